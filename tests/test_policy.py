"""Tests for specdec.policy: each policy fed synthetic step outcomes, then a smoke run in the real loop."""

from __future__ import annotations

import pytest
import torch

from specdec.analysis import optimal_gamma
from specdec.policy import (
    DraftLengthPolicy,
    FixedPolicy,
    GuardedPolicy,
    HeuristicPolicy,
    OnlineEstimates,
    OptimalPolicy,
    StepOutcome,
    ThresholdPolicy,
    resolve_policy,
)

TARGET_STEP_S = 0.010  # a plain decoding step of the synthetic target


def synthetic_outcome(gamma: int, alpha: float, gen: torch.Generator, *, batch: int = 1, cost_ratio: float = 0.0,
                      lengths: list[int] | None = None) -> StepOutcome:
    """A step under the paper's model: i.i.d. acceptance with probability α, drafting γ·c·T, verifying T."""
    draft_lengths = torch.tensor(lengths if lengths is not None else [gamma] * batch, dtype=torch.long)
    trials = torch.rand(len(draft_lengths), max(gamma, 1), generator=gen) < alpha
    accepted = trials.long().cumprod(1).sum(1).minimum(draft_lengths) if gamma else torch.zeros_like(draft_lengths)
    return StepOutcome(gamma, accepted, draft_lengths, gamma * cost_ratio * TARGET_STEP_S, TARGET_STEP_S)


def drive(policy: DraftLengthPolicy, steps: int, alpha: float, cost_ratio: float, gen: torch.Generator) -> list[int]:
    """Run the policy for `steps` steps against a synthetic pair; return the γ it chose at each step."""
    chosen = []
    for _ in range(steps):
        gamma = policy.num_draft_tokens()
        chosen.append(gamma)
        policy.update(synthetic_outcome(gamma, alpha, gen, cost_ratio=cost_ratio))
    return chosen


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def outcome(gamma: int, accepted: list[int], lengths: list[int] | None = None) -> StepOutcome:
    lengths = lengths if lengths is not None else [gamma] * len(accepted)
    return StepOutcome(gamma, torch.tensor(accepted), torch.tensor(lengths), 0.0, TARGET_STEP_S)


# ---------------------------------------------------------------------------------------------


def test_fixed_policy() -> None:
    policy = FixedPolicy(6)
    policy.update(outcome(6, [0]))
    assert policy.num_draft_tokens() == 6 and policy.confidence_threshold() is None
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_draft_tokens"):
            FixedPolicy(bad)


def test_heuristic_policy_follows_hugging_face_schedule() -> None:
    policy = HeuristicPolicy(initial=5, max_draft_tokens=9)
    policy.update(outcome(5, [5]))
    assert policy.num_draft_tokens() == 7  # fully accepted: +2
    policy.update(outcome(7, [3]))
    assert policy.num_draft_tokens() == 6  # otherwise: −1
    policy.update(outcome(6, [6]))
    policy.update(outcome(8, [8]))
    assert policy.num_draft_tokens() == 9  # capped
    for _ in range(20):
        policy.update(outcome(policy.num_draft_tokens(), [0]))
    assert policy.num_draft_tokens() == 1  # floor
    policy.update(outcome(0, [0]))  # a plain step changes nothing
    assert policy.num_draft_tokens() == 1


def test_heuristic_policy_batch_needs_every_row_fully_accepted() -> None:
    policy = HeuristicPolicy(initial=4)
    policy.update(outcome(4, [4, 4, 3]))
    assert policy.num_draft_tokens() == 3
    policy.update(outcome(3, [3, 3, 3]))
    assert policy.num_draft_tokens() == 5
    policy.update(outcome(5, []))  # no active rows: no evidence
    assert policy.num_draft_tokens() == 5


def test_estimates_alpha_is_accepted_over_reached() -> None:
    est = OnlineEstimates(decay=1.0)
    assert est.alpha is None and est.cost_ratio is None
    # row 0 accepted 2 of 4 (reached 3 positions), row 1 all 4, row 2 drafted only 1 and accepted it
    est.update(outcome(4, [2, 4, 1], [4, 4, 1]))
    assert est.alpha == pytest.approx((2 + 4 + 1) / (3 + 4 + 1))


def test_estimates_converge_to_true_alpha_and_cost(gen: torch.Generator) -> None:
    est = OnlineEstimates(decay=1.0)
    for _ in range(400):
        est.update(synthetic_outcome(5, 0.7, gen, batch=4, cost_ratio=0.05))
    assert est.alpha == pytest.approx(0.7, abs=0.03)
    assert est.cost_ratio == pytest.approx(0.05, rel=1e-6)  # verify time = T: c is the draft cost alone


def test_estimates_fold_extra_verify_cost_into_c() -> None:
    est = OnlineEstimates(decay=1.0)
    est.update(StepOutcome(0, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 0.0, 0.010))
    # γ = 4: drafting 4 × 0.5 ms, verifying 12 ms vs a 10 ms plain step → c = (0.5 + 2/4) / 10
    est.update(StepOutcome(4, torch.tensor([2]), torch.tensor([4]), 0.002, 0.012))
    assert est.cost_ratio == pytest.approx(0.1)


