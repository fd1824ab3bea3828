"""Drafter folders in the formats users already have: detection, config numbers and state-dict names.

  format          detected by                                   weights (names as the reference saves them)
  feature-head    `feature_head.json` (specdec train head)      model.safetensors
  eagle           config.json + `fc.weight` and `layers.0.*`    SafeAILab `cnets1.py`: fc(.bias), layers.0.{self_attn,mlp,
                  (EAGLE-1/2, HASS)                             post_attention_layernorm}; embed_tokens optional
  eagle3          config.json with `draft_vocab_size` or an     SafeAILab `cnets.py`: midlayer.* (hidden_norm,
                  *Eagle3 architecture, or `midlayer.*` weights input_layernorm, ...), fc, norm, lm_head, d2t, t2d
  medusa          config.json with `medusa_num_heads`, or       Medusa: {i}.{j}.linear.{weight,bias}, {i}.{L}.weight
                  vLLM's model_type "medusa"                    (medusa_lm_head.*); vLLM: blocks.{i}.layers.{j}.*,
                                                                lm_heads.{i}.weight, token_map
  speculators     config.json with `speculators_model_type`     "eagle3": layers.0.*, fc, norm, lm_head, d2t, t2d
                  (vLLM's speculators library)                  (+ input_norm / fc_norm.{i}); "eagle": fusion_fc.*,
                                                                transformer.*

`load_drafter(path_or_head, target)` returns a head bound to the target (`FeatureHead`, `EagleHead`, `MedusaHeads`)
on its device and dtype; the loaders (one function per format, `format_loaders.py`) map the names above. Every
refusal is one line naming the folder and the problem (a hidden size or vocabulary that does not match the target
names both numbers). Weights are safetensors; pickled `.bin`/`.pt` files load only with `allow_pickle=True`
(through `torch.load(weights_only=True)`); detection reads a pickle's strings without executing it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specdec.drafters.format_loaders import key_names, load_eagle, load_eagle3, load_medusa, load_speculators, read_config
from specdec.fast.eagle import EagleHead
from specdec.fast.head import CONFIG_NAME as FEATURE_HEAD_CONFIG, FeatureHead, load_feature_head
from specdec.fast.medusa import MedusaHeads
from specdec.fast.model import FastLlama

__all__ = ["DrafterFolder", "detect_format", "drafter_folder", "is_drafter", "load_drafter", "load_eagle", "load_eagle3",
           "load_medusa", "load_speculators", "FORMATS"]

FORMATS = ("feature-head", "eagle", "eagle3", "medusa", "speculators")
HEADS = (FeatureHead, EagleHead, MedusaHeads)


# ---------------------------------------------------------------------------------------------- detection
def detect_format(path: str | os.PathLike) -> str | None:
    """The drafter format of a folder (one of `FORMATS`), or None for a folder that is none of them (a model)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    if (folder / FEATURE_HEAD_CONFIG).is_file():
        return "feature-head"
    config = read_config(folder)
    if config is None:
        return None
    if "speculators_model_type" in config:
        return "speculators"
    if "medusa_num_heads" in config or config.get("model_type") == "medusa":
        return "medusa"
    if "draft_vocab_size" in config or any("Eagle3" in str(a) for a in config.get("architectures") or []):
        return "eagle3"  # (SGLang / SpecForge heads name their architecture LlamaForCausalLMEagle3)
    names = key_names(folder, ("model", "pytorch_model"))  # (EAGLE's own heads ship as pytorch_model.bin)
    if any(n.startswith("midlayer.") for n in names):
        return "eagle3"
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return "eagle"
    return None


@dataclass(frozen=True)
class DrafterFolder:
    """A drafter folder and how to read it: what `specdec.load(draft=...)` and `--draft` hand to the engine."""

    path: str
    allow_pickle: bool = False


def drafter_folder(path, allow_pickle: bool = False) -> DrafterFolder | None:
    """`path` as a `DrafterFolder` when it is a folder in one of `FORMATS`, else None (a model, a name, ...)."""
    if isinstance(path, (str, os.PathLike)) and detect_format(path) is not None:
        return DrafterFolder(os.fspath(path), allow_pickle)
    return None


def is_drafter(obj) -> bool:
    """True for a head object (`FeatureHead`, `EagleHead`, `MedusaHeads`), a `DrafterFolder` or a folder in one
    of `FORMATS`."""
    if isinstance(obj, (*HEADS, DrafterFolder)):
        return True
    return isinstance(obj, (str, os.PathLike)) and detect_format(obj) is not None


# ---------------------------------------------------------------------------------------------- entry point
_LOADERS = {"eagle": load_eagle, "eagle3": load_eagle3, "medusa": load_medusa, "speculators": load_speculators}


def load_drafter(obj, target: FastLlama, *, name: str = "drafter", allow_pickle: bool = False):
    """A head bound to `target` on its device and dtype, from a head object or a folder in one of `FORMATS`."""
    if isinstance(obj, FeatureHead):
        return load_feature_head(obj, target, name)
    if isinstance(obj, EagleHead):
        if obj.device != target.device or obj.dtype != target.dtype or (obj._target and obj._target[0] is not target):
            obj = obj.copy_to(target.device, target.dtype)
        return obj.bind(target, name)
    if isinstance(obj, MedusaHeads):
        obj.check_target(target.shape, name)
        return obj if obj.device == target.device and obj.dtype == target.dtype else \
            obj.copy_to(target.device, target.dtype)
    if isinstance(obj, DrafterFolder):
        obj, allow_pickle = obj.path, obj.allow_pickle
    if not isinstance(obj, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a drafter head or a folder, got {type(obj).__name__}")
    kind = detect_format(obj)
    if kind is None:
        raise ValueError(f"{name}: {obj} is not a drafter folder in a known format ({', '.join(FORMATS)})")
    if kind == "feature-head":
        return load_feature_head(obj, target, name)
    return _LOADERS[kind](obj, target, allow_pickle=allow_pickle, name=name)
