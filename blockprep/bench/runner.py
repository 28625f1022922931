"""Check, then time, the constructions of a workload; one :class:`Result` per construction.

Before anything is timed, the whole trace runs through every construction in lockstep and their
buffers are compared after every step: a mismatch raises :class:`MismatchError` naming the step,
buffer and first differing cell, and produces no number. Timing runs with the garbage collector
off; each step is timed alone (``perf_counter_ns``), so medians and p90s are per step.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from blockprep.bench.workloads import CONSTRUCTIONS, Stepper, Workload


class MismatchError(RuntimeError):
    """Two constructions of a workload wrote different buffers."""


@dataclass(frozen=True)
class Result:
    """One construction of one workload. Times in microseconds per step.

    ``speedup``: the pre-fix median divided by this median. ``rows_per_step`` and
    ``cells_per_step``: what the construction wrote per step (a whole-table construction writes
    everything). ``floor_us``: the time to copy the workload's ``cells`` int32 values once, the
    memory floor of a full rewrite.
    """

    workload: str
    construction: str
    steps: int
    median_us: float
    p90_us: float
    speedup: float
    rows_per_step: float
    cells_per_step: float
    floor_us: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify(workload: Workload, steps: int, seed: int) -> None:
    """Run the trace through every construction in lockstep, comparing all buffers after every
    step."""
    steppers = {name: make() for name, make in workload.constructions.items()}
    baseline = CONSTRUCTIONS[0]
    for index, item in enumerate(workload.trace(steps, seed)):
        for stepper in steppers.values():
            stepper.step(item)
        expected = steppers[baseline].buffers()
        for name, stepper in steppers.items():
            for buffer, actual in stepper.buffers().items():
                if not np.array_equal(actual, expected[buffer]):
                    cell = tuple(int(i) for i in np.argwhere(actual != expected[buffer])[0])
                    raise MismatchError(
                        f"{workload.name}: {name} differs from {baseline} at step {index}, "
                        f"{buffer}{list(cell)}: {actual[cell]} != {expected[buffer][cell]}"
                    )


def time_steps(workload: Workload, make: Callable[[], Stepper], steps: int, seed: int) -> Result:
    """Time every step of the trace but the first, which warms up (for a cold workload, every
    step runs on a fresh construction and only the step is timed). Making a step's input is not
    timed."""
    durations: list[int] = []
    rows = cells = 0
    trace = workload.trace(steps, seed)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        stepper = make()
        first = next(trace)
        if not workload.cold:
            stepper.step(first)
        before = stepper.written()
        for item in trace:
            if workload.cold:
                stepper = make()
            start = time.perf_counter_ns()
            stepper.step(item)
            durations.append(time.perf_counter_ns() - start)
            if workload.cold:
                written = stepper.written()
                rows += workload.rows if written is None else written[0]
                cells += workload.cells if written is None else written[1]
        after = stepper.written()
    finally:
        if was_enabled:
            gc.enable()
    steps = len(durations)
    if not workload.cold:
        if before is None or after is None:
            rows, cells = workload.rows * steps, workload.cells * steps
        else:
            rows, cells = after[0] - before[0], after[1] - before[1]
    micros = sorted(d / 1000 for d in durations)
    return Result(
        workload=workload.name,
        construction="",
        steps=steps,
        median_us=statistics.median(micros),
        p90_us=micros[min(steps - 1, int(0.9 * steps))],
        speedup=float("nan"),
        rows_per_step=rows / steps,
        cells_per_step=cells / steps,
        floor_us=float("nan"),
    )


def memory_floor(cells: int, repeats: int = 50) -> float:
    """Median microseconds to copy ``cells`` int32 values from one array into another."""
    source = np.arange(cells, dtype=np.int32)
    target = np.empty_like(source)
    durations = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        np.copyto(target, source)
        durations.append(time.perf_counter_ns() - start)
    return statistics.median(durations) / 1000


def run_workload(
    workload: Workload, steps: int, seed: int, done: Callable[[str], None] = lambda _: None
) -> list[Result]:
    """Check, then time, every construction of ``workload`` on one trace; ``done`` is called with
    the name of each phase ("check", then each construction) as it finishes."""
    verify(workload, steps, seed)
    done("check")
    floor = memory_floor(workload.cells)
    timed = {}
    for name, make in workload.constructions.items():
        timed[name] = time_steps(workload, make, steps, seed)
        done(name)
    baseline = timed[CONSTRUCTIONS[0]].median_us
    return [
        Result(
            **{
                **result.as_dict(),
                "construction": name,
                "speedup": baseline / result.median_us,
                "floor_us": floor,
            }
        )
        for name, result in timed.items()
    ]
