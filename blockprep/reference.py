"""Reference constructions: upstream's block-table builders, kept plain and obviously correct.

Public so that users can check blockprep (or their own code) against them, and used by the
benchmarks as baselines. They reproduce upstream pypto-serving exactly, including its quirks: ids
are coerced with ``int()``, a ring row longer than ``max_blocks`` is truncated, and a failed call
may have done part of its work. Not fast, on purpose.

- :func:`ring_block_table_repeat`: the ring builder before the upstream fix, one
  ``torch.tensor(ids).repeat(...)`` temporary per row.
- :func:`ring_block_table_gather`: the upstream fix, a cached ``arange(max_blocks) % n`` index
  gathered into each row.
- :func:`block_table_per_row`: the paged builder before the fix, one tensor per row.
- :func:`block_table_one_tensor`: the upstream fix, one tensor per call.

All return a new int32 tensor ``[len(rows), max_blocks]``. Paged tables take ``pad`` (upstream
DeepSeek: 0, the default; Qwen: -1).

Qwen decode preparation (seed-semantics 2), each owning the four compiled buffers:

- :class:`QwenDecodePrepBefore`: before PR #97, fresh tensors and full-row copies every step;
- :class:`QwenDecodePrep97`: the PR #97 form, torch row views and a per-row page-list cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from blockprep.batch import DecodeBatch

_GATHER_INDEX: dict[tuple[int, int], torch.Tensor] = {}


def _check_max_blocks(max_blocks: int) -> None:
    if max_blocks <= 0:
        raise ValueError("max_blocks must be positive")


def _ring_ids(r: int, row: Iterable[object]) -> tuple[int, ...]:
    ids = tuple(int(x) for x in row)  # type: ignore[call-overload]
    if not ids:
        raise ValueError(f"ring block-table row {r} has no allocated blocks")
    if any(x < 0 for x in ids):
        raise ValueError("block IDs must not be negative")
    return ids


def _paged_ids(r: int, row: Sequence[object], max_blocks: int) -> list[int]:
    if len(row) > max_blocks:
        raise ValueError(f"row {r} has {len(row)} blocks, maximum is {max_blocks}")
    ids = [int(x) for x in row]  # type: ignore[call-overload]
    if any(x < 0 for x in ids):
        raise ValueError("block IDs must not be negative")
    return ids


def ring_block_table_repeat(
    per_request_block_ids: Sequence[Iterable[object]], *, max_blocks: int
) -> torch.Tensor:
    """Upstream ring table before the fix: a ``torch.tensor(ids).repeat(...)`` per row."""
    _check_max_blocks(max_blocks)
    table = torch.empty((len(per_request_block_ids), max_blocks), dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _ring_ids(r, row)
        repeats = math.ceil(max_blocks / len(ids))
        table[r].copy_(torch.tensor(ids, dtype=torch.int32).repeat(repeats)[:max_blocks])
    return table


def ring_block_table_gather(
    per_request_block_ids: Sequence[Iterable[object]], *, max_blocks: int
) -> torch.Tensor:
    """Upstream ring table after the fix: a cached ``arange(max_blocks) % n`` gathered per row."""
    _check_max_blocks(max_blocks)
    table = torch.empty((len(per_request_block_ids), max_blocks), dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _ring_ids(r, row)
        key = (max_blocks, len(ids))
        index = _GATHER_INDEX.get(key)
        if index is None:
            index = _GATHER_INDEX.setdefault(key, torch.arange(max_blocks) % len(ids))
        torch.index_select(torch.tensor(ids, dtype=torch.int32), 0, index, out=table[r])
    return table


def block_table_per_row(
    per_request_block_ids: Sequence[Sequence[object]], *, max_blocks: int, pad: int = 0
) -> torch.Tensor:
    """Upstream paged table before the fix: ``pad``-filled, one tensor per non-empty row."""
    _check_max_blocks(max_blocks)
    table = torch.full((len(per_request_block_ids), max_blocks), pad, dtype=torch.int32)
    for r, row in enumerate(per_request_block_ids):
        ids = _paged_ids(r, row, max_blocks)
        if ids:
            table[r, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return table


def block_table_one_tensor(
    per_request_block_ids: Sequence[Sequence[object]], *, max_blocks: int, pad: int = 0
) -> torch.Tensor:
    """Upstream paged table after the fix: rows validated in order, then one tensor for all ids."""
    _check_max_blocks(max_blocks)
    rows = [_paged_ids(r, row, max_blocks) for r, row in enumerate(per_request_block_ids)]
    table = torch.full((len(rows), max_blocks), pad, dtype=torch.int32)
    lengths = torch.tensor([len(ids) for ids in rows], dtype=torch.int64)
    flat = torch.tensor([x for ids in rows for x in ids], dtype=torch.int32)
    table[torch.arange(max_blocks) < lengths[:, None]] = flat
    return table


# --- Qwen3 decode preparation (seed-semantics 2) -------------------------------------------------


class QwenDecodeBuffers:
    """The four persistent buffers of upstream's compiled Qwen decode program (seed-semantics 2.1).

    ``token_ids [B, sampled_ids_pad]``, ``seq_lens [B]``, flat ``block_table [B * max_blocks]``
    and ``slot_mapping [B]``, all int32, ``max_blocks = ceil(max_seq_len / page_size)``.
    """

    def __init__(
        self, max_batch_size: int, max_seq_len: int, page_size: int, sampled_ids_pad: int
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.page_size = page_size
        self.max_blocks = math.ceil(max_seq_len / page_size)
        batch = max_batch_size
        self.token_ids = torch.zeros((batch, sampled_ids_pad), dtype=torch.int32)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32)
        self.block_table = torch.full((batch * self.max_blocks,), -1, dtype=torch.int32)
        self.slot_mapping = torch.full((batch,), -1, dtype=torch.int32)

    def _batch_size(self, batch: DecodeBatch) -> int:
        count = len(batch.request_ids) if batch.request_ids else int(batch.seq_lens.shape[0])
        if count <= 0:
            raise ValueError("batch must contain at least one request")
        if count > self.max_batch_size:
            raise ValueError(
                f"batch has {count} requests, but runtime max_batch_size is {self.max_batch_size}"
            )
        return count

    def _check_seq_len(self, seq_len: int) -> None:
        if seq_len <= 0:
            raise ValueError("decode seq_lens must be positive")
        if seq_len > self.max_seq_len:
            raise ValueError(f"decode seq_len {seq_len} exceeds max_seq_len {self.max_seq_len}")

    def _slot(self, page_ids: Sequence[int], seq_len: int) -> int:
        position = seq_len - 1
        page_index, offset = divmod(position, self.page_size)
        if page_index >= len(page_ids):
            raise ValueError(
                f"page_ids list length {len(page_ids)} is too small for decode position "
                f"{position}; need at least {page_index + 1} pages"
            )
        return int(page_ids[page_index]) * self.page_size + offset


def _page_ids(batch: DecodeBatch, row: int) -> list[int]:
    return batch.block_ids[row] if row < len(batch.block_ids) else []


class QwenDecodePrepBefore(QwenDecodeBuffers):
    """Upstream's Qwen decode preparation before PR #97 (seed-semantics 2.2), without the host
    hidden states: fresh tensors every step, the token buffer zeroed every step, then every row
    of every buffer copied in (padding rows copy row 0)."""

    def prepare(self, batch: DecodeBatch) -> None:
        count = self._batch_size(batch)
        width = self.max_blocks
        seq_lens = batch.seq_lens.reshape(-1)[:count].to(torch.int32)
        block_table = torch.full((count * width,), -1, dtype=torch.int32)
        slot_mapping = torch.empty(count, dtype=torch.int32)
        for i, seq_len in enumerate(seq_lens.tolist()):
            self._check_seq_len(seq_len)
            page_ids = _page_ids(batch, i)
            if len(page_ids) > width:
                raise ValueError(
                    f"page_ids list length {len(page_ids)} exceeds block-table width {width}"
                )
            if page_ids:
                block_table[i * width : i * width + len(page_ids)] = torch.tensor(
                    page_ids, dtype=torch.int32
                )
            slot_mapping[i] = self._slot(page_ids, seq_len)
        tokens = batch.token_ids.to(torch.int32).reshape(count, -1)
        if tokens.shape[1] != 1:
            raise ValueError(
                "decode token_ids must contain exactly one token per row, "
                f"got shape {tuple(batch.token_ids.shape)}"
            )
        self.token_ids.zero_()
        self.token_ids[:count, 0] = tokens[:, 0]
        self.token_ids[count:, 0] = tokens[0, 0]
        for dst, active, rows_each in (
            (self.seq_lens, seq_lens, 1),
            (self.block_table, block_table, width),
            (self.slot_mapping, slot_mapping, 1),
        ):
            _copy_replicated_rows(dst, active, count, self.max_batch_size, rows_each)


def _copy_replicated_rows(
    dst: torch.Tensor, active: torch.Tensor, count: int, batch: int, rows_each: int
) -> None:
    """Upstream's ``_copy_replicated_rows``: the active rows, then row 0 into every padding row."""
    dst[: count * rows_each].copy_(active)
    for row in range(count, batch):
        dst[row * rows_each : (row + 1) * rows_each].copy_(active[:rows_each])


