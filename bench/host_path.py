"""``python -m bench.host_path``: the whole host path of a decode step.

Each step of a scheduler trace goes through every option's three stages, timed apart:

- **engine**: build the step's message from the scheduler's state and encode it (msgspec
  msgpack of :class:`StepCommand`, shaped like upstream's ``serving/server/ipc.py``);
- **transfer**: the encoded bytes written into a real ``os.pipe()`` and read back, in one process;
- **worker**: decode the bytes, build the :class:`~blockprep.batch.DecodeBatch`, prepare the
  buffers (DeepSeek V4: slot ``step_id % 2``).

Options (:data:`OPTIONS`, :mod:`bench.host_stages`): ``upstream`` (every request's
lists copied with ``list()`` per group, as upstream's engine does, and upstream's rebuild before
its fix), ``upstream-fix`` (the same, upstream's fix), ``by-value`` (the same lists, blockprep's
preparer by value), ``wire`` (:class:`~blockprep.wire.BlockDeltaEncoder`'s message inside the
command, blockprep's delta path), ``differ`` (:class:`~blockprep.events.PackedDeltaEncoder`'s
packed message) and ``recorder`` (the step's events, as the scheduler made them, replayed into a
:class:`~blockprep.events.BlockEventRecorder`, then its packed message). The ``envelope`` row is
no option: the command with every block list empty (engine only), what every option sends
besides its blocks.

Workloads: ``deepseek-v4-host-path`` (the bench's DeepSeek wire trace: 8 ranks x 8 requests,
:func:`~blockprep.bench.deepseek_workloads.deepseek_wire_sim`, churn 0.5%, two buffer slots) and
``qwen3-14b-host-path-b16`` / ``-b256`` (:func:`~blockprep.bench.qwen_workloads.qwen_wire_trace`;
``qwen3-14b-host-path`` names both). The scheduler's state of a step is made untimed; the first
``WARM`` steps warm every option up (both slots written) and are not timed.

Before timing, every option runs a short trace (``--verify-steps``) in lockstep with
``upstream`` through all three stages, and its buffers must equal upstream's cell for cell after
every step (:class:`~blockprep.bench.runner.MismatchError` otherwise: no figure). Timing: garbage
collector off, one torch thread, every option on every step of one trace, the stages interleaved
option by option: each step runs every option's engine, then every transfer, then every worker,
each stage's options in an order shuffled per step (seeded). The engine and the worker live in
two processes upstream; in one, an engine timed right after another option's worker pays for the
cache that worker left (the same copy and encode measured 470-530 us after blockprep's worker,
710-1,070 us after an upstream rebuild), so the stages are grouped, and shuffled so that no
option always follows the same other. Each run is a fresh set of options on the same trace.
Reported per option: each stage's median (of the runs' medians), the whole step's median (of
per-step sums of the three stages) with p10-p90 over every run's steps, the ratio ``upstream /
option`` of whole-step medians within each run (median over runs, min-max), the message's
median bytes and how many of them carry blocks, and the worker stage in its parts (decode, batch,
prepare, free). ``--sequential`` times each option alone over its own trace instead.
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import pickle
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

try:
    import msgspec
except ModuleNotFoundError as error:  # the bench extra
    raise SystemExit(
        "python -m bench.host_path needs msgspec: pip install 'blockprep[bench]'"
    ) from error

from bench.host_stages import (
    DeepSeekBlockprep,
    DeepSeekRebuild,
    DeltaStepCommand,
    Envelope,
    FullLists,
    Option,
    Pipe,
    QwenTarget,
    SchedulerStep,
    StepCommand,
    Target,
    block_bytes,
    packed_deltas,
    recorded_deltas,
    wire_deltas,
)
from blockprep._engine import kernel_backend
from blockprep.batch import DecodeBatch
from blockprep.bench.deepseek_workloads import DS_WARMUP, WIRE_SLOTS, deepseek_wire_sim
from blockprep.bench.qwen_workloads import qwen_wire_trace
from blockprep.bench.report import load_average
from blockprep.bench.runner import MismatchError, percentile, quiet_process
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS

WARM = WIRE_SLOTS
"""Untimed steps at the start of every run (each buffer slot written once)."""

QUICK_STEPS, DEFAULT_STEPS, VERIFY_STEPS = 40, 300, 30


def _finished(previous: Sequence[str], now: Sequence[str]) -> list[str]:
    current = set(now)
    return [rid for rid in previous if rid not in current]


class _Capture:
    """Stands in for the simulation's recorder: keeps each event call, its arguments copied (the
    scheduler's lists change later), for :func:`~bench.host_stages.recorded_deltas`
    to replay."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def call(*args: Any) -> None:
            self.events.append((name, copy.deepcopy(args)))

        return call


