"""The standard benchmark workloads (:func:`standard_workloads`): the DeepSeek V4 and Qwen3
workloads (:mod:`blockprep.bench.deepseek_workloads`, :mod:`blockprep.bench.qwen_workloads`), and
here the persistent ``BlockTable`` and the stateless builders, each a trace of step inputs and three
ways to prepare them (:mod:`blockprep.bench.base`).
"""

from __future__ import annotations

import collections
import pickle
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.bench.base import FullRewrite, Stepper, Workload
from blockprep.bench.deepseek_workloads import deepseek_workloads
from blockprep.bench.qwen_workloads import qwen_wire_workloads, qwen_workload
from blockprep.block_table import BlockTable
from blockprep.builders import paged_block_table, ring_block_table

# --- builders: one table per step, rebuilt whole -----------------------------------------------


class _BuilderStepper(FullRewrite):
    """A stateless builder rebuilding the whole table from the step's rows (``wire``: each item
    the rows pickled, unpickled by :meth:`receive`)."""

    def __init__(
        self,
        build: Callable[[Any, torch.Tensor], torch.Tensor],
        shape: tuple[int, int],
        wire: bool = False,
    ):
        super().__init__(shape[0], shape[0] * shape[1])
        self._build = build
        self._out = torch.empty(shape, dtype=torch.int32)
        self._wire = wire

    def receive(self, item: Any) -> Any:
        return pickle.loads(item) if self._wire else item

    def _prepare(self, item: Any) -> None:
        self._build(item, self._out)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {"table": self._out.numpy()}


def _same_rows(rows: int, lengths: Callable[[random.Random], int]) -> Callable[[int, int], Any]:
    def trace(steps: int, seed: int) -> Iterator[list[list[int]]]:
        rng = random.Random(seed)
        table = [rng.sample(range(100_000), lengths(rng)) for _ in range(rows)]
        for _ in range(steps + 1):
            yield table

    return trace


def _rebuild(
    builder: Callable[..., torch.Tensor], rows: int, width: int, wire: bool = False
) -> Callable[[], Stepper]:
    """An upstream builder as upstream used it: build the table, copy it into the buffer."""
    return lambda: _BuilderStepper(
        lambda ids, out: out.copy_(builder(ids, max_blocks=width)), (rows, width), wire
    )


_BUILDERS: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], Any]] = {
    "ring": (
        reference.ring_block_table_repeat,
        reference.ring_block_table_gather,
        ring_block_table,
    ),
    "paged": (reference.block_table_per_row, reference.block_table_one_tensor, paged_block_table),
}
"""Per table kind: upstream's builder before its fix, after it, and blockprep's."""


def _builder_workload(
    name: str, kind: str, rows: int, width: int, lengths: Callable[[random.Random], int], what: str
) -> Workload:
    pre_fix, fix, ours = _BUILDERS[kind]
    constructions = {
        "pre-fix": _rebuild(pre_fix, rows, width),
        "fix": _rebuild(fix, rows, width),
        "blockprep": lambda: _BuilderStepper(
            lambda ids, out: ours(ids, width, out=out), (rows, width)
        ),
    }
    return Workload(name, what, _same_rows(rows, lengths), constructions, rows, rows * width)


# --- BlockTable: a ring table kept across steps ---------------------------------------------------


def ring_rotation_trace(
    rows: int,
    ring: int,
    steps: int,
    seed: int,
    *,
    rotate: bool = True,
    ordered: bool = True,
    wire: bool = False,
) -> Iterator[list[list[int]] | bytes]:
    """``steps + 1`` states of ``rows`` ring rows of ``ring`` ids (live lists, rotated in place):
    step s rotates one slot of each row r with ``(r + s) % 4 == 0`` to a fresh page from a free
    queue, in slot order (``ordered=False``: a slot drawn at random, never the one after the
    slot that rotated last, as a scheduler that rotates out of order); with ``rotate=False``
    nothing changes between steps. ``wire``: each state pickled (bytes), for each construction
    to unpickle into new lists of new ints (untimed, in its :meth:`Stepper.receive`)."""
    rng = random.Random(seed)
    pool = list(range(rows * ring * 4))
    rng.shuffle(pool)
    table = [[pool.pop() for _ in range(ring)] for _ in range(rows)]
    free = collections.deque(pool)
    next_slot = [0] * rows
    yield pickle.dumps(table) if wire else table
    for step in range(1, steps + 1):
        for r in range(rows):
            if rotate and (r + step) % 4 == 0:
                slot = next_slot[r]
                if not ordered:
                    slot = (slot + rng.randrange(1, ring)) % ring
                free.append(table[r][slot])
                table[r][slot] = free.popleft()
                next_slot[r] = (slot + 1) % ring
        yield pickle.dumps(table) if wire else table


