"""Verify mode of the vLLM-style facade: ``VllmBlockTable(..., verify=True)`` and
``VllmMultiGroupBlockTable(..., verify=True)`` (every KV cache group, :class:`GroupCallerLists`).

After every call that writes rows, the table (host buffer and ``num_blocks_per_row``) is compared
with :func:`blockprep.reference.block_table_per_row` of the block lists the caller gave, kept here
from the calls' arguments alone (``add_row`` sets a row's list, ``append_row`` extends it, a move
copies it, a packed message's records apply to it by :func:`blockprep.wire.apply_ops`): never
from the table's own held ids, so a page the table dropped or wrote to the wrong row is caught.
The first difference raises :class:`~blockprep.errors.StaleRowError` naming the row and column
(:func:`blockprep._verify.check_buffer`). A refused call changes neither the table nor the lists.
Slow on purpose (a whole rebuild per call): for wiring the facade into an engine, off in
production. Rows must be written through the facade's methods (see ``VllmBlockTable``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from blockprep import packed, reference
from blockprep._verify import check_buffer, rows_and_columns
from blockprep.adapters.vllm._steps import iterable, step_items
from blockprep.wire import apply_ops


def _ints(ids: Any) -> list[int]:
    """A call's ids (a list, tuple, 1-D array or tensor the call accepted) as plain ints."""
    values = ids.tolist() if isinstance(ids, (np.ndarray, torch.Tensor)) else ids
    return [int(x) for x in values]


