"""Admission prefill (`slots.prefill_rows`) attending over a positions bucket gives exactly what attending over the
whole cache gives: cache contents, features and the next forward's logits, for several rows of different lengths,
prompts longer than a chunk, and the feature drafter; `extent` keeps what rows that feed nothing hold; the batched
slot-state writes of an admission (`SlotState.admit_rows`) are the per-request ones; `PrefillGraphs`' logic (a
stand-in for capture on CPU; bit-exactness and the engine's tokens on CUDA, GPU-marked)."""

import pytest
import torch

import specdec.engine.slots as slots_module
from helpers import RAGGED_PROMPTS
from specdec.engine import Engine, EngineConfig
from specdec.engine.feature_drafter import EngineFeatureDrafter
from specdec.engine.slots import PrefillGraphs, SlotCache, SlotState, positions_bucket, prefill_rows
from specdec.fast.head import FeatureHead, HeadConfig
from specdec.fast.model import FastLlama, LlamaShape
from specdec.request import SamplingParams

SHAPE = LlamaShape(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=64,
                   max_positions=512)
MAX_BATCH, POSITIONS, CHUNK = 5, 300, 32
ROWS = slice(1, 4)
ENDS = [5, 70, 37]  # row 2 runs three chunks of 32 (and a bucket of 64 past its end); row 1 fits in one


@pytest.fixture(scope="module")
def model():
    return FastLlama.random(SHAPE, device="cpu", dtype=torch.float32, std=0.2, seed=3)


def _state(seed: int = 0, features: bool = False) -> SlotState:
    gen = torch.Generator().manual_seed(seed)
    state = SlotState(MAX_BATCH, POSITIONS + 16, torch.device("cpu"))
    state.tokens.copy_(torch.randint(0, SHAPE.vocab_size, state.tokens.shape, generator=gen))
    if features:
        state.enable_features(SHAPE.dim, torch.float32)
        state.features.copy_(torch.randn(state.features.shape, generator=gen))
    return state


def _filled_cache(model, seed: int = 1) -> SlotCache:
    """A cache whose every entry holds something (a previous occupant's leftovers, or a running row's text)."""
    gen = torch.Generator().manual_seed(seed)
    cache = SlotCache(model, MAX_BATCH, POSITIONS)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    return cache


def _next_logits(model, cache: SlotCache, state: SlotState, ends: list[int]) -> torch.Tensor:
    """One forward of the token after each row's fed text (at position ends[i]), over the positions bucket."""
    view = cache.view(ROWS, positions_bucket(max(ends) + 1, cache.num_positions))
    view.lengths.copy_(torch.tensor(ends))
    tokens = state.tokens[ROWS].gather(1, torch.tensor(ends)[:, None])
    return model(tokens, view, kernels="reference")


def _assert_same_prefix(a: SlotCache, b: SlotCache, ends: list[int]) -> None:
    for i, end in enumerate(ends):
        slot = ROWS.start + i
        assert torch.equal(a.keys[:, slot, :, :end], b.keys[:, slot, :, :end]), slot
        assert torch.equal(a.values[:, slot, :, :end], b.values[:, slot, :, :end]), slot
    assert torch.equal(a.lengths[ROWS], b.lengths[ROWS])


def test_positions_bucket():
    assert [positions_bucket(e, 4096) for e in (0, 5, 63, 64, 100, 1000)] == [64, 64, 64, 128, 128, 1024]
    assert positions_bucket(2000, 1040) == 1040  # never past the cache


