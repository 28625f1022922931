"""Grouped block tables: several KV cache groups x table rows x buffer slots, planned then written.

A model with several KV cache groups (DeepSeek V4: 7 groups, rings and paged tables) keeps, per
buffer slot, one int32 table ``[num_rows, width]`` per group and an int32 ``counts [num_rows,
groups]`` table (ids per row and group). :class:`GroupedTables` owns them, model-neutral: rows are
whatever the caller lays out (DeepSeek: ``rank * decode_batch + local``), each row occupied by a
key (a request id) or by padding (key ``None``, ids the caller's own, trusted).

A step has two phases:

1. :meth:`GroupedTables.plan` takes every row's ids and key, compares each row with the latest
   step's ids (of any slot), checks only what changed and decides every write: a rotated ring
   slot is a strided write, a grown paged row its new cells, a request that moved to another row
   a row copy (keyed by request), anything else a whole row. New rows are validated and rendered
   per group in a few NumPy calls. It raises before anything is written, and changes nothing.
2. :meth:`GroupedTables.commit` brings one slot up to date and cannot raise: it replays the
   writes of the steps committed into other slots since its own last step, then the step's own,
   and records the step as the latest.

The id rule: an id equal by value to the id its row already holds at that position is taken as
that held int (so unchanged ids cost no type check); every other id must be an integer (a plain
``int``, or a NumPy integer or 0-d integer array or tensor, converted) in ``[0, id_limit)``, not
repeated within its row (``bool``, ``float``, NumPy floats and anything else are
:class:`BlockIdTypeError`); a row given as an array or tensor of a non-integer dtype is rejected
whole. The recorded state holds plain ints only, so what one slot accepted no slot rejects later.

After every commit, every slot's buffers equal a from-scratch rebuild of the latest step committed
into that slot (:mod:`blockprep.reference` builders): ring rows ``ids[j % n]``, paged rows the ids
then ``pad``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, compress, count
from typing import Any, NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt
import torch

from blockprep.block_table import BlockTableStats
from blockprep.buffers import host_tensor
from blockprep.ids import INT32_MAX, Kind, as_int, check_pad, has_integer_dtype, is_integer_id
from blockprep.tiling import tile_rows
from blockprep.wire import (
    APPEND,
    SET,
    TRUNCATE,
    DeltaMessageError,
    apply_ops,
    set_positions,
    truncated_length,
)

MAX_REPLAY_STEPS = 8
"""A slot more steps behind than this is re-rendered from the latest ids at its next commit."""
SMALL_CHANGE = 4
"""A same-length row whose ids differ in at most ``max(SMALL_CHANGE, n // 4)`` places is written
place by place (a strided write per ring slot, a cell per paged id); otherwise whole."""
BLOCK_RENDER_MIN_ROWS = 8
"""Default ``block_rows``: a group with at least this many whole rows in a step validates and
renders them in one block (fewer: row by row, cheaper below this count)."""

INTERNED_IDS = 1 << 16
"""Changed ids below this are recorded as one shared int object per value, so the ids compared
every step do not end up in objects scattered over every batch ever received (whole rows keep the
caller's int objects: an engine that passes the same objects again compares by identity)."""

_INT = {int}
_INTERNED = list(range(INTERNED_IDS))


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
            raise ValueError(
                f"group {self.name}: kind must be 'ring' or 'paged', got {self.kind!r}"
            )
        if as_int(self.width, "width") <= 0:
            raise ValueError(f"group {self.name}: width must be positive, got {self.width}")
        limit = as_int(self.id_limit, "id_limit")
        if not 0 < limit <= INT32_MAX + 1:
            raise ValueError(f"group {self.name}: id_limit must be in [1, 2**31], got {limit}")
        check_pad(self.pad)
        if not 0 <= as_int(self.min_ids, "min_ids") <= self.width:
            raise ValueError(
                f"group {self.name}: min_ids must be in [0, width], got {self.min_ids}"
            )

    @property
    def shortest(self) -> int:
        """The fewest ids a request's row may hold."""
        return max(self.min_ids, 1 if self.kind == "ring" else 0)


class BlockIdTypeError(TypeError):
    """A changed id that is not an integer, or a row container of a non-integer dtype.
    ``row`` is the table row, ``group`` the group name, ``value`` the offending id or row."""

    def __init__(self, message: str, row: int, group: str, value: object) -> None:
        super().__init__(message)
        self.row, self.group, self.value = row, group, value


class BlockIdValueError(ValueError):
    """A changed id out of range or repeated within its row, or a row of a bad length.
    ``row``, ``group`` and ``value`` as for :class:`BlockIdTypeError` (``value`` is ``None`` for a
    bad length)."""

    def __init__(self, message: str, row: int, group: str, value: object) -> None:
        super().__init__(message)
        self.row, self.group, self.value = row, group, value


def default_place(row: int) -> str:
    """How errors name a table row unless the caller says otherwise: ``"row {row}"``."""
    return f"row {row}"


class _Tiling(NamedTuple):
    """Ring rows written whole: row ``rows[i]`` (or ``rows + i`` for an int) gets ``ids[i]``
    tiled, ``ids`` int32 ``[k, n]``."""

    rows: npt.NDArray[np.intp] | int
    ids: npt.NDArray[np.int32]


class _GroupWrites(NamedTuple):
    """One group's writes of one step, in the order they apply.

    ``copy_dst``/``copy_src``: rows copied (from the content before the step); ``blocks``: rows
    written whole from a rendered ``[k, width]`` block; ``tilings``: ring rows tiled whole;
    ``cells``: ``((row, slice), value)`` assignments.
    ``rows``: rows written, ``cell_count``: cells written."""

    copy_dst: list[int]
    copy_src: list[int]
    blocks: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.int32]]]
    tilings: list[_Tiling]
    cells: list[tuple[tuple[int, slice | int], Any]]
    rows: int
    cell_count: int


