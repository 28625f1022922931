"""The encoders' compiled step (``blockprep._differ.diff_lists``) against its specification, the
encoders' Python code (:meth:`blockprep.events.PackedDeltaEncoder.encode` and
:meth:`blockprep.wire.BlockDeltaEncoder.encode` with ``_backend.diff_lists`` unset).

A hypothesis state machine drives two encoders of each kind with the same steps: the
scheduler's lists changed by appends, sets, truncates and replacements, requests joining,
leaving and reordered, and steps that are not the compiled step's (tuples, NumPy ints, bools,
floats, ids out of range, groups missing, extra or reordered, request ids of other types, a
repeated request). After every step the two encoders of a kind give equal messages (every byte)
and held copies, or both refused the step with the same exception type and text; the wire
message carries the packed one's ops; and what the worker rebuilds from the messages equals the
scheduler's lists. The compiled module is imported directly, so this runs in the twin-forced
pass too; it is skipped where the extension was not built.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from blockprep import _backend
from blockprep.events import PackedDeltaEncoder
from blockprep.packed import unpack
from blockprep.wire import BlockDeltaEncoder, apply_ops

compiled = pytest.importorskip("blockprep._differ")

GROUPS = ("swa", "c4", "c128")
IDS = st.integers(0, 50)
KINDS = ["append", "set", "set", "many", "truncate", "splice"]


def encode(encoder: Any, fast: bool, batch: list[Any], lists: list[Any]) -> Any:
    """``encoder.encode`` with the compiled step (``fast``) or the Python code alone."""
    saved = _backend.diff_lists
    _backend.diff_lists = compiled.diff_lists if fast else None
    try:
        return encoder.encode(batch, lists)
    except (TypeError, ValueError) as error:
        return error
    finally:
        _backend.diff_lists = saved


class DifferMachine(RuleBasedStateMachine):
    """The scheduler's truth (``request -> [ids per group]``), two encoders, one worker."""

    @initialize(grouped=st.booleans())
    def start(self, grouped: bool) -> None:
        self.groups = GROUPS if grouped else None
        self.fast = PackedDeltaEncoder(self.groups)
        self.slow = PackedDeltaEncoder(self.groups)
        self.wire_fast, self.wire_slow = BlockDeltaEncoder(), BlockDeltaEncoder()
        self.truth: dict[Any, list[list[int]]] = {}
        self.order: list[Any] = []
        self.worker: dict[Any, Any] = {}  # what the worker holds, rebuilt from the messages
        self.next = 0

    def width(self) -> int:
        return 1 if self.groups is None else len(self.groups)

    @rule(lists=st.lists(st.lists(IDS, max_size=12), min_size=3, max_size=3), key=st.booleans())
    def join(self, lists: list[list[int]], key: bool) -> None:
        request: Any = self.next if key else f"r{self.next}"
        self.next += 1
        self.truth[request] = lists[: self.width()]
        self.order.append(request)

    @precondition(lambda self: self.order)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        request = self.order.pop(data.draw(st.integers(0, len(self.order) - 1)))
        del self.truth[request]

    @precondition(lambda self: self.order)
    @rule(data=st.data(), kind=st.sampled_from(KINDS))
    def change(self, data: st.DataObject, kind: str) -> None:
        request = data.draw(st.sampled_from(self.order))
        ids = self.truth[request][data.draw(st.integers(0, self.width() - 1))]
        if kind == "append":
            ids.extend(data.draw(st.lists(IDS, min_size=1, max_size=4)))
        elif kind in ("set", "many") and ids:
            for _ in range(1 if kind == "set" else len(ids)):
                ids[data.draw(st.integers(0, len(ids) - 1))] = data.draw(IDS)
        elif kind == "truncate":
            del ids[data.draw(st.integers(0, len(ids))) :]
        else:
            at = data.draw(st.integers(0, len(ids)))
            ids[at:] = data.draw(st.lists(IDS, max_size=6))

    @rule(data=st.data())
    def shuffle(self, data: st.DataObject) -> None:
        self.order = data.draw(st.permutations(self.order))

    @rule()
    def resync(self) -> None:
        for encoder in (self.fast, self.slow, self.wire_fast, self.wire_slow):
            encoder.reset()
        self.worker = {}

    @rule(
        data=st.data(),
        odd=st.sampled_from(
            [
                "none",
                "none",
                "none",
                "tuple",
                "numpy",
                "bool",
                "float",
                "big",
                "huge",
                "negative",
                "reordered",
                "missing",
                "extra",
                "request",
                "repeat",
                "flat-grouped",
            ]
        ),
    )
    def step(self, data: st.DataObject, odd: str) -> None:
        for _ in range(data.draw(st.integers(0, 8))):  # what the scheduler did since
            if self.order:
                self.change(data, data.draw(st.sampled_from(KINDS)))
        batch = list(self.order)
        if self.groups is None:
            lists: list[Any] = [list(self.truth[r][0]) for r in batch]
        else:
            lists = [dict(zip(self.groups, map(list, self.truth[r]), strict=True)) for r in batch]
        if batch and odd != "none":
            row = data.draw(st.integers(0, len(batch) - 1))
            self.spoil(batch, lists, row, odd, data)
        held_before = copy.deepcopy(self.fast._held)
        wire_before = copy.deepcopy(self.wire_fast._held)
        got = encode(self.fast, True, batch, copy.deepcopy(lists))
        want = encode(self.slow, False, batch, copy.deepcopy(lists))
        wire_got = encode(self.wire_fast, True, batch, copy.deepcopy(lists))
        wire_want = encode(self.wire_slow, False, batch, lists)
        for fast, slow in ((got, want), (wire_got, wire_want)):
            if isinstance(slow, Exception):
                assert type(fast) is type(slow) and str(fast) == str(slow)
        if isinstance(wire_want, Exception):
            assert self.wire_fast._held == wire_before
        else:
            assert wire_got == wire_want
            assert self.wire_fast._held == self.wire_slow._held
        if isinstance(want, Exception):
            assert self.fast._held == held_before
            return
        assert got == want  # every header field and payload byte
        assert self.fast._held == self.slow._held
        if odd == "none" and all(type(r) in (str, int) for r in held_before):  # canonical
            assert compiled.diff_lists(held_before, batch, lists, self.groups) is not None
        rows = unpack(got, batch, None if self.groups is None else list(self.groups))["rows"]
        if not isinstance(wire_got, Exception) and wire_before == held_before:  # the same ops
            assert wire_got["rows"] == rows
        if got["base"] is None:
            self.worker = {}
        worker = {}
        for request in batch:
            ops = rows.get(request)
            if self.groups is None:
                held = self.worker.get(request)
                worker[request] = apply_ops(ops, held) if ops else held
            else:
                held, ops = self.worker.get(request, {}), ops or {}
                worker[request] = {
                    g: apply_ops(ops[g], held.get(g)) if g in ops else held[g] for g in self.groups
                }
        self.worker = worker
        for request, ids in zip(batch, lists, strict=True):
            if self.groups is None:
                assert worker[request] == list(ids)
            else:
                assert worker[request] == {g: list(v) for g, v in ids.items()}

    def spoil(self, batch: list[Any], lists: list[Any], row: int, odd: str, data: Any) -> None:
        """Make row ``row`` of the step something the compiled step does not take."""
        entry = lists[row]
        ids = entry if self.groups is None else entry[self.groups[0]]
        if odd in ("tuple", "numpy", "bool", "float", "big", "huge", "negative") and not ids:
            ids.append(1)
        if odd == "tuple":
            ids = tuple(ids)
        elif odd == "numpy":
            ids[0] = np.int64(ids[0])
        elif odd == "bool":
            ids[0] = True
        elif odd == "float":
            ids[0] = 1.5
        elif odd == "big":
            ids[0] = 2**31
        elif odd == "huge":  # outside int64: refused by both, never compared by a sentinel
            ids[0] = data.draw(st.sampled_from([2**63, 2**70, -(2**63) - 1]))
        elif odd == "negative":
            ids[0] = -1
        elif odd == "request":
            batch[row] = (batch[row],)  # a tuple request id: the Python path's
        elif odd == "repeat" and len(batch) > 1:
            batch[row] = batch[row - 1]
        elif odd == "flat-grouped":
            lists[row] = {"swa": list(ids)} if self.groups is None else list(ids)
        elif self.groups is not None and odd == "reordered":
            lists[row] = dict(reversed(list(entry.items())))
        elif self.groups is not None and odd == "missing":
            del entry[self.groups[-1]]
        elif self.groups is not None and odd == "extra":
            entry["other"] = [1]
        if odd == "tuple":
            if self.groups is None:
                lists[row] = ids
            else:
                entry[self.groups[0]] = ids

    @invariant()
    def copies_are_the_encoders_own(self) -> None:
        """The held copies equal the last lists sent, whatever the caller did with its own."""
        held = self.fast._held
        for request, value in held.items():
            if request in self.truth and request in self.worker:
                assert value == self.worker[request]


DifferMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_differ_differential = DifferMachine.TestCase


def test_the_compiled_step_takes_canonical_steps() -> None:
    """On plain lists of plain ints it is the compiled step that runs, not the fallback."""
    held: dict[Any, Any] = {}
    lists = [{g: [1, 2, 3] for g in GROUPS}, {g: [4] for g in GROUPS}]
    done = compiled.diff_lists(held, ["a", 7], lists, GROUPS)
    assert done is not None
    data, count, held = done
    assert count == 6 and held == {"a": lists[0], 7: lists[1]}
    lists[0]["swa"][1] = 9  # a set: the held copy changed in place, at commit
    lists[1]["c4"].append(5)
    copy_before = held["a"]["swa"]
    data, count, new_held = compiled.diff_lists(held, ["a", 7], lists, GROUPS)
    assert count == 2 and new_held["a"]["swa"] is copy_before and copy_before == [1, 9, 3]
    assert np.frombuffer(data, "<i4").tolist() == [3, 0, 0, 1, 1, 9, 2, 1, 1, 1, 5]
    assert compiled.diff_lists(new_held, ["a", 7], lists, GROUPS)[1] == 0


@pytest.mark.parametrize(
    "args",
    [
        ({}, ("a",), [[1]], None),  # a tuple of requests
        ({}, ["a"], ([1],), None),
        ([], ["a"], [[1]], None),  # held not a dict
        ({}, ["a"], [[1]], ["g"]),  # names not a tuple
        ({}, ["a", "b"], [[1]], None),  # lengths differ
        ({("x",): [1]}, ["a"], [[1]], None),  # a held key of another type
    ],
)
def test_the_compiled_step_declines_other_arguments(args: tuple[Any, ...]) -> None:
    assert compiled.diff_lists(*args) is None