GROUPS = [name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS]
"""The DeepSeek V4 groups in the order the packed records number them."""


def deepseek_steps(steps: int, seed: int) -> Iterator[SchedulerStep]:
    """``steps + WARM`` steps of :func:`deepseek_wire_sim` after ``DS_WARMUP`` steps; each
    step's events are what the simulation told its recorder during that step (the first step's:
    every request of its batch started with its lists)."""
    sim = deepseek_wire_sim(seed)
    capture = _Capture()
    sim.recorder = cast(Any, capture)
    for _ in range(DS_WARMUP):
        sim.step()
    previous: list[str] = []
    for index in range(steps + WARM):
        capture.events = []
        batch = sim.step()
        events = capture.events
        if index == 0:
            events = [
                ("start", (rid, {g: list(ids) for g, ids in lists.items()}))
                for rid, lists in zip(batch.request_ids, batch.block_ids_by_group, strict=True)
            ]
        yield SchedulerStep(
            list(batch.request_ids),
            batch.token_ids.tolist(),
            batch.seq_lens.tolist(),
            batch.block_ids_by_group,
            [int(p) for p in batch.cache_partitions],  # type: ignore[arg-type]
            _finished(previous, batch.request_ids),
            index,
            events,
        )
        previous = batch.request_ids


def qwen_steps(batch: int) -> Callable[[int, int], Iterator[SchedulerStep]]:
    """``steps + WARM`` steps of :func:`qwen_wire_trace` at ``batch`` requests; each step's
    events are what a paged scheduler would tell a recorder (found by comparing the step's
    lists with the last step's, untimed): ``finish`` for a request gone, ``start`` for a new
    one, ``append`` for pages added."""

    def trace(steps: int, seed: int) -> Iterator[SchedulerStep]:
        held: dict[str, list[int]] = {}
        source = qwen_wire_trace(batch, steps + WARM - 1, seed)
        for index, item in enumerate(source):
            state: DecodeBatch = pickle.loads(item.by_value)
            finished = _finished(list(held), state.request_ids)
            events: list[tuple[str, tuple[Any, ...]]] = [("finish", (r,)) for r in finished]
            for rid in finished:
                del held[rid]
            for rid, ids in zip(state.request_ids, state.block_ids, strict=True):
                old = held.get(rid)
                if old is None:
                    events.append(("start", (rid, list(ids))))
                elif ids[: len(old)] != old:
                    raise RuntimeError(f"the Qwen trace changed request {rid}'s held pages")
                elif len(ids) > len(old):
                    events.append(("append", (rid, ids[len(old) :])))
                held[rid] = list(ids)
            yield SchedulerStep(
                list(state.request_ids),
                state.token_ids.tolist(),
                state.seq_lens.tolist(),
                state.block_ids,
                [None] * len(state.request_ids),
                finished,
                index,
                events,
            )

    return trace


OptionFactory = Callable[[], Option]


@dataclass(frozen=True)
class HostPathWorkload:
    name: str
    description: str
    trace: Callable[[int, int], Iterator[SchedulerStep]]
    options: dict[str, OptionFactory]


def _options(target: Callable[[str], Target], groups: list[str] | None) -> dict[str, OptionFactory]:
    """Every option, ``target(kind)`` its worker's preparation (``"pre-fix"``, ``"fix"``,
    ``"blockprep"``), ``groups`` the packed records' group order (``None``: flat lists)."""
    full, deltas = StepCommand, DeltaStepCommand
    return {
        "upstream": lambda: Option(FullLists(), target("pre-fix"), full),
        "upstream-fix": lambda: Option(FullLists(), target("fix"), full),
        "by-value": lambda: Option(FullLists(), target("blockprep"), full),
        "wire": lambda: Option(wire_deltas(), target("blockprep"), deltas),
        "differ": lambda: Option(packed_deltas(groups), target("blockprep"), deltas),
        "recorder": lambda: Option(recorded_deltas(groups), target("blockprep"), deltas),
    }


def _deepseek_target(kind: str) -> Target:
    return DeepSeekBlockprep() if kind == "blockprep" else DeepSeekRebuild(fix=kind == "fix")


