"""Packed block-delta messages (:mod:`blockprep.packed`) applied by the preparers in place.

The engine state machine of ``test_deepseek_delta`` runs again with every message packed into
int32 records by an independent converter written here from the documented format (not by
``blockprep.packed``), carried through a pickle round trip and read in place by the table
kernel; every accepted step is checked against the reference rebuild, every rejected one for
byte-identical buffers. Scheduler traces compare packed messages with full lists step by step,
with corrupted messages (a flipped bit, a cut payload) refused with nothing written, and the
resync that follows. Bad records name the request, group and value as the wire ops' do.
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from test_deepseek_delta import (
    GROUP_IDS,
    DeepSeekDeltaEngine,
    assert_equal,
    assert_unchanged,
    engine_settings,
    fresh_preparer,
    rebuild,
    small_batch,
    tables_of,
)
from test_deepseek_state import LAYOUT

from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.deepseek.layout import GROUP_NAMES
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.vllm import VllmBlockTable
from blockprep.batch import DecodeBatch
from blockprep.reference import QwenDecodePrep97
from blockprep.testing import DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder, DeltaMessageError, DeltaSequenceError

KINDS = {"w": 1, "a": 2, "s": 3, "t": 4}


def packed_from_words(seq: int, base: int | None, count: int, words: list[int]) -> dict[str, Any]:
    """The documented message: little-endian int32 words, CRC-32 of ``"1 seq base count"`` then
    of the payload."""
    data = struct.pack(f"<{len(words)}i", *words)
    crc = zlib.crc32(data, zlib.crc32(f"1 {seq} {base} {count}".encode()))
    return {"v": 1, "seq": seq, "base": base, "count": count, "crc": crc, "data": data}


def to_packed(
    message: dict[str, Any], request_ids: Sequence[Any], groups: Sequence[str] | None
) -> dict[str, Any]:
    """A :mod:`blockprep.wire` message as the packed one standing for it (``ValueError`` for an
    id outside int32, which no record can carry)."""
    words: list[int] = []
    count = 0
    for request, entry in message["rows"].items():
        row = list(request_ids).index(request)
        by_group = {0: entry} if groups is None else {groups.index(g): o for g, o in entry.items()}
        for group, ops in by_group.items():
            for op in ops:
                tag = op[0]
                if tag == "t":
                    words += [4, group, row, op[1]]
                elif tag == "s":
                    words += [3, group, row, len(op[1]), *op[1], *op[2]]
                else:
                    words += [KINDS[tag], group, row, len(op[1]), *op[1]]
                count += 1
    if any(not -(2**31) <= w < 2**31 for w in words):
        raise ValueError("an id outside int32 cannot be packed")
    return packed_from_words(message["seq"], message["base"], count, words)


class PackingEncoder:
    """:class:`BlockDeltaEncoder`'s messages, packed; a message it cannot pack resets it (the
    engine then sends every request whole)."""

    def __init__(self, groups: Sequence[str] | None) -> None:
        self.inner = BlockDeltaEncoder()
        self.groups = groups

    def reset(self) -> None:
        self.inner.reset()

    def encode(self, request_ids: Sequence[Any], lists: Sequence[Any]) -> dict[str, Any]:
        message = self.inner.encode(request_ids, lists)
        try:
            return to_packed(message, request_ids, self.groups)
        except ValueError:
            self.inner.reset()
            raise


class DeepSeekPackedEngine(DeepSeekDeltaEngine):
    """The delta engine, its messages packed."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = PackingEncoder(GROUP_NAMES)  # type: ignore[assignment]


class DeepSeekPackedEngineMTP(DeepSeekPackedEngine):
    MTP = True


DeepSeekPackedEngine.TestCase.settings = engine_settings(60)
DeepSeekPackedEngineMTP.TestCase.settings = engine_settings(25)
test_deepseek_packed_engine = DeepSeekPackedEngine.TestCase
test_deepseek_packed_engine_mtp = DeepSeekPackedEngineMTP.TestCase


def packed_batch(batch: DecodeBatch, message: dict[str, Any]) -> DecodeBatch:
    delta = dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message)
    received: DecodeBatch = pickle.loads(pickle.dumps(delta))
    return received


