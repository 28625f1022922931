"""BlockTable: a persistent block table that writes only what changed and never serves a stale row.

A decode program reads its block table from one buffer whose address it captured. Between two
steps almost nothing in it changes: a paged row gains a page every 128 tokens, a ring row rotates
one slot every 4-8 tokens. ``BlockTable`` owns (or adopts) that buffer and is a thin face of the
table engine (:mod:`blockprep._engine`): one :class:`~blockprep._engine.GroupKernel` (one group, one
buffer slot) holds the ids each row holds, compares a write's ids with them and writes only the
cells that differ:

- a paged row writes the positions whose id changed (a grown row its new columns, a shrunk one
  its old tail reset to ``pad``), a range of them when more than four changed;
- a ring row of the same length whose ids differ in at most four slots writes only the columns
  ``j`` with ``j % n`` in those slots (about ``k * max_blocks / n`` cells);
- anything else (a new ring length, a row whose content is unknown) rewrites the row.

Rows hold what :func:`blockprep.paged_block_table` (``pad`` after the ids) or
:func:`blockprep.ring_block_table` would build; a cleared row is all ``pad`` for both kinds. A table
that allocates its buffer starts with every row cleared; an adopted buffer's rows are unknown until
written. Every call checks everything before it writes anything. Not thread-safe: one writer at a
time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from blockprep._engine import GroupKernel, kernel_buffer
from blockprep._engine.rules import ROW_APPEND, ROW_CLEAR, ROW_COPY, ROW_WHOLE
from blockprep._faults import convert, raise_row
from blockprep._ids import INT32_MAX, Kind, as_int, check_max_blocks, check_pad, id_list
from blockprep._row_deltas import Changes, RowDeltas, RowItems, row_items
from blockprep._row_deltas import RowsPlan as RowsPlan  # re-exported
from blockprep._table_checks import check_table, verify_table
from blockprep.buffers import check_adopted, claim_buffers, host_tensor
from blockprep.errors import (
    BlockprepIndexError,
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)
from blockprep.errors import StaleRowError as StaleRowError  # re-exported
from blockprep.errors import UnknownRowError as UnknownRowError  # re-exported
from blockprep.wire import SET, TRUNCATE, DeltaCursor

_T = TypeVar("_T")

IdsLike = Sequence[int] | npt.NDArray[Any] | torch.Tensor
"""Block ids or positions: a list, a tuple, a 1-D integer NumPy array or tensor."""

_WRITE_METHODS = (
    *("write_row", "write_rows", "commit", "copy_row", "fill_rows", "swap_rows", "clear_row"),
    *("append", "set_ids", "truncate", "apply_deltas", "apply_packed"),
)
"""The methods that write the buffer: ``verify=True`` checks the table after each."""


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
    fresh row. The table holds plain int32 ids only: the held ints, never the caller's ``1.0``.
    Ids may repeat within a row (the builders' rule).
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
            raise BlockprepValueError(f"kind must be 'paged' or 'ring', got {kind!r}")
        num_rows = as_int(num_rows, "num_rows")
        if num_rows < 0:
            raise BlockprepValueError(f"num_rows must be non-negative, got {num_rows}")
        max_blocks = check_max_blocks(max_blocks)
        pad = check_pad(pad)
        self._num_rows = num_rows
        self._max_blocks = max_blocks
        self._kind: Kind = kind
        self._ring = kind == "ring"
        self._pad = pad
        if buffer is None:
            self._tensor = host_tensor(
                (num_rows, max_blocks),
                torch.int32,
                fill=self._pad,
                pin_memory=pin_memory,
                share_memory=share_memory,
            )
        else:
            if pin_memory or share_memory:
                raise BlockprepValueError(
                    "pin_memory and share_memory apply only to an allocated buffer"
                )
            shapes = ((num_rows, max_blocks), (num_rows * max_blocks,))
            check_adopted(buffer, "buffer", dtype=torch.int32, shapes=shapes)
            self._tensor = buffer
        claim_buffers(self, [("buffer", self._tensor)], "BlockTable")  # one owner per byte
        self._flat: npt.NDArray[np.int32] = self._tensor.detach().numpy().reshape(-1)
        self._rows = self._flat.reshape(num_rows, max_blocks)
        shortest = 1 if self._ring else 0
        self._kernel = GroupKernel(
            self._ring, max_blocks, INT32_MAX + 1, shortest, pad, num_rows, 1, distinct=False
        )
        self._stay = list(range(num_rows))  # every row's ids come from the row itself
        self._counts = np.zeros((num_rows, 1), dtype=np.int32)  # the kernel writes the lengths
        self._lengths: npt.NDArray[np.int32] = self._counts[:, 0]
        self._kernel_buffers = (kernel_buffer(self._rows), kernel_buffer(self._counts))
        empty, _ = self._kernel.stage([], [], self._stay, convert)
        assert empty is not None
        self._empty = empty  # a plan of no change
        self._kernel.forget(-1)  # an adopted buffer: rows unknown, cells left as they are
        if buffer is None:  # every row cleared: rendered once more (the fill wrote pad already)
            self._kernel.clear(-1)
            self._kernel.commit(self._empty, 0, *self._kernel_buffers, 0, False)
        self._kernel.bind(*self._kernel_buffers, 0)  # apply_row: one row's change at once
        self._deltas = RowDeltas(self)
        self._dirty: set[int] = set()
        self._hits = 0
        self._misses = 0
        self._cells = 0
        self._epoch = 0  # bumped by every write and invalidation: a plan's staleness check
        self._pending: list[tuple[int, int, list[int]]] = []  # apply_step results, uncounted
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
        if self._pending:
            self._fold()
        return BlockTableStats(self._hits, self._misses, self._cells)

    def reset_stats(self) -> None:
        if self._pending:
            self._fold()  # their rows are dirty still
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
        return self._kernel.held(self._row_index(row))

    def knows(self, row: int) -> bool:
        """Whether the table knows the ids row ``row`` holds (``cached_ids`` is not ``None``)."""
        return self._kernel.length(self._row_index(row)) >= 0

    def held_rows(self, count: int) -> list[list[int] | None]:
        """The ids rows ``0..count-1`` hold, each a new list (``None``: unknown)."""
        held = self._kernel.held
        return [held(row) for row in range(count)]

    # --- writes ----------------------------------------------------------------------------------

    def write_row(self, row: int, ids: IdsLike) -> bool:
        """Make row ``row`` hold the kind's layout of ``ids``; return whether anything was written.

        ``ids``: a list, tuple, 1-D integer array or tensor. The caller may mutate it afterwards.
        """
        cells = self._apply_row(ROW_WHOLE, row, ids)  # plain ints: decided at once
        if cells is not None:
            return cells > 0
        if type(row) is not int or not 0 <= row < self._num_rows:
            row = self._row_index(row)
        listed = ids if type(ids) is list else self._listed(row, ids)
        plan, fault = self._kernel.stage([row], [listed], self._stay, convert)
        if fault is not None or (self._ring and not listed):
            self._raise_rows([row], [listed], fault)
        if not plan:
            self._hits += 1
            return False
        self._render(plan, False, [row])
        return True

    def write_rows(self, rows_ids: Iterable[IdsLike], start: int = 0) -> int:
        """Write ``rows_ids[i]`` into row ``start + i`` for each i; return how many rows changed.

        All-or-nothing: every row is checked before the first one is written.
        """
        if not isinstance(rows_ids, list) and not isinstance(rows_ids, Iterable):
            raise BlockprepTypeError(
                f"rows_ids must be a sequence of id rows, got {type(rows_ids).__name__}"
            )
        batch = rows_ids if isinstance(rows_ids, list) else list(rows_ids)
        if not batch:
            return 0
        start = self._row_index(start)
        if start + len(batch) > self._num_rows:
            self._row_index(self._num_rows)  # raises, naming the first row past the end
        every = start == 0 and len(batch) == self._num_rows
        rows = self._stay if every else list(range(start, start + len(batch)))
        visited = None if every else rows
        try:  # the caller's lists as they are: the kernel checks that each row is one
            lists: list[list[Any]] = batch  # type: ignore[assignment]
            plan, fault = self._kernel.stage(visited, lists, self._stay, convert)
        except TypeError:  # a row that is no list (a tuple, an array): converted, staged again
            lists = self._lists(rows, batch)
            plan, fault = self._kernel.stage(visited, lists, self._stay, convert)
        if fault is not None or (self._ring and not all(lists)):
            self._raise_rows(rows, lists, fault)
        written = self._render(plan, True)[0] if plan else 0
        self._hits += len(batch) - written
        return written

    def plan_rows(self, items: RowItems[IdsLike]) -> RowsPlan:
        """Check writing ``ids`` into each ``row`` of ``(row, ids)`` pairs or a ``{row: ids}``
        mapping (rows in any order, each once) and return the plan; nothing is written.

        The first half of an all-or-nothing step whose other parts (other buffers) are checked
        between the two halves: :meth:`commit` carries the plan out and cannot raise. Raises what
        :meth:`write_rows` raises, ``ValueError`` for a row given twice, ``TypeError`` for
        ``items`` that are not pairs or a mapping.
        """
        rows: list[int] = []
        lists: list[list[Any]] = []
        try:
            seen: set[int] = set()
            for row, ids in row_items(items, "plan_rows"):
                if type(row) is not int or not 0 <= row < self._num_rows:
                    row = self._row_index(row)
                if row in seen:
                    raise BlockprepValueError(f"block-table row {row} is given more than once")
                seen.add(row)
                lists.append(ids if type(ids) is list else self._listed(row, ids))
                rows.append(row)
        except (TypeError, ValueError, IndexError):
            self._check_listed(rows, lists)  # an earlier row's bad ids come first
            raise
        plan, fault = self._kernel.stage(rows, lists, self._stay, convert)
        if fault is not None or (self._ring and not all(lists)):
            self._raise_rows(rows, lists, fault)
        assert plan is not None
        changed = self._kernel.rows_of(plan)
        if self._pending:
            self._fold()
        return RowsPlan(self, self._epoch, changed, plan, len(rows) - len(changed))

    def commit(self, plan: RowsPlan) -> int:
        """Carry out a :meth:`plan_rows` plan of this table; return how many rows changed.

        Never raises for a plan made by this table with nothing written in between (the plan
        names the rows it writes: ``plan.rows``); a stale or foreign plan raises ``RuntimeError``
        and writes nothing.
        """
        if self._pending:
            self._fold()
        if plan.table is not self or plan.epoch != self._epoch:
            raise BlockprepRuntimeError(
                "a block-table plan must be committed to its table before any write"
            )
        self._hits += plan.hits
        if plan.rows:
            self._render(plan.staged, False, plan.rows)
        return len(plan.rows)

    def copy_row(self, src: int, dst: int) -> bool:
        """Make row ``dst`` a copy of row ``src``; return whether anything was written."""
        cells = self._apply_row(ROW_COPY, dst, src)  # a source holding ids: at once
        if cells is not None:
            return cells > 0
        n, kernel = self._num_rows, self._kernel
        rows = type(src) is int and type(dst) is int and 0 <= src < n and 0 <= dst < n
        if rows and src != dst and kernel.length(src) > 0:  # the common case: one kernel step
            stay = self._stay
            stay[dst] = src
            try:
                plan, _ = kernel.stage([dst], _NO_OPS, stay, convert, ops=True)
            finally:
                stay[dst] = dst
            if not plan:
                self._hits += 1
                return False
            self._render(plan, False, [dst])
            return True
        return self.fill_rows(src, [dst]) == 1

    def fill_rows(self, src: int, dst_rows: Iterable[int]) -> int:
        """Copy row ``src`` into each of ``dst_rows`` (padding replication); return rows written.

        A destination that already holds the source's ids is skipped, like a write cache hit. A
        source of unknown ids is copied cell by cell, and its copies are unknown too.
        """
        src = self._row_index(src)
        if isinstance(dst_rows, (str, bytes)) or not isinstance(dst_rows, Iterable):
            raise BlockprepTypeError(
                f"dst_rows must be an iterable of rows, got {type(dst_rows).__name__}"
            )
        targets = [dst for dst in map(self._row_index, dst_rows) if dst != src]
        if not targets:
            return 0
        if self._kernel.length(src) < 0:  # unknown: the cells, as they are
            for dst in targets:
                self._copy_cells(dst, self._rows[src])
            return len(targets)
        unique = list(dict.fromkeys(targets))
        written = self._take(unique, [src] * len(unique), {})
        self._hits += len(targets) - written
        return written

    def swap_rows(self, a: int, b: int) -> bool:
        """Exchange rows ``a`` and ``b`` (content and cache); return whether anything changed."""
        a, b = self._row_index(a), self._row_index(b)
        held = self._kernel.held
        if a == b:
            return False
        ids_a = held(a)
        if ids_a is not None and ids_a == held(b):
            return False
        unknown = {r: self._rows[r].copy() for r in (a, b) if self._kernel.length(r) < 0}
        self._take([a, b], [b, a], unknown)
        return True

    def clear_row(self, row: int) -> bool:
        """Fill row ``row`` with ``pad``; return whether anything was written."""
        cells = self._apply_row(ROW_CLEAR, row, None)
        if cells is not None:
            return cells > 0
        row = self._row_index(row)
        if self._kernel.length(row) == 0:
            self._hits += 1
            return False
        self._kernel.clear(row)
        self._lengths[row] = 0
        self._render(self._empty, False, [row])
        return True

    def invalidate(self, row: int | None = None) -> None:
        """Forget what ``row`` (every row when ``None``) holds: its next write rewrites it whole.

        Call after anything other than this table wrote the buffer.
        """
        self._epoch += 1
        if row is None:
            self._kernel.forget(-1)
            self._lengths[:] = 0
        else:
            row = self._row_index(row)
            self._kernel.forget(row)
            self._lengths[row] = 0

    # --- deltas --------------------------------------------------------------------------------

    def append(self, row: int, ids: IdsLike) -> int:
        """Row ``row``'s id list grows by ``ids``; return the cells written.

        A paged row writes only its new columns; a ring row's length changes, so it is re-tiled
        whole (every column ``j % n`` moves). The row's ids must be known (written by this table
        since it was made or last invalidated): :class:`UnknownRowError` otherwise. Appending
        nothing writes nothing (a hit), and so does appending nothing to a cleared ring row.
        """
        cells = self._apply_row(ROW_APPEND, row, ids)
        if cells is None:  # anything else: checked, converted, or refused with its message
            return self._deltas.append(row, ids)
        return cells

    def set_ids(self, row: int, positions: IdsLike, ids: IdsLike) -> int:
        """The ids at ``positions`` of row ``row``'s id list become ``ids``; return cells written.

        A ring row's position ``p`` is ring slot ``p``: one strided write of the columns
        ``j % n == p``; a paged row's is one cell. Positions are unique and within the row's
        length; positions whose id does not change are left alone (all of them: a hit).
        """
        return self._deltas.one(row, [SET, positions, ids], positions, ids) or self._deltas.apply(
            {}, [(row, positions, ids)], {}
        )

    def truncate(self, row: int, length: int) -> int:
        """Row ``row`` keeps the first ``length`` of its ids; return the cells written.

        A paged row resets only its dropped tail to ``pad``; a ring row is re-tiled whole. A ring
        row cannot be truncated to nothing (:meth:`clear_row` does that). Keeping every id is a
        hit.
        """
        return self._deltas.one(row, [TRUNCATE, length], length) or self._deltas.apply(
            {row: length}, (), {}
        )

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
        anything is written, then the buffer is written in one kernel commit. A row whose deltas
        change nothing counts as a hit. Raises ``TypeError`` for arguments of the wrong shape
        (a ``set_ids`` item that is not a ``(row, positions, ids)`` triple included).
        """
        return self._deltas.apply(truncate, set_ids, append)

    def apply_packed(self, message: object, cursor: DeltaCursor | None = None) -> int:
        """Apply a flat :mod:`blockprep.packed` message (group 0; a record's ``row`` is the table
        row) through the kernel, which reads its payload in place; return the cells written.

        A row's records apply in order to what it holds (to nothing when ``base`` is ``None``:
        each row named starts whole); rows not named keep theirs. ``cursor``: the worker's
        :class:`~blockprep.wire.DeltaCursor`, when the caller keeps one; the message must build
        on its last (``DeltaSequenceError``) and becomes it once applied. All-or-nothing.

        Raises:
            DeltaMessageError: the header or a record malformed (:func:`blockprep.packed.records`),
                records that do not fit the row's ids (the words of
                :func:`blockprep.wire.apply_ops`, the row named).
            DeltaSequenceError: ``base`` is not the cursor's last.
            ValueError: ids the builders refuse for the row's resulting ids (:meth:`write_row`).
        """
        return self._deltas.apply_packed(message, cursor)

    def plan_records(self, data: bytes, changes: Changes, *, whole: bool = False) -> RowsPlan:
        """Check ``changes``, ``{row: word offsets of its records in data}`` (a packed payload,
        as :func:`blockprep.packed.index_records` gives them), and return the plan for
        :meth:`commit`; nothing is written. ``whole``: each row named starts anew. Raises what
        :meth:`apply_packed` raises for records."""
        staged = self._deltas.plan_records(data, changes, whole)
        changed = self._kernel.rows_of(staged)
        if self._pending:
            self._fold()
        return RowsPlan(self, self._epoch, changed, staged, len(changes) - len(changed))

    # --- inspection ------------------------------------------------------------------------------

    def check(self) -> None:
        """Verify every row with known content against the buffer
        (:func:`blockprep._table_checks.check_table`).

        Raises:
            StaleRowError: naming the first row and column whose cell differs from its cached ids
                (something else wrote the buffer; :meth:`invalidate` is the remedy).
        """
        check_table(self)

    def verify(self) -> None:
        """Compare every row whose ids the table knows with a from-scratch rebuild through
        :mod:`blockprep.reference` (:func:`blockprep._table_checks.verify_table`). Slow; what
        ``verify=True`` runs after every write.

        Raises:
            StaleRowError: naming the first row (and column) that differs.
        """
        verify_table(self)

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
        if self._pending:
            self._fold()
        dirty = sorted(self._dirty)
        self._dirty.clear()
        return dirty

    # --- internals (the delta face, blockprep._row_deltas, uses these too) ------------------------

    def _row_index(self, row: object) -> int:
        index = as_int(row, "block-table row index")
        if not 0 <= index < self._num_rows:
            raise BlockprepIndexError(
                f"block-table row {index} is out of range for a table of {self._num_rows} rows"
            )
        return index

    def _apply_row(self, kind: int, row: int, value: object) -> int | None:
        """One row's change at once, counted (the kernel's ``apply_row``: ``kind`` a
        ``blockprep._engine.rules.ROW_*``); the cells written, 0 for a hit, or ``None`` when it is
        not a plain case (ids not a list of ints in range, a row not an int in range or of
        unknown ids, ...): nothing done, the caller's general path decides and words errors."""
        cells = self._kernel.apply_row(kind, row, value)
        if cells:
            self._dirty.add(row)
            self._epoch += 1
            self._misses += 1
            self._cells += cells
        elif cells == 0:
            self._hits += 1
        return cells

    def _apply_step(self, finished: Any, appended: Any, added: Any, moves: Any) -> bool:
        """A vLLM-like step of row changes at once, counted (the kernel's ``apply_step``: rows
        ``finished`` cleared, ``appended`` ids appended, ``added`` rows whole, then ``moves``
        copied in order); ``False`` when it is not a plain case: nothing done, the caller's
        general path decides and words errors."""
        out = self._kernel.apply_step(finished, appended, added, moves)
        if out is None:
            return False
        pending = self._pending  # counted when read (_fold): a step costs no Python bookkeeping
        pending.append(out)
        if len(pending) >= 64:
            self._fold()
        return True

    def _fold(self) -> None:
        """Count the ``apply_step`` results not yet counted: rows dirty, stats, the epoch."""
        for cells, hits, written in self._pending:
            if written:
                self._dirty.update(written)
                self._epoch += 1
                self._misses += len(written)
                self._cells += cells
            self._hits += hits
        self._pending.clear()

    def _render(self, plan: Any, want_rows: bool, rows: list[int] | None = None) -> tuple[int, int]:
        """Commit a kernel plan (and whatever clear marked) into the buffer, counted; ``(rows,
        cells)`` written (``rows``: the rows, when the caller knows them). Never raises."""
        table, counts = self._kernel_buffers
        written, cells, listed = self._kernel.commit(plan, 0, table, counts, 0, want_rows)
        if written:
            self._dirty.update(listed if listed is not None else rows or ())
            self._epoch += 1
            self._misses += written
            self._cells += cells
        return written, cells

    def _take(self, dsts: list[int], srcs: list[int], unknown: dict[int, Any]) -> int:
        """Rows ``dsts[i]`` take what rows ``srcs[i]`` hold as of this call (``unknown``: the
        cells of the sources of unknown ids, copied before); the rows written. Never raises."""
        kernel, stay = self._kernel, self._stay
        held = [(dst, src) for dst, src in zip(dsts, srcs, strict=True) if kernel.length(src) > 0]
        cleared = [dst for dst, src in zip(dsts, srcs, strict=True) if kernel.length(src) == 0]
        plan: Any = self._empty
        if held:
            for dst, src in held:
                stay[dst] = src
            try:
                dst_rows = [dst for dst, _ in held]
                plan, fault = kernel.stage(dst_rows, [None] * len(held), stay, convert, ops=True)
            finally:
                for dst, _ in held:
                    stay[dst] = dst
            assert fault is None, fault  # held ids were checked when they were written
        for dst in cleared:
            kernel.clear(dst)
            self._lengths[dst] = 0
        written = self._render(plan, True)[0] if held or cleared else 0
        for dst, src in zip(dsts, srcs, strict=True):
            if src in unknown:
                self._copy_cells(dst, unknown[src])
                written += 1
        return written

    def _copy_cells(self, dst: int, cells: npt.NDArray[np.int32]) -> None:
        """Row ``dst`` holds ``cells`` as they are, its ids unknown (a source of unknown ids)."""
        self._rows[dst] = cells
        self._kernel.forget(dst)
        self._lengths[dst] = 0
        self._dirty.add(dst)
        self._epoch += 1
        self._misses += 1
        self._cells += self._max_blocks

    def _listed(self, row: int, ids: object) -> list[Any]:
        """``ids`` of a by-value write as a list (tuples copied, integer arrays and tensors
        through ``tolist()``); the builders' error for anything else."""
        key = id_list(ids)
        if key is None:
            self._raise_row(row, ids)
        return key if type(key) is list else list(key)

    def _lists(self, rows: list[int], batch: list[Any]) -> list[list[Any]]:
        """:meth:`_listed` of each row of ``batch``; an earlier row's bad ids raise first."""
        lists: list[list[Any]] = []
        try:
            for row, ids in zip(rows, batch, strict=True):
                lists.append(ids if type(ids) is list else self._listed(row, ids))
        except (TypeError, ValueError, IndexError):
            self._check_listed(rows[: len(lists)], lists)
            raise
        return lists

    def _check_listed(self, rows: list[int], lists: list[list[Any]]) -> None:
        """Raise the error of the first bad row among ``rows`` (lists), if any."""
        _, fault = self._kernel.stage(rows, lists, self._stay, convert)
        if fault is not None or (self._ring and not all(lists)):
            self._raise_rows(rows, lists, fault)

    def _raise_rows(self, rows: list[int], lists: list[list[Any]], fault: Any) -> NoReturn:
        """The error of the first bad row, in order: the kernel's fault, or an empty ring list
        (the kernel takes ``[]`` over a cleared ring row as no change)."""
        for row, ids in zip(rows, lists, strict=True):
            if (fault is not None and row == fault[1]) or (self._ring and not ids):
                self._raise_row(row, ids)
        raise AssertionError(f"the kernel refused rows that the checks take: {fault}")

    def _raise_row(self, row: int, ids: object) -> NoReturn:
        """The builders' error for row ``row``'s ids (:func:`blockprep._faults.raise_row`)."""
        raise_row(row, ids, self._kernel.held(row), self._max_blocks, self._kind)


_NO_OPS = [None]
"""``stage`` ops items of one row that holds what its source row holds (never mutated)."""