OPTIONS = {
    "upstream": "full lists (list() per group) + msgspec + upstream's rebuild before its fix",
    "upstream-fix": "full lists + msgspec + upstream's fixed rebuild",
    "by-value": "full lists + msgspec + blockprep's preparer by value",
    "wire": "blockprep.wire.BlockDeltaEncoder's dict message in the command + blockprep's deltas",
    "differ": "blockprep.events.PackedDeltaEncoder's packed message + blockprep's deltas",
    "recorder": "the step's events replayed into blockprep.events.BlockEventRecorder, its "
    "packed message + blockprep's deltas",
}
BASELINE = "upstream"


def workloads() -> dict[str, HostPathWorkload]:
    """Every host-path workload by name."""
    found = [
        HostPathWorkload(
            "deepseek-v4-host-path",
            "DeepSeek V4: 8 ranks x 8 requests, prompts 1-3000, 0.5% churn, pools 4096, "
            "2 buffer slots (slot = step % 2)",
            deepseek_steps,
            _options(_deepseek_target, GROUPS),
        ),
    ]
    for batch in (16, 256):
        found.append(
            HostPathWorkload(
                f"qwen3-14b-host-path-b{batch}",
                f"Qwen3-14B: B={batch}, seq ~3338, page 128, 0.5% churn",
                qwen_steps(batch),
                _options(functools.partial(QwenTarget, batch), None),
            )
        )
    return {w.name: w for w in found}


ALIASES = {"qwen3-14b-host-path": ("qwen3-14b-host-path-b16", "qwen3-14b-host-path-b256")}


# --- check, then time -----------------------------------------------------------------------


def verify(workload: HostPathWorkload, steps: int, seed: int) -> int:
    """Run ``steps`` steps through every option in lockstep (all three stages) and compare each
    option's buffers with the baseline's after every step; the number of steps compared.

    Raises:
        MismatchError: an option's buffer differs (the step, buffer and cell named).
    """
    options = {name: make() for name, make in workload.options.items()}
    pipe = Pipe()
    compared = 0
    try:
        for step in workload.trace(steps, seed):
            for option in options.values():
                option.work(pipe.transfer(option.encode(step)))
            expected = options[BASELINE].target.buffers()
            for name, option in options.items():
                actual = option.target.buffers()
                if actual.keys() != expected.keys():
                    raise MismatchError(f"{workload.name}: {name} writes other buffers")
                for buffer, values in actual.items():
                    if not np.array_equal(values, expected[buffer]):
                        cell = tuple(int(i) for i in np.argwhere(values != expected[buffer])[0])
                        raise MismatchError(
                            f"{workload.name}: {name} differs from {BASELINE} at step "
                            f"{step.step_id}, {buffer}{list(cell)}: {values[cell]} != "
                            f"{expected[buffer][cell]}"
                        )
            compared += 1
    finally:
        pipe.close()
    return compared


STAGES = ("engine", "transfer", "worker", "whole")
WORKER_SPLIT = ("decode", "batch", "prepare", "free")
"""The worker stage's parts: decode the bytes, build the DecodeBatch, prepare, and free the
step's message and batch (on the worker's return)."""


def _split(start: int, decoded: int, built: int, prepared: int, end: int) -> tuple[int, ...]:
    return decoded - start, built - decoded, prepared - built, end - prepared


@dataclass
class Lane:
    """One option's timed steps in one run: nanoseconds per stage, the message's bytes and how
    many of them carry blocks (:func:`~bench.host_stages.block_bytes`, untimed)."""

    ns: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in STAGES + WORKER_SPLIT})
    sizes: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    def median_us(self, stage: str) -> float:
        return statistics.median(self.ns[stage]) / 1000

    def add(self, values: Sequence[int], sent: bytes, split: Sequence[int]) -> None:
        """One step's stage times (engine, transfer, worker; the envelope: engine), message
        and worker split (:data:`WORKER_SPLIT`; none for the envelope)."""
        for stage, value in zip(STAGES[:3], values, strict=False):
            self.ns[stage].append(value)
        for part, value in zip(WORKER_SPLIT, split, strict=False):
            self.ns[part].append(value)
        self.ns["whole"].append(sum(values))
        self.sizes.append(len(sent))
        self.blocks.append(block_bytes(sent))


ENVELOPE = "envelope"
"""The lane of :class:`~bench.host_stages.Envelope` (engine stage only)."""


