"""Packed block-delta messages: one bytes payload of int32 records.

A message is a plain dict, so pickle, msgpack and msgspec carry it unchanged::

    {"v": 1,               # VERSION
     "seq": 7,             # this message's number (as blockprep.wire's messages)
     "base": 6,            # the message it builds on; None: every request whole
     "count": 3,           # how many records data holds
     "crc": 123456789,     # checksum(seq, base, count, data)
     "data": b"..."}       # little-endian int32 records, back to back

A record is four int32 words ``kind, group, row, n`` then its values:

==========  ====  =======================  ==================================================
kind        code  values                   meaning
==========  ====  =======================  ==================================================
whole       1     ``n`` ids                the row's ids are these (a new request: first)
append      2     ``n`` ids                these ids appended
set         3     ``n`` positions, ``n``   ``ids[i]`` at ``positions[i]`` (a ring slot)
                  ids
truncate    4     none                     the first ``n`` ids kept
==========  ====  =======================  ==================================================

``row`` is the request's index in ``DecodeBatch.request_ids``; ``group`` the cache group's index
(in the preparer's group order; ``0`` in a flat, one-list-per-request message). A row's records
apply in message order to what its request held as of ``base``, exactly as the same
:mod:`blockprep.wire` operations (:func:`unpack` gives them), with the same resync rules.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from blockprep.wire import APPEND, SET, TRUNCATE, WHOLE, DeltaMessageError, refuse_numbers

VERSION = 1
"""The format's version, the message's ``"v"``."""

WHOLE_RECORD, APPEND_RECORD, SET_RECORD, TRUNCATE_RECORD = 1, 2, 3, 4
"""The record kinds."""

HEADER_WORDS = 4
"""A record's header: kind, group, row, n."""

_TAGS = {WHOLE_RECORD: WHOLE, APPEND_RECORD: APPEND, SET_RECORD: SET, TRUNCATE_RECORD: TRUNCATE}
_INT32 = (-(2**31), 2**31 - 1)


def _width(kind: int, n: int) -> int:
    """How many value words follow a record's header (``n`` positions and ``n`` ids for a set)."""
    return 0 if kind == TRUNCATE_RECORD else 2 * n if kind == SET_RECORD else n


def checksum(seq: int, base: int | None, count: int, data: bytes) -> int:
    """The message's ``crc``: CRC-32 of the header fields, then of ``data`` (a bit flip in
    ``seq``, ``base`` or ``count`` fails it as one in the payload does)."""
    return zlib.crc32(data, zlib.crc32(f"{VERSION} {seq} {base} {count}".encode()))


def message(seq: int, base: int | None, count: int, data: bytes) -> dict[str, Any]:
    """The message of ``count`` records already packed into ``data`` (no record checked)."""
    return {
        "v": VERSION,
        "seq": seq,
        "base": base,
        "count": count,
        "crc": checksum(seq, base, count, data),
        "data": data,
    }


def is_packed(message: object) -> bool:
    """Whether ``message`` is a packed message (a dict with ``"v"``) rather than a
    :mod:`blockprep.wire` one."""
    return isinstance(message, dict) and "v" in message


def values_of(kind: int, values: Sequence[int]) -> int:
    """A record's ``n`` for ``values`` (a truncate's ``values`` is ``[length]``)."""
    if kind == TRUNCATE_RECORD:
        return values[0] if len(values) == 1 else -1
    if kind == SET_RECORD:
        return len(values) // 2 if len(values) % 2 == 0 else -1
    return len(values)


