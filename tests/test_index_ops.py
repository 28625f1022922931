"""A grouped wire message's rows by group: the compiled ``index_ops`` against its twin
(:func:`blockprep.wire.index_ops`) and against a model of the walk it replaces (the DeepSeek
preparer's ``{request: {group: ops}}`` -> per group ``{table row: ops}``), on valid and malformed
messages. Runs in the twin-forced pass too (the compiled module is imported directly); skipped
only where the extension was not built."""

from __future__ import annotations

from collections import UserDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep import wire

compiled = pytest.importorskip("blockprep.engine._kernel")

GROUPS = {"a": 0, "b": 1, "c": 2}


def model(rows: dict[Any, Any], row_of: dict[Any, Any]) -> list[dict[int, Any]] | None:
    """What the walk takes: every request in the batch with an int row, every value a dict,
    every name a known str; anything else is for the walk to word (None)."""
    out: list[dict[int, Any]] = [{} for _ in GROUPS]
    for request, by_group in rows.items():
        row = row_of.get(request)
        if type(row) is not int or type(by_group) is not dict:
            return None
        for name, ops in by_group.items():
            if type(name) is not str or name not in GROUPS:
                return None
            out[GROUPS[name]][row] = ops
    return out


requests = st.one_of(st.text(max_size=3), st.integers(-3, 40), st.tuples(st.integers(0, 3)))
names = st.one_of(
    st.sampled_from(["a", "b", "c"]), st.sampled_from(["d", "", "A"]), st.integers(0, 3)
)
ops = st.one_of(st.just([["a", [7]]]), st.lists(st.integers(), max_size=2), st.none())
values = st.one_of(
    st.dictionaries(names, ops, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), ops, max_size=3),
    st.sampled_from([None, [], "a", ()]),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(requests, values, max_size=6), st.data())
def test_index_ops_agrees_with_the_twin_and_the_model(rows: dict[Any, Any], data: Any) -> None:
    row_of: dict[Any, Any] = {}
    for k, request in enumerate(rows):
        choice = data.draw(st.integers(0, 9))
        if choice < 8:
            row_of[request] = k
        elif choice == 8:
            row_of[request] = data.draw(st.sampled_from([None, "1", 1.0, True]))
    want = model(rows, row_of)
    assert wire.index_ops(rows, row_of, GROUPS) == want
    assert compiled.index_ops(rows, row_of, GROUPS) == want


@pytest.mark.parametrize("rows", [None, [], UserDict({"r": {"a": []}}), 3])
def test_a_message_that_is_no_dict_is_left_to_the_walk(rows: Any) -> None:
    assert wire.index_ops(rows, {"r": 0}, GROUPS) is None
    assert compiled.index_ops(rows, {"r": 0}, GROUPS) is None


@pytest.mark.parametrize("args", [({}, None, GROUPS), ({}, {}, None), ({}, UserDict(), GROUPS)])
def test_row_of_and_groups_must_be_dicts(args: tuple[Any, ...]) -> None:
    for index_ops in (wire.index_ops, compiled.index_ops):
        with pytest.raises(TypeError, match="row_of and groups must be dicts"):
            index_ops(*args)


class Exploding:
    """A request whose comparison raises (a lookup that finds its hash runs it)."""

    def __hash__(self) -> int:
        return hash("r")

    def __eq__(self, other: object) -> bool:
        raise ZeroDivisionError("compared")


def test_an_error_from_a_lookup_goes_up_alike() -> None:
    for index_ops in (wire.index_ops, compiled.index_ops):
        with pytest.raises(ZeroDivisionError, match="compared"):
            index_ops({"r": {"a": []}}, {Exploding(): 0}, GROUPS)
