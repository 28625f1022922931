"""The vLLM facade's ``apply_packed`` against ``apply_step``, vLLM's own table and the reference.

A vLLM-like scheduler (below, independent of blockprep) produces each step's finished, appended
and added rows, a few in-place edits (ids set at positions, a truncation), resyncs, and the moves
that close the gaps. One facade applies each step through ``apply_step``, another through
``apply_packed`` of the step packed here, with a few lines written from the documented format
(docs/integration.md 9.1), not with ``blockprep.packed.pack``. After every step both facades'
host tables, device tables and counts must be identical, equal to vLLM's table ported
(``tests/vllm_port.py``: same counts, same ids below them) and to a rebuild of the
scheduler's own lists through ``blockprep.reference``. Bad messages (a negative id, a position
or truncation past a row, too many blocks, a flipped bit, a cut payload, a wrong base, a group
or row out of range) must be refused with nothing written, compared byte for byte.

Run it with ``BLOCKPREP_PURE_PYTHON=1`` too: the twin kernel must give the same results.
"""

from __future__ import annotations

import pickle
import random
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_port import PortTable

from blockprep import reference
from blockprep.adapters.vllm import VllmBlockTable, VllmMultiGroupBlockTable
from blockprep.wire import DeltaMessageError, DeltaSequenceError

WHOLE, APPEND, SET, TRUNCATE = 1, 2, 3, 4


def pack(seq: int, base: int | None, records: list[tuple[int, int, int, list[int]]]) -> dict:
    """A packed message from the documented format: per record the words ``kind, group, row,
    n`` then its values (a set: ``n`` positions then ``n`` ids; a truncate: none, ``n`` the
    length kept), little-endian int32; ``crc`` over the header's text, then the payload."""
    words: list[int] = []
    for kind, group, row, values in records:
        if kind == TRUNCATE:
            words += [kind, group, row, values[0]]
        else:
            n = len(values) // 2 if kind == SET else len(values)
            words += [kind, group, row, n, *values]
    data = struct.pack(f"<{len(words)}i", *words)
    count = len(records)
    crc = zlib.crc32(data, zlib.crc32(f"1 {seq} {base} {count}".encode()))
    return {"v": 1, "seq": seq, "base": base, "count": count, "crc": crc, "data": data}


def resealed(message: dict, data: bytes, count: int | None = None) -> dict:
    """``message`` with another payload and a checksum that fits it (a well-sealed bad one)."""
    count = message["count"] if count is None else count
    seq, base = message["seq"], message["base"]
    crc = zlib.crc32(data, zlib.crc32(f"1 {seq} {base} {count}".encode()))
    return dict(message, data=data, count=count, crc=crc)


@dataclass
class Step:
    """One scheduler step: what a vLLM worker gets (``edits``: the packed path's in-place records,
    which ``apply_step`` receives as ``added``), and each group's rows once it is applied, before
    its moves."""

    finished: list[int] = field(default_factory=list)
    appended: dict[int, list[list[int]] | None] = field(default_factory=dict)
    added: dict[int, list[list[int]]] = field(default_factory=dict)
    edits: dict[int, list[tuple[int, int, list[int]]]] = field(default_factory=dict)  # packed only
    moves: list[tuple[int, int]] = field(default_factory=list)
    num_reqs: int = 0
    resync: bool = False
    before: list[list[list[int]]] = field(default_factory=list)  # each group's rows, pre-moves