def pack(
    seq: int, base: int | None, records: Sequence[tuple[int, int, int, Sequence[int]]]
) -> dict[str, Any]:
    """The message of ``(kind, group, row, values)`` records (a set's values: positions, then
    ids; a truncate's: ``[length]``).

    Raises:
        DeltaMessageError: an unknown kind, a negative group, row or length, a set whose values
            are not positions and ids in equal numbers, a value outside int32 (record named).
    """
    words: list[int] = []
    for index, (kind, group, row, values) in enumerate(records):
        n = values_of(kind, values) if kind in _TAGS else -1
        if n < 0 or type(group) is not int or group < 0 or type(row) is not int or row < 0:
            raise DeltaMessageError(
                f"record {index}: kind {kind!r}, group {group!r}, row {row!r} with "
                f"{len(values)} values is no packed record"
            )
        body = [] if kind == TRUNCATE_RECORD else list(values)
        for x in body:
            if type(x) is not int or not _INT32[0] <= x <= _INT32[1]:
                raise DeltaMessageError(f"record {index}: value {x!r} is not an int32")
        words += [kind, group, row, n, *body]
    return message(seq, base, len(records), np.asarray(words, dtype="<i4").tobytes())


class Record(NamedTuple):
    """One record of a checked message: its ``kind``, ``group``, ``row``, ``n`` and the word
    offset of its header in the payload."""

    kind: int
    group: int
    row: int
    n: int
    offset: int


def header(message: object) -> tuple[int, int | None, int, bytes]:
    """``(seq, base, count, data)`` of a packed message whose version, header types and
    checksum are right.

    Raises:
        DeltaMessageError: any of those wrong.
    """
    if not is_packed(message):
        raise DeltaMessageError("a packed block delta message must be a dict with a version 'v'")
    assert isinstance(message, dict)
    if message["v"] != VERSION:
        raise DeltaMessageError(
            f"packed block delta message version {message['v']!r}; this worker reads {VERSION}"
        )
    data, count = message.get("data"), message.get("count")
    seq, base = message.get("seq"), message.get("base")
    if type(seq) is not int or not (base is None or type(base) is int):
        refuse_numbers(seq, base)
    if type(data) is not bytes or len(data) % 4:
        raise DeltaMessageError("packed data must be bytes of whole int32 words")
    if type(count) is not int or message.get("crc") != checksum(seq, base, count, data):
        raise DeltaMessageError(f"packed block delta message {seq!r} fails its checksum")
    return seq, base, count, data


def records(message: object, rows: int, groups: int = 1) -> tuple[np.ndarray, list[Record]]:
    """The payload of a packed message as int32 words, and its records, every header checked:
    :func:`header`, then record bounds, kinds, lengths, ``group < groups`` and ``row < rows``
    (the batch's size). The values are not checked (the tables do that).

    Raises:
        DeltaMessageError: any of those wrong (the record and the value named).
    """
    seq, _, count, data = header(message)
    words = np.frombuffer(data, dtype="<i4")
    found: list[Record] = []
    for fault, record in _walk(data, rows, groups):
        if fault:
            raise DeltaMessageError(f"packed record {len(found)}{fault}")
        found.append(record)
    if len(found) != count:
        raise DeltaMessageError(
            f"packed block delta message {seq!r} says {count} records, holds {len(found)}"
        )
    return words, found


def _walk(data: bytes, rows: int, groups: int) -> Iterator[tuple[str, Record]]:
    """Each record of ``data`` in order, with ``""``, or the fault that ends the walk."""
    view = memoryview(data).cast("i") if np.little_endian else np.frombuffer(data, dtype="<i4")
    i, size = 0, len(view)
    none = Record(0, 0, 0, 0, 0)
    while i < size:
        if i + HEADER_WORDS > size:
            yield " is truncated: its header is cut", none
            return
        kind, group, row, n = view[i], view[i + 1], view[i + 2], view[i + 3]
        width = _width(kind, n)
        if kind not in _TAGS:
            yield f": unknown kind {kind}", none
        elif n < 0:
            yield f": negative length {n}", none
        elif not 0 <= group < groups:
            yield f": group {group} not in [0, {groups})", none
        elif not 0 <= row < rows:
            yield f": row {row} not in the batch's {rows} requests", none
        elif i + HEADER_WORDS + width > size:
            yield f" is truncated: it needs {HEADER_WORDS + width} words, {size - i} left", none
        else:
            yield "", Record(int(kind), int(group), int(row), int(n), i)
            i += HEADER_WORDS + width
            continue
        return


