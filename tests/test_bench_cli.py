"""``python -m blockprep bench``: checks before it times, reports what it measured."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pickle
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from blockprep.__main__ import main
from blockprep.bench.base import CONSTRUCTIONS, Stepper, Workload
from blockprep.bench.deepseek_workloads import DeepSeekStep, deepseek_wire_trace
from blockprep.bench.report import footer, warnings
from blockprep.bench.runner import (
    MismatchError,
    Result,
    RunResult,
    run_workload,
    time_workload,
    verify,
)
from blockprep.bench.workloads import standard_workloads

ROOT = Path(__file__).resolve().parent.parent


def _table_lines(out: str) -> list[str]:
    """The table of the bench's stdout: from its header row to the first blank line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("workload "))
    return lines[start : lines.index("", start)]


def test_bench_writes_table_json_and_plot(tmp_path: Path, capsys: Any) -> None:
    json_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = ["bench", "--steps", "3", "--workload", "qwen3-14b", "--workload", "paged-8x128-mixed"]
    threads = torch.get_num_threads()
    assert main([*argv, "--json", str(json_path), "--plot", str(plot_path)]) == 0
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert out.startswith("blockprep bench: 3 timed steps a workload, 1 run, seed 0; every ")
    assert "one torch thread" in out.splitlines()[0]
    lines = _table_lines(out)
    assert lines[0].split()[:7] == [
        "workload",
        "construction",
        "median",
        "us",
        "p10-p90",
        "us",
        "vs",
    ]
    assert sum(line.startswith("qwen3-14b") for line in lines) == 3
    assert "qwen3-14b: Qwen3-14B decode prepare" in out
    # What happened comes first: the speed-ups (no headline workload ran: every workload's),
    # the equality check, then the table and its legend.
    top = out.splitlines()[2:7]
    assert top[0] == "blockprep against upstream (median step; higher: faster):"
    assert [line.split()[0] for line in top[1:3]] == ["qwen3-14b", "paged-8x128-mixed"]
    assert "x vs pre-fix" in top[1] and "x vs fix" in top[1]
    assert top[3].startswith("equality check passed: the constructions' buffers equal cell for")
    assert out.index("equality check passed") < out.index("workload ") < out.index("columns: ")
    document = json.loads(json_path.read_text())
    assert document["options"] == {
        "workloads": ["qwen3-14b", "paged-8x128-mixed"],
        "steps": 3,
        "runs": 1,
        "seed": 0,
        "torch_threads": 1,
        "interleaved": True,
    }
    assert set(document["conditions"]) == {"load_averages", "warnings", "descriptions"}
    results = document["results"]
    assert [(r["workload"], r["construction"]) for r in results] == [
        (w, c) for w in ("qwen3-14b", "paged-8x128-mixed") for c in CONSTRUCTIONS
    ]
    for result in results:
        assert result["steps"] == 3 and result["median_us"] > 0 and result["floor_us"] > 0
        assert result["p10_us"] <= result["median_us"] <= result["p90_us"]
        assert len(result["runs"]) == 1
    pre_fix, fix = results[0], results[1]
    assert pre_fix["speedup"] == 1.0 and pre_fix["cells_per_step"] == 16 * 32
    assert fix["speedup_fix"] == 1.0
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("option", ["--steps", "--runs"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_counts_below_one_are_rejected(option: str, value: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", option, value])
    assert exit_info.value.code == 2
    assert f"argument {option}:" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_unwritable_output_path_fails_before_anything_runs(
    option: str, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setattr("blockprep.__main__.verify", _never)
    monkeypatch.setattr("blockprep.__main__.time_workload", _never)
    for path in (tmp_path / "missing" / "out", tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", "--steps", "1", option, str(path)])
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "is a directory" in err


def _never(*args: Any) -> None:
    raise AssertionError("the bench ran")


def test_round_trip_workloads_run_and_verify(tmp_path: Path, capsys: Any) -> None:
    json_path = tmp_path / "bench.json"
    names = ["deepseek-v4-wire", "deepseek-v4-wire-cold"]
    argv = ["bench", "--steps", "2", "--runs", "2", "--json", str(json_path)]
    assert main([*argv, *(arg for name in names for arg in ("--workload", name))]) == 0
    out = capsys.readouterr().out
    assert "2 runs (medians of the runs' medians)" in out.splitlines()[0]
    lines = _table_lines(out)
    assert [line.split()[0] for line in lines[2:]] == [n for n in names for _ in CONSTRUCTIONS]
    assert all(line.count("x (") == 2 for line in lines[2:])  # each speed-up's min-max
    assert "pickle round trip" in out and "2 slots in turn" in out and "0.5% churn" in out
    results = json.loads(json_path.read_text())["results"]
    for result in results:
        assert len(result["runs"]) == 2 and result["steps"] == 2
        assert result["median_us"] == statistics.median(r["median_us"] for r in result["runs"])
    rebuilds = [r for r in results if r["construction"] != "blockprep"]
    assert {(r["rows_per_step"], r["cells_per_step"]) for r in rebuilds} == {(448, 688_128)}


def test_the_wire_trace_round_trips_into_alternate_slots() -> None:
    items = list(deepseek_wire_trace(3, 0))
    assert [item.slot for item in items] == [0, 1, 0, 1]
    batches = [pickle.loads(item.batch) for item in items]
    assert all(len(batch.request_ids) == 64 for batch in batches)
    first, second = (batch.block_ids_by_group for batch in batches[:2])
    assert all(a["ori"] is not b["ori"] for a, b in zip(first, second, strict=True))
    big = [i for groups in first for i in groups["csa_state"] if i > 256]
    assert big and all(type(i) is int for i in big)


@pytest.mark.parametrize("name", ["deepseek-v4-wire-delta", "qwen3-14b-wire-b16"])
def test_each_construction_receives_only_the_payload_it_consumes(name: str) -> None:
    workload = standard_workloads()[name]
    item = next(workload.trace(1, 0))
    received = {c: make().receive(item) for c, make in workload.constructions.items()}
    for construction, value in received.items():
        batch = value.batch if isinstance(value, DeepSeekStep) else value
        full = construction != "blockprep"
        assert (batch.block_deltas is None) == full
        assert bool(batch.block_ids_by_group or batch.block_ids) == full
    assert received["pre-fix"] is not received["fix"]


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: Any, capsys: Any) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["bench", "--steps", "1", "--plot", "x.png"]) == 2
    assert "pip install 'blockprep[plot]'" in capsys.readouterr().err


class _Broken(Stepper):
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


class _Logged(_Right):
    """Records, into a shared log, its construction's name and torch's thread count per step."""

    log: ClassVar[list[tuple[str, int]]] = []
    name = ""

    def step(self, item: Any) -> None:
        super().step(item)
        self.log.append((self.name, torch.get_num_threads()))


def _logged_workload(cold: bool) -> Workload:
    constructions = {name: type(name, (_Logged,), {"name": name}) for name in CONSTRUCTIONS}
    return dataclasses.replace(_workload(_Right), constructions=constructions, cold=cold)


@pytest.mark.parametrize("cold", [False, True])
def test_constructions_are_interleaved_round_by_round_on_one_thread(cold: bool) -> None:
    _Logged.log.clear()
    threads = torch.get_num_threads()
    timings = time_workload(_logged_workload(cold), 4, 0)
    assert torch.get_num_threads() == threads
    timed = _Logged.log if cold else _Logged.log[3:]  # steady: the warm-up step first
    a, b, c = CONSTRUCTIONS
    assert [name for name, _ in timed] == [a, b, c, b, c, a, c, a, b, a, b, c]
    assert {count for _, count in _Logged.log} == {1}
    assert all(len(t.durations_us) == 4 for t in timings.values())


def test_sequential_times_each_construction_back_to_back(capsys: Any) -> None:
    _Logged.log.clear()
    timings = time_workload(_logged_workload(False), 3, 0, interleaved=False)
    a, b, c = CONSTRUCTIONS
    assert [name for name, _ in _Logged.log] == [a, b, c, a, a, a, b, b, b, c, c, c]
    assert all(len(t.durations_us) == 3 for t in timings.values())
    assert main(["bench", "--workload", "paged-8x128-mixed", "--steps", "2", "--sequential"]) == 0
    assert "timed one after another (--sequential)" in capsys.readouterr().out


def test_an_uncounted_construction_shows_no_rows(
    monkeypatch: Any, tmp_path: Path, capsys: Any
) -> None:
    monkeypatch.setattr("blockprep.__main__.standard_workloads", lambda: {"toy": _workload(_Right)})
    json_path = tmp_path / "toy.json"
    assert main(["bench", "--steps", "2", "--json", str(json_path)]) == 0
    assert all(
        line.split()[-3:-1] == ["-", "-"] for line in _table_lines(capsys.readouterr().out)[2:]
    )
    results = json.loads(json_path.read_text())["results"]
    assert {r["rows_per_step"] for r in results} == {None}


def _result(construction: str, p10: float, p90: float, speedups: Sequence[float]) -> Result:
    runs = tuple(RunResult(1.0, p10, p90, s, s) for s in speedups)
    return Result("w", construction, 10, 1.0, p10, p90, 1.0, 1.0, 1.0, 1.0, 1.0, runs)


def test_warnings_name_a_noisy_rebuild_disagreeing_runs_and_load() -> None:
    quiet = [_result("pre-fix", 1.0, 1.2, [1.0, 1.0]), _result("blockprep", 1.0, 3.0, [9, 10])]
    assert warnings(quiet, [0.9], cpus=2) == []
    noisy = [_result("pre-fix", 1.0, 2.0, [1.0]), _result("blockprep", 1.0, 1.0, [9, 13])]
    found = warnings(noisy, [1.7], cpus=2)
    assert [line.split(":")[0] for line in found] == [
        "w pre-fix",
        "w blockprep",
        "w blockprep",
        "load average up to 1.70 on 2 CPUs (above 1.5; the bench itself counts about 1)",
    ]
    assert footer(found) == (
        "warning: these figures may be unreliable (1 noisy upstream rebuild; 2 speed-ups varying "
        "over runs; load average up to 1.70 on 2 CPUs): rerun on a quiet machine (--runs 3); "
        "--json lists each sign"
    )
    assert footer([]) == ""


# --- issue 18 and 19: outputs checked up front, workloads once, the plot ------------------------


def test_a_plot_path_that_is_no_png_fails_before_anything_runs(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setattr("blockprep.__main__.verify", _never)
    monkeypatch.setattr("blockprep.__main__.time_workload", _never)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--steps", "1", "--plot", str(tmp_path / "x.txt")])
    assert exit_info.value.code == 2
    assert "the plot is a PNG; give a path ending in .png" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_json_device_that_cannot_take_a_byte_fails_before_anything_runs(
    monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setattr("blockprep.__main__.verify", _never)
    monkeypatch.setattr("blockprep.__main__.time_workload", _never)
    assert main(["bench", "--steps", "1", "--json", "/dev/full"]) == 2
    assert "error: --json /dev/full: [Errno 28] No space left on device" in capsys.readouterr().err


def test_a_workload_named_twice_runs_once(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    calls: list[str] = []
    real = time_workload

    def counted(workload: Workload, *args: Any, **kwargs: Any) -> Any:
        calls.append(workload.name)
        return real(workload, *args, **kwargs)

    monkeypatch.setattr("blockprep.__main__.time_workload", counted)
    json_path = tmp_path / "b.json"
    argv = ["bench", "--steps", "2", "--json", str(json_path)]
    assert main([*argv, "--workload", "paged-8x128-mixed", "--workload", "paged-8x128-mixed"]) == 0
    assert calls == ["paged-8x128-mixed"]
    assert (
        sum(line.startswith("paged-8x128") for line in _table_lines(capsys.readouterr().out)) == 3
    )
    assert json.loads(json_path.read_text())["options"]["workloads"] == ["paged-8x128-mixed"]


def test_a_failed_run_leaves_existing_outputs_and_removes_new_ones(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(
        "blockprep.__main__.standard_workloads", lambda: {"toy": _workload(_Broken)}
    )
    old, new = tmp_path / "old.json", tmp_path / "new.png"
    old.write_text("previous results\n")
    assert main(["bench", "--steps", "4", "--json", str(old), "--plot", str(new)]) == 1
    assert old.read_text() == "previous results\n"
    assert not new.exists()


def test_plot_without_a_path_draws_outside_the_checkout(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    pytest.importorskip("matplotlib")
    from blockprep import __main__ as cli

    assert not cli.DEFAULT_PLOT.resolve().is_relative_to(Path(__file__).resolve().parents[1])
    monkeypatch.setattr(cli, "DEFAULT_PLOT", tmp_path / "default.png")
    assert main(["bench", "--steps", "2", "--workload", "paged-8x128-mixed", "--plot"]) == 0
    assert (tmp_path / "default.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {tmp_path / 'default.png'}" in capsys.readouterr().err


def _plotted(workload: str, construction: str, median: float, spread: float = 1.5) -> Result:
    speedup = 100.0 / median
    run = RunResult(median, median * 0.8, median * spread, speedup, 50.0 / median)
    return Result(
        workload,
        construction,
        10,
        median,
        median * 0.8,
        median * spread,
        speedup,
        50.0 / median,
        1.0,
        1.0,
        0.1,
        (run,),
    )


def test_the_plot_is_one_bar_per_workload_grouped_by_family_and_says_unreliable(
    monkeypatch: Any,
) -> None:
    pytest.importorskip("matplotlib")
    import io

    import matplotlib.pyplot as plt

    from blockprep.bench.report import write_plot

    names = ["deepseek-v4-wire", "qwen3-14b", "deepseek-v4-cold", "ring-8x4096-n65"]
    results = [
        _plotted(name, construction, median)
        for name in names
        for construction, median in (("pre-fix", 100.0), ("fix", 50.0), ("blockprep", 4.0))
    ]
    figures: list[Any] = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: figures.append(figure))
    for found in ([], ["qwen3-14b pre-fix: p90/p10 = 2.00 > 1.5"]):
        picture = io.BytesIO()
        write_plot(picture, results, found)
        png = picture.getvalue()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(png[16:20], "big") <= 1600  # IHDR width, pixels
    close("all")
    quiet, noisy = figures
    (axes,) = quiet.axes
    assert [t.get_text() for t in axes.get_yticklabels()] == [
        "DeepSeek V4 preparer",
        "  deepseek-v4-wire",
        "  deepseek-v4-cold",
        "Qwen3-14B preparer",
        "  qwen3-14b",
        "builders",
        "  ring-8x4096-n65",
    ]  # top to bottom
    bars = [patch.get_width() for patch in axes.patches]
    assert bars == [25.0] * 4  # pre-fix 100 us / blockprep 4 us, one bar each
    (whisker,) = {
        (round(s[0][0], 3), round(s[1][0], 3))
        for c in axes.collections
        for s in c.get_segments()
        if s[0][1] == s[1][1]  # the horizontal line of an error bar
    }
    assert whisker == (round(100 / 6.0, 3), round(100 / 3.2, 3))  # pre-fix / p90 .. / p10
    assert sorted(t.get_text() for t in axes.texts) == ["25.0x (vs fix 12.5x)"] * 4
    assert quiet._suptitle is None
    assert noisy._suptitle.get_text().startswith("UNRELIABLE RUN")
    assert "qwen3-14b pre-fix: p90/p10 = 2.00 > 1.5" in noisy._suptitle.get_text()


BLOCK_HYPOTHESIS = textwrap.dedent(
    """
    import runpy, sys

    class NoHypothesis:
        def find_spec(self, name, path=None, target=None):
            if name == "hypothesis" or name.startswith("hypothesis."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoHypothesis())
    sys.argv = ["blockprep", "bench", "--help"]
    try:
        runpy.run_module("blockprep", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        assert "hypothesis" not in sys.modules
        raise
    """
)


def test_bench_help_runs_without_hypothesis() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_HYPOTHESIS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: blockprep bench")
    from blockprep.simulation import DeepSeekV4SchedulerSim
    from blockprep.testing import DeepSeekV4SchedulerSim as Reexported

    assert Reexported is DeepSeekV4SchedulerSim


def test_version_names_the_kernel_and_the_versions_under_it(capsys: Any) -> None:
    import importlib.metadata

    import blockprep
    from blockprep import kernel_backend

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    line = capsys.readouterr().out
    assert line.startswith(f"blockprep {blockprep.__version__} (table kernel: {kernel_backend()}, ")
    assert f"torch {torch.__version__}, numpy {np.__version__})" in line
    assert importlib.metadata.version("blockprep") == blockprep.__version__


def test_one_version_in_the_changelog_and_the_package() -> None:
    import re
    from datetime import date

    from packaging.version import Version

    import blockprep

    changelog = ROOT / "CHANGELOG.md"
    if not changelog.exists():
        pytest.skip("CHANGELOG.md is in the repository, not the sdist")
    top = re.search(r"^## (\S+) \((.+)\)$", changelog.read_text(), flags=re.MULTILINE)
    assert top is not None
    if top.group(2) == "unreleased":  # the next release, under way: a development version of it
        assert Version(top.group(1)).base_version == Version(blockprep.__version__).base_version
    else:  # a release, dated: that version exactly
        assert Version(top.group(1)) == Version(blockprep.__version__)
        date.fromisoformat(top.group(2))
