"""The engine with prefix caching (`EngineConfig(kv_layout="paged", enable_prefix_caching=True)`, CPU fp32): a
request hitting cached blocks gives the tokens it gives with caching off — greedy and seeded sampling, with a model
drafter (its K/V cached in the same blocks: the hit skips its feed too) and with none, chunked prefill and a pool
small enough to preempt and evict; `n > 1` copies of a prompt share its blocks; a shared block is never written;
the books balance after every step; hits are counted and reported. The negative control: a cached block whose K/V
are corrupted changes the output, so the exactness tests do see the reuse."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine.kv_pool import PagedSlotCache
from specdec.request import SamplingParams

SYSTEM = [(7 * i + 3) % 61 + 2 for i in range(37)]  # a shared "system prompt" of 37 tokens (4 blocks of 8, + 5)
PROMPTS = [SYSTEM + [5, 6, 7], SYSTEM + [8, 9], SYSTEM + [5, 6, 7, 10, 11], SYSTEM[:20]]


@pytest.fixture(scope="module")
def pair(make_llama):
    return make_llama(0), make_llama(1, layers=1)


def _config(caching, **kw):
    kw = dict(dict(max_batch_size=2, max_seq_len=128, num_draft_tokens=3, block_size=8), **kw)
    return EngineConfig(kv_layout="paged", enable_prefix_caching=caching, **kw)


def _drain(engine, outputs, finals):
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finals[out.request_id] = out
        engine.kv_pool.check()  # the books balance after every step (shared blocks counted once per holder)
        if engine.prefix_cache is not None:
            engine.prefix_cache.check()


def _serve(engine, prompts, params, waves=True):
    """Prompts one after another (waves: each once the last finished, so later ones can hit) → tokens, finals."""
    outputs, finals, ids = {}, {}, []
    for i, prompt in enumerate(prompts):
        ids.append(engine.add_request(prompt, params[i % len(params)]))
        if waves:
            _drain(engine, outputs, finals)
    _drain(engine, outputs, finals)
    return [outputs[i] for i in ids], [finals[i] for i in ids]


@pytest.mark.parametrize("drafter", ["model", None])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_hit_gives_the_tokens_of_caching_off(pair, drafter, temperature):
    target, draft = pair
    draft = draft if drafter else None
    params = [SamplingParams(temperature=temperature, max_new_tokens=16 + 2 * i, seed=11 + i) for i in range(3)]
    gamma = dict(num_draft_tokens=3) if drafter else dict(num_draft_tokens=0)
    reference = Engine(target, draft, _config(False, **gamma))
    off, _ = _serve(reference, PROMPTS, params)
    engine = Engine(target, draft, _config(True, **gamma))
    on, finals = _serve(engine, PROMPTS, params)
    assert on == off
    # the hits were fed to neither model: the target's prefill and the drafter's feed both skip them
    assert reference.prefill_tokens - engine.prefill_tokens == engine.prefix_cache_hits * (2 if drafter else 1)
    cached = [f.num_cached_tokens for f in finals]
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:3]) and cached[3] == 16
    assert engine.prefix_cache_hits == sum(cached) and engine.prefix_cache_queries == sum(len(p) for p in PROMPTS)
    assert engine.kv_cache_usage.num_free_blocks == engine.kv_cache_usage.num_blocks  # (cached blocks are free)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_conversation_hits_its_own_generated_turn(pair, temperature):
    """Turn 2 re-sends turn 1's prompt and answer: the answer's blocks, cached when turn 1 ended (the drafter's K/V
    with them), are hits; tokens as with caching off."""
    target, draft = pair
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seed=4)
    first, _ = _serve(Engine(target, draft, _config(True)), [PROMPTS[0]], [params])
    turn2 = PROMPTS[0] + first[0] + [4, 5, 6]
    engine = Engine(target, draft, _config(True))
    on, finals = _serve(engine, [PROMPTS[0], turn2], [params])
    off, _ = _serve(Engine(target, draft, _config(False)), [PROMPTS[0], turn2], [params])
    assert on == off and on[0] == first[0]
    assert finals[1].num_cached_tokens > len(PROMPTS[0]) // 8 * 8  # past the first prompt's blocks
    assert finals[1].num_cached_tokens == (len(PROMPTS[0]) + 24 - 4) // 8 * 8  # all the drafter held of turn 1


def test_shared_blocks_are_never_written(pair):
    target, draft = pair
    engine = Engine(target, draft, _config(True, max_batch_size=3))
    params = [SamplingParams(temperature=0, max_new_tokens=20)]
    _serve(engine, PROMPTS[:1], params)
    blocks = sorted(engine.prefix_cache._hashes)
    assert len(blocks) >= 4
    caches = (engine.cache, engine.drafter.cache)  # the target's and the drafter's K/V of the same blocks
    snapshot = [(c._keys[:, blocks].clone(), c._values[:, blocks].clone()) for c in caches]
    _, finals = _serve(engine, PROMPTS[1:3] + PROMPTS[:1], params, waves=False)  # three at once, sharing them
    assert all(f.num_cached_tokens >= 32 for f in finals)
    for cache, (keys, values) in zip(caches, snapshot):
        assert torch.equal(cache._keys[:, blocks], keys) and torch.equal(cache._values[:, blocks], values)


def test_a_running_requests_block_the_drafter_would_write_is_copied(pair):
    """B's prompt is A's plus one token, admitted while A runs: B's last hit block holds positions its drafter
    re-feeds, and A holds it — B gets a copy (copy-on-write); A's blocks are never written by B, and both decode
    the tokens of caching off."""
    target, draft = pair
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=3)
    prompts = [PROMPTS[0], PROMPTS[0] + [9]]
    engine = Engine(target, draft, _config(True))
    outputs, finals = {}, {}
    first = engine.add_request(prompts[0], params)
    while engine.prefix_cache.num_cached_blocks < 5:  # A's 5 prompt blocks, once stable (length − 4 ≥ 40)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    held = list(engine.kv_pool.blocks[0][:5])
    caches = (engine.cache, engine.drafter.cache)
    snapshot = [(c._keys[:, held].clone(), c._values[:, held].clone()) for c in caches]
    second = engine.add_request(prompts[1], params)
    _drain(engine, outputs, finals)
    assert finals[second].num_cached_tokens == 40 and engine.prefix_cache.copies == 1
    for cache, (keys, values) in zip(caches, snapshot):
        assert torch.equal(cache._keys[:, held], keys) and torch.equal(cache._values[:, held], values)
    off, _ = _serve(Engine(target, draft, _config(False)), prompts, [params], waves=False)
    assert [outputs[first], outputs[second]] == off


def test_copies_of_a_prompt_share_its_blocks(pair):
    """`n > 1`: four copies added at once; one prefills, the others are admitted right after it (the same step,
    tests/engine/test_prefix_sharing.py) and share its blocks (held by several rows at once, the books balanced);
    seeded sampling gives each its own tokens, those of caching off."""
    target, draft = pair
    params = [SamplingParams(temperature=1.0, max_new_tokens=12, seed=s) for s in range(4)]
    engine = Engine(target, draft, _config(True, max_batch_size=4))
    ids = [engine.add_request(PROMPTS[2], p) for p in params]
    shared, outputs, finals = 0, {}, {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            finals.update({out.request_id: out} if out.finished else {})
        engine.kv_pool.check()
        rows = engine.kv_pool.blocks
        shared = max(shared, sum(1 for b in set(rows[0]) if sum(b in r for r in rows) > 1))
    assert shared == 4  # the prompt's 4 blocks a hit may take ((42 − WINDOW) // 8) held by several rows at once
    assert [finals[i].num_cached_tokens for i in ids] == [0, 32, 32, 32]
    reference = Engine(target, draft, _config(False, max_batch_size=4))
    off, _ = _serve(reference, [PROMPTS[2]] * 4, params, waves=False)
    assert [outputs[i] for i in ids] == off
    # the prompt's shared blocks were prefilled once: by the first copy alone, for the target and the drafter
    assert engine.prefix_cache_hits == 3 * 32
    assert reference.prefill_tokens - engine.prefill_tokens == 2 * engine.prefix_cache_hits


def test_generated_blocks_are_shared_while_their_request_runs(pair):
    """A's committed answer enters the index while A still runs (rejected drafts never do: only the tokens it
    outputs name a block); B, a turn that re-sends A's prompt and the first 24 tokens of A's answer, added while A
    still decodes, hits past A's prompt — and both give caching off's tokens. Negative control: the blocks B hits
    hold A's generated text, so a B whose text differs from A's answer in its last block hits less."""
    target, draft = pair
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=7)
    engine = Engine(target, draft, _config(True))
    outputs, finals = {}, {}
    first = engine.add_request(PROMPTS[0], params)
    while len(outputs.get(first, [])) < 30:
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert engine.has_unfinished() and engine.prefix_cache.num_cached_blocks > len(PROMPTS[0]) // 8
    turn = PROMPTS[0] + outputs[first][:24] + [4, 5]
    second = engine.add_request(turn, SamplingParams(temperature=0.0, max_new_tokens=8))
    _drain(engine, outputs, finals)
    assert finals[second].num_cached_tokens == (len(PROMPTS[0]) + 24) // 8 * 8 > len(PROMPTS[0]) // 8 * 8
    reference = Engine(target, draft, _config(False))
    off, _ = _serve(reference, [PROMPTS[0]], [params])
    assert outputs[first] == off[0]
    alone, _ = _serve(Engine(target, draft, _config(False)), [turn], [SamplingParams(temperature=0.0, max_new_tokens=8)])
    assert outputs[second] == alone[0]
    wrong = list(turn)
    wrong[len(PROMPTS[0]) + 20] += 1  # one token of the answer changed inside B's last hit block
    engine2 = Engine(target, draft, _config(True))
    engine2.add_request(PROMPTS[0], params)
    for _ in range(12):
        engine2.step()
    _, wrong_finals = _serve(engine2, [wrong], [SamplingParams(temperature=0.0, max_new_tokens=8)])
    assert wrong_finals[0].num_cached_tokens == (len(PROMPTS[0]) + 20) // 8 * 8


def test_a_stale_block_changes_the_output(pair):
    """Negative control: corrupt the values of one cached block; the next request hitting it decodes differently
    (the same run with the block intact gives caching off's tokens: `test_a_hit_gives_the_tokens_of_caching_off`)."""
    target = pair[0]
    params = [SamplingParams(temperature=0, max_new_tokens=16)]
    clean, _ = _serve(Engine(target, None, _config(True, num_draft_tokens=0)), PROMPTS[:2], params)
    engine = Engine(target, None, _config(True, num_draft_tokens=0))
    _serve(engine, PROMPTS[:1], params)
    block = sorted(engine.prefix_cache._hashes)[1]
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        engine.cache._values[:, block] = torch.randn(engine.cache._values[:, block].shape, generator=generator) * 5
    stale, finals = _serve(engine, PROMPTS[1:2], params)
    assert finals[0].num_cached_tokens == 32
    assert stale[0] != clean[1]


def test_a_stale_drafter_block_changes_the_drafts_not_the_greedy_tokens(pair):
    """Negative control for the drafter's share of a block: with its cached values corrupted, greedy tokens stay
    the target's (exactness) but the drafts change (fewer accepted), and seeded sampling's tokens change."""
    target, draft = pair

    def second(corrupt, temperature):
        engine = Engine(target, draft, _config(True))
        _serve(engine, PROMPTS[:1], [SamplingParams(temperature=temperature, max_new_tokens=16, seed=1)])
        if corrupt:
            blocks, values = sorted(engine.prefix_cache._hashes), engine.drafter.cache._values
            with torch.inference_mode():
                values[:, blocks] = torch.randn(values[:, blocks].shape, generator=torch.Generator().manual_seed(0)) * 5
        out, finals = _serve(engine, PROMPTS[1:2], [SamplingParams(temperature=temperature, max_new_tokens=30, seed=2)])
        assert finals[0].num_cached_tokens == 32
        return out[0], finals[0].stats.accepted_tokens

    (clean, accepted), (stale, stale_accepted) = second(False, 0.0), second(True, 0.0)
    assert clean == stale and stale_accepted < accepted
    assert second(False, 1.0)[0] != second(True, 1.0)[0]


@pytest.mark.parametrize("budget", [None, 32])
def test_a_tight_pool_evicts_and_preempts_and_the_tokens_stay(pair, budget):
    target, draft = pair
    params = [SamplingParams(temperature=0, max_new_tokens=30), SamplingParams(temperature=1.0, max_new_tokens=26,
                                                                              seed=5)]
    prompts = PROMPTS * 2
    roomy = Engine(target, draft, _config(False, max_batch_size=3, prefill_budget=budget))
    free_run, _ = _serve(roomy, prompts, params, waves=False)
    block = sum(PagedSlotCache.block_bytes(m, 8) for m in (roomy.model, roomy.drafter.model))
    engine = Engine(target, draft, _config(True, max_batch_size=3, prefill_budget=budget, kv_cache_memory=16 * block))
    tight, finals = _serve(engine, prompts, params, waves=False)
    assert tight == free_run
    assert engine.kv_cache_usage.num_preemptions > 0 and engine.prefix_cache_hits > 0
    assert engine.prefix_cache.evictions > 0


def _head(target, seed=1):
    from specdec.fast.head import HeadConfig
    from specdec.fast.model import LlamaShape
    from specdec.zoo.feature_head import TrainableHead

    head = TrainableHead(HeadConfig.for_target(LlamaShape.from_hf(target.config)), seed=seed)
    head.init_from(target)
    return head.to_feature_head()


def test_options():
    with pytest.raises(ValueError, match="enable_prefix_caching=True .* needs kv_layout='paged'"):
        EngineConfig(kv_layout="static", enable_prefix_caching=True)
    with pytest.raises(TypeError, match="enable_prefix_caching must be True, False or None"):
        EngineConfig(kv_layout="paged", enable_prefix_caching=1)
    # vLLM's default: on with the paged pool, off with the static layout
    assert EngineConfig(kv_layout="paged").enable_prefix_caching is True
    assert EngineConfig(kv_layout="static").enable_prefix_caching is False
    assert EngineConfig().enable_prefix_caching is (EngineConfig().kv_layout == "paged")  # (the default layout's)
    assert EngineConfig(kv_layout="paged", enable_prefix_caching=False).enable_prefix_caching is False


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_feature_head_hits_the_targets_features_and_its_own_cache(pair, temperature):
    """A feature head (EAGLE-style): the target's stored features and the head's own K/V live in the hit blocks, so
    a hit skips the target's prefill and the head's catch-up alike (its feed starts past the hit: fed tokens drop by
    twice the hits) and the tokens — greedy and seeded — are caching off's; the head's window before the hit is
    re-fed into copies, never into a shared block."""
    target = pair[0]
    head = _head(target)
    params = [SamplingParams(temperature=temperature, max_new_tokens=16 + 2 * i, seed=11 + i) for i in range(3)]
    reference = Engine(target, head, _config(False, max_draft_tokens=3))
    off, _ = _serve(reference, PROMPTS, params)
    engine = Engine(target, head, _config(True, max_draft_tokens=3))
    assert engine.prefix_cache is not None and engine.prefix_cache.refeed == engine.drafter.window == 4
    on, finals = _serve(engine, PROMPTS, params)
    assert on == off
    cached = [f.num_cached_tokens for f in finals]
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:3]) and cached[3] == 16
    assert reference.prefill_tokens - engine.prefill_tokens == 2 * engine.prefix_cache_hits
    assert engine.prefix_cache.copies + engine.prefix_cache.num_cached_blocks > 0


