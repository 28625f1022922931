"""Render benchmark results: a text table, a JSON document, a log-scale PNG."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blockprep.bench.runner import Result

COLUMNS = (
    ("workload", "workload", "{}"),
    ("construction", "construction", "{}"),
    ("median_us", "median us", "{:,.1f}"),
    ("p90_us", "p90 us", "{:,.1f}"),
    ("speedup", "vs pre-fix", "{:.1f}x"),
    ("rows_per_step", "rows/step", "{:,.1f}"),
    ("cells_per_step", "cells/step", "{:,.1f}"),
    ("floor_us", "floor us", "{:,.1f}"),
)


def table(results: Sequence[Result]) -> str:
    """A fixed-width text table, one line per construction and workload."""
    rows = [[fmt.format(getattr(r, key)) for key, _, fmt in COLUMNS] for r in results]
    headers = [title for _, title, _ in COLUMNS]
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


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
    }


def write_json(path: Path, results: Sequence[Result], options: dict[str, Any]) -> None:
    document = {
        "machine": machine(),
        "options": options,
        "results": [result.as_dict() for result in results],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def write_plot(path: Path, results: Sequence[Result]) -> None:
    """Median per step of every construction, grouped by workload, on a log scale.

    Raises:
        ModuleNotFoundError: matplotlib is missing (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in results))
    constructions = list(dict.fromkeys(r.construction for r in results))
    by_key = {(r.workload, r.construction): r for r in results}
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads)), 4.5))
    width = 0.8 / len(constructions)
    for index, construction in enumerate(constructions):
        positions = [
            w + (index - (len(constructions) - 1) / 2) * width for w in range(len(workloads))
        ]
        medians = [by_key[(w, construction)].median_us for w in workloads]
        axes.bar(positions, medians, width, label=construction)
    axes.set_yscale("log")
    axes.set_ylabel("median per step (us, log scale)")
    axes.set_xticks(range(len(workloads)), workloads, rotation=20, ha="right")
    axes.legend()
    axes.set_title("blockprep bench: one decode step's input preparation")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
