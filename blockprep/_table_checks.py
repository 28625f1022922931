"""Checks of a :class:`~blockprep.block_table.BlockTable`'s buffer against the ids it holds:
:func:`check_table` (what each known row's cells must be, by definition) and :func:`verify_table`
(a from-scratch rebuild through :mod:`blockprep.reference`). Both read the table through its
public API only; both raise :class:`StaleRowError` naming the first row and column that differ.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from blockprep._ids import Kind
from blockprep.errors import StaleRowError


class CheckedTable(Protocol):
    """What the checks read of a table (a :class:`~blockprep.block_table.BlockTable`, which
    this module does not import): its public API only."""

    @property
    def kind(self) -> Kind: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def max_blocks(self) -> int: ...
    @property
    def pad(self) -> int: ...
    @property
    def lengths(self) -> npt.NDArray[np.int32]: ...
    def numpy(self) -> npt.NDArray[np.int32]: ...
    def cached_ids(self, row: int) -> list[int] | None: ...
    def held_rows(self, count: int) -> list[list[int] | None]: ...


def check_table(table: CheckedTable) -> None:
    """:meth:`BlockTable.check`: every row with known content against the buffer, cell by cell
    from the definition (a ring row ``ids[j % n]``, a paged row its ids then ``pad``, a cleared
    row all ``pad``)."""
    width, pad, cells = table.max_blocks, table.pad, table.numpy()
    expected = np.empty(width, dtype=np.int32)
    for row in range(table.num_rows):
        held = table.cached_ids(row)
        if held is None:
            continue
        if not held:
            expected[...] = pad
        elif table.kind == "ring":
            expected[...] = np.resize(np.array(held, dtype=np.int32), width)
        else:
            expected[: len(held)] = held
            expected[len(held) :] = pad
        actual = cells[row]
        if not np.array_equal(actual, expected):
            column = int(np.flatnonzero(actual != expected)[0])
            raise StaleRowError(
                f"block-table row {row} column {column} holds {int(actual[column])}, but its "
                f"cached ids say {int(expected[column])}; call invalidate() after writing the "
                "buffer directly"
            )


def verify_table(table: CheckedTable) -> None:
    """:meth:`BlockTable.verify`: every row whose ids the table knows against a from-scratch
    rebuild of those ids through :mod:`blockprep.reference` (``ring_block_table_repeat``,
    ``block_table_per_row``; a cleared row is all ``pad``), and :attr:`BlockTable.lengths`
    against the held ids. Rows of unknown content are skipped."""
    from blockprep import reference  # only here: verification is an opt-in slow path

    width, pad, cells, lengths = table.max_blocks, table.pad, table.numpy(), table.lengths
    expected = np.full((table.num_rows, width), pad, dtype=np.int32)
    held = table.held_rows(table.num_rows)
    filled: list[int] = []
    rows: list[list[int]] = []
    for row, ids in enumerate(held):
        if ids is None:
            continue
        if len(ids) != int(lengths[row]):
            raise StaleRowError(
                f"verify: block-table row {row} caches {len(ids)} ids, but its length "
                f"says {int(lengths[row])}"
            )
        if ids:
            filled.append(row)
            rows.append(ids)
    if rows:
        if table.kind == "ring":
            rebuilt = reference.ring_block_table_repeat(rows, max_blocks=width)
        else:
            rebuilt = reference.block_table_per_row(rows, max_blocks=width, pad=pad)
        expected[filled] = rebuilt.numpy()
    known = np.array([ids is not None for ids in held], dtype=bool)
    differs = (cells != expected) & known[:, None]
    if differs.any():
        row, column = (int(i) for i in np.argwhere(differs)[0])
        raise StaleRowError(
            f"verify: block-table row {row} column {column} holds "
            f"{int(cells[row, column])}, but a rebuild of its ids through "
            f"blockprep.reference gives {int(expected[row, column])}"
        )
