"""`specdec generate --chat / --system / --stop / --logprobs` on tiny checkpoints, against the text API."""

import json

import pytest

import specdec
from specdec.cli import main

TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"


def cli(capsys, *argv):
    code = main(["generate", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    return path


def test_system_renders_the_chat_template(capsys, ckpt, template):
    code, out, err = cli(capsys, str(ckpt / "target"), "--prompt", "w1 w2", "--system", "w3", "--chat-template",
                         str(template), "--temperature", "0", "--max-new-tokens", "6", "--json")
    assert code == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    with specdec.load(ckpt / "target", chat_template=TEMPLATE) as llm:
        ref = llm.chat([{"role": "system", "content": "w3"}, {"role": "user", "content": "w1 w2"}],
                       temperature=0, max_new_tokens=6)
        raw = llm.generate("w1 w2", temperature=0, max_new_tokens=6)
    assert got["sequences"] == [ref.token_ids]
    assert ref.prompt_token_ids != raw.prompt_token_ids  # negative control: the template changed the prompt
    code, out, err = cli(capsys, str(ckpt / "target"), "--prompt", "w1 w2", "--chat", "--chat-template", str(template),
                         "--temperature", "0", "--max-new-tokens", "6")
    assert code == 0, err
    assert not out.startswith("user")  # the reply alone, not the rendered template


def test_chat_without_a_template_is_one_line(capsys, ckpt):
    code, out, err = cli(capsys, str(ckpt / "target"), "--prompt", "w1", "--chat", "--max-new-tokens", "2")
    if code == 0:  # (the tiny tokenizer may carry a template of its own)
        pytest.skip("this tokenizer has a chat template")
    assert code == 2 and "chat template" in err and len(err.strip().splitlines()) == 1


def test_stop_cuts_the_text_before_the_stop_string(capsys, ckpt):
    base = [str(ckpt / "target"), "--prompt", "w1 w2 w3", "--temperature", "0", "--max-new-tokens", "12", "--json"]
    code, out, err = cli(capsys, *base)
    full = json.loads(out.strip().splitlines()[-1])["texts"][0]
    words = full.split()
    assert code == 0 and len(words) > 2, full
    stop = words[2]
    code, out, err = cli(capsys, *base, "--stop", stop)
    assert code == 0, err
    cut = json.loads(out.strip().splitlines()[-1])["texts"][0]
    assert cut == full[:full.index(stop)] and stop not in cut
    code, out, err = cli(capsys, *base, "--stop", "")
    assert code == 2 and "--stop" in err


def test_logprobs(capsys, ckpt):
    base = [str(ckpt / "target"), "--prompt", "w1 w2", "--temperature", "0", "--max-new-tokens", "5", "--logprobs"]
    code, out, err = cli(capsys, *base, "--json")
    assert code == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    assert len(got["logprobs"][0]) == len(got["sequences"][0]) and all(lp <= 0 for lp in got["logprobs"][0])
    code, out, err = cli(capsys, *base)
    rows = [line for line in out.splitlines() if "\t" in line]
    assert len(rows) == len(got["sequences"][0])
    assert [float(r.split("\t")[1]) for r in rows] == pytest.approx(got["logprobs"][0], abs=1e-4)
    code, out, err = cli(capsys, *base, "--leniency", "0.5")
    assert code == 2 and "--logprobs" in err


def test_engine_picks_the_runner_and_both_give_the_greedy_text(capsys, ckpt):
    base = [str(ckpt / "target"), "--draft", str(ckpt / "draft"), "--prompt", "w1 w2 w3", "--temperature", "0",
            "--max-new-tokens", "8", "--json"]
    texts = {}
    for engine in ("hf", "fast"):
        code, out, err = cli(capsys, *base, "--engine", engine)
        assert code == 0, err
        texts[engine] = json.loads(out.strip().splitlines()[-1])["sequences"]
    assert texts["hf"] == texts["fast"]
    code, out, err = cli(capsys, *base, "--engine", "hf", "--bitwise")
    assert code == 2 and "--engine hf" in err
