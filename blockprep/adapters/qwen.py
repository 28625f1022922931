"""Qwen3 decode preparation: upstream pypto-serving's PR #97 decode-input ABI over blockprep's core.

The compiled Qwen3-14B decode program reads four persistent int32 buffers (seed-semantics 2.1):

- ``token_ids`` ``[B, sampled_ids_pad]``: column 0 the row's token, the other columns 0;
- ``seq_lens`` ``[B]``: tokens per sequence, the current one included;
- ``block_table`` flat ``[B * ceil(max_seq_len / page_size)]``: each row's page ids, then -1;
- ``slot_mapping`` ``[B]``: the cache slot the current token writes.

``B`` is the compiled batch: rows ``A..B-1`` past the ``A`` active requests replicate row 0 (its
token, seq_len, slot and pages), so the fixed-batch program rewrites row 0's slot idempotently and
never writes another request's page. Validation and its messages are upstream's (seed-semantics
2.3), but every check runs before anything is written: a rejected batch leaves the buffers
holding the previous step's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from blockprep.batch import DecodeBatch, DecodeExecutor, DecodeResult
from blockprep.block_table import BlockTable
from blockprep.buffers import DeviceMirror, host_tensor
from blockprep.ids import as_int
from blockprep.slots import decode_slot
from blockprep.tokens import PaddedTokenBuffer

SAMPLED_IDS_PAD = 8
"""Token columns of upstream's compiled Qwen decode program."""


@dataclass(frozen=True)
class QwenDecodeInputs:
    """One step's inputs: each tensor *is* a persistent buffer (same object, same address)."""

    actual_batch: int
    token_ids: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor


