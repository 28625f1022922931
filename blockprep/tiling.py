"""Ring tiling: write ``ids[j % n]`` across a table row without a temporary per row.

Two constructions, picked by measurement (docs/benchmarks.md, "tiling constructions"):

- a gather through a cached, read-only tiling index ``arange(max_blocks) % n`` (upstream's fix):
  fastest for one narrow row;
- a broadcast of the ids into a ``[rows, max_blocks // n, n]`` view of the destination, then the
  ``max_blocks % n`` remainder: no index at all, memcpy-like, fastest for wide rows and for blocks
  of rows that share a length. Rings of a few ids use a doubling copy instead, whose copies stay
  long where a broadcast's inner loop would be a few elements.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

TILING_CACHE_SIZE = 256
"""Entries kept by :func:`tiling_index` (least recently used first out)."""

GATHER_MAX_WIDTH = 512
"""A row up to this width is tiled by a gather through :func:`tiling_index`, wider by broadcast."""

DOUBLING_MAX_RING = 8
"""Blocks of rows whose rings hold at most this many ids are tiled by a doubling copy."""


@functools.lru_cache(maxsize=TILING_CACHE_SIZE)
def tiling_index(max_blocks: int, n: int) -> npt.NDArray[np.intp]:
    """The tiling index ``arange(max_blocks) % n``: read-only ``intp [max_blocks]``, shared.

    Cached per ``(max_blocks, n)`` in a bounded LRU cache that is safe to use from many threads.
    Entries are never written: writing into one, or making it writeable, raises ``ValueError``.
    """
    base = np.arange(max_blocks, dtype=np.intp) % n
    base.flags.writeable = False
    # A read-only view of a read-only base: its writeable flag cannot be turned back on.
    index: npt.NDArray[np.intp] = base.view()
    index.flags.writeable = False
    return index


def tile_row(dst: npt.NDArray[Any], ids: npt.NDArray[Any]) -> None:
    """Write ``dst[j] = ids[j % n]`` for a contiguous 1-D ``dst``; ``1 <= len(ids) <= len(dst)``."""
    width, n = len(dst), len(ids)
    if n == width or n == 1:
        dst[...] = ids
    elif width <= GATHER_MAX_WIDTH:
        np.take(ids, tiling_index(width, n), out=dst)
    else:
        whole = width - width % n
        dst[:whole].reshape(whole // n, n)[...] = ids
        dst[whole:] = ids[: width - whole]


def tile_rows(dst: npt.NDArray[Any], ids: npt.NDArray[Any]) -> None:
    """Write ``dst[r, j] = ids[r, j % n]`` for a C-contiguous 2-D ``dst`` and ``ids [rows, n]``."""
    rows, width = dst.shape
    n = ids.shape[1]
    if n == width or n == 1:
        dst[...] = ids
    elif n <= DOUBLING_MAX_RING:
        dst[:, :n] = ids
        filled = n
        while filled < width:
            step = min(filled, width - filled)
            dst[:, filled : filled + step] = dst[:, :step]
            filled += step
    else:
        periods = width // n
        itemsize = dst.itemsize
        strides = (width * itemsize, n * itemsize, itemsize)
        view: npt.NDArray[Any] = np.ndarray((rows, periods, n), dst.dtype, dst, 0, strides)
        view[...] = ids[:, None, :]
        dst[:, periods * n :] = ids[:, : width - periods * n]
