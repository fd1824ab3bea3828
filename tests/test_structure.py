"""The package's shape, checked from its source with `ast` (nothing imported): no module (nor test module) over 400
lines, at most 12 modules at the package root, ARCHITECTURE.md's import arrows, and its module table naming every
subpackage and only modules that exist.

An import arrow is any `import` of a `specdec` module anywhere in a file — at the top or inside a function (a lazy
import is still a dependency at run time) — except under `if TYPE_CHECKING:` (names for the reader, never run).
Each rule is a function of the graph `{module: {imported modules}}`, so each has a negative control: a made-up graph
or file that breaks it, which the rule must report.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec"
MAX_LINES = 400
MAX_ROOT_MODULES = 12

# Known breaks, each named with who landed it: tolerated here, and each must still be broken — once fixed, its
# entry fails `test_every_known_exception_is_still_needed` until it is deleted (so the list only shrinks).
KNOWN_LONG_MODULES: dict[str, str] = {}
KNOWN_BROKEN_ARROWS: dict[str, str] = {}


# --- reading the package ---------------------------------------------------------------------------

def module_name(path: Path, package: Path = PACKAGE) -> str:
    """specdec/engine/step.py → "specdec.engine.step"; a package's __init__.py → the package."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, is_package: bool = False, modules: frozenset[str] = frozenset()) -> set[str]:
    """The `specdec` modules one file imports (relative imports resolved; `from a import b` names `a.b` when that is
    a module of `modules`, else `a`), skipping `if TYPE_CHECKING:` blocks."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here[: len(here) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return {m for m in found if m == "specdec" or m.startswith("specdec.")}


def package_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the specdec modules it imports} for every .py file under `package`."""
    paths = sorted(package.rglob("*.py"))
    modules = frozenset(module_name(p, package) for p in paths)
    return {module_name(p, package): imports_of(p.read_text(encoding="utf-8"), module_name(p, package),
                                                p.name == "__init__.py", modules) - {module_name(p, package)}
            for p in paths}


GRAPH = package_graph()


# --- the rules ---------------------------------------------------------------------------------------

# What imports the library and is never imported by it (the package root's lazy `specdec.load` aside; the CLI,
# the outermost, has its own rule).
OUTER_RING = ("specdec.server", "specdec.text", "specdec.bench", "specdec.zoo", "specdec.exactness")


def _within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _engine_role(module: str) -> str | None:
    """The engine's two sides: "runner" (`engine/runner*.py` and the step shapes it builds: `step_runner`,
    `tree_step`), "scheduler" (`engine/scheduler*.py`), None for the rest."""
    name = module.removeprefix("specdec.engine.") if module.startswith("specdec.engine.") else None
    if name is None:
        return None
    if name.startswith("runner") or name in ("step_runner", "tree_step"):
        return "runner"
    return "scheduler" if name.startswith("scheduler") else None


def broken_arrows(graph: dict[str, set[str]]) -> list[str]:
    """ARCHITECTURE.md's arrows, each broken import as "rule: importer -> imported"."""
    broken = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if _within(module, "specdec.core") and not _within(target, "specdec.core"):
                broken.append(f"core imports nothing of specdec: {module} -> {target}")
            if _within(module, "specdec.request", "specdec.step") and not _within(
                    target, "specdec.core", "specdec.metrics", "specdec.request", "specdec.step"):
                broken.append(f"request/step import only core and metrics: {module} -> {target}")
            if (_within(module, "specdec.loop") and _within(target, "specdec.engine")) or (
                    _within(module, "specdec.engine") and _within(target, "specdec.loop")):
                broken.append(f"the loop and the engine never import each other: {module} -> {target}")
            sides = {_engine_role(module), _engine_role(target)}
            if sides == {"runner", "scheduler"}:
                broken.append(f"the engine's scheduler and runner never import each other: {module} -> {target}")
            if _within(target, "specdec.cli") and not _within(module, "specdec.cli", "specdec.__main__"):
                broken.append(f"nothing of the library imports the CLI: {module} -> {target}")
            if _within(module, "specdec.bench") and _within(target, "specdec.cli"):
                broken.append(f"a benchmark never imports the CLI: {module} -> {target}")
            if _within(module, "specdec.models", "specdec.drafters") and _within(
                    target, "specdec.loop", "specdec.engine", "specdec.decoding"):
                broken.append(f"models and drafters never import a runner: {module} -> {target}")
            if _within(target, *OUTER_RING) and not _within(module, *OUTER_RING, "specdec.cli", "specdec.__main__") and (
                    module != "specdec"):
                broken.append(f"the library never imports the outer ring: {module} -> {target}")
    return broken


