"""The standard workloads of ``python -m blockprep bench`` as a pytest-benchmark suite.

One benchmark group per workload, three benchmarks in it (``extra_info["impl"]``: pre-fix, fix,
blockprep), each round one step of the workload's trace (received by the construction in the
untimed setup: on the wire workloads, unpickling only the payload it consumes), so
``--benchmark-compare`` between two commits compares the same steps. Each workload's trace is
first checked cell for cell across the three constructions (``blockprep.bench.runner.verify``),
so a wrong construction never produces a number. Run with ``pytest bench/ --benchmark-only``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from blockprep.bench.base import CONSTRUCTIONS
from blockprep.bench.runner import verify
from blockprep.bench.workloads import standard_workloads

STEPS = 300
SEED = 0
WORKLOADS = standard_workloads()
"""The same workloads as ``python -m blockprep bench``: one definition serves both."""


@functools.cache
def check(name: str) -> None:
    verify(WORKLOADS[name], STEPS, SEED)


@pytest.mark.parametrize("impl", CONSTRUCTIONS)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload(benchmark: Any, name: str, impl: str) -> None:
    workload = WORKLOADS[name]
    benchmark.group = f"{name}: {workload.description}"
    benchmark.extra_info["impl"] = impl
    check(name)
    items = workload.trace(STEPS, SEED)
    first = next(items)
    make = workload.constructions[impl]
    if workload.cold:

        def fresh() -> tuple[tuple[Any, Any], dict[str, Any]]:
            stepper = make()
            return (stepper, stepper.receive(next(items))), {}

        benchmark.pedantic(lambda stepper, item: stepper.step(item), setup=fresh, rounds=STEPS)
        return
    stepper = make()
    stepper.step(stepper.receive(first))
    before = stepper.written()
    benchmark.pedantic(
        stepper.step, setup=lambda: ((stepper.receive(next(items)),), {}), rounds=STEPS
    )
    after = stepper.written()
    if before is not None and after is not None:  # None: the construction does not count
        benchmark.extra_info["rows_written_per_step"] = (after[0] - before[0]) / STEPS
        benchmark.extra_info["cells_written_per_step"] = (after[1] - before[1]) / STEPS
        benchmark.extra_info["table_cells"] = workload.cells