class _GroupResult(NamedTuple):
    """One group's planned step: its writes, every row's ids after it, ``(row, length)`` of
    the rows whose length may have changed, and every row's hint."""

    writes: _GroupWrites
    latest: list[list[int] | None]
    lengths: list[tuple[int, int]]
    hints: list[int]


@dataclass(frozen=True, eq=False)
class GroupedStep:
    """A planned step: decided and checked, not yet written. Commit it once, with
    :meth:`GroupedTables.commit`, before planning the next one."""

    latest: tuple[list[list[int] | None], ...]
    hints: tuple[list[int], ...]  # per group and row: the ring slot likely to change next
    lengths: tuple[list[int], ...]  # per group and row: ids held (``counts`` as ints)
    keys: list[Hashable | None]
    counts: npt.NDArray[np.int32]
    writes: tuple[_GroupWrites | None, ...]  # per group, None when nothing changed
    version: int


class _SlotState:
    """One buffer slot: its buffers and the steps it has yet to replay (``None``: re-render)."""

    def __init__(
        self,
        groups: Sequence[TableGroup],
        num_rows: int,
        share_memory: bool,
        adopted: tuple[Mapping[str, torch.Tensor], torch.Tensor] | None = None,
        track_rows: bool = False,
    ) -> None:
        self.backlog: list[GroupedStep] | None = []
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
            self.backlog = None  # content unknown: the first commit renders every row
        self.arrays = [self.tables[g.name].numpy() for g in groups]
        self.counts_np = self.counts.numpy()
        self.counts_from: npt.NDArray[np.int32] | None = None  # the counts last copied in
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
        block_rows: whole rows of a group from which a step checks and renders them as one
            block (a tuning knob: the result is the same either way).
        buffers: adopt these buffers instead of allocating: per slot, ``(tables, counts)`` with
            ``tables`` a mapping from every group name to an int32 CPU tensor ``[num_rows,
            width]`` and ``counts`` int32 ``[num_rows, groups]``, all contiguous and writable
            (views of bigger buffers are fine). Their content is taken as unknown: each slot's
            first commit writes every row. ``share_memory`` does not apply.
        track_rows: record, per slot, the rows each commit writes (replayed writes and
            ``counts`` rows included), for :meth:`take_touched_rows`.

    Every buffer is allocated here (or adopted), once, zero-filled; its address never changes.
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
            raise TypeError("groups must be a non-empty sequence of TableGroup")
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        num_rows = as_int(num_rows, "num_rows")
        slots = as_int(slots, "slots")
        if num_rows < 0:
            raise ValueError(f"num_rows must be non-negative, got {num_rows}")
        if slots <= 0:
            raise ValueError(f"slots must be positive, got {slots}")
        self._groups = groups
        self._num_rows = num_rows
        self._block_rows = as_int(block_rows, "block_rows")
        if self._block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {self._block_rows}")
        self._row_range = range(num_rows)
        if buffers is None:
            adopted: list[tuple[Mapping[str, torch.Tensor], torch.Tensor] | None] = [None] * slots
        else:
            if share_memory:
                raise ValueError("share_memory applies only to allocated buffers")
            adopted = [_checked_adopted(groups, num_rows, b, s) for s, b in enumerate(buffers)]
            if len(adopted) != slots:
                raise ValueError(f"buffers must hold {slots} slots, got {len(adopted)}")
        self._slots = [
            _SlotState(groups, num_rows, share_memory, adopted[s], track_rows) for s in range(slots)
        ]
        self._latest: tuple[list[list[int] | None], ...] = tuple([None] * num_rows for _ in groups)
        self._keys: list[Hashable | None] = [None] * num_rows
        self._hints: tuple[list[int], ...] = tuple([0] * num_rows for _ in groups)
        self._counts = np.zeros((num_rows, len(groups)), dtype=np.int32)
        self._lengths: tuple[list[int], ...] = tuple([0] * num_rows for _ in groups)
        self._version = 0
        ring_cells = [num_rows * g.width for g in groups if g.kind == "ring"]
        self._scratch = np.full(max(ring_cells, default=0), 0, dtype=np.int32)

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
            raise ValueError("take_touched_rows needs GroupedTables(..., track_rows=True)")
        touched, state.touched = state.touched, set()
        return touched

    def latest_ids(self, group: int, row: int) -> list[int] | None:
        """A copy of the ids ``row`` holds in ``group`` as of the latest commit (``None``: none)."""
        ids = self._latest[group][row]
        return None if ids is None else list(ids)

    def stats(self, slot: int) -> dict[str, BlockTableStats]:
        """Per group, slot ``slot``'s counters: ``hits`` rows a commit left alone, ``misses`` rows
        it wrote (replayed writes included), ``cells_written``."""
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
        for state in self._slots if slot is None else [self._state(slot)]:
            state.backlog = None
            state.counts_from = None

    def reset(self) -> None:
        """Forget every row's ids and keys: the next step writes every row, into every slot."""
        self._latest = tuple([None] * self._num_rows for _ in self._groups)
        self._keys = [None] * self._num_rows
        self._hints = tuple([0] * self._num_rows for _ in self._groups)
        self._counts = np.zeros_like(self._counts)
        self._lengths = tuple([0] * self._num_rows for _ in self._groups)
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
                integer arrays or tensors. A padding row's list is trusted as it is (make it once
                and pass the same list every step).
            keys: per row, the key of the request that occupies it, or ``None`` for padding.
            place: names a table row in error messages (e.g. ``"decode row 3"``).

        Raises:
            BlockIdTypeError: a changed id that is not an integer, a non-integer row container,
                a row that is not a sequence.
            BlockIdValueError: an id outside ``[0, id_limit)`` or repeated in its row, a ring row
                with no ids, a row longer than its group's width.
            ValueError: ``rows`` or ``keys`` of the wrong length.
        """
        n_rows = self._num_rows
        if len(rows) != len(self._groups):
            raise ValueError(f"rows must hold {len(self._groups)} groups, got {len(rows)}")
        keys, bases, fresh = self._key_changes(keys)
        results: list[_GroupResult | None] = []
        for gi, group in enumerate(self._groups):
            column = rows[gi]
            if len(column) != n_rows:
                raise ValueError(
                    f"group {group.name}: rows must hold {n_rows} rows, got {len(column)}"
                )
            if set(map(type, column)) != {list}:
                column = [_as_list(ids, row, group, place) for row, ids in enumerate(column)]
            latest = self._latest[gi]
            try:
                changed = list(compress(self._row_range, map(operator.ne, column, latest)))
            except Exception:  # an id that does not compare as a number (an array, ...)
                raise _incomparable(column, group, place) from None
            if fresh:  # a request on a former padding row: its ids were never checked
                changed = sorted(set(changed).union(fresh))
            if not changed:
                results.append(None)
                continue
            planner = _GroupPlanner(group, latest, self._hints[gi], place, self._block_rows)
            planner.rows(changed, column, keys, bases)
            results.append(planner.finish())
        return self._step(keys, results)

    def plan_deltas(
        self,
        changes: Sequence[Mapping[int, Any]],
        keys: Sequence[Hashable | None],
        padding: Callable[[int, int], list[int]],
        place: Callable[[int], str] = default_place,
        *,
        whole: bool = False,
    ) -> GroupedStep:
        """Decide and check one step given as changes (:mod:`blockprep.wire` operations); write
        nothing. Its cost follows the changes, not the size of the tables.

        Args:
            changes: per group (in :attr:`groups` order), ``{row: ops}``: the operations that
                take the ids the row's request held (in whichever row it held them) to its ids
                now. A request's row without ops holds what its request held (a request that
                moved is a row copy); a request new to the tables needs ops that start whole.
            keys: per row, the key of the request that occupies it, or ``None`` for padding.
            padding: ``padding(group, row)``, a padding row's ids (trusted; the same list
                object for the same ids): looked up for every padding row when the keys
                changed, and written where the row does not hold that very list.
            place: names a table row in error messages.
            whole: every request starts anew (a message that builds on nothing): each of its
                groups needs ops that start whole, whatever the tables hold.

        Raises:
            DeltaMessageError: ops that do not fit the held ids, a new request without a whole
                list, ops for a padding row (the place, group and request named).
            BlockIdTypeError, BlockIdValueError, ValueError: as :meth:`plan`.
        """
        if len(changes) != len(self._groups):
            raise ValueError(f"changes must hold {len(self._groups)} groups, got {len(changes)}")
        previous = self._keys
        keys, bases, _ = self._key_changes(keys)
        if whole:
            bases = {row: None for row, key in enumerate(keys) if key is not None}
        padding_rows: list[int] = []  # their ids may change only when the keys do
        if keys is not previous or None in self._latest[0]:
            padding_rows = [row for row, key in enumerate(keys) if key is None]
        moved = sorted(bases)
        results: list[_GroupResult | None] = []
        for gi, group in enumerate(self._groups):
            group_changes = changes[gi]
            if not (group_changes or moved or padding_rows):
                results.append(None)
                continue
            latest = self._latest[gi]
            planner = _GroupPlanner(group, latest, self._hints[gi], place, self._block_rows)
            rows: Iterable[int] = group_changes.keys()
            if moved or padding_rows:
                rows = set(rows).union(moved, padding_rows)
            for row in sorted(rows):  # in table order, as the whole-row renderers expect
                key = keys[row]
                ops = group_changes.get(row)
                if key is None:
                    if ops is not None:
                        raise DeltaMessageError(
                            f"block delta ops for a padding row ({_where(place, row, group, key)})"
                        )
                    ids = padding(gi, row)
                    if latest[row] is not ids:
                        planner.padding(row, ids)
                    continue
                src = bases.get(row, row) if bases else row
                held = None if src is None else latest[src]
                src = None if src == row else src
                if ops is not None:
                    planner.delta(row, ops, src, held, key)
                elif held is None:
                    raise DeltaMessageError(
                        f"a request new to the worker must come with its whole list "
                        f"({_where(place, row, group, key)})"
                    )
                else:  # a request that moved: a row copy
                    planner.occupant(row, held, src, held)
            results.append(planner.finish())
        return self._step(keys, results)

    def _key_changes(
        self, keys: Sequence[Hashable | None]
    ) -> tuple[list[Hashable | None], dict[int, int | None], list[int]]:
        """``keys`` as a list (the held list itself when unchanged); per row whose key changed
        to a request, the row its request held (``None``: new); the rows that held padding and
        now hold a request."""
        n_rows = self._num_rows
        keys = list(keys)
        if len(keys) != n_rows:
            raise ValueError(f"keys must hold {n_rows} rows, got {len(keys)}")
        previous = self._keys
        bases: dict[int, int | None] = {}  # row -> the row its request held, None: a new request
        fresh: list[int] = []  # rows that held padding and now hold a request
        if keys == previous:
            return previous, bases, fresh
        held_at = {key: row for row, key in enumerate(previous) if key is not None}
        for row, (old, new) in enumerate(zip(previous, keys, strict=True)):
            if new is not None and new != old:
                bases[row] = held_at.get(new)
                if old is None:
                    fresh.append(row)
        return keys, bases, fresh

    def _step(self, keys: list[Hashable | None], results: list[_GroupResult | None]) -> GroupedStep:
        """The planned step from each group's result (``None``: the group is unchanged)."""
        counts = self._counts
        new_counts: npt.NDArray[np.int32] | None = None
        latest_out: list[list[list[int] | None]] = []
        hints_out: list[list[int]] = []
        lengths_out: list[list[int]] = []
        writes_out: list[_GroupWrites | None] = []
        for gi, result in enumerate(results):
            held_lengths = self._lengths[gi]
            if result is None:
                latest_out.append(self._latest[gi])
                hints_out.append(self._hints[gi])
                lengths_out.append(held_lengths)
                writes_out.append(None)
                continue
            writes, new_latest, lengths, hints = result
            grown = [(row, n) for row, n in lengths if held_lengths[row] != n]
            if grown:
                held_lengths = held_lengths[:]
                if new_counts is None:
                    new_counts = counts.copy()
                for row, n in grown:
                    held_lengths[row] = n
                    new_counts[row, gi] = n
            lengths_out.append(held_lengths)
            latest_out.append(new_latest)
            hints_out.append(hints)
            writes_out.append(writes)
        return GroupedStep(
            latest=tuple(latest_out),
            hints=tuple(hints_out),
            lengths=tuple(lengths_out),
            keys=keys,
            counts=counts if new_counts is None else new_counts,
            writes=tuple(writes_out),
            version=self._version,
        )

    # --- commit -----------------------------------------------------------------------------------

    def commit(self, step: GroupedStep, slot: int) -> None:
        """Write ``step`` into ``slot``'s buffers and record it as the latest step.

        Raises (before writing anything) only for misuse: ``ValueError`` when ``step`` was not
        planned on the current state, ``IndexError`` for a bad ``slot``.
        """
        if step.version != self._version:
            raise ValueError("a GroupedStep must be committed once, before the next plan")
        state = self._state(slot)
        if state.backlog is None:
            self._render_all(state, step.latest)
        else:
            for past in state.backlog:
                self._apply(state, past)
            self._apply(state, step)
        if state.counts_from is not step.counts:
            if state.touched is not None:
                changed = (state.counts_np != step.counts).any(axis=1)
                state.touched.update(np.flatnonzero(changed).tolist())
            np.copyto(state.counts_np, step.counts)
            state.counts_from = step.counts
        state.backlog = []
        for other in self._slots:
            if other is not state and other.backlog is not None:
                if len(other.backlog) >= MAX_REPLAY_STEPS:
                    other.backlog = None
                else:
                    other.backlog.append(step)
        self._latest = step.latest
        self._hints = step.hints
        self._keys = step.keys
        self._counts = step.counts
        self._lengths = step.lengths
        self._version += 1

    def _state(self, slot: int) -> _SlotState:
        """Slot ``slot``; ``IndexError`` (or ``TypeError``) for anything but one of them."""
        index = as_int(slot, "slot")
        if not 0 <= index < len(self._slots):
            raise IndexError(f"slot {slot} out of range: there are {len(self._slots)} slots")
        return self._slots[index]

    def _apply(self, state: _SlotState, step: GroupedStep) -> None:
        rows = self._num_rows
        for gi, writes in enumerate(step.writes):
            if writes is None:
                state.stats[gi][0] += rows
                continue
            table = state.arrays[gi]
            if writes.copy_dst:
                table[writes.copy_dst] = table[writes.copy_src]
            for index, block in writes.blocks:
                table[index] = block
            for tiling in writes.tilings:
                self._tile(table, tiling)
            for key, value in writes.cells:
                table[key] = value
            if state.touched is not None:
                _touched_rows(state.touched, writes)
            counters = state.stats[gi]
            counters[0] += max(rows - writes.rows, 0)
            counters[1] += writes.rows
            counters[2] += writes.cell_count

    def _tile(self, table: npt.NDArray[np.int32], tiling: _Tiling) -> None:
        """Tile ``tiling`` into ``table``: in place for a run of rows, else through the scratch
        block (allocated and touched once, at construction)."""
        rows, ids = tiling
        count, width = ids.shape[0], table.shape[1]
        if isinstance(rows, int):
            tile_rows(table[rows : rows + count], ids)
        else:
            part = self._scratch[: count * width].reshape(count, width)
            tile_rows(part, ids)
            table[rows] = part

    def _render_all(self, state: _SlotState, latest: tuple[list[list[int] | None], ...]) -> None:
        if state.touched is not None:
            state.touched.update(self._row_range)
        for gi, group in enumerate(self._groups):
            table = state.arrays[gi]
            known = [row for row, ids in enumerate(latest[gi]) if ids is not None]
            lists = [ids for ids in latest[gi] if ids is not None]
            unknown = sorted(set(self._row_range).difference(known))
            if unknown:
                table[unknown] = group.pad if group.kind == "paged" else 0
            if known and group.kind == "paged":
                lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
                table[known] = _paged_block(group, lengths, _flat_ids(lists))
            elif known:
                classes = _ring_classes(lists)
                assert classes is not None  # the recorded ids are plain ints
                for tiling in _ring_tilings(known, classes):
                    self._tile(table, tiling)
            counters = state.stats[gi]
            counters[1] += self._num_rows
            counters[2] += self._num_rows * group.width


