"""A Qwen delta batch's message checked against what the worker holds (:mod:`blockprep.wire`
operations, or a :mod:`blockprep.packed` message read as the one it stands for): each request's
row, and the new id lists of the rows the message changes. Nothing is written here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

from blockprep._engine import differing_rows
from blockprep.packed import is_packed, unpack
from blockprep.wire import DeltaCursor, DeltaMessageError, apply_ops

_new_tuple = tuple.__new__


class DeltaStep(NamedTuple):
    """A checked message: its number, each request's row, the new ids of the rows it changes
    (``None``: a request new to the worker, whose whole list the message's ops carry)."""

    seq: int
    rows: dict[Hashable, int]
    items: dict[int, Any]


def delta_step(
    message: object,
    request_ids: Sequence[Hashable],
    count: int,
    cursor: DeltaCursor,
    held_ids: list[Hashable] | None,
    held_rows: dict[Hashable, int],
    cached_ids: Callable[[int], list[int] | None],
) -> DeltaStep:
    """The new id lists of the rows ``message`` changes, checked against what the worker holds
    as of the last applied step (``held_ids``, the last step's request ids, ``None`` for none;
    ``held_rows`` their index; ``cached_ids(row)``, the ids a table row holds); nothing changes,
    ``cursor`` included.

    Raises:
        DeltaSequenceError: the message does not build on the last one applied.
        DeltaMessageError: a malformed message or op, ids that repeat, a request new to the
            worker without a whole list, one the worker no longer holds, ops for a request not
            in the batch (the request named).
    """
    if is_packed(message):
        message = unpack(message, request_ids)
    seq, deltas = cursor.check(message)
    if len(request_ids) != count:
        raise DeltaMessageError(
            f"a batch with block deltas needs one request id per row, got "
            f"{len(request_ids)} for {count} rows"
        )
    if message["base"] is None:  # type: ignore[index]
        held_ids, held_rows = None, {}
    items: dict[int, Any] = {}
    index, visit = request_index(request_ids, count, held_ids, held_rows)
    for row in visit:
        request = request_ids[row]
        old = held_rows.get(request)
        if old == row:
            continue
        if old is None:  # new to the worker: the message's whole list (checked below)
            if request not in deltas:
                raise DeltaMessageError(
                    f"request {request!r} is new to the worker, but the message carries "
                    "no block ids for it: send it whole"
                )
            items[row] = None
            continue
        held = cached_ids(old)
        if held is None:
            raise DeltaMessageError(
                f"the worker no longer holds the block ids of request {request!r}: "
                "reset the encoder and send every request whole"
            )
        items[row] = held
    for request, ops in deltas.items():
        where = index.get(request)
        if where is None:
            raise DeltaMessageError(f"request {request!r} has block deltas but is not in the batch")
        held = items[where] if where in items else cached_ids(where)
        try:
            items[where] = apply_ops(ops, held)
        except DeltaMessageError as error:
            raise DeltaMessageError(f"{error} (request {request!r})") from None
    return _new_tuple(DeltaStep, (seq, index, items))  # a NamedTuple's __new__ is a Python frame


def request_index(
    request_ids: Sequence[Hashable],
    count: int,
    held_ids: list[Hashable] | None,
    held_rows: dict[Hashable, int],
) -> tuple[dict[Hashable, int], Iterable[int]]:
    """Each request's row in a delta batch of ``count`` rows, and the rows whose request may not
    be the one the row held (every row when nothing is held: ``held_ids`` ``None``, a fresh
    message); ``held_rows`` is ``held_ids``' index, returned as it is when no row changed.

    A batch with the last one's length is compared row by row (``_engine.differing_rows``) and
    the held index patched where rows differ: rebuilding it hashed every id each step, a
    quarter of a 256-request step that one request joined.

    Raises:
        DeltaMessageError: an id repeats.
    """
    if held_ids is None or len(held_ids) != count:
        index = dict(zip(request_ids, range(count), strict=True))
        if len(index) != count:
            raise DeltaMessageError("request ids repeat within a batch with block deltas")
        return index, range(count)
    listed = request_ids if type(request_ids) is list else list(request_ids)
    visit = differing_rows(listed, held_ids)  # two lists of one length: never None
    assert visit is not None
    if not visit:  # nobody joined, left or moved
        return held_rows, ()
    index = held_rows.copy()
    for row in visit:  # the held ids are distinct: each leaves once
        del index[held_ids[row]]
    for row in visit:  # an id already placed (at a row that kept its id, or here) repeats
        request = request_ids[row]
        if request in index:
            raise DeltaMessageError("request ids repeat within a batch with block deltas")
        index[request] = row
    return index, visit
