"""Speculative beam search inside the engine (`engine/beam.py`): a beam request's beams equal transformers'
`generate(num_beams=w, do_sample=False)` and the loop's `beam_search`, with and without a drafter, with EOS, and
while chain requests run and join in the same engine (neither changes the other's tokens); a deliberately wrong rule
fails the same comparison; refusals name what beams cannot combine with. Over both KV layouts: on the paged pool
(`engine/beam_blocks.py`) the books balance after every step (`KVPool.check`) and a leaked block is caught."""

import functools

import pytest
import torch

import specdec

from helpers import hf_beams, hf_greedy, perturbed_copy
from specdec.engine import Engine, EngineConfig
from specdec.engine import beam as engine_beam
from specdec.engine.beam import BeamOutput, BeamParams
from specdec.engine.beam_run import engine_beam_search
from specdec.search import beam_rules
from specdec.search.beam import beam_search
from specdec.request import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5, 3, 4]]
N = 10


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target)  # agrees often but not always: accepted and rejected replays both happen


@functools.lru_cache(maxsize=None)
def _hf(model, prompt: tuple, w: int, eos: tuple, length_penalty: float = 1.0, early_stopping=False):
    return hf_beams(model, prompt, w, eos, N, length_penalty, early_stopping)


LAYOUTS = ["static", "paged"]


def engine_beams(target, draft, requests, *, max_batch=8, chains=(), late_chains=(), **config):
    """Run beam `requests` [(prompt, SamplingParams, BeamParams)] and chain requests [(prompt, SamplingParams)]
    in one engine; `late_chains` join after two steps → (beam outputs, chain tokens, late chain tokens). Paged:
    the pool's books are checked after every step and every block is back at the end."""
    engine = Engine(target, draft, EngineConfig(max_batch_size=max_batch, max_seq_len=64, num_draft_tokens=3,
                                                **config))
    engine_beams.last = engine
    ids = [engine.add_request(p, s, beams=b) for p, s, b in requests]
    chain_ids = [engine.add_request(p, s) for p, s in chains]
    tokens, finals, steps = {}, {}, 0
    late_ids = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finals[out.request_id] = out
        steps += 1
        if engine.kv_pool is not None:
            engine.kv_pool.check()
        if steps == 2:
            late_ids = [engine.add_request(p, s) for p, s in late_chains]
    if engine.kv_pool is not None:
        assert engine.kv_cache_usage.num_used_blocks == 0
    return [finals[i] for i in ids], [tokens.get(i, []) for i in chain_ids], [tokens.get(i, []) for i in late_ids]


def greedy(eos=(), n=N):
    return SamplingParams(temperature=0, max_new_tokens=n, eos_token_ids=eos)


def assert_transformers_beams(model, outs, w, eos, **kw):
    for prompt, out in zip(PROMPTS, outs):
        ref_beams, ref_scores = _hf(model, tuple(prompt), w, tuple(eos), **kw)
        assert isinstance(out, BeamOutput) and out.finished
        assert list(out.beams[0]) == out.new_token_ids
        assert [list(b) for b in out.beams] == ref_beams
        if ref_scores is not None:
            assert list(out.beam_scores) == pytest.approx(ref_scores, abs=1e-4)
        assert out.finish_reason == ("stop" if out.new_token_ids[-1] in eos else "length")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("w, u, gamma, eos", [(1, 2, 3, (7,)), (2, 2, 1, ()), (2, 4, 3, (7,)), (4, 4, 3, ()),
                                              (4, 8, 2, (7, 20))])
def test_engine_beams_equal_transformers_and_the_loop(pair, w, u, gamma, eos, layout):
    target, draft = pair
    requests = [(p, greedy(eos), BeamParams(w, u, gamma, num_return_sequences=w)) for p in PROMPTS]
    outs, _, _ = engine_beams(target, draft, requests, max_batch=8 if w < 4 else 16, kv_layout=layout)
    assert_transformers_beams(target, outs, w, eos)
    loop = beam_search(target, PROMPTS, draft, num_beams=w, draft_beams=u, num_draft_tokens=gamma,
                       max_new_tokens=N, eos_token_id=list(eos))
    for out, beams, scores, prompt in zip(outs, loop.sequences, loop.scores, PROMPTS):
        assert [list(b) for b in out.beams] == beams
        assert list(out.beam_scores) == pytest.approx(scores, abs=1e-4)
    passes = sum(o.beam_stats.passes for o in outs)
    assert passes == loop.stats.prompt_passes  # the same replay, pass for pass
    if w == 1:
        assert [o.new_token_ids for o in outs] == [hf_greedy(target, p, N, list(eos)) for p in PROMPTS]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("w", [1, 2, 4])
