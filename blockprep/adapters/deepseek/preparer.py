"""The DeepSeek V4 decode preparer: per buffer slot, the 7 tables (a :class:`~blockprep.grouped.
GroupedTables` over ``ranks * decode_batch`` rows), ``block_counts`` and the dynamic inputs, in
buffers named as upstream's kernel arguments (allocated here, or adopted).

A step runs upstream's checks in upstream's order, plans the tables (the id rule and every
change decided before any write), copies hidden states to the host, then writes; nothing after
the plan can raise. Padding rows hold the scratch pages ``num_blocks + k``.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep.adapters.deepseek.abi import (
    GROUP_ARGUMENTS,
    PREPARED_ARGUMENTS,
    deepseek_v4_prepared_arguments,
)
from blockprep.adapters.deepseek.assignment import Assignment, assign
from blockprep.adapters.deepseek.checks import normalization_error, upstream_error
from blockprep.adapters.deepseek.layout import (
    GROUP_NAMES,
    INPUT_FIELDS,
    UNBOUND_MESSAGE,
    DeepSeekV4Layout,
)
from blockprep.adapters.deepseek.mtp import integer_tensor
from blockprep.batch import DecodeBatch
from blockprep.block_table import BlockTableStats
from blockprep.buffers import check_writable, host_tensor
from blockprep.grouped import (
    BlockIdValueError,
    GroupedStep,
    GroupedTables,
    TableGroup,
)
from blockprep.ids import as_int, has_integer_dtype
from blockprep.verify import check_buffer
from blockprep.wire import DeltaCursor, DeltaMessageError, apply_ops

INT64_MAX = 2**63 - 1

HOST_HIDDEN_MESSAGE = "DeepSeek V4 decode requires host hidden states"
MTP_PREVIOUS_MESSAGE = "DeepSeekV4 MTP decode requires previous token IDs and embeddings"
REQUEST_ORDER_MESSAGE = "prepared decode request order changed before execution"
PARTITIONS_MESSAGE = "prepared decode cache partitions changed before execution"

Embedding = Literal["device", "host"]
Mode = Literal["decode", "mtp", "target"]


class SlotBusyError(RuntimeError):
    """A call on a buffer slot that another thread is preparing or re-staging right now (raised
    at once, never waited for; ``slot`` names it)."""

    def __init__(self, slot: int, what: str) -> None:
        super().__init__(
            f"DeepSeekV4 decode buffer slot {slot} is busy (another thread is preparing or "
            f"re-staging it); {what} does not wait"
        )
        self.slot = slot


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
    - ``buffer_slot``: the slot these views belong to;
    - ``decode_seq``: token rows per kernel row (``S``); ``active_seq``: the real token rows of
      each request (1, 2 for MTP verification, ``active_width`` for a target chunk);
    - ``request_ids``: the batch's request ids, in batch order.
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
    decode_seq: int = 1
    active_seq: int = 1
    request_ids: tuple[Any, ...] = ()

    def buffers(self) -> dict[str, torch.Tensor]:
        """The 7 tables and the :data:`INPUT_FIELDS` buffers, by name (not ``x_hc``)."""
        return {**self.tables, **{name: getattr(self, name) for name in INPUT_FIELDS}}

    def gather_rows(self, output: torch.Tensor, tokens: int | None = None) -> torch.Tensor:
        """A kernel output ``[R, T, ...]`` (``logits``, ``sampled_ids``, ``hidden_out``) in batch
        order: request ``i``'s rows start at token row ``local_rows[i] * decode_seq`` of rank
        ``ranks[i]`` (upstream: ``logits[rank, local_row]`` in ``_run_autoregressive_decode``,
        ``logits[rank, local_row * width : ... + real_width]`` in ``_verify_mtp_drafts``).

        ``tokens=None``: each request's first row, ``[A, ...]``; ``tokens=n`` (``1..decode_seq``,
        e.g. :attr:`active_seq`): its first ``n`` rows, ``[A, n, ...]``. Works on any device
        (the result is a new tensor there).

        Raises:
            ValueError: ``output`` not ``[R, T, ...]``, or ``tokens`` out of range.
        """
        R, T = self.input_ids.shape
        if output.ndim < 2 or tuple(output.shape[:2]) != (R, T):
            raise ValueError(
                f"kernel output must have shape [{R}, {T}, ...] (ranks, decode_tokens), got "
                f"{list(output.shape)}"
            )
        S = self.decode_seq
        ranks = torch.tensor(self.ranks, dtype=torch.long, device=output.device)
        rows = torch.tensor(self.local_rows, dtype=torch.long, device=output.device) * S
        if tokens is None:
            return output[ranks, rows]
        n = as_int(tokens, "tokens")
        if not 1 <= n <= S:
            raise ValueError(f"tokens must be in [1, {S}] (decode_seq), got {n}")
        offsets = torch.arange(n, dtype=torch.long, device=output.device)
        return output[ranks[:, None], rows[:, None] + offsets]


class _DynamicInputs:
    """A slot's buffers besides the tables: tokens, positions, KV lengths, owners, logits, x_hc."""

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        buffers: Mapping[str, torch.Tensor],
        hidden_size: int | None,
        share: bool,
    ) -> None:
        R, b, T, S = layout.ranks, layout.decode_batch, layout.decode_tokens, layout.decode_seq
        self.ranks = R
        self.input_ids = buffers["input_ids"]
        self.position_ids = buffers["position_ids"]
        self.kv_seq_lens = buffers["kv_seq_lens"]
        self.num_tokens_per_owner = buffers["num_tokens_per_owner"]
        self.logit_row_indices = buffers["logit_row_indices"]
        self.x_hc = (
            None
            if hidden_size is None
            else host_tensor((R, T, hidden_size), torch.float32, fill=0, share_memory=share)
        )
        self.input_np = self.input_ids.numpy().reshape(R * b, S)
        self.positions_np = self.position_ids.numpy().reshape(R * b, S)
        self.kv_np = self.kv_seq_lens.numpy().reshape(R * b)
        self.owner_key: tuple[tuple[int, ...], int] | None = None

    def write(
        self,
        assignment: Assignment,
        rows: _Rows,
        seq: npt.NDArray[np.int64],
        dirty: set[int] | None,
        owners: bool = True,
    ) -> None:
        """Stage one step (seed-semantics 6.5): every kernel row its request's token and position
        rows (padding rows: the rank's first request, or request 0); with ``owners``, also
        ``num_tokens_per_owner`` and the logit rows. ``dirty``: gets the ranks that changed."""
        source = assignment.source
        tokens = rows.tokens[source]
        positions = rows.positions[source]
        kv = seq[source]
        R = self.ranks
        if dirty is not None:
            changed = (
                (self.input_np != tokens).reshape(R, -1).any(axis=1)
                | (self.positions_np != positions).reshape(R, -1).any(axis=1)
                | (self.kv_np != kv).reshape(R, -1).any(axis=1)
            )
            dirty.update(np.flatnonzero(changed).tolist())
        self.input_np[...] = tokens
        self.positions_np[...] = positions
        self.kv_np[...] = kv
        key = (assignment.counts, rows.active_seq)
        if owners and self.owner_key != key:  # num_tokens_per_owner and logit rows: the counts
            active_seq = rows.active_seq
            logits = self.logit_row_indices.numpy()
            self.num_tokens_per_owner.numpy()[...] = np.array(assignment.counts) * active_seq
            logits[...] = -1
            for rank, count in enumerate(assignment.counts):
                logits[rank, : count * active_seq] = np.arange(count * active_seq)
            self.owner_key = key
            if dirty is not None:
                dirty.update(range(R))

    def write_x_hc(
        self, assignment: Assignment, hidden: torch.Tensor, previous: torch.Tensor | None
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


@dataclass(frozen=True)
class _Rows:
    """One step's dynamic rows per request: tokens and positions ``[A, S]``, the real rows."""

    tokens: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]
    active_seq: int


