"""`specdec.load(...)`: prompts of every form, defaults, stop strings, logprobs, streaming, errors."""

import pytest
import torch

import specdec
from specdec.text.prompts import make_params

TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"


@pytest.fixture(scope="module")
def llm(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=3, chat_template=TEMPLATE) as model:
        yield model


def reference(llm, ids, n, drafter=None, **kw):
    return specdec.generate(llm.target, [ids], drafter=drafter, max_new_tokens=n, temperature=0, **kw).sequences[0]


@pytest.mark.parametrize("gamma", [0, 3])
def test_greedy_text_and_tokens_equal_the_library_loop(llm, gamma):
    out = llm.generate("w1 w2 w3 w1 w2", max_new_tokens=12, num_draft_tokens=gamma)
    ids = llm.tokenizer.encode("w1 w2 w3 w1 w2")
    assert out.token_ids == reference(llm, ids, 12)
    # the completion is decoded in context: prompt text + completion text = the whole text decoded
    assert "w1 w2 w3 w1 w2" + out.text == llm.tokenizer.decode(ids + out.token_ids, skip_special_tokens=True)
    assert out.finish_reason in ("stop", "length") and out.prompt_token_ids == ids
    assert out.stats.num_generated_tokens == len(out.token_ids)
    assert (out.stats.num_draft_tokens > 0) == (gamma > 0) and out.stats.mean_accepted_length >= 1


def test_stream_deltas_concatenate_to_the_completion(llm):
    stream = llm.stream("w4 w5 w6", max_new_tokens=10)
    deltas = list(stream)
    assert deltas and "".join(deltas) == stream.completion.text
    assert stream.completion.text == llm.generate("w4 w5 w6", max_new_tokens=10).text


def test_every_prompt_form_gives_the_same_tokens(llm):
    text = "w7 w8 w9"
    ids = llm.tokenizer.encode(text)
    encoding = llm.tokenizer([text, "w1"], return_tensors=None)
    one = llm.generate(text, max_new_tokens=6)
    assert llm.generate(ids, max_new_tokens=6).token_ids == one.token_ids
    assert llm.generate(torch.tensor(ids), max_new_tokens=6).token_ids == one.token_ids
    batch = llm.generate([text, "w1"], max_new_tokens=6)
    assert isinstance(batch, list) and batch[0].token_ids == one.token_ids
    assert [c.token_ids for c in llm.generate(encoding, max_new_tokens=6)] == [c.token_ids for c in batch]
    assert llm.generate([ids, llm.tokenizer.encode("w1")], max_new_tokens=6)[1].token_ids == batch[1].token_ids


def test_chat_messages_are_rendered_with_the_template(llm):
    messages = [{"role": "w1", "content": "w2 w3"}, {"role": "w4", "content": "w5"}]
    rendered = llm.render_chat(messages)
    assert rendered == "w1 w2 w3 w4 w5 w9"
    out = llm.generate(messages, max_new_tokens=5)
    assert out.prompt_token_ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    assert len(llm.generate([messages, messages], max_new_tokens=5)) == 2


def test_generation_config_gives_the_defaults_and_explicit_arguments_win(ckpt):
    target = specdec.text.api.load(ckpt / "target").target
    target.generation_config.do_sample = True
    target.generation_config.temperature = 0.7
    target.generation_config.top_p = 0.9
    target.generation_config.top_k = 5
    tokenizer = specdec.loading.load_tokenizer(ckpt / "target")
    with specdec.load(target, tokenizer=tokenizer) as model:
        sampling, _, _ = make_params(model, 3, {})
        assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.9, 5)
        assert sampling.eos_token_ids == (63,)
        sampling, _, _ = make_params(model, 3, {"temperature": 0, "top_k": 0})
        assert sampling.greedy and sampling.top_k == 0 and sampling.top_p == 0.9
        a = model.generate("w1 w2", max_new_tokens=8, seed=3)
        assert a.token_ids == model.generate("w1 w2", max_new_tokens=8, seed=3).token_ids
    target.generation_config.do_sample = False
    with specdec.load(target, tokenizer=tokenizer) as model:
        assert make_params(model, 3, {})[0].greedy


def test_stop_strings_cut_the_text_and_end_the_request(llm):
    full = llm.generate("w1 w2 w3", max_new_tokens=12)
    words = full.text.split()
    assert len(words) >= 4, full.text
    stop = " " + words[2]
    cut = llm.generate("w1 w2 w3", max_new_tokens=12, stop=[stop, "never"])
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.stop_string == stop and len(cut.token_ids) < len(full.token_ids)
    streamed = llm.stream("w1 w2 w3", max_new_tokens=12, stop=stop)
    assert "".join(streamed) == cut.text


