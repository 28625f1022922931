"""Grouped block tables: several KV cache groups x table rows x buffer slots, planned then written.

A model with several KV cache groups (DeepSeek V4: 7 groups, rings and paged tables) keeps, per
buffer slot, one int32 table ``[num_rows, width]`` per group and an int32 ``counts [num_rows,
groups]`` table (ids per row and group). :class:`GroupedTables` owns them, model-neutral: rows are
whatever the caller lays out (DeepSeek: ``rank * decode_batch + local``), each row occupied by a
key (a request id) or by padding (key ``None``, ids the caller's own, trusted).

It is the public face of the table engine (:mod:`blockprep._engine`): one
:class:`~blockprep._engine.GroupKernel` per group, compiled or its pure-Python twin, holds the
latest ids and, per slot, which cells may be stale. A step has two phases:

1. :meth:`GroupedTables.plan` (full lists) or :meth:`GroupedTables.plan_deltas`
   (:mod:`blockprep.wire` operations) checks every changed row and decides its writes, one kernel
   call per group; it raises before anything is written, and changes nothing.
2. :meth:`GroupedTables.commit` takes the step as the latest and brings one slot up to date (its
   rows changed since its own last commit, by any step, and only their changed cells: a rotated
   ring slot is a strided write, a grown paged row its new cells); it cannot raise.

The id rule: an id equal by value to the id its row's request already holds at that position is
taken as that held int (so unchanged ids cost no type check); every other id must be an integer (a
plain ``int``, or a NumPy integer or 0-d integer array or tensor, converted) in ``[0,
id_limit)``, not repeated within its row (``bool``, ``float``, NumPy floats and anything else are
:class:`BlockIdTypeError`); a row given as an array or tensor of a non-integer dtype is rejected
whole. The held state is int32, so what one slot accepted no slot rejects later.

After every commit, every slot's buffers equal a from-scratch rebuild of the latest step committed
into that slot (:mod:`blockprep.reference` builders): ring rows ``ids[j % n]``, paged rows the ids
then ``pad``.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import is_, ne
from typing import Any

import numpy as np
import torch

from blockprep._engine import GroupKernel, kernel_buffer
from blockprep._engine.rules import NEW, OPS, PADDING
from blockprep._faults import (
    check_change_rows,
    convert,
    fault_error,
    raise_ops_error,
    record_ops,
    row_place,
)
from blockprep._ids import INT32_MAX, Kind, as_int, check_pad, has_integer_dtype
from blockprep.block_table import BlockTableStats
from blockprep.buffers import check_adopted, claim_buffers, host_tensor
from blockprep.errors import (
    BlockIdTypeError,
    BlockprepIndexError,
    BlockprepTypeError,
    BlockprepValueError,
)
from blockprep.errors import (
    BlockIdValueError as BlockIdValueError,  # importable from here, where it was defined
)
from blockprep.wire import DeltaMessageError

BLOCK_RENDER_MIN_ROWS = 8
"""Default ``block_rows`` (kept for compatibility: the kernel needs no such knob)."""


def padding_rows_of(keys: Sequence[Hashable | None]) -> list[int]:
    """The rows whose key is ``None`` (padding), found at C level."""
    return list(compress(count(), map(is_, keys, repeat(None))))


@dataclass(frozen=True)
class TableGroup:
    """One KV cache group: its table layout and the ids its rows may hold.

    ``kind``: ``"ring"`` (``ids[j % n]`` in every column) or ``"paged"`` (the ids, then ``pad``).
    A request's row holds ``min_ids..width`` ids (a ring at least one), each in ``[0, id_limit)``
    (padding rows may hold other ids). ``pad``: the value after a paged row's ids.
    """

    name: str
    kind: Kind
    width: int
    id_limit: int = INT32_MAX + 1
    pad: int = 0
    min_ids: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("ring", "paged"):
            raise BlockprepValueError(
                f"group {self.name}: kind must be 'ring' or 'paged', got {self.kind!r}"
            )
        if as_int(self.width, "width") <= 0:
            raise BlockprepValueError(
                f"group {self.name}: width must be positive, got {self.width}"
            )
        limit = as_int(self.id_limit, "id_limit")
        if not 0 < limit <= INT32_MAX + 1:
            raise BlockprepValueError(
                f"group {self.name}: id_limit must be in [1, 2**31], got {limit}"
            )
        check_pad(self.pad)
        if not 0 <= as_int(self.min_ids, "min_ids") <= self.width:
            raise BlockprepValueError(
                f"group {self.name}: min_ids must be in [0, width], got {self.min_ids}"
            )

    @property
    def shortest(self) -> int:
        """The fewest ids a request's row may hold."""
        return max(self.min_ids, 1 if self.kind == "ring" else 0)


