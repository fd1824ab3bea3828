"""Turning what a user passes (transformers models, folders, specdec drafters) into the engine's pieces.

Coverage is `specdec.fast.families.FAMILIES` (each config checked by `LlamaShape.from_hf`, which names what it refuses).

Anything the engine does not cover raises `UnsupportedModel` here, before any compute. `EngineConfig.model_impl`
routes a model the fast bodies do not cover to the transformers backend (`fast.hf_backend`: the model's own modules,
the engine's attention and cache; "auto" does, with one log line); `covers` / `uncovered_reason` keep naming the
fast bodies' coverage (what the entry points route by).

A transformers model's weights are held once: the engine's `FastLlama` reads the model's own storage
(`fast.held_once.adopt_hf`; q|k|v and gate|up are stacked once and the model's parameters re-pointed into the stacks),
so the model keeps working (the text API, `specdec check`, the eager loop) without a second copy beside it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from specdec.drafters.loop_adapter import LoopOnEngine, is_loop_only
from specdec.drafters.protocol import LoopDrafter, SlotDrafter, is_slot_drafter, takes_engine_call
from specdec.engine.config import UnsupportedModel
from specdec.drafters.model import ModelDrafter
from specdec.engine.drafters import SlotModel
from specdec.drafters.formats import is_drafter, load_drafter
from specdec.fast.held_once import adopt_hf
from specdec.fast.held_quantized import is_released, quantized_over, share_dense_tensors
from specdec.fast.hf_backend import HFBackendModel, UnsupportedArchitecture
from specdec.fast.model import FAMILIES, FastLlama

logger = logging.getLogger(__name__)

__all__ = ["build_model", "build_drafter", "covers", "covers_drafter", "uncovered_reason", "notice_fallback"]

# Modules whose weights the engine reads as plain tensors. Anything else (quantized linears from torch.ao,
# bitsandbytes or transformers.integrations, PEFT adapters, custom layers) computes something a copy of
# `.weight` would not reproduce.
_PLAIN_MODULES = ("torch.nn.modules.", "transformers.models.", "transformers.activations", "transformers.modeling_",
                  "transformers.pytorch_utils")  # GPT-2's Conv1D
_noticed: set[str] = set()


def covers(model) -> bool:
    """True when the engine can run this model (a covered architecture and attention variant)."""
    try:
        _fast_model(model, check_only=True)
    except UnsupportedModel:
        return False
    return True


def uncovered_reason(target, drafter=None) -> str | None:
    """Why the engine cannot run this target (and drafter), in one line; None when it can."""
    for what, model in (("target", target), ("drafter", drafter)):
        try:
            if what == "target":
                _fast_model(model, check_only=True)
            elif not covers_drafter(model):
                return f"the engine does not run this drafter ({type(model).__name__})"
        except UnsupportedModel as err:
            return f"{what}: {err}"
    return None


def notice_fallback(reason: str) -> None:
    """One log line (once per reason and process) when a model falls back to the eager transformers loop."""
    if reason not in _noticed:
        _noticed.add(reason)
        logger.warning("%s; running on the eager transformers loop instead of the engine", reason)


def _uncopyable(model: torch.nn.Module) -> str | None:
    """Why the engine cannot copy this transformers model's weights (quantized, adapters, custom layers)."""
    for name, module in model.named_modules():
        kind = type(module)
        if not kind.__module__.startswith(_PLAIN_MODULES):
            return (f"{name or 'the model'} is a {kind.__module__}.{kind.__name__} (quantized, adapter or custom "
                    "layers: the engine copies plain weights only)")
    for name, param in model.named_parameters():
        if param.is_meta or type(param) not in (torch.nn.Parameter, torch.Tensor) or not param.is_floating_point():
            return (f"parameter {name} is not a plain floating-point tensor ({type(param).__name__}, {param.dtype}, "
                    f"{param.device}): quantized or offloaded weights are not copied by the engine")
    return None


