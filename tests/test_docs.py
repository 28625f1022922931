"""Every ``python`` block in the README and docs/ runs as written (blocks of one file share a
namespace, in order), so the examples cannot rot."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CI = ROOT / ".ci" / "run"
repository_only = pytest.mark.skipif(
    not CI.exists(), reason=".ci/run is in the repository, not the sdist"
)


CONTINUES = "# continues the examples above"
"""The first line of a block that needs the blocks before it in its file (every other block
runs when copied alone)."""


def _blocks(document: Path) -> list[tuple[int, str]]:
    """Each ``python`` block of ``document`` with the line its code starts on."""
    text = document.read_text()
    return [
        (text.count("\n", 0, match.start(1)) + 1, match.group(1))
        for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_python_examples_run(document: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs.{document.stem}"}
    for line, block in _blocks(document):
        exec(compile(block, f"<{document.name}:{line}>", "exec"), namespace)


ALONE = [
    pytest.param(document, line, block, id=f"{document.name}:{line}")
    for document in DOCUMENTS
    for line, block in _blocks(document)
    if not block.startswith(CONTINUES)
]


@pytest.mark.parametrize(("document", "line", "block"), ALONE)
def test_each_python_example_runs_alone(document: Path, line: int, block: str) -> None:
    """Copied on its own, an example runs: its imports and the lines it needs are in it, unless
    its first line says it continues the examples above."""
    namespace: dict[str, object] = {"__name__": f"docs.{document.stem}.{line}"}
    exec(compile(block, f"<{document.name}:{line}>", "exec"), namespace)


def test_most_examples_run_alone() -> None:
    blocks = [block for document in DOCUMENTS for _, block in _blocks(document)]
    continued = [block for block in blocks if block.startswith(CONTINUES)]
    assert len(continued) * 4 < len(blocks), "mark only the blocks that truly continue others"


@repository_only
def test_readme_has_examples_and_the_ci_test_command() -> None:
    text = (ROOT / "README.md").read_text()
    assert "```python" in text
    assert 'pip install -e ".[test]"' in text
    assert re.search(r"^pytest$", text, flags=re.MULTILINE)
    assert re.search(r"^pytest$", CI.read_text(), flags=re.MULTILINE)


@repository_only
def test_readme_says_how_to_install_the_cpu_wheel_first() -> None:
    """The two set-up commands first, as they work on this project's machines (the local CPU
    wheel before blockprep), then the CPU-torch note with PyTorch's CPU index."""
    text = (ROOT / "README.md").read_text()
    first = text.index("pip install torch==2.13.0")
    assert first < text.index('pip install -e ".[test]"')
    assert first < text.index("--index-url https://download.pytorch.org/whl/cpu")
    ci = CI.read_text()
    assert "pip install torch==2.13.0" in ci


def test_section_10_holds_the_swap_classes_the_upstream_harness_applies() -> None:
    """``bench/upstream_suite`` (repository-only) takes each route's swap classes from the code
    blocks of docs/integration.md section 10: every route swaps both upstream runners."""
    swap = pytest.importorskip("bench.upstream_suite.swap")
    for route, sections in swap.SECTIONS.items():
        found = set()
        for section in sections:
            for source in swap.blocks(section):
                found |= {
                    node.name
                    for node in ast.parse(source).body
                    if isinstance(node, ast.ClassDef) and node.name in swap.RUNNERS
                }
        assert found == set(swap.RUNNERS), route
