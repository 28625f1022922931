"""A table kernel's fault ``(code, row, value)`` in the caller's voice, written once.

The kernel (:mod:`blockprep._engine`) answers a row it refuses with a fault, never an exception;
the faces turn it into their words here: :func:`fault_error` in the grouped tables' voice
(:class:`~blockprep.errors.BlockIdTypeError` / :class:`~blockprep.errors.BlockIdValueError`,
the place, group and id named), :func:`raise_ops_error` in the wire's
(:class:`~blockprep.wire.DeltaMessageError`, :func:`~blockprep.wire.apply_ops`'s words), and
:func:`raise_row` in the builders' (a :class:`~blockprep.block_table.BlockTable` row: the error
:func:`blockprep.paged_block_table` or :func:`blockprep.ring_block_table` would raise, in their
order: length, then types, then negative ids, then ids above int32).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any, NoReturn, Protocol

from blockprep import packed
from blockprep._engine.rules import LENGTH, PAD_RANGE, RANGE, REPEAT, TYPE
from blockprep._ids import INT32_MAX, Kind, id_list, is_integer_id, row_values
from blockprep.errors import (
    BlockIdTypeError,
    BlockIdValueError,
    BlockprepIndexError,
    BlockprepTypeError,
)
from blockprep.wire import DeltaMessageError, apply_ops


class Group(Protocol):
    """What the words of a group's fault read (a :class:`~blockprep.grouped.TableGroup`)."""

    @property
    def name(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def id_limit(self) -> int: ...
    @property
    def shortest(self) -> int: ...


def convert(x: object) -> int | None:
    """A changed id that is not a plain int: an integer converted, anything else ``None``."""
    return operator.index(x) if is_integer_id(x) else None  # type: ignore[arg-type]


def raise_ops_error(
    row: int,
    ops: Any,
    keys: list[Hashable | None],
    srcs: list[int],
    kernel: Any,
    group: Group,
    place: Callable[[int], str],
) -> NoReturn:
    """The :class:`DeltaMessageError` for row ``row``'s ops, which the kernel rejected: the
    words of :func:`~blockprep.wire.apply_ops`, the place, group and request."""
    where = row_place(place, row, group, keys[row])
    src = srcs[row]
    if ops is None:
        raise DeltaMessageError(
            f"a request new to the worker must come with its whole list ({where})"
        )
    try:
        apply_ops(ops, None if src < 0 else kernel.held(src))
    except DeltaMessageError as error:
        raise DeltaMessageError(f"{error} ({where})") from None
    raise AssertionError(f"the kernel rejected ops that apply_ops takes ({where})")


def record_ops(data: bytes, offsets: tuple[Any, ...], row: int) -> list[list[Any]]:
    """The ops of a row's packed records, up to the first offset that is no record (the kernel
    rejected a record before it)."""
    ops = []
    for offset in offsets:
        try:
            ops.append(packed.op_at(data, offset, row))
        except ValueError:
            break
    return ops


def fault_error(
    fault: tuple[int, int, Any], group: Group, place: Callable[[int], str]
) -> BlockIdTypeError | BlockIdValueError:
    """The error for a kernel fault ``(code, row, value)``."""
    code, row, x = fault
    name = group.name
    if code == TYPE:
        return BlockIdTypeError(
            f"{place(row)} group {name} holds {x!r} of type {type(x).__name__}; "
            "block IDs must be integers",
            row,
            name,
            x,
        )
    value: int | None = x
    if code == LENGTH:
        value = None
        text = (
            f"row has {x} blocks, maximum is {group.width}"
            if x > group.width
            else f"row has {x} blocks, minimum is {group.shortest}"
        )
    elif code == RANGE:
        text = f"block IDs must be in [0, {group.id_limit})"
    elif code == REPEAT:
        text = "a row must not repeat block IDs"
    else:
        assert code == PAD_RANGE
        text = f"padding block IDs must be in [{-INT32_MAX - 1}, {INT32_MAX}]"
    where = f"{place(row)}, group {name}" + ("" if value is None else f", id {value}")
    return BlockIdValueError(f"{text} ({where})", row, name, value)


def check_change_rows(changes: Mapping[Any, Any], num_rows: int, group: Group) -> None:
    """``BlockprepTypeError`` / ``BlockprepIndexError`` for the first key of ``changes`` that
    is not a table row (an int in ``[0, num_rows)``)."""
    for row in changes:
        if type(row) is not int:
            raise BlockprepTypeError(
                f"changes of group {group.name} must be keyed by table rows (ints), got {row!r}"
            )
        if not 0 <= row < num_rows:
            raise BlockprepIndexError(
                f"changes of group {group.name} name row {row}, not a table row in [0, {num_rows})"
            )


def row_place(place: Callable[[int], str], row: int, group: Group, key: Hashable) -> str:
    """A row named in an error: its place, group and request."""
    return f"{place(row)}, group {group.name}, request {key!r}"


def raise_row(
    row: int, ids: object, held: list[int] | None, max_blocks: int, kind: Kind
) -> NoReturn:
    """The builders' error for row ``row``'s ``ids`` under the id rule (an id equal by value to
    the ``held`` id at its position is that held int); only for ids a kernel refused, so it
    always raises."""
    key = id_list(ids)
    if key is not None and held:
        ids = as_held(key, held)
    row_values(row, ids, max_blocks, kind)
    raise AssertionError(f"block-table row {row}: the kernel refused ids the checks take")


def as_held(key: list[Any], held: list[int]) -> list[Any]:
    """``key`` with each non-int scalar that equals the held id at its position by value
    replaced by that held int (``[1.0, 2, 5.0]`` over ``[1, 2, 3]``: ``[1, 2, 5.0]``)."""
    result = list(key)
    for i, (x, old) in enumerate(zip(key, held, strict=False)):
        if type(x) is int or getattr(x, "ndim", 0) != 0 or isinstance(x, (list, tuple)):
            continue
        try:
            if bool(x == old):
                result[i] = old
        except Exception:  # an id whose comparison raises is not the held id (the kernel's rule)
            continue
    return result