class Scheduler:
    """A vLLM-like scheduler and its mirror of every table row (what each group's row holds)."""

    def __init__(
        self, rows: int, block_sizes: list[int], widths: list[int], seed: int, churn: float
    ) -> None:
        self.rng = random.Random(seed)
        self.rows, self.block_sizes, self.widths, self.churn = rows, block_sizes, widths, churn
        self.groups = len(block_sizes)
        self.held: list[list[list[int]]] = [[[] for _ in range(rows)] for _ in block_sizes]
        self.tokens: list[int | None] = [None] * rows  # None: no live request in the row
        self.limit = [0] * rows
        self.next_id = 1

    def _ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        if self.next_id > 2**31 - 1000:
            self.next_id = 1
        return ids

    def _blocks(self, g: int, tokens: int) -> int:
        return -(-tokens // self.block_sizes[g])

    def _max_tokens(self) -> int:
        return min(w * b for w, b in zip(self.widths, self.block_sizes, strict=True))

    def step(self) -> Step:
        rng, step = self.rng, Step()
        live = [r for r in range(self.rows) if self.tokens[r] is not None]
        for r in live:
            tokens = self.tokens[r]
            assert tokens is not None
            if rng.random() < self.churn or tokens >= self.limit[r]:
                step.finished.append(r)
                self.tokens[r] = None
                for g in range(self.groups):
                    self.held[g][r] = []
        for r in live:
            tokens = self.tokens[r]
            if tokens is None:
                continue
            roll = rng.random()
            if roll < 0.05:  # preempted and resumed: its lists anew
                self.tokens[r] = tokens = min(rng.randint(1, tokens), self.limit[r])
                lists = [self._ids(self._blocks(g, tokens)) for g in range(self.groups)]
                step.added[r] = lists
                for g in range(self.groups):
                    self.held[g][r] = list(lists[g])
            elif roll < 0.10:  # in place: a block replaced, or a tail dropped and grown again
                edits = []
                for g in range(self.groups):
                    held = self.held[g][r]
                    if held and rng.random() < 0.5:
                        p = rng.randrange(len(held))
                        (x,) = self._ids(1)
                        edits.append((SET, g, [p, x]))
                        held[p] = x
                    elif held:
                        keep = rng.randrange(len(held) + 1)
                        edits.append((TRUNCATE, g, [keep]))
                        grown = self._ids(len(held) - keep)
                        edits.append((APPEND, g, grown))
                        self.held[g][r] = held[:keep] + grown
                step.edits[r] = edits
            else:  # decoding: a token or a few, a block where a boundary is crossed
                new = min(tokens + rng.randint(1, 24), self.limit[r])
                self.tokens[r] = new
                grown_lists = [
                    self._ids(self._blocks(g, new) - self._blocks(g, tokens))
                    for g in range(self.groups)
                ]
                if any(grown_lists) or rng.random() < 0.3:
                    step.appended[r] = grown_lists if any(grown_lists) else None
                for g in range(self.groups):
                    self.held[g][r] += grown_lists[g]
        free = [r for r in range(self.rows) if self.tokens[r] is None]
        arrivals = rng.randint(0, max(1, len(free) // 2)) if free else 0
        for r in free[:arrivals]:
            limit = rng.randint(1, self._max_tokens())
            self.limit[r] = limit
            self.tokens[r] = tokens = rng.randint(1, limit)
            lists = [self._ids(self._blocks(g, tokens)) for g in range(self.groups)]
            step.added[r] = lists
            for g in range(self.groups):
                self.held[g][r] = list(lists[g])
        step.before = [[list(row) for row in rows] for rows in self.held]
        while True:  # condense: the last live row into the lowest gap
            live = [r for r in range(self.rows) if self.tokens[r] is not None]
            holes = [r for r in range(len(live)) if self.tokens[r] is None]
            if not holes:
                break
            src, tgt = live[-1], holes[0]
            step.moves.append((src, tgt))
            self.tokens[tgt], self.limit[tgt] = self.tokens[src], self.limit[src]
            self.tokens[src] = None
            for g in range(self.groups):
                self.held[g][tgt] = list(self.held[g][src])  # the source keeps its cells
        step.num_reqs = sum(t is not None for t in self.tokens)
        step.resync = rng.random() < 0.03
        return step


def records_of(step: Step, groups: int, rng: random.Random) -> list[Any]:
    """The step's records (each row's in order, rows interleaved at random): finished rows
    truncated to 0, appends, wholes, edits; a resync step names each row it touched whole (what
    the row holds before the moves)."""
    per_row: dict[int, list[tuple[int, int, int, list[int]]]] = {}
    if step.resync:
        for r in sorted({*step.finished, *step.appended, *step.added, *step.edits}):
            per_row[r] = [(WHOLE, g, r, step.before[g][r]) for g in range(groups)]
    else:
        for r in step.finished:
            per_row.setdefault(r, []).extend((TRUNCATE, g, r, [0]) for g in range(groups))
        for r, lists in step.appended.items():
            if lists is not None:
                per_row.setdefault(r, []).extend(
                    (APPEND, g, r, ids) for g, ids in enumerate(lists) if ids
                )
        for r, lists in step.added.items():
            per_row.setdefault(r, []).extend((WHOLE, g, r, ids) for g, ids in enumerate(lists))
        for r, edits in step.edits.items():
            per_row.setdefault(r, []).extend((kind, g, r, values) for kind, g, values in edits)
    queues = [list(records) for records in per_row.values()]
    out = []
    while queues:
        queue = rng.choice(queues)
        out.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return out


def step_args(step: Step, g: int | None) -> dict[str, Any]:
    """``apply_step``'s arguments for the step (``g``: one group's, ``None``: every group's);
    rows edited in place, and a resync's rows, go as ``added`` with what they then hold."""

    def lists(r: int) -> Any:
        whole = [rows[r] for rows in step.before]
        return whole if g is None else whole[g]

    def pick(value: Any) -> Any:
        return value if g is None or value is None else value[g]

    added = {r: pick(ids) for r, ids in step.added.items()}
    appended = {r: pick(ids) for r, ids in step.appended.items()}
    for r in step.edits:
        added[r] = lists(r)
    if step.resync:
        for r in step.appended:
            added[r] = lists(r)
        appended = {}
    return {
        "finished": list(step.finished),
        "appended": appended,
        "added": added,
        "moves": list(step.moves),
        "num_reqs": step.num_reqs,
    }


# --- the facades, side by side -------------------------------------------------------------------


def make(rows: int, block_sizes: list[int], widths: list[int]) -> Any:
    if len(block_sizes) == 1:  # verify mode on (both): every call checked against the lists
        return VllmBlockTable(block_sizes[0], rows, widths[0], 64, separate=True, verify=True)
    return VllmMultiGroupBlockTable(
        rows, 4096, 64, False, "cpu", block_sizes, max_num_blocks=widths, separate=True, verify=True
    )


def groups_of(facade: Any) -> list[VllmBlockTable]:
    return [facade] if isinstance(facade, VllmBlockTable) else list(facade.block_tables)


def snapshot(facade: Any) -> tuple[Any, ...]:
    """Every byte a refused message must leave as it was (host, device, counts, cursor)."""
    return (
        *(
            (
                t.get_numpy_array().tobytes(),
                t.get_device_tensor().numpy().tobytes(),
                t.num_blocks_per_row.tobytes(),
                t.table.stats,
            )
            for t in groups_of(facade)
        ),
        facade.resync_request(),
    )


class Trace:
    """One scheduler driving a facade by ``apply_step``, one by ``apply_packed`` and vLLM's
    table (ported, one per group), compared after every step."""

    def __init__(self, rows: int, block_sizes: list[int], seed: int, churn: float = 0.05) -> None:
        self.by_step = make(rows, block_sizes, _widths(block_sizes))
        self.by_packed = make(rows, block_sizes, _widths(block_sizes))
        self.widths = [t.max_num_blocks_per_req for t in groups_of(self.by_packed)]
        self.sched = Scheduler(rows, block_sizes, self.widths, seed, churn)
        self.ports = [
            PortTable(b, rows, w, 64) for b, w in zip(block_sizes, self.widths, strict=True)
        ]
        self.rng = random.Random(seed + 1)
        self.multi = len(block_sizes) > 1
        self.last: int | None = None
        self.seq = 0
        self.message: dict | None = None
        self.refused = 0

    def run(self, steps: int, bad: float = 0.0) -> None:
        for _ in range(steps):
            self.one(bad)

    def one(self, bad: float) -> None:
        step = self.sched.step()
        base = None if self.last is None or step.resync else self.last
        if base is None:
            step.resync = True
        records = records_of(step, self.sched.groups, self.rng)
        message = pack(self.seq, base, records)
        if self.rng.random() < bad:
            self.refuse(message, records, step)
        if self.multi:
            self.by_step.apply_step(**step_args(step, None))
        else:
            self.by_step.apply_step(**step_args(step, 0))
        wired = pickle.loads(pickle.dumps(message))  # as a queue delivers it
        self.by_packed.apply_packed(wired, moves=list(step.moves), num_reqs=step.num_reqs)
        self.message = message
        self.last = self.seq
        self.seq += 1
        for g, port in enumerate(self.ports):
            args = step_args(step, g)
            for r in args["finished"]:
                port.clear_row(r)
            for r, ids in args["appended"].items():
                if ids:
                    port.append_row(ids, r)
            for r, ids in args["added"].items():
                port.add_row(ids, r)
            for src, tgt in args["moves"]:
                port.move_row(src, tgt)
            port.commit_block_table(step.num_reqs)
        self.check(step.num_reqs)

    def check(self, num_reqs: int) -> None:
        assert self.by_packed.resync_request() == {"resync": True, "applied": self.last}
        for g, (a, b, port) in enumerate(
            zip(groups_of(self.by_step), groups_of(self.by_packed), self.ports, strict=True)
        ):
            host = b.get_numpy_array()
            assert np.array_equal(a.get_numpy_array(), host), g
            assert np.array_equal(a.num_blocks_per_row, b.num_blocks_per_row), g
            device = b.get_device_tensor(num_reqs)
            assert np.array_equal(a.get_device_tensor(num_reqs).numpy(), device.numpy()), g
            rebuilt = reference.block_table_per_row(
                self.sched.held[g], max_blocks=self.widths[g], pad=0
            )
            assert np.array_equal(host, rebuilt.numpy()), g
            counts = b.num_blocks_per_row
            assert np.array_equal(counts, port.num_blocks_per_row), g
            port_host, port_device = port.np, port.device
            for r in range(len(counts)):
                n = int(counts[r])
                assert np.array_equal(host[r, :n], port_host[r, :n]), (g, r)
                assert not host[r, n:].any(), (g, r)
                if r < num_reqs:
                    assert np.array_equal(device[r, :n], port_device[r, :n]), (g, r)

    def refuse(self, message: dict, records: list[Any], step: Step) -> None:
        """A bad form of ``message`` (or an old one) is refused with nothing written."""
        before = snapshot(self.by_packed)
        bad, error, match = self.bad_message(message, records)
        with pytest.raises(error, match=match):
            self.by_packed.apply_packed(bad, moves=list(step.moves), num_reqs=step.num_reqs)
        assert snapshot(self.by_packed) == before
        self.refused += 1

    def bad_message(self, message: dict, records: list[Any]) -> tuple[dict, Any, str]:
        rng, groups = self.rng, self.sched.groups
        rows = self.sched.rows
        g = groups - 1  # the last group: the others' records are good
        touched = {record[2] for record in records}
        counts = groups_of(self.by_packed)[g].num_blocks_per_row
        quiet = [r for r in range(rows) if r not in touched]
        with_ids = [r for r in quiet if counts[r] > 0]
        kinds = ["flip", "cut", "base", "group", "row"]
        if self.message is not None and self.message["base"] is not None:
            kinds.append("replay")  # a whole message (base None) may come again: not this
        if quiet:
            kinds += ["negative", "truncate", "too-many"]
        if with_ids:
            kinds.append("position")
        kind = rng.choice(kinds)
        prefix = rf"^KV cache group {g}: " if self.multi else "^"

        def plus(record: tuple[int, int, int, list[int]]) -> dict:
            return pack(message["seq"], message["base"], [*records, record])

        if kind == "flip":
            data = bytearray(message["data"] or b"\0\0\0\0")
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
            return dict(message, data=bytes(data)), DeltaMessageError, "fails its checksum"
        if kind == "cut":
            if not message["data"]:
                return resealed(message, b"", 1), DeltaMessageError, "says 1 records, holds 0"
            data = message["data"][: -4 * rng.randint(1, 2)]
            return resealed(message, data), DeltaMessageError, "truncated|says"
        if kind == "base":
            bad = pack(message["seq"] + 5, (self.last or 0) + 3, records)
            return bad, DeltaSequenceError, "but the worker last applied"
        if kind == "replay":
            assert self.message is not None
            return self.message, DeltaSequenceError, "but the worker last applied"
        if kind == "group":
            return plus((APPEND, groups, 0, [1])), DeltaMessageError, rf"group {groups} not in"
        if kind == "row":
            return plus((APPEND, 0, rows, [1])), DeltaMessageError, rf"row {rows} not in"
        if message["base"] is None and kind != "negative":
            # a resync: a record on a row it does not name must start whole
            r = rng.choice(quiet)
            text = rf"must come with its whole list \(block-table row {r}\)"
            return (
                plus((APPEND, g, r, [1])),
                DeltaMessageError,
                prefix + "a request new to the worker " + text,
            )
        if kind == "negative":
            r = rng.choice(quiet)
            value = -rng.randint(1, 2**31)
            return (
                plus((WHOLE, g, r, [5, value, 6])),
                ValueError,
                prefix + rf"block IDs must not be negative \(block-table row {r}, id {value}\)",
            )
        if kind == "truncate":
            r = rng.choice(quiet)
            n = int(counts[r])
            return (
                plus((TRUNCATE, g, r, [n + 1])),
                DeltaMessageError,
                prefix + rf"truncate length {n + 1} is not an int in \[0, {n}\] "
                rf"\(block-table row {r}\)",
            )
        if kind == "too-many":
            r = rng.choice(quiet)
            n, width = int(counts[r]), self.widths[g]
            return (
                plus((APPEND, g, r, list(range(1, width - n + 2)))),
                ValueError,
                prefix + rf"row {r} has {width + 1} blocks, maximum is {width}",
            )
        r = rng.choice(with_ids)
        n = int(counts[r])
        return (
            plus((SET, g, r, [n, 7])),
            DeltaMessageError,
            prefix + rf"position {n} is not an int in \[0, {n}\) \(block-table row {r}\)",
        )


def _widths(block_sizes: list[int]) -> list[int]:
    return [max(4, 1024 // b) for b in block_sizes]


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_trace_packed_equals_apply_step_vllm_and_reference(seed: int) -> None:
    trace = Trace(rows=24, block_sizes=[16], seed=seed, churn=0.04)
    trace.run(250, bad=0.25)
    assert trace.refused > 20


@pytest.mark.parametrize("seed", [0, 1])
def test_long_trace_multi_group(seed: int) -> None:
    trace = Trace(rows=16, block_sizes=[16, 64, 32], seed=seed, churn=0.06)
    trace.run(200, bad=0.25)
    assert trace.refused > 20


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 12),
    block_sizes=st.sampled_from([[16], [4], [16, 8], [128, 16, 64]]),
    churn=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_any_trace_packed_equals_apply_step(
    seed: int, rows: int, block_sizes: list[int], churn: float
) -> None:
    Trace(rows, block_sizes, seed, churn).run(30, bad=0.3)


def _facade() -> VllmBlockTable:
    table = VllmBlockTable(16, max_num_reqs=4, max_num_blocks_per_req=6, max_num_batched_tokens=8)
    table.apply_packed(pack(0, None, [(WHOLE, 0, 0, [7, 3]), (WHOLE, 0, 1, [5, 6, 9])]))
    return table


def test_records_mean_vllms_calls_then_moves_and_commit() -> None:
    table = VllmBlockTable(
        16, max_num_reqs=4, max_num_blocks_per_req=6, max_num_batched_tokens=8, separate=True
    )
    table.apply_packed(pack(0, None, [(WHOLE, 0, 0, [7, 3]), (WHOLE, 0, 1, [5, 6, 9])]))
    records = [
        (APPEND, 0, 0, [4]),  # append_row([4], 0)
        (TRUNCATE, 0, 1, [0]),  # clear_row(1)
        (WHOLE, 0, 2, [8, 2]),  # add_row([8, 2], 2)
        (SET, 0, 2, [1, 11]),  # then its position 1 holds 11
    ]
    table.apply_packed(pack(1, 0, records), moves=[(2, 1)], num_reqs=2)
    assert table.get_numpy_array().tolist() == [
        [7, 3, 4, 0, 0, 0],
        [8, 11, 0, 0, 0, 0],
        [8, 11, 0, 0, 0, 0],  # a move's source keeps its blocks, as in vLLM
        [0, 0, 0, 0, 0, 0],
    ]
    assert table.num_blocks_per_row.tolist() == [3, 2, 2, 0]
    assert table.get_device_tensor(2).tolist() == [[7, 3, 4, 0, 0, 0], [8, 11, 0, 0, 0, 0]]
    assert table.resync_request() == {"resync": True, "applied": 1}


BAD = [
    (
        (APPEND, 0, 1, [2, -4]),
        ValueError,
        "block IDs must not be negative (block-table row 1, id -4)",
    ),
    ((APPEND, 0, 1, [1, 2, 3, 4]), ValueError, "row 1 has 7 blocks, maximum is 6"),
    ((WHOLE, 0, 3, list(range(7))), ValueError, "row 3 has 7 blocks, maximum is 6"),
    (
        (TRUNCATE, 0, 0, [3]),
        DeltaMessageError,
        "truncate length 3 is not an int in [0, 2] (block-table row 0)",
    ),
    (
        (SET, 0, 0, [2, 8]),
        DeltaMessageError,
        "position 2 is not an int in [0, 2) (block-table row 0)",
    ),
    ((SET, 0, 0, [0, 0, 8, 9]), DeltaMessageError, "positions [0, 0] repeat (block-table row 0)"),
    (
        (APPEND, 0, 4, [1]),
        DeltaMessageError,
        "packed record 1: row 4 not in the batch's 4 requests",
    ),
    ((APPEND, 1, 0, [1]), DeltaMessageError, "packed record 1: group 1 not in [0, 1)"),
]


@pytest.mark.parametrize(("record", "error", "text"), BAD)
def test_a_bad_record_is_refused_by_name_with_nothing_written(
    record: Any, error: type[Exception], text: str
) -> None:
    table = _facade()
    before = snapshot(table)
    good = (APPEND, 0, 2, [4])  # in the same message: not written either
    with pytest.raises(error) as raised:
        table.apply_packed(pack(1, 0, [good, record]), num_reqs=2)
    assert str(raised.value) == text
    assert snapshot(table) == before
    table.apply_packed(pack(1, 0, [good]))  # the same seq, well formed: applied
    assert table.num_blocks_per_row.tolist() == [2, 3, 1, 0]


def test_a_damaged_or_out_of_sequence_message_is_refused_with_nothing_written() -> None:
    table = _facade()
    before = snapshot(table)
    message = pack(1, 0, [(APPEND, 0, 0, [4])])
    flipped = dict(message, data=b"\x03" + message["data"][1:])
    cut = resealed(message, message["data"][:-4])
    cases = [
        (flipped, DeltaMessageError, "packed block delta message 1 fails its checksum"),
        (cut, DeltaMessageError, "packed record 0 is truncated: it needs 5 words, 4 left"),
        (dict(message, v=2), DeltaMessageError, "version 2; this worker reads 1"),
        (pack(2, 1, [(APPEND, 0, 0, [4])]), DeltaSequenceError, "the worker last applied 0"),
        (pack(0, 0, [(APPEND, 0, 0, [4])]), DeltaSequenceError, "seq must be after its base"),
        (pack(1, None, [(APPEND, 0, 0, [4])]), DeltaMessageError, "must come with its whole"),
    ]
    for bad, error, text in cases:
        with pytest.raises(error, match=re.escape(text)):
            table.apply_packed(bad)
        assert snapshot(table) == before
        assert table.resync_request() == {"resync": True, "applied": 0}
    for moves, error in (([(0, 4)], IndexError), ([(0, "1")], TypeError)):
        with pytest.raises(error):
            table.apply_packed(message, moves=moves)
        assert snapshot(table) == before
    with pytest.raises(ValueError, match=re.escape("num_reqs must be in [0, 4], got 5")):
        table.apply_packed(message, num_reqs=5)
    assert snapshot(table) == before
    table.apply_packed(message)
    assert table.num_blocks_per_row.tolist() == [3, 3, 0, 0]


def test_an_invalidated_row_takes_a_whole_record_only() -> None:
    table = _facade()
    table.table.invalidate(1)
    before = snapshot(table)
    with pytest.raises(DeltaMessageError, match=re.escape("whole list (block-table row 1)")):
        table.apply_packed(pack(1, 0, [(APPEND, 0, 1, [4])]))
    assert snapshot(table) == before
    table.apply_packed(pack(1, 0, [(WHOLE, 0, 1, [4]), (APPEND, 0, 1, [2])]))
    assert table.get_numpy_array()[1].tolist() == [4, 2, 0, 0, 0, 0]


def test_multi_group_plans_every_group_before_writing_any() -> None:
    table = VllmMultiGroupBlockTable(4, 256, 8, False, "cpu", [16, 32], max_num_blocks=[16, 8])
    whole = [(WHOLE, g, r, [10 * r + g + 1]) for r in range(2) for g in range(2)]
    table.apply_packed(pack(0, None, whole), num_reqs=2)
    before = snapshot(table)
    records = [(APPEND, 0, 0, [5]), (APPEND, 1, 0, [6]), (TRUNCATE, 1, 1, [2])]
    with pytest.raises(DeltaMessageError) as raised:
        table.apply_packed(pack(1, 0, records), moves=[(1, 0)], num_reqs=2)
    assert str(raised.value) == (
        "KV cache group 1: truncate length 2 is not an int in [0, 1] (block-table row 1)"
    )
    assert snapshot(table) == before
    table.apply_packed(pack(1, 0, records[:2]), moves=[(1, 2)], num_reqs=3)
    assert table[0].get_numpy_array()[:3, :3].tolist() == [[1, 5, 0], [11, 0, 0], [11, 0, 0]]
    assert table[1].get_numpy_array()[:3, :3].tolist() == [[2, 6, 0], [12, 0, 0], [12, 0, 0]]
    assert table.resync_request() == {"resync": True, "applied": 1}


def test_block_table_apply_packed_with_and_without_a_cursor() -> None:
    from blockprep import BlockTable
    from blockprep.wire import DeltaCursor

    paged = BlockTable(3, 4, kind="paged", pad=-1, verify=True)
    assert paged.apply_packed(pack(5, 4, [(WHOLE, 0, 2, [1, 2])])) == 2  # no cursor: no order
    cursor = DeltaCursor()
    paged.apply_packed(pack(0, None, [(WHOLE, 0, 0, [3])]), cursor)
    with pytest.raises(DeltaSequenceError):
        paged.apply_packed(pack(2, 1, [(WHOLE, 0, 0, [3])]), cursor)
    paged.apply_packed(pack(1, 0, [(APPEND, 0, 0, [4]), (SET, 0, 2, [0, 9])]), cursor)
    assert cursor.last == 1
    expected = reference.block_table_per_row([[3, 4], [], [9, 2]], max_blocks=4, pad=-1)
    assert paged.numpy().tolist() == expected.tolist()
    ring = BlockTable(2, 6, kind="ring", pad=0)
    ring.apply_packed(pack(0, None, [(WHOLE, 0, 0, [1, 2, 3]), (SET, 0, 0, [1, 7])]))
    assert (
        ring.numpy()[0].tolist()
        == reference.ring_block_table_repeat([[1, 7, 3]], max_blocks=6)[0].tolist()
    )
    with pytest.raises(ValueError, match=re.escape("ring block-table row 0 has no allocated")):
        ring.apply_packed(pack(1, 0, [(TRUNCATE, 0, 0, [0])]))
    assert ring.cached_ids(0) == [1, 7, 3]
