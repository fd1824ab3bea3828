"""The engine's "auto" γ: it follows measured throughput (tokens per row per second), per batch bucket."""

from specdec.engine.policy import GammaPolicy


class _Row:
    estimate = None


def _simulate(step_time, tokens_per_row, alpha, steps=96, batch=8):
    """Run the policy against a simulated engine (rows accept drafts at rate α); the γ chosen at each step."""
    policy, rows, chosen = GammaPolicy("auto", 8), [_Row() for _ in range(batch)], []
    for _ in range(steps):
        gamma = policy.choose(batch, rows)
        policy.record_step(batch, gamma, step_time(gamma), tokens_per_row(gamma))
        if gamma:
            for row in rows:
                policy.record_row(row, beta_sum=alpha * gamma, reached=gamma, drafting=1)
        chosen.append(gamma)
    return chosen


def test_speculation_that_measures_slower_is_switched_off():
    # a weak drafter: each drafted token costs 25% of a plain step and barely pays (α ≈ 0.1)
    chosen = _simulate(lambda g: 1.0 + 0.25 * g, lambda g: 1.0 + 0.1 * min(g, 1), alpha=0.1)
    assert chosen[:2] == [4, 0]  # a new bucket times a speculative and a plain step first
    assert chosen[-32:].count(0) >= 30  # then plain, but for a rare re-measurement of the runner-up


def test_speculation_that_measures_faster_is_kept_at_its_best_gamma():
    # a strong drafter (α = 0.9): cheap drafts, τ = E(0.9, γ)
    def tau(g):
        return (1 - 0.9 ** (g + 1)) / (1 - 0.9)

    chosen = _simulate(lambda g: 1.0 + 0.05 * g, tau, alpha=0.9)
    late = chosen[-32:]
    assert 0 not in late[:-1] and max(set(late), key=late.count) == 6  # the largest candidate wins here


def test_a_fixed_gamma_is_exactly_that_gamma():
    policy = GammaPolicy(3, 8)
    assert {policy.choose(8, [_Row()]) for _ in range(50)} == {3}
