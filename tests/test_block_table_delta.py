"""BlockTable delta operations (append, set_ids, truncate, apply_deltas) and ``lengths``.

Every expected buffer is a from-scratch rebuild with the upstream constructions in
``blockprep.reference`` of a dense model of what each row holds; nothing is compared with the
implementation itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockprep import INT32_MAX, BlockTable
from blockprep import reference as ref
from blockprep.block_table import UnknownRowError
from blockprep.testing import as_container, block_ids

CLEARED = "cleared"  # a cleared ring row in the model (a cleared paged row is [])

BAD_IDS: list[Any] = [-1, -(2**40), INT32_MAX + 1, 2**70, 2.5, None, "7", [1], True]


def rebuild(kind: str, contents: list[Any], max_blocks: int, pad: int) -> np.ndarray:
    """The whole table from the model's row contents, with upstream's constructions."""
    table = np.full((len(contents), max_blocks), pad, dtype=np.int32)
    for row, ids in enumerate(contents):
        if ids == CLEARED or not ids:
            continue
        if kind == "ring":
            table[row] = ref.ring_block_table_repeat([ids], max_blocks=max_blocks)[0].numpy()
        else:
            table[row] = ref.block_table_per_row([ids], max_blocks=max_blocks, pad=pad)[0].numpy()
    return table


def snapshot(table: BlockTable) -> tuple[Any, ...]:
    rows = range(table.num_rows)
    return (
        table.numpy().tobytes(),
        [table.cached_ids(r) for r in rows],
        table.stats,
        table.lengths.tolist(),
    )


def ring_cells(width: int, n: int, slots: list[int]) -> int:
    return sum((width - 1 - p) // n + 1 for p in slots)


def written_cells(kind: str, width: int, old: list[int], new: list[int]) -> int:
    """The cells a change of a row from ``old`` to ``new`` ids writes, by the documented rule:
    the positions that differ (a ring slot its strided columns), at most four of them; else a
    paged range of them, or the whole ring row (so is a ring row whose length changes)."""
    if kind == "ring" and len(old) != len(new):
        return width
    short = min(len(old), len(new))
    differ = [p for p in range(max(len(old), len(new))) if p >= short or old[p] != new[p]]
    if kind == "ring":
        return ring_cells(width, len(new), differ) if len(differ) <= 4 else width
    return len(differ) if len(differ) <= 4 else differ[-1] + 1 - differ[0]


# --- append ----------------------------------------------------------------------------------


def test_paged_append_writes_only_the_new_cells() -> None:
    table = BlockTable(2, 8, pad=-1)
    table.write_row(0, [3, 4])
    table.take_dirty()
    before = table.stats
    assert table.append(0, [9]) == 1
    assert table.append(0, np.array([10, 11])) == 2
    assert (
        table.numpy().tolist()
        == ref.block_table_per_row([[3, 4, 9, 10, 11], []], max_blocks=8, pad=-1).tolist()
    )
    assert table.stats.cells_written - before.cells_written == 3
    assert table.stats.misses - before.misses == 2
    assert table.take_dirty() == [0]
    assert table.lengths.tolist() == [5, 0]
    assert not table.write_row(0, [3, 4, 9, 10, 11])  # by value: a hit, the cache kept up
    assert table.append(1, (7,)) == 1  # a cleared row grows from nothing
    assert table.numpy()[1].tolist() == [7] + [-1] * 7
    assert table.cached_ids(1) == [7]


def test_ring_append_retiles_the_row() -> None:
    table = BlockTable(1, 10, kind="ring")
    table.write_row(0, [1, 2, 3])
    assert table.append(0, torch.tensor([4])) == 10
    assert (
        table.numpy().tolist()
        == ref.ring_block_table_repeat([[1, 2, 3, 4]], max_blocks=10).tolist()
    )
    assert table.lengths.tolist() == [4]
    assert not table.write_row(0, [1, 2, 3, 4])
    table.clear_row(0)
    assert table.append(0, [5, 6]) == 10
    assert table.numpy()[0].tolist() == [5, 6] * 5


def test_empty_append_is_a_hit() -> None:
    for kind in ("paged", "ring"):
        table = BlockTable(1, 4, kind=kind)  # type: ignore[arg-type]
        if kind == "paged":
            table.write_row(0, [1])
        before = snapshot(table)
        assert table.append(0, []) == 0
        assert table.stats.hits == before[2].hits + 1
        assert table.numpy().tobytes() == before[0]


@pytest.mark.parametrize("kind", ["paged", "ring"])
def test_append_past_max_blocks_raises_and_writes_nothing(kind: str) -> None:
    table = BlockTable(1, 4, kind=kind)  # type: ignore[arg-type]
    table.write_row(0, [1, 2, 3])
    table.take_dirty()
    before = snapshot(table)
    with pytest.raises(ValueError, match="row 0 has 5 blocks, maximum is 4"):
        table.append(0, [4, 5])
    assert snapshot(table) == before
    assert table.take_dirty() == []


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (-1, ValueError, r"block IDs must not be negative \(block-table row 1, id -1\)"),
        (
            INT32_MAX + 1,
            ValueError,
            f"row 1 holds block ID {INT32_MAX + 1}, maximum is {INT32_MAX}",
        ),
        (2.5, TypeError, "row 1 holds 2.5 of type float; block IDs must be integers"),
        (True, TypeError, "row 1 holds True of type bool"),
        ("7", TypeError, "row 1 holds '7' of type str"),
    ],
)
def test_bad_ids_raise_naming_row_and_id_and_write_nothing(
    bad: Any, error: type[Exception], message: str
) -> None:
    table = BlockTable(2, 6)
    table.write_rows([[1], [2, 3]])
    table.take_dirty()
    before = snapshot(table)
    with pytest.raises(error, match=message):
        table.append(1, [4, bad])
    with pytest.raises(error, match=message):
        table.set_ids(1, [0, 1], [4, bad])
    with pytest.raises(error, match=message):
        table.apply_deltas(append={0: [5]}, set_ids=[(1, [1], [bad])])
    assert snapshot(table) == before
    assert table.take_dirty() == []


def test_bad_containers_raise() -> None:
    table = BlockTable(1, 6)
    table.write_row(0, [1])
    with pytest.raises(ValueError, match="one-dimensional"):
        table.append(0, np.zeros((1, 1), dtype=np.int64))
    with pytest.raises(TypeError, match="dtype float"):
        table.append(0, np.array([1.0]))
    with pytest.raises(TypeError, match="sequence of block IDs, got int"):
        table.append(0, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of block IDs, got str"):
        table.append(0, "12")


# --- unknown rows and row indices ------------------------------------------------------------


def test_deltas_on_unknown_rows_raise_naming_the_row() -> None:
    buffer = torch.zeros(3, 4, dtype=torch.int32)
    table = BlockTable(3, 4, buffer=buffer)
    table.write_row(0, [1])
    before = snapshot(table)
    for call in (
        lambda: table.append(2, [1]),
        lambda: table.set_ids(2, [], []),
        lambda: table.truncate(2, 0),
        lambda: table.apply_deltas(append={0: [2], 2: [1]}),
    ):
        with pytest.raises(UnknownRowError, match="block-table row 2 holds unknown ids"):
            call()
        assert snapshot(table) == before
    table.invalidate(0)
    with pytest.raises(UnknownRowError, match="row 0"):
        table.append(0, [2])
    assert isinstance(UnknownRowError("x"), ValueError)


def test_bad_row_indices() -> None:
    table = BlockTable(2, 4)
    with pytest.raises(IndexError, match="row 2 is out of range"):
        table.append(2, [1])
    with pytest.raises(IndexError, match="row -1 is out of range"):
        table.truncate(-1, 0)
    with pytest.raises(TypeError, match="row index must be an integer"):
        table.set_ids(True, [], [])  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        table.apply_deltas(append=[(0, [1]), (5, [1])])
    assert table.stats.misses == 0
    assert table.append(np.int64(1), [3]) == 1  # type: ignore[arg-type]


# --- set_ids ---------------------------------------------------------------------------------


def test_paged_set_ids_writes_one_cell_each() -> None:
    table = BlockTable(1, 8)
    table.write_row(0, list(range(10, 17)))
    before = table.stats.cells_written
    assert table.set_ids(0, [6, 0], [99, 98]) == 2
    assert table.set_ids(0, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == 5
    assert table.set_ids(0, [1], [1]) == 0  # unchanged: a hit
    expected = [98, 1, 2, 3, 4, 5, 99]
    assert (
        table.numpy().tolist() == ref.block_table_per_row([expected], max_blocks=8, pad=-1).tolist()
    )
    assert table.stats.cells_written - before == 7
    assert not table.write_row(0, expected)


def test_ring_set_ids_is_a_strided_write_per_slot() -> None:
    width, n = 11, 3
    table = BlockTable(1, width, kind="ring")
    table.write_row(0, [1, 2, 3])
    assert table.set_ids(0, np.array([2]), [30]) == ring_cells(width, n, [2])
    assert table.set_ids(0, (0, 1), (10, 20)) == ring_cells(width, n, [0, 1])
    assert (
        table.numpy().tolist()
        == ref.ring_block_table_repeat([[10, 20, 30]], max_blocks=width).tolist()
    )
    assert not table.write_row(0, [10, 20, 30])
    # a by-value rotation afterwards still writes the right slot
    assert table.write_row(0, [10, 21, 30])
    assert table.numpy()[0].tolist() == ([10, 21, 30] * 4)[:width]


@pytest.mark.parametrize(
    ("positions", "ids", "error", "message"),
    [
        ([3], [1], IndexError, "row 0 position 3 is out of range for its 3 ids"),
        ([-1], [1], IndexError, "row 0 position -1 is out of range"),
        ([1, 1], [1, 2], ValueError, "row 0 position 1 is given more than once"),
        ([0, 1], [1], ValueError, "row 0 has 2 positions but 1 ids"),
        ([0.0], [1], TypeError, "row 0 position must be an integer"),
        (np.zeros((1, 1), dtype=np.int64), [1], ValueError, "positions must be one-dimensional"),
        (5, [1], TypeError, "positions must be a sequence of ints"),
    ],
)
@pytest.mark.parametrize("kind", ["paged", "ring"])
def test_bad_positions_raise_and_write_nothing(
    kind: str, positions: Any, ids: list[int], error: type[Exception], message: str
) -> None:
    table = BlockTable(2, 7, kind=kind)  # type: ignore[arg-type]
    table.write_rows([[1, 2, 3], [4]])
    table.take_dirty()
    before = snapshot(table)
    with pytest.raises(error, match=message):
        table.set_ids(0, positions, ids)
    with pytest.raises(error, match=message):
        table.apply_deltas(append=[(1, [5])], set_ids=[(0, positions, ids)])
    assert snapshot(table) == before
    assert table.take_dirty() == []


# --- truncate --------------------------------------------------------------------------------


def test_paged_truncate_resets_only_the_dropped_tail() -> None:
    table = BlockTable(1, 8, pad=7)
    table.write_row(0, [1, 2, 3, 4, 5])
    before = table.stats.cells_written
    assert table.truncate(0, 2) == 3
    assert table.truncate(0, 2) == 0
    assert table.numpy().tolist() == ref.block_table_per_row([[1, 2]], max_blocks=8, pad=7).tolist()
    assert table.stats.cells_written - before == 3
    assert table.lengths.tolist() == [2]
    assert table.truncate(0, 0) == 2
    assert table.cached_ids(0) == [] and table.lengths.tolist() == [0]
    assert not table.clear_row(0)  # already cleared
    assert table.append(0, [8]) == 1
    assert table.numpy()[0].tolist() == [8] + [7] * 7


def test_ring_truncate_retiles_and_may_not_empty_the_row() -> None:
    table = BlockTable(1, 9, kind="ring")
    table.write_row(0, [1, 2, 3, 4])
    assert table.truncate(0, 3) == 9
    assert table.numpy().tolist() == ref.ring_block_table_repeat([[1, 2, 3]], max_blocks=9).tolist()
    before = snapshot(table)
    with pytest.raises(
        ValueError, match="ring block-table row 0 cannot be truncated to 0 ids; use clear_row"
    ):
        table.truncate(0, 0)
    with pytest.raises(ValueError, match="row 0 cannot be truncated to 4 ids: it holds 3"):
        table.truncate(0, 4)
    with pytest.raises(ValueError, match="row 0 cannot be truncated to -1 ids"):
        table.apply_deltas(truncate={0: -1})
    with pytest.raises(TypeError, match="truncate length must be an integer"):
        table.truncate(0, 1.0)  # type: ignore[arg-type]
    assert snapshot(table) == before
    assert not table.write_row(0, [1, 2, 3])


# --- apply_deltas ----------------------------------------------------------------------------


def test_apply_deltas_paged_matches_the_per_row_operations() -> None:
    table = BlockTable(4, 6, pad=0)
    table.write_rows([[1, 2, 3], [4], [5, 6, 7, 8], []])
    table.take_dirty()
    cells = table.apply_deltas(
        truncate={2: 1, 0: 3},
        set_ids=[(0, [2], [30]), (2, [0], [50])],
        append={1: [40, 41], 2: [51, 52], 3: []},
    )
    expected = [[1, 2, 30], [4, 40, 41], [50, 51, 52], []]
    assert table.numpy().tolist() == ref.block_table_per_row(expected, max_blocks=6, pad=0).tolist()
    assert cells == 1 + 2 + (1 + 2 + 1)
    assert table.take_dirty() == [0, 1, 2]
    assert table.lengths.tolist() == [3, 3, 3, 0]
    assert table.write_rows(expected) == 0
    assert table.apply_deltas() == 0


def test_apply_deltas_ring() -> None:
    width = 10
    table = BlockTable(4, width, kind="ring")
    table.write_rows([[1, 2, 3], [4, 5], [6, 7, 8, 9], [1]])
    table.clear_row(3)
    table.take_dirty()
    cells = table.apply_deltas(
        truncate=[(2, 2)],
        set_ids=[(0, [0, 2], [10, 3]), (2, [1], [70])],  # slot 2 of row 0 is unchanged
        append=[(1, [6]), (2, [80]), (3, [11, 12])],
    )
    expected = [[10, 2, 3], [4, 5, 6], [6, 70, 80], [11, 12]]
    assert (
        table.numpy().tolist() == ref.ring_block_table_repeat(expected, max_blocks=width).tolist()
    )
    assert cells == ring_cells(width, 3, [0]) + 3 * width
    assert table.lengths.tolist() == [3, 3, 3, 2]
    assert table.write_rows(expected) == 0
    # truncate and append back to the same length: only the changed slot is written
    assert table.apply_deltas(truncate={1: 2}, append={1: [60]}) == ring_cells(width, 3, [2])
    assert table.apply_deltas(truncate={1: 2}, append={1: [60]}) == 0  # the same ids: a hit
    assert table.numpy()[1].tolist() == ([4, 5, 60] * 4)[:width]


def test_apply_deltas_is_all_or_nothing() -> None:
    table = BlockTable(2, 6)
    table.write_rows([[1], [2]])
    table.take_dirty()
    before = snapshot(table)
    with pytest.raises(ValueError, match="row 1 appears more than once in append"):
        table.apply_deltas(append=[(1, [3]), (0, [4]), (1, [5])])
    with pytest.raises(ValueError, match="row 0 has 7 blocks, maximum is 6"):
        table.apply_deltas(append={1: [1], 0: [1, 2, 3, 4, 5, 6]})
    with pytest.raises(ValueError, match="row 1 cannot be truncated to 2 ids"):
        table.apply_deltas(truncate={0: 0, 1: 2}, append={0: [5]})
    assert snapshot(table) == before
    assert table.take_dirty() == []


def test_lengths_follow_every_operation() -> None:
    table = BlockTable(3, 8, kind="ring")
    lengths = table.lengths
    assert lengths.dtype == np.int32 and lengths.tolist() == [0, 0, 0]
    with pytest.raises(ValueError):
        lengths[0] = 1  # read-only
    table.write_rows([[1, 2], [3, 4, 5]])
    assert lengths.tolist() == [2, 3, 0]  # a view: it follows
    table.copy_row(1, 2)
    assert lengths.tolist() == [2, 3, 3]
    table.swap_rows(0, 1)
    assert lengths.tolist() == [3, 2, 3]
    table.clear_row(2)
    assert lengths.tolist() == [3, 2, 0]
    table.invalidate(0)
    assert lengths.tolist() == [0, 2, 0]
    table.write_row(0, [9])
    table.invalidate()
    assert lengths.tolist() == [0, 0, 0]
    adopted = BlockTable(2, 4, buffer=torch.ones(8, dtype=torch.int32))
    assert adopted.lengths.tolist() == [0, 0]


# --- stateful: delta operations mixed with by-value writes -----------------------------------


class DeltaMachine(RuleBasedStateMachine):
    table: BlockTable

    @initialize(
        kind=st.sampled_from(["paged", "ring"]),
        num_rows=st.integers(1, 5),
        max_blocks=st.sampled_from([1, 2, 5, 16, 67]),
        pad=st.sampled_from([-1, 0, 7]),
    )
    def start(self, kind: str, num_rows: int, max_blocks: int, pad: int) -> None:
        self.kind, self.num_rows, self.max_blocks, self.pad = kind, num_rows, max_blocks, pad
        self.cleared: Any = [] if kind == "paged" else CLEARED
        self.table = BlockTable(num_rows, max_blocks, kind=kind, pad=pad)  # type: ignore[arg-type]
        self.known: list[Any] = [self.cleared] * num_rows  # None: the table forgot the row
        self.content: list[Any] = [self.cleared] * num_rows  # what the buffer shows
        self.dirty: set[int] = set()

    # --- helpers -----------------------------------------------------------------------------

    def ids(self, data: Any, size: int) -> list[int]:
        id_ = block_ids(max_id=data.draw(st.sampled_from([40, INT32_MAX]), label="max_id"))
        return data.draw(st.lists(id_, min_size=size, max_size=size), label="ids")

    def container(self, data: Any, ids: list[int]) -> Any:
        kinds = ["list", "tuple", "numpy-int64", "torch-int64"]
        if max(ids, default=0) < 2**31:
            kinds.append("numpy-int32")
        return as_container(ids, data.draw(st.sampled_from(kinds), label="container"))

    def row_ids(self, row: int) -> list[int]:
        known = self.known[row]
        assert known is not None
        return [] if known == CLEARED else list(known)

    def known_rows(self) -> list[int]:
        return [r for r in range(self.num_rows) if self.known[r] is not None]

    def set_row(self, row: int, ids: list[int]) -> None:
        self.known[row] = self.content[row] = ids if ids else self.cleared
        self.dirty.add(row)

    def draw_delta(self, data: Any, row: int) -> tuple[int | None, list[int], list[int], list[int]]:
        """A valid truncate length (or None), positions, ids, appended ids for ``row``."""
        current = self.row_ids(row)
        keep: int | None = None
        if data.draw(st.booleans(), label="truncate?"):
            low = 1 if self.kind == "ring" and current else 0
            keep = data.draw(st.integers(low, len(current)), label="keep")
        n = len(current) if keep is None else keep
        positions: list[int] = []
        values: list[int] = []
        if n and data.draw(st.booleans(), label="set?"):
            positions = data.draw(
                st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 6)), label="positions"
            )
            values = [
                current[p] if data.draw(st.booleans(), label="same?") else self.ids(data, 1)[0]
                for p in positions
            ]
        room = self.max_blocks - n
        appended = self.ids(data, data.draw(st.integers(0, min(room, 4)), label="append"))
        return keep, positions, values, appended

    def model_delta(
        self,
        row: int,
        keep: int | None,
        positions: list[int],
        values: list[int],
        appended: list[int],
    ) -> int | None:
        """Apply a delta to the model; return the cells the table writes (None: a hit)."""
        old = self.row_ids(row)
        n = len(old) if keep is None else keep
        new = old[:n]
        for p, v in zip(positions, values, strict=True):
            new[p] = v
        new += appended
        if new == old:
            return None
        cells = written_cells(self.kind, self.max_blocks, old, new)
        self.set_row(row, new)
        return cells

    # --- rules: by value ---------------------------------------------------------------------

    @rule(data=st.data())
    def write_row(self, data: Any) -> None:
        row = data.draw(st.integers(0, self.num_rows - 1), label="row")
        current = self.content[row]
        if isinstance(current, list) and current and data.draw(st.booleans(), label="same?"):
            ids = list(current)  # a by-value rewrite of what deltas built: a hit once known
        else:
            low = 1 if self.kind == "ring" else 0
            ids = self.ids(data, data.draw(st.integers(low, min(self.max_blocks, 20)), label="n"))
        hit = self.known[row] is not None and self.known[row] == ids
        assert self.table.write_row(row, self.container(data, ids)) == (not hit)
        self.known[row] = self.content[row] = ids if ids else self.cleared
        if not hit:
            self.dirty.add(row)

    @rule(data=st.data())
    def write_rows(self, data: Any) -> None:
        low = 1 if self.kind == "ring" else 0
        size = st.integers(low, min(self.max_blocks, 8))
        batch = [self.ids(data, data.draw(size, label="n")) for _ in range(self.num_rows)]
        written = self.table.write_rows(batch)
        expected = 0
        for row, ids in enumerate(batch):
            known = self.known[row]
            if known is None or known != ids:
                expected += 1
                self.dirty.add(row)
            self.known[row] = self.content[row] = ids if ids else self.cleared
        assert written == expected

    @rule(data=st.data())
    def copy_row(self, data: Any) -> None:
        src = data.draw(st.integers(0, self.num_rows - 1), label="src")
        dst = data.draw(st.integers(0, self.num_rows - 1), label="dst")
        skip = dst == src or (self.known[src] is not None and self.known[dst] == self.known[src])
        assert self.table.copy_row(src, dst) == (not skip)
        if not skip:
            self.known[dst], self.content[dst] = self.known[src], self.content[src]
            self.dirty.add(dst)

    @rule(data=st.data())
    def swap_rows(self, data: Any) -> None:
        a = data.draw(st.integers(0, self.num_rows - 1), label="a")
        b = data.draw(st.integers(0, self.num_rows - 1), label="b")
        same = a == b or (self.known[a] is not None and self.known[a] == self.known[b])
        assert self.table.swap_rows(a, b) == (not same)
        if not same:
            for state in (self.known, self.content):
                state[a], state[b] = state[b], state[a]
            self.dirty |= {a, b}

    @rule(data=st.data())
    def clear_row(self, data: Any) -> None:
        row = data.draw(st.integers(0, self.num_rows - 1), label="row")
        assert self.table.clear_row(row) == (self.known[row] != self.cleared)
        if self.known[row] != self.cleared:
            self.dirty.add(row)
        self.known[row] = self.content[row] = self.cleared

    @rule(data=st.data())
    def invalidate(self, data: Any) -> None:
        row = data.draw(st.none() | st.integers(0, self.num_rows - 1), label="row")
        self.table.invalidate(row)
        for r in range(self.num_rows) if row is None else [row]:
            self.known[r] = None

    # --- rules: deltas -----------------------------------------------------------------------

    def checked_call(self, expected: int | None, call: Any) -> None:
        before = self.table.stats
        cells = call()
        after = self.table.stats
        assert cells == (expected or 0)
        assert after.cells_written - before.cells_written == cells
        assert (after.misses - before.misses, after.hits - before.hits) == (
            (1, 0) if expected is not None else (0, 1)
        )

    @rule(data=st.data())
    def append(self, data: Any) -> None:
        rows = self.known_rows()
        if not rows:
            return
        row = data.draw(st.sampled_from(rows), label="row")
        room = self.max_blocks - len(self.row_ids(row))
        appended = self.ids(data, data.draw(st.integers(0, min(room, 4)), label="append"))
        ids = self.container(data, appended)
        self.checked_call(
            self.model_delta(row, None, [], [], appended), lambda: self.table.append(row, ids)
        )

    @rule(data=st.data())
    def set_ids(self, data: Any) -> None:
        rows = self.known_rows()
        if not rows:
            return
        row = data.draw(st.sampled_from(rows), label="row")
        n = len(self.row_ids(row))
        positions = data.draw(
            st.lists(st.integers(0, max(n - 1, 0)), unique=True, max_size=min(n, 6))
        )
        values = [self.ids(data, 1)[0] for _ in positions]
        expected = self.model_delta(row, None, positions, values, [])
        args = (self.container(data, positions), self.container(data, values))
        self.checked_call(expected, lambda: self.table.set_ids(row, *args))

    @rule(data=st.data())
    def truncate(self, data: Any) -> None:
        rows = self.known_rows()
        if not rows:
            return
        row = data.draw(st.sampled_from(rows), label="row")
        n = len(self.row_ids(row))
        keep = data.draw(st.integers(1 if self.kind == "ring" and n else 0, n), label="keep")
        self.checked_call(
            self.model_delta(row, keep, [], [], []), lambda: self.table.truncate(row, keep)
        )

    @rule(data=st.data())
    def apply_deltas(self, data: Any) -> None:
        rows = data.draw(st.lists(st.sampled_from(range(self.num_rows)), unique=True), label="rows")
        rows = [r for r in rows if self.known[r] is not None]
        truncate: list[tuple[int, int]] = []
        sets: list[tuple[int, Any, Any]] = []
        append: list[tuple[int, Any]] = []
        expected_cells = 0
        changed = 0
        for row in rows:
            keep, positions, values, appended = self.draw_delta(data, row)
            if keep is not None:
                truncate.append((row, keep))
            if positions or data.draw(st.booleans(), label="empty set?"):
                sets.append((row, self.container(data, positions), self.container(data, values)))
            if appended or data.draw(st.booleans(), label="empty append?"):
                append.append((row, self.container(data, appended)))
            cells = self.model_delta(row, keep, positions, values, appended)
            if cells is not None:
                expected_cells += cells
                changed += 1
        as_mapping = data.draw(st.booleans(), label="mappings?")
        before = self.table.stats
        written = self.table.apply_deltas(
            truncate=dict(truncate) if as_mapping else truncate,
            set_ids=sets,
            append=dict(append) if as_mapping else append,
        )
        after = self.table.stats
        assert written == expected_cells == after.cells_written - before.cells_written
        assert after.misses - before.misses == changed

    @rule(data=st.data())
    def failed_delta(self, data: Any) -> None:
        before = snapshot(self.table)
        unknown = [r for r in range(self.num_rows) if self.known[r] is None]
        rows = self.known_rows()
        fault = data.draw(
            st.sampled_from(
                [
                    "unknown",
                    "id",
                    "long",
                    "position",
                    "duplicate",
                    "mismatch",
                    "truncate",
                    "ring-empty",
                    "row",
                    "twice",
                ]
            ),
            label="fault",
        )
        row = data.draw(st.sampled_from(rows), label="row") if rows else 0
        n = len(self.row_ids(row)) if rows else 0
        call: Any
        batch: dict[str, Any]
        error: Any = (ValueError, TypeError, IndexError)
        if fault == "unknown" and unknown:
            row, error = unknown[0], UnknownRowError
            call, batch = (lambda: self.table.append(row, [1])), {"append": [(row, [1])]}
        elif not rows:
            return
        elif fault == "id":
            ids = self.ids(data, data.draw(st.integers(0, 2)))
            ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.sampled_from(BAD_IDS)))
            call, batch = (lambda: self.table.append(row, ids)), {"append": [(row, ids)]}
        elif fault == "long":
            ids = [1] * (self.max_blocks - n + 1)
            call, batch = (lambda: self.table.append(row, ids)), {"append": {row: ids}}
        elif fault == "position":
            bad = data.draw(st.sampled_from([n, n + 5, -1]))
            call = lambda: self.table.set_ids(row, [bad], [1])  # noqa: E731
            batch = {"set_ids": [(row, [bad], [1])]}
        elif fault == "duplicate" and n:
            call = lambda: self.table.set_ids(row, [0, 0], [1, 2])  # noqa: E731
            batch = {"set_ids": [(row, [0, 0], [1, 2])]}
        elif fault == "mismatch" and n:
            call, batch = (lambda: self.table.set_ids(row, [0], [])), {"set_ids": [(row, [0], [])]}
        elif fault == "truncate":
            bad = data.draw(st.sampled_from([n + 1, -1]))
            call, batch = (lambda: self.table.truncate(row, bad)), {"truncate": [(row, bad)]}
        elif fault == "ring-empty" and self.kind == "ring" and n:
            call, batch = (lambda: self.table.truncate(row, 0)), {"truncate": {row: 0}}
        elif fault == "row":
            bad = data.draw(st.sampled_from([-1, self.num_rows, True, 1.5]))
            call, batch = (lambda: self.table.append(bad, [1])), {"append": [(bad, [1])]}
        elif fault == "twice":
            call = lambda: self.table.truncate(row, n + 1)  # noqa: E731
            batch = {"truncate": [(row, n), (row, n)]}
        else:
            return
        # In the batched form the faulty delta follows a valid one on another row.
        others = [r for r in rows if r != row]
        if others and self.max_blocks > len(self.row_ids(others[0])):
            good = {others[0]: [3]}
            if "append" in batch:
                items = batch["append"]
                batch["append"] = [
                    *good.items(),
                    *(items.items() if isinstance(items, dict) else items),
                ]
            else:
                batch["append"] = good
        with pytest.raises(error):
            call()
        assert snapshot(self.table) == before
        with pytest.raises(error):
            self.table.apply_deltas(**batch)
        assert snapshot(self.table) == before

    @rule()
    def take_dirty(self) -> None:
        assert self.table.take_dirty() == sorted(self.dirty)
        self.dirty.clear()

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def buffer_equals_rebuild(self) -> None:
        expected = rebuild(self.kind, self.content, self.max_blocks, self.pad)
        assert np.array_equal(self.table.numpy(), expected)
        lengths = [0 if k is None or k == CLEARED else len(k) for k in self.known]
        assert self.table.lengths.tolist() == lengths
        for row, known in enumerate(self.known):
            assert self.table.cached_ids(row) == (None if known is None else self.row_ids(row))
        self.table.check()


DeltaMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_delta_state_machine = DeltaMachine.TestCase
