"""What the prefix cache costs when nothing is shared (`engine/prefix_cache.py`): a prompt whose first block is not
cached reads none of the models' weights (the check that clears the cache after an in-place change runs only before
a possible hit)."""

import pytest

from specdec.engine import Engine, EngineConfig
from specdec.engine import prefix_cache
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

