"""N-gram tables and prefix caching on the engine's transformers backend (`fast/hf_backend.py`, OPT: a model no fast
family body covers). An n-gram drafter (fitted on the target's own texts: drafts accepted and rejected) keeps
transformers' greedy text, on the static slots and the paged pool, requests joining mid-flight; a request hitting
cached blocks of the paged pool gives the tokens it gives with caching off (greedy and seeded sampling, with a draft
model on the backend, whose K/V share the blocks, with an n-gram table, with no drafter), the hits skip prefill and
the books balance after every step. Negative controls: every n-gram draft accepted (no rollback) leaves
transformers' text; a cached block with corrupted K/V changes the next hit's tokens."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

from helpers import hf_greedy
from hf_models import make
from specdec import NGramDrafter
from specdec.engine import Engine, EngineConfig
from specdec.engine import greedy_commit, step_runner
from specdec.fast.hf_backend import HFBackendModel
from specdec.request import SamplingParams

NAME = "opt"
SYSTEM = [(7 * i + 3) % 61 + 2 for i in range(37)]  # a shared prefix of 37 tokens (4 blocks of 8, + 5)
PROMPTS = [SYSTEM + [5, 6, 7], SYSTEM + [8, 9], SYSTEM + [5, 6, 7, 10, 11], SYSTEM[:20]]
SHORT = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5, 3, 4, 5, 3, 9, 9, 9, 9, 9], list(range(20, 40))]
NEW = [12, 9, 14, 10]


@functools.lru_cache(maxsize=None)
def _models():
    return make(NAME), make(NAME, noise=0.1)


@functools.lru_cache(maxsize=None)
def _refs():
    target = _models()[0]
    return [hf_greedy(target, p, n, []) for p, n in zip(SHORT, NEW)]


def _ngram() -> NGramDrafter:
    """A bigram table of the target's own greedy texts: its drafts are often, not always, the target's tokens."""
    return NGramDrafter(2).fit([p + r for p, r in zip(SHORT, _refs())], 64)


def _drain(engine, outputs, finals):
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finals[out.request_id] = out
        if engine.kv_pool is not None:
            engine.kv_pool.check()  # the books balance after every step
        if engine.prefix_cache is not None:
            engine.prefix_cache.check()


def _joining(engine, prompts, news):
    """Requests added one per step, joining while others run → each request's tokens."""
    ids, outputs, pending = [], {}, list(zip(prompts, news))
    while pending or engine.has_unfinished():
        if pending:
            prompt, n = pending.pop(0)
            ids.append(engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=n)))
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    return [outputs[i] for i in ids]


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_an_ngram_table_keeps_the_greedy_text(layout):
    target, _ = _models()
    engine = Engine(target, _ngram(), EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3,
                                                   kv_layout=layout, block_size=8))
    assert isinstance(engine.model, HFBackendModel)
    assert _joining(engine, SHORT, NEW) == _refs()
    stats = engine.stats
    assert stats.drafted_tokens > stats.accepted_tokens > 0  # drafts accepted, and rejected (rolled back)


def test_negative_control_accepting_every_ngram_draft_fails(monkeypatch):
    """Every draft kept (the rejected ones' K/V and tokens not rolled back): not transformers' text."""
    def accept_all(verify):
        def accepted(drafts, logits, draft_lengths=None, **kw):
            result = verify(drafts, logits, draft_lengths=draft_lengths, **kw)
            full = torch.full_like(result.num_accepted, drafts.shape[1]) if draft_lengths is None else draft_lengths
            return replace(result, num_accepted=full.to(result.num_accepted.dtype))
        return accepted

    for module in (greedy_commit, step_runner):
        monkeypatch.setattr(module, "verify_greedy", accept_all(module.verify_greedy))
    engine = Engine(_models()[0], _ngram(), EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=3))
    assert _joining(engine, SHORT, NEW) != _refs()


def _config(caching, **kw):
    kw = dict(dict(max_batch_size=2, max_seq_len=128, num_draft_tokens=3, block_size=8), **kw)
    return EngineConfig(kv_layout="paged", enable_prefix_caching=caching, **kw)


def _serve(engine, prompts, params):
    """Prompts one after another, each once the last finished (so later ones can hit) → tokens, final outputs."""
    outputs, finals, ids = {}, {}, []
    for i, prompt in enumerate(prompts):
        ids.append(engine.add_request(prompt, params[i % len(params)]))
        _drain(engine, outputs, finals)
    return [outputs[i] for i in ids], [finals[i] for i in ids]


@pytest.mark.parametrize("drafter", ["model", "ngram", None])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_hit_gives_the_tokens_of_caching_off(drafter, temperature):
    target, draft = _models()
    draft = {"model": draft, "ngram": NGramDrafter(2).fit(PROMPTS, 64), None: None}[drafter]
    params = [SamplingParams(temperature=temperature, max_new_tokens=16 + 2 * i, seed=11 + i) for i in range(3)]
    gamma = dict(num_draft_tokens=3) if drafter else dict(num_draft_tokens=0)
    reference = Engine(target, draft, _config(False, **gamma))
    off, _ = _serve(reference, PROMPTS, params)
    engine = Engine(target, draft, _config(True, **gamma))
    assert isinstance(engine.model, HFBackendModel)
    if drafter == "model":
        assert isinstance(engine.drafter.model, HFBackendModel)
    on, finals = _serve(engine, PROMPTS, params)
    assert on == off
    if temperature == 0:
        assert on[:3] == [hf_greedy(target, p, 16 + 2 * i, []) for i, p in enumerate(PROMPTS[:3])]
    # the hits were fed to neither model: the target's prefill and the draft model's feed both skip them
    fed = 2 if drafter == "model" else 1
    assert reference.prefill_tokens - engine.prefill_tokens == engine.prefix_cache_hits * fed
    cached = [f.num_cached_tokens for f in finals]
    assert cached[0] == 0 and all(c >= 32 for c in cached[1:3]) and cached[3] == 16
    assert engine.prefix_cache_hits == sum(cached)
    assert engine.kv_cache_usage.num_free_blocks == engine.kv_cache_usage.num_blocks  # (cached blocks are free)


def test_negative_control_a_stale_block_changes_the_output():
    """Corrupt the values of one cached block of the backend's pool: the next request hitting it decodes
    differently (intact, the same run gives caching off's tokens: `test_a_hit_gives_the_tokens_of_caching_off`)."""
    target = _models()[0]
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
