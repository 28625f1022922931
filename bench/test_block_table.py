"""Benchmarks: a BlockTable's steady-state step against rebuilding the table upstream's ways.

Workload: a DeepSeek-V4-like ring table (the csa_state shape), 64 rows x 4096 columns, 65 ids per
row. Each decode step a quarter of the rows rotate one ring slot, in slot order, to a fresh page
from a free queue (the scheduler of seed-semantics 4.3). Per step:

- ``pre-fix``: rebuild with ``reference.ring_block_table_repeat`` and copy into the persistent
  buffer (upstream before its fix);
- ``fix``: the same with ``reference.ring_block_table_gather`` (upstream's fix);
- ``blockprep``: ``BlockTable.write_rows`` with the step's rows.

Each round is one step of a precomputed trace, so every construction sees the same inputs. Before
timing, the whole trace runs through a BlockTable and every step's buffer is compared with a
from-scratch reference rebuild. ``extra_info`` records cells written per step and the table size.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from blockprep import BlockTable
from blockprep.reference import ring_block_table_gather, ring_block_table_repeat

ROWS, WIDTH, RING = 64, 4096, 65
STEPS = 300
SEED = 4_096
STEADY = f"block table steady step: ring {ROWS}x{WIDTH} n={RING}, 1/4 of rows rotate one slot"
IDLE = f"block table idle step: ring {ROWS}x{WIDTH} n={RING}, no row changes"


def ring_trace(steps: int = STEPS) -> list[list[list[int]]]:
    """``steps + 1`` snapshots of the rows; step s rotates rows r with ``(r + s) % 4 == 0``."""
    rng = random.Random(SEED)
    pool = list(range(ROWS * RING * 4))
    rng.shuffle(pool)
    rows = [[pool.pop() for _ in range(RING)] for _ in range(ROWS)]
    free = collections.deque(pool)
    next_slot = [0] * ROWS
    trace = [[list(row) for row in rows]]
    for step in range(1, steps + 1):
        for r in range(ROWS):
            if (r + step) % 4 == 0:
                slot = next_slot[r]
                free.append(rows[r][slot])
                rows[r][slot] = free.popleft()
                next_slot[r] = (slot + 1) % RING
        trace.append([list(row) for row in rows])
    return trace


TRACE = ring_trace()


def test_trace_is_checked_step_by_step() -> None:
    """Not a benchmark: the table equals a reference rebuild after every step of the trace."""
    table = BlockTable(ROWS, WIDTH, kind="ring")
    for rows in TRACE:
        table.write_rows(rows)
        expected = ring_block_table_repeat(rows, max_blocks=WIDTH)
        assert np.array_equal(table.numpy(), expected.numpy())


def steps(start: int = 1) -> Iterator[tuple[tuple[list[list[int]]], dict[str, Any]]]:
    for rows in TRACE[start:]:
        yield (rows,), {}


def rebuild(builder: Callable[..., torch.Tensor]) -> Callable[[list[list[int]]], None]:
    buffer = torch.empty((ROWS, WIDTH), dtype=torch.int32)

    def step(rows: list[list[int]]) -> None:
        buffer.copy_(builder(rows, max_blocks=WIDTH))

    return step


@pytest.mark.parametrize("impl", ["pre-fix", "fix", "blockprep"])
def test_steady_step(benchmark: Any, impl: str) -> None:
    benchmark.group = STEADY
    benchmark.extra_info["impl"] = impl
    if impl == "blockprep":
        table = BlockTable(ROWS, WIDTH, kind="ring")
        table.write_rows(TRACE[0])
        table.reset_stats()
        target: Callable[[list[list[int]]], Any] = table.write_rows
    else:
        target = rebuild(ring_block_table_repeat if impl == "pre-fix" else ring_block_table_gather)
    setup = steps()
    benchmark.pedantic(target, setup=lambda: next(setup), rounds=STEPS, warmup_rounds=0)
    if impl == "blockprep":
        stats = table.stats
        benchmark.extra_info["cells_written_per_step"] = stats.cells_written / STEPS
        benchmark.extra_info["rows_written_per_step"] = stats.misses / STEPS
        benchmark.extra_info["table_cells"] = ROWS * WIDTH
        assert np.array_equal(
            table.numpy(), ring_block_table_repeat(TRACE[-1], max_blocks=WIDTH).numpy()
        )
    else:
        benchmark.extra_info["cells_written_per_step"] = ROWS * WIDTH
        benchmark.extra_info["table_cells"] = ROWS * WIDTH


def test_idle_step(benchmark: Any) -> None:
    """A step where no row changed: 64 cache hits."""
    benchmark.group = IDLE
    benchmark.extra_info["impl"] = "blockprep"
    table = BlockTable(ROWS, WIDTH, kind="ring")
    rows = TRACE[-1]
    table.write_rows(rows)
    table.reset_stats()
    benchmark(table.write_rows, rows)
    assert table.stats.misses == 0 and table.stats.cells_written == 0
    benchmark.extra_info["cells_written_per_step"] = 0
    benchmark.extra_info["table_cells"] = ROWS * WIDTH
