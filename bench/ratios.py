"""Print the ratio tables of a pytest-benchmark JSON file as markdown.

Usage::

    pytest bench/ --benchmark-only --benchmark-json=/tmp/bench.json
    python bench/ratios.py /tmp/bench.json

Builder groups (three benchmarks each, ``extra_info["impl"]`` = ``pre-fix``, ``fix``,
``blockprep``) become one table of medians and ratios; the "tiling constructions" groups a second
table of medians, one column per construction; any other group a third table of medians. Groups
keep the order in which they ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

BUILDER_IMPLS = ("pre-fix", "fix", "blockprep")
TILING_PREFIX = "tiling constructions: "
TILING_COLUMNS = (
    "gather per row",
    "broadcast per row",
    "broadcast block",
    "doubling copy",
    "tile_rows",
    "tile_row",
)


def medians(benchmarks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{group: {impl: median in microseconds}}``, groups in first-seen order."""
    table: dict[str, dict[str, float]] = {}
    for bench in benchmarks:
        impl = bench.get("extra_info", {}).get("impl")
        if impl is None:
            continue
        group = bench["group"] or bench["name"]
        table.setdefault(group, {})[impl] = bench["stats"]["median"] * 1e6
    return table


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def builder_table(groups: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        "| group | pre-fix median (us) | fix median (us) | blockprep median (us) "
        "| pre-fix / blockprep | fix / blockprep |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for group, impls in groups.items():
        if group.startswith(TILING_PREFIX) or not set(BUILDER_IMPLS) <= impls.keys():
            continue
        pre, fix, ours = (impls[name] for name in BUILDER_IMPLS)
        lines.append(
            f"| {group} | {_us(pre)} | {_us(fix)} | {_us(ours)} "
            f"| {pre / ours:.1f}x | {fix / ours:.1f}x |"
        )
    return lines


def tiling_table(groups: dict[str, dict[str, float]]) -> list[str]:
    header = " | ".join(f"{name} (us)" for name in TILING_COLUMNS)
    lines = [f"| case | {header} | fastest |", "|---|" + "---:|" * len(TILING_COLUMNS) + "---|"]
    for group, impls in groups.items():
        if not group.startswith(TILING_PREFIX):
            continue
        cells = " | ".join(_us(impls.get(name)) for name in TILING_COLUMNS)
        fastest = min(impls, key=impls.__getitem__)
        lines.append(f"| {group.removeprefix(TILING_PREFIX)} | {cells} | {fastest} |")
    return lines


def other_table(groups: dict[str, dict[str, float]]) -> list[str]:
    """Groups that are neither builder triples nor tiling constructions: medians only."""
    lines = ["| group | benchmark | median (us) |", "|---|---|---:|"]
    for group, impls in groups.items():
        if group.startswith(TILING_PREFIX) or set(BUILDER_IMPLS) <= impls.keys():
            continue
        lines.extend(f"| {group} | {impl} | {_us(median)} |" for impl, median in impls.items())
    return lines


def cells_table(benchmarks: list[dict[str, Any]]) -> list[str]:
    """Benchmarks that record ``cells_written_per_step``: cells written against the table's."""
    lines = [
        "| group | benchmark | cells written per step | table cells | share |",
        "|---|---|---:|---:|---:|",
    ]
    for bench in benchmarks:
        info = bench.get("extra_info", {})
        if "cells_written_per_step" not in info:
            continue
        cells, total = info["cells_written_per_step"], info["table_cells"]
        lines.append(
            f"| {bench['group']} | {info['impl']} | {cells:,.1f} | {total:,} "
            f"| {cells / total:.2%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path, help="a pytest-benchmark --benchmark-json file")
    args = parser.parse_args(argv)
    data = json.loads(args.json_file.read_text())
    groups = medians(data["benchmarks"])
    print("\n".join(builder_table(groups)))
    if any(group.startswith(TILING_PREFIX) for group in groups):
        print()
        print("\n".join(tiling_table(groups)))
    others = other_table(groups)
    if len(others) > 2:
        print()
        print("\n".join(others))
    cells = cells_table(data["benchmarks"])
    if len(cells) > 2:
        print()
        print("\n".join(cells))


if __name__ == "__main__":
    main()
