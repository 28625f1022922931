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
- :func:`deepseek_v4_decode_rebuild`: a whole DeepSeek V4 decode step (56 tables, block counts,
  dynamic inputs) rebuilt with the builders above, before (``fix=False``) or after the fix;
  :func:`deepseek_v4_x_hc`, its host-embedding input.

All return a new int32 tensor ``[len(rows), max_blocks]``. Paged tables take ``pad`` (upstream
DeepSeek: 0, the default; Qwen: -1).

Qwen decode preparation (seed-semantics 2), each owning the four compiled buffers:

- :class:`QwenDecodePrepBefore`: before PR #97, fresh tensors and full-row copies every step;
- :class:`QwenDecodePrep97`: the PR #97 form, torch row views and a per-row page-list cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from blockprep.batch import DecodeBatch

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
        allocations = getattr(batch, "kv_allocations", None)  # upstream's count (2.3, step 1)
        count = len(allocations) if allocations else int(batch.seq_lens.shape[0])
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
    """Upstream's page source by priority (seed-semantics 2.3, step 7): ``kv_allocations[row]``,
    else ``block_ids[row]``, else ``[]``."""
    allocations = getattr(batch, "kv_allocations", None) or []
    if row < len(allocations):
        pages: list[int] = allocations[row].page_ids
        return pages
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


# --- DeepSeek V4 decode: upstream's full rebuild of every buffer (seed-semantics 6.4, 6.5) -------

DEEPSEEK_V4_TABLES: tuple[tuple[str, str, int], ...] = (
    ("ori", "ring", 128),
    ("cmp_c128", "paged", 128),
    ("cmp_c4", "paged", 128),
    ("idx", "paged", 128),
    ("hca_state", "ring", 2048),
    ("csa_state", "ring", 4096),
    ("csa_inner_state", "ring", 4096),
)
"""Upstream's 7 decode tables: (cache group, ring or zero-padded, width), in canonical order."""


