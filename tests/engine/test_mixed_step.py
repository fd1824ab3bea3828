"""The mixed prefill/decode step (`EngineConfig.mixed_step`, `engine/mixed_step.py`): the filling rows' prompt chunks
ride in the running rows' verify forward, and a request's tokens are those of a whole prefill at admission —
greedy and seeded T = 1, plain / a draft model / a feature head, arrivals mid-flight, more requests than slots, a
tiny pool that preempts; the mixed steps did run (the running rows produced tokens in steps that fed chunks); a
chunk fed one position off, or a verify row one position off, fails the same comparison (negative controls); the
option's validation and its resolution at build (True, False, "auto"); token-tree requests prefill whole. The
bounded shapes (padding, buckets, warm-up): tests/engine/test_mixed_step_shapes.py."""

import pytest
import torch

from helpers import hf_greedy
from prefill_helpers import drive, head, mixed_params, prompt
from specdec.engine import Engine, EngineConfig
from specdec.engine import mixed_step as mixed_module
from specdec.engine.step_input import PrefillChunks
from specdec.request import SamplingParams

EARLY = [prompt(5, 1), prompt(9, 2)]
LATE = [prompt(70, 3), prompt(4, 4), prompt(41, 5), prompt(12, 6)]  # longer than the budget, and shorter


def _drafter(kind, make_llama, target):
    if kind == "plain":
        return None
    return make_llama(5, layers=1) if kind == "model" else head(target)


def _run(target, draft, mixed: bool, budget=24, watch=None, **config):
    options = dict(max_batch_size=4, max_seq_len=128, num_draft_tokens=3 if draft is not None else 0, admit_min=1)
    options.update(config)
    engine = Engine(target, draft, EngineConfig(mixed_step=mixed, prefill_budget=budget if mixed else None,
                                                **options))
    seen = {"mixed": 0, "stalled": 0}

    def look(e, outs):
        if e.runner.mixed_steps and any(s.ran for s in e.runner.mixed_steps.values()):
            seen["mixed"] += 1
        if watch is not None:
            watch(e, outs)
    tokens = drive(engine, EARLY, LATE, mixed_params(len(EARLY) + len(LATE)), watch=look)
    return tokens, engine, seen


@pytest.mark.parametrize("kind", ["plain", "model", "head"])
def test_mixed_step_gives_the_tokens_of_a_whole_prefill(make_llama, kind):
    """Six requests through four slots, four of them arriving mid-flight (one 70-token prompt fed over three steps of
    a 24-token budget): the tokens of prefilling each prompt whole at admission, greedy and seeded T = 1."""
    target = make_llama(0)
    draft = _drafter(kind, make_llama, target)
    fed_beside = []  # steps that fed a chunk while running rows went on (each produced a token)

    def watch(e, outs):
        if e.num_prefilling and outs:
            fed_beside.append(all(o.new_token_ids or o.finished for o in outs))
    mixed, engine, _ = _run(target, draft, True, watch=watch)
    whole, _, _ = _run(target, draft, False)
    assert engine.runner.mixed_steps and fed_beside and all(fed_beside)  # (the mixed steps ran: not vacuous)
    assert mixed == whole
    assert mixed[2] == hf_greedy(target, LATE[0], 20, [])  # the longest, greedy: the target's own tokens


