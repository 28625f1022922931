"""``python -m bench.vllm_compare``: the vLLM facade against vLLM's own row operations.

Replays vLLM-like scheduler outputs on paged tables (pad 0) at six shapes, requests x block size
16x128, 64x128, 256x128, 16x16, 64x16, 256x16, with sequences of up to 4,096 tokens and 1% churn
per step. Each step, as a vLLM worker applies it: the finished rows are cleared, running rows whose
sequence crossed a block boundary get their new block id appended, new requests are added into the
lowest free rows (their prompt's blocks), the last rows are moved into the gaps that are left, and
the first ``num_reqs`` rows are committed to the device copy (a separate CPU tensor here, as
vLLM's ``CpuGpuBuffer`` makes on a CPU device; the facade's device table is its host table, or
with ``--separate`` a separate CPU copy too).

Four constructions, each with its own copy of the step: ``vllm`` (:mod:`bench.vllm_port`,
vLLM's ``BlockTable`` ported: its per-row calls), ``per-row`` (the same calls on
:class:`~blockprep.adapters.vllm.VllmBlockTable`), ``batched``
(:meth:`~blockprep.adapters.vllm.VllmBlockTable.apply_step`) and ``packed``
(:meth:`~blockprep.adapters.vllm.VllmBlockTable.apply_packed`: the step as a
:mod:`blockprep.packed` message, packed when the trace is made, as a scheduler's recorder would:
finished rows truncated to 0, appended ids, added rows whole; then the moves). Every step reaches
each construction as a pickle round trip of the scheduler output (new lists of new int objects, as
vLLM's msgpack queue delivers them; for ``packed`` the message's bytes), made untimed. Before
timing, the whole trace runs through all four in lockstep and their host and device tables and
counts are compared after every step.

Timing as ``python -m blockprep bench`` does it: garbage collector off, one torch thread,
constructions interleaved round by round (round ``k`` starts with construction ``k % 3``), each
step timed alone; per shape the median of the runs' medians, p10-p90 over every run's steps, and
the ratios per-row / vllm, batched / vllm and packed / vllm (median over runs of each run's ratio
of medians). Targets: per-row <= 0.5x, batched <= 0.2x (packed: reported). The batched
construction calls ``apply_step`` with the step's fields as keywords, as a worker does.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.vllm_port import PortBlockTable
from blockprep import packed
from blockprep.adapters.vllm import VllmBlockTable
from blockprep.bench.runner import quiet_process

SHAPES: tuple[tuple[int, int], ...] = (
    (16, 128),
    (64, 128),
    (256, 128),
    (16, 16),
    (64, 16),
    (256, 16),
)
"""(requests, block size) of each measured table."""

SEQ_LEN = 4096
CHURN = 0.01
TARGETS = {"per-row": 0.5, "batched": 0.2}
CONSTRUCTIONS = ("vllm", "per-row", "batched", "packed")
VLLM_MEDIANS_US = {
    (16, 128): 3.2,
    (64, 128): 5.7,
    (256, 128): 11.2,
    (16, 16): 4.7,
    (64, 16): 9.4,
    (256, 16): 27.1,
}
"""vLLM's own per-step medians on a 2-core machine (for orientation; the ratios use this run's)."""

Step = dict[str, Any]


# --- the trace ----------------------------------------------------------------------------------


class SchedulerTrace:
    """vLLM-like scheduler outputs for ``num_reqs`` rows of ``block_size``-token blocks.

    Requests grow by one token a step; one whose next token needs a new block gets one (appended);
    a request finishes at ``SEQ_LEN`` tokens, and ``CHURN`` of the requests a step finish early
    (chosen at random); as many requests arrive as finished the step before (so that the batch
    shrinks and grows a little and gaps remain to be closed), with prompts of 1 to ``SEQ_LEN / 2``
    tokens. Rows follow vLLM's ``InputBatch``: new requests take the lowest free rows, then the
    highest rows are moved into the gaps left. The first step adds every request.
    """

    def __init__(self, num_reqs: int, block_size: int, seed: int) -> None:
        self.num_reqs = num_reqs
        self.block_size = block_size
        self.max_blocks = SEQ_LEN // block_size
        self._rng = np.random.default_rng(seed)
        self._free = list(range(num_reqs * self.max_blocks * 2, 0, -1))  # block ids, popped
        self._rows: list[list[int] | None] = [None] * num_reqs  # per row: [tokens, *blocks]
        self._arrivals = num_reqs
        self._churn = 0.0

    def _new_request(self) -> list[int]:
        tokens = int(self._rng.integers(1, SEQ_LEN // 2 + 1))
        blocks = -(-tokens // self.block_size)
        return [tokens, *(self._free.pop() for _ in range(blocks))]

    def __iter__(self) -> Iterator[Step]:
        while True:
            yield self.step()

    def step(self) -> Step:
        rows, size = self._rows, self.block_size
        finished: list[int] = []
        appended: list[tuple[int, list[int]]] = []
        running = [row for row, request in enumerate(rows) if request is not None]
        self._churn += CHURN * len(running)
        early = set()
        if self._churn >= 1 and running:
            count = min(int(self._churn), len(running))
            self._churn -= count
            early = set(self._rng.choice(running, size=count, replace=False).tolist())
        for row in running:
            request = rows[row]
            assert request is not None
            if row in early or request[0] >= SEQ_LEN:
                finished.append(row)
                self._free.extend(request[1:])
                rows[row] = None
                continue
            request[0] += 1
            if request[0] > (len(request) - 1) * size:
                block = self._free.pop()
                request.append(block)
                appended.append((row, [block]))
        added: list[tuple[int, list[int]]] = []
        holes = [row for row, request in enumerate(rows) if request is None]
        for row in holes[: self._arrivals]:
            request = self._new_request()
            rows[row] = request
            added.append((row, request[1:]))
        self._arrivals = len(finished)
        moves: list[tuple[int, int]] = []
        holes = [row for row, request in enumerate(rows) if request is None]
        last = len(rows) - 1
        for hole in holes:
            while last > hole and rows[last] is None:
                last -= 1
            if last <= hole:
                break
            rows[hole], rows[last] = rows[last], None
            moves.append((last, hole))
            last -= 1
        num_reqs = sum(request is not None for request in rows)
        return {
            "finished": finished,
            "appended": appended,
            "added": added,
            "moves": moves,
            "num_reqs": num_reqs,
        }


# --- the constructions ----------------------------------------------------------------------------


class _Stepper:
    def receive(self, item: Step) -> Any:
        """What this construction takes of a step off the wire (untimed): the scheduler output
        without its packed message."""
        del item["packed"]
        return item

    def step(self, item: Any) -> None:
        raise NotImplementedError

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host table, device table, counts."""
        raise NotImplementedError


