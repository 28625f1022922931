"""A paged decode step's dynamic inputs in one call each, in pure Python and NumPy: the
specification of ``dynamic.c`` (the compiled ``_kernel``'s ``step_slots``, ``paged_step`` and
``differing_rows``), and the fallback.

- :func:`step_slots`: a paged decode step's slot mapping (seed-semantics 2.3), each row's page
  read from a message's new list or from the table as it stands; ``None`` when a row fails
  upstream's checks (the caller's row loop words the error). It writes nothing.
- :func:`differing_rows`: the rows where two lists of one length differ (a batch's request ids
  against the last one's).
- :func:`paged_step`: a paged decode step that changes no table row, in one call: the slots of
  :func:`step_slots`, the tokens checked to fit their column, then tokens, sequence lengths and
  slots written; ``False``, nothing written, when any of it is in doubt.

Arguments are buffer-protocol objects (NumPy arrays, ``memoryview``), read as they are (any
stride for the 1-D inputs); the outputs must be C-contiguous and writable. Both implementations
check every argument and every value they read before their first write (a refused call writes
nothing) and raise the same exception types with the same messages.
"""

from __future__ import annotations

import operator
from itertools import combinations, compress
from typing import Any

import numpy as np
import numpy.typing as npt

INT32_MAX = 2**31 - 1
_INT64 = {"q", "l", "n"}  # 'l': a C long, 8 bytes where int64 arrays say it
_INT32 = {"i"}
_NATIVE = {4: np.dtype(np.int32), 8: np.dtype(np.int64)}  # singletons: tested with ``is``


def _view(obj: object, name: str, itemsize: int, writable: bool) -> memoryview:
    """``obj``'s buffer: an integer format of ``itemsize`` bytes, 1-D to read or C-contiguous and
    writable to write; ``TypeError`` / ``ValueError`` (the compiled kernel's words) otherwise."""
    kind = "int64" if itemsize == 8 else "int32"
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # ValueError: NumPy's dtypes a buffer cannot carry
        raise TypeError(f"{name} must be an {kind} array") from None
    code = view.format.lstrip("=<@")
    if view.itemsize != itemsize or code not in (_INT64 if itemsize == 8 else _INT32):
        raise TypeError(f"{name} must be an {kind} array")
    if writable:
        if view.readonly or not view.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous and writable")
    elif view.ndim != 1:
        raise TypeError(f"{name} must be a 1-D {kind} array")
    return view


def _array(obj: object, name: str, itemsize: int) -> npt.NDArray[Any]:
    """A 1-D integer array to read (:func:`_view`'s rules), the common NumPy one as it is."""
    if type(obj) is np.ndarray and obj.ndim == 1:
        dtype = obj.dtype
        if dtype is _NATIVE[itemsize] or (
            dtype.kind == "i" and dtype.itemsize == itemsize and dtype.isnative
        ):
            return obj
    return np.asarray(_view(obj, name, itemsize, False))


def step_slots(
    seq_lens: list[Any],
    items: dict[int, Any],
    lengths: object,
    table: object,
    width: int,
    page_size: int,
    max_seq_len: int,
) -> list[int] | None:
    """Each row's decode slot (seed-semantics 2.3: the page at position ``seq_len - 1``, times
    ``page_size``, plus the offset in it) when every row passes upstream's row checks; ``None``
    at the first row that does not (the caller's row loop then raises upstream's message).

    Row ``r`` reads its page ids from ``items[r]`` (a list) when ``items`` has a list for it,
    else from the table as it holds them: ``lengths[r]`` ids in ``table[r * width:]``.
    A row passes when ``seq_lens[r]`` is an int in ``[1, max_seq_len]`` and its decode page
    (index ``(seq_len - 1) // page_size``) exists, is an int in ``[0, page_max]`` (no slot above
    int32) and, from ``items``, comes from a list of at most ``width`` ids.

    Args:
        seq_lens: ``[A]`` list: each row's sequence length.
        items: ``{row: list of page ids}`` (int keys; ``None`` values and rows outside
            ``[0, A)`` are ignored).
        lengths: ``[>= A]`` int32: how many ids each table row holds.
        table: ``[>= A * width]`` int32: the flat block table.
        width, page_size, max_seq_len: ints in ``[1, 2**31)``.

    Raises:
        TypeError: ``seq_lens`` no list, ``items`` no dict or with a key that is no int, an
            argument of another kind (named).
        IndexError: ``width``, ``page_size`` or ``max_seq_len`` out of range.
        ValueError: fewer than ``A`` lengths or ``A * width`` cells.
    """
    if type(seq_lens) is not list:
        raise TypeError(f"seq_lens must be a list, got {type(seq_lens).__name__}")
    if type(items) is not dict:
        raise TypeError(f"items must be a dict, got {type(items).__name__}")
    if not (
        type(width) is int
        and type(page_size) is int
        and type(max_seq_len) is int
        and 1 <= width <= INT32_MAX
        and 1 <= page_size <= INT32_MAX
        and 1 <= max_seq_len <= INT32_MAX
    ):  # one test for the common case; the loop names the argument
        for name, value in (
            ("width", width),
            ("page_size", page_size),
            ("max_seq_len", max_seq_len),
        ):
            if type(value) is not int:
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if not 1 <= value <= INT32_MAX:
                raise IndexError(f"{name} {value!r} out of range [1, {INT32_MAX + 1})")
    if items and set(map(type, items)) != {int}:
        key = next(key for key in items if type(key) is not int)
        raise TypeError(f"items keys must be ints, got {type(key).__name__}")
    held = _array(lengths, "lengths", 4)
    cells = _array(table, "table", 4)
    rows = len(seq_lens)
    if held.shape[0] < rows:
        raise ValueError(f"lengths holds {held.shape[0]} rows, fewer than the {rows} seq_lens")
    if cells.shape[0] // width < rows:
        raise ValueError(f"table holds {cells.shape[0]} cells, fewer than {rows} rows of {width}")
    page_max = (INT32_MAX - page_size + 1) // page_size  # no slot of these overflows
    counts = held[:rows].tolist()
    cell, get = cells.item, items.get
    slots: list[int] = []
    for row, seq_len in enumerate(seq_lens):
        if type(seq_len) is not int or not 0 < seq_len <= max_seq_len:
            return None
        position = seq_len - 1
        index = position // page_size
        ids = get(row)
        if ids is None:  # as the table holds it
            if index >= counts[row] or index >= width:
                return None
            page = cell(row * width + index)
        elif type(ids) is not list or len(ids) > width or index >= len(ids):
            return None
        else:
            page = ids[index]
        if type(page) is not int or not 0 <= page <= page_max:
            return None
        slots.append(page * page_size + position - index * page_size)
    return slots


