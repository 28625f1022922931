"""The table kernel in pure Python and NumPy: the specification of ``_kernel.c``, and the fallback.

One :class:`GroupKernel` holds one cache group's persistent state: per table row the ids the row
holds as of the latest commit (``None``: unknown), and per buffer slot a *mark* per row saying
which cells of that slot's table may differ from a render of those ids. It has three steps:

- :meth:`GroupKernel.stage`: check the rows of a step against what they hold and decide what
  changes (a *plan*); touches nothing persistent, so a fault leaves everything as it was. A fault
  is returned as ``(code, row, value)``, never raised: the caller words the error.
- :meth:`GroupKernel.commit`: take a plan as the latest ids, mark its rows in every slot, then
  render the marked rows of one slot into that slot's table. Cannot fail on a plan it staged.
- :meth:`GroupKernel.invalidate`, :meth:`GroupKernel.reset`: forget what a slot's table holds, or
  everything.

The compiled kernel has the same class, the same signatures and the same results (buffers, held
ids, counters, faults); its plans are its own (a ``bytes`` of int32 records), as the twin's are
its own. ``tests/test_engine_differential.py`` drives both with the same steps.

The rules, for a visited row ``r`` with source ``src = srcs[r]`` (``PADDING``, ``NEW``, or the
row whose held ids the row's request held, ``r`` itself when it stayed):

1. *Ids.* Position ``p`` is unchanged when the request held an id there equal to ``ids[p]``
   (an exact ``int`` compared by value; anything else by ``==``, an exception counting as not
   equal): the held id is taken. Every other id is *changed*: a plain ``int`` as it is, anything
   else through ``convert(x)`` (an ``int``, or ``None``: fault ``TYPE`` naming ``x``).
2. *Length*: a request's row holds ``shortest..width`` ids (fault ``LENGTH``, value ``n``); a
   padding row ``1..width`` (ring) or ``0..width`` (paged).
3. *Range*: every changed id of a request's row in ``[0, limit)`` (fault ``RANGE``); of a padding
   row in int32 (fault ``PAD_RANGE``).
4. *Repeats*: a request's row holds no id twice (fault ``REPEAT`` with the first id, in position
   order, seen earlier in the row); not checked by a kernel made with ``distinct=False``.

Faults come in that order within a row, rows in visit order. A row that stays (``src`` is ``r``
or ``PADDING``) and holds exactly the ids it held (same length, every id ``==``) is no change and
is not checked. Any other row that holds what it held is checked, and is no change. Otherwise
the slot marks say what to write: the positions that differ (a ring slot is the strided columns
``p, p + n, ...``; a paged position one cell, ``pad`` past the ids), at most ``MAX_POSITIONS`` of
them; else a paged range ``[lo, hi)``; else the whole row.

Callbacks (an id's ``__eq__``, ``convert``) may run any code, so their order is part of the rules,
and the compiled kernel runs the same ones in the same order: a step of every row by id lists,
when every row is a list and every src an int, first compares each row's list with what it held
(``ids != held``, row by row, as Python compares lists); then it visits the rows that differ or
moved, in order. A visited row that stays is compared once more (``ids == held``) and, if it
differs, walked id by id: an id that is no exact int compared with the held id at its position,
then converted unless equal. A row changed by a callback while it is planned is refused
(``RuntimeError``); an op's tag is read without a callback (a str, or an unknown operation).

Besides steps: :meth:`GroupKernel.clear` makes rows hold no ids (a *cleared* row: every cell
``pad``, ring or paged; a ring row can hold no ids only this way), :meth:`GroupKernel.forget`
makes rows unknown without marking them (their cells are left as they are, and a later change
renders them whole), :meth:`GroupKernel.rows_of` names the rows a plan changes. A whole-row
render of an unknown row writes 0 (ring) or ``pad`` (paged).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import compress, count
from typing import Any

import numpy as np
import numpy.typing as npt

from blockprep import packed
from blockprep._engine.rules import (
    INT32_MAX,
    INT32_MIN,
    INT_ONLY,
    INTERNED,
    INTERNED_IDS,
    LENGTH,
    MAX_POSITIONS,
    NEW,
    OPS,
    PAD_RANGE,
    PADDING,
    POSITIONS,
    RANGE,
    REPEAT,
    SPAN,
    TYPE,
    WHOLE,
    Change,
    Fault,
    Mark,
    check_set_ids,
    check_spec,
    checked_tables,
    cleared_mark,
    equal_ids,
    holds,
    index_arg,
    lists_at,
    merged,
    one_set,
    positions_mark,
    same_lengths,
    same_sizes,
    src_of,
)
from blockprep._engine.twin_rows import RowChanges
from blockprep._tiling import tile_rows
from blockprep.wire import DeltaMessageError, apply_ops

__all__ = [  # the fault codes and srcs values callers read from here
    "LENGTH",
    "NEW",
    "OPS",
    "PADDING",
    "PAD_RANGE",
    "RANGE",
    "REPEAT",
    "TYPE",
    "GroupKernel",
]


class Plan(list):  # type: ignore[type-arg]
    """A staged plan: its changes (``Change`` tuples), and the kernel initialisation that staged
    it. A plan of another initialisation, or a list made elsewhere, is checked whole before its
    commit writes anything, as the compiled kernel checks every plan's records."""

    __slots__ = ("generation",)
    generation: object


