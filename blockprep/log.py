"""blockprep's logger, ``logging.getLogger("blockprep")``, and the records it writes.

As libraries do, the logger has a :class:`logging.NullHandler` and nothing else: nothing is
printed until the engine configures logging (``logging.basicConfig()``, or a handler on
``"blockprep"``). The records:

- WARNING, a rejected batch: a preparer's public entry point refused its input (every
  ``ValueError``, ``TypeError`` and ``IndexError`` it raises: nothing was written); the message
  names the entry point, the error's type and its text. One record per error, however many
  boundaries it passes.
- WARNING, a resync: a worker refused a block delta message that does not build on the last one
  it applied (:class:`~blockprep.wire.DeltaSequenceError`); the scheduler must reset its encoder.
  This record replaces the rejected-batch one for that error.
- DEBUG, slot claims and releases of the runtime executors' buffer slots.

Imports nothing from blockprep: any module may log.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TypeVar

logger = logging.getLogger("blockprep")
logger.addHandler(logging.NullHandler())

REJECTIONS = (ValueError, TypeError, IndexError)
"""The errors that mean "this input was refused, nothing written" at a public entry point."""

_LOGGED = "_blockprep_logged"
"""The attribute that marks an error already logged (an error crosses nested boundaries)."""

ErrorT = TypeVar("ErrorT", bound=BaseException)


def rejected(where: str, error: BaseException) -> None:
    """Log (WARNING) that the entry point ``where`` rejected its batch with ``error``, unless
    ``error`` was logged already."""
    if _mark(error):
        logger.warning("%s rejected a batch: %s: %s", where, type(error).__name__, error)


def resync(error: ErrorT) -> ErrorT:
    """Log (WARNING) that a worker needs a resync (``error``: the refusal), and return
    ``error`` for the caller to raise; no rejected-batch record follows for it."""
    if _mark(error):
        logger.warning("block delta resync needed: %s", error)
    return error


def slot_claimed(slot: int, owner: str) -> None:
    """Log (DEBUG) that ``owner`` claimed buffer slot ``slot``."""
    logger.debug("%s claimed buffer slot %d", owner, slot)


def slot_released(slot: int, owner: str) -> None:
    """Log (DEBUG) that ``owner`` released buffer slot ``slot``."""
    logger.debug("%s released buffer slot %d", owner, slot)


def _mark(error: BaseException) -> bool:
    """Mark ``error`` as logged; ``False`` when it already was."""
    if getattr(error, _LOGGED, False):
        return False
    with contextlib.suppress(AttributeError):  # no __dict__: logged, unmarked
        setattr(error, _LOGGED, True)
    return True
