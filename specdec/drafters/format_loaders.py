"""The published drafter formats' loaders (one function per format): their config numbers and state-dict names
mapped onto `fast.eagle.EagleHead` / `fast.medusa.MedusaHeads`, checked against the target. The names each
reference saves are listed in `specdec.drafters.formats`, which detects a folder's format and calls these.
Weights are safetensors; pickled `.bin`/`.pt` files load only with `allow_pickle=True` (`torch.load(weights_only=True)`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from specdec.fast.eagle import EagleConfig, EagleHead
from specdec.fast.medusa import MedusaConfig, MedusaHeads
from specdec.fast.model import FastLlama
from specdec.fast.quant.weight import dense_table

__all__ = ["load_eagle", "load_eagle3", "load_medusa", "load_speculators", "read_config", "key_names"]

_LAYER = {"self_attn.o_proj.weight": "wo", "mlp.down_proj.weight": "w_down",
          "post_attention_layernorm.weight": "mlp_norm", "input_layernorm.weight": "attn_norm",
          "hidden_norm.weight": "hidden_norm"}
_FUSED = {"wqkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
          "w_gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


# ---------------------------------------------------------------------------------------------- files
def read_config(folder: Path) -> dict | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return config


def _weight_files(folder: Path, stems: tuple[str, ...]) -> tuple[list[Path], bool]:
    """The weight files of the first stem found → (files, pickled?). Shard indexes stay inside the folder."""
    for stem in stems:
        single = folder / f"{stem}.safetensors"
        if single.is_file():
            return [single], False
        index = folder / f"{stem}.safetensors.index.json"
        if index.is_file():
            names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            if not names or any(Path(n).name != n or not (folder / n).is_file() for n in names):
                raise ValueError(f"{index}: its shards must be files in the folder, got {names[:4]}")
            return [folder / n for n in names], False
    for stem in stems:
        for suffix in (".bin", ".pt"):
            if (folder / f"{stem}{suffix}").is_file():
                return [folder / f"{stem}{suffix}"], True
    return [], False


def key_names(folder: Path, stems: tuple[str, ...]) -> set[str]:
    """Tensor names of a checkpoint (a safetensors header, or the strings of a pickle: nothing is executed)."""
    files, pickled = _weight_files(folder, stems)
    if not files:
        return set()
    if pickled:
        return _pickled_names(files[0])
    from safetensors import safe_open

    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def _pickled_names(file: Path) -> set[str]:
    """The strings of a torch zip checkpoint's pickle, read opcode by opcode (nothing is executed)."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(file) as archive:
            pkl = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            data = archive.read(pkl) if pkl else b""
        return {arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str) and "UNICODE" in op.name}
    except (OSError, ValueError, zipfile.BadZipFile):
        return set()


def _read_weights(folder: Path, stems: tuple[str, ...], allow_pickle: bool) -> dict[str, torch.Tensor]:
    files, pickled = _weight_files(folder, stems)
    if not files:
        raise ValueError(f"{folder}: no weights ({', '.join(s + '.safetensors' for s in stems)})")
    if pickled and not allow_pickle:
        raise ValueError(f"{folder}: the drafter's weights are pickled ({files[0].name}); unpickling can run code — "
                         "convert them to safetensors, or pass allow_pickle=True (CLI: --allow-pickle) for a file you trust")
    if pickled:
        state = torch.load(files[0], map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"{files[0]}: expected a state dict of tensors")
        return state
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


