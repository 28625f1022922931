"""A built wheel's smoke test (cibuildwheel's test-command): both compiled modules load from the
installed package and answer one small call each, without importing torch or NumPy (none is
installed where torch has no wheel, as on musllinux). Exit status 0: the wheel works."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def load(package: Path, dotted: str) -> object:
    """The extension module ``dotted`` (``blockprep._engine._kernel``) from ``package``'s files,
    loaded alone: ``blockprep/__init__.py`` (which imports torch) does not run."""
    parts = dotted.split(".")[1:]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = package.joinpath(*parts[:-1], parts[-1] + suffix)
        if path.exists():
            spec = importlib.util.spec_from_file_location(dotted, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit(f"{dotted}: no compiled module in {package}")


def main() -> None:
    spec = importlib.util.find_spec("blockprep")  # finds the package without running it
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    kernel = load(package, "blockprep._engine._kernel")
    differ = load(package, "blockprep._differ")
    k = kernel.GroupKernel(False, 4, 100, 0, -1, 2, 1)  # paged, 4 columns, ids < 100, 2 rows
    plan, fault = k.stage(None, [[3, 1], [7]], [-2, -2], int)  # both rows new
    assert fault is None, fault
    table = memoryview(bytearray(2 * 4 * 4)).cast("i", shape=[2, 4])
    counts = memoryview(bytearray(2 * 4)).cast("i", shape=[2, 1])
    written, cells, _ = k.commit(plan, 0, table, counts, 0, False)
    assert (written, cells, table.tolist(), counts.tolist()) == (
        2,
        8,
        [[3, 1, -1, -1], [7, -1, -1, -1]],
        [[2], [1]],
    ), table.tolist()
    held: dict = {}
    done = differ.diff_lists(held, ["a"], [[5, 6]], None)
    assert done is not None and done[2] == {"a": [5, 6]}, done
    print(f"blockprep wheel smoke test passed ({sys.version.split()[0]}, {package})")


if __name__ == "__main__":
    main()
