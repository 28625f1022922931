"""The twin kernel's one-call row changes: :meth:`RowChanges.apply_row` (one row) and
:meth:`RowChanges.apply_step` (a vLLM-like scheduler step), rendered at once into the buffers of
:meth:`RowChanges.bind`; the specification of ``_engine/apply_row.c``.

Each is what :meth:`GroupKernel.stage` (ops items) of the rows it changes, then
:meth:`GroupKernel.commit` into slot 0, would do, rendering only those rows, for the plain cases
it decides (lists of ints in ``[0, limit)`` on rows whose ids are known, a kernel without the
repeat rule); for any other it answers ``None`` having changed nothing, and the caller's
general path decides and words the error. A step is decided whole before its first write.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from blockprep._engine.rules import (
    INT_ONLY,
    ROW_APPEND,
    ROW_CLEAR,
    ROW_COPY,
    Mark,
    checked_tables,
    cleared_mark,
    index_arg,
    merged,
)

Bound = tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], int]


class _Kernel(Protocol):
    """What these methods use of :class:`blockprep._engine.twin.GroupKernel`."""

    ring: bool
    distinct: bool
    width: int
    limit: int
    shortest: int
    rows: int
    _held: list[list[int] | None]
    _distinct: list[bool]
    _marks: list[dict[int, Mark]]
    _bound: Bound | None

    def _check_idle(self) -> None: ...
    def _mark(self, old: list[int] | None, new: list[int]) -> Mark | None: ...
    def _render(
        self, marks: dict[int, Mark], table: npt.NDArray[np.int32], want_rows: bool
    ) -> tuple[int, int, list[int] | None]: ...


def _plain(self: _Kernel, ids: object) -> bool:
    """Whether ``ids`` is a list of exact ints in ``[0, limit)``."""
    return type(ids) is list and (
        set(map(type, ids)) <= INT_ONLY and (not ids or (min(ids) >= 0 and max(ids) < self.limit))
    )


def _row(self: _Kernel, row: object) -> int | None:
    """``row`` when it is an exact int naming a row, else ``None``."""
    return row if type(row) is int and 0 <= row < self.rows else None


def _ready(self: _Kernel, name: str) -> Bound:
    """The bound buffers; the compiled kernel's errors when a stage is running or none are."""
    self._check_idle()
    if self._bound is None:
        raise RuntimeError(f"{name} needs the buffers of bind() first")
    return self._bound


def _commit_row(self: _Kernel, bound: Bound, row: int, new: list[int], mark: Mark) -> int:
    """Row ``row`` holds ``new``: held ids, count, every slot's mark, then slot 0's render of
    the row; the cells written."""
    self._held[row], self._distinct[row] = new, False
    for marks in self._marks:
        marks[row] = merged(marks.get(row), mark, self.ring)
    table, counts, column = bound
    counts[row, column] = len(new)
    return self._render({row: self._marks[0].pop(row)}, table, False)[1]


def _pairs(items: object) -> list[tuple[Any, Any]] | None:
    """The ``(row, value)`` pairs of an exact dict, or of an exact list or tuple of exact
    2-tuples or 2-lists; ``None`` for anything else."""
    if type(items) is dict:
        return list(items.items())
    if type(items) not in (list, tuple):
        return None
    pairs = []
    for item in items:  # type: ignore[attr-defined]
        if type(item) not in (tuple, list) or len(item) != 2:
            return None
        pairs.append((item[0], item[1]))
    return pairs


