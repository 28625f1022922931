"""Upstream pypto-serving's own unit suite on blockprep, as docs/integration.md section 10 swaps it
in: the docs are the patch (repository-only; not installed, not run by CI).

Usage, from the repository root, with a clone of upstream at the pinned commit (its ``HEAD``; a
bare mirror works: the commit is read with ``git archive``; readable through the fork
Little-oil/pypto-serving; its pypto-lib submodule is not needed)::

    pip install safetensors msgspec fastapi uvicorn pydantic transformers   # upstream's imports
    python -m bench.upstream_suite.run PATH/TO/pypto-serving

For each route and backend it copies upstream's package and tests to a temporary directory, runs
``pytest tests/unit`` there with stand-ins for the NPU runtime (``standins/``: ``pypto``,
``simpler``, ``torch.npu``) and, for a route other than ``pristine``, section 10's swap classes
in place of upstream's runners (:mod:`bench.upstream_suite.swap`), and prints passed and failed
per route: ``pristine`` (upstream as it is), ``preparer`` (10.1 and 10.3), ``executor`` (10.1,
10.3 and 10.4), each on the compiled kernel and on the twin (``BLOCKPREP_PURE_PYTHON=1``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PINNED = "9b1a264"
"""The upstream commit section 10 is written against."""

ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
ROUTES = ("pristine", "preparer", "executor")
BACKENDS = {"c": "0", "python": "1"}


def copy_upstream(upstream: Path, commit: str, into: Path) -> Path:
    """Upstream's package and tests at ``commit`` (``git archive``: a bare mirror works too)
    under ``into``, with the DeepSeek kernel directory its executor looks for (empty: the unit
    suite compiles nothing)."""
    target = into / "upstream"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(upstream), "archive", commit, "pypto_serving", "tests"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    (target / "pypto-lib" / "models" / "deepseek_v4_flash_mtp").mkdir(parents=True)
    return target


def run_suite(copy: Path, route: str, backend: str, python: str) -> tuple[int, int, list[str]]:
    """``(passed, failed, failed test ids)`` of upstream's unit suite on ``route``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDINS), str(copy), str(ROOT)])
    env["BLOCKPREP_UPSTREAM_ROUTE"] = route
    env["BLOCKPREP_PURE_PYTHON"] = BACKENDS[backend]
    command = [python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
    command += ["-p", "upstream_plugin", "-p", "upstream_route", "tests/unit"]
    out = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True).stdout
    passed = re.search(r"(\d+) passed", out)
    failed = re.search(r"(\d+) (?:failed|error)", out)
    if passed is None and failed is None:
        raise RuntimeError(f"upstream's suite did not run on route {route}:\n{out[-3000:]}")
    names = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return int(passed.group(1)) if passed else 0, int(failed.group(1)) if failed else 0, names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream", type=Path, help="a checkout of pypto-serving")
    parser.add_argument("--routes", default=",".join(ROUTES), help="comma-separated")
    parser.add_argument("--backends", default="c,python", help="comma-separated: c, python")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run with")
    parser.add_argument("--any-commit", action="store_true", help=f"not only {PINNED}")
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if not head.startswith(PINNED) and not args.any_commit:
        print(f"upstream is at {head or '?'}, section 10 is written against {PINNED}")
        return 2
    print(f"upstream pypto-serving {head[:7]}, blockprep {ROOT}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = copy_upstream(args.upstream, head, Path(tmp))
        for route in args.routes.split(","):
            for backend in args.backends.split(","):
                passed, failed, names = run_suite(copy, route, backend, args.python)
                print(f"{route:9} {backend:7} {passed}/{passed + failed} passed")
                for name in names:
                    print(f"    failed: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
