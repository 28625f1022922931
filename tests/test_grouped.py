"""Tests of :mod:`blockprep.grouped`: the model-neutral grouped-table core, planned then written.

Every expectation comes from an independent model, never from the implementation: a slot's tables
are compared with a rebuild of the rows last committed into it by the upstream constructions in
:mod:`blockprep.reference` (``ring_block_table_repeat``; ``block_table_per_row`` with the group's
pad), its counts with the rows' lengths, and accepted ids with the documented id rule.

The stateful machine plays an engine: requests (keys) come and go, move between rows, rotate ring
ids, replace, grow and shrink rows, mutate their own lists in place after a step, and hand rows in
every container the core accepts (lists, tuples, int arrays and tensors, fresh int objects, a pickle
round trip, as upstream's msgpack queue delivers them). Between valid steps it sends doubtful steps
(non-integers equal to the held id: accepted as that int) and invalid ones, and carries on after
each error. After every rule every slot's buffers equal the rebuild of the rows last committed into
that slot; after a rejected plan everything is byte-identical to before.

"Held" follows the id rule conservatively (the core may be more lenient, never less): a doubtful id
stands only where the same request was in the latest committed step and holds the same int at that
position; a changed non-integer id differs from what that request and that table row held there.

Id windows: each group's request ids come from a window of 30 ids (``base .. base + 29``, the
group's ``id_limit`` is ``base + 30``); bases 0, 1,000 and 70,000 put ids below the small-int
cache, above it, and above ``INTERNED_IDS``, so fresh int objects are really fresh.
"""

from __future__ import annotations

import pickle
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockprep import reference as ref
from blockprep.errors import BlockprepIndexError, BlockprepTypeError
from blockprep.grouped import (
    BLOCK_RENDER_MIN_ROWS,
    BlockIdTypeError,
    BlockIdValueError,
    GroupedTables,
    TableGroup,
)

WINDOW = 30
BASES = (0, 1000, 70_000)


def rebuild(group: TableGroup, rows: list[list[int]]) -> np.ndarray:
    """The reference table of ``rows`` (plain int lists) for ``group``."""
    if group.kind == "ring":
        return ref.ring_block_table_repeat(rows, max_blocks=group.width).numpy()
    return ref.block_table_per_row(rows, max_blocks=group.width, pad=group.pad).numpy()


def dense_rebuild(group: TableGroup, rows: list[list[int]]) -> np.ndarray:
    """A second, dense NumPy model of the same tables (cell by cell from the definition)."""
    out = np.full((len(rows), group.width), group.pad if group.kind == "paged" else 0, np.int32)
    for r, ids in enumerate(rows):
        for j in range(group.width):
            if group.kind == "ring":
                out[r, j] = ids[j % len(ids)]
            elif j < len(ids):
                out[r, j] = ids[j]
    return out


def assert_slot(gt: GroupedTables, slot: int, rows: list[list[list[int]]]) -> None:
    """Slot ``slot`` holds exactly the rebuild of ``rows`` (per group, per table row)."""
    tables = gt.tables(slot)
    for gi, group in enumerate(gt.groups):
        expected = rebuild(group, rows[gi])
        np.testing.assert_array_equal(tables[group.name].numpy(), expected, err_msg=group.name)
    lengths = np.array(
        [[len(rows[gi][r]) for gi in range(len(gt.groups))] for r in range(gt.num_rows)],
        dtype=np.int32,
    )
    np.testing.assert_array_equal(gt.counts(slot).numpy(), lengths.reshape(gt.num_rows, -1))


def assert_latest(gt: GroupedTables, rows: list[list[list[int]]]) -> None:
    for gi in range(len(gt.groups)):
        for r in range(gt.num_rows):
            held = gt.latest_ids(gi, r)
            assert held == rows[gi][r], (gi, r)
            assert held is not None and all(type(x) is int for x in held), (gi, r, held)


def snapshot(gt: GroupedTables) -> Any:
    """Everything observable, as bytes: every slot's tables, counts and stats, the latest ids."""
    return (
        [{name: t.numpy().tobytes() for name, t in gt.tables(s).items()} for s in range(gt.slots)],
        [gt.counts(s).numpy().tobytes() for s in range(gt.slots)],
        [gt.stats(s) for s in range(gt.slots)],
        [[gt.latest_ids(gi, r) for r in range(gt.num_rows)] for gi in range(len(gt.groups))],
    )


def test_dense_model_agrees_with_reference() -> None:
    """The two independent models agree (so either may be trusted below)."""
    rng = random.Random(0)
    for kind, pad in (("ring", 0), ("paged", -1), ("paged", 7)):
        group = TableGroup("g", kind, 9, id_limit=50, pad=pad)  # type: ignore[arg-type]
        rows = [rng.sample(range(50), rng.randint(1, 9)) for _ in range(6)]
        np.testing.assert_array_equal(rebuild(group, rows), dense_rebuild(group, rows))


# --- the engine machine ---------------------------------------------------------------------------

FORMS = (
    "live",
    "live",
    "copy",
    "tuple",
    "numpy-int64",
    "numpy-int32",
    "torch-int64",
    "torch-int32",
    "fresh",
    "pickle",
    "mixed",
    "mixed",
)
MUTATIONS = (
    "add",
    "add",
    "remove",
    "reorder",
    "swap",
    "rotate",
    "rotate",
    "rotate",
    "rotate",
    "replace",
    "rebind",
    "grow",
    "grow",
    "shrink",
    "shuffle",
)
ASIDES = ("invalidate-one", "invalidate-all", "scribble", "reset", "discarded-plan")
FAULTS = (
    "type",
    "type",
    "float-container",
    "range",
    "repeat",
    "short",
    "long",
    "padding-ids",
    "shape",
)
BAD_VALUES = (-1, -5, -(2**40), "limit", "limit+3", 2**31, 2**40)
PLACE = "decode row {}".format


def present(ids: list[int], form: str, rng: random.Random) -> Any:
    """The engine's list ``ids`` as it reaches the core in ``form``."""
    if form == "mixed":
        form = rng.choice([f for f in FORMS if f != "mixed"])
    if form == "live":
        return ids  # the engine's own list: mutated in place later
    if form == "copy":
        return list(ids)
    if form == "tuple":
        return tuple(ids)
    if form == "fresh":
        return [int(str(x)) for x in ids]
    if form == "pickle":
        return pickle.loads(pickle.dumps(list(ids)))
    kind, dtype = form.split("-")
    if kind == "numpy":
        return np.array(ids, dtype=dtype)
    return torch.tensor(ids, dtype=getattr(torch, dtype))