def test_plain_engine_beams_without_a_drafter(pair, w, layout):
    target, _ = pair
    requests = [(p, greedy(), BeamParams(w, num_return_sequences=w)) for p in PROMPTS]
    outs, _, _ = engine_beams(target, None, requests, kv_layout=layout)
    assert_transformers_beams(target, outs, w, ())
    assert all(o.beam_stats.passes == N and o.beam_stats.draft_nodes == 0 for o in outs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_length_rules_on_the_engine(pair, layout):
    target, draft = pair
    for lp, es in [(2.0, "never"), (0.5, True)]:
        requests = [(p, greedy((7, 20)), BeamParams(3, 4, 2, length_penalty=lp, early_stopping=es,
                                                     num_return_sequences=3)) for p in PROMPTS]
        outs, _, _ = engine_beams(target, draft, requests, kv_layout=layout)
        assert_transformers_beams(target, outs, 3, (7, 20), length_penalty=lp, early_stopping=es)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prefill_budget", [None, 16])
def test_beams_and_chains_share_the_engine_without_changing_each_other(pair, prefill_budget, layout):
    """Beam groups run next to chain rows (admitted before and after them; with chunked prefill, late chains fill
    their slots a few tokens per step below the groups): every request's tokens are what it gives alone."""
    target, draft = pair
    chains = [([3, 9, 2, 14], greedy(n=12)), ([8, 8, 1], greedy(n=7))]
    late = [(list(range(21, 61)), greedy(n=9)), ([4], greedy(n=12))]  # 40 prompt tokens: 3 budgets
    requests = [(p, greedy((7,)), BeamParams(2, 4, 3, num_return_sequences=2)) for p in PROMPTS[:2]]
    outs, chain_tokens, late_tokens = engine_beams(target, draft, requests, max_batch=16, chains=chains,
                                                   late_chains=late, prefill_budget=prefill_budget, kv_layout=layout)
    alone_beams = [engine_beams(target, draft, [r])[0][0] for r in requests]
    assert [o.beams for o in outs] == [o.beams for o in alone_beams]
    assert_transformers_beams(target, outs, 2, (7,))
    for (prompt, params), got in zip(chains + late, chain_tokens + late_tokens):
        assert got == hf_greedy(target, prompt, params.max_new_tokens, [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_beam_group_waits_for_slots_and_chains_wait_for_it(pair, layout):
    """max_batch 4: a w=4 group takes every slot, so the chains wait for it (and it for them), in order."""
    target, draft = pair
    chains = [([3, 9, 2, 14], greedy(n=5))]
    requests = [(PROMPTS[0], greedy(), BeamParams(4, 4, 2, num_return_sequences=4))]
    outs, chain_tokens, late_tokens = engine_beams(target, draft, requests, max_batch=4, chains=chains,
                                                   late_chains=[([4, 5], greedy(n=4))], kv_layout=layout)
    assert [list(b) for b in outs[0].beams] == _hf(target, tuple(PROMPTS[0]), 4, ())[0]
    assert chain_tokens[0] == hf_greedy(target, [3, 9, 2, 14], 5, [])
    assert late_tokens[0] == hf_greedy(target, [4, 5], 4, [])


def test_a_wrong_rule_fails_the_equality(pair, monkeypatch):
    """Negative controls: the same comparison must fail with the length penalty dropped (scores not normalized) or
    with a non-top continuation kept as a running beam."""
    target, draft = pair
    requests = [(p, greedy((7, 20)), BeamParams(3, 4, 2, length_penalty=2.0, num_return_sequences=3)) for p in PROMPTS]
    original = beam_rules.beam_step
    monkeypatch.setattr(engine_beam, "BeamConfig",
                        lambda w, n, eos, lp, es: beam_rules.BeamConfig(w, n, eos, 0.0, es))  # lp dropped
    with pytest.raises(AssertionError):
        outs, _, _ = engine_beams(target, draft, requests)
        assert_transformers_beams(target, outs, 3, (7, 20), length_penalty=2.0)
    monkeypatch.undo()

    def keep_a_lower_beam(state, log_probs, config, stepping):
        state, parents, tokens = original(state, log_probs, config, stepping)
        return state, parents.flip(1), tokens.flip(1)  # running beams re-gathered in the wrong order

    import specdec.search.beam as loop_beam
    monkeypatch.setattr(loop_beam, "beam_step", keep_a_lower_beam)
    with pytest.raises(AssertionError):
        outs, _, _ = engine_beams(target, draft, [(p, greedy(), BeamParams(4, 4, 3, num_return_sequences=4))
                                                  for p in PROMPTS])
        assert_transformers_beams(target, outs, 4, ())


@pytest.mark.parametrize("w, u, gamma", [(2, 4, 3), (4, 4, 5)])
def test_beam_search_front_door_runs_on_the_engine(pair, w, u, gamma):
    """`specdec.beam_search(engine="fast")` is the engine's beam groups: transformers' beams, the same replay per
    prompt as the transformers path (which batches the prompts: fewer passes, the same prompt passes)."""
    target, draft = pair
    kw = dict(num_beams=w, draft_beams=u, num_draft_tokens=gamma, max_new_tokens=N, eos_token_id=[7])
    res = specdec.beam_search(target, PROMPTS, draft, engine="fast", **kw)
    for prompt, beams, scores in zip(PROMPTS, res.sequences, res.scores):
        ref_beams, ref_scores = _hf(target, tuple(prompt), w, (7,))
        assert beams == ref_beams and scores == pytest.approx(ref_scores, abs=1e-4)
    hf = specdec.beam_search(target, PROMPTS, draft, engine="hf", **kw)
    assert (res.stats.prompt_passes, res.stats.beam_steps) == (hf.stats.prompt_passes, hf.stats.beam_steps)
    assert res.stats.passes == res.stats.prompt_passes  # one search per prompt
    perfect = specdec.beam_search(target, PROMPTS, target, engine="fast", num_beams=2, draft_beams=2,
                                  num_draft_tokens=4, max_new_tokens=N, eos_token_id=[])
    assert perfect.sequences == [_hf(target, tuple(p), 2, ())[0] for p in PROMPTS]
    assert perfect.stats.steps_per_pass == 5.0  # the accepted nodes' K/V were copied into place: 5 + 5 steps
    queued = engine_beam_search(target, PROMPTS, draft, config=EngineConfig(max_batch_size=w, max_seq_len=64), **kw)
    assert queued.sequences == res.sequences  # one group at a time: the others wait for its slots
    with pytest.raises(ValueError, match="engine"):
        specdec.beam_search(target, PROMPTS, draft, engine="vllm")
    with pytest.raises(ValueError, match="draft_beams"):
        specdec.beam_search(target, PROMPTS, draft, engine="fast", num_beams=4, draft_beams=2)
    with pytest.raises(TypeError, match="drafter"):
        specdec.beam_search(target, PROMPTS, "ngram", engine="fast")


def test_refusals_name_what_beams_cannot_combine_with(pair):
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=64))
    cases = [(SamplingParams(temperature=1.0, max_new_tokens=N), BeamParams(2), "temperature"),
             (SamplingParams(temperature=0, max_new_tokens=N, draft_tree=(2, 1)), BeamParams(2), "draft_tree"),
             (SamplingParams(temperature=0, max_new_tokens=N, leniency=0.5), BeamParams(2), "leniency"),
             (SamplingParams(temperature=0, max_new_tokens=N, repetition_penalty=1.2), BeamParams(2),
              "repetition_penalty"),
             (SamplingParams(temperature=0, max_new_tokens=N, logprobs=True), BeamParams(2), "logprobs"),
             (greedy(), BeamParams(8), "num_beams=8 needs 8"),
             (greedy(), BeamParams(4, 16, 4), "64 tree nodes"),
             (greedy(n=60), BeamParams(2, 8, 6), "max_seq_len")]
    for params, beams, match in cases:
        with pytest.raises(ValueError, match=match):
            engine.add_request([1, 2, 3], params, beams=beams)
    for kwargs, match in [({"num_beams": 0}, "num_beams"), ({"num_beams": 4, "draft_beams": 2}, "draft_beams"),
                          ({"num_draft_tokens": -1}, "num_draft_tokens"), ({"length_penalty": float("nan")},
                          "length_penalty"), ({"early_stopping": "sometimes"}, "early_stopping"),
                          ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences")]:
        with pytest.raises(ValueError, match=match):
            BeamParams(**kwargs)
    with pytest.raises(TypeError, match="beams"):
        engine.add_request([1, 2], greedy(), beams={"num_beams": 2})
    plain = Engine(target, None, EngineConfig(max_batch_size=4, max_seq_len=64))
    with pytest.raises(ValueError, match="need a draft model"):
        plain.add_request([1, 2], greedy(), beams=BeamParams(2, num_draft_tokens=2))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_abort_and_empty_budget(pair, layout):
    target, draft = pair
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=64, kv_layout=layout))
    a = engine.add_request(PROMPTS[0], greedy(), beams=BeamParams(2))
    b = engine.add_request(PROMPTS[1], greedy(n=0), beams=BeamParams(2))
    first = engine.step()
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in first] == [(b, [], "length")]
    assert engine.num_beam_groups == 1
    engine.abort(a)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(a, "abort")]
    assert engine.num_beam_groups == 0
    c = engine.add_request(PROMPTS[0], greedy(), beams=BeamParams(2), request_id=a)  # the id is free again
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs] == [c] and isinstance(outs[0], engine_beam.BeamOutput)
    if engine.kv_pool is not None:  # the aborted group's blocks came back
        engine.kv_pool.check()
        assert engine.kv_cache_usage.num_used_blocks == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_engine_beams_on_cuda_equal_transformers_beside_chains(make_llama, layout):
    """On a CUDA engine (fp32 tiny Llamas: the fused layers, the Triton tree mask, the chain rows captured as CUDA
    graphs beside the groups) the beams are transformers' (fp32, where bf16 would only show near-ties) and the
    chains' tokens plain greedy's."""
    target = make_llama(0)
    draft = perturbed_copy(target)
    cases = ((2, 4, 3), (4, 4, 3), (4, 8, 2))
    refs = {(w, tuple(p)): _hf(target, tuple(p), w, (7,)) for w, _, _ in cases for p in PROMPTS}  # (on the CPU)
    chains = [([3, 9, 2, 14], 12), ([8, 8, 1], 7)]
    chain_refs = [hf_greedy(target, p, n, []) for p, n in chains]
    target, draft = target.cuda(), draft.cuda()
    for w, u, gamma in cases:
        engine = Engine(target, draft, EngineConfig(max_batch_size=16, max_seq_len=64, num_draft_tokens=3,
                                                    kv_layout=layout))
        assert engine.cuda_graphs
        ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=N, eos_token_ids=(7,)),
                                  beams=BeamParams(w, u, gamma, num_return_sequences=w)) for p in PROMPTS]
        chain_ids = [engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n)) for p, n in chains]
        finals, tokens = {}, {}
        while engine.has_unfinished():
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
                if out.finished:
                    finals[out.request_id] = out
            if engine.kv_pool is not None:
                engine.kv_pool.check()
        for rid, prompt in zip(ids, PROMPTS):
            ref_beams, ref_scores = refs[(w, tuple(prompt))]
            assert [list(b) for b in finals[rid].beams] == ref_beams
            assert list(finals[rid].beam_scores) == pytest.approx(ref_scores, abs=1e-4)
        assert [tokens[rid] for rid in chain_ids] == chain_refs
    # specdec.beam_search's default on CUDA ("auto") is the engine: one search per prompt (the transformers path
    # batches the 3 prompts, so its first pass alone counts 3 prompt passes)
    res = specdec.beam_search(target, PROMPTS, draft, num_beams=2, draft_beams=4, num_draft_tokens=3, max_new_tokens=N,
                              eos_token_id=[7])
    assert res.sequences == [refs[(2, tuple(p))][0] for p in PROMPTS]
    assert res.stats.passes == res.stats.prompt_passes


def test_beam_params_refuse_hostile_values_by_name():
    """Any value for any field: a valid BeamParams, or a ValueError / TypeError naming the field (never another
    exception)."""
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    odd = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.just(float("nan")), st.just(float("inf")),
                    st.floats(allow_nan=False, width=32), st.integers(-(2**70), 2**70), st.integers(0, 9),
                    st.just("never"), st.just(torch.tensor(2)), st.just(object()))
    fields = ("num_beams", "draft_beams", "num_draft_tokens", "length_penalty", "early_stopping",
              "num_return_sequences")

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(st.sampled_from(fields), odd)
    def check(name, value):
        try:
            params = BeamParams(**{name: value})
        except (ValueError, TypeError) as err:
            assert name in str(err)
        else:
            assert 1 <= params.num_beams <= params.width and 1 <= params.num_return_sequences <= params.num_beams

    check()
