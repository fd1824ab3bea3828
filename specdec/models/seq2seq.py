"""Adapter for Hugging Face encoder-decoder models (T5, BART, ...): the paper's T5 setting.

Prompts are encoder inputs. `begin` runs the encoder once (ragged prompts right-padded, so every
valid encoder token keeps its position) and the committed decoder text starts as the decoder start
token. `forward` appends decoder tokens; the cross-attention keys/values are computed on the first
call and kept; `crop` rolls back only the decoder self-attention cache.

The decoder cache is `[B, H, S, D]` per layer with S slots shared by all rows, as in `HFCausalLM`,
but these models take positions from the slot index (T5 through its relative position bias, BART
and most others through `cache length + i`), and none accepts per-row position ids in every
transformers 5.x release. So a row's valid slots must never have a hole before a new token.
Two exact layouts keep that true:

  relative  (T5 family: only distances between slots matter) — before a forward, each row's valid
            slots are moved to the right end of the cache (`compact`), and the row's new tokens are
            written right after them. Holes left by `crop` cost one gather of the cache.
  prefix    (absolute positions: BART and the rest) — row b's text occupies slots [0, lengths[b]).
            Before a forward the cache is cut to the shortest row, P = min(lengths), and every row
            re-feeds its own tokens past P before its new ones (the adapter keeps the fed tokens).
            At batch size 1 nothing is re-fed; in ragged batches the extra work is the spread of
            the rows' lengths.

In both, the new tokens of a row are packed at the left of the block; padding slots sit after the
row's last valid token, where no valid query of that pass can see them, and the next forward
removes them before anything is appended.
"""

from __future__ import annotations

import logging

import torch

from specdec.models.hf import _cache_kwarg, _cache_layers, keep_first_valid
from specdec.request import context_length, vocab_size
from specdec.sequences import TokenBuffer

logger = logging.getLogger(__name__)

# Families whose decoder self-attention sees positions only as slot distances (relative position bias).
_RELATIVE_POSITION_TYPES = {"t5", "mt5", "umt5", "longt5", "switch_transformers"}

# Generation-config settings that `model.generate()` applies and specdec does not (it samples the raw model).
_UNAPPLIED_GENERATION_SETTINGS = {
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": None,
    "repetition_penalty": 1.0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}


