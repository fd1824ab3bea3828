"""FP8 and int4 checkpoints into the engine: a transformers model carrying FP8 / GPTQ / AWQ linear modules, or a local
safetensors folder holding their tensors, becomes a `FastLlama` whose linear weights stay quantized
(`fast.quant.int4.Int4Weight`, `fast.quant.fp8.Fp8Weight`, attached by `fast.quant.gpu_attach`).

Recognized by the config's `quantization_config.quant_method`:
  "gptq"                qweight / qzeros / scales / g_idx, 4 bits, checkpoint_format "gptq" or "gptq_v2"; desc_act
                        (act-order) refused
  "awq"                 qweight / qzeros / scales, 4 bits, version "gemm" (zero points required)
  "fp8", "fbgemm_fp8"   e4m3 `weight` + `weight_scale_inv` (transformers' FineGrainedFP8, 128 × 128 blocks or per
                        tensor) or `weight_scale` (per channel)
  "compressed-tensors"  format "float-quantized" (or "naive-quantized" with e4m3 weights): e4m3 `weight` +
                        `weight_scale` (per tensor, channel or 128 × 128 block); `input_scale` not used; the int4
                        "pack-quantized" format is refused
Modules a checkpoint left unquantized (the LM head, as these formats usually ship it; compressed-tensors' `ignore`)
stay dense. Families: the Llama body with separate q/k/v and gate/up projections (`COVERED`); others are refused.
The folder reader is the smallest that works for the standard layouts: `*.safetensors` files (sharded or not)
read by tensor name, no transformers model built.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import SimpleNamespace

import torch

logger = logging.getLogger(__name__)

__all__ = ["METHODS", "COVERED", "quantization_method", "why_not", "load_quantized", "kernel_name",
           "bitwise_refusal"]

METHODS = ("gptq", "awq", "fp8", "fbgemm_fp8", "compressed-tensors")
COVERED = ("llama", "mistral", "qwen2", "qwen3")


def _qconfig(config) -> dict | None:
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    return q if isinstance(q, dict) else q.to_dict()


def quantization_method(config) -> str | None:
    """The checkpoint's quant_method (any, lower-case), or None for a plain one."""
    q = _qconfig(config)
    return None if q is None else str(q.get("quant_method", "unknown")).lower()


def why_not(config) -> str | None:
    """Why this quantized checkpoint cannot run on the engine (one line), or None when it can."""
    q, method = _qconfig(config), quantization_method(config)
    if method not in METHODS:
        return f"quant_method {method!r} (the engine runs {', '.join(METHODS)})"
    if config.model_type not in COVERED:
        return f"quantized {config.model_type} models (the engine's quantized path covers {', '.join(COVERED)})"
    if method in ("gptq", "awq") and int(q.get("bits", q.get("w_bit", 4))) != 4:
        return f"{method} with {q.get('bits', q.get('w_bit'))} bits (4-bit only)"
    if method == "gptq" and q.get("desc_act"):
        return "act-order GPTQ (desc_act=True)"
    if method == "gptq" and q.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        return f"GPTQ checkpoint_format {q.get('checkpoint_format')!r}"
    if method == "awq" and (str(q.get("version", "gemm")).lower() != "gemm" or not q.get("zero_point", True)):
        return f"AWQ version {q.get('version')!r} / zero_point {q.get('zero_point', True)} (the GEMM layout with zeros)"
    if method == "compressed-tensors" and q.get("format") not in ("float-quantized", "naive-quantized"):
        return f"compressed-tensors format {q.get('format')!r} (float-quantized FP8 only)"
    return None


