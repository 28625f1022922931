"""The DeepSeek V4 preparer fed block-list deltas (:mod:`blockprep.wire`) instead of full lists.

The engine state machine of ``test_deepseek_state`` runs again with every batch sent as a delta
message made by :class:`blockprep.wire.BlockDeltaEncoder` and carried through a pickle round
trip; after a rejected step the engine resets the encoder (the next message is whole), as the
integration guide says. Every accepted step is checked against
:func:`blockprep.reference.deepseek_v4_decode_rebuild` of the full batch, every rejected one
for byte-identical buffers. Scheduler traces compare deltas with full lists step by step, and
the plain tests pin the resync rules.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from test_deepseek_state import (
    DECODE_BATCH,
    LAYOUT,
    RANKS,
    DeepSeekEngine,
    Sent,
    engine_settings,
)

from blockprep.adapters.deepseek import (
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.batch import DecodeBatch
from blockprep.reference import deepseek_v4_decode_rebuild
from blockprep.testing import DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder, DeltaMessageError, DeltaSequenceError


def over_the_wire(batch: DecodeBatch, encoder: BlockDeltaEncoder) -> DecodeBatch:
    """``batch`` as a worker receives it with deltas: the message instead of the lists, after a
    pickle round trip."""
    message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
    delta = dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message)
    received: DecodeBatch = pickle.loads(pickle.dumps(delta))
    return received


class DeepSeekDeltaEngine(DeepSeekEngine):
    """The engine, sending deltas. Doubtful ids (a float equal to the held int) belong to the
    by-value path and are not sent; a group left out of a request's dict is an encoder error
    (the scheduler sends every group)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = BlockDeltaEncoder()

    def make_doubtful(self, data: st.DataObject, sent: Sent) -> None:
        return None

    def prepare(self, sent: Sent) -> DeepSeekV4DecodeInputs:
        prepare = self.preparer.prepare_mtp if self.MTP else self.preparer.prepare
        batch = over_the_wire(sent.batch(), self.encoder)  # an encoder error changes nothing
        try:
            return prepare(batch, buffer_slot=sent.buffer_slot)
        except Exception:
            self.encoder.reset()  # the step was not applied: the next message is whole
            raise


class DeepSeekDeltaEngineMTP(DeepSeekDeltaEngine):
    MTP = True


DeepSeekDeltaEngine.TestCase.settings = engine_settings(100)
DeepSeekDeltaEngineMTP.TestCase.settings = engine_settings(40)
test_deepseek_delta_engine = DeepSeekDeltaEngine.TestCase
test_deepseek_delta_engine_mtp = DeepSeekDeltaEngineMTP.TestCase


# --- scheduler traces: deltas and full lists, step by step ----------------------------------------


def rebuild(batch: DecodeBatch, layout: DeepSeekV4Layout) -> dict[str, torch.Tensor]:
    return deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
    )


def assert_equal(views: DeepSeekV4DecodeInputs, expected: dict[str, torch.Tensor], when: str):
    for name, tensor in views.buffers().items():
        assert torch.equal(tensor, expected[name]), f"{when}: {name} differs from the rebuild"


