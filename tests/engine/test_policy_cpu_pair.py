"""The engine's "auto" γ on the Qwen2.5-Coder pair's measured CPU costs (batch 1, the 1.5B target, the 0.5B draft;
`scripts/pair_costs.py`, docs/QWEN_PAIR.md): a verify pass of γ + 1 tokens costs r(γ + 1) one-token passes and a
draft token c of one, so T(γ) / T(0) = γ·c + r(γ + 1). Two tables: CPU seconds with one thread (what a pass costs a
core: γ = 1 wins 1.2x at α 0.9) and wall seconds with two threads on the loaded shared machine (every γ loses).
"auto" must never be much slower than plain decoding on either (where every fixed γ loses, as on the loaded table,
that means it settles on plain steps); the tables themselves are checked to say what the docs say of them."""

from policy_sim import Cell, fixed_rates, simulate

# r(k) = T(target pass of k tokens) / T(one-token pass), k = 2..9, and c = T(draft token) / T(one-token target pass)
CPU_1_THREAD = (0.47, {2: 1.08, 3: 1.566, 4: 1.824, 5: 2.618, 6: 2.975, 7: 2.963, 8: 2.548, 9: 2.821}, 0.391)
WALL_2_THREADS_LOADED = (0.75, {2: 2.166, 3: 2.331, 4: 3.474, 5: 3.744, 6: 3.599, 7: 5.537, 8: 4.265, 9: 5.093}, 1.63)


def _cell(name, costs, alpha):
    c, r, plain_s = costs
    ratios = tuple((g, g * c + r[g + 1]) for g in (1, 2, 3, 4, 5, 6, 8))
    return Cell(name, 1, plain_s, ratios, alpha, catch_up_s=plain_s, requests=40, new_tokens=(32, 128),
                prompts=(30, 200), capture_s=0.0, draft_token_s=c * plain_s)


def test_auto_never_much_slower_than_plain_on_the_pair_cpu_costs():
    for costs, alpha in ((CPU_1_THREAD, 0.9), (CPU_1_THREAD, 0.75), (WALL_2_THREADS_LOADED, 0.9)):
        cell = _cell("qwen cpu", costs, alpha)
        fixed = fixed_rates(cell, gammas=(0, 1, 2, 4))
        auto = simulate(cell, "auto", seed=1)["tok_s"]
        assert auto >= 0.97 * fixed[0], (alpha, auto / fixed[0])


def test_every_fixed_gamma_loses_on_the_loaded_wall_clock_costs():
    cell = _cell("qwen loaded", WALL_2_THREADS_LOADED, 0.9)
    fixed = fixed_rates(cell, gammas=(0, 1, 2, 4, 8))
    assert max(fixed, key=fixed.get) == 0  # speculation loses here: plain is the right arm
    quiet = fixed_rates(_cell("qwen quiet", CPU_1_THREAD, 0.9), gammas=(0, 1, 4))
    assert quiet[1] > 1.1 * quiet[0] > quiet[4]  # on one quiet core γ = 1 wins and γ = 4 loses