def long_modules(package: Path = PACKAGE, limit: int = MAX_LINES) -> list[str]:
    counts = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(package.rglob("*.py"))}
    return [f"{p.relative_to(package.parent)}: {n} lines" for p, n in counts.items() if n > limit]


def root_modules(package: Path = PACKAGE) -> list[str]:
    return sorted(p.name for p in package.glob("*.py"))


def subpackages(package: Path = PACKAGE) -> list[str]:
    """Every package under `package`, nested ones included: ["specdec/core", "specdec/fast/kernels", ...]."""
    return sorted(p.parent.relative_to(package.parent).as_posix() for p in package.rglob("*/__init__.py"))


def unlisted_subpackages(architecture: str, names: list[str]) -> list[str]:
    """The subpackages that no row of ARCHITECTURE.md's module table names in its first cell, as itself
    (`specdec/fast/kernels/`) or through one of its modules (`specdec/fast/model.py`)."""
    cells = [line.split("|")[1] for line in architecture.splitlines() if line.startswith("| ")]
    return [n for n in names if not any(re.search(rf"`{re.escape(n)}/", cell) for cell in cells)]


def missing_table_paths(architecture: str, root: Path = ROOT) -> list[str]:
    """Paths a module-table row names in its first cell (`specdec/x.py`, `scripts/`, or the short `fast/x.py`
    meaning specdec/fast/x.py) that do not exist."""
    missing = []
    for line in architecture.splitlines():
        if not line.startswith("| "):
            continue
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", line.split("|")[1]):
            path = name if name.startswith(("specdec/", "scripts/")) else f"specdec/{name}"
            if not (root / path).exists():
                missing.append(name)
    return missing


# --- the package ---------------------------------------------------------------------------------------

def test_no_module_is_over_400_lines():
    assert [m for m in long_modules() if m.split(":")[0] not in KNOWN_LONG_MODULES] == []
    assert long_modules(ROOT / "tests") == []  # the tests mirror the package, and split by topic as it does


def test_the_package_root_holds_at_most_12_modules():
    assert len(root_modules()) <= MAX_ROOT_MODULES, root_modules()


def test_architectures_import_arrows_hold():
    assert {"specdec.core.verify", "specdec.engine.engine", "specdec.loop.chain", "specdec.cli"} <= GRAPH.keys()
    assert "specdec.core" in GRAPH["specdec.engine.step_runner"]  # the graph sees imports at all
    assert [b for b in broken_arrows(GRAPH) if b not in KNOWN_BROKEN_ARROWS] == []


def test_every_known_exception_is_still_needed():
    long = {m.split(":")[0] for m in long_modules()}
    fixed = [m for m in KNOWN_LONG_MODULES if m not in long]
    fixed += [b for b in KNOWN_BROKEN_ARROWS if b not in broken_arrows(GRAPH)]
    assert fixed == [], "fixed: delete these entries from tests/test_structure.py's KNOWN_* lists"


def test_the_module_table_names_every_subpackage():
    names = subpackages()
    assert {"specdec/core", "specdec/engine", "specdec/loop", "specdec/server"} <= set(names)
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert unlisted_subpackages(architecture, names) == []
    assert missing_table_paths(architecture) == []  # and every module it names is there


# --- negative controls: each rule reports what breaks it ---------------------------------------------