def covers_drafter(drafter) -> bool:
    """True for the drafters the engine runs: None, any `SlotDrafter` (`drafters.protocol.is_slot_drafter`: prompt
    lookup, n-gram tables, a drafter written against the protocol), feature heads (specdec's, EAGLE, EAGLE-3,
    Medusa, speculators: objects or folders, `drafters.formats`), and draft models it covers (transformers models,
    folders, a `ModelDrafter` — the cross-vocabulary and `fast.target` ones included — over one); other loop
    drafters run on the transformers loop."""
    if drafter is None or is_drafter(drafter):
        return True
    if isinstance(drafter, ModelDrafter):  # (a subclass whose propose needs the loop's arguments stays there)
        return takes_engine_call(drafter) and (drafter.on_engine or covers(drafter.model))
    if is_slot_drafter(drafter):
        return True
    return not isinstance(drafter, LoopDrafter) and covers(drafter)


def refuse_own_target(model) -> None:
    """`UnsupportedModel` for a user's `Target` (`models.protocol.own_methods`): the engine runs the transformers model
    a specdec target wraps over the engine's own cache and would never call the target's methods."""
    from specdec.models.protocol import own_methods

    own = own_methods(model)
    if own:
        raise UnsupportedModel(f"{type(model).__name__} is a specdec Target whose {', '.join(own)} its own class "
                               "defines: the engine runs a transformers model's modules over its own KV cache and "
                               "never calls a Target's methods (the eager loop does)")


def _fast_model(model, check_only: bool = False, gguf_weights: str = "auto",
                bitwise: bool = False) -> FastLlama | None:
    if isinstance(model, FastLlama):
        return model
    inner = getattr(model, "model", None)  # specdec wrappers: HFCausalLM, ModelDrafter, FastTarget, FastDrafter
    if not isinstance(model, torch.nn.Module) and inner is not None and not isinstance(model, (str, Path)):
        refuse_own_target(model)
        return _fast_model(inner, check_only, gguf_weights, bitwise)
    if isinstance(model, (str, Path)):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model), local_files_only=True)
    else:
        config = getattr(model, "config", None)
        if config is None or not isinstance(model, torch.nn.Module):
            raise UnsupportedModel(f"the engine needs a transformers model or a local folder, got {type(model).__name__}")
        if is_released(model):  # its dense weights live in the quantized FastLlama now (`fast.held_quantized`)
            return None if check_only else _released_body(model, gguf_weights, bitwise)
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False) or model_type not in FAMILIES:
        raise UnsupportedModel(
            f"the engine covers model_type {', '.join(FAMILIES)}; got {model_type!r} (use engine='hf')"
        )
    try:
        from specdec.fast.model import LlamaShape

        LlamaShape.from_hf(config)
    except ValueError as err:
        raise UnsupportedModel(str(err)) from None
    from specdec.loading import quantized as gpu_quant  # FP8 / GPTQ / AWQ checkpoints: weights kept quantized

    method = gpu_quant.quantization_method(config)  # (a model object of another method: `_uncopyable` names it)
    if method in gpu_quant.METHODS or method is not None and isinstance(model, (str, Path)):
        reason = gpu_quant.why_not(config)
        if reason is not None:
            raise UnsupportedModel(f"the engine does not run {reason}")
        if check_only:
            return None
        try:
            return gpu_quant.load_quantized(model)
        except (ValueError, KeyError) as err:
            raise UnsupportedModel(f"the engine cannot read this quantized checkpoint ({err})") from None
    reason = _uncopyable(model) if isinstance(model, torch.nn.Module) else None
    if reason is not None:
        raise UnsupportedModel(reason)
    if check_only:
        return None
    try:  # a model's own tensors, held once (`fast.held_once`); a folder is read and copied by `FastLlama.from_hf`
        if isinstance(model, (str, Path)):
            return FastLlama.from_hf(model)
        from specdec.fast.quant.attach import quantized_from_hf  # a GGUF on the CPU: its weights stay quantized

        fast = quantized_from_hf(model, weights=gguf_weights, bitwise=bitwise)
        return share_dense_tensors(model, fast) if fast is not None else adopt_hf(model)
    except (KeyError, AttributeError, TypeError) as err:  # a layout the copy does not know: not a crash
        raise UnsupportedModel(f"the engine cannot copy this {model_type} model ({type(err).__name__}: {err})") \
            from None


def _released_body(model, gguf_weights: str, bitwise: bool) -> FastLlama:
    """The quantized FastLlama a released model's weights live in; refused where the dense weights are asked for."""
    from specdec.fast.quant.attach import resolve_weights

    if resolve_weights(gguf_weights, bitwise) != "quantized":
        raise ValueError("this GGUF model's dense weights were released to its quantized engine model "
                         "(`specdec.load`: `fast.held_quantized`); load it again for gguf_weights='dequantized' or "
                         "bitwise=True")
    return quantized_over(model)


