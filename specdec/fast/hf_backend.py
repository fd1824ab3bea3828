"""The transformers backend: any decoder-only transformers model runs in the engine with its own modules.

vLLM's Transformers backend, for specdec's engine: the model's own embeddings, norms, projections, RoPE, MLPs,
experts and LM head run as transformers wrote them; only the attention is the engine's. transformers calls one
attention function per layer through its registry (`transformers.AttentionInterface`, selected by
`config._attn_implementation`), after the layer's own q/k/v projections and RoPE. `HFBackendModel` registers
`engine_attention` there and names it in the model's configs for the length of each forward (the model is not
changed outside one: the text API, `specdec check` and the eager loop keep its own attention). The function writes
the layer's new keys and values into the engine's cache at the rows' write slots (`fast.cache.KVCache` or
`PagedKVCache`, the same calls as `FastLlama`'s layers) and attends over the cache with the engine's masks
(`kernels.attention.slot_attention`: positions, the junk slot, sliding windows, soft-caps, token trees). No model
code is copied; the model runs with no transformers cache (`use_cache=False`) and no mask of its own.

`HFBackendModel` presents `FastLlama`'s interface to the engine (`shape`, `device`, `dtype`, `forward(tokens, cache,
valid, ...)` with the same slots, positions, junk slot and tree semantics, `new_cache`, `rope_tables`,
`feature_layers`, `weight_bytes`, `kernels`, `bitwise`), so block tables, rollback (a length move), per-request
parameters, processors, grammar, logprobs and continuous batching run unchanged.

Built by a probe (`probe`): one token through the model finds, in call order, the modules that call the attention
function (the engine's layer index of each), their query and key/value heads, head dims and windows; then a short
text through the engine's path must give the model's own logits. Attention sinks (gpt-oss's `s_aux`) and ALiBi
biases are honoured (`fast.hf_attention`); the families whose attention does not go through the registry (Falcon,
Bloom, MPT, GPT-Neo, XGLM, GPT-NeoX-Japanese) run through per-family stand-ins for their attention modules' `forward`
(`fast.hf_adapters`). A model whose attention bypasses the registry with no adapter (CPM-Ant), whose
layers keep state outside K/V (state-space or recurrent layers), or whose attention takes inputs the engine does not
give (relative position biases, chunked attention) is refused with `UnsupportedArchitecture` (the engine's `UnsupportedModel`), naming why.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from dataclasses import dataclass, field

import torch

from specdec.fast.cache import KVCache, TreeNodes, place_tokens
from specdec.fast.hf_adapters import adapter_for
from specdec.fast.hf_engine_attention import (_FORWARD, ATTENTION_NAME, SELF_CHECK_WINDOW, UnsupportedArchitecture,
                                             _Forward, _refusal, _register, engine_attention)
from specdec.fast.kernels.select import KernelChoice, check_kernel

logger = logging.getLogger(__name__)

__all__ = ["HFBackendModel", "BackendShape", "BackendArch", "UnsupportedArchitecture", "engine_attention",
           "ATTENTION_NAME"]

@dataclass(frozen=True)
class BackendArch:
    """What the engine reads of a model's attention pattern (`FastLlama`'s `shape.arch` fields it uses)."""

    layer_windows: tuple = ()  # per layer: its sliding window, or None (() = no layer has one)
    rope_limit: int | None = None
    embed_scale: float | None = None
    fusable: bool = False  # never the fused Triton layer: the model's own modules run

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None


@dataclass(frozen=True)
class BackendShape:
    """The numbers the engine sizes caches and checks requests by (`FastLlama.shape`'s fields it reads)."""

    model_type: str
    vocab_size: int
    dim: int
    n_layers: int  # layers that attend (one KV cache layer each)
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_positions: int | None = None
    arch: BackendArch = field(default_factory=BackendArch)

    @property
    def context(self) -> int | None:
        return self.max_positions


class HFBackendModel(torch.nn.Module):
    """A transformers causal LM behind `FastLlama`'s interface (see the module doc); holds the model itself (its
    weights are not copied), in eval mode."""

    normed_output = True
    capturable = False  # eager steps: a model's own code may sync the host (MoE routing), which a CUDA graph cannot

    def __init__(self, model: torch.nn.Module, kernels: str = "auto"):
        super().__init__()
        from transformers import PretrainedConfig, PreTrainedModel

        config = getattr(model, "config", None)
        if not isinstance(model, PreTrainedModel) or config is None:
            raise _refusal(f"the transformers backend needs a transformers model, got {type(model).__name__}")
        model_type = getattr(config, "model_type", None)
        if getattr(config, "is_encoder_decoder", False):
            raise _refusal(f"{model_type} is an encoder-decoder model: the transformers backend runs decoders")
        self._adapted = [(m, a) for m in model.modules() if (a := adapter_for(m)) is not None]
        for module, adapter in self._adapted:
            why = adapter.why_not(module)
            if why is not None:
                raise _refusal(f"{model_type}: the engine's attention does not compute {why}")
        if not self._adapted and not type(model)._can_set_attn_implementation():
            raise _refusal(f"{model_type} ({type(model).__name__}) computes attention inside its own modules, not "
                           "through transformers' attention interface, and `fast.hf_adapters` has no adapter for "
                           "it: the engine cannot plug its attention in")
        self.hf = model.eval()
        self.kernels = kernels
        self._configs = []  # every config a module reads `_attn_implementation` from (a text config included)
        for module in model.modules():
            sub = getattr(module, "config", None)
            if isinstance(sub, PretrainedConfig) and all(sub is not c for c in self._configs):
                self._configs.append(sub)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.config, self.generation_config = config, getattr(model, "generation_config", None)
        self.feature_layers: tuple[int, ...] | None = None  # (the backend serves no feature heads: build refuses them)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        _register()
        self._layers: dict = {}
        self.shape = self._probe(model_type, text)

    # ------------------------------------------------------------------------------------------- the probe
    def _probe(self, model_type: str, text) -> BackendShape:
        """Find the attention layers in call order, then check the engine's path against the model's own logits."""
        step = _Forward(layers={}, found=[])
        ids = torch.ones(1, 1, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self._run(step, ids, ids * 0, None, compute_logits=True)
        found = step.found
        if not found:
            raise _refusal(f"{model_type} never called the attention function it names: its attention does not go "
                           "through transformers' attention interface")
        modules = [f[0] for f in found]
        if len({id(m) for m in modules}) != len(modules):
            raise _refusal(f"{model_type} calls one attention module more than once per forward (shared layers): "
                           "each needs its own KV cache layer")
        layers = getattr(text, "num_hidden_layers", len(found))
        if len(found) != layers:
            raise _refusal(f"{model_type} attends in {len(found)} of its {layers} layers: the others (state-space, "
                           "recurrent or convolution layers) keep a state the engine's KV cache does not hold")
        _, q_shape, k_shape, v_shape, _ = found[0]
        for module, q, k, v, _ in found:
            if (q[1], k[1:], v[1:]) != (q_shape[1], k_shape[1:], k_shape[1:]):
                raise _refusal(f"{model_type}'s attention layers differ in heads or head dims ({q} / {k} / {v}; "
                               f"layer 0: {q_shape} / {k_shape}) or its values' head dim differs from its keys': "
                               "the engine keeps one K/V shape for every layer")
        self._layers = {id(m): i for i, m in enumerate(modules)}
        windows = tuple(f[4] for f in found)
        types = set(getattr(text, "layer_types", None) or ())
        if types - {"full_attention", "sliding_attention"} or "sliding_attention" in types and not any(windows):
            raise _refusal(f"{model_type}'s layer types {sorted(types)} are not all given to its attention as "
                           "full or sliding-window attention (a window or chunk kept only in its own mask)")
        shape = BackendShape(
            model_type=str(model_type), vocab_size=int(logits.shape[-1]), dim=int(getattr(text, "hidden_size", 0) or 0),
            n_layers=len(found), n_heads=q_shape[1], n_kv_heads=k_shape[1], head_dim=k_shape[3],
            max_positions=_context(text), arch=BackendArch(layer_windows=windows if any(windows) else ()))
        self.shape = shape
        self._self_check(model_type)
        return shape

    def _self_check(self, model_type: str) -> None:
        """A short text through the engine's path (a prefill, then one token) must give the model's own logits."""
        vocab = self.shape.vocab_size
        # the windows the engine's path found and those the config declares (a window lost on the way is checked)
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        windows = [w for w in self.shape.arch.layer_windows if w] + [
            w for name in ("sliding_window", "window_size") if isinstance(w := getattr(text, name, None), int) and w > 0]
        # (long enough that a window of up to SELF_CHECK_WINDOW tokens drops a position; longer ones are not checked)
        length = max(6, min(min(windows, default=0) + 2, SELF_CHECK_WINDOW + 2))
        if self.shape.max_positions is not None:
            length = min(length, self.shape.max_positions)
        ids = (torch.arange(length, device=self.device) * 7 + 3) % vocab
        with torch.inference_mode():
            try:  # its eager attention: what the model computes (sdpa drops Gemma 2's softcap in transformers 5.17;
                # an adapted module may name another: `hf_adapters.Adapter.reference`)
                with self._attention(self._reference()):
                    ref = self.hf(input_ids=ids[None], use_cache=False).logits[0].float()
            except Exception as err:  # noqa: BLE001 (its own attention may not run here: nothing to compare with)
                logger.debug("%s: the model's own forward failed (%s); the backend's self-check is skipped",
                             model_type, err)
                return
            cache = self.new_cache(1, length)
            first = self(ids[None, :-1], cache)[0]
            last = self(ids[None, -1:], cache)[0]
        ours = torch.cat([first, last])
        tol = (1e-3 if self.dtype == torch.float32 else 5e-2) * max(1.0, float(ref.abs().max()))
        err = float((ours - ref).abs().max())
        if not err <= tol:
            raise _refusal(f"{model_type} computes other logits through the engine's attention than through its own "
                           f"(max difference {err:.3g}): it needs something the engine's attention does not give it "
                           "(a bias in its mask, a state outside K/V) or its outputs depend on what shares a forward "
                           "(activations quantized per call)")

    # ------------------------------------------------------------------------------------------- FastLlama's interface
    kernels = KernelChoice("The attention kernel (`slot_attention`'s \"auto\" / \"triton\" / \"reference\"); the "
                           "layers are the model's.")

    @property
    def bitwise(self) -> bool:
        return False

    @bitwise.setter
    def bitwise(self, value: bool) -> None:
        if value:
            raise ValueError("bitwise=True runs the fast Llama body's batch-invariant kernels; the transformers "
                             f"backend ({self.shape.model_type}) runs the model's own modules")

    @property
    def device(self) -> torch.device:
        return self.hf.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        weight = self.hf.get_input_embeddings().weight
        return weight.dtype if weight.is_floating_point() else torch.float32

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step reads: every parameter and buffer once, the input embeddings only when tied."""
        embed = self.hf.get_input_embeddings().weight
        head = self.hf.get_output_embeddings()
        tied = head is not None and head.weight is embed
        seen, total = set(), 0
        for p in list(self.hf.parameters()) + list(self.hf.buffers()):
            if id(p) in seen or (p is embed and not tied):
                continue
            seen.add(id(p))
            total += p.numel() * p.element_size()
        return total

    def new_cache(self, batch_size: int, num_slots: int) -> KVCache:
        """A zeroed cache with at least `num_slots` usable slots (+1 junk slot, rounded up to 16)."""
        return KVCache.zeros(self.shape, batch_size, num_slots, device=self.device, dtype=self.dtype)

    def rope_tables(self, num_positions: int) -> tuple[None, None]:
        """The model computes its own RoPE (nothing to build before a capture)."""
        return None, None

    def forward(self, tokens: torch.Tensor | None, cache, valid: torch.Tensor | None = None, *,
                embeds: torch.Tensor | None = None, last_only: bool = False, advance: bool = True,
                return_hidden: bool = False, compute_logits: bool = True, kernels: str | None = None,
                tree: TreeNodes | None = None, causal_prefix: bool = False):
        """`FastLlama.forward`'s contract: `tokens [B, k]` appended at each row's own slots → logits `[B, k, V]`
        float32 (`[B, 1, V]` with last_only; None with compute_logits=False); `(logits, None)` with return_hidden
        (no hidden states: feature heads need the fast body)."""
        if embeds is not None:
            raise ValueError("the transformers backend takes token ids (embeds= is for the fast body's drafters)")
        placed = place_tokens(cache.lengths, tokens.shape[1], cache.span - 1, valid, tree)
        rope_pos, slots = placed.positions, placed.slots
        step = _Forward(self._layers, cache, cache.write_index(slots), rope_pos if tree is None else slots, placed.tree,
                        self._kernels if kernels is None else check_kernel(kernels, "kernels"), causal_prefix)
        if tree is not None and self._adapted:  # (an ALiBi bias reads keys' positions, not their slots)
            span = cache.span
            keys = torch.arange(span, device=slots.device).expand(slots.shape[0], span).clone()
            step.key_positions = keys.scatter_(1, slots.clamp(max=span - 1), rope_pos.clamp(max=span - 1))
        context = self.shape.max_positions  # (a learned position table ends there; positions past it belong to
        # drafts beyond a row's budget, whose outputs are never committed: clamped, as FastLlama's)
        model_pos = rope_pos if context is None else rope_pos.clamp(max=context - 1)
        logits = self._run(step, tokens, model_pos, 1 if last_only else 0, compute_logits)
        if advance:
            cache.lengths.add_(placed.added)
        return (logits, None) if return_hidden else logits

    # ------------------------------------------------------------------------------------------- the model's forward
    def _run(self, step: _Forward, tokens, positions, keep: int | None, compute_logits: bool):
        kwargs = dict(input_ids=tokens, position_ids=positions, use_cache=False)
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1 if not compute_logits else (keep or 0)
        held = _FORWARD.set(step)
        try:
            with self._engine_attention():
                logits = self.hf(**kwargs).logits
        finally:
            _FORWARD.reset(held)
        if not compute_logits:
            return None
        return (logits[:, -1:] if keep == 1 else logits).float()

    def _engine_attention(self):
        """Every config of the model names the engine's attention for the length of one forward."""
        return self._attention(ATTENTION_NAME)

    def _reference(self) -> str:
        """The attention implementation the self-check compares with: eager, or what the adapted modules name."""
        names = {adapter.reference(module) for module, adapter in self._adapted} or {"eager"}
        if len(names) != 1:
            raise _refusal(f"{self.shape.model_type}'s attention modules compute their attention differently "
                           f"({sorted(names)}): nothing to check the backend against")
        return names.pop()

    @contextlib.contextmanager
    def _attention(self, implementation: str):
        """Every config of the model names `implementation` (a transformers attention function) while it is open;
        with the engine's, the adapted modules (`hf_adapters`) run their adapters instead, and the configs keep the
        model's own name (its forward builds the masks it passes by that name; the adapters do not read them)."""
        adapt = implementation == ATTENTION_NAME and bool(self._adapted)
        configs = [] if adapt else self._configs
        before = [c._attn_implementation_internal for c in configs]
        for c in configs:
            c._attn_implementation_internal = implementation
        own = [vars(module).get("forward") for module, _ in self._adapted] if adapt else []  # (an instance's own
        # forward, e.g. an accelerate hook's, comes back after)
        if adapt:
            for module, adapter in self._adapted:
                module.forward = functools.partial(adapter.forward, module)
        try:
            yield
        finally:
            for c, name in zip(configs, before):
                c._attn_implementation_internal = name
            for (module, _), forward in zip(self._adapted if adapt else [], own):
                if forward is None:
                    del module.forward
                else:
                    module.forward = forward


def _context(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
