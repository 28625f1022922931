"""docs/integration.md section 10, applied to upstream pypto-serving as written: the docs are the
patch.

Each swap in section 10 is a code block whose class subclasses a stand-in of an upstream runner
(``class Qwen314BModelRunner(UpstreamQwenRunner)``, ``class DeepSeekV4ModelRunner(
UpstreamDeepSeekRunner)``, ...). :func:`swapped_classes` takes from each block its imports, its
module-level helper functions and its swap classes, and makes each swap class again with
upstream's real runner class as its base, in a namespace of upstream's module globals (so the
block's other stand-ins, such as upstream's records, resolve to upstream's own). :func:`install`
then puts the new class in place of upstream's wherever upstream's modules hold it.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integration.md"

RUNNERS = {
    "Qwen314BModelRunner": "pypto_serving.model.qwen.npu_runner",
    "DeepSeekV4ModelRunner": "pypto_serving.model.deepseek.npu_runner",
}
"""The upstream runner classes a swap replaces, and the modules that define them."""

SECTIONS = {"preparer": ("10.1", "10.3"), "executor": ("10.1", "10.3", "10.4")}
"""The subsections of section 10 that each route applies, in order."""


def blocks(section: str, text: str | None = None) -> list[str]:
    """The ``python`` code blocks of subsection ``section`` (``"10.3"``) of the integration
    guide, in order."""
    text = DOCS.read_text() if text is None else text
    start = re.search(rf"^### {re.escape(section)} .*$", text, re.M)
    if start is None:
        raise LookupError(f"docs/integration.md has no section {section}")
    end = re.search(r"^#{2,3} ", text[start.end() :], re.M)
    body = text[start.end() : start.end() + end.start() if end else len(text)]
    return re.findall(r"^```python\n(.*?)^```", body, re.M | re.S)


def swapped_classes(route: str) -> dict[str, type]:
    """Upstream's runner classes with the swap classes of ``route``'s sections made over them:
    ``{class name: new class}`` (a later section's swap of a class builds on the earlier)."""
    made: dict[str, type] = {}
    shared: dict[str, Any] = {}  # imports and helpers of the sections so far
    for section in SECTIONS[route]:
        for source in blocks(section):
            tree = ast.parse(source)
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    exec(compile(ast.Module([node], []), f"<docs {section}>", "exec"), shared)
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    shared[node.name] = node
                elif isinstance(node, ast.ClassDef) and node.name in RUNNERS:
                    made[node.name] = _make(node, section, made, shared)
    return made


def _make(node: ast.ClassDef, section: str, made: dict[str, type], shared: dict[str, Any]) -> type:
    """Class ``node`` with the upstream runner (or an earlier section's swap of it) as its base,
    its names resolved in the upstream module's globals, then the block's imports and helpers."""
    module = importlib.import_module(RUNNERS[node.name])
    base = made.get(node.name) or getattr(module, node.name)
    namespace = dict(vars(module))
    namespace.update({k: v for k, v in shared.items() if not isinstance(v, ast.FunctionDef)})
    helpers = [v for v in shared.values() if isinstance(v, ast.FunctionDef)]
    if helpers:  # module-level helpers of the blocks, defined in the same namespace
        exec(compile(ast.Module(helpers, []), f"<docs {section}>", "exec"), namespace)
    node = ast.ClassDef(
        name=node.name,
        bases=[ast.Name("__upstream_base__", ast.Load())],
        keywords=[],
        body=node.body,
        decorator_list=[],
    )
    namespace["__upstream_base__"] = base
    exec(compile(ast.fix_missing_locations(ast.Module([node], [])), f"<docs {section}>", "exec"),
         namespace)  # fmt: skip
    cls: type = namespace[node.name]
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls


def install(route: str) -> dict[str, type]:
    """Put ``route``'s swapped classes in place of upstream's in every loaded module that holds
    upstream's."""
    originals = {name: getattr(importlib.import_module(RUNNERS[name]), name) for name in RUNNERS}
    made = swapped_classes(route)
    for module in list(sys.modules.values()):
        for attr, value in list(vars(module).items()) if module is not None else ():
            for name, cls in made.items():
                if value is originals[name]:
                    setattr(module, attr, cls)
    return made
