"""The scheduler side of the packed wire (blockprep.events): the event recorder and the differ.

Every message is applied, with :func:`blockprep.packed.unpack` and
:func:`blockprep.wire.apply_ops` only, to an independent model of what a worker holds (keyed by
request, only the requests of the last batch kept); after every step that model must equal the
scheduler's own full lists. Random traces have churn, preemption (a live request left out of a
batch), reordering, truncation, lost messages and resyncs. An invalid event must raise and record
nothing: a second recorder that never saw it makes the same messages, byte for byte.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockprep import events
from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.events import BlockEventRecorder, PackedDeltaEncoder
from blockprep.packed import unpack
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS, DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder, DeltaSequenceError, apply_ops, resync_request

GROUPS = ["full", "ring", "state"]
DS_GROUPS = [name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS]
RANDOM = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Worker:
    """What a worker holds: the last applied seq and each request's ids (flat: a list; grouped:
    ``{group: list}``), from the wire's own rules, written here without the recorder's code."""

    def __init__(self, groups: list[str] | None) -> None:
        self.groups = groups
        self.last: int | None = None
        self.rows: dict[Any, Any] = {}

    def apply(self, message: dict[str, Any], request_ids: list[Any]) -> None:
        """Apply ``message`` (packed, or a :mod:`blockprep.wire` one) for the batch
        ``request_ids``; ``DeltaSequenceError`` (nothing changed) when its base is not the last
        applied."""
        base = message["base"]
        if base is not None and base != self.last:
            raise DeltaSequenceError(self.last, base, message["seq"])
        rows = (
            message["rows"]
            if "rows" in message
            else unpack(message, request_ids, self.groups)["rows"]
        )
        held = self.rows if base is not None else {}
        new: dict[Any, Any] = {}
        for request in request_ids:
            old = held.get(request)
            if self.groups is None:
                ops = rows.get(request)
                new[request] = apply_ops(ops, old) if ops else old
                assert new[request] is not None, f"{request!r} new to the worker, not sent"
            else:
                entry = rows.get(request, {})
                lists = {}
                for group in self.groups:
                    before = None if old is None else old[group]
                    ops = entry.get(group)
                    lists[group] = apply_ops(ops, before) if ops else before
                    assert lists[group] is not None, f"{request!r}/{group} not sent"
                new[request] = lists
        self.rows, self.last = new, message["seq"]


def expected(truth: dict[Any, list[list[int]]], batch: list[Any], groups: list[str] | None):
    if groups is None:
        return {r: truth[r][0] for r in batch}
    return {r: dict(zip(groups, truth[r], strict=True)) for r in batch}


BAD_IDS: list[Any] = [-1, 2**31, 2**40, True, 1.0, "3", None, np.int64(3)]


class Trace:
    """A random scheduler: live requests' true lists, events drawn against them (valid ones to
    both recorders, invalid ones only to ``recorder``, which must refuse them unchanged)."""

    def __init__(self, data: st.DataObject, groups: list[str] | None) -> None:
        self.data, self.groups = data, groups
        self.ngroups = 1 if groups is None else len(groups)
        self.recorder = BlockEventRecorder(groups)
        self.twin = BlockEventRecorder(groups)
        self.truth: dict[Any, list[list[int]]] = {}
        self.counter = 0

    def draw(self, strategy: Any) -> Any:
        return self.data.draw(strategy)

    def ids(self, low: int = 0, high: int = 6) -> list[int]:
        return self.draw(st.lists(st.integers(0, 2**31 - 1), min_size=low, max_size=high))

    def group(self) -> tuple[int, str | None]:
        g = self.draw(st.integers(0, self.ngroups - 1))
        return g, None if self.groups is None else self.groups[g]

    def both(self, method: str, *args: Any, **kwargs: Any) -> None:
        getattr(self.recorder, method)(*args, **kwargs)
        getattr(self.twin, method)(*args, **kwargs)

    def refused(self, method: str, *args: Any, **kwargs: Any) -> None:
        with pytest.raises((BlockprepValueError, BlockprepTypeError)):
            getattr(self.recorder, method)(*args, **kwargs)

    def start(self, request: Any = None) -> None:
        if request is None:
            self.counter += 1
            request = f"r{self.counter}"
        lists = [self.ids(0, 8) for _ in range(self.ngroups)]
        self.truth[request] = [list(x) for x in lists]
        arg = lists[0] if self.groups is None else dict(zip(self.groups, lists, strict=True))
        if self.draw(st.booleans()) and self.groups is None:
            arg = tuple(arg)
        self.both("start", request, arg)

    def event(self) -> None:
        live = sorted(self.truth)
        kind = self.draw(st.sampled_from(["start", "append", "set", "truncate", "finish", "bad"]))
        if kind == "start" or not live:
            self.start()
            return
        request = self.draw(st.sampled_from(live))
        g, name = self.group()
        row = self.truth[request][g]
        if kind == "append":
            ids = self.ids(1, 4)
            if len(ids) == 1 and self.draw(st.booleans()):
                self.both("append", request, ids[0], group=name)
            else:
                self.both("append", request, ids, group=name)
            row += ids
        elif kind == "set" and row:
            positions = self.draw(
                st.lists(st.integers(0, len(row) - 1), min_size=1, max_size=3, unique=True)
            )
            ids = self.ids(len(positions), len(positions))
            if len(positions) == 1 and self.draw(st.booleans()):
                self.both("set", request, positions[0], ids[0], group=name)
            else:
                self.both("set", request, positions, ids, group=name)
            for p, x in zip(positions, ids, strict=True):
                row[p] = x
        elif kind == "truncate":
            length = self.draw(st.integers(0, len(row)))
            self.both("truncate", request, length, group=name)
            del row[length:]
        elif kind == "finish":
            self.both("finish", request)
            del self.truth[request]
            if self.draw(st.booleans()):
                self.start(request)  # the same id again: a new request to the worker
        elif kind == "bad":
            self.bad(request, name, row)

    def bad(self, request: Any, name: str | None, row: list[int]) -> None:
        bad = self.draw(st.sampled_from(BAD_IDS))
        n = len(row)
        case = self.draw(st.integers(0, 13))
        if case == 0:
            self.refused("append", "nobody", [1], group=name)
        elif case == 1:
            self.refused("append", request, [1], group="nogroup")
        elif case == 2:
            lists = [1] if self.groups is None else {g: [1] for g in self.groups}
            self.refused("start", request, lists)
        elif case == 3:
            self.refused("append", request, [5, bad], group=name)
        elif case == 4:
            self.refused("append", request, bad, group=name)
        elif case == 5:
            self.refused("set", request, n, 1, group=name)
        elif case == 6 and n:
            self.refused("set", request, [0, 0], [1, 2], group=name)
        elif case == 7 and n:
            self.refused("set", request, [0], [bad], group=name)
        elif case == 8 and n >= 2:
            self.refused("set", request, [1, 0], [7, 8, 9], group=name)
        elif case == 9:
            self.refused("truncate", request, self.draw(st.sampled_from([n + 1, -1, True])), name)
        elif case == 10:
            self.refused("finish", "nobody")
        elif case == 11:
            lists = [1, bad] if self.groups is None else {g: [1, bad] for g in self.groups}
            self.refused("start", "newcomer", lists)
        elif case == 12 and self.groups is not None:
            self.refused("start", "newcomer", {self.groups[0]: [1]})
        elif case == 13 and self.groups is not None:
            self.refused("append", request, [1])  # no group in a grouped recorder
        elif self.groups is None:
            self.refused("append", request, [1], group="full")  # a group in a flat one
        if case in (11, 12):
            assert "newcomer" not in self.truth
            with pytest.raises(BlockprepValueError):
                self.recorder.held("newcomer")

    def batch(self) -> list[Any]:
        live = sorted(self.truth)
        chosen = self.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
        return chosen


@pytest.mark.parametrize("groups", [None, GROUPS])
@RANDOM
@given(data=st.data())
def test_recorder_messages_rebuild_the_scheduler_lists(groups, data):
    trace = Trace(data, groups)
    worker = Worker(groups)
    lost = False
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 10))):
            trace.event()
        for request, lists in trace.truth.items():
            held = trace.recorder.held(request)
            assert held == (lists[0] if groups is None else dict(zip(groups, lists, strict=True)))
        batch = trace.batch()
        if data.draw(st.integers(0, 9)) == 0:
            with pytest.raises(BlockprepValueError):
                trace.recorder.message([*batch, "nobody"])
        message = trace.recorder.message(batch)
        assert message == trace.twin.message(batch)
        if data.draw(st.integers(0, 7)) == 0:
            lost = True  # lost on the way: the worker never sees it
            continue
        try:
            worker.apply(message, batch)
        except DeltaSequenceError:
            assert lost
            request = resync_request(worker.last)
            trace.recorder.resync(request)
            trace.twin.resync(request)
            if data.draw(st.booleans()):  # a duplicated resync request: one more whole message
                trace.recorder.resync(request)
                trace.twin.resync(request)
            lost = False
            continue
        assert not lost or message["base"] is None
        lost = False
        assert worker.rows == expected(trace.truth, batch, groups)


def test_recorder_records_kinds_and_rows():
    recorder = BlockEventRecorder()
    recorder.start("a", [1, 2])
    recorder.start("b", [])
    assert unpack(m := recorder.message(["a", "b"]), ["a", "b"]) == {
        "seq": 0,
        "base": None,
        "rows": {"a": [["w", [1, 2]]], "b": [["w", []]]},
    }
    assert len(m["data"]) == 4 * (4 + 2 + 4)
    recorder.append("b", 7)
    recorder.set("a", [1, 0], [5, 6])
    recorder.truncate("a", 1)
    recorder.start("c", [3])
    recorder.append("c", 4)  # c is new: goes whole, no append record
    assert unpack(recorder.message(["c", "b", "a"]), ["c", "b", "a"]) == {
        "seq": 1,
        "base": 0,
        "rows": {"c": [["w", [3, 4]]], "b": [["a", [7]]], "a": [["s", [1, 0], [5, 6]], ["t", 1]]},
    }
    recorder.append("a", 9)  # a leaves the batch: its record is dropped
    assert unpack(recorder.message(["b"]), ["b"])["rows"] == {}
    assert unpack(recorder.message(["a", "b"]), ["a", "b"])["rows"] == {"a": [["w", [6, 9]]]}
    recorder.resync()
    assert unpack(recorder.message(["b"]), ["b"]) == {
        "seq": 4,
        "base": None,
        "rows": {"b": [["w", [7]]]},
    }


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda r: r.append("x", [1]), r"request 'x' is not live"),
        (lambda r: r.append("a", [1], group="ori"), r"request 'a': unknown group 'ori'"),
        (lambda r: r.append("a", [1]), r"request 'a': unknown group None"),
        (lambda r: r.append("a", [1, True], "g"), r"request 'a', group 'g': block id True of"),
        (lambda r: r.append("a", 2**31, "g"), r"request 'a', group 'g': block id 2147483648 is"),
        (lambda r: r.set("a", 2, 1, "g"), r"request 'a', group 'g': position 2 is not in \[0, 2\)"),
        (lambda r: r.set("a", 1, -1, "g"), r"group 'g', position 1: block id -1 is not in"),
        (lambda r: r.set("a", [1, 1], [3, 4], "g"), r"positions \[1, 1\] repeat"),
        (lambda r: r.set("a", [1], [3, 4], "g"), r"1 positions for 2 ids"),
        (lambda r: r.truncate("a", 3, "g"), r"truncate length 3 is not an int in \[0, 2\]"),
        (lambda r: r.start("a", {"g": [], "h": []}), r"start of request 'a', which is live"),
        (lambda r: r.start("b", {"g": []}), r"groups \['g'\]; this recorder's groups are"),
        (lambda r: r.start("b", [1]), r"a grouped recorder takes \{group: ids\}"),
        (lambda r: r.start([], {}), r"request ids must be hashable"),
        (lambda r: r.finish("b"), r"finish of request 'b', which is not live"),
        (lambda r: r.message(["a", "b"]), r"batch row 1: request 'b' is not live"),
        (lambda r: r.message(["a", "a"]), r"unique within a batch"),
        (lambda r: r.message("a"), r"request_ids must be a list or tuple"),
        (lambda r: r.resync({"resync": True}), r"resync expects the worker's resync request"),
    ],
)
def test_recorder_errors_name_the_place(call, match):
    recorder = BlockEventRecorder(["g", "h"])
    recorder.start("a", {"g": [1, 2], "h": []})
    twin = BlockEventRecorder(["g", "h"])
    twin.start("a", {"g": [1, 2], "h": []})
    with pytest.raises((BlockprepValueError, BlockprepTypeError), match=match):
        call(recorder)
    assert recorder.held("a") == {"g": [1, 2], "h": []}
    assert recorder.message(["a"]) == twin.message(["a"])


# --- the differ ------------------------------------------------------------------------------


def as_form(ids: list[int], form: str) -> Any:
    return {"list": ids, "tuple": tuple(ids), "array": np.array(ids, dtype=np.int64)}[form]


@pytest.mark.parametrize("groups", [None, GROUPS])
@RANDOM
@given(data=st.data())
def test_differ_matches_block_delta_encoder(groups, data):
    trace = Trace(data, groups)  # its truth only: the scheduler's full lists
    packed, wire = PackedDeltaEncoder(groups), BlockDeltaEncoder()
    worker, wire_worker = Worker(groups), Worker(groups)
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 10))):
            trace.event()
        batch = trace.batch()
        form = data.draw(st.sampled_from(["list", "list", "tuple", "array"]))
        lists: list[Any] = [
            as_form(trace.truth[r][0], form)
            if groups is None
            else {g: as_form(ids, form) for g, ids in zip(groups, trace.truth[r], strict=True)}
            for r in batch
        ]
        if data.draw(st.integers(0, 9)) == 0:
            resync = resync_request(worker.last)
            packed.resync(resync)
            wire.reset()
        message = packed.encode(batch, lists)
        reference = wire.encode(batch, lists)
        assert message["seq"] == reference["seq"] and message["base"] == reference["base"]
        assert unpack(message, batch, groups)["rows"] == reference["rows"]
        if data.draw(st.integers(0, 7)) == 0:
            continue  # lost on the way, both
        try:
            worker.apply(message, batch)
        except DeltaSequenceError:
            with pytest.raises(DeltaSequenceError):
                wire_worker.apply(reference, batch)
            packed.resync(resync_request(worker.last))
            wire.reset()
            continue
        wire_worker.apply(reference, batch)
        truth = expected(trace.truth, batch, groups)
        assert worker.rows == truth
        assert wire_worker.rows == truth


def test_differ_chooses_as_the_wire_does():
    encoder = PackedDeltaEncoder()
    steps = [
        [1, 2, 3, 4],
        [1, 2, 3, 4, 5],  # append
        [1, 9, 3, 4, 5],  # set
        [1, 9],  # truncate
        [1, 9, 8, 7],  # append
        [1, 9, 8, 5, 6],  # truncate + append
        [4, 5, 6],  # whole
    ]
    ops = [unpack(encoder.encode(["r"], [ids]), ["r"])["rows"].get("r") for ids in steps]
    assert ops == [
        [["w", [1, 2, 3, 4]]],
        [["a", [5]]],
        [["s", [1], [9]]],
        [["t", 2]],
        [["a", [8, 7]]],
        [["t", 3], ["a", [5, 6]]],
        [["w", [4, 5, 6]]],
    ]


@pytest.mark.parametrize(
    ("ids", "lists", "error"),
    [
        (["a", "b"], [[1]], ValueError),
        (["a", "a"], [[1], [2]], ValueError),
        ("ab", [[1], [2]], TypeError),
        (["a"], [[1, 2.5]], TypeError),
        (["a"], [[1, True]], TypeError),
        (["a"], [{1, 2}], TypeError),
    ],
)
def test_differ_refuses_as_block_delta_encoder(ids, lists, error):
    with pytest.raises(error) as wire_error:
        BlockDeltaEncoder().encode(ids, lists)
    encoder = PackedDeltaEncoder()
    encoder.encode(["a"], [[1, 2]])
    with pytest.raises(error) as packed_error:
        encoder.encode(ids, lists)
    assert str(packed_error.value) == str(wire_error.value)
    twin = PackedDeltaEncoder()
    twin.encode(["a"], [[1, 2]])
    assert encoder.encode(["a"], [[1, 2, 3]]) == twin.encode(["a"], [[1, 2, 3]])


@pytest.mark.parametrize(
    ("groups", "lists", "match"),
    [
        (None, [{"g": [1]}], r"request 'a' carries grouped block lists, but this encoder is flat"),
        (["g"], [[1]], r"carries flat block lists, but this encoder's groups are \['g'\]"),
        (["g"], [{"h": [1]}], r"carries groups \['h'\], but this encoder's groups are \['g'\]"),
        (None, [[1, 2**31]], r"request 'a': block id 2147483648 is not in \[0, 2147483648\)"),
        (["g"], [{"g": [-1]}], r"request 'a', group 'g': block id -1 is not in"),
    ],
)
def test_differ_refuses_other_shapes_and_ranges(groups, lists, match):
    encoder = PackedDeltaEncoder(groups)
    with pytest.raises(BlockprepValueError, match=match):
        encoder.encode(["a"], lists)
    assert encoder.encode([], [])["base"] is None  # the refused step was not counted


def test_differ_keeps_copies_and_resyncs():
    encoder = PackedDeltaEncoder()
    ids = [1, 2]
    encoder.encode(["a"], [ids])
    ids.append(3)  # the scheduler's list, mutated in place
    assert unpack(encoder.encode(["a"], [ids]), ["a"])["rows"] == {"a": [["a", [3]]]}
    assert unpack(encoder.encode(["a"], [ids]), ["a"])["rows"] == {}
    encoder.resync(resync_request(2))
    m = encoder.encode(["a"], [ids])
    assert (m["seq"], m["base"]) == (3, None)
    assert unpack(m, ["a"])["rows"] == {"a": [["w", [1, 2, 3]]]}
    with pytest.raises(BlockprepValueError, match="resync expects"):
        encoder.resync({"resync": True, "applied": "3"})


# --- on schedulers ---------------------------------------------------------------------------


def deepseek_sim(recorder: BlockEventRecorder | None, seed: int) -> DeepSeekV4SchedulerSim:
    return DeepSeekV4SchedulerSim(
        ranks=2,
        decode_batch=4,
        max_seq_len=2048,
        seed=seed,
        join_probability=0.5,
        leave_probability=0.05,
        prompt_lengths=(1, 1500),
        max_advance=3,
        shuffle=True,
        recorder=recorder,
    )


def snapshot(batch: Any) -> tuple[Any, ...]:
    return (
        batch.request_ids,
        batch.token_ids.tolist(),
        batch.prev_token_ids.tolist(),
        batch.seq_lens.tolist(),
        batch.cache_partitions,
        [{g: list(ids) for g, ids in lists.items()} for lists in batch.block_ids_by_group],
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_deepseek_sim_with_a_recorder(seed):
    recorder = BlockEventRecorder(DS_GROUPS)
    sim, plain = deepseek_sim(recorder, seed), deepseek_sim(None, seed)
    worker, differ_worker = Worker(DS_GROUPS), Worker(DS_GROUPS)
    differ = PackedDeltaEncoder(DS_GROUPS)
    rng = random.Random(seed)
    for step in range(400):
        batch = sim.step()
        assert snapshot(batch) == snapshot(plain.step())  # the recorder changes nothing
        lists = dict(zip(batch.request_ids, batch.block_ids_by_group, strict=True))
        differ_worker.apply(
            differ.encode(batch.request_ids, batch.block_ids_by_group), batch.request_ids
        )
        assert differ_worker.rows == lists
        message = recorder.message(batch.request_ids)
        if step % 97 == 50:
            continue  # lost: the next message is refused, the worker asks for a resync
        try:
            worker.apply(message, batch.request_ids)
        except DeltaSequenceError:
            recorder.resync(resync_request(worker.last))
            continue
        assert worker.rows == lists
        if rng.random() < 0.02:
            recorder.resync()


class PagedScheduler:
    """A paged (Qwen-style) KV manager: 16-token pages from a free list; requests decode 1-4
    tokens (speculative: the rejected tail rolled back, its pages truncated), get preempted (pages
    freed, back later with their pages recomputed) and finish. Calls a flat recorder where it
    acts; ``pages`` is the truth."""

    PAGE = 16

    def __init__(self, recorder: BlockEventRecorder, seed: int) -> None:
        self.rng = random.Random(seed)
        self.recorder = recorder
        self.free = list(range(4096))
        self.rng.shuffle(self.free)
        self.tokens: dict[str, int] = {}
        self.pages: dict[str, list[int]] = {}
        self.waiting: dict[str, int] = {}  # preempted: tokens to recompute
        self.counter = 0

    def admit(self, request: str, tokens: int) -> None:
        pages = [self.free.pop() for _ in range(-(-tokens // self.PAGE))]
        self.tokens[request], self.pages[request] = tokens, pages
        self.recorder.start(request, pages)

    def grow(self, request: str, tokens: int) -> None:
        self.tokens[request] = tokens
        pages = self.pages[request]
        while len(pages) * self.PAGE < tokens:
            pages.append(self.free.pop())
            self.recorder.append(request, pages[-1])
        keep = -(-tokens // self.PAGE)
        if keep < len(pages):
            self.free += pages[keep:]
            del pages[keep:]
            self.recorder.truncate(request, keep)

    def drop(self, request: str) -> None:
        self.free += self.pages.pop(request)
        del self.tokens[request]
        self.recorder.finish(request)

    def step(self) -> list[str]:
        rng = self.rng
        for request in list(self.pages):
            roll = rng.random()
            if roll < 0.03:
                self.drop(request)
            elif roll < 0.06:
                self.waiting[request] = self.tokens[request]
                self.drop(request)
            else:
                drafted = self.tokens[request] + rng.randint(1, 4)
                self.grow(request, drafted)
                self.grow(request, drafted - rng.randint(0, 3))  # rejected drafts rolled back
        for request in list(self.waiting):
            if rng.random() < 0.3:
                self.admit(request, self.waiting.pop(request))
        while len(self.pages) < 12 and rng.random() < 0.7:
            self.counter += 1
            self.admit(f"q{self.counter}", rng.randint(1, 300))
        batch = list(self.pages)
        rng.shuffle(batch)
        return batch


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paged_scheduler_with_a_recorder(seed):
    recorder = BlockEventRecorder()
    scheduler = PagedScheduler(recorder, seed)
    worker = Worker(None)
    for _ in range(300):
        batch = scheduler.step()
        worker.apply(recorder.message(batch), batch)
        assert worker.rows == {r: scheduler.pages[r] for r in batch}


def test_payload_is_little_endian_on_any_host(monkeypatch):
    def made(swap: bool) -> bytes:
        monkeypatch.setattr(events.common, "_SWAP", swap)
        recorder = BlockEventRecorder()
        recorder.start("a", [1, 2**31 - 1])
        return recorder.message(["a"])["data"]

    native = made(False)
    assert native == np.array([1, 0, 0, 2, 1, 2**31 - 1], dtype="<i4").tobytes()
    swapped = np.frombuffer(native, dtype="<i4").astype(">i4").tobytes()
    assert made(True) == swapped  # what a big-endian host's native words become


@pytest.mark.parametrize("groups", [None, GROUPS])
@RANDOM
@given(data=st.data())
def test_recorder_messages_of_a_steady_batch(groups, data):
    """A batch that keeps its length and changes a few rows a step (a request replaced, two
    swapped, one finished and started again under its id), as a scheduler's does: the recorder
    places it from the last message's placement; the worker's lists equal the scheduler's after
    every message, a stale or repeated id is refused (the first row not live named) and changes
    nothing."""
    trace = Trace(data, groups)
    worker = Worker(groups)
    for _ in range(data.draw(st.integers(2, 8))):
        trace.start()
    batch = sorted(trace.truth)
    for _ in range(data.draw(st.integers(1, 14))):
        for _ in range(data.draw(st.integers(0, 4))):
            kind = data.draw(st.sampled_from(["event", "restart", "finish"]))
            request = data.draw(st.sampled_from(batch))
            if kind == "event":
                trace.event()
            elif request in trace.truth:
                trace.both("finish", request)
                del trace.truth[request]
                if kind == "restart":
                    trace.start(request)  # the same id at the same row: a new request
        change = data.draw(st.sampled_from(["keep", "replace", "swap", "stale", "repeat"]))
        row = data.draw(st.integers(0, len(batch) - 1))
        if change == "replace":
            trace.start()
            batch[row] = f"r{trace.counter}"
        elif change == "swap":
            other = data.draw(st.integers(0, len(batch) - 1))
            batch[row], batch[other] = batch[other], batch[row]
        elif change == "repeat" and len(batch) > 1:
            bad = list(batch)
            bad[row] = bad[row - 1]
            if all(r in trace.truth for r in bad):
                with pytest.raises(BlockprepValueError, match="unique"):
                    trace.recorder.message(bad)
        stale = [r for r, request in enumerate(batch) if request not in trace.truth]
        if stale:
            with pytest.raises(BlockprepValueError, match=f"batch row {stale[0]}: request"):
                trace.recorder.message(list(batch))
            for r in stale:  # the scheduler replaces what finished
                trace.start()
                batch[r] = f"r{trace.counter}"
        message = trace.recorder.message(list(batch))
        assert message == trace.twin.message(list(batch))
        worker.apply(message, batch)
        assert worker.rows == expected(trace.truth, batch, groups)
