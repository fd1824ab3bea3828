"""`specdec.generate`'s runner (`decoding/route.py`), on a CPU as on CUDA: the engine by default — a fast family body
(Llama), the transformers backend (OPT) — and the eager loop only where the engine refuses (a torch.ao dynamically
quantized Llama: its activations are quantized per call, so a verify pass is not `generate`'s one-token steps),
one log line, the refusal remembered so the next call builds nothing."""

import logging

import pytest
import torch

import specdec
from specdec.decoding import route
from specdec.policy import FixedPolicy

PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


def greedy(model, drafter=None, **kw):
    return specdec.generate(model, PROMPTS, drafter, max_new_tokens=8, temperature=0, **kw).sequences


def engines_on(model) -> list:
    return [entry[1] for entry in model.__dict__.get("_specdec_engines", {}).values()]


@pytest.fixture
def refused(make_llama):
    """A model the engine refuses (torch.ao's dynamic int8 linears: the fast bodies cannot copy them, and the
    backend's self-check finds each call's activations quantized together)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        return torch.ao.quantization.quantize_dynamic(make_llama(3), {torch.nn.Linear}, dtype=torch.qint8).eval()


@pytest.fixture
def fresh_opt(opt):
    """An OPT of its own (the session's `opt` may hold an engine of an earlier test's call: no build, no log line)."""
    from transformers import OPTForCausalLM

    torch.manual_seed(1)
    return OPTForCausalLM(opt.config).eval()


def test_a_covered_model_and_a_backend_model_run_on_the_engine_on_a_cpu(llama, llama_draft, fresh_opt, caplog,
                                                                         monkeypatch):
    opt = fresh_opt
    monkeypatch.setattr("specdec.engine.build._noticed", set())
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert greedy(llama, llama_draft) == greedy(llama, llama_draft, engine="hf")
        assert greedy(opt) == greedy(opt, engine="hf")
    assert route.runner_for("auto", llama, llama_draft, 4) == "fast" == route.runner_for("auto", opt, None, 4)
    assert [type(e.model).__name__ for e in engines_on(opt)] == ["HFBackendModel"]
    assert any(type(e.model).__name__ == "FastLlama" for e in engines_on(llama))
    assert any("'opt' runs on the engine's transformers backend" in r.getMessage() for r in caplog.records)


def test_what_the_engine_refuses_runs_on_the_loop_once_said_and_never_rebuilt(refused, caplog, monkeypatch):
    monkeypatch.setattr("specdec.engine.build._noticed", set())
    from specdec.engine import generate as engine_generate

    calls = []
    real = engine_generate.engine_stream
    monkeypatch.setattr(engine_generate, "engine_stream", lambda *a, **k: calls.append(1) or real(*a, **k))
    with caplog.at_level(logging.WARNING, logger="specdec"):
        first = greedy(refused)
        again = greedy(refused)
    assert first == again == greedy(refused, engine="hf")
    assert len(calls) == 1 and route.runner_for("auto", refused, None, 4) == "hf"  # the refusal was kept
    assert [r.getMessage() for r in caplog.records if "eager transformers loop" in r.getMessage()] != []
    with pytest.raises(Exception, match="quantized"):
        greedy(refused, engine="fast")  # forced: the refusal is an error, not a fallback


def test_a_draft_length_policy_runs_on_the_engine(llama, llama_draft, refused):
    assert route.runner_for("auto", llama, llama_draft, FixedPolicy(3)) == "fast"
    assert route.runner_for("auto", llama, llama_draft, "heuristic") == "fast"
    assert route.runner_for("hf", llama, llama_draft, "heuristic") == "hf"
    assert greedy(llama, llama_draft, num_draft_tokens=FixedPolicy(3)) == greedy(llama, llama_draft, engine="hf")
    engine = [e for e in engines_on(llama) if e.drafter is not None]
    assert engine and all(e.policy.loop is None for e in engine)  # (the call's policy left the kept engine)
    assert greedy(refused, num_draft_tokens="heuristic") == greedy(refused, engine="hf")  # refused: the loop's


class _LoopOnly(specdec.Drafter):
    """A loop drafter whose propose takes anything (it would bind the engine's call, then need the loop's
    sampling arguments)."""

    vocab_size = 64

    def propose(self, *args, **kwargs):
        raise AssertionError("not called by this test")


def test_only_the_loop_drafters_written_for_both_runners_go_to_the_engine(llama):
    assert route.runner_for("auto", llama, specdec.PromptLookupDrafter(), 4) == "fast"
    assert route.runner_for("auto", llama, specdec.NGramDrafter(2), 4) == "fast"
    assert route.runner_for("auto", llama, _LoopOnly(), 4) == "hf"


@pytest.mark.parametrize("name", ["falcon", "gpt-oss", "xglm", "gpt-neox-japanese", "bloom-slow-but-exact"])
def test_families_the_loop_ran_before_the_backend_took_them_run_on_the_engine(name):
    """Falcon, XGLM, GPT-NeoX-Japanese and Bloom with `slow_but_exact` (through `fast.hf_adapters`) and gpt-oss
    (attention sinks) take the engine by default now, with transformers' greedy text."""
    from helpers import hf_greedy
    from hf_models import make

    target = make(name)
    assert greedy(target) == [hf_greedy(target, p, 8, []) for p in PROMPTS]
    assert engines_on(target) and route.runner_for("auto", target, None, 4) == "fast"