class _GroupPlanner:
    """Decides one group's writes for one step (see :meth:`GroupedTables.plan`)."""

    def __init__(
        self,
        group: TableGroup,
        latest: list[list[int] | None],
        hints: list[int],
        place: Callable[[int], str],
        block_rows: int,
    ) -> None:
        self.group = group
        self.block_rows = block_rows
        self.latest = latest
        self.new_latest = latest[:]
        self.old_hints = hints
        self.hints = hints[:]
        self.place = place
        self.writes = _GroupWrites([], [], [], [], [], 0, 0)
        self.whole_rows: list[int] = []
        self.whole_ids: list[list[Any]] = []
        self.whole_bases: list[list[int] | None] = []
        self.padding_rows: set[int] = set()
        self.lengths: list[tuple[int, int]] = []
        self.rows_written = 0
        self.cell_count = 0

    def rows(
        self,
        changed: list[int],
        column: Sequence[Any],
        keys: list[Hashable | None],
        bases: dict[int, int | None],
    ) -> None:
        """Decide every changed row. Inline, the common case of a steady step: a request's row
        whose ids differ from what it holds only at its hinted position (the ring slot after the
        one that rotated last), by a plain int in range not in the row."""
        latest, hints, limit = self.latest, self.hints, self.group.id_limit
        for row in changed:
            ids = column[row]
            if keys[row] is None:
                self.padding(row, ids)
                continue
            if row in bases:
                src = bases[row]
                if src is None:  # a request new to the tables
                    self._whole(row, ids, None)
                else:
                    self.occupant(row, ids, src, latest[src])
                continue
            base = latest[row]
            if base is not None and len(ids) == len(base) > (p := hints[row]):
                x = ids[p]
                if type(x) is int and x == base[p]:  # another slot rotated: find it, in C
                    p = _single_difference(ids, base)
                    x = ids[p] if p >= 0 else None
                    same = True
                else:
                    same = False
                if type(x) is int:
                    new = base[:]
                    new[p] = _INTERNED[x] if 0 <= x < INTERNED_IDS else x
                    if (same or ids == new) and 0 <= x < limit and x not in base:
                        self._set_one(row, new, p, x)
                        continue
            self.occupant(row, ids, None, base)

    def padding(self, row: int, ids: list[int]) -> None:
        """A padding row: its ids are the caller's own, written as they are."""
        self.padding_rows.add(row)
        self._whole(row, ids, None)

    def occupant(self, row: int, ids: list[Any], src: int | None, base: list[int] | None) -> None:
        """A request's row; ``base``: the ids its request held (at row ``src`` when it moved),
        ``None`` for a request new to the tables."""
        group = self.group
        if src is not None:
            self.hints[row] = self.old_hints[src]
        if src is not None and base is not None and ids == base:
            self.writes.copy_dst.append(row)
            self.writes.copy_src.append(src)
            self.new_latest[row] = base
            self.lengths.append((row, len(base)))
            self._count(group.width)
            return
        if base is not None:
            n, m = len(ids), len(base)
            if n == m and n:
                positions = list(compress(range(n), map(operator.ne, ids, base)))
                if len(positions) <= max(SMALL_CHANGE, n // 4):
                    self._patch(row, ids, src, base, positions)
                    return
            elif m < n <= group.width and ids[:m] == base:
                self._append(row, ids, src, base)
                return
            elif group.kind == "paged" and group.shortest <= n < m and ids == base[:n]:
                self._truncate(row, src, base, n)
                return
        self._whole(row, ids, base)

    def delta(
        self, row: int, ops: object, src: int | None, base: list[int] | None, key: Hashable
    ) -> None:
        """A request's row given as :mod:`blockprep.wire` operations on ``base``, the ids its
        request held (at row ``src`` when it moved; ``None``: new). One operation setting
        positions, appending, or truncating a paged row goes straight to its writes; anything
        else is applied to a copy and decided by value."""
        group = self.group
        if src is None and base is not None and type(ops) is list and len(ops) == 1:
            op = ops[0]  # the steady step: one ring slot (or page) set to a new id, in place
            if type(op) is list and len(op) == 3 and op[0] == SET:
                positions, values = op[1], op[2]
                if type(positions) is list and type(values) is list and len(values) == 1:
                    p, x = positions[0] if len(positions) == 1 else None, values[0]
                    if (
                        type(p) is int
                        and type(x) is int
                        and 0 <= p < len(base)
                        and 0 <= x < group.id_limit
                        and x not in base
                    ):
                        new = base[:]
                        new[p] = _INTERNED[x] if x < INTERNED_IDS else x
                        self._set_one(row, new, p, x)
                        return
        try:
            if base is not None and type(ops) is list and len(ops) == 1 and type(ops[0]) is list:
                op = ops[0]
                tag = op[0] if op else None
                if tag == SET and len(op) == 3:
                    new = set_positions(base, op[1], op[2])
                    positions = [p for p in op[1] if type(new[p]) is not int or new[p] != base[p]]
                    if positions:
                        self._patch(row, new, src, base, positions)
                    elif src is not None:
                        self.occupant(row, base, src, base)
                    return
                if tag == APPEND and len(op) == 2 and type(op[1]) is list and op[1]:
                    new = base + op[1]
                    self._check_length(row, len(new))
                    self._append(row, new, src, base)
                    return
                if tag == TRUNCATE and len(op) == 2 and group.kind == "paged":
                    n, m = truncated_length(op[1], len(base)), len(base)
                    if n == m:
                        if src is not None:
                            self.occupant(row, base, src, base)
                        return
                    self._check_length(row, n)
                    self._truncate(row, src, base, n)
                    return
            ids = apply_ops(ops, base)
        except DeltaMessageError as error:
            raise DeltaMessageError(f"{error} ({_where(self.place, row, group, key)})") from None
        if base is None:
            self._whole(row, ids, None)
        else:
            self.occupant(row, ids, src, base)

    def _set_one(self, row: int, new: list[int], p: int, x: int) -> None:
        """A row that stays in place now holds ``new``: its ids before, with ``x`` (a checked new
        id, not in the row) at position ``p``. One strided write (ring) or one cell (paged)."""
        n, width = len(new), self.group.width
        self.new_latest[row] = new
        self.hints[row] = p + 1 if p + 1 < n else 0
        self.rows_written += 1
        if self.group.kind == "ring":
            self._cells((row, slice(p, width, n)), x, (width - 1 - p) // n + 1)
        else:
            self._cells((row, p), x, 1)

    def finish(self) -> _GroupResult:
        """The group's writes, its rows' ids after the step, ``(row, length)`` of every row
        whose length may have changed, and its hints."""
        whole_rows = self.whole_rows
        if len(whole_rows) >= self.block_rows and self.group.kind == "ring":
            whole_ids, tilings = self._ring_block()
            self.writes.tilings.extend(tilings)
        elif len(whole_rows) >= self.block_rows:
            whole_ids, flat = self._block_ids()
            self.writes.blocks.append(self._check_block(whole_rows, whole_ids, flat))
        else:
            whole_ids = self._row_ids()
            for row, ids in zip(whole_rows, whole_ids, strict=True):
                self._check_row(row, ids)
                self._write_row(row, ids)
        for row, ids in zip(whole_rows, whole_ids, strict=True):
            self.new_latest[row] = ids
            self.hints[row] = 0
            self.lengths.append((row, len(ids)))
        count = len(whole_rows)
        writes = self.writes._replace(
            rows=self.rows_written + count, cell_count=self.cell_count + count * self.group.width
        )
        return _GroupResult(writes, self.new_latest, self.lengths, self.hints)

    # --- decisions --------------------------------------------------------------------------------

    def _patch(
        self, row: int, ids: list[Any], src: int | None, base: list[int], positions: list[int]
    ) -> None:
        """Same length, ``positions`` changed: check and write only those."""
        group = self.group
        new = base[:]
        for p in positions:
            new[p] = _interned(self._new_id(row, ids[p]))
        if len(positions) == 1:  # as the inline path: a new id repeats iff the row holds it
            if new[positions[0]] in base:
                self._repeat(row, new[positions[0]])
        elif len(set(new)) != len(new):
            self._repeat(row, _first_repeat(new))
        self._move(row, src)
        self.new_latest[row] = new
        n, width = len(new), group.width
        self.hints[row] = (positions[-1] + 1) % n if positions else 0
        for p in positions:
            if group.kind == "ring":
                self._cells((row, slice(p, width, n)), new[p], len(range(p, width, n)))
            else:
                self._cells((row, p), new[p], 1)
        self.lengths.append((row, n))
        self.rows_written += 1

    def _append(self, row: int, ids: list[Any], src: int | None, base: list[int]) -> None:
        """A row grown at its end: check the new ids; write them (paged) or re-tile (ring)."""
        m = len(base)
        tail = [_interned(self._new_id(row, x)) for x in ids[m:]]
        new = base + tail
        if (tail[0] in base) if len(tail) == 1 else (len(set(new)) != len(new)):
            self._repeat(row, _first_repeat(new))
        self.new_latest[row] = new
        self.lengths.append((row, len(new)))
        if self.group.kind == "ring":  # every column j % n moves: tile the row whole
            self.hints[row] = 0
            self.writes.tilings.append(_Tiling(row, np.array([new], dtype=np.int32)))
            self._count(self.group.width)
            return
        self._move(row, src)
        value = tail[0] if len(tail) == 1 else np.array(tail, dtype=np.int32)
        self._cells((row, slice(m, len(new))), value, len(tail))
        self.rows_written += 1

    def _truncate(self, row: int, src: int | None, base: list[int], n: int) -> None:
        """A paged row that keeps the first ``n`` of its ``base`` ids: its tail reset to pad."""
        self._move(row, src)
        self.new_latest[row] = base[:n]
        self.lengths.append((row, n))
        self._cells((row, slice(n, len(base))), self.group.pad, len(base) - n)
        self.rows_written += 1

    def _move(self, row: int, src: int | None) -> None:
        """A moved request's row starts as a copy of the row it held."""
        if src is not None:
            self.writes.copy_dst.append(row)
            self.writes.copy_src.append(src)
            self.cell_count += self.group.width

    def _whole(self, row: int, ids: list[Any], base: list[int] | None) -> None:
        """A row written whole: checked in :meth:`finish`, with the other whole rows."""
        self.whole_rows.append(row)
        self.whole_ids.append(ids)
        self.whole_bases.append(base)

    def _row_ids(self) -> list[list[int]]:
        """The whole rows' ids as plain ints, row by row (padding rows as they are)."""
        padding = self.padding_rows
        return [
            ids if row in padding else self._held_ints(row, ids, base)
            for row, ids, base in zip(
                self.whole_rows, self.whole_ids, self.whole_bases, strict=True
            )
        ]

    def _block_ids(self) -> tuple[list[list[int]], npt.NDArray[np.int64]]:
        """The whole paged rows' ids as plain ints and as one flat int64 array."""
        lists = self._plain_ids()
        try:
            return lists, _flat_ids(lists)
        except OverflowError:  # an id beyond int64: out of range
            self._check_rows(self.whole_rows, lists)
            raise

    def _plain_ids(self) -> list[list[Any]]:
        """The whole rows' ids as plain ints: copies of the caller's lists when one pass over
        their types finds nothing but ints (the caller's int objects kept, so an engine that
        passes the same objects again compares by identity), row by row otherwise."""
        raw = self.whole_ids
        if not set(map(type, chain.from_iterable(raw))) <= _INT:
            return self._row_ids()
        padding = self.padding_rows
        rows = self.whole_rows
        return [ids if row in padding else ids[:] for row, ids in zip(rows, raw, strict=True)]

    def _held_ints(self, row: int, ids: list[Any], base: list[int] | None) -> list[int]:
        """``ids`` with every id equal to the held id at its position taken as the held int; any
        other id must be an integer (NumPy integers converted)."""
        if set(map(type, ids)) <= _INT:
            return ids[:]  # never hold the caller's list: a scheduler mutates its lists in place
        held = base or []
        out = []
        for p, x in enumerate(ids):
            if type(x) is not int:
                if p < len(held) and _equal(x, held[p]):
                    x = held[p]
                elif is_integer_id(x):
                    x = operator.index(x)
                else:
                    raise self._type_error(row, x)
            out.append(x)
        return out

    # --- checks -----------------------------------------------------------------------------------

    def _new_id(self, row: int, x: object) -> int:
        """A changed id as a plain int in range (other integers converted)."""
        if type(x) is not int:
            if not is_integer_id(x):
                raise self._type_error(row, x)
            x = operator.index(x)  # type: ignore[arg-type]
        if not 0 <= x < self.group.id_limit:
            self._out_of_range(row, x)
        return x

    def _check_row(self, row: int, ids: list[int]) -> None:
        """A whole row of plain ints: length, range, repeats."""
        if row in self.padding_rows:
            return
        self._check_length(row, len(ids))
        if ids:
            low, high = min(ids), max(ids)
            if low < 0 or high >= self.group.id_limit:
                self._out_of_range(row, low if low < 0 else high)
            if len(set(ids)) != len(ids):
                self._repeat(row, _first_repeat(ids))

    def _check_block(
        self, rows: list[int], lists: list[list[int]], flat: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int32]]:
        """Check many whole paged rows at once (lengths, range, repeats) and render them as one
        ``[k, width]`` block; on a failure, the row by row check names the first bad row."""
        group = self.group
        count = len(lists)
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=count)
        checked = self._checked_mask(rows)
        owner = np.repeat(np.arange(count), lengths)
        mine = checked[owner]
        values = flat[mine]
        bad = bool(lengths[checked].size) and not (
            group.shortest <= lengths[checked].min() and lengths[checked].max() <= group.width
        )
        if not bad and values.size:
            keyed = np.sort(owner[mine] * (INT32_MAX + 1) + values)
            bad = bool(
                values.min() < 0
                or values.max() >= group.id_limit
                or (keyed[1:] == keyed[:-1]).any()
            )
        if bad:
            self._check_rows(rows, lists)
        return np.array(rows, dtype=np.intp), _paged_block(group, lengths, flat)

    def _ring_block(self) -> tuple[list[list[int]], list[_Tiling]]:
        """Many whole ring rows: grouped by length, each length one NumPy conversion, checked per
        length (range, repeats by sorting each row), rendered as tilings."""
        group, rows = self.group, self.whole_rows
        lists = self._plain_ids()
        classes = _ring_classes(lists)
        if classes is None:  # an id beyond int64: out of range
            self._check_rows(rows, lists)
            raise AssertionError("unreachable")
        checked = self._checked_mask(rows)
        for members, ids in classes:
            mine = ids[checked[members]]
            if not mine.shape[0]:
                continue  # padding rows only
            n = ids.shape[1]
            bad = not group.shortest <= n <= group.width
            if not bad and n:
                ranked = np.sort(mine, axis=1)
                bad = bool(
                    ranked[:, 0].min() < 0
                    or ranked[:, -1].max() >= group.id_limit
                    or (ranked[:, 1:] == ranked[:, :-1]).any()
                )
            if bad:
                self._check_rows(rows, lists)
        return lists, _ring_tilings(rows, classes)

    def _checked_mask(self, rows: list[int]) -> npt.NDArray[np.bool_]:
        """Which of ``rows`` are checked (not padding)."""
        padding = self.padding_rows
        if padding.isdisjoint(rows):
            return np.ones(len(rows), dtype=bool)
        return np.fromiter((row not in padding for row in rows), dtype=bool, count=len(rows))

    def _check_rows(self, rows: list[int], lists: list[list[int]]) -> None:
        """The row by row check, after a block check found a fault: raises for the first row."""
        for row, ids in zip(rows, lists, strict=True):
            self._check_row(row, ids)
        raise AssertionError("the block check and the row check disagree")

    def _check_length(self, row: int, n: int) -> None:
        group = self.group
        if n < group.shortest:
            self._value_error(row, f"row has {n} blocks, minimum is {group.shortest}", None)
        if n > group.width:
            self._value_error(row, f"row has {n} blocks, maximum is {group.width}", None)

    def _type_error(self, row: int, x: object) -> BlockIdTypeError:
        name = self.group.name
        return BlockIdTypeError(
            f"{self.place(row)} group {name} holds {x!r} of type {type(x).__name__}; "
            "block IDs must be integers",
            row,
            name,
            x,
        )

    def _out_of_range(self, row: int, x: int) -> NoReturn:
        self._value_error(row, f"block IDs must be in [0, {self.group.id_limit})", x)

    def _repeat(self, row: int, x: int) -> NoReturn:
        self._value_error(row, "a row must not repeat block IDs", x)

    def _value_error(self, row: int, text: str, x: int | None) -> NoReturn:
        """Raise ``text`` naming the place, the group and (when given) the id."""
        name = self.group.name
        place = f"{self.place(row)}, group {name}" + ("" if x is None else f", id {x}")
        raise BlockIdValueError(f"{text} ({place})", row, name, x)

    # --- writes -----------------------------------------------------------------------------------

    def _write_row(self, row: int, ids: list[int]) -> None:
        group = self.group
        array = np.array(ids, dtype=np.int32)
        if group.kind == "ring":
            self.writes.tilings.append(_Tiling(row, array[None, :]))
        else:
            n = len(ids)
            if n:
                self.writes.cells.append(((row, slice(0, n)), array))
            if n < group.width:
                self.writes.cells.append(((row, slice(n, group.width)), group.pad))

    def _cells(self, key: tuple[int, slice | int], value: Any, cells: int) -> None:
        """One assignment into a row (its caller counts the row)."""
        self.writes.cells.append((key, value))
        self.cell_count += cells

    def _count(self, cells: int) -> None:
        """One row written, ``cells`` cells of it."""
        self.rows_written += 1
        self.cell_count += cells