@pytest.mark.parametrize("packed", [False, True])
def test_ids_outside_int64_are_refused_by_both_paths(packed: bool) -> None:
    """A request going from ``[5]`` to ``[2**70]``: never the same as ``[2**63]`` (one sentinel
    for both), both paths refuse it with the same words, and nothing is remembered."""
    for first, then in (([5], [2**70]), ([5, 6], [5, 2**64]), ([2**63], [2**70])):
        fast, slow = (
            (PackedDeltaEncoder(None), PackedDeltaEncoder(None))
            if packed
            else (
                BlockDeltaEncoder(),
                BlockDeltaEncoder(),
            )
        )
        for lists in ([first], [then]):
            got_fast, got_slow = encode(fast, True, ["a"], lists), encode(slow, False, ["a"], lists)
            assert str(got_fast) == str(got_slow)
        assert isinstance(got_fast, ValueError)
        assert str(got_fast) == f"block IDs must fit int64, got {max(then)}"
        assert fast._held == slow._held


def test_a_declined_step_changes_nothing() -> None:
    held = {"a": [1, 2, 3]}
    assert compiled.diff_lists(held, ["a"], [[1, 7, 2.5]], None) is None
    assert held == {"a": [1, 2, 3]}


@pytest.mark.parametrize("first", [0, 1, 5])
def test_held_copies_of_other_ints_are_declined_not_read(first: int) -> None:
    """``BlockDeltaEncoder``'s Python code keeps the caller's NumPy ints in its held copy; the
    next step's compiled call must not read them as Python ints (it declines, the Python code
    takes the step): the same messages as the Python code's alone."""
    fast, slow = BlockDeltaEncoder(), BlockDeltaEncoder()
    steps = [[[np.int64(first), 5, 7]], [[first, 5, 8]], [[first, 5, 8, 9]]]
    for lists in steps:
        assert encode(fast, True, ["a"], lists) == encode(slow, False, ["a"], lists)
        assert fast._held == slow._held
    held = {"a": [np.int64(first), 5, 7]}
    assert compiled.diff_lists(held, ["a"], [[first, 5, 8]], None) is None
