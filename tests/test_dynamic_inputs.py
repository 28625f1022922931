"""A paged decode step's dynamic inputs: the compiled ``step_slots``, ``paged_step`` and
``differing_rows`` and their twin (:mod:`blockprep._engine.dynamic`) against models written from
seed-semantics 2.3 (a paged decode slot), and against each other on valid and malformed
arguments (same results, same buffers, same exception types and messages, nothing written on a
refusal).

The compiled module is imported directly, so this runs in the twin-forced pass too; it is skipped
only where the extension was not built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep._engine import dynamic

compiled = pytest.importorskip("blockprep._engine._kernel")

IMPLEMENTATIONS = [dynamic, compiled]


def call(module: Any, name: str, *args: Any) -> tuple[str, Any]:
    """What a call gives: ("ok", result) or (exception type, message)."""
    try:
        return "ok", getattr(module, name)(*args)
    except (TypeError, ValueError, IndexError) as error:
        return type(error).__name__, str(error)


INT32_MAX = 2**31 - 1


def model_slots(
    seq_lens: list[Any],
    items: dict[int, Any],
    lengths: list[int],
    table: list[int],
    width: int,
    page_size: int,
    max_seq_len: int,
) -> list[int] | None:
    """Seed-semantics 2.3 for a paged decode step, where every row must pass: a row's ids are its
    ``items`` list, or the ``lengths[row]`` ids the table row holds (at most ``width``); its
    sequence length an int in ``[1, max_seq_len]``; its page at ``(seq - 1) // page_size``
    present, an int, not negative, and every slot of the page within int32."""
    slots = []
    for row, seq in enumerate(seq_lens):
        if type(seq) is not int or not 1 <= seq <= max_seq_len:
            return None
        ids = items.get(row)
        if ids is None:
            ids = table[row * width : row * width + max(0, min(lengths[row], width))]
        elif type(ids) is not list or len(ids) > width:
            return None
        page_index, offset = divmod(seq - 1, page_size)
        if page_index >= len(ids):
            return None
        page = ids[page_index]
        if type(page) is not int or page < 0 or page * page_size + page_size - 1 > INT32_MAX:
            return None
        slots.append(page * page_size + offset)
    return slots


SEQ = st.one_of(
    st.integers(1, 40),
    st.integers(-3, 45),
    st.sampled_from([True, 2.0, 2**70, -(2**70), None]),
)
PAGE = st.one_of(
    st.integers(-2, 60),
    st.sampled_from([2**31 // 4 - 1, 2**31 // 4, 2**31 - 1, 2**63, True, 3.0, None]),
)


@st.composite
def slot_steps(draw: st.DrawFn) -> tuple[Any, ...]:
    rows = draw(st.integers(0, 8))
    width = draw(st.integers(1, 6))
    page_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_seq_len = draw(st.integers(1, width * page_size + 2))
    seq_lens = draw(st.lists(SEQ, min_size=rows, max_size=rows))
    lengths = draw(st.lists(st.integers(-1, width + 2), min_size=rows, max_size=rows + 2))
    cells = rows * width + draw(st.integers(0, 3))
    table = draw(st.lists(st.integers(-1, 2**31 // 4 + 1), min_size=cells, max_size=cells))
    ids = st.one_of(
        st.none(),
        st.lists(PAGE, max_size=width + 1),
        st.lists(PAGE, max_size=width).map(tuple),
    )
    items = draw(st.dictionaries(st.integers(-1, rows + 1), ids, max_size=rows + 1))
    return seq_lens, items, lengths, table, width, page_size, max_seq_len


@settings(max_examples=600, deadline=None)
@given(slot_steps())
def test_step_slots_equal_the_model(step: tuple[Any, ...]) -> None:
    seq_lens, items, lengths, table, width, page_size, max_seq_len = step
    want = model_slots(*step)
    strided = np.stack([np.array(lengths, np.int32)] * 2, axis=1)[:, 0]  # as BlockTable's
    for module in IMPLEMENTATIONS:
        for held in (np.array(lengths, np.int32), strided):
            got = module.step_slots(
                seq_lens, items, held, np.array(table, np.int32), width, page_size, max_seq_len
            )
            assert got == want, module.__name__


def test_step_slots_of_a_step() -> None:
    """Two rows from the table, one from the message; then one row's page missing."""
    lengths = np.array([2, 3, 0], np.int32)
    table = np.arange(12, dtype=np.int32)  # row r holds 4r, 4r + 1, ...
    for module in IMPLEMENTATIONS:
        args = (lengths, table, 4, 128, 1000)
        assert module.step_slots([1, 129, 5], {2: [7]}, *args) == [0, 5 * 128, 7 * 128 + 4]
        assert module.step_slots([1, 400, 5], {2: [7]}, *args) is None  # row 1: page 3 of 3
        assert module.step_slots([1, 129], {}, *args) == [0, 5 * 128]


