"""Tests for specdec.analysis: the §3 formulas against the paper's tables, then the measurements."""

from __future__ import annotations

import copy

import pytest

from specdec.analysis import (
    expected_tokens,
    operations_increase,
    optimal_gamma,
    speculation_pays,
    walltime_improvement,
)

# Table 1 of the paper (c = ĉ = 0): (α, γ) → (operations increase, walltime speedup)
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha, gamma, operations, speed", TABLE_1)
def test_table_1(alpha: float, gamma: int, operations: float, speed: float) -> None:
    assert round(operations_increase(alpha, gamma, 0.0), 2) == operations
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == speed


def test_table_4_prediction() -> None:
    # EnDe, T5-small draft, temperature 0: α 0.75, c 0.02, γ = 7 → predicted 3.2X
    assert walltime_improvement(0.75, 7, 0.02) == pytest.approx(3.2, abs=0.05)


def test_expected_tokens_limits() -> None:
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 0) == 1.0
    # continuous into α = 1, no cancellation just below it
    assert expected_tokens(1 - 1e-12, 5) == pytest.approx(6.0, rel=1e-9)
    for alpha in (0.1, 0.5, 0.9, 0.999):
        assert expected_tokens(alpha, 7) == pytest.approx(sum(alpha**i for i in range(8)), rel=1e-12)


def test_plain_decoding_is_neutral() -> None:
    assert walltime_improvement(0.3, 0, 0.5) == 1.0
    assert operations_increase(0.3, 0, 0.5) == 1.0


def test_ceiling_is_one_over_one_minus_alpha() -> None:
    assert walltime_improvement(0.8, 200, 0.0) == pytest.approx(1 / (1 - 0.8), rel=1e-9)


def test_optimal_gamma_example() -> None:
    gamma = optimal_gamma(0.8, 0.05)
    assert isinstance(gamma, int) and gamma == 8
    assert walltime_improvement(0.8, gamma, 0.05) == pytest.approx(3.09, abs=0.005)


def test_optimal_gamma_is_the_argmax() -> None:
    for alpha, c in [(0.5, 0.1), (0.7, 0.02), (0.95, 0.01), (0.3, 0.5)]:
        gamma = optimal_gamma(alpha, c, max_gamma=40)
        best = max(walltime_improvement(alpha, g, c) for g in range(1, 41))
        assert walltime_improvement(alpha, gamma, c) == best


def test_optimal_gamma_grows_with_alpha_and_shrinks_with_cost() -> None:
    alphas = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    by_alpha = [optimal_gamma(a, 0.05) for a in alphas]
    assert by_alpha == sorted(by_alpha) and by_alpha[0] < by_alpha[-1]
    costs = [0.001, 0.01, 0.05, 0.1, 0.2, 0.4]
    by_cost = [optimal_gamma(0.8, c) for c in costs]
    assert by_cost == sorted(by_cost, reverse=True) and by_cost[0] > by_cost[-1]


def test_optimal_gamma_edges() -> None:
    assert optimal_gamma(1.0, 0.0, max_gamma=12) == 12  # unbounded speedup: the cap wins
    assert optimal_gamma(0.1, 0.9) == 1  # nothing pays; still an argmax in [1, max_gamma]
    assert optimal_gamma(0.99, 0.0, max_gamma=1) == 1