def decoder_start_token_id(model: torch.nn.Module) -> int:
    """The token every decoder text starts with: generation_config first, then config (as transformers)."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "decoder_start_token_id", None) if source is not None else None
        if isinstance(value, (list, tuple)):  # some configs store one id per language; take the first
            value = value[0] if value else None
        if value is not None:
            return int(value)
    raise ValueError(
        "the encoder-decoder model has no decoder_start_token_id (neither model.generation_config nor "
        "model.config sets it); set model.generation_config.decoder_start_token_id"
    )


def check_encoder_inputs(sources) -> None:
    """A ValueError unless `sources` holds at least one encoder input and each at least one token (naming the row):
    the one check of both seq2seq targets (this one and `fast.seq2seq.FastSeq2SeqTarget`)."""
    if not sources:
        raise ValueError("prompts is empty: give at least one encoder input")
    for i, source in enumerate(sources):
        if len(source) == 0:
            raise ValueError(f"prompt {i} is empty: every encoder input needs at least one token")


class HFSeq2SeqLM:
    """One batch of requests through a `transformers` encoder-decoder model; owns encoder states and caches.

    Usage: `begin(prompts, max_new_tokens)` (or `encode(prompts)`), then `forward(tokens [B, k], valid [B, k])`
    any number of times, `crop(lengths)` to roll back. `lengths` [B] counts decoder tokens in the cache.
    `layout` is "relative" or "prefix" (see the module docstring); None picks it from the model type.
    """

    def __init__(self, model: torch.nn.Module, *, layout: str | None = None):
        from transformers import DynamicCache, EncoderDecoderCache  # dependency at the edge

        config = getattr(model, "config", None)
        if config is None or not getattr(config, "is_encoder_decoder", False):
            raise TypeError("HFSeq2SeqLM needs an encoder-decoder transformers model (T5, BART, ...)")
        relative = getattr(config, "model_type", "") in _RELATIVE_POSITION_TYPES
        layout = layout or ("relative" if relative else "prefix")
        if layout not in ("relative", "prefix"):
            raise ValueError(f"layout must be 'relative' or 'prefix', got {layout!r}")
        if layout == "relative" and not relative:
            raise ValueError(
                f"layout='relative' is exact only for relative-position models ({sorted(_RELATIVE_POSITION_TYPES)}), "
                f"not {getattr(config, 'model_type', '?')!r}"
            )
        self.model = model
        self.config = config
        self.layout = layout
        self.vocab_size: int = vocab_size(model)
        self.decoder_start_token_id = decoder_start_token_id(model)
        self.pad_token_id = getattr(config, "pad_token_id", None) or 0
        # Learned/sinusoidal absolute position tables index out of range past their size; T5 has none.
        self.position_limit = None if relative else context_length(model)
        self._cache_kwarg = _cache_kwarg(model)
        self._new_cache = lambda: EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        self._warn_unapplied_generation_settings()
        self.reset(0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def num_slots(self) -> int:
        return self.mask.shape[1]

    def reset(self, batch_size: int) -> None:
        device = self.device
        self.cache = self._new_cache()
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, S] 1 = valid slot
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] decoder tokens cached
        self.fed = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, ≥max(lengths)] decoder text
        self.encoder_states: torch.Tensor | None = None  # [B, T, D]
        self.encoder_mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, T]

    # -- a new batch ---------------------------------------------------------------------------------

    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Encode the prompts; the committed decoder text starts as `[decoder_start_token_id]` per row."""
        # The decoder is fed positions 0 .. max_new_tokens-1 (the last committed token is never fed).
        if self.position_limit is not None and max_new_tokens > self.position_limit:
            raise ValueError(
                f"max_new_tokens {max_new_tokens} exceeds the decoder's context of {self.position_limit} tokens"
            )
        self.encode(prompts)
        context = TokenBuffer(
            [[self.decoder_start_token_id]] * len(prompts), capacity=1 + max_new_tokens + 1, device=self.device
        )
        context.source = [list(p) for p in prompts]
        return context

    @torch.inference_mode()
    def encode(self, prompts: list[list[int]]) -> None:
        """Reset to `len(prompts)` rows and run the encoder once (prompts right-padded, masked)."""
        check_encoder_inputs(prompts)
        longest = max(len(p) for p in prompts)
        if self.position_limit is not None and longest > self.position_limit:
            raise ValueError(f"prompt length {longest} exceeds the encoder's context of {self.position_limit} tokens")
        self.reset(len(prompts))
        device = self.device
        ids = torch.full((len(prompts), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), longest, dtype=torch.long)
        for b, prompt in enumerate(prompts):
            ids[b, : len(prompt)] = torch.as_tensor(prompt, dtype=torch.long)
            mask[b, : len(prompt)] = 1
        self.encoder_mask = mask.to(device)
        encoder = self.model.get_encoder()
        self.encoder_states = encoder(input_ids=ids.to(device), attention_mask=self.encoder_mask).last_hidden_state

    # -- decoding ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append decoder `tokens [B, k]` (slots where `valid [B, k]` is False are padding) → logits `[B, k, V]`.

        Logits at padding slots (and at positions past the decoder's context) are zeros.
        """
        from transformers.modeling_outputs import BaseModelOutput

        if self.encoder_states is None:
            raise RuntimeError("call begin(prompts, max_new_tokens) or encode(prompts) before forward")
        batch, k = tokens.shape
        device = tokens.device
        valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid.bool()
        rank = valid.long().cumsum(1) - 1  # index of each valid token among the row's new tokens
        positions = self.lengths[:, None] + rank  # decoder position of each new token
        # Position 0 is this model's start token (a drafter shares the target's text, not always its start id).
        tokens = torch.where(positions == 0, torch.full_like(tokens, self.decoder_start_token_id), tokens)
        if self.position_limit is not None:
            # Only drafts beyond max_new_tokens get here; their logits are never used to commit a token.
            valid = valid & (positions < self.position_limit)
        counts = valid.long().sum(1)

        pending = self._make_room()  # [B] tokens each row re-feeds before its new ones
        width = int((pending + counts).max()) if batch else 0
        if width == 0:
            return torch.zeros(batch, k, self.vocab_size, device=device)
        # New valid tokens packed at the left of each row, after the row's pending tokens.
        packed = torch.zeros(batch, k + 1, dtype=torch.long, device=device)
        packed.scatter_(1, torch.where(valid, rank, k), tokens)
        cols = torch.arange(width, device=device)[None, :]
        if self.fed.shape[1]:
            fed_index = (self.num_slots + cols).clamp(max=self.fed.shape[1] - 1).expand(batch, -1)
            from_fed = self.fed.gather(1, fed_index)
        else:
            from_fed = torch.zeros(batch, width, dtype=torch.long, device=device)
        from_new = packed.gather(1, (cols - pending[:, None]).clamp(0, k))
        block = torch.where(cols < pending[:, None], from_fed, from_new)
        block_valid = cols < (pending + counts)[:, None]

        attention_mask = torch.cat([self.mask, block_valid.long()], dim=1)
        out = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=self.encoder_states),
            attention_mask=self.encoder_mask,
            decoder_input_ids=block,
            decoder_attention_mask=attention_mask,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self.mask = attention_mask
        index = (pending[:, None] + rank).clamp(0, width - 1)
        logits = out.logits.gather(1, index[..., None].expand(-1, -1, out.logits.shape[-1]))
        logits = logits.masked_fill(~valid[..., None], 0.0)

        self._remember(tokens, valid, rank)
        self.lengths = self.lengths + counts
        return logits

    def _make_room(self) -> torch.Tensor:
        """Bring the cache to a state where each row's next token goes right after its last valid slot."""
        if self.layout == "relative":
            self.compact()
            return torch.zeros_like(self.lengths)
        # prefix: keep the slots every row shares (all valid), re-feed the rest
        shared = int(self.lengths.min()) if self.lengths.numel() else 0
        if shared < self.num_slots:
            self._keep_slots(shared)
        return self.lengths - shared

    def _remember(self, tokens: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor) -> None:
        """Record the fed decoder text (the prefix layout re-feeds from it)."""
        needed = int((self.lengths + valid.long().sum(1)).max()) if valid.numel() else 0
        if needed > self.fed.shape[1]:
            grown = torch.zeros(self.fed.shape[0], max(needed, 2 * self.fed.shape[1]), dtype=torch.long, device=self.fed.device)
            grown[:, : self.fed.shape[1]] = self.fed
            self.fed = grown
        cols = torch.where(valid, self.lengths[:, None] + rank, self.fed.shape[1])
        extended = torch.cat([self.fed, self.fed.new_zeros(self.fed.shape[0], 1)], dim=1)
        self.fed = extended.scatter(1, cols, tokens)[:, :-1]

    def _keep_slots(self, num_slots: int) -> None:
        self.mask = self.mask[:, :num_slots]
        for layer in _cache_layers(self.cache.self_attention_cache):
            layer.keys = layer.keys[..., :num_slots, :]
            layer.values = layer.values[..., :num_slots, :]

    def compact(self) -> None:
        """Relative layout: move each row's valid slots to the right end, drop columns no row uses."""
        if self.layout != "relative":
            raise RuntimeError("compact() would shift absolute positions; only the relative layout may compact")
        slots = self.num_slots
        if slots == 0:
            return
        width = int(self.lengths.max())
        valid = self.mask.bool()
        right_aligned = torch.arange(slots, device=valid.device)[None, :] >= slots - self.lengths[:, None]
        if bool(torch.equal(valid, right_aligned)):
            if width < slots:  # leading columns nobody uses: dropping them keeps every distance
                self.mask = self.mask[:, slots - width :]
                for layer in _cache_layers(self.cache.self_attention_cache):
                    layer.keys = layer.keys[..., slots - width :, :]
                    layer.values = layer.values[..., slots - width :, :]
            return
        # Order slots so that invalid ones come first and valid ones keep their order.
        order = torch.argsort(valid.long() * (1 + torch.arange(slots, device=valid.device)), dim=1, stable=True)
        order = order[:, slots - width :]
        self.mask = valid.gather(1, order).long()
        for layer in _cache_layers(self.cache.self_attention_cache):
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    def crop(self, lengths: torch.Tensor | int) -> None:
        """Roll back the decoder self-attention cache: keep the first `lengths[b]` tokens of row b."""
        lengths, keep, num_slots = keep_first_valid(self.mask, self.lengths, lengths)
        self.mask = keep.long()
        self.lengths = lengths
        self._keep_slots(num_slots)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` (e.g. drop finished rows): decoder and cross caches, encoder states."""
        self.mask = self.mask[index]
        self.lengths = self.lengths[index]
        self.fed = self.fed[index]
        self.encoder_mask = self.encoder_mask[index]
        if self.encoder_states is not None:
            self.encoder_states = self.encoder_states[index]
        for layer in [*_cache_layers(self.cache.self_attention_cache), *_cache_layers(self.cache.cross_attention_cache)]:
            layer.keys = layer.keys[index]
            layer.values = layer.values[index]
        # Encoder padding no remaining row uses can go (masked columns: dropping them is exact).
        used = self.encoder_mask.any(0).nonzero()
        source_len = int(used[-1]) + 1 if used.numel() else 0
        if source_len < self.encoder_mask.shape[1]:
            self.encoder_mask = self.encoder_mask[:, :source_len]
            if self.encoder_states is not None:
                self.encoder_states = self.encoder_states[:, :source_len]
            for layer in _cache_layers(self.cache.cross_attention_cache):
                layer.keys = layer.keys[..., :source_len, :]
                layer.values = layer.values[..., :source_len, :]

    def _warn_unapplied_generation_settings(self) -> None:
        generation_config = getattr(self.model, "generation_config", None)
        if generation_config is None:
            return
        differing = [
            f"{name}={getattr(generation_config, name)!r}"
            for name, default in _UNAPPLIED_GENERATION_SETTINGS.items()
            if getattr(generation_config, name, default) not in (default, None)
        ]
        if differing:
            logger.warning(
                "the model's generation_config sets %s; specdec samples the model's own distribution and does not "
                "apply these (outputs can differ from model.generate() with its defaults)",
                ", ".join(differing),
            )
