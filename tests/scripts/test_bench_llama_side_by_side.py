"""scripts/bench_llama_side_by_side.py without llama.cpp: the inline llama-cpp-python script compiles, its three
modes name their figure, and a bad arm list is refused before anything is loaded."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_llama_side_by_side.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_llama_side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_llama_script_compiles_and_names_its_modes():
    module = _module()
    compile(module._LLAMA, "<llama>", "exec")
    assert module.LLAMA_MODES == {"llama": "plain", "llama_draft": "draft", "llama_lookup": "lookup"}
    assert "LlamaPromptLookupDecoding" in module._LLAMA and "LlamaDraftModel" in module._LLAMA


@pytest.mark.parametrize("arms, message", [("llama,bogus", "unknown"), ("llama,llama_draft", "needs --draft-gguf")])
def test_bad_arms_are_refused_before_loading(arms, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _module().main(["--gguf", "missing.gguf", "--arms", arms])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
