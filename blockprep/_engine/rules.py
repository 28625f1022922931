"""The twin kernel's rules outside the kernel: fault codes, slot marks and their merging, the
argument checks the compiled kernel makes, id comparisons (:mod:`blockprep._engine.twin` is the
kernel; these are its pieces, one concept: what a step is checked against).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import numpy as np
import numpy.typing as npt

from blockprep import wire

PADDING, NEW = -2, -1
"""``srcs`` values besides a row index: a padding row (trusted ids), a request new to the table."""
TYPE, LENGTH, RANGE, REPEAT, PAD_RANGE, OPS = 1, 2, 3, 4, 5, 6
"""Fault codes."""
CLEAN, POSITIONS, SPAN, WHOLE = 0, 1, 2, 3
"""Slot marks: nothing to write, some positions, a paged range, the whole row."""
ROW_APPEND, ROW_WHOLE, ROW_COPY, ROW_CLEAR = 0, 1, 2, 3
"""``GroupKernel.apply_row`` kinds: ids appended, a whole row, a copy of a row, a clear."""
MAX_POSITIONS = 4
MAX_SLOTS = 1 << 16
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT_ONLY = {int}
INTERNED_IDS = 1 << 16
"""A group's ids below this are held as one shared int object per value (the held lists are
compared with every step's new int objects: shared ones stay compact in memory)."""
INTERNED = list(range(INTERNED_IDS))

Fault = tuple[int, int, object]
Mark = tuple[int, tuple[int, ...]]  # (mode, positions) or (SPAN, (lo, hi)) or (WHOLE, ())
Change = tuple[int, list[int], Mark, bool]  # row, its new ids, its mark, checked (a request)


def same_lengths(lists: list[list[Any]], sizes: list[int]) -> None:
    """``RuntimeError`` naming the first row whose list no longer holds ``sizes`` ids (the
    compiled kernel's error for a row changed under a comparison while it was planned)."""
    now = list(map(len, lists))
    if len(now) == len(sizes) and now != sizes:  # the step itself changed: the row loop says
        r = next(r for r, (a, b) in enumerate(zip(now, sizes, strict=True)) if a != b)
        raise RuntimeError(f"row {r} changed while it was planned")


def one_set(ops: object, held: list[int]) -> tuple[int, int] | None:
    """``(p, x)`` when ``ops`` is exactly ``[["s", [p], [x]]]`` (plain lists, a plain int ``x``
    and a position ``p`` within ``held``), else ``None``."""
    if type(ops) is not list or len(ops) != 1:
        return None
    op = ops[0]
    if type(op) is not list or len(op) != 3 or type(op[0]) is not str or op[0] != wire.SET:
        return None
    positions, values = op[1], op[2]
    if type(positions) is not list or type(values) is not list:
        return None
    if len(positions) != 1 or len(values) != 1:
        return None
    p, x = positions[0], values[0]
    if type(p) is not int or type(x) is not int or not 0 <= p < len(held):
        return None
    return p, x


def src_of(srcs: Sequence[int], r: int, rows: int) -> int:
    src = srcs[r]
    if type(src) is not int or not (src in (PADDING, NEW) or 0 <= src < rows):
        raise ValueError(f"srcs[{r}] must be -2, -1 or a row, got {src!r}")
    return src


def check_set_ids(ops: list[Any], r: int, convert: Callable[[object], int | None]) -> Fault | None:
    """The first id an append or a set names that is not an integer (ops already applied)."""
    for op in ops:
        if not isinstance(op, list) or len(op) < 2:
            continue
        tag = wire.tag_of(op)
        ids = op[-1] if len(op) >= 2 else None
        if (
            tag in (wire.APPEND, wire.SET)
            and type(ids) is list
            and not set(map(type, ids)) <= INT_ONLY
        ):
            for x in ids:
                if type(x) is not int and type(convert(x)) is not int:
                    return (TYPE, r, x)
    return None


def same_sizes(*pairs: tuple[list[Any] | None, int]) -> None:
    """The step's lists still have their sizes (a callback may have changed them)."""
    for items, size in pairs:
        if items is not None and len(items) != size:
            raise RuntimeError("the step changed while it was planned")


def positions_mark(differ: list[int], ring: bool) -> Mark | None:
    """The mark of a row of unchanged length whose ids differ at ``differ`` (ascending)."""
    if not differ:
        return None
    if len(differ) <= MAX_POSITIONS:
        return (POSITIONS, tuple(differ))
    return (WHOLE, ()) if ring else (SPAN, (differ[0], differ[-1] + 1))


def cleared_mark(old: list[int] | None, ring: bool) -> Mark:
    """The mark of a row that held ``old`` (unknown, or at least one id) and now holds none: a
    paged row's ids' cells, else (a ring row, or ids unknown) the whole row."""
    if old is None or ring:
        return (WHOLE, ())
    mark = positions_mark(list(range(len(old))), False)
    assert mark is not None
    return mark


