"""``python -m blockprep.bench.host_path``: the whole host path of a decode step (issue 17).

Each step of a scheduler trace goes through every option's three stages, timed apart:

- **engine**: build the step's message from the scheduler's state and encode it (msgspec
  msgpack of :class:`StepCommand`, shaped like upstream's ``serving/server/ipc.py``);
- **transfer**: the encoded bytes written into a real ``os.pipe()`` and read back, in one process;
- **worker**: decode the bytes, build the :class:`~blockprep.batch.DecodeBatch`, prepare the
  buffers (DeepSeek V4: slot ``step_id % 2``).

Options (:data:`OPTIONS`): ``upstream`` (every request's lists copied with ``list()`` per group,
as upstream's engine does, and upstream's rebuild before its fix), ``upstream-fix`` (the same
with upstream's fix), ``by-value`` (the same lists, blockprep's preparer by value), ``wire``
(:class:`~blockprep.wire.BlockDeltaEncoder` messages inside the command, blockprep's delta path).

Workloads: ``deepseek-v4-host-path`` (the bench's DeepSeek wire trace: 8 ranks x 8 requests,
:func:`~blockprep.bench.workloads.deepseek_wire_sim`, churn 0.5%, two buffer slots) and
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
option`` of whole-step medians within each run (median over runs, min-max), and the message's
median bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pickle
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.bench.qwen_workloads import qwen_wire_trace
from blockprep.bench.report import load_average
from blockprep.bench.runner import MismatchError, percentile, quiet_process
from blockprep.bench.workloads import (
    DS_WARMUP,
    QWEN_MAX_SEQ_LEN,
    QWEN_PAD,
    QWEN_PAGE_SIZE,
    WIRE_LAYOUT,
    WIRE_SLOTS,
    deepseek_wire_sim,
)
from blockprep.engine import kernel_backend
from blockprep.wire import BlockDeltaEncoder

WARM = WIRE_SLOTS
"""Untimed steps at the start of every run (each buffer slot written once)."""

QUICK_STEPS, DEFAULT_STEPS, VERIFY_STEPS = 40, 300, 30


# --- upstream's wire shape (our own definitions, after serving/server/ipc.py) ------------------


class DecodeRequest(msgspec.Struct):
    """One request of a decode step, as upstream's engine sends it every step."""

    request_id: str
    last_token: int
    seq_len: int
    block_ids: list[int]
    block_ids_by_group: dict[str, list[int]] = msgspec.field(default_factory=dict)
    cache_partition: int | None = None


class StepCommand(msgspec.Struct, tag="step"):
    """One scheduling step (decode only here: no new or prefill requests)."""

    new_requests: list[Any]
    prefill_requests: list[Any]
    decode_requests: list[DecodeRequest]
    finished_request_ids: list[str]
    step_id: int = 0


class DeltaStepCommand(StepCommand, tag="step"):
    """Upstream's command with the block lists left empty and blockprep's message beside them."""

    block_deltas: dict[str, Any] | None = None


# --- the scheduler's state of one step ------------------------------------------------------


@dataclass
class SchedulerStep:
    """What the engine knows of one step, made untimed: the batch order, each request's token,
    ``seq_len``, block lists (grouped: ``{group: ids}``; flat: ``ids``; the scheduler's own
    lists) and rank (``None``: flat), the requests finished since the last step, and the step's
    number."""

    request_ids: list[str]
    tokens: list[int]
    seq_lens: list[int]
    lists: list[Any]
    partitions: list[int | None]
    finished: list[str]
    step_id: int
    events: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)


def _finished(previous: Sequence[str], now: Sequence[str]) -> list[str]:
    current = set(now)
    return [rid for rid in previous if rid not in current]


def deepseek_steps(steps: int, seed: int) -> Iterator[SchedulerStep]:
    """``steps + WARM`` steps of :func:`deepseek_wire_sim` after ``DS_WARMUP`` steps."""
    sim = deepseek_wire_sim(seed)
    for _ in range(DS_WARMUP):
        sim.step()
    previous: list[str] = []
    for index in range(steps + WARM):
        batch = sim.step()
        yield SchedulerStep(
            list(batch.request_ids),
            batch.token_ids.tolist(),
            batch.seq_lens.tolist(),
            batch.block_ids_by_group,
            [int(p) for p in batch.cache_partitions],  # type: ignore[arg-type]
            _finished(previous, batch.request_ids),
            index,
        )
        previous = batch.request_ids


