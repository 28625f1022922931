"""Slot mapping for paged KV caches: where each row's current token writes its K and V.

For a request whose sequence holds ``s`` tokens (the current one included) and whose pages are
``pages``, the current token sits at position ``t = s - 1`` and writes cache slot
``pages[t // page_size] * page_size + t % page_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import INT32_MAX, NOT_ID_ROWS, as_int, checked_ids
from blockprep.buffers import check_no_self_overlap, check_writable
from blockprep.errors import BlockprepTypeError, BlockprepValueError


def paged_slot_mapping(
    pages: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    page_size: int,
    *,
    out: torch.Tensor | npt.NDArray[np.int32] | None = None,
) -> torch.Tensor | npt.NDArray[np.int32]:
    """int32 ``[A]`` decode slots, one per row; written into ``out[:A]`` when given.

    Args:
        pages: ``A`` page-id lists.
        seq_lens: ``A`` sequence lengths, each at least 1 (the current token included).
        page_size: tokens per page, positive.
        out: an int32 CPU tensor or array with at least ``A`` elements.

    Raises:
        ValueError: a seq_len below 1 (row named); a page list too small for the position
            (upstream's ``"page_ids list length {n} is too small for decode position {t}; need
            at least {k} pages"``); a slot above ``2**31 - 1`` (row and slot named) instead of
            wrapping. Nothing is written.
        TypeError: ``pages`` or ``seq_lens`` not an ordered sequence (a ``set`` or ``dict``
            included), a page list that is not one, a page id or seq_len that is not an integer
            (``bool`` and ``float`` included; row named); ``out`` not an int32 CPU tensor or
            NumPy array.
    """
    slots = decode_slots(pages, seq_lens, page_size)
    if out is None:
        return torch.tensor(slots, dtype=torch.int32)
    if isinstance(out, torch.Tensor):
        if out.device.type != "cpu":
            raise BlockprepTypeError(
                f"out must be an int32 CPU tensor or array, got a tensor on {out.device}"
            )
        target = out.detach().numpy()
    elif isinstance(out, np.ndarray):
        target = out
    else:
        raise BlockprepTypeError(
            f"out must be an int32 CPU tensor or array, got {type(out).__name__}"
        )
    if target.dtype != np.int32 or target.ndim != 1 or len(target) < len(slots):
        raise BlockprepValueError(f"out must be int32 with at least {len(slots)} elements")
    check_writable(out, "out")
    check_no_self_overlap(target[: len(slots)], "out")
    target[: len(slots)] = slots
    return out


def decode_slots(
    pages: Sequence[Sequence[Any]], seq_lens: Sequence[int], page_size: int
) -> list[int]:
    """The slots of :func:`paged_slot_mapping` as Python ints, checked, nothing written."""
    page_size = as_int(page_size, "page_size")
    if page_size <= 0:
        raise BlockprepValueError(f"page_size must be positive, got {page_size}")
    _check_sequence(pages, "pages")
    _check_sequence(seq_lens, "seq_lens")
    if len(pages) != len(seq_lens):
        raise BlockprepValueError(f"{len(pages)} page lists for {len(seq_lens)} seq_lens")
    return [
        decode_slot(row, pages[row], seq_len, page_size) for row, seq_len in enumerate(seq_lens)
    ]


def decode_slot(row: int, pages: Sequence[Any], seq_len: int, page_size: int) -> int:
    """Row ``row``'s slot for a sequence of ``seq_len`` tokens in ``pages``; see
    :func:`paged_slot_mapping` for the errors (``page_size`` is trusted to be positive)."""
    if type(seq_len) is not int:  # bools, floats, arrays: no silent 1/0 or truncation
        seq_len = as_int(seq_len, f"slot-mapping row {row} seq_len")
    if type(pages) is not list and (
        isinstance(pages, NOT_ID_ROWS)
        or not isinstance(pages, (Sequence, np.ndarray, torch.Tensor))
        or getattr(pages, "ndim", 1) != 1
    ):
        raise BlockprepTypeError(
            f"slot-mapping row {row} pages must be a sequence of page ids, "
            f"got {type(pages).__name__}"
        )
    if seq_len < 1:
        raise BlockprepValueError(
            f"slot-mapping row {row} has seq_len {seq_len}; it must be positive"
        )
    position = seq_len - 1
    index, offset = divmod(position, page_size)
    if index >= len(pages):
        raise BlockprepValueError(
            f"page_ids list length {len(pages)} is too small for decode position "
            f"{position}; need at least {index + 1} pages"
        )
    page = pages[index]
    if type(page) is not int or page < 0:
        page = int(checked_ids(row, [page], "paged")[0])
    slot = page * page_size + offset
    if slot > INT32_MAX:
        raise BlockprepValueError(
            f"slot-mapping row {row} maps to slot {slot} (page {page}), above {INT32_MAX}"
        )
    return slot


def _check_sequence(value: object, name: str) -> None:
    """``TypeError`` naming ``name`` unless ``value`` is an ordered sequence (a list, tuple, or an
    array or tensor of at least one dimension)."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        if value.ndim >= 1:
            return
    elif isinstance(value, Sequence) and not isinstance(value, NOT_ID_ROWS):
        return
    raise BlockprepTypeError(
        f"{name} must be a sequence (list, tuple, array), got {type(value).__name__}"
    )
