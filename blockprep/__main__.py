"""``python -m blockprep bench``: measure blockprep against upstream's constructions.

Prints a table on stdout (progress on stderr); ``--json`` and ``--plot`` save the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from blockprep.bench.report import table, write_json, write_plot
from blockprep.bench.runner import MismatchError, run_workload
from blockprep.bench.workloads import Workload, standard_workloads

QUICK_STEPS = 60
DEFAULT_STEPS = 300


def _parser(workload_names: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockprep", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="time the standard workloads",
        description="Check, then time, upstream pre-fix, upstream fix and blockprep on each "
        "workload: median and p90 per step, speed-up against pre-fix, rows and cells written, "
        "and the memory floor (the time to copy a full rewrite's bytes).",
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
        "--steps", type=int, help=f"timed steps a workload (default {DEFAULT_STEPS})"
    )
    bench.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    bench.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--plot", type=Path, metavar="PATH", help="also draw a log-scale PNG")
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
    steps = args.steps or (QUICK_STEPS if args.quick else DEFAULT_STEPS)
    if steps < 1:
        print("--steps must be at least 1", file=sys.stderr)
        return 2
    return _bench(workloads, args.workload or list(workloads), steps, args)


def _bench(
    workloads: Mapping[str, Workload], names: list[str], steps: int, args: argparse.Namespace
) -> int:
    from tqdm import tqdm  # the bench extra; checked for in main()

    results = []
    phases = sum(1 + len(workloads[name].constructions) for name in names)
    with tqdm(total=phases, file=sys.stderr, unit="phase", leave=False) as bar:
        for name in names:
            bar.set_description(name)
            try:
                results += run_workload(workloads[name], steps, args.seed, lambda _: bar.update())
            except MismatchError as error:
                bar.close()
                print(f"error: {error}", file=sys.stderr)
                return 1
    print(table(results))
    options = {"workloads": names, "steps": steps, "seed": args.seed}
    if args.json is not None:
        write_json(args.json, results, options)
    if args.plot is not None:
        write_plot(args.plot, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
