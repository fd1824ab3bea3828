"""The engine (CPU, no graphs): exact greedy output for every covered family, requests joining mid-flight,
seeds that repeat, batch independence, abort, logprobs, and errors that name the argument; the tests of slots
moving and joining run over both KV layouts (static slots and the paged pool)."""

import pytest
import torch
import transformers

import specdec
from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.engine import Engine, EngineConfig, UnsupportedModel
from specdec.request import SamplingParams

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)


def _perturbed(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.lm_head.weight.mul_(8.0)  # peaked logits, so drafts get accepted
    return model.eval()


LAYOUTS = ["static", "paged"]  # the KV cache's: per-slot static, or the paged pool (engine/kv_pool.py)

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)),
    "llama3-rope": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=None)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON, head_dim=16)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    torch.manual_seed(0)
    target = _perturbed(FAMILIES[request.param](), 1)
    torch.manual_seed(1)
    draft = _perturbed(FAMILIES[request.param](), 2)
    return target, draft


def test_successive_calls_give_transformers_greedy(family):
    """Changing prompt lengths, batch sizes and γ on one kept engine: always the target's greedy text."""
    target, draft = family
    calls = [(RAGGED_PROMPTS, 12, 3), ([[9] * 40 + [3, 4]], 30, 4), (RAGGED_PROMPTS[1:3], 7, 1),
             ([[1, 2, 3]] * 5, 20, 0), ([list(range(5, 60))], 25, 8)]
    for prompts, new, gamma in calls:
        res = specdec.generate(target, prompts, drafter=draft if gamma else None, max_new_tokens=new, temperature=0,
                               num_draft_tokens=max(gamma, 1), eos_token_id=[], engine="fast")
        for prompt, out in zip(prompts, res.sequences):
            assert out == hf_greedy(target, prompt, new, [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_join_mid_flight(make_llama, layout):
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, num_draft_tokens=3, kv_layout=layout))
    prompts = RAGGED_PROMPTS + [[4, 4, 9], [11, 12, 13, 14, 15, 16, 17, 18]]
    outputs, ids = {}, {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        if pending:  # one new request per step, while others run
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=9 + i))] = i
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
            assert out.finish_reason in (None, "length")
    for i, prompt in enumerate(prompts):
        assert outputs[i] == hf_greedy(target, prompt, 9 + i, [])


def _sampled(engine, prompt, params, others=()):
    rid = engine.add_request(prompt, params)
    for other in others:
        engine.add_request(other, SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=15, seed=5))
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
    return tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seeded_request_is_independent_of_its_batch(make_llama, layout):
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3, kv_layout=layout))
    params = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=16, seed=11)
    alone = _sampled(engine, [5, 6, 7], params)
    crowded = _sampled(engine, [5, 6, 7], params, others=[[1, 2], [9, 9, 9, 9], [3] * 12])
    again = _sampled(engine, [5, 6, 7], params)
    other_seed = _sampled(engine, [5, 6, 7], SamplingParams(temperature=1.0, top_k=20, max_new_tokens=16, seed=12))
    assert alone == crowded == again and len(alone) == 16
    assert other_seed != alone


def test_generate_with_seed_repeats_across_calls(make_llama):
    target, draft = make_llama(0), make_llama(1, layers=1)
    runs = [specdec.generate(target, RAGGED_PROMPTS, drafter=draft, max_new_tokens=12, temperature=0.9, seed=3,
                             eos_token_id=[], engine="fast").sequences for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_greedy_and_sampled_rows_share_a_batch(make_llama, layout):
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=4, kv_layout=layout))
    greedy = engine.add_request(RAGGED_PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=20))
    for i, prompt in enumerate(RAGGED_PROMPTS[1:]):
        engine.add_request(prompt, SamplingParams(temperature=1.2, top_p=0.7, top_k=9, max_new_tokens=20, seed=i))
    tokens = []
    while engine.has_unfinished():
        tokens += [t for out in engine.step() if out.request_id == greedy for t in out.new_token_ids]
    assert tokens == hf_greedy(target, RAGGED_PROMPTS[0], 20, [])


