"""``python -m blockprep bench``: checks before it times, reports what it measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blockprep.__main__ import main
from blockprep.bench.runner import MismatchError, run_workload, verify
from blockprep.bench.workloads import CONSTRUCTIONS, Workload, standard_workloads


def test_bench_writes_table_json_and_plot(tmp_path: Path, capsys: Any) -> None:
    json_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--steps", "3", "--workload", "qwen3-14b", "--workload", "paged-8x128-mixed"]
    assert main([*argv, "--json", str(json_path), "--plot", str(plot_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["workload", "construction", "median", "us"]
    assert sum(line.startswith("qwen3-14b") for line in out.splitlines()) == 3
    document = json.loads(json_path.read_text())
    assert document["options"] == {
        "workloads": ["qwen3-14b", "paged-8x128-mixed"],
        "steps": 3,
        "seed": 0,
    }
    results = document["results"]
    assert [(r["workload"], r["construction"]) for r in results] == [
        (w, c) for w in ("qwen3-14b", "paged-8x128-mixed") for c in CONSTRUCTIONS
    ]
    for result in results:
        assert result["steps"] == 3 and result["median_us"] > 0 and result["floor_us"] > 0
        assert result["p90_us"] >= result["median_us"]
    pre_fix = results[0]
    assert pre_fix["speedup"] == 1.0 and pre_fix["cells_per_step"] == 16 * 32
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: Any, capsys: Any) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["bench", "--steps", "1", "--plot", "x.png"]) == 2
    assert "pip install 'blockprep[plot]'" in capsys.readouterr().err


class _Broken:
    """A construction that gets one cell wrong on the third step."""

    def __init__(self) -> None:
        self.table = np.zeros((2, 3), dtype=np.int32)
        self.count = 0

    def step(self, item: Any) -> None:
        self.count += 1
        self.table[...] = item
        if self.count == 3:
            self.table[1, 2] += 1

    def buffers(self) -> dict[str, Any]:
        return {"table": self.table}

    def written(self) -> None:
        return None


class _Right(_Broken):
    def step(self, item: Any) -> None:
        self.table[...] = item


def _workload(blockprep: type[_Broken]) -> Workload:
    return Workload(
        "toy",
        "a toy",
        lambda steps, seed: (np.full((2, 3), i, dtype=np.int32) for i in range(steps + 1)),
        {"pre-fix": _Right, "fix": _Right, "blockprep": blockprep},
        rows=2,
        cells=6,
    )


def test_a_mismatch_is_an_error_naming_the_first_differing_cell() -> None:
    with pytest.raises(
        MismatchError,
        match=r"^toy: blockprep differs from pre-fix at step 2, table\[1, 2\]: 3 != 2$",
    ):
        verify(_workload(_Broken), 5, 0)
    with pytest.raises(MismatchError):
        run_workload(_workload(_Broken), 5, 0)
    results = run_workload(_workload(_Right), 5, 0)
    assert [r.construction for r in results] == list(CONSTRUCTIONS)


def test_cli_mismatch_exits_with_the_error_and_no_table(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(
        "blockprep.__main__.standard_workloads", lambda: {"toy": _workload(_Broken)}
    )
    assert main(["bench", "--steps", "4"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error: toy: blockprep differs from pre-fix at step 2" in captured.err


def test_standard_workloads_agree_across_constructions() -> None:
    for workload in standard_workloads().values():
        verify(workload, 4, 1)
