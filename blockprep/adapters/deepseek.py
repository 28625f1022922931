"""DeepSeek V4 decode inputs: 7 KV groups x DP ranks, scratch padding, ping-pong buffer slots, MTP.

Reproduces upstream pypto-serving's DeepSeek V4 decode ABI (seed-semantics 4-8): per buffer slot,
one ``[ranks, decode_batch, width]`` int32 table per cache group, ``block_counts``, and the dynamic
inputs (tokens, positions, KV lengths, per-rank row counts, logit row indices), with upstream's
padding rules and error messages. Unlike upstream, which rebuilt all 56 tables every step, a step
costs what changed: every (buffer slot, group) is a :class:`~blockprep.BlockTable` over that
slot's ``[ranks * decode_batch, width]`` buffer view. The ids that changed since the previous
step (of any slot) are checked once, only where they changed; each slot then writes the rows that
changed since its own last step (a rotated ring slot is a strided write, a grown full-history row
one cell, a request that moved to another local row a row copy, a padding row only when its
scratch id changes) and leaves every other slot alone. Every buffer still equals upstream's full
rebuild (:func:`blockprep.reference.deepseek_v4_decode_rebuild`) after every step.

Deliberate differences from upstream (beyond validating before writing anything):

- block ids must be integers (``TypeError`` naming the batch row and group) where upstream coerced
  with ``int()``; a state ring longer than its table width raises
  ``"ring block-table row {r} has {n} blocks, maximum is {width}"`` where upstream truncated;
- upstream's padding and builder messages are kept word for word, so they name no rank; the
  first failing (rank, group, local row) in upstream's order is the one reported.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep.batch import DecodeBatch
from blockprep.block_table import BlockTable, BlockTableStats
from blockprep.buffers import host_tensor
from blockprep.ids import INT32_MAX, as_int, has_integer_dtype, is_integer_id

GROUP_NAMES = (
    "ori",
    "cmp_c128",
    "cmp_c4",
    "idx",
    "hca_state",
    "csa_state",
    "csa_inner_state",
)
"""The 7 cache groups in upstream's canonical order (``block_counts`` column order)."""

INPUT_FIELDS = (
    "block_counts",
    "input_ids",
    "position_ids",
    "kv_seq_lens",
    "num_tokens_per_owner",
    "logit_row_indices",
)
"""A slot's buffers besides the 7 tables, by their names in :class:`DeepSeekV4DecodeInputs` and
:func:`blockprep.reference.deepseek_v4_decode_rebuild`."""

SOURCE_BLOCK_TOKENS = 128
"""Tokens per block of the ``ori``, ``cmp_*`` and ``idx`` groups (upstream ``BLOCK_SIZE``)."""
COMPILED_SOURCE_BLOCKS = 128
"""Width of the ``ori``, ``cmp_*`` and ``idx`` tables: source-token blocks a request may hold."""
SLIDING_WINDOW = 128
HCA_STATE_BLOCK_TOKENS = 8
CSA_STATE_BLOCK_TOKENS = 4
CSA_COMPRESS_RATIO = 4

HOST_HIDDEN_MESSAGE = "DeepSeek V4 decode requires host hidden states"
MTP_PREVIOUS_MESSAGE = "DeepSeekV4 MTP decode requires previous token IDs and embeddings"

Embedding = Literal["device", "host"]


@dataclass(frozen=True)
class DeepSeekV4CacheGroup:
    """One KV cache group of a layout.

    ``kind``: ``"ring"`` (``ids[j % n]`` in every column) or ``"paged"`` (full history: ids, then
    0). ``width``: decode table columns. ``block_tokens``: tokens per scheduler block.
    ``ids_per_request``: the most ids a request holds (a ring's length). ``num_blocks``: the
    scheduler-visible physical blocks per rank; padding rows use the scratch pages
    ``num_blocks + k``.
    """

    name: str
    kind: Literal["ring", "paged"]
    width: int
    block_tokens: int
    ids_per_request: int
    num_blocks: int


