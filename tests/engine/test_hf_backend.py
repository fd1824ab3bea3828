"""The transformers backend (`fast/hf_backend.py`): every architecture of `hf_models.MATRIX` runs in the engine with
its own modules, and its greedy text is transformers' `generate(do_sample=False)`, alone and under continuous
batching (requests joining mid-flight, mixed lengths, the static and the paged cache), with speculation on (prompt
lookup; a draft model sharing the vocabulary, on the backend too); seeded sampling gives a request the same tokens
alone and in a batch; a backend whose attention ignores the cache, or writes K/V one slot off, fails the same
comparison; attention sinks (gpt-oss), ALiBi biases (Falcon-RW, Bloom, MPT), per-layer local windows (GPT-Neo) and
XGLM's query scaling are honoured — dropping one fails both the comparison and the backend's self-check;
architectures whose attention cannot be plugged in are refused by name."""

from __future__ import annotations

import logging

import pytest
import torch

import specdec
from helpers import hf_greedy
from hf_models import BACKEND, EXTRAS, MATRIX, NEW, PROMPTS, REFUSED, make, run
from specdec.engine import Engine, EngineConfig, UnsupportedModel
from specdec.fast import hf_adapters, hf_backend, hf_engine_attention
from specdec.fast.cache import KVCache, PagedKVCache
from specdec.fast.hf_backend import HFBackendModel, UnsupportedArchitecture
from specdec.request import SamplingParams

@pytest.fixture(scope="module", params=sorted(MATRIX))
def arch(request):
    name = request.param
    target = make(name)
    return name, target, [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)]


def test_alone_equals_transformers(arch):
    """One request at a time on a paged pool, prompt lookup drafting: transformers' greedy text."""
    name, target, refs = arch
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=1, kv_layout="paged",
                                                                        block_size=8, **BACKEND))
    assert isinstance(engine.model, HFBackendModel)
    for prompt, new, ref in zip(PROMPTS, NEW, refs):
        assert run(engine, [prompt], [new]) == [ref], name


def test_continuous_batching_with_a_draft_model(arch):
    """Four requests of mixed lengths joining one per step into two slots (slot moves, refills), a draft model on the
    backend too (the target moved a little): every text is transformers' own, and drafts were accepted and
    rejected."""
    name, target, refs = arch
    draft = make(name, noise=0.3)
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, **BACKEND))
    assert isinstance(engine.drafter.model, HFBackendModel)
    assert run(engine, PROMPTS, NEW) == refs, name
    stats = engine.stats
    assert stats.drafted_tokens > stats.accepted_tokens > 0, name  # speculation ran, and rolled back


@pytest.mark.parametrize("name", ["opt", "mixtral"])
def test_seeded_sampling_alone_equals_in_a_batch(name):
    """A sampled request's tokens depend on its prompt, parameters and seed only: alone = with three others."""
    target = make(name)
    params = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=1)
    seeds = [11, 12, 13, 14]
    batched = run(Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=4, **BACKEND)),
                  PROMPTS, NEW, params, seeds)
    alone = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=1, **BACKEND))
    for i in range(len(PROMPTS)):
        assert run(alone, [PROMPTS[i]], [NEW[i]], params, [seeds[i]]) == [batched[i]]
    assert len({tuple(t) for t in batched}) == len(batched) and any(len(set(t)) > 2 for t in batched)


@pytest.mark.parametrize("name", ["olmo", "bloom", "mpt"])
def test_token_trees_keep_the_greedy_text(name):
    """Draft trees verified in one forward (an ALiBi bias under the tree mask too; the engine refuses trees on
    targets with sliding-window layers, gpt-oss's and GPT-Neo's included)."""
    target, draft = make(name), make(name, noise=0.3)
    for prompt, new in zip(PROMPTS[:2], NEW):
        assert _tree_text(target, draft, prompt, new) == hf_greedy(target, prompt, new, []), name


