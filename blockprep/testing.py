"""Hypothesis strategies for block-id rows and tables, and a DeepSeek V4 scheduler simulation
(:class:`DeepSeekV4SchedulerSim`): property tests and traces for blockprep and its users.

Needs ``hypothesis`` (the ``test`` extra). Example::

    from hypothesis import given
    from blockprep.testing import ring_tables

    @given(ring_tables())
    def test_my_ring_builder(table):
        rows, max_blocks = table
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from blockprep._ids import INT32_MAX

# The scheduler simulation lives in blockprep.simulation (it needs no test dependency: the bench
# command imports it); it stays importable from here.
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS as DEEPSEEK_V4_CACHE_GROUPS
from blockprep.simulation import DeepSeekV4SchedulerSim as DeepSeekV4SchedulerSim

CONTAINERS = (
    "list",
    "tuple",
    "numpy-int64",
    "numpy-int32",
    "numpy-uint32",
    "torch-int64",
    "torch-int32",
)
"""The row containers :func:`as_container` produces: every kind of row the builders accept."""


def block_ids(*, max_id: int = INT32_MAX) -> st.SearchStrategy[int]:
    """Valid block ids in ``[0, max_id]``, weighted towards small ids and the edges."""
    return st.one_of(
        st.integers(0, min(max_id, 1024)),
        st.integers(0, max_id),
        st.sampled_from(sorted({0, 1, max_id})),
    )


def block_id_rows(
    *, min_size: int = 0, max_size: int = 64, max_id: int = INT32_MAX, unique: bool = False
) -> st.SearchStrategy[list[int]]:
    """One row of block ids as a list of ints, ``min_size..max_size`` long."""
    return st.lists(block_ids(max_id=max_id), min_size=min_size, max_size=max_size, unique=unique)


def as_container(ids: Sequence[int], container: str) -> Any:
    """``ids`` as one of :data:`CONTAINERS` (a list, a tuple, a NumPy array or a tensor)."""
    if container == "list":
        return list(ids)
    if container == "tuple":
        return tuple(ids)
    kind, dtype = container.split("-")
    if kind == "numpy":
        return np.array(ids, dtype=dtype)
    return torch.tensor(list(ids), dtype=getattr(torch, dtype))


@st.composite
def in_containers(draw: st.DrawFn, rows: Sequence[Sequence[int]]) -> list[Any]:
    """Each row of ``rows`` in a container drawn from :data:`CONTAINERS`."""
    return [as_container(row, draw(st.sampled_from(CONTAINERS))) for row in rows]


@st.composite
def _tables(
    draw: st.DrawFn, shortest: int, max_rows: int, max_width: int, max_id: int
) -> tuple[list[list[int]], int]:
    max_blocks = draw(st.integers(1, max_width))
    length = st.integers(shortest, max_blocks) | st.sampled_from([shortest, max_blocks])
    lengths = draw(st.lists(length, max_size=max_rows))
    rows = [draw(block_id_rows(min_size=n, max_size=n, max_id=max_id)) for n in lengths]
    return rows, max_blocks


def ring_tables(
    *, max_rows: int = 8, max_width: int = 300, max_id: int = INT32_MAX
) -> st.SearchStrategy[tuple[list[list[int]], int]]:
    """``(rows, max_blocks)`` for a valid ring table: every row holds ``1..max_blocks`` ids."""
    return _tables(1, max_rows, max_width, max_id)


def paged_tables(
    *, max_rows: int = 8, max_width: int = 300, max_id: int = INT32_MAX
) -> st.SearchStrategy[tuple[list[list[int]], int]]:
    """``(rows, max_blocks)`` for a valid paged table: every row holds ``0..max_blocks`` ids."""
    return _tables(0, max_rows, max_width, max_id)
