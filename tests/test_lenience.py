"""Lenience (paper appendix A.5): opt-in and lossy, with the guarantee that no token is emitted with
probability above p(x)/l. l = 1 is bit for bit the exact rule. Statistical checks have a negative control."""

import numpy as np
import pytest
import torch

from specdec.core import acceptance_beta, sample, verify, verify_greedy
from stats_utils import chi2_pvalue

PASS = 1e-3
N = 200_000
# One drafted position. Token 0 is where the bound is tight: p(0) = 0.05 ≤ l·q(0) for l = 0.5, so the lenient
# rule emits it with probability exactly p/l = 0.10 (twice the target's 0.05, never more).
P = torch.tensor([0.05, 0.30, 0.10, 0.05, 0.20, 0.10, 0.10, 0.10])
Q = torch.tensor([0.30, 0.10, 0.20, 0.20, 0.05, 0.05, 0.05, 0.05])


def lenient_law(p: torch.Tensor, q: torch.Tensor, leniency: float) -> torch.Tensor:
    """What one lenient position emits: min(q, p/l) + (1 − β_l)·norm(max(0, p − q)), β_l = Σ min(p/l, q)."""
    accepted = torch.minimum(q, p / leniency)
    residual = (p - q).clamp_min(0)
    return accepted + (1 - accepted.sum()) * residual / residual.sum()


def one_position(leniency: float, rule=verify, seed: int = 0):
    """Emitted token of N independent single-draft steps [N] (the draft or its replacement)."""
    g = torch.Generator().manual_seed(seed)
    q = Q.expand(N, 1, -1).contiguous()
    drafts = sample(q, g)  # [N, 1] from q
    p = torch.stack([P, P]).expand(N, -1, -1).contiguous()  # p_1 and the bonus law
    res = rule(drafts, q, p, g, leniency=leniency)
    return torch.where(res.num_accepted > 0, drafts[:, 0], res.next_token), res


def over_lenient(drafts, q, p, g, *, leniency):
    """Negative control: lenience applied twice (accept when r·l²·q < p) breaks the p/l bound."""
    return verify(drafts, q, p, g, leniency=leniency**2)


def bound_z(tokens: torch.Tensor, leniency: float) -> float:
    """Largest one-sided z-score of an empirical frequency above p(x)/l (≤ ~4 when the bound holds)."""
    counts = torch.bincount(tokens, minlength=len(P)).double()
    cap = (P.double() / leniency).clamp(max=1.0)
    sd = (N * cap * (1 - cap)).clamp_min(1e-12).sqrt()
    return float(((counts - N * cap) / sd).max())


@pytest.mark.parametrize("leniency", [0.5, 0.2])
def test_lenient_position_law_and_the_p_over_l_bound(leniency):
    tokens, res = one_position(leniency)
    law = lenient_law(P, Q, leniency)
    assert (law <= P / leniency + 1e-7).all()  # the guarantee, analytically
    assert chi2_pvalue(tokens.numpy(), law.numpy()) > PASS  # the code emits exactly that law
    assert bound_z(tokens, leniency) < 4.0  # so, statistically, nothing exceeds p/l
    # the acceptance rate is β_l = Σ min(p/l, q), which the result reports as β
    beta_l = torch.minimum(P / leniency, Q).sum().item()
    assert res.num_accepted.float().mean().item() == pytest.approx(beta_l, abs=0.005)
    assert res.beta[0, 0].item() == pytest.approx(beta_l, abs=1e-6)
    assert beta_l > torch.minimum(P, Q).sum().item()  # lenience raises α


def test_negative_control_over_lenient_rule_breaks_the_bound():
    tokens, _ = one_position(0.5, rule=over_lenient)
    assert bound_z(tokens, 0.5) > 20  # token 0 comes out with probability 0.2 > p/l = 0.1


def test_lenience_is_lossy_but_exact_at_one():
    tokens, _ = one_position(0.5)
    assert chi2_pvalue(tokens.numpy(), P.numpy()) < 1e-8  # l < 1 does not follow p (by design)
    tokens, _ = one_position(1.0)
    assert chi2_pvalue(tokens.numpy(), P.numpy()) > PASS