def _tree_text(target, draft, prompt, new) -> list[int]:
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, **BACKEND))
    params = SamplingParams(temperature=0, max_new_tokens=new, draft_tree=(2, 2))
    rid, out = engine.add_request(prompt, params), []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    return out


def test_negative_control_alibi_by_slot_under_a_tree_fails(monkeypatch):
    """A tree's nodes sit at slots past their positions: an ALiBi bias read by slot (not by the key's position)
    gives MPT another text."""
    target, draft = make("mpt"), make("mpt", noise=0.3)
    monkeypatch.setattr(hf_engine_attention, "_key_bias", lambda alibi, span, step: alibi(span))
    assert any(_tree_text(target, draft, p, n) != hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW))


def _broken(monkeypatch, how: str) -> None:
    if how == "ignores the cache":  # each query attends to its own token only
        real = hf_engine_attention.slot_attention

        def own_token(q, keys, values, positions, scale, **kw):
            return real(q, keys, values, positions, scale, window=1, softcap=kw.get("softcap"), kernel="reference",
                        block_table=kw.get("block_table"))

        monkeypatch.setattr(hf_engine_attention, "slot_attention", own_token)
        monkeypatch.setattr(hf_engine_attention, "causal_prefix_attention",
                            lambda q, keys, values, scale: own_token(q, keys, values, torch.arange(
                                q.shape[1]).expand(q.shape[0], -1), scale))
    else:  # K/V written one slot past where the model reads them
        for cls in (KVCache, PagedKVCache):  # (whichever layout the engine runs)
            real = cls.write_index
            monkeypatch.setattr(cls, "write_index", lambda self, slots, real=real: real(self, (slots + 1).clamp(
                max=self.span - 1)))


@pytest.mark.parametrize("name", ["mixtral", "falcon"])
@pytest.mark.parametrize("how", ["ignores the cache", "writes one slot off"])
def test_negative_control_a_broken_attention_fails(monkeypatch, how, name):
    """The same comparison as above catches an attention that does not use the engine's cache properly (through the
    attention interface, Mixtral; through an adapter, Falcon)."""
    target = make(name)
    refs = [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)]
    HFBackendModel(target)  # (built before the breakage: its self-check would refuse it)
    _broken(monkeypatch, how)
    monkeypatch.setattr(HFBackendModel, "_self_check", lambda self, model_type: None)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert run(engine, PROMPTS, NEW) != refs


def _drop(monkeypatch, what: str) -> None:
    """The engine's attention ignores `what` the model passes ("sinks", "alibi" or "window")."""
    real = hf_engine_attention.engine_attention
    names = {"sinks": ("s_aux", "sinks"), "alibi": ("alibi",), "window": ("sliding_window",)}[what]

    def without(*args, **kwargs):
        return real(*args, **{k: v for k, v in kwargs.items() if k not in names})

    monkeypatch.setattr(hf_engine_attention, "engine_attention", without)  # (the registry and the adapters call it by name)


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_negative_control_dropping_what_the_attention_adds_fails(monkeypatch, name):
    """Sinks, an ALiBi bias or a local window ignored: the backend's self-check refuses the model, and with the
    self-check off the engine's greedy text is not transformers'."""
    target = make(name)
    refs = [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)]
    _drop(monkeypatch, EXTRAS[name])
    with pytest.raises(UnsupportedArchitecture, match="other logits through the engine's attention"):
        HFBackendModel(target)
    monkeypatch.setattr(HFBackendModel, "_self_check", lambda self, model_type: None)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert run(engine, PROMPTS, NEW) != refs, name


