"""DeepSeek V4 decode inputs: 7 KV groups x DP ranks, scratch padding, ping-pong buffer slots, MTP.

Reproduces upstream pypto-serving's DeepSeek V4 decode ABI (seed-semantics 4-8): per buffer slot,
one ``[ranks, decode_batch, width]`` int32 table per cache group, ``block_counts``, and the dynamic
inputs (tokens, positions, KV lengths, per-rank row counts, logit row indices), with upstream's
padding rules and error messages. The tables live in a :class:`~blockprep.grouped.GroupedTables`
(one row per ``rank * decode_batch + local`` kernel row, keyed by request id), so a step costs what
changed since the latest step of any slot and every buffer still equals upstream's full rebuild
(:func:`blockprep.reference.deepseek_v4_decode_rebuild`). This module holds only what is DeepSeek's:
the layout, the rank assignment, the scratch padding, the dynamic inputs, MTP, the hidden-state
contract and upstream's messages in upstream's order.

A step checks everything (upstream's checks, then the id rule of :mod:`blockprep.grouped`, then
the hidden states' copy to the host) before its first write; a rejected batch leaves every slot,
cache and record as it was. Deliberate differences from upstream:

- a changed block id must be a plain int (``TypeError`` naming the batch row, group and value)
  where upstream coerced with ``int()``; an id equal to the one its row holds is taken as that int;
- a state ring longer than its table width raises
  ``"ring block-table row {r} has {n} blocks, maximum is {width}"`` where upstream truncated;
- upstream's padding and builder messages are kept word for word, so they name no rank; the
  first failing (rank, group, local row) in upstream's order is the one reported.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as _replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep.batch import DecodeBatch
from blockprep.block_table import BlockTableStats
from blockprep.buffers import host_tensor
from blockprep.grouped import BlockIdTypeError, BlockIdValueError, GroupedTables, TableGroup
from blockprep.ids import INT32_MAX, as_int, has_integer_dtype

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
    (``rank * b + local``) its request and the request whose dynamic inputs it copies."""

    request_ids: list[str]
    partitions: list[Any]
    ranks: tuple[int, ...]
    local_rows: tuple[int, ...]
    counts: tuple[int, ...]
    perm: list[int]  # per table row: request index, or A + k for scratch page k
    occupants: list[str | None]  # per table row: request id, None for a padding row
    source: npt.NDArray[np.intp]  # per table row: the request its dynamic inputs replicate
    request_rows: npt.NDArray[np.intp]  # per request: its table row
    in_order: bool  # request q sits in table row q, and no row is padding


