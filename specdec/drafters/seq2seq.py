"""A smaller encoder-decoder model as drafter (the paper's T5-small for T5-XXL), caches in lockstep.

It encodes the same encoder inputs as the target once per batch (`context.source`), then drafts
decoder tokens exactly like `ModelDrafter`: its decoder cache holds the committed text plus this
step's drafts, and `commit` crops it back to the committed prefix.
"""

from __future__ import annotations

import torch

from specdec.drafters.model import LoopState, ModelDrafter
from specdec.models.seq2seq import HFSeq2SeqLM
from specdec.sequences import TokenBuffer


class Seq2SeqModelDrafter(ModelDrafter):
    """Drafts with a `transformers` encoder-decoder model (same vocabulary as the target).

    If its decoder start token differs from the target's, it reads the committed text with its own
    start token in front (the adapter always feeds position 0 as the model's start token).
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__(state=LoopState(HFSeq2SeqLM(model)))

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        self._claim(context)
        if context.source is None:
            raise ValueError(
                "Seq2SeqModelDrafter needs an encoder-decoder target: the context carries no encoder inputs "
                "(context.source is None)"
            )
        self.state.lm.encode(context.source)
