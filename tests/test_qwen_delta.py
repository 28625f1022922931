"""Qwen decode preparation fed block-list deltas (blockprep.wire) instead of full lists: after
every step the buffers equal upstream's PR #97 construction fed the full lists; rejected steps
write nothing, the next message then raises DeltaSequenceError, and a reset encoder resyncs."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blockprep import DecodeBatch
from blockprep.adapters._qwen_deltas import request_index
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97
from blockprep.wire import BlockDeltaEncoder, DeltaMessageError, DeltaSequenceError

BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class Scheduler:
    """Requests join with a prompt, decode a token per step, take a page from a shuffled pool
    every ``page_size`` tokens, leave; the batch order is shuffled now and then (rows move)."""

    def __init__(self, rng: random.Random, batch: int, max_seq_len: int, page_size: int) -> None:
        self.rng, self.batch, self.max_seq_len, self.page_size = rng, batch, max_seq_len, page_size
        self.free = list(range(batch * (-(-max_seq_len // page_size)) * 2 + 4))
        rng.shuffle(self.free)
        self.requests: dict[str, list[Any]] = {}  # id: [seq_len, pages]
        self.order: list[str] = []
        self.counter = 0

    def next_batch(self) -> tuple[list[str], list[int], list[int], list[list[int]]]:
        rng = self.rng
        for rid in list(self.order):
            if self.requests[rid][0] >= self.max_seq_len or rng.random() < 0.08:
                self.order.remove(rid)
                self.free.extend(self.requests.pop(rid)[1])
        while len(self.order) < self.batch and (not self.order or rng.random() < 0.4):
            seq_len = rng.randint(1, self.max_seq_len)
            pages = [self.free.pop() for _ in range(-(-seq_len // self.page_size))]
            rid = f"r{self.counter}"
            self.counter += 1
            self.requests[rid] = [seq_len, pages]
            self.order.insert(rng.randrange(len(self.order) + 1), rid)
        if rng.random() < 0.15:
            rng.shuffle(self.order)
        active = self.order[: rng.randint(1, len(self.order))]
        seq_lens = [self.requests[r][0] for r in active]
        pages = [list(self.requests[r][1]) for r in active]
        tokens = [rng.randrange(1000) for _ in active]
        return active, tokens, seq_lens, pages

    def advance(self) -> None:
        for request in self.requests.values():
            request[0] += 1
            if (request[0] - 1) // self.page_size >= len(request[1]) and (
                request[0] <= self.max_seq_len
            ):
                request[1].append(self.free.pop())


def by_value(ids: list[str], tokens: list[int], seq: list[int], pages: Any) -> DecodeBatch:
    return DecodeBatch(
        request_ids=ids,
        token_ids=torch.tensor(tokens),
        hidden_states=None,
        seq_lens=torch.tensor(seq),
        block_ids=pages,
    )


def as_delta(ids: list[str], tokens: list[int], seq: list[int], message: Any) -> DecodeBatch:
    """What the worker receives: the batch through a pickle round trip (new ints, new lists)."""
    batch = DecodeBatch(
        request_ids=ids,
        token_ids=torch.tensor(tokens),
        hidden_states=None,
        seq_lens=torch.tensor(seq),
        block_deltas=message,
    )
    received: DecodeBatch = pickle.loads(pickle.dumps(batch))
    return received


def snapshot(preparer: QwenDecodePreparer) -> dict[str, torch.Tensor]:
    inputs = preparer._inputs(1)
    return {name: getattr(inputs, name).clone() for name in BUFFERS}


def same_as_reference(preparer: QwenDecodePreparer, reference: QwenDecodePrep97) -> None:
    inputs = preparer._inputs(1)
    for name in BUFFERS:
        assert torch.equal(getattr(inputs, name), getattr(reference, name)), name


def unchanged(preparer: QwenDecodePreparer, before: dict[str, torch.Tensor]) -> None:
    after = snapshot(preparer)
    for name in BUFFERS:
        assert torch.equal(after[name], before[name]), name


class QwenDeltaMachine(RuleBasedStateMachine):
    """The scheduler's encoder and the worker's preparer, with rejected steps, by-value steps and
    warm-up resets interleaved; the reference gets the full lists of every applied step."""

    def __init__(self) -> None:
        super().__init__()
        self.configured = False

    @precondition(lambda self: not self.configured)
    @rule(
        seed=st.integers(0, 2**32 - 1),
        batch=st.integers(1, 5),
        page_size=st.sampled_from([1, 4, 16]),
        max_seq_len=st.sampled_from([7, 64, 200]),
    )
    def configure(self, seed: int, batch: int, page_size: int, max_seq_len: int) -> None:
        self.configured = True
        self.rng = random.Random(seed)
        self.scheduler = Scheduler(self.rng, batch, max_seq_len, page_size)
        self.preparer = QwenDecodePreparer(batch, max_seq_len, page_size)
        self.reference = QwenDecodePrep97(batch, max_seq_len, page_size, 8)
        self.encoder = BlockDeltaEncoder()
        self.synced = True  # whether the encoder's next message builds on what the worker applied
        self.applied = False

    def _apply_delta(self) -> None:
        ids, tokens, seq, pages = self.scheduler.next_batch()
        message = self.encoder.encode(ids, pages)
        batch = as_delta(ids, tokens, seq, message)
        if not self.synced and message["base"] is not None:
            before = snapshot(self.preparer)
            with pytest.raises(DeltaSequenceError):
                self.preparer.prepare(batch)
            unchanged(self.preparer, before)
            self.encoder.reset()
            batch = as_delta(ids, tokens, seq, self.encoder.encode(ids, pages))
            assert batch.block_deltas is not None and batch.block_deltas["base"] is None
            self.synced = True
        inputs = self.preparer.prepare(batch)
        self.reference.prepare(by_value(ids, tokens, seq, pages))
        assert inputs.actual_batch == len(ids)
        self.synced = True
        self.applied = True
        self.scheduler.advance()

    @precondition(lambda self: self.configured)
    @rule()
    def delta_step(self) -> None:
        self._apply_delta()

    @precondition(lambda self: self.configured)
    @rule()
    def by_value_step(self) -> None:
        """Full lists: the worker forgets the message numbers, so the encoder must resync."""
        ids, tokens, seq, pages = self.scheduler.next_batch()
        batch: DecodeBatch = pickle.loads(pickle.dumps(by_value(ids, tokens, seq, pages)))
        self.preparer.prepare(batch)
        self.reference.prepare(by_value(ids, tokens, seq, pages))
        self.synced = False
        self.applied = True
        self.scheduler.advance()

    @precondition(lambda self: self.configured)
    @rule(fault=st.sampled_from(["seq", "negative-id", "stranger", "truncate", "new-not-whole"]))
    def rejected_step(self, fault: str) -> None:
        """A step the worker rejects: nothing is written and the cursor does not move, so the
        next message (which the encoder built on the rejected one) raises DeltaSequenceError."""
        ids, tokens, seq, pages = self.scheduler.next_batch()
        pages = [list(p) for p in pages]
        if fault == "seq":
            seq[-1] = self.preparer.max_seq_len + 1
        elif fault == "negative-id":
            pages[0].append(-3)
        message = self.encoder.encode(ids, pages)
        if fault == "stranger":
            message["rows"]["nobody"] = [["a", [1]]]
        elif fault == "truncate":
            message["rows"][ids[0]] = [["t", len(pages[0]) + 5]]
        elif fault == "new-not-whole":
            message = {"seq": message["seq"], "base": None, "rows": {}}
        batch = as_delta(ids, tokens, seq, message)
        before = snapshot(self.preparer)
        if not self.synced and message["base"] is not None:
            error: type[Exception] = DeltaSequenceError
        elif fault in ("stranger", "truncate", "new-not-whole"):
            error = DeltaMessageError
        else:
            error = ValueError
        with pytest.raises(error):
            self.preparer.prepare(batch)
        unchanged(self.preparer, before)
        self.preparer.block_table.check()
        self.synced = False  # the encoder believes the rejected message applied

    @precondition(lambda self: self.configured)
    @rule()
    def warm_up_reset(self) -> None:
        """Upstream's warm-up: the preparer forgets its rows and its cursor."""
        self.preparer.reset()
        self.reference.reset()
        self.synced = False
        self.applied = False

    @invariant()
    def buffers_equal_reference(self) -> None:
        if self.configured and self.applied:
            same_as_reference(self.preparer, self.reference)
            self.preparer.block_table.check()


