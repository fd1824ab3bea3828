"""A GGUF's weights held once when the engine keeps them quantized: the transformers model reads the engine's blocks.

`fast.quant.attach.quantized_from_hf` builds the engine's `FastLlama` with the file's linear weights quantized; the
transformers model `load_model` made from the GGUF still holds every weight dequantized to float32 (SmolLM2-135M:
0.54 GB beside 0.11 GB of blocks, issue 36). Two steps remove the copies:

- `share_dense_tensors` (every quantized build, `engine.build`): the `FastLlama`'s dense norms (and a float
  embedding: copies) are replaced by the model's own tensors (equal, checked). A quantized token embedding stays
  quantized in the `FastLlama` (`fast.quant.attach`: rows dequantized on gather), never shared dense.
- `release_dense_weights` (what `specdec.load` loaded itself, `release_when_built`: as soon as the body is built,
  before the KV cache is allocated): each `nn.Linear` of the model whose
  weight the `FastLlama` holds quantized becomes a `QuantizedLinear` over those blocks (its rows of a stacked q|k|v or
  gate|up), replaced only where the blocks dequantize to the dense weight bit for bit (so every forward of the model
  — the eager loop, `specdec check`, logprobs of the fallback path — gives the same float32 as before, one layer's
  weight dequantized at a time). Its token embedding, where the `FastLlama` holds it quantized and it dequantizes to
  the model's table bit for bit (every row compared), becomes a `QuantizedEmbedding` over those blocks, and a tied
  LM head a `QuantizedLinear` over all their rows. The model's dense weights are then freed
  (`held_once.release_freed_memory`).

A rebuilt engine over a released model (the text API rebuilds one after a step raised) gets the same `FastLlama`
back (`quantized_over`); one asking for the dense weights (`gguf_weights="dequantized"`, bitwise) is refused by
name: load the model again. A model object a user passes is never released (it is theirs: only the embedding is
shared, as `held_once.adopt_hf` shares every tensor).
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.fast.held_once import release_freed_memory
from specdec.fast.quant.weight import ATTRIBUTE, quantized
from specdec.fast.weights import hf_weights

__all__ = ["QuantizedLinear", "QuantizedEmbedding", "share_dense_tensors", "quantized_over", "release_dense_weights", "release_when_built",
           "is_released"]

#: model → a weak reference to the quantized FastLlama built over it (`share_dense_tensors`)
_BUILT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: released model → its FastLlama, held (a rebuilt engine needs it: the model no longer has the dense weights)
_RELEASED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: models whose dense weights are released when their quantized body is built (`release_when_built`)
_OWNED: "weakref.WeakSet" = weakref.WeakSet()


class QuantizedLinear(torch.nn.Module):
    """`nn.Linear` over rows [start, stop) of a `QuantWeight` `[N, K]`: `weight` dequantizes them (float32
    `[stop - start, K]`, made for each call and dropped after it); `forward(x [..., K])` → `[..., stop - start]`."""

    def __init__(self, quant, start: int, stop: int, bias: torch.nn.Parameter | None):
        super().__init__()
        self.quant, self.start, self.stop = quant, int(start), int(stop)
        self.in_features, self.out_features = int(quant.shape[1]), self.stop - self.start
        self.register_parameter("bias", bias)

    @property
    def weight(self) -> torch.Tensor:
        return self.quant.dequantize(self.start, self.stop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rows {self.start}:{self.stop} of " \
               f"{self.quant.source} {tuple(self.quant.shape)}"


class QuantizedEmbedding(torch.nn.Module):
    """`nn.Embedding` over a `QuantWeight` `[V, dim]`: `forward(ids [...])` → float32 `[..., dim]`, the rows asked for
    dequantized (`QuantWeight.gather`); `weight` dequantizes the whole table (`[V, dim]`, made for each read and
    dropped after it: for code that inspects the table, never the forward)."""

    def __init__(self, quant, padding_idx: int | None = None):
        super().__init__()
        self.quant, self.padding_idx = quant, padding_idx
        self.num_embeddings, self.embedding_dim = (int(n) for n in quant.shape)

    @property
    def weight(self) -> torch.Tensor:
        return self.quant.dequantize()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.quant.gather(ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.quant.source} (rows dequantized on gather)"


def _dequantizes_to(quant, weight: torch.Tensor, rows: int = 4096) -> bool:
    """Whether every row of `quant` dequantizes to `weight`'s, bit for bit (a few thousand rows at a time)."""
    if tuple(weight.shape) != tuple(quant.shape) or weight.dtype != torch.float32:
        return False
    return all(torch.equal(quant.dequantize(i, i + rows), weight[i:i + rows]) for i in range(0, weight.shape[0], rows))


