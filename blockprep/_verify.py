"""Verify mode of the preparers: every buffer compared with a from-scratch rebuild.

``QwenDecodePreparer(..., verify=True)`` and ``DeepSeekV4DecodePreparer(..., verify=True)`` call
:func:`check_buffer` after each step, on each buffer against :mod:`blockprep.reference`'s
rebuild of the same step; the first difference raises :class:`~blockprep.block_table.
StaleRowError` naming the buffer, row and column (what ``BlockTable(verify=True)`` raises).
Slow on purpose (a whole rebuild per step): the first thing to switch on when wiring blockprep
into an engine, off in production.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from blockprep.errors import StaleRowError

Place = Callable[[tuple[int, ...]], str]
"""Names an index of a buffer for a message (``"row 3, column 2"``)."""


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> tuple[int, ...] | None:
    """The first index (row-major) where ``got`` differs from ``expected`` (NaN equals NaN),
    ``()`` for a shape or dtype mismatch, ``None`` when they are equal."""
    got = got.detach().cpu()
    expected = expected.detach().cpu()
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return ()
    differs = got != expected
    if got.is_floating_point():
        differs &= ~(got.isnan() & expected.isnan())
    flat = differs.reshape(-1)
    if not bool(flat.any()):
        return None
    index = int(torch.nonzero(flat)[0, 0])
    return tuple(int(i) for i in np.unravel_index(index, tuple(got.shape)))


def rows_and_columns(index: tuple[int, ...]) -> str:
    """``row r, column c`` of a 2-D buffer (``row r`` of a 1-D one)."""
    if len(index) == 1:
        return f"row {index[0]}"
    return f"row {index[0]}, column {index[1]}"


def check_buffer(
    what: str, name: str, got: torch.Tensor, expected: torch.Tensor, place: Place
) -> None:
    """Raise :class:`StaleRowError` at the first difference of buffer ``name``."""
    index = first_difference(got, expected)
    if index is None:
        return
    if index == ():
        raise StaleRowError(
            f"verify: {what} buffer {name} is {got.dtype} {list(got.shape)}, the reference "
            f"rebuild {expected.dtype} {list(expected.shape)}"
        )
    held = got.detach().cpu()[index].item()
    wanted = expected.detach().cpu()[index].item()
    raise StaleRowError(
        f"verify: {what} buffer {name} differs from the blockprep.reference rebuild at "
        f"{place(index)}: holds {held}, the rebuild {wanted}"
    )
