"""The drafter a name or path stands for, loaded next to its target (local files only): one definition that
`specdec.load(target, draft)` (`load_draft`) and the CLI's `--draft` (`cli.common.load_drafter`) both use.

`named_draft` builds prompt lookup or an n-gram table; `draft_checkpoint` returns a head folder (the engine loads
it onto the target) or a draft model placed like the target, bridged when its tokenizer differs.
"""

from __future__ import annotations

from pathlib import Path

from specdec.request import vocab_size

__all__ = ["DRAFT_NAMES", "NGRAM_ORDERS", "draft_checkpoint", "load_draft", "named_draft"]

DRAFT_NAMES = ("prompt-lookup", "ngram")  # what `specdec.load` accepts by name
NGRAM_ORDERS = {"ngram": 2, "bigram": 2, "unigram": 1}  # n-gram drafter names → their order


def named_draft(name: str, token_ids=(), vocab: int = 0):
    """"prompt-lookup", or an n-gram drafter (`NGRAM_ORDERS`) fitted on `token_ids` (lists of ids) over `vocab`."""
    import specdec

    if name == "prompt-lookup":
        return specdec.PromptLookupDrafter()
    return specdec.NGramDrafter(NGRAM_ORDERS[name]).fit(token_ids, vocab)


def draft_checkpoint(draft, tokenizer, vocab: int, *, device, dtype, allow_pickle: bool, model_kwargs=None,
                     allow_weight_mismatch: bool = False, option: str = "draft_model_kwargs"):
    """The head folder `draft` is (EAGLE, EAGLE-3, Medusa, speculators, `specdec train head`: the engine loads it
    onto the target; `model_kwargs` refused, naming `option`), or the draft checkpoint, loaded on `device` in `dtype`
    unless `model_kwargs` place it; a draft with its own tokenizer drafts over the tokens both vocabularies share."""
    from specdec.drafters.cross_vocab import bridge_if_needed
    from specdec.drafters.formats import drafter_folder
    from specdec.loading import load_model, placed_like

    head = drafter_folder(draft, allow_pickle)
    if head is not None:
        if model_kwargs:
            raise ValueError(f"{option} applies to draft models, not to head folders")
        return head
    model = load_model(draft, what="draft", allow_pickle=allow_pickle, model_kwargs=model_kwargs,
                       allow_weight_mismatch=allow_weight_mismatch, **placed_like(device, dtype, model_kwargs))
    return bridge_if_needed(model, draft if Path(draft).is_dir() else None, tokenizer, vocab)


def load_draft(draft, target, tokenizer, allow_pickle: bool, ngram_data, *, draft_model_kwargs=None,
               allow_weight_mismatch: bool = False):
    """The drafter `draft` names for `specdec.load`: None, "prompt-lookup", "ngram" (fitted on `ngram_data`), a
    head folder, a checkpoint (placed like `target`; see `draft_checkpoint`), or a drafter object."""
    if draft_model_kwargs is not None and (not isinstance(draft, (str, Path)) or str(draft).lower() in DRAFT_NAMES):
        raise ValueError("draft_model_kwargs apply when draft is a checkpoint path or hub id")
    if draft is None:
        return None
    if isinstance(draft, str) and draft.lower() == "prompt-lookup":
        return named_draft("prompt-lookup")
    if isinstance(draft, str) and draft.lower() == "ngram":
        if ngram_data is None:
            raise ValueError("draft='ngram' needs ngram_data (a text file or a list of strings) to fit its table on; "
                             "draft='prompt-lookup' needs no data")
        texts = [Path(ngram_data).read_text(encoding="utf-8", errors="replace")] \
            if isinstance(ngram_data, (str, Path)) else list(ngram_data)
        return named_draft("ngram", [tokenizer.encode(t) for t in texts if t], vocab_size(target))
    if isinstance(draft, (str, Path)):
        return draft_checkpoint(draft, tokenizer, vocab_size(target), device=target.device,
                                dtype=next(target.parameters()).dtype, allow_pickle=allow_pickle,
                                model_kwargs=draft_model_kwargs, allow_weight_mismatch=allow_weight_mismatch)
    return draft