class _Tensors:
    """Tensors by name: a model's parameters and buffers, or a folder's safetensors files (read on demand)."""

    def __init__(self, source):
        self._dense, self._files = {}, {}
        if isinstance(source, torch.nn.Module):
            self._dense = {**dict(source.named_buffers()), **dict(source.named_parameters())}
            return
        from safetensors import safe_open

        files = sorted(Path(source).glob("*.safetensors"))
        if not files:
            raise ValueError(f"{source}: no *.safetensors files")
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    self._files[name] = f

    def has(self, name: str) -> bool:
        return name in self._dense or name in self._files

    def get(self, name: str) -> torch.Tensor:
        if name in self._dense:
            return self._dense[name].detach()
        from safetensors import safe_open

        if name not in self._files:
            raise KeyError(name)
        with safe_open(str(self._files[name]), framework="pt") as handle:
            return handle.get_tensor(name)


def _linear(src: _Tensors, prefix: str, q: dict, device):
    """One projection: an Int4Weight / Fp8Weight, or the dense weight tensor."""
    from specdec.fast.quant.fp8 import FP8, Fp8Weight
    from specdec.fast.quant.int4 import from_awq, from_gptq

    get = lambda n: src.get(f"{prefix}.{n}").to(device)  # noqa: E731
    method = str(q.get("quant_method")).lower()
    if src.has(prefix + ".qweight"):
        if method == "gptq":
            g_idx = get("g_idx") if src.has(prefix + ".g_idx") else None
            return from_gptq(get("qweight"), get("qzeros"), get("scales"), g_idx,
                             checkpoint_format=q.get("checkpoint_format", "gptq"), name=prefix)
        if method == "awq":
            return from_awq(get("qweight"), get("qzeros"), get("scales"), name=prefix)
        raise ValueError(f"{prefix}: packed int4 tensors in a {method!r} checkpoint")
    if src.has(prefix + ".weight_packed"):
        raise ValueError(f"{prefix}: compressed-tensors pack-quantized int4 is not covered")
    weight = get("weight")
    if weight.dtype == FP8:
        scale_name = next((n for n in ("weight_scale_inv", "weight_scale") if src.has(f"{prefix}.{n}")), None)
        if scale_name is None:
            raise ValueError(f"{prefix}: an e4m3 weight without weight_scale_inv / weight_scale")
        source = {"compressed-tensors": "compressed-tensors FP8", "fbgemm_fp8": "fbgemm FP8"}.get(method, "FP8")
        return Fp8Weight.from_checkpoint(weight, get(scale_name), source, name=prefix)
    if not weight.is_floating_point() or weight.element_size() == 1:
        raise ValueError(f"{prefix}: a {weight.dtype} weight this loader does not read")
    return weight


def _stack(parts: list, where: str):
    from specdec.fast.quant import fp8, int4

    kinds = {type(p) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"{where}: its projections mix quantized and dense weights")
    kind = kinds.pop()
    if kind is torch.Tensor or issubclass(kind, torch.Tensor):
        return torch.cat(parts)
    return (int4.join if kind is int4.Int4Weight else fp8.join)(parts)


def _ropes(source, config, shape):
    from specdec.fast.weights import hf_ropes

    if isinstance(source, torch.nn.Module):
        return hf_ropes(source, shape)
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    rotary = next(v for k, v in vars(module).items() if k.endswith("RotaryEmbedding") and isinstance(v, type))
    return hf_ropes(SimpleNamespace(model=SimpleNamespace(rotary_emb=rotary(config)), config=config), shape)


def kernel_name(device: torch.device) -> str:
    from specdec.fast.quant.fp8 import fp8_kernel

    if device.type != "cuda":
        return "the reference (each weight dequantized, then F.linear) on CPU"
    from specdec.fast.kernels.quant_gemv import GEMV_ROWS, quant_kernel

    extra = "; FP8 per-channel / per-tensor through torch._scaled_mm" if fp8_kernel() == "scaled_mm" else ""
    if quant_kernel() == "gemv":
        extra += f"; ≤ {GEMV_ROWS} rows through the decode GEMV (SPECDEC_QUANT_KERNEL=gemv)"
    return f"specdec's Triton weight-only kernel (≤ 4096 rows; dequantized + cuBLAS above){extra}"


