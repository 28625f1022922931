"""``python -m blockprep bench``: measure blockprep against upstream's constructions.

Prints a header line (the measuring conditions), a table, the workloads' conditions and any
reliability warnings on stdout (progress on stderr); ``--json`` and ``--plot`` save the results.
Their files are opened (and a device probed) before anything runs, so a path that cannot take the
results fails at once, not after the run.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import platform
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

import blockprep
from blockprep._engine import kernel_backend
from blockprep.bench.base import Workload
from blockprep.bench.report import (
    COLUMN_LEGEND,
    footer,
    header,
    headline,
    json_text,
    legend,
    load_average,
    table,
    warnings,
    write_plot,
)
from blockprep.bench.runner import (
    MismatchError,
    Result,
    Timing,
    memory_floor,
    summarize,
    time_workload,
    verify,
)
from blockprep.bench.workloads import standard_workloads

QUICK_STEPS = 60
DEFAULT_STEPS = 300


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _output_path(text: str) -> Path:
    """An argparse type: a file path that can be written (its directory exists and is writable,
    the path is no directory), so a bad path fails before anything is timed."""
    path = Path(text)
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {str(parent)!r} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: not writable")
    return path


def _plot_path(text: str) -> Path:
    """An argparse type: :func:`_output_path` ending in ``.png`` (the plot is a PNG)."""
    path = _output_path(text)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text}: the plot is a PNG; give a path ending in .png")
    return path


DEFAULT_PLOT = Path(tempfile.gettempdir()) / "blockprep-bench.png"
"""Where ``--plot`` without a path draws: outside any checkout (never the tracked
``docs/benchmarks.png``)."""


class _Output:
    """An output file, opened before the run: created if missing (and removed again if the run
    fails), an existing one kept until :meth:`write` replaces its content; a device or pipe is
    probed with one newline byte (``/dev/full`` fails here, not after the run)."""

    def __init__(self, path: Path, *, probe: bool) -> None:
        self.path = path
        self._created = not path.exists()
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 (held open for the run)
        self._regular = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        if probe and not self._regular:
            try:
                self._file.write(b"\n")  # leading whitespace: still valid JSON
                self._file.flush()
            except OSError:
                self._file.close()
                raise

    def write(self, data: bytes) -> None:
        """Replace the file's content with ``data`` and close it."""
        self._created = False  # written: kept
        with self._file:
            if self._regular:
                self._file.seek(0)
                self._file.truncate()
            self._file.write(data)

    def discard(self) -> None:
        """Close (if still open); a file created for this run and not written is removed."""
        self._file.close()
        if self._created and self._regular:
            self.path.unlink(missing_ok=True)
            self._created = False


def version() -> str:
    """One line for a bug report: blockprep's version, the table kernel that runs, and the
    versions of Python, torch and NumPy."""
    return (
        f"blockprep {blockprep.__version__} (table kernel: {kernel_backend()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__})"
    )


