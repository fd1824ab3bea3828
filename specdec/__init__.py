"""specdec: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023).

    import specdec
    result = specdec.generate(target, prompts, drafter=draft_model, temperature=0, num_draft_tokens=4)
    result.sequences, result.stats.alpha, result.stats.mean_accepted_length

Layers: `core` (pure tensor functions) ← `models` (targets), `drafters` ← `decoding` (the loop)
← `cli`, benchmarks, training recipes. p is the target distribution, q the drafter's.
"""

from specdec.core import SamplingConfig, standardize_logits, verify, verify_greedy
from specdec.decoding import GenerationStream, generate, stream
from specdec.request import SamplingParams
from specdec.step import GenerateResult, TokenEvent
from specdec.drafters import Drafter, ModelDrafter, NGramDrafter, PromptLookupDrafter, Proposal
from specdec.metrics import SpecStats
from specdec.policy import DraftLengthPolicy, FixedPolicy, StepOutcome
from specdec.text import load
from specdec.drafters.hierarchical import HierarchicalDrafter
from specdec.beam import BeamSearchResult, beam_search

__version__ = "0.1.0"

__all__ = [
    "generate",
    "stream",
    "GenerateResult",
    "GenerationStream",
    "TokenEvent",
    "SpecStats",
    "SamplingConfig",
    "SamplingParams",
    "standardize_logits",
    "verify",
    "verify_greedy",
    "Drafter",
    "Proposal",
    "ModelDrafter",
    "NGramDrafter",
    "PromptLookupDrafter",
    "DraftLengthPolicy",
    "FixedPolicy",
    "StepOutcome",
    "load",
    "HierarchicalDrafter",
    "beam_search",
    "BeamSearchResult",
]
