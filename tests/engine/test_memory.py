"""The engine's buffers are counted before anything is allocated: a size the device cannot hold is refused in one
line naming the options (with a made-up free memory), a size that fits loads, and the count is each buffer's bytes
(the static layout's slots; the paged pool is sized within free memory: tests/engine/test_engine_paged.py)."""

import pytest
import torch

from specdec.engine import Engine, EngineConfig
from specdec.engine import memory as engine_memory
from specdec.engine.memory import EngineMemory, available_memory, check_fits


def _free(monkeypatch, nbytes):
    monkeypatch.setattr(engine_memory, "available_memory", lambda device: nbytes)


def test_a_size_past_free_memory_is_refused_before_allocating(make_llama, monkeypatch):
    target = make_llama(0)
    allocated = []
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: allocated.append(a) or zeros(*a, **k))
    _free(monkeypatch, 1 << 20)  # 1 MiB
    with pytest.raises(ValueError, match=r"max_batch_size=64 \(--max-batch-size\).*max_seq_len.*need.*available") \
            as err:
        Engine(target, make_llama(1), EngineConfig(max_batch_size=64, max_seq_len=256, kv_layout="static"))
    assert "\n" not in str(err.value)
    big = [a for a in allocated if a and isinstance(a[0], tuple) and len(a[0]) == 5]
    assert big == []  # no K/V cache was allocated (the refusal came first)


def test_a_size_that_fits_loads_and_reports_its_bytes(make_llama, monkeypatch):
    target, draft = make_llama(0), make_llama(1)
    _free(monkeypatch, 1 << 40)  # negative control of the refusal: the same engine with memory to spare
    engine = Engine(target, draft, EngineConfig(max_batch_size=4, max_seq_len=64, kv_layout="static"))
    m = engine.memory
    assert m.target_kv == engine.cache.keys.numel() * 4 * 2 == engine.cache.nbytes
    assert m.drafter_kv == engine.drafter.cache.nbytes > 0
    assert engine.kv_cache_bytes == m.target_kv + m.drafter_kv
    s = engine.model.shape
    assert engine.cache.keys.shape == (s.n_layers, 4, s.n_kv_heads, engine.num_positions, s.head_dim)


def test_the_refusal_counts_every_part():
    memory = EngineMemory(target_kv=600, drafter_kv=300, features=100, state=24)
    check_fits(memory, torch.device("cpu"), 8, 64, available=lambda d: 1024)  # exactly enough
    with pytest.raises(ValueError, match=r"1024 bytes: target KV .*drafter KV.*features.*slot state.*1023 bytes"):
        check_fits(memory, torch.device("cpu"), 8, 64, available=lambda d: 1023)
    check_fits(memory, torch.device("cpu"), 8, 64, available=lambda d: None)  # unknown: not checked


def test_available_memory_reads_the_host():
    free = available_memory(torch.device("cpu"))
    assert free is not None and 0 < free
