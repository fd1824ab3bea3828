"""`specdec demo --pair qwen` without the pair installed: one line saying how to fetch it, before anything loads."""

from specdec.cli import main
from specdec.fast.kernels import cpu_linear


def test_demo_pair_qwen_names_the_fetch_script_when_the_pair_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_QWEN_PAIR", str(tmp_path))
    monkeypatch.setattr(cpu_linear, "MODE", cpu_linear.MODE)
    assert main(["demo", "--pair", "qwen"]) == 2
    err = capsys.readouterr().err
    assert "scripts/fetch_qwen_pair.py" in err and str(tmp_path) in err
    assert cpu_linear.MODE == "auto"  # refused before the demo changed anything
