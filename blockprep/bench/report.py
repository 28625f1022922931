"""Render benchmark results: a header, a text table, reliability warnings, JSON, a log-scale PNG."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blockprep.bench.runner import BASELINE, FIX, Result
from blockprep.engine import kernel_backend

SPREAD_LIMIT = 1.5
"""An upstream rebuild's p90/p10 per step above this says the machine was too noisy to trust."""
RUNS_LIMIT = 1.25
"""A speed-up's max/min over runs above this says the runs disagree too much to trust."""
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
    """The warnings as lines for the end of the output, or ``""``."""
    if not found:
        return ""
    lines = [f"warning: {line}" for line in found]
    lines.append("warning: these figures are unreliable; rerun on a quiet machine (--runs 3)")
    return "\n".join(lines)


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


def write_json(
    path: Path, results: Sequence[Result], options: dict[str, Any], conditions: dict[str, Any]
) -> None:
    """Machine, options, measuring conditions (load averages, warnings) and every result with
    its per-run figures; a figure that was not counted is ``null``."""
    document = {
        "machine": machine(),
        "options": options,
        "conditions": conditions,
        "results": [result.as_dict() for result in results],
    }
    path.write_text(json.dumps(_plain(document), indent=2, allow_nan=False) + "\n")


def write_plot(path: Path, results: Sequence[Result]) -> None:
    """Median per step of every construction, grouped by workload, on a log scale, with p10-p90
    error bars and each construction's speed-up against pre-fix above its bar.

    Raises:
        ModuleNotFoundError: matplotlib is missing (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in results))
    constructions = list(dict.fromkeys(r.construction for r in results))
    by_key = {(r.workload, r.construction): r for r in results}
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads)), 5.0))
    width = 0.8 / len(constructions)
    for index, construction in enumerate(constructions):
        offset = (index - (len(constructions) - 1) / 2) * width
        bars = [by_key[(w, construction)] for w in workloads]
        positions = [w + offset for w in range(len(workloads))]
        medians = [r.median_us for r in bars]
        spread = [[r.median_us - r.p10_us for r in bars], [r.p90_us - r.median_us for r in bars]]
        axes.bar(positions, medians, width, yerr=spread, capsize=2, label=construction)
        if construction == BASELINE:
            continue
        for position, r in zip(positions, bars, strict=True):
            axes.annotate(
                f"{r.speedup:,.1f}x",
                (position, r.p90_us),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
            )
    axes.set_yscale("log")
    axes.set_ylabel("median per step, p10-p90 (us, log scale)")
    axes.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right")
    axes.legend()
    axes.set_title("blockprep bench: one decode step's input preparation (labels: vs pre-fix)")
    axes.margins(y=0.15)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
