"""The mixed step's bounded shapes (`engine/mixed_shapes.py`): the device-built batch's live rows are
`RaggedBatch.from_rows`' and its padding lives in the null block; padding that writes a real block changes the
tokens (negative control); the token buckets and the plan's cap; the warm-up builds every shape a traffic run
reaches (counted by key), while without it the run builds new ones (control)."""

import pytest
import torch

from prefill_helpers import drive, mixed_params, prompt
from specdec.engine import Engine, EngineConfig
from specdec.engine import mixed_step as mixed_module
from specdec.engine.mixed_shapes import AUTO_CAP, MixedLayout, graph_buckets, graph_cap, host_meta, mixed_keys, \
    token_bucket, token_buckets, token_cap, token_floor
from specdec.engine.step_input import PrefillChunks
from specdec.fast.ragged import RaggedBatch, RaggedRow
from specdec.request import SamplingParams

EARLY = [prompt(5, 1), prompt(9, 2)]
LATE = [prompt(70, 3), prompt(4, 4), prompt(41, 5), prompt(12, 6)]


def _engine(target, draft, budget=24, **config):
    options = dict(max_batch_size=4, max_seq_len=128, num_draft_tokens=3 if draft is not None else 0, admit_min=1,
                   mixed_step=True, prefill_budget=budget)
    options.update(config)
    return Engine(target, draft, EngineConfig(**options))


def test_the_bounded_batch_is_from_rows_batch_plus_padding_in_the_null_block():
    """Two running rows in a bucket of 4 (rows 2, 3 dead), one 17-token chunk in a 24-token bucket (7 pad tokens):
    the live rows' tokens, positions, slot mapping and block tables are `from_rows`' of those rows; every dead or
    pad token writes the null block 0; the logits are the verify rows' only."""
    table = torch.zeros(6, 8, dtype=torch.int32)
    table[0, :3] = torch.tensor([3, 4, 5])
    table[1, :2] = torch.tensor([7, 8])
    table[2, :1] = torch.tensor([13])  # (a dead verify row's slot holds a block: the batch must not write it)
    table[4, :4] = torch.tensor([9, 10, 11, 12])
    tokens = torch.arange(6 * 64).view(6, 64) % 50
    verify = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]])
    lengths = torch.tensor([30, 9, 5, 1])
    layout = MixedLayout(4, 3, 24, 6, 2, 64, 16, True)
    chunks = PrefillChunks((4,), (20,), (37,), (30, 9))
    meta, counts, starts = host_meta(layout, chunks, 2)
    batch = mixed_module.mixed_batch(torch.tensor(meta), verify, lengths, table, 16, tokens, layout,
                                     torch.zeros(0, 2, dtype=torch.int32), row_counts=counts, row_starts=starts,
                                     num_blocks=16)
    rows = [RaggedRow([1, 2, 3], 29, [3, 4, 5], 3), RaggedRow([4, 5, 6], 8, [7, 8], 3),
            RaggedRow(tokens[4, 20:37].tolist(), 20, [9, 10, 11, 12], 0)]
    want = RaggedBatch.from_rows(rows, block_size=16, table_width=8)
    live = torch.cat([torch.arange(6), torch.arange(12, 29)])  # (rows 0, 1, then the chunk past the dead rows)
    for name in ("tokens", "positions", "slot_mapping"):
        assert torch.equal(getattr(batch, name)[live], getattr(want, name)), name
    assert torch.equal(batch.block_table[[0, 1, 4]], want.block_table)
    dead = torch.ones(layout.num_tokens, dtype=torch.bool)
    dead[live] = False
    assert dead.sum() == 6 + 7 and (batch.slot_mapping[dead] < 16).all()  # the null block, and only it
    assert not batch.block_table[[2, 3] + list(range(5, layout.num_rows))].any()
    assert torch.equal(batch.logits_index, torch.arange(12)) and batch.num_tokens == 4 * 3 + 24
    assert batch.query_start.tolist() == [0, 3, 6, 9, 12, 29, 29, 29, 29, 29, 29, 36]
    assert counts == (3, 3, 3, 3, 17, 0, 0, 0, 0, 0, 7) and starts[:5] == (29, 8, 0, 0, 20)


def _logprobs_run(engine, params):
    """Each request's (tokens, log-probabilities), arrivals mid-flight (`drive`'s schedule)."""
    ids = [engine.add_request(p, q) for p, q in zip(EARLY, params)]
    tokens, logprobs = {}, {}
    for step in range(500):
        if step == 3:
            ids += [engine.add_request(p, q) for p, q in zip(LATE, params[len(EARLY):])]
        if step > 3 and not engine.has_unfinished():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            logprobs.setdefault(out.request_id, []).extend(out.logprobs or [])
    return [tokens[i] for i in ids], [logprobs[i] for i in ids]