def _touched_rows(touched: set[int], writes: _GroupWrites) -> None:
    """Add the rows ``writes`` write to ``touched``."""
    touched.update(writes.copy_dst)
    for index, _ in writes.blocks:
        touched.update(index.tolist())
    for rows, ids in writes.tilings:
        if isinstance(rows, int):
            touched.update(range(rows, rows + ids.shape[0]))
        else:
            touched.update(rows.tolist())
    touched.update(key[0] for key, _ in writes.cells)


def _checked_adopted(
    groups: Sequence[TableGroup], num_rows: int, buffers: object, slot: int
) -> tuple[Mapping[str, torch.Tensor], torch.Tensor]:
    """One slot's adopted ``(tables, counts)``, checked: int32, CPU, contiguous, shapes."""
    if not isinstance(buffers, tuple) or len(buffers) != 2:
        raise TypeError(f"buffers[{slot}] must be a (tables, counts) pair")
    tables, counts = buffers
    if not isinstance(tables, Mapping):
        raise TypeError(f"buffers[{slot}] tables must map group names to tensors")
    wanted = {g.name: (num_rows, g.width) for g in groups}
    wanted_counts = (num_rows, len(groups))
    for name, shape in [*wanted.items(), ("counts", wanted_counts)]:
        tensor = counts if name == "counts" else tables.get(name)
        where = f"buffers[{slot}][{name!r}]"
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{where} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype != torch.int32 or tensor.device.type != "cpu":
            raise TypeError(
                f"{where} must be an int32 CPU tensor, got {tensor.dtype} on {tensor.device}"
            )
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{where} must have shape {shape}, got {tuple(tensor.shape)}")
        if not tensor.is_contiguous():
            raise ValueError(f"{where} must be contiguous")
    return tables, counts


