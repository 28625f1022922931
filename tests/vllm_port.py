"""vLLM MRv1's ``BlockTable`` (vllm/v1/worker/block_table.py at 01edfd09) re-stated in plain
NumPy, independently of blockprep: the oracle the vLLM-style facade's tests compare with."""

from __future__ import annotations

from typing import Any

import numpy as np


class PortTable:
    """vLLM's BlockTable, one group, NumPy only (no validation, as in vLLM)."""

    def __init__(self, block_size: int, rows: int, width: int, tokens: int) -> None:
        self.block_size, self.width = block_size, width
        self.np = np.zeros((rows, width), dtype=np.int32)
        self.device = np.zeros((rows, width), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(rows, dtype=np.int32)
        self.slot_mapping = np.zeros(tokens, dtype=np.int64)

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        if not block_ids:
            return
        num_blocks = len(block_ids)
        start = self.num_blocks_per_row[row_idx]
        self.num_blocks_per_row[row_idx] += num_blocks
        self.np[row_idx, start : start + num_blocks] = block_ids

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        num_blocks = self.num_blocks_per_row[row_idx]
        if num_blocks > 0:
            self.np[row_idx, :num_blocks] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        num_blocks = self.num_blocks_per_row[src]
        self.np[tgt, :num_blocks] = self.np[src, :num_blocks]
        self.num_blocks_per_row[tgt] = num_blocks

    def swap_row(self, src: int, tgt: int) -> None:
        self.num_blocks_per_row[[src, tgt]] = self.num_blocks_per_row[[tgt, src]]
        self.np[[src, tgt]] = self.np[[tgt, src]]

    def commit_block_table(self, num_reqs: int) -> None:
        self.device[:num_reqs] = self.np[:num_reqs]

    def compute_slot_mapping(self, req_indices: np.ndarray, positions: np.ndarray) -> None:
        index = req_indices * self.width + positions // self.block_size
        numbers = self.np.ravel()[index]
        n = len(req_indices)
        np.add(numbers * self.block_size, positions % self.block_size, out=self.slot_mapping[:n])
        self.slot_mapping[n:] = -1

    def step(self, finished: Any, appended: Any, added: Any, moves: Any) -> None:
        """A scheduler step the way a vLLM worker applies it, call by call."""
        for row in finished:
            self.clear_row(row)
        for row, ids in appended:
            if ids is not None:
                self.append_row(ids, row)
        for row, ids in added:
            self.add_row(ids, row)
        for src, tgt in moves:
            self.move_row(src, tgt)
