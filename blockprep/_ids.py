"""Validation and normalisation of block-id rows.

Every builder accepts ``rows`` as a sequence of rows, each row a list or tuple of integers, a 1-D
NumPy integer array or a 1-D integer tensor; a 2-D integer array or tensor is a table of equal rows.
:func:`id_rows` checks all of it before anything is written and returns the ids as one flat array.

Errors, per row in row order (the first failing row wins; within a row, in this order):

- ring rows only: an empty row, then a row longer than ``max_blocks``;
- paged rows only: a row longer than ``max_blocks`` (upstream's message);
- a row that is not an ordered sequence of ids (a ``set``, ``dict``, ``str``, ``bytes``,
  ``bytearray`` or ``memoryview`` included), an id that is not an integer (``bool`` and ``float``
  included): ``TypeError`` naming the row;
- a negative id: upstream's ``ValueError("block IDs must not be negative")`` with the place
  appended: ``"block IDs must not be negative (block-table row 3, id -1)"``;
- an id above ``2**31 - 1``: ``ValueError`` naming the row and the id.

``rows`` itself must be ordered too: a ``set``, ``dict`` (or other mapping), string or bytes-like
object, or a 0-d array, raises ``TypeError`` (a set would assign rows in arbitrary order).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep.errors import BlockprepTypeError, BlockprepValueError

INT32_MAX = 2**31 - 1
"""Largest block id a table can hold (the tables are int32)."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of a token, a length or an id that enters blockprep anywhere (int64 buffers)."""

NEGATIVE_ID_MESSAGE = "block IDs must not be negative"

Kind = Literal["ring", "paged"]

_LIST_TYPES = frozenset({list, tuple})
NOT_ID_ROWS = (str, bytes, bytearray, memoryview, Set, Mapping)
"""Containers never taken as a row of ids (or as the rows): unordered, or bytes and text."""
_INT_ONLY = {int}


@dataclass(frozen=True)
class IdRows:
    """Validated rows: ``values`` holds every id, row after row; ``lengths[r]`` is row r's length.

    ``values`` is 1-D int32, every id in ``[0, INT32_MAX]``. It may be a view
    of the caller's array: read it, never write it. ``width`` is the length all rows share, or
    ``None`` when they differ (or there are none).
    """

    values: npt.NDArray[np.int32]
    lengths: list[int]

    @property
    def width(self) -> int | None:
        lengths = self.lengths
        if lengths and min(lengths) == max(lengths):
            return lengths[0]
        return None

    @property
    def offsets(self) -> list[int]:
        """``R + 1`` offsets: row r is ``values[offsets[r]:offsets[r + 1]]``."""
        return [0, *itertools.accumulate(self.lengths)]


def as_int(value: object, name: str) -> int:
    """``value`` as an int; ``TypeError`` naming ``name`` for bools and non-integers (a 0-d bool
    tensor included, which ``operator.index`` would take as 0 or 1)."""
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool
    ):
        raise BlockprepTypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise BlockprepTypeError(f"{name} must be an integer, got {value!r}") from None
    except Exception as error:  # an __index__ that raises: not an integer it can read
        raise BlockprepTypeError(f"{name} must be an integer, got {value!r}") from error


def check_max_blocks(max_blocks: int) -> int:
    """Return ``max_blocks`` as an int; upstream's ``ValueError`` when it is not positive."""
    value = as_int(max_blocks, "max_blocks")
    if value <= 0:
        raise BlockprepValueError("max_blocks must be positive")
    if value > INT32_MAX:  # a table's columns are int32-addressed
        raise BlockprepValueError(f"max_blocks must be at most {INT32_MAX}, got {value}")
    return value


def check_pad(pad: int) -> int:
    """Return ``pad`` (the value after a paged row's ids) as an int within int32."""
    value = as_int(pad, "pad")
    if not -(2**31) <= value <= INT32_MAX:
        raise BlockprepValueError(f"pad {value} is outside the int32 range")
    return value