@pytest.mark.parametrize("shuffle", [False, True])
def test_trace_deltas_equal_full_lists_and_rebuild(shuffle: bool) -> None:
    """Joins, leaves, ring rotations, page appends (and with ``shuffle`` requests changing rows):
    two slots in turn, deltas through a pickle round trip; one step in five the engine first
    sends a bad step (an id out of range), then a message on a stale base, then resyncs."""
    sim = DeepSeekV4SchedulerSim(
        ranks=4,
        decode_batch=4,
        max_seq_len=4096,
        seed=7,
        join_probability=0.5,
        leave_probability=0.05,
        prompt_lengths=(1, 1500),
        max_advance=40,
        shuffle=shuffle,
        fresh_lists=True,
    )
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, max_seq_len=4096, num_blocks=sim.num_blocks)
    by_value = DeepSeekV4DecodePreparer(layout, buffer_slots=2)
    by_delta = DeepSeekV4DecodePreparer(layout, buffer_slots=2)
    encoder = BlockDeltaEncoder()
    rejected = resynced = 0
    for step in range(120):
        batch = sim.step()
        slot = step % 2
        if step % 5 == 4:
            bad = pickle.loads(pickle.dumps(batch))
            bad.block_ids_by_group[0]["ori"] = [layout.num_blocks["ori"]]
            snapshot = [
                {n: t.clone() for n, t in by_delta._tables.tables(s).items()} for s in range(2)
            ]
            with pytest.raises(ValueError):
                by_delta.prepare(over_the_wire(bad, encoder), buffer_slot=slot)
            rejected += 1
            for s in range(2):  # nothing was written
                for name, table in by_delta._tables.tables(s).items():
                    assert torch.equal(table, snapshot[s][name])
            # The encoder believes the bad step applied: the next message builds on it.
            with pytest.raises(DeltaSequenceError):
                by_delta.prepare(over_the_wire(batch, encoder), buffer_slot=slot)
            encoder.reset()
            resynced += 1
        got = by_delta.prepare(over_the_wire(batch, encoder), buffer_slot=slot)
        want_views = by_value.prepare(batch, buffer_slot=slot)
        expected = rebuild(batch, layout)
        assert_equal(got, expected, f"step {step}, deltas")
        assert_equal(want_views, expected, f"step {step}, full lists")
    assert rejected and resynced


def test_delta_steps_cost_what_changed() -> None:
    """A steady step through deltas writes only changed rows: the counters of the tables show
    fewer rows written than the batch has (the by-value path writes the same rows)."""
    sim = DeepSeekV4SchedulerSim(
        ranks=2,
        decode_batch=4,
        seed=3,
        join_probability=1.0,
        leave_probability=0.0,
        prompt_lengths=(600, 1200),
        fresh_lists=True,
    )
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks=sim.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=1)
    encoder = BlockDeltaEncoder()
    for _ in range(5):
        preparer.prepare(over_the_wire(sim.step(), encoder))
    preparer.reset_stats()
    batch = sim.step()
    message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
    changed = sum(len(groups) for groups in message["rows"].values())
    preparer.prepare(dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message))
    stats = preparer.table_stats(0)
    assert sum(s.misses for s in stats.values()) == changed
    assert_equal(preparer.prepare(batch), rebuild(batch, layout), "by value after deltas")


# --- resync and malformed messages ----------------------------------------------------------------


def small_batch(ids: dict[str, list[int]], rid: str = "a", seq_len: int = 5) -> DecodeBatch:
    return DecodeBatch(
        request_ids=[rid],
        token_ids=torch.tensor([1]),
        hidden_states=None,
        seq_lens=torch.tensor([seq_len]),
        block_ids_by_group=[ids],
        cache_partitions=[0],
    )


GROUP_IDS = {
    "ori": [1],
    "cmp_c4": [2],
    "cmp_c128": [3],
    "idx": [4],
    "hca_state": [5],
    "csa_state": [6],
    "csa_inner_state": [7],
}


def delta_batch(message: dict[str, Any], rid: str = "a") -> DecodeBatch:
    return DecodeBatch(
        request_ids=[rid],
        token_ids=torch.tensor([1]),
        hidden_states=None,
        seq_lens=torch.tensor([5]),
        cache_partitions=[0],
        block_deltas=message,
    )


def fresh_preparer() -> DeepSeekV4DecodePreparer:
    return DeepSeekV4DecodePreparer(LAYOUT, buffer_slots=2)


def tables_of(preparer: DeepSeekV4DecodePreparer) -> list[dict[str, torch.Tensor]]:
    return [
        {n: t.clone() for n, t in preparer._tables.tables(s).items()}
        for s in range(preparer.buffer_slots)
    ]


def assert_unchanged(preparer: DeepSeekV4DecodePreparer, before: list[dict[str, torch.Tensor]]):
    for s, tables in enumerate(before):
        for name, table in preparer._tables.tables(s).items():
            assert torch.equal(table, tables[name]), f"slot {s} {name} changed"