def _release_embedding(model: torch.nn.Module, quant) -> int:
    """`model`'s token embedding (and its tied LM head) over `quant`, where equal bit for bit; the bytes released."""
    embed = model.get_input_embeddings()
    if quant is None or not isinstance(embed, torch.nn.Embedding) or embed.weight.is_meta or \
            not _dequantizes_to(quant, embed.weight):
        return 0
    head = model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", None) is embed.weight
    if tied and not isinstance(head, torch.nn.Linear):
        return 0  # (a head of another kind reading the table: the table stays dense)
    released = embed.weight.numel() * embed.weight.element_size()
    model.set_input_embeddings(QuantizedEmbedding(quant, embed.padding_idx))
    if tied:
        model.set_output_embeddings(QuantizedLinear(quant, 0, quant.shape[0], head.bias))
    return released


@torch.inference_mode(False)
def share_dense_tensors(model: torch.nn.Module, fast):
    """`fast` (a FastLlama with quantized weights, built over `model`) reading `model`'s own tensors instead of its
    copies of them — the norms, a token embedding of a float type (a quantized one stays quantized: a meta
    parameter, never shared) — where equal; remembered for `release_dense_weights`. Returns `fast`."""
    own_storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for name, layer, tensor in hf_weights(model, fast.shape):
        held = getattr(fast, name) if layer is None else getattr(fast, name)[layer]
        if held.is_meta or tensor.untyped_storage().data_ptr() not in own_storage or tensor.shape != held.shape or \
                tensor.dtype != held.dtype or tensor.device != held.device or tensor.stride() != held.stride() or \
                not torch.equal(tensor, held):
            continue  # (quantized, a made tensor — a stack, Gemma's 1 + w —, or not the model's: kept)
        shared = torch.nn.Parameter(tensor.detach(), requires_grad=False)
        if quantized(held) is not None:
            setattr(shared, ATTRIBUTE, quantized(held))
        if layer is not None:
            getattr(fast, name)[layer] = shared
            continue
        tied = name == "embed" and fast.lm_head is held
        setattr(fast, name, shared)
        if tied:
            fast.lm_head = shared
    _BUILT[model] = weakref.ref(fast)
    if model in _OWNED:
        release_dense_weights(model)
    release_freed_memory()
    return fast


def quantized_over(model: torch.nn.Module):
    """The FastLlama a released model's weights live in (`release_dense_weights`), or None."""
    return _RELEASED.get(model)


def is_released(model) -> bool:
    return isinstance(model, torch.nn.Module) and model in _RELEASED


def _linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, torch.nn.Linear)]


@torch.inference_mode(False)
def release_dense_weights(model: torch.nn.Module) -> int:
    """Replace `model`'s linear weights by `QuantizedLinear`s over the blocks of the quantized FastLlama built over it
    (module doc); returns the bytes of dense weights released (0: no such FastLlama, or released before)."""
    ref = _BUILT.get(model)
    fast = ref() if ref is not None else None
    if fast is None or model in _RELEASED:
        return 0
    linears, released = _linears(model), 0
    for name, layer, tensor in hf_weights(model, fast.shape, share=True):  # (q|k|v, gate|up: parts re-pointed
        held = getattr(fast, name) if layer is None else getattr(fast, name)[layer]  # into one stack, a view)
        quant = quantized(held)
        if quant is None or name == "embed" or tensor.dim() != 2 or tuple(tensor.shape) != tuple(quant.shape):
            continue
        storage, rows = tensor.untyped_storage().data_ptr(), tensor.stride(0)
        for entry in [e for e in linears if not e[2].weight.is_meta and
                      e[2].weight.untyped_storage().data_ptr() == storage]:
            parent, child, linear = entry
            weight = linear.weight
            start = (weight.storage_offset() - tensor.storage_offset()) // rows
            stop = start + weight.shape[0]
            if weight.stride() != tensor.stride() or not torch.equal(quant.dequantize(start, stop), weight):
                continue  # (kept dense: never a weight that is not the model's own, bit for bit)
            setattr(parent, child, QuantizedLinear(quant, start, stop, linear.bias))
            linears.remove(entry)
            released += weight.numel() * weight.element_size()
        del tensor
    released += _release_embedding(model, quantized(fast.embed) if fast.embed.is_meta else None)  # (after the
    _RELEASED[model] = fast  # linears: `hf_weights` reads the model's embedding parameter)
    release_freed_memory()
    return released


def release_when_built(target, model, draft=None, drafter=None) -> None:
    """Mark the models `specdec.load` loads itself (`target` / `draft` a path, not a model object: `model`, and
    `drafter.model`) so that their dense linear weights are released as soon as the engine's quantized body of them
    is built (`share_dense_tensors`), before the KV cache is allocated: the start-up peak never holds both."""
    if isinstance(target, (str, Path)) and isinstance(model, torch.nn.Module):
        _OWNED.add(model)
    draft_model = getattr(drafter, "model", None)
    if isinstance(draft, (str, Path)) and isinstance(draft_model, torch.nn.Module):
        _OWNED.add(draft_model)
