"""Instructions per step of a two-slot workload's churn steps against its steady ones, for
callgrind.

Usage (from a directory that holds no ``blockprep``, as for ``bench/callgrind_step.py``)::

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --toggle-collect=functools_reduce --callgrind-out-file=out python \\
        bench/callgrind_churn.py WORKLOAD KIND 80

and take the total (the ``summary:`` line of ``out``) / the count the script prints on stderr.
The trace's steps (80 here) all run, the first 5 outside collection; only the steps of ``KIND``
run inside ``functools.reduce``, the only place events are collected. A step's kind, for the slot
it writes: ``steady`` (the slot held the same requests last time), ``churn`` (requests joined,
left or moved since the slot's last step), split into ``churn-first`` (the first slot to see this
batch) and ``churn-second`` (the other slot, catching up with a batch already planned).
"""

import functools
import gc
import os
import subprocess
import sys
from typing import Any

import torch

from blockprep.bench import workloads

KINDS = ("steady", "churn", "churn-first", "churn-second")


def kinds_of(items: list) -> list[str]:
    """Each step's kind (``first`` for a slot's first step)."""
    held: dict[int, list] = {}
    last: list | None = None
    kinds = []
    for item in items:
        ids = list(item.batch.request_ids)
        before = held.get(item.slot)
        if before is None:
            kinds.append("first")
        elif before == ids:
            kinds.append("steady")
        else:
            kinds.append("churn-first" if ids != last else "churn-second")
        held[item.slot], last = ids, ids
    return kinds


def prepared(name: str, steps: int, kind: str) -> tuple[Any, list[tuple[Any, bool]]]:
    """Workload ``name``'s blockprep construction and its trace's ``steps`` items, received, each
    with whether it is a step of ``kind`` from the fifth on (``all``: every one); the
    instrumentation then on (under callgrind) and the garbage collector off."""
    torch.set_num_threads(1)
    workload = workloads.standard_workloads()[name]
    stepper = workload.constructions["blockprep"]()
    received = [stepper.receive(item) for item in workload.trace(steps, 0)]
    chosen = [
        k >= 5 and (kind in ("all", its) or (kind == "churn" and its.startswith("churn")))
        for k, its in enumerate(kinds_of(received))
    ]
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
    gc.disable()
    return stepper, list(zip(received, chosen, strict=True))


def main() -> None:
    name, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind not in KINDS:
        raise SystemExit(f"KIND must be one of {', '.join(KINDS)}, got {kind!r}")
    stepper, steps_chosen = prepared(name, steps, kind)
    counted = 0
    for item, chosen in steps_chosen:
        if chosen:
            functools.reduce(lambda done, x: (stepper.step(x), done)[1], [item], 0)
            counted += 1
        else:
            stepper.step(item)
    print(kind, counted, file=sys.stderr)


if __name__ == "__main__":
    main()
