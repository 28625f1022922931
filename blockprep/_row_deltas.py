"""BlockTable's deltas: ``append``, ``set_ids``, ``truncate`` and ``apply_deltas``, checked, then
given to the table's kernel as :mod:`blockprep.wire` operations (one ``stage`` of ops items and
one commit per call, whatever the number of rows).

The checks and their messages are the table's (the row named, then the offending value); the
kernel checks the ids again and writes only the cells that change. A paged step given as
``{row: length}`` and ``{row: ids}`` dicts of plain ints and int lists (a scheduler step) goes to
the kernel as it is; the checks run only when the kernel refuses it, to pick the message.
A :mod:`blockprep.packed` message's records go to the kernel as word offsets into its payload,
read there in place (:func:`packed_changes`, :meth:`RowDeltas.plan_records`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, Protocol, TypeVar

import numpy as np
import torch

from blockprep import packed
from blockprep._engine import index_records
from blockprep._engine.rules import NEW, OPS
from blockprep._faults import convert, raise_row
from blockprep._ids import (
    INT32_MAX,
    NEGATIVE_ID_MESSAGE,
    NOT_ID_ROWS,
    as_int,
    check_length,
    has_integer_dtype,
    is_integer_id,
)
from blockprep._table_checks import CheckedTable
from blockprep.errors import (
    BlockprepIndexError,
    BlockprepTypeError,
    BlockprepValueError,
    UnknownRowError,
)
from blockprep.wire import APPEND, SET, TRUNCATE, DeltaCursor, DeltaMessageError, apply_ops

_T = TypeVar("_T")

RowItems = Mapping[int, _T] | Iterable[tuple[int, _T]]
"""Per-row values: a ``{row: value}`` mapping or ``(row, value)`` pairs."""


class DeltaTable(CheckedTable, Protocol):
    """What the deltas read and count of their table besides its public API, and what a plan's
    holder commits it to (a :class:`~blockprep.block_table.BlockTable`, which this module does
    not import)."""

    _kernel: Any  # its GroupKernel
    _stay: list[int]  # every row's ids from the row itself
    _hits: int

    def commit(self, plan: RowsPlan) -> int: ...
    def _row_index(self, row: object) -> int: ...
    def _render(
        self, plan: Any, want_rows: bool, rows: list[int] | None = None
    ) -> tuple[int, int]: ...


_INT_ONLY = {int}


def row_items(items: RowItems[_T], what: str) -> Iterable[tuple[int, _T]]:
    """``(row, value)`` pairs from a mapping or an iterable of pairs; ``TypeError`` naming
    ``what`` for anything else (``None``, a string, an item that is not a pair)."""
    if isinstance(items, Mapping):
        return items.items()
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise BlockprepTypeError(
            f"{what} must be (row, value) pairs or a {{row: value}} mapping, "
            f"got {type(items).__name__}"
        )
    return _pairs(items, what)


def _pairs(items: Iterable[Any], what: str) -> Iterable[tuple[int, Any]]:
    for item in items:
        if (type(item) is not tuple or len(item) != 2) and (
            isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2
        ):
            raise BlockprepTypeError(f"{what} items must be (row, value) pairs, got {item!r}")
        yield item[0], item[1]


Changes = dict[int, tuple[int, ...]]
"""One table's packed records: ``{table row: word offsets of its records}`` (in message order)."""


def packed_changes(
    message: object, rows: list[int], groups: int
) -> tuple[int, int | None, int, bytes, list[Changes]]:
    """``(seq, base, count, data, changes)`` of a :mod:`blockprep.packed` message whose records'
    ``row`` is a table row: ``changes[g]`` is group ``g``'s :data:`Changes`. ``rows`` is
    ``list(range(num_rows))`` (kept by the caller: one list for every message).

    Raises:
        DeltaMessageError: :func:`blockprep.packed.records`' faults (version, checksum, a record
            cut, an unknown kind, a group not below ``groups``, a row not below ``len(rows)``).
    """
    seq, base, count, data = packed.header(message)
    index = index_records(data, count, rows, groups)
    if index is None:  # a malformed record: the twin's walk words it
        packed.records(message, len(rows), groups)
        raise AssertionError("index_records refused records that packed.records takes")
    return seq, base, count, data, index