def test_a_stale_head_block_changes_the_drafts(pair):
    """Negative control for the head's share of a block: with the cached blocks' head K/V and stored features
    corrupted, greedy tokens stay the target's (exactness) but the head drafts differently — seeded sampling
    accepts another number of drafts: the hit's entries are the ones the head drafts from, not recomputed."""
    target = pair[0]
    head = _head(target)

    def second(corrupt, temperature):
        engine = Engine(target, head, _config(True, max_draft_tokens=3))
        _serve(engine, PROMPTS[:1], [SamplingParams(temperature=temperature, max_new_tokens=16, seed=1)])
        if corrupt:
            blocks, size = sorted(engine.prefix_cache._hashes), engine.kv_pool.block_size
            values, data = engine.drafter.cache._values, engine.state.feature_store.data
            generator = torch.Generator().manual_seed(0)
            with torch.inference_mode():
                values[:, blocks] = torch.randn(values[:, blocks].shape, generator=generator) * 5
                for b in blocks:
                    data[b * size : (b + 1) * size] = torch.randn(size, data.shape[1], generator=generator) * 5
        params = SamplingParams(temperature=temperature, max_new_tokens=30, seed=2)
        out, finals = _serve(engine, PROMPTS[1:2], [params])
        assert finals[0].num_cached_tokens == 32
        return out[0], finals[0].stats.accepted_tokens

    assert second(False, 0.0)[0] == second(True, 0.0)[0]
    assert second(False, 1.0) != second(True, 1.0)


