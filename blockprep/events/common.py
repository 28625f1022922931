"""What the recorder and the differ share: the id range, the payload's byte order, the words of
their errors."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.wire import is_resync_request

ID_LIMIT = 2**31
"""Block ids are ints in ``[0, ID_LIMIT)`` (they travel as int32)."""

_SWAP = sys.byteorder == "big"
assert array("i").itemsize == 4, "blockprep.events needs a 4-byte C int"


def payload(words: array[int]) -> bytes:
    """``words`` as the message's little-endian payload."""
    if _SWAP:
        words = array("i", words)
        words.byteswap()
    return words.tobytes()


def checked_groups(groups: Sequence[str] | None) -> tuple[str, ...] | None:
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


def place(request: object, group: str | None) -> str:
    return f"request {request!r}" + ("" if group is None else f", group {group!r}")


def bad_id(x: object, where: str, what: str = "block id") -> Exception:
    if type(x) is not int:
        return BlockprepTypeError(f"{where}: {what} {x!r} of type {type(x).__name__} is not an int")
    return BlockprepValueError(f"{where}: {what} {x} is not in [0, {ID_LIMIT})")


def check_resync(request: object) -> None:
    if request is not None and not is_resync_request(request):
        raise BlockprepValueError(
            f"resync expects the worker's resync request (blockprep.wire.resync_request: "
            f"{{'resync': True, 'applied': int or None}}) or None, got {request!r}"
        )