def test_estimates_forget_with_decay() -> None:
    est = OnlineEstimates(decay=0.5)
    for _ in range(30):
        est.update(outcome(4, [0]))
    for _ in range(30):
        est.update(outcome(4, [4]))
    assert est.alpha > 0.99


def test_optimal_policy_raises_gamma_for_a_good_cheap_drafter(gen: torch.Generator) -> None:
    policy = OptimalPolicy(initial=2, max_draft_tokens=16, warmup_steps=3)
    chosen = drive(policy, 60, alpha=0.9, cost_ratio=0.01, gen=gen)
    assert chosen[:3] == [2, 2, 2]  # warm-up
    assert min(chosen[-20:]) >= 8
    est = policy.estimates
    assert policy.num_draft_tokens() == optimal_gamma(est.alpha, est.cost_ratio, 16)


def test_optimal_policy_lowers_gamma_for_a_poor_drafter(gen: torch.Generator) -> None:
    policy = OptimalPolicy(initial=8)
    chosen = drive(policy, 60, alpha=0.4, cost_ratio=0.2, gen=gen)
    assert max(chosen[-20:]) <= 2
    assert min(chosen) >= 1  # never 0 by itself


def test_threshold_policy() -> None:
    policy = ThresholdPolicy(max_draft_tokens=10, threshold=0.3)
    assert policy.num_draft_tokens() == 10 and policy.confidence_threshold() == 0.3
    policy.update(outcome(10, [3], [4]))
    assert policy.num_draft_tokens() == 10
    with pytest.raises(ValueError, match="threshold"):
        ThresholdPolicy(threshold=1.5)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        ThresholdPolicy(max_draft_tokens=0)


def test_guard_turns_speculation_off_and_back_on(gen: torch.Generator) -> None:
    policy = GuardedPolicy(OptimalPolicy(), probe_every=8, probe_steps=2, warmup_steps=3)
    # a poor, expensive drafter: α = 0.1, c = 0.5 → no γ pays (α ≤ c), the guard must switch drafting off
    chosen = drive(policy, 40, alpha=0.1, cost_ratio=0.5, gen=gen)
    assert chosen[0] > 0 and chosen[-1] == 0 and not policy.speculating
    assert chosen[-30:].count(0) >= 20  # mostly plain decoding, with short probes
    probes = [i for i in range(1, len(chosen)) if chosen[i] > 0 and chosen[i - 1] == 0]
    assert probes, "the guard must keep probing"
    # the drafter becomes good and cheap: a probe must switch speculation back on, for good
    chosen = drive(policy, 60, alpha=0.95, cost_ratio=0.01, gen=gen)
    assert chosen[-20:].count(0) == 0 and policy.speculating
    assert chosen[-1] >= 4


def test_guard_leaves_a_good_pair_alone(gen: torch.Generator) -> None:
    policy = GuardedPolicy(OptimalPolicy())
    assert 0 not in drive(policy, 50, alpha=0.8, cost_ratio=0.05, gen=gen)


def test_guard_delegates_threshold() -> None:
    policy = GuardedPolicy(ThresholdPolicy(threshold=0.25))
    assert policy.confidence_threshold() == 0.25 and policy.num_draft_tokens() == 8
    with pytest.raises(ValueError, match="min_speedup"):
        GuardedPolicy(min_speedup=0)


def test_resolve_policy() -> None:
    assert isinstance(resolve_policy(3), FixedPolicy) and resolve_policy(3).num_draft_tokens() == 3
    assert resolve_policy("7").num_draft_tokens() == 7
    assert resolve_policy("fixed").num_draft_tokens() == 4
    assert isinstance(resolve_policy("heuristic"), HeuristicPolicy)
    assert isinstance(resolve_policy("Optimal"), OptimalPolicy)
    assert isinstance(resolve_policy("threshold"), ThresholdPolicy)
    guarded = resolve_policy("guarded")
    assert isinstance(guarded, GuardedPolicy) and isinstance(guarded.inner, OptimalPolicy)
    assert resolve_policy("heuristic") is not resolve_policy("heuristic")  # fresh state each time
    policy = HeuristicPolicy()
    assert resolve_policy(policy) is policy
    with pytest.raises(ValueError, match="unknown draft-length policy"):
        resolve_policy("fastest")
    for bad in (0, True, 2.5, None):
        with pytest.raises(ValueError):
            resolve_policy(bad)


# ---------------------------------------------------------------------------------------------
# Every policy in the real loop keeps greedy output exact.


@pytest.mark.parametrize("name", ["fixed", "heuristic", "optimal", "threshold", "guarded"])
def test_policies_in_the_decoding_loop_keep_greedy_exact(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    import specdec

    def tiny(seed: int, layers: int) -> torch.nn.Module:
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                          num_attention_heads=4, num_key_value_heads=2)
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(config).eval()

    target, draft = tiny(0, 2), tiny(1, 1)
    prompts = [[1, 2, 3, 4], [5, 6]]
    plain = specdec.generate(target, prompts, None, max_new_tokens=12, temperature=0, eos_token_id=[])
    spec = specdec.generate(target, prompts, draft, max_new_tokens=12, temperature=0, num_draft_tokens=name,
                            eos_token_id=[])
    assert spec.sequences == plain.sequences
