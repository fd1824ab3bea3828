"""Lenience (appendix A.5) on the engine, per request: l = 1 rows are bit for bit the exact rule, greedy l < 1 gives
the loop's tokens (fp32), a lenient row's tokens do not depend on its batch, and at T > 0 the first token follows
the lenient law min(q, p/l) + (1 − β_l)·norm(max(0, p − q)) — with a negative control (lenience applied twice)."""

import numpy as np
import pytest
import torch

import specdec
from specdec.core import SamplingConfig, standardize_logits, verify, verify_greedy
from specdec.engine import Engine, EngineConfig
from specdec.engine import step_runner
from specdec.request import SamplingParams
from stats_utils import chi2_pvalue
from test_distribution import PROMPT
from test_lenience import lenient_law

PASS, FAIL = 1e-3, 1e-8
ROWS = 6000
LENIENT = 0.2
PROMPTS = [[5, 6, 7, 8], [1, 2], [9, 3, 3, 9, 4], [4, 4, 9]]


@pytest.fixture(scope="module")
def pair(peaked_pair):
    return peaked_pair


@pytest.fixture(scope="module")
def small_pair(make_llama):
    """16 tokens, laws peaked enough that p/l, (p/l)/l and p tell apart (the raw tiny models are near uniform)."""
    target, draft = make_llama(10, vocab=16), make_llama(11, layers=1, vocab=16)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    return target, draft


def run(pair, requests, gamma=3, max_batch=4):
    """Tokens per request of `requests` [(prompt, SamplingParams)], all added at once."""
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=max_batch, max_seq_len=128, num_draft_tokens=gamma))
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    tokens = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[rid] for rid in ids], engine


def test_per_row_leniency_one_is_bit_for_bit_the_float_rule():
    g = torch.Generator().manual_seed(3)
    p = torch.rand(8, 4, 11, generator=g).softmax(-1)
    q = torch.rand(8, 3, 11, generator=g).softmax(-1)
    drafts = torch.multinomial(q.view(-1, 11), 1, generator=g).view(8, 3)
    u = torch.rand(8, 3, generator=g)
    noise = torch.empty(8, 11).exponential_(generator=g)
    rows = torch.tensor([1.0, 0.3, 1.0, 0.5, 1.0, 1.0, 0.1, 1.0])
    exact = verify(drafts, q, p, uniforms=u, noise=noise)
    mixed = verify(drafts, q, p, uniforms=u, noise=noise, leniency=rows)
    one = rows == 1.0
    for field in ("num_accepted", "next_token", "beta"):
        assert torch.equal(getattr(exact, field)[one], getattr(mixed, field)[one])
    for i, l in enumerate(rows.tolist()):  # a lenient row: as the float rule with its own l
        alone = verify(drafts[i : i + 1], q[i : i + 1], p[i : i + 1], uniforms=u[i : i + 1], noise=noise[i : i + 1],
                       leniency=l)
        assert torch.equal(alone.num_accepted, mixed.num_accepted[i : i + 1])
        assert torch.equal(alone.beta, mixed.beta[i : i + 1])
    logits = torch.randn(8, 4, 11, generator=g)
    logits[0, 0, int(drafts[0, 0])] = logits[0, 0].max()  # a tie with the argmax: not a match at l = 1
    a, b = verify_greedy(drafts, logits), verify_greedy(drafts, logits, leniency=rows)
    assert torch.equal(a.num_accepted[one], b.num_accepted[one]) and torch.equal(a.next_token[one], b.next_token[one])
    for i, l in enumerate(rows.tolist()):
        assert torch.equal(verify_greedy(drafts[i : i + 1], logits[i : i + 1], leniency=l).num_accepted,
                           b.num_accepted[i : i + 1])
    with pytest.raises(ValueError, match="leniency"):
        verify(drafts, q, p, leniency=rows[:3])


def test_exact_rows_are_unchanged_beside_lenient_ones(pair):
    exact = [SamplingParams(temperature=t, max_new_tokens=14, seed=i) for i, t in enumerate((0, 0.8, 0, 1.0))]
    alone, _ = run(pair, list(zip(PROMPTS, exact)))
    lenient = [exact[0], SamplingParams(temperature=0.8, max_new_tokens=14, seed=1, leniency=0.3), exact[2],
               SamplingParams(temperature=0, max_new_tokens=14, leniency=0.05)]
    mixed, _ = run(pair, list(zip(PROMPTS, lenient)))
    assert mixed[0] == alone[0] and mixed[2] == alone[2]
    assert mixed[1] != alone[1] or mixed[3] != alone[3]  # lenience took effect somewhere


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_lenient_engine_equals_the_loop(pair, gamma):
    target, draft = pair
    """Each prompt alone on the loop: a step drafts at most what its row can still commit, per row on the engine, per
    batch on the loop (its γ is clamped to the longest row's remaining budget) — under lenience, which is lossy,
    drafting at a row's last token changes that token, so only a batch of one clamps like the engine's rows."""
    kw = dict(drafter=draft, max_new_tokens=16, temperature=0, num_draft_tokens=gamma, eos_token_id=[])
    loop = [specdec.generate(target, [p], leniency=LENIENT, engine="hf", **kw).sequences[0] for p in PROMPTS]
    fast = specdec.generate(target, PROMPTS, leniency=LENIENT, engine="fast", **kw)
    exact = specdec.generate(target, PROMPTS, engine="fast", **kw)
    assert fast.sequences == loop
    assert fast.sequences != exact.sequences  # lossy: the lenient rule accepted drafts the argmax rule rejects
    assert fast.stats.target_calls < exact.stats.target_calls


