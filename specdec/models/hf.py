"""Adapter for Hugging Face decoder-only causal LMs: a batch of ragged sequences and their KV cache.

The cache is one tensor per layer `[B, H, S, D]` whose S slots are shared by all rows. Every call
appends the same number of slots to every row; a row that needs fewer tokens (left padding of a
prompt, a row that accepted fewer drafts) marks the extra slots invalid in its attention mask.
So a row's text is its valid slots in order, and its position ids count only valid slots.
Rollback is `crop(lengths)`: keep each row's first `lengths[b]` valid tokens, then drop trailing
slots no row uses. At batch size 1 this is an ordinary cache crop with no holes.
"""

from __future__ import annotations

import inspect
import logging

import torch

from specdec.request import context_length, vocab_size
from specdec.sequences import TokenBuffer

logger = logging.getLogger(__name__)


def _cache_kwarg(model: torch.nn.Module) -> str:
    # transformers renamed `past_key_values` to `cache` during the 5.x series; accept both.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _learned_positions(config) -> bool:
    # Absolute learned position tables (GPT-2, OPT, ...) index out of range past their size;
    # rotary models (Llama, Qwen2, ...) extrapolate, so only the former get a hard limit.
    return getattr(config, "model_type", "") in {"gpt2", "gpt_neo", "gptj", "opt", "bloom", "gpt_bigcode", "biogpt"}


class HFCausalLM:
    """One batch of sequences through a `transformers` causal LM; owns the KV cache.

    Usage: `reset(B)`, then `forward(tokens [B, k], valid [B, k])` any number of times (the first call
    is the prefill), `crop(lengths)` to roll back. `lengths` [B] counts the valid tokens per row.
    """

    def __init__(self, model: torch.nn.Module):
        from transformers import DynamicCache  # dependency at the edge

        config = getattr(model, "config", None)
        if config is None or getattr(config, "is_encoder_decoder", False):
            raise TypeError("HFCausalLM needs a decoder-only transformers model (got an encoder-decoder model)")
        self.model = model
        self.config = config
        self.vocab_size: int = vocab_size(model)
        self.max_positions = context_length(model)
        self.position_limit = self.max_positions if _learned_positions(config) else None
        self._cache_kwarg = _cache_kwarg(model)
        self._new_cache = lambda: DynamicCache(config=config)
        # Rows that accept fewer drafts than the batch's best leave holes; once more than this many
        # slots are holes, `crop` compacts the cache so memory stays proportional to the text.
        self.compact_after_holes = 256
        self.reset(0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self, batch_size: int) -> None:
        self.cache = self._new_cache()
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)  # [B, S] 1 = valid slot
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # [B] valid tokens

    def begin(self, prompts: list[list[int]], max_new_tokens: int) -> TokenBuffer:
        """Start a batch: the committed text is the prompts; prefill all but each prompt's last token."""
        longest = max(len(p) for p in prompts)
        if self.max_positions is not None and longest > self.max_positions:
            raise ValueError(f"prompt length {longest} exceeds the model's context of {self.max_positions} tokens")
        if self.position_limit is not None and longest + max_new_tokens > self.position_limit:
            raise ValueError(
                f"prompt length {longest} + max_new_tokens {max_new_tokens} exceeds the model's context of "
                f"{self.position_limit} tokens"
            )
        context = TokenBuffer(prompts, capacity=longest + max_new_tokens + 1, device=self.device)
        self.reset(len(prompts))
        self.begin_forward_passes = int(longest > 1)
        if longest > 1:
            block, valid = context.tail(longest, context.lengths)  # prompts right-aligned (left padding)
            self.forward(block[:, :-1], valid[:, :-1])
        return context

    @property
    def num_slots(self) -> int:
        return self.mask.shape[1]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Append `tokens [B, k]` (slots where `valid [B, k]` is False are padding) → logits `[B, k, V]`."""
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        positions = self.lengths[:, None] + valid.long().cumsum(1) - 1  # position id of each new token
        if self.position_limit is not None:
            # Drafts past a learned position table can never be committed (`begin` checked that prompt +
            # max_new_tokens fits), so they become padding instead of an index error.
            valid = valid & (positions < self.position_limit)
            positions = positions.clamp(max=self.position_limit - 1)
        valid_long = valid.long()
        new_lengths = self.lengths + valid_long.sum(1)
        positions = positions.clamp_min(0)
        self.mask = torch.cat([self.mask, valid_long], dim=1)
        out = self.model(
            input_ids=tokens,
            attention_mask=self.mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self.lengths = new_lengths
        return out.logits

    def crop(self, lengths: torch.Tensor | int) -> None:
        """Roll back to an absolute length: keep the first `lengths[b]` valid tokens of row b."""
        lengths, keep, num_slots = keep_first_valid(self.mask, self.lengths, lengths)
        self.mask = keep[:, :num_slots].long()
        self.lengths = lengths
        for layer in _cache_layers(self.cache):
            layer.keys = layer.keys[..., :num_slots, :]
            layer.values = layer.values[..., :num_slots, :]
        if num_slots - int(lengths.min()) > self.compact_after_holes:
            self.compact()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the rows in `index` (e.g. drop finished rows)."""
        self.mask = self.mask[index]
        self.lengths = self.lengths[index]
        for layer in _cache_layers(self.cache):
            layer.keys = layer.keys[index]
            layer.values = layer.values[index]

    def compact(self) -> None:
        """Remove holes: move each row's valid slots to the right end (left padding), drop empty columns."""
        if self.num_slots == 0:
            return
        width = int(self.lengths.max())
        valid = self.mask.bool()
        # Order slots so that invalid ones come first, valid ones keep their order.
        order = torch.argsort(valid.long() * (1 + torch.arange(self.num_slots, device=valid.device)), dim=1, stable=True)
        order = order[:, -width:] if width else order[:, :0]
        self.mask = valid.gather(1, order).long()
        for layer in _cache_layers(self.cache):
            if layer.keys is None:
                continue
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)


def keep_first_valid(mask: torch.Tensor, current: torch.Tensor, lengths: "torch.Tensor | int"):
    """Which slots survive `crop(lengths)`: each row keeps its first `lengths[b]` valid slots.

    mask [B, S] (1 = valid), current [B] valid counts → (lengths [B], keep [B, S] bool, slots still used).
    """
    if isinstance(lengths, int):
        lengths = torch.full_like(current, lengths)
    if bool((lengths > current).any()) or bool((lengths < 0).any()):
        raise ValueError("crop can only shorten sequences (0 <= lengths <= current lengths)")
    valid = mask.bool()
    keep = valid & (valid.long().cumsum(1) <= lengths[:, None])
    used = keep.any(0).nonzero()
    return lengths.clone(), keep, int(used[-1]) + 1 if used.numel() else 0


def _cache_layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers DynamicCache")
    for layer in layers:
        if type(layer).__name__ != "DynamicLayer":
            raise TypeError(
                f"cache layer {type(layer).__name__} is not supported (sliding-window/hybrid caches cannot be cropped yet)"
            )
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        yield layer