@pytest.mark.parametrize("importer, imported, rule", [
    ("specdec.core.sampling", "specdec.rng", "core imports nothing"),
    ("specdec.request", "specdec.models.protocol", "request/step import only"),
    ("specdec.step", "specdec.engine", "request/step import only"),
    ("specdec.loop.chain", "specdec.engine.engine", "the loop and the engine never import each other"),
    ("specdec.engine.drafters", "specdec.loop.tree_decoding", "the loop and the engine never import each other"),
    ("specdec.text.api", "specdec.cli.common", "nothing of the library imports the CLI"),
    ("specdec.bench.traffic", "specdec.cli", "a benchmark never imports the CLI"),
    ("specdec.drafters.model", "specdec.loop.chain", "models and drafters never import a runner"),
    ("specdec.models.hf", "specdec.decoding", "models and drafters never import a runner"),
    ("specdec.engine.engine", "specdec.text.api", "the library never imports the outer ring"),
    ("specdec.engine.runner", "specdec.engine.scheduler", "the engine's scheduler and runner never import"),
    ("specdec.engine.step_runner", "specdec.engine.scheduler", "the engine's scheduler and runner never import"),
    ("specdec.engine.scheduler", "specdec.engine.runner_parts", "the engine's scheduler and runner never import"),
    ("specdec.decoding", "specdec.server.app", "the library never imports the outer ring"),
])
def test_each_arrow_rule_reports_an_import_that_breaks_it(importer, imported, rule):
    graph = {**GRAPH, importer: GRAPH.get(importer, set()) | {imported}}
    assert any(b.startswith(rule) for b in broken_arrows(graph)), rule
    assert broken_arrows({importer: {"specdec.core"} if not importer.startswith("specdec.core") else set()}) == []


def test_the_import_reader_resolves_lazy_relative_and_type_only_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import slots\n"
        "from ..core import verify\n"
        "import specdec.rng as r\n"
        "if TYPE_CHECKING:\n"
        "    from specdec.loop.chain import run_chain\n"
        "def f():\n"
        "    from specdec.cli.common import load_drafter\n"
    )
    modules = frozenset({"specdec.engine.slots", "specdec.core.verify"})
    found = imports_of(source, "specdec.engine.step_runner", modules=modules)
    assert found == {"specdec.engine.slots", "specdec.core.verify", "specdec.rng", "specdec.cli.common"}
    assert broken_arrows({"specdec.engine.step_runner": found}) == [
        "nothing of the library imports the CLI: specdec.engine.step_runner -> specdec.cli.common"]


def test_the_size_rules_report_a_long_module_and_a_crowded_root(tmp_path):
    fake = tmp_path / "specdec"
    (fake / "sub").mkdir(parents=True)
    (fake / "sub" / "__init__.py").write_text("")
    (fake / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (fake / "sub" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    for i in range(MAX_ROOT_MODULES + 1):
        (fake / f"m{i}.py").write_text("")
    assert long_modules(fake) == [f"specdec/sub/big.py: {MAX_LINES + 1} lines"]
    assert len(root_modules(fake)) == MAX_ROOT_MODULES + 1 > MAX_ROOT_MODULES
    (fake / "sub" / "inner").mkdir()
    (fake / "sub" / "inner" / "__init__.py").write_text("")
    assert subpackages(fake) == ["specdec/sub", "specdec/sub/inner"]


def test_the_table_check_reports_a_subpackage_it_does_not_name():
    table = ("| module | what | depends |\n|---|---|---|\n| `specdec/core/` | x | torch |\n"
             "| `specdec/fast/t5.py` | y, not `specdec/zoo/` | z |\n")
    names = ["specdec/core", "specdec/fast", "specdec/fast/kernels", "specdec/zoo"]
    assert unlisted_subpackages(table, names) == ["specdec/fast/kernels", "specdec/zoo"]  # a later cell: not a row
    assert unlisted_subpackages(table + "prose naming `specdec/zoo/` outside the table\n", ["specdec/zoo"]) == [
        "specdec/zoo"]


def test_the_table_check_reports_a_module_that_is_gone():
    table = "| `specdec/core/` | x | y |\n| `specdec/engine/gone.py`, `fast/model.py`, `loop/no.py` | `not/a/cell.py` | z |\n"
    assert missing_table_paths(table) == ["specdec/engine/gone.py", "loop/no.py"]
