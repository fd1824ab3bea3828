"""Speculative beam search on the engine's transformers backend (`engine/beam.py` over `fast/hf_backend.py`): on
models no fast family body covers (OPT, Mixtral, Qwen2-MoE, Falcon, Phi, Bloom's ALiBi under the tree mask) the
engine's beam groups give transformers' `generate(num_beams=w, do_sample=False)` beams and scores, with a draft model
(on the backend too) and without, over the static slots and the paged pool (forks by table, reorders as table edits,
copy-on-write: the books checked after every step); `specdec.beam_search` takes the engine for them by default and
the loop only where the engine refuses (the build: torch.ao's dynamic int8; beams: sliding-window layers), with one log
line. Negative controls: beams re-gathered without their K/V, or a dropped length penalty, fail the comparison."""

from __future__ import annotations

import functools
import logging

import pytest

import specdec
from helpers import hf_beams
from hf_models import REFUSED, make
from specdec.engine import Engine, EngineConfig, UnsupportedModel
from specdec.engine import beam as engine_beam
from specdec.engine import beam_slots
from specdec.engine.beam import BeamParams
from specdec.fast.hf_backend import HFBackendModel
from specdec.request import SamplingParams
from specdec.search import beam_rules

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [3, 4, 5, 3, 4]]
N = 10
EOS = (7,)
ARCHS = ["opt", "mixtral", "qwen2-moe", "falcon", "phi", "bloom"]
LAYOUTS = ["static", "paged"]


@functools.lru_cache(maxsize=None)
def _models(name: str):
    return make(name), make(name, noise=0.1)  # the draft: the target moved a little (accepts and rejects)


@functools.lru_cache(maxsize=None)
def _hf(name: str, prompt: tuple, w: int, eos: tuple, length_penalty: float = 1.0):
    return hf_beams(_models(name)[0], prompt, w, eos, N, length_penalty, False)


def run_beams(target, draft, beams: BeamParams, eos=EOS, layout="paged", max_batch=9):
    """The prompts as beam requests of one engine (the paged pool's books checked after every step) → the engine
    and its `BeamOutput`s in prompt order."""
    engine = Engine(target, draft, EngineConfig(max_batch_size=max_batch, max_seq_len=64, kv_layout=layout,
                                                block_size=8, max_tree_nodes=13))
    params = SamplingParams(temperature=0, max_new_tokens=N, eos_token_ids=eos)
    ids = [engine.add_request(p, params, beams=beams) for p in PROMPTS]
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        if engine.kv_pool is not None:
            engine.kv_pool.check()
    if engine.kv_pool is not None:
        assert engine.kv_cache_usage.num_used_blocks == 0
    return engine, [finals[i] for i in ids]


def assert_transformers_beams(name, outs, w, eos=EOS, length_penalty=1.0):
    for prompt, out in zip(PROMPTS, outs):
        ref_beams, ref_scores = _hf(name, tuple(prompt), w, tuple(eos), length_penalty)
        assert [list(b) for b in out.beams] == ref_beams, name
        assert list(out.beam_scores) == pytest.approx(ref_scores, abs=1e-4), name


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ARCHS)
def test_speculative_beams_on_the_backend_equal_transformers(name, layout):
    target, draft = _models(name)
    engine, outs = run_beams(target, draft, BeamParams(3, 4, 3, num_return_sequences=3), layout=layout)
    assert isinstance(engine.model, HFBackendModel) and isinstance(engine.drafter.model, HFBackendModel)
    assert_transformers_beams(name, outs, 3)
    drafted = sum(o.beam_stats.draft_nodes for o in outs)
    passes, steps = (sum(getattr(o.beam_stats, f) for o in outs) for f in ("passes", "beam_steps"))
    assert drafted > 0 and steps > passes > steps / 4  # drafts accepted (fewer passes) and rejected (γ = 3)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ARCHS)