def whole(ids: dict[str, list[int]]) -> dict[str, Any]:
    return {name: [["w", list(v)]] for name, v in ids.items()}


def test_first_message_must_be_whole_and_build_on_nothing() -> None:
    preparer = fresh_preparer()
    before = tables_of(preparer)
    with pytest.raises(DeltaSequenceError, match="builds on message 3"):
        preparer.prepare(delta_batch({"seq": 4, "base": 3, "rows": {"a": whole(GROUP_IDS)}}))
    assert_unchanged(preparer, before)
    with pytest.raises(DeltaMessageError, match=r"whole list.*request 'a'"):
        preparer.prepare(delta_batch({"seq": 0, "base": None, "rows": {}}))
    assert_unchanged(preparer, before)
    partial = {"a": {**whole(GROUP_IDS), "ori": [["a", [9]]]}}
    with pytest.raises(DeltaMessageError, match="whole list"):
        preparer.prepare(delta_batch({"seq": 0, "base": None, "rows": partial}))
    assert_unchanged(preparer, before)
    views = preparer.prepare(delta_batch({"seq": 0, "base": None, "rows": {"a": whole(GROUP_IDS)}}))
    assert_equal(views, rebuild(small_batch(GROUP_IDS), LAYOUT), "whole")


def test_ops_change_what_the_request_holds() -> None:
    preparer = fresh_preparer()
    preparer.prepare(delta_batch({"seq": 0, "base": None, "rows": {"a": whole(GROUP_IDS)}}))
    ops = {
        "ori": [["a", [8, 9]]],
        "cmp_c4": [["s", [0], [10]]],
        "csa_state": [["w", [10, 11]]],
        "idx": [["a", [8]], ["t", 1]],
    }
    views = preparer.prepare(delta_batch({"seq": 1, "base": 0, "rows": {"a": ops}}), buffer_slot=1)
    now = {**GROUP_IDS, "ori": [1, 8, 9], "cmp_c4": [10], "csa_state": [10, 11]}
    assert_equal(views, rebuild(small_batch(now), LAYOUT), "ops")
    # Slot 0 catches up on slot 1's step.
    views = preparer.prepare(delta_batch({"seq": 2, "base": 1, "rows": {}}), buffer_slot=0)
    assert_equal(views, rebuild(small_batch(now), LAYOUT), "slot 0 after catching up")


@pytest.mark.parametrize(
    ("rows", "error", "match"),
    [
        ({"b": whole(GROUP_IDS)}, DeltaMessageError, "request 'b', which is not in the batch"),
        ({"a": [["w", [1]]]}, DeltaMessageError, "must be a dict by group"),
        ({"a": {"nope": [["w", [1]]]}}, DeltaMessageError, "unknown group 'nope'"),
        ({"a": {"ori": [["s", [3], [9]]]}}, DeltaMessageError, "position 3 .*group ori"),
        ({"a": {"ori": [["t", 5]]}}, DeltaMessageError, "truncate length 5"),
        ({"a": {"ori": [["x", 1]]}}, DeltaMessageError, "unknown block delta operation"),
        ({"a": {"ori": []}}, DeltaMessageError, "non-empty list"),
        ({"a": {"ori": [["a", [1]]]}}, ValueError, "repeat"),
        ({"a": {"ori": [["s", [0], [True]]]}}, TypeError, "must be integers"),
        ({"a": {"ori": [["a", [-1]]]}}, ValueError, r"block IDs must be in \[0, "),
        ({"a": {"cmp_c4": [["t", 0]]}}, ValueError, "minimum is 1"),
    ],
)
def test_bad_ops_write_nothing(rows: dict[str, Any], error: type[Exception], match: str) -> None:
    preparer = fresh_preparer()
    preparer.prepare(delta_batch({"seq": 0, "base": None, "rows": {"a": whole(GROUP_IDS)}}))
    before = tables_of(preparer)
    with pytest.raises(error, match=match):
        preparer.prepare(delta_batch({"seq": 1, "base": 0, "rows": rows}))
    assert_unchanged(preparer, before)
    # The rejected step was not applied: the next message builds on message 0.
    views = preparer.prepare(delta_batch({"seq": 2, "base": 0, "rows": {}}))
    assert_equal(views, rebuild(small_batch(GROUP_IDS), LAYOUT), "after a rejected step")


