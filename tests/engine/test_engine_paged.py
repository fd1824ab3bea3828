"""The engine over the paged KV pool (`EngineConfig(kv_layout="paged")`, CPU fp32): greedy tokens are transformers'
and the static layout's, with a model drafter, a feature head and n-grams; a pool too small for the traffic preempts
(blocks freed, re-queued first, recomputed) and the tokens stay those of an unconstrained run, processors included;
the books balance after every step and every block comes back; a request that could never fit is refused at
`add_request`; the metrics (`kv_cache_usage`)."""

import pytest
import torch

from helpers import RAGGED_PROMPTS, hf_greedy
from specdec.drafters.ngram import NGramDrafter
from specdec.engine import Engine, EngineConfig
from specdec.engine.kv_pool import PagedSlotCache
from specdec.request import SamplingParams

PROMPTS = RAGGED_PROMPTS + [[4, 4, 9], list(range(3, 40))]


def _drain(engine, check=True):
    outputs, usage = {}, []
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        usage.append(engine.kv_cache_usage_perc)
        if check:
            engine.kv_pool.check()  # the books balance after every step
    return outputs, usage


def _run(target, drafter, config, prompts, params):
    engine = Engine(target, drafter, config)
    ids = [engine.add_request(p, params[i % len(params)]) for i, p in enumerate(prompts)]
    outputs, usage = _drain(engine, check=engine.kv_pool is not None)
    return engine, [outputs[i] for i in ids], usage


def start_head(target):
    """An untrained feature head started from the target's last layer (as `test_feature_drafter` builds it)."""
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=1)
    head.init_from(target)
    return head.to_feature_head()


def _block_bytes(engine):
    models = [engine.model] + ([engine.drafter.model] if engine.drafter_cached else [])
    return sum(PagedSlotCache.block_bytes(m, engine.config.block_size) for m in models)


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(0), make_llama(1, layers=1)


@pytest.mark.parametrize("gamma", [0, 3, "auto"])
def test_greedy_is_transformers_and_the_static_layouts(pair, gamma):
    target, draft = pair
    params = [SamplingParams(temperature=0, max_new_tokens=18 + 3 * i) for i in range(3)]
    config = dict(max_batch_size=3, max_seq_len=128, num_draft_tokens=gamma)
    engine, paged, usage = _run(target, draft, EngineConfig(**config, kv_layout="paged"), PROMPTS, params)
    _, static, _ = _run(target, draft, EngineConfig(**config), PROMPTS, params)
    assert paged == static
    for i, (prompt, out) in enumerate(zip(PROMPTS, paged)):
        assert out == hf_greedy(target, prompt, 18 + 3 * (i % 3), [])
    assert max(usage) > 0 and usage[-1] == 0.0 and engine.kv_cache_usage.num_free_blocks == engine.kv_cache_usage.num_blocks


@pytest.mark.parametrize("drafter", ["head", "ngram"])
def test_other_drafters_follow_the_table(pair, drafter):
    """A feature head (its layer's cache and the target's stored features over the pool) and n-grams (no cache)."""
    target = pair[0]
    draft = start_head(target) if drafter == "head" else NGramDrafter(2).fit(PROMPTS, 64)
    params = [SamplingParams(temperature=0, max_new_tokens=20)]
    config = dict(max_batch_size=2, max_seq_len=96, num_draft_tokens=3)
    engine, paged, _ = _run(target, draft, EngineConfig(**config, kv_layout="paged"), PROMPTS, params)
    static_engine, static, _ = _run(target, draft, EngineConfig(**config), PROMPTS, params)
    assert engine.drafter_cached == (drafter == "head")
    for prompt, out in zip(PROMPTS, paged):
        assert out == hf_greedy(target, prompt, 20, [])
    # the head's drafts read its cache and the stored features through the table: the same drafts get accepted
    accepted = engine.stats.accepted_tokens
    assert accepted == static_engine.stats.accepted_tokens and accepted > 0 and paged == static


@pytest.mark.parametrize("budget", [None, 32])
def test_a_pool_too_small_preempts_and_the_tokens_stay_the_same(pair, budget):
    """Five requests of ~4 blocks each over 6 usable blocks: preemptions (also of filling rows, with a prefill
    budget), never a failure; every request's tokens are the unconstrained run's. Processors included: a preempted
    request's output counts come back with it."""
    target, draft = pair
    params = [SamplingParams(temperature=0, max_new_tokens=40),
              SamplingParams(temperature=0, max_new_tokens=36, repetition_penalty=1.3, frequency_penalty=0.5)]
    config = dict(max_batch_size=4, max_seq_len=128, num_draft_tokens=3, kv_layout="paged", prefill_budget=budget)
    roomy, free_run, _ = _run(target, draft, EngineConfig(**config), PROMPTS, params)
    assert roomy.kv_cache_usage.num_preemptions == 0
    tight = EngineConfig(**config, kv_cache_memory=7 * _block_bytes(roomy))
    engine, tight_run, usage = _run(target, draft, tight, PROMPTS, params)
    assert engine.kv_cache_usage.num_blocks == 6 and engine.kv_cache_usage.num_preemptions > 0
    assert tight_run == free_run
    assert all(len(out) == params[i % 2].max_new_tokens for i, out in enumerate(tight_run))  # none truncated
    assert max(usage) == 1.0 and usage[-1] == 0.0