class RowsPlan(NamedTuple):
    """A checked :meth:`BlockTable.plan_rows` step, for :meth:`BlockTable.commit`: ``rows``, the
    rows it writes (the others already hold their ids), in the order given. It holds the checked
    ids themselves: the caller's lists may change before the commit."""

    table: DeltaTable
    epoch: int
    rows: list[int]
    staged: Any  # the kernel's plan
    hits: int


@dataclass(eq=False, slots=True)
class _Entry:
    """One row's deltas in an :meth:`RowDeltas.apply` call: the length it keeps, its kinds of
    delta so far and its operations."""

    row: int
    keep: int
    kinds: set[str] = field(default_factory=set)
    ops: list[list[Any]] = field(default_factory=list)


class RowDeltas:
    """The delta operations of one :class:`~blockprep.block_table.BlockTable` (its methods
    ``append``, ``set_ids``, ``truncate`` and ``apply_deltas`` call these)."""

    def __init__(self, table: DeltaTable) -> None:
        self._table = table
        self._label = "ring block-table" if table.kind == "ring" else "block-table"

    def append(self, row: int, ids: Any) -> int:
        """:meth:`BlockTable.append`."""
        table = self._table
        if type(row) is not int or not 0 <= row < table.num_rows:
            row = table._row_index(row)
        if type(ids) is not list:
            self._known(row)
            ids = self._ids(row, ids)
        kernel = table._kernel
        plan, fault = kernel.stage([row], [[[APPEND, ids]]], table._stay, convert, ops=True)
        if fault is not None:  # the checks pick the message
            length = self._known(row)
            check_length(row, length + len(self._ids(row, ids)), table.max_blocks, table.kind)
            raise AssertionError(f"{self._label} row {row}: the kernel refused {fault}")
        return self._commit(plan, 1, [row])

    def one(self, row: object, op: list[Any], *values: object) -> int:
        """One ``set_ids`` or ``truncate`` op of plain ints on a row, straight to the kernel:
        the cells written; ``0`` when it changes nothing or is not of that form, or when the
        kernel refuses it (:meth:`apply` then decides, and picks the message)."""
        table = self._table
        if type(row) is not int or not 0 <= row < table.num_rows:
            return 0
        for value in values:
            if type(value) is not int and (type(value) is not list or not _plain(value)):
                return 0
        plan, fault = table._kernel.stage([row], [[op]], table._stay, convert, ops=True)
        if fault is not None or not plan:
            return 0
        return self._commit(plan, 1, [row])

    def apply(
        self,
        truncate: RowItems[int],
        set_ids: Iterable[tuple[int, Any, Any]],
        append: RowItems[Any],
    ) -> int:
        """:meth:`BlockTable.apply_deltas` (``truncate`` and ``set_ids`` of one row too)."""
        table = self._table
        plain = type(truncate) is dict and type(append) is dict
        if plain and table.kind == "paged" and not set_ids:
            cells = self._plain_step(truncate, append)  # type: ignore[arg-type]
            if cells is not None:
                return cells
        entries: dict[int, _Entry] = {}
        for row, length in row_items(truncate, "truncate"):
            entry = self._entry(entries, row, "truncate")
            entry.keep = self._length(entry.row, length, entry.keep)
            entry.ops.append([TRUNCATE, entry.keep])
        if isinstance(set_ids, (str, bytes)) or not isinstance(set_ids, Iterable):
            raise BlockprepTypeError(
                f"set_ids must be (row, positions, ids) triples, got {type(set_ids).__name__}"
            )
        for item in set_ids:
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 3:
                raise BlockprepTypeError(
                    f"set_ids items must be (row, positions, ids) triples, got {item!r}"
                )
            row, positions, ids = item
            entry = self._entry(entries, row, "set_ids")
            slots, values = self._sets(entry.row, positions, ids, entry.keep)
            entry.ops.append([SET, slots, values])
        for row, ids in row_items(append, "append"):
            entry = self._entry(entries, row, "append")
            values = self._ids(entry.row, ids)
            if values:
                check_length(entry.row, entry.keep + len(values), table.max_blocks, table.kind)
            entry.ops.append([APPEND, values])
        if not entries:
            return 0
        rows = list(entries)
        items = [entry.ops for entry in entries.values()]
        plan, fault = table._kernel.stage(rows, items, table._stay, convert, ops=True)
        assert fault is None, fault  # every delta was checked above
        return self._commit(plan, len(rows))

    def apply_packed(self, message: object, cursor: DeltaCursor | None) -> int:
        """:meth:`BlockTable.apply_packed`."""
        seq, base, count, data, changes = packed_changes(message, self._table._stay, 1)
        if cursor is not None:
            cursor.check_sequence(seq, base, count > 0)
        rows = changes[0]
        cells = self.apply_records(data, rows, base is None) if rows else 0
        if cursor is not None:
            cursor.last = seq
        return cells

    def plan_records(self, data: bytes, changes: Changes, whole: bool = False) -> Any:
        """:meth:`BlockTable.plan_records`: the kernel's plan of ``changes`` (records of
        ``data`` read in place; ``whole``: every row named starts anew), nothing written."""
        table = self._table
        srcs = table._stay
        if whole:  # a message that builds on nothing: each row's records must start whole
            srcs = srcs[:]
            for row in changes:
                srcs[row] = NEW
        rows = list(changes)
        plan, fault = table._kernel.stage(
            rows, list(changes.values()), srcs, convert, data=data, ops=True
        )
        if fault is not None:
            self._raise_records(data, fault, changes[fault[1]], None if whole else fault[1])
        return plan

    def apply_records(self, data: bytes, changes: Changes, whole: bool = False) -> int:
        """:meth:`plan_records`, then its commit; the cells written."""
        plan = self.plan_records(data, changes, whole)
        return self._commit(plan, len(changes))

    def _raise_records(
        self, data: bytes, fault: tuple[int, int, Any], offsets: tuple[int, ...], src: int | None
    ) -> NoReturn:
        """The error for row ``fault[1]``'s records, which the kernel refused (``src``: the row
        whose ids they apply to, ``None`` for none): a record that does not fit the ids is
        :func:`blockprep.wire.apply_ops`' :class:`DeltaMessageError`, the row named; ids that
        break the table's rules, the builders' error for the ids the records make."""
        code, row, _ = fault
        table = self._table
        held = None if src is None else table._kernel.held(src)
        ops = [packed.op_at(data, offset, row) for offset in offsets]
        try:
            ids = apply_ops(ops, held)
        except DeltaMessageError as error:
            raise DeltaMessageError(f"{error} ({self._label} row {row})") from None
        if code != OPS:
            raise_row(row, ids, held, table.max_blocks, table.kind)
        raise AssertionError(f"{self._label} row {row}: the kernel refused {fault}")

    def _plain_step(self, truncate: dict[Any, Any], append: dict[Any, Any]) -> int | None:
        """A paged step of plain ints and int lists, straight to the kernel; ``None``, having
        changed nothing, when it is not of that form or the kernel refuses it (the checks then
        pick the message)."""
        table = self._table
        num_rows = table.num_rows
        ops: dict[int, list[list[Any]]] = {}
        for row, keep in truncate.items():
            if type(row) is not int or type(keep) is not int or not 0 <= row < num_rows:
                return None
            ops[row] = [[TRUNCATE, keep]]
        for row, ids in append.items():
            if type(row) is not int or type(ids) is not list or not 0 <= row < num_rows:
                return None
            entry = ops.get(row)
            if entry is None:
                ops[row] = [[APPEND, ids]]
            else:
                entry.append([APPEND, ids])
        if not ops:
            return 0
        plan, fault = table._kernel.stage(
            list(ops), list(ops.values()), table._stay, convert, ops=True
        )
        if fault is not None:
            return None
        return self._commit(plan, len(ops))

    def _commit(self, plan: Any, visited: int, rows: list[int] | None = None) -> int:
        """Commit ``plan`` (of ``visited`` rows); the cells written."""
        table = self._table
        written, cells = table._render(plan, rows is None, rows) if plan else (0, 0)
        table._hits += visited - written
        return cells

    # --- the checks ----------------------------------------------------------------------------

    def _known(self, row: int) -> int:
        """How many ids row ``row`` holds; :class:`UnknownRowError` when they are unknown."""
        length = self._table._kernel.length(row)
        if length < 0:
            raise UnknownRowError(
                f"block-table row {row} holds unknown ids (never written by this table, or "
                "invalidated): write the whole row with write_row() before a delta"
            )
        return int(length)

    def _entry(self, entries: dict[int, _Entry], row: object, what: str) -> _Entry:
        """The pending deltas of ``row`` (made on first use)."""
        table = self._table
        index = row if type(row) is int and 0 <= row < table.num_rows else table._row_index(row)
        entry = entries.get(index)
        if entry is None:
            entry = entries[index] = _Entry(index, self._known(index))
        if what in entry.kinds:
            raise BlockprepValueError(
                f"{self._label} row {index} appears more than once in {what} "
                "(one delta of each kind per row and call)"
            )
        entry.kinds.add(what)
        return entry

    def _ids(self, row: int, ids: object) -> list[int]:
        """``ids`` of a delta on row ``row`` as plain checked ints (a list the caller may keep
        using: read it, never store it); errors naming the row and the id."""
        if type(ids) is list and (
            not ids
            or (set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) <= INT32_MAX)
        ):
            return ids
        values = self._list(row, ids, "ids", "block IDs")
        if _plain(values):
            return values
        return [_delta_id(self._label, row, x) for x in values]

    def _list(self, row: int, values: object, what: str, items: str) -> list[Any]:
        """``values`` (a sequence, or a 1-D array or tensor) of a delta on ``row`` as a list;
        ``TypeError`` or ``ValueError`` naming the row. An array of ids must have an integer
        dtype."""
        label = self._label
        if isinstance(values, (np.ndarray, torch.Tensor)):
            if values.ndim != 1:
                shape = tuple(values.shape)
                raise BlockprepValueError(
                    f"{label} row {row} {what} must be one-dimensional, got shape {shape}"
                )
            if what == "ids" and not has_integer_dtype(values):
                raise BlockprepTypeError(
                    f"{label} row {row} has dtype {values.dtype}; block IDs must be integers"
                )
            if isinstance(values, torch.Tensor) and values.is_meta:
                raise BlockprepValueError(
                    f"{label} row {row} {what} are on the meta device: no values"
                )
            listed: list[Any] = values.tolist()
            return listed
        if isinstance(values, NOT_ID_ROWS) or not isinstance(values, Sequence):
            name = type(values).__name__
            raise BlockprepTypeError(
                f"{label} row {row} {what} must be a sequence of {items}, got {name}"
            )
        return values if type(values) is list else list(values)

    def _sets(
        self, row: int, positions: object, ids: object, length: int
    ) -> tuple[list[int], list[int]]:
        """Checked positions (unique, within ``length`` ids) and ids of a ``set_ids`` on ``row``."""
        label = self._label
        slots = self._list(row, positions, "positions", "ints")
        values = self._ids(row, ids)
        if len(slots) != len(values):
            raise BlockprepValueError(
                f"{label} row {row} has {len(slots)} positions but {len(values)} ids to set there"
            )
        seen: set[int] = set()
        checked: list[int] = []
        for p in slots:
            index = as_int(p, f"{label} row {row} position")
            if not 0 <= index < length:
                raise BlockprepIndexError(
                    f"{label} row {row} position {index} is out of range for its {length} ids"
                )
            if index in seen:
                raise BlockprepValueError(
                    f"{label} row {row} position {index} is given more than once"
                )
            seen.add(index)
            checked.append(index)
        return checked, values

    def _length(self, row: int, length: object, old: int) -> int:
        """A checked ``truncate`` length for ``row``, which holds ``old`` ids."""
        label = self._label
        keep = as_int(length, f"{label} row {row} truncate length")
        if not 0 <= keep <= old:
            raise BlockprepValueError(
                f"{label} row {row} cannot be truncated to {keep} ids: it holds {old}"
            )
        if keep == 0 and old and self._table.kind == "ring":
            raise BlockprepValueError(
                f"ring block-table row {row} cannot be truncated to 0 ids; use clear_row()"
            )
        return keep


def _plain(ids: list[Any]) -> bool:
    """Whether ``ids`` are plain ints in ``[0, INT32_MAX]`` (decided in C-level passes)."""
    return not ids or (set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) <= INT32_MAX)


def _delta_id(label: str, row: int, x: object) -> int:
    """One id of a delta on ``row``, checked: errors naming the row and the id."""
    if not is_integer_id(x):
        name = type(x).__name__
        raise BlockprepTypeError(
            f"{label} row {row} holds {x!r} of type {name}; block IDs must be integers"
        )
    value = operator.index(x)  # type: ignore[arg-type]
    if value < 0:
        raise BlockprepValueError(f"{NEGATIVE_ID_MESSAGE} ({label} row {row}, id {value})")
    if value > INT32_MAX:
        raise BlockprepValueError(
            f"{label} row {row} holds block ID {value}, maximum is {INT32_MAX}"
        )
    return value