def qwen_steps(batch: int) -> Callable[[int, int], Iterator[SchedulerStep]]:
    """``steps + WARM`` steps of :func:`qwen_wire_trace` at ``batch`` requests."""

    def trace(steps: int, seed: int) -> Iterator[SchedulerStep]:
        previous: list[str] = []
        source = qwen_wire_trace(batch, steps + WARM - 1, seed)
        for index, item in enumerate(source):
            state: DecodeBatch = pickle.loads(item.by_value)
            yield SchedulerStep(
                list(state.request_ids),
                state.token_ids.tolist(),
                state.seq_lens.tolist(),
                state.block_ids,
                [None] * len(state.request_ids),
                _finished(previous, state.request_ids),
                index,
            )
            previous = state.request_ids

    return trace


# --- engine side: one message builder per option ----------------------------------------------


class Engine(Protocol):
    def message(self, step: SchedulerStep) -> StepCommand:
        """The step's command, built from the scheduler's state."""


class FullLists:
    """Upstream's engine: every request's block lists copied (``list()`` per group)."""

    def message(self, step: SchedulerStep) -> StepCommand:
        requests = []
        for rid, token, seq_len, lists, partition in zip(
            step.request_ids, step.tokens, step.seq_lens, step.lists, step.partitions, strict=True
        ):
            if partition is None:
                request = DecodeRequest(rid, token, seq_len, list(lists), {}, None)
            else:
                groups = {name: list(ids) for name, ids in lists.items()}
                request = DecodeRequest(rid, token, seq_len, [], groups, partition)
            requests.append(request)
        return StepCommand([], [], requests, step.finished, step.step_id)


class Deltas:
    """A delta engine: the block lists left empty, ``encode(request_ids, lists)``'s message
    carried in the command's ``block_deltas``."""

    def __init__(self, encode: Callable[[SchedulerStep], dict[str, Any]]) -> None:
        self._encode = encode

    def message(self, step: SchedulerStep) -> StepCommand:
        requests = [
            DecodeRequest(rid, token, seq_len, [], {}, partition)
            for rid, token, seq_len, partition in zip(
                step.request_ids, step.tokens, step.seq_lens, step.partitions, strict=True
            )
        ]
        deltas = self._encode(step)
        return DeltaStepCommand([], [], requests, step.finished, step.step_id, deltas)


def wire_deltas() -> Deltas:
    encoder = BlockDeltaEncoder()
    return Deltas(lambda step: encoder.encode(step.request_ids, step.lists))


# --- worker side: one preparation per option --------------------------------------------------


class Target(Protocol):
    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        """Write one step into buffer slot ``slot``."""

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        """The buffers the last step wrote (views)."""


class DeepSeekRebuild:
    """``reference.deepseek_v4_decode_rebuild`` into per-slot persistent buffers."""

    def __init__(self, *, fix: bool) -> None:
        self._fix = fix
        self._out: list[dict[str, torch.Tensor] | None] = [None] * WIRE_SLOTS
        self._slot = 0

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        layout = WIRE_LAYOUT
        self._out[slot] = reference.deepseek_v4_decode_rebuild(
            batch,
            ranks=layout.ranks,
            decode_batch=layout.decode_batch,
            decode_seq=layout.decode_seq,
            num_blocks=layout.num_blocks,
            fix=self._fix,
            out=self._out[slot],
        )
        self._slot = slot

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        out = self._out[self._slot]
        assert out is not None
        return {name: tensor.numpy() for name, tensor in out.items()}


class DeepSeekBlockprep:
    """:class:`DeepSeekV4DecodePreparer` (by value or by delta, as the batch carries)."""

    def __init__(self) -> None:
        self._preparer = DeepSeekV4DecodePreparer(WIRE_LAYOUT, buffer_slots=WIRE_SLOTS)
        self._inputs: Any = None

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        self._inputs = self._preparer.prepare(batch, buffer_slot=slot)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: t.numpy() for name, t in self._inputs.buffers().items()}


_QWEN_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class QwenTarget:
    """A Qwen preparation of ``batch`` requests: upstream's before #97 (``"pre-fix"``), #97
    (``"fix"``) or blockprep's :class:`QwenDecodePreparer` (``"blockprep"``)."""

    def __init__(self, batch: int, kind: str) -> None:
        args = (batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
        self._prep: Any = {
            "pre-fix": reference.QwenDecodePrepBefore,
            "fix": reference.QwenDecodePrep97,
            "blockprep": QwenDecodePreparer,
        }[kind](*args)
        self._out: Any = self._prep

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        out = self._prep.prepare(batch)
        self._out = self._prep if out is None else out

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self._out, name).numpy() for name in _QWEN_BUFFERS}


