"""Check, then time, the constructions of a workload; one :class:`Result` per construction.

Before anything is timed, the whole trace runs through every construction in lockstep and their
buffers are compared after every step: a mismatch raises :class:`MismatchError` naming the step,
buffer and first differing cell, and produces no number.

Timing (:func:`time_workload`) runs with the garbage collector off and one torch thread
(``torch.set_num_threads(1)``, restored afterwards), and interleaves the constructions round by
round: each construction keeps its own stepper and its own trace, and round ``k`` times one step
of each, starting with construction ``k % 3``, so a slow spell of the machine lands on all of them
alike and none always runs right after the same other. Each step is timed alone
(``perf_counter_ns``, the prepare call only: making a step's input is not timed, nor is the
construction's :meth:`~blockprep.bench.base.Stepper.receive` of it, made just before its
step: on the wire workloads, unpickling only the payload that construction consumes), so medians
and percentiles are per step. :func:`summarize` turns one or more such runs into results: the median
of the per-run medians, percentiles over every run's steps, and each run's speed-ups.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from blockprep.bench.base import CONSTRUCTIONS, Stepper, Workload

BASELINE, FIX = CONSTRUCTIONS[0], CONSTRUCTIONS[1]
"""The constructions speed-ups are measured against: upstream before its fix, and its fix."""


class MismatchError(RuntimeError):
    """Two constructions of a workload wrote different buffers."""


@dataclass(frozen=True)
class Timing:
    """One construction's steps in one run: microseconds per step (``durations_us``, sorted) and
    table rows and cells written per step (NaN when the construction does not count them)."""

    durations_us: tuple[float, ...]
    rows_per_step: float
    cells_per_step: float

    @property
    def median_us(self) -> float:
        return statistics.median(self.durations_us)


@dataclass(frozen=True)
class RunResult:
    """One run of one construction: its median and p10-p90 per step (us), and its speed-ups
    against the pre-fix and fix medians of the same run."""

    median_us: float
    p10_us: float
    p90_us: float
    speedup: float
    speedup_fix: float


@dataclass(frozen=True)
class Result:
    """One construction of one workload over every run. Times in microseconds per step.

    ``median_us``: the median of the per-run medians; ``p10_us`` and ``p90_us``: percentiles of
    every timed step of every run. ``speedup`` and ``speedup_fix``: the median over runs of the
    pre-fix (fix) median divided by this median, each ratio taken within one run; ``runs`` holds
    every run's figures. ``rows_per_step`` and ``cells_per_step``: table rows and cells the
    construction wrote per step (NaN if it does not count them). ``floor_us``: the time to copy
    the workload's ``cells`` int32 values once, the memory floor of a full rewrite.
    """

    workload: str
    construction: str
    steps: int
    median_us: float
    p10_us: float
    p90_us: float
    speedup: float
    speedup_fix: float
    rows_per_step: float
    cells_per_step: float
    floor_us: float
    runs: tuple[RunResult, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify(workload: Workload, steps: int, seed: int) -> None:
    """Run the trace through every construction in lockstep (each receiving, then preparing, each
    item), comparing all buffers after every step."""
    steppers = {name: make() for name, make in workload.constructions.items()}
    for index, item in enumerate(workload.trace(steps, seed)):
        for stepper in steppers.values():
            stepper.step(stepper.receive(item))
        expected = steppers[BASELINE].buffers()
        for name, stepper in steppers.items():
            for buffer, actual in stepper.buffers().items():
                if not np.array_equal(actual, expected[buffer]):
                    cell = tuple(int(i) for i in np.argwhere(actual != expected[buffer])[0])
                    raise MismatchError(
                        f"{workload.name}: {name} differs from {BASELINE} at step {index}, "
                        f"{buffer}{list(cell)}: {actual[cell]} != {expected[buffer][cell]}"
                    )


@contextlib.contextmanager
def quiet_process() -> Iterator[None]:
    """The garbage collector off and one torch thread for the duration; both restored after."""
    threads = torch.get_num_threads()
    was_enabled = gc.isenabled()
    gc.disable()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if was_enabled:
            gc.enable()


Written = tuple[int, int] | None
"""Table rows and cells written, or ``None`` where a construction does not count them."""


def _plus(a: Written, b: Written) -> Written:
    return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])


class _Lane:
    """One construction's stepper, trace and timed steps within one run.

    Steady: one stepper, warmed up by the trace's first input. Cold: a fresh stepper for every
    timed step (made untimed), the first input unused.
    """

    def __init__(self, workload: Workload, make: Callable[[], Stepper], steps: int, seed: int):
        self._make = make
        self._cold = workload.cold
        self._trace = workload.trace(steps, seed)
        self._stepper = make()
        first = next(self._trace)
        if not self._cold:
            self._stepper.step(self._stepper.receive(first))
        # Cold: the sum of every fresh stepper's count; steady: minus the count before timing.
        before = (0, 0) if self._cold else self._stepper.written()
        self._written: Written = None if before is None else (-before[0], -before[1])
        self._durations: list[int] = []

    def time_next(self) -> None:
        """Time the trace's next input (on a fresh stepper when cold), received untimed just
        before its step."""
        item = next(self._trace)
        if self._cold:
            self._stepper = self._make()
        received = self._stepper.receive(item)
        start = time.perf_counter_ns()
        self._stepper.step(received)
        self._durations.append(time.perf_counter_ns() - start)
        if self._cold:
            self._written = _plus(self._written, self._stepper.written())

    def timing(self) -> Timing:
        """The steps timed so far."""
        steps = len(self._durations)
        written = self._written if self._cold else _plus(self._written, self._stepper.written())
        per_step = (np.nan, np.nan) if written is None else (written[0] / steps, written[1] / steps)
        return Timing(tuple(sorted(d / 1000 for d in self._durations)), *per_step)


def time_workload(
    workload: Workload, steps: int, seed: int, *, interleaved: bool = True
) -> dict[str, Timing]:
    """Time ``steps`` steps of every construction of ``workload``, interleaved round by round
    (see the module; ``interleaved=False``: each construction's steps back to back), with the
    garbage collector off and one torch thread."""
    with quiet_process():
        lanes = {
            name: _Lane(workload, make, steps, seed)
            for name, make in workload.constructions.items()
        }
        order = list(lanes.values())
        if interleaved:
            for index in range(steps):
                for offset in range(len(order)):
                    order[(index + offset) % len(order)].time_next()
        else:
            for lane in order:
                for _ in range(steps):
                    lane.time_next()
    return {name: lane.timing() for name, lane in lanes.items()}


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


def percentile(durations: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 <= q <= 1) of sorted ``durations``."""
    return durations[min(len(durations) - 1, int(q * len(durations)))]


def summarize(workload: Workload, runs: Sequence[dict[str, Timing]], floor: float) -> list[Result]:
    """One :class:`Result` per construction from one or more runs of :func:`time_workload`."""
    per_run = [_run_results(timings) for timings in runs]
    results = []
    for name in workload.constructions:
        mine = [run[name] for run in per_run]
        pooled = sorted(d for timings in runs for d in timings[name].durations_us)
        first = runs[0][name]
        results.append(
            Result(
                workload=workload.name,
                construction=name,
                steps=len(first.durations_us),
                median_us=statistics.median(r.median_us for r in mine),
                p10_us=percentile(pooled, 0.1),
                p90_us=percentile(pooled, 0.9),
                speedup=statistics.median(r.speedup for r in mine),
                speedup_fix=statistics.median(r.speedup_fix for r in mine),
                rows_per_step=first.rows_per_step,
                cells_per_step=first.cells_per_step,
                floor_us=floor,
                runs=tuple(mine),
            )
        )
    return results


def _run_results(timings: dict[str, Timing]) -> dict[str, RunResult]:
    baseline, fix = timings[BASELINE].median_us, timings[FIX].median_us
    return {
        name: RunResult(
            median_us=timing.median_us,
            p10_us=percentile(timing.durations_us, 0.1),
            p90_us=percentile(timing.durations_us, 0.9),
            speedup=baseline / timing.median_us,
            speedup_fix=fix / timing.median_us,
        )
        for name, timing in timings.items()
    }


def run_workload(
    workload: Workload,
    steps: int,
    seed: int,
    done: Callable[[str], None] = lambda _: None,
    runs: int = 1,
) -> list[Result]:
    """Check, then time ``runs`` times, every construction of ``workload`` on one trace;
    ``done`` is called with the name of each phase ("check", then "run 1", ...) as it ends."""
    verify(workload, steps, seed)
    done("check")
    floor = memory_floor(workload.cells)
    timings = []
    for index in range(runs):
        timings.append(time_workload(workload, steps, seed))
        done(f"run {index + 1}")
    return summarize(workload, timings, floor)
