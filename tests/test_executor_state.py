"""The runtime executors, stateful: the runtime executor's slot life cycle and adopted buffers
under any order of calls, good and bad, some from two threads at once. After every accepted step
the buffers equal the reference rebuild; after every refused one every buffer is byte-identical
and the slots are as a small model says."""

from __future__ import annotations

import gc
import mmap
import pickle
import tempfile
import threading
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_grouped import rebuild
from test_runtime_executors import deepseek_setup, one_per_rank, reclaim_and_check

from blockprep import BlockprepError, BlockTable
from blockprep.grouped import GroupedTables, TableGroup
from blockprep.reference import block_table_per_row, deepseek_v4_decode_rebuild

SLOTS = 2

# --- the runtime executor's slots ----------------------------------------------------------------


class ExecutorMachine(RuleBasedStateMachine):
    """submit, prepare_early, submit_prepared, reclaim (current, stale, twice), cancel, on two
    slots; the model: each slot free, prepared (with its batch) or in flight (its pending)."""

    @initialize()
    def setup(self) -> None:
        self.executor, self.worker, _, _ = deepseek_setup(slots=SLOTS)
        self.scheduler = one_per_rank(self.executor.preparer.layout)  # the early rule
        self.prepared: dict[int, Any] = {}  # slot -> the batch prepare_early prepared
        self.flying: dict[int, Any] = {}  # slot -> its pending decode
        self.spent: list[Any] = []  # pending decodes already reclaimed

    def next_batch(self) -> Any:
        """The scheduler's next batch, its own lists (the simulator's are live)."""
        return pickle.loads(pickle.dumps(self.scheduler.step()))

    def expected(self, batch: Any) -> dict[str, torch.Tensor]:
        layout = self.executor.preparer.layout
        return deepseek_v4_decode_rebuild(
            batch,
            ranks=layout.ranks,
            decode_batch=layout.decode_batch,
            decode_seq=layout.decode_seq,
            num_blocks=layout.num_blocks,
        )

    def snapshot(self) -> list[dict[str, torch.Tensor]]:
        preparer = self.executor.preparer
        return [{n: t.clone() for n, t in preparer.slot_buffers(s).items()} for s in range(SLOTS)]

    def refused(self, call: Any) -> None:
        """``call()`` raises a BlockprepError and changes nothing."""
        before, calls = self.snapshot(), len(self.worker.calls)
        with pytest.raises(BlockprepError):
            call()
        after = self.snapshot()
        for s in range(SLOTS):
            for name, tensor in before[s].items():
                assert torch.equal(after[s][name], tensor), (s, name)
        assert len(self.worker.calls) == calls

    def dispatched(self, slot: int, pending: Any, batch: Any) -> None:
        assert pending.buffer_slot == slot
        expected = self.expected(batch)
        for name, tensor in pending.inputs.buffers().items():
            assert torch.equal(tensor, expected[name]), (slot, name)
        self.flying[slot] = pending

    def free(self, slot: int) -> bool:
        return slot not in self.prepared and slot not in self.flying

    @rule(slot=st.integers(0, SLOTS - 1))
    def submit(self, slot: int) -> None:
        batch = self.next_batch()
        if not self.free(slot):
            self.refused(lambda: self.executor.submit(batch, buffer_slot=slot))
            return
        self.dispatched(slot, self.executor.submit(batch, buffer_slot=slot), batch)

    @rule(slot=st.integers(0, SLOTS - 1))
    def prepare_early(self, slot: int) -> None:
        batch = self.next_batch()
        if not self.free(slot):
            self.refused(lambda: self.executor.prepare_early(batch, buffer_slot=slot))
            return
        assert self.executor.prepare_early(batch, buffer_slot=slot) == slot
        self.prepared[slot] = batch

    @rule(slot=st.integers(0, SLOTS - 1), wrong=st.booleans())
    def submit_prepared(self, slot: int, wrong: bool) -> None:
        batch = self.prepared.get(slot)
        if batch is None or wrong:
            other = self.next_batch()
            if batch is not None:  # not the requests prepared there: the slot stays prepared
                other.request_ids = [f"not {r}" for r in other.request_ids]
            self.refused(lambda: self.executor.submit_prepared(other, slot))
            return
        pending = self.executor.submit_prepared(batch, slot)
        del self.prepared[slot]
        self.dispatched(slot, pending, batch)

    @rule(slot=st.integers(0, SLOTS - 1), stale=st.booleans())
    def reclaim(self, slot: int, stale: bool) -> None:
        if stale and self.spent:
            self.refused(lambda: self.executor.reclaim(self.spent[-1]))
            return
        pending = self.flying.pop(slot, None)
        if pending is None:
            return
        reclaim_and_check(self.executor, pending)
        self.spent.append(pending)

    @rule(slot=st.integers(0, SLOTS - 1))
    def cancel(self, slot: int) -> None:
        if slot not in self.prepared:
            self.refused(lambda: self.executor.cancel(slot))
            return
        self.executor.cancel(slot)
        del self.prepared[slot]

    @rule(slot=st.integers(0, SLOTS - 1), what=st.sampled_from(["submit", "reclaim", "cancel"]))
    def race(self, slot: int, what: str) -> None:
        """The same call on the same slot from two threads at once: one is accepted at most."""
        batch = self.next_batch()
        pending = self.flying.get(slot)
        calls = {
            "submit": lambda: self.executor.submit(batch, buffer_slot=slot),
            "reclaim": lambda: self.executor.reclaim(pending),
            "cancel": lambda: self.executor.cancel(slot),
        }
        if what == "reclaim" and pending is None:
            return
        results: list[Any] = []
        start = threading.Barrier(2)

        def lane() -> None:
            start.wait()
            try:
                results.append(("ok", calls[what]()))
            except BlockprepError as error:
                results.append(("refused", error))

        threads = [threading.Thread(target=lane) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        accepted = [value for status, value in results if status == "ok"]
        assert len(results) == 2
        if what == "submit":
            assert len(accepted) == (1 if self.free(slot) else 0)
            if accepted:
                self.dispatched(slot, accepted[0], batch)
        elif what == "reclaim":
            assert len(accepted) == 1
            self.spent.append(self.flying.pop(slot))
        else:
            assert len(accepted) == (1 if slot in self.prepared else 0)
            self.prepared.pop(slot, None)

    @invariant()
    def slots_as_modelled(self) -> None:
        if not hasattr(self, "executor"):
            return
        for slot in range(SLOTS):
            stage = self.executor.slot_stage(slot)
            want = (
                "prepared"
                if slot in self.prepared
                else "in flight"
                if slot in self.flying
                else None
            )
            assert stage == want, (slot, stage, want)


ExecutorMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestExecutorSlots = ExecutorMachine.TestCase


# --- adopted buffers -----------------------------------------------------------------------------

POOL = 96  # int32 cells of the shared memory every owner is cut from
ROWS, WIDTH = 2, 4
RING = TableGroup("swa", "ring", WIDTH, id_limit=50)
PAGED = TableGroup("pages", "paged", WIDTH, id_limit=50, pad=-1)


def read_only_pool() -> torch.Tensor:
    with tempfile.TemporaryFile() as handle:  # the mapping outlives the file object
        handle.write(bytes(POOL * 4))
        handle.flush()
        memory = mmap.mmap(handle.fileno(), POOL * 4, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the array is not writable
        return torch.from_numpy(np.frombuffer(memory, dtype=np.int32))


READ_ONLY = read_only_pool()

ids = st.lists(st.integers(0, 49), min_size=0, max_size=WIDTH, unique=True)


class AdoptedBuffersMachine(RuleBasedStateMachine):
    """Owners (BlockTable, GroupedTables) adopt spans of one pool, overlapping each other, one
    another's, or read-only memory at random; the model: which owner holds each cell. An
    adoption is accepted exactly when its spans are disjoint, unowned and writable."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.full((POOL,), 7, dtype=torch.int32)
        self.owner_of = np.full(POOL, -1)
        self.owners: dict[int, tuple[Any, Any, list[Any]]] = {}  # id -> (owner, kind, rows)
        self.next_id = 0

    def cells(self, start: int, size: int) -> np.ndarray:
        return np.arange(start, start + size)

    def adopt(self, spans: list[tuple[int, int]], read_only: bool, make: Any, kind: str) -> None:
        cells = np.concatenate([self.cells(s, n) for s, n in spans])
        expect = (
            not read_only
            and len(np.unique(cells)) == len(cells)
            and bool(np.all(self.owner_of[cells] == -1))
        )
        source = READ_ONLY if read_only else self.pool
        views = [source[s : s + n] for s, n in spans]
        before = self.pool.clone()
        if not expect:
            with pytest.raises(ValueError) as info:
                make(views)
            assert isinstance(info.value, BlockprepError)
            assert torch.equal(self.pool, before)
            return
        owner = make(views)
        self.owner_of[cells] = self.next_id
        rows: list[Any] = [[[] for _ in range(ROWS)] for _ in range(2)] if kind == "g" else []
        self.owners[self.next_id] = (owner, kind, rows)
        self.next_id += 1

    @rule(start=st.integers(0, POOL - ROWS * WIDTH), read_only=st.booleans())
    def adopt_block_table(self, start: int, read_only: bool) -> None:
        spans = [(start, ROWS * WIDTH)]
        self.adopt(spans, read_only, lambda v: BlockTable(ROWS, WIDTH, buffer=v[0]), "b")

    @rule(
        starts=st.lists(st.integers(0, POOL - ROWS * WIDTH), min_size=3, max_size=3),
        read_only=st.booleans(),
    )
    def adopt_grouped(self, starts: list[int], read_only: bool) -> None:
        spans = [(starts[0], ROWS * WIDTH), (starts[1], ROWS * WIDTH), (starts[2], ROWS * 2)]

        def make(views: list[torch.Tensor]) -> GroupedTables:
            tables = {"swa": views[0].view(ROWS, WIDTH), "pages": views[1].view(ROWS, WIDTH)}
            return GroupedTables([RING, PAGED], ROWS, buffers=[(tables, views[2].view(ROWS, 2))])

        self.adopt(spans, read_only, make, "g")

    @precondition(lambda self: bool(self.owners))
    @rule(data=st.data(), ring=st.lists(ids, min_size=ROWS, max_size=ROWS))
    def write(self, data: st.DataObject, ring: list[list[int]]) -> None:
        key = data.draw(st.sampled_from(sorted(self.owners)))
        owner, kind, _ = self.owners[key]
        if kind == "b":
            owner.write_rows(ring)
            self.owners[key] = (owner, kind, ring)
            return
        ring = [r or [1] for r in ring]  # a ring row holds an id at least
        paged = data.draw(st.lists(ids, min_size=ROWS, max_size=ROWS))
        owner.commit(owner.plan([ring, paged], [f"r{i}" for i in range(ROWS)]), 0)
        self.owners[key] = (owner, kind, [ring, paged])

    @precondition(lambda self: bool(self.owners))
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.owners)))
        del self.owners[key]
        gc.collect()
        freed = self.owner_of == key
        self.owner_of[freed] = -1
        self.pool[torch.from_numpy(freed)] = 7  # what the next owner finds

    @invariant()
    def every_owner_holds_its_rebuild(self) -> None:
        for owner, kind, rows in self.owners.values():
            if kind == "b":
                if rows:
                    want = block_table_per_row(rows, max_blocks=WIDTH, pad=-1).numpy()
                    np.testing.assert_array_equal(owner.tensor.numpy().reshape(ROWS, WIDTH), want)
                continue
            if rows[0][0]:
                tables = owner.tables(0)
                for group, group_rows in zip((RING, PAGED), rows, strict=True):
                    want = rebuild(group, group_rows)
                    np.testing.assert_array_equal(tables[group.name].numpy(), want)
                counts = [[len(rows[0][r]), len(rows[1][r])] for r in range(ROWS)]
                assert owner.counts(0).tolist() == counts
        unowned = self.owner_of == -1
        assert bool(np.all(self.pool.numpy()[unowned] == 7))  # no owner wrote outside its cells


AdoptedBuffersMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestAdoptedBuffers = AdoptedBuffersMachine.TestCase