def to_batch(command: StepCommand) -> DecodeBatch:
    """The worker's :class:`DecodeBatch` of a decoded command (block lists, or its deltas)."""
    requests = command.decode_requests
    deltas = getattr(command, "block_deltas", None)
    grouped = bool(requests) and requests[0].cache_partition is not None
    lists: dict[str, Any] = {}
    if deltas is not None:
        lists["block_deltas"] = deltas
    elif grouped:
        lists["block_ids_by_group"] = [r.block_ids_by_group for r in requests]
    else:
        lists["block_ids"] = [r.block_ids for r in requests]
    return DecodeBatch(
        request_ids=[r.request_id for r in requests],
        token_ids=torch.tensor([r.last_token for r in requests]),
        hidden_states=None,
        seq_lens=torch.tensor([r.seq_len for r in requests]),
        cache_partitions=[r.cache_partition for r in requests] if grouped else [],
        **lists,
    )


# --- the three stages ---------------------------------------------------------------------------


class Pipe:
    """A real ``os.pipe()``: :meth:`transfer` writes the bytes in, then reads them out."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self.capacity = 1 << 16
        with contextlib.suppress(AttributeError, OSError):  # else (not Linux) 64 KiB chunks
            self.capacity = fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, 1 << 20)

    def transfer(self, data: bytes) -> bytes:
        view, parts = memoryview(data), []
        for start in range(0, len(data), self.capacity):
            chunk = view[start : start + self.capacity]
            written = 0
            while written < len(chunk):
                written += os.write(self._write, chunk[written:])
            got = 0
            while got < written:
                part = os.read(self._read, written - got)
                parts.append(part)
                got += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class Option:
    """One option's two ends: an engine, a worker target, and the codec between them."""

    def __init__(self, engine: Engine, target: Target, command: type[StepCommand]) -> None:
        self.engine, self.target = engine, target
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(command)

    def encode(self, step: SchedulerStep) -> bytes:
        return self._encoder.encode(self.engine.message(step))

    def work(self, data: bytes) -> None:
        command = self._decoder.decode(data)
        self.target.prepare(to_batch(command), command.step_id % WIRE_SLOTS)


OptionFactory = Callable[[], Option]


@dataclass(frozen=True)
class HostPathWorkload:
    name: str
    description: str
    trace: Callable[[int, int], Iterator[SchedulerStep]]
    options: dict[str, OptionFactory]


def _deepseek_options() -> dict[str, OptionFactory]:
    return {
        "upstream": lambda: Option(FullLists(), DeepSeekRebuild(fix=False), StepCommand),
        "upstream-fix": lambda: Option(FullLists(), DeepSeekRebuild(fix=True), StepCommand),
        "by-value": lambda: Option(FullLists(), DeepSeekBlockprep(), StepCommand),
        "wire": lambda: Option(wire_deltas(), DeepSeekBlockprep(), DeltaStepCommand),
    }


def _qwen_options(batch: int) -> dict[str, OptionFactory]:
    return {
        "upstream": lambda: Option(FullLists(), QwenTarget(batch, "pre-fix"), StepCommand),
        "upstream-fix": lambda: Option(FullLists(), QwenTarget(batch, "fix"), StepCommand),
        "by-value": lambda: Option(FullLists(), QwenTarget(batch, "blockprep"), StepCommand),
        "wire": lambda: Option(wire_deltas(), QwenTarget(batch, "blockprep"), DeltaStepCommand),
    }


OPTIONS = {
    "upstream": "full lists (list() per group) + msgspec + upstream's rebuild before its fix",
    "upstream-fix": "full lists + msgspec + upstream's fixed rebuild",
    "by-value": "full lists + msgspec + blockprep's preparer by value",
    "wire": "blockprep.wire.BlockDeltaEncoder message in the command + blockprep's delta path",
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
            _deepseek_options(),
        ),
    ]
    for batch in (16, 256):
        found.append(
            HostPathWorkload(
                f"qwen3-14b-host-path-b{batch}",
                f"Qwen3-14B: B={batch}, seq ~3338, page 128, 0.5% churn",
                qwen_steps(batch),
                _qwen_options(batch),
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


@dataclass
class Lane:
    """One option's timed steps in one run: nanoseconds per stage and the message bytes."""

    ns: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in STAGES})
    sizes: list[int] = field(default_factory=list)

    def median_us(self, stage: str) -> float:
        return statistics.median(self.ns[stage]) / 1000


