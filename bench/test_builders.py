"""Benchmarks: blockprep's builders against upstream's constructions, and the tiling constructions.

Run with ``pytest bench/ --benchmark-only`` (``bench/`` is outside the default test paths);
``python bench/ratios.py`` turns a ``--benchmark-json`` file into the table in docs/benchmarks.md.

Every builder case is one benchmark group holding three benchmarks, told apart by
``extra_info["impl"]``: ``pre-fix`` (upstream before its fix), ``fix`` (upstream's fix) and
``blockprep`` (writing into a preallocated int32 ``out``). Inputs are Python lists of ints, as
upstream passes them, drawn with a fixed seed: distinct ids in ``[0, 100000)``. Before anything is
timed, each benchmark checks that its output equals the pre-fix reference's output, so a wrong
construction never produces a number.

The "tiling constructions" groups time the ways of writing ``ids[r][j % n]`` into a NumPy int32
destination from a prepared int64 or int32 ids array; they document the thresholds in
:mod:`blockprep._tiling` (the broadcast, the doubling copy past ``DOUBLING_MIN_PERIODS``, and no
gather).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from blockprep import paged_block_table, ring_block_table
from blockprep._tiling import tile_row, tile_rows
from blockprep.reference import (
    block_table_one_tensor,
    block_table_per_row,
    ring_block_table_gather,
    ring_block_table_repeat,
)

SEED = 20_240_601
ID_SPACE = 100_000
SENTINEL = -7
"""Written into every destination before a check, so that a cell left unwritten shows."""

IMPLS = ("pre-fix", "fix", "blockprep")


@dataclass(frozen=True)
class Case:
    """One block table to build: ``rows`` rows of width ``width``.

    ``ring`` is a fixed row length, or ``None`` for lengths drawn uniformly from ``1..mixed_max``.
    """

    kind: str  # "ring" or "paged"
    rows: int
    width: int
    ring: int | None
    mixed_max: int

    @property
    def group(self) -> str:
        lengths = f"n={self.ring}" if self.ring is not None else f"mixed 1..{self.mixed_max}"
        return f"{self.kind} {self.rows}x{self.width} {lengths}"

    def __str__(self) -> str:
        return self.group.replace(" ", "-").replace("..", "-")


RING_CASES = [
    Case("ring", rows, width, n, 0)
    for rows in (8, 64)
    for width in (128, 2048, 4096)
    for n in (4, 48, 65)
    if n <= width  # a ring longer than the table is an error in blockprep; none here
] + [Case("ring", rows, width, None, 65) for rows in (8, 64) for width in (128, 2048, 4096)]

PAGED_CASES = [
    Case("paged", rows, 128, n, 30)
    for rows in (8, 64)
    for n in (None, 26)  # 26 pages: about sequence length 3338 at page size 128
]


def _distinct_ids(lengths: list[int], rng: np.random.Generator) -> list[list[int]]:
    flat = rng.choice(ID_SPACE, size=sum(lengths), replace=False).tolist()
    rows, start = [], 0
    for n in lengths:
        rows.append(flat[start : start + n])
        start += n
    return rows


@functools.cache
def case_rows(case: Case) -> list[list[int]]:
    """The case's input: ``case.rows`` lists of distinct Python ints, the same on every run."""
    rng = np.random.default_rng([SEED, case.rows, case.width, case.ring or 0, case.mixed_max])
    if case.ring is not None:
        lengths = [case.ring] * case.rows
    else:
        lengths = rng.integers(1, case.mixed_max + 1, size=case.rows).tolist()
    return _distinct_ids(lengths, rng)


@functools.cache
def expected_table(case: Case) -> torch.Tensor:
    """The pre-fix reference's table for ``case``: what every construction must equal."""
    rows = case_rows(case)
    if case.kind == "ring":
        return ring_block_table_repeat(rows, max_blocks=case.width)
    return block_table_per_row(rows, max_blocks=case.width)


def builder(case: Case, impl: str) -> Callable[[], torch.Tensor]:
    """A no-argument call building ``case`` with ``impl``; blockprep's writes one fixed ``out``."""
    rows, width = case_rows(case), case.width
    if impl == "blockprep":
        out = torch.full((case.rows, width), SENTINEL, dtype=torch.int32)
        if case.kind == "ring":
            return lambda: ring_block_table(rows, width, out=out)
        return lambda: paged_block_table(rows, width, out=out)
    reference: Any = {
        ("ring", "pre-fix"): ring_block_table_repeat,
        ("ring", "fix"): ring_block_table_gather,
        ("paged", "pre-fix"): block_table_per_row,
        ("paged", "fix"): block_table_one_tensor,
    }[case.kind, impl]
    return lambda: reference(rows, max_blocks=width)


def _bench_builder(benchmark: Any, case: Case, impl: str) -> None:
    benchmark.group = case.group
    benchmark.extra_info.update(impl=impl, case=case.group)
    build = builder(case, impl)
    expected = expected_table(case)
    table = build()
    assert table.dtype == torch.int32
    assert torch.equal(table, expected), f"{impl} differs from the pre-fix reference"
    result = benchmark(build)
    assert torch.equal(result, expected)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", RING_CASES, ids=str)
