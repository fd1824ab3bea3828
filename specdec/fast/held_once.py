"""Weights held once: a `FastLlama` made from a transformers model that reads the model's own tensors.

`FastLlama.from_hf` copies every weight into tensors of its own, so a loaded model sits in memory twice (the
transformers model's tensors and FastLlama's). `adopt_hf` takes each tensor `hf_weights(share=True)` yields instead:
one the model already holds (embeddings, o / down projections, norms, an untied LM head) becomes a FastLlama
parameter over the same storage; a stacked one (q|k|v, gate|up) is made once and the model's parameters are re-pointed
to its rows (`fast.weights.stack_rows`: the parameters keep their identity, their old tensors are freed). Both models stay usable and give the same outputs (the text API, `specdec check` and the eager loop still run the
transformers model); each weight is stored once, one layer's stack at a time on top.

What a transformation makes (Gemma's 1 + w norms in float32, Granite's scaled o / down projections, GPT-NeoX's
regrouped q|k|v, GPT-2's Conv1D matrices transposed to [out, in] — the model's GEMM on a transposed view would round
differently —, a dtype or device change) is held by both models: `duplicate_bytes` counts it.

Adopting the same model again (the text API builds an engine per served γ) gives FastLlama parameters over the same
storage and the same `Parameter` objects, so what is keyed by the weight — the CPU GEMMs' packed copies
(`kernels.cpu_linear`) — is made once too. Caveat: the model's stacked parameters are views of one storage, which
`save_pretrained` refuses as shared tensors; save the model before serving it, or save a `copy.deepcopy` of it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import weakref

import torch

from specdec.fast.families import LlamaShape
from specdec.fast.model import FastLlama
from specdec.fast.weights import hf_ropes, hf_weights

__all__ = ["adopt_hf", "held_bytes", "duplicate_bytes", "release_freed_memory"]

#: model → {(data_ptr, shape, stride, dtype, device): the FastLlama parameter over that tensor}, both weak
_ADOPTED: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakValueDictionary]" = weakref.WeakKeyDictionary()


def _key(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device


def _adopted(tensor: torch.Tensor, like: torch.Tensor, device: torch.device,
             known: weakref.WeakValueDictionary) -> torch.nn.Parameter:
    """A FastLlama parameter shaped like `like` over `tensor`'s storage (a copy only where the dtype, device or
    layout must change)."""
    if tuple(tensor.shape) != tuple(like.shape):
        raise ValueError(f"a weight of shape {tuple(tensor.shape)} where FastLlama expects {tuple(like.shape)}")
    held = tensor.detach()
    if held.dtype != like.dtype or held.device != device:
        held = held.to(device, like.dtype)
    if not held.is_contiguous():  # (GPT-2's Conv1D [in, out] transposed: the model keeps its own layout, since
        held = held.contiguous()  # its GEMM on a transposed view would round differently)
    param = known.get(_key(held))
    if param is None:
        param = torch.nn.Parameter(held, requires_grad=False)
        known[_key(held)] = param
    return param


def _default_inv_freq(shape: LlamaShape) -> torch.Tensor:
    """The RoPE frequencies FastLlama computes from `rope_theta` when the model has no rotary embedding object."""
    rot = shape.head_dim if shape.arch.rotary_dim is None else shape.arch.rotary_dim
    return 1.0 / (shape.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))


@torch.inference_mode(False)  # (the model's re-pointed parameters stay ordinary tensors: autograd keeps working)
def adopt_hf(model: torch.nn.Module, *, kernels: str = "auto") -> FastLlama:
    """A FastLlama over the weights of `model` (a transformers causal LM of `FAMILIES`), held once (module doc).

    Same outputs as `FastLlama.from_hf(model)`; `model` keeps working and now shares its storage with the result.
    Built outside inference mode even when called inside it (the engine is): tensors made in inference mode could
    never again take part in a backward pass, and the model's own parameters now point into them.
    """
    config = model.config
    shape = LlamaShape.from_hf(config)
    ref = model.get_input_embeddings().weight
    device, dtype = ref.device, ref.dtype
    ropes = [(freq if freq is not None else _default_inv_freq(shape), scaling) for freq, scaling in
             hf_ropes(model, shape)]
    fast = FastLlama(shape, ropes=ropes, device="meta", dtype=dtype, kernels=kernels)  # nothing allocated
    for i, (freq, _) in enumerate(ropes):
        fast.register_buffer("inv_freq" if i == 0 else f"inv_freq_{i}", freq.detach().float().to(device),
                             persistent=False)
    known = _ADOPTED.setdefault(model, weakref.WeakValueDictionary())
    with torch.no_grad():
        for name, layer, tensor in hf_weights(model, shape, share=True):
            if layer is None:
                setattr(fast, name, _adopted(tensor, getattr(fast, name), device, known))
            else:
                getattr(fast, name)[layer] = _adopted(tensor, getattr(fast, name)[layer], device, known)
    if shape.tie_word_embeddings:
        fast.lm_head = fast.embed
    missing = [name for name, p in fast.named_parameters() if p.is_meta]
    if missing:
        raise KeyError(f"the checkpoint mapping gave no tensor for {', '.join(missing[:4])}")
    fast.config = config
    fast.generation_config = getattr(model, "generation_config", None)
    if device.type == "cpu":
        release_freed_memory()
    return fast.eval()


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the OS (glibc's `malloc_trim(0)`; False where there is none).

    The tensors a stack replaces are freed into glibc's heap, not unmapped: after a large block is freed glibc raises
    its mmap threshold, so blocks of a weight's size come from the heap and stay resident after `free`. Measured on
    SmolLM2-135M (0.54 GB of fp32 weights): 0.21 GB resident after the engine's build, gone after the trim
    (docs/QWEN_PAIR.md)."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def _storages(tensors) -> dict[int, int]:
    """data_ptr of each distinct storage → its bytes."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if not t.is_meta}


def held_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the distinct storages the parameters and buffers of `modules` hold together (shared storage counted
    once): the weights' share of resident memory."""
    tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
    return sum(_storages(tensors).values())


def duplicate_bytes(model: torch.nn.Module, fast: FastLlama) -> int:
    """Bytes `fast` holds beyond what `model` holds: 0 when every FastLlama tensor lies in the model's storage."""
    return held_bytes(model, fast) - held_bytes(model)
