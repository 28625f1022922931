"""Render benchmark results: a header, a text table, reliability warnings, JSON, a PNG of the
speed-ups."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np
import torch

from blockprep._engine import kernel_backend
from blockprep.bench.base import CONSTRUCTIONS
from blockprep.bench.runner import BASELINE, FIX, Result

SPREAD_LIMIT = 1.5
"""An upstream rebuild's p90/p10 per step above this says the machine was too noisy to trust."""
RUNS_LIMIT = 1.25
"""A speed-up's max/min over runs above this says the runs disagree too much to trust."""
BLOCKPREP = CONSTRUCTIONS[2]
"""The construction the plot draws (against the other two)."""
LOAD_MARGIN = 0.5
"""The load average (the bench's own busy thread included) may reach ``cpus - LOAD_MARGIN``."""


def header(steps: int, runs: int, seed: int, threads: int, *, interleaved: bool = True) -> str:
    """The conditions every figure of the table was measured under. ``threads``: torch's thread
    count outside the bench. Names the table kernel that ran (``c`` or the ``python`` twin)."""
    repeat = "1 run" if runs == 1 else f"{runs} runs (medians of the runs' medians)"
    order = (
        "constructions interleaved round by round"
        if interleaved
        else "constructions timed one after another (--sequential)"
    )
    return (
        f"blockprep bench: {steps} timed steps a workload, {repeat}, seed {seed}; every "
        f"construction on one torch thread (torch.set_num_threads(1); {threads} otherwise), "
        f"{order}, garbage collector off; table kernel: {kernel_backend()}"
    )


def _ratio(value: float, per_run: Sequence[float]) -> str:
    text = f"{value:,.1f}x"
    if len(per_run) > 1:
        text += f" ({min(per_run):,.1f}-{max(per_run):,.1f})"
    return text


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.1f}"


COLUMNS: tuple[tuple[str, Callable[[Result], str]], ...] = (
    ("workload", lambda r: r.workload),
    ("construction", lambda r: r.construction),
    ("median us", lambda r: f"{r.median_us:,.1f}"),
    ("p10-p90 us", lambda r: f"{r.p10_us:,.1f}-{r.p90_us:,.1f}"),
    ("vs pre-fix", lambda r: _ratio(r.speedup, [run.speedup for run in r.runs])),
    ("vs fix", lambda r: _ratio(r.speedup_fix, [run.speedup_fix for run in r.runs])),
    ("rows/step", lambda r: _number(r.rows_per_step)),
    ("cells/step", lambda r: _number(r.cells_per_step)),
    ("floor us", lambda r: f"{r.floor_us:,.1f}"),
)
"""Title and cell of each table column. With several runs a speed-up shows its min-max over the
runs in parentheses."""