def test_logprobs_are_the_targets_raw_log_probabilities(llm):
    out = llm.generate("w3 w1 w4", max_new_tokens=6, logprobs=True, temperature=1.0, seed=0)
    ids = out.prompt_token_ids + out.token_ids
    with torch.no_grad():
        logits = llm.target(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(out.prompt_token_ids) - 1 : -1].gather(
        1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def test_concurrent_seeded_requests_equal_their_solo_runs(llm):
    prompts = ["w1 w2", "w3 w4 w5", "w6"]
    solo = [llm.generate(p, max_new_tokens=8, temperature=1.0, seed=i).token_ids for i, p in enumerate(prompts)]
    import threading

    got = [None] * 3

    def worker(i):
        got[i] = llm.generate(prompts[i], max_new_tokens=8, temperature=1.0, seed=i).token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == solo


def test_breaking_out_of_a_stream_aborts_the_request(llm):
    stream = llm.stream("w1", max_new_tokens=200)
    for _ in stream:
        break
    stream.deltas  # noqa: B018
    del stream
    import gc
    import time

    gc.collect()
    deadline = time.time() + 5
    while llm.driver.num_requests and time.time() < deadline:
        time.sleep(0.01)
    assert llm.driver.num_requests == 0


@pytest.mark.parametrize(
    "prompt, params, error, fragment",
    [
        ("w1", {"max_token": 5}, TypeError, "unknown parameter 'max_token'"),  # (max_tokens is max_new_tokens)
        ("w1", {"max_new_tokens": -1}, ValueError, "max_new_tokens"),
        ("w1", {"max_new_tokens": 10_000}, ValueError, "max_new_tokens=10000 does not fit"),
        ("w1 " * 300, {}, ValueError, "context"),
        ("w1", {"temperature": "hot"}, TypeError, "temperature"),
        ("w1", {"top_p": 0}, ValueError, "top_p"),
        ("w1", {"stop": 5}, TypeError, "stop"),
        ("w1", {"stop": [""]}, ValueError, "stop"),
        ("w1", {"num_draft_tokens": -1}, ValueError, "num_draft_tokens"),
        ("w1", {"num_draft_tokens": 1000}, ValueError, "num_draft_tokens"),
        ("w1", {"logprobs": "yes"}, TypeError, "logprobs"),
        ("", {}, ValueError, "empty"),
        ([], {}, ValueError, "prompts must be"),
        ([[1, 2], [99]], {}, ValueError, "outside the vocabulary"),
        ([{"role": "user"}], {}, ValueError, "messages[0]"),
        (3.5, {}, ValueError, "prompts must be"),
    ],
)
def test_bad_arguments_name_themselves(llm, prompt, params, error, fragment):
    with pytest.raises(error, match=None) as info:
        llm.generate(prompt, **params)
    assert fragment in str(info.value)


def test_chat_without_a_template_says_how_to_fix_it(ckpt):
    with specdec.load(ckpt / "target") as model, pytest.raises(ValueError, match="chat_template="):
        model.generate([{"role": "user", "content": "w1"}])


def test_loading_refuses_pickle_weights_unless_allowed(ckpt, tmp_path):
    import shutil

    folder = tmp_path / "pickled"
    shutil.copytree(ckpt / "target", folder)
    model = specdec.load(folder).target
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="allow_pickle"):
        specdec.load(folder)
    with pytest.raises(ValueError, match="ngram_data"):
        specdec.load(ckpt / "target", draft="ngram")
    specdec.load(folder, allow_pickle=True).close()


def test_token_prompts_to_the_library_loop_point_at_the_text_api(llm):
    with pytest.raises(ValueError, match="specdec.load"):
        specdec.generate(llm.target, "w1 w2")
    with pytest.raises(ValueError, match="specdec.load"):
        specdec.generate(llm.target, llm.tokenizer(["w1 w2"]))


