"""Drafters: the cheap models M_q. Each proposes γ tokens and reports the q it sampled them from.

Kinds, one class each for both runners: `ModelDrafter` (a smaller model; its cache in the runner's state holder),
`NGramDrafter` (unigram/bigram tables), `PromptLookupDrafter` (copy from the context; deterministic),
`CrossVocabDrafter` (a `ModelDrafter` with another tokenizer: token-level intersection); on the loop only,
`HierarchicalDrafter` (a draft model decoded speculatively by an inner drafter). Published head formats (EAGLE, EAGLE-3, Medusa, speculators) are read by `formats`. Adding a drafter is one file:
subclass `Drafter` and implement `propose`. What each runner calls on a drafter is written down in `protocol.py`:
one family (`LoopDrafter` for the eager loop, `SlotDrafter` and its capabilities for the engine, `TreeLoopDrafter`
for the loop's token trees) whose `propose(context, num_draft_tokens, ...)` returns one record, `Proposal`.
"""

from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.cross_vocab import CrossVocabDrafter, VocabBridge
from specdec.drafters.hierarchical import HierarchicalDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.drafters.protocol import (AnyDrafter, CachedSlotDrafter, FeatureSlotDrafter, LoopDrafter, SlotDrafter,
                                       TreeLoopDrafter)
from specdec.drafters.seq2seq import Seq2SeqModelDrafter

__all__ = ["Drafter", "Proposal", "ModelDrafter", "NGramDrafter", "PromptLookupDrafter", "Seq2SeqModelDrafter", "HierarchicalDrafter",
           "CrossVocabDrafter", "VocabBridge", "LoopDrafter", "SlotDrafter", "CachedSlotDrafter", "FeatureSlotDrafter",
           "TreeLoopDrafter", "AnyDrafter"]
