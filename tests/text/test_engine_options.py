"""`specdec.load(..., **engine options)`: EngineConfig's fields by name (`text/options.py`) — an unknown name refused
naming it before anything loads, sizes written for people, the paged pool sized by `kv_cache_memory` (a tiny pool
preempts and the tokens stay the roomy pool's), the eager loop refusing what it cannot honour."""

from dataclasses import fields

import pytest

import specdec
from specdec.engine import EngineConfig
from specdec.engine.kv_pool import PagedSlotCache
from specdec.text.options import (ENTRY_DEFAULTS, LOOP_OPTIONS, check_engine_options, engine_config,
                                  engine_option_names, loop_refusal, parse_memory)

PROMPTS = ["w1 w2 w3 w1 w2 w3 w4", "w4 w5 w6 w4 w5", "w2 w2 w3 w3 w1 w2", "w7 w1 w7 w1 w7 w1 w7"]


@pytest.mark.parametrize("text, value", [
    ("4GiB", 4 << 30), ("512MiB", 512 << 20), ("512 MiB", 512 << 20), ("2G", 2 * 10**9), ("2GB", 2 * 10**9),
    ("64KiB", 64 << 10), ("1073741824", 1 << 30), ("1.5GiB", 3 << 29), ("0.5", 0.5), ("1.0", 1.0),
    (1 << 20, 1 << 20), (0.25, 0.25), (None, None),
])
def test_sizes_parse(text, value):
    assert parse_memory(text) == value and type(parse_memory(text)) is type(value)


@pytest.mark.parametrize("text", ["lots", "4 GiBs", "-1GiB", "0", "1.5", "0.5b", "", "4XiB"])
def test_bad_sizes_are_refused_naming_the_argument(text):
    with pytest.raises(ValueError, match="kv_cache_memory"):
        engine_config(check_engine_options({"kv_cache_memory": text}))


def test_every_config_field_is_an_option_and_the_entry_defaults_are_fields():
    names = {f.name for f in fields(EngineConfig)}
    assert set(engine_option_names()) == names - {"num_draft_tokens"}
    assert set(ENTRY_DEFAULTS) <= names and set(LOOP_OPTIONS) <= names
    config = engine_config(check_engine_options({"kv_cache_memory": "8MiB", "block_size": 8}), 3)
    assert (config.kv_cache_memory, config.block_size, config.max_batch_size, config.num_draft_tokens,
            config.max_draft_tokens) == (8 << 20, 8, ENTRY_DEFAULTS["max_batch_size"], 3, 8)
    assert engine_config({}, 12).max_draft_tokens == 12


def test_loop_refusal_names_the_first_option_it_cannot_honour():
    assert loop_refusal({"max_batch_size": 4, "max_seq_len": 64, "bitwise": False, "model_impl": "auto"}) is None
    assert "block_size=8" in loop_refusal({"max_batch_size": 4, "block_size": 8})
    assert "enable_prefix_caching=True" in loop_refusal({"enable_prefix_caching": True})


@pytest.fixture
def no_loading(monkeypatch):
    import specdec.loading

    def refuse(*args, **kwargs):
        raise AssertionError("loaded before the error")

    monkeypatch.setattr(specdec.loading, "load_model", refuse)
    monkeypatch.setattr(specdec.loading, "load_tokenizer", refuse)


@pytest.mark.parametrize("options, error, fragment", [
    ({"kv_cache_memroy": "4GiB"}, TypeError, "unknown engine option 'kv_cache_memroy'"),
    ({"kv_cache_memory": "lots"}, ValueError, "kv_cache_memory"),
    ({"kv_cache_memory": 1.5}, ValueError, "kv_cache_memory"),
    ({"block_size": 24}, ValueError, "block_size"),
    ({"max_batch_size": 100000}, ValueError, "max_batch_size"),
    ({"kv_layout": "static", "kv_cache_memory": 1 << 20}, ValueError, "kv_cache_memory"),
])
def test_load_refuses_a_bad_option_before_loading(ckpt, no_loading, options, error, fragment):
    with pytest.raises(error, match=fragment):
        specdec.load(ckpt / "target", **options)


def test_the_loop_refuses_an_engine_option_before_loading(ckpt, no_loading):
    with pytest.raises(ValueError, match="kv_cache_memory"):
        specdec.load(ckpt / "target", runner="fallback", kv_cache_memory="1GiB")


def test_options_reach_the_engine(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=2, max_batch_size=3,
                      kv_cache_memory="4MiB", block_size=8) as llm:
        engine = llm.runner()
        assert (engine.config.kv_cache_memory, engine.config.block_size, engine.max_batch) == (4 << 20, 8, 3)
        assert llm.engine_options == {"max_batch_size": 3, "kv_cache_memory": 4 << 20, "block_size": 8}
        assert engine.kv_cache_bytes <= 4 << 20


def _block_bytes(engine) -> int:
    models = [engine.model] + ([engine.drafter.model] if engine.drafter_cached else [])
    return sum(PagedSlotCache.block_bytes(m, engine.config.block_size) for m in models)


def test_a_tiny_pool_preempts_through_load_and_the_tokens_stay_the_roomy_pools(ckpt):
    """Four requests of ~7 blocks each (block_size 4: prompt + 12 tokens + a step's margin) over 9 usable blocks: the
    engine preempts (recompute), never fails, and every request's greedy tokens are those of a roomy pool."""
    common = dict(draft=ckpt / "draft", num_draft_tokens=2, max_batch_size=4, max_seq_len=64, block_size=4)
    with specdec.load(ckpt / "target", **common) as roomy:
        want = [c.token_ids for c in roomy.generate(PROMPTS, max_new_tokens=12, temperature=0)]
        block = _block_bytes(roomy.runner())
        assert roomy.runner().kv_cache_usage.num_preemptions == 0
    with specdec.load(ckpt / "target", kv_cache_memory=10 * block, **common) as tiny:
        engine = tiny.runner()
        got = [c.token_ids for c in tiny.generate(PROMPTS, max_new_tokens=12, temperature=0)]
        usage = engine.kv_cache_usage
        assert usage.num_blocks == 9 and usage.num_preemptions > 0  # (the null block is the tenth)
        assert got == want