def time_run(
    workload: HostPathWorkload, steps: int, seed: int, *, sequential: bool = False
) -> dict[str, Lane]:
    """One run: fresh options on the trace, stage by stage and option by option within each
    step (see the module), the envelope's engine stage among the engines; ``sequential``: each
    option (and the envelope) alone over a trace of its own, one after the other, so that no
    other option's work comes between two of its steps (the caches stay its own; the ratios
    then also compare different seconds of the machine)."""
    options = {name: make() for name, make in workload.options.items()}
    envelope, encoder = Envelope(), msgspec.msgpack.Encoder()
    lanes = {name: Lane() for name in [*options, ENVELOPE]}
    passes = [[name] for name in lanes] if sequential else [list(lanes)]
    rng = random.Random(seed)
    pipe = Pipe()
    clock = time.perf_counter_ns
    try:
        with quiet_process():
            for names in passes:
                for index, step in enumerate(workload.trace(steps, seed)):
                    ns: dict[str, list[int]] = {name: [] for name in names}
                    sent: dict[str, bytes] = {}
                    received: dict[str, bytes] = {}
                    split: dict[str, tuple[int, ...]] = {}
                    for stage in ("engine", "transfer", "worker"):
                        order = [n for n in names if stage == "engine" or n != ENVELOPE]
                        rng.shuffle(order)
                        for name in order:
                            start = clock()
                            if name == ENVELOPE:
                                sent[name] = encoder.encode(envelope.message(step))
                            elif stage == "engine":
                                sent[name] = options[name].encode(step)
                            elif stage == "transfer":
                                received[name] = pipe.transfer(sent[name])
                            else:
                                marks = options[name].work(received.pop(name))
                            end = clock()
                            ns[name].append(end - start)
                            if stage == "worker":
                                split[name] = _split(start, *marks, end)
                    if index >= WARM:
                        for name, values in ns.items():
                            lanes[name].add(values, sent[name], split.get(name, ()))
    finally:
        pipe.close()
    return lanes


@dataclass(frozen=True)
class OptionResult:
    """One option over every run: each stage's median of the runs' medians (us; the envelope
    has its engine stage only), the whole step's p10 and p90 over every run's steps, the ratio
    against the baseline's whole step (median over runs, and each run's; NaN for the envelope),
    the message's median bytes and its median bytes carrying blocks."""

    workload: str
    option: str
    stages_us: dict[str, float]
    p10_us: float
    p90_us: float
    ratio: float
    ratios: tuple[float, ...]
    message_bytes: float
    block_bytes: float


def summarize(workload: HostPathWorkload, runs: Sequence[dict[str, Lane]]) -> list[OptionResult]:
    """One result per option of ``workload``, then the envelope's."""
    results = []
    for name in [*workload.options, ENVELOPE]:
        lanes = [run[name] for run in runs]
        pooled = sorted(ns / 1000 for lane in lanes for ns in lane.ns["whole"])
        ratios = tuple(
            run[BASELINE].median_us("whole") / run[name].median_us("whole") for run in runs
        )
        results.append(
            OptionResult(
                workload.name,
                name,
                {
                    s: statistics.median(lane.median_us(s) for lane in lanes)
                    for s in STAGES + WORKER_SPLIT
                    if lanes[0].ns[s]
                },
                percentile(pooled, 0.1),
                percentile(pooled, 0.9),
                math.nan if name == ENVELOPE else statistics.median(ratios),
                () if name == ENVELOPE else ratios,
                statistics.median(size for lane in lanes for size in lane.sizes),
                statistics.median(size for lane in lanes for size in lane.blocks),
            )
        )
    return results


# --- report -----------------------------------------------------------------------------------


def table(results: Sequence[OptionResult]) -> str:
    """A text table, one row per option."""
    head = (
        "workload",
        "option",
        "engine us",
        "transfer us",
        "worker us",
        "whole us",
        "p10-p90",
        "vs upstream",
        "message B",
        "blocks B",
    )
    rows: list[tuple[str, ...]] = [head]
    for r in results:
        ratio = "-" if math.isnan(r.ratio) else f"{r.ratio:,.1f}x"
        if len(r.ratios) > 1:
            ratio += f" ({min(r.ratios):,.1f}-{max(r.ratios):,.1f})"
        rows.append(
            (
                r.workload,
                r.option,
                *(f"{r.stages_us[s]:,.1f}" if s in r.stages_us else "-" for s in STAGES),
                f"{r.p10_us:,.0f}-{r.p90_us:,.0f}",
                ratio,
                f"{r.message_bytes:,.0f}",
                f"{r.block_bytes:,.0f}",
            )
        )
    return _render(rows)


def split_table(results: Sequence[OptionResult]) -> str:
    """A text table of each option's worker stage in its parts (:data:`WORKER_SPLIT`)."""
    rows: list[tuple[str, ...]] = [("workload", "option", *(f"{s} us" for s in WORKER_SPLIT))]
    for r in results:
        if r.option != ENVELOPE:
            rows.append((r.workload, r.option, *(f"{r.stages_us[s]:,.1f}" for s in WORKER_SPLIT)))
    return _render(rows)


