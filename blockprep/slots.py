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

from blockprep.buffers import check_no_self_overlap, check_writable
from blockprep.ids import INT32_MAX, as_int, checked_ids


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
        ValueError: a seq_len below 1; a page list too small for the position (upstream's
            ``"page_ids list length {n} is too small for decode position {t}; need at least {k}
            pages"``); a slot above ``2**31 - 1`` (row and slot named) instead of wrapping.
            Nothing is written.
        TypeError: a page id that is not an integer (row named).
    """
    slots = decode_slots(pages, seq_lens, page_size)
    if out is None:
        return torch.tensor(slots, dtype=torch.int32)
    target = out.numpy() if isinstance(out, torch.Tensor) else out
    if target.dtype != np.int32 or target.ndim != 1 or len(target) < len(slots):
        raise ValueError(f"out must be int32 with at least {len(slots)} elements")
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
        raise ValueError(f"page_size must be positive, got {page_size}")
    if len(pages) != len(seq_lens):
        raise ValueError(f"{len(pages)} page lists for {len(seq_lens)} seq_lens")
    return [
        decode_slot(row, pages[row], seq_len, page_size) for row, seq_len in enumerate(seq_lens)
    ]


def decode_slot(row: int, pages: Sequence[Any], seq_len: int, page_size: int) -> int:
    """Row ``row``'s slot for a sequence of ``seq_len`` tokens in ``pages``; see
    :func:`paged_slot_mapping` for the errors (``page_size`` is trusted to be positive)."""
    if seq_len < 1:
        raise ValueError(f"slot-mapping row {row} has seq_len {seq_len}; it must be positive")
    position = seq_len - 1
    index, offset = divmod(position, page_size)
    if index >= len(pages):
        raise ValueError(
            f"page_ids list length {len(pages)} is too small for decode position "
            f"{position}; need at least {index + 1} pages"
        )
    page = pages[index]
    if type(page) is not int or page < 0:
        page = int(checked_ids(row, [page], "paged")[0])
    slot = page * page_size + offset
    if slot > INT32_MAX:
        raise ValueError(
            f"slot-mapping row {row} maps to slot {slot} (page {page}), above {INT32_MAX}"
        )
    return slot