class QwenDecodePreparer:
    """Owns the Qwen decode buffers and writes one step's inputs into them.

    Args:
        max_batch_size: the compiled batch ``B``.
        max_seq_len: longest sequence; the block table is ``ceil(max_seq_len / page_size)`` wide.
        page_size: tokens per KV page.
        sampled_ids_pad: token buffer columns.
        device: ``"cpu"`` (the host buffers are the buffers), ``"cuda"`` or ``"npu"`` (device
            mirrors, refreshed each step; only block-table rows that changed are copied).
        share_memory: allocate the host buffers in shared memory, for workers forked afterwards.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_seq_len: int,
        page_size: int = 128,
        sampled_ids_pad: int = SAMPLED_IDS_PAD,
        *,
        device: str | torch.device = "cpu",
        share_memory: bool = False,
    ) -> None:
        self.max_batch_size = as_int(max_batch_size, "max_batch_size")
        self.max_seq_len = as_int(max_seq_len, "max_seq_len")
        self.page_size = as_int(page_size, "page_size")
        for name in ("max_batch_size", "max_seq_len", "page_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        batch = self.max_batch_size
        self.max_blocks = math.ceil(self.max_seq_len / self.page_size)
        # Device mirrors copy with non_blocking=True, which needs page-locked host memory.
        pin = torch.device(device).type != "cpu" and not share_memory
        self._tokens = PaddedTokenBuffer(
            batch, sampled_ids_pad, pin_memory=pin, share_memory=share_memory
        )

        def buffer(size: int, fill: int) -> torch.Tensor:
            return host_tensor(
                (size,), torch.int32, fill=fill, pin_memory=pin, share_memory=share_memory
            )

        self._seq_lens = buffer(batch, 0)
        self._slots = buffer(batch, -1)
        flat_table = buffer(batch * self.max_blocks, -1)
        self._table = BlockTable(batch, self.max_blocks, kind="paged", pad=-1, buffer=flat_table)
        self._mirrors = {
            name: DeviceMirror(host, device)
            for name, host in (
                ("token_ids", self._tokens.tensor),
                ("seq_lens", self._seq_lens),
                ("slot_mapping", self._slots),
            )
        }
        # The block table mirrors row by row, through a [B, max_blocks] view of the flat buffer.
        self._table_mirror = DeviceMirror(flat_table.view(batch, self.max_blocks), device)
        self._table_buffer = (
            flat_table if self._table_mirror.is_host else self._table_mirror.tensor.view(-1)
        )
        self._inputs_by_count: dict[int, QwenDecodeInputs] = {}

    @property
    def block_table(self) -> BlockTable:
        """The host block table (row cache, dirty rows, stats)."""
        return self._table

    def prepare(self, batch: DecodeBatch) -> QwenDecodeInputs:
        """Write ``batch`` into the persistent buffers and return them.

        Raises (upstream's messages, in upstream's order; nothing is written):
            ValueError: ``"batch must contain at least one request"``; ``"batch has {n}
                requests, but runtime max_batch_size is {B}"``; ``"decode token_ids must contain
                exactly one token per row, got shape {shape}"``; ``"decode seq_lens has {n} rows,
                expected {A}"``; per row ``"decode seq_lens must be positive"``, ``"decode seq_len
                {s} exceeds max_seq_len {m}"``, ``"page_ids list length {n} exceeds block-table
                width {w}"``, ``"page_ids list length {n} is too small for decode position {t};
                need at least {k} pages"``; then bad page or token ids (row named).
        """
        count = len(batch.request_ids) if batch.request_ids else int(batch.seq_lens.shape[0])
        if count <= 0:
            raise ValueError("batch must contain at least one request")
        if count > self.max_batch_size:
            raise ValueError(
                f"batch has {count} requests, but runtime max_batch_size is {self.max_batch_size}"
            )
        tokens = batch.token_ids
        if tokens.numel() % count or tokens.numel() // count != 1:
            raise ValueError(
                "decode token_ids must contain exactly one token per row, "
                f"got shape {tuple(tokens.shape)}"
            )
        seq_lens_flat = batch.seq_lens.reshape(-1)
        if seq_lens_flat.numel() < count:
            raise ValueError(f"decode seq_lens has {seq_lens_flat.numel()} rows, expected {count}")
        seq_lens: list[int] = seq_lens_flat[:count].tolist()
        block_ids, width, page_size = batch.block_ids, self.max_blocks, self.page_size
        pages: list[Sequence[int]] = []
        slots: list[int] = []
        for row, seq_len in enumerate(seq_lens):  # upstream's checks, in its order, row by row
            if seq_len <= 0:
                raise ValueError("decode seq_lens must be positive")
            if seq_len > self.max_seq_len:
                raise ValueError(f"decode seq_len {seq_len} exceeds max_seq_len {self.max_seq_len}")
            row_pages = block_ids[row] if row < len(block_ids) else []
            if len(row_pages) > width:
                raise ValueError(
                    f"page_ids list length {len(row_pages)} exceeds block-table width {width}"
                )
            slots.append(decode_slot(row, row_pages, seq_len, page_size))
            pages.append(row_pages)
        token_values: list[int] = tokens.reshape(-1).tolist()
        self._tokens.check_tokens(token_values)
        # The last check: the block table checks every changed row before writing any.
        self._table.write_rows(pages)
        self._write_rows(count, token_values, seq_lens, slots)
        return self._inputs(count)

    def reset(self) -> None:
        """What upstream's warm-up does: forget every cached block-table row (the next step
        rewrites them all) and re-initialise the token padding. Call after anything else wrote
        the buffers."""
        self._table.invalidate()
        self._tokens.reset()
        self._sync_all()

    def _write_rows(
        self, count: int, tokens: list[int], seq_lens: list[int], slots: list[int]
    ) -> None:
        """Write the checked step and replicate row 0 into rows ``count..B-1``."""
        self._tokens.write(tokens)
        seq_view, slot_view = self._seq_lens.numpy(), self._slots.numpy()
        seq_view[:count] = seq_lens
        slot_view[:count] = slots
        if count < self.max_batch_size:
            padding = range(count, self.max_batch_size)
            self._tokens.replicate(0, count)
            seq_view[count:] = seq_lens[0]
            slot_view[count:] = slots[0]
            self._table.fill_rows(0, padding)
        dirty = self._table.take_dirty()
        if not self._table_mirror.is_host:
            for mirror in self._mirrors.values():
                mirror.sync()
            self._table_mirror.sync(dirty)

    def _sync_all(self) -> None:
        for mirror in (*self._mirrors.values(), self._table_mirror):
            mirror.sync()

    def _inputs(self, count: int) -> QwenDecodeInputs:
        inputs = self._inputs_by_count.get(count)
        if inputs is None:  # the same buffers every step: one frozen record per batch size
            mirrors = self._mirrors
            inputs = self._inputs_by_count[count] = QwenDecodeInputs(
                actual_batch=count,
                token_ids=mirrors["token_ids"].tensor,
                seq_lens=mirrors["seq_lens"].tensor,
                block_table=self._table_buffer,
                slot_mapping=mirrors["slot_mapping"].tensor,
            )
        return inputs


class QwenDecodeAdapter:
    """Prepares a :class:`~blockprep.batch.DecodeBatch` and hands the buffers to an executor.

    Device-embedding executors receive no hidden states: nothing looks embeddings up on the host,
    and ``batch.hidden_states`` is never read.
    """

    def __init__(
        self, preparer: QwenDecodePreparer, executor: DecodeExecutor[QwenDecodeInputs]
    ) -> None:
        self.preparer = preparer
        self.executor = executor

    def run_decode(self, batch: DecodeBatch) -> DecodeResult:
        return self.executor.run_decode(self.preparer.prepare(batch))