def test_a_preempted_requests_statistics_add_up(pair):
    target, draft = pair
    probe = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, kv_layout="paged"))
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=128, num_draft_tokens=2,
                                                kv_layout="paged", kv_cache_memory=7 * _block_bytes(probe)))
    for p in PROMPTS:
        engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=40))
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.stats
    assert engine.kv_cache_usage.num_preemptions > 0
    assert all(s.num_generated_tokens == 40 for s in finals.values())
    assert engine.stats.num_generated_tokens == 40 * len(PROMPTS)


def test_what_could_never_fit_is_refused_at_add_request(pair):
    target, draft = pair
    probe = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, kv_layout="paged"))
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, kv_layout="paged",
                                                kv_cache_memory=4 * _block_bytes(probe)))  # 3 usable blocks
    engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=30))  # 3 + 30 + γ + 2 positions: 3 blocks
    with pytest.raises(ValueError, match=r"needs 4 KV blocks of 16 positions; the pool holds 3 .*kv_cache_memory"):
        engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=50))
    tree = SamplingParams(max_new_tokens=30, draft_tree=(2, 1))  # its step writes 5 nodes from slot n − 1
    with pytest.raises(ValueError, match=r"needs 4 KV blocks of 16 positions; the pool holds 3"):
        engine.add_request([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], tree)
    with pytest.raises(ValueError, match="at least 2"):
        Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=128, kv_layout="paged", kv_cache_memory=1))


def test_config_errors_name_the_option():
    with pytest.raises(ValueError, match="kv_layout must be"):
        EngineConfig(kv_layout="blocks")
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        EngineConfig(kv_layout="paged", block_size=24)
    with pytest.raises(ValueError, match="needs kv_layout='paged'"):
        EngineConfig(kv_layout="static", kv_cache_memory=1 << 20)
    with pytest.raises(ValueError, match=r"fraction of free memory in \(0, 1\]"):
        EngineConfig(kv_layout="paged", kv_cache_memory=1.5)


def test_the_pool_is_sized_by_its_budget(pair):
    target, draft = pair
    probe = Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=200, kv_layout="paged"))
    per_block = _block_bytes(probe)
    engine = Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=200, kv_layout="paged",
                                                kv_cache_memory=100 * per_block + 5))
    assert engine.kv_cache_usage.num_blocks == 99  # (block 0 is the null block)
    assert engine.kv_cache_bytes == 100 * per_block < engine.max_batch * engine.num_positions * per_block // 16
    assert engine.cache.nbytes == 100 * PagedSlotCache.block_bytes(engine.model, 16)
    with pytest.raises(ValueError, match="holds 0 KV blocks"):  # a sliver of free memory buys no block
        Engine(target, draft, EngineConfig(max_batch_size=8, max_seq_len=200, kv_layout="paged", kv_cache_memory=1e-15))


TREE_PARAMS = [SamplingParams(temperature=0, max_new_tokens=30, draft_tree=(2, 2, 1)),
               SamplingParams(temperature=0.9, top_k=30, max_new_tokens=26, seed=3, draft_tree=(2, 2, 1)),
               SamplingParams(temperature=1.0, max_new_tokens=28, seed=11, draft_tree=(2, 2, 1))]


@pytest.mark.parametrize("budget", [None, 7])
def test_token_trees_on_the_pool_are_the_static_layouts(pair, budget):
    """Token trees (greedy and seeded samples) over the paged pool: each accepted path's K/V moved into chain order
    through the block table; with a pool of 6 usable blocks for 4 rows (budget=7), preemptions mid-tree-traffic,
    and every request's tokens are still the static layout's."""
    target, draft = pair
    config = dict(max_batch_size=4, max_seq_len=128, max_tree_nodes=16)
    _, static, _ = _run(target, draft, EngineConfig(**config), PROMPTS, TREE_PARAMS)
    probe = Engine(target, draft, EngineConfig(**config, kv_layout="paged"))
    memory = None if budget is None else budget * _block_bytes(probe)
    engine, paged, usage = _run(target, draft, EngineConfig(**config, kv_layout="paged", kv_cache_memory=memory),
                                PROMPTS, TREE_PARAMS)
    assert paged == static
    assert all(len(out) == TREE_PARAMS[i % 3].max_new_tokens for i, out in enumerate(paged))
    assert (engine.kv_cache_usage.num_preemptions > 0) == (budget is not None)
    assert engine.stats.accepted_tokens > 0 and usage[-1] == 0.0


def test_a_tree_path_left_uncommitted_changes_the_tokens(pair, monkeypatch):
    """Negative control: without the paged path's copy into chain order, the tokens differ from the static run's."""
    from specdec.engine import kv_pool

    target, draft = pair
    config = dict(max_batch_size=2, max_seq_len=128, max_tree_nodes=16)
    params = [SamplingParams(temperature=0, max_new_tokens=30, draft_tree=(3, 2))]
    _, static, _ = _run(target, draft, EngineConfig(**config), PROMPTS[:3], params)
    monkeypatch.setattr(kv_pool.PagedSlotCache, "copy_positions", lambda *a, **k: None)
    _, broken, _ = _run(target, draft, EngineConfig(**config, kv_layout="paged"), PROMPTS[:3], params)
    assert broken != static


def test_a_tree_warmup_runs_on_the_paged_layout(pair):
    engine = Engine(*pair, EngineConfig(max_batch_size=2, max_seq_len=64, kv_layout="paged"))
    assert engine.warmup(draft_trees=[(2, 1)], max_length=16) > 0
    engine.kv_pool.check()