TestQwenDeltaMachine = QwenDeltaMachine.TestCase
TestQwenDeltaMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_long_trace_deltas_equal_full_lists_every_step() -> None:
    """The same trace as full lists (the reference) and as deltas through pickle (blockprep)."""
    rng = random.Random(7)
    scheduler = Scheduler(rng, 6, 300, 16)
    preparer, reference = QwenDecodePreparer(6, 300, 16), QwenDecodePrep97(6, 300, 16, 8)
    by_value_preparer = QwenDecodePreparer(6, 300, 16)
    by_value_preparer.row_loop_max = 0  # the array checks, not the small-batch row loop
    encoder = BlockDeltaEncoder()
    appended_in_place = 0
    for _ in range(400):
        ids, tokens, seq, pages = scheduler.next_batch()
        before = preparer.block_table.stats.cells_written
        message = encoder.encode(ids, pages)
        preparer.prepare(as_delta(ids, tokens, seq, message))
        reference.prepare(by_value(ids, tokens, seq, pages))
        by_value_preparer.prepare(by_value(ids, tokens, seq, pages))
        same_as_reference(preparer, reference)
        same_as_reference(by_value_preparer, reference)
        rows = message["rows"]
        if len(rows) == 1 and next(iter(rows.values()))[0][0] == "a" and len(ids) == 6:
            appended_in_place += 1
            # One page appended to a request that kept its row: one cell (plus padding: none).
            assert preparer.block_table.stats.cells_written - before == len(
                next(iter(rows.values()))[0][1]
            )
        scheduler.advance()
    assert appended_in_place > 0