def test_plain_beams_on_the_backend_equal_transformers(name, layout):
    target, _ = _models(name)
    engine, outs = run_beams(target, None, BeamParams(4, num_return_sequences=4), eos=(), layout=layout)
    assert isinstance(engine.model, HFBackendModel)
    assert_transformers_beams(name, outs, 4, eos=())
    assert all(o.beam_stats.passes == N and o.beam_stats.draft_nodes == 0 for o in outs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_length_penalty_on_the_backend(layout):
    target, draft = _models("mixtral")
    _, outs = run_beams(target, draft, BeamParams(3, 4, 2, length_penalty=2.0, num_return_sequences=3),
                        eos=(7, 20), layout=layout)
    assert_transformers_beams("mixtral", outs, 3, eos=(7, 20), length_penalty=2.0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_negative_control_beams_reordered_without_their_kv_fail(monkeypatch, layout):
    """A reorder that moves the beams' lengths and tree state but leaves their K/V where they were (no slot copy,
    no table edit): the beams are no longer transformers'."""
    def lengths_only(self, index):
        self.cache.lengths.copy_(self.cache.lengths.index_select(0, index))
        if self.in_tree:
            self._base, self._depths, self._bits = self._base[index], self._depths[index], self._bits[index]

    monkeypatch.setattr(beam_slots.SlotTreeLM, "select_rows", lengths_only)
    target, draft = _models("opt")
    _, outs = run_beams(target, draft, BeamParams(3, 4, 3, num_return_sequences=3), layout=layout)
    with pytest.raises(AssertionError):
        assert_transformers_beams("opt", outs, 3)


def test_negative_control_a_dropped_length_penalty_fails(monkeypatch):
    monkeypatch.setattr(engine_beam, "BeamConfig", lambda w, n, eos, lp, es: beam_rules.BeamConfig(w, n, eos, 0.0, es))
    target, draft = _models("mixtral")
    _, outs = run_beams(target, draft, BeamParams(3, 4, 2, length_penalty=2.0, num_return_sequences=3), eos=(7, 20))
    with pytest.raises(AssertionError):
        assert_transformers_beams("mixtral", outs, 3, eos=(7, 20), length_penalty=2.0)


def _no_loop(monkeypatch):
    import specdec.search.beam as loop_beam

    def refuse(*args, **kwargs):
        raise AssertionError("the loop's beam search ran")

    monkeypatch.setattr(loop_beam, "beam_search", refuse)


@pytest.mark.parametrize("name", ["opt", "falcon"])
def test_beam_search_takes_the_engine_for_a_backend_model(monkeypatch, name):
    """`specdec.beam_search`'s default ("auto") runs a backend model's beams on the engine (the loop is not called):
    one search per prompt (the loop batches the prompts: its first pass alone counts 3 prompt passes)."""
    target, draft = _models(name)
    _no_loop(monkeypatch)
    for drafter, kw in [(draft, dict(draft_beams=4, num_draft_tokens=3)), (None, {})]:
        res = specdec.beam_search(target, PROMPTS, drafter, num_beams=2, max_new_tokens=N, eos_token_id=list(EOS),
                                  **kw)
        for prompt, beams, scores in zip(PROMPTS, res.sequences, res.scores):
            ref_beams, ref_scores = _hf(name, tuple(prompt), 2, EOS)
            assert beams == ref_beams and scores == pytest.approx(ref_scores, abs=1e-4)
        assert res.stats.passes == res.stats.prompt_passes


def test_what_the_engine_refuses_takes_the_loop_with_one_log_line(caplog, monkeypatch):
    """GPT-Neo (local windows: the engine runs its chains, not tree passes) and an OPT under torch.ao's dynamic int8
    (the build refuses it: each call's activations quantized together) run their beams on the loop under "auto" — one warning line, the refusal kept
    on the model (a second call neither tries the engine nor logs) — and raise `UnsupportedModel` under
    engine="fast"."""
    import warnings

    import torch

    from specdec.engine import beam_run, build

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        refused = torch.ao.quantization.quantize_dynamic(make("opt"), {torch.nn.Linear}, dtype=torch.qint8).eval()
    tried, run = [], beam_run.engine_beam_search

    def counted(*args, **kwargs):
        tried.append(1)
        return run(*args, **kwargs)

    monkeypatch.setattr(beam_run, "engine_beam_search", counted)
    for model, words in [(make("gpt-neo"), "sliding-window"), (refused, "quantiz")]:
        monkeypatch.setattr(build, "_noticed", set())
        kw = dict(num_beams=2, max_new_tokens=6, eos_token_id=[])
        ref = hf_beams(model, tuple(PROMPTS[0]), 2, (), 6, 1.0, False)[0]
        with pytest.raises(UnsupportedModel, match=words):
            specdec.beam_search(model, PROMPTS[:1], engine="fast", **kw)
        caplog.clear()
        tried.clear()
        with caplog.at_level(logging.WARNING, logger="specdec.engine.build"):
            first = specdec.beam_search(model, PROMPTS[:1], **kw)
            second = specdec.beam_search(model, PROMPTS[:1], **kw)
        assert first.sequences[0] == second.sequences[0] == ref
        assert len(tried) == 1  # the second call went straight to the loop
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and words in lines[0] and "eager transformers loop" in lines[0], lines


def test_a_fast_body_and_a_backend_model_share_one_beam_search(monkeypatch):
    """A Llama target (a fast family body) with an OPT draft model (the backend), and the other way round: the
    engine runs the pair (the loop is not called), transformers' beams."""
    _no_loop(monkeypatch)
    for target, draft in [(make("llama"), make("opt")), (make("opt"), make("llama"))]:
        res = specdec.beam_search(target, PROMPTS, draft, num_beams=2, draft_beams=4, num_draft_tokens=2,
                                  max_new_tokens=N, eos_token_id=[])
        assert res.sequences == [hf_beams(target, tuple(p), 2, (), N, 1.0, False)[0] for p in PROMPTS]
