"""Block-list deltas on the wire: what changed since the worker's last step, as plain data.

A scheduler that ships every request's whole block lists every step makes the worker's cost
follow the size of the tables. :class:`BlockDeltaEncoder` (scheduler side) sends only what
changed since the last message; the preparers (worker side) apply the message to what their
tables hold, at a cost that follows the change. A message is built from ints, strings, lists and
dicts only, so pickle and msgpack carry it as it is::

    {"seq": 7,              # this message's number
     "base": 6,             # the message it builds on; None: it builds on nothing
     "rows": {request_id: ops}}                # one id list per request (DecodeBatch.block_ids)
     "rows": {request_id: {group: ops}}        # grouped (DecodeBatch.block_ids_by_group)

``ops`` is a list of operations applied in order to the request's ids as of the base message:

- ``["w", ids]``: the whole list (a new request, or whenever simpler);
- ``["a", ids]``: ``ids`` appended;
- ``["s", positions, ids]``: ``ids[i]`` at ``positions[i]`` (a ring row: ring slot ``p``);
- ``["t", length]``: the first ``length`` ids kept.

A request of the batch without an entry (or a group without one) holds what it held. A request
that was not in the base message's batch is new to the worker: each of its groups starts with
``"w"``. A message with ``base`` ``None`` carries every request whole.

Resync: the worker remembers the number of the last message it applied (:class:`DeltaCursor`).
A message whose ``base`` is not that number, or whose ``seq`` is not after its ``base`` (a
redelivery would be applied twice; ``seq == base`` with no rows, "nothing changed", is the one
exception), raises :class:`DeltaSequenceError` and writes nothing; so
does any rejected step, which counts as not applied. The worker sends back
:func:`resync_request` (plain data, through whatever channel carries replies); the engine calls
:meth:`BlockDeltaEncoder.reset` (the packed encoders: ``resync``), and the next message is whole
for every request. :mod:`blockprep.packed` messages follow the same rules.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import compress
from typing import Any, NoReturn

import numpy as np
import torch

from blockprep import _backend, log
from blockprep._ids import INT64_MAX, INT64_MIN, has_integer_dtype, is_integer_id
from blockprep.errors import BlockprepTypeError, BlockprepValueError

WHOLE, APPEND, SET, TRUNCATE = "w", "a", "s", "t"
"""The operation tags."""

Ops = list[list[Any]]
"""One request's (and group's) operations, in order."""


class DeltaSequenceError(BlockprepValueError):
    """A message that does not build on the last one the worker applied, or whose ``seq`` is
    not after its ``base``: nothing was written. Reset the encoder; its next message is whole.
    ``expected``: the worker's last applied number (``None``: none), ``base``: what the message
    builds on."""

    def __init__(self, expected: int | None, base: int | None, seq: object) -> None:
        if base is not None and type(seq) is int and seq <= base:  # seq == base: with rows
            text = (
                f"block delta message {seq} builds on message {base}, but a message's seq must "
                f"be after its base: reset the encoder and send every request whole"
            )
        else:
            text = (
                f"block delta message {seq} builds on message {base}, but the worker last "
                f"applied {expected}: reset the encoder and send every request whole"
            )
        super().__init__(text)
        self.expected = expected
        self.base = base


class DeltaMessageError(BlockprepValueError):
    """A malformed message, or an operation that does not fit the ids it applies to (the
    request, and group, named): nothing was written."""


class BlockDeltaEncoder:
    """Scheduler side: turns each step's block lists into a message carrying what changed.

    ``encode(request_ids, block_lists)`` takes the step's batch order and, per request, its id
    list (Qwen: ``DecodeBatch.block_ids``) or ``{group: ids}`` (DeepSeek:
    ``block_ids_by_group``); the caller may mutate its lists afterwards (the encoder keeps
    copies). Assumes every message is applied: after the worker rejects one, call :meth:`reset`.
    """

    def __init__(self) -> None:
        self._next = 0
        self._base: int | None = None
        self._held: dict[Hashable, Any] = {}

    def reset(self) -> None:
        """Forget what the worker holds: the next message carries every request whole."""
        self._base = None
        self._held = {}

    def encode(
        self,
        request_ids: Sequence[Hashable],
        block_lists: Sequence[Sequence[int] | Mapping[str, Sequence[int]]],
    ) -> dict[str, Any]:
        """The message for this step (see the module docstring for the schema).

        Raises (nothing is remembered from a refused step):
            ValueError: ``request_ids`` and ``block_lists`` of different lengths, a request id
                repeated, a grouped request whose groups differ from its last message's, a
                request that switched between a flat list and grouped lists (send it under a
                new id, or :meth:`reset`).
            TypeError: ``request_ids`` or ``block_lists`` not a list, tuple or 1-D array; an id
                that is not an integer (a bool or a float included).
        """
        check_batch(request_ids, block_lists)
        if _backend.diff_lists is not None:  # compiled; None: a step it does not take
            first = block_lists[0] if len(block_lists) else None
            names = tuple(first) if type(first) is dict else None
            done = _backend.diff_lists(self._held, request_ids, block_lists, names, True)
            if done is not None:
                self._held = done[2]
                return self._sent(done[0])
        held = self._held
        rows: dict[Hashable, Any] = {}
        new_held: dict[Hashable, Any] = {}
        for request, lists in zip(request_ids, block_lists, strict=True):
            old = held.get(request)
            if (
                old is not None
                and type(lists) is type(old)
                and _plain_lists(lists)
                and same_ids(lists, old)
            ):
                new_held[request] = old  # nothing changed: one comparison, at C speed
                continue
            if old is not None and isinstance(old, dict) != isinstance(lists, Mapping):
                was, now = ("grouped", "flat") if isinstance(old, dict) else ("flat", "grouped")
                raise BlockprepValueError(
                    f"request {request!r} carries {now} block lists, but its last message "
                    f"carried {was} ones (send it under a new request id, or reset the encoder)"
                )
            if isinstance(lists, Mapping):
                if old is not None and old.keys() != lists.keys():
                    raise BlockprepValueError(
                        f"request {request!r} carries groups {sorted(lists)}, but it carried "
                        f"{sorted(old)} (a grouped request sends every group every step)"
                    )
                entry: dict[str, Ops] = {}
                copies: dict[str, list[int]] = {}
                for group, ids in lists.items():
                    before = None if old is None else old.get(group)
                    if before is not None and type(ids) is list and same_ids(ids, before):
                        copies[group] = before  # the encoder's own copy, unchanged
                        continue
                    copies[group] = current = _id_copy(ids)
                    ops = _diff(before, current)
                    if ops:
                        entry[str(group)] = ops
                new_held[request] = copies
                if entry:
                    rows[request] = entry
            else:
                current = _id_copy(lists)
                new_held[request] = current
                ops = _diff(old, current)
                if ops:
                    rows[request] = ops
        self._held = new_held
        return self._sent(rows)

    def _sent(self, rows: dict[Hashable, Any]) -> dict[str, Any]:
        """The message of ``rows``, and the numbers moved on."""
        message = {"seq": self._next, "base": self._base, "rows": rows}
        self._base = self._next
        self._next += 1
        return message


def check_batch(request_ids: object, block_lists: object) -> None:
    """An encoder's arguments: sequences (:func:`_check_sequence`) of equal lengths, the request
    ids unique (``ValueError`` / ``TypeError`` otherwise)."""
    _check_sequence(request_ids, "request_ids")
    _check_sequence(block_lists, "block_lists")
    assert isinstance(request_ids, Sequence | np.ndarray | torch.Tensor)
    assert isinstance(block_lists, Sequence | np.ndarray | torch.Tensor)
    if len(request_ids) != len(block_lists):
        raise BlockprepValueError(
            f"{len(request_ids)} request ids for {len(block_lists)} block lists"
        )
    try:
        unique = len(set(request_ids)) == len(request_ids)
    except Exception as error:  # a request id that cannot be hashed or compared
        raise BlockprepTypeError(
            f"request ids must hash and compare, got one that raised {type(error).__name__}: "
            f"{error}"
        ) from error
    if not unique:
        raise BlockprepValueError("request ids must be unique within a batch")


def _diff(old: list[int] | None, new: list[Any]) -> Ops:
    """:func:`diff_ops`; where comparing an id raises, the ids' check (:func:`_plain`) says
    which id is no integer."""
    try:
        return diff_ops(old, new)
    except Exception:
        _plain(new)
        raise


def same_ids(new: object, held: object) -> bool:
    """Whether ``new == held`` (an encoder's own copy); an id whose comparison raises is not the
    held id (the table kernel's rule), and the encoder's id check then refuses it."""
    try:
        return bool(new == held)
    except Exception:
        return False


def _plain_lists(lists: object) -> bool:
    """Whether ``lists`` is a list, or a dict of lists (so ``==`` is a plain comparison)."""
    return type(lists) is list or (
        type(lists) is dict and all(type(ids) is list for ids in lists.values())
    )


def _check_sequence(value: object, what: str) -> None:
    """``TypeError`` unless ``value`` is a list, a tuple or a 1-D array (not a str)."""
    if isinstance(value, (list, tuple)) or (
        isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim == 1
    ):
        return
    raise BlockprepTypeError(
        f"BlockDeltaEncoder.encode: {what} must be a list, tuple or 1-D array, got "
        f"{type(value).__name__}"
    )


def diff_ops(
    old: list[Any] | None,
    new: list[Any],
    values: Callable[[list[Any]], list[int]] = lambda ids: _plain(ids),
) -> Ops:
    """The fewest-ids operations taking ``old`` to ``new`` (``[]``: no change); the ids an
    operation carries go through ``values`` (a new list each time: it checks them and may return
    it as it is). The encoders' one choice rule (:class:`BlockDeltaEncoder`, the packed differ)."""
    if old is None:
        return [[WHOLE, values(list(new))]]
    n, m = len(new), len(old)
    if n == m:
        positions = list(compress(range(n), map(operator.ne, new, old)))
        if not positions:
            return []
        if 2 * len(positions) <= n:
            return [[SET, positions, values([new[p] for p in positions])]]
        return [[WHOLE, values(list(new))]]
    if n > m and new[:m] == old:
        return [[APPEND, values(new[m:])]]
    if n < m and old[:n] == new:
        return [[TRUNCATE, n]]
    prefix = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        prefix += 1
    if 2 * prefix >= n:
        return [[TRUNCATE, prefix], [APPEND, values(new[prefix:])]]
    return [[WHOLE, values(list(new))]]


def _id_copy(ids: object) -> list[Any]:
    """A list copy of one request's ids: a list or tuple, or a 1-D integer array or tensor."""
    if isinstance(ids, (list, tuple)):
        return list(ids)
    if isinstance(ids, (np.ndarray, torch.Tensor)) and ids.ndim == 1 and has_integer_dtype(ids):
        values: list[Any] = ids.tolist()
        return values
    raise BlockprepTypeError(
        f"block IDs must be a list, tuple or 1-D integer array, got {type(ids).__name__}"
        + (f" of dtype {ids.dtype}" if isinstance(ids, (np.ndarray, torch.Tensor)) else "")
    )


def _plain(ids: Sequence[Any]) -> list[int]:
    """``ids`` as plain ints (NumPy integers converted), for msgpack; ``TypeError`` for
    anything else (bools and floats included), ``ValueError`` for an id outside int64."""
    if not all(type(x) is int for x in ids):
        for x in ids:
            if not is_integer_id(x):
                raise BlockprepTypeError(
                    f"block IDs must be integers, got {x!r} of type {type(x).__name__}"
                )
        ids = list(map(operator.index, ids))
    if ids and (min(ids) < INT64_MIN or max(ids) > INT64_MAX):
        x = next(x for x in ids if not INT64_MIN <= x <= INT64_MAX)
        raise BlockprepValueError(f"block IDs must fit int64, got {x}")
    return list(ids)


class DeltaCursor:
    """Worker side: the number of the last message applied, and the header checks."""

    def __init__(self) -> None:
        self.last: int | None = None

    def check(self, message: object) -> tuple[int, Mapping[Any, Any]]:
        """``(seq, rows)`` of a message that builds on the last one applied.

        Raises:
            DeltaMessageError: not a mapping with an int ``seq``, an int-or-``None`` ``base`` and
                a mapping ``rows``.
            DeltaSequenceError: ``base`` is not ``None`` and not the last number applied, or
                ``seq`` is not after ``base`` (``seq == base`` only with no rows: the message
                saying nothing changed, as ``speculative_batch`` makes, which is idempotent).
        """
        if type(message) is not dict and not isinstance(message, Mapping):  # dict: no ABC check
            raise DeltaMessageError(
                f"a block delta message must be a dict, got {type(message).__name__}"
            )
        seq, base, rows = message.get("seq"), message.get("base"), message.get("rows")
        if type(seq) is not int or not (base is None or type(base) is int):
            refuse_numbers(seq, base)
        if type(rows) is not dict and not isinstance(rows, Mapping):
            raise DeltaMessageError(
                f"a block delta message needs a dict of rows, got {type(rows).__name__}"
            )
        if base is not None and (base != self.last or seq < base or (seq == base and rows)):
            self.check_sequence(seq, base, bool(rows))  # raises (the common case: no call)
        return seq, rows

    def check_sequence(self, seq: int, base: int | None, changes: bool) -> None:
        """:class:`DeltaSequenceError` unless message ``seq`` (carrying ``changes`` or not)
        builds on the last one applied, as :meth:`check` says (a packed message's header);
        :class:`DeltaMessageError` for a ``seq`` that is no int or a ``base`` no int or ``None``
        (a bool or a float refused), as :meth:`check`'s."""
        if type(seq) is not int or not (base is None or type(base) is int):
            refuse_numbers(seq, base)
        if base is not None and (base != self.last or seq < base or (seq == base and changes)):
            raise log.resync(DeltaSequenceError(self.last, base, seq))  # a WARNING record

    def resync_request(self) -> dict[str, Any]:
        """What the worker sends back after a refused message: :func:`resync_request` of the
        last message it applied."""
        return resync_request(self.last)


def refuse_numbers(seq: object, base: object) -> NoReturn:
    """The refusal of a message whose ``seq`` is no int or ``base`` no int or ``None``."""
    raise DeltaMessageError(
        f"a block delta message needs an int seq and an int or None base, got seq {seq!r}, "
        f"base {base!r}"
    )


def resync_request(applied: int | None) -> dict[str, Any]:
    """Worker side of the resync back channel: the plain dict a worker sends its scheduler after
    refusing a message, ``{"resync": True, "applied": applied}`` (``applied``: the ``seq`` of
    the last message it applied, ``None`` for none). The scheduler passes it to its encoder's
    or recorder's ``resync``; the next message carries every request whole.

    Raises:
        TypeError: ``applied`` not an int (a bool refused) or ``None``.
    """
    if applied is not None and type(applied) is not int:
        raise BlockprepTypeError(
            f"applied must be the seq of the last message applied (an int) or None, got {applied!r}"
        )
    return {"resync": True, "applied": applied}


def is_resync_request(obj: object) -> bool:
    """Whether ``obj`` is a :func:`resync_request` (exactly its two keys and types)."""
    return (
        type(obj) is dict
        and obj.keys() == {"resync", "applied"}
        and obj["resync"] is True
        and (obj["applied"] is None or type(obj["applied"]) is int)
    )


def apply_ops(ops: object, held: list[Any] | None) -> list[Any]:
    """The id list ``ops`` make of ``held`` (``None``: the request is new), as a new list; the
    ids themselves are not checked (the table does that).

    Raises:
        DeltaMessageError: ops that are not a non-empty list of operations, a new request that
            does not start whole, a position or length that is not an int within the list (the
            caller adds the place).
    """
    if not isinstance(ops, list) or not ops:
        raise DeltaMessageError("block delta ops must be a non-empty list")
    ids = held
    for op in ops:
        tag = op[0] if isinstance(op, list) and op else None
        if type(tag) is not str:  # read without a callback (tag_of)
            tag = _tag(tag)
        if ids is None and tag != WHOLE:
            raise DeltaMessageError("a request new to the worker must come with its whole list")
        if tag == WHOLE and len(op) == 2:
            ids = _id_list(op[1])[:]  # a new list: the caller's may change while it is read
        elif ids is not None and tag == APPEND and len(op) == 2:
            ids = ids + _id_list(op[1])
        elif ids is not None and tag == SET and len(op) == 3:
            ids = set_positions(ids, op[1], op[2])
        elif ids is not None and tag == TRUNCATE and len(op) == 2:
            ids = ids[: truncated_length(op[1], len(ids))]
        else:
            raise DeltaMessageError(f"unknown block delta operation {op!r}")
    assert ids is not None
    return ids


def tag_of(op: object) -> str | None:
    """The operation a list ``op`` names: its first item, a ``str`` (a subclass compared by
    value) equal to one of the tags; ``None`` for anything else (no ``__eq__`` of the caller's
    runs, so a tag that is no str is an unknown operation, never the tag's own error)."""
    if not isinstance(op, list) or not op:
        return None
    return _tag(op[0])


def _tag(tag: object) -> str | None:
    if type(tag) is str:
        return tag if tag in _TAGS else None
    if isinstance(tag, str):
        return next((name for name in _TAGS if str.__eq__(tag, name)), None)
    return None


_TAGS = (WHOLE, APPEND, SET, TRUNCATE)


def set_positions(ids: list[Any], positions: object, values: object) -> list[Any]:
    """A copy of ``ids`` with ``values[i]`` at ``positions[i]``; positions unique ints within
    ``ids`` (:class:`DeltaMessageError` otherwise)."""
    if type(positions) is not list or type(values) is not list:
        raise DeltaMessageError("set positions and ids must be lists")
    if len(positions) != len(values):
        raise DeltaMessageError(f"{len(positions)} positions for {len(values)} ids")
    n = len(ids)
    out = ids[:]
    for p, x in zip(positions, values, strict=True):
        if type(p) is not int or not 0 <= p < n:
            raise DeltaMessageError(f"position {p!r} is not an int in [0, {n})")
        out[p] = x
    if len(positions) > 1 and len(set(positions)) != len(positions):
        raise DeltaMessageError(f"positions {positions} repeat")
    return out


def truncated_length(length: object, n: int) -> int:
    """``length`` as the length a list of ``n`` ids is truncated to: an int in ``[0, n]``."""
    if type(length) is not int or not 0 <= length <= n:
        raise DeltaMessageError(f"truncate length {length!r} is not an int in [0, {n}]")
    return length


def _id_list(ids: object) -> list[Any]:
    if type(ids) is not list:
        raise DeltaMessageError(f"block delta ids must be a list, got {type(ids).__name__}")
    return ids
