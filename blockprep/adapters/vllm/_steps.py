"""A scheduler step's row operations for the vLLM facade (:mod:`blockprep.adapters.vllm`).

The checks of ``apply_step``'s arguments (ids, rows, moves) and their translation into one
:meth:`~blockprep.BlockTable.apply_deltas` call per group; and :func:`apply_packed`, a
:mod:`blockprep.packed` message's records planned through every group's kernel (the payload read
in place) before any group is written.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import INT32_MAX, NEGATIVE_ID_MESSAGE, has_integer_dtype, is_integer_id
from blockprep._row_deltas import RowsPlan, packed_changes
from blockprep.block_table import BlockTable
from blockprep.errors import BlockprepTypeError, BlockprepValueError, UnknownRowError
from blockprep.wire import DeltaCursor

_T = TypeVar("_T")

Ids = Sequence[int] | npt.NDArray[Any] | torch.Tensor
"""One group's block ids: a list (the fast path), a tuple, a 1-D integer array or tensor."""

GroupIds = Sequence[Ids]
"""One id list per KV cache group (vLLM's ``tuple[list[int], ...]``)."""

RowItems = Mapping[int, _T] | Iterable[tuple[int, _T]]
"""Per-row values: a ``{row: value}`` mapping or ``(row, value)`` pairs."""

_INT_ONLY = {int}


def step_items(items: RowItems[_T], name: str) -> Iterable[tuple[int, _T]]:
    """``(row, value)`` pairs of a mapping, a list or tuple of pairs, or another iterable of
    them; ``TypeError`` naming ``name`` for anything else."""
    if type(items) is list or type(items) is tuple:
        return items
    if isinstance(items, Mapping):
        return items.items()
    pairs: Iterable[tuple[int, _T]] = iterable(items, name, "(row, ids) pairs or a mapping")
    return pairs


def iterable(items: Any, name: str, what: str) -> Any:
    """``items`` when it is iterable (not a string); ``TypeError`` naming ``name`` otherwise."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise BlockprepTypeError(f"{name} must be {what}, got {type(items).__name__}")
    return items


def unknown_row(where: str) -> UnknownRowError:
    """The facade's error for a delta on a row whose ids are unknown (``where``: the row)."""
    return UnknownRowError(
        f"{where} holds unknown ids (never written by this table, or invalidated): "
        "write the whole row with add_row() first"
    )


def plain_ids(ids: object) -> bool:
    """Whether ``ids`` is a list of plain ints in ``[0, INT32_MAX]`` (decided in C)."""
    if type(ids) is not list:
        return False
    if len(ids) == 1:
        x = ids[0]
        return type(x) is int and 0 <= x <= INT32_MAX
    return not ids or (set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) <= INT32_MAX)


def checked_ids(where: str, ids: object, count: int, max_blocks: int) -> list[int]:
    """``ids`` as plain ints for a row holding ``count`` of at most ``max_blocks`` blocks;
    ``TypeError``/``ValueError`` naming ``where`` (the row) and the offending value."""
    if plain_ids(ids):
        values: list[Any] = ids  # type: ignore[assignment]
    else:
        if isinstance(ids, (np.ndarray, torch.Tensor)):
            if ids.ndim != 1:
                raise BlockprepValueError(
                    f"{where} block ids must be one-dimensional, got shape {tuple(ids.shape)}"
                )
            if not has_integer_dtype(ids):
                raise BlockprepTypeError(
                    f"{where} block ids have dtype {ids.dtype}; block IDs must be integers"
                )
            raw: list[Any] = ids.tolist()
        elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            name = type(ids).__name__
            raise BlockprepTypeError(f"{where} block ids must be a sequence of ints, got {name}")
        else:
            raw = list(ids)
        values = []
        for x in raw:
            if not is_integer_id(x):
                name = type(x).__name__
                raise BlockprepTypeError(
                    f"{where} holds {x!r} of type {name}; block IDs must be integers"
                )
            value = operator.index(x)
            if value < 0:
                raise BlockprepValueError(f"{NEGATIVE_ID_MESSAGE} ({where}, id {value})")
            if value > INT32_MAX:
                raise BlockprepValueError(f"{where} holds block ID {value}, maximum is {INT32_MAX}")
            values.append(value)
    if count + len(values) > max_blocks:
        raise BlockprepValueError(
            f"{where} would hold {count + len(values)} blocks, maximum is {max_blocks}"
        )
    return values


