"""The prefix cache's parts (`engine/prefix_cache.py` over `engine/kv_pool.py`): the hash chain, the index entered
only below what every model holds, hits that stop before the request's first write, and eviction — least recently
released first, never a block someone holds — with the pool's books balanced throughout."""

from types import SimpleNamespace

import pytest
import torch

from specdec.engine.kv_pool import KVPool, PoolAccountingError
from specdec.engine.prefix_cache import PrefixCache, block_hashes, model_key

SEED = model_key("target", "fp32")


def test_the_chain_names_a_block_by_everything_before_it():
    tokens = list(range(3, 40))  # 37 tokens: 4 full blocks of 8, a partial fifth never hashed
    hashes = block_hashes(tokens, 8, SEED)
    assert len(hashes) == 4 and len(set(hashes)) == 4
    assert block_hashes(tokens[:16] + [1, 2], 8, SEED) == hashes[:2]  # same prefix, same hashes
    changed = block_hashes([tokens[0] + 1] + tokens[1:], 8, SEED)  # an earlier token changes every later hash
    assert all(a != b for a, b in zip(changed, hashes))
    late = block_hashes(tokens[:20] + [99] + tokens[21:], 8, SEED)  # block 2 changed: blocks 0, 1 stay
    assert late[:2] == hashes[:2] and all(a != b for a, b in zip(late[2:], hashes[2:]))
    other = block_hashes(tokens, 8, model_key("another target", "fp32"))  # another model: nothing in common
    assert not set(other) & set(hashes)
    assert not set(block_hashes(tokens, 8, SEED, extra=b"adapter-1")) & set(hashes)
    assert block_hashes(tokens, 8, SEED, parents=hashes[:2]) == hashes  # extended, not recomputed
    assert block_hashes([1, 23], 2, SEED) != block_hashes([12, 3], 2, SEED)  # (token boundaries are kept)


def _request(prompt, length=None, draft_valid=0):
    return SimpleNamespace(prompt=list(prompt), length=len(prompt) if length is None else length,
                           draft_valid=draft_valid, prefix=None, num_cached_tokens=0)


def _setup(num_blocks=9, write_back=1):
    pool = KVPool(num_blocks=num_blocks, block_size=4, max_batch=3, max_positions=32, device=torch.device("cpu"))
    return pool, PrefixCache(pool, SEED, write_back)


def _admit(pool, cache, slot, request):
    cache.attach(slot, request)
    assert pool.reserve(slot, len(request.prompt) + 2)
    cache.commit(slot, request, request.prompt, cache.stable(request, None))  # (the target holds [0, length − 1))


def test_a_hit_shares_the_blocks_and_stops_before_the_last_prompt_token():
    pool, cache = _setup()
    first = _request(range(10, 22))  # 12 tokens: blocks 0, 1 stable (the target holds [0, 11)), block 2 not
    _admit(pool, cache, 0, first)
    assert first.num_cached_tokens == 0 and cache.num_cached_blocks == 2
    again = _request(range(10, 22))  # the same 12: blocks 0, 1 are hits; block 2 holds its first write (11)
    assert cache.attach(1, again) == 8 and pool.blocks[1] == pool.blocks[0][:2]
    assert pool.reserve(1, 14)
    pool.check()  # the two shared blocks held twice, counted twice
    assert (cache.queries, cache.hits) == (24, 8)  # (tokens: both prompts looked up, 8 found)
    exact = _request(range(10, 19))  # 9 tokens = 2 blocks + 1: both hit, the 9th is recomputed
    assert cache.attach(2, exact) == 8
    short = _request(range(10, 18))  # 8 tokens = 2 blocks exactly: the last token lies in block 1, so 1 hit
    pool.release(2)
    assert cache.attach(2, short) == 4
    with pytest.raises(PoolAccountingError, match="still holds"):
        pool.share_row(2, [1])


def test_a_drafter_holds_back_what_it_rewrites():
    pool, cache = _setup(write_back=4)  # a model drafter re-feeds from length − 4
    request = _request(range(10, 22), draft_valid=6)
    cache.attach(0, request)
    assert pool.reserve(0, 14)
    cache.commit(0, request, request.prompt, cache.stable(request, request.draft_valid))
    assert cache.num_cached_blocks == 1  # min(12 − 4, 6) = 6 positions: one full block
    request.draft_valid = 10
    cache.commit(0, request, request.prompt, cache.stable(request, request.draft_valid))
    assert cache.num_cached_blocks == 2  # min(8, 10): two
    assert cache.attach(1, _request(range(10, 22))) == 8  # (12 − 4) // 4 = 2 blocks may hit


