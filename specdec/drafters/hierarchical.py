"""Hierarchical drafts (paper §6): the draft model is itself decoded speculatively by a cheaper drafter.

    drafter = specdec.HierarchicalDrafter(draft_model, drafter=inner)   # inner: n-gram, lookup, model, ...
    specdec.generate(target, prompts, drafter=drafter, num_draft_tokens=γ)

To propose γ tokens, the middle model M_m runs speculative decoding of its own: `inner` proposes k
tokens, M_m scores them in one pass, and `core.verify` (the exact rule) keeps its law; steps repeat until
γ tokens exist. Nesting is free: `inner` may itself be a `HierarchicalDrafter`.

Why the reported q is exact. Speculative sampling with the exact rule emits a sequence whose joint law is
M_m's autoregressive law (Leviathan et al. 2023, Thm 3.1 applied step by step), so drafted token x_i,
given x_<i (and everything the outer verifier has seen, which is x_<i and its own independent uniforms),
follows q_i = standardize(M_m(· | context, x_<i)) exactly. That q_i is the row of M_m's logits at the
position that predicted x_i (an accepted inner draft, the residual sample, or the bonus), which the inner
step computed anyway, so the drafter reports it at no extra cost. Greedy: the inner verification is the
argmax path, so the drafts are M_m's own greedy tokens (one-hot q).
`tests/drafters/test_drafter_kit.py` checks the law (chi-square) and that a verifier-free variant fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.core import SamplingConfig, VerifyResult, standardize_logits, verify, verify_greedy
from specdec.drafters.base import Drafter, Proposal
from specdec.models.hf import HFCausalLM
from specdec.sequences import TokenBuffer


@dataclass
class HierarchyCounters:
    """What the inner speculation did, summed over a generation (read them to see when it pays).

    middle_calls    forward passes of the middle (draft) model
    inner_calls     forward passes the inner drafter reported (0 for tables / lookup)
    inner_drafted   inner drafts verified by the middle model (Σ over rows)
    inner_accepted  of those, accepted
    middle_tokens   tokens the middle model produced (Σ over rows): middle_tokens / middle row-steps = its τ
    middle_row_steps
    """

    middle_calls: int = 0
    inner_calls: int = 0
    inner_drafted: int = 0
    inner_accepted: int = 0
    middle_tokens: int = 0
    middle_row_steps: int = 0

    @property
    def inner_acceptance_rate(self) -> float | None:
        return self.inner_accepted / self.inner_drafted if self.inner_drafted else None

    @property
    def middle_tokens_per_call(self) -> float:
        """τ of the inner speculation: middle tokens per middle pass per row."""
        return self.middle_tokens / self.middle_row_steps if self.middle_row_steps else 0.0


class HierarchicalDrafter(Drafter):
    """`HierarchicalDrafter(draft_model, drafter=inner, num_inner_draft_tokens=k)`.

    draft_model   the middle model: a transformers decoder-only model with the target's vocabulary
    drafter       the inner drafter: any `Drafter` (n-gram, prompt lookup, a `ModelDrafter`, another
                  `HierarchicalDrafter`) or a transformers model (wrapped in a `ModelDrafter`)
    num_inner_draft_tokens   k, drafts the inner drafter proposes per middle pass
    """

    def __init__(self, draft_model: torch.nn.Module, drafter, num_inner_draft_tokens: int = 3):
        if isinstance(num_inner_draft_tokens, bool) or not isinstance(num_inner_draft_tokens, int) or num_inner_draft_tokens < 1:
            raise ValueError(f"num_inner_draft_tokens must be an integer >= 1, got {num_inner_draft_tokens!r}")
        if not isinstance(drafter, Drafter):
            if not isinstance(drafter, torch.nn.Module) or getattr(drafter, "config", None) is None:
                raise TypeError(f"drafter must be a specdec Drafter or a transformers model, got {type(drafter).__name__}")
            from specdec.drafters.model import ModelDrafter

            drafter = ModelDrafter(drafter)
        self.lm = HFCausalLM(draft_model)
        self.vocab_size = self.lm.vocab_size
        if drafter.vocab_size is not None and drafter.vocab_size != self.vocab_size:
            raise ValueError(
                f"inner drafter vocabulary ({drafter.vocab_size}) differs from the draft model's ({self.vocab_size})"
            )
        self.inner = drafter
        self.num_inner_draft_tokens = num_inner_draft_tokens
        self.counters = HierarchyCounters()

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    def begin(self, context: TokenBuffer, vocab_size: int) -> None:
        self.lm.reset(context.batch_size)
        self.inner.begin(context, vocab_size)

    @torch.inference_mode()
    def propose(
        self,
        context: TokenBuffer,
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        confidence_threshold: float | None = None,
    ) -> Proposal:
        gamma, k = num_draft_tokens, self.num_inner_draft_tokens
        text = _scratch_copy(context, gamma + k + 1)  # committed text + this proposal's drafts so far
        start = context.lengths
        batch, vocab = context.batch_size, self.vocab_size
        probs = None if sampling.greedy else torch.zeros(batch, gamma, vocab, device=start.device)
        confidence = torch.zeros(batch, gamma, device=start.device)
        cols = torch.arange(k + 1, device=start.device)[None, :]
        middle_calls = 0
        self.inner._claim(text)  # the inner drafter follows the scratch text during this proposal
        while True:
            need = gamma - (text.lengths - start)  # [B] tokens still to draft per row
            if not bool((need > 0).any()):
                break
            inner = self.inner.propose(text, k, sampling, generator)
            drafts = inner.tokens
            unseen = text.lengths - self.lm.lengths  # ≥ 1: at least the last committed token
            block, valid = text.tail(int(unseen.max()), unseen)
            width = drafts.shape[1]
            logits = self.lm.forward(torch.cat([block, drafts], 1), torch.cat([valid, torch.ones_like(drafts, dtype=torch.bool)], 1))
            logits = logits[:, -(width + 1):]  # [B, k+1, V]: M_m at the positions of the k drafts and the bonus
            middle_calls += 1
            result, middle_probs = self._verify(inner, logits, sampling, generator)
            counts = torch.minimum(result.num_accepted + 1, need.clamp_min(0))
            # q (and the drafter's confidence) of each emitted token: M_m's row that predicted it.
            slot = (text.lengths - start)[:, None] + cols[:, : width + 1]  # where emitted token j lands
            emit = cols[:, : width + 1] < counts[:, None]
            slot = torch.where(emit, slot, torch.zeros_like(slot))
            if middle_probs is not None:
                rows = middle_probs * emit[..., None]
                probs.scatter_add_(1, slot[..., None].expand(-1, -1, vocab), rows)
                conf = middle_probs.gather(-1, result.tokens(drafts)[..., None]).squeeze(-1)
            else:
                conf = logits.float().softmax(-1).max(-1).values
            confidence.scatter_add_(1, slot, conf * emit)
            text.append(result.tokens(drafts), counts)
            self.lm.crop(text.lengths - 1)
            self.inner.commit(text)
            self._count(inner, result, counts, need, width)
        self.inner._claim(context)  # and the committed text again for `commit`
        tokens = text.tokens.gather(1, start[:, None] + torch.arange(gamma, device=start.device)[None, :])
        lengths = None
        if confidence_threshold is not None:
            # Like ModelDrafter: a row stops after the first token its drafter was unsure of.
            unsure = confidence < confidence_threshold
            first = torch.where(unsure.any(1), unsure.long().argmax(1) + 1, torch.full_like(start, gamma))
            lengths = first
        self.counters.middle_calls += middle_calls
        return Proposal(tokens=tokens, probs=probs, lengths=lengths, forward_passes=middle_calls)

    def _verify(self, inner: Proposal, logits: torch.Tensor, sampling: SamplingConfig, generator):
        """The exact rule on the inner drafts → (VerifyResult, M_m's standardized probs [B, k+1, V] or None)."""
        if sampling.greedy:
            return verify_greedy(inner.tokens, logits, draft_lengths=inner.lengths), None
        middle_probs = standardize_logits(logits, sampling)
        return verify(inner.tokens, inner.probs, middle_probs, generator, draft_lengths=inner.lengths), middle_probs

    def _count(self, inner: Proposal, result: VerifyResult, counts, need, width: int) -> None:
        busy = need > 0
        drafted = inner.lengths if inner.lengths is not None else torch.full_like(need, width)
        c = self.counters
        c.inner_calls += inner.forward_passes
        c.inner_drafted += int((drafted * busy).sum())
        c.inner_accepted += int((result.num_accepted * busy).sum())
        c.middle_tokens += int((result.num_accepted + 1)[busy].sum())
        c.middle_row_steps += int(busy.sum())

    def commit(self, context: TokenBuffer) -> None:
        # Keep only what is still committed text (the old prefix and the accepted drafts), as ModelDrafter.
        self.lm.crop(torch.minimum(self.lm.lengths, context.lengths - 1))
        self.inner.commit(context)

    def select_rows(self, index: torch.Tensor) -> None:
        self.lm.select_rows(index)
        self.inner.select_rows(index)


def _scratch_copy(context: TokenBuffer, extra: int) -> TokenBuffer:
    """A private TokenBuffer with the same rows and room for `extra` more tokens per row."""
    text = TokenBuffer.__new__(TokenBuffer)
    needed = int(context.lengths.max()) + extra if context.batch_size else extra
    width = max(needed, context.capacity)
    text.tokens = torch.zeros(context.batch_size, width, dtype=torch.long, device=context.tokens.device)
    text.tokens[:, : context.capacity] = context.tokens
    text.lengths = context.lengths.clone()
    text.start_lengths = context.start_lengths
    text.source = context.source
    text.growable = False
    return text
