"""``BlockEventRecorder.message`` per step on the host-path bench's Qwen trace
(``bench.host_path.qwen_steps``: B requests, churn, page appends): each step's events
replayed untimed, then ``message(request_ids)`` timed; one process, garbage collector off.
The steps after the warm-up run inside one ``functools.reduce`` call, for callgrind (events
and messages both counted).

Usage::

    python bench/recorder_message.py [--batch 256] [--steps 300]
    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect=functools_reduce python bench/recorder_message.py --steps 200
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time
from typing import Any

from bench.host_path import qwen_steps
from blockprep.events import BlockEventRecorder

WARM = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    steps = list(qwen_steps(args.batch)(args.steps, 0))
    recorder = BlockEventRecorder()
    times: list[float] = []
    changed = 0

    def replay(part: list[Any], timed: bool) -> None:
        nonlocal changed
        for step in part:
            for name, call_args in step.events:
                getattr(recorder, name)(*call_args)
            start = time.perf_counter_ns()
            recorder.message(step.request_ids)
            if timed:
                times.append((time.perf_counter_ns() - start) / 1e3)
                changed += any(name in ("start", "finish") for name, _ in step.events)

    gc.disable()
    try:
        replay(steps[:WARM], False)
        functools.reduce(lambda a, b: replay(steps[WARM:], True), [0, 0])
    finally:
        gc.enable()
    print(
        f"B{args.batch}: message {statistics.median(times):.1f} us median, "
        f"{statistics.fmean(times):.1f} us mean over {len(times)} steps "
        f"({changed} with a request started or finished)"
    )


if __name__ == "__main__":
    main()