def _column(obj: object, name: str, rows: int) -> npt.NDArray[Any]:
    """A writable 1-D int32 or int64 array of any stride with at least ``rows`` cells (what the
    compiled ``paged_step`` writes into); ``TypeError`` / ``ValueError`` otherwise."""
    if (
        type(obj) is np.ndarray
        and obj.ndim == 1
        and (obj.dtype is _NATIVE[4] or obj.dtype is _NATIVE[8])
        and obj.flags.writeable
    ):  # the common case; any other int32 or int64 array passes below
        column = obj
    else:
        try:
            view = memoryview(obj)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # ValueError: NumPy's dtypes a buffer cannot carry
            view = None
        if (
            view is None
            or view.readonly
            or view.ndim != 1
            or view.format.lstrip("=<@") not in (_INT64 if view.itemsize == 8 else _INT32)
            or view.itemsize not in (4, 8)
        ):
            raise TypeError(f"{name} must be a writable 1-D int32 or int64 array")
        column = np.asarray(view)
    if column.shape[0] < rows:
        raise ValueError(f"{name} holds {column.shape[0]} cells, fewer than the {rows} rows")
    return column


def paged_step(
    seq_lens: list[Any],
    tokens: list[Any],
    items: dict[int, Any],
    lengths: object,
    table: object,
    width: int,
    page_size: int,
    max_seq_len: int,
    token_out: object,
    seq_out: object,
    slot_out: object,
    write: object = True,
) -> bool:
    """A paged decode step written in one call: when every row passes :func:`step_slots` and
    ``tokens`` holds one int per row that fits ``token_out``'s type (int64's least value counts as
    not fitting), writes ``token_out[r] = tokens[r]``, ``seq_out[r] = seq_lens[r]`` and
    ``slot_out[r]`` = the row's slot for every row ``r`` and returns ``True``; otherwise writes
    nothing and returns ``False`` (the caller's general path decides and words the error). With
    ``write`` false nothing is written either way: the checks alone (before a table plan, whose
    commit comes between the two calls).

    Args:
        seq_lens, items, lengths, table, width, page_size, max_seq_len: as :func:`step_slots`.
        tokens: ``[A]`` list: each row's token.
        token_out, seq_out, slot_out: writable 1-D int32 or int64 arrays (any stride) of at least
            ``A`` cells.

    Raises:
        TypeError, IndexError, ValueError: as :func:`step_slots`; then ``tokens`` no list; then an
            output of another kind or with fewer than ``A`` cells (named).
    """
    write = bool(write)  # first, as the compiled call reads it
    slots = step_slots(seq_lens, items, lengths, table, width, page_size, max_seq_len)
    if type(tokens) is not list:
        raise TypeError(f"tokens must be a list, got {type(tokens).__name__}")
    rows = len(seq_lens)
    out_tokens = _column(token_out, "token_out", rows)
    out_seq = _column(seq_out, "seq_out", rows)
    out_slots = _column(slot_out, "slot_out", rows)
    heads = (out_tokens[:rows], out_seq[:rows], out_slots[:rows])
    if rows and any(np.may_share_memory(a, b) for a, b in combinations(heads, 2)):
        raise ValueError("token_out, seq_out and slot_out must not overlap")
    if slots is None or len(tokens) != rows:
        return False
    wide = out_tokens.dtype.itemsize == 8
    low, high = (-(2**63) + 1, 2**63 - 1) if wide else (-(2**31), INT32_MAX)
    for token in tokens:
        if type(token) is not int or not low <= token <= high:
            return False
    if not write:
        return True
    out_tokens[:rows] = tokens
    out_seq[:rows] = seq_lens
    out_slots[:rows] = slots
    return True


def differing_rows(new: object, old: object) -> list[int] | None:
    """The rows ``r`` where ``new[r] != old[r]``, in row order, for two lists (exactly) of one
    length; ``None`` for anything else (the caller compares itself). An exception of a ``!=``
    goes up. The rows are those the lists had when the call began: a ``!=`` that grows them adds
    none, one that shrinks them ends the walk."""
    if type(new) is not list or type(old) is not list or len(new) != len(old):
        return None
    return list(compress(range(len(new)), map(operator.ne, new, old)))
