"""The base of every error blockprep raises on bad input.

Each error stays the built-in type it always was (``except ValueError`` keeps working) and also
derives from :class:`BlockprepError`, so an engine can tell blockprep's refusals (nothing was
written) from its own bugs with one ``except BlockprepError``::

    BlockprepError(Exception)
    ├── BlockprepTypeError(BlockprepError, TypeError)
    ├── BlockprepValueError(BlockprepError, ValueError)
    ├── BlockprepIndexError(BlockprepError, IndexError)
    └── BlockprepRuntimeError(BlockprepError, RuntimeError)

The named errors (``UnknownRowError``, ``StaleRowError``, ``BlockIdTypeError`` and
``BlockIdValueError`` here, and those of the other modules: ``DeltaSequenceError``,
``SlotBusyError``, ...) derive from one of the four. This module imports nothing from blockprep.
"""

from __future__ import annotations


class BlockprepError(Exception):
    """An input blockprep refused; the call wrote nothing."""


class BlockprepTypeError(BlockprepError, TypeError):
    """An argument of the wrong type."""


class BlockprepValueError(BlockprepError, ValueError):
    """An argument of the right type with a wrong value."""


class BlockprepIndexError(BlockprepError, IndexError):
    """A row, slot or position outside its range."""


class BlockprepRuntimeError(BlockprepError, RuntimeError):
    """A call at the wrong point of a life cycle (a busy slot, a stale row, a reentrant call)."""


class UnknownRowError(BlockprepValueError):
    """A delta (:meth:`BlockTable.append`, :meth:`~BlockTable.set_ids`,
    :meth:`~BlockTable.truncate`, :meth:`~BlockTable.apply_deltas`) named a row whose ids the
    table does not know: never written by it, or invalidated. Write the row whole first."""


class StaleRowError(BlockprepRuntimeError):
    """:meth:`BlockTable.check` found a row whose buffer content differs from its cached ids."""


class BlockIdTypeError(BlockprepTypeError):
    """A changed id that is not an integer, or a row container of a non-integer dtype.
    ``row`` is the table row, ``group`` the group name, ``value`` the offending id or row."""

    def __init__(self, message: str, row: int, group: str, value: object) -> None:
        super().__init__(message)
        self.row, self.group, self.value = row, group, value


class BlockIdValueError(BlockprepValueError):
    """A changed id out of range or repeated within its row, or a row of a bad length.
    ``row``, ``group`` and ``value`` as for :class:`BlockIdTypeError` (``value`` is ``None`` for a
    bad length)."""

    def __init__(self, message: str, row: int, group: str, value: object) -> None:
        super().__init__(message)
        self.row, self.group, self.value = row, group, value