def default_place(row: int) -> str:
    """How errors name a table row unless the caller says otherwise: ``"row {row}"``."""
    return f"row {row}"


@dataclass(frozen=True, eq=False)
class GroupedStep:
    """A planned step: decided and checked, not yet written. Commit it once, with
    :meth:`GroupedTables.commit`, before planning the next one."""

    plans: tuple[Any, ...]  # per group, the kernel's plan
    keys: list[Hashable | None]
    version: int


class _SlotState:
    """One buffer slot: its buffers, counters and the rows written since last taken."""

    def __init__(
        self,
        groups: Sequence[TableGroup],
        num_rows: int,
        share_memory: bool,
        adopted: tuple[Mapping[str, torch.Tensor], torch.Tensor] | None = None,
        track_rows: bool = False,
    ) -> None:
        if adopted is None:
            # Filled (so faulted in) here, not on the first step.
            self.tables = {
                g.name: host_tensor(
                    (num_rows, g.width), torch.int32, fill=0, share_memory=share_memory
                )
                for g in groups
            }
            self.counts = host_tensor(
                (num_rows, len(groups)), torch.int32, fill=0, share_memory=share_memory
            )
        else:
            tables, counts = adopted
            self.tables = {g.name: tables[g.name] for g in groups}
            self.counts = counts
        self.arrays = [self.tables[g.name].numpy() for g in groups]
        self.kernel_arrays = [kernel_buffer(array) for array in self.arrays]  # commit's
        self.counts_np = self.counts.numpy()
        self.counts_bytes = self.counts_np.data.cast("B")  # a copy: one memcpy
        self.counts_stale = True  # the counts buffer may differ from the held counts
        self.stats = [[0, 0, 0] for _ in groups]  # hits, misses, cells_written
        # Rows written since last taken (``track_rows``), else None.
        self.touched: set[int] | None = set() if track_rows else None


