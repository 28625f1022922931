"""A decode step's dynamic inputs: the compiled ``int_range`` / ``decode_inputs`` and their twin
(:mod:`blockprep.engine.dynamic`) against a dense model written from seed-semantics 6.5, and
against each other on valid and malformed arguments (same results, same buffers, same exception
types and messages, nothing written on a refusal).

The compiled module is imported directly, so this runs in the twin-forced pass too; it is skipped
only where the extension was not built.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep.engine import dynamic

compiled = pytest.importorskip("blockprep.engine._kernel")

IMPLEMENTATIONS = [dynamic, compiled]


def model(source: list[int], tokens: list[int], seq: list[int], S: int) -> tuple[Any, ...]:
    """Seed-semantics 6.5 for the standard step: row t copies request source[t]."""
    ids = [[tokens[q]] * S for q in source]
    positions = [[seq[q] - 1] * S for q in source]
    kv = [seq[q] for q in source]
    return ids, positions, kv


def outputs(T: int, S: int, fill: int = 7) -> list[np.ndarray]:
    return [
        np.full((T, S), fill, np.int64),
        np.full((T, S), fill, np.int32),
        np.full(T, fill, np.int32),
    ]


def call(module: Any, name: str, *args: Any) -> tuple[str, Any]:
    """What a call gives: ("ok", result) or (exception type, message)."""
    try:
        return "ok", getattr(module, name)(*args)
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)


@st.composite
def steps(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], int]:
    A = draw(st.integers(1, 12))
    T = draw(st.integers(1, 24))
    source = draw(st.lists(st.integers(0, A - 1), min_size=T, max_size=T))
    tokens = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=A, max_size=A))
    seq = draw(st.lists(st.integers(1, 2**31 - 1), min_size=A, max_size=A + 3))
    return source, tokens, seq, draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(steps(), st.booleans())
def test_decode_inputs_equal_the_model(step: Any, strided: bool) -> None:
    source, tokens, seq, S = step
    tok = np.array(tokens, np.int64)
    if strided:  # a token column of [A, 2] rows, as token_column gives it
        tok = np.stack([tok, tok * 0], axis=1)[:, 0]
    want = model(source, tokens, seq, S)
    for module in IMPLEMENTATIONS:
        out = outputs(len(source), S)
        module.decode_inputs(np.array(source, np.intp), tok, np.array(seq, np.int64), *out)
        assert [o.tolist() for o in out] == list(want), module.__name__


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20), st.data())
def test_int_range_equals_min_and_max(values: list[int], data: st.DataObject) -> None:
    n = data.draw(st.integers(1, len(values)))
    array = np.array(values, np.int64)
    for module in IMPLEMENTATIONS:
        assert module.int_range(array, n) == (min(values[:n]), max(values[:n]))
        assert module.int_range(array[::-1], n) == (min(values[::-1][:n]), max(values[::-1][:n]))


WRONG = [  # made anew for each call: some are views a call must not be able to keep
    lambda: None,
    lambda: [0, 1],
    lambda: b"\x00" * 16,
    lambda: np.zeros(2, np.int32),
    lambda: np.zeros(2, np.float64),
    lambda: np.zeros(2, np.uint64),
    lambda: np.zeros((2, 1), np.int64),
    lambda: np.zeros(2, np.int64).astype(">i8"),
    lambda: np.zeros(4, np.int64)[::2],
    lambda: np.zeros((2, 2), np.int64).T,
    lambda: np.zeros(0, np.int64),
    lambda: np.zeros(2, np.int16),
    lambda: np.array([0, 5], np.intp),
    lambda: np.array([-1, 0], np.intp),
    lambda: np.array([0, 2**31], np.int64),
    lambda: np.array([0, 1], np.int64),
    lambda: memoryview(b"\x00" * 16).cast("q"),
    lambda: memoryview(np.zeros(2, np.int64)).toreadonly(),
]


def malformed() -> st.SearchStrategy[tuple[int, int]]:
    """An argument index of decode_inputs and something wrong to put there (its WRONG index)."""
    return st.tuples(st.integers(0, 5), st.integers(0, len(WRONG) - 1))


@settings(max_examples=400, deadline=None)
@given(malformed(), st.integers(1, 3))
def test_decode_inputs_refuses_alike_and_writes_nothing(bad: tuple[int, int], S: int) -> None:
    index, wrong = bad
    base = [np.array([0, 1], np.intp), np.array([11, 12], np.int64), np.array([3, 4], np.int64)]
    results = []
    for module in IMPLEMENTATIONS:
        out = outputs(2, S)
        args: list[Any] = [*base, *out]
        args[index] = WRONG[wrong]()
        before = [o.copy() for o in out]
        got = call(module, "decode_inputs", *args)
        if got[0] != "ok":
            assert all(np.array_equal(o, b) for o, b in zip(out, before, strict=True))
        results.append((got, [o.tolist() for o in out]))
    assert results[0] == results[1]


@pytest.mark.parametrize(
    "args",
    [
        (np.array([1, 2, 3], np.int64), 0),
        (np.array([1, 2, 3], np.int64), 4),
        (np.array([1, 2, 3], np.int64), True),
        (np.array([1, 2, 3], np.int64), 2**70),
        (np.array([1, 2, 3], np.int64), 1.0),
        (np.array([1, 2, 3], np.int32), 1),
        (np.zeros((2, 2), np.int64), 1),
        ([1, 2], 1),
        (None, 1),
    ],
)
def test_int_range_refuses_alike(args: tuple[Any, Any]) -> None:
    got = [call(module, "int_range", *args) for module in IMPLEMENTATIONS]
    assert got[0] == got[1]
    assert got[0][0] != "ok"


def test_decode_inputs_refusals_name_the_value() -> None:
    out = outputs(2, 1)
    for module in IMPLEMENTATIONS:
        with pytest.raises(ValueError, match=r"source\[1\] = 2 is not a request in \[0, 2\)"):
            module.decode_inputs(
                np.array([0, 2], np.intp), np.array([1, 2]), np.array([3, 4]), *out
            )
        with pytest.raises(ValueError, match=r"seq\[1\] = 0 is not a length in \[1, 2\*\*31\)"):
            module.decode_inputs(
                np.array([0, 0], np.intp), np.array([1, 2]), np.array([3, 0]), *out
            )
        with pytest.raises(ValueError, match="kv_seq_lens"):
            module.decode_inputs(
                np.array([0, 1], np.intp),
                np.array([1, 2]),
                np.array([3, 4]),
                *out[:2],
                np.zeros(3, np.int32),
            )
    assert [o.tolist() for o in out] == [[[7], [7]], [[7], [7]], [7, 7]]