def test_ring(benchmark: Any, case: Case, impl: str) -> None:
    _bench_builder(benchmark, case, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", PAGED_CASES, ids=str)
def test_paged(benchmark: Any, case: Case, impl: str) -> None:
    _bench_builder(benchmark, case, impl)


# --- tiling constructions -------------------------------------------------------------------

Dst = npt.NDArray[np.int32]
Ids = npt.NDArray[np.int64] | npt.NDArray[np.int32]


@functools.cache
def tiling_index(width: int, n: int) -> npt.NDArray[np.intp]:
    """Upstream's fix: the index ``arange(width) % n``, built once per shape."""
    return np.arange(width) % n


def gather_per_row(dst: Dst, ids: Ids) -> None:
    """(a) Each row gathered through a cached tiling index (upstream's fix, in NumPy)."""
    index = tiling_index(dst.shape[1], ids.shape[1])
    for r in range(dst.shape[0]):
        np.take(ids[r], index, out=dst[r])


def broadcast_per_row(dst: Dst, ids: Ids) -> None:
    """(b) Each row's whole periods as a ``[width // n, n]`` reshape, then the remainder."""
    width, n = dst.shape[1], ids.shape[1]
    whole = width - width % n
    for r in range(dst.shape[0]):
        row = dst[r]
        row[:whole].reshape(whole // n, n)[...] = ids[r]
        row[whole:] = ids[r, : width - whole]


def broadcast_block(dst: Dst, ids: Ids) -> None:
    """(b') All rows at once: ids broadcast into a ``[rows, width // n, n]`` view, then the rest."""
    rows, width = dst.shape
    n = ids.shape[1]
    periods = width // n
    strides = (dst.strides[0], n * dst.itemsize, dst.itemsize)
    view: Dst = np.ndarray((rows, periods, n), dst.dtype, dst, 0, strides)
    view[...] = ids[:, None, :]
    dst[:, periods * n :] = ids[:, : width - periods * n]


def doubling_copy(dst: Dst, ids: Ids) -> None:
    """(c) The ids into the first ``n`` columns of all rows, then the filled part copied onwards."""
    width, n = dst.shape[1], ids.shape[1]
    dst[:, :n] = ids
    filled = n
    while filled < width:
        step = min(filled, width - filled)
        dst[:, filled : filled + step] = dst[:, :step]
        filled += step


def shipped_tile_rows(dst: Dst, ids: Ids) -> None:
    """(d) :func:`blockprep._tiling.tile_rows`: the builders' writer for rows of one length."""
    tile_rows(dst, ids)


def shipped_tile_row(dst: Dst, ids: Ids) -> None:
    """(d') :func:`blockprep._tiling.tile_row`: what the builders use for a lone row of a length."""
    tile_row(dst[0], ids[0])


TILING_PREFIX = "tiling constructions: "


@dataclass(frozen=True)
class TilingCase:
    rows: int
    width: int
    n: int
    dtype: str  # of the ids: "int64" (np.array of Python ints) or "int32" (what builders pass)

    @property
    def group(self) -> str:
        return f"{TILING_PREFIX}{self.rows}x{self.width} n={self.n}, {self.dtype} ids"

    def __str__(self) -> str:
        return f"{self.rows}x{self.width}-n{self.n}-{self.dtype}"


TILING_SHAPES = [
    (64, 4096, 65),
    (8, 4096, 65),
    (64, 128, 4),
    (1, 4096, 65),
    (1, 128, 4),
    # Either side of DOUBLING_MIN_PERIODS (rows * (width // n) = 4096): the cases that place it.
    (64, 4096, 9),
    (64, 4096, 24),
    (64, 4096, 32),
    (64, 2048, 16),
    (64, 2048, 32),
    (8, 4096, 8),
    (8, 4096, 12),
]
# blockprep._ids hands the tile writers int32 ids.
TILING_CASES = [TilingCase(*shape, "int32") for shape in TILING_SHAPES]

CONSTRUCTIONS: dict[str, Callable[[Dst, Ids], None]] = {
    "gather per row": gather_per_row,
    "broadcast per row": broadcast_per_row,
    "broadcast block": broadcast_block,
    "doubling copy": doubling_copy,
    "tile_rows": shipped_tile_rows,
    "tile_row": shipped_tile_row,
}

TILING_PARAMS = [
    pytest.param(case, name, id=f"{case}-{name.replace(' ', '-')}")
    for case in TILING_CASES
    for name in CONSTRUCTIONS
    if name != "tile_row" or case.rows == 1  # tile_row writes one row
]

ROUND_SECONDS = 200e-6
"""Tiling calls take 1-300 us: each timed round repeats one for at least this long."""
TILING_ROUNDS = 200


@functools.cache
def tiling_ids(case: TilingCase) -> Ids:
    rng = np.random.default_rng([SEED, case.rows, case.width, case.n])
    ids = rng.choice(ID_SPACE, size=case.rows * case.n, replace=False).reshape(case.rows, case.n)
    return np.ascontiguousarray(ids, dtype=case.dtype)


def _iterations(call: Callable[[], None]) -> int:
    """Calls per round so that a round lasts about ``ROUND_SECONDS``."""
    calls = 20
    start = time.perf_counter()
    for _ in range(calls):
        call()
    once = (time.perf_counter() - start) / calls
    return max(1, math.ceil(ROUND_SECONDS / once))


@pytest.mark.parametrize(("case", "construction"), TILING_PARAMS)
def test_tiling(benchmark: Any, case: TilingCase, construction: str) -> None:
    benchmark.group = case.group
    benchmark.extra_info.update(impl=construction, case=case.group)
    write = CONSTRUCTIONS[construction]
    ids = tiling_ids(case)
    dst = np.full((case.rows, case.width), SENTINEL, dtype=np.int32)
    expected = ids[:, np.arange(case.width) % case.n]  # ids[r][j % n]
    write(dst, ids)
    assert np.array_equal(dst, expected), f"{construction} differs from ids[r][j % n]"
    iterations = _iterations(lambda: write(dst, ids))
    benchmark.pedantic(write, (dst, ids), rounds=TILING_ROUNDS, iterations=iterations)
    assert np.array_equal(dst, expected)