def test_leniency_one_is_bit_for_bit_the_exact_rule():
    g = torch.Generator().manual_seed(3)
    p = torch.rand(64, 5, 11, generator=g).softmax(-1)
    q = torch.rand(64, 4, 11, generator=g).softmax(-1)
    drafts = sample(q, g)
    a = verify(drafts, q, p, torch.Generator().manual_seed(7))
    b = verify(drafts, q, p, torch.Generator().manual_seed(7), leniency=1.0)
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)
    assert torch.equal(a.beta, b.beta)
    logits = torch.randn(64, 5, 11, generator=g)
    a, b = verify_greedy(drafts, logits), verify_greedy(drafts, logits, leniency=1.0)
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)


def test_deterministic_drafts_beta_is_min_one_p_over_l():
    p = torch.tensor([[[0.3, 0.7], [0.5, 0.5]]])
    assert acceptance_beta(p, None, torch.tensor([[0]]), leniency=0.5).tolist() == [[pytest.approx(0.6)]]
    assert acceptance_beta(p, None, torch.tensor([[1]]), leniency=0.5).tolist() == [[1.0]]


def test_greedy_lenience_accepts_tokens_within_l_of_the_max():
    # softmax ratios to the max: token 1 has p = 0.4·max p, token 2 has 0.1·max p
    logits = torch.log(torch.tensor([[[1.0, 0.4, 0.1, 0.05], [0.2, 1.0, 0.1, 0.1]]]))
    drafts = torch.tensor([[1]])
    assert verify_greedy(drafts, logits).num_accepted.tolist() == [0]
    res = verify_greedy(drafts, logits, leniency=0.3)  # 0.4 ≥ 0.3: accepted, then the bonus argmax
    assert res.num_accepted.tolist() == [1] and res.next_token.tolist() == [1]
    res = verify_greedy(drafts, logits, leniency=0.5)  # 0.4 < 0.5: rejected, the argmax is emitted
    assert res.num_accepted.tolist() == [0] and res.next_token.tolist() == [0]
    assert verify_greedy(torch.tensor([[2]]), logits, leniency=0.1).num_accepted.tolist() == [1]


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), True, "0.5"])
def test_bad_leniency_is_named(bad):
    p = torch.full((1, 2, 3), 1 / 3)
    with pytest.raises(ValueError, match="leniency"):
        verify(torch.tensor([[0]]), None, p, leniency=bad)
    with pytest.raises(ValueError, match="leniency"):
        verify_greedy(torch.tensor([[0]]), p, leniency=bad)


# ------------------------------------------------------------------------------------------------
# Through specdec.generate

import specdec  # noqa: E402
from helpers import RAGGED_PROMPTS  # noqa: E402


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_leniency_one_is_the_default_and_lower_l_accepts_more(llama, llama_draft, temperature):
    kw = dict(drafter=llama_draft, max_new_tokens=12, temperature=temperature, num_draft_tokens=3, seed=4, eos_token_id=[])
    exact = specdec.generate(llama, RAGGED_PROMPTS, **kw)
    same = specdec.generate(llama, RAGGED_PROMPTS, leniency=1.0, **kw)
    assert same.sequences == exact.sequences and same.stats.alpha == exact.stats.alpha
    lenient = specdec.generate(llama, RAGGED_PROMPTS, leniency=0.05, **kw)
    assert lenient.stats.mean_accepted_length > exact.stats.mean_accepted_length
    assert lenient.stats.target_calls < exact.stats.target_calls


def test_generate_rejects_bad_leniency_on_both_runners(llama):
    with pytest.raises(ValueError, match="leniency"):
        specdec.generate(llama, [[1, 2]], max_new_tokens=2, leniency=0)
    with pytest.raises(ValueError, match="leniency"):
        specdec.generate(llama, [[1, 2]], max_new_tokens=2, leniency=1.5, engine="fast")
