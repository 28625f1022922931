"""Upstream's checks of the grouped block ids, in upstream's order (seed-semantics 6.2, 6.3).

blockprep decides a step in one pass and checks only what changed; when that finds a fault, these
functions pick the error upstream would have raised first for the whole batch (normalisation,
then per rank the padding checks of every group, then the table builders' length checks), so
that messages and their precedence stay upstream's. Ids are read as upstream's ``int()`` would,
those that hold no integer value left to the id rule of :mod:`blockprep.grouped`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from blockprep.adapters.deepseek._assignment import Assignment
from blockprep.adapters.deepseek.layout import GROUP_NAMES, DeepSeekV4CacheGroup, DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepTypeError, BlockprepValueError

REPEAT_MESSAGE = "a grouped KV row must not repeat physical blocks"


def _range_error(num_blocks: int, kernel_rows: int) -> ValueError:
    return BlockprepValueError(
        f"grouped KV block IDs must be in [0, {num_blocks}); [{num_blocks}, "
        f"{num_blocks + kernel_rows}) is reserved for kernel padding"
    )


def _length_message(group: DeepSeekV4CacheGroup, row: int, n: int) -> str:
    if group.name == "ori":
        return f"ori ring row {row} has {n} blocks, maximum is {group.width}"
    if group.kind == "paged":
        return f"row {row} has {n} blocks, maximum is {group.width}"
    return f"ring block-table row {row} has {n} blocks, maximum is {group.width}"


def _sequence(ids: object, q: int, name: str) -> Sequence[Any]:
    """Request ``q``'s ``name`` ids as upstream iterates them (arrays and tensors as lists)."""
    if isinstance(ids, (np.ndarray, torch.Tensor)) and ids.ndim == 1:
        values: list[Any] = ids.tolist()
        return values
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise BlockprepTypeError(
            f"decode row {q} group {name} must be a sequence of block IDs, got {type(ids).__name__}"
        )
    return ids


def _integer_values(ids: Sequence[Any]) -> list[int]:
    """The ids that hold an integer value (``6``, ``6.0``, ``True``, ``np.int32(6)``), as ints."""
    values = []
    for x in ids:
        try:
            value = operator.index(x)
        except Exception:  # no integer (an __index__ that raises included)
            if not isinstance(x, (float, np.floating)) or not float(x).is_integer():
                continue
            value = int(x)
        values.append(value)
    return values


def normalization_error(batch: DecodeBatch) -> Exception | None:
    """The first error of upstream's ``_normalize_group_block_ids`` (seed-semantics 6.2)."""
    try:
        _normalized(batch)
    except (TypeError, ValueError) as error:
        return error
    return None


def _normalized(batch: DecodeBatch) -> list[dict[str, list[int]]]:
    """Every row's ids as upstream reads them, ids that are no integer value left out (the
    id rule decides about those)."""
    result = []
    for q, row in enumerate(batch.block_ids_by_group):
        if not isinstance(row, Mapping):
            raise BlockprepTypeError(
                f"decode row {q} grouped KV blocks must map group names to block IDs, got "
                f"{type(row).__name__}"
            )
        lists = {name: _sequence(row[name], q, name) for name in GROUP_NAMES if name in row}
        missing = [name for name in GROUP_NAMES if not lists.get(name)]
        if missing:
            raise BlockprepValueError(
                f"decode row {q} is missing grouped KV blocks: {', '.join(missing)}"
            )
        result.append({name: _integer_values(ids) for name, ids in lists.items()})
    return result


def upstream_error(
    layout: DeepSeekV4Layout, batch: DecodeBatch, assignment: Assignment
) -> Exception | None:
    """The first error upstream would raise for the block ids, or ``None``: normalisation,
    then per rank the padding checks of every group, then the table builders' checks."""
    try:
        normalized = _normalized(batch)
    except (TypeError, ValueError) as error:
        return error
    b = layout.decode_batch
    by_rank: list[list[int]] = [[] for _ in range(layout.ranks)]
    for q, rank in enumerate(assignment.ranks):
        by_rank[rank].append(q)
    for requests in by_rank:
        for group in layout.groups:
            for q in requests:
                ids = normalized[q][group.name]
                if len(set(ids)) != len(ids):
                    return BlockprepValueError(REPEAT_MESSAGE)
                pool = group.num_blocks
                assert pool is not None  # preparing needs a bound layout
                if ids and (min(ids) < 0 or max(ids) >= pool):
                    return _range_error(pool, b)
        for group in layout.groups:
            for local, q in enumerate(requests):
                n = len(batch.block_ids_by_group[q][group.name])
                if n > group.width:
                    return BlockprepValueError(_length_message(group, local, n))
    return None


def raise_first(error: Exception | None) -> None:
    """Raise ``error`` (upstream's first error, from the functions above) unless it is ``None``."""
    if error is not None:
        raise error
