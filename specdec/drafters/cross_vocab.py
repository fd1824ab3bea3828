"""A draft model with ANOTHER tokenizer, exact (token-level intersection).

Terms:
  shared tokens   token strings in both vocabularies (`get_vocab()` keys, special tokens left out): S pairs
                  (target id, draft id)
  q               the draft's standardized law over the shared tokens only: its logits outside S are -inf, the
                  rest are placed at their target ids (so q is 0 outside S in the target's vocabulary), then
                  temperature / top-k / top-p apply as for any drafter. Every draft is a shared token, so it
                  extends the draft's own text by exactly one of its tokens.
  draft text      the committed target tokens translated token by token: a shared token is its draft id, any
                  other is the draft tokenizer's encoding of its string (a valid spelling of the same text,
                  not always the canonical one; the law does not depend on it, only how well the draft guesses)

The tokens proposed are target ids drawn from the q reported, so `core.verify` keeps the target's law. One class
for both runners (a `ModelDrafter`: the same rule and draws): on the transformers loop (batched, any causal LM as
draft) the draft's KV cache follows the draft text and is cropped after each step; on the engine each target token
is fed as one draft token (`VocabBridge.single_spelling`), so its slot cache keeps the target's positions.
"""

from __future__ import annotations

import torch

from specdec.drafters.model import LoopState, ModelDrafter
from specdec.models.hf import HFCausalLM
from specdec.sequences import TokenBuffer

__all__ = ["VocabBridge", "CrossVocabDrafter", "SpelledLoopState", "bridge_if_needed"]


class VocabBridge:
    """The shared tokens of two tokenizers and how target tokens are spelled in the draft's."""

    def __init__(self, target_tokenizer, draft_tokenizer, target_vocab_size: int | None = None,
                 draft_vocab_size: int | None = None):
        special = set(getattr(target_tokenizer, "all_special_tokens", [])) | \
            set(getattr(draft_tokenizer, "all_special_tokens", []))
        target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        self.target_vocab_size = target_vocab_size or max(target_vocab.values()) + 1
        self.draft_vocab_size = draft_vocab_size or max(draft_vocab.values()) + 1
        pairs = sorted((t, draft_vocab[s]) for s, t in target_vocab.items()
                       if s in draft_vocab and s not in special and t < self.target_vocab_size
                       and draft_vocab[s] < self.draft_vocab_size)
        if not pairs:
            raise ValueError("the draft and target tokenizers share no token: token-level intersection needs some")
        self.target_ids = torch.tensor([t for t, _ in pairs])
        self.draft_ids = torch.tensor([d for _, d in pairs])
        self.target_to_draft = torch.full((self.target_vocab_size,), -1, dtype=torch.long)
        self.target_to_draft[self.target_ids] = self.draft_ids
        self._target_tokenizer, self._draft_tokenizer = target_tokenizer, draft_tokenizer
        self._spelling: dict[int, list[int]] = {}
        self._device_ids: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def num_shared(self) -> int:
        return len(self.target_ids)

    def spell(self, target_id: int) -> list[int]:
        """Draft ids spelling one target token (its shared id, else the draft's encoding of its string)."""
        shared = int(self.target_to_draft[target_id])
        if shared >= 0:
            return [shared]
        if target_id not in self._spelling:
            self._spelling[target_id] = self._spell(target_id)
        return self._spelling[target_id]

    def _spell(self, target_id: int) -> list[int]:
        target, draft = self._target_tokenizer, self._draft_tokenizer
        for role in ("bos_token_id", "eos_token_id", "pad_token_id"):  # special tokens map by their role
            if target_id == getattr(target, role, None):
                other = getattr(draft, role, None)
                return [] if other is None else [int(other)]
        if target_id in set(getattr(target, "all_special_ids", [])):
            return []
        text = target.decode([target_id])
        return draft.encode(text, add_special_tokens=False) if text else []

    def single_spelling(self) -> torch.Tensor:
        """One draft id per target id `[V_t]`: its shared id, else the first of its spelling (the draft's unknown
        token, or 0, when it has none) — what the engine feeds, keeping the target's positions."""
        unk = getattr(self._draft_tokenizer, "unk_token_id", None)
        out = self.target_to_draft.clone()
        for t in (out < 0).nonzero().flatten().tolist():
            ids = self.spell(t)
            out[t] = ids[0] if ids else (unk if unk is not None else 0)
        return out

    def shared_ids(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(target ids, draft ids) of the shared tokens `[S]` each, on `device` (copied there once)."""
        if self._device_ids is None or self._device_ids[0].device != device:
            self._device_ids = (self.target_ids.to(device), self.draft_ids.to(device))
        return self._device_ids

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft logits `[B, V_d]` → logits over the target vocabulary `[B, V_t]`, -inf outside the shared tokens (the
        ids copied to the device once: no host transfer inside a captured graph)."""
        target_ids, draft_ids = self.shared_ids(draft_logits.device)
        out = draft_logits.new_full((draft_logits.shape[0], self.target_vocab_size), float("-inf"))
        return out.index_copy_(1, target_ids, draft_logits.index_select(1, draft_ids))


class SpelledLoopState(LoopState):
    """The loop's state of a `CrossVocabDrafter`: the draft's cache follows the draft text (the committed target
    tokens spelled in full) and is cropped after each step like `ModelDrafter`'s."""

    def __init__(self, lm, bridge: VocabBridge):
        super().__init__(lm)
        self.bridge = bridge
        self._text: list[list[int]] = []  # per row: the draft text of the committed target tokens
        self._spelled: list[list[int]] = []  # per row: draft text length after each committed target token
        self._bos = getattr(getattr(lm.model, "config", None), "bos_token_id", None)
        self._to_draft: torch.Tensor | None = None

    def begin(self, context: TokenBuffer) -> None:
        self.lm.reset(context.batch_size)
        self._text = [[] for _ in range(context.batch_size)]
        self._spelled = [[] for _ in range(context.batch_size)]
        self._translate(context)
        filler = int(self._bos) if self._bos is not None else 0
        self._start = [0] * context.batch_size
        for b, text in enumerate(self._text):  # a prompt the draft cannot spell at all starts from its BOS
            if not text:
                text.append(filler)
                self._spelled[b] = [n + 1 for n in self._spelled[b]]
                self._start[b] = 1

    def _translate(self, context: TokenBuffer) -> None:
        """Spell the committed target tokens not yet translated (one host read of the new tokens)."""
        lengths = context.lengths.tolist()
        done = [len(s) for s in self._spelled]
        width = max(L - d for L, d in zip(lengths, done))
        if width <= 0:
            return
        tokens = context.tokens[:, max(0, min(done)) : max(lengths)].tolist()
        for b, (length, start) in enumerate(zip(lengths, done)):
            for t in tokens[b][start - min(done) : length - min(done)]:
                self._text[b].extend(self.bridge.spell(int(t)))
                self._spelled[b].append(len(self._text[b]))

    def feed(self, context: TokenBuffer) -> torch.Tensor:
        self._translate(context)
        device = self.lm.device
        texts = self._text
        cached = torch.minimum(self.lm.lengths, torch.tensor([len(t) - 1 for t in texts], device=device))
        self.lm.crop(cached)  # (keeps at least the last draft token unseen: its logits start the chain)
        unseen = [len(t) - int(c) for t, c in zip(texts, cached.tolist())]
        width = max(unseen)
        block = torch.zeros(len(texts), width, dtype=torch.long)
        valid = torch.zeros(len(texts), width, dtype=torch.bool)
        for b, (text, n) in enumerate(zip(texts, unseen)):  # right-aligned: the last column is each row's last
            block[b, width - n :] = torch.tensor(text[len(text) - n :])
            valid[b, width - n :] = True
        return self.lm.forward(block.to(device), valid.to(device))[:, -1]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._to_draft is None or self._to_draft.device != tokens.device:
            self._to_draft = self.bridge.target_to_draft.to(tokens.device)
        return self.lm.forward(self._to_draft[tokens][:, None])[:, -1]  # (drafts are shared tokens)

    def commit(self, context: TokenBuffer) -> None:
        # The cache holds the old draft text and the drafts' draft ids; the accepted drafts spell themselves
        # (shared tokens), so it stays valid up to the committed text without its last target token.
        self._translate(context)
        keep = [s[-2] if len(s) >= 2 else start for s, start in zip(self._spelled, self._start)]
        self.lm.crop(torch.minimum(self.lm.lengths, torch.tensor(keep, device=self.lm.device)))

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)
        rows = index.tolist()
        self._text = [self._text[i] for i in rows]
        self._spelled = [self._spelled[i] for i in rows]