SLOT_ARGS: list[Any] = [[3], {}, np.array([1], np.int32), np.array([5, 6], np.int32), 2, 4, 8]
SLOT_WRONG: list[tuple[int, Any]] = [
    (0, (3,)),
    (0, None),
    (1, [(0, [1])]),
    (1, {"0": [1]}),
    (1, {True: [1]}),
    (2, np.array([1], np.int64)),
    (2, np.zeros((1, 1), np.int32)),
    (2, np.zeros(0, np.int32)),
    (2, [1]),
    (2, np.zeros(2, "datetime64[s]")),
    (3, np.array([5], np.int32)),
    (3, np.zeros(4, "datetime64[s]")),
    (3, np.array([5, 6], np.float32)),
    (3, None),
    (4, 0),
    (4, 2**31),
    (4, 2.0),
    (4, True),
    (5, -1),
    (5, None),
    (6, 0),
    (6, 2**70),
]


@pytest.mark.parametrize("where,value", SLOT_WRONG)
def test_step_slots_refuse_alike(where: int, value: Any) -> None:
    args = list(SLOT_ARGS)
    args[where] = value
    got = [call(module, "step_slots", *args) for module in IMPLEMENTATIONS]
    assert got[0] == got[1]
    assert got[0][0] != "ok", got


TOKEN = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([-(2**31) - 1, 2**31, -(2**63), -(2**63) + 1, 2**63 - 1, 2**63, True, 1.0]),
)


def paged_outputs(rows: int, token_dtype: Any, out_dtype: Any) -> list[np.ndarray]:
    """A token column (column 0 of a 2-D buffer, strided, as the token buffer's) and two flat
    columns, each with spare cells past the rows, filled with a marker."""
    return [
        np.full((rows + 2, 3), 77, token_dtype)[:, 0],
        np.full(rows + 1, 77, out_dtype),
        np.full(rows + 3, 77, out_dtype),
    ]


@settings(max_examples=600, deadline=None)
@given(
    slot_steps(),
    st.sampled_from([np.int32, np.int64]),
    st.sampled_from([np.int32, np.int64]),
    st.data(),
)
def test_paged_step_writes_the_model_or_nothing(
    step: tuple[Any, ...], token_dtype: Any, out_dtype: Any, data: st.DataObject
) -> None:
    """True and the model's slots, the tokens and the lengths in the first rows when every row
    passes and every token fits its column (int64's least value does not); otherwise False and
    every cell as it was. Both implementations alike."""
    seq_lens, items, lengths, table, width, page_size, max_seq_len = step
    rows = len(seq_lens)
    n_tokens = data.draw(st.sampled_from([rows, rows, rows, rows + 1, max(rows - 1, 0)]))
    tokens = data.draw(st.lists(TOKEN, min_size=n_tokens, max_size=n_tokens))
    slots = model_slots(*step)
    info = np.iinfo(token_dtype)
    fits = len(tokens) == rows and all(
        type(t) is int and max(int(info.min), -(2**63) + 1) <= t <= int(info.max) for t in tokens
    )
    for module in IMPLEMENTATIONS:
        out = paged_outputs(rows, token_dtype, out_dtype)
        got = module.paged_step(
            seq_lens, tokens, items, np.array(lengths, np.int32), np.array(table, np.int32),
            width, page_size, max_seq_len, *out,
        )  # fmt: skip
        want = paged_outputs(rows, token_dtype, out_dtype)
        if slots is not None and fits:
            want[0][:rows], want[1][:rows], want[2][:rows] = tokens, seq_lens, slots
        assert got is (slots is not None and fits), module.__name__
        assert [o.tolist() for o in out] == [w.tolist() for w in want], module.__name__
        checked = paged_outputs(rows, token_dtype, out_dtype)  # write=False: the checks alone
        answer = module.paged_step(
            seq_lens, tokens, items, np.array(lengths, np.int32), np.array(table, np.int32),
            width, page_size, max_seq_len, *checked, data.draw(st.sampled_from([False, 0, ()])),
        )  # fmt: skip
        assert answer is got, module.__name__
        assert [o.tolist() for o in checked] == [
            o.tolist() for o in paged_outputs(rows, token_dtype, out_dtype)
        ], module.__name__