def test_mixed_step_under_a_tiny_pool_that_preempts(make_llama):
    """A pool too small for every request at once: running and filling requests are preempted (recomputed on
    readmission) and the tokens stay a whole prefill's."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    memory = dict(kv_cache_memory=26 * 2 * 1024)  # (a few dozen blocks of the tiny pair's)
    mixed, engine, _ = _run(target, draft, True, **memory)
    assert engine.kv_pool.num_preemptions > 0, "the pool did not preempt: the scenario lost its point"
    whole, _, _ = _run(target, draft, False, **memory)
    assert mixed == whole


@pytest.mark.parametrize("wrong", ["chunk", "verify"])
def test_a_row_fed_one_position_off_fails_the_comparison(make_llama, monkeypatch, wrong):
    """Negative controls: the same comparison fails when each chunk is fed one position later (the host's meta), or
    each verify row one position later (the device lengths the batch builder reads: K/V and queries misplaced)."""
    target = make_llama(0)
    whole, _, _ = _run(target, None, False)
    if wrong == "chunk":
        meta = mixed_module.host_meta

        def shifted(layout, chunks, n):
            return meta(layout, PrefillChunks(chunks.slots, tuple(s + 1 for s in chunks.starts),
                                              tuple(e + 1 for e in chunks.ends), chunks.lengths), n)
        monkeypatch.setattr(mixed_module, "host_meta", shifted)
    else:
        build = mixed_module.mixed_batch
        monkeypatch.setattr(mixed_module, "mixed_batch",
                            lambda meta, verify, lengths, *args, **kwargs: build(meta, verify, lengths + 1, *args,
                                                                                 **kwargs))
    off, engine, _ = _run(target, None, True)
    assert engine.runner.mixed_steps
    assert off != whole


def test_mixed_step_is_auto_by_default_and_checked(make_llama):
    from specdec.engine.config import DEFAULT_MIXED_STEP

    assert EngineConfig().mixed_step == DEFAULT_MIXED_STEP == "auto"
    for bad in (1, 0, "Auto", "yes", None):
        with pytest.raises(TypeError, match="mixed_step must be True, False or 'auto'"):
            EngineConfig(mixed_step=bad)
    assert EngineConfig(mixed_step="auto", kv_layout="static").mixed_step == "auto"  # (resolved at build: False)
    with pytest.raises(ValueError, match="mixed_step"):
        EngineConfig(mixed_step=True, kv_layout="static")
    engine = Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, mixed_step=True))
    assert engine.prefill_budget == "auto"  # (its token budget: measured)
    with pytest.raises(ValueError, match="prefill_steps"):
        EngineConfig(mixed_step=False, prefill_steps=2)  # (without the mixed step or a budget: refused)
    with pytest.raises(ValueError, match="prefill_stall"):
        EngineConfig(mixed_step=False, prefill_stall=0.25)
    EngineConfig(mixed_step=True, prefill_steps=2, prefill_stall=0.25)  # (the "auto" budget's own options)
    EngineConfig(prefill_steps=2, prefill_stall=0.25)  # (the default "auto": where it runs, the budget is "auto")


def test_mixed_step_resolves_once_at_build(make_llama):
    """`config.resolve_mixed_step`: True where supported (the paged layout, a target body the ragged forward covers),
    refused where not; "auto" — or False with a prefill_budget — True where supported, else False (whole
    prefills); False alone stays False. On engines: the fast body on the paged pool resolves "auto" True (its budget
    "auto"); the transformers backend and the static layout resolve it False (no budget), and refuse True naming
    the body (the controls)."""
    from specdec.engine.config import resolve_mixed_step

    def resolved(mixed, covered, **options):
        return resolve_mixed_step(EngineConfig(mixed_step=mixed, **options), covered).mixed_step
    assert [resolved(m, True) for m in (True, "auto", False)] == [True, True, False]
    assert [resolved(m, False) for m in ("auto", False)] == [False, False]
    assert resolved(False, True, prefill_budget=32) is True and resolved(False, False, prefill_budget=32) is False
    assert resolved("auto", True, kv_layout="static") is False
    with pytest.raises(ValueError, match="mixed_step=True runs the fast Llama body's ragged forward; this target"):
        resolve_mixed_step(EngineConfig(mixed_step=True), False)
    target = make_llama(0)
    small = dict(max_batch_size=2, max_seq_len=64)
    fast = Engine(target, None, EngineConfig(mixed_step="auto", **small))
    assert fast.config.mixed_step is True and fast.prefill_budget == "auto"
    for options in (dict(model_impl="transformers"), dict(kv_layout="static")):
        engine = Engine(target, None, EngineConfig(mixed_step="auto", **small, **options))
        assert engine.config.mixed_step is False and engine.prefill_budget is None, options
    with pytest.raises(ValueError, match="mixed_step=True .* this target runs on"):
        Engine(target, None, EngineConfig(mixed_step=True, model_impl="transformers", **small))


def test_a_long_prompt_rides_in_the_decode_steps(make_llama):
    """A 200-token prompt admitted mid-flight is fed a budget per step inside the running rows' forwards: the
    running rows produce a token in every one of those steps, no step feeds more than the budget, and the tokens
    are a whole prefill's."""
    target = make_llama(0)
    long = prompt(200, 7)
    params = [SamplingParams(temperature=0, max_new_tokens=40)] * 2 + [SamplingParams(temperature=0, max_new_tokens=6)]
    runs = []
    for mixed in (True, False):
        engine = Engine(target, None, EngineConfig(max_batch_size=3, max_seq_len=250, num_draft_tokens=0,
                                                   admit_min=1, mixed_step=mixed, prefill_budget=32 if mixed else None))
        between, seen = [], {"fed": 0}

        def watch(e, outs, between=between, seen=seen):
            between.append(e.prefill_tokens - seen["fed"])
            seen["fed"] = e.prefill_tokens
            if e.num_prefilling:
                assert all(o.new_token_ids for o in outs if not o.finished)
        runs.append((drive(engine, EARLY, [long], params, join_after=2, watch=watch), between))
    (mixed_tokens, between), (whole_tokens, whole_between) = runs
    assert max(between[1:]) <= 32 and sum(1 for b in between if b) >= (len(long) - 1) // 32
    assert max(whole_between[1:]) > 32  # (without it, the step that admits the prompt prefills all of it)
    assert mixed_tokens == whole_tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "model", "head"])