@torch.inference_mode()
def test_bounded_span_is_exactly_the_whole_cache_span(model):
    state = _state(features=True)
    results = []
    for extent in (None, 0):  # None: every chunk attends over the whole cache (the old behaviour)
        cache = _filled_cache(model)
        features = state.features.clone()
        prefill_rows(model, cache, state, ROWS, [0, 0, 0], ENDS, CHUNK, features=features, extent=extent)
        assert cache.lengths[ROWS].tolist() == ENDS
        results.append((cache, features, _next_logits(model, cache, state, ENDS)))
    (full, full_features, full_logits), (bounded, bounded_features, bounded_logits) = results
    _assert_same_prefix(full, bounded, ENDS)
    assert torch.equal(full_features, bounded_features)
    assert torch.equal(full_logits, bounded_logits)
    # the fed entries are the model's, not leftovers: a fresh one-row pass over row 2's text agrees
    ref = model.new_cache(1, 80)
    model(state.tokens[2:3, : ENDS[1]], ref, kernels="reference")
    torch.testing.assert_close(bounded.keys[:, 2, :, : ENDS[1]], torch.stack(ref.keys)[:, 0, :, : ENDS[1]])


@torch.inference_mode()
def test_resumed_rows_and_extent_keep_what_rows_hold(model):
    """Rows resuming at different starts (the drafter's catch-up), one feeding nothing while it holds 90 entries."""
    state = _state(seed=4)
    starts, ends = [40, 0, 3], [75, 0, 20]
    held = 90  # the middle row (slot 2) holds entries below this
    full, bounded = _filled_cache(model), _filled_cache(model)
    prefill_rows(model, full, state, ROWS, starts, ends, CHUNK)
    prefill_rows(model, bounded, state, ROWS, starts, ends, CHUNK, extent=held)
    _assert_same_prefix(full, bounded, [75, held, 20])
    untouched = _filled_cache(model)
    assert torch.equal(bounded.keys[:, 2, :, :held], untouched.keys[:, 2, :, :held])
    # negative control: claiming the rows hold nothing lets the padding of a chunk land in the middle row's text
    clobbered = _filled_cache(model)
    prefill_rows(model, clobbered, state, ROWS, starts, ends, CHUNK, extent=0)
    assert not torch.equal(clobbered.keys[:, 2, :, :held], untouched.keys[:, 2, :, :held])


@torch.inference_mode()
def test_feature_drafter_prefill_bounded_is_exact(model):
    head = FeatureHead(HeadConfig.for_target(SHAPE), layer=FastLlama.random(HeadConfig.for_target(SHAPE).layer_shape(),
                                                                           device="cpu", dtype=torch.float32,
                                                                           std=0.2, seed=5))
    head.fc.copy_(torch.randn(head.fc.shape, generator=torch.Generator().manual_seed(6)) * 0.2)
    head.bind(model)
    state = _state(seed=7, features=True)
    caches = []
    for extent in (None, 0):
        drafter = EngineFeatureDrafter(head, state, MAX_BATCH, POSITIONS, max_draft_tokens=4)
        drafter.cache = _filled_cache(head.layer)
        drafter.prefill(state, ROWS, [0, 0, 0], ENDS, CHUNK, extent=extent)
        caches.append(drafter.cache)
    _assert_same_prefix(*caches, ENDS)


def test_admit_rows_writes_each_requests_slot():
    state = SlotState(4, 32, torch.device("cpu"), counter_width=3)
    state.tokens.fill_(9)
    state.counters.fill_(2.0)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    params = [SamplingParams(temperature=0, max_new_tokens=5),
              SamplingParams(temperature=0.7, top_k=3, top_p=0.9, max_new_tokens=2, eos_token_ids=[4, 11]),
              SamplingParams(temperature=1.0, max_new_tokens=7, eos_token_ids=[2])]
    state.admit_rows(1, prompts, params, [10, 11, 2**62])
    for slot, (prompt, p, seed) in enumerate(zip(prompts, params, [10, 11, 2**62]), start=1):
        assert state.tokens[slot].tolist() == prompt + [0] * (32 - len(prompt))
        assert state.lengths[slot] == len(prompt) and state.max_new[slot] == p.max_new_tokens
        assert state.generated[slot] == 0 and bool(state.active[slot]) and state.seed[slot] == seed
        assert state.temperature[slot].item() == pytest.approx(p.temperature)
        assert state.top_k[slot] == p.top_k and state.top_p[slot].item() == pytest.approx(p.top_p)
        assert state.eos[slot].tolist() == list(p.eos_token_ids) + [-1] * (16 - len(p.eos_token_ids))
        assert state.counters[slot].tolist() == [0.0] * 3
    assert state.tokens[0].tolist() == [9] * 32 and not bool(state.active[0])  # other slots untouched


