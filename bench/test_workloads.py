"""The standard workloads of ``python -m blockprep bench`` as a pytest-benchmark suite.

One benchmark group per workload, three benchmarks in it (``extra_info["impl"]``: pre-fix, fix,
blockprep), each round one step of the workload's trace, so ``--benchmark-compare`` between two
commits compares the same steps. Each workload's trace is first checked cell for cell across the
three constructions (``blockprep.bench.runner.verify``), so a wrong construction never produces a
number. Run with ``pytest bench/ --benchmark-only``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import pytest

from blockprep.bench.runner import verify
from blockprep.bench.workloads import CONSTRUCTIONS, Workload, standard_workloads

STEPS = 300
SEED = 0
WORKLOADS = standard_workloads()


@functools.cache
def checked_trace(name: str) -> Sequence[Any]:
    workload = WORKLOADS[name]
    trace = workload.trace(STEPS, SEED)
    verify(workload, trace)
    return trace


def _cold_round(workload: Workload, impl: str, items: Any) -> Any:
    stepper = workload.constructions[impl]()
    return (stepper, next(items)), {}


@pytest.mark.parametrize("impl", CONSTRUCTIONS)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload(benchmark: Any, name: str, impl: str) -> None:
    workload = WORKLOADS[name]
    benchmark.group = f"{name}: {workload.description}"
    benchmark.extra_info["impl"] = impl
    trace = checked_trace(name)
    items = iter(trace[1:])
    if workload.cold:
        benchmark.pedantic(
            lambda stepper, item: stepper.step(item),
            setup=lambda: _cold_round(workload, impl, items),
            rounds=STEPS,
        )
        return
    stepper = workload.constructions[impl]()
    stepper.step(trace[0])
    before = stepper.written()
    benchmark.pedantic(stepper.step, setup=lambda: ((next(items),), {}), rounds=STEPS)
    after = stepper.written()
    if before is not None and after is not None:
        benchmark.extra_info["rows_written_per_step"] = (after[0] - before[0]) / STEPS
        benchmark.extra_info["cells_written_per_step"] = (after[1] - before[1]) / STEPS
    else:
        benchmark.extra_info["rows_written_per_step"] = workload.rows
        benchmark.extra_info["cells_written_per_step"] = workload.cells
    benchmark.extra_info["table_cells"] = workload.cells
