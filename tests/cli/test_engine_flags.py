"""The engine's flags (`cli/engine_flags.ENGINE_FLAGS`): one table from flags to EngineConfig fields, read back as
`specdec.load`'s engine options, checked by the library before anything loads, each error naming the flag."""

from __future__ import annotations

from dataclasses import fields

import pytest

from specdec.cli import CLIError, build_parser, main
from specdec.cli.aliases import expand_config, finish
from specdec.cli.engine_flags import ENGINE_FLAGS, EngineFlag, check_engine_flags, engine_options


def parse(argv):
    parser = build_parser()
    return finish(parser.parse_args(expand_config(argv, parser)))


def rows_off_the_config(rows) -> list[str]:
    """The rows whose option is no EngineConfig field (what the check below asserts is empty)."""
    from specdec.engine import EngineConfig

    names = {f.name for f in fields(EngineConfig)}
    return [row.flags[0] for row in rows if row.option not in names]


def test_every_row_names_an_engine_config_field():
    assert rows_off_the_config(ENGINE_FLAGS) == []
    # negative control: a row for a field that does not exist is found
    assert rows_off_the_config((*ENGINE_FLAGS, EngineFlag(("--kv-cache-size",), "kv_cache_size"))) == ["--kv-cache-size"]


@pytest.mark.parametrize("command", [["serve", "M"], ["generate", "M", "--prompt", "x"]])
def test_flags_not_given_leave_the_librarys_defaults(command):
    assert engine_options(parse(command)) == {}


@pytest.mark.parametrize("argv, want", [
    (["--kv-cache-memory", "4GiB"], {"kv_cache_memory": 4 << 30}),
    (["--kv-cache-memory", "0.5"], {"kv_cache_memory": 0.5}),
    (["--kv-cache-memory-bytes", "512MiB"], {"kv_cache_memory": 512 << 20}),
    (["--block-size", "32", "--max-num-seqs", "8", "-c", "2048"],
     {"block_size": 32, "max_batch_size": 8, "max_seq_len": 2048}),
    (["--no-prefix-caching", "--model-impl", "transformers"], {"enable_prefix_caching": False, "model_impl": "transformers"}),
    (["--prefill-budget", "auto", "--prefill-steps", "2"], {"prefill_budget": "auto", "prefill_steps": 2}),
    (["--bitwise"], {"bitwise": True}),
    (["--mixed-step"], {"mixed_step": True}),  # (bare: True, as before it took a value)
    (["--mixed-step", "auto"], {"mixed_step": "auto"}),
    (["--mixed-step=false", "--max-num-seqs", "4"], {"mixed_step": False, "max_batch_size": 4}),
    (["--mixed-step", "On", "--prefill-budget", "64"], {"mixed_step": True, "prefill_budget": 64}),
])
def test_flags_map_onto_engine_options(argv, want):
    for command in (["serve", "M"], ["generate", "M", "--prompt", "x"]):
        assert check_engine_flags(parse([*command, *argv]), num_draft_tokens=4) == want


@pytest.mark.parametrize("argv, flag", [
    (["--kv-cache-memory", "lots"], "--kv-cache-memory"), (["--kv-cache-memory", "1.5"], "--kv-cache-memory"),
    (["--kv-cache-memory-bytes", "0.5"], "--kv-cache-memory-bytes"),
    (["--kv-cache-memory", "1GiB", "--kv-cache-memory-bytes", "2GiB"], "--kv-cache-memory"),
    (["--block-size", "24"], "--block-size"), (["--block-size", "128"], "--block-size"),
    (["--max-batch-size", "100000"], "--max-batch-size"),
    (["--prefill-steps", "4", "--mixed-step", "false"], "--prefill-steps"),
])
def test_bad_values_are_refused_naming_the_flag(argv, flag):
    with pytest.raises(CLIError) as info:
        check_engine_flags(parse(["serve", "M", *argv]))
    assert str(info.value).startswith(flag), info.value


def test_a_bad_mixed_step_value_is_refused_naming_the_flag_and_its_values(capsys):
    with pytest.raises(SystemExit):
        parse(["serve", "M", "--mixed-step", "sometimes"])
    err = capsys.readouterr().err
    assert "--mixed-step" in err and "'sometimes' is not true, false or auto" in err, err
    assert engine_options(parse(["serve", "M", "--mixed-step", "no"])) == {"mixed_step": False}  # (the control)
    with pytest.raises(SystemExit):  # (a model path read as the flag's value: the error says how to write it)
        parse(["serve", "--mixed-step", "models/m.gguf"])
    assert "put the model first" in capsys.readouterr().err


def test_the_loop_refuses_the_engines_options_naming_the_flag():
    with pytest.raises(CLIError, match="^--kv-cache-memory: "):
        check_engine_flags(parse(["serve", "M", "--kv-cache-memory", "1GiB"]), loop=True)
    assert check_engine_flags(parse(["serve", "M", "--max-batch-size", "4"]), loop=True) == {"max_batch_size": 4}


def test_serve_refuses_a_bad_size_before_loading(capsys, monkeypatch):
    pytest.importorskip("uvicorn")
    import specdec

    monkeypatch.setattr(specdec, "load", lambda *a, **k: pytest.fail("loaded before the error"))
    code = main(["serve", "--target", str(__import__("pathlib").Path(specdec.__file__).parent / "assets" / "demo_pair"
                                          / "target"), "--kv-cache-memory", "4 GiBs"])
    err = capsys.readouterr().err
    assert code == 2 and "--kv-cache-memory" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flags, said", [([], "the default budget"), (["--kv-cache-memory", "16MiB"],
                                                                     "--kv-cache-memory 16.0 MiB")])
def test_serve_sizes_the_pool_by_the_flag_and_says_so_at_start_up(flags, said):
    pytest.importorskip("fastapi")
    from pathlib import Path

    import specdec
    from specdec.cli.serve import build
    from specdec.cli.serve_startup import kv_cache_line

    demo = Path(specdec.__file__).parent / "assets" / "demo_pair"
    _, llm = build(parse(["serve", str(demo / "target"), "--draft", str(demo / "draft"), "--max-batch-size", "2",
                          "--block-size", "8", *flags]))
    with llm:
        engine = llm.runner()
        usage = engine.kv_cache_usage
        line = kv_cache_line(engine)
        assert f"{usage.num_blocks} blocks of 8 tokens = {usage.num_blocks * 8} tokens" in line and said in line, line
        assert (engine.kv_cache_bytes <= 16 << 20) == bool(flags)