def id_rows(rows: Any, max_blocks: int, kind: Kind) -> IdRows:
    """Validate ``rows`` for a ``kind`` table of width ``max_blocks``; see the module docstring."""
    if isinstance(rows, (np.ndarray, torch.Tensor)) and rows.ndim == 2:
        if has_integer_dtype(rows):
            table = _as_numpy(rows)
            if _table_is_valid(table, max_blocks, kind):
                count, width = table.shape
                return IdRows(_int32(table.reshape(-1)), [width] * count)
        return _id_rows_by_row(list(rows), max_blocks, kind)
    if not isinstance(rows, (list, tuple)):
        is_table = isinstance(rows, (np.ndarray, torch.Tensor)) and rows.ndim > 0
        if not is_table and (
            isinstance(rows, (np.ndarray, torch.Tensor, *NOT_ID_ROWS))
            or not isinstance(rows, Iterable)
        ):
            raise BlockprepTypeError(
                "rows must be an iterable of block-id rows, in order (a list, tuple, or 2-D "
                f"integer array or tensor), got {_describe(rows)}"
            )
        rows = list(rows)
    if set(map(type, rows)) <= _LIST_TYPES:
        fast = _lists_fast(rows, max_blocks, kind)
        if fast is not None:
            return fast
    return _id_rows_by_row(rows, max_blocks, kind)


def _table_is_valid(table: npt.NDArray[Any], max_blocks: int, kind: Kind) -> bool:
    count, width = table.shape
    if count == 0:
        return True
    if width > max_blocks or (kind == "ring" and width == 0):
        return False
    return table.size == 0 or (int(table.min()) >= 0 and int(table.max()) <= INT32_MAX)


def _lists_fast(rows: Sequence[Sequence[Any]], max_blocks: int, kind: Kind) -> IdRows | None:
    """All rows are lists or tuples of ints: convert them in one NumPy call.

    Returns ``None`` when anything looks wrong (or merely suspicious), so that the row-by-row path
    decides, and raises, in row order.
    """
    lengths = list(map(len, rows))
    if not lengths:
        return IdRows(np.empty(0, dtype=np.int32), lengths)
    longest, shortest = max(lengths), min(lengths)
    if longest > max_blocks or (kind == "ring" and shortest == 0):
        return None
    uniform = longest == shortest
    try:
        # Equal rows convert as one 2-D array; ragged ones through a flat list of all ids.
        values = np.array(rows if uniform else list(itertools.chain.from_iterable(rows)))
    except (TypeError, ValueError, OverflowError):
        return None
    if values.size == 0:
        return IdRows(np.empty(0, dtype=np.int32), lengths)
    if values.ndim != (2 if uniform else 1) or values.dtype.kind not in "iu":
        return None
    values = values.reshape(-1)
    smallest = int(values.min())
    if smallest < 0 or int(values.max()) > INT32_MAX:
        return None
    # NumPy turns bools mixed with ints into 0 and 1: only rows holding a 0 or 1 can hide one.
    if smallest <= 1:
        row_of = np.repeat(np.arange(len(rows)), lengths)
        for r in np.unique(row_of[values <= 1]).tolist():
            if not all(map(is_integer_id, rows[r])):
                return None
    return IdRows(_int32(values), lengths)


def _id_rows_by_row(rows: Sequence[Any], max_blocks: int, kind: Kind) -> IdRows:
    arrays = [row_values(r, row, max_blocks, kind) for r, row in enumerate(rows)]
    lengths = list(map(len, arrays))
    values = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int32)
    return IdRows(_int32(values), lengths)


def _int32(values: npt.NDArray[Any]) -> npt.NDArray[np.int32]:
    """Validated ids as int32 (no copy when they already are)."""
    return values.astype(np.int32, copy=False)


def _label(kind: Kind) -> str:
    return "ring block-table" if kind == "ring" else "block-table"


def row_values(r: int, row: Any, max_blocks: int, kind: Kind) -> npt.NDArray[Any]:
    """Validate one row exactly and return it as a 1-D integer array."""
    label = _label(kind)
    if isinstance(row, (np.ndarray, torch.Tensor)):
        if row.ndim != 1:
            shape = tuple(row.shape)
            raise BlockprepValueError(f"{label} row {r} must be one-dimensional, got shape {shape}")
        check_length(r, len(row), max_blocks, kind)
        if not has_integer_dtype(row):
            raise BlockprepTypeError(
                f"{label} row {r} has dtype {row.dtype}; block IDs must be integers"
            )
        array = _as_numpy(row)
        if array.size:
            if int(array.min()) < 0:
                raise_negative(r, int(array[array < 0][0]), kind)
            if int(array.max()) > INT32_MAX:
                _raise_above_int32(r, int(array[array > INT32_MAX][0]), kind)
        return array
    if isinstance(row, NOT_ID_ROWS) or not isinstance(row, Sequence):
        name = type(row).__name__
        raise BlockprepTypeError(f"{label} row {r} must be a sequence of block IDs, got {name}")
    check_length(r, len(row), max_blocks, kind)
    return checked_ids(r, row, kind)