def test_negative_control_xglm_without_its_query_scaling_fails(monkeypatch):
    """XGLM's adapter scales the query by 1/√d before the product, as its module does: undone, the self-check refuses
    the model, and with the self-check off the engine's greedy text is not transformers'."""
    target = make("xglm")
    refs = [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)]
    real = hf_adapters._attend
    monkeypatch.setattr(hf_adapters, "_attend", lambda module, q, *a, **kw: real(module, q / module.scaling, *a, **kw))
    with pytest.raises(UnsupportedArchitecture, match="other logits through the engine's attention"):
        HFBackendModel(target)
    monkeypatch.setattr(HFBackendModel, "_self_check", lambda self, model_type: None)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert run(engine, PROMPTS, NEW) != refs


def test_adapted_modules_keep_their_own_forward_outside_the_engine():
    """The adapters (`fast.hf_adapters`) stand in for the attention modules' forward during engine forwards only."""
    target = make("falcon-alibi")
    engine = Engine(target, None, EngineConfig(max_batch_size=1, model_impl="transformers"))
    run(engine, PROMPTS[:1], NEW[:1])
    assert all("forward" not in vars(m) for m in target.modules())
    assert target.config._attn_implementation == "sdpa"
    attention = target.transformer.h[0].self_attention
    attention.forward = hooked = attention.forward  # an instance's own forward (as an accelerate hook sets one)
    run(engine, PROMPTS[:1], NEW[:1])
    assert vars(attention)["forward"] is hooked
    assert hf_greedy(target, PROMPTS[0], NEW[0], []) == run(engine, PROMPTS[:1], NEW[:1])[0]


def test_the_self_check_refuses_what_the_engine_computes_differently(monkeypatch):
    _broken(monkeypatch, "writes one slot off")
    with pytest.raises(UnsupportedArchitecture, match="other logits through the engine's attention"):
        HFBackendModel(make("olmo"))


def test_the_self_check_compares_with_the_models_eager_attention(caplog):
    """Gemma 2 configured with sdpa: transformers' sdpa drops its attention softcap (5.17) or refuses it (5.24), so
    the self-check's reference is the eager attention (what the model computes) — the backend is built, its text is
    the eager model's, and the model's own setting is left as it was."""
    target = make("gemma2-softcap-window")
    eager = hf_greedy(target, PROMPTS[0], NEW[0], [])
    target.config._attn_implementation_internal = "sdpa"
    with caplog.at_level(logging.DEBUG, logger=hf_backend.__name__):
        engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert "self-check is skipped" not in caplog.text  # (it ran)
    assert run(engine, PROMPTS[:1], NEW[:1])[0] == eager
    assert target.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_architectures_without_the_attention_interface_are_refused(name):
    build, words = REFUSED[name]
    with pytest.raises(UnsupportedModel, match=words):
        Engine(build().eval(), None, EngineConfig(max_batch_size=1, model_impl="transformers"))


def test_model_impl_routes_and_names_the_backend(caplog, make_llama):
    opt, llama = make("opt"), make_llama(0)
    with pytest.raises(UnsupportedModel, match="model_type"):
        Engine(opt, None, EngineConfig(max_batch_size=1, model_impl="fast"))
    hf_backend_logger = "specdec.engine.build"
    with caplog.at_level(logging.INFO, logger=hf_backend_logger):
        auto = Engine(opt, None, EngineConfig(max_batch_size=1))
    assert isinstance(auto.model, HFBackendModel)
    lines = [r.getMessage() for r in caplog.records if "transformers backend" in r.getMessage()]
    assert len(lines) == 1 and "'opt'" in lines[0]
    assert not isinstance(Engine(llama, None, EngineConfig(max_batch_size=1)).model, HFBackendModel)
    assert isinstance(Engine(llama, None, EngineConfig(max_batch_size=1, model_impl="transformers")).model,
                      HFBackendModel)
    with pytest.raises(ValueError, match="model_impl"):
        EngineConfig(model_impl="vllm")
    with pytest.raises(ValueError, match="bitwise"):
        Engine(opt, None, EngineConfig(max_batch_size=1, bitwise=True))