class CallerLists:
    """Each row's block list as the caller's calls say, and the check of a facade against it.

    ``facade`` is a ``VllmBlockTable`` (``max_num_reqs``, ``max_num_blocks_per_req``,
    ``get_cpu_tensor``, ``num_blocks_per_row``)."""

    def __init__(self, facade: Any, name: str = "VllmBlockTable") -> None:
        self.facade = facade
        self.name = name
        self.lists: list[list[int]] = [[] for _ in range(facade.max_num_reqs)]

    def install(self) -> None:
        """Replace the facade's writing methods by verified ones (on the instance only)."""
        install(self.facade, self)

    # --- what each call does to the lists -------------------------------------------------------

    def append_row(self, block_ids: Any, row_idx: int) -> None:
        self.lists[row_idx] += _ints(block_ids)

    def add_row(self, block_ids: Any, row_idx: int) -> None:
        self.lists[row_idx] = _ints(block_ids)

    def clear_row(self, row_idx: int) -> None:
        self.lists[row_idx] = []

    def move_row(self, src: int, tgt: int) -> None:
        self.lists[tgt] = list(self.lists[src])

    def swap_row(self, src: int, tgt: int) -> None:
        lists = self.lists
        lists[src], lists[tgt] = lists[tgt], lists[src]

    def clear(self) -> None:
        self.lists = [[] for _ in self.lists]

    def apply_step(
        self,
        *,
        finished: Iterable[int] = (),
        appended: Any = (),
        added: Any = (),
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """The facade's ``apply_step``, its arguments read once (iterators included), then
        the lists and the check."""
        self.record_step(*applied_step(self.facade, finished, appended, added, moves, num_reqs))
        self.check()

    def record_step(
        self,
        finished: list[int],
        appended: list[tuple[int, Any]],
        added: list[tuple[int, Any]],
        moves: list[tuple[int, int]],
        group: int | None = None,
    ) -> None:
        """A step's rows in the lists (``group``: each row's ids are one list per group, this
        group's taken)."""

        def ids_of(ids: Any) -> list[int]:
            return _ints(ids if group is None else ids[group])

        for row in finished:
            self.lists[row] = []
        for row, ids in appended:
            if ids is not None:
                self.lists[row] += ids_of(ids)
        for row, ids in added:
            self.lists[row] = ids_of(ids)
        self.moved(moves)

    def apply_packed(
        self,
        message: object,
        *,
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """The facade's ``apply_packed``, then the message's records applied to the lists by
        :func:`blockprep.wire.apply_ops` (a resync: each row named starts whole), the moves,
        and the check."""
        applied_packed(self.facade, [self], message, moves, num_reqs)
        self.check()

    def moved(self, moves: list[tuple[int, int]]) -> None:
        """Each ``(src, tgt)`` of ``moves``, in order: ``tgt``'s list a copy of ``src``'s."""
        for src, tgt in moves:
            self.lists[tgt] = list(self.lists[src])

    # --- the check ------------------------------------------------------------------------------

    def check(self) -> None:
        """The facade's table and counts against the rebuild of the lists: ``StaleRowError``
        naming the first differing row and column."""
        facade = self.facade
        rebuilt = reference.block_table_per_row(
            self.lists, max_blocks=facade.max_num_blocks_per_req, pad=0
        )
        table = facade.get_cpu_tensor()
        check_buffer(self.name, "block_table", table, rebuilt, rows_and_columns)
        counts = torch.tensor([len(ids) for ids in self.lists], dtype=torch.int32)
        got = torch.from_numpy(np.array(facade.num_blocks_per_row))
        check_buffer(self.name, "num_blocks_per_row", got, counts, rows_and_columns)


class GroupCallerLists:
    """:class:`CallerLists` of every KV cache group of a ``VllmMultiGroupBlockTable``: a call's
    ``block_ids[g]`` go to group ``g``'s lists, a packed record's ``group`` names its group, and
    after every call that writes rows every group is checked (the error names the group)."""

    def __init__(self, tables: Any) -> None:
        self.facade = tables
        self.groups = [
            CallerLists(table, f"KV cache group {g}") for g, table in enumerate(tables.block_tables)
        ]

    def install(self) -> None:
        """Replace the tables' writing methods by verified ones (on the instance only)."""
        install(self.facade, self)

    def append_row(self, block_ids: Any, row_idx: int) -> None:
        for lists, ids in zip(self.groups, block_ids, strict=True):
            lists.append_row(ids, row_idx)

    def add_row(self, block_ids: Any, row_idx: int) -> None:
        for lists, ids in zip(self.groups, block_ids, strict=True):
            lists.add_row(ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        for lists in self.groups:
            lists.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        for lists in self.groups:
            lists.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        for lists in self.groups:
            lists.swap_row(src, tgt)

    def clear(self) -> None:
        for lists in self.groups:
            lists.clear()

    def apply_step(
        self,
        *,
        finished: Iterable[int] = (),
        appended: Any = (),
        added: Any = (),
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """The tables' ``apply_step``, its arguments read once, then each group's lists and
        the check."""
        step = applied_step(self.facade, finished, appended, added, moves, num_reqs)
        for g, group in enumerate(self.groups):
            group.record_step(*step, group=g)
        self.check()

    def apply_packed(
        self,
        message: object,
        *,
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """The tables' ``apply_packed``, then each record applied to its group's lists by
        :func:`blockprep.wire.apply_ops`, the moves, and the check."""
        applied_packed(self.facade, self.groups, message, moves, num_reqs)
        self.check()

    def check(self) -> None:
        for group in self.groups:
            group.check()


def applied_step(
    facade: Any,
    finished: Iterable[int],
    appended: Any,
    added: Any,
    moves: Iterable[tuple[int, int]],
    num_reqs: int | None,
) -> tuple[list[int], list[tuple[int, Any]], list[tuple[int, Any]], list[tuple[int, int]]]:
    """``facade``'s own ``apply_step`` of the arguments, each read once (iterators included);
    the lists it read."""
    step = (
        list(iterable(finished, "finished", "an iterable of rows")),
        list(step_items(appended, "appended")),
        list(step_items(added, "added")),
        list(iterable(moves, "moves", "(src, tgt) pairs")),
    )
    type(facade).apply_step(
        facade,
        finished=step[0],
        appended=step[1],
        added=step[2],
        moves=step[3],
        num_reqs=num_reqs,
    )
    return step


def applied_packed(
    facade: Any,
    groups: list[CallerLists],
    message: object,
    moves: Iterable[tuple[int, int]],
    num_reqs: int | None,
) -> None:
    """``facade``'s own ``apply_packed``, then each record applied to its group's lists (a
    record's ``group`` is the index in ``groups``) by :func:`blockprep.wire.apply_ops`, then the
    moves."""
    moves = list(iterable(moves, "moves", "(src, tgt) pairs"))
    type(facade).apply_packed(facade, message, moves=moves, num_reqs=num_reqs)
    names = [str(g) for g in range(len(groups))]
    rows = packed.unpack(message, list(range(len(groups[0].lists))), names)["rows"]
    for row, by_group in rows.items():
        for name, ops in by_group.items():
            group = groups[int(name)]
            group.lists[row] = apply_ops(ops, group.lists[row])
    for group in groups:
        group.moved(moves)


def install(facade: Any, lists: CallerLists | GroupCallerLists) -> None:
    """``facade``'s writing methods (on the instance) replaced by ones that call them, then
    record the call in ``lists`` and check; a refused call records nothing."""
    for name in ("append_row", "add_row", "clear_row", "move_row", "swap_row", "clear"):
        call, record = getattr(facade, name), getattr(lists, name)

        def verified(*args: Any, _call: Any = call, _record: Any = record, **kwargs: Any) -> None:
            _call(*args, **kwargs)  # refused: raises, nothing recorded
            _record(*args, **kwargs)
            lists.check()

        verified.__doc__ = call.__doc__
        setattr(facade, name, verified)
    facade.apply_step = lists.apply_step
    facade.apply_packed = lists.apply_packed