class RowChanges:
    """:class:`blockprep._engine.twin.GroupKernel`'s ``bind``, ``apply_row`` and ``apply_step``."""

    _bound: Bound | None = None

    def bind(
        self: _Kernel, table: npt.NDArray[np.int32], counts: npt.NDArray[np.int32], column: int
    ) -> None:
        """The buffers ``apply_row`` and ``apply_step`` render into: ``commit``'s arguments for
        slot 0."""
        self._check_idle()
        table, counts = checked_tables(table, counts, self.rows, self.width)
        self._bound = (table, counts, index_arg(column, counts.shape[1], "column"))

    def apply_row(self: _Kernel, kind: int, row: int, value: object) -> int | None:
        """One row's change at once; the cells written (0: it holds what it held). ``kind``:
        ``ROW_APPEND`` (the ids of the list ``value`` after the row's), ``ROW_WHOLE`` (the row
        holds them), ``ROW_COPY`` (it holds what row ``value`` holds) or ``ROW_CLEAR`` (it holds
        none; ``value`` unread).

        ``None``, nothing changed, for a case it leaves to the caller: a row not an int in
        range, a distinct kernel, ids not a list of ints in ``[0, limit)``, an append to a row
        of unknown ids, a result of more than ``width`` or fewer than ``shortest`` ids, a copy
        of the row itself or of a row holding no or unknown ids.
        """
        bound = _ready(self, "apply_row")
        if type(kind) is not int or not ROW_APPEND <= kind <= ROW_CLEAR:
            raise ValueError(f"kind must be 0, 1, 2 or 3, got {kind!r}")
        r = _row(self, row)
        if r is None or self.distinct:
            return None
        old = self._held[r]
        if kind == ROW_CLEAR:
            if old is not None and not old:
                return 0
            return _commit_row(self, bound, r, [], cleared_mark(old, self.ring))
        if kind == ROW_COPY:
            src = _row(self, value)
            held = None if src is None or src == r else self._held[src]
            if not held:
                return None
            new = held[:]
        elif not _plain(self, value):
            return None
        elif kind == ROW_APPEND:
            if old is None:
                return None
            if not value:
                return 0
            new = old + value  # type: ignore[operator]
        else:
            new = value[:]  # type: ignore[index]
        if not self.shortest <= len(new) <= self.width:
            return None
        changed = self._mark(old, new)
        return 0 if changed is None else _commit_row(self, bound, r, new, changed)

    def apply_step(
        self: _Kernel, finished: object, appended: object, added: object, moves: object
    ) -> tuple[int, int, list[int]] | None:
        """A vLLM-like step at once, all or nothing: rows ``finished`` (a list or tuple) hold no
        ids, each ``appended`` row (``(row, ids)`` pairs or a ``{row: ids}`` dict; ids ``None``:
        nothing) gains its ids after what is left, each ``added`` row holds its ids; then each
        ``(src, tgt)`` of ``moves`` copies row ``src`` into row ``tgt``, in order. ``(cells
        written, rows that held what they held, the rows written in order)``: the rows the
        deltas touch, in order of first mention, then each move's target.

        ``None``, nothing changed, for a case it leaves to the caller: a container or pair of
        another type, a row not an int in range or of unknown ids, a row twice in ``appended``
        or ``added`` or in both, ids not a list of ints in ``[0, limit)``, a row of more than
        ``width`` or fewer than ``shortest`` ids, a move of a row onto itself or of a row holding
        no or unknown ids, a distinct kernel.
        """
        bound = _ready(self, "apply_step")
        if self.distinct:
            return None
        steps = (finished, appended, added, moves)
        if all(type(x) in (list, tuple, dict) and not x for x in steps):
            return (0, 0, [])
        decided = _decide_step(self, finished, appended, added, moves)
        if decided is None:
            return None
        rows, pairs = decided
        held = self._held

        def writes() -> Iterator[tuple[int, list[int]]]:  # a move reads what the rows hold then
            yield from rows.items()
            for src, tgt in pairs:
                yield tgt, held[src][:]  # type: ignore[index]

        cells = hits = 0
        written: list[int] = []
        for r, new in writes():
            mark = self._mark(held[r], new)
            if mark is None:
                hits += 1
                continue
            cells += _commit_row(self, bound, r, new, mark)
            written.append(r)
        return cells, hits, written


def _decide_step(
    self: _Kernel, finished: object, appended: object, added: object, moves: object
) -> tuple[dict[int, list[int]], list[tuple[int, int]]] | None:
    """Every check of :meth:`RowChanges.apply_step` on a simulation of the rows' ids: the new
    ids of the rows the deltas touch (in order of first mention) and the moves; ``None`` when
    the step is not a plain case. Changes nothing."""
    appended_pairs, added_pairs = _pairs(appended), _pairs(added)
    if type(finished) not in (list, tuple) or type(moves) not in (list, tuple):
        return None
    if appended_pairs is None or added_pairs is None:
        return None
    held = self._held
    rows: dict[int, list[int]] = {}
    for item in finished:  # type: ignore[attr-defined]
        r = _row(self, item)
        if r is None or held[r] is None:
            return None
        rows[r] = []
    seen: set[int] = set()
    for item, ids in appended_pairs:
        r = _row(self, item)
        if r is None or r in seen:
            return None
        seen.add(r)
        if ids is None:
            continue
        old = held[r]
        if not _plain(self, ids) or old is None:
            return None
        rows[r] = rows.get(r, old) + ids
    replaced: set[int] = set()
    for item, ids in added_pairs:
        r = _row(self, item)
        if r is None or r in seen or r in replaced or held[r] is None or not _plain(self, ids):
            return None
        replaced.add(r)
        rows[r] = ids[:]
    if any(not self.shortest <= len(new) <= self.width for new in rows.values()):
        return None
    lengths = {r: len(new) for r, new in rows.items()}
    pairs: list[tuple[int, int]] = []
    for pair in moves:  # type: ignore[attr-defined]
        if type(pair) not in (tuple, list) or len(pair) != 2:
            return None
        src, tgt = _row(self, pair[0]), _row(self, pair[1])
        if src is None or tgt is None or src == tgt:
            return None
        held_src = held[src]
        n = lengths.get(src, -1 if held_src is None else len(held_src))
        if n <= 0 or n < self.shortest:
            return None
        lengths[tgt] = n
        pairs.append((src, tgt))
    return rows, pairs