class DeepSeekV4Layout:
    """The decode shapes of a DeepSeek V4 deployment (upstream ``DeepSeekV4CacheLayout``).

    Args:
        ranks: DP ranks (one cache partition each).
        decode_batch: kernel rows per rank (``b``).
        decode_seq: token slots per row (``S``; 2 for MTP verification).
        max_seq_len: longest sequence, at most 16384 (128 source blocks of 128 tokens).
        num_blocks: group name -> scheduler-visible physical blocks per rank, every group named.
            Default: enough for ``decode_batch`` requests of ``ids_per_request`` ids each.
        max_in_flight_prefill_tokens: prefill tokens a ring must cover besides its window (256);
            it sets the ring lengths: ori 4, hca_state 48, csa_state and csa_inner_state 65.

    ``decode_tokens = decode_batch * decode_seq`` (``T``). Tables are 128 wide, except hca_state
    2048 and the two csa tables 4096.

    Raises:
        ValueError: upstream's messages (seed-semantics 4.1): ``"decode_batch must be
            positive"``, ``"max_seq_len must be positive"``, ``"DeepSeekV4 max_seq_len={m} needs
            {n} source-token blocks, but the compiled block tables support 128"``, ``"DeepSeekV4
            {name} cache needs {required} blocks per request to cover ..."``, ``"DeepSeekV4 {name}
            cache needs more than {decode_batch} physical blocks"``, ``"unknown DeepSeekV4 cache
            group: {name}"``; and for ``ranks``, ``decode_seq``, a missing group or a pool whose
            scratch pages would pass ``2**31 - 1``.
        TypeError: a non-integer argument.
    """

    __slots__ = ("_groups", "decode_batch", "decode_seq", "max_seq_len", "ranks")

    def __init__(
        self,
        ranks: int = 8,
        decode_batch: int = 8,
        decode_seq: int = 1,
        max_seq_len: int = 16384,
        num_blocks: Mapping[str, int] | None = None,
        *,
        max_in_flight_prefill_tokens: int = 256,
    ) -> None:
        ranks = as_int(ranks, "ranks")
        decode_batch = as_int(decode_batch, "decode_batch")
        decode_seq = as_int(decode_seq, "decode_seq")
        max_seq_len = as_int(max_seq_len, "max_seq_len")
        prefill = as_int(max_in_flight_prefill_tokens, "max_in_flight_prefill_tokens")
        if ranks <= 0:
            raise ValueError(f"ranks must be positive, got {ranks}")
        if decode_batch <= 0:
            raise ValueError("decode_batch must be positive")
        if decode_seq <= 0:
            raise ValueError(f"decode_seq must be positive, got {decode_seq}")
        if max_seq_len <= 0:
            raise ValueError("max_seq_len must be positive")
        if prefill < 0:
            raise ValueError(f"max_in_flight_prefill_tokens must be non-negative, got {prefill}")
        source_blocks = math.ceil(max_seq_len / SOURCE_BLOCK_TOKENS)
        if source_blocks > COMPILED_SOURCE_BLOCKS:
            raise ValueError(
                f"DeepSeekV4 max_seq_len={max_seq_len} needs {source_blocks} source-token blocks, "
                f"but the compiled block tables support {COMPILED_SOURCE_BLOCKS}"
            )
        csa_ring = math.ceil((CSA_COMPRESS_RATIO + prefill) / CSA_STATE_BLOCK_TOKENS)
        rings = {
            "ori": (math.ceil((SLIDING_WINDOW - 1 + prefill) / SOURCE_BLOCK_TOKENS) + 1, 128),
            "hca_state": (math.ceil((SLIDING_WINDOW + prefill) / HCA_STATE_BLOCK_TOKENS), 64),
            "csa_state": (csa_ring, 65),
            "csa_inner_state": (csa_ring, 65),
        }
        for name, (required, limit) in rings.items():
            if required > limit:
                raise ValueError(
                    f"DeepSeekV4 {name} cache needs {required} blocks per request to cover the "
                    "rolling history and in-flight prefill tokens, but the compiled block table "
                    f"supports {limit}"
                )
        shapes: dict[str, tuple[Literal["ring", "paged"], int, int, int]] = {
            "ori": ("ring", 128, SOURCE_BLOCK_TOKENS, rings["ori"][0]),
            "cmp_c128": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "cmp_c4": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "idx": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "hca_state": ("ring", 2048, HCA_STATE_BLOCK_TOKENS, rings["hca_state"][0]),
            "csa_state": ("ring", 4096, CSA_STATE_BLOCK_TOKENS, csa_ring),
            "csa_inner_state": ("ring", 4096, CSA_STATE_BLOCK_TOKENS, csa_ring),
        }
        pools = _pool_sizes(num_blocks, decode_batch, {g: s[3] for g, s in shapes.items()})
        self.ranks = ranks
        self.decode_batch = decode_batch
        self.decode_seq = decode_seq
        self.max_seq_len = max_seq_len
        self._groups = tuple(
            DeepSeekV4CacheGroup(name, *shapes[name], pools[name]) for name in GROUP_NAMES
        )

    @property
    def decode_tokens(self) -> int:
        """Token rows per rank: ``decode_batch * decode_seq``."""
        return self.decode_batch * self.decode_seq

    @property
    def groups(self) -> tuple[DeepSeekV4CacheGroup, ...]:
        """The 7 groups in :data:`GROUP_NAMES` order."""
        return self._groups

    @property
    def num_blocks(self) -> Mapping[str, int]:
        """Group name -> scheduler-visible physical blocks per rank (read-only)."""
        return MappingProxyType({g.name: g.num_blocks for g in self._groups})

    def group(self, name: str) -> DeepSeekV4CacheGroup:
        """The group called ``name``; ``ValueError("unknown DeepSeekV4 cache group: {name}")``."""
        for group in self._groups:
            if group.name == name:
                return group
        raise ValueError(f"unknown DeepSeekV4 cache group: {name}")

    def __repr__(self) -> str:
        return (
            f"DeepSeekV4Layout(ranks={self.ranks}, decode_batch={self.decode_batch}, "
            f"decode_seq={self.decode_seq}, max_seq_len={self.max_seq_len}, "
            f"num_blocks={dict(self.num_blocks)})"
        )


def _pool_sizes(
    num_blocks: Mapping[str, int] | None, decode_batch: int, per_request: Mapping[str, int]
) -> dict[str, int]:
    if num_blocks is None:
        return {name: decode_batch * count for name, count in per_request.items()}
    if not isinstance(num_blocks, Mapping):
        raise TypeError(
            f"num_blocks must map group names to block counts, got {type(num_blocks).__name__}"
        )
    for name in num_blocks:
        if name not in per_request:
            raise ValueError(f"unknown DeepSeekV4 cache group: {name}")
    missing = [name for name in GROUP_NAMES if name not in num_blocks]
    if missing:
        raise ValueError(f"num_blocks is missing cache groups: {', '.join(missing)}")
    pools = {}
    for name in GROUP_NAMES:
        count = as_int(num_blocks[name], f"num_blocks[{name!r}]")
        if count <= decode_batch:
            raise ValueError(
                f"DeepSeekV4 {name} cache needs more than {decode_batch} physical blocks"
            )
        if count + decode_batch - 1 > INT32_MAX:
            raise ValueError(
                f"num_blocks[{name!r}]={count}: scratch pages up to {count + decode_batch - 1} "
                f"would pass the int32 maximum {INT32_MAX}"
            )
        pools[name] = count
    return pools


@dataclass(frozen=True)
class DeepSeekV4DecodeInputs:
    """One prepared step: views of one buffer slot's persistent buffers (valid until that slot
    is prepared again). ``R`` ranks, ``b`` decode_batch, ``T`` decode_tokens.

    - ``tables``: group name -> int32 ``[R, b, width]`` (:data:`GROUP_NAMES` order);
    - ``block_counts``: int32 ``[R, b, 7]``, ids per row and group (1 for padding rows);
    - ``input_ids``: int64 ``[R, T]``; ``position_ids``: int32 ``[R, T]``;
      ``kv_seq_lens``: int32 ``[R, b]``;
    - ``num_tokens_per_owner``: int32 ``[R]``, real token rows per rank;
    - ``logit_row_indices``: int32 ``[R, T]``, ``0..rows-1`` then -1;
    - ``x_hc``: float32 ``[R, T, hidden]`` host embeddings (``embedding="host"``), else ``None``;
    - ``ranks``, ``local_rows``: per request (batch order), its rank and kernel row there;
    - ``buffer_slot``: the slot these views belong to.
    """

    tables: Mapping[str, torch.Tensor]
    block_counts: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    kv_seq_lens: torch.Tensor
    num_tokens_per_owner: torch.Tensor
    logit_row_indices: torch.Tensor
    x_hc: torch.Tensor | None
    ranks: tuple[int, ...]
    local_rows: tuple[int, ...]
    buffer_slot: int

    def buffers(self) -> dict[str, torch.Tensor]:
        """The 7 tables and the :data:`INPUT_FIELDS` buffers, by name (not ``x_hc``)."""
        return {**self.tables, **{name: getattr(self, name) for name in INPUT_FIELDS}}