def test_corollary_3_9() -> None:
    for alpha in (0.1, 0.4, 0.8, 0.95):
        for c in (0.0, 0.05, 0.3, 0.9):
            assert speculation_pays(alpha, c) == (alpha > c)
            s1 = walltime_improvement(alpha, 1, c)
            assert s1 >= (1 + alpha) / (1 + c) - 1e-12
            best = max(walltime_improvement(alpha, g, c) for g in range(1, 65))
            assert (best > 1) == (alpha > c)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: expected_tokens(1.2, 3), "alpha"),
        (lambda: expected_tokens(-0.1, 3), "alpha"),
        (lambda: expected_tokens(float("nan"), 3), "alpha"),
        (lambda: expected_tokens(0.5, -1), "gamma"),
        (lambda: expected_tokens(0.5, 2.5), "gamma"),
        (lambda: walltime_improvement(0.5, 2, -0.1), "cost_ratio"),
        (lambda: walltime_improvement(0.5, 2, float("inf")), "cost_ratio"),
        (lambda: operations_increase(0.5, 2, -1.0), "op_cost_ratio"),
        (lambda: optimal_gamma(0.5, 0.1, max_gamma=0), "max_gamma"),
        (lambda: speculation_pays(0.5, -2), "cost_ratio"),
    ],
)
def test_bad_arguments_name_themselves(call, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()


def test_formulas_do_not_import_torch() -> None:
    # Load analysis.py on its own (the package __init__ imports torch) with torch made unimportable.
    import subprocess
    import sys

    code = (
        "import sys, importlib.util; sys.modules['torch'] = None; "
        "spec = importlib.util.spec_from_file_location('a', 'specdec/analysis.py'); "
        "a = importlib.util.module_from_spec(spec); sys.modules['a'] = a; spec.loader.exec_module(a); "
        "print(a.optimal_gamma(0.8, 0.05), a.walltime_improvement(0.8, 2, 0.1), a.operations_increase(0.8, 2, 0.1))"
    )
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "8"


# ---------------------------------------------------------------------------------------------
# Measurements on tiny random Llama models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specdec.analysis import AlphaMeasurement, measure_alpha, measure_cost_ratio, op_cost_ratio  # noqa: E402
from specdec.core import SamplingConfig, standardize_logits  # noqa: E402


def tiny_llama(seed: int, *, hidden_size: int = 32, layers: int = 2, tie: bool = False) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    # random init gives near-uniform logits; scale them up so argmaxes are stable and p, q differ clearly
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(0)


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    # a perturbed copy of the target: close enough that greedy argmaxes often agree (0 < α < 1)
    model = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=g))
    return model


def brute_force_betas(target, draft, rows, starts, sampling: SamplingConfig) -> list[float]:
    betas = []
    with torch.no_grad():
        for row, start in zip(rows, starts):
            for t in range(start, len(row)):  # the distribution predicting token t, from prefix row[:t]
                prefix = torch.tensor([row[:t]])
                p = standardize_logits(target(input_ids=prefix).logits[0, -1], sampling)
                q = standardize_logits(draft(input_ids=prefix).logits[0, -1], sampling)
                betas.append(float(torch.minimum(p, q).sum()))
    return betas


def random_rows(seed: int, lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(64, (n,), generator=g).tolist() for n in lengths]


def test_same_model_has_alpha_one(target) -> None:
    rows = random_rows(0, [12, 7, 20])
    for temperature in (0.0, 1.0, 0.7):
        m = measure_alpha(target, target, rows, prompt_lengths=[3, 2, 5], temperature=temperature, top_k=10)
        assert isinstance(m, AlphaMeasurement)
        assert m.alpha == pytest.approx(1.0, abs=1e-6)
        assert m.num_positions == (12 - 3) + (7 - 2) + (20 - 5)


def test_alpha_matches_brute_force_on_ragged_batch(target, draft) -> None:
    rows = random_rows(1, [12, 4, 9, 16, 11])
    starts = [4, 1, 3, 10, 11]  # the last row has no generated tokens: contributes nothing
    sampling = SamplingConfig(temperature=1.0, top_k=0, top_p=0.9)
    expected = brute_force_betas(target, draft, rows, starts, sampling)
    m = measure_alpha(target, draft, rows, prompt_lengths=starts, temperature=1.0, top_p=0.9,
                      batch_size=2, return_betas=True)
    assert m.num_positions == len(expected)
    assert m.betas is not None
    torch.testing.assert_close(m.betas, torch.tensor(expected), atol=1e-5, rtol=0)
    assert m.alpha == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert 0.0 < m.alpha < 1.0


