"""The DeepSeek V4 decode preparer: per buffer slot, the 7 tables (a :class:`~blockprep.grouped.
GroupedTables` over ``ranks * decode_batch`` rows), ``block_counts`` and the dynamic inputs.

A step runs upstream's checks in upstream's order, plans the tables (the id rule and every
change decided before any write), copies hidden states to the host, then writes; nothing after
the plan can raise. Padding rows hold the scratch pages ``num_blocks + k``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep.adapters.deepseek.assignment import Assignment, assign
from blockprep.adapters.deepseek.checks import normalization_error, upstream_error
from blockprep.adapters.deepseek.layout import GROUP_NAMES, INPUT_FIELDS, DeepSeekV4Layout
from blockprep.adapters.deepseek.mtp import integer_tensor
from blockprep.batch import DecodeBatch
from blockprep.block_table import BlockTableStats
from blockprep.buffers import host_tensor
from blockprep.grouped import (
    BlockIdValueError,
    GroupedStep,
    GroupedTables,
    TableGroup,
)
from blockprep.ids import as_int, has_integer_dtype
from blockprep.wire import DeltaCursor, DeltaMessageError

HOST_HIDDEN_MESSAGE = "DeepSeek V4 decode requires host hidden states"
MTP_PREVIOUS_MESSAGE = "DeepSeekV4 MTP decode requires previous token IDs and embeddings"

Embedding = Literal["device", "host"]


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
        assignment: Assignment,
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
        self._assignment: Assignment | None = None
        self._group_index = {name: gi for gi, name in enumerate(GROUP_NAMES)}
        self._cursor = DeltaCursor()

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
        self._cursor.last = None
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
        assignment = self._assignment = assign(self.layout, batch, self._assignment)
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
        assignment = self._assignment = assign(self.layout, batch, self._assignment)
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
        tokens: npt.NDArray[np.int64],
        previous: npt.NDArray[np.int64] | None,
        hidden: tuple[torch.Tensor, torch.Tensor | None] | None,
    ) -> DeepSeekV4DecodeInputs:
        """Check the block ids, plan the tables, then write the slot (nothing after the plan
        can raise)."""
        slot = self._checked_slot(batch, seq, buffer_slot)
        if batch.block_deltas is None:
            step, applied = self._plan_tables(batch, assignment), None
        else:
            step, applied = self._plan_deltas(batch.block_deltas, batch, assignment)
        self._tables.commit(step, slot)
        self._cursor.last = applied
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
            return self._tables.plan(
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

        step = self._tables.plan_deltas(
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
        if batch.block_deltas is None:
            if not rows:
                raise ValueError("DeepSeekV4 requires grouped KV block IDs")
            if len(rows) != A:
                raise ValueError(
                    f"grouped KV metadata has {len(rows)} rows, expected decode batch {A}"
                )
        position = int(seq.max()) - 1
        if position >= self.layout.max_seq_len:
            _raise_first(normalization_error(batch))
            raise ValueError(
                f"decode position {position} exceeds max_seq_len={self.layout.max_seq_len}"
            )
        slot = buffer_slot if type(buffer_slot) is int else as_int(buffer_slot, "buffer_slot")
        if not 0 <= slot < self.buffer_slots:
            _raise_first(normalization_error(batch))
            choices = [str(s) for s in range(self.buffer_slots)]
            allowed = (
                choices[0]
                if len(choices) == 1
                else (", ".join(choices[:-1]) + " or " + choices[-1])
            )
            raise ValueError(f"decode buffer_slot must be {allowed}, got {buffer_slot}")
        return slot


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
    return array.astype(np.int64, copy=False)


def _raise_first(error: Exception | None) -> None:
    if error is not None:
        raise error
