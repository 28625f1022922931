"""Ring tiling: write ``ids[j % n]`` across table rows without a temporary per row.

Two constructions, picked by measurement (docs/benchmarks.md, "Tiling constructions"):

- a broadcast of the ids into a ``[rows, max_blocks // n, n]`` view of the destination, then the
  ``max_blocks % n`` remainder: no index, no temporary, one NumPy call for a block of rows;
- a doubling copy (the ids into the first ``n`` columns, then the filled prefix copied onwards):
  ``log2(max_blocks / n)`` long copies, faster once the broadcast's inner loop (``n`` ids, once
  per period of every row) would run many thousands of times.

Upstream's fix, a gather through a cached ``arange(max_blocks) % n`` index, lost to both at every
shape measured (up to 7x slower at 64x4096), so nothing here needs a cache: no state is shared
between calls or threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

DOUBLING_MIN_PERIODS = 4096
"""A block of rows is tiled by the doubling copy when ``rows * (max_blocks // n)`` reaches this."""


def tile_row(dst: npt.NDArray[Any], ids: npt.NDArray[Any]) -> None:
    """Write ``dst[j] = ids[j % n]`` for a contiguous 1-D ``dst``; ``1 <= len(ids) <= len(dst)``."""
    width, n = len(dst), len(ids)
    if n == width or n == 1:
        dst[...] = ids
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
    elif rows == 1:
        tile_row(dst[0], ids[0])
    elif rows * (width // n) >= DOUBLING_MIN_PERIODS:
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
