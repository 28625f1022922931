"""Packed block-delta messages: one bytes payload of int32 records (issue 17, step 1).

A message is ``{"v": 1, "seq": int, "base": int | None, "count": int, "crc": int,
"data": bytes}``; ``data`` is little-endian int32 records, each ``kind, group, row, n`` then
``n`` values (kind 3, set: ``n`` positions then ``n`` ids; kind 4, truncate: ``n`` is the
length kept and no values follow). ``row`` is the request's index in
``DecodeBatch.request_ids``; ``crc`` is ``zlib.crc32(data)``. :func:`unpack` turns a message
into :mod:`blockprep.wire`'s plain message, so the existing delta path applies it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from blockprep.wire import APPEND, SET, TRUNCATE, WHOLE, DeltaMessageError

KINDS = {1: WHOLE, 2: APPEND, 3: SET, 4: TRUNCATE}
"""Record kind -> wire operation tag."""


def pack(
    seq: int, base: int | None, records: Sequence[tuple[int, int, int, list[int]]]
) -> dict[str, Any]:
    """A packed message of ``(kind, group, row, values)`` records (values as the layout says)."""
    out: list[int] = []
    for kind, group, row, values in records:
        n = values[0] if kind == 4 else (len(values) // 2 if kind == 3 else len(values))
        out += [kind, group, row, n] + ([] if kind == 4 else list(values))
    data = np.asarray(out, dtype="<i4").tobytes()
    return {
        "v": 1,
        "seq": seq,
        "base": base,
        "count": len(records),
        "crc": zlib.crc32(data),
        "data": data,
    }


def unpack(message: object, request_ids: Sequence[Any], grouped: bool = False) -> dict[str, Any]:
    """The :mod:`blockprep.wire` message a packed one stands for.

    Raises:
        DeltaMessageError: a wrong version, checksum, count, kind, row or a truncated record.
    """
    if not isinstance(message, dict) or message.get("v") != 1:
        raise DeltaMessageError("a packed block delta message needs v == 1")
    data = message.get("data")
    if type(data) is not bytes or len(data) % 4:
        raise DeltaMessageError("packed data must be bytes of whole int32 records")
    if message.get("crc") != zlib.crc32(data):
        raise DeltaMessageError("packed data fails its checksum")
    words = np.frombuffer(data, dtype="<i4")
    rows: dict[Any, Any] = {}
    i, count = 0, 0
    while i < len(words):
        if i + 4 > len(words):
            raise DeltaMessageError(f"record {count} is truncated")
        kind, group, row, n = (int(x) for x in words[i : i + 4])
        width = 0 if kind == 4 else (2 * n if kind == 3 else n)
        if kind not in KINDS or n < 0 or group < 0 or (group and not grouped):
            raise DeltaMessageError(f"record {count}: kind {kind}, group {group}, n {n} not valid")
        if not 0 <= row < len(request_ids) or i + 4 + width > len(words):
            raise DeltaMessageError(f"record {count}: row {row} unknown or record truncated")
        values = words[i + 4 : i + 4 + width].tolist()
        op: list[Any] = (
            [KINDS[kind], n]
            if kind == 4
            else ([SET, values[:n], values[n:]] if kind == 3 else [KINDS[kind], values])
        )
        entry = rows.setdefault(request_ids[row], {} if grouped else [])
        (entry.setdefault(group, []) if grouped else entry).append(op)
        i, count = i + 4 + width, count + 1
    if count != message.get("count"):
        raise DeltaMessageError(
            f"packed message says {message.get('count')} records, holds {count}"
        )
    return {"seq": message.get("seq"), "base": message.get("base"), "rows": rows}
