"""The names users already type (vLLM's, llama.cpp's), a positional model, --speculative-config, --config FILE and
the deprecated spellings: parsed into specdec's own options, nothing loaded."""

from __future__ import annotations

import json

import pytest

from specdec.cli import CLIError, build_parser, main
from specdec.cli.aliases import expand_config, finish


def parse(argv):
    parser = build_parser()
    return finish(parser.parse_args(expand_config(argv, parser)))


def test_model_is_never_an_abbreviation_of_model_option():
    args = parse(["serve", "--model", "some/model"])
    assert args.target == "some/model"
    assert args.model_option is None
    # and no option is taken for an abbreviation of another (argparse would read `--model-o` as --model-option)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--model-o", "revision=v1"])


@pytest.mark.parametrize("argv", [
    ["serve", "M"], ["serve", "--model", "M"], ["serve", "-m", "M"], ["serve", "--target", "M"],
    ["generate", "M", "--prompt", "x"], ["bench", "M"], ["beam", "M", "--prompt", "x"],
])
def test_the_model_positional_or_by_any_name(argv):
    assert str(parse(argv).target) == "M"


def test_check_takes_a_positional_model_as_a_path(tmp_path):
    args = parse(["check", str(tmp_path), "--draft", "prompt-lookup"])
    assert args.target == tmp_path


def test_the_model_given_twice_is_refused():
    with pytest.raises(CLIError, match="given twice"):
        parse(["serve", "A", "--model", "B"])


def test_a_missing_model_is_one_line(capsys):
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "the model is required" in err and len(err.strip().splitlines()) == 1


def test_vllm_and_llama_server_spellings():
    args = parse(["serve", "-m", "T", "-md", "D", "--draft-max", "6", "-c", "2048", "--max-num-seqs", "8"])
    assert (args.target, args.draft, args.num_draft_tokens, args.max_seq_len, args.max_batch_size) == (
        "T", "D", "6", 2048, 8)
    args = parse(["serve", "T", "--model-draft", "D", "--max-model-len", "1024"])
    assert (args.draft, args.max_seq_len) == ("D", 1024)


def test_speculative_config():
    args = parse(["serve", "T", "--speculative-config", json.dumps({"model": "D", "num_speculative_tokens": 3})])
    assert (args.draft, args.num_draft_tokens) == ("D", "3")
    args = parse(["serve", "T", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'])
    assert (args.draft, args.num_draft_tokens) == ("prompt-lookup", "5")
    args = parse(["bench", "T", "--speculative-config", '{"model": "D", "num_speculative_tokens": 2}'])
    assert (args.draft, args.gamma) == ("D", 2)


@pytest.mark.parametrize("config, message", [
    ('{"model": "D", "prompt_lookup_max": 4}', "unsupported key 'prompt_lookup_max'"),
    ('[1]', "JSON object"), ('{"model": "D"', "JSON object"), ('{"num_speculative_tokens": 2}', "needs \"model\""),
    ('{"method": "lookahead"}', "method must be"), ('{"model": "D", "num_speculative_tokens": "4"}', "integer"),
])
def test_speculative_config_refusals(config, message):
    with pytest.raises(CLIError, match=message):
        parse(["serve", "T", "--speculative-config", config])


def test_speculative_config_and_another_draft_conflict():
    with pytest.raises(CLIError, match="draft is given twice"):
        parse(["serve", "T", "--draft", "X", "--speculative-config", '{"model": "D"}'])


def test_one_runner_vocabulary_and_the_deprecated_runner(capsys):
    assert parse(["serve", "T", "--engine", "hf"]).engine == "hf"
    assert parse(["serve", "T"]).engine == "auto"
    assert parse(["check", "--engine", "fast"]).engine == "fast"
    assert parse(["beam", "T", "--prompt", "x", "--engine", "hf"]).engine == "hf"
    capsys.readouterr()
    assert parse(["serve", "T", "--runner", "fallback"]).engine == "hf"
    assert parse(["serve", "T", "--runner", "engine"]).engine == "fast"
    assert "--runner is deprecated; use --engine" in capsys.readouterr().err


def test_bench_gamma_is_a_deprecated_num_draft_tokens(capsys):
    assert parse(["bench", "--num-draft-tokens", "3"]).gamma == 3
    assert parse(["bench"]).gamma is None
    capsys.readouterr()
    assert parse(["bench", "--gamma", "2"]).gamma == 2
    assert "--gamma is deprecated; use --num-draft-tokens" in capsys.readouterr().err


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "model: T\ndraft: D\nmax-model-len: 512\nnum_draft_tokens: 3\nbitwise: true\nallowed-hosts: [a, b]\n"),
    (".json", json.dumps({"model": "T", "draft": "D", "max_model_len": 512, "num-draft-tokens": 3, "bitwise": True,
                          "allowed_hosts": ["a", "b"]})),
])
def test_config_file(tmp_path, suffix, text):
    path = tmp_path / f"serve{suffix}"
    path.write_text(text)
    args = parse(["serve", "--config", str(path)])
    assert (args.target, args.draft, args.max_seq_len, args.num_draft_tokens, args.bitwise, args.allowed_hosts) == (
        "T", "D", 512, "3", True, ["a", "b"])
    assert parse(["serve", "--config", str(path), "--max-model-len", "256"]).max_seq_len == 256  # the command wins


def test_config_file_refusals(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: T\nmodel-optoin: x\n")
    with pytest.raises(CLIError, match="unknown option 'model-optoin'"):
        parse(["serve", "--config", str(bad)])
    with pytest.raises(CLIError, match="no such file"):
        parse(["serve", "--config", str(tmp_path / "missing.yaml")])
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(CLIError, match="mapping"):
        parse(["serve", "--config", str(listed)])
    flag = tmp_path / "flag.yaml"
    flag.write_text("bitwise: 3\n")
    with pytest.raises(CLIError, match="true or false"):
        parse(["serve", "T", "--config", str(flag)])


def test_config_errors_through_main_are_one_line(tmp_path, capsys):
    assert main(["serve", "--config", str(tmp_path / "none.yaml")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