# ---------------------------------------------------------------------------------------------- numbers
def _int(config: dict, key: str, where: Path, default=None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: config field {key!r} must be a positive integer, got {value!r}")
    return value


def _layer_numbers(config: dict, where: Path) -> dict:
    """The one decoder layer's numbers from a Llama-style config (one layer, SiLU, no biases)."""
    if config.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"{where}: drafter heads with {config['num_hidden_layers']} layers are not supported (1)")
    if config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias") or config.get("attention_bias"):
        raise ValueError(f"{where}: only SiLU layers without biases are supported (hidden_act, mlp_bias, attention_bias)")
    dim, heads = _int(config, "hidden_size", where), _int(config, "num_attention_heads", where)
    return dict(dim=dim, n_heads=heads, n_kv_heads=_int(config, "num_key_value_heads", where, heads),
                head_dim=_int(config, "head_dim", where, config.get("head_dim") or dim // heads),
                intermediate_size=_int(config, "intermediate_size", where),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(config.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta", 1e4))),
                max_positions=config.get("max_position_embeddings"))


def _rope(config: dict, numbers: dict) -> tuple[torch.Tensor | None, float]:
    """(inv_freq, attention scaling) of the head's RoPE as transformers computes them (None: the default)."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind == "default":
        return None, 1.0
    if kind in ("dynamic", "longrope"):
        raise ValueError(f"RoPE type {kind!r} depends on the text length; not supported for drafter heads")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = LlamaConfig(hidden_size=numbers["dim"], num_attention_heads=numbers["n_heads"], head_dim=numbers["head_dim"],
                     rope_theta=numbers["rope_theta"], rope_scaling=dict(scaling),
                     max_position_embeddings=numbers["max_positions"] or 8192)
    rotary = LlamaRotaryEmbedding(hf)
    return rotary.inv_freq.float(), float(rotary.attention_scaling)


def _check_target(where: Path, what: str, dim: int, vocab: int, target: FastLlama) -> None:
    if dim != target.shape.dim or vocab != target.shape.vocab_size:
        raise ValueError(f"{where}: {what} for a target of hidden size {dim} and vocabulary {vocab}; "
                         f"this target has hidden size {target.shape.dim} and vocabulary {target.shape.vocab_size}")


# ---------------------------------------------------------------------------------------------- EAGLE
def _fill_eagle(head: EagleHead, state: dict, layer_prefix: str, names: dict, where: Path) -> None:
    """Copy a state dict into `head`: the layer's tensors under `layer_prefix`, the others by `names`
    (reference name → head parameter). Missing or unexpected names and wrong shapes are refused."""
    params = dict(head.named_parameters())
    want: dict[str, torch.Tensor] = {}
    for ours, theirs in _FUSED.items():
        parts = [state.pop(layer_prefix + t, None) for t in theirs]
        if any(p is None for p in parts):
            raise ValueError(f"{where}: missing {[layer_prefix + t for t, p in zip(theirs, parts) if p is None]}")
        want[f"layer.{ours}.0"] = torch.cat(parts)
    for theirs, ours in _LAYER.items():
        if layer_prefix + theirs in state:
            want[f"layer.{ours}.0" if ours != "hidden_norm" else "layer.hidden_norm"] = state.pop(layer_prefix + theirs)
    for theirs, ours in names.items():
        if theirs in state:
            want[ours] = state.pop(theirs)
    embed = state.pop("embed_tokens.weight", None)
    if state:
        raise ValueError(f"{where}: unexpected tensors for this format: {sorted(state)[:6]}")
    expected = {n for n in params if not n.startswith(("layer.embed", "layer.final_norm", "layer.lm_head", "embed"))}
    if head.config.version == 1:
        expected.discard("layer.attn_norm.0")  # EAGLE-1's only layer has no input norm
        if "layer.attn_norm.0" in want:
            raise ValueError(f"{where}: {layer_prefix}input_layernorm.weight is not part of an EAGLE-1 head (its layer "
                             "reads fc's output unnormed); heads with that norm are not supported")
    missing = sorted(expected - set(want))
    if missing:
        raise ValueError(f"{where}: missing tensors {missing[:6]} (not a complete EAGLE-{head.config.version} head)")
    with torch.no_grad():
        for name, value in want.items():
            param = params[name]
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{where}: {name} has shape {tuple(value.shape)}, expected {tuple(param.shape)}")
            param.copy_(value.to(param.dtype))
        if embed is not None and head.embed is not None:
            head.embed.copy_(embed.to(head.dtype))


def _own_embedding(embed: torch.Tensor | None, target: FastLlama) -> bool:
    """Keep the checkpoint's embedding only where it is not the target's (the reference loads it over the target's)."""
    if embed is None:
        return False
    table = dense_table(target.embed)  # (a target's quantized table: dequantized once, for this comparison)
    return tuple(embed.shape) != tuple(table.shape) or not torch.equal(embed.to(table), table)


def _build_eagle(config: EagleConfig, raw: dict, target: FastLlama) -> EagleHead:
    inv_freq, scaling = _rope(raw, dict(dim=config.dim, n_heads=config.n_heads, head_dim=config.head_dim,
                                        rope_theta=config.rope_theta, max_positions=config.max_positions))
    return EagleHead(config, inv_freq=inv_freq, rope_scaling=scaling, device=target.device, dtype=target.dtype)


def load_eagle(folder: str | os.PathLike, target: FastLlama, *, allow_pickle: bool = False, name: str = "drafter",
               _state: dict | None = None, _config: dict | None = None, _names: dict | None = None,
               _layer_prefix: str = "layers.0.") -> EagleHead:
    """An EAGLE-1/2 head (SafeAILab `cnets1.py` layout; speculators "eagle" passes its own names) bound to `target`."""
    where = Path(folder)
    raw = _config if _config is not None else (read_config(where) or {})
    state = _state if _state is not None else _read_weights(where, ("model", "pytorch_model"), allow_pickle)
    names = _names or {"fc.weight": "fc", "fc.bias": "fc_bias"}
    numbers = _layer_numbers(raw, where)
    vocab = raw.get("vocab_size", target.shape.vocab_size)
    _check_target(where, "an EAGLE head", numbers["dim"], vocab, target)
    embed = state.get("embed_tokens.weight")
    fc_bias = next((k for k, v in names.items() if v == "fc_bias"), "fc.bias") in state
    if raw.get("bias", raw.get("fusion_bias")) and not fc_bias:
        raise ValueError(f"{where}: the config asks for an fc bias but the weights have none")
    config = EagleConfig(version=1, vocab_size=vocab, fc_bias=fc_bias, own_embedding=_own_embedding(embed, target),
                         **numbers)
    head = _build_eagle(config, raw, target)
    _fill_eagle(head, dict(state), _layer_prefix, names, where)
    return head.bind(target, name).eval()


def _vocab_map(state: dict, draft: int, vocab: int, where: Path) -> torch.Tensor | None:
    """EAGLE-3's d2t (offsets: target id = draft id + d2t[draft id]) as target ids, checked against t2d."""
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    if d2t is None:
        if draft != vocab:
            raise ValueError(f"{where}: a draft vocabulary of {draft} tokens (target {vocab}) needs the d2t map")
        return None
    ids = torch.arange(draft) + d2t.long().cpu()
    if d2t.shape != (draft,) or ids.min() < 0 or ids.max() >= vocab or ids.unique().numel() != draft:
        raise ValueError(f"{where}: d2t must map the {draft} draft ids to distinct target ids in [0, {vocab})")
    if t2d is not None:
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[ids] = True
        if t2d.shape != (vocab,) or not torch.equal(t2d.bool().cpu(), mask):
            raise ValueError(f"{where}: t2d does not mark exactly the target ids d2t maps to")
    return ids


def load_eagle3(folder: str | os.PathLike, target: FastLlama, *, allow_pickle: bool = False, name: str = "drafter",
                _state: dict | None = None, _config: dict | None = None, _flags: dict | None = None,
                _layer_prefix: str = "midlayer.") -> EagleHead:
    """An EAGLE-3 head (SafeAILab `cnets.py` layout; speculators "eagle3" passes `layers.0.` and its flags)."""
    where = Path(folder)
    raw = _config if _config is not None else (read_config(where) or {})
    state = dict(_state if _state is not None else _read_weights(where, ("model", "pytorch_model"), allow_pickle))
    if _state is None and not any(k.startswith("midlayer.") for k in state):
        _layer_prefix = "layers.0."  # (heads trained outside SafeAILab's code name the layer like speculators)
    flags = dict(_flags or {})
    numbers = _layer_numbers(raw, where)
    vocab = raw.get("vocab_size", target.shape.vocab_size)
    target_dim = raw.get("target_hidden_size") or numbers["dim"]
    _check_target(where, "an EAGLE-3 head", target_dim, vocab, target)
    n = target.shape.n_layers
    layers = flags.pop("feature_layers", None) or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids") or [2, n // 2, n - 3]
    layers = tuple(int(i) for i in layers)
    if len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) >= n:
        raise ValueError(f"{where}: the EAGLE-3 head reads target layers {list(layers)}; they must be distinct layers "
                         f"of this {n}-layer target (the default 2, L//2, L-3 needs at least 6 layers)")
    draft = _int(raw, "draft_vocab_size", where, vocab)
    ids = _vocab_map(state, draft, vocab, where)
    embed = state.get("embed_tokens.weight")
    own = _own_embedding(embed, target) or numbers["dim"] != target.shape.dim
    if own and embed is None:
        raise ValueError(f"{where}: a head of hidden size {numbers['dim']} over a target of {target.shape.dim} "
                         "needs its own embed_tokens.weight")
    config = EagleConfig(version=3, vocab_size=vocab, target_dim=target_dim, draft_vocab_size=draft,
                         feature_layers=tuple(sorted(layers)), own_embedding=own, **flags, **numbers)
    head = _build_eagle(config, raw, target)
    names = {"fc.weight": "fc", "norm.weight": "norm", "lm_head.weight": "lm_head", "input_norm.weight": "input_norm"}
    if config.fc_norm:
        stacked = [state.pop(f"fc_norm.{i}.weight", None) for i in range(len(layers))]
        if any(t is None for t in stacked):
            raise ValueError(f"{where}: fc_norm needs fc_norm.0..{len(layers) - 1}.weight")
        state["fc_norms"] = torch.stack(stacked)
        names["fc_norms"] = "fc_norms"
    _fill_eagle(head, state, _layer_prefix, names, where)
    if ids is not None:
        head.set_vocab_map(ids)
    return head.bind(target, name).eval()


# ---------------------------------------------------------------------------------------------- speculators
def load_speculators(folder: str | os.PathLike, target: FastLlama, *, allow_pickle: bool = False,
                     name: str = "drafter") -> EagleHead:
    """A vLLM `speculators` folder: "eagle3" (layers.0.*, its norm flags) or "eagle" (fusion_fc, transformer.*)."""
    where = Path(folder)
    raw = read_config(where) or {}
    kind = raw.get("speculators_model_type")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{where}: a speculators config needs a transformer_layer_config object")
    if layer.get("model_type", "llama") != "llama":
        raise ValueError(f"{where}: transformer_layer_config model_type {layer.get('model_type')!r} is not supported "
                         "(llama)")
    state = _read_weights(where, ("model",), allow_pickle)
    merged = {**layer, **{k: raw[k] for k in ("draft_vocab_size", "target_hidden_size") if raw.get(k) is not None}}
    if kind == "eagle3":
        flags = {k: bool(raw.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
        flags["norm_before_residual"] = bool(raw.get("norm_before_residual", True))  # (vLLM's default when absent)
        if raw.get("eagle_aux_hidden_state_layer_ids"):
            flags["feature_layers"] = raw["eagle_aux_hidden_state_layer_ids"]
        state = {k: v for k, v in state.items() if not k.startswith("verifier_")}
        return load_eagle3(where, target, name=name, _state=state, _config=merged, _flags=flags,
                           _layer_prefix="layers.0.")
    if kind == "eagle":
        if raw.get("layernorms"):
            raise ValueError(f"{where}: speculators eagle heads with layernorms=true (HASS) are not supported")
        return load_eagle(where, target, name=name, _state=state, _config=merged, _layer_prefix="transformer.",
                          _names={"fusion_fc.weight": "fc", "fusion_fc.bias": "fc_bias"})
    raise ValueError(f"{where}: speculators_model_type {kind!r} is not supported (eagle, eagle3)")


# ---------------------------------------------------------------------------------------------- Medusa
_MEDUSA_BLOCK = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.linear\.(weight|bias)$")
_MEDUSA_HEAD = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^(?:medusa_heads\.)?blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_HEAD = re.compile(r"^(?:medusa_heads\.)?lm_heads\.(\d+)\.weight$")


def load_medusa(folder: str | os.PathLike, target: FastLlama, *, allow_pickle: bool = False,
                name: str = "drafter") -> MedusaHeads:
    """Medusa heads (FasterDecoding layout `{i}.{j}.linear.*` / `{i}.{L}.weight`, or vLLM's `blocks.*`/`lm_heads.*`);
    K and the blocks per head are read from the tensors (Medusa's own loader trusts its weights over its config)."""
    where = Path(folder)
    raw = read_config(where) or {}
    state = dict(_read_weights(where, ("medusa_lm_head", "model"), allow_pickle))
    token_map = state.pop("token_map", None)
    blocks: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    heads: dict[int, torch.Tensor] = {}
    vllm = any(k.startswith(("blocks.", "lm_heads.", "medusa_heads.")) for k in state)
    block_re, head_re = (_VLLM_BLOCK, _VLLM_HEAD) if vllm else (_MEDUSA_BLOCK, _MEDUSA_HEAD)
    for key, value in state.items():
        block, head = block_re.match(key), head_re.match(key)
        if block:
            blocks.setdefault((int(block[1]), int(block[2])), {})[block[3]] = value
        elif head:
            heads[int(head[1])] = value
        elif vllm and key == "lm_head.weight" and raw.get("original_lm_head"):
            heads = {i: value for i in range(_int(raw, "num_heads", where))}
        elif vllm or key.startswith("medusa_head."):
            raise ValueError(f"{where}: unexpected tensor {key!r} for {'vLLM' if vllm else 'Medusa'}'s layout")
        # (a Medusa-2 folder also holds the base model: only the heads are read)
    num_heads = len(heads)
    if num_heads == 0 or sorted(heads) != list(range(num_heads)):
        raise ValueError(f"{where}: no Medusa heads found (expected {{i}}.{{j}}.linear.weight and {{i}}.{{L}}.weight)")
    num_layers = len({j for (i, j) in blocks if i == 0})
    dim, rows = heads[0].shape[1], heads[0].shape[0]
    vocab = raw.get("vocab_size", target.shape.vocab_size) if token_map is not None else rows
    _check_target(where, "Medusa heads", dim, vocab, target)
    config = MedusaConfig(num_heads=num_heads, num_layers=num_layers, dim=dim, vocab_size=vocab,
                          draft_vocab_size=rows if rows != vocab else None)
    module = MedusaHeads(config, device=target.device, dtype=target.dtype)
    with torch.no_grad():
        for i in range(num_heads):
            if tuple(heads[i].shape) != (rows, dim):
                raise ValueError(f"{where}: head {i}'s LM head has shape {tuple(heads[i].shape)}, expected {(rows, dim)}")
            module.lm_head[i].copy_(heads[i].to(module.dtype))
            for j in range(num_layers):
                block = blocks.get((i, j))
                if block is None or tuple(block.get("weight", torch.empty(0)).shape) != (dim, dim):
                    raise ValueError(f"{where}: head {i} block {j} is missing or not {dim}x{dim}")
                module.weight[i, j].copy_(block["weight"].to(module.dtype))
                if "bias" in block:
                    module.bias[i, j].copy_(block["bias"].to(module.dtype))
        if len(blocks) != num_heads * num_layers:
            raise ValueError(f"{where}: every Medusa head needs the same {num_layers} blocks")
    if token_map is not None:
        ids = token_map.long().cpu()
        if ids.shape != (rows,) or ids.min() < 0 or ids.max() >= vocab or ids.unique().numel() != rows:
            raise ValueError(f"{where}: token_map must hold {rows} distinct target ids in [0, {vocab})")
        module.set_token_map(ids)
    module.check_target(target.shape, name)
    return module.eval()
