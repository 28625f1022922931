"""Hardening (issue 19): the wire cursor and encoder at the edges of their life cycle. Every case
fails on 9ea27c1; a refused call leaves the worker's buffers byte-identical."""

from __future__ import annotations

import gc

import pytest
import torch

from blockprep import BlockprepError, BlockTable, DecodeBatch
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.buffers import release_buffers
from blockprep.grouped import GroupedTables, TableGroup
from blockprep.reference import QwenDecodePrep97
from blockprep.wire import BlockDeltaEncoder, DeltaCursor, DeltaSequenceError

QWEN_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


def qwen_snapshot(preparer: QwenDecodePreparer) -> dict[str, torch.Tensor]:
    inputs = preparer._inputs(1)
    return {name: getattr(inputs, name).clone() for name in QWEN_BUFFERS}


def delta_batch(ids: list[str], seq_lens: list[int], message: object) -> DecodeBatch:
    return DecodeBatch(
        request_ids=ids,
        token_ids=torch.tensor([5] * len(ids)),
        hidden_states=None,
        seq_lens=torch.tensor(seq_lens),
        block_deltas=message,  # type: ignore[arg-type]
    )


# --- the wire cursor -----------------------------------------------------------------------------


@pytest.mark.parametrize("seq", [6, 5, 0])
def test_cursor_refuses_a_message_whose_seq_is_not_after_its_base(seq: int) -> None:
    cursor = DeltaCursor()
    cursor.last = 6
    rows = {"a": [["a", [3]]]}
    with pytest.raises(DeltaSequenceError, match=f"message {seq} builds on message 6.*after"):
        cursor.check({"seq": seq, "base": 6, "rows": rows})
    assert cursor.check({"seq": 7, "base": 6, "rows": rows}) == (7, rows)
    # "Nothing changed" (speculative_batch's message) may repeat its base: applying it is
    # idempotent; a seq before the base may not.
    assert cursor.check({"seq": 6, "base": 6, "rows": {}}) == (6, {})
    if seq < 6:
        with pytest.raises(DeltaSequenceError, match="after its base"):
            cursor.check({"seq": seq, "base": 6, "rows": {}})


def test_a_redelivered_qwen_append_is_refused_not_applied_twice() -> None:
    """The 9ea27c1 failure: ``{"seq": 1, "base": 1}`` appended again on every delivery (the row
    became [8, 3, 3, 3]); now each delivery after the first is refused and writes nothing."""
    preparer = QwenDecodePreparer(1, 16, 4)
    reference = QwenDecodePrep97(1, 16, 4, 8)
    preparer.prepare(delta_batch(["a"], [4], {"seq": 1, "base": None, "rows": {"a": [["w", [8]]]}}))
    replay = {"seq": 1, "base": 1, "rows": {"a": [["a", [3]]]}}
    before = qwen_snapshot(preparer)
    for _ in range(3):
        with pytest.raises(DeltaSequenceError, match="after its base"):
            preparer.prepare(delta_batch(["a"], [5], replay))
        after = qwen_snapshot(preparer)
        assert all(torch.equal(after[k], before[k]) for k in QWEN_BUFFERS)
    preparer.prepare(delta_batch(["a"], [5], {"seq": 2, "base": 1, "rows": {"a": [["a", [3]]]}}))
    reference.prepare(
        DecodeBatch(
            request_ids=["a"],
            token_ids=torch.tensor([5]),
            hidden_states=None,
            seq_lens=torch.tensor([5]),
            block_ids=[[8, 3]],
        )
    )
    inputs = preparer._inputs(1)
    for name in QWEN_BUFFERS:
        assert torch.equal(getattr(inputs, name), getattr(reference, name)), name


