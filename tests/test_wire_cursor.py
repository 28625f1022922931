"""The wire cursor and encoder at the edges of their life cycle: a refused call leaves the
worker's buffers byte-identical."""

from __future__ import annotations

import pytest
import torch

from blockprep import BlockprepError, DecodeBatch
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97
from blockprep.wire import BlockDeltaEncoder, DeltaCursor, DeltaMessageError, DeltaSequenceError

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


@pytest.mark.parametrize(("seq", "base"), [(True, None), (1.0, None), (7, True), (7, 6.0)])
def test_check_sequence_refuses_what_check_refuses(seq: object, base: object) -> None:
    """A packed header's numbers go through ``check_sequence``: a bool or a float is refused
    there in ``check``'s words, whatever the changes."""
    cursor = DeltaCursor()
    cursor.last = 6
    message = rf"^a block delta message needs an int seq and an int or None base, got seq {seq!r}"
    for changes in (False, True):
        with pytest.raises(DeltaMessageError, match=message):
            cursor.check_sequence(seq, base, changes)  # type: ignore[arg-type]
        with pytest.raises(DeltaMessageError, match=message):
            cursor.check({"seq": seq, "base": base, "rows": {"a": []} if changes else {}})
    assert cursor.last == 6


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