def _render(rows: Sequence[tuple[str, ...]]) -> str:
    """Columns padded, the first two left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


DS, QWEN_256 = "deepseek-v4-host-path", "qwen3-14b-host-path-b256"
TARGETS: tuple[tuple[str, str, str, str, float], ...] = (
    (DS, "recorder", "ratio", ">=", 40),
    (DS, "differ", "ratio", ">=", 20),
    (DS, "recorder", "engine", "<=", 100),
    (DS, "differ", "engine", "<=", 450),
    (DS, "recorder", "blocks", "<=", 6000),
    (DS, "differ", "blocks", "<=", 6000),
    (QWEN_256, "recorder", "ratio", ">=", 10),
)
"""(workload, option, figure, comparison, target): the targets, reported, not asserted;
figure ``ratio`` (whole step against upstream), ``engine`` (us) or ``blocks`` (the message's
bytes carrying blocks: the rest, the envelope, is upstream's own per-request fields)."""


def targets(results: Sequence[OptionResult]) -> list[str]:
    """One line per issue-17 target whose workload and option ran: the figure and met or not."""
    lines = []
    found = {(r.workload, r.option): r for r in results}
    for workload, option, figure, comparison, target in TARGETS:
        r = found.get((workload, option))
        if r is None:
            continue
        value = {"ratio": r.ratio, "engine": r.stages_us["engine"], "blocks": r.block_bytes}[figure]
        met = value >= target if comparison == ">=" else value <= target
        lines.append(
            f"target {workload} {option} {figure} {comparison} {target:,g}: {value:,.1f} "
            f"({'met' if met else 'not met'})"
        )
    return lines


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    names = list(workloads())
    parser = argparse.ArgumentParser(
        prog="python -m bench.host_path",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=[*names, *ALIASES],
        metavar="NAME",
        help=f"run only this workload (repeatable): {', '.join([*names, *ALIASES])}",
    )
    parser.add_argument("--steps", type=_positive, help=f"timed steps (default {DEFAULT_STEPS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} timed steps")
    parser.add_argument("--runs", type=_positive, default=3, help="timing runs (default 3)")
    parser.add_argument(
        "--verify-steps",
        type=_positive,
        default=VERIFY_STEPS,
        help=f"steps checked cell for cell before timing (default {VERIFY_STEPS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="time each option alone over its own trace, one after the other (no other "
        "option's work between two of its steps; for comparison: the ratios then also compare "
        "different seconds of the machine)",
    )
    args = parser.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else DEFAULT_STEPS)
    chosen = [alias for name in args.workload or names for alias in ALIASES.get(name, (name,))]
    found = workloads()
    results: list[OptionResult] = []
    loads: list[float] = []
    checked = []
    for name in dict.fromkeys(chosen):
        workload = found[name]
        try:
            count = verify(workload, args.verify_steps, args.seed)
        except MismatchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        checked.append(
            f"verified {name}: {len(workload.options)} options equal {BASELINE} cell "
            f"for cell after each of {count} steps"
        )
        runs = []
        for run in range(args.runs):
            print(f"{name}: run {run + 1}/{args.runs}", file=sys.stderr)
            runs.append(time_run(workload, steps, args.seed, sequential=args.sequential))
            load = load_average()
            if load is not None:
                loads.append(load)
        results += summarize(workload, runs)
    load_text = "-" if not loads else f"{min(loads):.2f}-{max(loads):.2f}"
    order = (
        "each option alone over its own trace, one after the other (--sequential)"
        if args.sequential
        else "each step every option's engine, then every transfer, then every worker, each "
        "stage's options in a shuffled order"
    )
    print(
        f"blockprep host path: {steps} timed steps, {args.runs} runs (medians of the runs' "
        f"medians), seed {args.seed}, one torch thread, garbage collector off; {order}; table "
        f"kernel: {kernel_backend()}; load average {load_text}"
    )
    print("\n".join(checked))
    print()
    print(table(results))
    print()
    print(split_table(results))
    print()
    print("\n".join(f"{name}: {what}" for name, what in OPTIONS.items()))
    print(
        f"{ENVELOPE}: not an option: the command with every block list empty (engine only); "
        "blocks B: the message's bytes less the envelope's; worker = decode (the bytes) + batch "
        "(the DecodeBatch built) + prepare + free (the step's message and batch freed)"
    )
    lines = targets(results)
    if lines:
        print()
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