def test_mixed_step_on_cuda_gives_the_tokens_of_a_whole_prefill(make_llama, kind):
    """On CUDA (every step replayed as graphs, the mixed ones' verify halves through the Triton varlen attention;
    graphs on / off: tests/engine/test_mixed_step_gpu.py), fp32: the tokens of a whole prefill, greedy and seeded
    T = 1."""
    target = make_llama(0).cuda()
    draft = _drafter(kind, make_llama, target)
    draft = draft.cuda() if kind == "model" else draft
    mixed, engine, _ = _run(target, draft, True)
    whole, _, _ = _run(target, draft, False)
    assert engine.runner.mixed_steps and engine.cuda_graphs
    assert mixed == whole


def test_mixed_step_past_a_prefix_cache_hit(make_llama):
    """Requests sharing a 40-token system prompt arrive mid-flight, one after another: the later ones hit the prefix
    cache and their chunks start past the hit (attending over the shared blocks through their tables); the tokens
    stay a whole prefill's."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    system = prompt(40, 9)
    late = [system + prompt(n, 20 + n) for n in (30, 5, 17, 44)]
    params = mixed_params(len(EARLY) + len(late), max_new=24)
    runs = []
    for mixed in (True, False):
        engine = Engine(target, draft, EngineConfig(max_batch_size=3, max_seq_len=160, num_draft_tokens=2,
                                                    admit_min=1, mixed_step=mixed, prefill_budget=16 if mixed else None))
        ids = [engine.add_request(p, q) for p, q in zip(EARLY, params)]
        outputs: dict = {}
        for step in range(2000):
            if 2 <= step < 2 + 6 * len(late) and (step - 2) % 6 == 0:  # one arrival every 6 steps
                i = (step - 2) // 6
                ids.append(engine.add_request(late[i], params[len(EARLY) + i]))
            if step > 2 + 6 * len(late) and not engine.has_unfinished():
                break
            for out in engine.step():
                outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        runs.append(([outputs[i] for i in ids], engine.prefix_cache_hits, engine.runner.num_mixed_steps))
    (mixed_tokens, hits, steps), (whole_tokens, _, _) = runs
    assert hits > 0 and steps > 0, "no prefix hit or no mixed step: the scenario lost its point"
    assert mixed_tokens == whole_tokens


def test_token_tree_requests_prefill_whole(make_llama):
    """A token-tree step (`SamplingParams.draft_tree`) has no mixed form: with the mixed step on, tree requests
    admitted mid-flight prefill whole at admission (none fills, no mixed step runs), and the tokens are a whole
    prefill's. Control: chain requests in the same engine configuration fill across mixed steps."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    trees = [SamplingParams(temperature=0, max_new_tokens=12, draft_tree=(2, 2)) for _ in range(6)]
    chains = [SamplingParams(temperature=0, max_new_tokens=12) for _ in range(6)]
    runs = []
    for mixed, params in ((True, trees), (False, trees), (True, chains)):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=2,
                                                    admit_min=1, mixed_step=mixed, prefill_budget=24 if mixed else None))
        filling = []
        tokens = drive(engine, EARLY, LATE, params, watch=lambda e, _, filling=filling: filling.append(e.num_prefilling))
        runs.append((tokens, engine.runner.num_mixed_steps, max(filling)))
    (mixed_tokens, steps, filled), (whole_tokens, _, _), (_, chain_steps, chain_filled) = runs
    assert filled == 0 and steps == 0  # tree requests: whole prefills
    assert chain_filled > 0 and chain_steps > 0  # the control: chains fill, in mixed steps
    assert mixed_tokens == whole_tokens