def test_full_lists_then_deltas_need_a_whole_message() -> None:
    preparer = fresh_preparer()
    preparer.prepare(small_batch(GROUP_IDS))
    with pytest.raises(DeltaSequenceError):
        preparer.prepare(delta_batch({"seq": 5, "base": 4, "rows": {}}))
    with pytest.raises(DeltaMessageError, match="whole list"):  # base None: every group whole
        preparer.prepare(delta_batch({"seq": 5, "base": None, "rows": {}}))
    preparer.prepare(delta_batch({"seq": 5, "base": None, "rows": {"a": whole(GROUP_IDS)}}))
    with pytest.raises(ValueError, match="not both"):
        both = dataclasses.replace(small_batch(GROUP_IDS), block_deltas={"seq": 6, "base": 5})
        both.block_deltas = {"seq": 6, "base": 5, "rows": {}}
        preparer.prepare(both)


def test_speculative_batch_carries_an_unchanged_message() -> None:
    layout = DeepSeekV4Layout(
        ranks=RANKS, decode_batch=DECODE_BATCH, decode_seq=2, num_blocks=LAYOUT.num_blocks
    )
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=2)
    batch = delta_batch({"seq": 0, "base": None, "rows": {"a": whole(GROUP_IDS)}})
    batch.prev_token_ids = torch.tensor([3])
    preparer.prepare_mtp(batch)
    verify = preparer.speculative_batch(batch, torch.tensor([4]))
    assert verify.block_deltas == {"seq": 0, "base": 0, "rows": {}}
    views = preparer.prepare_mtp(verify, buffer_slot=1)
    expected = deepseek_v4_decode_rebuild(
        dataclasses.replace(
            small_batch(GROUP_IDS, seq_len=6),
            token_ids=torch.tensor([[4]]),
            prev_token_ids=torch.tensor([1]),
        ),
        ranks=RANKS,
        decode_batch=DECODE_BATCH,
        decode_seq=2,
        num_blocks=layout.num_blocks,
        mtp=True,
    )
    assert_equal(views, expected, "verification step")


def test_encoder_messages_are_plain_and_minimal() -> None:
    encoder = BlockDeltaEncoder()
    first = encoder.encode(["a", "b"], [[1, 2], [3]])
    assert first == {"seq": 0, "base": None, "rows": {"a": [["w", [1, 2]]], "b": [["w", [3]]]}}
    second = encoder.encode(["b", "a"], [[3, 4], [1, 2]])
    assert second == {"seq": 1, "base": 0, "rows": {"b": [["a", [4]]]}}
    third = encoder.encode(["b", "c"], [[3, 9], [5]])
    assert third == {"seq": 2, "base": 1, "rows": {"b": [["s", [1], [9]]], "c": [["w", [5]]]}}
    fourth = encoder.encode(["b", "a"], [[3], [1, 2]])  # "a" left and came back: whole again
    assert fourth == {"seq": 3, "base": 2, "rows": {"b": [["t", 1]], "a": [["w", [1, 2]]]}}
    with pytest.raises(TypeError, match="must be integers"):
        encoder.encode(["b"], [[3, 1.0]])
    with pytest.raises(ValueError, match="carries groups"):
        grouped = BlockDeltaEncoder()
        grouped.encode(["a"], [{"x": [1], "y": [2]}])
        grouped.encode(["a"], [{"x": [1]}])
    encoder.reset()
    assert encoder.encode(["b"], [[3]]) == {"seq": 4, "base": None, "rows": {"b": [["w", [3]]]}}