class QwenDecodePrep97(QwenDecodeBuffers):
    """Upstream's Qwen decode preparation in the PR #97 form (seed-semantics 2.3-2.4): writes
    straight into the buffers through torch row views, with a per-row page-list cache checked
    before any view is made, padding zeroed once, and row-0 replication through the cached
    writer. Like upstream, a rejected batch may have written tokens and seq_lens first."""

    def __init__(
        self, max_batch_size: int, max_seq_len: int, page_size: int, sampled_ids_pad: int
    ) -> None:
        super().__init__(max_batch_size, max_seq_len, page_size, sampled_ids_pad)
        self._row_pages: list[list[int] | None] = []
        self._padding_initialized = False

    def prepare(self, batch: DecodeBatch) -> None:
        count = self._batch_size(batch)
        batch_rows = self.max_batch_size
        token_rows = self.token_ids.view(batch_rows, -1)
        active_tokens = batch.token_ids.reshape(count, -1)
        if active_tokens.shape[1] != 1:
            raise ValueError(
                "decode token_ids must contain exactly one token per row, "
                f"got shape {tuple(batch.token_ids.shape)}"
            )
        if not self._padding_initialized:
            token_rows[:, 1:].zero_()
            self._padding_initialized = True
        token_rows[:count, 0].copy_(active_tokens[:, 0])
        seq_flat, active_seq = self.seq_lens.reshape(-1), batch.seq_lens.reshape(-1)
        if active_seq.numel() < count:
            raise ValueError(f"decode seq_lens has {active_seq.numel()} rows, expected {count}")
        seq_flat[:count].copy_(active_seq[:count])
        seq_values = seq_flat[:count].tolist()
        rows = self.block_table.view(batch_rows, self.max_blocks)
        slots = self.slot_mapping.view(-1)
        if len(self._row_pages) != batch_rows:
            self._row_pages = [None] * batch_rows
        first_page_ids: list[int] | None = None
        for i, seq_len in enumerate(seq_values):
            self._check_seq_len(seq_len)
            page_ids = _page_ids(batch, i)
            self._write_cached_row(rows, i, page_ids)
            if i == 0:
                first_page_ids = page_ids
            slots[i] = self._slot(page_ids, seq_len)
        if count < batch_rows:
            assert first_page_ids is not None
            token_rows[count:, 0] = token_rows[0, 0]
            seq_flat[count:] = seq_flat[0]
            slots[count:] = slots[0]
            for row in range(count, batch_rows):
                self._write_cached_row(rows, row, first_page_ids)

    def _write_cached_row(self, rows: torch.Tensor, row: int, page_ids: list[int]) -> None:
        if self._row_pages[row] == page_ids:
            return
        view = rows[row]
        if len(page_ids) > view.numel():
            raise ValueError(
                f"page_ids list length {len(page_ids)} exceeds block-table width {view.numel()}"
            )
        view.fill_(-1)
        if page_ids:
            view[: len(page_ids)].copy_(torch.tensor(page_ids, dtype=view.dtype))
        self._row_pages[row] = list(page_ids)

    def reset(self) -> None:
        """Upstream's warm-up: clears the row cache and re-initialises the token padding."""
        self.token_ids.zero_()
        self._padding_initialized = True
        self._row_pages = []