class GroupedTables:
    """Persistent grouped block tables over ``slots`` buffer slots.

    Args:
        groups: the cache groups, in ``counts`` column order (names unique).
        num_rows: table rows (kernel rows; padding included).
        slots: independent buffer sets; committing into one never touches another.
        share_memory: allocate every buffer in shared memory (for workers forked afterwards).
        block_rows: kept for compatibility (a positive int; the result never depended on it).
        buffers: adopt these buffers instead of allocating: per slot, ``(tables, counts)`` with
            ``tables`` a mapping from every group name to an int32 CPU tensor ``[num_rows,
            width]`` and ``counts`` int32 ``[num_rows, groups]``, all contiguous and writable
            (views of bigger buffers are fine). Their content is taken as unknown: each slot's
            first commit writes every row. ``share_memory`` does not apply.
        track_rows: record, per slot, the rows each commit writes (``counts`` rows included),
            for :meth:`take_touched_rows`.

    Every buffer is allocated here (or adopted), once, zero-filled; its address never changes.
    Each slot's first commit writes every row.
    """

    def __init__(
        self,
        groups: Sequence[TableGroup],
        num_rows: int,
        *,
        slots: int = 1,
        share_memory: bool = False,
        block_rows: int = BLOCK_RENDER_MIN_ROWS,
        buffers: Sequence[tuple[Mapping[str, torch.Tensor], torch.Tensor]] | None = None,
        track_rows: bool = False,
    ) -> None:
        groups = tuple(groups)
        if not groups or not all(isinstance(g, TableGroup) for g in groups):
            raise BlockprepTypeError("groups must be a non-empty sequence of TableGroup")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise BlockprepValueError(f"group names must be unique, got {names}")
        num_rows = as_int(num_rows, "num_rows")
        slots = as_int(slots, "slots")
        if num_rows < 0:
            raise BlockprepValueError(f"num_rows must be non-negative, got {num_rows}")
        if slots <= 0:
            raise BlockprepValueError(f"slots must be positive, got {slots}")
        if as_int(block_rows, "block_rows") < 1:
            raise BlockprepValueError(f"block_rows must be positive, got {block_rows}")
        self._groups = groups
        self._num_rows = num_rows
        if buffers is None:
            adopted: list[tuple[Mapping[str, torch.Tensor], torch.Tensor] | None] = [None] * slots
        else:
            if share_memory:
                raise BlockprepValueError("share_memory applies only to allocated buffers")
            checked = [_checked_adopted(groups, num_rows, b, s) for s, b in enumerate(buffers)]
            if len(checked) != slots:
                raise BlockprepValueError(f"buffers must hold {slots} slots, got {len(checked)}")
            adopted = list(checked)
        self._slots = [
            _SlotState(groups, num_rows, share_memory, adopted[s], track_rows) for s in range(slots)
        ]
        claim_buffers(self, _named_buffers(self._slots), "GroupedTables")  # disjoint, one owner
        self._kernels = [
            GroupKernel(g.kind == "ring", g.width, g.id_limit, g.shortest, g.pad, num_rows, slots)
            for g in groups
        ]
        self._counts = np.zeros((num_rows, len(groups)), dtype=np.int32)
        self._counts_bytes = self._counts.data.cast("B")
        self._kernel_counts = kernel_buffer(self._counts)
        self._keys: list[Hashable | None] = [None] * num_rows
        self._stay = [PADDING] * num_rows  # srcs when no key changes
        self._padding_rows = list(range(num_rows))  # the rows whose key is None, and as a set
        self._padding_set = set(self._padding_rows)
        self._version = 0

    @property
    def groups(self) -> tuple[TableGroup, ...]:
        return self._groups

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def slots(self) -> int:
        return len(self._slots)

    def tables(self, slot: int) -> dict[str, torch.Tensor]:
        """Slot ``slot``'s tables by group name: int32 ``[num_rows, width]`` (the buffers)."""
        return dict(self._state(slot).tables)

    def counts(self, slot: int) -> torch.Tensor:
        """Slot ``slot``'s int32 ``[num_rows, groups]`` ids-per-row table (the buffer)."""
        return self._state(slot).counts

    def take_touched_rows(self, slot: int) -> set[int]:
        """The rows of slot ``slot`` that commits wrote since the last call (a row written with
        the value it held counts too); empties the record. ``ValueError`` unless built with
        ``track_rows=True``."""
        state = self._state(slot)
        if state.touched is None:
            raise BlockprepValueError("take_touched_rows needs GroupedTables(..., track_rows=True)")
        touched, state.touched = state.touched, set()
        return touched

    def latest_ids(self, group: int, row: int) -> list[int] | None:
        """A copy of the ids ``row`` holds in ``group`` (an index into :attr:`groups`) as of the
        latest commit (``None``: none). ``IndexError`` for a group or row out of range (negative
        ones included: nothing counts from the end)."""
        index, number = as_int(group, "group"), as_int(row, "row")
        if not 0 <= index < len(self._kernels):
            raise BlockprepIndexError(
                f"group {group} out of range: there are {len(self._kernels)} groups"
            )
        if not 0 <= number < self._num_rows:
            raise BlockprepIndexError(f"row {row} out of range: there are {self._num_rows} rows")
        return self._kernels[index].held(number)

    def stats(self, slot: int) -> dict[str, BlockTableStats]:
        """Per group, slot ``slot``'s counters: ``hits`` rows a commit left alone, ``misses`` rows
        it wrote (other slots' steps caught up on included), ``cells_written``."""
        return {
            g.name: BlockTableStats(*counters)
            for g, counters in zip(self._groups, self._state(slot).stats, strict=True)
        }

    def reset_stats(self) -> None:
        for state in self._slots:
            state.stats = [[0, 0, 0] for _ in self._groups]

    def invalidate(self, slot: int | None = None) -> None:
        """Forget what ``slot``'s buffers (every slot's with ``None``) hold, for when something
        else wrote them: its next commit rewrites every row from the latest ids."""
        number = -1 if slot is None else as_int(slot, "slot")
        states = self._slots if slot is None else [self._state(number)]
        for kernel in self._kernels:
            kernel.invalidate(number)
        for state in states:
            state.counts_stale = True

    def reset(self) -> None:
        """Forget every row's ids and keys: the next step writes every row, into every slot."""
        for kernel in self._kernels:
            kernel.forget(-1)  # every slot marked whole below
        self._keys = [None] * self._num_rows
        self._stay = [PADDING] * self._num_rows
        self._padding_rows = list(range(self._num_rows))
        self._padding_set = set(self._padding_rows)
        self._counts.fill(0)
        self._version += 1
        self.invalidate()

    # --- plan -------------------------------------------------------------------------------------

    def plan(
        self,
        rows: Sequence[Sequence[Any]],
        keys: Sequence[Hashable | None],
        place: Callable[[int], str] = default_place,
    ) -> GroupedStep:
        """Decide and check one step; write nothing.

        Args:
            rows: per group (in :attr:`groups` order), ``num_rows`` id rows: lists, tuples, 1-D
                integer arrays or tensors. A padding row's ids are trusted (int32, at most the
                width; a ring row at least one).
            keys: per row, the key of the request that occupies it, or ``None`` for padding.
            place: names a table row in error messages (e.g. ``"decode row 3"``).

        Raises:
            BlockIdTypeError: a changed id that is not an integer, a non-integer row container,
                a row that is not a sequence.
            BlockIdValueError: an id outside ``[0, id_limit)`` or repeated in its row, a ring row
                with no ids, a row longer than its group's width.
            ValueError: ``rows`` or ``keys`` of the wrong length.
            TypeError: ``keys`` that is no sequence (``None``, say).
        """
        n_rows = self._num_rows
        if len(rows) != len(self._groups):
            raise BlockprepValueError(f"rows must hold {len(self._groups)} groups, got {len(rows)}")
        keys, srcs = self._key_changes(keys)
        plans = []
        for gi, group in enumerate(self._groups):
            column = rows[gi]
            if len(column) != n_rows:
                raise BlockprepValueError(
                    f"group {group.name}: rows must hold {n_rows} rows, got {len(column)}"
                )
            kernel = self._kernels[gi]
            plan, fault = None, None
            if type(column) is list:  # the caller's lists as they are (the kernel checks them)
                with contextlib.suppress(TypeError):  # a row that is no list: converted below
                    plan, fault = kernel.stage(None, column, srcs, convert)
            if plan is None and (fault is None or set(map(type, column)) != {list}):
                column = [_as_list(ids, row, group, place) for row, ids in enumerate(column)]
                plan, fault = kernel.stage(None, column, srcs, convert)
            if fault is not None:
                raise fault_error(fault, group, place)
            plans.append(plan)
        return GroupedStep(tuple(plans), keys, self._version)

    def plan_mappings(
        self,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[Hashable | None],
        place: Callable[[int], str] = default_place,
    ) -> GroupedStep:
        """:meth:`plan` with the rows given as ``num_rows`` mappings ``{group name: ids}`` (a
        batch's ``block_ids_by_group``, in table order): each group's lists are read where they
        are, no columns made. Same results and errors as :meth:`plan` of the columns made row by
        row (``[[row[name] for name in groups] for row in rows]``, transposed): a row that is no
        mapping or lacks a group raises what reading it there raises, the first such row first."""
        if type(rows) is list and len(rows) == self._num_rows:
            step_keys, srcs = self._key_changes(keys)
            plans = []
            for group, kernel in zip(self._groups, self._kernels, strict=True):
                try:
                    plan, fault = kernel.stage(None, rows, srcs, convert, group.name)
                except (TypeError, KeyError):  # a row no dict or without the group
                    break
                if fault is not None:  # the columns' plan words it
                    break
                plans.append(plan)
            else:
                return GroupedStep(tuple(plans), step_keys, self._version)
        names = [group.name for group in self._groups]
        by_row = [[row[name] for name in names] for row in rows]  # raises as the batch's reader
        return self.plan([list(column) for column in zip(*by_row, strict=True)], keys, place)

    def plan_deltas(
        self,
        changes: Sequence[Mapping[int, Any]],
        keys: Sequence[Hashable | None],
        padding: Callable[[int, int], list[int]],
        place: Callable[[int], str] = default_place,
        *,
        whole: bool = False,
        data: bytes | None = None,
    ) -> GroupedStep:
        """Decide and check one step given as changes (:mod:`blockprep.wire` operations); write
        nothing. Its cost follows the changes, not the size of the tables.

        Args:
            changes: per group (in :attr:`groups` order), ``{row: ops}``: the operations that
                take the ids the row's request held (in whichever row it held them) to its ids
                now. A request's row without ops holds what its request held (a request that
                moved is a row copy); a request new to the tables needs ops that start whole.
            keys: per row, the key of the request that occupies it, or ``None`` for padding.
            padding: ``padding(group, row)``, a padding row's ids (trusted): looked up for every
                padding row when the keys changed or the row holds nothing yet.
            place: names a table row in error messages.
            whole: every request starts anew (a message that builds on nothing): each of its
                groups needs ops that start whole, whatever the tables hold.
            data: a :mod:`blockprep.packed` payload; a row's ops may then be a tuple of the word
                offsets of its records there (checked by :func:`blockprep.packed.records`),
                which the kernel reads in place.

        Raises:
            DeltaMessageError: ops that do not fit the held ids, a new request without a whole
                list, ops for a padding row (the place, group and request named).
            BlockIdTypeError, BlockIdValueError, ValueError: as :meth:`plan`.
        """
        if len(changes) != len(self._groups):
            raise BlockprepValueError(
                f"changes must hold {len(self._groups)} groups, got {len(changes)}"
            )
        previous = self._keys
        keys, srcs = self._key_changes(keys)
        if whole:
            srcs = [PADDING if key is None else NEW for key in keys]
        if keys is previous and not whole:  # no key changed: the padding rows as held, none moved
            padding_rows, padding_set, moved = self._padding_rows, self._padding_set, []
        else:  # the rows walked at C level; Python only for the padding and moved rows
            padding_rows = padding_rows_of(keys)
            padding_set = set(padding_rows)
            moved = [
                row for row in compress(count(), map(ne, srcs, count())) if srcs[row] != PADDING
            ]
        plans = []
        for gi, group in enumerate(self._groups):
            kernel = self._kernels[gi]
            group_changes = changes[gi]
            if not padding_set.isdisjoint(group_changes):
                row = min(padding_set.intersection(group_changes))
                raise DeltaMessageError(
                    f"block delta ops for a padding row ({row_place(place, row, group, None)})"
                )
            if keys is not previous:
                visit_padding = padding_rows
            else:  # padding rows that hold nothing yet
                visit_padding = [row for row in padding_rows if kernel.length(row) < 0]
            try:
                if moved or visit_padding:  # a padding row has no change (checked above)
                    rows = sorted({*group_changes, *moved, *visit_padding})
                    items = list(map(group_changes.get, rows))
                    for row in visit_padding:
                        items[bisect_left(rows, row)] = padding(gi, row)
                else:
                    rows = sorted(group_changes)
                    items = list(map(group_changes.__getitem__, rows))
                plan, fault = kernel.stage(rows, items, srcs, convert, data=data, ops=True)
            except (IndexError, TypeError):
                check_change_rows(group_changes, len(keys), group)  # raises for a bad row
                raise
            if fault is not None:
                if fault[0] == OPS:
                    ops = group_changes.get(fault[1])
                    if data is not None and type(ops) is tuple:  # packed: the ops it stands for
                        ops = record_ops(data, ops, fault[1])
                    raise_ops_error(fault[1], ops, keys, srcs, kernel, group, place)
                raise fault_error(fault, group, place)
            plans.append(plan)
        return GroupedStep(tuple(plans), keys, self._version)

    def _key_changes(
        self, keys: Sequence[Hashable | None]
    ) -> tuple[list[Hashable | None], list[int]]:
        """``keys`` as a list (the held list itself when unchanged) and, per row, where its ids
        come from: ``PADDING``, the row its request held them at (itself when it stayed), or
        ``NEW``."""
        n_rows = self._num_rows
        try:
            keys = list(keys)
        except TypeError:
            raise BlockprepTypeError(
                f"keys must be a sequence of {n_rows} row keys (None for a padding row), got "
                f"{type(keys).__name__}"
            ) from None
        if len(keys) != n_rows:
            raise BlockprepValueError(f"keys must hold {n_rows} rows, got {len(keys)}")
        previous = self._keys
        try:  # a request key is hashed and compared: one that cannot be is refused
            if keys == previous:
                return previous, self._stay
            held_at = {key: row for row, key in enumerate(previous) if key is not None}
            srcs = [
                PADDING if new is None else row if new == old else held_at.get(new, NEW)
                for row, (old, new) in enumerate(zip(previous, keys, strict=True))
            ]
        except Exception as error:
            raise BlockprepTypeError(
                f"keys must be request keys that hash and compare (None for a padding row); "
                f"one raised {type(error).__name__}: {error}"
            ) from error
        return keys, srcs

    # --- commit -----------------------------------------------------------------------------------

    def commit(self, step: GroupedStep, slot: int) -> None:
        """Write ``step`` into ``slot``'s buffers and record it as the latest step.

        Raises (before writing anything) only for misuse: ``ValueError`` when ``step`` was not
        planned on the current state, ``IndexError`` for a bad ``slot``.
        """
        if step.version != self._version:
            raise BlockprepValueError("a GroupedStep must be committed once, before the next plan")
        state = self._state(slot)
        number = self._slots.index(state)
        touched = state.touched
        want = touched is not None
        changed_counts = False
        for gi, kernel in enumerate(self._kernels):
            plan = step.plans[gi]
            changed_counts = changed_counts or bool(plan)
            written, cells, rows = kernel.commit(
                plan, number, state.kernel_arrays[gi], self._kernel_counts, gi, want
            )
            counters = state.stats[gi]
            counters[0] += self._num_rows - written
            counters[1] += written
            counters[2] += cells
            if touched is not None and rows is not None:
                touched.update(rows)
        if changed_counts:
            for other in self._slots:
                other.counts_stale = True
        if state.counts_stale:
            if touched is not None:
                differ = (state.counts_np != self._counts).any(axis=1)
                touched.update(np.flatnonzero(differ).tolist())
            state.counts_bytes[:] = self._counts_bytes  # np.copyto: 14 us cold, interleaved
            state.counts_stale = False
        if step.keys is not self._keys:
            self._keys = step.keys
            self._padding_rows = padding_rows_of(step.keys)
            self._padding_set = set(self._padding_rows)
            self._stay = list(range(self._num_rows))
            for row in self._padding_rows:
                self._stay[row] = PADDING
        self._version += 1

    def _state(self, slot: int) -> _SlotState:
        """Slot ``slot``; ``IndexError`` (or ``TypeError``) for anything but one of them."""
        if type(slot) is int and 0 <= slot < len(self._slots):  # the common case, no call
            return self._slots[slot]
        index = as_int(slot, "slot")
        if not 0 <= index < len(self._slots):
            raise BlockprepIndexError(
                f"slot {slot} out of range: there are {len(self._slots)} slots"
            )
        return self._slots[index]


