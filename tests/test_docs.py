"""Every ``python`` block in the README and docs/ runs as written (blocks of one file share a
namespace, in order), so the examples cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_python_examples_run(document: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.DOTALL)
    namespace: dict[str, object] = {"__name__": f"docs.{document.stem}"}
    for block in blocks:
        exec(compile(block, f"<{document.name}>", "exec"), namespace)


def test_readme_has_examples_and_the_ci_test_command() -> None:
    text = (ROOT / "README.md").read_text()
    assert "```python" in text
    assert 'pip install -e ".[test]"' in text
    assert re.search(r"^pytest$", text, flags=re.MULTILINE)
    assert re.search(r"^pytest$", (ROOT / ".ci" / "run").read_text(), flags=re.MULTILINE)
