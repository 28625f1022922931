"""The cached tiling index is shared, read-only and bounded; builders are safe across threads."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from blockprep import paged_block_table, ring_block_table, tiling_index
from blockprep import reference as ref
from blockprep.tiling import GATHER_MAX_WIDTH, TILING_CACHE_SIZE, tile_row, tile_rows


@pytest.mark.parametrize(("max_blocks", "n"), [(1, 1), (8, 3), (128, 4), (4096, 65), (5, 9)])
def test_tiling_index_values(max_blocks: int, n: int) -> None:
    index = tiling_index(max_blocks, n)
    assert index.tolist() == [j % n for j in range(max_blocks)]


def test_tiling_index_entries_are_cached_and_read_only() -> None:
    index = tiling_index(4096, 65)
    assert tiling_index(4096, 65) is index
    assert tiling_index(4096, 64) is not index
    with pytest.raises(ValueError, match="read-only"):
        index[0] = 3
    with pytest.raises(ValueError, match="read-only"):
        np.copyto(index, 0)
    with pytest.raises(ValueError):
        index.flags.writeable = True
    assert index.tolist() == [j % 65 for j in range(4096)]


def test_tiling_cache_is_bounded() -> None:
    for n in range(1, TILING_CACHE_SIZE + 50):
        tiling_index(TILING_CACHE_SIZE + 50, n)
    assert tiling_index.cache_info().currsize <= TILING_CACHE_SIZE


@pytest.mark.parametrize("width", [1, 7, 64, GATHER_MAX_WIDTH, GATHER_MAX_WIDTH + 1, 4096])
def test_tile_row_and_rows_cover_every_ring_length(width: int) -> None:
    rng = np.random.default_rng(width)
    for n in sorted({1, 2, 3, 8, 9, 65, width} & set(range(1, width + 1))):
        ids = rng.integers(0, 2**31 - 1, size=(3, n))
        expected = ids[:, np.arange(width) % n]
        rows = np.full((3, width), -5, dtype=np.int32)
        tile_rows(rows, ids)
        assert (rows == expected).all()
        row = np.full(width, -5, dtype=np.int32)
        tile_row(row, ids[1])
        assert (row == expected[1]).all()


def test_many_threads_building_at_once_all_get_correct_tables() -> None:
    rng = random.Random(7)
    jobs = []
    for _ in range(300):
        max_blocks = rng.choice([3, 128, 513, 2048, 4096])
        rows = [
            rng.sample(range(100_000), rng.randint(1, min(max_blocks, 70)))
            for _ in range(rng.randint(0, 16))
        ]
        jobs.append((rows, max_blocks))
    expected = [
        (
            ref.ring_block_table_repeat(rows, max_blocks=w),
            ref.block_table_per_row(rows, max_blocks=w),
        )
        for rows, w in jobs
    ]
    tiling_index.cache_clear()

    def build(job: tuple[list[list[int]], int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, max_blocks = job
        return ring_block_table(rows, max_blocks), paged_block_table(rows, max_blocks)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(build, jobs * 3))
    for (ring, paged), (ring_ref, paged_ref) in zip(results, expected * 3, strict=True):
        assert torch.equal(ring, ring_ref)
        assert torch.equal(paged, paged_ref)
