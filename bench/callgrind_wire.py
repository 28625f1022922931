"""Instructions per DeepSeek V4 step on the bench's wire trace, for callgrind: the worker's
prepare fed ``blockprep.wire`` deltas (``wire``) or packed records from the event recorder
(``packed``), or the scheduler's ``BlockDeltaEncoder.encode`` of the lists copied with ``list()``
per group, as upstream's engine copies them (``encoder``; ``differ``: the packed differ's
``PackedDeltaEncoder.encode`` of the same lists), or the event recorder: the
simulation's events of each step replayed into it, then ``message()`` (``recorder``).

Usage (from a directory that holds no ``blockprep``; ``python`` the interpreter itself)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no \\
        --toggle-collect=functools_reduce --callgrind-out-file=out python \\
        bench/callgrind_wire.py MODE 100

and take the total / 100. The trace (``deepseek_wire_sim``, 8 ranks x 8 requests, after its
warm-up) is made and unpickled first; only the steps inside one ``functools.reduce`` call are
collected.
"""

import dataclasses
import functools
import os
import pickle
import sys

from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer
from blockprep.bench.deepseek_workloads import DS_WARMUP, WIRE_LAYOUT, deepseek_wire_sim
from blockprep.events import BlockEventRecorder, PackedDeltaEncoder
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS
from blockprep.wire import BlockDeltaEncoder


def main(mode: str, steps: int) -> None:
    recorder = BlockEventRecorder([name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS])
    sim = deepseek_wire_sim(0)
    sim.recorder = recorder
    encoder = BlockDeltaEncoder()
    for _ in range(DS_WARMUP):
        batch = sim.step()
        recorder.message(batch.request_ids)
        encoder.encode(batch.request_ids, batch.block_ids_by_group)
    recorder.resync()
    encoder.reset()
    if mode == "recorder":  # the scheduler's events replayed, then message(), after a warm-up
        sys.path.insert(0, os.path.dirname(__file__))
        from events_cost import GROUPS, trace

        events, orders = trace(steps, 0)
        warm = len(events) - steps
        replayed = BlockEventRecorder(GROUPS)
        calls = {n: getattr(replayed, n) for n in ("start", "append", "set", "truncate", "finish")}

        def replay(part: slice) -> None:
            for step, order in zip(events[part], orders[part], strict=True):
                for name, args in step:
                    calls[name](*args)
                replayed.message(order)

        replay(slice(0, warm))
        functools.reduce(lambda a, b: replay(slice(warm, None)), [0, 0])
        return
    if mode in ("encoder", "differ"):  # differ: the packed differ on the same lists
        if mode == "differ":
            encoder = PackedDeltaEncoder([name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS])
        lists = []
        for _ in range(steps + 1):
            batch = sim.step()
            copies = [{g: list(ids) for g, ids in row.items()} for row in batch.block_ids_by_group]
            lists.append((list(batch.request_ids), copies))  # list() per group, as upstream
        encoder.encode(*lists[0])

        def run() -> None:
            for item in lists[1:]:
                encoder.encode(*item)

    else:
        items = []
        for _ in range(steps + 1):
            batch = sim.step()
            if mode == "packed":
                message = recorder.message(batch.request_ids)
            else:
                message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
            delta = dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message)
            items.append(pickle.loads(pickle.dumps(delta)))
        preparer = DeepSeekV4DecodePreparer(WIRE_LAYOUT, buffer_slots=2)
        preparer.prepare(items[0], buffer_slot=0)

        def run() -> None:
            for i, item in enumerate(items[1:]):
                preparer.prepare(item, buffer_slot=(i + 1) % 2)

    functools.reduce(lambda a, b: run(), [0, 0])


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
