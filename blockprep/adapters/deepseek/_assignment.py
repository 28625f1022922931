"""Where a DeepSeek V4 batch's requests sit: rank by cache partition, local row by arrival."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as _replace
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from blockprep._ids import as_int
from blockprep.adapters.deepseek.layout import DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepTypeError, BlockprepValueError


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
    ranks = _ranks(partitions, R)
    counts = [0] * R
    local_rows = [0] * A
    rows = [0] * A  # per request, its table row
    firsts = [0] * R  # each rank's first request (request 0 for an empty rank)
    for q, rank in enumerate(ranks):  # one pass: local row by arrival on the rank
        local = counts[rank]
        counts[rank] = local + 1
        local_rows[q] = local
        rows[q] = rank * b + local
        if not local:
            firsts[rank] = q
    if len(ranks) != A or max(counts) > b:
        _raise_first(partitions, R, b)
    perm = [A + local - count for count in counts for local in range(b)]
    source = [q for q in firsts for _ in range(b)]
    for q, row in enumerate(rows):
        perm[row] = q
        source[row] = q
    ids = list(request_ids)
    return Assignment(
        ids,
        list(partitions),
        tuple(ranks),
        tuple(local_rows),
        tuple(counts),
        perm,
        list(map([*ids, *[None] * (R * b)].__getitem__, perm)),  # padding rows: None
        np.array(source, dtype=np.intp),
        np.array(rows, dtype=np.intp),
        R * b == A and perm == list(range(R * b)),
        _rows_by_id(ids, rows),
    )


def _ranks(partitions: Sequence[Any], R: int) -> list[int]:
    """Each request's rank, its partition, when every one is an integer in ``[0, R)``; else
    those that are (the caller then finds the first fault)."""
    ranks = partitions if type(partitions) is list else list(partitions)
    if set(map(type, ranks)) <= _INT and min(ranks) >= 0 and max(ranks) < R:
        return ranks
    converted = [p if type(p) is int else _partition_index(p) for p in ranks]
    return [rank for rank in converted if 0 <= rank < R]


def _raise_first(partitions: Sequence[Any], R: int, b: int) -> NoReturn:
    """Upstream's message for the first request, in batch order, whose partition is out of
    ``[0, R)`` (anything but an integer, a bool included) or whose rank is already full."""
    counts = [0] * R
    for partition in partitions:
        rank = partition if type(partition) is int else _partition_index(partition)
        if not 0 <= rank < R:
            raise BlockprepValueError(f"DeepSeekV4 decode cache partitions must be in [0, {R - 1}]")
        if counts[rank] >= b:
            raise BlockprepValueError(
                f"DeepSeekV4 rank {rank} decode batch exceeds local capacity {b}"
            )
        counts[rank] += 1
    raise AssertionError("no request refused")


_INT = {int}


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