def _row_calls(table: PortBlockTable | VllmBlockTable, item: Step) -> None:
    """One scheduler step as vLLM's worker makes it: per-row calls, then the commit."""
    for row in item["finished"]:
        table.clear_row(row)
    for row, ids in item["appended"]:
        table.append_row(ids, row)
    for row, ids in item["added"]:
        table.add_row(ids, row)
    for src, tgt in item["moves"]:
        table.move_row(src, tgt)
    table.commit_block_table(item["num_reqs"])


class _Port(_Stepper):
    def __init__(self, num_reqs: int, block_size: int) -> None:
        self.table = PortBlockTable(block_size, num_reqs, SEQ_LEN // block_size, num_reqs)

    def step(self, item: Step) -> None:
        _row_calls(self.table, item)

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = self.table
        return t.get_numpy_array(), t.block_table.gpu.numpy(), t.num_blocks_per_row


SEPARATE = [False]
"""Whether the facade keeps a separate CPU copy as its device table (``--separate``)."""


class _PerRow(_Stepper):
    def __init__(self, num_reqs: int, block_size: int) -> None:
        max_blocks = SEQ_LEN // block_size
        self.table = VllmBlockTable(
            block_size, num_reqs, max_blocks, num_reqs, separate=SEPARATE[0]
        )

    def step(self, item: Step) -> None:
        _row_calls(self.table, item)

    def state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = self.table
        return t.get_numpy_array(), t.get_device_tensor().numpy(), t.num_blocks_per_row


class _Batched(_PerRow):
    def step(self, item: Step) -> None:
        self.table.apply_step(
            finished=item["finished"],
            appended=item["appended"],
            added=item["added"],
            moves=item["moves"],
            num_reqs=item["num_reqs"],
        )


class _Packed(_PerRow):
    def receive(self, item: Step) -> Any:
        return item["packed"], item["moves"], item["num_reqs"]

    def step(self, item: Any) -> None:
        message, moves, num_reqs = item
        self.table.apply_packed(message, moves=moves, num_reqs=num_reqs)


MAKERS: dict[str, Callable[[int, int], _Stepper]] = {
    "vllm": _Port,
    "per-row": _PerRow,
    "batched": _Batched,
    "packed": _Packed,
}


def _packed(item: Step, seq: int) -> dict[str, Any]:
    """The step's :mod:`blockprep.packed` message (row: the table row), building on ``seq - 1``:
    a finished row truncated to 0 (unless a request is added into it), appended ids, added rows
    whole."""
    added = dict(item["added"])
    records: list[tuple[int, int, int, list[int]]] = [
        (packed.TRUNCATE_RECORD, 0, row, [0]) for row in item["finished"] if row not in added
    ]
    records += [(packed.APPEND_RECORD, 0, row, ids) for row, ids in item["appended"]]
    records += [(packed.WHOLE_RECORD, 0, row, ids) for row, ids in item["added"]]
    return packed.pack(seq, seq - 1 if seq else None, records)


class MismatchError(RuntimeError):
    """Two constructions hold different tables or counts."""


def _trace(num_reqs: int, block_size: int, steps: int, seed: int) -> list[bytes]:
    """The first step (every request added) and ``steps`` more, each pickled once."""
    trace = SchedulerTrace(num_reqs, block_size, seed)
    items = [trace.step() for _ in range(steps + 1)]
    return [pickle.dumps({**item, "packed": _packed(item, i)}) for i, item in enumerate(items)]


def verify(num_reqs: int, block_size: int, trace: Sequence[bytes]) -> None:
    """Every construction through the whole trace, compared with ``vllm`` after every step: the
    counts, and each row's cells below its count in the host table and (rows below
    ``num_reqs``) in the device table; the facade's cells past the counts must hold 0 (vLLM's may
    hold stale ids: a row moved away from and then added to keeps its old tail)."""
    steppers = {name: make(num_reqs, block_size) for name, make in MAKERS.items()}
    for index, wire in enumerate(trace):
        n = pickle.loads(wire)["num_reqs"]
        for stepper in steppers.values():
            stepper.step(stepper.receive(pickle.loads(wire)))
        host, device, counts = steppers["vllm"].state()
        live = np.arange(host.shape[1])[None, :] < counts[:, None]
        for name, stepper in steppers.items():
            mine_host, mine_device, mine_counts = stepper.state()
            checks = {
                "counts": np.array_equal(mine_counts, counts),
                "host": np.array_equal(mine_host[live], host[live]),
                "device": np.array_equal(mine_device[:n][live[:n]], device[:n][live[:n]]),
                "padding": name == "vllm" or not mine_host[~live].any(),
            }
            for what, ok in checks.items():
                if not ok:
                    raise MismatchError(
                        f"{num_reqs}x{block_size}: {name} {what} differs from vllm at step {index}"
                    )


# --- timing -------------------------------------------------------------------------------------


def time_shape(num_reqs: int, block_size: int, trace: Sequence[bytes]) -> dict[str, list[float]]:
    """Microseconds per step of each construction, interleaved round by round (sorted)."""
    steppers = [MAKERS[name](num_reqs, block_size) for name in CONSTRUCTIONS]
    durations: list[list[float]] = [[] for _ in CONSTRUCTIONS]
    with quiet_process():
        for stepper in steppers:
            stepper.step(stepper.receive(pickle.loads(trace[0])))  # every request added: untimed
        for index, wire in enumerate(trace[1:]):
            for offset in range(len(steppers)):
                lane = (index + offset) % len(steppers)
                item = steppers[lane].receive(pickle.loads(wire))  # a fresh copy: untimed
                start = time.perf_counter_ns()
                steppers[lane].step(item)
                durations[lane].append((time.perf_counter_ns() - start) / 1000)
    return {name: sorted(d) for name, d in zip(CONSTRUCTIONS, durations, strict=True)}


def percentile(durations: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of sorted ``durations``."""
    return durations[min(len(durations) - 1, int(q * len(durations)))]


@dataclass(frozen=True)
class ShapeResult:
    num_reqs: int
    block_size: int
    median_us: dict[str, float]
    p10_us: dict[str, float]
    p90_us: dict[str, float]
    ratio: dict[str, float]
    ratio_range: dict[str, tuple[float, float]]


def measure(
    num_reqs: int, block_size: int, steps: int, runs: int, seed: int, *, check: bool = True
) -> ShapeResult:
    """Check, then time ``runs`` times, one shape."""
    trace = _trace(num_reqs, block_size, steps, seed)
    if check:
        verify(num_reqs, block_size, trace)
    timings = [time_shape(num_reqs, block_size, trace) for _ in range(runs)]
    medians = {name: [statistics.median(t[name]) for t in timings] for name in CONSTRUCTIONS}
    pooled = {name: sorted(d for t in timings for d in t[name]) for name in CONSTRUCTIONS}
    ratios = {
        name: [m / v for m, v in zip(medians[name], medians["vllm"], strict=True)]
        for name in CONSTRUCTIONS[1:]
    }
    return ShapeResult(
        num_reqs,
        block_size,
        median_us={name: statistics.median(m) for name, m in medians.items()},
        p10_us={name: percentile(p, 0.1) for name, p in pooled.items()},
        p90_us={name: percentile(p, 0.9) for name, p in pooled.items()},
        ratio={name: statistics.median(r) for name, r in ratios.items()},
        ratio_range={name: (min(r), max(r)) for name, r in ratios.items()},
    )


def report(results: Sequence[ShapeResult], steps: int, runs: int, seed: int) -> str:
    device = (
        "a separate CPU copy, rows written copied at commit"
        if SEPARATE[0]
        else "the host table itself"
    )
    lines = [
        "vllm: vLLM's table ported (device table: a separate CPU copy, num_reqs rows copied at "
        f"commit); per-row, batched, packed: the facade (device table: {device})",
        f"vLLM facade vs vLLM port: {steps} timed steps a shape, {runs} run(s) (medians of the "
        f"runs' medians; ratios: median over runs of each run's ratio), seed {seed}; one torch "
        f"thread, constructions interleaved round by round, garbage collector off; "
        f"{os.cpu_count()} CPUs",
        "",
        f"{'shape':>9}  {'vllm us (p10-p90)':>20}  {'per-row us (p10-p90)':>21}  {'ratio':>5}  "
        f"{'batched us (p10-p90)':>21}  {'ratio':>5}  {'packed us (p10-p90)':>21}  {'ratio':>5}",
    ]
    for r in results:
        cells = [f"{r.num_reqs}x{r.block_size}".rjust(9)]
        for name in CONSTRUCTIONS:
            spread = f"{r.median_us[name]:.1f} ({r.p10_us[name]:.1f}-{r.p90_us[name]:.1f})"
            cells.append(spread.rjust(20 if name == "vllm" else 21))
            if name != "vllm":
                cells.append(f"{r.ratio[name]:.2f}x".rjust(5))
        lines.append("  ".join(cells))
    missed = [
        f"{r.num_reqs}x{r.block_size} {name} {r.ratio[name]:.2f}x > {target}x"
        for r in results
        for name, target in TARGETS.items()
        if r.ratio[name] > target
    ]
    lines += [
        "",
        "targets: per-row <= 0.5x, batched <= 0.2x of vllm's median in the same run (packed: "
        "reported)",
    ]
    lines.append("missed: " + "; ".join(missed) if missed else "all targets met")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vllm_compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=3000, help="timed steps a shape")
    parser.add_argument("--runs", type=int, default=3, help="repeat each shape's timing N times")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--separate",
        action="store_true",
        help="the facade keeps a separate CPU copy as its device table and copies the rows "
        "written at each commit (default: on CPU its device table is the host table)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        metavar="RxB",
        help="only this shape, e.g. 256x16 (repeatable; default all six)",
    )
    args = parser.parse_args(argv)
    SEPARATE[0] = args.separate
    shapes = SHAPES
    if args.shape:
        shapes = tuple(tuple(int(x) for x in s.split("x")) for s in args.shape)  # type: ignore[misc]
    results = []
    for num_reqs, block_size in shapes:
        print(f"{num_reqs}x{block_size} ...", file=sys.stderr)
        results.append(measure(num_reqs, block_size, args.steps, args.runs, args.seed))
    print(report(results, args.steps, args.runs, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
