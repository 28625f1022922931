"""Stateful property test: after every operation a BlockTable equals a from-scratch rebuild.

The model is dense and independent of blockprep's write paths: it rebuilds a row with the
upstream constructions in ``blockprep.reference`` whenever the row's content changes, and it
predicts cache hits from the documented rule (a write hits when the row's known ids equal the new
ones by value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockprep import INT32_MAX, BlockTable, StaleRowError
from blockprep import reference as ref
from blockprep.testing import CONTAINERS, as_container, block_ids

CLEARED = "cleared"  # the model's marker for a cleared row

BAD_IDS = [-1, -(2**40), INT32_MAX + 1, 2**70, 2.5, None, "7", [1]]


def reference_row(kind: str, ids: list[int], max_blocks: int, pad: int) -> np.ndarray:
    if kind == "ring":
        return ref.ring_block_table_repeat([ids], max_blocks=max_blocks)[0].numpy()
    return ref.block_table_per_row([ids], max_blocks=max_blocks, pad=pad)[0].numpy()


class BlockTableMachine(RuleBasedStateMachine):
    table: BlockTable
    expected: np.ndarray

    @initialize(
        kind=st.sampled_from(["paged", "ring"]),
        num_rows=st.integers(1, 6),
        max_blocks=st.sampled_from([1, 2, 5, 16, 64, 130, 600]),
        pad=st.sampled_from([-1, 0, 7]),
        adopt=st.sampled_from([None, "flat", "2d"]),
        seed=st.integers(0, 2**16),
    )
    def start(
        self, kind: str, num_rows: int, max_blocks: int, pad: int, adopt: str | None, seed: int
    ) -> None:
        self.kind, self.num_rows, self.max_blocks, self.pad = kind, num_rows, max_blocks, pad
        cleared: Any = [] if kind == "paged" else CLEARED
        self.cleared = cleared
        if adopt is None:
            self.table = BlockTable(num_rows, max_blocks, kind=kind, pad=pad)  # type: ignore[arg-type]
            self.expected = np.full((num_rows, max_blocks), pad, dtype=np.int32)
            self.known: list[Any] = [cleared] * num_rows
        else:
            garbage = np.random.default_rng(seed).integers(-5, 99, size=(num_rows, max_blocks))
            self.expected = garbage.astype(np.int32)
            buffer = torch.from_numpy(self.expected.copy())
            if adopt == "flat":
                buffer = buffer.reshape(-1)
            self.table = BlockTable(num_rows, max_blocks, kind=kind, pad=pad, buffer=buffer)  # type: ignore[arg-type]
            assert self.table.tensor is buffer
            self.known = [None] * num_rows
        # Ids the row logically holds (kept across invalidate, unlike ``known``).
        self.content: list[Any] = list(self.known)
        self.address = self.table.tensor.data_ptr()
        self.dirty: set[int] = set()
        self.last_changed: dict[int, int] = {}

    # --- helpers -----------------------------------------------------------------------------

    def ids_for(self, data: Any, row: int) -> list[int]:
        """New ids for ``row``: grown, shrunk, rotated, replaced or repeated."""
        low = 1 if self.kind == "ring" else 0
        current = self.content[row]
        strategies = ["replace"]
        if isinstance(current, list) and (current or self.kind == "paged"):
            strategies += ["same", "grow", "shrink", "rotate", "rotate", "rotate-next"]
        how = data.draw(st.sampled_from(strategies), label="how")
        ids_ = block_ids(max_id=data.draw(st.sampled_from([40, INT32_MAX]), label="max_id"))
        if how == "replace":
            size = data.draw(st.integers(low, min(self.max_blocks, 70)), label="size")
            return data.draw(st.lists(ids_, min_size=size, max_size=size), label="ids")
        assert isinstance(current, list)
        if how == "same":
            return list(current)
        if how == "grow" and len(current) < self.max_blocks:
            room = min(self.max_blocks - len(current), 3)
            return current + data.draw(st.lists(ids_, min_size=1, max_size=room), label="more")
        if how == "shrink" and len(current) > low:
            return current[: data.draw(st.integers(low, len(current) - 1), label="keep")]
        ids = list(current)
        if how == "rotate-next" and ids:
            # The next slot in ring order, as a scheduler rotates them (the table's fast path).
            slot = (self.last_changed.get(row, -1) + 1) % len(ids)
            ids[slot] = data.draw(ids_, label="new id")
            return ids
        if ids:
            for _ in range(data.draw(st.integers(1, 6), label="slots")):
                ids[data.draw(st.integers(0, len(ids) - 1), label="slot")] = data.draw(ids_)
        return ids

    def container(self, data: Any, ids: list[int]) -> Any:
        kinds = [c for c in CONTAINERS if "int32" not in c or max(ids, default=0) < 2**31]
        return as_container(ids, data.draw(st.sampled_from(kinds), label="container"))

    def model_write(self, row: int, ids: list[int]) -> bool:
        previous = self.content[row]
        if isinstance(previous, list) and len(previous) == len(ids):
            changed = [k for k, (a, b) in enumerate(zip(previous, ids, strict=True)) if a != b]
            if changed:
                self.last_changed[row] = changed[-1]
        hit = self.known[row] is not None and self.known[row] == ids
        if not hit:
            self.expected[row] = reference_row(self.kind, ids, self.max_blocks, self.pad)
            self.dirty.add(row)
        self.known[row] = list(ids)
        self.content[row] = list(ids)
        return not hit

    def model_copy(self, src: int, dst: int) -> bool:
        if dst == src or (self.known[src] is not None and self.known[dst] == self.known[src]):
            return False
        self.expected[dst] = self.expected[src]
        self.known[dst] = self.known[src]
        self.content[dst] = self.content[src]
        self.dirty.add(dst)
        return True

    def rows(self) -> Any:
        return st.integers(0, self.num_rows - 1)

    # --- rules -------------------------------------------------------------------------------

    @rule(data=st.data())
    def write_row(self, data: Any) -> None:
        row = data.draw(self.rows(), label="row")
        ids = self.ids_for(data, row)
        written = self.table.write_row(row, self.container(data, ids))
        assert written == self.model_write(row, ids)

    @rule(data=st.data())
    def write_rows(self, data: Any) -> None:
        start = data.draw(self.rows(), label="start")
        count = data.draw(st.integers(0, self.num_rows - start), label="count")
        batch = [self.ids_for(data, start + i) for i in range(count)]
        written = self.table.write_rows([self.container(data, ids) for ids in batch], start=start)
        assert written == sum(self.model_write(start + i, ids) for i, ids in enumerate(batch))

    @rule(data=st.data())
    def copy_row(self, data: Any) -> None:
        src, dst = data.draw(self.rows(), label="src"), data.draw(self.rows(), label="dst")
        assert self.table.copy_row(src, dst) == self.model_copy(src, dst)

    @rule(data=st.data())
    def fill_rows(self, data: Any) -> None:
        src = data.draw(self.rows(), label="src")
        targets = data.draw(st.lists(self.rows(), max_size=self.num_rows + 1), label="targets")
        written = self.table.fill_rows(src, targets)
        assert written == sum(self.model_copy(src, dst) for dst in targets)

    @rule(data=st.data())
    def swap_rows(self, data: Any) -> None:
        a, b = data.draw(self.rows(), label="a"), data.draw(self.rows(), label="b")
        same = a == b or (self.known[a] is not None and self.known[a] == self.known[b])
        assert self.table.swap_rows(a, b) == (not same)
        if not same:
            self.expected[[a, b]] = self.expected[[b, a]]
            for state in (self.known, self.content):
                state[a], state[b] = state[b], state[a]
            self.dirty |= {a, b}

    @rule(data=st.data())
    def clear_row(self, data: Any) -> None:
        row = data.draw(self.rows(), label="row")
        assert self.table.clear_row(row) == (self.known[row] != self.cleared)
        if self.known[row] != self.cleared:
            self.expected[row] = self.pad
            self.dirty.add(row)
        self.known[row] = self.content[row] = self.cleared

    @rule(data=st.data())
    def invalidate(self, data: Any) -> None:
        row = data.draw(st.none() | self.rows(), label="row")
        self.table.invalidate(row)
        for r in range(self.num_rows) if row is None else [row]:
            self.known[r] = None

    @rule(data=st.data())
    def failed_write(self, data: Any) -> None:
        cache = [self.table.cached_ids(r) for r in range(self.num_rows)]
        stats = self.table.stats
        row = data.draw(self.rows(), label="row")
        current = self.content[row]
        ids: list[Any] = list(current) if isinstance(current, list) else [3]
        fault = data.draw(st.sampled_from(["id", "long", "empty", "row"]), label="fault")
        if fault == "id":
            ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.sampled_from(BAD_IDS)))
        elif fault == "long":
            ids = list(range(self.max_blocks + 1))
        elif fault == "empty" and self.kind == "ring":
            ids = []
        else:
            row = data.draw(st.sampled_from([-1, self.num_rows, self.num_rows + 3, True, 1.0]))
        with pytest.raises((ValueError, TypeError, IndexError)):
            if data.draw(st.booleans(), label="batch"):
                good = self.content[0] if isinstance(self.content[0], list) else None
                if isinstance(row, int) and not isinstance(row, bool) and good is not None:
                    self.table.write_rows([good, ids], start=row - 1 if row > 0 else row)
                else:
                    self.table.write_row(row, ids)  # type: ignore[arg-type]
            else:
                self.table.write_row(row, ids)  # type: ignore[arg-type]
        assert [self.table.cached_ids(r) for r in range(self.num_rows)] == cache
        assert self.table.stats == stats

    @rule(data=st.data())
    def outside_write_then_invalidate(self, data: Any) -> None:
        row = data.draw(self.rows(), label="row")
        column = data.draw(st.integers(0, self.max_blocks - 1), label="column")
        old = int(self.expected[row, column])
        value = old + 1 if old < INT32_MAX else old - 1
        self.table.numpy()[row, column] = value
        self.expected[row, column] = value
        if self.known[row] is not None:
            with pytest.raises(StaleRowError, match=f"row {row} column {column} holds {value}"):
                self.table.check()
        self.table.invalidate(row)
        self.known[row] = None
        self.content[row] = None

    @rule()
    def take_dirty(self) -> None:
        # Rows the table wrote; an outside write is not the table's and is not among them.
        assert self.table.take_dirty() == sorted(self.dirty)
        self.dirty.clear()

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def buffer_equals_rebuild(self) -> None:
        assert np.array_equal(self.table.numpy(), self.expected)
        assert self.table.tensor.data_ptr() == self.address
        self.table.check()


# The issue asks for at least 200 examples of 50 steps: Hypothesis ends some runs early, so ask for
# more of both (measured: about 250 of 300 runs reach 50 steps).
BlockTableMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_block_table_state_machine = BlockTableMachine.TestCase