@pytest.mark.parametrize("shuffle", [False, True])
def test_trace_packed_equals_full_lists_and_rebuild(shuffle: bool) -> None:
    """Joins, leaves, rotations, appends, rows moving: packed messages through a pickle round
    trip equal the rebuild of the full lists at every step, in two slots; now and then a message
    is corrupted (a bit flipped, its payload cut) and refused with nothing written, the next
    message (built on the refused one) is refused as out of sequence, and the worker's resync
    request brings a whole message that applies."""
    sim = DeepSeekV4SchedulerSim(
        ranks=4,
        decode_batch=4,
        max_seq_len=4096,
        seed=11,
        join_probability=0.5,
        leave_probability=0.05,
        prompt_lengths=(1, 1500),
        max_advance=40,
        shuffle=shuffle,
        fresh_lists=True,
    )
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, max_seq_len=4096, num_blocks=sim.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=2)
    encoder = PackingEncoder(GROUP_NAMES)
    corrupted = 0
    for step in range(100):
        batch = sim.step()
        slot = step % 2
        message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
        if step % 7 == 6 and message["data"]:
            data = message["data"]
            bad = (
                dict(message, data=data[:-4])
                if step % 2
                else dict(message, data=bytes([data[0] ^ 1]) + data[1:])
            )
            before = [tables_of(preparer)]
            with pytest.raises(DeltaMessageError, match="checksum"):
                preparer.prepare(packed_batch(batch, bad), buffer_slot=slot)
            assert_unchanged(preparer, before[0])
            corrupted += 1
            batch = sim.step()  # the scheduler went on: this message builds on the refused one
            message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
            with pytest.raises(DeltaSequenceError):
                preparer.prepare(packed_batch(batch, message), buffer_slot=slot)
            request = preparer.resync_request()
            assert request == {"resync": True, "applied": message["base"] - 1}
            encoder.reset()
            message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
            assert message["base"] is None
        views = preparer.prepare(packed_batch(batch, message), buffer_slot=slot)
        assert_equal(views, rebuild(batch, layout), f"step {step}, packed")
    assert corrupted


def packed(seq: int, base: int | None, records: list[tuple[int, int, int, list[int]]]) -> Any:
    words: list[int] = []
    for kind, group, row, values in records:
        n = values[0] if kind == 4 else len(values) // (2 if kind == 3 else 1)
        words += [kind, group, row, n, *([] if kind == 4 else values)]
    return packed_from_words(seq, base, len(records), words)


def whole_records(ids: dict[str, list[int]], row: int = 0) -> list[tuple[int, int, int, list[int]]]:
    return [(1, GROUP_NAMES.index(name), row, list(ids[name])) for name in GROUP_NAMES]


def packed_delta(message: Any) -> DecodeBatch:
    return dataclasses.replace(small_batch(GROUP_IDS), block_ids_by_group=[], block_deltas=message)


G = {name: i for i, name in enumerate(GROUP_NAMES)}


@pytest.mark.parametrize(
    ("records", "error", "match"),
    [
        ([(1, G["ori"], 1, [1])], DeltaMessageError, "row 1 not in the batch's 1 requests"),
        ([(1, 7, 0, [1])], DeltaMessageError, r"group 7 not in \[0, 7\)"),
        ([(3, G["ori"], 0, [3, 9])], DeltaMessageError, r"position 3 .*group ori.*request 'a'"),
        ([(4, G["ori"], 0, [5])], DeltaMessageError, "truncate length 5"),
        ([(3, G["ori"], 0, [0, 0, 1, 2])], DeltaMessageError, "repeat"),
        ([(2, G["ori"], 0, [1])], ValueError, "a row must not repeat block IDs"),
        ([(2, G["ori"], 0, [-1])], ValueError, r"block IDs must be in \[0, .*id -1"),
        ([(2, G["idx"], 0, [2**31 - 1])], ValueError, r"group idx, id 2147483647"),
        ([(4, G["cmp_c4"], 0, [0])], ValueError, "minimum is 1"),
    ],
)
def test_bad_records_write_nothing(records: Any, error: type[Exception], match: str) -> None:
    preparer = fresh_preparer()
    preparer.prepare(packed_delta(packed(0, None, whole_records(GROUP_IDS))))
    before = tables_of(preparer)
    with pytest.raises(error, match=match):
        preparer.prepare(packed_delta(packed(1, 0, records)))
    assert_unchanged(preparer, before)
    views = preparer.prepare(packed_delta(packed(2, 0, [])))
    assert_equal(views, rebuild(small_batch(GROUP_IDS), LAYOUT), "after a rejected step")