def test_mixed_step_with_processors_logprobs_and_an_abort(make_llama):
    """Rows with a repetition penalty, top-k / top-p and log-probabilities beside the chunks, and a filling request
    aborted mid-feed: the others' tokens are a whole prefill's and their log-probabilities equal to fp32 rounding."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    kinds = [dict(repetition_penalty=1.3), dict(top_k=5, top_p=0.9, temperature=0.8), dict(logprobs=True)]
    params = [SamplingParams(seed=50 + i, max_new_tokens=16, **kinds[i % 3]) for i in range(len(EARLY) + len(LATE))]
    runs = []
    for mixed in (True, False):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                    admit_min=1, mixed_step=mixed, prefill_budget=24 if mixed else None))
        ids = [engine.add_request(p, q) for p, q in zip(EARLY, params)]
        tokens, logprobs, aborted = {}, {}, None
        for step in range(500):
            if step == 2:
                ids += [engine.add_request(p, q) for p, q in zip(LATE, params[len(EARLY):])]
            if step == 4:
                aborted = ids[2]  # the 70-token prompt: still filling at a 24-token budget
                filling = mixed and engine.num_prefilling > 0
                engine.abort(aborted)
            if step > 4 and not engine.has_unfinished():
                break
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
                logprobs.setdefault(out.request_id, []).extend(out.logprobs or [])
        kept = [i for i in ids if i != aborted]
        runs.append(([tokens[i] for i in kept], [logprobs[i] for i in kept], engine.runner.num_mixed_steps))
        if mixed:
            assert filling, "the aborted request was not filling: the scenario lost its point"
    (mixed_tokens, mixed_logprobs, steps), (whole_tokens, whole_logprobs, _) = runs
    assert steps > 0 and mixed_tokens == whole_tokens
    assert any(mixed_logprobs)
    for got, want in zip(mixed_logprobs, whole_logprobs):
        assert got == pytest.approx(want, abs=1e-4)


def test_the_auto_budget_learns_from_mixed_steps_alone():
    """Traffic that never stops filling (every step mixed, no decode step measured): the budget comes from the mixed
    steps' seconds against their chunk tokens — their fit's cost at no tokens is the decode step, the rest the
    chunks' — and settles at the tokens whose cost is `stall` × that step (synthetic: 10 ms + 2 µs a token); before
    any mixed step it is the cold budget, and a step's whole time taken as its chunks' cost (the control) lands
    far from it."""
    import random

    from specdec.engine.prefill import ChunkBudget
    from specdec.engine.prefill_budget import COLD

    step, per_token, stall = 0.010, 2e-6, 0.5
    chunked = ChunkBudget(EngineConfig(mixed_step=True, prefill_stall=stall))
    control = ChunkBudget(EngineConfig(mixed_step=True, prefill_stall=stall))
    assert chunked.step_prefill_budget == COLD
    rng = random.Random(0)
    for _ in range(200):
        for prefill, share_of in ((chunked, chunked.mixed_share), (control, None)):
            tokens = rng.randint(max(prefill.step_prefill_budget // 4, 1), prefill.step_prefill_budget)
            seconds = step + per_token * tokens
            share = share_of(tokens, seconds) if share_of else seconds
            prefill.measure_prefill(tokens, share)
    want = stall * step / per_token
    assert chunked.step_prefill_budget == pytest.approx(want, rel=0.05) == chunked.report()["budget"]
    assert chunked.report()["decode_step_ms"] == pytest.approx(1e3 * step, rel=0.05)
    assert abs(control.step_prefill_budget - want) > 0.5 * want


def test_mixed_step_with_an_eagle3_head(make_llama, tmp_path):
    """An EAGLE-3 head (features: the residual stream entering three of the target's layers, `feature_layers`): the
    chunks' features come from the same forward's captured layers, and the tokens are a whole prefill's."""
    from drafters import format_checkpoints
    from specdec.drafters.formats import load_drafter
    from specdec.fast.model import FastLlama

    target = make_llama(0, layers=8)  # (EAGLE-3's layers 2, L // 2, L − 3: distinct from 7 layers up)
    folder = format_checkpoints.write_eagle3(tmp_path / "eagle3", target, list(range(64)))
    runs = []
    for mixed in (True, False):
        head = load_drafter(str(folder), FastLlama.from_hf(target))
        assert head.feature_layers is not None
        tokens, engine, _ = _run(target, head, mixed)
        runs.append((tokens, engine.runner.num_mixed_steps))
    (mixed_tokens, steps), (whole_tokens, _) = runs
    assert steps > 0 and mixed_tokens == whole_tokens


def test_a_feature_head_without_the_chunks_features_drafts_otherwise(make_llama, monkeypatch):
    """Negative control of the features' feed: with the chunks' features not stored (the head's feed then reads
    what the pool held), the drafts change — the accepted counts and the sampled rows' tokens differ from a whole
    prefill's — while with them stored both are equal."""
    target = make_llama(0)

    def run(mixed):
        engine = Engine(target, head(target), EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                           admit_min=1, mixed_step=mixed,
                                                           prefill_budget=24 if mixed else None))
        accepted: dict = {}

        def watch(e, outs):
            for out in outs:
                accepted[out.request_id] = accepted.get(out.request_id, 0) + out.num_accepted
        tokens = drive(engine, EARLY, LATE, mixed_params(len(EARLY) + len(LATE)), watch=watch)
        return tokens, sorted(accepted.items())
    whole = run(False)
    assert run(True) == whole
    monkeypatch.setattr(mixed_module.MixedStepRunner, "store_features", staticmethod(lambda *args: None))
    assert run(True) != whole