def test_a_greedy_lenient_row_ignores_the_temperatures_beside_it(pair):
    me = SamplingParams(temperature=0, max_new_tokens=16, leniency=LENIENT)
    alone, _ = run(pair, [(PROMPTS[0], me)])
    crowd = [(p, SamplingParams(temperature=0.9, top_k=5, max_new_tokens=10, seed=i)) for i, p in enumerate(PROMPTS[1:])]
    mixed, _ = run(pair, [(PROMPTS[0], me), *crowd])
    assert mixed[0] == alone[0]


def first_tokens(small_pair, leniency: float, sampling: SamplingConfig = SamplingConfig(1.0)) -> np.ndarray:
    target, draft = small_pair
    res = specdec.generate(target, [PROMPT] * ROWS, drafter=draft, max_new_tokens=2, temperature=sampling.temperature,
                           top_k=sampling.top_k, top_p=sampling.top_p, num_draft_tokens=2, seed=5, eos_token_id=[],
                           engine="fast", leniency=leniency)
    return np.array([s[0] for s in res.sequences])


def law(small_pair, leniency: float, sampling: SamplingConfig = SamplingConfig(1.0)) -> np.ndarray:
    """The lenient law of the first token from the standardized p and q at the prompt (both filtered alike)."""
    target, draft = small_pair
    with torch.no_grad():
        p, q = (standardize_logits(m(torch.tensor([PROMPT])).logits[0, -1], sampling).double() for m in small_pair)
    return lenient_law(p, q, leniency).numpy()


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.8, top_k=6), SamplingConfig(1.0, top_p=0.8)])
def test_first_token_follows_the_lenient_law(small_pair, sampling):
    tokens = first_tokens(small_pair, LENIENT, sampling)
    assert chi2_pvalue(tokens, law(small_pair, LENIENT, sampling)) > PASS
    if sampling == SamplingConfig(1.0):  # (with a filter both laws keep a few tokens and lie too close to tell)
        assert chi2_pvalue(tokens, law(small_pair, 1.0, sampling)) < FAIL  # lossy by design: not the target's law


def test_negative_control_lenience_applied_twice_fails(small_pair, monkeypatch):
    real = step_runner.verify

    def twice(*args, leniency=1.0, **kwargs):
        return real(*args, leniency=leniency * leniency if isinstance(leniency, torch.Tensor) else leniency, **kwargs)

    monkeypatch.setattr(step_runner, "verify", twice)
    tokens = first_tokens(small_pair, LENIENT)
    assert chi2_pvalue(tokens, law(small_pair, LENIENT)) < FAIL


def test_sampled_lenience_accepts_more(small_pair):
    target, draft = small_pair
    kw = dict(drafter=draft, max_new_tokens=12, temperature=1.0, num_draft_tokens=3, seed=2, eos_token_id=[],
              engine="fast")
    exact = specdec.generate(target, [PROMPT] * 32, **kw)
    lenient = specdec.generate(target, [PROMPT] * 32, leniency=0.1, **kw)
    assert lenient.stats.alpha > exact.stats.alpha
    assert lenient.stats.mean_accepted_length > exact.stats.mean_accepted_length


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lenience_under_cuda_graphs_matches_the_eager_engine(pair):
    """Per-row l on the device inside captured steps: the greedy lenient tokens of the eager CPU engine, and a
    mixed batch (lenient and exact, greedy and sampled) captured once per flavor."""
    target, draft = pair
    kw = dict(drafter=draft, max_new_tokens=24, temperature=0, num_draft_tokens=3, eos_token_id=[], engine="fast")
    cpu = specdec.generate(target, PROMPTS, leniency=LENIENT, **kw).sequences
    gpu_pair = (target.cuda(), draft.cuda())
    try:
        kw["drafter"] = gpu_pair[1]
        gpu = specdec.generate(gpu_pair[0], PROMPTS, leniency=LENIENT, **kw).sequences
        requests = [(p, SamplingParams(temperature=t, max_new_tokens=16, seed=i, leniency=l))
                    for i, (p, t, l) in enumerate(zip(PROMPTS, (0, 0.8, 0, 1.0), (1.0, 0.3, LENIENT, 1.0)))]
        mixed, engine = run(gpu_pair, requests)
        assert engine.cuda_graphs
        alone, _ = run(gpu_pair, [requests[2]])
    finally:
        target.cpu(), draft.cpu()
    assert gpu == cpu
    assert mixed[2] == alone[0]
