"""PackedDeltaEncoder: full lists diffed against what was last sent, the change packed as
:mod:`blockprep.packed` records (see :mod:`blockprep.events`)."""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from blockprep import _backend
from blockprep.errors import BlockprepValueError
from blockprep.events.common import ID_LIMIT, bad_id, check_resync, checked_groups, payload, place
from blockprep.packed import (
    APPEND_RECORD,
    SET_RECORD,
    TRUNCATE_RECORD,
    WHOLE_RECORD,
    message,
)
from blockprep.wire import (
    APPEND,
    SET,
    TRUNCATE,
    WHOLE,
    _id_copy,
    _plain,
    check_batch,
    diff_ops,
    same_ids,
)

_KINDS = {WHOLE: WHOLE_RECORD, APPEND: APPEND_RECORD, SET: SET_RECORD, TRUNCATE: TRUNCATE_RECORD}
"""Wire operation tag -> packed record kind."""


class PackedDeltaEncoder:
    """The differ: :class:`blockprep.wire.BlockDeltaEncoder`'s ``encode`` producing packed
    messages.

    ``groups``: ``None`` for flat lists (every request one list), else the group names in the
    worker's order (every request a ``{group: ids}`` with exactly these). Each list is compared
    with the copy last sent (``==``); a changed one becomes the same operation
    ``BlockDeltaEncoder`` would choose (append, set, truncate, truncate + append, or whole).
    The caller may mutate its lists afterwards (the encoder keeps copies).
    """

    def __init__(self, groups: Sequence[str] | None = None) -> None:
        self._groups = checked_groups(groups)
        names = self._groups or ()
        self._keys = set(names)
        self._index = {g: i for i, g in enumerate(names)}
        self._types = [list] * len(names)
        self._held: dict[Hashable, Any] = {}  # flat: a list; grouped: {group: list}
        self._next = 0
        self._base: int | None = None

    def reset(self) -> None:
        """Forget what the worker holds: the next message carries every request whole."""
        self._base = None
        self._held = {}

    def resync(self, request: Mapping[str, Any] | None = None) -> None:
        """:meth:`reset`, on the worker's resync request (checked as the recorder's)."""
        check_resync(request)
        self.reset()

    def encode(
        self,
        request_ids: Sequence[Hashable],
        block_lists: Sequence[Sequence[int] | Mapping[str, Sequence[int]]],
    ) -> dict[str, Any]:
        """The packed message for this step.

        Raises (nothing is remembered from a refused step): ``BlockDeltaEncoder.encode``'s
        errors, and ``ValueError`` for a request whose lists are not this encoder's shape
        (flat or these groups) or an id outside ``[0, 2**31)``.
        """
        check_batch(request_ids, block_lists)
        if _backend.diff_lists is not None:  # compiled; None: a step it does not take
            done = _backend.diff_lists(self._held, request_ids, block_lists, self._groups)
            if done is not None:
                data, count, self._held = done
                return self._sent(count, data)
        held = self._held
        names, keys, index, types = self._groups, self._keys, self._index, self._types
        out: array[int] = array("i")
        count = 0
        new_held: dict[Hashable, Any] = {}
        changes: list[tuple[list[int], list[Any]]] = []  # (held copy, op), applied at the end
        for row, (request, lists) in enumerate(zip(request_ids, block_lists, strict=True)):
            old = held.get(request)
            if old is not None and (  # nothing changed: one comparison at C speed
                (type(lists) is list and same_ids(lists, old))
                if names is None
                else (
                    type(lists) is dict
                    and list(map(type, lists.values())) == types
                    and same_ids(lists, old)
                )
            ):
                new_held[request] = old
                continue
            if names is None:
                if isinstance(lists, Mapping):
                    raise BlockprepValueError(
                        f"request {request!r} carries grouped block lists, but this encoder "
                        f"is flat (groups=None)"
                    )
                new_held[request], n = _row(request, None, 0, row, old, lists, out, changes)
                count += n
                continue
            if not isinstance(lists, Mapping):
                raise BlockprepValueError(
                    f"request {request!r} carries flat block lists, but this encoder's "
                    f"groups are {list(names)}"
                )
            if lists.keys() != keys:
                raise BlockprepValueError(
                    f"request {request!r} carries groups {sorted(map(str, lists))}, but "
                    f"this encoder's groups are {sorted(names)}"
                )
            copies = {}
            for name, ids in lists.items():
                before = None if old is None else old[name]
                copies[name], n = _row(request, name, index[name], row, before, ids, out, changes)
                count += n
            new_held[request] = copies
        for copy, op in changes:
            tag = op[0]
            if tag == APPEND:
                copy += op[1]
            elif tag == SET:
                for p, x in zip(op[1], op[2], strict=True):
                    copy[p] = x
            else:
                del copy[op[1] :]
        self._held = new_held
        return self._sent(count, payload(out))

    def _sent(self, count: int, data: bytes) -> dict[str, Any]:
        """The message of ``count`` records in ``data``, and the numbers moved on."""
        result = message(self._next, self._base, count, data)
        self._base = self._next
        self._next += 1
        return result


def _row(
    request: Hashable,
    group: str | None,
    g: int,
    row: int,
    old: list[int] | None,
    ids: Any,
    out: array[int],
    changes: list[tuple[list[int], list[Any]]],
) -> tuple[list[int], int]:
    """One row's records (group ``g`` of batch row ``row``) packed into ``out``: the list the
    encoder holds for it afterwards (``old`` itself, changed by ``changes`` at the end, or a new
    copy) and how many records."""
    if old is not None and type(ids) is list and same_ids(ids, old):
        return old, 0
    new = ids if type(ids) is list else _id_copy(ids)
    try:
        ops = diff_ops(old, new, lambda values: _checked(values, request, group))
    except Exception:  # an id whose comparison raises: the id check names it
        _checked(new, request, group)
        raise
    for op in ops:
        tag = op[0]
        kind = _KINDS[tag]
        if tag in (WHOLE, APPEND):
            out.extend((kind, g, row, len(op[1])))
            out.extend(op[1])
        elif tag == SET:
            out.extend((kind, g, row, len(op[1])))
            out.extend(op[1])
            out.extend(op[2])
        else:
            out.extend((kind, g, row, op[1]))
        if tag == WHOLE:
            old = op[1]
        else:
            assert old is not None
            changes.append((old, op))
    assert old is not None
    return old, len(ops)


def _checked(ids: list[Any], request: Hashable, group: str | None) -> list[int]:
    """``ids`` (a list of the encoder's own) as plain ints (wire's type check and text), each in
    ``[0, ID_LIMIT)``."""
    for x in ids:
        if type(x) is not int or not 0 <= x < ID_LIMIT:
            break
    else:
        return ids
    values = _plain(ids)
    if values and (min(values) < 0 or max(values) >= ID_LIMIT):
        where = place(request, group)
        raise next(bad_id(x, where) for x in values if not 0 <= x < ID_LIMIT)
    return values