def test_the_engine_serves_llama_and_opt_and_the_fallback_serves_what_it_refuses(llm, ckpt, opt, make_llama, caplog,
                                                                                  monkeypatch):
    """Llama on a fast family body, OPT on the engine's transformers backend (its own modules), a torch.ao
    dynamically quantized Llama (activations quantized per call: the engine refuses it) on the eager loop: each said
    in one log line; the same greedy tokens."""
    import logging
    import warnings

    monkeypatch.setattr("specdec.engine.build._noticed", set())  # (each line is said once per process)
    assert llm.runner_kind == "engine"
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=3, runner="fallback") as loop:
        assert loop.runner_kind == "fallback"
        for prompt in ("w1 w2 w3", "w5 w5 w5 w5"):
            assert loop.generate(prompt, max_new_tokens=10).token_ids == llm.generate(prompt, max_new_tokens=10).token_ids
    ids = llm.tokenizer.encode("w1 w2")
    with caplog.at_level(logging.INFO, logger="specdec"), specdec.load(opt, tokenizer=llm.tokenizer) as other:
        assert other.runner_kind == "engine" and type(other.runner().model).__name__ == "HFBackendModel"
        assert other.generate("w1 w2", max_new_tokens=6).token_ids == reference(other, ids, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        refused = torch.ao.quantization.quantize_dynamic(make_llama(3, vocab=opt.config.vocab_size), {torch.nn.Linear},
                                                         dtype=torch.qint8).eval()  # (refused by the engine)
    with caplog.at_level(logging.INFO, logger="specdec"), specdec.load(refused, tokenizer=llm.tokenizer) as other:
        assert other.runner_kind == "fallback"
        assert other.generate("w1 w2", max_new_tokens=6).token_ids == reference(other, ids, 6)
    said = [r.getMessage() for r in caplog.records]
    assert any("'opt' runs on the engine's transformers backend" in m for m in said), said
    assert any("quantized" in m and "eager transformers loop" in m for m in said), said
    with pytest.raises(Exception, match="UnsupportedModel|not|cover|attention"):
        specdec.load(refused, tokenizer=llm.tokenizer, runner="engine")


def test_token_trees_and_lenience_per_request(llm):
    """draft_tree and leniency are request parameters: a tree keeps the greedy text; lenience matches the library."""
    ids = llm.tokenizer.encode("w1 w2 w3 w1 w2")
    tree = llm.generate("w1 w2 w3 w1 w2", max_new_tokens=12, draft_tree=[2, 2, 1])
    assert tree.token_ids == reference(llm, ids, 12) and tree.stats.alpha is None
    lenient = llm.generate("w1 w2 w3 w1 w2", max_new_tokens=12, temperature=0, leniency=0.05)
    assert lenient.token_ids == reference(llm, ids, 12, drafter=llm.drafter, num_draft_tokens=3, leniency=0.05,
                                          eos_token_id=list(llm.defaults.eos_token_ids))
    assert lenient.token_ids != tree.token_ids  # (lossy: on this pair l = 0.05 accepts drafts the argmax rejects)
    for params, fragment in (({"draft_tree": [0]}, "draft_tree"), ({"leniency": 2}, "leniency")):
        with pytest.raises(ValueError, match=fragment):
            llm.generate("w1", max_new_tokens=2, **params)


def test_load_passes_the_prefill_budget_to_the_engine_and_checks_it_first(tmp_path):
    """`specdec.load(prefill_budget=...)` reaches the engine's `EngineConfig.prefill_budget`; a bad one is refused by
    name before anything loads (the target path does not even exist)."""
    import specdec
    from specdec.bench.demo_pair import DEMO_PAIR

    with pytest.raises(ValueError, match="prefill_budget"):
        specdec.load(tmp_path / "missing", prefill_budget=4)
    with pytest.raises(ValueError, match="prefill_stall"):
        specdec.load(tmp_path / "missing", prefill_budget=64, prefill_stall=0.5)
    llm = specdec.load(DEMO_PAIR / "target", DEMO_PAIR / "draft", device="cpu", dtype="float32", prefill_budget=64)
    try:
        assert llm.runner(2).prefill_budget == 64
    finally:
        llm.close()
    llm = specdec.load(DEMO_PAIR / "target", DEMO_PAIR / "draft", device="cpu", dtype="float32",
                       prefill_budget="auto", prefill_stall=0.25)
    try:
        assert llm.runner(2).prefill_budget == "auto" and llm.runner(2).prefill_report["stall"] == 0.25
    finally:
        llm.close()


def test_load_passes_mixed_step_to_the_engine_and_checks_it_first(tmp_path):
    """`specdec.load(mixed_step=True)` reaches `EngineConfig.mixed_step` (its budget "auto" unless given); a bad value
    is refused by name before anything loads, and the eager loop refuses it."""
    import specdec
    from specdec.bench.demo_pair import DEMO_PAIR

    with pytest.raises(TypeError, match="mixed_step"):
        specdec.load(tmp_path / "missing", mixed_step="yes")
    llm = specdec.load(DEMO_PAIR / "target", DEMO_PAIR / "draft", device="cpu", dtype="float32", mixed_step=True)
    try:
        assert llm.runner(2).config.mixed_step and llm.runner(2).prefill_budget == "auto"
    finally:
        llm.close()
    with pytest.raises(ValueError, match="mixed_step"):
        specdec.load(DEMO_PAIR / "target", DEMO_PAIR / "draft", device="cpu", dtype="float32", mixed_step=True,
                     runner="fallback")  # (refused at load, as bitwise is)


def test_a_runner_rebuilt_after_the_heap_was_frozen_is_frozen_too():
    """`specdec serve` freezes its start-up heap (gc.freeze) so full collections skip it; a runner rebuilt later (its
    step raised: `Driver.failed`) joins the frozen heap. Without a frozen heap nothing is frozen (the control)."""
    import gc

    import specdec
    from specdec.bench.demo_pair import DEMO_PAIR

    gc.unfreeze()  # (whatever an earlier test of this process froze)
    llm = specdec.load(DEMO_PAIR / "target", DEMO_PAIR / "draft", device="cpu", dtype="float32")
    try:
        first = llm.runner(0)
        assert llm.runner(3) is first and llm.runner() is first  # one runner for every γ
        llm.driver.failed.add(first)
        second = llm.runner()
        assert second is not first and gc.get_freeze_count() == 0  # the control: this process froze nothing
        gc.freeze()
        frozen = gc.get_freeze_count()
        llm.driver.failed.add(second)
        llm.runner()
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        llm.close()
