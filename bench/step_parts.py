"""Where an interleaved DeepSeek V4 step's time goes, part by part.

Usage (from a directory that holds no ``blockprep``)::

    python REPO/bench/step_parts.py deepseek-v4-wire-delta

Runs the workload's trace as the bench interleaves it (upstream's pre-fix step, then
blockprep's, round by round, one torch thread, the garbage collector off) and times, inside
each blockprep step, the table kernel's calls (``stage``, ``commit``), the wire message's walk
by group, the torch reads (``tensor.numpy()`` of the lengths and tokens) and the dynamic
inputs' write. Prints the median step and each part's median over the steps (the timers add a
little).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import blockprep.adapters.deepseek._dynamic as dynamic
import blockprep.adapters.deepseek._rows as rows
import blockprep.adapters.deepseek._tables as tables
from blockprep.bench import workloads

STEPS = 300
WARM_UP = 10

spent: dict[str, int] = {}


def timed(function: Callable[..., Any], part: str) -> Callable[..., Any]:
    """``function``, adding its time to ``spent[part]``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0) + time.perf_counter_ns() - start

    return call


class TimedKernel:
    """A table kernel whose stage and commit calls are timed."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.stage = timed(kernel.stage, "kernel stage")
        self.commit = timed(kernel.commit, "kernel commit")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


def main(name: str) -> None:
    torch.set_num_threads(1)
    workload = workloads.standard_workloads()[name]
    trace = list(workload.trace(STEPS + WARM_UP, 0))
    upstream = workload.constructions["pre-fix"]()
    ours = workload.constructions["blockprep"]()
    rows.integer_array = timed(rows.integer_array, "torch reads")  # type: ignore[assignment]
    tables._walk = timed(tables._walk, "message walk")  # type: ignore[assignment]
    dynamic.DynamicInputs.write = timed(dynamic.DynamicInputs.write, "dynamic write")  # type: ignore[method-assign]
    steps: list[int] = []
    parts: list[dict[str, int]] = []
    gc.disable()
    for i, item in enumerate(trace):
        upstream.step(upstream.receive(item))
        received = ours.receive(item)
        if i == 1:  # the tables exist after the first step
            grouped = ours.preparer._grouped()
            grouped._kernels = [TimedKernel(kernel) for kernel in grouped._kernels]
        spent.clear()
        start = time.perf_counter_ns()
        ours.step(received)
        steps.append(time.perf_counter_ns() - start)
        parts.append(dict(spent))

    def median(values: list[int]) -> float:
        return statistics.median(values[WARM_UP:]) / 1e3

    print(f"{name}: step {median(steps):.1f} us (median of {STEPS} interleaved steps)")
    total = 0.0
    for part in sorted({part for step in parts for part in step}):
        value = median([step.get(part, 0) for step in parts])
        total += value
        print(f"  {part:14s} {value:7.1f} us")
    print(f"  {'sum':14s} {total:7.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
