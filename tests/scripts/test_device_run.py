"""scripts/device_run.sh: every GPU recipe in one runner — it parses, lists its recipes, shows each one's help, and
refuses an unknown name; nothing else in the repository still names a recipe's old file."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "device_run.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args):
    return subprocess.run(["bash", str(RUNNER), *args], capture_output=True, text=True, cwd=ROOT, timeout=30)


def recipes() -> list[str]:
    return re.findall(r"^# ==== (\S+)$", RUNNER.read_text(), flags=re.M)


def test_the_runner_parses_and_lists_every_recipe():
    assert subprocess.run(["bash", "-n", str(RUNNER)], capture_output=True).returncode == 0
    names = recipes()
    assert len(names) == len(set(names)) >= 10
    listed = run("--list")
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == names
    for name in names:
        assert f"recipe_{name.replace('-', '_')}() {{" in RUNNER.read_text()


def test_help_of_a_recipe_and_an_unknown_recipe():
    shown = run("--help", "traffic")
    assert shown.returncode == 0 and "device_run.sh traffic" in shown.stdout and "recipe_" not in shown.stdout
    assert "recipes:" in run().stdout
    wrong = run("no-such-recipe")
    assert wrong.returncode == 2 and "unknown recipe" in wrong.stderr


def test_no_reference_to_a_recipe_file_that_is_gone():
    shells = {p.name for p in (ROOT / "scripts").glob("*.sh")}
    assert shells == {"device_run.sh"}
    pattern = re.compile(r"scripts/([a-z_0-9]+\.sh)")
    deleted = {"device_checks.sh"}  # a bundle deleted earlier, named in the history with its `git show` command
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "specdec").rglob("*.py"),
                 *(ROOT / "scripts").glob("*"), *(ROOT / "tests").rglob("*.py")]:
        if path.is_file():
            for name in pattern.findall(path.read_text(encoding="utf-8", errors="replace")):
                assert name in shells | deleted, f"{path.relative_to(ROOT)} names scripts/{name}"
