"""Engine-side cost per DeepSeek V4 step of the scheduler side of the packed wire
(blockprep.events), on the bench's wire trace (``deepseek_wire_sim``: 8 ranks x 8 requests,
every rank full, 0.5% churn), after its warm-up; one process, one torch thread.

- recorder: the KV manager's events of the step replayed into a :class:`BlockEventRecorder`
  (the calls the simulation makes, in its order) plus ``message(request_ids)``;
- differ: :class:`PackedDeltaEncoder.encode` of the step's live lists, against
  :class:`blockprep.wire.BlockDeltaEncoder.encode` of the same lists, interleaved;
- message size: the packed payload, and the whole message pickled.

Usage::

    python bench/events_cost.py [--steps 1000] [--runs 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import statistics
import time
from typing import Any

import torch

from blockprep.bench.deepseek_workloads import DS_WARMUP, deepseek_wire_sim
from blockprep.events import BlockEventRecorder, PackedDeltaEncoder
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS
from blockprep.wire import BlockDeltaEncoder

GROUPS = [name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS]


class _Log:
    """A recorder stand-in that logs the simulation's calls, step by step."""

    def __init__(self) -> None:
        self.steps: list[list[tuple[str, tuple[Any, ...]]]] = [[]]

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> None:
            copied = tuple(
                {g: list(v) for g, v in a.items()} if isinstance(a, dict) else a for a in args
            )
            self.steps[-1].append((name, copied))

        return call


def trace(steps: int, seed: int) -> tuple[list[Any], list[list[Any]]]:
    """The step's events and batch order for ``DS_WARMUP + steps`` steps."""
    log = _Log()
    sim = deepseek_wire_sim(seed)
    sim.recorder = log  # type: ignore[assignment]
    orders = []
    for _ in range(DS_WARMUP + steps):
        orders.append(sim.step().request_ids)
        log.steps.append([])
    return log.steps[:-1], orders


def time_recorder(events: list[Any], orders: list[Any]) -> tuple[list[float], list[int], list[int]]:
    recorder = BlockEventRecorder(GROUPS)
    times, sizes, pickled = [], [], []
    for index, (step, order) in enumerate(zip(events, orders, strict=True)):
        calls = [(getattr(recorder, name), args) for name, args in step]
        t0 = time.perf_counter_ns()
        for f, args in calls:
            f(*args)
        message = recorder.message(order)
        t1 = time.perf_counter_ns()
        if index >= DS_WARMUP:
            times.append((t1 - t0) / 1e3)
            sizes.append(len(message["data"]))
            pickled.append(len(pickle.dumps(message)))
    return times, sizes, pickled


def time_differs(steps: int, seed: int) -> tuple[list[float], list[float], list[int]]:
    sim = deepseek_wire_sim(seed)
    packed, wire = PackedDeltaEncoder(GROUPS), BlockDeltaEncoder()
    packed_us, wire_us, sizes = [], [], []
    for index in range(DS_WARMUP + steps):
        batch = sim.step()
        ids, lists = batch.request_ids, batch.block_ids_by_group
        first, second = (packed, wire) if index % 2 else (wire, packed)
        took = {}
        for encoder in (first, second):
            t0 = time.perf_counter_ns()
            message = encoder.encode(ids, lists)
            took[encoder] = (time.perf_counter_ns() - t0) / 1e3
            if encoder is packed:
                size = len(message["data"])
        if index >= DS_WARMUP:
            packed_us.append(took[packed])
            wire_us.append(took[wire])
            sizes.append(size)
    return packed_us, wire_us, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    events, orders = trace(args.steps, args.seed)
    n_events = sum(len(s) for s in events[DS_WARMUP:]) / args.steps
    print(f"{args.steps} steps after {DS_WARMUP} warm-up, {n_events:.1f} events a step")
    print("| run | recorder us (median / mean) | differ us | BlockDeltaEncoder us |")
    print("|---|---:|---:|---:|")
    gc.disable()
    try:
        for run in range(args.runs):
            rec, size, pickled = time_recorder(events, orders)
            diff, wire, diff_size = time_differs(args.steps, args.seed)
            print(
                f"| {run} | {statistics.median(rec):.1f} / {statistics.fmean(rec):.1f} | "
                f"{statistics.median(diff):.1f} / {statistics.fmean(diff):.1f} | "
                f"{statistics.median(wire):.1f} / {statistics.fmean(wire):.1f} |"
            )
    finally:
        gc.enable()
    print(
        f"recorder message: payload {statistics.fmean(size):.0f} B mean, {max(size)} B max; "
        f"pickled {statistics.fmean(pickled):.0f} B mean, {max(pickled)} B max"
    )
    mean, most = statistics.fmean(diff_size), max(diff_size)
    print(f"differ message: payload {mean:.0f} B mean, {most} B max")


if __name__ == "__main__":
    main()