def test_upstream_messages_for_deltas() -> None:
    preparer = QwenDecodePreparer(max_batch_size=3, max_seq_len=256, page_size=64)
    encoder = BlockDeltaEncoder()
    first = encoder.encode(["a", "b"], [[1], [2, 4]])
    preparer.prepare(as_delta(["a", "b"], [5, 6], [3, 70], first))
    before = snapshot(preparer)
    cases = [
        ([3, 200], [[1], [2, 4]], r"^page_ids list length 2 is too small for decode position 199"),
        ([3, 0], [[1], [2, 4]], r"^decode seq_lens must be positive$"),
        ([3, 257], [[1], [2, 4]], r"^decode seq_len 257 exceeds max_seq_len 256$"),
        ([3, 70], [[1], [2, 4, 5, 6, 7]], r"^page_ids list length 5 exceeds block-table width 4$"),
        ([65, 70], [[1, 2**25], [2, 4]], r"^slot-mapping row 0 maps to slot 2147483648"),
        ([3, 70], [[1], [2, 4, -1]], r"^block IDs must not be negative"),
    ]
    for seq, pages, message in cases:
        encoder.reset()
        encoder.encode(["a", "b"], [[1], [2, 4]])  # as the worker holds them
        delta = encoder.encode(["a", "b"], pages)
        delta["base"] = preparer._cursor.last
        with pytest.raises(ValueError, match=message):
            preparer.prepare(as_delta(["a", "b"], [1, 1], seq, delta))
        unchanged(preparer, before)
    # The cursor did not move: a message building on the first one still applies.
    encoder.reset()
    encoder.encode(["a", "b"], [[1], [2, 4]])
    delta = encoder.encode(["b", "a"], [[2, 4], [1, 9]])
    delta["base"] = first["seq"]
    inputs = preparer.prepare(as_delta(["b", "a"], [1, 2], [70, 65], delta))
    assert inputs.block_table.reshape(3, 4).tolist() == [[2, 4, -1, -1], [1, 9, -1, -1]] * 1 + [
        [2, 4, -1, -1]
    ]
    assert inputs.slot_mapping.tolist() == [4 * 64 + 5, 9 * 64, 4 * 64 + 5]


def test_slot_overflow_in_a_delta_names_the_row_and_writes_nothing() -> None:
    preparer = QwenDecodePreparer(max_batch_size=2, max_seq_len=256, page_size=64)
    encoder = BlockDeltaEncoder()
    preparer.prepare(as_delta(["a"], [1], [3], encoder.encode(["a"], [[1]])))
    before = snapshot(preparer)
    with pytest.raises(ValueError, match=r"^slot-mapping row 0 maps to slot 2147483648"):
        preparer.prepare(as_delta(["a"], [1], [65], encoder.encode(["a"], [[1, 2**25]])))
    unchanged(preparer, before)
    with pytest.raises(DeltaSequenceError):
        preparer.prepare(as_delta(["a"], [1], [65], encoder.encode(["a"], [[1, 2]])))
    encoder.reset()
    inputs = preparer.prepare(as_delta(["a"], [1], [65], encoder.encode(["a"], [[1, 2]])))
    assert inputs.slot_mapping.tolist() == [128, 128]