def test_padding_that_writes_a_real_block_changes_the_outputs(make_llama, monkeypatch):
    """The padding (dead verify rows, the pad row) reads and writes the null block only: tokens and log-probabilities
    are a whole prefill's (to fp32 rounding), and steps did pad. With the dead rows' and the pad row's tables slot
    1's (they overwrite a running request's first block) the log-probabilities move (the control)."""
    target = make_llama(0)
    params = [SamplingParams(temperature=0, max_new_tokens=20, logprobs=True)] * (len(EARLY) + len(LATE))
    whole_tokens, whole = _logprobs_run(Engine(target, None, EngineConfig(
        max_batch_size=4, max_seq_len=128, num_draft_tokens=0, admit_min=1)), params)
    pads = []
    real = mixed_module.host_meta

    def counting(layout, chunks, n):
        out = real(layout, chunks, n)
        pads.append((out[1][-1], layout.batch - n))
        return out
    monkeypatch.setattr(mixed_module, "host_meta", counting)
    tokens, got = _logprobs_run(_engine(target, None, budget=20), params)  # (20 tokens in buckets of 24)
    assert tokens == whole_tokens and sum(1 for p, _ in pads if p) >= 3 and any(d for _, d in pads)
    gap = max(abs(a - b) for x, y in zip(got, whole) for a, b in zip(x, y))
    leak = lambda table, live: torch.where(live[:, None], table, table[1:2])  # noqa: E731  (slot 1's blocks)
    monkeypatch.setattr(mixed_module, "_dead_table", leak)
    _, bad = _logprobs_run(_engine(target, None, budget=20), params)
    bad_gap = max(abs(a - b) for x, y in zip(bad, whole) for a, b in zip(x, y))
    assert gap < 1e-4 < 1e-2 < bad_gap