def _equal(x: object, held: int) -> bool:
    """Whether ``x`` equals ``held`` by value (``6.0``, ``True``, ``np.float64(6)``)."""
    try:
        return bool(x == held)
    except Exception:  # an object whose comparison fails is not the held id
        return False


def _incomparable(
    column: Sequence[Any], group: TableGroup, place: Callable[[int], str]
) -> BlockIdTypeError:
    """The error for the first id of ``column`` that is not a number."""
    for row, ids in enumerate(column):
        for x in ids:
            try:
                bool(x == 0)
            except Exception:
                return BlockIdTypeError(
                    f"{place(row)} group {group.name} holds {x!r} of type "
                    f"{type(x).__name__}; block IDs must be integers",
                    row,
                    group.name,
                    x,
                )
    return BlockIdTypeError(f"group {group.name}: block IDs must be integers", -1, group.name, None)


def _single_difference(ids: list[Any], held: list[int]) -> int:
    """The one position where ``ids`` differ from ``held`` (same length, not equal), or -1
    when they differ in more (or compare oddly): the first difference, then one comparison of
    the rest."""
    try:
        p = next(compress(count(), map(operator.ne, ids, held)))
        return p if ids[p + 1 :] == held[p + 1 :] else -1
    except Exception:  # ids that do not compare as numbers: decided the slow way
        return -1