def time_run(workload: HostPathWorkload, steps: int, seed: int) -> dict[str, Lane]:
    """One run: fresh options on the trace, stage by stage and option by option within each step
    (see the module)."""
    options = {name: make() for name, make in workload.options.items()}
    lanes = {name: Lane() for name in options}
    order = list(options)
    rng = random.Random(seed)
    pipe = Pipe()
    clock = time.perf_counter_ns
    try:
        with quiet_process():
            for index, step in enumerate(workload.trace(steps, seed)):
                ns: dict[str, list[int]] = {name: [] for name in options}
                data: dict[str, bytes] = {}
                sizes: dict[str, int] = {}
                for stage in ("engine", "transfer", "worker"):
                    rng.shuffle(order)
                    for name in order:
                        option = options[name]
                        start = clock()
                        if stage == "engine":
                            data[name] = option.encode(step)
                            sizes[name] = len(data[name])
                        elif stage == "transfer":
                            data[name] = pipe.transfer(data[name])
                        else:
                            option.work(data.pop(name))
                        ns[name].append(clock() - start)
                if index >= WARM:
                    for name, (engine, transfer, worker) in ns.items():
                        lane = lanes[name]
                        for stage, value in zip(STAGES, (engine, transfer, worker), strict=False):
                            lane.ns[stage].append(value)
                        lane.ns["whole"].append(engine + transfer + worker)
                        lane.sizes.append(sizes[name])
    finally:
        pipe.close()
    return lanes


@dataclass(frozen=True)
class OptionResult:
    """One option over every run: each stage's median of the runs' medians (us), the whole
    step's p10 and p90 over every run's steps, the ratio against the baseline (median over runs,
    and each run's), the message's median bytes."""

    workload: str
    option: str
    stages_us: dict[str, float]
    p10_us: float
    p90_us: float
    ratio: float
    ratios: tuple[float, ...]
    message_bytes: float


def summarize(workload: HostPathWorkload, runs: Sequence[dict[str, Lane]]) -> list[OptionResult]:
    results = []
    for name in workload.options:
        lanes = [run[name] for run in runs]
        pooled = sorted(ns / 1000 for lane in lanes for ns in lane.ns["whole"])
        ratios = tuple(
            run[BASELINE].median_us("whole") / run[name].median_us("whole") for run in runs
        )
        results.append(
            OptionResult(
                workload.name,
                name,
                {s: statistics.median(lane.median_us(s) for lane in lanes) for s in STAGES},
                percentile(pooled, 0.1),
                percentile(pooled, 0.9),
                statistics.median(ratios),
                ratios,
                statistics.median(size for lane in lanes for size in lane.sizes),
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
    )
    rows: list[tuple[str, ...]] = [head]
    for r in results:
        ratio = f"{r.ratio:,.1f}x"
        if len(r.ratios) > 1:
            ratio += f" ({min(r.ratios):,.1f}-{max(r.ratios):,.1f})"
        rows.append(
            (
                r.workload,
                r.option,
                *(f"{r.stages_us[s]:,.1f}" for s in STAGES),
                f"{r.p10_us:,.0f}-{r.p90_us:,.0f}",
                ratio,
                f"{r.message_bytes:,.0f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


TARGETS: tuple[tuple[str, str, str, str, float], ...] = ()
"""(workload, option, figure, comparison, target): issue 17's targets, reported, not asserted;
figure ``ratio`` (whole step against upstream), ``engine`` (us) or ``bytes``."""


def targets(results: Sequence[OptionResult]) -> list[str]:
    """One line per issue-17 target whose workload and option ran: the figure and met or not."""
    lines = []
    found = {(r.workload, r.option): r for r in results}
    for workload, option, figure, comparison, target in TARGETS:
        r = found.get((workload, option))
        if r is None:
            continue
        value = {"ratio": r.ratio, "engine": r.stages_us["engine"], "bytes": r.message_bytes}[
            figure
        ]
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
        prog="python -m blockprep.bench.host_path",
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
            runs.append(time_run(workload, steps, args.seed))
            load = load_average()
            if load is not None:
                loads.append(load)
        results += summarize(workload, runs)
    load_text = "-" if not loads else f"{min(loads):.2f}-{max(loads):.2f}"
    print(
        f"blockprep host path: {steps} timed steps, {args.runs} runs (medians of the runs' "
        f"medians), seed {args.seed}, one torch thread, garbage collector off, options "
        f"interleaved step by step; table kernel: {kernel_backend()}; load average {load_text}"
    )
    print("\n".join(checked))
    print()
    print(table(results))
    print()
    print("\n".join(f"{name}: {what}" for name, what in OPTIONS.items()))
    lines = targets(results)
    if lines:
        print()
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
