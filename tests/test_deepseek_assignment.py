"""The DeepSeek V4 assignment (ranks, local rows, padding sources) against a model written from
seed-semantics 6.1: every field, and upstream's message for the first faulty partition."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep.adapters.deepseek import DeepSeekV4Layout
from blockprep.adapters.deepseek._assignment import assign
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepValueError

R, B = 3, 4
LAYOUT = DeepSeekV4Layout(ranks=R, decode_batch=B, max_seq_len=1024)


def rank_of(p: object) -> int:
    """An integer (a NumPy integer or 0-d integer tensor included) as itself; a bool, a bool
    tensor or anything else as -1 (out of range)."""
    if isinstance(p, (bool, np.bool_)) or (isinstance(p, torch.Tensor) and p.dtype == torch.bool):
        return -1
    try:
        return operator.index(p)  # type: ignore[arg-type]
    except TypeError:
        return -1


def model(partitions: list[Any]) -> dict[str, Any] | str:
    """Seed-semantics 6.1, one request at a time: its rank, then the next free row of that
    rank; a padding row (rank r, local k) is scratch page ``A + k - count_r`` and copies its
    rank's first request (request 0 for an empty rank). A fault: its message."""
    A = len(partitions)
    by_rank: list[list[int]] = [[] for _ in range(R)]
    ranks = []
    for q, p in enumerate(partitions):
        rank = rank_of(p)
        if not 0 <= rank < R:
            return f"DeepSeekV4 decode cache partitions must be in [0, {R - 1}]"
        if len(by_rank[rank]) == B:
            return f"DeepSeekV4 rank {rank} decode batch exceeds local capacity {B}"
        by_rank[rank].append(q)
        ranks.append(rank)
    perm: list[int] = []
    source: list[int] = []
    occupants: list[str | None] = []
    rows = [0] * A
    for r, members in enumerate(by_rank):
        for k in range(B):
            if k < len(members):
                q = members[k]
                rows[q] = r * B + k
                perm.append(q)
                source.append(q)
                occupants.append(f"r{q}")
            else:
                perm.append(A + k - len(members))
                source.append(members[0] if members else 0)
                occupants.append(None)
    return {
        "ranks": tuple(ranks),
        "local_rows": tuple(rows[q] - ranks[q] * B for q in range(A)),
        "counts": tuple(len(m) for m in by_rank),
        "perm": perm,
        "occupants": occupants,
        "source": source,
        "request_rows": rows,
        "in_order": perm == list(range(R * B)),
        "row_of": {f"r{q}": rows[q] for q in range(A)},
    }


def check(partitions: list[Any]) -> None:
    A = len(partitions)
    batch = DecodeBatch(
        token_ids=torch.zeros(A, dtype=torch.int64),
        hidden_states=None,
        seq_lens=torch.ones(A, dtype=torch.int32),
        request_ids=[f"r{q}" for q in range(A)],
        cache_partitions=partitions,
    )
    want = model(partitions)
    if isinstance(want, str):
        with pytest.raises(BlockprepValueError) as caught:
            assign(LAYOUT, batch, None)
        assert str(caught.value) == want
        return
    got = assign(LAYOUT, batch, None)
    assert got.request_ids == list(batch.request_ids)
    assert got.partitions == partitions
    for name, value in want.items():
        field = getattr(got, name)
        if isinstance(field, np.ndarray):
            assert field.dtype == np.intp and field.tolist() == value, name
        else:
            assert field == value and type(field) is type(value), name
    assert all(type(x) is int for x in [*got.ranks, *got.local_rows, *got.counts, *got.perm])


ranks_of = st.integers(0, R - 1)
unusual = st.one_of(  # faulty partitions, and a NumPy int (a rank)
    st.integers(-3, -1),
    st.integers(R, R + 2),
    st.just(2**70),
    st.just(None),
    st.just(True),
    st.just(1.0),
    st.just("1"),
    st.just(torch.tensor(True)),
    st.just(np.int64(1)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(ranks_of, min_size=1, max_size=R * B))
def test_valid_partitions_match_the_model(partitions: list[int]) -> None:
    check(partitions)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(ranks_of, ranks_of, unusual), min_size=1, max_size=R * B + 3))
def test_any_partitions_match_the_model(partitions: list[Any]) -> None:
    """Out of range, past a rank's capacity (which comes first in batch order decides the
    message), or not an integer."""
    check(partitions)


def test_numpy_and_tensor_partitions_are_ranks() -> None:
    check([np.int64(2), torch.tensor(0), 1, np.int32(2)])
