"""Beam groups over the paged pool (`engine/beam_blocks.py`): the prompt's blocks forked by table (reference
counts), reorders as table edits, copy-on-write where a beam extends a block others hold; the beams stay
transformers' (tests/engine/test_engine_beam.py runs every case over both layouts). Here: what the group holds while
it runs (the prompt's full blocks shared by every beam, fewer blocks than w separate rows), the books checked after
every step with a leaked block caught (negative control), and copy-on-write needed (without it the beams change)."""

import pytest

from helpers import hf_beams, perturbed_copy
from specdec.engine import Engine, EngineConfig
from specdec.engine import beam_blocks
from specdec.engine.beam import BeamParams
from specdec.engine.kv_pool import PoolAccountingError, blocks_for
from specdec.request import SamplingParams

PROMPT = list(range(3, 40))  # 37 tokens: 36 prefilled = 2 full blocks of 16 and a partial one
N = 12


@pytest.fixture(scope="module")
def pair(make_llama):
    target = make_llama(0)
    return target, perturbed_copy(target)


def _engine(pair, **config):
    return Engine(*pair, EngineConfig(max_batch_size=4, max_seq_len=96, num_draft_tokens=3, kv_layout="paged",
                                      **config))


def _run(engine, w=4, check=True):
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0, max_new_tokens=N),
                             beams=BeamParams(w, 4, 3, num_return_sequences=w))
    held, out = [], None
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o
        if check:
            engine.kv_pool.check()
        rows = [list(engine.kv_pool.blocks[r]) for r in range(4 - w, 4)]
        if any(rows):
            held.append((rows, [engine.kv_pool.allocator.ref_count(b) for b in rows[0]]))
    return out, held


def test_the_prompt_is_forked_by_table_and_beams_share_it(pair):
    engine = _engine(pair)
    out, held = _run(engine)
    assert [list(b) for b in out.beams] == hf_beams(pair[0], tuple(PROMPT), 4, (), N, 1.0, False)[0]
    full = (len(PROMPT) - 1) // 16
    assert held
    for rows, counts in held:  # every beam's first blocks are the prompt's, the same blocks (one copy in the pool)
        assert all(r[:full] == rows[0][:full] for r in rows)
        assert counts[:full] == [4] * full
    distinct = max(len({b for r in rows for b in r}) for rows, _ in held)
    per_row = blocks_for(len(PROMPT) + N + 3, 16)
    assert distinct < 4 * per_row  # shared, not w copies
    assert engine.kv_cache_usage.num_used_blocks == 0  # all back


def test_a_leaked_block_is_caught_after_the_step(pair, monkeypatch):
    """Negative control: a reorder that forgets to drop one row's old block once leaves a count nobody holds."""
    drop, forgot = beam_blocks.BeamBlocks._drop, []

    def forget_once(self, block):
        if forgot:
            return drop(self, block)
        forgot.append(block)

    monkeypatch.setattr(beam_blocks.BeamBlocks, "_drop", forget_once)
    with pytest.raises(PoolAccountingError, match="held a number of times|leaked"):
        _run(_engine(pair))


def test_without_copy_on_write_the_beams_change(pair, monkeypatch):
    """Negative control: beams writing a block they share (no copy first) corrupt each other's text."""
    reference = [list(b) for b in _run(_engine(pair))[0].beams]

    def extend_in_place(self, row, lo, hi):
        blocks = self.pool.blocks[row]
        for j in range(lo // self.size, blocks_for(hi, self.size)):
            while j >= len(blocks):
                blocks.append(self._take())

    monkeypatch.setattr(beam_blocks.BeamBlocks, "_extend", extend_in_place)
    broken, _ = _run(_engine(pair), check=False)
    assert [list(b) for b in broken.beams] != reference


def test_a_group_waits_for_its_blocks_and_is_refused_when_it_never_fits(pair):
    probe = _engine(pair)
    need = beam_blocks.group_blocks(len(PROMPT) - 1, len(PROMPT) + N + 4 * 3 + 2, 4, 16)
    block = sum(c.block_bytes(m, 16) for c, m in ((probe.cache, probe.model), (probe.drafter.cache,
                                                                                probe.drafter.model)))
    small = _engine(pair, kv_cache_memory=need * block)  # need − 1 usable blocks
    with pytest.raises(ValueError, match=rf"num_beams=4 .* needs {need} KV blocks of 16 positions; the pool holds "
                                         rf"{need - 1}"):
        small.add_request(PROMPT, SamplingParams(temperature=0, max_new_tokens=N), beams=BeamParams(4, 4, 3))
    roomy = _engine(pair, kv_cache_memory=(need + 3) * block)
    chain = roomy.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=40))  # holds blocks first
    out, _ = _run(roomy)
    assert out.finished and roomy.kv_cache_usage.num_used_blocks == 0
    assert chain  # (it ran beside or before the group; the books balanced after every step)