def test_alpha_on_tensor_input_and_default_prompt_length(target, draft) -> None:
    ids = torch.randint(64, (3, 10), generator=torch.Generator().manual_seed(2))
    m = measure_alpha(target, draft, ids, temperature=1.0, return_betas=True)
    assert m.num_positions == 3 * 9  # every position with at least one token of context
    expected = brute_force_betas(target, draft, ids.tolist(), [1, 1, 1], SamplingConfig(temperature=1.0))
    assert m.alpha == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def test_greedy_betas_are_zero_or_one(target, draft) -> None:
    rows = random_rows(3, [20, 18])
    m = measure_alpha(target, draft, rows, prompt_lengths=2, temperature=0.0, return_betas=True)
    assert m.betas is not None
    assert set(m.betas.tolist()) <= {0.0, 1.0}
    expected = brute_force_betas(target, draft, rows, [2, 2], SamplingConfig(temperature=0.0))
    assert m.betas.tolist() == expected
    assert 0.0 < m.alpha < 1.0


def test_measure_alpha_restores_train_mode(target) -> None:
    model = tiny_llama(5).train()
    measure_alpha(target, model, [[1, 2, 3]])
    assert model.training and not target.training


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(sequences=[]), "empty"),
        (dict(sequences=[[1, 2, 3]], prompt_lengths=0), "prompt_lengths"),
        (dict(sequences=[[1, 2, 3]], prompt_lengths=5), "prompt_lengths"),
        (dict(sequences=[[1, 2, 3]], prompt_lengths=[1, 2]), "prompt_lengths"),
        (dict(sequences=[[1, 2, 3]], prompt_lengths=3), "no positions"),
        (dict(sequences=[[1, 2, 3]], temperature=-1.0), "temperature"),
    ],
)
def test_measure_alpha_bad_input(target, kwargs, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        measure_alpha(target, target, **kwargs)


def test_measure_alpha_vocab_mismatch(target) -> None:
    config = transformers.LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    other = transformers.LlamaForCausalLM(config).eval()
    with pytest.raises(ValueError, match="vocabular"):
        measure_alpha(target, other, [[1, 2, 3]])


def test_cost_ratio_of_a_model_with_itself_is_about_one(target) -> None:
    # loose bounds: CI machines are shared and noisy; the point is "same model → same order"
    c = measure_cost_ratio(target, target, context_length=16, num_tokens=32)
    assert 1 / 3 < c < 3.0


def test_cost_ratio_sees_a_bigger_target() -> None:
    small = tiny_llama(0, hidden_size=32, layers=1)
    big = tiny_llama(1, hidden_size=256, layers=8)
    c = measure_cost_ratio(big, small, context_length=32, num_tokens=16)
    assert 0.0 < c < 0.7


def test_op_cost_ratio_counts_matmul_parameters() -> None:
    a, b = tiny_llama(0), tiny_llama(1, hidden_size=64, layers=3)
    assert op_cost_ratio(a, a) == 1.0

    def matmul_params(m) -> int:  # everything but the input embedding table (lm_head is a matmul)
        return sum(p.numel() for p in m.parameters()) - m.get_input_embeddings().weight.numel()

    assert op_cost_ratio(a, b) == pytest.approx(matmul_params(b) / matmul_params(a))  # draft / target
    # tying the weights changes the parameter count but not the arithmetic per token
    tied = tiny_llama(2, tie=True)
    assert sum(p.numel() for p in tied.parameters()) < sum(p.numel() for p in a.parameters())
    assert op_cost_ratio(tied, a) == 1.0


def test_median_timed_warms_up_once_and_returns_the_median_run(monkeypatch) -> None:
    import time

    import torch

    from specdec import analysis

    clock = [0.0]
    durations = {0: 100.0, 1: 5.0, 2: 1.0, 3: 3.0}  # fn(0) is the warm-up: never among the timed runs
    calls: list[int] = []

    def fn(i: int) -> str:
        calls.append(i)
        clock[0] += durations[i]
        return f"run {i}"

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    seconds, result = analysis.median_timed(fn, torch.device("cpu"), 3)
    assert calls == [0, 1, 2, 3]
    assert (seconds, result) == (3.0, "run 3")
    calls.clear()
    seconds, result = analysis.median_timed(fn, torch.device("cpu"), 1, warmup=lambda: calls.append(-1))
    assert calls == [-1, 1] and (seconds, result) == (5.0, "run 1")
    with pytest.raises(ValueError, match="repeats"):
        analysis.median_timed(fn, torch.device("cpu"), 0)
