"""The user documentation: the README keeps CI's set-up-and-test command word for word, every relative link in the
README, BENCHMARKS.md and docs/ resolves, and the user pages carry no development-process words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "docs" / "benchmarks" / "HISTORY.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: words about how the project was built, not about what it does (the history page may keep them)
PROCESS_WORDS = re.compile(r"\b(wave [0-9]|session [0-9]|issue [0-9]+|round [0-9])", re.IGNORECASE)
USER_PAGES = ["README.md", "BENCHMARKS.md", "docs/CLI.md", "docs/PYTHON_API.md", "docs/MODELS.md", "docs/DRAFTERS.md",
              "docs/ENGINE.md", "docs/TENSOR_PARALLEL.md", "docs/EXACTNESS.md", "docs/SERVER.md"]


def broken_links(page: Path) -> list[str]:
    """The relative links of a Markdown page whose file does not exist (web links and anchors are not checked)."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            broken.append(target)
    return broken


def test_the_readme_holds_the_command_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert ci, ".ci/run lost its command"
    assert ci[0] in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#part) [web](https://example.org) [gone](missing.md) [anchor](#top)")
    assert broken_links(page) == ["missing.md"]


@pytest.mark.parametrize("name", USER_PAGES)
def test_no_development_process_words(name):
    assert PROCESS_WORDS.findall((ROOT / name).read_text(encoding="utf-8")) == []


def test_process_words_are_found():
    assert PROCESS_WORDS.findall("measured in wave 3, session 5 (issue 21)") == ["wave 3", "session 5", "issue 21"]
