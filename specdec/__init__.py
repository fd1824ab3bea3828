"""specdec: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023).

    import specdec
    result = specdec.generate(target, prompts, drafter=draft_model, temperature=0, num_draft_tokens=4)
    result.sequences, result.stats.alpha, result.stats.mean_accepted_length

Layers: `core` (pure tensor functions) ← `request`/`step` ← `models` (targets, the `Target` protocol), `drafters`
(the drafter protocols) ← the runners `loop` (eager, transformers) and `engine` (continuous batching) ← `decoding`
(the front door that picks one) ← `text`, `server`, `cli`, benchmarks, training recipes. p is the target
distribution, q the drafter's.

The names below are imported on first use (PEP 562), so `import specdec.cli` and `specdec --help` do not
pay for importing torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it (append new exports here)
_EXPORTS = {
    "generate": "specdec.decoding",
    "stream": "specdec.decoding",
    "GenerationStream": "specdec.step",
    "GenerateResult": "specdec.step",
    "TokenEvent": "specdec.step",
    "SpecStats": "specdec.metrics",
    "SamplingConfig": "specdec.core",
    "SamplingParams": "specdec.request",
    "standardize_logits": "specdec.core",
    "verify": "specdec.core",
    "verify_greedy": "specdec.core",
    "Drafter": "specdec.drafters",
    "LoopDrafter": "specdec.drafters",
    "SlotDrafter": "specdec.drafters",
    "Target": "specdec.models",
    "Proposal": "specdec.drafters",
    "ModelDrafter": "specdec.drafters",
    "NGramDrafter": "specdec.drafters",
    "PromptLookupDrafter": "specdec.drafters",
    "DraftLengthPolicy": "specdec.policy",
    "FixedPolicy": "specdec.policy",
    "StepOutcome": "specdec.policy",
    "load": "specdec.text",
    "HierarchicalDrafter": "specdec.drafters.hierarchical",
    "beam_search": "specdec.decoding",
    "BeamSearchResult": "specdec.search.beam",
    "check": "specdec.exactness",
    "CheckResult": "specdec.exactness",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("_") or importlib.util.find_spec(f"specdec.{name}") is None:
            raise AttributeError(f"module 'specdec' has no attribute {name!r}")
        return importlib.import_module(f"specdec.{name}")  # `specdec.core` etc. after a bare `import specdec`
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from specdec.core import SamplingConfig, standardize_logits, verify, verify_greedy
    from specdec.decoding import GenerationStream, generate, stream
    from specdec.drafters import Drafter, LoopDrafter, ModelDrafter, NGramDrafter, PromptLookupDrafter, Proposal, SlotDrafter
    from specdec.exactness import CheckResult, check
    from specdec.metrics import SpecStats
    from specdec.models import Target
    from specdec.policy import DraftLengthPolicy, FixedPolicy, StepOutcome
    from specdec.request import SamplingParams
    from specdec.step import GenerateResult, TokenEvent