def test_eviction_only_when_nothing_else_is_free_least_recently_released_first_never_a_held_block():
    pool, cache = _setup(num_blocks=9)  # 8 usable blocks of 4
    a, b = _request(range(100, 109)), _request(range(200, 209))  # 9 tokens: 2 cached blocks each (+1 uncached)
    _admit(pool, cache, 0, a)
    _admit(pool, cache, 1, b)
    a_all, b_all = list(pool.blocks[0]), list(pool.blocks[1])
    a_blocks, b_blocks = a_all[:2], b_all[:2]
    never = sorted(set(range(1, 9)) - set(a_all) - set(b_all))
    pool.release(0)  # a leaves first (least recently used), then b
    pool.release(1)
    pool.check()
    cache.check()
    assert cache.num_cached_blocks == 4 and pool.allocator.num_free_blocks == 8  # cached, and free
    assert pool.allocator.num_cached_free_blocks == 4
    held = _request(range(200, 209))  # b's text comes back: its blocks are held again
    assert cache.attach(0, held) == 8 and pool.blocks[0] == b_blocks
    assert pool.allocator.num_free_blocks == 6
    # free now: the 2 never used and a's and b's uncached thirds, handed out first (in order of release), then the
    # cached: a's two (released tail first). Taking 5 evicts one, a's tail; a's head stays, b's (held) too
    assert pool.reserve(1, 20)
    assert pool.blocks[1] == never + [a_all[2], b_all[2], a_blocks[1]]
    assert cache.evictions == 1 and cache.num_cached_blocks == 3
    assert cache.attach(2, _request(range(100, 109))) == 4 and pool.blocks[2] == a_blocks[:1]  # a's head survived
    pool.release(2)
    assert pool.reserve(2, 4) and pool.blocks[2] == a_blocks[:1] and cache.evictions == 2  # the last free block
    pool.release(1)
    assert cache.attach(1, _request(range(200, 209))) == 8 and pool.blocks[1] == b_blocks  # (held: shared again)
    pool.check()
    cache.check()


@pytest.mark.parametrize("apart", [True, False])
def test_cached_blocks_are_evicted_only_when_the_pool_needs_them(apart):
    """Short texts come and go (2 blocks each, none cached) in a pool of 11: no cached block is handed out,
    however long ago it was released. Negative control (apart=False: one free list in order of release, the cached
    blocks not kept apart) — the third text takes the first's cached blocks while others are free."""
    pool, cache = _setup(num_blocks=12)
    if not apart:
        pool.allocator.cached = None
    first = _request(range(100, 109))
    _admit(pool, cache, 0, first)
    pool.release(0)
    for i in range(6):
        other = _request(range(300 + 20 * i, 304 + 20 * i))
        _admit(pool, cache, 1, other)
        pool.release(1)
    hits = cache.attach(0, _request(range(100, 109)))
    assert (cache.evictions, hits) == ((0, 8) if apart else (2, 0))
    pool.check()
    cache.check()


def test_reset_returns_cached_free_blocks_to_the_plain_list():
    pool, cache = _setup()
    request = _request(range(10, 22))
    _admit(pool, cache, 0, request)
    pool.release(0)
    assert pool.allocator.num_cached_free_blocks == 2
    cache.reset("test")
    assert pool.allocator.num_cached_free_blocks == 0 and pool.allocator.num_free_blocks == 8
    assert cache.attach(0, _request(range(10, 22))) == 0
    pool.check()
    cache.check()


def test_lru_order_follows_the_last_use():
    pool, cache = _setup(num_blocks=9)
    a, b = _request(range(100, 105)), _request(range(200, 205))  # one cached block each
    _admit(pool, cache, 0, a)
    _admit(pool, cache, 1, b)
    pool.release(0)
    pool.release(1)
    again = _request(range(100, 105))  # a used again, then released: now b's block is the least recent
    assert cache.attach(0, again) == 4
    pool.release(0)
    free = pool.allocator.num_free_blocks
    taken = pool.allocator.allocate(free - 1)  # all but the most recently released block
    assert cache.attach(0, _request(range(100, 105))) == 4  # a survived
    pool.release(0)
    pool.allocator.free(taken)
    assert cache.attach(1, _request(range(200, 205))) == 0  # b was evicted
    pool.release(1)
    pool.check()
    cache.check()


def test_a_hit_the_drafter_would_rewrite_is_copied_or_taken_over():
    """write_back 4 (a model drafter re-feeds from length − 4): of a 13-token prompt's 3 hit blocks, the third holds
    positions 8..11, which the re-feed writes. Held by another request, it is copied (every model's cache) into a
    block of the row's own; held by nobody, the row takes it over (out of the index until it is stable again)."""
    copied = []
    pool = KVPool(num_blocks=12, block_size=4, max_batch=4, max_positions=32, device=torch.device("cpu"))
    cache = PrefixCache(pool, SEED, 4, caches=(SimpleNamespace(copy_block=lambda s, d: copied.append((s, d))),))
    a = _request(range(50, 63))
    cache.attach(0, a)
    assert pool.reserve(0, 15)
    cache.commit(0, a, a.prompt, 12)  # (a leaving request: all the target holds)
    held = list(pool.blocks[0][:3])
    b = _request(range(50, 63))
    assert cache.attach(1, b) == 12 and cache.copies == 1
    assert pool.blocks[1][:2] == held[:2] and copied == [(held[2], pool.blocks[1][2])] and pool.blocks[1][2] != held[2]
    assert pool.reserve(1, 15)
    pool.check()
    pool.release(0)  # a leaves: its third block is cached and held by nobody
    c = _request(range(50, 63))
    assert cache.attach(2, c) == 12 and cache.copies == 1 and pool.blocks[2][2] == held[2]  # taken over, no copy
    assert cache.attach(3, _request(range(50, 63))) == 8  # out of the index while c may write it
    pool.release(3)
    assert pool.reserve(2, 15)
    cache.commit(2, c, c.prompt, 12)  # stable again: back in the index
    assert cache.attach(3, _request(range(50, 63))) == 12 and cache.copies == 2
    pool.check()
    cache.check()