PAGED_ARGS: list[Any] = [
    [3],
    [9],
    {},
    np.array([1], np.int32),
    np.array([5, 6], np.int32),
    2,
    4,
    8,
]
PAGED_WRONG: list[tuple[int, Any]] = [
    (0, (3,)),
    (1, (9,)),
    (1, None),
    (2, [(0, [1])]),
    (2, {"0": [1]}),
    (3, np.array([1], np.int64)),
    (4, None),
    (5, 0),
    (6, 2.0),
    (7, 2**70),
    (8, np.zeros(4, np.int16)),
    (8, np.zeros(0, np.int32)),
    (8, np.zeros((2, 2), np.int32)),
    (8, np.zeros(4, np.float64)),
    (8, np.zeros(4, np.int32).view(np.uint32)),
    (8, [0, 0]),
    (8, bytes(16)),
    (8, np.zeros(4, "datetime64[s]")),
    (9, np.zeros(4, "timedelta64[s]")),
    (9, np.zeros(4, np.int32)[::-1].copy().astype(">i4")),
    (9, np.zeros(0, np.int64)),
    (10, None),
    (10, np.zeros(2, np.int64)[:0]),
]


class _NoTruth:
    def __bool__(self) -> bool:
        raise ValueError("no truth value")


def test_paged_step_reads_write_first() -> None:
    """``write`` is read before anything else: an object without a truth value raises from both,
    even with other arguments wrong, and nothing is written."""
    for module in IMPLEMENTATIONS:
        out = [np.full(2, 5, np.int32), np.full(2, 5, np.int32), np.full(2, 5, np.int64)]
        args = [*PAGED_ARGS, *out, _NoTruth()]
        args[0] = None
        with pytest.raises(ValueError, match="no truth value"):
            module.paged_step(*args)
        assert [o.tolist() for o in out] == [[5, 5], [5, 5], [5, 5]]


@pytest.mark.parametrize("where,value", PAGED_WRONG)
def test_paged_step_refuses_alike_and_writes_nothing(where: int, value: Any) -> None:
    """Bad arguments: the same exception and message from both, in the same order (the
    step_slots arguments, then the tokens, then each output), and nothing written."""
    got = []
    for module in IMPLEMENTATIONS:
        out = [np.full(2, 5, np.int32), np.full(2, 5, np.int32), np.full(2, 5, np.int64)]
        args = [*PAGED_ARGS, *out]
        args[where] = value
        got.append(call(module, "paged_step", *args))
        assert [o.tolist() for o in out] == [[5, 5], [5, 5], [5, 5]]
    assert got[0] == got[1]
    assert got[0][0] != "ok", got


def _overlapping(kind: str) -> list[np.ndarray]:
    """Three output columns of two rows, two of them sharing cells."""
    if kind == "same":
        one = np.full(2, 5, np.int32)
        return [one, one, np.full(2, 5, np.int64)]
    if kind == "shifted":  # seq_out starts at token_out's second cell
        base = np.full(3, 5, np.int32)
        return [base[:2], base[1:], np.full(2, 5, np.int64)]
    if kind == "interleaved":  # even and odd cells: the extents meet, the cells do not
        base = np.full(4, 5, np.int64)
        return [np.full(2, 5, np.int32), base[0::2], base[1::2]]
    base = np.full(4, 5, np.int32)  # "apart": two halves of one array
    return [base[:2], base[2:], np.full(2, 5, np.int64)]


@pytest.mark.parametrize("kind", ["same", "shifted", "interleaved", "apart"])
def test_paged_step_refuses_outputs_that_overlap(kind: str) -> None:
    """Outputs whose extents meet are refused by both before any write (the C wrote one
    column's cells over another's, the twin in another order); columns apart are written."""
    got = []
    for module in IMPLEMENTATIONS:
        out = _overlapping(kind)
        table = (np.array([2, 2], np.int32), np.arange(8, dtype=np.int32), 4, 128, 1000)
        got.append(call(module, "paged_step", [1, 129], [11, 12], {}, *table, *out))
        if kind != "apart":
            assert all(o.tolist() == [5, 5] for o in out)
    assert got[0] == got[1]
    if kind == "apart":
        assert got[0][0] == "ok"
    else:
        assert got[0] == ("ValueError", "token_out, seq_out and slot_out must not overlap")