class GroupKernel(RowChanges):
    """One group's held ids and per-slot marks (see the module docstring).

    Args: ``ring`` (else paged), ``width`` table columns, ``limit`` ids of a request in
    ``[0, limit)``, ``shortest`` fewest ids of a request's row, ``pad`` after a paged row's ids,
    ``rows`` table rows, ``slots`` buffer slots; ``distinct`` (keyword only): a request's row must
    not repeat an id (the rule 4). Every slot starts marked whole.
    """

    def __new__(cls, *args: object, **kwargs: object) -> GroupKernel:
        """An empty kernel, as the C's before ``__init__``: no rows, no slots."""
        self = super().__new__(cls)
        self.ring, self.distinct = False, False
        self.width = self.limit = self.shortest = self.pad = self.rows = self.slots = 0
        self._held, self._distinct, self._marks = [], [], []
        self._bound, self._generation = None, object()
        return self

    def __init__(
        self,
        ring: bool,
        width: int,
        limit: int,
        shortest: int,
        pad: int,
        rows: int,
        slots: int,
        *,
        distinct: bool = True,
    ) -> None:
        self._check_idle()
        check_spec(ring, width, limit, shortest, pad, rows, slots)
        truth, unique = bool(ring), bool(distinct)
        self.distinct = unique
        self.ring, self.width, self.limit = truth, width, limit
        self.shortest, self.pad, self.rows, self.slots = shortest, pad, rows, slots
        self._held: list[list[int] | None] = [None] * rows
        self._distinct = [False] * rows  # the held ids were checked as a request's
        self._marks: list[dict[int, Mark]] = [
            dict.fromkeys(range(rows), (WHOLE, ())) for _ in range(slots)
        ]
        self._bound: tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], int] | None = None
        self._generation = object()  # this initialisation's: the plans it stages carry it

    # --- reading ----------------------------------------------------------------------------------

    def held(self, row: int) -> list[int] | None:
        """A copy of the ids ``row`` holds (``None``: unknown)."""
        ids = self._held[index_arg(row, self.rows, "row")]
        return None if ids is None else ids[:]

    def length(self, row: int) -> int:
        """How many ids ``row`` holds (-1: unknown)."""
        ids = self._held[index_arg(row, self.rows, "row")]
        return -1 if ids is None else len(ids)

    # --- stage ------------------------------------------------------------------------------------

    def stage(
        self,
        rows: list[int] | None,
        items: list[Any],
        srcs: list[int],
        convert: Callable[[object], int | None],
        key: object = None,
        *,
        ops: bool = False,
        data: bytes | None = None,
    ) -> tuple[list[Change] | None, Fault | None]:
        """Check and decide the visited rows (``rows``; ``None``: every row, and ``items`` has
        one item per table row); ``(plan, None)`` or ``(None, fault)``. An item is the row's new
        ids (a list), or with ``ops`` its :mod:`blockprep.wire` operations on the ids its
        request held (``None``: as they were), or, given ``data``, a tuple of word offsets of
        :mod:`blockprep.packed` records in it (read in place, applied in order as the ops they
        stand for); a padding row's item is its ids either way. With ``ops``, row by row: the
        ops (fault ``OPS`` where :func:`~blockprep.wire.apply_ops` rejects them, or a request
        new to the table without ops), then the ids an append or a set names must be integers
        (fault ``TYPE``, whatever the row held: they are new; a record's are), then the rules
        1-4 on the resulting ids. With ``key`` (``rows`` ``None`` only), ``items`` holds one
        dict per table row and a row's item is its dict's ``key`` item (a batch's rows by
        group, read in place): every row is looked up first, ``TypeError`` / ``KeyError`` at the
        first that is no dict or holds no ``key``."""
        if (
            type(items) is not list
            or type(srcs) is not list
            or (rows is not None and type(rows) is not list)
        ):
            raise TypeError("rows (or None), items and srcs must be lists")
        if data is not None and (not ops or type(data) is not bytes or len(data) % 4):
            raise TypeError("data must be None or, with ops, bytes of whole int32 words")
        if len(srcs) != self.rows:
            raise ValueError(f"srcs must hold {self.rows} rows, got {len(srcs)}")
        visits = self.rows if rows is None else len(rows)
        if len(items) != visits:
            raise ValueError(f"items must hold {visits} rows, got {len(items)}")
        if key is not None:
            self._check_idle()
            if rows is not None:
                raise ValueError("key applies only to a step of every row (rows None)")
            items = lists_at(items, key)
        with self._staging():
            if ops:
                return self._stage_items(rows, items, srcs, convert, data)
            order: Sequence[int] = range(visits)
            if rows is None and self._plain(items, srcs):
                sizes = list(map(len, items))
                try:  # the unchanged rows, found by one C-level comparison of the lists
                    differ = list(map(operator.ne, items, self._held))
                    order = [
                        r
                        for r, d, s in zip(range(visits), differ, srcs, strict=True)
                        if d or s not in (r, PADDING)
                    ]
                except Exception:  # an id that does not compare: every row decided by itself
                    pass
                same_lengths(items, sizes)  # an id's __eq__ may have changed a row
            plan = self._new_plan()
            for i in order:
                same_sizes((rows, visits), (items, visits), (srcs, self.rows))
                r = i if rows is None else index_arg(rows[i], self.rows, "row")
                ids = items[i]
                if type(ids) is not list:
                    raise TypeError(f"row {r} must be a list, got {type(ids).__name__}")
                fault = self._stage_row(plan, r, ids, src_of(srcs, r, self.rows), convert)
                if fault is not None:
                    return None, fault
            if order and order[-1] < visits - 1:  # the C looks at every row, the last too
                same_sizes((rows, visits), (items, visits), (srcs, self.rows))
            return plan, None

    def _plain(self, lists: list[list[Any]], srcs: list[int]) -> bool:
        """Whether every row is a list and every src is valid (so no row skipped as unchanged
        would have been refused)."""
        if set(map(type, lists)) - {list} or set(map(type, srcs)) - INT_ONLY:
            return False
        return not srcs or (min(srcs) >= PADDING and max(srcs) < self.rows)

    @contextmanager
    def _staging(self) -> Iterator[None]:
        self._check_idle()
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def _check_idle(self) -> None:
        if getattr(self, "_busy", False):
            raise RuntimeError("GroupKernel called again from a callback of its own stage")

    def _stage_items(
        self,
        rows: list[int] | None,
        items: list[Any],
        srcs: list[int],
        convert: Callable[[object], int | None],
        data: bytes | None,
    ) -> tuple[list[Change] | None, Fault | None]:
        """:meth:`stage` of ops items, row by row."""
        visits = len(items)
        plan = self._new_plan()
        for i in range(visits):
            same_sizes((rows, visits), (items, visits), (srcs, self.rows))
            r = i if rows is None else index_arg(rows[i], self.rows, "row")
            src, item = src_of(srcs, r, self.rows), items[i]
            fault = self._stage_item(plan, r, src, item, convert, data)
            if fault is not None:
                return None, fault
        return plan, None

    def _stage_item(
        self,
        plan: list[Change],
        r: int,
        src: int,
        item: Any,
        convert: Callable[[object], int | None],
        data: bytes | None,
    ) -> Fault | None:
        """One row of :meth:`stage` of ops items."""
        if src == PADDING:
            if type(item) is not list:
                raise TypeError(f"row {r} must be a list, got {type(item).__name__}")
            return self._stage_row(plan, r, item, src, convert)
        held = self._held[src] if src >= 0 else None
        if data is not None and type(item) is tuple:  # without data: malformed ops
            return self._stage_records(plan, r, src, held, item, data, convert)
        if item is None:
            if held is None:
                return (OPS, r, None)
            return self._stage_row(plan, r, held, src, convert)
        if src == r and held and self._distinct[r] and (one := one_set(item, held)):
            return self._set_one(plan, r, held, *one)  # the steady step, decided here
        try:
            ids = apply_ops(item, held)
        except DeltaMessageError:
            return (OPS, r, None)
        fault = check_set_ids(item, r, convert)
        if fault is not None:
            return fault
        return self._stage_row(plan, r, ids, src, convert)

    def _stage_records(
        self,
        plan: list[Change],
        r: int,
        src: int,
        held: list[int] | None,
        offsets: tuple[Any, ...],
        data: bytes,
        convert: Callable[[object], int | None],
    ) -> Fault | None:
        """One row of :meth:`stage`'s ops items given as packed records: each read, then applied, in
        order (a bad offset after a rejected record is never read, as in the compiled kernel)."""
        if not offsets:
            return (OPS, r, None)
        if len(offsets) == 1:  # as its one op (the steady step's fast path included)
            return self._stage_item(
                plan, r, src, [packed.op_at(data, offsets[0], r)], convert, None
            )
        ids = held
        for offset in offsets:
            op = packed.op_at(data, offset, r)
            try:
                ids = apply_ops([op], ids)
            except DeltaMessageError:
                return (OPS, r, None)
        assert ids is not None
        return self._stage_row(plan, r, ids, src, convert)

    def _set_one(self, plan: list[Change], r: int, held: list[int], p: int, x: int) -> Fault | None:
        """What the general path decides for ``[["s", [p], [x]]]`` on a checked row that stays:
        the same faults (range, then a repeat, which can only be ``x``), the same change."""
        if x == held[p]:
            return None
        if not 0 <= x < self.limit:
            return (RANGE, r, x)
        if x in held:
            return (REPEAT, r, x)
        new = held[:]
        new[p] = INTERNED[x] if self.limit <= INTERNED_IDS else x
        plan.append((r, new, (POSITIONS, (p,)), True))  # only a distinct kernel gets here
        return None

    def _stage_row(
        self,
        plan: list[Change],
        r: int,
        ids: list[Any],
        src: int,
        convert: Callable[[object], int | None],
    ) -> Fault | None:
        """Check row ``r`` and add its change to ``plan`` (nothing when it holds what it held)."""
        held = self._held
        if src in (r, PADDING) and holds(held[r], ids):
            return None  # it holds exactly what it held: nothing to check or write
        base = held[src] if src >= 0 else held[r] if src == PADDING else None
        distinct = src >= 0 and self._distinct[src]
        new, changed, fault = self._checked(r, ids, base, src == PADDING, distinct, convert)
        if fault is not None:
            return fault
        assert new is not None
        old = held[r]
        if changed is not None and src in (r, PADDING) and old is not None and len(old) == len(new):
            mark = positions_mark(changed, self.ring)  # the base is what the row holds
        else:
            mark = self._mark(old, new)
        if mark is not None:
            plan.append((r, new, mark, src != PADDING and self.distinct))
        return None

    def _checked(
        self,
        r: int,
        ids: list[Any],
        base: list[int] | None,
        padding: bool,
        distinct: bool,
        convert: Callable[[object], int | None],
    ) -> tuple[list[int] | None, list[int] | None, Fault | None]:
        """Row ``r``'s ids as plain ints, checked by the rules 1-4, and (when every id was a
        plain int) the positions whose value differs from ``base``; or its first fault.
        ``distinct``: ``base`` is a checked request's ids (no repeats among them)."""
        n = len(ids)
        base = base or []
        m = len(base)
        if set(map(type, ids)) <= INT_ONLY:  # plain ints only: the rule 1 in C-level passes
            if not m:  # nothing held: every id is changed
                new, changed = ids[:], list(range(n))
            else:
                short = min(n, m)
                first = next(compress(count(), map(operator.ne, ids, base)), short)
                if n == m and first < n and ids[first + 1 :] == base[first + 1 :]:
                    changed = [first]  # one id changed (a rotated ring slot): no second pass
                else:
                    changed = [
                        *compress(range(first, short), map(operator.ne, ids[first:], base[first:])),
                        *range(short, n),
                    ]
                if len(changed) == n:
                    new = ids[:]
                else:  # the held int objects kept, the changed ones put in
                    new = base[:n] if n <= m else [*base, *ids[m:]]
                    for p in changed:
                        new[p] = ids[p]
        else:
            new, changed, fault = self._converted(r, ids, base, convert)
            if fault is not None:
                return None, None, fault
            new_ids, fault = self._rules(r, new, changed, padding, distinct)
            return new_ids, None, fault
        new_ids, fault = self._rules(r, new, changed, padding, distinct)
        return new_ids, changed, fault

    def _converted(
        self, r: int, ids: list[Any], base: list[int], convert: Callable[[object], int | None]
    ) -> tuple[list[int], list[int], Fault | None]:
        """The rule 1 id by id: the new ids, the changed positions, or the first type fault."""
        n, m = len(ids), len(base)
        new: list[int] = []
        changed: list[int] = []
        for p in range(n):
            x = ids[p]
            if type(x) is int:
                if p < m and x == base[p]:
                    new.append(base[p])
                    continue
            else:  # a callback may run any code: the row must not change under it
                given = x
                equal = p < m and equal_ids(x, base[p])
                if not equal:
                    x = convert(x)
                if len(ids) != n:
                    raise RuntimeError(f"row {r} changed while it was planned")
                if equal:
                    new.append(base[p])
                    continue
                if type(x) is not int:
                    return new, changed, (TYPE, r, given)
            new.append(x)
            changed.append(p)
        return new, changed, None

    def _rules(
        self, r: int, new: list[int], changed: list[int], padding: bool, distinct: bool
    ) -> tuple[list[int] | None, Fault | None]:
        """The rules 2-4 on a row's ids (plain ints) and its changed positions."""
        n = len(new)
        whole = len(changed) == n  # every id changed: C-level passes over the row
        if padding:
            if n > self.width or (self.ring and n == 0):
                return None, (LENGTH, r, n)
            if not whole or (n and not (min(new) >= INT32_MIN and max(new) <= INT32_MAX)):
                for p in changed:
                    if not INT32_MIN <= new[p] <= INT32_MAX:
                        return None, (PAD_RANGE, r, new[p])
            return new, None
        if not self.shortest <= n <= self.width:
            return None, (LENGTH, r, n)
        if not whole or (n and not (min(new) >= 0 and max(new) < self.limit)):
            for p in changed:
                if not 0 <= new[p] < self.limit:
                    return None, (RANGE, r, new[p])
        few = distinct and len(changed) <= MAX_POSITIONS  # only a changed id can repeat
        if (
            self.distinct
            and changed
            and (any(new.count(new[p]) > 1 for p in changed) if few else len(set(new)) != n)
        ):
            seen = set()
            for x in new:
                if x in seen:
                    return None, (REPEAT, r, x)
                seen.add(x)
        if self.limit <= INTERNED_IDS:  # held ids as shared objects: compact, compared fast
            if whole:
                new[:] = map(INTERNED.__getitem__, new)
            else:
                for p in changed:
                    new[p] = INTERNED[new[p]]
        return new, None

    def _mark(self, old: list[int] | None, new: list[int]) -> Mark | None:
        """What a slot holding a render of ``old`` must write to hold a render of ``new``."""
        if old is None:
            return (WHOLE, ())
        n, m = len(new), len(old)
        if n != m and self.ring:
            return (WHOLE, ())
        short = min(n, m)
        differ = [*compress(range(short), map(operator.ne, new, old)), *range(short, max(n, m))]
        return positions_mark(differ, self.ring)

    # --- commit -----------------------------------------------------------------------------------

    def commit(
        self,
        plan: list[Change],
        slot: int,
        table: npt.NDArray[np.int32],
        counts: npt.NDArray[np.int32],
        column: int,
        want_rows: bool,
    ) -> tuple[int, int, list[int] | None]:
        """Take ``plan`` as the latest ids (``counts[row, column]`` their lengths), mark its rows
        in every slot, render slot ``slot``'s marked rows into ``table`` (int32 ``[rows,
        width]``); ``(rows written, cells written, the rows when want_rows)``."""
        want = bool(want_rows)
        self._check_idle()
        slot = index_arg(slot, self.slots, "slot")
        table, counts = checked_tables(table, counts, self.rows, self.width)
        column = index_arg(column, counts.shape[1], "column")
        if type(plan) is not Plan or plan.generation is not self._generation:
            if type(plan) is not list and type(plan) is not Plan:
                raise TypeError("plan must be a plan this kernel staged")
            self._check_plan(plan)  # stale or made elsewhere: every change, before any write
        held, distinct, ring = self._held, self._distinct, self.ring
        for r, new, mark, checked in plan:
            held[r] = new
            distinct[r] = checked
            counts[r, column] = len(new)
            for marks in self._marks:
                marks[r] = merged(marks.get(r), mark, ring)
        return self._render(self._marks[slot], table, want)

    def _new_plan(self) -> Plan:
        plan = Plan()
        plan.generation = self._generation
        return plan

    def _check_plan(self, plan: list[Any]) -> None:
        """``ValueError`` unless every change is a row of this kernel, a list of ids, a mark
        whose positions fit the width and a bool (the compiled ``checked_plan``'s bounds)."""
        for change in plan:
            if not (
                type(change) is tuple
                and len(change) == 4
                and type(change[0]) is int
                and 0 <= change[0] < self.rows
                and type(change[1]) is list
                and type(change[3]) is bool
                and self._fits(change[2])
            ):
                raise ValueError("plan is not one this kernel staged")

    def _fits(self, mark: object) -> bool:
        """Whether ``mark`` is a mark of this kernel's width."""
        if type(mark) is not tuple or len(mark) != 2 or type(mark[1]) is not tuple:
            return False
        mode, where = mark
        if mode == WHOLE:
            return True
        if not where or not all(type(p) is int for p in where):
            return False
        if mode == POSITIONS:
            return bool(min(where) >= 0 and max(where) < self.width)
        return bool(mode == SPAN and len(where) == 2 and 0 <= where[0] < where[1] <= self.width)

    def invalidate(self, slot: int) -> None:
        """Mark every row of slot ``slot`` (every slot: -1) whole."""
        self._check_idle()
        every = type(slot) is int and slot == -1
        targets = self._marks if every else [self._marks[index_arg(slot, self.slots, "slot")]]
        for marks in targets:
            marks.update(dict.fromkeys(range(self.rows), (WHOLE, ())))

    def clear(self, row: int) -> None:
        """Row ``row`` (every row: -1) holds no ids; every slot marks what a render of the
        cleared row changes (nothing for a row holding none; a paged row's ids; else whole)."""
        self._check_idle()
        for r in self._targets(row):
            old = self._held[r]
            if old is not None and not old:
                continue
            mark = cleared_mark(old, self.ring)
            self._held[r] = []
            self._distinct[r] = False
            for marks in self._marks:
                marks[r] = merged(marks.get(r), mark, self.ring)

    def forget(self, row: int) -> None:
        """Row ``row`` (every row: -1) holds unknown ids; no slot marks it (its cells are left
        as they are; a later change renders it whole)."""
        self._check_idle()
        for r in self._targets(row):
            self._held[r] = None
            self._distinct[r] = False
            for marks in self._marks:
                marks.pop(r, None)

    def rows_of(self, plan: list[Change]) -> list[int]:
        """The rows a plan this kernel staged changes, in its order."""
        if type(plan) is not Plan and type(plan) is not list:
            raise TypeError("plan must be a plan this kernel staged")
        return [change[0] for change in plan]

    def _targets(self, row: object) -> Sequence[int]:
        if type(row) is int and row == -1:
            return range(self.rows)
        return (index_arg(row, self.rows, "row"),)

    def _render(
        self, marks: dict[int, Mark], table: npt.NDArray[np.int32], want_rows: bool
    ) -> tuple[int, int, list[int] | None]:
        width, pad, held = self.width, self.pad, self._held
        cells = 0
        whole: list[int] = []
        for r, (mode, where) in marks.items():
            ids = held[r]
            if mode == WHOLE:
                whole.append(r)
            elif self.ring:
                assert ids is not None
                n = len(ids)
                for p in where:
                    table[r, p::n] = ids[p]
                    cells += len(range(p, width, n))
            else:
                assert ids is not None
                n = len(ids)
                span = where if mode == POSITIONS else range(where[0], where[1])
                for p in span:
                    table[r, p] = ids[p] if p < n else pad
                cells += len(span)
        if whole:
            cells += len(whole) * width
            self._render_whole(sorted(whole), table)
        written = sorted(marks) if want_rows else None
        count = len(marks)
        marks.clear()
        return count, cells, written

    def _render_whole(self, rows: list[int], table: npt.NDArray[np.int32]) -> None:
        """Rows rendered whole: ring rows of one length tiled in one block, paged rows one
        block; unknown rows 0 (ring) or ``pad`` (paged), cleared rows ``pad``."""
        held = self._held
        if self.ring:
            by_length: dict[int, list[int]] = {}
            for r in rows:
                held_ids = held[r]
                by_length.setdefault(-1 if held_ids is None else len(held_ids), []).append(r)
            for n, members in by_length.items():
                if n <= 0:
                    table[members] = 0 if n < 0 else self.pad
                    continue
                ids = np.array([held[r] for r in members], dtype=np.int32)
                block = np.empty((len(members), self.width), dtype=np.int32)
                tile_rows(block, ids)
                table[members] = block
            return
        lists = [held[r] or [] for r in rows]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        block = np.full((len(rows), self.width), self.pad, dtype=np.int32)
        flat = np.fromiter(
            (x for ids in lists for x in ids), dtype=np.int32, count=int(lengths.sum())
        )
        block[np.arange(self.width) < lengths[:, None]] = flat
        table[rows] = block
