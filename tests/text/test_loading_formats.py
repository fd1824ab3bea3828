"""`specdec.load`, `specdec generate` and `specdec serve` on every format: a GGUF file (tokenizer and chat template
from the file), a hub id in a test-made offline cache, model options; greedy == transformers on the loaded model."""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from helpers import hf_greedy
from specdec.cli import build_parser, main

gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf package (pip install 'specdec[gguf]')")
pytest.importorskip("accelerate", reason="transformers loads GGUF files with accelerate (pip install 'specdec[gguf]')")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from gguf_helpers import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", seed=3)


@pytest.mark.parametrize("draft, gamma", [(None, 0), ("prompt-lookup", 3)])
def test_load_a_gguf_file_greedy_equals_transformers(tiny_gguf, draft, gamma):
    with specdec.load(tiny_gguf, draft, device="cpu", num_draft_tokens=gamma or 4) as llm:
        assert llm.runner_kind == "engine"  # a Llama GGUF: dequantized, then copied by the engine
        chat = [{"role": "user", "content": "abcabc"}]
        assert llm.render_chat(chat).startswith("user: abcabc")  # the template inside the GGUF
        for prompt in ("abcab", "hello", chat):
            out = llm.generate(prompt, max_new_tokens=16, temperature=0)
            ids = llm.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True) \
                if isinstance(prompt, list) else llm.tokenizer.encode(prompt)
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            assert out.token_ids == hf_greedy(llm.target, list(ids), 16, [llm.tokenizer.eos_token_id])


def test_cli_generate_takes_a_gguf_file(capsys, tiny_gguf):
    base = ["generate", "--target", str(tiny_gguf), "--prompt", "abcab", "--temperature", "0",
            "--max-new-tokens", "10", "--json", "--device", "cpu"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*base, "--draft", "prompt-lookup", "--num-draft-tokens", "3"]) == 0
    spec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert spec["sequences"] == plain["sequences"] and len(plain["sequences"][0]) > 0
    folder = ["--target", str(tiny_gguf.parent), "--model-option", f"gguf_file={tiny_gguf.name}"]
    assert main([*base[:1], *folder, *base[3:]]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sequences"] == plain["sequences"]


@pytest.mark.parametrize("option, fragment", [
    ("trust_remote_code=true", "--model-option: model option trust_remote_code is refused"),
    ("turbo=1", "--model-option: unknown model option 'turbo'"),
    ("attn_implementation=warp", "--model-option: model option attn_implementation must be"),
    ("revision", "--model-option: a model option is KEY=VALUE"),
])
def test_cli_bad_model_options_fail_in_one_line(capsys, tiny_gguf, option, fragment):
    for command in (["generate", "--prompt", "a"], ["serve"]):
        code = main([*command, "--target", str(tiny_gguf), "--model-option", option, "--device", "cpu"])
        err = capsys.readouterr().err
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_serve_a_gguf_file(tiny_gguf):
    from fastapi.testclient import TestClient

    from specdec.cli.serve import build

    args = build_parser().parse_args(["serve", "--target", str(tiny_gguf), "--device", "cpu", "--draft",
                                      "prompt-lookup", "--num-draft-tokens", "2"])
    app, llm = build(args)
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            models = client.get("/v1/models").json()
            assert [m["id"] for m in models["data"]] == ["tiny-chat"]  # the file's stem
            body = client.post("/v1/chat/completions", json={
                "model": "tiny-chat", "messages": [{"role": "user", "content": "abcabc"}], "max_tokens": 8,
                "temperature": 0}).json()
        text = body["choices"][0]["message"]["content"]
        ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "abcabc"}], add_generation_prompt=True,
                                                tokenize=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        ref = hf_greedy(llm.target, list(ids), 8, [llm.tokenizer.eos_token_id])
        assert text == llm.tokenizer.decode(ref, skip_special_tokens=True)
    finally:
        llm.close()


def test_load_a_hub_id_from_the_offline_cache(tmp_path, monkeypatch, ckpt):
    from gguf_helpers import make_hub_cache

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    make_hub_cache(tmp_path / "hub", "org/tiny-target", ckpt / "target", revision="v1")
    make_hub_cache(tmp_path / "hub", "org/tiny-draft", ckpt / "draft")
    with pytest.raises(FileNotFoundError, match="no revision 'main'"):
        specdec.load("org/tiny-target", device="cpu")
    with specdec.load("org/tiny-target", "org/tiny-draft", device="cpu", model_kwargs={"revision": "v1"},
                      num_draft_tokens=3) as llm:
        out = llm.generate("w1 w2 w3", max_new_tokens=10, temperature=0)
        ids = llm.tokenizer.encode("w1 w2 w3")
        assert out.token_ids == hf_greedy(llm.target, ids, 10, [llm.tokenizer.eos_token_id])
    with pytest.raises(ValueError, match="draft_model_kwargs apply"):
        specdec.load(ckpt / "target", "prompt-lookup", device="cpu", draft_model_kwargs={"revision": "v1"})
    args = build_parser().parse_args(["serve", "--target", "org/tiny-target", "--model-option", "revision=v1",
                                      "--device", "cpu"])
    from specdec.cli.serve import build

    app, llm = build(args)
    llm.close()
    assert app.state.model_name == "org/tiny-target"


def test_model_kwargs_reach_the_model(ckpt):
    with specdec.load(ckpt / "target", device="cpu", model_kwargs={"attn_implementation": "eager",
                                                                    "torch_dtype": "bfloat16"}) as llm:
        assert llm.target.config._attn_implementation == "eager" and llm.target.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="model_kwargs apply when target is a path"):
        specdec.load(llm.target, tokenizer=llm.tokenizer, model_kwargs={"revision": "x"})


def test_a_gguf_inside_a_cached_hub_repo(tmp_path, monkeypatch, tiny_gguf):
    from gguf_helpers import make_hub_cache

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    make_hub_cache(tmp_path / "hub", "org/tiny-gguf", tiny_gguf.parent)
    with specdec.load("org/tiny-gguf", device="cpu", model_kwargs={"gguf_file": tiny_gguf.name}) as llm:
        assert llm.tokenizer.encode("abc") == [2, 3, 4]  # the tokenizer from the GGUF in the snapshot
        out = llm.generate("abcab", max_new_tokens=8, temperature=0)
        assert out.token_ids == hf_greedy(llm.target, [2, 3, 4, 2, 3], 8, [llm.tokenizer.eos_token_id])
    with pytest.raises(FileNotFoundError, match="gguf_file 'other.gguf' not found"):
        specdec.load("org/tiny-gguf", device="cpu", model_kwargs={"gguf_file": "other.gguf"})