@pytest.mark.parametrize("row_loop_max", [0, 24])
@pytest.mark.parametrize(
    ("seq", "pages", "tokens", "message"),
    [
        (
            [3, 0, 999],
            [[1], [2], [5, 6, 7, 8, 9]],
            [1, 1, 1],
            r"^decode seq_lens must be positive$",
        ),
        (
            [3, 70, 257],
            [[1], [2], [3]],
            [1, 1, 1],
            r"^page_ids list length 1 is too small for decode position 69;",
        ),
        ([3, 3, 257], [[1], [2], [3]], [1, 1, 1], r"^decode seq_len 257 exceeds max_seq_len 256$"),
        ([3, 3, 3], [[1], [2, 3, 4, 5, 6], [-1]], [1, 1, 1], r"^page_ids list length 5 exceeds"),
        ([3, 3, 3], [[1, -1], [-2], [3]], [1, 1, 1], r"^block IDs must not be negative"),
        ([3, 3, 3], [[1, -1], [2], [3]], [1, 2**31, 1], r"^token row 1 holds token id 2147483648"),
        ([3, 3, 65], [[1, -1], [2], [3, 2**25]], [1, 1, 1], r"^slot-mapping row 2 maps to slot"),
        ([3, 3, 3], [[1, -1], [2], [3]], [1, 1, 1], r"^block IDs must not be negative"),
    ],
)
def test_by_value_errors_are_upstreams_first_failing_row(
    row_loop_max: int, seq: list[int], pages: list[Any], tokens: list[int], message: str
) -> None:
    """The array checks find the fault; the row loop picks upstream's message for the first
    failing row, in upstream's order, whichever path runs; nothing is written."""
    preparer = QwenDecodePreparer(max_batch_size=3, max_seq_len=256, page_size=64)
    preparer.row_loop_max = row_loop_max
    good = by_value(["a", "b"], [5, 6], [3, 70], [[1], [2, 4]])
    preparer.prepare(good)
    before = snapshot(preparer)
    with pytest.raises((ValueError, TypeError), match=message):
        preparer.prepare(by_value(["a", "b", "c"], tokens, seq, pages))
    unchanged(preparer, before)
    preparer.block_table.check()


def test_block_table_plan_rows_then_commit() -> None:
    """``plan_rows`` checks a sparse set of rows and writes nothing; ``commit`` writes them;
    a plan made stale by another write is refused."""
    from blockprep import BlockTable, paged_block_table

    table = BlockTable(3, 4)
    table.write_rows([[1], [2, 3], []])
    plan = table.plan_rows({2: [7, 8], 0: [1]})
    assert plan.rows == [2]  # row 0 already holds [1]
    before = table.numpy().copy()
    with pytest.raises(ValueError, match="negative"):
        table.plan_rows([(1, [2, -3])])
    with pytest.raises(ValueError, match="more than once"):
        table.plan_rows([(1, [2]), (1, [3])])
    assert (table.numpy() == before).all()
    assert table.commit(plan) == 1
    expected = paged_block_table([[1], [2, 3], [7, 8]], 4, pad=-1)
    assert torch.equal(table.tensor, expected)
    stale = table.plan_rows({1: [9]})
    table.write_row(0, [4])
    with pytest.raises(RuntimeError, match="committed"):
        table.commit(stale)
    table.check()


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=12, unique=True),
    st.data(),
)
def test_request_index_equals_a_rebuild(held: list[int], data: st.DataObject) -> None:
    """The patched index is the one a rebuild makes (``dict(zip(ids, range))``), an id that
    repeats is refused as the rebuild refuses it, and every row whose request is not the one the
    held index puts there is visited. Ids are strings made anew, as after a round trip."""
    held_ids: list[Any] = [f"r{k}" for k in held]
    held_rows = {request: row for row, request in enumerate(held_ids)}
    count = data.draw(st.sampled_from([len(held), len(held), max(1, len(held) - 1)]))
    new_ids = [
        "".join(f"r{k}")  # a new str object of the same value
        for k in data.draw(st.lists(st.integers(0, 40), min_size=count, max_size=count))
    ]
    rebuilt = dict(zip(new_ids, range(count), strict=True))
    try:
        index, visit = request_index(new_ids, count, held_ids, held_rows)
    except DeltaMessageError as error:
        assert "repeat" in str(error)
        assert len(rebuilt) != count
        return
    assert len(rebuilt) == count
    assert index == rebuilt
    moved = {row for row, request in enumerate(new_ids) if held_rows.get(request) != row}
    assert moved <= set(visit)
    assert held_rows == {request: row for row, request in enumerate(held_ids)}  # not changed