def _checked_adopted(
    groups: Sequence[TableGroup], num_rows: int, buffers: object, slot: int
) -> tuple[Mapping[str, torch.Tensor], torch.Tensor]:
    """One slot's adopted ``(tables, counts)``, checked: int32, CPU, contiguous, shapes."""
    if not isinstance(buffers, tuple) or len(buffers) != 2:
        raise BlockprepTypeError(f"buffers[{slot}] must be a (tables, counts) pair")
    tables, counts = buffers
    if not isinstance(tables, Mapping):
        raise BlockprepTypeError(f"buffers[{slot}] tables must map group names to tensors")
    wanted = {g.name: (num_rows, g.width) for g in groups}
    wanted_counts = (num_rows, len(groups))
    for name, shape in [*wanted.items(), ("counts", wanted_counts)]:
        tensor = counts if name == "counts" else tables.get(name)
        check_adopted(tensor, f"buffers[{slot}][{name!r}]", dtype=torch.int32, shapes=(shape,))
    return tables, counts


def _named_buffers(slots: Sequence[_SlotState]) -> list[tuple[str, torch.Tensor]]:
    """Every slot's tables and counts, by the name an overlap error gives them."""
    return [
        (f"buffers[{s}][{name!r}]", tensor)
        for s, slot in enumerate(slots)
        for name, tensor in [*slot.tables.items(), ("counts", slot.counts)]
    ]


def _as_list(ids: object, row: int, group: TableGroup, place: Callable[[int], str]) -> list[Any]:
    """Row ``row``'s ids as a list: lists as they are, tuples copied, 1-D integer arrays and tensors
    through ``tolist()``."""
    if isinstance(ids, list):
        return ids
    if isinstance(ids, tuple):
        return list(ids)
    if isinstance(ids, (np.ndarray, torch.Tensor)):
        if ids.ndim == 1 and has_integer_dtype(ids):
            values: list[Any] = ids.tolist()
            return values
        raise BlockIdTypeError(
            f"{place(row)} group {group.name} must hold integer block IDs, got a "
            f"{type(ids).__name__} of dtype {ids.dtype} and shape {list(ids.shape)}",
            row,
            group.name,
            ids,
        )
    raise BlockIdTypeError(
        f"{place(row)} group {group.name} must be a sequence of block IDs, "
        f"got {type(ids).__name__}",
        row,
        group.name,
        ids,
    )