class _EagerCapture:
    """Stands in for `CapturedStep` on CPU: runs the body as capture's warm-ups do (twice, then restores), and
    `replay` runs it again, on whatever its static inputs hold by then."""

    captured = 0

    def __init__(self, fn, *, pool=None, restore=()):
        saved = [t.clone() for t in restore]
        fn()
        fn()
        for t, s in zip(restore, saved):
            t.copy_(s)
        self.fn, self.outputs = fn, None
        _EagerCapture.captured += 1

    def replay(self):
        self.fn()


@torch.inference_mode()
def test_prefill_graphs_replay_a_shape_on_new_bounds_and_tokens(model, monkeypatch):
    """The graph logic on CPU: a shape seen once runs eagerly, then is captured with its own static bounds; replays
    on other rows' text of other lengths (same chunk shapes) give what an eager prefill gives."""
    monkeypatch.setattr(slots_module, "CapturedStep", _EagerCapture)
    monkeypatch.setattr(slots_module, "new_pool", lambda: None)
    graphs = PrefillGraphs()
    cache, state = _filled_cache(model), _state(features=True)  # static tensors, as the engine's
    features = state.features.clone()
    for seed, ends in enumerate([[5, 70, 37], [9, 66, 40], [20, 65, 33]]):  # the same chunks and spans
        state.tokens.copy_(_state(seed=10 + seed).tokens)  # new text in place
        eager, eager_features = _filled_cache(model, seed=9), features.clone()
        prefill_rows(model, cache, state, ROWS, [0, 0, 0], ends, CHUNK, features=features, extent=0, graphs=graphs)
        prefill_rows(model, eager, state, ROWS, [0, 0, 0], ends, CHUNK, features=eager_features, extent=0)
        _assert_same_prefix(cache, eager, ends)
        assert torch.equal(features, eager_features)
    assert len(graphs.graphs) == 3 and _EagerCapture.captured == 3  # three chunk shapes, each captured once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.inference_mode()
def test_bounded_span_and_graphs_are_exact_on_cuda():
    """bf16 on CUDA: the whole-cache span, the bounded span and replayed graphs leave bit-identical entries."""
    model = FastLlama.random(SHAPE, device="cuda", dtype=torch.bfloat16, std=0.2, seed=3)
    state = SlotState(MAX_BATCH, POSITIONS + 16, torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    state.tokens.copy_(torch.randint(0, SHAPE.vocab_size, state.tokens.shape, generator=gen))
    cache, graphs = SlotCache(model, MAX_BATCH, POSITIONS), PrefillGraphs()
    results = []
    # whole span; bounded span; bounded span with graphs: seen once (eager), captured, replayed
    for extent, use in ((None, None), (0, None), (0, graphs), (0, graphs), (0, graphs)):
        cache.keys.zero_()
        cache.values.zero_()
        prefill_rows(model, cache, state, ROWS, [0, 0, 0], ENDS, CHUNK, extent=extent, graphs=use)
        torch.cuda.synchronize()
        results.append((cache.keys.clone(), cache.values.clone()))
    assert len(graphs.graphs) == 3
    for keys, values in results[1:]:
        for i, end in enumerate(ENDS):
            slot = ROWS.start + i
            assert torch.equal(results[0][0][:, slot, :, :end], keys[:, slot, :, :end])
            assert torch.equal(results[0][1][:, slot, :, :end], values[:, slot, :, :end])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_with_prefill_graphs_gives_the_same_tokens(make_llama):
    target, draft = make_llama(0).cuda(), make_llama(1, layers=1).cuda()
    params = SamplingParams(temperature=0, max_new_tokens=12)
    outputs = []
    for graphs in (None, PrefillGraphs()):
        engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                    prefill_graphs=graphs is not None))
        graphs = engine.prefill_graphs
        for _ in range(3):  # graphs: seen, captured, replayed (a request admitted alone into slot 0)
            for p in RAGGED_PROMPTS:
                engine.add_request(p, params)
                tokens = []
                while engine.has_unfinished():
                    for out in engine.step():
                        tokens.extend(out.new_token_ids)
                outputs.append(tokens)
            ids = [engine.add_request(p, params) for p in RAGGED_PROMPTS]  # admitted together: eager
            tokens = {i: [] for i in ids}
            while engine.has_unfinished():
                for out in engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
            outputs.append([tokens[i] for i in ids])
        assert graphs is None or graphs.graphs
    half = len(outputs) // 2
    assert outputs[:half] == outputs[half:]