def index_records(
    data: bytes, count: int, rows: list[int], groups: int
) -> list[dict[int, tuple[int, ...]]] | None:
    """Per group, ``{table row: word offsets of its records, in message order}`` of a payload
    whose header :func:`header` checked; ``rows[i]`` is the table row of the batch's request
    ``i``. ``None`` when a record is malformed or ``count`` is wrong (:func:`records` words
    it). The twin of the compiled kernel's ``index_records`` (same results and errors).

    Raises:
        TypeError: ``data`` not bytes of whole words, ``rows`` not a list, a record's
            ``rows[row]`` not an int in ``[0, 2**31)``.
        ValueError: ``groups`` outside ``[1, 65536]``.
    """
    if type(data) is not bytes or len(data) % 4:
        raise TypeError("data must be bytes of whole int32 words")
    count = operator.index(count)  # any int: one past the payload's room is a miscount
    if type(rows) is not list:
        raise TypeError("rows must be a list of table rows")
    groups = operator.index(groups)
    if not 1 <= groups <= 1 << 16:
        raise ValueError(f"groups must be in [1, {1 << 16}], got {groups}")
    out: list[dict[int, Any]] = [{} for _ in range(groups)]
    found = 0
    for fault, record in _walk(data, len(rows), groups):
        if fault:
            return None
        table_row = rows[record.row]
        if type(table_row) is not int or not 0 <= table_row <= _INT32[1]:
            raise TypeError(
                f"rows[{record.row}] must be a table row (an int >= 0), got {table_row!r}"
            )
        out[record.group].setdefault(table_row, []).append(record.offset)
        found += 1
    if found != count:
        return None
    return [{row: tuple(offsets) for row, offsets in sorted(d.items())} for d in out]


def record_op(words: Any, record: Record) -> list[Any]:
    """The :mod:`blockprep.wire` operation a checked record stands for (``words``: the payload
    as int32 words, an array or a memoryview)."""
    at, n = record.offset + HEADER_WORDS, record.n
    if record.kind == TRUNCATE_RECORD:
        return [TRUNCATE, n]
    if record.kind == SET_RECORD:
        return [SET, words[at : at + n].tolist(), words[at + n : at + 2 * n].tolist()]
    return [_TAGS[record.kind], words[at : at + n].tolist()]


def unpack(
    message: object, request_ids: Sequence[Any], groups: Sequence[str] | None = None
) -> dict[str, Any]:
    """The :mod:`blockprep.wire` message a packed one stands for: ``rows`` keyed by request
    id, each a list of ops (flat, ``groups`` ``None``) or ``{group name: ops}``.

    Raises:
        DeltaMessageError: as :func:`records`.
    """
    words, found = records(message, len(request_ids), 1 if groups is None else len(groups))
    assert isinstance(message, dict)
    rows: dict[Any, Any] = {}
    for record in found:
        request = request_ids[record.row]
        if groups is None:
            rows.setdefault(request, []).append(record_op(words, record))
        else:
            entry = rows.setdefault(request, {})
            entry.setdefault(groups[record.group], []).append(record_op(words, record))
    return {"seq": message["seq"], "base": message["base"], "rows": rows}


def op_at(data: bytes, offset: object, row: int) -> list[Any]:
    """The :mod:`blockprep.wire` operation of the record at word ``offset`` of ``data`` (what a
    table kernel reads in place: the twin's form of the compiled kernel's reader).

    Raises:
        ValueError: no whole record there (``row`` named: the caller's bug, not the message's).
    """
    words: Any = memoryview(data).cast("i") if np.little_endian else np.frombuffer(data, "<i4")
    at = offset if type(offset) is int else -1
    kind = count = -1
    if 0 <= at <= len(words) - HEADER_WORDS:
        kind, count = int(words[at]), int(words[at + 3])
    width = _width(kind, count)
    if kind not in _TAGS or count < 0 or at + HEADER_WORDS + width > len(words):
        raise ValueError(f"row {row}: no packed record at word {offset!r}")
    return record_op(words, Record(kind, int(words[at + 1]), int(words[at + 2]), count, at))