def table(results: Sequence[Result]) -> str:
    """A fixed-width text table, one line per construction and workload."""
    rows = [[cell(r) for _, cell in COLUMNS] for r in results]
    headers = [title for title, _ in COLUMNS]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = []
    for line in [headers, *rows]:
        cells = [
            cell.ljust(width) if index < 2 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


HEADLINE = (
    "deepseek-v4-wire",
    "deepseek-v4-wire-delta",
    "deepseek-v4-wire-cold",
    "qwen3-14b-wire-b16",
    "qwen3-14b-wire-b256",
)
"""The workloads the headline shows (when they ran; otherwise every workload that ran)."""

COLUMN_LEGEND = """\
columns: median us = the median step, microseconds; p10-p90 us = the 10th-90th percentile of
every timed step; vs pre-fix, vs fix = upstream's median step before its fix (pre-fix) or with
its fix (fix) divided by this construction's, within each run (higher: faster; several runs:
their range in parentheses); rows/step, cells/step = block-table rows and cells written a step
(- where not counted); floor us = the time to copy every table cell once (the memory floor of a
full rewrite). constructions: pre-fix and fix = upstream's two ways, blockprep = this library."""


def headline(results: Sequence[Result], loads: Sequence[float], cpus: int) -> str:
    """What happened, first: blockprep's speed-up against upstream's two ways on each headline
    workload that ran (every workload when none did), that the equality check passed (the
    report is only made then), and the machine's load."""
    ours = [r for r in results if r.construction == BLOCKPREP]
    shown = [r for r in ours if r.workload in HEADLINE] or ours
    width = max((len(r.workload) for r in shown), default=0)
    lines = ["blockprep against upstream (median step; higher: faster):"]
    lines += [
        f"  {r.workload.ljust(width)}  {r.speedup:,.1f}x vs pre-fix  {r.speedup_fix:,.1f}x vs fix"
        for r in shown
    ]
    workloads = len({r.workload for r in results})
    lines.append(
        "equality check passed: the constructions' buffers equal cell for cell on every checked "
        f"step ({workloads} workload{'s' if workloads != 1 else ''})"
    )
    if loads:
        lines.append(f"load average: up to {max(loads):.2f} on {cpus} CPUs")
    return "\n".join(lines)


def legend(descriptions: Mapping[str, str]) -> str:
    """One line per workload: its name and the conditions it assumes."""
    return "\n".join(f"{name}: {description}" for name, description in descriptions.items())


def load_average() -> float | None:
    """The 1-minute load average, or ``None`` where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def warnings(results: Sequence[Result], loads: Sequence[float], cpus: int) -> list[str]:
    """Why the figures may be unreliable, one sentence each (empty if nothing says so).

    An upstream rebuild (pre-fix or fix) whose p90/p10 exceeds :data:`SPREAD_LIMIT`: it does the
    same work every step, so its spread is the machine's noise, which interleaving spreads over
    every construction (blockprep's own steps vary by design: a step where requests leave or
    rings grow writes more, so its spread is shown but not judged); a speed-up whose max/min over
    runs exceeds :data:`RUNS_LIMIT`; a load average (sampled after each timing) above ``cpus -
    LOAD_MARGIN``: besides the bench's own thread, other work kept most cores busy (on 2 CPUs,
    more than half a core).
    """
    found = []
    for r in results:
        name = f"{r.workload} {r.construction}"
        if r.construction in (BASELINE, FIX) and r.p90_us > SPREAD_LIMIT * r.p10_us:
            found.append(f"{name}: p90/p10 = {r.p90_us / r.p10_us:.2f} > {SPREAD_LIMIT}")
        for label, per_run in (
            ("vs pre-fix", [run.speedup for run in r.runs]),
            ("vs fix", [run.speedup_fix for run in r.runs]),
        ):
            if max(per_run) > RUNS_LIMIT * min(per_run):
                found.append(
                    f"{name}: {label} ranges {min(per_run):,.1f}-{max(per_run):,.1f}x over runs "
                    f"(max/min > {RUNS_LIMIT})"
                )
    if loads and max(loads) > cpus - LOAD_MARGIN:
        found.append(
            f"load average up to {max(loads):.2f} on {cpus} CPUs (above {cpus - LOAD_MARGIN}; "
            "the bench itself counts about 1): other work competed for the CPUs"
        )
    return found


def footer(found: Sequence[str]) -> str:
    """The warnings folded into one line with the advice, or ``""`` (each one is in the JSON
    output's ``conditions.warnings``)."""
    if not found:
        return ""
    noisy = sum("p90/p10" in line for line in found)
    varying = sum("over runs" in line for line in found)
    signs = [
        f"{noisy} noisy upstream rebuild{'s' if noisy != 1 else ''}" if noisy else "",
        f"{varying} speed-up{'s' if varying != 1 else ''} varying over runs" if varying else "",
        *(line.split(" (")[0] for line in found if line.startswith("load average")),
    ]
    return (
        f"warning: these figures may be unreliable ({'; '.join(sign for sign in signs if sign)}): "
        "rerun on a quiet machine (--runs 3); --json lists each sign"
    )


def machine() -> dict[str, Any]:
    """What the numbers were measured on (``torch_threads``: torch's default, not the bench's)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "table_kernel": kernel_backend(),
    }


def _plain(value: Any) -> Any:
    """``value`` with every NaN float replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def json_text(
    results: Sequence[Result], options: dict[str, Any], conditions: dict[str, Any]
) -> str:
    """The JSON document: machine, options, measuring conditions (load averages, warnings) and
    every result with its per-run figures; a figure that was not counted is ``null``."""
    document = {
        "machine": machine(),
        "options": options,
        "conditions": conditions,
        "results": [result.as_dict() for result in results],
    }
    return json.dumps(_plain(document), indent=2, allow_nan=False) + "\n"


FAMILIES = (
    ("deepseek-v4", "DeepSeek V4 preparer"),
    ("qwen3-14b", "Qwen3-14B preparer"),
    ("blocktable", "BlockTable"),
    ("", "builders"),
)
"""Workload name prefix -> the family its bar is grouped under (the first prefix that matches)."""

PLOT_WIDTH_IN, PLOT_DPI = 12.0, 120
"""The picture is ``12 * 120 = 1440`` pixels wide, readable unzoomed."""


def family(workload: str) -> str:
    """The family of ``workload`` (:data:`FAMILIES`)."""
    return next(label for prefix, label in FAMILIES if workload.startswith(prefix))


def write_plot(out: BinaryIO, results: Sequence[Result], found: Sequence[str] = ()) -> None:
    """Draw a PNG into ``out``: one horizontal bar per workload, blockprep's speed-up against
    pre-fix (the table's "vs pre-fix", log scale), its whisker the per-step spread (the pre-fix
    median over blockprep's p90, then p10), each labelled with both speed-ups; workloads grouped
    by :func:`family`, a heading per family. ``found`` (the :func:`warnings`): when there are
    any, the picture says in red that the run was unreliable, and why. 1440 pixels wide.

    Raises:
        ModuleNotFoundError: matplotlib is missing (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {(r.workload, r.construction): r for r in results}
    workloads = list(dict.fromkeys(r.workload for r in results))
    groups: dict[str, list[str]] = {}
    for name in workloads:
        groups.setdefault(family(name), []).append(name)
    rows: list[tuple[str, Result | None]] = []  # top to bottom: a heading, then its workloads
    for label, names in groups.items():
        rows.append((label, None))
        rows += [(name, by_key[(name, BLOCKPREP)]) for name in names]
    top = 0.9 + 0.25 * min(len(found), 4)
    figure, axes = plt.subplots(figsize=(PLOT_WIDTH_IN, top + 0.3 * len(rows) + 0.8))
    positions = list(range(len(rows)))[::-1]
    labels = []
    for y, (label, r) in zip(positions, rows, strict=True):
        if r is None:
            labels.append(label)
            continue
        labels.append(f"  {label}")
        baseline = by_key[(r.workload, BASELINE)].median_us
        low, high = baseline / r.p90_us, baseline / r.p10_us
        axes.barh(y, r.speedup, height=0.7, color="tab:blue")
        axes.errorbar(
            r.speedup,
            y,
            xerr=[[max(r.speedup - low, 0.0)], [max(high - r.speedup, 0.0)]],
            fmt="none",
            ecolor="black",
            capsize=3,
        )
        axes.annotate(
            f"{r.speedup:,.1f}x (vs fix {r.speedup_fix:,.1f}x)",
            (max(high, r.speedup), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    axes.set_yticks(positions, labels)
    for tick, (_, r) in zip(axes.get_yticklabels(), rows, strict=True):
        if r is None:
            tick.set_fontweight("bold")
    axes.set_xscale("log")
    axes.axvline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel(
        "blockprep speed-up vs upstream pre-fix (log scale); whisker: pre-fix median / "
        "blockprep p90 .. p10 per step"
    )
    axes.margins(x=0.25)
    title = "blockprep bench: one decode step's input preparation"
    if found:
        shown = [*found[:3], f"... {len(found) - 3} more"] if len(found) > 4 else list(found)
        figure.suptitle(
            "UNRELIABLE RUN (rerun on a quiet machine, --runs 3):\n" + "\n".join(shown),
            color="red",
            fontsize=9,
            x=0.01,
            ha="left",
        )
        axes.set_title(title, fontsize=10)
    else:
        axes.set_title(title)
    figure.tight_layout()
    figure.savefig(out, format="png", dpi=PLOT_DPI)
    plt.close(figure)