def test_eos_stop_and_logprobs(make_llama):
    target = make_llama(0)
    reference = hf_greedy(target, [5, 6, 7], 20, [])
    eos = reference[6]
    engine = Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=64))
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=20, eos_token_ids=(eos,), logprobs=True))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    tokens = [t for o in outs for t in o.new_token_ids]
    assert tokens == reference[: reference.index(eos) + 1]
    assert outs[-1].finish_reason == "stop" and outs[-1].stats.num_generated_tokens == len(tokens)
    logprobs = [lp for o in outs for lp in o.logprobs]
    with torch.no_grad():
        expected = target(torch.tensor([[5, 6, 7] + tokens])).logits[0, 2:-1].log_softmax(-1)
    assert logprobs == pytest.approx(expected.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist(), abs=1e-4)


def test_abort_frees_the_slot(make_llama):
    target = make_llama(0)
    engine = Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=64))
    first = engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=50))
    second = engine.add_request([4, 5], SamplingParams(temperature=0, max_new_tokens=3))
    engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1
    engine.abort(first)
    outs = engine.step()
    assert any(o.request_id == first and o.finish_reason == "abort" for o in outs)
    assert any(o.request_id == second for o in outs)  # admitted into the freed slot at once
    while engine.has_unfinished():
        engine.step()
    assert engine.num_running == 0


def test_errors_name_the_argument(make_llama, opt):
    target = make_llama(0)
    engine = Engine(target, None, EngineConfig(max_batch_size=1, max_seq_len=32))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.add_request([1] * 10, SamplingParams(max_new_tokens=30))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request([1, 99], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(TypeError, match="seed"):
        SamplingParams(seed=1.5)
    with pytest.raises(UnsupportedModel, match="model_type"):
        Engine(opt, config=EngineConfig(model_impl="fast"))
    with pytest.raises(ValueError, match="engine"):
        specdec.generate(target, [[1]], engine="turbo")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdec.generate(target, [[1]], drafter=make_llama(1, layers=1), num_draft_tokens="bogus", engine="fast")


def test_sliding_window_texts_longer_than_the_window_are_exact():
    """The window is computed, not refused: texts far past it give transformers' greedy text (more families with
    windows, and rollbacks under them, in tests/fast/test_families.py)."""
    model = transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=8)).eval()
    engine = Engine(model, None, EngineConfig(max_batch_size=1, max_seq_len=64))
    rid = engine.add_request([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], SamplingParams(max_new_tokens=20, temperature=0))
    tokens = []
    while engine.has_unfinished():
        tokens += [t for out in engine.step() if out.request_id == rid for t in out.new_token_ids]
    assert tokens == hf_greedy(model, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], 20, [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_plain_steps_between_speculative_ones_keep_the_drafter_in_step(make_llama, layout):
    """The auto policy switches speculation off and on; the drafter's cache must catch up exactly."""
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens="auto", kv_layout=layout))
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=30)): p for p in RAGGED_PROMPTS}
    pattern = [3, 0, 0, 0, 0, 0, 2, 0, 4, 0, 0, 0, 1]
    outputs = {rid: [] for rid in ids}
    step, caught_up, timed = 0, [], []
    catch_up, record_step = engine._catch_up_drafter, engine.policy.record_step
    engine._catch_up_drafter = lambda gamma: caught_up.append(catch_up(gamma)) or caught_up[-1]
    def record(*args, **kwargs):  # a step that fed the drafter's backlog reports catch_up_of > 0: no step time
        if not kwargs.get("catch_up_of"):
            timed.append(step)
        record_step(*args, **kwargs)

    engine.policy.record_step = record
    while engine.has_unfinished():
        engine.policy.set_fixed(pattern[step % len(pattern)])
        for out in engine.step():
            outputs[out.request_id] += out.new_token_ids
        step += 1
    for rid, prompt in ids.items():
        assert outputs[rid] == hf_greedy(target, prompt, 30, [])
    assert engine.stats.accepted_tokens > 0  # the speculative steps after catch-ups drafted real tokens
    fed = {i for i, c in enumerate(caught_up) if c}
    assert fed and not fed & set(timed) and timed  # a step that fed the drafter's backlog is no step time