def test_static_layout_has_no_prefix_cache(pair):
    static = Engine(pair[0], None, EngineConfig(max_batch_size=2, max_seq_len=64, kv_layout="static"))
    assert static.prefix_cache is None and static.prefix_cache_queries == static.prefix_cache_hits == 0


def test_a_forced_hash_collision_is_caught(pair, monkeypatch):
    """Negative control with the check that catches it: hashes forced to name a block by its position alone, so
    another text of the same length collides with every cached block. Each cached block's (parent hash, tokens)
    is compared at a hit: the collision is refused (counted) and the tokens are caching off's; with the comparison
    off (`verify = False`) the stale blocks are used and the output changes."""
    import hashlib

    from specdec.engine import prefix_cache

    def positional(parent, data):  # (block i's hash: the seed hashed i + 1 times, whatever its text)
        return hashlib.sha256(parent).digest()

    monkeypatch.setattr(prefix_cache, "_digest", positional)
    target = pair[0]
    params = [SamplingParams(temperature=0, max_new_tokens=16)]
    other = [(t * 5 + 1) % 61 + 2 for t in PROMPTS[1]]  # another text of PROMPTS[1]'s length
    off, _ = _serve(Engine(target, None, _config(False, num_draft_tokens=0)), [other], params)
    outputs = []
    for verify in (True, False):
        engine = Engine(target, None, _config(True, num_draft_tokens=0))
        engine.prefix_cache.verify = verify
        _serve(engine, PROMPTS[:1], params)
        got, finals = _serve(engine, [other], params)
        outputs.append((got[0], finals[0].num_cached_tokens, engine.prefix_cache.collisions))
    (checked, checked_hits, collisions), (unchecked, unchecked_hits, _) = outputs
    assert checked == off[0] and checked_hits == 0 and collisions == 1
    assert unchecked_hits == 32 and unchecked != off[0]