class _BlockTableStepper(Stepper):
    def __init__(self, rows: int, width: int, wire: bool = False) -> None:
        self.table = BlockTable(rows, width, kind="ring")
        self._wire = wire

    def receive(self, item: Any) -> Any:
        return pickle.loads(item) if self._wire else item

    def step(self, item: Any) -> None:
        self.table.write_rows(item)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {"table": self.table.numpy()}

    def written(self) -> tuple[int, int] | None:
        stats = self.table.stats
        return stats.misses, stats.cells_written


def _block_table_workload(
    rows: int,
    width: int,
    ring: int,
    *,
    idle: bool = False,
    ordered: bool = True,
    wire: bool = False,
) -> Workload:
    what = "no row changes" if idle else "1/4 of rows rotate one slot per step"
    suffix = ("-wire" if wire else "") + ("-idle" if idle else "" if ordered else "-unordered")
    if not ordered:
        what += ", a slot other than the next one"
    if wire:
        what += ", pickle round trip (new lists of new ints)"
    return Workload(
        f"blocktable-ring-{rows}x{width}{suffix}",
        f"BlockTable, ring {rows}x{width} n={ring}: {what}",
        lambda steps, seed: ring_rotation_trace(
            rows, ring, steps, seed, rotate=not idle, ordered=ordered, wire=wire
        ),
        {
            "pre-fix": _rebuild(reference.ring_block_table_repeat, rows, width, wire),
            "fix": _rebuild(reference.ring_block_table_gather, rows, width, wire),
            "blockprep": lambda: _BlockTableStepper(rows, width, wire),
        },
        rows,
        rows * width,
    )


def _fixed(n: int) -> Callable[[random.Random], int]:
    return lambda rng: n


def standard_workloads() -> dict[str, Workload]:
    """Every standard workload by name, in the order the bench command runs them: the DeepSeek V4
    round-trip workloads (the batches upstream's worker really receives) lead."""
    mixed_ring: Callable[[random.Random], int] = lambda rng: rng.randint(1, 65)  # noqa: E731
    mixed_paged: Callable[[random.Random], int] = lambda rng: rng.randint(1, 30)  # noqa: E731
    workloads = [
        *deepseek_workloads(),
        qwen_workload(),
        _block_table_workload(64, 4096, 65),
        _block_table_workload(64, 4096, 65, ordered=False),
        _block_table_workload(64, 4096, 65, idle=True),
        _block_table_workload(64, 4096, 65, wire=True),
        _block_table_workload(64, 4096, 65, ordered=False, wire=True),
        _block_table_workload(64, 4096, 65, idle=True, wire=True),
        _builder_workload(
            "ring-64x4096-n65", "ring", 64, 4096, _fixed(65), "ring_block_table 64x4096, n=65"
        ),
        _builder_workload(
            "ring-8x4096-n65", "ring", 8, 4096, _fixed(65), "ring_block_table 8x4096, n=65"
        ),
        _builder_workload(
            "ring-64x4096-mixed",
            "ring",
            64,
            4096,
            mixed_ring,
            "ring_block_table 64x4096, lengths 1..65",
        ),
        _builder_workload(
            "paged-8x128-mixed", "paged", 8, 128, mixed_paged, "paged_block_table 8x128, 1..30 ids"
        ),
    ]
    workloads += qwen_wire_workloads()
    return {workload.name: workload for workload in workloads}