class _DynamicInputs:
    """A slot's buffers besides the tables: tokens, positions, KV lengths, owners, logits, x_hc."""

    def __init__(self, layout: DeepSeekV4Layout, hidden_size: int | None, share: bool) -> None:
        R, b, T, S = layout.ranks, layout.decode_batch, layout.decode_tokens, layout.decode_seq

        def buffer(shape: tuple[int, ...], dtype: torch.dtype, fill: int = 0) -> torch.Tensor:
            return host_tensor(shape, dtype, fill=fill, share_memory=share)

        self.input_ids = buffer((R, T), torch.int64)
        self.position_ids = buffer((R, T), torch.int32)
        self.kv_seq_lens = buffer((R, b), torch.int32)
        self.num_tokens_per_owner = buffer((R,), torch.int32)
        self.logit_row_indices = buffer((R, T), torch.int32, fill=-1)
        self.x_hc = None if hidden_size is None else buffer((R, T, hidden_size), torch.float32)
        self.input_np = self.input_ids.numpy().reshape(R * b, S)
        self.positions_np = self.position_ids.numpy().reshape(R * b, S)
        self.kv_np = self.kv_seq_lens.numpy().reshape(R * b)
        self.owner_key: tuple[tuple[int, ...], int] | None = None

    def write(
        self,
        assignment: _Assignment,
        tokens: npt.NDArray[np.int64],
        seq: npt.NDArray[np.int64],
        previous: npt.NDArray[np.int64] | None,
    ) -> None:
        """Stage one step (seed-semantics 6.5): ``previous`` tokens for MTP's first token row."""
        source = assignment.source
        if previous is None:
            self.input_np[...] = tokens[source][:, None]
            self.positions_np[...] = (seq - 1)[source][:, None]
        else:
            self.input_np[:, 0] = previous[source]
            self.input_np[:, 1] = tokens[source]
            self.positions_np[:, 0] = (seq - 2)[source]
            self.positions_np[:, 1] = (seq - 1)[source]
        self.kv_np[...] = seq[source]
        active_seq = 1 if previous is None else 2
        key = (assignment.counts, active_seq)
        if self.owner_key != key:  # num_tokens_per_owner and logit rows follow the counts
            logits = self.logit_row_indices.numpy()
            self.num_tokens_per_owner.numpy()[...] = np.array(assignment.counts) * active_seq
            logits[...] = -1
            for rank, count in enumerate(assignment.counts):
                logits[rank, : count * active_seq] = np.arange(count * active_seq)
            self.owner_key = key

    def write_x_hc(
        self, assignment: _Assignment, hidden: torch.Tensor, previous: torch.Tensor | None
    ) -> None:
        """Upstream's ``_pack_decode_x_hc``: every row request 0's last embedding, then each
        request's rows (its embedding over ``decode_seq``; MTP: ``[previous, current]``)."""
        assert self.x_hc is not None
        rows = len(assignment.occupants)
        x = self.x_hc.view(rows, self.input_np.shape[1], -1)
        x[...] = hidden[0]
        index = torch.from_numpy(assignment.request_rows)
        if previous is None:
            x[index] = hidden[:, None, :]
        else:
            x[index, 0] = previous
            x[index, 1] = hidden