def test_weights_changed_in_place_clear_the_cache(make_llama):
    """Nothing cached survives a change of the weights (an adapter merged in place, a state dict loaded): the engine
    shares the model's weights, and the cache watches their version — the next admission finds the index cleared,
    so the repeated prompt is prefilled again and decodes (seeded) as a fresh engine on the new weights does. Negative
    control: with the watch off the blocks of the old weights hit (the tiny model's tokens happen not to change:
    `test_a_stale_block_changes_the_output` shows a stale block does change them)."""
    outputs = []
    for watch in (True, False):
        target = make_llama(0)
        params = [SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)]
        engine = Engine(target, None, _config(True, num_draft_tokens=0))
        if not watch:
            engine.prefix_cache.watch_weights = False
        _serve(engine, PROMPTS[:1], params)
        with torch.no_grad():
            for layer in target.model.layers:  # (the "adapter": the values every cached block holds change)
                layer.self_attn.v_proj.weight.mul_(-3.0)
        got, finals = _serve(engine, PROMPTS[:1], params)
        fresh, _ = _serve(Engine(target, None, _config(False, num_draft_tokens=0)), PROMPTS[:1], params)
        outputs.append((got[0], finals[0].num_cached_tokens, fresh[0], engine.prefix_cache.resets))
    (got, cached, fresh, resets), (_, stale_cached, _, stale_resets) = outputs
    assert cached == 0 and resets == 1 and got == fresh
    assert stale_cached == 32 and stale_resets == 0  # unwatched, the blocks of the old weights would be reused


def test_a_prompt_longer_than_the_pool_is_refused(pair):
    target, draft = pair
    roomy = Engine(target, draft, _config(False))
    block = sum(PagedSlotCache.block_bytes(m, 8) for m in (roomy.model, roomy.drafter.model))
    engine = Engine(target, draft, _config(True, kv_cache_memory=6 * block))
    with pytest.raises(ValueError, match=r"prompt length 60 \+ max_new_tokens 8 needs 10 KV blocks of 8 positions; "
                                         r"the pool holds \d+ \(raise kv_cache_memory"):
        engine.add_request(list(range(2, 62)), SamplingParams(max_new_tokens=8))
    assert not engine.has_unfinished() and engine.prefix_cache_queries == 0
