"""``GroupKernel.bind`` and ``GroupKernel.apply_row`` (one row's change at once) on both kernels.

Malformed arguments raise the same exception type on the compiled kernel and the twin and change
nothing; the cases ``apply_row`` leaves to its caller answer ``None`` and change nothing; long
random sequences of row changes on wide rows (past the compiled kernel's first held stride of
128 ids) leave both kernels' tables equal to each other and to a :mod:`blockprep.reference`
rebuild of the held ids after every call. The state machine of ``test_engine_differential.py``
interleaves ``apply_row`` with every other call.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from blockprep import reference as ref
from blockprep._engine import twin
from blockprep._engine.rules import ROW_APPEND, ROW_CLEAR, ROW_COPY, ROW_WHOLE


def compiled() -> Any:
    return pytest.importorskip("blockprep._engine._kernel")


# K, each kernel class in turn: tests/conftest.py.
ROWS, WIDTH, PAD = 4, 6, -1


class Bound:
    """A paged (or ring) kernel bound to its table and counts; rows 0 and 1 hold ids, row 2 is
    cleared, row 3 unknown."""

    def __init__(self, K: type, ring: bool = False, distinct: bool = False) -> None:
        self.k = K(ring, WIDTH, 50, 1 if ring else 0, PAD, ROWS, 2, distinct=distinct)
        self.table = np.full((ROWS, WIDTH), 7, np.int32)
        self.counts = np.zeros((ROWS, 2), np.int32)
        self.k.bind(self.table, self.counts, 1)
        # rows start unknown: each written whole
        assert self.k.apply_row(ROW_WHOLE, 0, [1, 2, 3]) == (None if distinct else WIDTH)
        if not distinct:
            assert self.k.apply_row(ROW_WHOLE, 1, [4, 5]) == WIDTH
            assert self.k.apply_row(ROW_CLEAR, 2, None) == WIDTH

    def state(self) -> tuple[Any, ...]:
        held = tuple(self.k.held(r) for r in range(ROWS))
        return held, self.table.tobytes(), self.counts.tobytes()


def test_apply_row_writes_what_a_rebuild_gives(K: type) -> None:
    b = Bound(K)
    assert b.table[:3].tolist() == [[1, 2, 3, PAD, PAD, PAD], [4, 5, PAD, PAD, PAD, PAD], [PAD] * 6]
    assert b.table[3].tolist() == [7] * 6  # unknown: left as it was
    assert b.counts[:, 1].tolist() == [3, 2, 0, 0] and not b.counts[:, 0].any()
    assert b.k.apply_row(ROW_APPEND, 0, [9]) == 1
    assert b.k.apply_row(ROW_APPEND, 0, []) == 0  # a hit
    assert b.k.apply_row(ROW_COPY, 2, 0) == 4
    assert b.k.apply_row(ROW_WHOLE, 1, [4, 5]) == 0  # holds them already
    assert b.k.apply_row(ROW_WHOLE, 3, [8]) == WIDTH  # unknown: written whole
    expected = ref.block_table_per_row(
        [[1, 2, 3, 9], [4, 5], [1, 2, 3, 9], [8]], max_blocks=WIDTH, pad=PAD
    )
    np.testing.assert_array_equal(b.table, expected.numpy())
    assert b.counts[:, 1].tolist() == [4, 2, 4, 1]


def test_apply_row_ring_rows_retile(K: type) -> None:
    b = Bound(K, ring=True)
    assert b.k.apply_row(ROW_APPEND, 1, [6]) == WIDTH
    assert b.k.apply_row(ROW_WHOLE, 1, [4, 5, 8]) == 2  # one ring position: its strided cells
    expected = ref.ring_block_table_repeat([[1, 2, 3], [4, 5, 8]], max_blocks=WIDTH).numpy()
    np.testing.assert_array_equal(b.table[:2], expected)
    assert b.table[2].tolist() == [PAD] * WIDTH


NONE_CASES = [
    ("row -1", ROW_APPEND, -1, [1]),
    ("row past the end", ROW_APPEND, ROWS, [1]),
    ("row a bool", ROW_APPEND, True, [1]),
    ("row a float", ROW_WHOLE, 0.0, [1]),
    ("row a NumPy int", ROW_WHOLE, np.int64(0), [1]),
    ("ids a tuple", ROW_APPEND, 0, (1,)),
    ("ids an array", ROW_WHOLE, 0, np.array([1])),
    ("ids a tensor", ROW_WHOLE, 0, torch.tensor([1])),
    ("ids None", ROW_WHOLE, 0, None),
    ("an id negative", ROW_APPEND, 0, [-1]),
    ("an id at the limit", ROW_APPEND, 0, [50]),
    ("an id past int64", ROW_WHOLE, 0, [2**70]),
    ("an id a bool", ROW_APPEND, 0, [True]),
    ("an id a float", ROW_WHOLE, 0, [1.0]),
    ("an id a NumPy int", ROW_APPEND, 0, [np.int32(1)]),
    ("append to an unknown row", ROW_APPEND, 3, [1]),
    ("append past the width", ROW_APPEND, 0, [1, 2, 3, 4]),
    ("a row past the width", ROW_WHOLE, 0, list(range(WIDTH + 1))),
    ("a copy of itself", ROW_COPY, 0, 0),
    ("a copy of a cleared row", ROW_COPY, 0, 2),
    ("a copy of an unknown row", ROW_COPY, 0, 3),
    ("a copy of row -1", ROW_COPY, 0, -1),
    ("a copy of a float row", ROW_COPY, 0, 1.0),
]


@pytest.mark.parametrize(
    ("name", "kind", "row", "value"), NONE_CASES, ids=[c[0] for c in NONE_CASES]
)
def test_cases_left_to_the_caller_change_nothing(
    K: type, name: str, kind: int, row: Any, value: Any
) -> None:
    b = Bound(K)
    before = b.state()
    assert b.k.apply_row(kind, row, value) is None
    assert b.state() == before


def test_a_distinct_kernel_and_a_short_ring_row_are_left_to_the_caller(K: type) -> None:
    b = Bound(K, distinct=True)
    before = b.state()
    assert b.k.apply_row(ROW_APPEND, 0, [9]) is None
    assert b.state() == before
    ring = Bound(K, ring=True)
    before = ring.state()
    assert ring.k.apply_row(ROW_WHOLE, 0, []) is None  # a ring row holds at least one id
    assert ring.state() == before


@pytest.mark.parametrize(
    ("args", "exc"),
    [
        ((), TypeError),
        ((ROW_APPEND, 0), TypeError),
        ((ROW_APPEND, 0, [1], 1), TypeError),
        ((-1, 0, [1]), ValueError),
        ((4, 0, [1]), ValueError),
        ((True, 0, [1]), ValueError),
        ((1.0, 0, [1]), ValueError),
        (("a", 0, [1]), ValueError),
        ((2**70, 0, [1]), ValueError),
    ],
    ids=repr,
)
def test_apply_row_rejects_malformed_arguments(K: type, args: tuple[Any, ...], exc: type) -> None:
    b = Bound(K)
    before = b.state()
    with pytest.raises(exc):
        b.k.apply_row(*args)
    assert b.state() == before


def test_both_kernels_word_a_missing_bind_alike() -> None:
    """``apply_row`` and ``apply_step`` before ``bind``: the same ``RuntimeError`` text."""
    spec = (False, WIDTH, 50, 0, PAD, ROWS, 1)
    texts = []
    for kernel in (compiled().GroupKernel, twin.GroupKernel):
        k = kernel(*spec, distinct=False)
        with pytest.raises(RuntimeError) as row_info:
            k.apply_row(ROW_WHOLE, 0, [1])
        with pytest.raises(RuntimeError) as step_info:
            k.apply_step([], [], [], [])
        texts += [str(row_info.value), str(step_info.value)]
    assert texts[:2] == texts[2:]
    assert texts[:2] == [
        "apply_row needs the buffers of bind() first",
        "apply_step needs the buffers of bind() first",
    ]


def test_apply_row_needs_bind_and_a_reinit_unbinds(K: type) -> None:
    k = K(False, WIDTH, 50, 0, PAD, ROWS, 1, distinct=False)
    with pytest.raises(RuntimeError, match="bind"):
        k.apply_row(ROW_WHOLE, 0, [1])
    k.bind(np.zeros((ROWS, WIDTH), np.int32), np.zeros((ROWS, 1), np.int32), 0)
    assert k.apply_row(ROW_WHOLE, 0, [1]) == WIDTH
    k.__init__(False, WIDTH + 1, 50, 0, PAD, ROWS, 1, distinct=False)  # another shape
    with pytest.raises(RuntimeError, match="bind"):
        k.apply_row(ROW_WHOLE, 0, [1])


def bad_buffers() -> list[tuple[str, Any, Any, Any, type]]:
    table, counts = np.zeros((ROWS, WIDTH), np.int32), np.zeros((ROWS, 2), np.int32)
    readonly = table.copy()
    readonly.flags.writeable = False
    return [
        ("table int64", table.astype(np.int64), counts, 0, TypeError),
        ("table a tensor", torch.zeros((ROWS, WIDTH), dtype=torch.int32), counts, 0, TypeError),
        ("table None", None, counts, 0, TypeError),
        ("table 1-d", table.reshape(-1), counts, 0, TypeError),
        ("table rows+1", np.zeros((ROWS + 1, WIDTH), np.int32), counts, 0, ValueError),
        ("table cols-1", np.zeros((ROWS, WIDTH - 1), np.int32), counts, 0, ValueError),
        ("table strided", np.zeros((ROWS, 2 * WIDTH), np.int32)[:, ::2], counts, 0, ValueError),
        ("table read-only", readonly, counts, 0, ValueError),
        ("counts float", table, counts.astype(np.float32), 0, TypeError),
        ("counts rows-1", table, np.zeros((ROWS - 1, 2), np.int32), 0, ValueError),
        ("column 2", table, counts, 2, IndexError),
        ("column -1", table, counts, -1, IndexError),
        ("column a float", table, counts, 1.0, TypeError),
        ("column a bool", table, counts, True, TypeError),
    ]


@pytest.mark.parametrize(
    ("name", "table", "counts", "column", "exc"), bad_buffers(), ids=[c[0] for c in bad_buffers()]
)
def test_bind_rejects_bad_buffers_and_keeps_its_binding(
    K: type, name: str, table: Any, counts: Any, column: Any, exc: type
) -> None:
    b = Bound(K)
    with pytest.raises(exc):
        b.k.bind(table, counts, column)
    assert b.k.apply_row(ROW_APPEND, 1, [6]) == 1  # into the buffers bound before
    assert b.table[1].tolist() == [4, 5, 6, PAD, PAD, PAD]
    assert b.counts[1].tolist() == [0, 3]


def test_the_bound_buffers_stay_alive(K: type) -> None:
    """The kernel holds its bound arrays: dropping every other reference leaves them valid."""
    k = K(False, WIDTH, 50, 0, PAD, ROWS, 1, distinct=False)
    table, counts = np.zeros((ROWS, WIDTH), np.int32), np.zeros((ROWS, 1), np.int32)
    view = table.view()
    k.bind(table, counts, 0)
    del table, counts
    gc.collect()
    assert k.apply_row(ROW_WHOLE, 2, [3, 4]) == WIDTH
    assert view[2].tolist() == [3, 4, PAD, PAD, PAD, PAD]


@pytest.mark.parametrize("ring", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_long_sequences_on_wide_rows_agree_with_a_rebuild(ring: bool, seed: int) -> None:
    """Wide rows (300 columns, held rows growing past 128 ids) changed one call at a time by
    both kernels: the same results, tables equal to a rebuild of the held ids after every call."""
    rows, width, limit = 6, 300, 10_000
    kernels = [compiled().GroupKernel, twin.GroupKernel]
    made = []
    for kernel in kernels:
        k = kernel(ring, width, limit, 1 if ring else 0, PAD, rows, 1, distinct=False)
        table, counts = np.full((rows, width), 3, np.int32), np.zeros((rows, 1), np.int32)
        k.bind(table, counts, 0)
        made.append((k, table, counts))
    rng = random.Random(seed)
    known: set[int] = set()
    for _ in range(300):
        kind = rng.choice([ROW_APPEND] * 4 + [ROW_WHOLE, ROW_COPY, ROW_CLEAR])
        row = rng.randrange(rows)
        value: Any = None
        if kind in (ROW_APPEND, ROW_WHOLE):
            value = [rng.randrange(limit) for _ in range(rng.choice([0, 1, 2, 5, 40, 150]))]
        elif kind == ROW_COPY:
            value = rng.randrange(rows)
        outs = [k.apply_row(kind, row, value) for k, _, _ in made]
        assert outs[0] == outs[1], (kind, row, outs)
        if outs[0]:
            known.add(row)
        np.testing.assert_array_equal(made[0][1], made[1][1])
        np.testing.assert_array_equal(made[0][2], made[1][2])
        k, table, counts = made[0]
        for r in sorted(known):
            held = k.held(r)
            assert held == made[1][0].held(r) and counts[r, 0] == len(held)
            if not held:
                expected = np.full(width, PAD)
            elif ring:
                expected = ref.ring_block_table_repeat([held], max_blocks=width).numpy()[0]
            else:
                expected = ref.block_table_per_row([held], max_blocks=width, pad=PAD).numpy()[0]
            np.testing.assert_array_equal(table[r], expected)


@pytest.mark.parametrize(("num_reqs", "block_size"), [(300, 16), (16, 128)])
def test_scheduler_steps_agree_with_a_rebuild(num_reqs: int, block_size: int) -> None:
    """``apply_step`` of a vLLM-like scheduler trace (:mod:`bench.vllm_compare`'s: churn,
    appends, new requests, rows moved into gaps; 300 rows take the compiled kernel's allocated
    scratch, 16 its stack one) on both kernels: the same results, and after every step each
    row's cells equal a :mod:`blockprep.reference` rebuild of the ids the scheduler holds."""
    if not (Path(__file__).parents[1] / "bench" / "vllm_compare.py").exists():
        pytest.skip("bench/ (a repository checkout's harnesses) is not here")
    from bench.vllm_compare import SEQ_LEN, SchedulerTrace

    width = SEQ_LEN // block_size
    made = []
    for kernel in (compiled().GroupKernel, twin.GroupKernel):
        k = kernel(False, width, 2**31, 0, 0, num_reqs, 1, distinct=False)
        table, counts = np.full((num_reqs, width), 9, np.int32), np.zeros((num_reqs, 1), np.int32)
        k.bind(table, counts, 0)
        for r in range(num_reqs):  # every row known and empty, as a facade's table starts
            assert k.apply_row(ROW_CLEAR, r, None) == width
        made.append((k, table, counts))
    trace = SchedulerTrace(num_reqs, block_size, seed=3)
    lists: list[list[int]] = [[] for _ in range(num_reqs)]
    for _ in range(60):
        step = trace.step()
        args = (step["finished"], step["appended"], step["added"], step["moves"])
        outs = [k.apply_step(*args) for k, _, _ in made]
        assert outs[0] == outs[1] and outs[0] is not None
        for row in step["finished"]:
            lists[row] = []
        for row, ids in step["appended"]:
            lists[row] = lists[row] + ids
        for row, ids in step["added"]:
            lists[row] = list(ids)
        for src, tgt in step["moves"]:
            lists[tgt] = list(lists[src])
        expected = ref.block_table_per_row(lists, max_blocks=width, pad=0).numpy()
        for _, table, counts in made:
            np.testing.assert_array_equal(table, expected)
            assert counts[:, 0].tolist() == [len(ids) for ids in lists]
