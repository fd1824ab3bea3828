"""The drafter a `specdec.load(target, draft)` call names, loaded next to its target (local files only)."""

from __future__ import annotations

from pathlib import Path

from specdec.request import vocab_size

__all__ = ["DRAFT_NAMES", "load_draft"]

DRAFT_NAMES = ("prompt-lookup", "ngram")


def load_draft(draft, target, tokenizer, allow_pickle: bool, ngram_data, *, draft_model_kwargs=None,
               allow_weight_mismatch: bool = False):
    """The drafter `draft` names for `specdec.load`: None, "prompt-lookup", "ngram" (fitted on `ngram_data`), a
    head folder (EAGLE, EAGLE-3, Medusa, speculators, `specdec train head`: the engine loads it onto the target), a
    checkpoint (placed like `target`; another tokenizer drafts over the shared tokens), or a drafter object."""
    import specdec
    from specdec.loading import load_model, placed_like

    if draft_model_kwargs is not None and (not isinstance(draft, (str, Path)) or str(draft).lower() in DRAFT_NAMES):
        raise ValueError("draft_model_kwargs apply when draft is a checkpoint path or hub id")
    if draft is None:
        return None
    if isinstance(draft, str) and draft.lower() in DRAFT_NAMES:
        if draft.lower() == "prompt-lookup":
            return specdec.PromptLookupDrafter()
        if ngram_data is None:
            raise ValueError("draft='ngram' needs ngram_data (a text file or a list of strings) to fit its table on; "
                             "draft='prompt-lookup' needs no data")
        texts = [Path(ngram_data).read_text(encoding="utf-8", errors="replace")] \
            if isinstance(ngram_data, (str, Path)) else list(ngram_data)
        vocab = vocab_size(target)
        return specdec.NGramDrafter(2).fit([tokenizer.encode(t) for t in texts if t], vocab)
    from specdec.drafters.cross_vocab import bridge_if_needed
    from specdec.drafters.formats import drafter_folder

    head = drafter_folder(draft, allow_pickle)  # EAGLE, EAGLE-3, Medusa, speculators, `specdec train head`
    if head is not None:  # the engine loads it onto the target
        if draft_model_kwargs:
            raise ValueError("draft_model_kwargs apply to draft models, not to head folders")
        return head
    if isinstance(draft, (str, Path)):
        placed = placed_like(target.device, next(target.parameters()).dtype, draft_model_kwargs)
        model = load_model(draft, what="draft", allow_pickle=allow_pickle, model_kwargs=draft_model_kwargs,
                           allow_weight_mismatch=allow_weight_mismatch, **placed)
        # a draft with its own tokenizer drafts over the tokens both vocabularies share
        return bridge_if_needed(model, draft if Path(draft).is_dir() else None, tokenizer, vocab_size(target))
    return draft