@pytest.mark.parametrize("count", [2**63, 2**64 + 1, -1])
def test_a_record_count_no_payload_holds_is_a_delta_message_error(count: int) -> None:
    """A count past int64 with a valid checksum is a miscount (the resend recovery catches it),
    not an ``OverflowError`` from the compiled index; nothing is written."""
    preparer = fresh_preparer()
    preparer.prepare(packed_delta(packed(0, None, whole_records(GROUP_IDS))))
    before = tables_of(preparer)
    words = [2, G["ori"], 0, 1, 9]
    with pytest.raises(DeltaMessageError, match=f"says {count} records, holds 1"):
        preparer.prepare(packed_delta(packed_from_words(1, 0, count, words)))
    assert_unchanged(preparer, before)
    table = VllmBlockTable(16, max_num_reqs=2, max_num_blocks_per_req=4, max_num_batched_tokens=8)
    table.apply_packed(packed_from_words(0, None, 1, [1, 0, 0, 2, 5, 6]))
    held = table.get_numpy_array().copy()
    with pytest.raises(DeltaMessageError, match=f"says {count} records, holds 1"):
        table.apply_packed(packed_from_words(1, 0, count, [2, 0, 0, 1, 7]))
    assert (table.get_numpy_array() == held).all()


def test_records_change_what_the_request_holds_and_mtp_passes_nothing_changed() -> None:
    preparer = fresh_preparer()
    preparer.prepare(packed_delta(packed(0, None, whole_records(GROUP_IDS))))
    message = packed(
        1,
        0,
        [
            (2, G["ori"], 0, [8, 9]),
            (3, G["cmp_c4"], 0, [0, 10]),
            (1, G["csa_state"], 0, [10, 11]),
            (2, G["idx"], 0, [8]),
            (4, G["idx"], 0, [1]),
        ],
    )
    views = preparer.prepare(packed_delta(message), buffer_slot=1)
    now = {**GROUP_IDS, "ori": [1, 8, 9], "cmp_c4": [10], "csa_state": [10, 11]}
    assert_equal(views, rebuild(small_batch(now), LAYOUT), "records")
    with pytest.raises(DeltaSequenceError):  # a redelivery is not applied twice
        preparer.prepare(packed_delta(message), buffer_slot=0)
    views = preparer.prepare(packed_delta(packed(2, 1, [])), buffer_slot=0)
    assert_equal(views, rebuild(small_batch(now), LAYOUT), "slot 0 after catching up")


def test_qwen_trace_packed_equals_full_lists() -> None:
    """The Qwen preparer takes packed messages (one list per request: group 0) as the wire
    ones they stand for: the same buffers as upstream's construction at every step."""
    import random

    rng = random.Random(3)
    batch, max_seq_len, page_size = 4, 256, 16
    preparer = QwenDecodePreparer(batch, max_seq_len, page_size)
    reference = QwenDecodePrep97(batch, max_seq_len, page_size, 8)
    encoder = PackingEncoder(None)
    free = list(range(200))
    rng.shuffle(free)
    live: dict[str, tuple[int, list[int]]] = {}
    serial = 0
    for step in range(80):
        while len(live) < batch:
            seq = rng.randint(1, 100)
            live[f"r{serial}"] = (seq, [free.pop() for _ in range(-(-seq // page_size))])
            serial += 1
        ids = list(live)
        rng.shuffle(ids)
        seq_lens = [live[r][0] for r in ids]
        pages = [list(live[r][1]) for r in ids]
        tokens = torch.tensor([step] * len(ids))
        message = encoder.encode(ids, pages)
        wire = DecodeBatch(
            request_ids=ids,
            token_ids=tokens,
            hidden_states=None,
            seq_lens=torch.tensor(seq_lens),
            block_deltas=message,
        )
        preparer.prepare(pickle.loads(pickle.dumps(wire)))
        reference.prepare(
            DecodeBatch(
                request_ids=ids,
                token_ids=tokens,
                hidden_states=None,
                seq_lens=torch.tensor(seq_lens),
                block_ids=pages,
            )
        )
        got = preparer._inputs(1)
        for name in ("token_ids", "seq_lens", "block_table", "slot_mapping"):
            assert torch.equal(getattr(got, name), getattr(reference, name)), (step, name)
        for r in list(live):
            seq, held = live[r]
            if rng.random() < 0.1 or seq + 1 > max_seq_len:
                free += held
                del live[r]
                continue
            if seq % page_size == 0:
                held.append(free.pop())
            live[r] = (seq + 1, held)