def accept_mtp_tokens(
    main_token_ids: torch.Tensor | Sequence[Sequence[int]],
    draft_token_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]],
) -> list[list[int]]:
    """The tokens each request commits after verifying its drafts (upstream's general form).

    ``main_token_ids [B, K+1]``: the target model's tokens; ``draft_token_ids [B, K]`` (or ``[B]``
    for K=1): the drafts. Per request: the longest prefix where ``draft[j] == main[j]``, plus the
    target token after it (so ``1..K+1`` tokens).

    Raises:
        ValueError: ``"main_token_ids must have shape [batch, {K+1}], got {shape}"``, then
            ``"draft_token_ids must have {B} entries, got {n}"``.
        TypeError: non-integer tokens.
    """
    main = _integer_tensor(main_token_ids, "main_token_ids")
    draft = _integer_tensor(draft_token_ids, "draft_token_ids")
    width = 2 if draft.ndim <= 1 else draft.shape[1] + 1
    if main.ndim != 2 or main.shape[1] != width:
        raise ValueError(
            f"main_token_ids must have shape [batch, {width}], got {tuple(main.shape)}"
        )
    batch = main.shape[0]
    count = draft.shape[0] if draft.ndim else 0
    if draft.ndim not in (1, 2) or count != batch:
        raise ValueError(f"draft_token_ids must have {batch} entries, got {count}")
    drafts = draft.reshape(batch, width - 1).tolist()
    accepted = []
    for target, proposed in zip(main.tolist(), drafts, strict=True):
        keep = 0
        while keep < len(proposed) and proposed[keep] == target[keep]:
            keep += 1
        accepted.append(target[: keep + 1])
    return accepted


def _integer_tensor(values: object, name: str) -> torch.Tensor:
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if not has_integer_dtype(tensor):
        raise TypeError(f"{name} must hold integer token ids, got dtype {tensor.dtype}")
    return tensor


@dataclass(frozen=True)
class _Assignment:
    """Where one batch's requests sit: per request its rank and local row, per table row
    (``rank * b + local``) its request, and the request whose dynamic inputs it copies."""

    request_ids: list[str]
    partitions: list[Any]
    ranks: tuple[int, ...]
    local_rows: tuple[int, ...]
    counts: tuple[int, ...]
    perm: list[int]  # per table row: request index, or A + k for scratch page k
    occupants: list[str | None]  # per table row: request id, None for a padding row
    source: npt.NDArray[np.intp]  # per table row: the request its dynamic inputs replicate
    request_rows: npt.NDArray[np.intp]  # per request: its table row


