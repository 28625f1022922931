"""BlockEventRecorder: the scheduler's KV manager tells it what it did; each step's events packed
as :mod:`blockprep.packed` records (see :mod:`blockprep.events`)."""

from __future__ import annotations

import operator
from array import array
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, cast

from blockprep._engine import differing_rows
from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.events.common import (
    ID_LIMIT,
    bad_id,
    check_resync,
    checked_groups,
    payload,
    place,
)
from blockprep.packed import (
    APPEND_RECORD,
    SET_RECORD,
    TRUNCATE_RECORD,
    WHOLE_RECORD,
    message,
)

_HANDLE = operator.attrgetter("handle")


def _ids_of(ids: object, where: str) -> list[int]:
    """``ids`` (a list or tuple of ints in ``[0, ID_LIMIT)``) as a new list."""
    if type(ids) is not list and type(ids) is not tuple:
        raise BlockprepTypeError(
            f"{where}: block ids must be a list or tuple of ints, got {type(ids).__name__}"
        )
    if ids and not (all(type(x) is int for x in ids) and min(ids) >= 0 and max(ids) < ID_LIMIT):
        raise next(bad_id(x, where) for x in ids if type(x) is not int or not 0 <= x < ID_LIMIT)
    return list(ids)


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
        self._groups = checked_groups(groups)
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
            lists = [_ids_of(ids, place(request, None))]
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
            lists = [_ids_of(ids[g], place(request, g)) for g in names]
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
                raise bad_id(ids, place(request, group))
            row.append(ids)
            if not live.fresh:
                self._heads.append(len(self._words))
                self._words.extend((APPEND_RECORD, g, live.handle, 1, ids))
            return
        values = _ids_of(ids, place(request, group))
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
                    f"{place(request, group)}: position {positions} is not in [0, {n})"
                )
            if not 0 <= ids < ID_LIMIT:
                raise bad_id(ids, f"{place(request, group)}, position {positions}")
            row[positions] = ids
            if not live.fresh:
                self._heads.append(len(self._words))
                self._words.extend((SET_RECORD, g, live.handle, 1, positions, ids))
            return
        where = place(request, group)
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
                raise bad_id(x, f"{where}, position {p}")
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
                f"{place(request, group)}: truncate length {length!r} is not an int in "
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
        result = message(self._next, self._base, count, payload(out))
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
        check_resync(request)
        self._base = None
