"""Scheduler side of the packed wire: block events recorded as a KV manager acts, or full lists
diffed, each step's change packed as :mod:`blockprep.packed` int32 records.

Two ways in:

- :class:`BlockEventRecorder`: the scheduler's KV manager tells it what it did (a request
  started with these lists, a page appended, ring slots set, a row truncated, a request
  finished); :meth:`BlockEventRecorder.message` packs the step's events for the batch. Each
  event is checked where it happens (a scheduler bug is caught at its source), costs one
  dictionary lookup, an update of the recorder's mirror of the request's ids and one record
  appended to an ``array.array``.
- :class:`PackedDeltaEncoder`: for a scheduler that only has full lists; it compares them with
  what it last sent (``list == list``, C speed) and packs the difference, with
  :class:`blockprep.wire.BlockDeltaEncoder`'s arguments, checks and choice of operations.

Both keep the wire's rules (the worker applies a message as the :mod:`blockprep.wire` ops
:func:`blockprep.packed.unpack` gives): a request of the batch that was not in the previous
message's batch (every request of the first message, and of the message after a resync) is
sent whole, one whole record per group; a request in both gets its change as records; one
without change gets nothing. ``seq`` counts messages from 0; ``base`` is the previous
message's ``seq``, ``None`` at first and after a resync.

Resync: a worker that refused a message (a lost or corrupted one, a rejected step) sends back
:func:`blockprep.wire.resync_request` (``{"resync": True, "applied": seq or None}``); the
scheduler passes it to ``resync``, and the next message carries every request of its batch
whole (a duplicate request costs one more whole message, nothing else).
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, cast

from blockprep import backend
from blockprep.engine import differing_rows
from blockprep.errors import BlockprepTypeError, BlockprepValueError
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
    is_resync_request,
)

_HANDLE = operator.attrgetter("handle")

_KINDS = {WHOLE: WHOLE_RECORD, APPEND: APPEND_RECORD, SET: SET_RECORD, TRUNCATE: TRUNCATE_RECORD}
"""Wire operation tag -> packed record kind."""

ID_LIMIT = 2**31
"""Block ids are ints in ``[0, ID_LIMIT)`` (they travel as int32)."""

_SWAP = sys.byteorder == "big"
assert array("i").itemsize == 4, "blockprep.events needs a 4-byte C int"


def _payload(words: array[int]) -> bytes:
    """``words`` as the message's little-endian payload."""
    if _SWAP:
        words = array("i", words)
        words.byteswap()
    return words.tobytes()


def _checked_groups(groups: Sequence[str] | None) -> tuple[str, ...] | None:
    if groups is None:
        return None
    if isinstance(groups, str) or not isinstance(groups, Sequence):
        raise BlockprepTypeError(
            f"groups must be a sequence of group names or None, got {type(groups).__name__}"
        )
    names = tuple(groups)
    if not names or not all(type(g) is str for g in names) or len(set(names)) != len(names):
        raise BlockprepValueError(f"groups must be distinct group names, got {list(names)}")
    return names


def _place(request: object, group: str | None) -> str:
    return f"request {request!r}" + ("" if group is None else f", group {group!r}")


def _bad_id(x: object, where: str, what: str = "block id") -> Exception:
    if type(x) is not int:
        return BlockprepTypeError(f"{where}: {what} {x!r} of type {type(x).__name__} is not an int")
    return BlockprepValueError(f"{where}: {what} {x} is not in [0, {ID_LIMIT})")


def _ids_of(ids: object, where: str) -> list[int]:
    """``ids`` (a list or tuple of ints in ``[0, ID_LIMIT)``) as a new list."""
    if type(ids) is not list and type(ids) is not tuple:
        raise BlockprepTypeError(
            f"{where}: block ids must be a list or tuple of ints, got {type(ids).__name__}"
        )
    if ids and not (all(type(x) is int for x in ids) and min(ids) >= 0 and max(ids) < ID_LIMIT):
        raise next(_bad_id(x, where) for x in ids if type(x) is not int or not 0 <= x < ID_LIMIT)
    return list(ids)


