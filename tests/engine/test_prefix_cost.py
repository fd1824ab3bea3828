"""What the prefix cache costs when nothing is shared (`engine/prefix_cache.py`): a prompt whose first block is not
cached reads none of the models' weights (the check that clears the cache after an in-place change runs only before
a possible hit), and a step reads only the rows that may enter a block (`due`), every row after a release."""

from types import SimpleNamespace

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine import prefix_cache
from specdec.engine.kv_pool import KVPool
from specdec.engine.prefix_cache import PrefixCache, model_key
from specdec.request import SamplingParams


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(0)


def test_no_weight_read_unless_a_hit_is_possible(target, monkeypatch):
    engine = Engine(target, None, EngineConfig(max_batch_size=2, max_seq_len=96, kv_layout="paged", block_size=8,
                                               num_draft_tokens=0))
    reads = []
    original = prefix_cache.PrefixCache._fingerprint
    monkeypatch.setattr(prefix_cache.PrefixCache, "_fingerprint", lambda self: reads.append(1) or original(self))
    params = SamplingParams(temperature=0, max_new_tokens=4)
    for i in range(4):  # distinct prompts: no first block in common
        engine.add_request([2 + (7 * i + 3 * j) % 60 for j in range(20 + i)], params)
        while engine.has_unfinished():
            engine.step()
    assert engine.prefix_cache_hits == 0 and reads == []
    engine.add_request([2 + (3 * j) % 60 for j in range(20)], params)  # the first prompt again: a hit, checked first
    while engine.has_unfinished():
        engine.step()
    assert engine.prefix_cache_hits == 16 and reads == [1]  # negative control: a possible hit does read them



class _Looks(list):
    """The running rows, counting the rows read by index (what `commit_rows` looks at)."""

    looks = 0

    def __getitem__(self, i):
        type(self).looks += 1
        return super().__getitem__(i)


def _rows(pool, cache, lengths):
    running = []
    for slot, n in enumerate(lengths):
        request = SimpleNamespace(prompt=[100 * slot + j for j in range(n)], length=n, draft_valid=0, prefix=None,
                                  num_cached_tokens=0)
        cache.attach(slot, request)
        assert pool.reserve(slot, n + 2)
        running.append(request)
    return running


def _decode(pool, cache, running, steps, scan_every_step):
    """`steps` plain steps of one token per row (the engine's order: blocks, index, step, lengths and text) → the
    rows `commit_rows` read."""
    _Looks.looks = 0
    rows = _Looks(running)
    for step in range(steps):
        for slot, r in enumerate(running):
            assert pool.reserve(slot, r.length + 3)
        if scan_every_step:
            cache._scan = True  # (every row read each step: what the index cost before `due`)
        cache.commit_rows(rows, None)
        tokens = [[7 + (step + slot) % 50] for slot in range(len(running))]
        for r, t in zip(running, tokens):
            r.length += len(t)
        cache.extend(running, tokens)
    cache.commit_rows(rows, None)
    return _Looks.looks


def test_a_step_reads_only_the_rows_that_may_enter_a_block():
    """8 rows at staggered lengths, one token a step, blocks of 4: a row can enter a block once every 4 steps, and
    `commit_rows` reads only those rows (each read enters a block: with no drafter, `due` is exact) — the same index
    as reading every row every step (the negative control), at a quarter of the reads."""
    indexes, reads = [], []
    for scan in (False, True):
        pool = KVPool(num_blocks=80, block_size=4, max_batch=8, max_positions=64, device=torch.device("cpu"))
        cache = PrefixCache(pool, model_key("t"), 1)
        running = _rows(pool, cache, [5 + i for i in range(8)])
        reads.append(_decode(pool, cache, running, 24, scan))
        indexes.append(dict(cache._blocks))
        cache.check()
        pool.check()
        entered = sum(r.prefix.num_cached_blocks for r in running)
        assert entered == sum((r.length - 1) // 4 for r in running)  # every full block below length − 1
    assert indexes[0] == indexes[1]
    every, due = reads[1], reads[0]
    assert every >= 8 * 24 and due <= 8 + 8 * 24 // 4 + 8  # (8: the first step reads every row, their prompts)


def test_rows_moved_by_a_release_are_read_in_full():
    """A release moves the last running row into the freed slot and a new request takes the last slot, all after the
    step noted which slots were due: the next `commit_rows` reads every row, so the moved row's block enters at once
    (shareable from the step its model holds it). Negative control: with the noted slots trusted (no full read after
    the release), the moved row's block is missed that step."""
    for rescan in (True, False):
        pool = KVPool(num_blocks=40, block_size=4, max_batch=4, max_positions=32, device=torch.device("cpu"))
        cache = PrefixCache(pool, model_key("t"), 1)
        running = _rows(pool, cache, [6, 6, 8])  # the last row reaches its second block's due (9) next step
        cache.commit_rows(running, None)
        for slot, r in enumerate(running):
            assert pool.reserve(slot, r.length + 3)
        tokens = [[1], [2], [3]]
        for r, t in zip(running, tokens):
            r.length += 1
        cache.extend(running, tokens)  # (slot 2 noted due)
        leaving = running[0]
        cache.commit_row(0, leaving, None, None)
        if not rescan:
            cache._scan = False
        pool.release(0)
        pool.move(2, 0)
        running[0] = running.pop()  # (the scheduler's `release`: the last row into the freed slot)
        running.append(_rows_at(pool, cache, 2, 3))  # (a new request joins in the last slot)
        cache.commit_rows(running, None)
        moved = running[0]
        assert moved.length == 9
        assert (moved.prefix.num_cached_blocks == 2) == rescan
        cache.check()
        pool.check()


def _rows_at(pool, cache, slot, n):
    request = SimpleNamespace(prompt=[900 + j for j in range(n)], length=n, draft_valid=0, prefix=None,
                              num_cached_tokens=0)
    cache.attach(slot, request)
    assert pool.reserve(slot, n + 2)
    return request
