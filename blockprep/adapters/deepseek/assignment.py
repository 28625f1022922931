"""Where a DeepSeek V4 batch's requests sit: rank by cache partition, local row by arrival."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as _replace
from typing import Any

import numpy as np
import numpy.typing as npt

from blockprep.adapters.deepseek.layout import DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.ids import as_int


@dataclass(frozen=True)
class Assignment:
    """Where one batch's requests sit: per request its rank and local row, per table row
    (``rank * b + local``) its request and the request whose dynamic inputs it copies."""

    request_ids: list[str]
    partitions: list[Any]
    ranks: tuple[int, ...]
    local_rows: tuple[int, ...]
    counts: tuple[int, ...]
    perm: list[int]  # per table row: request index, or A + k for scratch page k
    occupants: list[str | None]  # per table row: request id, None for a padding row
    source: npt.NDArray[np.intp]  # per table row: the request its dynamic inputs replicate
    request_rows: npt.NDArray[np.intp]  # per request: its table row
    in_order: bool  # request q sits in table row q, and no row is padding
    row_of: dict[Any, int]  # request id -> its table row


def assign(layout: DeepSeekV4Layout, batch: DecodeBatch, cached: Assignment | None) -> Assignment:
    """Rank and local row of every request (seed-semantics 6.1, upstream's messages), reusing
    ``cached`` (the previous batch's) when the partitions are the same."""
    request_ids, partitions = batch.request_ids, batch.cache_partitions
    if cached is not None and _equal(partitions, cached.partitions):
        if _equal(request_ids, cached.request_ids):
            return cached
        if len(request_ids) == len(partitions):  # the same places, other requests
            A = len(request_ids)
            now = [request_ids[q] if q < A else None for q in cached.perm]
            row_of = _rows_by_id(request_ids, cached.request_rows.tolist())
            return _replace(cached, request_ids=list(request_ids), occupants=now, row_of=row_of)
    A = len(request_ids)
    if A <= 0:
        raise BlockprepValueError("DeepSeekV4 decode batch must not be empty")
    if len(partitions) != A:
        raise BlockprepValueError("DeepSeekV4 decode requires one cache partition per request")
    R, b = layout.ranks, layout.decode_batch
    counts = [0] * R
    ranks: list[int] = []
    rows: list[int] = []  # per request, its table row
    for partition in partitions:
        rank = partition if type(partition) is int else _partition_index(partition)
        if not 0 <= rank < R:
            raise BlockprepValueError(f"DeepSeekV4 decode cache partitions must be in [0, {R - 1}]")
        local = counts[rank]
        if local >= b:
            raise BlockprepValueError(
                f"DeepSeekV4 rank {rank} decode batch exceeds local capacity {b}"
            )
        counts[rank] = local + 1
        ranks.append(rank)
        rows.append(rank * b + local)
    perm = [A + local - count for count in counts for local in range(b)]
    occupants: list[str | None] = [None] * (R * b)
    firsts = [0] * R  # each rank's first request (request 0 for an empty rank)
    for q in range(A - 1, -1, -1):
        firsts[ranks[q]] = q
    source = [q for q in firsts for _ in range(b)]
    ids = list(request_ids)
    for q, row in enumerate(rows):
        perm[row] = q
        occupants[row] = ids[q]
        source[row] = q
    return Assignment(
        ids,
        list(partitions),
        tuple(ranks),
        tuple(row - rank * b for row, rank in zip(rows, ranks, strict=True)),
        tuple(counts),
        perm,
        occupants,
        np.array(source, dtype=np.intp),
        np.array(rows, dtype=np.intp),
        R * b == A and perm == list(range(R * b)),
        _rows_by_id(ids, rows),
    )


def _equal(a: object, b: object) -> bool:
    """Whether ``a == b``; a request id or partition whose comparison raises is no match (the
    assignment is then made anew, and checks it)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def _rows_by_id(request_ids: Sequence[Any], rows: Sequence[int]) -> dict[Any, int]:
    """Each request id's table row; a request id that cannot be hashed or compared is refused."""
    try:
        return dict(zip(request_ids, rows, strict=True))
    except Exception as error:
        raise BlockprepTypeError(
            f"DeepSeekV4 decode request ids must hash and compare, got one that raised "
            f"{type(error).__name__}: {error}"
        ) from error


def _partition_index(partition: object) -> int:
    """A cache partition as an int; anything else is out of range (upstream's message)."""
    try:
        return as_int(partition, "cache partition")
    except TypeError:
        return -1