def _where(place: Callable[[int], str], row: int, group: TableGroup, key: Hashable) -> str:
    return f"{place(row)}, group {group.name}, request {key!r}"


def _interned(x: int) -> int:
    """The shared object for id ``x`` (``x`` itself above :data:`INTERNED_IDS`)."""
    return _INTERNED[x] if 0 <= x < INTERNED_IDS else x


def _first_repeat(ids: list[int]) -> int:
    seen = set()
    for x in ids:
        if x in seen:
            return x
        seen.add(x)
    raise AssertionError("no repeated id")


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


def _flat_ids(lists: list[list[int]]) -> npt.NDArray[np.int64]:
    """Every id of ``lists`` (plain ints), row after row, as one int64 array."""
    total = sum(map(len, lists))
    return np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=total)


def _paged_block(
    group: TableGroup, lengths: npt.NDArray[np.int64], flat: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """The int32 ``[len(lengths), width]`` paged rows holding ``flat`` (row after row), then pad."""
    block = np.full((len(lengths), group.width), group.pad, dtype=np.int32)
    block[np.arange(group.width) < lengths[:, None]] = flat
    return block


class _RingClass(NamedTuple):
    """Whole ring rows of one length: their indices among the whole rows, and their ids."""

    members: list[int]
    ids: npt.NDArray[np.int64]  # [len(members), length]


def _ring_classes(lists: Sequence[Sequence[int]]) -> list[_RingClass] | None:
    """``lists`` (plain ints) grouped by length, each group converted in one NumPy call;
    ``None`` when an id does not fit int64."""
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(lists):
        by_length.setdefault(len(row), []).append(i)
    classes = []
    for n, members in by_length.items():
        try:
            ids = np.array([lists[i] for i in members], dtype=np.int64)
        except OverflowError:
            return None
        classes.append(_RingClass(members, ids.reshape(len(members), n)))
    return classes


def _ring_tilings(rows: list[int], classes: list[_RingClass]) -> list[_Tiling]:
    """Tilings writing ``classes`` into table rows ``rows``: one per length, in place where its
    rows form a run. When all of ``rows`` form a run, the most common length is tiled over the
    whole run first (one in-place tiling, the other rows holding stand-ins that their own
    tilings overwrite after it)."""
    count = len(rows)
    index = np.array(rows, dtype=np.intp)
    tilings: list[_Tiling] = []
    order = sorted(range(len(classes)), key=lambda c: -len(classes[c].members))
    if len(classes[order[0]].members) > 1 and rows[-1] - rows[0] == count - 1:
        members, ids = classes[order.pop(0)]
        whole = np.repeat(ids[:1], count, axis=0)
        whole[members] = ids
        tilings.append(_Tiling(rows[0], whole.astype(np.int32)))
    for c in order:
        members, ids = classes[c]
        if not ids.shape[1]:
            continue  # an empty ring row is never written (the checks reject it)
        targets = index[members]
        run = int(targets[0]) if (np.diff(targets) == 1).all() else None
        tilings.append(_Tiling(targets if run is None else run, ids.astype(np.int32)))
    return tilings
