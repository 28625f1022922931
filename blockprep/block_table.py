"""BlockTable: a persistent block table that writes only what changed and never serves a stale row.

A decode program reads its block table from one buffer whose address it captured. Between two
steps almost nothing in it changes: a paged row gains a page every 128 tokens, a ring row rotates
one slot every 4-8 tokens. ``BlockTable`` owns (or adopts) that buffer and keeps, per row, a copy
of the ids the row holds. A write compares the new ids with that copy before anything else (one list
comparison, no tensor view) and writes only the cells that differ:

- a paged row that grew writes only its new columns; one that shrank resets only its old tail;
- a ring row of the same length whose ids differ in k slots writes only the columns ``j`` with
  ``j % n`` in those slots (about ``k * max_blocks / n`` cells);
- anything else (a new ring length, a row whose content is unknown) rewrites the row.

Rows hold what :func:`blockprep.paged_block_table` (``pad`` after the ids) or
:func:`blockprep.ring_block_table` would build; a cleared row is all ``pad`` for both kinds. A table
that allocates its buffer starts with every row cleared; an adopted buffer's rows are unknown until
written. Not thread-safe: one writer at a time.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, count
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from blockprep.buffers import check_adopted, claim_buffers, host_tensor
from blockprep.ids import (
    INT32_MAX,
    NEGATIVE_ID_MESSAGE,
    NOT_ID_ROWS,
    Kind,
    as_int,
    check_length,
    check_max_blocks,
    check_pad,
    checked_ids,
    has_integer_dtype,
    id_list,
    is_integer_id,
    row_values,
)
from blockprep.tiling import tile_row

RING_SLOT_LOOP_MAX = 4
"""A ring write that changes at most this many slots does one strided write per slot."""

_CLEARED_RING: tuple[()] = ()
"""Cache entry of a cleared ring row: equal to no list, so every write to the row misses."""


_T = TypeVar("_T")

IdsLike = Sequence[int] | npt.NDArray[Any] | torch.Tensor
"""Block ids or positions: a list, a tuple, a 1-D integer NumPy array or tensor."""

RowItems = Mapping[int, _T] | Iterable[tuple[int, _T]]
"""Per-row values of :meth:`BlockTable.apply_deltas`: a ``{row: value}`` mapping or pairs."""

_INT_ONLY = {int}

_WRITE_METHODS = (
    "write_row",
    "write_rows",
    "commit",
    "copy_row",
    "fill_rows",
    "swap_rows",
    "clear_row",
    "append",
    "set_ids",
    "truncate",
    "apply_deltas",
)
"""The methods that write the buffer: ``verify=True`` checks the table after each."""


class StaleRowError(RuntimeError):
    """:meth:`BlockTable.check` found a row whose buffer content differs from its cached ids."""


class UnknownRowError(ValueError):
    """A delta (:meth:`BlockTable.append`, :meth:`~BlockTable.set_ids`,
    :meth:`~BlockTable.truncate`, :meth:`~BlockTable.apply_deltas`) named a row whose ids the
    table does not know: never written by it, or invalidated. Write the row whole first."""


@dataclass(frozen=True)
class BlockTableStats:
    """Counters since the table was made or :meth:`BlockTable.reset_stats` was called.

    ``hits``: writes skipped because the row already held the ids; ``misses``: writes that wrote;
    ``cells_written``: buffer cells written by every operation.
    """

    hits: int
    misses: int
    cells_written: int


class BlockTable:
    """A persistent int32 block table ``[num_rows, max_blocks]`` with a by-value row cache.

    Args:
        num_rows: rows in the table (non-negative).
        max_blocks: columns (positive).
        kind: ``"paged"`` (ids then ``pad``) or ``"ring"`` (``ids[j % n]`` in column j).
        pad: int32 value after a paged row's ids and in every cell of a cleared row.
        buffer: adopt this int32 CPU tensor, contiguous, of shape ``[num_rows, max_blocks]`` or
            flat ``[num_rows * max_blocks]`` (upstream's compiled buffers are flat), instead of
            allocating one. Its content is left as it is and its rows count as unknown.
        pin_memory, share_memory: how to allocate the buffer (see
            :func:`blockprep.buffers.host_tensor`); not with ``buffer``.
        verify: after every write operation (``write_row``, ``write_rows``, ``commit``,
            ``copy_row``, ``fill_rows``, ``swap_rows``, ``clear_row``, ``append``, ``set_ids``,
            ``truncate``, ``apply_deltas``), run :meth:`verify`: every row whose ids the table
            knows is compared with a from-scratch rebuild of those ids through
            :mod:`blockprep.reference`, and :class:`StaleRowError` names the first differing row
            and column. Slow (a rebuild of the whole table per write), off by default: the first
            thing to switch on when wiring blockprep into an engine.

    Errors: a bad id raises what :func:`blockprep.paged_block_table` or
    :func:`blockprep.ring_block_table` would, naming the table row; a bad row index raises
    ``IndexError`` (``TypeError`` for a non-integer). A call that raises has written nothing and
    left the cache as it was.

    The id rule (the grouped tables' rule, :mod:`blockprep.grouped`): an id equal by value to
    the id the row already holds at that position is taken as that held int without another
    check, as upstream's cache did (``[1.0, 2, 3]`` over a row holding ``[1, 2, 3]`` is a hit);
    every other id must be an integer (a plain ``int``, or a NumPy integer, converted), so
    ``[1.0, 2, 3, 4]`` is accepted over ``[1, 2, 3]`` (only the 4 is new) and rejected on a
    fresh row. The cache stores plain ints only: the held ints, never the caller's ``1.0``.
    """

    def __init__(
        self,
        num_rows: int,
        max_blocks: int,
        *,
        kind: Literal["paged", "ring"] = "paged",
        pad: int = -1,
        buffer: torch.Tensor | None = None,
        pin_memory: bool = False,
        share_memory: bool = False,
        verify: bool = False,
    ) -> None:
        if not isinstance(kind, str) or kind not in ("paged", "ring"):
            raise ValueError(f"kind must be 'paged' or 'ring', got {kind!r}")
        num_rows = as_int(num_rows, "num_rows")
        if num_rows < 0:
            raise ValueError(f"num_rows must be non-negative, got {num_rows}")
        max_blocks = check_max_blocks(max_blocks)
        pad = check_pad(pad)
        self._num_rows = num_rows
        self._max_blocks = max_blocks
        self._kind: Kind = kind
        self._pad = pad
        cleared: list[int] | tuple[()] = [] if kind == "paged" else _CLEARED_RING
        self._cleared = cleared
        if buffer is None:
            self._tensor = host_tensor(
                (num_rows, max_blocks),
                torch.int32,
                fill=self._pad,
                pin_memory=pin_memory,
                share_memory=share_memory,
            )
            initial: list[int] | tuple[()] | None = cleared
        else:
            if pin_memory or share_memory:
                raise ValueError("pin_memory and share_memory apply only to an allocated buffer")
            shapes = ((num_rows, max_blocks), (num_rows * max_blocks,))
            check_adopted(buffer, "buffer", dtype=torch.int32, shapes=shapes)
            self._tensor = buffer
            initial = None
        claim_buffers(self, [("buffer", self._tensor)], "BlockTable")  # one owner per byte
        self._flat: npt.NDArray[np.int32] = self._tensor.detach().numpy().reshape(-1)
        self._rows = self._flat.reshape(num_rows, max_blocks)
        # Per row: a copy of the ids the row holds, the cleared marker, or None (unknown).
        self._cached: list[Any] = [initial] * num_rows
        self._next_slot = [0] * num_rows  # ring rows: the slot most likely to rotate next
        # Per row: how many ids it holds (0 when cleared or unknown), kept with every cache entry.
        self._lengths = np.zeros(num_rows, dtype=np.int32)
        self._dirty: set[int] = set()
        self._hits = 0
        self._misses = 0
        self._cells = 0
        self._epoch = 0  # bumped by every write and invalidation: a plan's staleness check
        if verify:  # wrap this table's write methods; the class's own stay as fast as ever
            for name in _WRITE_METHODS:
                setattr(self, name, self._verified(name, getattr(self, name)))

    # --- properties ------------------------------------------------------------------------------

    @property
    def tensor(self) -> torch.Tensor:
        """The persistent buffer: the same object, with the same ``data_ptr()``, for life."""
        return self._tensor

    def numpy(self) -> npt.NDArray[np.int32]:
        """A ``[num_rows, max_blocks]`` NumPy view sharing the buffer's memory."""
        return self._rows

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def max_blocks(self) -> int:
        return self._max_blocks

    @property
    def kind(self) -> Kind:
        return self._kind

    @property
    def pad(self) -> int:
        return self._pad

    @property
    def stats(self) -> BlockTableStats:
        return BlockTableStats(self._hits, self._misses, self._cells)

    def reset_stats(self) -> None:
        self._hits = self._misses = self._cells = 0

    @property
    def lengths(self) -> npt.NDArray[np.int32]:
        """How many ids each row holds, int32 ``[num_rows]`` (0 for a cleared or unknown row).

        A read-only view of the table's own array: it follows every later write.
        """
        view: npt.NDArray[np.int32] = self._lengths.view()
        view.flags.writeable = False
        return view

    def cached_ids(self, row: int) -> list[int] | None:
        """A copy of the ids row ``row`` holds (``[]`` when cleared), or ``None`` when unknown."""
        cached = self._cached[self._row_index(row)]
        return None if cached is None else list(cached)

    def held_rows(self, count: int) -> list[Sequence[int] | None]:
        """The ids rows ``0..count-1`` hold, each as the table's own sequence, without a copy
        (``None``: unknown): read them, never mutate them, and do not keep them past the
        table's next write."""
        rows: list[Sequence[int] | None] = self._cached[:count]
        return rows

    # --- writes ----------------------------------------------------------------------------------

    def write_row(self, row: int, ids: Sequence[int] | npt.NDArray[Any] | torch.Tensor) -> bool:
        """Make row ``row`` hold the kind's layout of ``ids``; return whether anything was written.

        ``ids``: a list, tuple, 1-D integer array or tensor. The caller may mutate it afterwards.
        """
        if type(row) is not int or not 0 <= row < self._num_rows:
            row = self._row_index(row)
        write = None if _listed_hit(ids, self._cached[row]) else self._decide(row, ids)
        if write is None:
            self._hits += 1
            return False
        self._perform(row, ids, write)
        return True

    def write_rows(
        self, rows_ids: Iterable[Sequence[int] | npt.NDArray[Any] | torch.Tensor], start: int = 0
    ) -> int:
        """Write ``rows_ids[i]`` into row ``start + i`` for each i; return how many rows changed.

        All-or-nothing: every row is checked before the first one is written.
        """
        batch = rows_ids if isinstance(rows_ids, list) else list(rows_ids)
        if not batch:
            return 0
        start = self._row_index(start)
        if start + len(batch) > self._num_rows:
            self._row_index(self._num_rows)  # raises, naming the first row past the end
        writes = []
        cache = self._cached
        for row, ids in enumerate(batch, start):
            if _listed_hit(ids, cache[row]):  # the common case, kept to one call
                continue
            write = self._decide(row, ids)
            if write is not None:
                writes.append((row, ids, write))
        self._hits += len(batch) - len(writes)
        for row, ids, write in writes:
            self._perform(row, ids, write)
        return len(writes)

    def plan_rows(self, items: RowItems[IdsLike]) -> RowsPlan:
        """Check writing ``ids`` into each ``row`` of ``(row, ids)`` pairs or a ``{row: ids}``
        mapping (rows in any order, each once) and return the plan; nothing is written.

        The first half of an all-or-nothing step whose other parts (other buffers) are checked
        between the two halves: :meth:`commit` carries the plan out and cannot raise. Raises what
        :meth:`write_rows` raises, and ``ValueError`` for a row given twice.
        """
        writes: list[tuple[int, Any, int | _Plan]] = []
        cache = self._cached
        seen: set[int] = set()
        hits = 0
        for row, ids in _row_items(items):
            if type(row) is not int or not 0 <= row < self._num_rows:
                row = self._row_index(row)
            if row in seen:
                raise ValueError(f"block-table row {row} is given more than once")
            seen.add(row)
            if _listed_hit(ids, cache[row]):
                hits += 1
                continue
            write = self._decide(row, ids)
            if write is None:
                hits += 1
            else:
                writes.append((row, ids, write))
        return RowsPlan(self, self._epoch, [row for row, _, _ in writes], writes, hits)

    def commit(self, plan: RowsPlan) -> int:
        """Carry out a :meth:`plan_rows` plan of this table; return how many rows changed.

        Never raises for a plan made by this table with nothing written in between (the plan
        names the rows it writes: ``plan.rows``); a stale or foreign plan raises ``RuntimeError``
        and writes nothing.
        """
        if plan.table is not self or plan.epoch != self._epoch:
            raise RuntimeError("a block-table plan must be committed to its table before any write")
        self._hits += plan.hits
        for row, ids, write in plan.writes:
            self._perform(row, ids, write)
        return len(plan.writes)

    def copy_row(self, src: int, dst: int) -> bool:
        """Make row ``dst`` a copy of row ``src``; return whether anything was written."""
        return self.fill_rows(src, [dst]) == 1

    def fill_rows(self, src: int, dst_rows: Iterable[int]) -> int:
        """Copy row ``src`` into each of ``dst_rows`` (padding replication); return rows written.

        A destination that already holds the source's ids is skipped, like a write cache hit.
        """
        src = self._row_index(src)
        targets = [self._row_index(row) for row in dst_rows]
        source = self._cached[src]
        written = 0
        for dst in targets:
            if dst == src:
                continue
            if source is not None and self._cached[dst] == source:
                self._hits += 1
                continue
            self._rows[dst] = self._rows[src]
            self._cached[dst] = None if source is None else source[:]
            self._next_slot[dst] = self._next_slot[src]
            self._lengths[dst] = self._lengths[src]
            self._wrote(dst, self._max_blocks)
            written += 1
        return written

    def swap_rows(self, a: int, b: int) -> bool:
        """Exchange rows ``a`` and ``b`` (content and cache); return whether anything changed."""
        a, b = self._row_index(a), self._row_index(b)
        if a == b or (self._cached[a] is not None and self._cached[a] == self._cached[b]):
            return False
        self._rows[[a, b]] = self._rows[[b, a]]
        self._cached[a], self._cached[b] = self._cached[b], self._cached[a]
        self._next_slot[a], self._next_slot[b] = self._next_slot[b], self._next_slot[a]
        self._lengths[[a, b]] = self._lengths[[b, a]]
        self._wrote(a, self._max_blocks)
        self._wrote(b, self._max_blocks)
        return True

    def clear_row(self, row: int) -> bool:
        """Fill row ``row`` with ``pad``; return whether anything was written."""
        row = self._row_index(row)
        if self._cached[row] == self._cleared:
            self._hits += 1
            return False
        cached = self._cached[row]
        if self._kind == "paged" and cached is not None:
            self._rows[row, : len(cached)] = self._pad
            cells = len(cached)
        else:
            self._rows[row] = self._pad
            cells = self._max_blocks
        self._cached[row] = self._cleared
        self._lengths[row] = 0
        self._wrote(row, cells)
        return True

    def invalidate(self, row: int | None = None) -> None:
        """Forget what ``row`` (every row when ``None``) holds: its next write rewrites it whole.

        Call after anything other than this table wrote the buffer.
        """
        self._epoch += 1
        if row is None:
            self._cached = [None] * self._num_rows
            self._lengths[:] = 0
        else:
            row = self._row_index(row)
            self._cached[row] = None
            self._lengths[row] = 0

    # --- deltas --------------------------------------------------------------------------------

    def append(self, row: int, ids: IdsLike) -> int:
        """Row ``row``'s id list grows by ``ids``; return the cells written.

        A paged row writes only its new columns; a ring row's length changes, so it is re-tiled
        whole (every column ``j % n`` moves). The row's ids must be known (written by this table
        since it was made or last invalidated): :class:`UnknownRowError` otherwise. Appending
        nothing writes nothing (a hit), and so does appending nothing to a cleared ring row.
        """
        if type(row) is not int or not 0 <= row < self._num_rows:
            row = self._row_index(row)
        cached = self._known(row)
        values = self._delta_ids(row, ids)
        if not values:
            self._hits += 1
            return 0
        old = len(cached)
        new = old + len(values)
        check_length(row, new, self._max_blocks, self._kind)
        if self._kind == "paged":
            if new - old == 1:
                self._flat[row * self._max_blocks + old] = values[0]
            else:
                self._rows[row, old:new] = values
            if cached is self._cleared:
                self._cached[row] = list(values)
            else:
                cached.extend(values)
            cells = new - old
        else:
            grown = [*cached, *values]
            tile_row(self._rows[row], np.array(grown, dtype=np.int32))
            self._cached[row] = grown
            self._next_slot[row] = 0
            cells = self._max_blocks
        self._lengths[row] = new
        self._wrote(row, cells)
        return cells

    def set_ids(self, row: int, positions: IdsLike, ids: IdsLike) -> int:
        """The ids at ``positions`` of row ``row``'s id list become ``ids``; return cells written.

        A ring row's position ``p`` is ring slot ``p``: one strided write of the columns
        ``j % n == p``; a paged row's is one cell. Positions are unique and within the row's
        length; positions whose id does not change are left alone (all of them: a hit).
        """
        if type(row) is not int or not 0 <= row < self._num_rows:
            row = self._row_index(row)
        cached = self._known(row)
        slots, values = self._delta_sets(row, positions, ids, len(cached))
        changed = [(p, v) for p, v in zip(slots, values, strict=True) if cached[p] != v]
        if not changed:
            self._hits += 1
            return 0
        before = self._cells
        if self._kind == "ring":
            self._write_slots(row, cached, [p for p, _ in changed], [v for _, v in changed])
        else:
            begin = row * self._max_blocks
            if len(changed) <= RING_SLOT_LOOP_MAX:
                for p, v in changed:
                    self._flat[begin + p] = v
            else:
                columns = [p for p, _ in changed]
                self._rows[row, columns] = [v for _, v in changed]
            for p, v in changed:
                cached[p] = v
            self._wrote(row, len(changed))
        return self._cells - before

    def truncate(self, row: int, length: int) -> int:
        """Row ``row`` keeps the first ``length`` of its ids; return the cells written.

        A paged row resets only its dropped tail to ``pad``; a ring row is re-tiled whole. A ring
        row cannot be truncated to nothing (:meth:`clear_row` does that). Keeping every id is a
        hit.
        """
        if type(row) is not int or not 0 <= row < self._num_rows:
            row = self._row_index(row)
        cached = self._known(row)
        length = self._delta_length(row, length, len(cached))
        old = len(cached)
        if length == old:
            self._hits += 1
            return 0
        if self._kind == "paged":
            self._rows[row, length:old] = self._pad
            if length:
                del cached[length:]
            else:
                self._cached[row] = self._cleared
            cells = old - length
        else:
            kept = cached[:length]
            tile_row(self._rows[row], np.array(kept, dtype=np.int32))
            self._cached[row] = kept
            self._next_slot[row] = 0
            cells = self._max_blocks
        self._lengths[row] = length
        self._wrote(row, cells)
        return cells

    def apply_deltas(
        self,
        *,
        truncate: RowItems[int] = (),
        set_ids: Iterable[tuple[int, IdsLike, IdsLike]] = (),
        append: RowItems[IdsLike] = (),
    ) -> int:
        """Apply many rows' deltas at once; return the cells written.

        ``truncate``: ``(row, length)`` pairs or a ``{row: length}`` mapping; ``set_ids``:
        ``(row, positions, ids)`` triples; ``append``: ``(row, ids)`` pairs or a ``{row: ids}``
        mapping. Each means what :meth:`truncate`, :meth:`set_ids` and :meth:`append` mean, in
        that order: a row may appear once in each, its positions are those left after its
        truncation, its appended ids follow them. All-or-nothing: every delta is checked before
        anything is written. Then the buffer is written in a few NumPy calls (one per kind of
        write: paged cells, paged tails reset, ring slots, ring rows re-tiled), whatever the
        number of rows. A row whose deltas change nothing counts as a hit.
        """
        if self._kind == "paged" and not set_ids and isinstance(truncate, dict):
            written = (
                None if type(append) is not dict else self._paged_dict_deltas(truncate, append)
            )
            if written is not None:
                return written
        deltas: dict[int, _Delta] = {}
        for row, length in _row_items(truncate):
            delta = self._delta_entry(deltas, row, "truncate")
            delta.keep = self._delta_length(delta.row, length, delta.keep)
        for item in set_ids:
            row, positions, ids = item
            delta = self._delta_entry(deltas, row, "set_ids")
            slots, values = self._delta_sets(delta.row, positions, ids, delta.keep)
            cached = delta.cached
            delta.sets = [(p, v) for p, v in zip(slots, values, strict=True) if cached[p] != v]
        for row, ids in _row_items(append):
            delta = self._delta_entry(deltas, row, "append")
            delta.appended = self._delta_ids(delta.row, ids)
            if delta.appended:
                length = delta.keep + len(delta.appended)
                check_length(delta.row, length, self._max_blocks, self._kind)
        # Everything is checked: from here on nothing raises.
        changed = [d for d in deltas.values() if d.changes()]
        self._hits += len(deltas) - len(changed)
        if not changed:
            return 0
        before = self._cells
        if self._kind == "paged":
            self._apply_paged(changed)
        else:
            self._apply_ring(changed)
        return self._cells - before

    # --- inspection ------------------------------------------------------------------------------

    def check(self) -> None:
        """Verify every row with known content against the buffer.

        Raises:
            StaleRowError: naming the first row and column whose cell differs from its cached ids
                (something else wrote the buffer; :meth:`invalidate` is the remedy).
        """
        expected = np.empty(self._max_blocks, dtype=np.int32)
        for row, cached in enumerate(self._cached):
            if cached is None:
                continue
            self._layout(expected, cached)
            actual = self._rows[row]
            if not np.array_equal(actual, expected):
                column = int(np.flatnonzero(actual != expected)[0])
                raise StaleRowError(
                    f"block-table row {row} column {column} holds {int(actual[column])}, but its "
                    f"cached ids say {int(expected[column])}; call invalidate() after writing the "
                    "buffer directly"
                )

    def verify(self) -> None:
        """Compare every row whose ids the table knows with a from-scratch rebuild of those ids
        through :mod:`blockprep.reference` (``ring_block_table_repeat``, ``block_table_per_row``;
        a cleared row is all ``pad``), and check that the cache holds plain ints and agrees with
        :attr:`lengths`. Rows of unknown content are skipped. Slow; what ``verify=True`` runs
        after every write.

        Raises:
            StaleRowError: naming the first row (and column) that differs.
        """
        from blockprep import reference  # only here: verification is an opt-in slow path

        width, pad = self._max_blocks, self._pad
        expected = np.full((self._num_rows, width), pad, dtype=np.int32)
        filled: list[int] = []
        rows: list[list[int]] = []
        for row, cached in enumerate(self._cached):
            if cached is None:
                continue
            bad = next((x for x in cached if type(x) is not int), None)
            if bad is not None:
                raise StaleRowError(
                    f"verify: block-table row {row} caches {bad!r} of type {type(bad).__name__}; "
                    "the cache must hold plain ints"
                )
            if len(cached) != int(self._lengths[row]):
                raise StaleRowError(
                    f"verify: block-table row {row} caches {len(cached)} ids, but its length "
                    f"says {int(self._lengths[row])}"
                )
            if cached:
                filled.append(row)
                rows.append(list(cached))
        if rows:
            if self._kind == "ring":
                rebuilt = reference.ring_block_table_repeat(rows, max_blocks=width)
            else:
                rebuilt = reference.block_table_per_row(rows, max_blocks=width, pad=pad)
            expected[filled] = rebuilt.numpy()
        known = np.array([cached is not None for cached in self._cached], dtype=bool)
        differs = (self._rows != expected) & known[:, None]
        if differs.any():
            row, column = (int(i) for i in np.argwhere(differs)[0])
            raise StaleRowError(
                f"verify: block-table row {row} column {column} holds "
                f"{int(self._rows[row, column])}, but a rebuild of its ids through "
                f"blockprep.reference gives {int(expected[row, column])}"
            )

    def _verified(self, name: str, method: Callable[..., _T]) -> Callable[..., _T]:
        """``method``, then :meth:`verify` (the write has happened: the error says after what)."""

        def verified(*args: Any, **kwargs: Any) -> _T:
            result = method(*args, **kwargs)
            try:
                self.verify()
            except StaleRowError as error:
                raise StaleRowError(f"{error} (after {name})") from None
            return result

        verified.__name__ = verified.__qualname__ = name
        verified.__doc__ = method.__doc__
        return verified

    def take_dirty(self) -> list[int]:
        """The rows written since the last call, ascending; the set starts empty again."""
        dirty = sorted(self._dirty)
        self._dirty.clear()
        return dirty

    # --- internals -------------------------------------------------------------------------------

    def _row_index(self, row: object) -> int:
        index = as_int(row, "block-table row index")
        if not 0 <= index < self._num_rows:
            raise IndexError(
                f"block-table row {index} is out of range for a table of {self._num_rows} rows"
            )
        return index

    def _known(self, row: int) -> Any:
        """Row ``row``'s cache entry (a list, or a cleared marker); raises when it is unknown."""
        cached = self._cached[row]
        if cached is None:
            raise UnknownRowError(
                f"block-table row {row} holds unknown ids (never written by this table, or "
                "invalidated): write the whole row with write_row() before a delta"
            )
        return cached

    def _delta_ids(self, row: int, ids: object) -> list[int]:
        """``ids`` of a delta on row ``row`` as plain checked ints (a list the caller may keep
        using: read it, never store it); the module's errors naming the row and the id."""
        if type(ids) is list:  # the common case: plain in-range ints, checked in C
            if len(ids) == 1:
                x = ids[0]
                if type(x) is int and 0 <= x <= INT32_MAX:
                    return ids
            elif not ids or (
                set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) <= INT32_MAX
            ):
                return ids
        label = _label(self._kind)
        values = self._delta_list(row, ids, "ids", "block IDs")
        if not values or (
            set(map(type, values)) == _INT_ONLY and min(values) >= 0 and max(values) <= INT32_MAX
        ):
            return values
        return [_delta_id(label, row, x) for x in values]

    def _delta_list(self, row: int, values: object, what: str, items: str) -> list[Any]:
        """``values`` (a sequence, or a 1-D array or tensor) of a delta on ``row`` as a list;
        ``TypeError`` or ``ValueError`` naming the row. An array of ids must have an integer
        dtype."""
        label = _label(self._kind)
        if isinstance(values, (np.ndarray, torch.Tensor)):
            if values.ndim != 1:
                shape = tuple(values.shape)
                raise ValueError(
                    f"{label} row {row} {what} must be one-dimensional, got shape {shape}"
                )
            if what == "ids" and not has_integer_dtype(values):
                raise TypeError(
                    f"{label} row {row} has dtype {values.dtype}; block IDs must be integers"
                )
            if isinstance(values, torch.Tensor) and values.is_meta:
                raise ValueError(f"{label} row {row} {what} are on the meta device: no values")
            listed: list[Any] = values.tolist()
            return listed
        if isinstance(values, NOT_ID_ROWS) or not isinstance(values, Sequence):
            name = type(values).__name__
            raise TypeError(f"{label} row {row} {what} must be a sequence of {items}, got {name}")
        return values if type(values) is list else list(values)

    def _delta_sets(
        self, row: int, positions: object, ids: object, length: int
    ) -> tuple[list[int], list[int]]:
        """Checked positions (unique, within ``length`` ids) and ids of a ``set_ids`` on ``row``."""
        label = _label(self._kind)
        slots = self._delta_list(row, positions, "positions", "ints")
        values = self._delta_ids(row, ids)
        if len(slots) != len(values):
            raise ValueError(
                f"{label} row {row} has {len(slots)} positions but {len(values)} ids to set there"
            )
        if (
            slots
            and set(map(type, slots)) == _INT_ONLY
            and min(slots) >= 0
            and max(slots) < length
            and len(set(slots)) == len(slots)
        ):
            return slots, values
        seen: set[int] = set()
        for p in slots:
            index = as_int(p, f"{label} row {row} position")
            if not 0 <= index < length:
                raise IndexError(
                    f"{label} row {row} position {index} is out of range for its {length} ids"
                )
            if index in seen:
                raise ValueError(f"{label} row {row} position {index} is given more than once")
            seen.add(index)
        return [operator.index(p) for p in slots], values

    def _delta_length(self, row: int, length: object, old: int) -> int:
        """A checked ``truncate`` length for ``row``, which holds ``old`` ids."""
        label = _label(self._kind)
        keep = as_int(length, f"{label} row {row} truncate length")
        if not 0 <= keep <= old:
            raise ValueError(f"{label} row {row} cannot be truncated to {keep} ids: it holds {old}")
        if keep == 0 and old and self._kind == "ring":
            raise ValueError(
                f"ring block-table row {row} cannot be truncated to 0 ids; use clear_row()"
            )
        return keep

    def _delta_entry(self, deltas: dict[int, _Delta], row: object, what: str) -> _Delta:
        """The pending delta of ``row`` in an :meth:`apply_deltas` call (made on first use)."""
        index = row if type(row) is int and 0 <= row < self._num_rows else self._row_index(row)
        delta = deltas.get(index)
        if delta is None:
            cached = self._known(index)
            delta = deltas[index] = _Delta(index, cached, len(cached))
        if what in delta.kinds:
            raise ValueError(
                f"{_label(self._kind)} row {index} appears more than once in {what} "
                "(one delta of each kind per row and call)"
            )
        delta.kinds.add(what)
        return delta

    def _settle(self, delta: _Delta) -> list[int]:
        """Give ``delta.row`` its new cache entry, length and counters (not the buffer)."""
        row, cached = delta.row, delta.cached
        ids = cached if type(cached) is list and cached is not self._cleared else list(cached)
        del ids[delta.keep :]
        for p, v in delta.sets:
            ids[p] = v
        ids.extend(delta.appended)
        self._cached[row] = ids if ids else self._cleared
        self._lengths[row] = len(ids)
        return ids

    def _paged_dict_deltas(self, truncate: dict[Any, Any], append: dict[Any, Any]) -> int | None:
        """:meth:`apply_deltas` on a paged table for ``{row: length}`` and ``{row: ids}`` dicts of
        plain ints and int lists (a scheduler step): one checking pass, then one slice write per
        row, without per-row objects. ``None``, having changed nothing, when anything is not of that
        form or not valid: the general path then decides, and raises the right error."""
        num_rows, width, cache = self._num_rows, self._max_blocks, self._cached
        for row, keep in truncate.items():
            if type(row) is not int or not 0 <= row < num_rows or type(keep) is not int:
                return None
            cached = cache[row]
            if cached is None or not 0 <= keep <= len(cached):
                return None
        for row, ids in append.items():
            if type(row) is not int or not 0 <= row < num_rows or type(ids) is not list:
                return None
            cached = cache[row]
            if cached is None:
                return None
            if len(ids) == 1:
                x = ids[0]
                if type(x) is not int or not 0 <= x <= INT32_MAX:
                    return None
            elif ids and (set(map(type, ids)) != _INT_ONLY or min(ids) < 0 or max(ids) > INT32_MAX):
                return None
            if truncate.get(row, len(cached)) + len(ids) > width:
                return None
        # Everything is checked: from here on nothing raises. Small steps are the common case,
        # so each row is written with a slice as it comes: no index arrays to build.
        cleared, flat, pad = self._cleared, self._flat, self._pad
        lengths, dirty = self._lengths, self._dirty
        changed = written = 0
        for row, keep in truncate.items():
            cached = cache[row]
            old = len(cached)
            if keep == old:
                continue
            ids = append.get(row)
            new = keep + len(ids) if ids else keep
            if new < old:
                begin = row * width
                flat[begin + new : begin + old] = pad
                written += old - new
            if keep:
                del cached[keep:]
            else:
                cache[row] = cleared
            if not ids:
                lengths[row] = keep
                dirty.add(row)
                changed += 1
        for row, ids in append.items():
            if not ids:
                continue
            cached = cache[row]
            old = len(cached)
            count = len(ids)
            begin = row * width + old
            if count == 1:
                flat[begin] = ids[0]
            else:
                flat[begin : begin + count] = ids
            if cached is cleared:
                cache[row] = ids[:]
            else:
                cached.extend(ids)
            lengths[row] = old + count
            dirty.add(row)
            changed += 1
            written += count
        touched = len(truncate) + len(append)
        if truncate and append:
            touched -= len(truncate.keys() & append.keys())
        self._hits += touched - changed
        if changed:
            self._epoch += 1
            self._misses += changed
            self._cells += written
        return written

    def _apply_paged(self, changed: list[_Delta]) -> None:
        """Paged rows: new cells in one scatter, dropped tails reset in another. Never raises."""
        width = self._max_blocks
        cells: list[int] = []  # set_ids cells, then the appended spans
        values: list[int] = []  # their ids, in the same order
        appended: list[int] = []
        starts, counts, tails, tail_counts = [], [], [], []
        for delta in changed:
            begin = delta.row * width
            old, keep = len(delta.cached), delta.keep
            new = keep + len(delta.appended)
            for p, v in delta.sets:
                cells.append(begin + p)
                values.append(v)
            if delta.appended:
                starts.append(begin + keep)
                counts.append(len(delta.appended))
                appended.extend(delta.appended)
            if new < old:
                tails.append(begin + new)
                tail_counts.append(old - new)
            self._settle(delta)
            self._wrote(delta.row, len(delta.sets) + len(delta.appended) + max(old - new, 0))
        if tails:
            self._flat[_spans(tails, tail_counts)] = self._pad
        if cells or appended:
            index = np.concatenate([np.array(cells, dtype=np.int64), _spans(starts, counts)])
            self._flat[index] = np.array(values + appended, dtype=np.int32)

    def _apply_ring(self, changed: list[_Delta]) -> None:
        """Ring rows: those of a new length re-tiled in one gather, the others' changed slots in
        one strided scatter. Never raises."""
        width = self._max_blocks
        tiled_rows: list[int] = []
        tiled: list[list[int]] = []
        starts: list[int] = []
        counts: list[int] = []
        steps: list[int] = []
        values: list[int] = []
        for delta in changed:
            row, old = delta.row, len(delta.cached)
            ids = self._settle(delta)
            n = len(ids)
            if delta.keep != old or delta.appended:  # a new length, at least for a moment
                tiled_rows.append(row)
                tiled.append(ids)
                self._next_slot[row] = 0
                self._wrote(row, width)
                continue
            written = 0
            for p, v in delta.sets:
                count = (width - 1 - p) // n + 1
                starts.append(row * width + p)
                counts.append(count)
                steps.append(n)
                values.append(v)
                written += count
            self._next_slot[row] = (delta.sets[-1][0] + 1) % n
            self._wrote(row, written)
        if tiled_rows:
            lengths = np.array(list(map(len, tiled)), dtype=np.int64)
            offsets = np.cumsum(lengths) - lengths
            flat_ids = np.array(list(chain.from_iterable(tiled)), dtype=np.int32)
            index = np.arange(width)[None, :] % lengths[:, None] + offsets[:, None]
            self._rows[tiled_rows] = flat_ids[index]
        if starts:
            index = _spans(starts, counts, steps)
            self._flat[index] = np.repeat(np.array(values, dtype=np.int32), counts)

    def _decide(self, row: int, ids: Any) -> int | _Plan | None:
        """What writing ``ids`` into ``row`` takes, checked, nothing changed (callers have ruled
        out a list equal to the cached ids): a slot number for the predicted ring rotation (list
        ids only: one comparison and one strided write); ``None`` for a hit in another container;
        otherwise a :class:`_Plan`. Raises on bad ids."""
        if type(ids) is list:
            slot = self._predicted_rotation(row, ids)
            if slot >= 0:
                return slot
        return self._plan(row, ids)

    def _perform(self, row: int, ids: Any, write: int | _Plan) -> None:
        """Carry out a :meth:`_decide` result. Never raises."""
        if isinstance(write, int):
            self._write_rotation(row, len(ids), write, ids[write])
        else:
            self._apply(row, write)

    def _plan(self, row: int, ids: object) -> _Plan | None:
        """``None`` when ``row`` already holds ``ids`` (a cache hit: one comparison, no view);
        else the checked cells to write. Raises on bad ids, having changed nothing."""
        cached = self._cached[row]
        key = ids if type(ids) is list else id_list(ids)
        if key is None or not isinstance(cached, list):
            return self._full_plan(row, ids, key)
        try:
            if key == cached:
                return None
            if self._kind == "paged":
                start = self._changed_from(row, key, cached)
                # The id rule: ids before ``start`` equal the held ones by value and are taken
                # as the held ints (the cache never stores the caller's 1.0 or np.int64).
                values = self._checked(row, key[start:])
                return _Plan(cached[:start] + values, start, None, values)
            if len(key) != len(cached):
                return self._full_plan(row, ids, key)
            slots = self._changed_slots(row, key, cached)
            return _Plan(key, 0, slots, self._checked(row, [key[s] for s in slots]))
        except (TypeError, ValueError):
            # Bad ids, or ids whose comparison raises: the whole-row check raises the right error.
            return self._full_plan(row, ids, key)

    def _changed_from(self, row: int, key: list[Any], cached: list[Any]) -> int:
        """First column where paged ids ``key`` differ from ``cached`` (lengths may differ)."""
        check_length(row, len(key), self._max_blocks, self._kind)
        old, new = len(cached), len(key)
        if new >= old and key[:old] == cached:
            return old
        if new < old and cached[:new] == key:
            return new
        return next(i for i, (a, b) in enumerate(zip(key, cached, strict=False)) if a != b)

    def _predicted_rotation(self, row: int, ids: list[Any]) -> int:
        """The steady-state ring write: the one slot where ``ids`` differ from the row's cached
        ids, when it holds a plain in-range int; else -1 (:meth:`_plan` decides). Changes nothing.

        The slot predicted to rotate next is tried first (one list comparison); when that slot
        did not change (a scheduler that rotates out of order), one C-level pass finds the
        changed slots instead, so an unpredicted rotation costs about what a predicted one does.
        """
        cached = self._cached[row]
        if self._kind != "ring" or type(cached) is not list or len(ids) != len(cached):
            return -1
        slot = self._next_slot[row]
        value, old = ids[slot], cached[slot]
        if type(value) is int and value == old:
            try:  # the first slot that differs, then whether the rest is equal (C-level)
                slot = next(compress(count(), map(operator.ne, ids, cached)))
                value = ids[slot]
                single = ids[slot + 1 :] == cached[slot + 1 :]
            except (TypeError, ValueError):
                return -1
            return slot if single and type(value) is int and 0 <= value <= INT32_MAX else -1
        if type(value) is not int or not 0 <= value <= INT32_MAX or value == old:
            return -1
        cached[slot] = value
        try:
            rotated = ids == cached
        except (TypeError, ValueError):
            rotated = False
        finally:
            cached[slot] = old
        return slot if rotated else -1

    def _write_rotation(self, row: int, n: int, slot: int, value: int) -> None:
        """Ring row of ``n`` ids: slot ``slot`` now holds ``value`` (columns ``j % n == slot``)."""
        width = self._max_blocks
        begin = row * width
        self._flat[begin + slot : begin + width : n] = value
        self._cached[row][slot] = value
        self._next_slot[row] = (slot + 1) % n
        self._wrote(row, (width - 1 - slot) // n + 1)

    def _checked(self, row: int, ids: list[Any]) -> list[int]:
        """``ids`` (a row's new ids) as checked ints; plain in-range ints pass without a copy."""
        for x in ids:
            if type(x) is not int or not 0 <= x <= INT32_MAX:
                values: list[int] = checked_ids(row, ids, self._kind).tolist()
                return values
        return ids

    def _full_plan(self, row: int, ids: object, key: list[Any] | None) -> _Plan:
        plain = key is not None and set(map(type, key)) <= _INT_ONLY
        held = self._cached[row]
        if key is not None and not plain and type(held) is list and held:
            # The id rule: an id equal by value to the held id at its position is the held int
            # (so it needs no type check); only the others must be integers.
            ids = key = _as_held(key, held)
            plain = set(map(type, key)) <= _INT_ONLY
        values = row_values(row, ids, self._max_blocks, self._kind).astype(np.int32, copy=False)
        if np.may_share_memory(values, self._flat):  # ids read from this table: copy them first
            values = values.copy()
        # Cache the caller's own int objects: the next comparison then matches by identity.
        cache = values.tolist() if not plain or key is None else key[:] if key is ids else key
        return _Plan(cache, 0, None, values, full=True)

    def _changed_slots(self, row: int, key: list[Any], cached: list[Any]) -> list[int]:
        """Slots where ``key`` differs from ``cached`` (equal lengths, not equal).

        Rings rotate their slots in order, so the slots after the last one that changed are
        tried first: patch them into the cached copy one by one (up to ``RING_SLOT_LOOP_MAX``,
        for a table that catches up several rotations at once) and compare the whole lists, in
        C, after each; the copy is restored whatever happens. Anything else: a full comparison.
        """
        n = len(key)
        slot = self._next_slot[row]
        patched: list[tuple[int, Any]] = []
        try:
            for _ in range(min(RING_SLOT_LOOP_MAX, n)):
                if key[slot] == cached[slot]:
                    break
                patched.append((slot, cached[slot]))
                cached[slot] = key[slot]
                if key == cached:
                    return [changed for changed, _ in patched]
                slot = (slot + 1) % n
        finally:
            for changed, old in reversed(patched):
                cached[changed] = old
        return list(compress(range(n), map(operator.ne, key, cached)))

    def _apply(self, row: int, plan: _Plan) -> None:
        """Write a checked plan into the buffer and the cache. Never raises."""
        if plan.slots is not None:
            self._write_slots(row, plan.ids, plan.slots, plan.values)
        elif plan.full:
            self._write_whole(row, plan)
        else:
            self._write_columns(row, plan)

    def _write_whole(self, row: int, plan: _Plan) -> None:
        dst = self._rows[row]
        if self._kind == "ring":
            tile_row(dst, np.asarray(plan.values))
        else:
            n = len(plan.values)
            dst[:n] = plan.values
            dst[n:] = self._pad
        self._cached[row] = plan.ids
        self._next_slot[row] = 0
        self._lengths[row] = len(plan.ids)
        self._wrote(row, self._max_blocks)

    def _write_slots(self, row: int, ids: list[Any], slots: list[int], values: Any) -> None:
        """Ring row: rewrite the columns ``j`` with ``j % n`` in ``slots``, strided."""
        n, width = len(ids), self._max_blocks
        if len(slots) == 1:
            self._write_rotation(row, n, slots[0], values[0])
            return
        if len(slots) <= RING_SLOT_LOOP_MAX:
            begin, end = row * width, (row + 1) * width
            for slot, value in zip(slots, values, strict=True):
                self._flat[begin + slot : end : n] = value
        else:
            dst = self._rows[row]
            whole = width - width % n
            columns, cells = np.array(slots), np.array(values, dtype=np.int32)
            dst[:whole].reshape(-1, n)[:, columns] = cells
            tail = columns < width - whole
            dst[whole:][columns[tail]] = cells[tail]
        cached = self._cached[row]
        written = 0
        for slot, value in zip(slots, values, strict=True):
            cached[slot] = value
            written += (width - 1 - slot) // n + 1
        self._next_slot[row] = (slots[-1] + 1) % n
        self._wrote(row, written)

    def _write_columns(self, row: int, plan: _Plan) -> None:
        """Paged row: write ``ids[start:]``, then reset what is left of the old row to ``pad``."""
        dst = self._rows[row]
        start, new_length, old_length = plan.start, len(plan.ids), len(self._cached[row])
        dst[start:new_length] = plan.values
        if old_length > new_length:
            dst[new_length:old_length] = self._pad
        self._cached[row] = plan.ids[:]
        self._lengths[row] = new_length
        self._wrote(row, max(new_length, old_length) - start)

    def _wrote(self, row: int, cells: int) -> None:
        self._dirty.add(row)
        self._epoch += 1
        self._misses += 1
        self._cells += cells

    def _layout(self, dst: npt.NDArray[np.int32], cached: Any) -> None:
        """The row that ``cached`` ids make, written into ``dst``."""
        if not cached:
            dst[...] = self._pad
        elif self._kind == "ring":
            tile_row(dst, np.array(cached, dtype=np.int32))
        else:
            dst[: len(cached)] = cached
            dst[len(cached) :] = self._pad


@dataclass(eq=False, slots=True)
class _Delta:
    """One row's pending deltas in :meth:`BlockTable.apply_deltas`: its cache entry, the length
    it keeps, the ``(position, id)`` pairs that change and the ids appended."""

    row: int
    cached: Any
    keep: int
    sets: list[tuple[int, int]] = field(default_factory=list)
    appended: list[int] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)

    def changes(self) -> bool:
        return bool(self.sets or self.appended or self.keep != len(self.cached))


def _row_items(items: RowItems[_T]) -> Iterable[tuple[int, _T]]:
    """``(row, value)`` pairs from a mapping or an iterable of pairs."""
    if isinstance(items, Mapping):
        return items.items()
    return items


def _spans(
    starts: Sequence[int], counts: Sequence[int], steps: Sequence[int] | None = None
) -> npt.NDArray[np.int64]:
    """Flat indices ``starts[i] + steps[i] * k`` for ``k < counts[i]``, span after span."""
    count = np.array(counts, dtype=np.int64)
    total = int(count.sum())
    local = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    if steps is not None:
        local *= np.repeat(np.array(steps, dtype=np.int64), count)
    result: npt.NDArray[np.int64] = np.repeat(np.array(starts, dtype=np.int64), count) + local
    return result


def _label(kind: Kind) -> str:
    return "ring block-table" if kind == "ring" else "block-table"


def _delta_id(label: str, row: int, x: object) -> int:
    """One id of a delta on ``row``, checked: errors name the row and the id."""
    if not is_integer_id(x):
        name = type(x).__name__
        raise TypeError(f"{label} row {row} holds {x!r} of type {name}; block IDs must be integers")
    value = operator.index(x)  # type: ignore[arg-type]
    if value < 0:
        raise ValueError(f"{NEGATIVE_ID_MESSAGE} ({label} row {row}, id {value})")
    if value > INT32_MAX:
        raise ValueError(f"{label} row {row} holds block ID {value}, maximum is {INT32_MAX}")
    return value


class RowsPlan(NamedTuple):
    """A checked :meth:`BlockTable.plan_rows` step, for :meth:`BlockTable.commit`: ``rows``, the
    rows it writes (the others already hold their ids), in the order given."""

    table: BlockTable
    epoch: int
    rows: list[int]
    writes: list[tuple[int, Any, int | _Plan]]
    hits: int


class _Plan(NamedTuple):
    """Cells one write will change, checked and ready to apply.

    ``ids``: the row's new ids (the cache entry). ``values``: the ids to write: the whole row
    (int32) when ``full``; else for a ring the values of ``slots``; for a paged row ``ids[start:]``.
    """

    ids: list[Any]
    start: int
    slots: list[int] | None
    values: npt.NDArray[np.int32] | list[int]
    full: bool = False


def _as_held(key: list[Any], held: list[int]) -> list[Any]:
    """``key`` with each non-int scalar that equals the held id at its position by value
    replaced by that held int (``[1.0, 2, 5.0]`` over ``[1, 2, 3]``: ``[1, 2, 5.0]``)."""
    result = list(key)
    for i, (x, old) in enumerate(zip(key, held, strict=False)):
        if type(x) is int or getattr(x, "ndim", 0) != 0 or isinstance(x, (list, tuple)):
            continue
        try:
            if bool(x == old):
                result[i] = old
        except (TypeError, ValueError, RuntimeError):
            continue
    return result


def _listed_hit(ids: object, cached: Any) -> bool:
    """A cache hit on the fast path: ``ids`` is a list equal to the cached ids (a comparison
    that raises is no hit; other containers go through :meth:`BlockTable._plan`)."""
    if type(ids) is not list:
        return False
    try:
        return bool(ids == cached)
    except (TypeError, ValueError):
        return False
