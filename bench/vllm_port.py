"""vLLM MRv1's worker block table, ported: the baseline of ``bench.vllm_compare``.

This is not blockprep code: it is vLLM's own construction (``vllm/v1/worker/block_table.py`` at
commit ``01edfd091847f63b5db913c293f4834c823dac40``), kept as close to it as plain NumPy and torch
allow, so that the bench times what vLLM's worker does on every step. vLLM's ``CpuGpuBuffer`` is
:class:`PortCpuGpuBuffer`: a host tensor, a separate "device" tensor (on CPU a second CPU tensor,
as vLLM makes one with ``torch.zeros_like(cpu, device=device)``) and a NumPy view of the host
tensor; ``copy_to_gpu(n)`` copies the first ``n`` rows. The slot mapping is vLLM's NumPy form
(before it moved to a Triton kernel) with the kernel's ``-1`` padding after the tokens. Hybrid
kernel blocks and decode context parallelism are left out (``kernel_block_size == block_size``,
one rank), as in the facade.

No validation, as in vLLM: an oversized id list raises half way (the count already raised),
negative ids are written as they are, rows keep stale tails after ``move_row`` and ``add_row``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

PAD_SLOT_ID = -1


class PortCpuGpuBuffer:
    """vLLM's ``CpuGpuBuffer``: ``cpu`` and ``gpu`` tensors and ``np``, a view of ``cpu``."""

    def __init__(self, *size: int, dtype: torch.dtype, device: str = "cpu") -> None:
        self.cpu = torch.zeros(*size, dtype=dtype)
        self.gpu = torch.zeros_like(self.cpu, device=device)
        self.np: npt.NDArray[Any] = self.cpu.numpy()

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        if n is None:
            return self.gpu.copy_(self.cpu, non_blocking=True)
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


class PortBlockTable:
    """vLLM's ``BlockTable`` (one KV cache group), method for method."""

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        device: str = "cpu",
    ) -> None:
        self.block_size = block_size
        self.max_num_reqs = max_num_reqs
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_table = PortCpuGpuBuffer(
            max_num_reqs, max_num_blocks_per_req, dtype=torch.int32, device=device
        )
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.slot_mapping = PortCpuGpuBuffer(
            max_num_batched_tokens, dtype=torch.int64, device=device
        )

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        if not block_ids:
            return
        num_blocks = len(block_ids)
        start = self.num_blocks_per_row[row_idx]
        self.num_blocks_per_row[row_idx] += num_blocks
        self.block_table.np[row_idx, start : start + num_blocks] = block_ids

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        num_blocks = self.num_blocks_per_row[row_idx]
        if num_blocks > 0:
            self.block_table.np[row_idx, :num_blocks] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        num_blocks = self.num_blocks_per_row[src]
        block_table_np = self.block_table.np
        block_table_np[tgt, :num_blocks] = block_table_np[src, :num_blocks]
        self.num_blocks_per_row[tgt] = num_blocks

    def swap_row(self, src: int, tgt: int) -> None:
        src_tgt, tgt_src = [src, tgt], [tgt, src]
        self.num_blocks_per_row[src_tgt] = self.num_blocks_per_row[tgt_src]
        self.block_table.np[src_tgt] = self.block_table.np[tgt_src]

    def compute_slot_mapping(
        self, req_indices: npt.NDArray[Any], positions: npt.NDArray[Any]
    ) -> None:
        block_table_indices = (
            req_indices * self.max_num_blocks_per_req + positions // self.block_size
        )
        block_numbers = self.block_table.np.ravel()[block_table_indices]
        block_offsets = positions % self.block_size
        num_tokens = req_indices.shape[0]
        np.add(
            block_numbers * self.block_size,
            block_offsets,
            out=self.slot_mapping.np[:num_tokens],
        )
        self.slot_mapping.np[num_tokens:] = PAD_SLOT_ID

    def commit_block_table(self, num_reqs: int) -> None:
        self.block_table.copy_to_gpu(num_reqs)

    def clear(self) -> None:
        self.block_table.gpu.fill_(0)
        self.block_table.cpu.fill_(0)

    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        return self.block_table.gpu[:num_reqs]

    def get_cpu_tensor(self) -> torch.Tensor:
        return self.block_table.cpu

    def get_numpy_array(self) -> npt.NDArray[Any]:
        return self.block_table.np