class CrossVocabDrafter(ModelDrafter):
    """Drafts with a causal LM whose tokenizer differs from the target's (see the module doc): the model drafter's
    one rule, its logits restricted to the shared tokens and placed at their target ids. On the loop its state
    spells the committed text in full (`SpelledLoopState`); on the engine (`engine.build`: `with_state`) every target
    token reaches the draft as ONE draft token (`engine_inputs`), so the slot cache keeps the target's positions —
    the law does not depend on the spelling, only α does."""

    accepts_processor = False

    def __init__(self, model: torch.nn.Module, bridge: VocabBridge):
        lm = HFCausalLM(model)
        if lm.vocab_size < bridge.draft_vocab_size:
            raise ValueError(f"the draft model has {lm.vocab_size} logits; its tokenizer has "
                             f"{bridge.draft_vocab_size} ids")
        super().__init__(state=SpelledLoopState(lm, bridge))
        self.bridge = bridge
        self.vocab_size = bridge.target_vocab_size  # proposes target ids
        self.draft_vocab_size = bridge.draft_vocab_size

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        if vocab_size != self.vocab_size:
            raise ValueError(f"the vocabulary bridge maps into {self.vocab_size} target ids; the target has {vocab_size}")
        super().begin(context, vocab_size)

    def with_state(self, state) -> "CrossVocabDrafter":
        self.bridge.shared_ids(state.model.device)  # (on the state's device before any graph capture)
        return super().with_state(state)

    def engine_inputs(self) -> torch.Tensor:
        """`[V_t]`: one draft id per target id (`VocabBridge.single_spelling`), what the engine feeds."""
        return self.bridge.single_spelling()

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return self.bridge.target_logits(logits.float())


def bridge_if_needed(draft_model, draft_folder, target_tokenizer, target_vocab_size: int):
    """`draft_model` itself when it reads the target's vocabulary, else a `CrossVocabDrafter` over the shared tokens
    of the target's tokenizer and the draft's own (from `draft_folder`). What `--draft DIR` / `load(draft=DIR)` use,
    so a draft of another family just works; None tokenizers or folders leave the draft as it is."""
    if target_tokenizer is None or draft_folder is None:
        return draft_model
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(str(draft_folder), local_files_only=True)
    except (OSError, ValueError):
        return draft_model  # no tokenizer of its own: it must read the target's ids (checked where it drafts)
    draft_vocab_size = draft_model.get_output_embeddings().weight.shape[0]
    if draft_vocab_size == target_vocab_size and draft_tokenizer.get_vocab() == target_tokenizer.get_vocab():
        return draft_model
    bridge = VocabBridge(target_tokenizer, draft_tokenizer, target_vocab_size=target_vocab_size,
                         draft_vocab_size=draft_vocab_size)
    return CrossVocabDrafter(draft_model, bridge)