class _Slot:
    """One buffer slot: its buffers, one BlockTable per group, and what its rows hold."""

    def __init__(self, layout: DeepSeekV4Layout, hidden_size: int | None, share: bool) -> None:
        R, b, T, S = layout.ranks, layout.decode_batch, layout.decode_tokens, layout.decode_seq
        rows = R * b

        def buffer(shape: tuple[int, ...], dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
            return host_tensor(shape, dtype, fill=fill, share_memory=share)

        self.tables = {g.name: buffer((R, b, g.width), torch.int32) for g in layout.groups}
        self.block_tables = [
            BlockTable(
                rows,
                g.width,
                kind=g.kind,
                pad=0,
                buffer=self.tables[g.name].view(rows, g.width),
            )
            for g in layout.groups
        ]
        self.block_counts = buffer((R, b, len(GROUP_NAMES)), torch.int32)
        self.input_ids = buffer((R, T), torch.int64)
        self.position_ids = buffer((R, T), torch.int32)
        self.kv_seq_lens = buffer((R, b), torch.int32)
        self.num_tokens_per_owner = buffer((R,), torch.int32)
        self.logit_row_indices = buffer((R, T), torch.int32, fill=-1)
        self.x_hc = None if hidden_size is None else buffer((R, T, hidden_size), torch.float32)
        self.counts_np = self.block_counts.numpy().reshape(rows, len(GROUP_NAMES))
        self.input_np = self.input_ids.numpy().reshape(rows, S)
        self.positions_np = self.position_ids.numpy().reshape(rows, S)
        self.kv_np = self.kv_seq_lens.numpy().reshape(rows)
        # Per group and table row: the ids the row holds (None: unknown); never mutated in place.
        self.held: list[list[Any]] = [[None] * rows for _ in layout.groups]
        # Per table row: the request it held when last prepared (None: padding or unknown).
        self.occupants: list[str | None] = [None] * rows
        # Per group: rows changed by steps prepared into other slots since this one's last
        # step; None: unknown (never prepared, or far behind), compare every row.
        self.pending: list[set[int]] | None = None
        self.owner_key: tuple[tuple[int, ...], int] | None = None


class _Invalid(Exception):
    """A fast-path check failed; the full check in upstream order picks the error to raise."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class DeepSeekV4DecodePreparer:
    """Prepares DeepSeek V4 decode steps into persistent, per-slot buffers.

    Args:
        layout: the deployment's shapes.
        buffer_slots: independent buffer sets (2: upstream's ping-pong slots); preparing one never
            touches another.
        embedding: ``"device"`` (the kernel embeds ``input_ids``; hidden states may be ``None``)
            or ``"host"`` (upstream's PR #97 era: every consumer requires ``hidden_states`` and
            fills ``x_hc``).
        hidden_size: embedding width; required with ``embedding="host"``, not allowed otherwise.
        share_memory: allocate every buffer in shared memory (for workers forked afterwards).

    Every buffer is allocated here, once; its address never changes.
    """

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        *,
        buffer_slots: int = 2,
        embedding: Embedding = "device",
        hidden_size: int | None = None,
        share_memory: bool = False,
    ) -> None:
        if not isinstance(layout, DeepSeekV4Layout):
            raise TypeError(f"layout must be a DeepSeekV4Layout, got {type(layout).__name__}")
        buffer_slots = as_int(buffer_slots, "buffer_slots")
        if buffer_slots <= 0:
            raise ValueError(f"buffer_slots must be positive, got {buffer_slots}")
        if embedding not in ("device", "host"):
            raise ValueError(f"embedding must be 'device' or 'host', got {embedding!r}")
        if embedding == "host":
            if hidden_size is None:
                raise ValueError('embedding="host" requires hidden_size')
            hidden_size = as_int(hidden_size, "hidden_size")
            if hidden_size <= 0:
                raise ValueError(f"hidden_size must be positive, got {hidden_size}")
        elif hidden_size is not None:
            raise ValueError('hidden_size applies only to embedding="host"')
        self.layout = layout
        self.embedding: Embedding = embedding
        self.hidden_size = hidden_size
        self._slots = [_Slot(layout, hidden_size, share_memory) for _ in range(buffer_slots)]
        b = layout.decode_batch
        self._rows = layout.ranks * b
        self._row_range = range(self._rows)
        self._getters = [operator.itemgetter(name) for name in GROUP_NAMES]
        # Scratch rows: [num_blocks + k] for the k-th padding row of a rank; never mutated.
        self._scratch = [[[g.num_blocks + k] for k in range(b)] for g in layout.groups]
        self._assignment: _Assignment | None = None
        # The last step prepared (into any slot): per group every row's checked ids (None:
        # unknown), the ring slot likely to rotate next per row, and each row's request. A row
        # with a request holds checked ids; changes are checked against this state, once.
        self._latest: list[list[Any]] = [[None] * self._rows for _ in layout.groups]
        self._hints: list[list[int]] = [[0] * self._rows for _ in layout.groups]
        self._latest_occupants: list[str | None] = [None] * self._rows

    @property
    def buffer_slots(self) -> int:
        return len(self._slots)

    def table_stats(self, buffer_slot: int) -> dict[str, BlockTableStats]:
        """Per group, the counters of ``buffer_slot``'s table (rows written are ``misses``)."""
        tables = self._slots[buffer_slot].block_tables
        return {name: table.stats for name, table in zip(GROUP_NAMES, tables, strict=True)}

    def reset_stats(self) -> None:
        """Zero every table's counters, in every slot."""
        for slot in self._slots:
            for table in slot.block_tables:
                table.reset_stats()

    # --- public entry points ---------------------------------------------------------------------

    def prepare(self, batch: DecodeBatch, *, buffer_slot: int = 0) -> DeepSeekV4DecodeInputs:
        """Write one standard (autoregressive) decode step into ``buffer_slot``'s buffers.

        Each request decodes ``token_ids[i]`` (``[A]``, or ``[A, k]``: column 0) at position
        ``seq_lens[i] - 1``, repeated over ``decode_seq``. Upstream's rules: rank from
        ``cache_partitions``, local row by order of arrival on the rank; padding rows get scratch
        pages and block count 1; their dynamic inputs copy the rank's first request (global
        request 0 on an empty rank).

        Raises:
            ValueError: upstream's messages (seed-semantics 3, 6), first the hidden-state check of
                ``embedding="host"``; nothing is written.
            TypeError: non-integer tokens, lengths, partitions or block ids.
        """
        if self.embedding == "host" and batch.hidden_states is None:
            raise ValueError(HOST_HIDDEN_MESSAGE)
        assignment = self._assign(batch)
        layout = self.layout
        if layout.decode_seq != 1 and max(assignment.counts) > 1:
            raise ValueError(
                "DeepSeekV4 non-MTP decode supports at most one request per DP rank; the fixed "
                "S=2 kernel can expose only one cache-safe active token per rank"
            )
        A = len(assignment.ranks)
        seq = self._seq_lens(batch, A)
        if int(seq.min()) < 1:
            raise ValueError("decode seq_lens must be positive")
        tokens = self._tokens(batch.token_ids, A, "token_ids")
        hidden = self._hidden(batch, A, mtp=False)
        slot = self._checked_slot(batch, seq, buffer_slot)
        self._write_tables(slot, batch, assignment)
        positions = (seq - 1)[assignment.source]
        slot.input_np[...] = tokens[assignment.source][:, None]
        slot.positions_np[...] = positions[:, None]
        slot.kv_np[...] = seq[assignment.source]
        self._write_owners(slot, assignment.counts, 1)
        if hidden is not None:
            self._write_x_hc(slot, assignment, hidden, None)
        return self._inputs(slot, assignment, buffer_slot)

    def prepare_mtp(self, batch: DecodeBatch, *, buffer_slot: int = 0) -> DeepSeekV4DecodeInputs:
        """Write one MTP verification step (``decode_seq == 2``) into ``buffer_slot``'s buffers.

        Each request's token rows are ``[prev_token_ids[i], token_ids[i]]`` at positions
        ``(seq_len - 2, seq_len - 1)``; every rank may hold up to ``decode_batch`` requests and
        ``num_tokens_per_owner`` counts two rows per request. Padding as :meth:`prepare`.

        Raises:
            ValueError: ``"DeepSeek V4 decode requires host hidden states"`` (``embedding=
                "host"``, first), ``"DeepSeekV4 MTP decode requires previous token IDs and
                embeddings"`` (``prev_token_ids`` missing, or with ``embedding="host"``
                ``prev_hidden_states``), ``"DeepSeekV4 MTP verification requires
                decode_seq=2"``, ``"decode seq_lens must be >= MTP sequence width (2), got
                {s}"``, ``"MTP previous embeddings must align with draft embeddings"``, and those
                of :meth:`prepare`; nothing is written.
        """
        if self.embedding == "host":
            if batch.hidden_states is None:
                raise ValueError(HOST_HIDDEN_MESSAGE)
            if batch.prev_token_ids is None or batch.prev_hidden_states is None:
                raise ValueError(MTP_PREVIOUS_MESSAGE)
        elif batch.prev_token_ids is None:
            raise ValueError(MTP_PREVIOUS_MESSAGE)
        layout = self.layout
        if layout.decode_seq != 2:
            raise ValueError("DeepSeekV4 MTP verification requires decode_seq=2")
        assignment = self._assign(batch)
        A = len(assignment.ranks)
        seq = self._seq_lens(batch, A)
        shortest = int(seq.min())
        if shortest < layout.decode_seq:
            raise ValueError(
                f"decode seq_lens must be >= MTP sequence width ({layout.decode_seq}), "
                f"got {shortest}"
            )
        previous = self._tokens(batch.prev_token_ids, A, "prev_token_ids")
        tokens = self._tokens(batch.token_ids, A, "token_ids")
        hidden = self._hidden(batch, A, mtp=True)
        slot = self._checked_slot(batch, seq, buffer_slot)
        self._write_tables(slot, batch, assignment)
        source = assignment.source
        slot.input_np[:, 0] = previous[source]
        slot.input_np[:, 1] = tokens[source]
        slot.positions_np[:, 0] = (seq - 2)[source]
        slot.positions_np[:, 1] = (seq - 1)[source]
        slot.kv_np[...] = seq[source]
        self._write_owners(slot, assignment.counts, 2)
        if hidden is not None:
            assert batch.prev_hidden_states is not None  # checked with the host hidden states
            self._write_x_hc(slot, assignment, hidden, batch.prev_hidden_states)
        return self._inputs(slot, assignment, buffer_slot)

    def speculative_batch(
        self,
        batch: DecodeBatch,
        draft_token_ids: torch.Tensor,
        draft_hidden_states: torch.Tensor | None = None,
    ) -> DecodeBatch:
        """The batch the main model verifies: each request's draft after its current token.

        Returns a new batch with ``token_ids = drafts[:, None]``, ``prev_token_ids`` the current
        tokens, ``seq_lens + 1``; with ``embedding="host"`` also ``hidden_states`` the drafts'
        embeddings (``draft_hidden_states``, cast to the current hidden states' dtype) and
        ``prev_hidden_states`` the current ones. With ``embedding="device"`` both are ``None``.

        Raises:
            ValueError: ``"DeepSeek V4 decode requires host hidden states"`` (``embedding=
                "host"`` without ``batch.hidden_states``, first), ``draft_hidden_states``
                missing with ``embedding="host"`` or not shaped like the hidden states
                (``"MTP previous embeddings must align with draft embeddings"``),
                ``"draft_token_ids must have {A} entries, got {n}"``.
        """
        hidden = batch.hidden_states
        if self.embedding == "host":
            if hidden is None:
                raise ValueError(HOST_HIDDEN_MESSAGE)
            if draft_hidden_states is None:
                raise ValueError('embedding="host" needs the drafts\' host embeddings')
            if tuple(draft_hidden_states.shape) != tuple(hidden.shape):
                raise ValueError("MTP previous embeddings must align with draft embeddings")
        A = len(batch.request_ids)
        drafts = _integer_tensor(draft_token_ids, "draft_token_ids").reshape(-1)
        if drafts.numel() != A:
            raise ValueError(f"draft_token_ids must have {A} entries, got {drafts.numel()}")
        current = batch.token_ids if batch.token_ids.ndim == 1 else batch.token_ids[:, 0]
        host = self.embedding == "host"
        return DecodeBatch(
            request_ids=list(batch.request_ids),
            token_ids=drafts.to(torch.int64)[:, None],
            seq_lens=batch.seq_lens + 1,
            hidden_states=(
                draft_hidden_states.to(hidden.dtype)
                if host and draft_hidden_states is not None and hidden is not None
                else None
            ),
            block_ids=batch.block_ids,
            block_ids_by_group=batch.block_ids_by_group,
            cache_partitions=list(batch.cache_partitions),
            prev_token_ids=current.clone(),
            prev_hidden_states=hidden if host else None,
        )

    # --- checks ----------------------------------------------------------------------------------

    def _assign(self, batch: DecodeBatch) -> _Assignment:
        """Rank and local row of every request (seed-semantics 6.1); cached per batch layout."""
        request_ids, partitions = batch.request_ids, batch.cache_partitions
        cached = self._assignment
        if (
            cached is not None
            and request_ids == cached.request_ids
            and partitions == cached.partitions
        ):
            return cached
        A = len(request_ids)
        if A <= 0:
            raise ValueError("DeepSeekV4 decode batch must not be empty")
        if len(partitions) != A:
            raise ValueError("DeepSeekV4 decode requires one cache partition per request")
        R, b = self.layout.ranks, self.layout.decode_batch
        counts = [0] * R
        ranks: list[int] = []
        local_rows: list[int] = []
        for partition in partitions:
            rank = partition if type(partition) is int else _partition_index(partition)
            if not 0 <= rank < R:
                raise ValueError(f"DeepSeekV4 decode cache partitions must be in [0, {R - 1}]")
            if counts[rank] >= b:
                raise ValueError(f"DeepSeekV4 rank {rank} decode batch exceeds local capacity {b}")
            ranks.append(rank)
            local_rows.append(counts[rank])
            counts[rank] += 1
        perm = [A + local - counts[rank] for rank in range(R) for local in range(b)]
        occupants: list[str | None] = [None] * (R * b)
        source = np.zeros(R * b, dtype=np.intp)
        request_rows = np.empty(A, dtype=np.intp)
        for q, (rank, local) in enumerate(zip(ranks, local_rows, strict=True)):
            row = rank * b + local
            perm[row] = q
            occupants[row] = request_ids[q]
            request_rows[q] = row
            if local == 0:
                source[rank * b : (rank + 1) * b] = q
        source[request_rows] = np.arange(A)
        assignment = _Assignment(
            list(request_ids),
            list(partitions),
            tuple(ranks),
            tuple(local_rows),
            tuple(counts),
            perm,
            occupants,
            source,
            request_rows,
        )
        self._assignment = assignment
        return assignment

    def _seq_lens(self, batch: DecodeBatch, A: int) -> npt.NDArray[np.int64]:
        seq = _integer_array(batch.seq_lens, "seq_lens")
        if seq.shape != (A,):
            raise ValueError(f"decode seq_lens must have shape [{A}], got {list(seq.shape)}")
        return seq

    def _tokens(self, values: torch.Tensor | None, A: int, name: str) -> npt.NDArray[np.int64]:
        """Column 0 of ``[A]`` or ``[A, k]`` token ids, as int64."""
        tokens = _integer_array(values, name)
        if tokens.ndim == 2 and tokens.shape[0] == A and tokens.shape[1] >= 1:
            return tokens[:, 0]
        if tokens.shape != (A,):
            raise ValueError(
                f"decode {name} must have shape [{A}] or [{A}, k], got {list(tokens.shape)}"
            )
        return tokens

    def _hidden(self, batch: DecodeBatch, A: int, *, mtp: bool) -> torch.Tensor | None:
        """The host hidden states ``[A, hidden]`` (``embedding="host"``), else ``None``."""
        hidden = batch.hidden_states
        if self.embedding != "host" or hidden is None:
            return None
        expected = (A, self.hidden_size)
        if tuple(hidden.shape) != expected:
            raise ValueError(
                f"hidden_states must have shape {list(expected)}, got {list(hidden.shape)}"
            )
        previous = batch.prev_hidden_states
        if mtp and (previous is None or tuple(previous.shape) != expected):
            raise ValueError("MTP previous embeddings must align with draft embeddings")
        return hidden

    def _checked_slot(
        self, batch: DecodeBatch, seq: npt.NDArray[np.int64], buffer_slot: int
    ) -> _Slot:
        """Upstream's order: grouped-id shape, the position limit, then the buffer slot."""
        A = len(batch.request_ids)
        rows = batch.block_ids_by_group
        if not rows:
            raise ValueError("DeepSeekV4 requires grouped KV block IDs")
        if len(rows) != A:
            raise ValueError(f"grouped KV metadata has {len(rows)} rows, expected decode batch {A}")
        position = int(seq.max()) - 1
        if position >= self.layout.max_seq_len:
            _raise_first(self._normalization_error(batch))
            raise ValueError(
                f"decode position {position} exceeds max_seq_len={self.layout.max_seq_len}"
            )
        slot = buffer_slot if type(buffer_slot) is int else as_int(buffer_slot, "buffer_slot")
        if not 0 <= slot < len(self._slots):
            _raise_first(self._normalization_error(batch))
            choices = [str(s) for s in range(len(self._slots))]
            allowed = (
                choices[0]
                if len(choices) == 1
                else (", ".join(choices[:-1]) + " or " + choices[-1])
            )
            raise ValueError(f"decode buffer_slot must be {allowed}, got {buffer_slot}")
        return self._slots[slot]

    # --- tables ----------------------------------------------------------------------------------

    def _write_tables(self, slot: _Slot, batch: DecodeBatch, assignment: _Assignment) -> None:
        """Check the rows that changed since the last step (of any slot), then bring this slot's
        rows up to date: those changed since it was last prepared. All-or-nothing."""
        try:
            checked = self._check_tables(batch, assignment)
        except _Invalid as invalid:
            _raise_first(self._full_check_error(batch, assignment))
            raise invalid.error from None
        moved = (
            {}
            if slot.occupants == assignment.occupants
            else _occupancy_changes(slot.occupants, assignment.occupants)[1]
        )
        counts = slot.counts_np
        for gi, (changed, latest, _) in enumerate(checked):
            held = slot.held[gi]
            if slot.pending is None:
                candidates: Any = compress(self._row_range, map(operator.ne, latest, held))
            else:
                candidates = slot.pending[gi].union(changed) if slot.pending[gi] else changed
            writes: list[int] = []
            copies: dict[int, int] = {}
            for row in candidates:
                value, old = latest[row], held[row]
                if old is value or old == value:
                    continue
                src = moved.get(row)
                if src is not None and held[src] == value:
                    copies[row] = src
                else:
                    writes.append(row)
                if old is None or len(old) != len(value):
                    counts[row, gi] = len(value)
            table = slot.block_tables[gi]
            ordered, rewrites = _copy_order(copies)
            for src, dst in ordered:
                table.copy_row(src, dst)
            for row in writes + rewrites:
                table.write_row(row, latest[row])
            slot.held[gi] = latest  # shared with the latest state: neither is mutated in place
        slot.occupants = assignment.occupants
        slot.pending = [set() for _ in GROUP_NAMES]
        for other in self._slots:
            if other is not slot and other.pending is not None:
                for pending, (changed, _, _) in zip(other.pending, checked, strict=True):
                    pending.update(changed)
                if max(map(len, other.pending)) > self._rows // 2:
                    other.pending = None  # far behind: its next prepare compares every row
        self._latest = [latest for _, latest, _ in checked]
        self._hints = [hints for _, _, hints in checked]
        self._latest_occupants = assignment.occupants

    def _check_tables(
        self, batch: DecodeBatch, assignment: _Assignment
    ) -> list[tuple[list[int], list[Any], list[int]]]:
        """Per group: (rows whose ids changed since the last step, every row's checked ids, ring
        hints). Only changed ids are checked; raises :class:`_Invalid` on the first bad one."""
        dicts = batch.block_ids_by_group
        perm = assignment.perm
        A = len(assignment.ranks)
        before = self._latest_occupants
        if before == assignment.occupants:
            fresh: list[int] = []
            moved: dict[int, int] = {}
        else:
            fresh, moved = _occupancy_changes(before, assignment.occupants)
        checked = []
        for gi, group in enumerate(self.layout.groups):
            try:
                column = list(map(self._getters[gi], dicts))
            except (KeyError, TypeError, IndexError) as error:
                raise _Invalid(error) from None
            extended = column + self._scratch[gi]
            rows = list(map(extended.__getitem__, perm))
            latest = self._latest[gi]
            try:
                changed = self._changed_rows(group, rows, latest)
            except (TypeError, ValueError, RuntimeError):  # arrays or tensors: compare as lists
                try:
                    column = [_as_list(ids, q, group.name) for q, ids in enumerate(column)]
                except TypeError as error:
                    raise _Invalid(error) from None
                extended = column + self._scratch[gi]
                rows = list(map(extended.__getitem__, perm))
                changed = self._changed_rows(group, rows, latest)
            hints = self._hints[gi]
            new_latest = latest[:] if changed else latest
            for row in changed:
                ids = rows[row]
                q = perm[row]
                if q >= A:  # a padding row whose scratch page changed
                    new_latest[row] = ids
                    continue
                if type(ids) is not list:
                    try:
                        ids = _as_list(ids, q, group.name)
                    except TypeError as error:
                        raise _Invalid(error) from None
                src = moved.get(row)
                if src is not None and latest[src] == ids:
                    new_latest[row] = latest[src]
                    continue
                base = latest[row] if before[row] is not None else None
                good, hint = self._check_row(group, q, ids, base, hints[row])
                new_latest[row] = good[:] if good is ids else good
                if hint != hints[row]:
                    if hints is self._hints[gi]:
                        hints = hints[:]
                    hints[row] = hint
            for row in fresh:  # a request on a former padding row, holding its scratch ids
                if rows[row] == latest[row]:
                    self._check_row(group, perm[row], rows[row], None, 0)
            checked.append((changed, new_latest, hints))
        return checked

    def _changed_rows(
        self, group: DeepSeekV4CacheGroup, rows: list[Any], held: list[Any]
    ) -> list[int]:
        """Rows whose ids differ from what they hold. Groups that follow the 128-token block
        rarely change: one comparison of all rows settles most steps."""
        if group.block_tokens == SOURCE_BLOCK_TOKENS and rows == held:
            return []
        return list(compress(self._row_range, map(operator.ne, rows, held)))

    def _check_row(
        self, group: DeepSeekV4CacheGroup, q: int, ids: list[Any], base: list[Any] | None, hint: int
    ) -> tuple[list[Any], int]:
        """Check request ``q``'s new ``ids`` for ``group``; return them (as a list of ints) and
        the ring slot likely to rotate next. ``base``: validated ids the row held, which ``ids``
        may differ from in a few places (only those are checked), or ``None``."""
        if base is not None and len(ids) == len(base):
            if hint < len(ids) and ids[hint] != base[hint]:
                saved = base[hint]
                base[hint] = ids[hint]  # base is a private copy: patch, compare, restore
                try:
                    single = ids == base
                finally:
                    base[hint] = saved
                if single and self._new_id_ok(group, ids, ids[hint]):
                    return ids, (hint + 1) % len(ids)
            positions = list(compress(range(len(ids)), map(operator.ne, ids, base)))
            if not positions:  # the same ids in another container
                return ids, hint
            if len(positions) <= RING_SLOT_CHECK_MAX and all(
                self._new_id_ok(group, ids, ids[p]) for p in positions
            ):
                return ids, (positions[-1] + 1) % len(ids)
        return self._check_whole_row(group, q, ids), 0

    def _new_id_ok(self, group: DeepSeekV4CacheGroup, ids: list[Any], x: Any) -> bool:
        """Whether ``x``, one new id of ``ids``, is a plain int, in range and not repeated;
        ``False`` for other integer types (the whole-row check converts them)."""
        if type(x) is not int:
            return False
        if not 0 <= x < group.num_blocks:
            raise _Invalid(_range_error(group.num_blocks, self.layout.decode_batch))
        if ids.count(x) != 1:
            raise _Invalid(ValueError(REPEAT_MESSAGE))
        return True

    def _check_whole_row(self, group: DeepSeekV4CacheGroup, q: int, ids: list[Any]) -> list[Any]:
        if not ids:
            raise _Invalid(ValueError(f"decode row {q} is missing grouped KV blocks"))
        if set(map(type, ids)) != _INT_TYPE:
            try:
                ids = [_block_id(q, group.name, x) for x in ids]
            except TypeError as error:
                raise _Invalid(error) from None
        if len(set(ids)) != len(ids):
            raise _Invalid(ValueError(REPEAT_MESSAGE))
        if min(ids) < 0 or max(ids) >= group.num_blocks:
            raise _Invalid(_range_error(group.num_blocks, self.layout.decode_batch))
        if len(ids) > group.width:
            raise _Invalid(ValueError(_length_message(group, 0, len(ids))))
        return ids

    # --- the full check, in upstream's order -----------------------------------------------------

    def _normalization_error(self, batch: DecodeBatch) -> Exception | None:
        """The first error of upstream's ``_normalize_group_block_ids`` (seed-semantics 6.2)."""
        try:
            self._normalized(batch)
        except (TypeError, ValueError) as error:
            return error
        return None

    def _normalized(self, batch: DecodeBatch) -> list[dict[str, list[int]]]:
        result = []
        for q, row in enumerate(batch.block_ids_by_group):
            if not isinstance(row, Mapping):
                raise TypeError(
                    f"decode row {q} grouped KV blocks must map group names to block IDs, got "
                    f"{type(row).__name__}"
                )
            lists = {name: _as_list(row[name], q, name) for name in GROUP_NAMES if name in row}
            missing = [name for name in GROUP_NAMES if not lists.get(name)]
            if missing:
                raise ValueError(
                    f"decode row {q} is missing grouped KV blocks: {', '.join(missing)}"
                )
            result.append(
                {name: [_block_id(q, name, x) for x in ids] for name, ids in lists.items()}
            )
        return result

    def _full_check_error(self, batch: DecodeBatch, assignment: _Assignment) -> Exception | None:
        """The first error upstream would raise for the block ids, or ``None``: normalisation,
        then per rank the padding checks of every group, then the table builders' checks."""
        try:
            normalized = self._normalized(batch)
        except (TypeError, ValueError) as error:
            return error
        b = self.layout.decode_batch
        by_rank: list[list[int]] = [[] for _ in range(self.layout.ranks)]
        for q, rank in enumerate(assignment.ranks):
            by_rank[rank].append(q)
        for requests in by_rank:
            for group in self.layout.groups:
                for q in requests:
                    ids = normalized[q][group.name]
                    if len(set(ids)) != len(ids):
                        return ValueError(REPEAT_MESSAGE)
                    if min(ids) < 0 or max(ids) >= group.num_blocks:
                        return _range_error(group.num_blocks, b)
            for group in self.layout.groups:
                for local, q in enumerate(requests):
                    n = len(normalized[q][group.name])
                    if n > group.width:
                        return ValueError(_length_message(group, local, n))
        return None

    # --- dynamic inputs --------------------------------------------------------------------------

    def _write_owners(self, slot: _Slot, counts: tuple[int, ...], active_seq: int) -> None:
        """``num_tokens_per_owner`` and ``logit_row_indices``, rewritten when the counts change."""
        key = (counts, active_seq)
        if slot.owner_key == key:
            return
        owners = slot.num_tokens_per_owner.numpy()
        logits = slot.logit_row_indices.numpy()
        owners[...] = np.array(counts) * active_seq
        logits[...] = -1
        for rank, count in enumerate(counts):
            logits[rank, : count * active_seq] = np.arange(count * active_seq)
        slot.owner_key = key

    def _write_x_hc(
        self,
        slot: _Slot,
        assignment: _Assignment,
        hidden: torch.Tensor,
        previous: torch.Tensor | None,
    ) -> None:
        """Upstream's ``_pack_decode_x_hc``: every row request 0's last embedding, then each
        request's rows (its embedding over ``decode_seq``; MTP: ``[previous, current]``)."""
        assert slot.x_hc is not None
        S = self.layout.decode_seq
        x = slot.x_hc.view(self._rows, S, -1)
        current = hidden.detach().to("cpu", torch.float32)
        x[...] = current[0]
        rows = torch.from_numpy(assignment.request_rows)
        if previous is None:
            x[rows] = current[:, None, :]
        else:
            x[rows, 0] = previous.detach().to("cpu", torch.float32)
            x[rows, 1] = current

    def _inputs(
        self, slot: _Slot, assignment: _Assignment, buffer_slot: int
    ) -> DeepSeekV4DecodeInputs:
        return DeepSeekV4DecodeInputs(
            tables=MappingProxyType(slot.tables),
            block_counts=slot.block_counts,
            input_ids=slot.input_ids,
            position_ids=slot.position_ids,
            kv_seq_lens=slot.kv_seq_lens,
            num_tokens_per_owner=slot.num_tokens_per_owner,
            logit_row_indices=slot.logit_row_indices,
            x_hc=slot.x_hc,
            ranks=assignment.ranks,
            local_rows=assignment.local_rows,
            buffer_slot=int(buffer_slot),
        )


REPEAT_MESSAGE = "a grouped KV row must not repeat physical blocks"
RING_SLOT_CHECK_MAX = 4
"""A changed row whose ids differ in at most this many places has only those ids checked."""
_INT_TYPE = {int}


def _range_error(num_blocks: int, kernel_rows: int) -> ValueError:
    return ValueError(
        f"grouped KV block IDs must be in [0, {num_blocks}); [{num_blocks}, "
        f"{num_blocks + kernel_rows}) is reserved for kernel padding"
    )


def _length_message(group: DeepSeekV4CacheGroup, row: int, n: int) -> str:
    if group.name == "ori":
        return f"ori ring row {row} has {n} blocks, maximum is {group.width}"
    if group.kind == "paged":
        return f"row {row} has {n} blocks, maximum is {group.width}"
    return f"ring block-table row {row} has {n} blocks, maximum is {group.width}"


def _type_error(q: int, name: str, x: object) -> TypeError:
    return TypeError(
        f"decode row {q} group {name} holds {x!r} of type {type(x).__name__}; "
        "block IDs must be integers"
    )


def _block_id(q: int, name: str, x: object) -> int:
    """``x`` as an int block id: Python, NumPy or 0-d integer values; never bools or floats."""
    if type(x) is int:
        return x
    if is_integer_id(x):
        return operator.index(x)  # type: ignore[arg-type]
    raise _type_error(q, name, x)


def _as_list(ids: object, q: int, name: str) -> list[Any]:
    """Request ``q``'s ``name`` ids as a list (tuples copied, arrays and tensors ``tolist()``)."""
    if isinstance(ids, list):
        return ids
    if isinstance(ids, (np.ndarray, torch.Tensor)) and ids.ndim == 1:
        values: list[Any] = ids.tolist()
        return values
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(
            f"decode row {q} group {name} must be a sequence of block IDs, got {type(ids).__name__}"
        )
    return list(ids)


def _partition_index(partition: object) -> int:
    """A cache partition as an int; anything else is out of range (upstream's message)."""
    try:
        return as_int(partition, "cache partition")
    except TypeError:
        return -1


def _integer_array(values: object, name: str) -> npt.NDArray[np.int64]:
    """An integer tensor (or array, or list) as an int64 NumPy array; ``TypeError`` otherwise."""
    if values is None:
        raise ValueError(f"decode {name} are missing")
    array = values if isinstance(values, torch.Tensor) else np.asarray(values)
    if not has_integer_dtype(array):
        raise TypeError(f"decode {name} must be integers, got dtype {array.dtype}")
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    return array.astype(np.int64, copy=False)


def _occupancy_changes(
    before: list[str | None], after: list[str | None]
) -> tuple[list[int], dict[int, int]]:
    """Rows whose request is new to them: (rows that held no request before, and the rows whose
    request sat in another row before: row -> that row)."""
    rows_before = {request: row for row, request in enumerate(before) if request is not None}
    fresh = []
    moved = {}
    for row, (old, new) in enumerate(zip(before, after, strict=True)):
        if new is None or new == old:
            continue
        src = rows_before.get(new)
        if src is not None:
            moved[row] = src
        if old is None:
            fresh.append(row)
    return fresh, moved


def _copy_order(copies: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Order row copies ``dst <- src`` so that no row is overwritten before it is read.

    Returns ``(copies in order, rows to write from ids instead)``: a cycle of moves is broken by
    writing one of its rows from its ids after every copy.
    """
    if not copies:
        return [], []
    pending = dict(copies)
    readers: dict[int, int] = {}
    for src in pending.values():
        readers[src] = readers.get(src, 0) + 1
    ready = [dst for dst in pending if not readers.get(dst)]
    ordered: list[tuple[int, int]] = []
    rewrites: list[int] = []
    while pending:
        if ready:
            dst = ready.pop()
            if dst not in pending:
                continue
            src = pending.pop(dst)
            ordered.append((src, dst))
        else:
            dst, src = pending.popitem()
            rewrites.append(dst)
        readers[src] -= 1
        if not readers[src] and src in pending:
            ready.append(src)
    return ordered, rewrites


def _raise_first(error: Exception | None) -> None:
    if error is not None:
        raise error
