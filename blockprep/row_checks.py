"""The id rule of a table face, and the builders' error for a row its kernel refused.

:class:`~blockprep.block_table.BlockTable` hands rows to its kernel as they come; only when the
kernel refuses one (a fault) does it ask here for the error :func:`blockprep.paged_block_table`
or :func:`blockprep.ring_block_table` would raise, so the words and their order (length, then
types, then negative ids, then ids above int32) stay the builders'.
"""

from __future__ import annotations

import operator
from typing import Any, NoReturn

from blockprep.ids import Kind, id_list, is_integer_id, row_values


def convert(x: object) -> int | None:
    """A changed id that is not a plain int: an integer converted, anything else ``None``."""
    return operator.index(x) if is_integer_id(x) else None  # type: ignore[arg-type]


def raise_row(
    row: int, ids: object, held: list[int] | None, max_blocks: int, kind: Kind
) -> NoReturn:
    """The builders' error for row ``row``'s ``ids`` under the id rule (an id equal by value to
    the ``held`` id at its position is that held int); only for ids a kernel refused, so it
    always raises."""
    key = id_list(ids)
    if key is not None and held:
        ids = as_held(key, held)
    row_values(row, ids, max_blocks, kind)
    raise AssertionError(f"block-table row {row}: the kernel refused ids the checks take")


def as_held(key: list[Any], held: list[int]) -> list[Any]:
    """``key`` with each non-int scalar that equals the held id at its position by value
    replaced by that held int (``[1.0, 2, 5.0]`` over ``[1, 2, 3]``: ``[1, 2, 5.0]``)."""
    result = list(key)
    for i, (x, old) in enumerate(zip(key, held, strict=False)):
        if type(x) is int or getattr(x, "ndim", 0) != 0 or isinstance(x, (list, tuple)):
            continue
        try:
            if bool(x == old):
                result[i] = old
        except (TypeError, ValueError, RuntimeError):
            continue
    return result
