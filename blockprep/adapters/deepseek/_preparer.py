"""The DeepSeek V4 decode preparer: per buffer slot, the 7 tables (a :class:`~blockprep.grouped.
GroupedTables` over ``ranks * decode_batch`` rows), ``block_counts`` and the dynamic inputs, in
buffers named as upstream's kernel arguments (allocated here, or adopted).

A step runs upstream's checks in upstream's order, plans the tables (the id rule and every
change decided before any write), copies hidden states to the host, then writes; nothing after
the plan can raise. Padding rows hold the scratch pages ``num_blocks + k``.

The pieces live beside it: ``inputs`` (the record a step returns), ``rows`` (a step's token and
position rows, lengths and hidden states, with upstream's checks), ``dynamic`` (the writes of the
buffers besides the tables), ``lifecycle`` (slots, buffers, locks, what a slot holds),
``tables`` (binding and planning the tables), ``verify`` (verify mode) and ``mtp``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep import forks, log
from blockprep._ids import as_int
from blockprep.adapters.deepseek._assignment import Assignment, assign
from blockprep.adapters.deepseek._checks import normalization_error, raise_first
from blockprep.adapters.deepseek._inputs import DeepSeekV4DecodeInputs
from blockprep.adapters.deepseek._lifecycle import (
    PARTITIONS_MESSAGE,
    REQUEST_ORDER_MESSAGE,
    Slot,
    SlotBusyError,
    adopted,
    all_slots,
    allocated,
    claim_inputs,
    holding,
    prepared_step,
    preparing,
    slot_number,
)
from blockprep.adapters.deepseek._mtp import speculative_batch
from blockprep.adapters.deepseek._rows import (
    HOST_HIDDEN_MESSAGE,
    MTP_PREVIOUS_MESSAGE,
    Hidden,
    Mode,
    StepRows,
    check_position,
    checked_seq_lens,
    decode_rows,
    early_device_only,
    host_hidden,
    mtp_inputs_present,
    mtp_rows,
    one_per_rank,
    placeholder,
    target_rows,
)
from blockprep.adapters.deepseek._tables import (
    NO_SCRATCH,
    Scratch,
    bind_tables,
    plan_deltas,
    plan_tables,
)
from blockprep.adapters.deepseek._verify import check_contract, verify_lists, verify_slot
from blockprep.adapters.deepseek.abi import PREPARED_ARGUMENTS, deepseek_v4_prepared_arguments
from blockprep.adapters.deepseek.layout import UNBOUND_MESSAGE, DeepSeekV4Layout
from blockprep.batch import DecodeBatch, as_decode_batch
from blockprep.block_table import BlockTableStats
from blockprep.buffers import release_buffers
from blockprep.errors import BlockprepRuntimeError, BlockprepTypeError, BlockprepValueError
from blockprep.grouped import GroupedTables
from blockprep.wire import DeltaCursor

__all__ = [
    "HOST_HIDDEN_MESSAGE",
    "MTP_PREVIOUS_MESSAGE",
    "PARTITIONS_MESSAGE",
    "REQUEST_ORDER_MESSAGE",
    "DeepSeekV4DecodeInputs",
    "DeepSeekV4DecodePreparer",
    "Embedding",
    "SlotBusyError",
]

Embedding = Literal["device", "host"]


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
            raise BlockprepTypeError(
                f"layout must be a DeepSeekV4Layout, got {type(layout).__name__}"
            )
        buffer_slots = as_int(buffer_slots, "buffer_slots")
        if buffer_slots <= 0:
            raise BlockprepValueError(f"buffer_slots must be positive, got {buffer_slots}")
        if embedding not in ("device", "host"):
            raise BlockprepValueError(f"embedding must be 'device' or 'host', got {embedding!r}")
        if embedding == "host":
            if hidden_size is None:
                raise BlockprepValueError('embedding="host" requires hidden_size')
            hidden_size = as_int(hidden_size, "hidden_size")
            if hidden_size <= 0:
                raise BlockprepValueError(f"hidden_size must be positive, got {hidden_size}")
        elif hidden_size is not None:
            raise BlockprepValueError('hidden_size applies only to embedding="host"')
        if buffers is not None and share_memory:
            raise BlockprepValueError(
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
            slot_buffers = allocated(specs, buffer_slots, share)
        else:
            slot_buffers = adopted(buffers, specs, buffer_slots)
        claim_inputs(self, slot_buffers)
        self._slots = [Slot(layout, b, hidden_size, share) for b in slot_buffers]
        self._plan_lock = threading.Lock()  # the tables' shared planning state
        self._tables: GroupedTables | None = None
        self._scratch: Scratch = NO_SCRATCH
        self._assignment: Assignment | None = None
        self._cursor = DeltaCursor()
        self.verify = bool(verify)
        self._verify_held: dict[Any, dict[str, list[int]]] = {}  # by request, as the steps made
        self._verify_slots: dict[int, list[dict[str, list[int]]]] = {}  # by slot, for restage
        if layout.bound:
            self._bind(layout)
        forks.register(self)

    def _after_fork(self) -> None:
        """In a forked child (:mod:`blockprep.forks`): new locks; when a thread held one at
        the fork (a step half done), forget everything prepared, as :meth:`reset` does."""
        held = self._plan_lock.locked() or any(slot.lock.locked() for slot in self._slots)
        self._plan_lock = threading.Lock()
        for slot in self._slots:
            slot.lock = threading.Lock()
        if held:
            if self._tables is not None:
                self._tables.reset()
            self._assignment = None
            self._cursor.last = None
            self._invalidate(None)

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
        with all_slots(self._slots, self._plan_lock, "bind_num_blocks"):
            self._bind(self.layout.with_num_blocks(num_blocks))

    def _bind(self, layout: DeepSeekV4Layout) -> None:
        if self._tables is not None:  # the new tables own the same buffers
            release_buffers(self._tables)
        self._tables, self._scratch = bind_tables(layout, self._slots, self._track)
        self.layout = layout
        self._assignment = None
        self._cursor.last = None
        for slot in self._slots:
            slot.prepared = None
            slot.dynamic.owner_key = None

    def _grouped(self) -> GroupedTables:
        tables = self._tables
        if tables is None:
            raise BlockprepRuntimeError(UNBOUND_MESSAGE)
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
        with holding(slot, buffer_slot, "dirty_ranks"):
            return set(self._dirty(buffer_slot))

    def take_dirty_ranks(self, buffer_slot: int) -> set[int]:
        """:meth:`dirty_ranks`, and forget them (call after uploading those ranks' shards)."""
        slot = self._slots[self._slot_number(buffer_slot)]
        with holding(slot, buffer_slot, "take_dirty_ranks"):
            taken = self._dirty(buffer_slot)
            slot.dirty = set()
            return taken

    def _dirty(self, buffer_slot: int) -> set[int]:
        if not self._track:
            raise BlockprepValueError(
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
            with all_slots(self._slots, self._plan_lock, "invalidate"):
                self._invalidate(None)
            return
        number = self._slot_number(buffer_slot)
        with holding(self._slots[number], number, "invalidate"), self._plan_lock:
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
        with all_slots(self._slots, self._plan_lock, "reset"):
            if self._tables is not None:
                self._tables.reset()
            self._assignment = None
            self._cursor.last = None
            self._invalidate(None)

    def resync_request(self) -> dict[str, Any]:
        """The resync back channel's message to send the scheduler after a refused
        ``block_deltas`` message (:func:`blockprep.wire.resync_request` of the last message
        applied): its encoder's next message carries every request whole."""
        return self._cursor.resync_request()

    def _slot_number(self, buffer_slot: object) -> int:
        return slot_number(buffer_slot, len(self._slots))

    # --- public entry points ---------------------------------------------------------------------

    def prepare(
        self, batch: DecodeBatch, *, buffer_slot: int = 0, early: bool = False
    ) -> DeepSeekV4DecodeInputs:
        """Write one standard (autoregressive) decode step into ``buffer_slot``'s buffers.

        Each request decodes ``token_ids[i]`` (``[A]``, or ``[A, k]``: column 0) at position
        ``seq_lens[i] - 1``, repeated over ``decode_seq``. Upstream's rules: rank from
        ``cache_partitions``, local row by order of arrival on the rank; padding rows get scratch
        pages and block count 1; their dynamic inputs copy the rank's first request (global
        request 0 on an empty rank). ``seq_lens`` entries past the ``A`` requests are ignored, as
        upstream reads ``seq_lens[i]`` for the requests only. ``batch`` may be upstream's own
        object (:func:`~blockprep.batch.as_decode_batch`, as for every method here); a rejection
        is logged (:mod:`blockprep.log`).

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
        with preparing(self._slots, self._plan_lock, buffer_slot, "prepare"):
            batch = as_decode_batch(batch)  # upstream's own objects: its defaults
            self._grouped()
            if early:
                early_device_only(self.embedding == "host")
            elif self.embedding == "host" and batch.hidden_states is None:
                raise BlockprepValueError(HOST_HIDDEN_MESSAGE)
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            if early and max(assignment.counts) > 1:
                raise BlockprepValueError(
                    "DeepSeekV4 non-MTP decode supports at most one request per DP rank"
                )
            A = len(assignment.ranks)
            seq = checked_seq_lens(batch, A)
            rows: StepRows
            if early:
                rows, hidden = placeholder(self.layout, A, 1), None
            else:
                one_per_rank(self.layout, assignment)
                rows = decode_rows(self.layout, batch, seq, A)
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
        with preparing(self._slots, self._plan_lock, buffer_slot, "prepare_mtp"):
            batch = as_decode_batch(batch)
            self._grouped()
            if early:
                early_device_only(self.embedding == "host")
            else:
                mtp_inputs_present(batch, self.embedding == "host")
            layout = self.layout
            if layout.decode_seq != 2:
                raise BlockprepValueError("DeepSeekV4 MTP verification requires decode_seq=2")
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            A = len(assignment.ranks)
            seq = checked_seq_lens(batch, A)
            if early:
                rows, hidden = placeholder(layout, A, 2), None
            else:
                rows = mtp_rows(self.layout, batch, seq, A)
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
        with preparing(self._slots, self._plan_lock, buffer_slot, "prepare_mtp_target"):
            batch = as_decode_batch(batch)
            self._grouped()
            if self.embedding == "host":
                raise BlockprepValueError('prepare_mtp_target needs embedding="device"')
            A = len(batch.request_ids)
            rows = target_rows(self.layout, token_rows, positions, active_width, A)
            assignment = self._assignment = assign(self.layout, batch, self._assignment)
            if rows.active_seq < self.layout.decode_seq and max(assignment.counts) > 1:
                raise BlockprepValueError(
                    "partial MTP target chunks require at most one request per rank"
                )
            seq = checked_seq_lens(batch, A)
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
        with holding(slot, number, "restage"):
            batch = as_decode_batch(batch)
            prepared = prepared_step(slot, number, batch)
            assignment = prepared.assignment
            A = len(assignment.ranks)
            seq = checked_seq_lens(batch, A)
            hidden: Hidden | None = None
            rows: StepRows
            if prepared.mode == "target":
                if token_rows is None or positions is None:
                    raise BlockprepValueError(
                        "a slot prepared by prepare_mtp_target is re-staged with token_rows and "
                        "positions"
                    )
                active_seq = prepared.inputs.active_seq
                rows = target_rows(self.layout, token_rows, positions, active_seq, A)
            elif token_rows is not None or positions is not None:
                raise BlockprepValueError(
                    "token_rows and positions apply only to a slot prepared by prepare_mtp_target"
                )
            elif prepared.mode == "mtp":
                mtp_inputs_present(batch, self.embedding == "host")
                rows = mtp_rows(self.layout, batch, seq, A)
                hidden = self._hidden(batch, A, mtp=True)
            else:
                if self.embedding == "host" and batch.hidden_states is None:
                    raise BlockprepValueError(HOST_HIDDEN_MESSAGE)
                rows = decode_rows(self.layout, batch, seq, A)
                hidden = self._hidden(batch, A, mtp=False)
            check_position(self.layout, batch, rows)
            groups = self._verify_slots.get(number) if self.verify else None
            if groups is not None:  # the ids the slot holds, against the re-staged lengths
                check_contract(self.layout, batch, groups, seq)
            dirty = slot.dirty if self._track else None
            slot.dynamic.write(assignment, rows, seq, dirty, owners=False)
            if hidden is not None:
                slot.dynamic.write_x_hc(assignment, *hidden)
            if groups is not None:
                verify_slot(
                    self.layout,
                    prepared.inputs,
                    batch,
                    groups,
                    seq,
                    rows,
                    hidden,
                    prepared.mode,
                    False,
                )
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
        host = self.embedding == "host"
        try:
            return speculative_batch(
                as_decode_batch(batch), draft_token_ids, draft_hidden_states, host=host
            )
        except log.REJECTIONS as error:
            log.rejected("DeepSeekV4DecodePreparer.speculative_batch", error)
            raise

    # --- one step: check, plan, then write -------------------------------------------------------

    def _stage(
        self,
        batch: DecodeBatch,
        assignment: Assignment,
        buffer_slot: int,
        seq: npt.NDArray[np.int64],
        rows: StepRows,
        hidden: Hidden | None,
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
            step = plan_tables(tables, self.layout, batch, assignment, self._scratch)
            applied = None
        else:
            step, applied = plan_deltas(
                tables, self._cursor, batch.block_deltas, batch, assignment, self._scratch
            )
        groups = None
        if self.verify:  # the lists this step makes, checked against the layout before writing
            groups = verify_lists(batch, self._verify_held)
            check_contract(self.layout, batch, groups, seq)
        tables.commit(step, number)
        self._cursor.last = applied
        slot = self._slots[number]
        dynamic = slot.dynamic
        dynamic.write(assignment, rows, seq, slot.dirty if self._track else None)
        if hidden is not None:
            dynamic.write_x_hc(assignment, *hidden)
        inputs = slot.record(mode, assignment, number, self.layout.decode_seq, rows.active_seq)
        if groups is not None:
            self._verify_held = dict(zip(batch.request_ids, groups, strict=True))
            self._verify_slots[number] = groups
            verify_slot(self.layout, inputs, batch, groups, seq, rows, hidden, mode, early)
        return inputs

    def _hidden(self, batch: DecodeBatch, A: int, *, mtp: bool) -> Hidden | None:
        """``embedding="host"``: the hidden states ``[A, hidden]`` (and MTP's previous ones),
        copied to the host as float32 now, so that a copy that fails fails before any write."""
        host = self.embedding == "host"
        return host_hidden(batch, A, mtp=mtp, host=host, hidden_size=self.hidden_size)

    def _checked_slot(self, batch: DecodeBatch, rows: StepRows, buffer_slot: int) -> int:
        """Upstream's order: grouped-id shape, the position limit, then the buffer slot."""
        A = len(batch.request_ids)
        grouped = batch.block_ids_by_group
        if batch.block_deltas is None:
            if not grouped:
                raise BlockprepValueError("DeepSeekV4 requires grouped KV block IDs")
            if len(grouped) != A:
                raise BlockprepValueError(
                    f"grouped KV metadata has {len(grouped)} rows, expected decode batch {A}"
                )
        check_position(self.layout, batch, rows)
        try:
            return self._slot_number(buffer_slot)
        except ValueError:
            raise_first(normalization_error(batch))
            raise
