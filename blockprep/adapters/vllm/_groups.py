"""VllmMultiGroupBlockTable: vLLM's ``MultiGroupBlockTable``, one :class:`VllmBlockTable` per KV
cache group (see :mod:`blockprep.adapters.vllm`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy.typing as npt
import torch

from blockprep._ids import as_int
from blockprep.adapters.vllm._steps import (
    GroupIds,
    RowItems,
    apply_packed,
    checked_ids,
    iterable,
    step_deltas,
    step_items,
    unknown_row,
    where,
)
from blockprep.adapters.vllm._table import VllmBlockTable, _kernel_block_size, _positive
from blockprep.adapters.vllm._verify import GroupCallerLists
from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.wire import DeltaCursor


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class VllmMultiGroupBlockTable:
    """vLLM's ``MultiGroupBlockTable``: one :class:`VllmBlockTable` per KV cache group.

    Args, in vLLM's order: ``max_num_reqs``, ``max_model_len``, ``max_num_batched_tokens``,
    ``pin_memory``, ``device``, ``block_sizes`` (one per group), ``kernel_block_sizes`` (``None``
    or equal to ``block_sizes``), ``max_num_blocks`` (per group; default
    ``cdiv(max_model_len, block_size)``). As in vLLM, a group's column count is rounded up to a
    multiple of ``128 // block_size`` when ``block_size <= 128``. ``separate`` and ``verify`` as
    in :class:`VllmBlockTable` (``verify``: every group's table and counts against a rebuild of
    the block lists the calls gave that group, after every call that writes rows).

    Row operations take one id list per group (``block_ids[g]`` for group ``g``; vLLM's
    ``tuple[list[int], ...]``). Unlike vLLM, which writes group after group and stops at the
    first failure, every group's ids and the row are checked before any group is written; errors
    name the group, the row and the value. ``table[g]`` is group ``g``'s :class:`VllmBlockTable`.
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: str | torch.device,
        block_sizes: Sequence[int],
        kernel_block_sizes: Sequence[int] | None = None,
        max_num_blocks: Sequence[int] | None = None,
        *,
        separate: bool = False,
        verify: bool = False,
    ) -> None:
        sizes = [_positive(size, "block size") for size in block_sizes]
        if not sizes:
            raise BlockprepValueError("block_sizes must name at least one KV cache group")
        if kernel_block_sizes is not None:
            if len(kernel_block_sizes) != len(sizes):
                raise BlockprepValueError(
                    f"kernel_block_sizes length ({len(kernel_block_sizes)}) must match "
                    f"block_sizes length ({len(sizes)})"
                )
            for size, kernel in zip(sizes, kernel_block_sizes, strict=True):
                _kernel_block_size(size, kernel)
        max_model_len = _positive(max_model_len, "max_model_len")
        if max_num_blocks is None:
            max_num_blocks = [_cdiv(max_model_len, size) for size in sizes]
        if len(max_num_blocks) != len(sizes):
            raise BlockprepValueError(
                f"max_num_blocks length ({len(max_num_blocks)}) must match block_sizes length "
                f"({len(sizes)})"
            )
        widths = [
            _cdiv(n, 128 // size) * (128 // size) if size <= 128 else n
            for n, size in zip(max_num_blocks, sizes, strict=True)
        ]
        self.block_tables = [
            VllmBlockTable(
                size,
                max_num_reqs,
                width,
                max_num_batched_tokens,
                pin_memory,
                device,
                separate=separate,
            )
            for size, width in zip(sizes, widths, strict=True)
        ]
        self._num_rows = self.block_tables[0].max_num_reqs
        self._cursor = DeltaCursor()  # the last packed message applied (apply_packed)
        self.verify = bool(verify)
        if self.verify:  # the plain methods pay nothing for the option
            GroupCallerLists(self).install()

    def __getitem__(self, idx: int) -> VllmBlockTable:
        """Group ``idx``'s table."""
        return self.block_tables[idx]

    # --- per-row operations ----------------------------------------------------------------------

    def append_row(self, block_ids: GroupIds, row_idx: int) -> None:
        """Each group's row ``row_idx`` gains that group's ids; all groups checked first (its
        ids known in each: :class:`~blockprep.UnknownRowError` naming the group otherwise)."""
        checked = self._group_ids(block_ids, row_idx, append=True)
        for g, table in enumerate(self.block_tables):
            if not table.table.knows(row_idx):
                raise unknown_row(where(g, row_idx))
        for table, ids in zip(self.block_tables, checked, strict=True):
            table.table.append(row_idx, ids)

    def add_row(self, block_ids: GroupIds, row_idx: int) -> None:
        """Each group's row ``row_idx`` holds that group's ids; all groups checked first."""
        checked = self._group_ids(block_ids, row_idx, append=False)
        for table, ids in zip(self.block_tables, checked, strict=True):
            table.add_row(ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        self._row(row_idx)
        for table in self.block_tables:
            table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        self._row(src)
        self._row(tgt)
        for table in self.block_tables:
            table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        self._row(src)
        self._row(tgt)
        for table in self.block_tables:
            table.swap_row(src, tgt)

    def clear(self) -> None:
        for table in self.block_tables:
            table.clear()

    # --- a whole step ----------------------------------------------------------------------------

    def apply_step(
        self,
        *,
        finished: Iterable[int] = (),
        appended: RowItems[GroupIds | None] = (),
        added: RowItems[GroupIds] = (),
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """:meth:`VllmBlockTable.apply_step` for every group: ``appended`` and ``added`` map a
        row to one id list per group (``appended`` may map it to ``None``). Every group's step
        is checked before any group is written."""
        first = self.block_tables[0]
        commit = None if num_reqs is None else first._num_reqs(num_reqs)
        finished = list(iterable(finished, "finished", "an iterable of rows"))
        appended_items = list(step_items(appended, "appended"))
        added_items = list(step_items(added, "added"))
        moves = list(iterable(moves, "moves", "(src, tgt) pairs"))
        groups = len(self.block_tables)
        for row, ids in [*appended_items, *added_items]:
            if ids is not None and len(ids) != groups:
                raise BlockprepValueError(
                    f"block-table row {row} has ids for {len(ids)} KV cache groups, "
                    f"expected {groups}"
                )
        for row in finished:
            self._row(row)
        steps = []
        for g, group in enumerate(self.block_tables):
            table = group.table
            truncate, append, pairs = step_deltas(
                table,
                finished,
                [(row, None if ids is None else ids[g]) for row, ids in appended_items],
                [(row, ids[g]) for row, ids in added_items],
                moves,
            )
            width = group.max_num_blocks_per_req
            for row in [*truncate, *append]:
                if not table.knows(self._row(row)):
                    raise unknown_row(where(g, row))
            for row, ids in append.items():
                count = 0 if row in truncate else int(group.num_blocks_per_row[self._row(row)])
                append[row] = checked_ids(where(g, row), ids, count, width)
            steps.append((table, truncate, append, pairs))
        # Everything is checked: from here on nothing raises.
        for table, truncate, append, pairs in steps:
            if truncate or append:
                table.apply_deltas(truncate=truncate, append=append)
            for src, tgt in pairs:
                table.copy_row(src, tgt)
        if commit is not None:
            self.commit_block_table(commit)

    def apply_packed(
        self,
        message: object,
        *,
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """:meth:`VllmBlockTable.apply_packed` for every group: a record's ``group`` is the KV
        cache group's index. Every group's records are planned before any group is written;
        an error names the group first (``KV cache group 1: ...``)."""
        first = self.block_tables[0]
        commit = None if num_reqs is None else first._num_reqs(num_reqs)
        tables = [group.table for group in self.block_tables]
        apply_packed(tables, first._row_list, self._cursor, message, moves)
        if commit is not None:
            self.commit_block_table(commit)

    def resync_request(self) -> dict[str, Any]:
        """:meth:`VllmBlockTable.resync_request` (one message sequence for every group)."""
        return self._cursor.resync_request()

    # --- hand-off --------------------------------------------------------------------------------

    def commit_block_table(self, num_reqs: int) -> None:
        for table in self.block_tables:
            table.commit_block_table(num_reqs)

    def compute_slot_mapping(self, req_indices: npt.ArrayLike, positions: npt.ArrayLike) -> None:
        """Each group's ``slot_mapping`` (see :meth:`VllmBlockTable.compute_slot_mapping`);
        every group is checked before any is written."""
        req, pos = self.block_tables[0]._token_arrays(req_indices, positions)
        blocks = []
        for g, table in enumerate(self.block_tables):
            block = pos // table.block_size
            table._check_positions(req, pos, block, f"KV cache group {g} ")
            blocks.append(block)
        for table, block in zip(self.block_tables, blocks, strict=True):
            table._write_slots(req, pos, block)

    # --- internals -------------------------------------------------------------------------------

    def _row(self, row: object) -> int:
        if type(row) is int and 0 <= row < self._num_rows:
            return row
        index = as_int(row, "block-table row index")
        self.block_tables[0].table.cached_ids(index)  # raises the table's IndexError
        return index

    def _group_ids(self, block_ids: GroupIds, row_idx: int, *, append: bool) -> list[list[int]]:
        row = self._row(row_idx)
        if isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Sequence):
            raise BlockprepTypeError(
                f"block-table row {row}: block_ids must hold one id list per KV cache group, "
                f"got {type(block_ids).__name__}"
            )
        if len(block_ids) != len(self.block_tables):
            raise BlockprepValueError(
                f"block-table row {row} has ids for {len(block_ids)} KV cache groups, "
                f"expected {len(self.block_tables)}"
            )
        checked = []
        for g, (table, ids) in enumerate(zip(self.block_tables, block_ids, strict=True)):
            count = int(table.num_blocks_per_row[row]) if append else 0
            checked.append(checked_ids(where(g, row), ids, count, table.max_num_blocks_per_req))
        return checked
