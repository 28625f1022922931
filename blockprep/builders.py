"""Whole-table builders: ring and paged block tables, written in place into ``out``.

Both return int32 ``[len(rows), max_blocks]`` tables equal to upstream's
``ring_block_table_from_ids`` and ``block_table_from_ids`` (see :mod:`blockprep.reference`), with
the same errors and error precedence, and three deliberate differences:

a. a ring row longer than ``max_blocks`` raises
   ``ValueError("ring block-table row {r} has {n} blocks, maximum is {max_blocks}")`` where
   upstream silently truncated it;
b. ids must be integers (``bool``, ``float`` and other types raise ``TypeError`` naming the row)
   within ``[0, 2**31 - 1]`` (an id above raises ``ValueError`` naming the row and the id), where
   upstream coerced with ``int()``;
c. everything is validated before anything is written: on any error ``out`` is left as it was.

Cost: one NumPy conversion of all ids per call (none when ``rows`` is already a 2-D integer
array or tensor) and no temporary per row; see :mod:`blockprep._tiling` for the ring construction.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import IdRows, check_max_blocks, check_pad, id_rows
from blockprep._tiling import tile_row, tile_rows
from blockprep.buffers import check_no_self_overlap, check_writable
from blockprep.errors import BlockprepTypeError, BlockprepValueError

Table = TypeVar("Table", torch.Tensor, npt.NDArray[np.int32])


@overload
def ring_block_table(rows: Any, max_blocks: int, *, out: None = None) -> torch.Tensor: ...
@overload
def ring_block_table(rows: Any, max_blocks: int, *, out: Table) -> Table: ...
def ring_block_table(
    rows: Any, max_blocks: int, *, out: torch.Tensor | npt.NDArray[np.int32] | None = None
) -> torch.Tensor | npt.NDArray[np.int32]:
    """Ring block table: ``table[r, j] = rows[r][j % len(rows[r])]``.

    Args:
        rows: ``R`` rows of ``1..max_blocks`` block ids each (lists, tuples, 1-D integer arrays or
            tensors, or one 2-D integer array or tensor).
        max_blocks: table width, positive.
        out: optional int32 CPU tensor or NumPy array of shape ``[R, max_blocks]``, written in place
            and returned.

    Returns:
        ``out``, or a new int32 tensor ``[R, max_blocks]``. Every cell is defined (no pad).

    Raises:
        ValueError: ``"max_blocks must be positive"``; then, per row in order,
            ``"ring block-table row {r} has no allocated blocks"``,
            ``"ring block-table row {r} has {n} blocks, maximum is {max_blocks}"``,
            ``"block IDs must not be negative"``, or an id above ``2**31 - 1`` (row and id named).
        TypeError: a non-integer id (row named), or a bad ``out``.
    """
    max_blocks = check_max_blocks(max_blocks)
    ids = id_rows(rows, max_blocks, "ring")
    result, dst = _destination(out, len(ids.lengths), max_blocks)
    ids = _unaliased(ids, dst)
    work = dst if dst.flags.c_contiguous else np.empty(dst.shape, dtype=np.int32)
    _write_ring(work, ids)
    if work is not dst:
        dst[...] = work
    return result


@overload
def paged_block_table(
    rows: Any, max_blocks: int, *, pad: int = 0, out: None = None
) -> torch.Tensor: ...
@overload
def paged_block_table(rows: Any, max_blocks: int, *, pad: int = 0, out: Table) -> Table: ...
def paged_block_table(
    rows: Any,
    max_blocks: int,
    *,
    pad: int = 0,
    out: torch.Tensor | npt.NDArray[np.int32] | None = None,
) -> torch.Tensor | npt.NDArray[np.int32]:
    """Paged block table: ``table[r, j] = rows[r][j]`` for ``j < len(rows[r])``, ``pad`` after.

    Args:
        rows: ``R`` rows of ``0..max_blocks`` block ids each (same containers as
            :func:`ring_block_table`); an empty row is all ``pad``.
        max_blocks: table width, positive.
        pad: the value after each row's ids, an int32 (upstream DeepSeek pads with 0, Qwen with -1).
        out: optional int32 CPU tensor or NumPy array ``[R, max_blocks]``, written in place and
            returned.

    Returns:
        ``out``, or a new int32 tensor ``[R, max_blocks]``.

    Raises:
        ValueError: ``"max_blocks must be positive"``; then, per row in order,
            ``"row {r} has {n} blocks, maximum is {max_blocks}"``,
            ``"block IDs must not be negative"``, or an id above ``2**31 - 1`` (row and id named);
            a ``pad`` outside int32.
        TypeError: a non-integer id (row named), a non-integer ``pad``, or a bad ``out``.
    """
    max_blocks = check_max_blocks(max_blocks)
    pad = check_pad(pad)
    ids = id_rows(rows, max_blocks, "paged")
    result, dst = _destination(out, len(ids.lengths), max_blocks)
    _write_paged(dst, _unaliased(ids, dst), pad)
    return result


def _unaliased(ids: IdRows, dst: npt.NDArray[np.int32]) -> IdRows:
    """``ids``, copied first when they may share memory with ``dst`` (ids read from the table
    being written: tiling would read cells it has already overwritten)."""
    if np.may_share_memory(ids.values, dst):
        return IdRows(ids.values.copy(), ids.lengths)
    return ids


def _write_ring(dst: npt.NDArray[np.int32], ids: IdRows) -> None:
    """Tile each run of consecutive equal-length rows as one block, a lone row by itself."""
    lengths, values = ids.lengths, ids.values
    if ids.width is not None:
        tile_rows(dst, values.reshape(len(lengths), ids.width))
        return
    offsets = ids.offsets
    begin = 0
    for end in range(1, len(lengths) + 1):
        if end < len(lengths) and lengths[end] == lengths[begin]:
            continue
        run = values[offsets[begin] : offsets[end]]
        if end - begin == 1:
            tile_row(dst[begin], run)
        else:
            tile_rows(dst[begin:end], run.reshape(end - begin, lengths[begin]))
        begin = end


def _write_paged(dst: npt.NDArray[np.int32], ids: IdRows, pad: int) -> None:
    if ids.width is not None:
        dst[:, : ids.width] = ids.values.reshape(len(ids.lengths), ids.width)
        dst[:, ids.width :] = pad
    elif ids.lengths:
        dst[...] = pad
        dst[np.arange(dst.shape[1]) < np.array(ids.lengths)[:, None]] = ids.values


def _destination(
    out: object, rows: int, max_blocks: int
) -> tuple[torch.Tensor | npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """``(what to return, a NumPy view to write)``; a new tensor when ``out`` is None."""
    if out is None:
        table = torch.empty((rows, max_blocks), dtype=torch.int32)
        return table, table.numpy()
    shape = (rows, max_blocks)
    if isinstance(out, torch.Tensor):
        if out.dtype != torch.int32 or out.device.type != "cpu":
            raise BlockprepTypeError(
                f"out must be an int32 CPU tensor, got {out.dtype} on {out.device}"
            )
        if tuple(out.shape) != shape:
            raise BlockprepValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
        check_writable(out, "out")
        view = out.detach().numpy()
        check_no_self_overlap(view, "out")
        return out, view
    if isinstance(out, np.ndarray):
        if out.dtype != np.int32:
            raise BlockprepTypeError(f"out must be an int32 array, got {out.dtype}")
        if out.shape != shape:
            raise BlockprepValueError(f"out must have shape {shape}, got {out.shape}")
        if not out.flags.writeable:
            raise BlockprepValueError("out is read-only")
        check_no_self_overlap(out, "out")
        return out, out
    raise BlockprepTypeError(
        f"out must be a torch.Tensor or numpy.ndarray, got {type(out).__name__}"
    )