def test_the_model_keeps_its_own_attention_outside_the_engine():
    target = make("phi")
    before = target.config._attn_implementation
    engine = Engine(target, None, EngineConfig(max_batch_size=1, model_impl="transformers"))
    run(engine, PROMPTS[:1], NEW[:1])
    assert target.config._attn_implementation == before
    assert hf_greedy(target, PROMPTS[0], NEW[0], []) == run(engine, PROMPTS[:1], NEW[:1])[0]


def test_peft_lora_model():
    peft = pytest.importorskip("peft", reason="peft is not installed in this environment")
    target = make("opt")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(target, config)
    merged_ref = [hf_greedy(lora, p, n, []) for p, n in zip(PROMPTS, NEW)]
    engine = Engine(lora.base_model.model, None, EngineConfig(max_batch_size=2, **BACKEND))
    assert run(engine, PROMPTS, NEW) == merged_ref


def test_dynamically_quantized_model_is_refused_by_the_self_check():
    """torch.ao's dynamic int8 linears quantize each call's activations with one scale for the whole call, so a
    token's logits depend on what shares its forward (a verify pass ≠ generate's one-token steps): refused, not run
    inexactly."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = torch.ao.quantization.quantize_dynamic(make("llama"), {torch.nn.Linear}, dtype=torch.qint8).eval()
    with pytest.raises(UnsupportedModel, match="activations quantized per call"):
        Engine(target, None, EngineConfig(max_batch_size=1, model_impl="transformers"))


def test_load_takes_the_backend_for_an_uncovered_model(ckpt):
    """`specdec.load` serves an uncovered model on the engine's transformers backend, by default ("auto") as with
    model_impl="transformers"; the eager loop only when asked (runner="fallback"); the same greedy text."""
    target = make("opt")
    with specdec.load(target, tokenizer=ckpt / "target", model_impl="transformers") as backend, \
            specdec.load(target, tokenizer=ckpt / "target") as auto, \
            specdec.load(target, tokenizer=ckpt / "target", runner="fallback") as loop:
        assert (backend.runner_kind, auto.runner_kind, loop.runner_kind) == ("engine", "engine", "fallback")
        assert type(auto.runner().model).__name__ == "HFBackendModel"
        for prompt in ("w1 w2 w3", "w5 w5 w5 w5"):
            want = loop.generate(prompt, max_new_tokens=8).token_ids
            assert backend.generate(prompt, max_new_tokens=8).token_ids == want
            assert auto.generate(prompt, max_new_tokens=8).token_ids == want
    with pytest.raises(ValueError, match="model_impl"):
        specdec.load(target, tokenizer=ckpt / "target", model_impl="transformers", runner="fallback")


def test_backend_equals_the_fast_body_with_processors_and_logprobs(make_llama):
    """On a family both bodies run: the same tokens and log-probabilities under a repetition penalty, a logit bias
    and min_tokens, greedy and seeded (the engine's per-request processors act on the backend's logits unchanged)."""
    target = make("llama")
    params = [SamplingParams(temperature=0, max_new_tokens=10, repetition_penalty=1.3, logprobs=True,
                             logit_bias=((11, 2.0),)),
              SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=10, seed=5, min_tokens=4, eos_token_ids=(2,),
                             logprobs=True)]
    results = {}
    for impl in ("fast", "transformers"):
        engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, max_seq_len=64,
                                                                            num_draft_tokens=3, model_impl=impl))
        ids = {engine.add_request(PROMPTS[i], params[i]): i for i in range(2)}
        outs = {i: ([], []) for i in range(2)}
        while engine.has_unfinished():
            for out in engine.step():
                outs[ids[out.request_id]][0].extend(out.new_token_ids)
                outs[ids[out.request_id]][1].extend(out.logprobs or [])
        results[impl] = outs
    for i in range(2):
        assert results["fast"][i][0] == results["transformers"][i][0]
        torch.testing.assert_close(torch.tensor(results["fast"][i][1]), torch.tensor(results["transformers"][i][1]),
                                   atol=1e-4, rtol=0)


def test_the_speed_script_runs_on_a_tiny_model(tmp_path, capsys):
    """scripts/bench_hf_backend.py (the GPU comparison against the loop) on CPU: both arms, the same texts."""
    import json
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_hf_backend.py"
    out = tmp_path / "row.json"
    runpy.run_path(str(script))["main"](["--shape", "tiny", "--device", "cpu", "--requests", "3", "--new", "6",
                                         "--prompt-len", "8", "--repeats", "1", "--out", str(out)])
    row = json.loads(out.read_text())
    assert row["identical"] and row["tokens"] == 18 and row["engine_tok_s"] > 0 and row["loop_tok_s"] > 0


def test_a_backend_target_with_a_fast_body_draft_model(make_llama):
    """The two bodies in one engine: an OPT target on the backend, a tiny Llama drafter (same vocabulary) on its
    family body; requests joining mid-flight keep transformers' greedy text."""
    target, draft = make("opt"), make_llama(1, layers=1)
    engine = Engine(target, draft, EngineConfig(max_batch_size=2, max_seq_len=64, num_draft_tokens=2))
    assert isinstance(engine.model, HFBackendModel) and not isinstance(engine.drafter.model, HFBackendModel)
    assert run(engine, PROMPTS, NEW) == [hf_greedy(target, p, n, []) for p, n in zip(PROMPTS, NEW)]
    assert engine.stats.drafted_tokens > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["opt", "mixtral", "gemma2-softcap-window", "gpt-oss", "falcon", "falcon-alibi",
                                  "bloom", "mpt", "gpt-neo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_on_cuda(name, dtype):
    """On a GPU (eager steps, the Triton attention kernel, gpt-oss's sinks included; ALiBi biases take
    `hf_attention`'s torch path over the gathered slots): fp32 greedy = transformers'; bf16 may differ only at a
    near-tie of the target's logits."""
    from helpers import assert_same_greedy

    target = make(name).to("cuda", dtype)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=2, **BACKEND))
    assert not engine.cuda_graphs
    for prompt, ours in zip(PROMPTS, run(engine, PROMPTS, NEW)):
        ref = hf_greedy(target, prompt, len(ours), [])
        if dtype == torch.float32:
            assert ours == ref, name
        else:
            assert_same_greedy(target, prompt, ours, ref, tie=0.1)