@dataclass(frozen=True)
class _Prepared:
    """What a slot's last prepare wrote, for :meth:`DeepSeekV4DecodePreparer.restage`."""

    mode: Mode
    request_ids: tuple[Any, ...]
    partitions: list[Any]
    assignment: Assignment
    inputs: DeepSeekV4DecodeInputs


class _Slot:
    """One buffer slot: its buffers by kernel argument name, its lock, what it holds."""

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        buffers: Mapping[str, torch.Tensor],
        hidden_size: int | None,
        share: bool,
    ) -> None:
        R, b = layout.ranks, layout.decode_batch
        self.buffers = dict(buffers)
        self.lock = threading.Lock()
        self.dynamic = _DynamicInputs(layout, buffers, hidden_size, share)
        self.tables = {group: buffers[argument] for group, argument in GROUP_ARGUMENTS.items()}
        self.flat_tables = {g: t.view(R * b, -1) for g, t in self.tables.items()}
        self.counts = buffers["block_counts"]
        self.prepared: _Prepared | None = None
        self.dirty: set[int] = set(range(R))


class DeepSeekV4DecodePreparer:
    """Prepares DeepSeek V4 decode steps into persistent, per-slot buffers.

    Args:
        layout: the deployment's shapes; its pool sizes may be unbound (``num_blocks=UNBOUND``):
            every buffer exists at once, :meth:`bind_num_blocks` binds the pool sizes later (as
            upstream allocates before the fork and sizes the KV pools after it).
        buffer_slots: independent buffer sets (2: upstream's ping-pong slots); preparing one never
            touches another, and a slot catches up on the changes prepared into the others.
        embedding: ``"device"`` (the kernel embeds ``input_ids``; hidden states may be ``None``)
            or ``"host"`` (upstream's PR #97 era: every consumer requires ``hidden_states`` and
            fills ``x_hc``).
        hidden_size: embedding width; required with ``embedding="host"``, not allowed otherwise.
        share_memory: allocate every buffer in shared memory, so that workers forked afterwards
            see every write (upstream's transport). Default ``True`` (when allocating).
        buffers: adopt upstream's own buffers instead of allocating: one mapping per slot, by
            kernel argument name (:data:`~blockprep.adapters.deepseek.abi.PREPARED_ARGUMENTS`:
            ``block_table``, ``hca_cmp_block_table``, ..., ``block_counts``, ``input_ids``, ...;
            other names, like a ``TaskArgs``' ``logits``, are ignored). Each must be a contiguous,
            writable CPU tensor of the recorded dtype and shape, not overlapping another; it is
            written in place and never replaced. Their content is taken as unknown: each slot's
            first prepare writes every byte. ``share_memory=True`` is refused with ``buffers``
            (a tensor moved to shared memory changes address).
        track_dirty_ranks: record per slot the ranks whose buffers a call wrote, for
            :meth:`take_dirty_ranks` (runtimes that upload changed rank shards).
        verify: slow checks for wiring blockprep into an engine, off by default. Before each
            prepare writes, the input contract of docs/api.md (a ring group holds at most its
            ring length of ids, a full-history group at least ``ceil(seq_len / 128)``: checks
            upstream did not make) raises ``ValueError`` naming the row, request, group and
            count, nothing written; after it writes, every buffer of the slot is compared with
            :func:`blockprep.reference.deepseek_v4_decode_rebuild` (and ``x_hc`` with
            :func:`~blockprep.reference.deepseek_v4_x_hc`) of the same step (delta steps: of the
            id lists the message makes, kept apart from the tables), raising
            :class:`~blockprep.block_table.StaleRowError` naming the first differing buffer,
            rank, row and column. :meth:`restage` is not verified.

    Threading contract (upstream's worker: a command thread prepares slot ``step % 2`` early while
    a device thread re-stages and dispatches the other):

    - each slot has one lock; :meth:`prepare`, :meth:`prepare_mtp`, :meth:`prepare_mtp_target`,
      :meth:`restage` and :meth:`invalidate` of a slot take it without waiting and raise
      :class:`SlotBusyError` when another thread holds it: a slot is never written by two
      threads at once, and a caller that collides learns it at once;
    - :meth:`restage` touches only its slot's tokens, positions and KV lengths (and ``x_hc``),
      never the tables or their shared planning state, so it runs alongside a prepare of another
      slot;
    - prepares of two different slots are serialised (the table planning state is shared: the
      second waits for the first);
    - :meth:`bind_num_blocks` and :meth:`reset` need every slot free (else :class:`SlotBusyError`);
    - the caller keeps a slot's buffers alive and unchanged until the kernel reading them
      completes: nothing here knows when a dispatch ends, so do not prepare or re-stage a slot
      whose dispatch is in flight (upstream releases a slot after its results are read).

    Every buffer is allocated (or adopted) here, once; its address never changes.
    """

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        *,
        buffer_slots: int = 2,
        embedding: Embedding = "device",
        hidden_size: int | None = None,
        share_memory: bool | None = None,
        buffers: Sequence[Mapping[str, torch.Tensor]] | None = None,
        track_dirty_ranks: bool = False,
        verify: bool = False,
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
        if buffers is not None and share_memory:
            raise ValueError(
                "share_memory applies only to allocated buffers; adopted buffers are used as "
                "they are (allocate them in shared memory before the fork)"
            )
        share = buffers is None if share_memory is None else bool(share_memory)
        self.layout = layout
        self.embedding: Embedding = embedding
        self.hidden_size = hidden_size
        self.share_memory = share
        self._track = bool(track_dirty_ranks)
        specs = deepseek_v4_prepared_arguments(layout)
        if buffers is None:
            slot_buffers = [
                {
                    name: host_tensor(
                        spec.shape,
                        spec.dtype,
                        fill=-1 if name == "logit_row_indices" else 0,
                        share_memory=share,
                    )
                    for name, spec in specs.items()
                }
                for _ in range(buffer_slots)
            ]
        else:
            slot_buffers = _adopted(buffers, specs, buffer_slots)
        self._slots = [_Slot(layout, b, hidden_size, share) for b in slot_buffers]
        self._plan_lock = threading.Lock()  # the tables' shared planning state
        self._group_ids = operator.itemgetter(*GROUP_NAMES)
        self._group_index = {name: gi for gi, name in enumerate(GROUP_NAMES)}
        self._tables: GroupedTables | None = None
        self._scratch: list[list[list[int]]] = []
        self._assignment: Assignment | None = None
        self._cursor = DeltaCursor()
        self.verify = bool(verify)
        self._verify_held: dict[Any, dict[str, list[int]]] = {}  # by request, as the steps made
        if layout.bound:
            self._bind(layout)

    @property
    def buffer_slots(self) -> int:
        return len(self._slots)

    @property
    def bound(self) -> bool:
        """Whether the pool sizes are bound (preparing needs them)."""
        return self._tables is not None

    def slot_buffers(self, buffer_slot: int) -> dict[str, torch.Tensor]:
        """``buffer_slot``'s prepared buffers by kernel argument name (the tensors themselves),
        in kernel order; they exist from construction on, bound or not."""
        buffers = self._slots[self._slot_number(buffer_slot)].buffers
        return {name: buffers[name] for name in PREPARED_ARGUMENTS}

    def bind_num_blocks(self, num_blocks: Mapping[str, int]) -> None:
        """Bind the KV pool sizes (group name -> scheduler-visible blocks per rank, every group
        named): the id limits and the scratch pages ``num_blocks + k`` of padding rows.

        Binding again (same sizes or not) invalidates every slot: each slot's next prepare
        rewrites every byte, and no slot can be re-staged before it is prepared again. The
        buffers stay the same tensors.

        Raises:
            ValueError, TypeError: the layout's checks on ``num_blocks``; nothing changes.
            SlotBusyError: a slot is being prepared or re-staged.
        """
        with self._all_slots("bind_num_blocks"):
            self._bind(self.layout.with_num_blocks(num_blocks))

    def _bind(self, layout: DeepSeekV4Layout) -> None:
        R, b = layout.ranks, layout.decode_batch
        groups = []
        for g in layout.groups:
            assert g.num_blocks is not None
            groups.append(TableGroup(g.name, g.kind, g.width, g.num_blocks, min_ids=1))
        self._tables = GroupedTables(
            groups,
            R * b,
            slots=len(self._slots),
            buffers=[(slot.flat_tables, slot.counts.view(R * b, -1)) for slot in self._slots],
            track_rows=self._track,
        )
        # Scratch rows: [num_blocks + k] for the k-th padding row of a rank; never mutated.
        self._scratch = [[[n + k] for k in range(b)] for n in layout.num_blocks.values()]
        self.layout = layout
        self._assignment = None
        self._cursor.last = None
        for slot in self._slots:
            slot.prepared = None
            slot.dynamic.owner_key = None

    def _grouped(self) -> GroupedTables:
        tables = self._tables
        if tables is None:
            raise RuntimeError(UNBOUND_MESSAGE)
        return tables

    def table_stats(self, buffer_slot: int) -> dict[str, BlockTableStats]:
        """Per group, ``buffer_slot``'s counters: ``hits`` rows a step left alone, ``misses`` rows
        it wrote (catching up on other slots' steps included), ``cells_written``. Binding the
        pool sizes starts them anew."""
        return self._grouped().stats(buffer_slot)

    def reset_stats(self) -> None:
        """Zero every slot's counters."""
        if self._tables is not None:
            self._tables.reset_stats()

    def dirty_ranks(self, buffer_slot: int) -> set[int]:
        """The ranks whose prepared buffers in ``buffer_slot`` were written since they were last
        taken (a copy; every rank at first). Needs ``track_dirty_ranks=True``.

        Raises:
            SlotBusyError: another thread holds ``buffer_slot``.
        """
        slot = self._slots[self._slot_number(buffer_slot)]
        with self._holding(slot, buffer_slot, "dirty_ranks"):
            return set(self._dirty(buffer_slot))

    def take_dirty_ranks(self, buffer_slot: int) -> set[int]:
        """:meth:`dirty_ranks`, and forget them (call after uploading those ranks' shards)."""
        slot = self._slots[self._slot_number(buffer_slot)]
        with self._holding(slot, buffer_slot, "take_dirty_ranks"):
            taken = self._dirty(buffer_slot)
            slot.dirty = set()
            return taken

    def _dirty(self, buffer_slot: int) -> set[int]:
        if not self._track:
            raise ValueError(
                "dirty ranks need DeepSeekV4DecodePreparer(..., track_dirty_ranks=True)"
            )
        number = self._slot_number(buffer_slot)
        slot = self._slots[number]
        if self._tables is not None:
            b = self.layout.decode_batch
            rows = self._tables.take_touched_rows(number)
            slot.dirty.update({row // b for row in rows})
        return slot.dirty

    def invalidate(self, buffer_slot: int | None = None) -> None:
        """Forget what ``buffer_slot``'s buffers (every slot's with ``None``) hold, for when
        anything else wrote them (upstream's recurrent MTP path writes slot 0's
        ``block_table``): its next step rewrites every table row and dynamic input, and it
        cannot be re-staged before it is prepared again.

        Raises:
            SlotBusyError: the slot (any slot, with ``None``) is being prepared or re-staged.
        """
        if buffer_slot is None:
            with self._all_slots("invalidate"):
                self._invalidate(None)
            return
        number = self._slot_number(buffer_slot)
        with self._holding(self._slots[number], number, "invalidate"), self._plan_lock:
            self._invalidate(number)

    def _invalidate(self, number: int | None) -> None:
        if self._tables is not None:
            self._tables.invalidate(number)
        for slot in self._slots if number is None else [self._slots[number]]:
            slot.dynamic.owner_key = None
            slot.prepared = None
            slot.dirty.update(range(self.layout.ranks))

    def reset(self) -> None:
        """Forget everything prepared: the next step writes every row of whichever slot."""
        with self._all_slots("reset"):
            if self._tables is not None:
                self._tables.reset()
            self._assignment = None
            self._cursor.last = None
            self._invalidate(None)

    # --- locks -----------------------------------------------------------------------------------

    def _slot_number(self, buffer_slot: object) -> int:
        number = buffer_slot if type(buffer_slot) is int else as_int(buffer_slot, "buffer_slot")
        if not 0 <= number < len(self._slots):
            raise ValueError(
                f"decode buffer_slot must be {self._slot_choices()}, got {buffer_slot}"
            )
        return number

    def _slot_choices(self) -> str:
        choices = [str(s) for s in range(len(self._slots))]
        return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]

    @contextmanager
    def _holding(self, slot: _Slot, number: object, what: str) -> Iterator[None]:
        if not slot.lock.acquire(blocking=False):
            raise SlotBusyError(as_int(number, "buffer_slot"), what)
        try:
            yield
        finally:
            slot.lock.release()

    @contextmanager
    def _preparing(self, buffer_slot: object, what: str) -> Iterator[None]:
        """A prepare: its slot's lock (when ``buffer_slot`` names one; otherwise the checks
        raise upstream's message in upstream's order), then the planning lock."""
        slot = None
        try:
            number = as_int(buffer_slot, "buffer_slot")
        except (TypeError, ValueError):
            number = -1  # not a slot: the checks raise upstream's message in upstream's order
        if 0 <= number < len(self._slots):
            slot = self._slots[number]
        with ExitStack() as stack:
            if slot is not None:
                stack.enter_context(self._holding(slot, number, what))
            stack.enter_context(self._plan_lock)
            yield

    @contextmanager
    def _all_slots(self, what: str) -> Iterator[None]:
        with ExitStack() as stack:
            for number, slot in enumerate(self._slots):
                stack.enter_context(self._holding(slot, number, what))
            stack.enter_context(self._plan_lock)
            yield

    # --- public entry points ---------------------------------------------------------------------

    def prepare(
        self, batch: DecodeBatch, *, buffer_slot: int = 0, early: bool = False
    ) -> DeepSeekV4DecodeInputs:
        """Write one standard (autoregressive) decode step into ``buffer_slot``'s buffers.

        Each request decodes ``token_ids[i]`` (``[A]``, or ``[A, k]``: column 0) at position
        ``seq_lens[i] - 1``, repeated over ``decode_seq``. Upstream's rules: rank from
        ``cache_partitions``, local row by order of arrival on the rank; padding rows get scratch
        pages and block count 1; their dynamic inputs copy the rank's first request (global
        request 0 on an empty rank).

        ``early=True``: upstream's ``prepare_decode`` (``decode.prepare_early``, run on the
        command thread while the device runs the previous step, before the previous step's token
        is known): placeholder tokens and positions (all 0), ``kv_seq_lens`` from the batch,
        every table and ``block_counts`` as usual, and upstream's early rule: at most one request
        per rank, whatever ``decode_seq`` (``"DeepSeekV4 non-MTP decode supports at most one
        request per DP rank"``). Then :meth:`restage` the real tokens before dispatching.
        Needs ``embedding="device"``; ``token_ids`` are not read.

        Raises:
            ValueError: upstream's messages (seed-semantics 3, 6), first the hidden-state check of
                ``embedding="host"``; hidden states that cannot be copied to the host; nothing is
                written.
            TypeError: non-integer tokens, lengths or partitions; block ids against the id rule
                (:mod:`blockprep.grouped`).
            RuntimeError: the pool sizes are not bound (:meth:`bind_num_blocks`).
            SlotBusyError: another thread holds ``buffer_slot``.
        """
        with self._preparing(buffer_slot, "prepare"):
            self._grouped()
            if early:
                self._early_device_only()
            elif self.embedding == "host" and batch.hidden_states is None:
                raise ValueError(HOST_HIDDEN_MESSAGE)
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            if early and max(assignment.counts) > 1:
                raise ValueError(
                    "DeepSeekV4 non-MTP decode supports at most one request per DP rank"
                )
            A = len(assignment.ranks)
            seq = self._seq_lens(batch, A)
            if early:
                rows, hidden = self._placeholder(A, 1), None
            else:
                self._one_per_rank(assignment)
                rows = self._decode_rows(batch, seq, A)
                hidden = self._hidden(batch, A, mtp=False)
            return self._stage(
                batch, assignment, buffer_slot, seq, rows, hidden, "decode", early=early
            )

    def prepare_mtp(
        self, batch: DecodeBatch, *, buffer_slot: int = 0, early: bool = False
    ) -> DeepSeekV4DecodeInputs:
        """Write one MTP verification step (``decode_seq == 2``) into ``buffer_slot``'s buffers.

        Each request's token rows are ``[prev_token_ids[i], token_ids[i]]`` at positions
        ``(seq_len - 2, seq_len - 1)``; every rank may hold up to ``decode_batch`` requests and
        ``num_tokens_per_owner`` counts two rows per request. Padding as :meth:`prepare`.

        ``early=True``: upstream's fused K=1 ``prepare_decode``: placeholder tokens and
        positions (all 0; the fused kernel substitutes the active rows from device state, or
        :meth:`restage` writes them), two logit rows per request, ``kv_seq_lens`` from the
        batch; ``prev_token_ids`` and ``token_ids`` are not read. Needs ``embedding="device"``.

        Raises:
            ValueError: ``"DeepSeek V4 decode requires host hidden states"`` (``embedding=
                "host"``, first), ``"DeepSeekV4 MTP decode requires previous token IDs and
                embeddings"`` (``prev_token_ids`` missing, or with ``embedding="host"``
                ``prev_hidden_states``), ``"DeepSeekV4 MTP verification requires
                decode_seq=2"``, ``"decode seq_lens must be >= MTP sequence width (2), got
                {s}"``, ``"MTP previous embeddings must align with draft embeddings"``, and those
                of :meth:`prepare`; nothing is written.
        """
        with self._preparing(buffer_slot, "prepare_mtp"):
            self._grouped()
            if early:
                self._early_device_only()
            else:
                self._mtp_inputs_present(batch)
            layout = self.layout
            if layout.decode_seq != 2:
                raise ValueError("DeepSeekV4 MTP verification requires decode_seq=2")
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            A = len(assignment.ranks)
            seq = self._seq_lens(batch, A)
            if early:
                rows, hidden = self._placeholder(A, 2), None
            else:
                rows = self._mtp_rows(batch, seq, A)
                hidden = self._hidden(batch, A, mtp=True)
            return self._stage(
                batch, assignment, buffer_slot, seq, rows, hidden, "mtp", early=early
            )

    def prepare_mtp_target(
        self,
        batch: DecodeBatch,
        *,
        token_rows: torch.Tensor | Sequence[Sequence[int]],
        positions: Sequence[Sequence[int]] | torch.Tensor,
        active_width: int,
        buffer_slot: int = 0,
    ) -> DeepSeekV4DecodeInputs:
        """Write one fixed-width MTP target-verification chunk (upstream's
        ``prepare_mtp_target_inputs``, npu_runner.py at ``9b1a264``): the layouts of MTP depth
        ``k >= 2`` (``b=4, S=4``; ``b=2, S=8``), and any ``decode_seq``.

        ``token_rows [A, S]``: each request's ``S`` token rows (upstream: the current token and
        drafts, the last real one repeated past ``active_width``); ``positions [A][S]``: their
        positions; ``active_width`` (``1..S``): the real rows per request, so
        ``num_tokens_per_owner = count * active_width`` and the logit rows ``0..count *
        active_width - 1``. ``kv_seq_lens`` are the batch's ``seq_lens`` (upstream passes
        ``base + offset + real_width - 1``).

        Raises:
            ValueError: upstream's messages, in upstream's order: ``"MTP target token rows must
                have shape (A, S), got ..."``, ``"MTP target active width must fit the fixed
                decode sequence"``, ``"MTP target positions must align with the fixed decode
                sequence"``, the assignment's, ``"partial MTP target chunks require at most one
                request per rank"``, then those of :meth:`prepare`; ``embedding="host"`` (upstream
                embeds target chunks on the device).
            TypeError: non-integer token rows or positions, and as :meth:`prepare`.
        """
        with self._preparing(buffer_slot, "prepare_mtp_target"):
            self._grouped()
            if self.embedding == "host":
                raise ValueError('prepare_mtp_target needs embedding="device"')
            A = len(batch.request_ids)
            rows = self._target_rows(token_rows, positions, active_width, A)
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            if rows.active_seq < self.layout.decode_seq and max(assignment.counts) > 1:
                raise ValueError("partial MTP target chunks require at most one request per rank")
            seq = self._seq_lens(batch, A)
            return self._stage(batch, assignment, buffer_slot, seq, rows, None, "target")

    def restage(
        self,
        batch: DecodeBatch,
        *,
        buffer_slot: int,
        token_rows: torch.Tensor | Sequence[Sequence[int]] | None = None,
        positions: Sequence[Sequence[int]] | torch.Tensor | None = None,
    ) -> DeepSeekV4DecodeInputs:
        """Re-stage ``buffer_slot``'s tokens, positions and KV lengths for the step it holds
        (upstream's ``_stage_decode_dynamic_inputs`` on the device thread, after an early
        prepare): writes ``input_ids``, ``position_ids``, ``kv_seq_lens`` (and ``x_hc`` with
        ``embedding="host"``) only, by the rules of the call that prepared the slot
        (:meth:`prepare`: the token at ``seq_len - 1``; :meth:`prepare_mtp`: ``[prev, current]``
        at ``(seq_len - 2, seq_len - 1)``; :meth:`prepare_mtp_target`: ``token_rows`` and
        ``positions``, required here, with the prepared ``active_width``). Tables,
        ``block_counts``, ``num_tokens_per_owner`` and ``logit_row_indices`` are left as they are;
        the batch's block ids are not read. Safe while another slot is being prepared.

        ``batch`` must hold the same requests in the same order on the same cache partitions as
        the slot's last prepare.

        Returns the slot's inputs (the same views the prepare returned).

        Raises:
            ValueError: ``"prepared decode request order changed before execution"``, ``"prepared
                decode cache partitions changed before execution"`` (upstream's), the checks of
                the preparing call on tokens, lengths and positions; a bad ``buffer_slot``.
                Nothing is written.
            RuntimeError: the slot holds no prepared step (never prepared, or invalidated or
                re-bound since).
            SlotBusyError: another thread holds ``buffer_slot``.
        """
        number = self._slot_number(buffer_slot)
        slot = self._slots[number]
        with self._holding(slot, number, "restage"):
            prepared = slot.prepared
            if prepared is None:
                raise RuntimeError(
                    f"DeepSeekV4 decode buffer slot {number} holds no prepared step to re-stage "
                    "(prepare it first; binding the pool sizes or invalidating forgets it)"
                )
            if tuple(batch.request_ids) != prepared.request_ids:
                raise ValueError(REQUEST_ORDER_MESSAGE)
            if list(batch.cache_partitions) != prepared.partitions:
                raise ValueError(PARTITIONS_MESSAGE)
            assignment = prepared.assignment
            A = len(assignment.ranks)
            seq = self._seq_lens(batch, A)
            hidden = None
            if prepared.mode == "target":
                if token_rows is None or positions is None:
                    raise ValueError(
                        "a slot prepared by prepare_mtp_target is re-staged with token_rows and "
                        "positions"
                    )
                rows = self._target_rows(token_rows, positions, prepared.inputs.active_seq, A)
            elif token_rows is not None or positions is not None:
                raise ValueError(
                    "token_rows and positions apply only to a slot prepared by prepare_mtp_target"
                )
            elif prepared.mode == "mtp":
                self._mtp_inputs_present(batch)
                rows = self._mtp_rows(batch, seq, A)
                hidden = self._hidden(batch, A, mtp=True)
            else:
                if self.embedding == "host" and batch.hidden_states is None:
                    raise ValueError(HOST_HIDDEN_MESSAGE)
                rows = self._decode_rows(batch, seq, A)
                hidden = self._hidden(batch, A, mtp=False)
            self._check_position(batch, rows)
            dirty = slot.dirty if self._track else None
            slot.dynamic.write(assignment, rows, seq, dirty, owners=False)
            if hidden is not None:
                slot.dynamic.write_x_hc(assignment, *hidden)
            return prepared.inputs

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
        A batch carrying ``block_deltas`` gives one carrying a message that changes nothing and
        builds on it (prepare ``batch`` first).

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
        drafts = integer_tensor(draft_token_ids, "draft_token_ids").reshape(-1)
        if drafts.numel() != A:
            raise ValueError(f"draft_token_ids must have {A} entries, got {drafts.numel()}")
        _integer_array(drafts, "draft_token_ids")  # uint64 above int64 would wrap
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
            block_deltas=_unchanged(batch.block_deltas),
        )

    # --- one step: check, plan, then write -------------------------------------------------------

    def _stage(
        self,
        batch: DecodeBatch,
        assignment: Assignment,
        buffer_slot: int,
        seq: npt.NDArray[np.int64],
        rows: _Rows,
        hidden: tuple[torch.Tensor, torch.Tensor | None] | None,
        mode: Mode,
        *,
        early: bool = False,
    ) -> DeepSeekV4DecodeInputs:
        """Check the block ids, plan the tables, then write the slot (nothing after the plan
        can raise, but verify mode's comparison). The caller holds the slot's lock and the
        planning lock."""
        number = self._checked_slot(batch, rows, buffer_slot)
        tables = self._grouped()
        if batch.block_deltas is None:
            step, applied = self._plan_tables(batch, assignment), None
        else:
            step, applied = self._plan_deltas(batch.block_deltas, batch, assignment)
        groups = None
        if self.verify:  # the lists this step makes, checked against the layout before writing
            groups = self._verify_lists(batch)
            self._check_contract(batch, groups, seq)
        tables.commit(step, number)
        self._cursor.last = applied
        slot = self._slots[number]
        dynamic = slot.dynamic
        dynamic.write(assignment, rows, seq, slot.dirty if self._track else None)
        if hidden is not None:
            dynamic.write_x_hc(assignment, *hidden)
        inputs = DeepSeekV4DecodeInputs(
            tables=MappingProxyType(slot.tables),
            block_counts=slot.counts,
            input_ids=dynamic.input_ids,
            position_ids=dynamic.position_ids,
            kv_seq_lens=dynamic.kv_seq_lens,
            num_tokens_per_owner=dynamic.num_tokens_per_owner,
            logit_row_indices=dynamic.logit_row_indices,
            x_hc=dynamic.x_hc,
            ranks=assignment.ranks,
            local_rows=assignment.local_rows,
            buffer_slot=number,
            decode_seq=self.layout.decode_seq,
            active_seq=rows.active_seq,
            request_ids=tuple(assignment.request_ids),
        )
        slot.prepared = _Prepared(
            mode, tuple(assignment.request_ids), list(assignment.partitions), assignment, inputs
        )
        if groups is not None:
            self._verify_held = dict(zip(batch.request_ids, groups, strict=True))
            self._verify_slot(inputs, batch, groups, seq, rows, hidden, mode, early)
        return inputs

    # --- verify mode -----------------------------------------------------------------------------

    def _verify_lists(self, batch: DecodeBatch) -> list[dict[str, list[int]]]:
        """Each request's ids per group as this (planned, valid) step makes them: the batch's,
        or the message's ops applied to what the verifier kept of the steps before."""
        message = batch.block_deltas
        if message is None:
            return [
                {name: [int(x) for x in row[name]] for name in GROUP_NAMES}
                for row in batch.block_ids_by_group
            ]
        held = {} if message.get("base") is None else self._verify_held
        ops_by_request = message.get("rows") or {}
        lists = []
        for request in batch.request_ids:
            groups = dict(held.get(request, {}))
            for name, ops in ops_by_request.get(request, {}).items():
                groups[name] = [int(x) for x in apply_ops(ops, groups.get(name))]
            lists.append(groups)
        return lists

    def _check_contract(
        self, batch: DecodeBatch, groups: list[dict[str, list[int]]], seq: npt.NDArray[np.int64]
    ) -> None:
        """The input contract (docs/api.md): rings hold at most their ring length of ids,
        full-history groups at least ``ceil(seq_len / 128)``. Upstream checked neither."""
        for q, (row, seq_len) in enumerate(zip(groups, seq.tolist(), strict=True)):
            for group in self.layout.groups:
                n = len(row[group.name])
                where = f"decode row {q} (request {batch.request_ids[q]!r}) group {group.name}"
                if group.kind == "ring" and n > group.ids_per_request:
                    raise ValueError(
                        f"DeepSeekV4 input contract: {where} holds {n} block IDs, more than its "
                        f"ring length {group.ids_per_request}"
                    )
                need = -(-seq_len // group.block_tokens)
                if group.kind == "paged" and n < need:
                    raise ValueError(
                        f"DeepSeekV4 input contract: {where} holds {n} block IDs, fewer than "
                        f"seq_len {seq_len} needs (ceil({seq_len} / {group.block_tokens}) = "
                        f"{need})"
                    )

    def _verify_slot(
        self,
        inputs: DeepSeekV4DecodeInputs,
        batch: DecodeBatch,
        groups: list[dict[str, list[int]]],
        seq: npt.NDArray[np.int64],
        rows: _Rows,
        hidden: tuple[torch.Tensor, torch.Tensor | None] | None,
        mode: Mode,
        early: bool,
    ) -> None:
        """Every buffer of the slot against upstream's full rebuild of the same step."""
        from blockprep.reference import deepseek_v4_decode_rebuild, deepseek_v4_x_hc

        layout = self.layout
        A = len(groups)
        explicit = early or mode == "target"  # the call's rows, not the batch's tokens
        exact = DecodeBatch(
            request_ids=list(batch.request_ids),
            token_ids=torch.zeros(A, dtype=torch.int64) if explicit else batch.token_ids,
            hidden_states=batch.hidden_states,
            seq_lens=torch.tensor(seq.tolist(), dtype=torch.int64),
            block_ids_by_group=groups,
            cache_partitions=list(inputs.ranks),
            prev_token_ids=batch.prev_token_ids,
            prev_hidden_states=batch.prev_hidden_states,
        )
        expected = deepseek_v4_decode_rebuild(
            exact,
            ranks=layout.ranks,
            decode_batch=layout.decode_batch,
            decode_seq=layout.decode_seq,
            num_blocks=layout.num_blocks,
            mtp=mode == "mtp",
            fix=True,
            token_rows=rows.tokens.tolist() if explicit else None,
            positions=rows.positions.tolist() if explicit else None,
            active_seq=rows.active_seq if explicit else None,
        )
        got = inputs.buffers()
        if hidden is not None and inputs.x_hc is not None:
            got["x_hc"] = inputs.x_hc
            expected["x_hc"] = deepseek_v4_x_hc(
                exact,
                ranks=layout.ranks,
                decode_batch=layout.decode_batch,
                decode_seq=layout.decode_seq,
                mtp=mode == "mtp",
            )
        for name, tensor in got.items():
            check_buffer(
                f"DeepSeekV4 decode (slot {inputs.buffer_slot})",
                name,
                tensor,
                expected[name],
                _place(name),
            )

    def _plan_tables(self, batch: DecodeBatch, assignment: Assignment) -> GroupedStep:
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
            return self._grouped().plan(
                columns, assignment.occupants, lambda r: f"decode row {perm[r]}"
            )
        except (KeyError, TypeError, BlockIdValueError) as error:
            # the id rule, or a row that is no mapping, a group missing: upstream's error first
            _raise_first(upstream_error(self.layout, batch, assignment))
            raise error from None

    def _plan_deltas(
        self, message: object, batch: DecodeBatch, assignment: Assignment
    ) -> tuple[GroupedStep, int]:
        """Plan the tables from a :mod:`blockprep.wire` message (``{request: {group: ops}}``)
        on what they hold: the step costs what changed. Returns the step and the message's
        number."""
        seq, rows = self._cursor.check(message)
        if batch.block_ids_by_group:
            raise ValueError(
                "a DeepSeekV4 batch carries block_ids_by_group or block_deltas, not both"
            )
        changes: list[dict[int, Any]] = [{} for _ in GROUP_NAMES]
        if rows:
            row_of, group_index = assignment.row_of, self._group_index
            for request, groups in rows.items():
                row = row_of.get(request)
                if row is None:
                    raise DeltaMessageError(
                        f"block delta ops for request {request!r}, which is not in the batch"
                    )
                if type(groups) is not dict and not isinstance(groups, Mapping):
                    raise DeltaMessageError(
                        f"request {request!r}: block delta ops must be a dict by group, got "
                        f"{type(groups).__name__}"
                    )
                for name, ops in groups.items():
                    gi = group_index.get(name)
                    if gi is None:
                        raise DeltaMessageError(
                            f"request {request!r}: unknown group {name!r}; the groups are "
                            f"{list(GROUP_NAMES)}"
                        )
                    changes[gi][row] = ops
        perm, scratch = assignment.perm, self._scratch
        A = len(assignment.ranks)

        def padding(group: int, row: int) -> list[int]:
            return scratch[group][perm[row] - A]

        step = self._grouped().plan_deltas(
            changes,
            assignment.occupants,
            padding,
            lambda r: f"decode row {perm[r]}",
            whole=isinstance(message, Mapping) and message.get("base") is None,
        )
        return step, seq

    def _seq_lens(self, batch: DecodeBatch, A: int) -> npt.NDArray[np.int64]:
        seq = _integer_array(batch.seq_lens, "seq_lens")
        if seq.shape != (A,):
            raise ValueError(f"decode seq_lens must have shape [{A}], got {list(seq.shape)}")
        return seq

    def _one_per_rank(self, assignment: Assignment) -> None:
        if self.layout.decode_seq != 1 and max(assignment.counts) > 1:
            raise ValueError(
                "DeepSeekV4 non-MTP decode supports at most one request per DP rank; the fixed "
                "S=2 kernel can expose only one cache-safe active token per rank"
            )

    def _early_device_only(self) -> None:
        if self.embedding == "host":
            raise ValueError(
                'early prepare (placeholder tokens) needs embedding="device": host embeddings '
                "of unknown tokens cannot be staged"
            )

    def _mtp_inputs_present(self, batch: DecodeBatch) -> None:
        if self.embedding == "host":
            if batch.hidden_states is None:
                raise ValueError(HOST_HIDDEN_MESSAGE)
            if batch.prev_token_ids is None or batch.prev_hidden_states is None:
                raise ValueError(MTP_PREVIOUS_MESSAGE)
        elif batch.prev_token_ids is None:
            raise ValueError(MTP_PREVIOUS_MESSAGE)

    def _placeholder(self, A: int, active_seq: int) -> _Rows:
        """Upstream's early rows: tokens and positions all 0."""
        zeros = np.zeros((A, self.layout.decode_seq), dtype=np.int64)
        return _Rows(zeros, zeros, active_seq)

    def _decode_rows(self, batch: DecodeBatch, seq: npt.NDArray[np.int64], A: int) -> _Rows:
        """The standard step: ``token_ids[i]`` at ``seq_len - 1``, over ``decode_seq``."""
        if int(seq.min()) < 1:
            raise ValueError("decode seq_lens must be positive")
        tokens = self._tokens(batch.token_ids, A, "token_ids")
        S = self.layout.decode_seq
        return _Rows(
            np.repeat(tokens[:, None], S, axis=1), np.repeat((seq - 1)[:, None], S, axis=1), 1
        )

    def _mtp_rows(self, batch: DecodeBatch, seq: npt.NDArray[np.int64], A: int) -> _Rows:
        """MTP verification: ``[prev, current]`` at ``(seq_len - 2, seq_len - 1)``."""
        shortest = int(seq.min())
        if shortest < self.layout.decode_seq:
            raise ValueError(
                f"decode seq_lens must be >= MTP sequence width ({self.layout.decode_seq}), "
                f"got {shortest}"
            )
        previous = self._tokens(batch.prev_token_ids, A, "prev_token_ids")
        tokens = self._tokens(batch.token_ids, A, "token_ids")
        return _Rows(np.stack([previous, tokens], axis=1), np.stack([seq - 2, seq - 1], axis=1), 2)

    def _target_rows(
        self, token_rows: object, positions: object, active_width: object, A: int
    ) -> _Rows:
        """Upstream's ``prepare_mtp_target_inputs`` checks, in its order."""
        S = self.layout.decode_seq
        tokens = _integer_array(token_rows, "MTP target token rows")
        if tokens.shape != (A, S):
            raise ValueError(
                f"MTP target token rows must have shape {(A, S)}, got {tuple(tokens.shape)}"
            )
        width = as_int(active_width, "active_width")
        if not 1 <= width <= S:
            raise ValueError("MTP target active width must fit the fixed decode sequence")
        if isinstance(positions, (torch.Tensor, np.ndarray)):
            places = _integer_array(positions, "MTP target positions")
            aligned = places.shape == (A, S)
        else:
            if not isinstance(positions, Sequence):
                raise TypeError("MTP target positions must be a sequence of position rows")
            aligned = len(positions) == A and all(
                isinstance(row, (Sequence, np.ndarray, torch.Tensor)) and len(row) == S
                for row in positions
            )
            places = (
                _integer_array([list(row) for row in positions], "MTP target positions")
                if aligned and A
                else np.zeros((A, S), dtype=np.int64)
            )
        if not aligned:
            raise ValueError("MTP target positions must align with the fixed decode sequence")
        return _Rows(tokens, places.reshape(A, S), width)

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

    def _check_position(self, batch: DecodeBatch, rows: _Rows) -> None:
        position = int(rows.positions.max()) if rows.positions.size else 0
        if position >= self.layout.max_seq_len:
            _raise_first(normalization_error(batch))
            raise ValueError(
                f"decode position {position} exceeds max_seq_len={self.layout.max_seq_len}"
            )

    def _checked_slot(self, batch: DecodeBatch, rows: _Rows, buffer_slot: int) -> int:
        """Upstream's order: grouped-id shape, the position limit, then the buffer slot."""
        A = len(batch.request_ids)
        grouped = batch.block_ids_by_group
        if batch.block_deltas is None:
            if not grouped:
                raise ValueError("DeepSeekV4 requires grouped KV block IDs")
            if len(grouped) != A:
                raise ValueError(
                    f"grouped KV metadata has {len(grouped)} rows, expected decode batch {A}"
                )
        self._check_position(batch, rows)
        try:
            return self._slot_number(buffer_slot)
        except ValueError:
            _raise_first(normalization_error(batch))
            raise


_PLACES = {
    "kv_seq_lens": ("rank", "row"),
    "input_ids": ("rank", "token row"),
    "position_ids": ("rank", "token row"),
    "logit_row_indices": ("rank", "token row"),
    "num_tokens_per_owner": ("rank",),
    "x_hc": ("rank", "token row", "column"),
}


def _place(name: str) -> Callable[[tuple[int, ...]], str]:
    """Names an index of slot buffer ``name``: ``rank r, row l, column c`` of a table or
    ``block_counts``, ``rank r, token row t`` of the token rows, ``rank r, row l`` of
    ``kv_seq_lens``."""
    parts = _PLACES.get(name, ("rank", "row", "column"))

    def place(index: tuple[int, ...]) -> str:
        return ", ".join(f"{part} {i}" for part, i in zip(parts, index, strict=False))

    return place


def _adopted(
    buffers: Sequence[Mapping[str, torch.Tensor]],
    specs: Mapping[str, Any],
    slots: int,
) -> list[dict[str, torch.Tensor]]:
    """Upstream's buffers, checked: per slot, every prepared argument by name, a contiguous,
    writable CPU tensor of the recorded dtype and shape; no two overlapping."""
    if isinstance(buffers, Mapping) or not isinstance(buffers, Sequence):
        raise TypeError("buffers must be a sequence of mappings, one per buffer slot")
    if len(buffers) != slots:
        raise ValueError(f"buffers must hold {slots} buffer slots, got {len(buffers)}")
    adopted = []
    spans: list[tuple[int, int, str]] = []
    for s, given in enumerate(buffers):
        if not isinstance(given, Mapping):
            raise TypeError(f"buffers[{s}] must map kernel argument names to tensors")
        missing = [name for name in PREPARED_ARGUMENTS if name not in given]
        if missing:
            raise ValueError(f"buffers[{s}] is missing {', '.join(missing)}")
        slot = {}
        for name in PREPARED_ARGUMENTS:
            tensor, where = given[name], f"buffers[{s}][{name!r}]"
            specs[name].check(tensor, where)  # a tensor of the recorded dtype and shape
            if tensor.device.type != "cpu":
                raise ValueError(f"{where} must be a CPU tensor, got one on {tensor.device}")
            if not tensor.is_contiguous():
                raise ValueError(f"{where} must be contiguous")
            if tensor.requires_grad:
                raise ValueError(f"{where} must not require grad")
            check_writable(tensor, where)
            start = tensor.data_ptr()
            spans.append((start, start + tensor.numel() * tensor.element_size(), where))
            slot[name] = tensor
        adopted.append(slot)
    spans.sort()
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise ValueError(f"{second} overlaps {first}: every buffer needs its own memory")
    return adopted


def _unchanged(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message saying that nothing changed since ``message`` (``None`` for ``None``)."""
    if message is None:
        return None
    seq = message.get("seq")
    return {"seq": seq, "base": seq, "rows": {}}


def _host_float(states: torch.Tensor, name: str) -> torch.Tensor:
    """``states`` as a float32 CPU tensor; ``ValueError`` when it cannot be copied there."""
    try:
        return states.detach().to("cpu", torch.float32)
    except (RuntimeError, NotImplementedError) as error:
        raise ValueError(f"{name} cannot be copied to the host: {error}") from None


def _integer_array(values: object, name: str) -> npt.NDArray[np.int64]:
    """An integer tensor (or array, or list) as an int64 NumPy array; ``TypeError`` otherwise."""
    if values is None:
        raise ValueError(f"decode {name} are missing")
    array = values if isinstance(values, torch.Tensor) else np.asarray(values)
    if not has_integer_dtype(array):
        raise TypeError(f"decode {name} must be integers, got dtype {array.dtype}")
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size:
        flat = array.reshape(-1)
        over = np.flatnonzero(flat > np.uint64(INT64_MAX))
        if over.size:  # astype would wrap them to negative ids
            where = np.unravel_index(int(over[0]), array.shape)
            row = int(where[0]) if where else 0
            raise ValueError(
                f"decode {name} must fit int64: row {row} holds {int(flat[over[0]])}, above "
                f"{INT64_MAX}"
            )
    return array.astype(np.int64, copy=False)


def _raise_first(error: Exception | None) -> None:
    if error is not None:
        raise error
