"""The DeepSeek V4 tables of a step: the :class:`~blockprep.grouped.GroupedTables` over every
slot's 7 tables and ``block_counts``, and a step's plan from the batch's id lists or from a
:mod:`blockprep.wire` message.

Contract: :func:`bind_tables` builds the tables over ``ranks * decode_batch`` rows (one per
``rank * decode_batch + local`` kernel row, keyed by request id) on the slots' own buffers, and
the scratch lists ``[num_blocks + k]`` of each rank's ``k``-th padding row (never mutated). A plan
decides every group's rows in table order and writes nothing (the caller commits it); when the
plan of id lists finds a fault, upstream's first error for the whole batch
(:func:`~blockprep.adapters.deepseek._checks.upstream_error`) is raised, the plan's own error (the
id rule) when upstream had none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blockprep._engine import index_records
from blockprep.adapters.deepseek._assignment import Assignment
from blockprep.adapters.deepseek._checks import raise_first, upstream_error
from blockprep.adapters.deepseek._lifecycle import Slot
from blockprep.adapters.deepseek.layout import GROUP_NAMES, DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepValueError
from blockprep.grouped import BlockIdValueError, GroupedStep, GroupedTables, TableGroup
from blockprep.packed import header, is_packed, records
from blockprep.wire import DeltaCursor, DeltaMessageError


@dataclass(frozen=True)
class Scratch:
    """The ids of padding rows (never mutated): ``lists[group][k]`` is ``[num_blocks + k]``, the
    scratch list of a rank's ``k``-th padding row; ``rows[k]`` the same lists by group name."""

    lists: list[list[list[int]]]
    rows: tuple[dict[str, list[int]], ...]


NO_SCRATCH = Scratch([], ())
"""The scratch of an unbound layout (nothing is planned on it)."""


def bind_tables(
    layout: DeepSeekV4Layout, slots: Sequence[Slot], track: bool
) -> tuple[GroupedTables, Scratch]:
    """The tables of a bound ``layout`` over ``slots``' buffers, and the scratch lists."""
    R, b = layout.ranks, layout.decode_batch
    groups = []
    for g in layout.groups:
        assert g.num_blocks is not None
        groups.append(TableGroup(g.name, g.kind, g.width, g.num_blocks, min_ids=1))
    tables = GroupedTables(
        groups,
        R * b,
        slots=len(slots),
        buffers=[(slot.flat_tables, slot.counts.view(R * b, -1)) for slot in slots],
        track_rows=track,
    )
    lists = [[[n + k] for k in range(b)] for n in layout.num_blocks.values()]
    rows = tuple(dict(zip(GROUP_NAMES, pages, strict=True)) for pages in zip(*lists, strict=True))
    return tables, Scratch(lists, rows)


def plan_tables(
    tables: GroupedTables,
    layout: DeepSeekV4Layout,
    batch: DecodeBatch,
    assignment: Assignment,
    scratch: Scratch,
) -> GroupedStep:
    """Every group's rows in table order (requests by assignment, scratch pages on padding
    rows), planned by the grouped tables; on any error, upstream's first error wins."""
    perm = assignment.perm
    try:
        lists: Sequence[Any] = batch.block_ids_by_group
        if not assignment.in_order:  # table order: requests by assignment, padding rows' scratch
            lists = list(map((*lists, *scratch.rows).__getitem__, perm))
        elif type(lists) is not list:
            lists = list(lists)
        return tables.plan_mappings(lists, assignment.occupants, lambda r: f"decode row {perm[r]}")
    except (KeyError, TypeError, BlockIdValueError) as error:
        # the id rule, or a row that is no mapping, a group missing: upstream's error first
        raise_first(upstream_error(layout, batch, assignment))
        raise error from None


def plan_deltas(
    tables: GroupedTables,
    cursor: DeltaCursor,
    message: object,
    batch: DecodeBatch,
    assignment: Assignment,
    scratch: Scratch,
) -> tuple[GroupedStep, int]:
    """Plan the tables from a :mod:`blockprep.wire` message (``{request: {group: ops}}``)
    on what they hold: the step costs what changed. Returns the step and the message's
    number (``cursor`` checks the message builds on the last one applied; the caller moves it
    on once the step is committed). A :mod:`blockprep.packed` message (groups in
    ``GROUP_NAMES`` order) is read in place: its records' offsets go to the kernels."""
    data = None
    if is_packed(message):
        seq, base, count, data = header(message)
        index = index_records(data, count, assignment.request_rows.tolist(), len(GROUP_NAMES))
        if index is None:  # a malformed record: the twin's walk words it
            records(message, len(batch.request_ids), len(GROUP_NAMES))
            raise AssertionError("index_records refused records that packed.records takes")
        cursor.check_sequence(seq, base, count > 0)
        changes: list[dict[int, Any]] = index
        rows: Mapping[Any, Any] = {}
    else:
        seq, rows = cursor.check(message)
    if batch.block_ids_by_group:
        raise BlockprepValueError(
            "a DeepSeekV4 batch carries block_ids_by_group or block_deltas, not both"
        )
    if data is None:  # the message's rows by group
        changes = list(_walk(rows, assignment).values())
    perm = assignment.perm
    A = len(assignment.ranks)

    def padding(group: int, row: int) -> list[int]:
        return scratch.lists[group][perm[row] - A]

    step = tables.plan_deltas(
        changes,
        assignment.occupants,
        padding,
        lambda r: f"decode row {perm[r]}",
        whole=isinstance(message, Mapping) and message.get("base") is None,
        data=data,
    )
    return step, seq


def _walk(rows: Mapping[Any, Any], assignment: Assignment) -> dict[str, dict[int, Any]]:
    """A wire message's rows by group name (``{table row: ops}``): the plain message (every
    request in the batch, each a dict by known group name) in one pass; anything else through
    :func:`_checked_walk`, which words each fault."""
    by_name: dict[str, dict[int, Any]] = {name: {} for name in GROUP_NAMES}
    row_of = assignment.row_of
    try:
        for request, groups in rows.items():
            row = row_of[request]
            if type(groups) is not dict:
                return _checked_walk(rows, assignment)
            for name, ops in groups.items():
                by_name[name][row] = ops
    except (KeyError, TypeError):
        return _checked_walk(rows, assignment)
    return by_name


def _checked_walk(rows: Mapping[Any, Any], assignment: Assignment) -> dict[str, dict[int, Any]]:
    """A wire message's rows by group name (``{table row: ops}``), each fault its own
    :class:`DeltaMessageError` (the request or group named)."""
    by_name: dict[str, dict[int, Any]] = {name: {} for name in GROUP_NAMES}
    row_of = assignment.row_of
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
            group = by_name.get(name)
            if group is None:
                raise DeltaMessageError(
                    f"request {request!r}: unknown group {name!r}; the groups are "
                    f"{list(GROUP_NAMES)}"
                )
            group[row] = ops
    return by_name
