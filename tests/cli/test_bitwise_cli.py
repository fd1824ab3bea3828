"""`--bitwise` on `specdec generate` / `specdec serve` and `specdec.load(bitwise=True)`: the engine's bit-exact mode
(issue 26 item 1) reaches the engine; its greedy text is the default mode's; combinations it cannot honour are
refused in one line before anything loads."""

import json

import pytest

import specdec
from specdec.cli import main


def generate(capsys, *argv):
    code = main(["generate", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_generate_bitwise_gives_the_default_greedy_text(capsys, ckpt):
    base = ["--target", str(ckpt / "target"), "--draft", str(ckpt / "draft"), "--prompt", "w1 w2 w3 w1",
            "--prompt", "w2 w2", "--temperature", "0", "--max-new-tokens", "10", "--json"]
    code, out, err = generate(capsys, *base)
    assert code == 0, err
    code, out_bitwise, err = generate(capsys, *base, "--bitwise")
    assert code == 0, err
    assert json.loads(out_bitwise.splitlines()[-1])["sequences"] == json.loads(out.splitlines()[-1])["sequences"]


@pytest.mark.parametrize("extra, fragment", [(["--leniency", "0.5"], "--leniency"),
                                             (["--tensor-parallel-size", "2"], "--tensor-parallel-size")])
def test_generate_refuses_what_bitwise_cannot_honour(capsys, ckpt, extra, fragment):
    code, out, err = generate(capsys, "--target", str(ckpt / "target"), "--prompt", "w1", "--bitwise", *extra)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_load_passes_bitwise_to_the_engine_and_refuses_the_fallback(ckpt):
    with specdec.load(ckpt / "target", draft=ckpt / "draft", num_draft_tokens=3, bitwise=True) as llm:
        out = llm.generate("w1 w2 w3", max_new_tokens=6, temperature=0, logprobs=True)
        assert llm.runner_kind == "engine" and llm.bitwise and len(out.token_ids) == 6
    with pytest.raises(ValueError, match="bitwise"):
        specdec.load(ckpt / "target", runner="fallback", bitwise=True)
    with pytest.raises(TypeError, match="bitwise"):
        specdec.load(ckpt / "target", bitwise="yes")


def test_serve_refuses_bitwise_on_the_fallback_runner(capsys, ckpt, monkeypatch):
    pytest.importorskip("uvicorn")
    monkeypatch.setattr(specdec, "load", lambda *a, **k: pytest.fail("loaded before the error"))
    code = main(["serve", "--target", str(ckpt / "target"), "--bitwise", "--runner", "fallback"])
    err = capsys.readouterr().err
    assert code == 2 and "--bitwise" in err
