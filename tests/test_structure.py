"""The house rules that keep blockprep small, checked on its source: imports point one way (no
import circle, counting imports inside functions and under ``TYPE_CHECKING``), no module over
700 lines, and the compiled kernel's surface is exactly the names pinned here (an addition or a
removal is a deliberate diff of this file; docs/architecture.md, "The compiled kernel")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import blockprep

PACKAGE = Path(blockprep.__file__).parent
MAX_LINES = 700

KERNEL_FUNCTIONS = {
    "differing_rows",
    "index_records",
    "paged_step",
    "step_slots",
}
"""The compiled ``blockprep._engine._kernel`` module's public functions."""

KERNEL_METHODS = {
    "apply_row",
    "apply_step",
    "bind",
    "clear",
    "commit",
    "forget",
    "held",
    "invalidate",
    "length",
    "rows_of",
    "stage",
}
"""The public methods of the compiled ``GroupKernel`` (its read-only members aside)."""

DIFFER_FUNCTIONS = {"diff_lists"}
"""The compiled ``blockprep._differ`` module's public functions."""

KNOWN_CIRCLES: list[list[str]] = []
"""Import circles allowed: none."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The blockprep modules that ``name`` imports anywhere in its source (a submodule's own
    package aside: Python imports it first anyway)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_no_import_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(graph) == KNOWN_CIRCLES


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_over_700_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)}: {lines} lines"


def test_the_kernel_surface_is_pinned() -> None:
    kernel = pytest.importorskip("blockprep._engine._kernel")
    differ = pytest.importorskip("blockprep._differ")

    def public(obj: object) -> set[str]:
        return {n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n))}

    assert public(kernel) - {"GroupKernel"} == KERNEL_FUNCTIONS
    assert public(kernel.GroupKernel) == KERNEL_METHODS
    assert public(differ) == DIFFER_FUNCTIONS
