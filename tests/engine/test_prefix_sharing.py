"""`n > 1` copies of a prompt share its blocks from their first step (`PrefixCache.pending` / `take_held` and the
second admission round in `engine/admission.py`): one copy prefills, the others are admitted in the same step right
after its prefill and hit its blocks (the drafter's re-fed window copied from the K/V just written), so all four
produce their first token in the same step, with the tokens of caching off — for a draft model and a feature head.
Negative control: without the second round the copies still hit, but a step later."""

import pytest

from specdec.engine import Engine, EngineConfig
from specdec.engine import prefix_cache
from specdec.request import SamplingParams

PROMPT = [(7 * i + 3) % 61 + 2 for i in range(42)]  # 5 full blocks of 8, + 2


@pytest.fixture(scope="module")
def target(make_llama):
    return make_llama(0)


def _drafter(kind, target, make_llama):
    if kind == "model":
        return make_llama(1, layers=1)
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)
    return head.to_feature_head()


def _copies(target, drafter, caching, mixed="auto"):
    """Four seeded copies of PROMPT added at once → (tokens per copy, step of each copy's first token, finals,
    engine)."""
    engine = Engine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=3,
                                                  max_draft_tokens=3, block_size=8, kv_layout="paged",
                                                  enable_prefix_caching=caching, mixed_step=mixed))
    ids = [engine.add_request(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=10, seed=s)) for s in range(4)]
    tokens, first, finals, step = {}, {}, {}, 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            if out.new_token_ids:
                first.setdefault(out.request_id, step)
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finals[out.request_id] = out
        engine.kv_pool.check()
    return [tokens[i] for i in ids], [first[i] for i in ids], [finals[i] for i in ids], engine


@pytest.mark.parametrize("mixed", ["auto", False])
@pytest.mark.parametrize("kind", ["model", "head"])
def test_copies_hit_from_their_first_step(target, make_llama, kind, mixed, monkeypatch):
    """With the mixed step (the default) and with whole prefills: the second round's copies prefill their rest
    whole beside the first copy, not in chunks of a later step."""
    drafter = _drafter(kind, target, make_llama)
    off, off_first, _, _ = _copies(target, drafter, False, mixed)
    on, on_first, finals, engine = _copies(target, drafter, True, mixed)
    assert on == off
    assert len(set(on_first)) == 1 and on_first == off_first  # all four start together, as without caching
    cached = [f.num_cached_tokens for f in finals]
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:])
    assert engine.prefix_cache_hits == sum(cached)
    # negative control: without the second admission round the copies wait a step (and still hit)
    monkeypatch.setattr(prefix_cache.PrefixCache, "take_held", lambda self, running, synced: False)
    late, late_first, late_finals, _ = _copies(target, drafter, True, mixed)
    assert late == off and late_first[1] > late_first[0]
    assert [f.num_cached_tokens for f in late_finals] == cached