class GroupedEngine(RuleBasedStateMachine):
    """An engine driving :class:`GroupedTables` (see the module docstring)."""

    @initialize(
        n_groups=st.sampled_from([2, 3]),
        widths=st.tuples(st.integers(7, 20), st.integers(7, 20), st.integers(7, 20)),
        third_kind=st.sampled_from(["ring", "paged"]),
        num_rows=st.integers(4, 6),
        slots=st.integers(1, 3),
        in_range_padding=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
        block_rows=st.sampled_from([1, 2, 3, 8]),
    )
    def start(
        self,
        n_groups: int,
        widths: tuple[int, int, int],
        third_kind: str,
        num_rows: int,
        slots: int,
        in_range_padding: bool,
        seed: int,
        block_rows: int,
    ) -> None:
        groups = [
            TableGroup("swa", "ring", widths[0], id_limit=BASES[0] + WINDOW),
            TableGroup("pages", "paged", widths[1], id_limit=BASES[1] + WINDOW, pad=-1, min_ids=1),
        ]
        if n_groups == 3:
            kind: Any = third_kind
            groups.append(
                TableGroup("far", kind, widths[2], id_limit=BASES[2] + WINDOW, pad=7, min_ids=2)
            )
        self.groups = groups
        self.num_rows = num_rows
        self.gt = GroupedTables(groups, num_rows, slots=slots, block_rows=block_rows)
        self.addresses = self.snapshot_addresses()

        # Padding rows: one fixed list per group and row, the same object every step. Group 0's
        # may hold in-range ids (equal by value to what a request could hold); a paged group's
        # are empty on even rows.
        def padding(gi: int, g: TableGroup, r: int) -> list[int]:
            if gi == 0 and in_range_padding:
                return [r]
            return [] if g.kind == "paged" and r % 2 == 0 else [g.id_limit + r]

        self.padding = [[padding(gi, g, r) for r in range(num_rows)] for gi, g in enumerate(groups)]
        self.requests: dict[str, list[list[int]]] = {}  # key -> per group, the engine's live list
        self.cursor: dict[tuple[str, int], int] = {}  # the ring position the engine rotates next
        self.layout: list[str | None] = [None] * num_rows
        self.serial = 0
        # The latest committed step: per key its ids, per group and row its ids.
        self.held: dict[str, list[list[int]]] = {}
        self.row_held: list[list[list[int]]] | None = None
        self.committed_layout: list[str | None] = [None] * num_rows
        # Per slot what its buffers hold: the tables and counts (zero-filled at construction).
        self.expected = [
            (
                [np.zeros((num_rows, g.width), np.int32) for g in groups],
                np.zeros((num_rows, len(groups)), np.int32),
            )
            for _ in range(slots)
        ]
        rng = random.Random(seed)
        for _ in range(rng.randint(0, num_rows)):
            self.mutate("add", rng)

    # --- the engine's requests -----------------------------------------------------------------

    def window(self, gi: int) -> range:
        return range(BASES[gi], BASES[gi] + WINDOW)

    def fresh_ids(self, gi: int, avoid: list[int], count: int, rng: random.Random) -> list[int]:
        return rng.sample([x for x in self.window(gi) if x not in avoid], count)

    def new_request(self, rng: random.Random) -> list[list[int]]:
        return [
            self.fresh_ids(gi, [], rng.randint(g.shortest, g.width), rng)
            for gi, g in enumerate(self.groups)
        ]

    def occupied(self) -> list[int]:
        return [r for r, key in enumerate(self.layout) if key is not None]

    def mutate(self, kind: str, rng: random.Random) -> None:
        """One scheduler change; lists are changed in place unless ``kind`` says otherwise."""
        occupied = self.occupied()
        if kind == "add" or not occupied:
            free = [r for r, key in enumerate(self.layout) if key is None]
            if free:
                key = f"req{self.serial}"
                self.serial += 1
                self.requests[key] = self.new_request(rng)
                self.layout[rng.choice(free)] = key
            return
        row = rng.choice(occupied)
        held_key = self.layout[row]
        assert held_key is not None
        key = held_key
        if kind == "remove":
            self.layout[row] = None
            del self.requests[key]
            return
        if kind == "reorder":
            rng.shuffle(self.layout)
            return
        if kind == "swap":
            other = rng.randrange(self.num_rows)
            self.layout[row], self.layout[other] = self.layout[other], self.layout[row]
            return
        gi = rng.randrange(len(self.groups))
        group = self.groups[gi]
        ids = self.requests[key][gi]
        n = len(ids)
        if kind == "rotate":
            ring = [i for i, g in enumerate(self.groups) if g.kind == "ring"]
            gi = rng.choice(ring)
            ids = self.requests[key][gi]
            n = len(ids)
            p = self.cursor.get((key, gi), 0) % n if rng.random() < 0.7 else rng.randrange(n)
            ids[p] = self.fresh_ids(gi, ids, 1, rng)[0]
            self.cursor[key, gi] = (p + 1) % n
            return
        self.cursor[key, gi] = 0
        if kind == "replace" and n:
            positions = rng.sample(range(n), rng.randint(1, min(n, WINDOW - n)))
            for p, x in zip(positions, self.fresh_ids(gi, ids, len(positions), rng), strict=True):
                ids[p] = x
        elif kind == "rebind":  # a new list object, of any valid length
            self.requests[key][gi] = self.fresh_ids(
                gi, [], rng.randint(group.shortest, group.width), rng
            )
        elif kind == "grow" and n < group.width:
            ids.extend(self.fresh_ids(gi, ids, rng.randint(1, min(3, group.width - n)), rng))
        elif kind == "shrink" and n > group.shortest:
            del ids[rng.randint(group.shortest, n - 1) :]
        elif kind == "shuffle":
            rng.shuffle(ids)

    # --- steps ----------------------------------------------------------------------------------

    def build(self, form: str, rng: random.Random) -> tuple[list[list[Any]], list[str | None]]:
        rows = [
            [
                self.padding[gi][r] if key is None else present(self.requests[key][gi], form, rng)
                for r, key in enumerate(self.layout)
            ]
            for gi in range(len(self.groups))
        ]
        # Keys as fresh objects half of the time: the core compares them by value.
        keys = [
            None if key is None else (key if rng.random() < 0.5 else "".join(list(key)))
            for key in self.layout
        ]
        return rows, keys

    def doubt(self, rows: list[list[Any]], rng: random.Random) -> None:
        """Replace some ids by non-ints that equal the held id, and some by NumPy integers."""
        for r, key in enumerate(self.layout):
            if key is None:
                continue
            for gi in range(len(self.groups)):
                given = rows[gi][r]
                if not isinstance(given, (list, tuple)) or rng.random() < 0.5:
                    continue
                ids = list(given)  # never the engine's own list
                held = self.held.get(key, [None] * len(self.groups))[gi]
                for p, x in enumerate(ids):
                    if rng.random() < 0.3:
                        continue
                    options: list[Any] = [np.int64(x), np.int32(x)]
                    if held is not None and p < len(held) and held[p] == x:
                        options += [float(x), np.float64(x), np.float32(x)]
                        if x in (0, 1):
                            options.append(bool(x))
                    ids[p] = rng.choice(options)
                rows[gi][r] = tuple(ids) if isinstance(given, tuple) else ids

    def commit(self, slot: int, form: str, doubtful: bool, rng: random.Random) -> None:
        rows, keys = self.build(form, rng)
        if doubtful:
            self.doubt(rows, rng)
        step = self.gt.plan(rows, keys, place=PLACE)
        self.gt.commit(step, slot)
        committed = [
            [
                list(self.padding[gi][r] if key is None else self.requests[key][gi])
                for r, key in enumerate(self.layout)
            ]
            for gi in range(len(self.groups))
        ]
        self.row_held = committed
        self.committed_layout = list(self.layout)
        self.held = {
            key: [list(ids) for ids in self.requests[key]] for key in self.layout if key is not None
        }
        tables = [rebuild(g, committed[gi]) for gi, g in enumerate(self.groups)]
        counts = np.array(
            [
                [len(committed[gi][r]) for gi in range(len(self.groups))]
                for r in range(self.num_rows)
            ],
            dtype=np.int32,
        )
        self.expected[slot] = (tables, counts)
        assert_latest(self.gt, committed)

    @rule(
        aside=st.sampled_from((None,) * 20 + ASIDES),
        aside_slot=st.integers(0, 2),
        mutations=st.lists(st.sampled_from(MUTATIONS), max_size=3),
        slot=st.integers(0, 2),
        form=st.sampled_from(FORMS),
        doubtful=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def step(
        self,
        aside: str | None,
        aside_slot: int,
        mutations: list[str],
        slot: int,
        form: str,
        doubtful: bool,
        seed: int,
    ) -> None:
        """Now and then something besides steps first (see :meth:`aside`), then a step."""
        if aside is not None:
            self.aside(aside, aside_slot, seed)
        self.run_step(mutations, slot, form, doubtful, seed)

    def run_step(
        self, mutations: list[str], slot: int, form: str, doubtful: bool, seed: int
    ) -> None:
        rng = random.Random(seed)
        for kind in mutations:
            self.mutate(kind, rng)
        self.commit(slot % self.gt.slots, form, doubtful, rng)

    @rule(
        mutations=st.lists(st.sampled_from(MUTATIONS), max_size=2),
        slot=st.integers(0, 2),
        form=st.sampled_from(FORMS),
        seed=st.integers(0, 2**32 - 1),
    )
    def ping_pong_step(self, mutations: list[str], slot: int, form: str, seed: int) -> None:
        """A second step rule (steps are most of what an engine does), into slot 0 or 1 only: with
        three slots, slot 2 falls behind, often by many steps."""
        self.run_step(mutations, slot % 2, form, False, seed)

    @rule(
        mutations=st.lists(st.sampled_from(MUTATIONS), max_size=2),
        fault=st.sampled_from(FAULTS),
        form=st.sampled_from(FORMS),
        seed=st.integers(0, 2**32 - 1),
    )
    def bad_step(self, mutations: list[str], fault: str, form: str, seed: int) -> None:
        """A step with one fault: rejected whole, nothing changes; the engine carries on."""
        rng = random.Random(seed)
        for kind in mutations:
            self.mutate(kind, rng)
        rows, keys = self.build(form, rng)
        expected, where = self.inject(fault, rows, keys, rng)
        before = snapshot(self.gt)
        with pytest.raises(expected) as info:
            self.gt.plan(rows, keys, place=PLACE)
        if where is not None:
            r, gi = where
            err = info.value
            assert isinstance(err, (BlockIdTypeError, BlockIdValueError))
            name = self.groups[gi].name
            assert (err.row, err.group) == (r, name), str(err)
            assert PLACE(r) in str(err) and name in str(err), str(err)
        assert snapshot(self.gt) == before

    def inject(
        self, fault: str, rows: list[list[Any]], keys: list[Any], rng: random.Random
    ) -> tuple[type[Exception], tuple[int, int] | None]:
        """Put one fault into ``rows`` (new containers only); the error it must raise, and where."""
        candidates = [(r, gi) for r in self.occupied() for gi in range(len(self.groups))]
        if fault == "padding-ids":  # a request on a former padding row, with its (bad) ids
            candidates = [
                (r, gi)
                for r, gi in candidates
                if self.row_held is not None
                and self.committed_layout[r] is None
                and self.padding[gi][r]
                and self.padding[gi][r][0] >= self.groups[gi].id_limit
            ]
            if candidates:
                r, gi = rng.choice(candidates)
                rows[gi][r] = list(self.padding[gi][r])  # equal by value, another list
                return BlockIdValueError, (r, gi)
        if fault in ("shape", "padding-ids") or not candidates:
            what = rng.choice(["keys", "groups", "rows"])
            if what == "keys":
                keys.pop()
            elif what == "groups":
                rows.pop()
            else:
                rows[rng.randrange(len(rows))].pop()
            return ValueError, None
        r, gi = rng.choice(candidates)
        group = self.groups[gi]
        key = self.layout[r]
        assert key is not None
        cur = list(self.requests[key][gi])
        if fault == "float-container":
            rows[gi][r] = (
                np.array(cur, dtype=np.float64)
                if rng.random() < 0.5
                else torch.tensor(cur, dtype=torch.float32)
            )
            return BlockIdTypeError, (r, gi)
        if fault == "long":
            rows[gi][r] = self.fresh_ids(gi, [], group.width + 1, rng)
            return BlockIdValueError, (r, gi)
        if fault == "short":
            if group.shortest == 0:
                gi = 0  # a ring row: at least one id
                group, cur = self.groups[0], list(self.requests[key][0])
            rows[gi][r] = cur[: rng.randint(0, group.shortest - 1)]
            return BlockIdValueError, (r, gi)
        if fault == "repeat" and cur and len(cur) < group.width and rng.random() < 0.4:
            kept = len(cur)  # grown by ids of which one repeats a kept one
            cur += self.fresh_ids(gi, cur, rng.randint(1, min(3, group.width - kept)), rng)
            cur[rng.randrange(kept, len(cur))] = cur[rng.randrange(kept)]
            rows[gi][r] = cur
            return BlockIdValueError, (r, gi)
        if fault == "repeat" and len(cur) >= 2:
            p, q = rng.sample(range(len(cur)), 2)
            cur[p] = cur[q]
            rows[gi][r] = cur
            return BlockIdValueError, (r, gi)
        if not cur:  # an empty paged row: the bad id is appended
            cur = [0]
            p = 0
        else:
            p = rng.randrange(len(cur))
        if fault == "range" or fault == "repeat":
            bad = rng.choice(BAD_VALUES)
            if isinstance(bad, str):
                bad = group.id_limit + (3 if bad.endswith("3") else 0)
            cur[p] = bad
            rows[gi][r] = cur
            return BlockIdValueError, (r, gi)
        # A changed id that is not an int: unequal to what the request and the table row held.
        forbidden = set()
        for held in (
            self.held.get(key, [None] * len(self.groups))[gi],
            None if self.row_held is None else self.row_held[gi][r],
        ):
            if held is not None and p < len(held):
                forbidden.add(held[p])
        choices: list[Any] = [
            f(x)
            for x in self.window(gi)
            if x not in forbidden
            for f in (float, np.float64, np.float32)
        ]
        choices += [b for b in (True, False) if int(b) not in forbidden]
        choices += ["7", None]
        cur[p] = rng.choice(choices)
        rows[gi][r] = tuple(cur) if rng.random() < 0.3 else cur
        return BlockIdTypeError, (r, gi)

    # --- things besides steps --------------------------------------------------------------------

    def aside(self, kind: str, slot: int, seed: int) -> None:
        slot %= self.gt.slots
        rng = random.Random(seed)
        if kind == "invalidate-one":
            self.gt.invalidate(slot)
        elif kind == "invalidate-all":
            self.gt.invalidate(None)
        elif kind == "scribble":  # someone else writes the slot's buffers, then says so
            tables, counts = self.expected[slot]
            garbage = np.random.default_rng(seed)
            for gi, g in enumerate(self.groups):
                mask = garbage.random(tables[gi].shape) < 0.5
                tables[gi][mask] = garbage.integers(-9, 99, size=int(mask.sum()))
                self.gt.tables(slot)[g.name].numpy()[...] = tables[gi]
            counts[...] = garbage.integers(0, 5, size=counts.shape)
            self.gt.counts(slot).numpy()[...] = counts
            self.gt.invalidate(slot if rng.random() < 0.5 else None)
        elif kind == "reset":
            self.gt.reset()
            self.held, self.row_held = {}, None
            for gi in range(len(self.groups)):
                for r in range(self.num_rows):
                    assert self.gt.latest_ids(gi, r) is None
        else:  # a valid plan nobody commits changes nothing
            before = snapshot(self.gt)
            rows, keys = self.build(rng.choice(FORMS), rng)
            self.gt.plan(rows, keys)
            assert snapshot(self.gt) == before

    # --- invariants ------------------------------------------------------------------------------

    def snapshot_addresses(self) -> list[int]:
        return [
            t.data_ptr()
            for s in range(self.gt.slots)
            for t in [*self.gt.tables(s).values(), self.gt.counts(s)]
        ]

    @invariant()
    def every_slot_equals_its_rebuild(self) -> None:
        for slot, (tables, counts) in enumerate(self.expected):
            got = self.gt.tables(slot)
            for gi, g in enumerate(self.groups):
                np.testing.assert_array_equal(
                    got[g.name].numpy(), tables[gi], err_msg=f"slot {slot} group {g.name}"
                )
            np.testing.assert_array_equal(
                self.gt.counts(slot).numpy(), counts, err_msg=f"slot {slot} counts"
            )
        assert self.snapshot_addresses() == self.addresses


GroupedEngine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_grouped_engine = GroupedEngine.TestCase


# --- unit tests -----------------------------------------------------------------------------------

RING = TableGroup("swa", "ring", 10, id_limit=100)
PAGED = TableGroup("pages", "paged", 8, id_limit=100, pad=-1)


def step(gt: GroupedTables, rows: list[list[Any]], keys: list[Any], slot: int = 0) -> None:
    gt.commit(gt.plan(rows, keys), slot)


def test_errors_are_type_and_value_errors() -> None:
    assert issubclass(BlockIdTypeError, TypeError)
    assert issubclass(BlockIdValueError, ValueError)


def test_uncommitted_plan_cannot_be_committed_after_the_next() -> None:
    gt = GroupedTables([RING, PAGED], 3, slots=2)
    keys = ["a", "b", "c"]
    first = [[[1, 2, 3], [4], [5, 6]], [[1], [], [2, 3]]]
    step(gt, first, keys, 0)
    step(gt, first, keys, 1)
    a = gt.plan([[[9, 2, 3], [4], [5, 6]], [[1, 7], [], [2, 3]]], keys)
    b = gt.plan([[[1, 2, 8], [4, 11], [5, 6]], [[1], [12], [2]]], keys)
    gt.commit(b, 0)
    second = [[[1, 2, 8], [4, 11], [5, 6]], [[1], [12], [2]]]
    assert_slot(gt, 0, second)
    before = snapshot(gt)
    with pytest.raises(ValueError, match="committed once"):
        gt.commit(a, 1)  # planned before b was committed
    with pytest.raises(ValueError):
        gt.commit(b, 1)  # committed already
    assert snapshot(gt) == before
    # The other order: the first of two plans is committed, the second is stale.
    c = gt.plan(first, keys)
    d = gt.plan(second, keys)
    gt.commit(c, 1)
    before = snapshot(gt)
    with pytest.raises(ValueError):
        gt.commit(d, 0)
    assert snapshot(gt) == before
    # A plan made before reset() is stale too.
    e = gt.plan(second, keys)
    gt.reset()
    before = snapshot(gt)
    with pytest.raises(ValueError):
        gt.commit(e, 0)
    assert snapshot(gt) == before
    step(gt, second, keys, 0)
    step(gt, second, keys, 1)
    assert_slot(gt, 0, second)
    assert_slot(gt, 1, second)
    assert_latest(gt, second)
    with pytest.raises(IndexError):
        gt.commit(gt.plan(first, keys), 2)


def test_stats_count_a_one_slot_rotation() -> None:
    """hits: rows left alone, misses: rows written, cells_written: cells; a rotated ring slot is
    ``len(range(p, width, n))`` cells."""
    gt = GroupedTables([RING, PAGED], 3)
    keys = ["a", "b", "c"]
    ring = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    paged = [[10, 11], [12], []]
    step(gt, [ring, paged], keys)
    fresh = gt.stats(0)
    assert fresh["swa"].misses == 3 and fresh["swa"].cells_written == 3 * RING.width
    assert fresh["pages"].misses == 3 and fresh["pages"].cells_written == 3 * PAGED.width
    width = RING.width
    expected_cells = 0
    for k in range(7):  # rotate row 0 slot by slot, around the ring more than once
        gt.reset_stats()
        p = k % 3
        ring[0][p] = 20 + k
        step(gt, [ring, paged], keys)
        stats = gt.stats(0)
        assert stats["swa"].hits == 2 and stats["swa"].misses == 1
        assert stats["swa"].cells_written == len(range(p, width, 3))
        assert stats["pages"].hits == 3 and stats["pages"].misses == 0
        assert stats["pages"].cells_written == 0
        expected_cells += len(range(p, width, 3))
        assert_slot(gt, 0, [ring, paged])
    # A rotation off the hinted slot, in the 4-id row.
    gt.reset_stats()
    ring[2][2] = 40
    step(gt, [ring, paged], keys)
    assert gt.stats(0)["swa"].cells_written == len(range(2, width, 4))
    # Paged: a grown row writes its new cells, a shrunk one its freed cells, a changed id one.
    for change, cells in (("grow", 2), ("shrink", 1), ("change", 1)):
        gt.reset_stats()
        if change == "grow":
            paged[1].extend([30, 31])
        elif change == "shrink":
            paged[0].pop()
        else:
            paged[1][0] = 33
        step(gt, [ring, paged], keys)
        pages = gt.stats(0)["pages"]
        assert (pages.hits, pages.misses, pages.cells_written) == (2, 1, cells), change
        assert gt.stats(0)["swa"] == type(pages)(3, 0, 0)
        assert_slot(gt, 0, [ring, paged])


def test_stats_count_rows_not_places() -> None:
    """``misses`` counts rows written: a row changed in two places is one row written."""
    gt = GroupedTables([PAGED], 3)
    keys = ["a", "b", "c"]
    rows = [[[1, 2, 3], [4], [5]]]
    step(gt, rows, keys)
    gt.reset_stats()
    rows[0][0][0], rows[0][0][2] = 7, 8
    step(gt, rows, keys)
    stats = gt.stats(0)["pages"]
    assert (stats.hits, stats.misses, stats.cells_written) == (2, 1, 2)
    assert_slot(gt, 0, rows)
    # Two requests swap rows: two rows written where they differ ([7, 2, 8] over [4]: three
    # cells, and back), one left alone.
    gt.reset_stats()
    keys = ["b", "a", "c"]
    rows = [[rows[0][1], rows[0][0], rows[0][2]]]
    step(gt, rows, keys)
    stats = gt.stats(0)["pages"]
    assert (stats.hits, stats.misses, stats.cells_written) == (1, 2, 6)
    assert_slot(gt, 0, rows)
    # They swap back, one of them changed in one place: still two rows written.
    gt.reset_stats()
    keys = ["a", "b", "c"]
    rows = [[rows[0][1], rows[0][0], rows[0][2]]]
    rows[0][0][1] = 9
    step(gt, rows, keys)
    stats = gt.stats(0)["pages"]
    assert (stats.hits, stats.misses, stats.cells_written) == (1, 2, 6)
    assert_slot(gt, 0, rows)


def random_rows(
    rng: random.Random, groups: list[TableGroup], num_rows: int
) -> list[list[list[int]]]:
    return [
        [rng.sample(range(g.id_limit), rng.randint(g.shortest, g.width)) for _ in range(num_rows)]
        for g in groups
    ]


def evolve(rows: list[list[list[int]]], groups: list[TableGroup], rng: random.Random) -> None:
    """A few small changes in place: rotations, growth, a new row."""
    for _ in range(rng.randint(1, 3)):
        gi = rng.randrange(len(groups))
        g = groups[gi]
        r = rng.randrange(len(rows[gi]))
        ids = rows[gi][r]
        free = [x for x in range(g.id_limit) if x not in ids]
        choice = rng.random()
        if choice < 0.5 and ids:
            ids[rng.randrange(len(ids))] = rng.choice(free)
        elif choice < 0.8 and len(ids) < g.width:
            ids.append(rng.choice(free))
        else:
            rows[gi][r] = rng.sample(range(g.id_limit), rng.randint(g.shortest, g.width))


def test_two_slots_alternating_each_equal_their_own_rows() -> None:
    groups = [RING, PAGED]
    gt = GroupedTables(groups, 4, slots=2)
    keys = ["a", "b", "c", "d"]
    rng = random.Random(1)
    rows = random_rows(rng, groups, 4)
    last: dict[int, list[list[list[int]]]] = {}
    for k in range(40):
        slot = k % 2
        evolve(rows, groups, rng)
        step(gt, rows, keys, slot)
        last[slot] = [[list(ids) for ids in column] for column in rows]
        for s, committed in last.items():
            assert_slot(gt, s, committed)
        assert_latest(gt, rows)


@pytest.mark.parametrize(
    "behind",
    [1, 7, 8, 9, 24],
)
def test_slot_left_behind_catches_up(behind: int) -> None:
    groups = [RING, PAGED]
    gt = GroupedTables(groups, 4, slots=3)
    keys = ["a", "b", "c", "d"]
    rng = random.Random(behind)
    rows = random_rows(rng, groups, 4)
    for slot in range(3):
        step(gt, rows, keys, slot)
    kept = [[list(ids) for ids in column] for column in rows]
    for k in range(behind):
        evolve(rows, groups, rng)
        if k % 3 == 0:  # a request moves to another row now and then
            keys = keys[1:] + keys[:1]
            rows = [column[1:] + column[:1] for column in rows]
        step(gt, rows, keys, k % 2)
        assert_slot(gt, 2, kept)  # never touched meanwhile
    evolve(rows, groups, rng)
    gt.reset_stats()
    step(gt, rows, keys, 2)
    assert_slot(gt, 2, rows)
    assert_latest(gt, rows)
    for g in groups:  # however far behind, each row is written at most once
        assert gt.stats(2)[g.name].cells_written <= 4 * g.width


@pytest.mark.parametrize("which", [0, None])
def test_invalidate_then_scribble_is_repaired(which: int | None) -> None:
    groups = [RING, PAGED]
    gt = GroupedTables(groups, 4, slots=2)
    keys = ["a", "b", "c", "d"]
    rng = random.Random(5)
    rows = random_rows(rng, groups, 4)
    step(gt, rows, keys, 0)
    step(gt, rows, keys, 1)
    kept = [[list(ids) for ids in column] for column in rows]
    gt.invalidate(which)
    scribbled = [0, 1] if which is None else [which]
    for s in scribbled:  # someone else writes what was invalidated
        for t in gt.tables(s).values():
            t.fill_(77)
        gt.counts(s).fill_(9)
    evolve(rows, groups, rng)
    step(gt, rows, keys, 0)
    assert_slot(gt, 0, rows)
    if which is None:
        assert (gt.counts(1).numpy() == 9).all()  # not repaired before slot 1's next commit
    else:
        assert_slot(gt, 1, kept)  # slot 1 untouched by slot 0's commit
    for _ in range(3):
        evolve(rows, groups, rng)
        step(gt, rows, keys, 1)
        assert_slot(gt, 1, rows)
        evolve(rows, groups, rng)
        step(gt, rows, keys, 0)
        assert_slot(gt, 0, rows)


def test_reset_rewrites_every_row_of_every_slot() -> None:
    groups = [RING, PAGED]
    gt = GroupedTables(groups, 4, slots=2)
    keys = ["a", "b", "c", "d"]
    rows = random_rows(random.Random(2), groups, 4)
    step(gt, rows, keys, 0)
    step(gt, rows, keys, 1)
    gt.reset()
    assert all(gt.latest_ids(gi, r) is None for gi in range(2) for r in range(4))
    for s in range(2):
        for t in gt.tables(s).values():
            t.fill_(55)
    gt.reset_stats()
    step(gt, rows, keys, 1)
    assert_slot(gt, 1, rows)
    step(gt, rows, keys, 0)
    assert_slot(gt, 0, rows)
    # A step after reset holds nothing: a float equal to the former id is a changed id.
    gt.reset()
    with pytest.raises(BlockIdTypeError):
        gt.plan([[[float(x) for x in rows[0][0]], *rows[0][1:]], rows[1]], keys)


# --- the id rule on the block path and the per-row path ------------------------------------------

BLOCK_ROWS = max(4, BLOCK_RENDER_MIN_ROWS + 1)  # whole rows enough for the block path


def block_setup() -> tuple[GroupedTables, list[str]]:
    return GroupedTables([RING, PAGED], BLOCK_ROWS), [f"r{i}" for i in range(BLOCK_ROWS)]


@pytest.mark.parametrize("gi", [0, 1])
@pytest.mark.parametrize("bad", [True, False, 5.0, np.float64(5), np.bool_(True), "5", None])
def test_block_path_rejects_a_hidden_non_int(gi: int, bad: Any) -> None:
    """A cold step writes every row whole, in one block: a bool hides among ints in NumPy."""
    gt, keys = block_setup()
    rows = [[[3 + r, 40 + r] for r in range(BLOCK_ROWS)], [[60 + r] for r in range(BLOCK_ROWS)]]
    rows[gi][2] = [bad, 5] if gi == 0 else [bad, 6]
    before = snapshot(gt)
    with pytest.raises(BlockIdTypeError) as info:
        gt.plan(rows, keys, place=PLACE)
    err = info.value
    name = gt.groups[gi].name
    assert (err.row, err.group) == (2, name)
    assert err.value is bad or err.value == bad
    message = str(err)
    assert "decode row 2" in message and name in message and repr(bad) in message
    assert snapshot(gt) == before


@pytest.mark.parametrize("scalar", [np.int64, np.int32, np.uint16, np.uint32])
def test_numpy_integers_are_accepted_and_stored_as_ints(scalar: Any) -> None:
    gt, keys = block_setup()
    rows = [[[3 + r, 40 + r] for r in range(BLOCK_ROWS)], [[60 + r] for r in range(BLOCK_ROWS)]]
    given = [[list(ids) for ids in column] for column in rows]
    given[0][1] = [scalar(4), 41]
    given[1][3] = [scalar(63), scalar(1)]
    rows[1][3] = [63, 1]
    step(gt, given, keys)  # the block path: every row new
    assert_slot(gt, 0, rows)
    assert_latest(gt, rows)
    # The per-row path: one row written whole (a new length that is no growth), one grown.
    rows[0][2] = [7, 8, 9]
    rows[1][0] = [61, 62]
    given = [[list(ids) for ids in column] for column in rows]
    given[0][2] = [scalar(7), 8, scalar(9)]
    given[1][0] = [61, scalar(62)]
    step(gt, given, keys)
    assert_slot(gt, 0, rows)
    assert_latest(gt, rows)


def test_per_row_path_names_the_place() -> None:
    gt, keys = block_setup()
    rows = [[[1, 2, 3 + r] for r in range(BLOCK_ROWS)], [[60 + r] for r in range(BLOCK_ROWS)]]
    step(gt, rows, keys)
    cases: list[tuple[int, list[Any], type[Exception], str]] = [
        (0, [9, True], BlockIdTypeError, "True"),  # whole row: True is not the held 2
        (0, [1, 2.5, 3 + 1], BlockIdTypeError, "2.5"),  # a patched place
        (0, [1, 2, 5, np.float64(30)], BlockIdTypeError, "30"),  # an appended id
        (1, [60 + 1, 101], BlockIdValueError, "101"),
        (1, [60 + 1, -1], BlockIdValueError, "-1"),
        (0, [1, 2, 1], BlockIdValueError, "id 1"),
        (0, [1, 2, 4, 2], BlockIdValueError, "id 2"),  # grown by an id it holds
        (0, [1, 2, 4, 30, 4], BlockIdValueError, "id 4"),
        (1, [61, 61], BlockIdValueError, "id 61"),
        (0, [], BlockIdValueError, "0 blocks"),
        (0, list(range(11)), BlockIdValueError, "11 blocks"),
        (1, list(range(9)), BlockIdValueError, "9 blocks"),
    ]
    for gi, ids, error, shown in cases:
        given: list[list[Any]] = [[list(x) for x in column] for column in rows]
        given[gi][1] = ids
        before = snapshot(gt)
        with pytest.raises(error) as info:
            gt.plan(given, keys, place=PLACE)
        message = str(info.value)
        name = gt.groups[gi].name
        assert "decode row 1" in message and name in message and shown in message, message
        assert (info.value.row, info.value.group) == (1, name)  # type: ignore[attr-defined]
        assert snapshot(gt) == before
    # Non-ints equal to the held id at their place are the held ints, on both paths.
    given = [[list(x) for x in column] for column in rows]
    given[0][1] = [True, 2.0, np.float64(4), 50]  # held [1, 2, 4]: grown, so checked
    rows[0][1] = [1, 2, 4, 50]
    step(gt, given, keys)
    assert_slot(gt, 0, rows)
    assert_latest(gt, rows)
    given = [[list(x) for x in column] for column in rows]
    for r in range(BLOCK_ROWS):  # every row rewritten whole, in one block
        given[0][r] = [np.float32(rows[0][r][0]), 70 + r]
        rows[0][r] = [rows[0][r][0], 70 + r]
    given[0][1][0] = True
    step(gt, given, keys)
    assert_slot(gt, 0, rows)
    assert_latest(gt, rows)


def test_hinted_place_with_a_huge_negative_id_is_a_value_error() -> None:
    """The steady fast path (the hinted ring slot) must range-check before using the id."""
    gt = GroupedTables([RING], 2)
    keys = ["a", "b"]
    step(gt, [[[1, 2, 3], [4, 5]]], keys)
    for bad in (-1, -(2**16), -(2**16) - 1, -(2**40)):
        with pytest.raises(BlockIdValueError):
            gt.plan([[[bad, 2, 3], [4, 5]]], keys)


@pytest.mark.parametrize("element", [torch.tensor(5), np.array(5), np.int32(5)])
def test_integer_scalars_are_ids_on_either_path(element: Any) -> None:
    """0-d integer arrays and tensors and NumPy integers are integers (as the builders take
    them): accepted and recorded as plain ints, whatever the number of whole rows in the step;
    0-d float ones are not."""
    gt = GroupedTables([PAGED], BLOCK_ROWS)
    keys = [f"r{i}" for i in range(BLOCK_ROWS)]
    rows = [[[r] for r in range(BLOCK_ROWS)]]
    rows[0][0] = [element, 7]
    step(gt, rows, keys)  # the block path
    assert gt.latest_ids(0, 0) == [5, 7] and all(type(x) is int for x in gt.latest_ids(0, 0) or [])
    step(gt, [[[9], *[[r] for r in range(1, BLOCK_ROWS)]]], keys)
    step(gt, rows, keys)  # the per-row path
    assert gt.latest_ids(0, 0) == [5, 7] and all(type(x) is int for x in gt.latest_ids(0, 0) or [])
    floats = [[[r] for r in range(BLOCK_ROWS)]]
    floats[0][0] = [torch.tensor(5.5), 7]
    with pytest.raises(BlockIdTypeError):
        gt.plan(floats, keys)


def test_float_containers_are_rejected_whole() -> None:
    gt, keys = block_setup()
    rows = [[[1, 2, 3 + r] for r in range(BLOCK_ROWS)], [[60 + r] for r in range(BLOCK_ROWS)]]
    step(gt, rows, keys)
    for container in (
        np.array([1.0, 2.0, 5.0]),
        torch.tensor([1.0, 2.0, 5.0]),
        np.array([1, 2, 5], dtype=np.float32),
        np.array([True, False]),
        np.array([[1, 2], [3, 4]]),
    ):
        given: list[list[Any]] = [[list(x) for x in column] for column in rows]
        given[0][3] = container
        before = snapshot(gt)
        with pytest.raises(BlockIdTypeError) as info:
            gt.plan(given, keys, place=PLACE)
        assert "decode row 3" in str(info.value) and "swa" in str(info.value)
        assert snapshot(gt) == before
    # Equal by value (even to what the row holds) does not save a float container.
    given = [[list(x) for x in column] for column in rows]
    given[0][0] = np.array(rows[0][0], dtype=np.float64)
    with pytest.raises(BlockIdTypeError):
        gt.plan(given, keys)


def test_the_core_does_not_hold_the_callers_lists() -> None:
    """The engine mutates its lists in place after a step: the next step sees the change, on
    every path (one place, growth, shrinking, a row rewritten whole, many rows in one block), for
    ids below and above ``INTERNED_IDS``."""
    big = TableGroup("big", "paged", 8, id_limit=200_000, pad=-1)
    groups = [RING, big]
    gt = GroupedTables(groups, 4, slots=2)
    keys = ["a", "b", "c", "d"]
    rows = [[[1, 2], [3, 4, 5], [6], [7, 8]], [[100_000], [100_001, 100_002], [], [100_003]]]
    step(gt, rows, keys, 0)
    rng = random.Random(3)
    for k in range(30):
        slot = k % 2
        change = k % 5
        for gi, g in enumerate(groups):
            base = 0 if gi == 0 else 100_000
            targets = range(4) if change == 4 else [rng.randrange(4)]
            for r in targets:
                ids = rows[gi][r]  # in place: the same list object as the last step's
                free = [x for x in range(base, base + 60) if x not in ids]
                if change == 0 and ids:
                    ids[rng.randrange(len(ids))] = rng.choice(free)
                elif change == 1 and len(ids) < g.width:
                    ids.append(rng.choice(free))
                elif change == 2 and len(ids) > g.shortest:
                    ids.pop()
                else:  # rewritten whole (change 4: every row, one block)
                    ids[:] = rng.sample(free, rng.randint(max(g.shortest, 1), 5))
        step(gt, rows, keys, slot)
        assert_slot(gt, slot, rows)
        assert_latest(gt, rows)


def test_padding_rows_are_trusted_and_requests_on_them_checked() -> None:
    """Padding rows (key ``None``) hold the caller's ids, unchecked; a request arriving on a
    padding row with the same ids by value is checked as new."""
    gt = GroupedTables([RING, PAGED], 3)
    pad_ring, pad_paged = [5], [150]  # out of range for a request, fine for padding
    rows = [[[1, 2], pad_ring, [3]], [[10], pad_paged, []]]
    step(gt, rows, ["a", None, "c"])
    assert_slot(gt, 0, rows)
    with pytest.raises(BlockIdTypeError):  # nothing held for the newcomer: 5.0 is a new id
        gt.plan([[[1, 2], [5.0], [3]], [[10], [11], []]], ["a", "b", "c"])
    with pytest.raises(BlockIdValueError):
        gt.plan([[[1, 2], [5], [3]], [[10], [150], []]], ["a", "b", "c"])
    rows = [[[1, 2], [5], [3]], [[10], [11], []]]
    step(gt, rows, ["a", "b", "c"])
    assert_slot(gt, 0, rows)
    assert_latest(gt, rows)


def test_a_bad_slot_or_block_rows_is_refused_before_anything_is_written() -> None:
    gt = GroupedTables([RING, PAGED], 3, slots=2)
    keys = ["a", "b", "c"]
    step(gt, [[[1, 2], [3], [4]], [[5], [6], [7]]], keys, slot=0)
    before = [t.clone() for s in (0, 1) for t in gt.tables(s).values()]
    planned = gt.plan([[[1, 9], [3], [4]], [[5], [6], [7]]], keys)
    for bad in (-1, 2, 1.0):
        with pytest.raises((IndexError, TypeError)):
            gt.commit(planned, bad)  # type: ignore[arg-type]
    after = [t.clone() for s in (0, 1) for t in gt.tables(s).values()]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    gt.commit(planned, 1)  # the plan is still good
    assert gt.latest_ids(0, 0) == [1, 9]
    for bad in (-1, 2):
        with pytest.raises(IndexError):
            gt.tables(bad)
    with pytest.raises(ValueError, match="block_rows must be positive"):
        GroupedTables([RING], 2, block_rows=0)


# --- adopted buffers ------------------------------------------------------------------------------


def adopted_slot(rows: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    tables = {g.name: torch.zeros(rows, g.width, dtype=torch.int32) for g in (RING, PAGED)}
    return tables, torch.zeros(rows, 2, dtype=torch.int32)


def test_adopted_buffers_that_overlap_are_refused() -> None:
    """Groups, counts or slots over the same memory would overwrite each other's rows."""
    tables, counts = adopted_slot(3)
    shared = torch.zeros(3 * max(RING.width, PAGED.width), dtype=torch.int32)
    cases = [
        ({g.name: shared[: 3 * g.width].view(3, g.width) for g in (RING, PAGED)}, counts),
        (tables, tables["pages"].view(-1)[:6].view(3, 2)),  # counts over a table's first rows
    ]
    for case in cases:
        with pytest.raises(ValueError, match="overlap"):
            GroupedTables([RING, PAGED], 3, buffers=[case])
    with pytest.raises(ValueError, match="overlap"):
        GroupedTables([RING, PAGED], 3, slots=2, buffers=[(tables, counts), (tables, counts)])
    gt = GroupedTables([RING, PAGED], 3, slots=2, buffers=[adopted_slot(3), adopted_slot(3)])
    rows = [[[1, 2], [3], [4, 5, 6]], [[7], [8, 9], []]]
    step(gt, rows, ["a", "b", "c"], 1)
    assert_slot(gt, 1, rows)


def test_adopted_read_only_memory_is_refused(tmp_path: Any) -> None:
    """A tensor over a read-only mapping would kill the process at the first commit."""
    path = tmp_path / "table.bin"
    path.write_bytes(bytes(3 * RING.width * 4))
    mapped = np.memmap(path, dtype=np.int32, mode="r", shape=(3, RING.width))
    with warnings.catch_warnings():  # torch warns of a non-writable array once per process
        warnings.simplefilter("ignore", UserWarning)
        read_only = torch.from_numpy(mapped)
    tables, counts = adopted_slot(3)
    tables["swa"] = read_only
    with pytest.raises(ValueError, match="read-only"):
        GroupedTables([RING, PAGED], 3, buffers=[(tables, counts)])


@pytest.mark.parametrize(
    ("row", "error", "message"),
    [
        (5, BlockprepIndexError, r"changes of group pages name row 5, not a table row in \[0, 3\)"),
        (-1, BlockprepIndexError, r"changes of group pages name row -1, not a table row in"),
        ("x", BlockprepTypeError, "changes of group pages must be keyed by table rows .*'x'"),
        (True, BlockprepTypeError, "changes of group pages must be keyed by table rows .*True"),
    ],
)
@pytest.mark.parametrize("moved", [False, True])
def test_plan_deltas_names_a_change_row_that_is_no_table_row(
    row: Any, error: type[Exception], message: str, moved: bool
) -> None:
    """A change keyed by something that is no table row: a BlockprepError naming the group and
    the row (it was a bare ``IndexError("list index out of range")``), nothing planned."""
    gt = GroupedTables([RING, PAGED], 3)
    keys = ["a", "b", "c"]
    step(gt, [[[1], [2], [3]], [[10], [11], [12]]], keys)
    before = [gt.tables(0)[name].clone() for name in ("swa", "pages")]
    new_keys = ["b", "a", "c"] if moved else keys  # rows moved: the other walk
    with pytest.raises(error, match=message):
        gt.plan_deltas([{}, {row: [["a", [13]]]}], new_keys, lambda g, r: [])
    step(gt, [[[1], [2], [3]], [[10], [11], [12]]], keys)
    assert all(
        torch.equal(gt.tables(0)[name], was)
        for name, was in zip(("swa", "pages"), before, strict=True)
    )