def test_auto_feeds_past_prefill_chunk_when_its_deadline_asks(make_llama, monkeypatch):
    """"auto" with a deadline of one step (`prefill_steps=1`): a 200-token prompt admitted mid-flight is fed in one
    mixed step past `prefill_chunk` (64: the graphed buckets' cap; the bucket it runs at is eager), the running rows
    keep producing tokens, and the tokens are a whole prefill's; with the cap at prefill_chunk's bucket (the control:
    the cap before) no step feeds more than 64 and the prompt takes several steps."""
    from specdec.engine import mixed_shapes

    target = make_llama(0)
    long = prompt(200, 8)
    params = [SamplingParams(temperature=0, max_new_tokens=30)] * 2 + [SamplingParams(temperature=0, max_new_tokens=6)]

    def run(mixed):
        engine = Engine(target, None, EngineConfig(max_batch_size=3, max_seq_len=250, num_draft_tokens=0, admit_min=1,
                                                   mixed_step=mixed, prefill_chunk=64,
                                                   prefill_steps=1 if mixed else None))
        between, seen = [], {"fed": 0}

        def watch(e, outs):
            between.append(e.prefill_tokens - seen["fed"])
            seen["fed"] = e.prefill_tokens
            if e.num_prefilling:
                assert all(o.new_token_ids for o in outs if not o.finished)
        return drive(engine, EARLY, [long], params, join_after=2, watch=watch), between, engine

    whole, _, _ = run(False)
    tokens, between, engine = run(True)
    assert tokens == whole and max(between[1:]) > 64
    assert any(key[3] > 64 and shape.ran and not shape.graphs for key, shape in engine.runner.mixed_steps.items())
    monkeypatch.setattr(mixed_shapes, "token_cap", mixed_shapes.graph_cap)
    capped, capped_between, _ = run(True)
    assert capped == whole and max(capped_between[1:]) <= 64 and sum(1 for b in capped_between if b) >= 4