class _Version(argparse.Action):
    """``--version``: :func:`version` on one line (argparse's own action wraps it), then exit."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version())
        parser.exit()


def _parser(workload_names: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockprep", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="the version, which table kernel runs (c or python) and the versions under it",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="time the standard workloads",
        description="Check, then time, upstream pre-fix, upstream fix and blockprep on each "
        "workload, interleaved round by round on one torch thread: median and p10-p90 per step, "
        "speed-ups against pre-fix and fix, rows and cells written, and the memory floor (the "
        "time to copy a full rewrite's bytes); warns when the spread or the load average says "
        "the figures are unreliable.",
        epilog="From a repository checkout, the whole host path of a step (the engine's "
        "message, the pipe, the worker's decode and preparation, per stage): "
        "python -m bench.host_path.",
    )
    bench.add_argument(
        "--workload",
        action="append",
        choices=workload_names,
        metavar="NAME",
        help=f"run only this workload (repeatable): {', '.join(workload_names)}",
    )
    bench.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps a workload")
    bench.add_argument(
        "--steps",
        type=_positive_int,
        help=f"timed steps a workload (default {DEFAULT_STEPS}; overrides --quick)",
    )
    bench.add_argument(
        "--runs",
        type=_positive_int,
        default=1,
        help="repeat the whole timing N times and report the median of the runs' medians and "
        "each speed-up's min-max over runs (default 1)",
    )
    bench.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    bench.add_argument(
        "--sequential",
        action="store_true",
        help="time each construction's steps back to back instead of round by round (each keeps "
        "its own cache state between steps; for comparison only: the ratios then also compare "
        "different seconds of the machine)",
    )
    bench.add_argument(
        "--json", type=_output_path, metavar="PATH", help="also write the results as JSON"
    )
    bench.add_argument(
        "--plot",
        type=_plot_path,
        nargs="?",
        const=DEFAULT_PLOT,
        metavar="PATH.png",
        help="also draw blockprep's speed-ups as a PNG (1440 px wide) at PATH.png (default "
        f"{DEFAULT_PLOT})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    workloads = standard_workloads()
    args = _parser(list(workloads)).parse_args(argv)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        print("--plot needs matplotlib: pip install 'blockprep[plot]'", file=sys.stderr)
        return 2
    if importlib.util.find_spec("tqdm") is None:
        print("the bench command needs tqdm: pip install 'blockprep[bench]'", file=sys.stderr)
        return 2
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    names = list(dict.fromkeys(args.workload or workloads))  # a workload named twice runs once
    outputs: dict[str, _Output] = {}
    try:
        for option in ("json", "plot"):
            path = getattr(args, option)
            if path is not None:
                outputs[option] = _Output(path, probe=option == "json")
    except OSError as error:
        for output in outputs.values():
            output.discard()
        print(f"blockprep bench: error: --{option} {path}: {error}", file=sys.stderr)
        return 2
    try:
        status = _bench(workloads, names, args, outputs)
    finally:
        for output in outputs.values():
            output.discard()
    return status


def _bench(
    workloads: Mapping[str, Workload],
    names: list[str],
    args: argparse.Namespace,
    outputs: Mapping[str, _Output],
) -> int:
    """Check every workload, time all of them ``args.runs`` times (each run one pass over the
    workloads, so a slow spell of the machine lands in one run of several workloads rather than
    in every run of one), then report."""
    from tqdm import tqdm  # the bench extra; checked for in main()

    threads = torch.get_num_threads()
    timings: dict[str, list[dict[str, Timing]]] = {name: [] for name in names}
    floors: dict[str, float] = {}
    loads: list[float] = []
    with tqdm(total=len(names) * (1 + args.runs), file=sys.stderr, leave=False) as bar:
        for run in range(args.runs):
            for name in names:
                workload = workloads[name]
                if run == 0:
                    bar.set_description(f"{name}: check")
                    try:
                        verify(workload, args.steps, args.seed)
                    except MismatchError as error:
                        bar.close()
                        print(f"error: {error}", file=sys.stderr)
                        return 1
                    floors[name] = memory_floor(workload.cells)
                    bar.update()
                bar.set_description(f"{name}: run {run + 1}/{args.runs}")
                timings[name].append(
                    time_workload(workload, args.steps, args.seed, interleaved=not args.sequential)
                )
                load = load_average()
                if load is not None:
                    loads.append(load)
                bar.update()
    results = [r for name in names for r in summarize(workloads[name], timings[name], floors[name])]
    descriptions = {name: workloads[name].description for name in names}
    _report(results, descriptions, loads, threads, args, outputs)
    return 0


def _report(
    results: list[Result],
    descriptions: dict[str, str],
    loads: list[float],
    threads: int,
    args: argparse.Namespace,
    outputs: Mapping[str, _Output],
) -> None:
    cpus = os.cpu_count() or 1
    found = warnings(results, loads, cpus)
    parts = [
        header(args.steps, args.runs, args.seed, threads, interleaved=not args.sequential),
        headline(results, loads, cpus),
        footer(found),
        table(results),
        COLUMN_LEGEND,
        legend(descriptions),
    ]
    print("\n\n".join(part for part in parts if part))
    if "json" in outputs:
        options = {
            "workloads": list(descriptions),
            "steps": args.steps,
            "runs": args.runs,
            "seed": args.seed,
            "torch_threads": 1,
            "interleaved": not args.sequential,
        }
        conditions = {"load_averages": loads, "warnings": found, "descriptions": descriptions}
        outputs["json"].write(json_text(results, options, conditions).encode())
    if "plot" in outputs:
        picture = io.BytesIO()
        write_plot(picture, results, found)
        outputs["plot"].write(picture.getvalue())
        print(f"plot: {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
