"""A Qwen decode batch's fields read and checked as upstream's runner does (seed-semantics 2.3):
the adopted buffers against the recorded ABI, each row's pages, the token and length tensors.

Every function raises upstream's message first, then the place, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import INT64_MAX, NOT_ID_ROWS, has_integer_dtype
from blockprep.adapters.qwen_abi import QWEN3_PREPARED_ARGUMENTS, qwen3_prepared_arguments
from blockprep.batch import DecodeBatch
from blockprep.buffers import check_adopted, check_disjoint
from blockprep.errors import BlockprepTypeError, BlockprepValueError


def adopted_buffers(
    buffers: Mapping[str, torch.Tensor] | None,
    batch: int,
    max_seq_len: int,
    page_size: int,
    width: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """``buffers`` checked against the recorded ABI (upstream's argument names, int32, shapes),
    contiguous, on the CPU, writable and disjoint (:func:`~blockprep.buffers.check_adopted`,
    :func:`~blockprep.buffers.check_disjoint`); nothing is adopted unless every one passes."""
    if not buffers:
        return {}
    if device.type != "cpu":
        raise BlockprepValueError(
            f"adopted buffers are the buffers the runtime reads: device must be 'cpu', "
            f"got {str(device)!r}"
        )
    unknown = [name for name in buffers if name not in QWEN3_PREPARED_ARGUMENTS]
    if unknown:
        raise BlockprepValueError(
            f"unknown Qwen decode buffers {unknown}; upstream's names are "
            f"{list(QWEN3_PREPARED_ARGUMENTS)}"
        )
    specs = qwen3_prepared_arguments(batch, max_seq_len, page_size, width)
    adopted: dict[str, torch.Tensor] = {}
    for name in QWEN3_PREPARED_ARGUMENTS:
        if name not in buffers:
            continue
        tensor = buffers[name]
        specs[name].check(tensor)
        adopted[name] = check_adopted(tensor, name)
    check_disjoint(adopted)  # seq_lens and slot_mapping as one tensor, a slot_mapping in the table
    return adopted


def check_page_row(row: int, pages: object) -> None:
    """``TypeError`` naming the row unless ``pages`` is an ordered sequence of ids (a list,
    tuple, or 1-D array or tensor; not a set, dict, string or bytes-like object)."""
    if (
        isinstance(pages, NOT_ID_ROWS)
        or not isinstance(pages, (Sequence, np.ndarray, torch.Tensor))
        or getattr(pages, "ndim", 1) != 1
    ):
        raise BlockprepTypeError(
            f"decode row {row} page_ids must be a sequence of page ids, got {type(pages).__name__}"
        )


INTEGER_DTYPES = frozenset(
    {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
)


def raise_token_shape(tokens: torch.Tensor, count: int) -> NoReturn:
    """Token ids must be ``[A]`` or ``[A, 1]`` (upstream's message; upstream's ``reshape(A,
    -1)`` also let ``[1, A]`` and other shapes of ``A`` tokens through, which would hide a
    transposed batch)."""
    shape = tuple(tokens.shape)
    message = f"decode token_ids must contain exactly one token per row, got shape {shape}"
    if tokens.numel() == count:
        message += f" (expected [{count}] or [{count}, 1])"
    raise BlockprepValueError(message)


def check_integer_dtype(values: torch.Tensor, name: str) -> None:
    """``TypeError`` unless ``values`` holds integers (a bool or float tensor would be cast:
    ``True`` -> 1, ``11.7`` -> 11)."""
    if not has_integer_dtype(values):
        raise BlockprepTypeError(
            f"decode {name} must be an integer tensor ([A] int32 or int64), got dtype "
            f"{values.dtype}"
        )


def page_lists(batch: DecodeBatch) -> Sequence[Sequence[int]]:
    """Each row's pages, upstream's priority: ``kv_allocations[i].page_ids``, else
    ``block_ids[i]``."""
    allocations = getattr(batch, "kv_allocations", None)
    if not allocations:
        block_ids: Sequence[Sequence[int]] = getattr(batch, "block_ids", None) or []
        return block_ids
    return [allocation.page_ids for allocation in allocations]


def rows_of(block_ids: Sequence[Sequence[int]], count: int) -> list[Sequence[int]]:
    """The first ``count`` page lists, ``[]`` for rows past the end (upstream's default)."""
    return [block_ids[row] if row < len(block_ids) else [] for row in range(count)]


def tensor_values(values: torch.Tensor, count: int) -> list[Any]:
    """The first ``count`` values of a tensor as Python numbers (a 1-D tensor of ``count``
    values directly: reshaping and slicing a tensor cost more than the conversion)."""
    if values.ndim == 1 and values.shape[0] == count:
        listed: list[Any] = values.tolist()
        return listed
    flat: list[Any] = values.reshape(-1)[:count].tolist()
    return flat


_INT64 = np.dtype(np.int64)


def int64_values(values: torch.Tensor, count: int) -> npt.NDArray[np.int64]:
    """A tensor's first ``count`` values, flattened, as int64 NumPy (a view when it can be;
    other dtypes cast as upstream's int32 copy did, without its wrap-around)."""
    try:
        array = values.numpy()
    except (RuntimeError, TypeError):  # on a device, or needing grad, or no NumPy dtype
        array = values.detach().cpu().to(torch.int64).numpy()
    flat: npt.NDArray[Any] = array.reshape(-1)[:count]
    if flat.dtype is _INT64 or flat.dtype == _INT64:
        return flat
    if flat.dtype.kind not in "iu":
        flat = torch.from_numpy(np.ascontiguousarray(flat)).to(torch.int64).numpy()
    if flat.dtype.kind == "u" and flat.dtype.itemsize == 8:  # saturate, never wrap to negative
        flat = np.minimum(flat, np.uint64(INT64_MAX))
    return flat.astype(np.int64)