def test_prefill_graphs_option_is_checked(make_llama):
    with pytest.raises(TypeError, match="prefill_graphs"):
        EngineConfig(prefill_graphs="yes")
    with pytest.raises(ValueError, match="prefill_graphs=True needs cuda_graphs"):
        Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_graphs=True))
    assert Engine(make_llama(0), None, EngineConfig(max_batch_size=2, max_seq_len=64, prefill_graphs=None)).prefill_graphs is None


class _CountingGraphs(PrefillGraphs):
    """PrefillGraphs that records its keys and runs eagerly (CPU): what warm-up would capture."""

    def run(self, key, body, bounds, lengths):
        self.seen[key] = self.seen.get(key, 0) + 1
        body(bounds)


def _head_of(target):
    from specdec.zoo.feature_head import TrainableHead

    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)
    return head.to_feature_head()


def _lone_admissions(engine, hits_warmed: bool = True) -> tuple[dict, dict, int]:
    """Warm-up (hits_warmed=False: as if no prefix cache — the negative control), then prompts admitted alone that
    share their first tokens, so later ones start past a prefix hit → (warmed keys, keys met, runs)."""
    engine.prefill_graphs = graphs = _CountingGraphs()
    cache = engine.runner.prefix_cache
    if not hits_warmed:
        engine.runner.prefix_cache = None
    with torch.inference_mode():
        runs = engine._warm_prefill(96)
    engine.runner.prefix_cache = cache
    warmed = dict(graphs.seen)
    for n in (2, 3, 17, 33, 64, 65, 90):
        engine.add_request([1 + i % 60 for i in range(n)], SamplingParams(temperature=0, max_new_tokens=2))
        while engine.has_unfinished():
            engine.step()
    return warmed, dict(graphs.seen), runs


@pytest.mark.parametrize("drafter", ["model", "head"])
@pytest.mark.parametrize("caching", [False, True])
def test_warmup_covers_every_prompt_length_of_a_lone_admission(make_llama, drafter, caching):
    """After warm-up, a request admitted alone meets only chunk shapes warm-up ran `after + 1` times — with prefix
    caching too, whose hits start a prefill past a block boundary (these prompts share their first tokens: later
    ones hit), for a model drafter and a feature head (which re-feeds a window before the hit)."""
    target = make_llama(0)
    draft = make_llama(1, layers=1) if drafter == "model" else _head_of(target)
    config = EngineConfig(max_batch_size=2, max_seq_len=96, num_draft_tokens=2, prefill_chunk=32,
                          kv_layout="paged", enable_prefix_caching=caching)
    engine = Engine(target, draft, config)
    warmed, met, runs = _lone_admissions(engine)
    assert 0 < runs and all(count >= engine.prefill_graphs.after + 1 for count in warmed.values())
    assert engine.prefix_cache_hits > 0 if caching else engine.prefix_cache is None
    assert set(met) == set(warmed)  # no new chunk shape
    if caching:  # negative control: warm-up without the starts past a hit misses the shapes those prefills meet
        warmed, met, _ = _lone_admissions(Engine(target, draft, config), hits_warmed=False)
        assert set(met) - set(warmed)