def load_quantized(source, *, device=None, dtype: torch.dtype | None = None, kernels: str = "auto"):
    """A `FastLlama` from a quantized transformers model or local folder (module doc); its linear weights quantized
    on `device` (default: the model's, or CUDA when there is one), the rest in `dtype` (default: bf16 on CUDA,
    float32 on CPU). ValueError for a layout it does not read, naming the tensor."""
    from transformers import AutoConfig

    from specdec.fast.families import LlamaShape
    from specdec.fast.model import FastLlama
    from specdec.fast.quant.gpu_attach import attach, describe, quant_bytes

    config = source.config if isinstance(source, torch.nn.Module) else AutoConfig.from_pretrained(
        str(source), local_files_only=True)
    reason = why_not(config)
    if reason is not None:
        raise ValueError(f"the engine does not run {reason}")
    q = _qconfig(config)
    shape = LlamaShape.from_hf(config)
    if device is None:
        ref = source.get_input_embeddings().weight if isinstance(source, torch.nn.Module) else None
        device = ref.device if ref is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    src = _Tensors(source)
    fast = FastLlama(shape, ropes=_ropes(source, config, shape), device=device, dtype=dtype, kernels=kernels)
    quant, root = {}, "model."
    with torch.no_grad():
        dense = {"embed": root + "embed_tokens.weight", "final_norm": root + "norm.weight"}
        for name, tensor_name in dense.items():
            getattr(fast, name).copy_(src.get(tensor_name))
        for i in range(shape.n_layers):
            pre = f"{root}layers.{i}."
            attn, mlp = pre + "self_attn.", pre + "mlp."
            groups = {"wqkv": [attn + n for n in ("q_proj", "k_proj", "v_proj")], "wo": [attn + "o_proj"],
                      "w_gate_up": [mlp + "gate_proj", mlp + "up_proj"], "w_down": [mlp + "down_proj"]}
            for name, prefixes in groups.items():
                parts = [_linear(src, p, q, device) for p in prefixes]
                w = _stack(parts, f"{name}[{i}]") if len(parts) > 1 else parts[0]
                if isinstance(w, torch.Tensor):
                    getattr(fast, name)[i].copy_(w)
                else:
                    quant[(name, i)] = w  # (GPTQ / AWQ scales stay in their dtype: fp16 → bf16 would move them)
            if shape.qkv_bias:
                fast.bqkv[i].copy_(torch.cat([src.get(attn + n + ".bias") for n in ("q_proj", "k_proj", "v_proj")]))
            if shape.qk_norm:
                fast.q_norm[i].copy_(src.get(attn + "q_norm.weight"))
                fast.k_norm[i].copy_(src.get(attn + "k_norm.weight"))
            fast.attn_norm[i].copy_(src.get(pre + "input_layernorm.weight"))
            fast.mlp_norm[i].copy_(src.get(pre + "post_attention_layernorm.weight"))
        if not shape.tie_word_embeddings:
            head = _linear(src, "lm_head", q, device)
            if isinstance(head, torch.Tensor):
                fast.lm_head.copy_(head)
            else:
                quant[("lm_head", None)] = head
    attach(fast, quant)
    fast.config = config
    fast.generation_config = getattr(source, "generation_config", None)
    logger.info("%s: %s kept quantized (%.2f GiB read per step) on %s", q.get("quant_method"), describe(fast),
                quant_bytes(fast) / 2**30, kernel_name(device))
    return fast.eval()


def bitwise_refusal(model) -> str | None:
    """Why `bitwise=True` cannot run this model's quantized weights, or None. Covered: int4 (GPTQ / AWQ) and FP8
    (every scale layout) on CUDA, the Triton kernel for every row count with one config per weight shape."""
    from specdec.fast.quant.gpu_attach import quantized_weights
    from specdec.fast.quant.weight import QuantWeight

    ours = [w for w in quantized_weights(model) if not isinstance(w, QuantWeight)]  # (GGUF's: refused in fast.layers)
    if model.device.type != "cuda" and ours:
        return ("bitwise=True covers FP8 / int4 weights on CUDA only (the Triton kernel for every row count); on the "
                "CPU they run the dequantized reference")
    return None