def test_paged_step_of_a_step() -> None:
    """Both rows from the table, then row 1 from a message; a token that does not fit; a
    read-only output refused."""
    for module in IMPLEMENTATIONS:
        out = [np.zeros(2, np.int32), np.zeros(2, np.int32), np.zeros(2, np.int64)]
        args = (np.array([2, 2], np.int32), np.arange(8, dtype=np.int32), 4, 128, 1000)
        assert module.paged_step([1, 129], [11, 12], {}, *args, *out) is True
        assert [o.tolist() for o in out] == [[11, 12], [1, 129], [0, 5 * 128]]
        assert module.paged_step([1, 129], [11, 12], {1: [6, 9]}, *args, *out) is True
        assert out[2].tolist() == [0, 9 * 128]
        assert module.paged_step([1, 129], [11, 2**31], {}, *args, *out) is False
        assert out[0].tolist() == [11, 12]
        frozen = np.zeros(2, np.int32)
        frozen.flags.writeable = False
        with pytest.raises(TypeError, match="seq_out must be a writable 1-D int32 or int64"):
            module.paged_step([1, 129], [11, 12], {}, *args, out[0], frozen, out[2])


ID = st.one_of(
    st.sampled_from(["r0", "r1", "r2", "a" * 40, "é", "é0", "日本", "日", "\U0001f600"]).map(
        lambda s: "".join(s)  # equal, not the same object; 1-, 2- and 4-byte kinds
    ),
    st.integers(-2, 3),
    st.sampled_from([None, 1.0, float("nan"), (1, 2), True, b"r0"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(ID, ID), max_size=12), st.booleans())
def test_differing_rows_equal_the_model(pairs: list[tuple[Any, Any]], as_tuple: bool) -> None:
    """The rows where ``new[r] != old[r]``; ``None`` unless two lists of one length."""
    new, old = [a for a, _ in pairs], [b for _, b in pairs]
    want = [r for r, (a, b) in enumerate(pairs) if a != b]
    for module in IMPLEMENTATIONS:
        assert module.differing_rows(new, old) == want, module.__name__
        assert module.differing_rows(new, new) == [r for r, a in enumerate(new) if a != a]
        assert module.differing_rows(tuple(new) if as_tuple else new, [*old, 0]) is None
        assert module.differing_rows(new, tuple(old)) is None


class _Shrinking:
    """An id whose ``!=`` empties the other list, or raises."""

    def __init__(self, victim: list[Any] | None) -> None:
        self.victim = victim

    def __ne__(self, other: object) -> bool:
        if self.victim is None:
            raise ValueError("no comparison")
        self.victim.clear()
        return True

    __hash__ = None  # type: ignore[assignment]


def test_differing_rows_survive_a_comparison_that_changes_the_lists() -> None:
    """A ``!=`` that empties a list ends the walk (as two iterators end); one that raises goes up
    from both."""
    for module in IMPLEMENTATIONS:
        old = ["x", "y", "z"]
        assert module.differing_rows([_Shrinking(old), "y", "q"], old) == [0]
        with pytest.raises(ValueError, match="no comparison"):
            module.differing_rows(["x", _Shrinking(None)], ["x", "y"])
        with pytest.raises(TypeError):
            module.differing_rows(["x"])  # type: ignore[call-arg]


class _Growing:
    """An id whose ``!=`` appends a differing row to both lists."""

    def __init__(self, lists: list[list[Any]]) -> None:
        self.lists = lists

    def __ne__(self, other: object) -> bool:
        for rows in self.lists:
            rows.append(len(rows) * (2 if rows is self.lists[0] else 3))
        return True

    __hash__ = None  # type: ignore[assignment]


def test_differing_rows_compare_the_rows_the_lists_had_when_called() -> None:
    """A ``!=`` that grows both lists adds no row to the answer, in both: the C re-read the
    sizes each row and answered ``[0, 2]`` where the twin answered ``[0]``."""
    for module in IMPLEMENTATIONS:
        new: list[Any] = ["x", "y"]
        old: list[Any] = ["w", "y"]
        new[0] = _Growing([new, old])
        assert module.differing_rows(new, old) == [0], module.__name__
        assert len(new) == len(old) == 3
