"""A grouped wire message's rows by group: the compiled ``index_ops`` against a model of the walk
it speeds up (the DeepSeek preparer's ``{request: {group: ops}}`` -> per group ``{table row:
ops}``, ``_walk``, which the twin backend runs instead) and against that walk itself, on valid
and malformed messages. Runs in the twin-forced pass too (the compiled module is imported
directly); skipped only where the extension was not built."""

from __future__ import annotations

from collections import UserDict
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep.adapters.deepseek import tables

compiled = pytest.importorskip("blockprep.engine._kernel")

GROUPS = tables._GROUP_INDEX  # the DeepSeek groups, by name
NAMES = list(GROUPS)


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
names = st.one_of(st.sampled_from(NAMES), st.sampled_from(["d", "", "ORI"]), st.integers(0, 3))
ops = st.one_of(st.just([["a", [7]]]), st.lists(st.integers(), max_size=2), st.none())
values = st.one_of(
    st.dictionaries(names, ops, max_size=3),
    st.dictionaries(st.sampled_from(NAMES), ops, max_size=3),
    st.sampled_from([None, [], "a", ()]),
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(requests, values, max_size=6), st.data())
def test_index_ops_agrees_with_the_model_and_the_walk(rows: dict[Any, Any], data: Any) -> None:
    row_of: dict[Any, Any] = {}
    for k, request in enumerate(rows):
        choice = data.draw(st.integers(0, 9))
        if choice < 8:
            row_of[request] = k
        elif choice == 8:
            row_of[request] = data.draw(st.sampled_from([None, "1", 1.0, True]))
    want = model(rows, row_of)
    got = compiled.index_ops(rows, row_of, GROUPS)
    assert got == want
    if got is not None:  # what it takes, the preparer's own walk makes alike
        assert list(tables._walk(rows, SimpleNamespace(row_of=row_of)).values()) == got


@pytest.mark.parametrize("rows", [None, [], UserDict({"r": {"ori": []}}), 3])
def test_a_message_that_is_no_dict_is_left_to_the_walk(rows: Any) -> None:
    assert compiled.index_ops(rows, {"r": 0}, GROUPS) is None


@pytest.mark.parametrize("args", [({}, None, GROUPS), ({}, {}, None), ({}, UserDict(), GROUPS)])
def test_row_of_and_groups_must_be_dicts(args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError, match="row_of and groups must be dicts"):
        compiled.index_ops(*args)


class Exploding:
    """A request whose comparison raises (a lookup that finds its hash runs it)."""

    def __hash__(self) -> int:
        return hash("r")

    def __eq__(self, other: object) -> bool:
        raise ZeroDivisionError("compared")


def test_an_error_from_a_lookup_goes_up() -> None:
    with pytest.raises(ZeroDivisionError, match="compared"):
        compiled.index_ops({"r": {"ori": []}}, {Exploding(): 0}, GROUPS)