@pytest.mark.parametrize("name", ["opt", "gpt2"])
def test_a_request_fills_a_learned_position_table(name):
    """Prompt + new tokens = the whole context of a model with learned positions, drafting to the end: the verify
    pass's drafts past the budget sit past the table (clamped there, never committed); the text is transformers'."""
    target = make(name)
    engine = Engine(target, specdec.PromptLookupDrafter(), EngineConfig(max_batch_size=1, num_draft_tokens=3,
                                                                        model_impl="transformers"))
    prompt = [3, 4, 5, 6] * 25
    assert engine.max_seq_len == 128
    assert run(engine, [prompt], [28]) == [hf_greedy(target, prompt, 28, [])]


def test_serve_passes_model_impl_to_load(capsys, ckpt, monkeypatch):
    """`specdec serve --model-impl transformers` reaches `specdec.load(model_impl=...)`; with `--engine hf` it is
    refused in one line before anything loads."""
    pytest.importorskip("uvicorn")
    from specdec.cli import main

    seen = {}

    def fake_load(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(specdec, "load", fake_load)
    with pytest.raises(SystemExit):
        main(["serve", "--target", str(ckpt / "target"), "--model-impl", "transformers"])
    assert seen["model_impl"] == "transformers"
    monkeypatch.setattr(specdec, "load", lambda *a, **k: pytest.fail("loaded before the error"))
    code = main(["serve", "--target", str(ckpt / "target"), "--model-impl", "transformers", "--engine", "hf"])
    err = capsys.readouterr().err
    assert code == 2 and "--model-impl" in err and len(err.strip().splitlines()) == 1