def step_deltas(
    table: BlockTable,
    finished: Iterable[int],
    appended: Iterable[tuple[int, Ids | None]],
    added: Iterable[tuple[int, Ids]],
    moves: Iterable[tuple[int, int]],
) -> tuple[dict[int, int], dict[int, Any], list[tuple[int, int]]]:
    """One group's step as ``apply_deltas`` arguments (``{row: 0}`` truncations, ``{row: ids}``
    appends) and the moves, whose rows are checked here: ``apply_deltas`` checks the rest."""
    rows = iterable(finished, "finished", "an iterable of rows")
    truncate = dict.fromkeys([_row(table, row) for row in rows], 0)
    append: dict[int, Any] = {}
    for row, ids in appended:
        if _row(table, row) in append:
            raise BlockprepValueError(f"block-table row {row} appears more than once in appended")
        if ids is not None:
            append[row] = ids
    replaced: set[int] = set()
    for row, ids in added:
        if _row(table, row) in replaced:
            raise BlockprepValueError(f"block-table row {row} appears more than once in added")
        if row in append:
            raise BlockprepValueError(f"block-table row {row} appears in both appended and added")
        replaced.add(row)
        truncate[row] = 0
        append[row] = ids
    return truncate, append, checked_moves(table, moves)


def _row(table: BlockTable, row: object) -> int:
    """``row``, a row of ``table``: the table's ``TypeError`` or ``IndexError`` otherwise (before
    it is hashed or compared: a row object may do anything there)."""
    if type(row) is not int or not 0 <= row < table.num_rows:
        table.cached_ids(row)  # type: ignore[arg-type]  # raises, naming the row
    return row  # type: ignore[return-value]


def checked_moves(table: BlockTable, moves: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``moves`` as a list of ``(src, tgt)`` pairs whose rows are rows of ``table``: the table's
    ``TypeError`` or ``IndexError`` otherwise, naming the row."""
    if type(moves) is tuple and not moves:
        return []
    pairs = moves if type(moves) is list else list(iterable(moves, "moves", "(src, tgt) pairs"))
    num_rows = table.num_rows
    for pair in pairs:
        for row in pair:
            if type(row) is not int or not 0 <= row < num_rows:
                table.cached_ids(row)  # raises the table's TypeError or IndexError
    return pairs


def where(group: int, row: int) -> str:
    """A multi-group row in an error message."""
    return f"KV cache group {group} block-table row {row}"


def apply_packed(
    tables: Sequence[BlockTable],
    rows: list[int],
    cursor: DeltaCursor,
    message: object,
    moves: Iterable[tuple[int, int]],
) -> None:
    """Apply a packed message (``group``: the index in ``tables``, ``row``: the table row), then
    ``moves``, to ``tables``; ``cursor`` checks the message's ``seq`` and ``base`` and holds its
    ``seq`` once it is applied. ``rows`` is ``list(range(num_rows))``.

    Everything is checked first: the moves' rows, the header and records, the sequence, every
    group's records against its rows' ids (one kernel plan per group); then each group's plan is
    committed and the moves copied. With several tables an error names the group first.

    Raises:
        DeltaMessageError, DeltaSequenceError, ValueError: as
            :meth:`blockprep.BlockTable.apply_packed` (nothing written in any group).
        TypeError, IndexError: a move that is no pair of rows.
    """
    pairs = checked_moves(tables[0], moves)
    if len(tables) == 1:  # one table: its own plan and commit, at once
        tables[0].apply_packed(message, cursor)
    else:
        seq, base, count, data, changes = packed_changes(message, rows, len(tables))
        cursor.check_sequence(seq, base, count > 0)
        plans: list[RowsPlan] = []
        for g, (table, group) in enumerate(zip(tables, changes, strict=True)):
            if not group:
                continue
            try:
                plans.append(table.plan_records(data, group, whole=base is None))
            except BlockprepValueError as error:
                raise type(error)(f"KV cache group {g}: {error}") from None
        # Everything is checked: from here on nothing raises.
        for plan in plans:
            plan.table.commit(plan)
        cursor.last = seq
    if pairs:
        for table in tables:
            for src, tgt in pairs:
                table.copy_row(src, tgt)