def _check_resync(request: object) -> None:
    if request is not None and not is_resync_request(request):
        raise BlockprepValueError(
            f"resync expects the worker's resync request (blockprep.wire.resync_request: "
            f"{{'resync': True, 'applied': int or None}}) or None, got {request!r}"
        )


class _Live:
    """A live request: its ids per group (the recorder's mirror) and its record handle."""

    __slots__ = ("fresh", "handle", "lists")

    def __init__(self, lists: list[list[int]], handle: int) -> None:
        self.lists = lists
        self.handle = handle
        self.fresh = True  # started since the last message: goes whole, records none


# A batch's placement: each handle's row, each row's handle, the rows sent whole with their
# requests (in row order).
_Placement = tuple[dict[int, int], list[int], list[tuple[int, "_Live"]]]


def _not_live(row: int, request: Hashable) -> BlockprepValueError:
    return BlockprepValueError(f"batch row {row}: request {request!r} is not live (start it first)")


def _repeated() -> BlockprepValueError:
    return BlockprepValueError("request ids must be unique within a batch")


class BlockEventRecorder:
    """Records a scheduler's block events and packs one message per step.

    ``groups``: ``None`` for one id list per request (Qwen), else the group names in the
    worker's order (a record's ``group`` is the index; DeepSeek:
    ``[name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS]``). Every event method takes
    ``group=None`` in a flat recorder and a group name in a grouped one.

    Every event is checked before anything is recorded: an unknown request or group, a start of
    a live request, an id that is not a plain int (bools refused) in ``[0, 2**31)``, a position
    outside the row or repeated, a truncate length outside ``[0, len]`` raise
    ``BlockprepValueError``/``BlockprepTypeError`` naming the request, group, position and
    value, and leave the recorder as it was.

    The recorder keeps a mirror of every live request's ids (its events applied), so a request
    new to the worker (or every request after a resync) is sent whole from it. Events of
    requests not in the next message's batch are dropped (they go whole when they come back).
    """

    def __init__(self, groups: Sequence[str] | None = None) -> None:
        self._groups = _checked_groups(groups)
        names = self._groups
        self._index: dict[str | None, int] = (
            {None: 0} if names is None else {g: i for i, g in enumerate(names)}
        )
        self._live: dict[Hashable, _Live] = {}
        self._words: list[int] = []  # the step's records (a list extends faster than an array)
        self._heads: list[int] = []  # where each of the step's records starts in _words
        self._fresh: list[_Live] = []
        self._free: list[int] = []  # handles of finished requests, reusable after a message
        self._released: list[int] = []
        self._handles = 0
        self._last_ids: list[Hashable] | None = None  # the last message's batch
        self._rows: dict[int, int] = {}  # its handles' batch rows (requests sent as records)
        self._row_handles: list[int] = []  # per row of that batch, its request's handle
        self._next = 0
        self._base: int | None = None

    # the events ---------------------------------------------------------------------------

    def start(self, request: Hashable, ids: Sequence[int] | Mapping[str, Sequence[int]]) -> None:
        """``request`` starts holding ``ids`` (flat: a list of ints; grouped: ``{name: ids}``
        with every group); it goes whole in the next message of a batch it is in."""
        try:
            live = request in self._live
        except TypeError:
            raise BlockprepTypeError(
                f"request ids must be hashable, got {type(request).__name__}"
            ) from None
        if live:
            raise BlockprepValueError(f"start of request {request!r}, which is live: finish it")
        names = self._groups
        if names is None:
            lists = [_ids_of(ids, _place(request, None))]
        else:
            if not isinstance(ids, Mapping):
                raise BlockprepTypeError(
                    f"start of request {request!r}: a grouped recorder takes {{group: ids}}, "
                    f"got {type(ids).__name__}"
                )
            if ids.keys() != set(names):
                raise BlockprepValueError(
                    f"start of request {request!r} with groups {sorted(map(str, ids))}; this "
                    f"recorder's groups are {sorted(names)} (every group, each once)"
                )
            lists = [_ids_of(ids[g], _place(request, g)) for g in names]
        if self._free:
            handle = self._free.pop()
        else:
            handle = self._handles
            self._handles += 1
        state = _Live(lists, handle)
        self._live[request] = state
        self._fresh.append(state)

    def append(self, request: Hashable, ids: int | Sequence[int], group: str | None = None) -> None:
        """``ids`` (one id, or a list or tuple of them) appended to ``request``'s ``group``."""
        live = self._live.get(request)
        g = self._index.get(group)
        if live is None or g is None:  # the hot loop's lookups inline; _find words the error
            live, g = self._find(request, group)
        row = live.lists[g]
        if type(ids) is int:
            if not 0 <= ids < ID_LIMIT:
                raise _bad_id(ids, _place(request, group))
            row.append(ids)
            if not live.fresh:
                self._heads.append(len(self._words))
                self._words.extend((APPEND_RECORD, g, live.handle, 1, ids))
            return
        values = _ids_of(ids, _place(request, group))
        if not values:
            return
        row.extend(values)
        if not live.fresh:
            words = self._words
            self._heads.append(len(words))
            words.extend((APPEND_RECORD, g, live.handle, len(values)))
            words.extend(values)

    def set(
        self,
        request: Hashable,
        positions: int | Sequence[int],
        ids: int | Sequence[int],
        group: str | None = None,
    ) -> None:
        """``ids[i]`` at ``positions[i]`` of ``request``'s ``group`` (a ring slot rotated;
        one position and one id, or lists or tuples of equal length, positions distinct)."""
        live = self._live.get(request)
        g = self._index.get(group)
        if live is None or g is None:
            live, g = self._find(request, group)
        row = live.lists[g]
        n = len(row)
        if type(positions) is int and type(ids) is int:
            if not 0 <= positions < n:
                raise BlockprepValueError(
                    f"{_place(request, group)}: position {positions} is not in [0, {n})"
                )
            if not 0 <= ids < ID_LIMIT:
                raise _bad_id(ids, f"{_place(request, group)}, position {positions}")
            row[positions] = ids
            if not live.fresh:
                self._heads.append(len(self._words))
                self._words.extend((SET_RECORD, g, live.handle, 1, positions, ids))
            return
        where = _place(request, group)
        if type(positions) not in (list, tuple) or type(ids) not in (list, tuple):
            raise BlockprepTypeError(
                f"{where}: set takes a position and an id, or lists of them, got "
                f"{type(positions).__name__} and {type(ids).__name__}"
            )
        assert not isinstance(positions, int) and not isinstance(ids, int)
        if len(positions) != len(ids):
            raise BlockprepValueError(f"{where}: {len(positions)} positions for {len(ids)} ids")
        for p, x in zip(positions, ids, strict=True):
            if type(p) is not int or not 0 <= p < n:
                raise BlockprepValueError(f"{where}: position {p!r} is not an int in [0, {n})")
            if type(x) is not int or not 0 <= x < ID_LIMIT:
                raise _bad_id(x, f"{where}, position {p}")
        if len(positions) > 1 and len(set(positions)) != len(positions):
            raise BlockprepValueError(f"{where}: positions {list(positions)} repeat")
        if not positions:
            return
        for p, x in zip(positions, ids, strict=True):
            row[p] = x
        if not live.fresh:
            words = self._words
            self._heads.append(len(words))
            words.extend((SET_RECORD, g, live.handle, len(positions)))
            words.extend(positions)
            words.extend(ids)

    def truncate(self, request: Hashable, length: int, group: str | None = None) -> None:
        """``request``'s ``group`` keeps its first ``length`` ids."""
        live, g = self._find(request, group)
        row = live.lists[g]
        if type(length) is not int or not 0 <= length <= len(row):
            raise BlockprepValueError(
                f"{_place(request, group)}: truncate length {length!r} is not an int in "
                f"[0, {len(row)}]"
            )
        if length == len(row):
            return
        del row[length:]
        if not live.fresh:
            self._heads.append(len(self._words))
            self._words.extend((TRUNCATE_RECORD, g, live.handle, length))

    def finish(self, request: Hashable) -> None:
        """``request`` is done (its pages freed): the recorder forgets it."""
        live = self._live.pop(request, None)
        if live is None:
            raise BlockprepValueError(f"finish of request {request!r}, which is not live")
        self._released.append(live.handle)

    def held(self, request: Hashable) -> list[int] | dict[str, list[int]]:
        """A copy of ``request``'s ids as the recorder holds them (flat: a list; grouped:
        ``{name: list}``)."""
        live = self._live.get(request)
        if live is None:
            raise BlockprepValueError(f"request {request!r} is not live")
        if self._groups is None:
            return list(live.lists[0])
        return {g: list(ids) for g, ids in zip(self._groups, live.lists, strict=True)}

    def _find(self, request: Hashable, group: str | None) -> tuple[_Live, int]:
        live = self._live.get(request)
        g = self._index.get(group)
        if live is None or g is None:
            if live is None:
                raise BlockprepValueError(f"request {request!r} is not live (start it first)")
            if self._groups is None:
                raise BlockprepValueError(
                    f"request {request!r}: group {group!r} given to a flat recorder"
                )
            raise BlockprepValueError(
                f"request {request!r}: unknown group {group!r} (groups: {list(self._groups)})"
            )
        return live, g

    # the message --------------------------------------------------------------------------

    def message(self, request_ids: Sequence[Hashable]) -> dict[str, Any]:
        """The packed message of this step for the batch ``request_ids`` (its order gives each
        record's ``row``); the step's events are consumed.

        Raises (nothing consumed):
            TypeError: ``request_ids`` not a list or tuple.
            ValueError: a request repeated or not live.
        """
        if type(request_ids) is not list and type(request_ids) is not tuple:
            raise BlockprepTypeError(
                f"BlockEventRecorder.message: request_ids must be a list or tuple, got "
                f"{type(request_ids).__name__}"
            )
        if (
            self._base is not None
            and not self._fresh
            and not self._released
            and request_ids == self._last_ids
        ):  # the batch of the last message, no request started or finished since: no lookups
            out: array[int] = array("i")
            count = self._remap(out, self._rows)
        else:
            placed = self._patched_rows(request_ids)
            if placed is None:
                placed = self._placed_rows(request_ids)
            every, handles, whole = placed
            out, count, rows = self._whole_records(every, whole)
            count += self._remap(out, rows)
            self._last_ids = list(request_ids)
            self._rows = every
            self._row_handles = handles
        result = message(self._next, self._base, count, _payload(out))
        self._base = self._next
        self._next += 1
        self._words = []
        self._heads = []
        for state in self._fresh:
            state.fresh = False
        self._fresh = []
        self._free += self._released
        self._released = []
        return result

    def _placed_rows(self, request_ids: Sequence[Hashable]) -> _Placement:
        """The batch's placement from every id: each handle's row, each row's handle, and the
        rows sent whole with their requests, in row order (every row after a resync; else those
        whose request is not the one the last message placed: new to it, or started again
        since). Every request checked live, none twice."""
        live = self._live
        found = list(map(live.get, request_ids))  # C speed: a batch of hundreds
        if None in found:
            row = found.index(None)
            raise _not_live(row, request_ids[row])
        states = cast(list[_Live], found)
        handles = list(map(_HANDLE, states))
        every = dict(zip(handles, range(len(handles)), strict=True))  # handle -> row
        if len(every) != len(handles):  # one request's state twice: its id repeats
            raise _repeated()
        if self._base is None:
            return every, handles, list(enumerate(states))
        last = self._rows  # a handle placed by the last message is that request still
        whole = [(row, state) for row, state in enumerate(states) if handles[row] not in last]
        return every, handles, whole

    def _patched_rows(self, request_ids: Sequence[Hashable]) -> _Placement | None:
        """:meth:`_placed_rows` from the last message's placement, looking up only the rows whose
        id changed and those of requests finished since (a handle is only reused after a
        message, so every other row holds the request it held); ``None`` when there is none to
        patch (a resync, a first message, a batch of another length or no list)."""
        last_ids = self._last_ids
        if self._base is None or last_ids is None or len(last_ids) != len(request_ids):
            return None
        changed = differing_rows(request_ids, last_ids)
        if changed is None:
            return None
        last = self._rows
        if self._released:  # a request finished since (started again or not): look again
            gone = {last[h] for h in self._released if h in last}
            changed = sorted(gone.union(changed))
        live = self._live
        found = [live.get(request_ids[row]) for row in changed]
        if None in found:
            row = changed[found.index(None)]  # the first row not live: the others are
            raise _not_live(row, request_ids[row])
        every = last.copy()
        handles = list(self._row_handles)
        for row in changed:
            del every[handles[row]]  # the handles of one batch are distinct: each leaves once
        states = cast(list[_Live], found)
        for row, state in zip(changed, states, strict=True):
            if state.handle in every:  # placed at a row that kept it, or here already
                raise _repeated()
            every[state.handle] = row
            handles[row] = state.handle
        placed = zip(changed, states, strict=True)
        return every, handles, [(row, state) for row, state in placed if state.handle not in last]

    @staticmethod
    def _whole_records(
        every: dict[int, int], whole: list[tuple[int, _Live]]
    ) -> tuple[array[int], int, dict[int, int]]:
        """The whole records of the ``whole`` rows' requests (in row order), their count, and
        the batch row of every other request's handle (the requests sent as records)."""
        out: array[int] = array("i")
        count = 0
        rows = every.copy()  # handle -> row, requests sent as records
        for row, state in whole:
            for g, ids in enumerate(state.lists):
                out.extend((WHOLE_RECORD, g, row, len(ids)))
                out.fromlist(ids)
            count += len(state.lists)
            del rows[state.handle]
        return out, count, rows

    def _remap(self, out: array[int], rows: dict[int, int]) -> int:
        """The step's records of the requests in ``rows`` appended to ``out``, each handle
        replaced by its batch row; how many."""
        words, heads = self._words, self._heads
        if not words or not rows:
            return 0
        fields = [words[i + 2] for i in heads]
        if all(map(rows.__contains__, fields)):  # every record goes: patch the rows in place
            for i, handle in zip(heads, fields, strict=True):
                words[i + 2] = rows[handle]
            out.fromlist(words)
            return len(heads)
        count = 0
        ends = [*heads[1:], len(words)]
        for i, end, handle in zip(heads, ends, fields, strict=True):
            row = rows.get(handle)
            if row is not None:
                words[i + 2] = row
                out.fromlist(words[i:end])
                count += 1
        return count

    def resync(self, request: Mapping[str, Any] | None = None) -> None:
        """The next message carries every request of its batch whole (``request``: the
        worker's :func:`blockprep.wire.resync_request`, checked; ``None``: from the scheduler
        itself).

        Raises:
            ValueError: ``request`` not a resync request.
        """
        _check_resync(request)
        self._base = None


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
        self._groups = _checked_groups(groups)
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
        _check_resync(request)
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
        if backend.diff_lists is not None:  # compiled; None: a step it does not take
            done = backend.diff_lists(self._held, request_ids, block_lists, self._groups)
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
                (type(lists) is list and lists == old)
                if names is None
                else (
                    type(lists) is dict
                    and list(map(type, lists.values())) == types
                    and lists == old
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
        return self._sent(count, _payload(out))

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
    if old is not None and type(ids) is list and ids == old:
        return old, 0
    new = ids if type(ids) is list else _id_copy(ids)
    ops = diff_ops(old, new, lambda values: _checked(values, request, group))
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
        where = _place(request, group)
        raise next(_bad_id(x, where) for x in values if not 0 <= x < ID_LIMIT)
    return values
