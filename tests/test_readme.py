"""The README's usage example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_readme_quickstart_uses_the_ci_test_command() -> None:
    text = README.read_text()
    assert 'pip install -e ".[test]"' in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^pytest$", ci, flags=re.MULTILINE)
    assert re.search(r"^pytest$", text, flags=re.MULTILINE)