class DeepSeekV4DecodePreparer:
    """Prepares DeepSeek V4 decode steps into persistent, per-slot buffers.

    Args:
        layout: the deployment's shapes.
        buffer_slots: independent buffer sets (2: upstream's ping-pong slots); preparing one never
            touches another, and a slot catches up on the changes prepared into the others.
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
        R, b = layout.ranks, layout.decode_batch
        groups = [
            TableGroup(g.name, g.kind, g.width, g.num_blocks, min_ids=1) for g in layout.groups
        ]
        self._tables = GroupedTables(groups, R * b, slots=buffer_slots, share_memory=share_memory)
        self._dynamic = [
            _DynamicInputs(layout, hidden_size, share_memory) for _ in range(buffer_slots)
        ]
        self._views = [
            (
                {n: t.view(R, b, -1) for n, t in self._tables.tables(s).items()},
                self._tables.counts(s).view(R, b, len(GROUP_NAMES)),
            )
            for s in range(buffer_slots)
        ]
        self._group_ids = operator.itemgetter(*GROUP_NAMES)
        # Scratch rows: [num_blocks + k] for the k-th padding row of a rank; never mutated.
        self._scratch = [[[g.num_blocks + k] for k in range(b)] for g in layout.groups]
        self._assignment: _Assignment | None = None

    @property
    def buffer_slots(self) -> int:
        return self._tables.slots

    def table_stats(self, buffer_slot: int) -> dict[str, BlockTableStats]:
        """Per group, ``buffer_slot``'s counters: ``hits`` rows a step left alone, ``misses`` rows
        it wrote (catching up on other slots' steps included), ``cells_written``."""
        return self._tables.stats(buffer_slot)

    def reset_stats(self) -> None:
        """Zero every slot's counters."""
        self._tables.reset_stats()

    def invalidate(self, buffer_slot: int | None = None) -> None:
        """Forget what ``buffer_slot``'s buffers (every slot's with ``None``) hold, for when
        anything else wrote them: its next step rewrites every table row and dynamic input."""
        self._tables.invalidate(buffer_slot)
        for dynamic in self._dynamic if buffer_slot is None else [self._dynamic[buffer_slot]]:
            dynamic.owner_key = None

    def reset(self) -> None:
        """Forget everything prepared: the next step writes every row of whichever slot."""
        self._tables.reset()
        self._assignment = None
        self.invalidate()

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
                ``embedding="host"``; hidden states that cannot be copied to the host; nothing is
                written.
            TypeError: non-integer tokens, lengths or partitions; block ids against the id rule
                (:mod:`blockprep.grouped`).
        """
        if self.embedding == "host" and batch.hidden_states is None:
            raise ValueError(HOST_HIDDEN_MESSAGE)
        assignment = self._assign(batch)
        if self.layout.decode_seq != 1 and max(assignment.counts) > 1:
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
        return self._stage(batch, assignment, buffer_slot, seq, tokens, None, hidden)

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
        return self._stage(batch, assignment, buffer_slot, seq, tokens, previous, hidden)

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

    # --- one step: check, plan, then write -------------------------------------------------------

    def _stage(
        self,
        batch: DecodeBatch,
        assignment: _Assignment,
        buffer_slot: int,
        seq: npt.NDArray[np.int64],
        tokens: npt.NDArray[np.int64],
        previous: npt.NDArray[np.int64] | None,
        hidden: tuple[torch.Tensor, torch.Tensor | None] | None,
    ) -> DeepSeekV4DecodeInputs:
        """Check the block ids, plan the tables, then write the slot (nothing after the plan
        can raise)."""
        slot = self._checked_slot(batch, seq, buffer_slot)
        step = self._plan_tables(batch, assignment)
        self._tables.commit(step, slot)
        dynamic = self._dynamic[slot]
        dynamic.write(assignment, tokens, seq, previous)
        if hidden is not None:
            dynamic.write_x_hc(assignment, *hidden)
        tables, counts = self._views[slot]
        return DeepSeekV4DecodeInputs(
            tables=MappingProxyType(tables),
            block_counts=counts,
            input_ids=dynamic.input_ids,
            position_ids=dynamic.position_ids,
            kv_seq_lens=dynamic.kv_seq_lens,
            num_tokens_per_owner=dynamic.num_tokens_per_owner,
            logit_row_indices=dynamic.logit_row_indices,
            x_hc=dynamic.x_hc,
            ranks=assignment.ranks,
            local_rows=assignment.local_rows,
            buffer_slot=slot,
        )

    def _plan_tables(self, batch: DecodeBatch, assignment: _Assignment) -> Any:
        """Every group's rows in table order (requests by assignment, scratch pages on padding
        rows), planned by the grouped tables; on any error, upstream's first error wins."""
        perm = assignment.perm
        try:
            columns: list[Sequence[Any]]
            columns = list(zip(*map(self._group_ids, batch.block_ids_by_group), strict=True))
            if not assignment.in_order:
                columns = [
                    list(map((*column, *scratch).__getitem__, perm))
                    for column, scratch in zip(columns, self._scratch, strict=True)
                ]
            return self._tables.plan(
                columns, assignment.occupants, lambda r: f"decode row {perm[r]}"
            )
        except (BlockIdTypeError, BlockIdValueError) as error:
            _raise_first(self._full_check_error(batch, assignment))
            raise error from None
        except (KeyError, TypeError):  # a row that is no mapping, a group missing
            _raise_first(self._full_check_error(batch, assignment))
            raise

    def _assign(self, batch: DecodeBatch) -> _Assignment:
        """Rank and local row of every request (seed-semantics 6.1); cached per batch layout."""
        request_ids, partitions = batch.request_ids, batch.cache_partitions
        cached = self._assignment
        if cached is not None and partitions == cached.partitions:
            if request_ids == cached.request_ids:
                return cached
            if len(request_ids) == len(partitions):  # the same places, other requests
                A = len(request_ids)
                now = [request_ids[q] if q < A else None for q in cached.perm]
                self._assignment = cached = _replace(
                    cached, request_ids=list(request_ids), occupants=now
                )
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
        firsts = [0] * R  # each rank's first request (request 0 for an empty rank)
        for q in range(A - 1, -1, -1):
            firsts[ranks[q]] = q
        source = [q for q in firsts for _ in range(b)]
        rows = [rank * b + local for rank, local in zip(ranks, local_rows, strict=True)]
        for q, row in enumerate(rows):
            perm[row] = q
            occupants[row] = request_ids[q]
            source[row] = q
        assignment = _Assignment(
            list(request_ids),
            list(partitions),
            tuple(ranks),
            tuple(local_rows),
            tuple(counts),
            perm,
            occupants,
            np.array(source, dtype=np.intp),
            np.array(rows, dtype=np.intp),
            perm == list(range(R * b)),
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

    def _hidden(
        self, batch: DecodeBatch, A: int, *, mtp: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``embedding="host"``: the hidden states ``[A, hidden]`` (and MTP's previous ones),
        copied to the host as float32 now, so that a copy that fails fails before any write."""
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
        return _host_float(hidden, "hidden_states"), (
            None if not mtp or previous is None else _host_float(previous, "prev_hidden_states")
        )

    def _checked_slot(
        self, batch: DecodeBatch, seq: npt.NDArray[np.int64], buffer_slot: int
    ) -> int:
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
        if not 0 <= slot < self.buffer_slots:
            _raise_first(self._normalization_error(batch))
            choices = [str(s) for s in range(self.buffer_slots)]
            allowed = (
                choices[0]
                if len(choices) == 1
                else (", ".join(choices[:-1]) + " or " + choices[-1])
            )
            raise ValueError(f"decode buffer_slot must be {allowed}, got {buffer_slot}")
        return slot

    # --- the full check, in upstream's order -----------------------------------------------------

    def _normalization_error(self, batch: DecodeBatch) -> Exception | None:
        """The first error of upstream's ``_normalize_group_block_ids`` (seed-semantics 6.2)."""
        try:
            self._normalized(batch)
        except (TypeError, ValueError) as error:
            return error
        return None

    def _normalized(self, batch: DecodeBatch) -> list[dict[str, list[int]]]:
        """Every row's ids as upstream reads them, ids that are no integer value left out (the
        id rule decides about those)."""
        result = []
        for q, row in enumerate(batch.block_ids_by_group):
            if not isinstance(row, Mapping):
                raise TypeError(
                    f"decode row {q} grouped KV blocks must map group names to block IDs, got "
                    f"{type(row).__name__}"
                )
            lists = {name: _sequence(row[name], q, name) for name in GROUP_NAMES if name in row}
            missing = [name for name in GROUP_NAMES if not lists.get(name)]
            if missing:
                raise ValueError(
                    f"decode row {q} is missing grouped KV blocks: {', '.join(missing)}"
                )
            result.append({name: _integer_values(ids) for name, ids in lists.items()})
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
                    if ids and (min(ids) < 0 or max(ids) >= group.num_blocks):
                        return _range_error(group.num_blocks, b)
            for group in self.layout.groups:
                for local, q in enumerate(requests):
                    n = len(batch.block_ids_by_group[q][group.name])
                    if n > group.width:
                        return ValueError(_length_message(group, local, n))
        return None


REPEAT_MESSAGE = "a grouped KV row must not repeat physical blocks"


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


def _sequence(ids: object, q: int, name: str) -> Sequence[Any]:
    """Request ``q``'s ``name`` ids as upstream iterates them (arrays and tensors as lists)."""
    if isinstance(ids, (np.ndarray, torch.Tensor)) and ids.ndim == 1:
        values: list[Any] = ids.tolist()
        return values
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(
            f"decode row {q} group {name} must be a sequence of block IDs, got {type(ids).__name__}"
        )
    return ids


def _integer_values(ids: Sequence[Any]) -> list[int]:
    """The ids that hold an integer value (``6``, ``6.0``, ``True``, ``np.int32(6)``), as ints."""
    values = []
    for x in ids:
        try:
            value = operator.index(x)
        except TypeError:
            if not isinstance(x, (float, np.floating)) or not float(x).is_integer():
                continue
            value = int(x)
        values.append(value)
    return values


def _host_float(states: torch.Tensor, name: str) -> torch.Tensor:
    """``states`` as a float32 CPU tensor; ``ValueError`` when it cannot be copied there."""
    try:
        return states.detach().to("cpu", torch.float32)
    except (RuntimeError, NotImplementedError) as error:
        raise ValueError(f"{name} cannot be copied to the host: {error}") from None


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


def _raise_first(error: Exception | None) -> None:
    if error is not None:
        raise error