# --- the encoder ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        ([1, 2], {"g": [1, 2]}, "carries grouped block lists, but its last message carried flat"),
        ({"g": [1, 2]}, [1, 2], "carries flat block lists, but its last message carried grouped"),
    ],
)
def test_encoder_refuses_a_request_switching_between_flat_and_grouped(
    first: object, second: object, words: str
) -> None:
    encoder = BlockDeltaEncoder()
    m0 = encoder.encode(["a", "b"], [first, [7]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=f"request 'a' {words}") as info:
        encoder.encode(["a", "b"], [second, [7, 8]])  # type: ignore[list-item]
    assert isinstance(info.value, BlockprepError)
    # Nothing remembered from the refused step: the next message builds on m0.
    m1 = encoder.encode(["a", "b"], [first, [7, 9]])  # type: ignore[list-item]
    assert m1["base"] == m0["seq"] and m1["rows"] == {"b": [["a", [9]]]}
    # Under a new id, or after a reset, the switch is a new request.
    m2 = encoder.encode(["a2"], [second])  # type: ignore[list-item]
    assert "a2" in m2["rows"]


@pytest.mark.parametrize(
    ("request_ids", "block_lists", "what"),
    [
        (None, [[1]], "request_ids"),
        (["a"], None, "block_lists"),
        ("ab", [[1], [2]], "request_ids"),
        (["a"], 3, "block_lists"),
    ],
)
def test_encoder_refuses_what_is_no_sequence_with_a_type_error(
    request_ids: object, block_lists: object, what: str
) -> None:
    encoder = BlockDeltaEncoder()
    with pytest.raises(TypeError, match=f"{what} must be a list, tuple or 1-D array, got") as info:
        encoder.encode(request_ids, block_lists)  # type: ignore[arg-type]
    assert isinstance(info.value, BlockprepError)
    assert encoder.encode(["a"], [[1]])["base"] is None


# --- one adopted-buffer check, one owner per byte -----------------------------------------------

RING = TableGroup("swa", "ring", 4, id_limit=100)
PAGED = TableGroup("pages", "paged", 6, id_limit=100, pad=-1)


def grouped_slot(rows: int = 3) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    tables = {g.name: torch.full((rows, g.width), 7, dtype=torch.int32) for g in (RING, PAGED)}
    return tables, torch.full((rows, 2), 7, dtype=torch.int32)


def qwen_buffers(batch: int = 2, max_seq_len: int = 16, page: int = 4) -> dict[str, torch.Tensor]:
    return {
        "token_ids": torch.full((batch, 8), 7, dtype=torch.int32),
        "seq_lens": torch.full((batch,), 7, dtype=torch.int32),
        "block_table": torch.full((batch * (max_seq_len // page),), 7, dtype=torch.int32),
        "slot_mapping": torch.full((batch,), 7, dtype=torch.int32),
    }


def test_grouped_issue_example_shared_table_and_counts_over_a_row_are_refused() -> None:
    """The issue's example (one tensor for two groups), and a counts tensor over a table's last
    row: refused, naming both buffers, nothing written."""
    shared = torch.zeros(3, 4, dtype=torch.int32)
    groups = [TableGroup("x", "ring", 4, id_limit=100), TableGroup("y", "ring", 4, id_limit=100)]
    with pytest.raises(ValueError, match=r"buffers\[0\]\['y'\] overlaps buffers\[0\]\['x'\]"):
        GroupedTables(groups, 3, buffers=[({"x": shared, "y": shared}, torch.zeros(3, 2).int())])
    tables, _ = grouped_slot()
    counts = tables["pages"].view(-1)[-6:].view(3, 2)  # over the table's last row
    before = tables["pages"].clone()
    with pytest.raises(ValueError, match=r"overlaps") as info:
        GroupedTables([RING, PAGED], 3, buffers=[(tables, counts)])
    assert isinstance(info.value, BlockprepError)
    assert torch.equal(tables["pages"], before)


@pytest.mark.parametrize("case", ["one tensor", "slots over the table's tail"])
def test_qwen_adopted_buffers_that_overlap_are_refused(case: str) -> None:
    """9ea27c1 checked each buffer alone: seq_lens read back as the slots, or the padding
    replication reset the slots to -1 (K/V written at slot -1)."""
    buffers = qwen_buffers()
    if case == "one tensor":
        buffers["slot_mapping"] = buffers["seq_lens"]
        words = r"slot_mapping overlaps seq_lens"
    else:
        buffers["slot_mapping"] = buffers["block_table"][-2:]
        words = r"slot_mapping overlaps block_table"
    before = {name: tensor.clone() for name, tensor in buffers.items()}
    with pytest.raises(ValueError, match=words) as info:
        QwenDecodePreparer(2, 16, 4, buffers=buffers)
    assert isinstance(info.value, BlockprepError)
    for name, tensor in buffers.items():
        assert torch.equal(tensor, before[name]), name
    # Disjoint buffers are adopted, and the first step equals the reference.
    QwenDecodePreparer(2, 16, 4, buffers=qwen_buffers())


def test_one_owner_per_byte_across_owners() -> None:
    """Two owners over the same memory would each trust a cache the other's writes falsify: the
    registry covers BlockTable, GroupedTables and the Qwen preparer alike, allocated buffers
    included; a refused owner claims nothing, a collected one releases its claims."""
    clash = "overlaps the buffer of another live"
    grouped = GroupedTables([RING, PAGED], 3)
    with pytest.raises(ValueError, match=f"^buffer {clash} GroupedTables"):
        BlockTable(3, PAGED.width, buffer=grouped.tables(0)["pages"])
    table = BlockTable(3, RING.width, kind="ring")
    tables, counts = grouped_slot()
    tables["swa"] = table.tensor
    with pytest.raises(ValueError, match=rf"^buffers\[0\]\['swa'\] {clash} BlockTable"):
        GroupedTables([RING, PAGED], 3, buffers=[(tables, counts)])
    # Refused as a whole: the buffers that did not clash were not left claimed.
    BlockTable(3, PAGED.width, buffer=tables["pages"])
    fresh = grouped_slot()
    first = GroupedTables([RING, PAGED], 3, buffers=[fresh])
    with pytest.raises(ValueError, match=f"{clash} GroupedTables"):
        GroupedTables([RING, PAGED], 3, buffers=[fresh])
    del first
    gc.collect()
    GroupedTables([RING, PAGED], 3, buffers=[fresh])  # released with its owner
    # Qwen: another live preparer's buffers, allocated or adopted. The table is its
    # BlockTable's, whose check names it "buffer".
    owner = QwenDecodePreparer(2, 16, 4)
    for name in ("token_ids", "seq_lens", "slot_mapping", "block_table"):
        buffers = qwen_buffers()
        buffers[name] = owner.buffers()[name]
        words = "buffer {} BlockTable" if name == "block_table" else name + " {} QwenDecodePreparer"
        with pytest.raises(ValueError, match="^" + words.format(clash)):
            QwenDecodePreparer(2, 16, 4, buffers=buffers)


def test_release_buffers_frees_an_owners_claims_now() -> None:
    tables = grouped_slot()
    grouped = GroupedTables([RING, PAGED], 3, buffers=[tables])
    with pytest.raises(ValueError, match="another live GroupedTables"):
        BlockTable(3, PAGED.width, buffer=tables[0]["pages"])
    release_buffers(grouped)
    release_buffers(grouped)  # a no-op the second time
    BlockTable(3, PAGED.width, buffer=tables[0]["pages"])