def merged(current: Mark | None, mark: Mark, ring: bool) -> Mark:
    """A slot's mark for a row after another change of it."""
    if current is None or current[0] == CLEAN:
        return mark
    if current[0] == WHOLE or mark[0] == WHOLE:
        return (WHOLE, ())
    if current[0] == POSITIONS and mark[0] == POSITIONS:
        union = sorted(set(current[1]).union(mark[1]))
        if len(union) <= MAX_POSITIONS:
            return (POSITIONS, tuple(union))
        if ring:
            return (WHOLE, ())
        return (SPAN, (union[0], union[-1] + 1))
    lo, hi = mark_span(current)
    lo2, hi2 = mark_span(mark)
    return (SPAN, (min(lo, lo2), max(hi, hi2)))


def mark_span(mark: Mark) -> tuple[int, int]:
    mode, where = mark
    if mode == SPAN:
        return where[0], where[1]
    return min(where), max(where) + 1


def holds(held: list[int] | None, ids: list[Any]) -> bool:
    """Whether ``ids`` are ``held``, id by id (an id whose comparison raises: not)."""
    if held is None or len(held) != len(ids):
        return False
    try:
        return ids == held
    except Exception:
        return False


def equal_ids(x: object, held: int) -> bool:
    """Whether ``x == held`` (an exception: not equal)."""
    try:
        return bool(x == held)
    except Exception:
        return False


def index_arg(value: object, size: int, name: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < size:
        raise IndexError(f"{name} {value} out of range [0, {size})")
    return value


def checked_array(array: object, shape: tuple[int, int | None], name: str) -> npt.NDArray[np.int32]:
    """``array`` (a NumPy array, or a memoryview: the buffer the C takes) as a writable
    C-contiguous int32 array of ``shape`` (``None``: any), or the error the C raises."""
    if isinstance(array, memoryview) and array.format in ("i", "=i", "<i", "@i"):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray) or array.dtype != np.int32 or array.ndim != 2:
        raise TypeError(f"{name} must be a 2-D int32 array")
    rows, width = shape
    if width is None and array.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got {array.shape[0]}")
    if width is not None and array.shape != (rows, width):
        raise ValueError(
            f"{name} must have {rows} rows and {width} columns, got "
            f"{array.shape[0]} x {array.shape[1]}"
        )
    if not (array.flags.c_contiguous and array.flags.writeable):
        raise ValueError(f"{name} must be C-contiguous and writable")
    return array


def checked_tables(
    table: object, counts: object, rows: int, width: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """``commit``'s and ``bind``'s table (``[rows, width]``) and counts (``[rows, any]``) by
    :func:`checked_array`'s rules; ``ValueError`` when they overlap."""
    table = checked_array(table, (rows, width), "table")
    counts = checked_array(counts, (rows, None), "counts")
    if table.size and counts.size and np.may_share_memory(table, counts):
        raise ValueError("table and counts must not overlap")
    return table, counts


def check_spec(
    ring: object, width: int, limit: int, shortest: int, pad: int, rows: int, slots: int
) -> None:
    for name, value in (
        ("width", width),
        ("limit", limit),
        ("shortest", shortest),
        ("pad", pad),
        ("rows", rows),
        ("slots", slots),
    ):
        if type(value) is not int:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 < width <= INT32_MAX or not 0 < limit <= INT32_MAX + 1:
        raise ValueError(
            f"width must be in [1, 2**31) and limit in [1, 2**31], got {width}, {limit}"
        )
    if not 0 <= shortest <= width or not INT32_MIN <= pad <= INT32_MAX:
        raise ValueError(f"shortest must be in [0, width] and pad an int32, got {shortest}, {pad}")
    if not 0 <= rows <= INT32_MAX or not 0 < slots <= MAX_SLOTS:
        raise ValueError(f"rows must be in [0, 2**31) and slots in [1, 2**16], got {rows}, {slots}")


def lists_at(rows: list[Any], key: object) -> list[Any]:
    """``[row[key] for row in rows]``, every row an exact dict (``TypeError`` / ``KeyError``
    naming the first that is not, or holds no ``key``)."""
    n = len(rows)
    if set(map(type, rows)) <= {dict}:  # the common case at C speed; any doubt: the loop
        with suppress(KeyError):
            lists = list(map(operator.itemgetter(key), rows))
            if len(lists) == n == len(rows):  # else a key's __eq__ changed rows: the loop says
                return lists
    lists = []
    for i in range(n):
        if len(rows) != n:  # a key's __eq__ may change the caller's list
            raise RuntimeError("the step changed while it was planned")
        row = rows[i]
        if type(row) is not dict:
            raise TypeError(f"row {i} must be a dict, got {type(row).__name__}")
        ids = row.get(key, _MISSING)
        if ids is _MISSING:
            raise KeyError(f"row {i} holds no {key!r}")
        lists.append(ids)
    return lists


_MISSING = object()