def build_model(target, kernels: str = "auto", bitwise: bool = False, model_impl: str = "auto",
                gguf_weights: str = "auto") -> FastLlama:
    """The engine's target body: `model_impl` (`EngineConfig.model_impl`) picks a fast family body or the
    transformers backend (`fast.hf_backend.HFBackendModel`); `gguf_weights` (`EngineConfig.gguf_weights`) whether a
    GGUF's weights stay quantized on the CPU (`fast.quant.attach`)."""
    model = _model_body(target, model_impl, bitwise, gguf_weights)
    model.kernels = kernels
    # (a ValueError for families it does not cover: never a silent fallback). Drafters keep their own kernels: under
    # bitwise every committed token is the target's own (argmax, or `verify_coupled`'s race draw), so a draft only
    # decides how many tokens a step commits, never which
    if bitwise:  # (which quantized formats the bitwise mode covers: `loading.quantized.bitwise_refusal`)
        from specdec.loading.quantized import bitwise_refusal

        if bitwise_refusal(model) is not None:
            raise ValueError(bitwise_refusal(model))
    model.bitwise = bitwise
    return model


def _model_body(model, model_impl: str = "auto", bitwise: bool = False, gguf_weights: str = "auto"):
    """The fast body (`_fast_model`) or the transformers backend, as `model_impl` says ("auto": fast where it covers
    the model, else the backend, one log line per model type)."""
    if isinstance(model, HFBackendModel) or model_impl == "transformers":
        return model if isinstance(model, HFBackendModel) else _backend(model)
    try:
        return _fast_model(model, gguf_weights=gguf_weights, bitwise=bitwise)
    except UnsupportedModel as err:
        if bitwise and model_impl == "auto":
            raise UnsupportedModel(f"{err}; bitwise=True needs a fast family body (the transformers backend runs "
                                   "the model's own modules)") from None
        if model_impl == "fast" or isinstance(model, FastLlama):
            raise
        backend = _backend(model)
        if backend.shape.model_type not in _noticed:
            _noticed.add(backend.shape.model_type)
            logger.info("model_type %r runs on the engine's transformers backend (its own modules, the engine's "
                        "attention and KV cache): %s", backend.shape.model_type, err)
        return backend


def _backend(model) -> HFBackendModel:
    try:
        return HFBackendModel(_hf_module(model))
    except UnsupportedArchitecture as err:
        raise UnsupportedModel(str(err)) from None


def _hf_module(model):
    """The transformers model behind a specdec wrapper (`HFCausalLM`, `ModelDrafter`, ...) or a local folder."""
    if isinstance(model, (str, Path)):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(model), dtype="auto", local_files_only=True)
    inner = getattr(model, "model", None)
    if not isinstance(model, torch.nn.Module) and inner is not None:
        refuse_own_target(model)
        return _hf_module(inner)
    return model