def checked_ids(r: int, ids: Iterable[Any], kind: Kind) -> npt.NDArray[np.int32]:
    """Type and range checks of row r's ``ids`` (the caller checks the row's length).

    Returns them as int32; raises the module's ``TypeError`` or ``ValueError`` otherwise.
    """
    values = ids if isinstance(ids, list) else list(ids)
    if not values:
        return np.empty(0, dtype=np.int32)
    # The common case, decided in C: plain ints, all in range.
    if set(map(type, values)) == _INT_ONLY and min(values) >= 0 and max(values) <= INT32_MAX:
        return np.array(values, dtype=np.int32)
    ints = []
    for x in values:
        if not is_integer_id(x):
            name = type(x).__name__
            raise BlockprepTypeError(
                f"{_label(kind)} row {r} holds {x!r} of type {name}; block IDs must be integers"
            )
        ints.append(operator.index(x))
    for x in ints:
        if x < 0:
            raise_negative(r, x, kind)
    for x in ints:
        if x > INT32_MAX:
            _raise_above_int32(r, x, kind)
    return np.array(ints, dtype=np.int32)


def id_list(ids: object) -> list[Any] | None:
    """``ids`` as a list, for comparing with a cached row by value; ``None`` if not a valid row.

    Lists come back as they are (no copy), tuples copied, 1-D integer arrays and tensors through
    ``tolist()``. A float or bool array gives ``None``, so that it never equals a cached row.
    """
    if isinstance(ids, list):
        return ids
    if isinstance(ids, tuple):
        return list(ids)
    if isinstance(ids, (np.ndarray, torch.Tensor)) and ids.ndim == 1 and has_integer_dtype(ids):
        if isinstance(ids, torch.Tensor) and ids.is_meta:
            return None  # no values: the whole-row check raises
        values: list[Any] = ids.tolist()
        return values
    return None


def check_length(r: int, n: int, max_blocks: int, kind: Kind) -> None:
    if kind == "ring":
        if n == 0:
            raise BlockprepValueError(f"ring block-table row {r} has no allocated blocks")
        if n > max_blocks:
            raise BlockprepValueError(
                f"ring block-table row {r} has {n} blocks, maximum is {max_blocks}"
            )
    elif n > max_blocks:
        raise BlockprepValueError(f"row {r} has {n} blocks, maximum is {max_blocks}")


def raise_negative(r: int, value: int, kind: Kind) -> None:
    """Upstream's negative-id message, the place appended: ``"block IDs must not be negative
    (block-table row 3, id -1)"`` (tests match the prefix)."""
    raise BlockprepValueError(f"{NEGATIVE_ID_MESSAGE} ({_label(kind)} row {r}, id {value})")


def _describe(value: object) -> str:
    """``value``'s type for a message (and its dimensions when it is an array or tensor)."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"a {value.ndim}-d {type(value).__name__}"
    return type(value).__name__


def _raise_above_int32(r: int, value: int, kind: Kind) -> None:
    raise BlockprepValueError(
        f"{_label(kind)} row {r} holds block ID {value}, maximum is {INT32_MAX}"
    )


def is_integer_id(x: object) -> bool:
    """Python and NumPy integers, and 0-d integer arrays or tensors; never bools."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    if isinstance(x, (np.ndarray, torch.Tensor)) and x.ndim == 0:
        return has_integer_dtype(x) and not (isinstance(x, torch.Tensor) and x.is_meta)
    return False


_TORCH_INTEGER_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
)


def has_integer_dtype(array: npt.NDArray[Any] | torch.Tensor) -> bool:
    if isinstance(array, torch.Tensor):
        return array.dtype in _TORCH_INTEGER_DTYPES
    return array.dtype.kind in "iu"


def _as_numpy(array: npt.NDArray[Any] | torch.Tensor) -> npt.NDArray[Any]:
    """A NumPy view of a CPU integer tensor (a host copy of a device one); arrays pass through."""
    if isinstance(array, torch.Tensor):
        if array.is_meta:
            raise BlockprepValueError("block IDs on the meta device hold no values")
        return array.detach().cpu().numpy()
    return array