@pytest.mark.parametrize("layout", LAYOUTS)
def test_request_stats_add_up_to_the_engines(make_llama, layout):
    """Counters summed on the device per slot: each request's SpecStats agrees with its own outputs, and the
    requests together give the engine's totals, across steps of different γ and slots that move."""
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=3, max_seq_len=128, num_draft_tokens="auto", kv_layout=layout))
    for i, prompt in enumerate(RAGGED_PROMPTS + [[4, 4, 9]]):
        engine.add_request(prompt, SamplingParams(temperature=0.9 if i % 2 else 0, max_new_tokens=6 + 4 * i, seed=i))
    pattern, step = [3, 0, 2, 0, 0, 4], 0
    outs: dict[str, list] = {}
    while engine.has_unfinished():
        engine.policy.set_fixed(pattern[step % len(pattern)])
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
        step += 1
    total = engine.stats
    finals = [o[-1].stats for o in outs.values()]
    for rid, seq in outs.items():
        stats = seq[-1].stats
        assert seq[-1].finished and all(not o.finished for o in seq[:-1])
        assert stats.num_steps == len(seq) and stats.drafted_tokens == sum(o.num_drafted for o in seq)
        assert stats.num_generated_tokens == sum(len(o.new_token_ids) for o in seq)
        assert stats.max_num_draft_tokens == max(o.num_drafted for o in seq)
        assert len(stats.reached_by_position) == stats.max_num_draft_tokens
        assert stats.row_steps == len(seq) and stats.accepted_tokens >= sum(o.num_accepted for o in seq)
    for name in ("row_steps", "speculative_row_steps", "drafted_tokens", "accepted_tokens", "beta_count",
                 "algorithm_tokens", "num_generated_tokens"):
        assert getattr(total, name) == sum(getattr(s, name) for s in finals), name
    assert total.beta_sum == pytest.approx(sum(s.beta_sum for s in finals))
    assert total.reached_by_position == [sum(v) for v in zip(*[s.reached_by_position + [0] * 4 for s in finals])][:4]
    assert total.accepted_tokens > 0 and total.max_num_draft_tokens == 4


def test_positions_buckets_are_powers_of_two_and_the_whole_cache_at_the_top():
    from specdec.engine.config import length_buckets, positions_bucket

    assert [positions_bucket(n, 1034) for n in (1, 64, 65, 300, 512, 513, 1024, 1034)] == [
        64, 64, 128, 512, 512, 1034, 1034, 1034]
    assert length_buckets(1034) == [64, 128, 256, 512, 1034] and length_buckets(1034, 200) == [64, 128, 256]
    assert length_buckets(1500) == [64, 128, 256, 512, 1024, 1500] and length_buckets(40) == [40]
    for cache in (40, 266, 1034, 1500, 4106):  # every need maps to a listed bucket that holds it
        buckets = length_buckets(cache)
        assert all(need <= positions_bucket(need, cache) in buckets for need in range(1, cache + 1))


def test_admission_waits_for_admit_min_free_slots_or_admit_max_wait_steps(make_llama):
    """While requests run, waiting ones are admitted in groups (one launch-bound prefill for several), after at
    most `admit_max_wait` steps; with nothing running at once; the text is the same greedy text."""
    target, draft = make_llama(0), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=2,
                                                admit_min=2, admit_max_wait=3))
    budgets = [3, 40, 40, 40, 5, 40, 7, 9, 30, 4]  # short requests free slots one at a time
    prompts = [[(7 * i + j) % 50 + 3 for j in range(4 + i)] for i in range(len(budgets))]
    ids = {engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=n)): i
           for i, (p, n) in enumerate(zip(prompts, budgets))}
    outputs, deferred, grouped, events = {}, 0, 0, 0
    while engine.has_unfinished():
        waiting, running = engine.num_waiting, engine.num_running
        free = engine.max_batch - running
        waited = 0 if engine._free_since is None else engine._num_steps - engine._free_since
        for out in engine.step():
            outputs.setdefault(ids[out.request_id], []).extend(out.new_token_ids)
        admitted = waiting - engine.num_waiting
        events += admitted > 0
        if running and admitted:
            assert free >= 2 or waited >= 3, (free, waited)
            grouped += admitted > 1
        deferred += bool(running and waiting and free and not admitted)
    assert deferred >= 1 and grouped >= 1  # (the rule ran both ways)
    assert engine.num_admissions == events  # one per step that admitted (the driver's "admitted" steps)
    for i, (prompt, n) in enumerate(zip(prompts, budgets)):
        assert outputs[i] == hf_greedy(target, prompt, n, [])
    with pytest.raises(ValueError, match="admit_min"):
        EngineConfig(max_batch_size=4, admit_min=5)
    with pytest.raises(ValueError, match="admit_max_wait"):
        EngineConfig(admit_max_wait=-1)
    whole = EngineConfig(max_batch_size=64, max_seq_len=64, mixed_step=False)
    assert Engine(target, None, whole).admit_min == 4  # (whole prefills: a group is one launch for several)
    assert Engine(target, None, EngineConfig(max_batch_size=64, max_seq_len=64)).admit_min == 1  # (the mixed step)
