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

from blockprep.events.common import ID_LIMIT
from blockprep.events.encoder import PackedDeltaEncoder
from blockprep.events.recorder import BlockEventRecorder

__all__ = ["ID_LIMIT", "BlockEventRecorder", "PackedDeltaEncoder"]