def build_drafter(drafter, engine):
    """The engine's drafter for what a user passed: a `SlotDrafter` as it is (prompt lookup, n-gram tables, a
    plugin: `drafters.protocol.is_slot_drafter`), a feature head bound to the target, or a `ModelDrafter` (its
    cross-vocabulary kind included) bound to the engine's state over a draft model, a `HierarchicalDrafter` over a
    table, a rule, a model drafter or another such hierarchy as `engine.hierarchy.EngineHierarchy` (each model bound
    as a draft model's), another loop-only drafter (a duck-typed `LoopDrafter`, a hierarchy subclass) behind
    `drafters.loop_adapter.LoopOnEngine` (eager steps only, both); `UnsupportedModel` for anything else."""
    if is_drafter(drafter) and isinstance(engine.model, HFBackendModel):
        raise UnsupportedModel(f"feature heads read the target's hidden states from a fast family body; the target "
                               f"runs on the transformers backend ({engine.model.shape.model_type})")
    if is_drafter(drafter):  # a head or its folder (any `drafters.formats` format): drafts from target features
        from specdec.engine.feature_drafter import EngineFeatureDrafter, EngineMedusaDrafter
        from specdec.fast.medusa import MedusaHeads

        head = load_drafter(drafter, engine.model, name="drafter")
        if isinstance(head, MedusaHeads):
            return EngineMedusaDrafter(head, engine.state)
        return EngineFeatureDrafter(head, engine.state, engine.max_batch, engine.num_positions,
                                    engine.max_draft_tokens)
    if isinstance(drafter, (torch.nn.Module, str, Path)):  # a draft model: the model drafter over it
        return _bind_model(drafter, None, engine)
    if isinstance(drafter, ModelDrafter) and takes_engine_call(drafter):  # one class for both runners: bound
        return _bind_model(drafter.model, drafter, engine)
    if is_slot_drafter(drafter):  # one implementation for both runners, or written against the engine's protocol
        size = drafter.vocab_size if isinstance(drafter, LoopDrafter) else None  # (a plugin: q checked per step)
        if size is not None and size != engine.vocab_size:
            raise ValueError(f"draft and target vocabularies differ: drafter has {size} tokens, target has "
                             f"{engine.vocab_size}")
        return drafter
    if is_loop_only(drafter):  # a loop drafter, begun and called row by row every step (`drafters.loop_adapter`)
        if engine.device.type == "cuda" and engine.config.cuda_graphs is not False and \
                getattr(engine.model, "capturable", True):
            raise UnsupportedModel(f"{type(drafter).__name__} is a loop drafter (host reads every step): on the engine "
                                   "it needs EngineConfig(cuda_graphs=False) (specdec.generate sets it), or engine='hf'")
        from specdec.engine.hierarchy import runs_on_engine

        if runs_on_engine(drafter):  # each of its models on the engine's slot state, a table or rule as it is
            return _bind_hierarchy(drafter, engine)
        return LoopOnEngine(drafter, engine.vocab_size)
    why = (" (its propose needs the loop's sampling arguments; the engine calls propose(context, num_draft_tokens))"
           if isinstance(drafter, SlotDrafter) else "")
    raise UnsupportedModel(f"the engine does not run {type(drafter).__name__} drafters{why}: use engine='hf'")


def _bind_hierarchy(drafter, engine):
    """A `HierarchicalDrafter` as `engine.hierarchy.EngineHierarchy`, its middle model and any model under it (a model
    drafter, another hierarchy: bound in turn) each on a slot state of its own."""
    from specdec.engine.hierarchy import EngineHierarchy, runs_on_engine

    inner = drafter.inner
    if runs_on_engine(inner):
        inner = _bind_hierarchy(inner, engine)
    elif isinstance(inner, ModelDrafter):
        inner = _bind_model(inner.model, inner, engine)
    return EngineHierarchy(drafter, _bind_model(drafter.model, None, engine).state, inner)


def _bind_model(draft_model, drafter: ModelDrafter | None, engine) -> ModelDrafter:
    """`drafter` (a new `ModelDrafter` when None) over the engine's state (`engine.drafters.SlotModel`): a slot cache
    over the engine's body of `draft_model` (a fast family body, or the transformers backend as `model_impl` says)."""
    impl, vocab = engine.config.model_impl, engine.vocab_size
    inputs = None if drafter is None else drafter.engine_inputs()  # (a cross-vocabulary draft's spelling)
    cross_vocab = inputs is not None
    model = _model_body(draft_model, impl, gguf_weights=engine.config.gguf_weights)
    if model.device != engine.device:
        model = model.to(engine.device)
    if cross_vocab and isinstance(model, HFBackendModel):
        raise UnsupportedModel("the cross-vocabulary drafter embeds the target's tokens in its own model: it needs a "
                               "fast family body (model_impl='fast' or 'auto' with a covered draft model)")
    size = drafter.vocab_size if cross_vocab else model.shape.vocab_size
    if size != vocab:
        raise ValueError(f"the vocabulary bridge maps into {size} target ids; the target has {vocab}" if cross_vocab
                         else f"draft and target vocabularies differ: drafter has {size} tokens, target has {vocab}; "
                         "speculative decoding needs the same vocabulary")
    model.kernels = engine.config.kernels
    if cross_vocab and model.shape.vocab_size < drafter.draft_vocab_size:
        raise ValueError(f"the draft model has {model.shape.vocab_size} logits; its tokenizer has "
                         f"{drafter.draft_vocab_size} ids")
    state = SlotModel(model, engine.max_batch, engine.num_positions, inputs=inputs,
                      state=engine.state if cross_vocab else None)
    return ModelDrafter(state=state) if drafter is None else drafter.with_state(state)