def test_token_buckets_and_the_plans_cap(make_llama):
    """Buckets 16, 24, 32, 48, ... up to the cap (an int budget's bucket — with a deadline, `prefill_steps`, the
    larger of it and prefill_chunk's —, else max(prefill_chunk, AUTO_CAP)'s); the warm-up's and the graphs' buckets
    stop at the int budget's or prefill_chunk's; a mixed step never feeds past the cap, though its budget asks for
    more ("auto" before anything is measured, a deadline)."""
    assert graph_buckets(EngineConfig(mixed_step=True, prefill_chunk=512)) == \
        (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    assert token_buckets(EngineConfig(mixed_step=True, prefill_chunk=512))[-4:] == (1536, 2048, 3072, AUTO_CAP)
    assert token_cap(EngineConfig(mixed_step=True, prefill_budget=100)) == 128 == \
        graph_cap(EngineConfig(mixed_step=True, prefill_budget=100))
    assert token_cap(EngineConfig(mixed_step=True, prefill_budget=16)) == 16
    assert token_cap(EngineConfig(mixed_step=True, prefill_chunk=8192)) == 8192  # (a larger prefill_chunk: its own)
    assert token_cap(EngineConfig(mixed_step=True, prefill_budget=16, prefill_steps=2, prefill_chunk=100)) == 128
    assert token_bucket(25, (16, 24, 32)) == 32 and token_floor(31, (16, 24, 32)) == 24
    with pytest.raises(ValueError, match="largest token bucket"):
        token_bucket(33, (16, 24, 32))
    assert len(mixed_keys((1, 2), (0, 3), ("f",), EngineConfig(mixed_step=True, prefill_budget=24))) == 2 * 2 * 2
    assert {k[3] for k in mixed_keys((1,), (0,), ("f",), EngineConfig(mixed_step=True, prefill_chunk=64))} == \
        {16, 24, 32, 48, 64}  # (the warm-up builds the graphed buckets only)
    from types import SimpleNamespace

    from specdec.engine.prefill import ChunkBudget, plan_mixed

    def plan(length=300, **config):
        chunked = ChunkBudget(EngineConfig(mixed_step=True, **config))
        request = SimpleNamespace(prompt=list(range(length)), prefilled=0, draft_valid=0, slot=1, fed_by=2)
        scheduler = SimpleNamespace(filling=[request], num_steps=0, running=[SimpleNamespace(length=5)])
        asked = chunked.step_budget(scheduler.filling, 0, False)
        return asked, plan_mixed(scheduler, chunked, False).chunks.num_tokens
    assert plan(prefill_chunk=64) == (512, 299)  # ("auto" cold asks 512: the whole prompt but its last token)
    assert plan(length=20000, prefill_chunk=64) == (10000, AUTO_CAP)  # (a deadline: at most the cap)
    assert plan(prefill_budget=20, prefill_steps=2) == (150, 150)  # (a deadline asks for more: it gets it)
    assert plan(prefill_budget=20, prefill_steps=2, prefill_chunk=64) == (150, 64)  # (up to prefill_chunk's bucket)
    assert plan(prefill_budget=20) == (20, 20)


def test_warmup_builds_every_shape_a_run_reaches(make_llama):
    """After `Engine.warmup` over every batch size, the γ values and both flavors, a run with arrivals mid-flight
    builds no mixed shape the warm-up did not (the warm-up's keys are `mixed_keys` of those, all of them), and its
    tokens are an unwarmed run's; without the warm-up the run builds shapes as it goes (the control)."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    params = mixed_params(len(EARLY) + len(LATE))
    runs = {}
    for warm in (True, False):
        engine = _engine(target, draft)
        if warm:
            engine.warmup(batch_sizes=(1, 2, 3, 4), temperatures=(0.0, 1.0))
        warmed = set(engine.runner.mixed_steps)
        tokens = drive(engine, EARLY, LATE, params)
        ran = {key for key, shape in engine.runner.mixed_steps.items() if shape.ran}
        runs[warm] = (tokens, warmed, set(engine.runner.mixed_steps), ran, engine)
    (tokens, warmed, after, ran, engine), (cold_tokens, cold_warmed, cold_after, cold_ran, _) = runs[True], runs[False]
    gammas = sorted({0, *engine.policy.candidates})
    flavors = {key[2] for key in warmed}
    assert warmed == set(mixed_keys((1, 2, 4), gammas, flavors, engine.config)) and len(flavors) == 2
    assert len(ran) >= 2 and after == warmed  # (mixed steps of several shapes ran; none was new)
    assert not cold_warmed and len(cold_ran) >= 2 and cold_after == cold_ran  # (each built as the run reached it)
    assert tokens == cold_tokens


def test_the_triton_path_reads_the_device_meta_alone(make_llama):
    """What a captured graph replays (the step's host values frozen at capture): through the Triton attention (its
    interpreter on CPU) the bounded batch's forward reads the device meta and lengths alone — built with another
    step's host row counts and starts it gives the same logits and K/V; the reference attention, which groups rows
    on the host, does not (the control)."""
    pytest.importorskip("triton")
    from types import SimpleNamespace

    from specdec.fast.kernels.ragged_attention import block_m_for
    from specdec.fast.model import FastLlama
    from specdec.fast.ragged import forward_ragged

    model = FastLlama.from_hf(make_llama(0, hidden=64))  # (head dim 16: the Triton kernel's least)
    s = model.shape
    group, bs, blocks = s.n_heads // s.n_kv_heads, 16, 40
    layout = MixedLayout(2, 3, 32, 4, group, block_m_for(1 << 30, s.head_dim, True), s.head_dim, True)
    table = torch.zeros(4, 8, dtype=torch.int32)
    for slot in range(4):
        table[slot, :4] = torch.arange(1 + 4 * slot, 5 + 4 * slot)
    tokens = torch.randint(2, s.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    verify = tokens[:2, 20:23].clone()
    lengths = torch.tensor([21, 34])
    verify_tiles = torch.tensor(layout.verify_tiles(block_m_for(group * 3, s.head_dim, True)),
                                dtype=torch.int32).view(-1, 2)
    gen = torch.Generator().manual_seed(1)
    pools = [torch.randn(blocks, bs, s.n_kv_heads, s.head_dim, generator=gen) for _ in range(2 * s.n_layers)]
    step = PrefillChunks((2, 3), (0, 16), (20, 27), (21, 34))
    other = PrefillChunks((3,), (5,), (6,), (9, 4))  # (another step's host rows: what a replay would hold)
    meta, counts, starts = host_meta(layout, step, 2)
    _, other_counts, other_starts = host_meta(layout, other, 2)

    def run(rows, kernels):
        cache = SimpleNamespace(keys=[p.clone() for p in pools[: s.n_layers]],
                                values=[p.clone() for p in pools[s.n_layers:]])
        batch = mixed_module.mixed_batch(torch.tensor(meta), verify, lengths, table, bs, tokens, layout,
                                         verify_tiles, row_counts=rows[0], row_starts=rows[1], num_blocks=blocks)
        return forward_ragged(model, batch, cache, kernels=kernels), cache.keys[-1]
    logits, keys = run((counts, starts), "triton")
    frozen, frozen_keys = run((other_counts, other_starts), "triton")
    assert torch.equal(logits, frozen) and torch.equal(keys, frozen_keys)
    reference, _ = run((counts, starts), "reference")
    torch.testing.assert_close(reference, logits, atol=1e-4, rtol=0)
    with pytest.raises(Exception):  # (its groups follow the host's rows: another step's do not fit this batch)
        wrong, _ = run((other_counts, other_starts), "reference")
        torch.testing.assert_close(wrong, logits, atol=1e-4, rtol=0)


def test_the_captured_path_on_cpu_with_a_stand_in_graph(make_llama, monkeypatch):
    """The graph path's own code on CPU: `CapturedStep` stood in by a body run at capture (twice, state put back)
    and at each replay, the mixed shapes made non-eager — the drafts copied into the shape's static buffers every
    step, the verify half "captured" once per shape after its drafts, the source decode shape drafting; the tokens
    are a whole prefill's, greedy and T = 1 with a draft model. A stale copy of the drafts (the control: copied at
    capture, never after) changes them."""
    target, draft = make_llama(0), make_llama(5, layers=1)
    params = mixed_params(len(EARLY) + len(LATE))
    whole = drive(Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                     admit_min=1)), EARLY, LATE, params)
    captures = []

    class StandIn:
        def __init__(self, fn, *, pool=None, restore=()):
            saved = [t.clone() for t in restore]
            for _ in range(2):
                fn()
            for t, s in zip(restore, saved):
                t.copy_(s)
            self.fn, self.outputs = fn, None
            captures.append(fn)

        def replay(self):
            return self.fn()

    def verify(self):
        self.capture()
        return self._verify_graph.replay()
    monkeypatch.setattr(mixed_module, "CapturedStep", StandIn)
    monkeypatch.setattr(mixed_module.MixedStepRunner, "eager", property(lambda self: False))
    monkeypatch.setattr(mixed_module.MixedStepRunner, "verify", verify)
    engine = _engine(target, draft, budget=20)
    assert drive(engine, EARLY, LATE, params) == whole
    shapes = [s for s in engine.runner.mixed_steps.values() if s.ran]
    assert shapes and len(captures) == len(shapes) and all(s.drafts is s._static for s in shapes)
    stale = mixed_module.MixedStepRunner.draft

    def once(self):
        if self._static is None:
            return stale(self)
        self.load(self.prefill)
        self.source.draft()  # (its drafts never reach the static buffers)
    monkeypatch.setattr(mixed_module.MixedStepRunner, "draft", once)
    assert drive(_engine(target, draft, budget=20), EARLY, LATE, params) != whole


def test_the_chunk_launch_covers_every_query_row_once_within_its_fixed_tiles():
    """`host_meta`'s tiles (seeded random steps): every query row of every chunk and of the pad row in exactly one
    used tile, the rest unused, never more than the layout's fixed count."""
    import random

    from specdec.engine.mixed_shapes import UNUSED_TILE

    rng = random.Random(0)
    for _ in range(300):
        group, block_m = rng.choice([1, 2, 4, 8]), rng.choice([16, 64, 128])
        layout = MixedLayout(rng.choice([1, 2, 4]), 4, rng.choice([16, 24, 48, 128]), rng.randint(1, 12), group, block_m)
        c = rng.randint(0, min(layout.max_chunks, layout.tokens))
        cuts = sorted(rng.sample(range(1, layout.tokens + 1), c)) if c else []
        counts = [b - a for a, b in zip([0] + cuts, cuts)]
        chunks = PrefillChunks(tuple(range(c)), (0,) * c, tuple(counts), (5,) * layout.batch)
        meta, row_counts, _ = host_meta(layout, chunks, layout.batch)
        tiles = meta[2 + 3 * layout.max_chunks:]
        assert len(tiles) == 2 * layout.num_tiles
        seen = {}
        for row, part in zip(tiles[::2], tiles[1::2]):
            if part == UNUSED_TILE:
                continue
            for r in range(part * block_m, min((part + 1) * block_m, group * row_counts[row])):
                seen[(row, r)] = seen.get((row, r), 0) + 1
        want = {(row, r) for row in range(layout.batch, layout.num_rows) for r in range(group * row_counts[row])}
        assert set(seen) == want and set(seen.values()) <= {1}
