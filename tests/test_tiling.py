"""Ring tiling writes ``ids[j % n]`` on every path it picks; builders are safe across threads."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from blockprep import paged_block_table, ring_block_table
from blockprep import reference as ref
from blockprep._tiling import tile_row, tile_rows


# Rows x widths x ring lengths below reach both constructions of tile_rows: the broadcast (for
# example 2x130, n=65) and the doubling copy (64x4096, n=2: past DOUBLING_MIN_PERIODS).
@pytest.mark.parametrize("rows", [1, 2, 8, 64])
@pytest.mark.parametrize("width", [1, 7, 64, 130, 2048, 4096])
def test_tile_rows_and_row_cover_both_constructions(rows: int, width: int) -> None:
    rng = np.random.default_rng(rows * width)
    for n in sorted({1, 2, 3, 8, 9, 31, 65, width} & set(range(1, width + 1))):
        ids = rng.integers(0, 2**31 - 1, size=(rows, n)).astype(np.int32)
        expected = ids[:, np.arange(width) % n]
        block = np.full((rows, width), -5, dtype=np.int32)
        tile_rows(block, ids)
        assert (block == expected).all(), (rows, width, n)
        row = np.full(width, -5, dtype=np.int32)
        tile_row(row, ids[-1])
        assert (row == expected[-1]).all(), (width, n)


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

    def build(job: tuple[list[list[int]], int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, max_blocks = job
        return ring_block_table(rows, max_blocks), paged_block_table(rows, max_blocks)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(build, jobs * 3))
    for (ring, paged), (ring_ref, paged_ref) in zip(results, expected * 3, strict=True):
        assert torch.equal(ring, ring_ref)
        assert torch.equal(paged, paged_ref)