def deepseek_v4_decode_rebuild(
    batch: DecodeBatch,
    *,
    ranks: int,
    decode_batch: int,
    decode_seq: int,
    num_blocks: Mapping[str, int],
    mtp: bool = False,
    fix: bool = False,
    out: Mapping[str, torch.Tensor] | None = None,
    token_rows: Sequence[Sequence[int]] | None = None,
    positions: Sequence[Sequence[int]] | None = None,
    active_seq: int | None = None,
) -> dict[str, torch.Tensor]:
    """Upstream's DeepSeek V4 decode step, rebuilt from scratch: all ``7 * ranks`` tables.

    For a valid ``batch`` (no checks beyond the builders'): ranks from ``cache_partitions``, local
    rows by order of arrival; per rank, each group's rows padded with the scratch rows
    ``(num_blocks[group] + k,)``, each table built with upstream's builders (``fix=False``:
    :func:`ring_block_table_repeat` and :func:`block_table_per_row`, before upstream's fix;
    ``fix=True``: :func:`ring_block_table_gather` and :func:`block_table_one_tensor`) and copied
    into its rank's slice; ``block_counts`` from the padded lengths; the dynamic inputs staged
    with upstream's replication (every row request 0, an active rank's rows its first request,
    then each request's own row). ``mtp``: token rows ``[prev, current]`` at positions
    ``(s-2, s-1)`` and two logit rows per request; otherwise ``current`` at ``s-1`` repeated over
    ``decode_seq``, one logit row per request. ``token_rows``/``positions`` (``[A][decode_seq]``)
    and ``active_seq``: explicit rows, as upstream's ``prepare_mtp_target_inputs`` (MTP target
    chunks, ``active_seq = active_width``) and ``prepare_decode`` (placeholder zeros,
    ``active_seq`` 1 or, fused MTP, 2) pass them to ``_prepare_decode_inputs``.

    Returns ``out`` (filled in place, like upstream's ``copy_shared``) or new tensors, keyed by
    group name (int32 ``[ranks, decode_batch, width]``) and ``block_counts`` (int32
    ``[ranks, decode_batch, 7]``), ``input_ids`` (int64 ``[ranks, T]``), ``position_ids`` (int32
    ``[ranks, T]``), ``kv_seq_lens`` (int32 ``[ranks, decode_batch]``), ``num_tokens_per_owner``
    (int32 ``[ranks]``), ``logit_row_indices`` (int32 ``[ranks, T]``), ``T = decode_batch *
    decode_seq``.
    """
    ring = ring_block_table_gather if fix else ring_block_table_repeat
    paged = block_table_one_tensor if fix else block_table_per_row
    tokens_per_rank = decode_batch * decode_seq
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        name: ((ranks, decode_batch, width), torch.int32) for name, _, width in DEEPSEEK_V4_TABLES
    }
    shapes["block_counts"] = ((ranks, decode_batch, len(DEEPSEEK_V4_TABLES)), torch.int32)
    shapes["input_ids"] = ((ranks, tokens_per_rank), torch.int64)
    shapes["position_ids"] = ((ranks, tokens_per_rank), torch.int32)
    shapes["kv_seq_lens"] = ((ranks, decode_batch), torch.int32)
    shapes["num_tokens_per_owner"] = ((ranks,), torch.int32)
    shapes["logit_row_indices"] = ((ranks, tokens_per_rank), torch.int32)
    if out is None:
        staged = {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in shapes.items()}
    else:
        staged = dict(out)

    # Assignment: rank and local row of each request.
    by_rank: list[list[int]] = [[] for _ in range(ranks)]
    for q, partition in enumerate(batch.cache_partitions):
        by_rank[int(partition)].append(q)  # type: ignore[arg-type]

    # Dynamic inputs (seed-semantics 6.5).
    seq_lens = [int(s) for s in batch.seq_lens.tolist()]
    current = batch.token_ids if batch.token_ids.ndim == 1 else batch.token_ids[:, 0]
    if token_rows is not None:
        assert positions is not None and active_seq is not None
        token_rows = [[int(t) for t in row] for row in token_rows]
        positions = [[int(p) for p in row] for row in positions]
    elif mtp:
        assert batch.prev_token_ids is not None
        previous = batch.prev_token_ids.reshape(-1).tolist()
        token_rows = [[int(p), int(c)] for p, c in zip(previous, current.tolist(), strict=True)]
        positions = [[s - 2, s - 1] for s in seq_lens]
    else:
        token_rows = [[int(c)] * decode_seq for c in current.tolist()]
        positions = [[s - 1] * decode_seq for s in seq_lens]
    if active_seq is None:
        active_seq = 2 if mtp else 1
    input_ids = staged["input_ids"].view(ranks, decode_batch, decode_seq)
    position_ids = staged["position_ids"].view(ranks, decode_batch, decode_seq)
    input_ids[...] = torch.tensor(token_rows[0], dtype=torch.int64)
    position_ids[...] = torch.tensor(positions[0], dtype=torch.int32)
    staged["kv_seq_lens"].fill_(seq_lens[0])
    for rank, requests in enumerate(by_rank):
        if requests:
            first = requests[0]
            input_ids[rank] = torch.tensor(token_rows[first], dtype=torch.int64)
            position_ids[rank] = torch.tensor(positions[first], dtype=torch.int32)
            staged["kv_seq_lens"][rank] = seq_lens[first]
    for rank, requests in enumerate(by_rank):
        for local, q in enumerate(requests):
            input_ids[rank, local] = torch.tensor(token_rows[q], dtype=torch.int64)
            position_ids[rank, local] = torch.tensor(positions[q], dtype=torch.int32)
            staged["kv_seq_lens"][rank, local] = seq_lens[q]
    staged["num_tokens_per_owner"].zero_()
    staged["logit_row_indices"].fill_(-1)
    for rank, requests in enumerate(by_rank):
        rows = len(requests) * active_seq
        staged["num_tokens_per_owner"][rank] = rows
        staged["logit_row_indices"][rank, :rows] = torch.arange(rows, dtype=torch.int32)

    # Static metadata: per rank, 7 padded groups, 7 tables and block_counts (seed-semantics 6.4).
    for rank, requests in enumerate(by_rank):
        padded: list[list[tuple[int, ...]]] = []
        for name, kind, width in DEEPSEEK_V4_TABLES:
            active = [tuple(int(x) for x in batch.block_ids_by_group[q][name]) for q in requests]
            scratch = [(num_blocks[name] + k,) for k in range(decode_batch - len(active))]
            rows_g = active + scratch
            padded.append(rows_g)
            if kind == "ring":
                table = ring(rows_g, max_blocks=width)
            else:
                table = paged(rows_g, max_blocks=width)
            staged[name][rank].copy_(table)
        counts = [[len(rows_g[row]) for rows_g in padded] for row in range(decode_batch)]
        staged["block_counts"][rank].copy_(torch.tensor(counts, dtype=torch.int32))
    return staged


def deepseek_v4_x_hc(
    batch: DecodeBatch, *, ranks: int, decode_batch: int, decode_seq: int, mtp: bool = False
) -> torch.Tensor:
    """Upstream's host-embedding input ``x_hc`` (DS-97 ``_pack_decode_x_hc``): float32
    ``[ranks, decode_batch * decode_seq, hidden]``. Every row first holds request 0's last
    embedding; then each request's ``decode_seq`` rows hold its embedding (``mtp``:
    ``[prev_hidden_states, hidden_states]``)."""
    assert batch.hidden_states is not None
    hidden = batch.hidden_states.float()
    x = torch.empty((ranks, decode_batch, decode_seq, hidden.shape[1]), dtype=torch.float32)
    x[...] = hidden[0]
    by_rank = [0] * ranks
    for q, partition in enumerate(batch.cache_partitions):
        rank = int(partition)  # type: ignore[arg-type]
        local = by_rank[rank]
        by_rank[rank] += 1
        if mtp:
            assert batch.prev_hidden_states is not None
            x[rank, local, 0] = batch.prev_hidden_states[q].float()
            x[rank, local, 1] = hidden[q]
        else:
            x[rank, local] = hidden[q]
    return x.view(ranks, decode_batch * decode_seq, -1)
