"""Reference constructions: upstream's block-table builders, kept plain and obviously correct.

Public so that users can check blockprep (or their own code) against them, and used by the
benchmarks as baselines. They reproduce upstream pypto-serving exactly, including its quirks: ids
are coerced with ``int()``, a ring row longer than ``max_blocks`` is truncated, and a failed call
may have done part of its work. Not fast, on purpose.

- :func:`ring_block_table_repeat`: the ring builder before the upstream fix, one
  ``torch.tensor(ids).repeat(...)`` temporary per row.
- :func:`ring_block_table_gather`: the upstream fix, a cached ``arange(max_blocks) % n`` index
  gathered into each row.
- :func:`block_table_per_row`: the paged builder before the fix, one tensor per row.
- :func:`block_table_one_tensor`: the upstream fix, one tensor per call.

All return a new int32 tensor ``[len(rows), max_blocks]``. Paged tables take ``pad`` (upstream
DeepSeek: 0, the default; Qwen: -1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

_GATHER_INDEX: dict[tuple[int, int], torch.Tensor] = {}


def _check_max_blocks(max_blocks: int) -> None:
    if max_blocks <= 0:
        raise ValueError("max_blocks must be positive")


def _ring_ids(r: int, row: Iterable[object]) -> tuple[int, ...]:
    ids = tuple(int(x) for x in row)  # type: ignore[call-overload]
    if not ids:
        raise ValueError(f"ring block-table row {r} has no allocated blocks")
    if any(x < 0 for x in ids):
        raise ValueError("block IDs must not be negative")
    return ids


def _paged_ids(r: int, row: Sequence[object], max_blocks: int) -> list[int]:
    if len(row) > max_blocks:
        raise ValueError(f"row {r} has {len(row)} blocks, maximum is {max_blocks}")
    ids = [int(x) for x in row]  # type: ignore[call-overload]
    if any(x < 0 for x in ids):
        raise ValueError("block IDs must not be negative")
    return ids


def ring_block_table_repeat(
    per_request_block_ids: Sequence[Iterable[object]], *, max_blocks: int
) -> torch.Tensor:
    """Upstream ring table before the fix: a ``torch.tensor(ids).repeat(...)`` per row."""
    _check_max_blocks(max_blocks)
    table = torch.empty((len(per_request_block_ids), max_blocks), dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _ring_ids(r, row)
        repeats = math.ceil(max_blocks / len(ids))
        table[r].copy_(torch.tensor(ids, dtype=torch.int32).repeat(repeats)[:max_blocks])
    return table


def ring_block_table_gather(
    per_request_block_ids: Sequence[Iterable[object]], *, max_blocks: int
) -> torch.Tensor:
    """Upstream ring table after the fix: a cached ``arange(max_blocks) % n`` gathered per row."""
    _check_max_blocks(max_blocks)
    table = torch.empty((len(per_request_block_ids), max_blocks), dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _ring_ids(r, row)
        key = (max_blocks, len(ids))
        index = _GATHER_INDEX.get(key)
        if index is None:
            index = _GATHER_INDEX.setdefault(key, torch.arange(max_blocks) % len(ids))
        torch.index_select(torch.tensor(ids, dtype=torch.int32), 0, index, out=table[r])
    return table


def block_table_per_row(
    per_request_block_ids: Sequence[Sequence[object]], *, max_blocks: int, pad: int = 0
) -> torch.Tensor:
    """Upstream paged table before the fix: ``pad``-filled, one tensor per non-empty row."""
    _check_max_blocks(max_blocks)
    table = torch.full((len(per_request_block_ids), max_blocks), pad, dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _paged_ids(r, row, max_blocks)
        if ids:
            table[r, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return table


def block_table_one_tensor(
    per_request_block_ids: Sequence[Sequence[object]], *, max_blocks: int, pad: int = 0
) -> torch.Tensor:
    """Upstream paged table after the fix: rows validated in order, then one tensor for all ids."""
    _check_max_blocks(max_blocks)
    rows = [_paged_ids(r, row, max_blocks) for r, row in enumerate(per_request_block_ids)]
    table = torch.full((len(rows), max_blocks), pad, dtype=torch.int32)
    lengths = torch.tensor([len(ids) for ids in rows], dtype=torch.int64)
    flat = torch.tensor([x for ids in rows for x in ids], dtype=torch.int32)
    table[torch.arange(max_blocks) < lengths[:, None]] = flat
    return table
