"""Benchmarks: a DeepSeek V4 decode step prepared by blockprep against upstream's full rebuild.

Workload: the scheduler simulation of ``blockprep.testing`` (seed-semantics 4.3) with 8 ranks x
decode_batch 8, every rank full (64 requests, 448 table rows, 56 tables), prompts of 300-8000
tokens so that every ring is full and rotating; a request that reaches its length is replaced.
Each step the simulator advances first (untimed, as the scheduler runs just before preparation),
then one of:

- ``pre-fix``: ``reference.deepseek_v4_decode_rebuild(fix=False)`` into persistent buffers:
  upstream before its fix, all 56 tables, ``block_counts`` and the dynamic inputs rebuilt;
- ``fix``: the same with upstream's fix (``fix=True``);
- ``blockprep``: ``DeepSeekV4DecodePreparer.prepare``.

Steady state is timed with one buffer slot and with two slots used in turn (upstream's ping-pong,
where each slot catches up on two steps of changes). Also: a cold first step (a fresh preparer) and
the memory floor of a full rewrite (copying all 56 tables' bytes).

The round-trip cases time what upstream's worker really receives: the simulation of
``blockprep.bench.deepseek_workloads.deepseek_wire_sim`` (prompts of 1-3000 tokens, pools of 4096
pages per group and rank, 0.5% of requests leaving each step and replaced in the same rank), each
batch through a pickle round trip in the untimed setup (new lists of new int objects, as upstream's
msgpack queue delivers them): the steady step with two slots used in turn, and the cold first step.

Before timing, blockprep's buffers are compared with the reference rebuild after every warm-up step
(and again after timing), and the two reference variants with each other. ``extra_info`` records
rows and cells written.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from blockprep.adapters.deepseek import (
    GROUP_NAMES,
    INPUT_FIELDS,
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.batch import DecodeBatch
from blockprep.bench.deepseek_workloads import WIRE_LAYOUT, deepseek_steady_sim, deepseek_wire_sim
from blockprep.reference import deepseek_v4_decode_rebuild
from blockprep.testing import DeepSeekV4SchedulerSim

RANKS, BATCH = 8, 8
WARMUP, STEPS, COLD_ROUNDS = 100, 300, 30
SEED = 2026
SHAPE = f"{RANKS} ranks x {BATCH} rows, 56 tables"
STEADY = {1: f"deepseek v4 steady step: {SHAPE}, one buffer slot"}
STEADY[2] = f"deepseek v4 steady step: {SHAPE}, two ping-pong slots"
COLD = f"deepseek v4 cold first step: {SHAPE}"
WIRE = (
    f"deepseek v4 steady step after a pickle round trip: {SHAPE}, two ping-pong slots, 0.5% churn"
)
WIRE_COLD = f"deepseek v4 cold first step after a pickle round trip: {SHAPE}, 0.5% churn"
FLOOR = f"deepseek v4 memory floor: copy all 56 tables' bytes ({SHAPE})"


def simulator(**options: Any) -> DeepSeekV4SchedulerSim:
    return deepseek_steady_sim(SEED, **options)


LAYOUT = DeepSeekV4Layout(ranks=RANKS, decode_batch=BATCH, num_blocks=simulator().num_blocks)
TABLE_CELLS = RANKS * BATCH * sum(g.width for g in LAYOUT.groups)


def rebuild(
    batch: DecodeBatch,
    *,
    fix: bool,
    out: dict[str, torch.Tensor] | None = None,
    layout: DeepSeekV4Layout = LAYOUT,
) -> Any:
    return deepseek_v4_decode_rebuild(
        batch,
        ranks=RANKS,
        decode_batch=BATCH,
        decode_seq=1,
        num_blocks=layout.num_blocks,
        fix=fix,
        out=out,
    )


def round_trip(batch: DecodeBatch) -> DecodeBatch:
    """The batch as upstream's worker receives it: new lists of new int objects."""
    batch = pickle.loads(pickle.dumps(batch))
    assert isinstance(batch, DecodeBatch)
    return batch


def written(preparer: DeepSeekV4DecodePreparer) -> tuple[int, int] | None:
    """Rows and cells written so far into every slot, from the preparer's table counters
    (``None`` if it keeps none)."""
    table_stats = getattr(preparer, "table_stats", None)
    if table_stats is None:
        return None
    stats = [s for slot in range(preparer.buffer_slots) for s in table_stats(slot).values()]
    return sum(s.misses for s in stats), sum(s.cells_written for s in stats)


def record_written(
    benchmark: Any, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> None:
    """Rows and cells written per timed step (nothing is recorded without counters)."""
    if before is not None and after is not None:
        benchmark.extra_info["rows_written_per_step"] = (after[0] - before[0]) / STEPS
        benchmark.extra_info["cells_written_per_step"] = (after[1] - before[1]) / STEPS


def assert_equal(inputs: DeepSeekV4DecodeInputs, expected: dict[str, torch.Tensor]) -> None:
    for name in GROUP_NAMES:
        assert torch.equal(inputs.tables[name], expected[name]), name
    for name in INPUT_FIELDS:
        assert torch.equal(getattr(inputs, name), expected[name]), name


def steps(
    sim: DeepSeekV4SchedulerSim, slots: int
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    step = 0
    while True:
        yield (sim.step(), step % slots), {}
        step += 1


def reference_step(
    fix: bool, layout: DeepSeekV4Layout = LAYOUT
) -> Callable[[DecodeBatch, int], None]:
    """Upstream's step: rebuild everything into the slot's persistent buffers."""
    buffers = [rebuild(simulator().step(), fix=fix, layout=layout) for _ in range(2)]

    def step(batch: DecodeBatch, slot: int) -> None:
        rebuild(batch, fix=fix, out=buffers[slot], layout=layout)

    return step


def test_reference_variants_agree() -> None:
    """Not a benchmark: upstream's pre-fix and fix rebuilds are equal on the trace."""
    sim = simulator()
    for _ in range(20):
        batch = sim.step()
        before, after = rebuild(batch, fix=False), rebuild(batch, fix=True)
        assert all(torch.equal(before[name], after[name]) for name in before)


@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("impl", ["pre-fix", "fix", "blockprep"])
def test_steady_step(benchmark: Any, impl: str, slots: int) -> None:
    benchmark.group = STEADY[slots]
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["table_cells"] = TABLE_CELLS
    sim = simulator()
    if impl == "blockprep":
        preparer = DeepSeekV4DecodePreparer(LAYOUT)
        for step in range(WARMUP):  # checked against the reference after every step
            batch = sim.step()
            assert_equal(
                preparer.prepare(batch, buffer_slot=step % slots), rebuild(batch, fix=True)
            )
        before = written(preparer)

        def target(batch: DecodeBatch, slot: int) -> Any:
            return preparer.prepare(batch, buffer_slot=slot)

    else:
        for _ in range(WARMUP):
            sim.step()
        target = reference_step(impl == "fix")  # type: ignore[assignment]
    setup = steps(sim, slots)
    last: dict[int, DecodeBatch] = {}

    def remember(batch: DecodeBatch, slot: int) -> Any:
        last[slot] = batch
        return target(batch, slot)

    benchmark.pedantic(remember, setup=lambda: next(setup), rounds=STEPS, warmup_rounds=0)
    if impl == "blockprep":
        record_written(benchmark, before, written(preparer))
        # The live lists moved on since; a fresh step of each slot must still match.
        for slot in range(slots):
            batch = sim.step()
            assert_equal(preparer.prepare(batch, buffer_slot=slot), rebuild(batch, fix=True))
    else:
        benchmark.extra_info["rows_written_per_step"] = RANKS * BATCH * len(GROUP_NAMES)
        benchmark.extra_info["cells_written_per_step"] = TABLE_CELLS


@pytest.mark.parametrize("impl", ["pre-fix", "fix", "blockprep"])
def test_cold_first_step(benchmark: Any, impl: str) -> None:
    """The first step of a fresh preparer (every row checked and written) at steady state."""
    benchmark.group = COLD
    benchmark.extra_info["impl"] = impl
    sim = simulator(fresh_lists=True)
    for _ in range(WARMUP):
        batch = sim.step()
    expected = rebuild(batch, fix=False)
    if impl == "blockprep":
        assert_equal(DeepSeekV4DecodePreparer(LAYOUT).prepare(batch), expected)

        def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (DeepSeekV4DecodePreparer(LAYOUT), batch), {}

        def cold(preparer: DeepSeekV4DecodePreparer, batch: DecodeBatch) -> Any:
            return preparer.prepare(batch)

        benchmark.pedantic(cold, setup=fresh, rounds=COLD_ROUNDS, warmup_rounds=1)
    else:
        out = rebuild(batch, fix=impl == "fix")
        assert all(torch.equal(out[name], expected[name]) for name in expected)
        benchmark.pedantic(
            lambda: rebuild(batch, fix=impl == "fix", out=out),
            rounds=COLD_ROUNDS,
            warmup_rounds=1,
        )
    benchmark.extra_info["table_cells"] = TABLE_CELLS
    benchmark.extra_info["cells_written_per_step"] = TABLE_CELLS


def wire_simulator() -> DeepSeekV4SchedulerSim:
    """The round-trip workload's scheduler, after ``WARMUP`` steps."""
    sim = deepseek_wire_sim(SEED)
    for _ in range(WARMUP):
        sim.step()
    return sim


@pytest.mark.parametrize("impl", ["pre-fix", "fix", "blockprep"])
def test_round_trip_steady_step(benchmark: Any, impl: str) -> None:
    """Two slots in turn (``buffer_slot = step % 2``); only the prepare call is timed, the
    scheduler's step and the round trip run in the setup."""
    benchmark.group = WIRE
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["table_cells"] = TABLE_CELLS
    sim = wire_simulator()
    if impl == "blockprep":
        preparer = DeepSeekV4DecodePreparer(WIRE_LAYOUT, buffer_slots=2)
        for step in range(WARMUP):  # checked against the reference after every step
            batch = round_trip(sim.step())
            expected = rebuild(batch, fix=True, layout=WIRE_LAYOUT)
            assert_equal(preparer.prepare(batch, buffer_slot=step % 2), expected)
        before = written(preparer)

        def target(batch: DecodeBatch, slot: int) -> Any:
            return preparer.prepare(batch, buffer_slot=slot)

    else:
        target = reference_step(impl == "fix", WIRE_LAYOUT)  # type: ignore[assignment]
    counter = itertools.count()

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (round_trip(sim.step()), next(counter) % 2), {}

    benchmark.pedantic(target, setup=setup, rounds=STEPS, warmup_rounds=0)
    if impl == "blockprep":
        record_written(benchmark, before, written(preparer))
        for slot in range(2):  # a fresh step of each slot must still match
            batch = round_trip(sim.step())
            expected = rebuild(batch, fix=True, layout=WIRE_LAYOUT)
            assert_equal(preparer.prepare(batch, buffer_slot=slot), expected)
    else:
        benchmark.extra_info["rows_written_per_step"] = RANKS * BATCH * len(GROUP_NAMES)
        benchmark.extra_info["cells_written_per_step"] = TABLE_CELLS


@pytest.mark.parametrize("impl", ["pre-fix", "fix", "blockprep"])
def test_round_trip_cold_first_step(benchmark: Any, impl: str) -> None:
    """The first step of a fresh two-slot preparer on a round-tripped batch (each round its own
    round trip and preparer, made in the setup)."""
    benchmark.group = WIRE_COLD
    benchmark.extra_info["impl"] = impl
    batch = wire_simulator().step()
    expected = rebuild(batch, fix=False, layout=WIRE_LAYOUT)
    if impl == "blockprep":

        def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (DeepSeekV4DecodePreparer(WIRE_LAYOUT, buffer_slots=2), round_trip(batch)), {}

        def cold(preparer: DeepSeekV4DecodePreparer, batch: DecodeBatch) -> Any:
            return preparer.prepare(batch, buffer_slot=0)

        assert_equal(cold(*fresh()[0]), expected)
        benchmark.pedantic(cold, setup=fresh, rounds=COLD_ROUNDS, warmup_rounds=1)
    else:
        fix = impl == "fix"
        out = rebuild(batch, fix=fix, layout=WIRE_LAYOUT)
        assert all(torch.equal(out[name], expected[name]) for name in expected)
        benchmark.pedantic(
            lambda batch: rebuild(batch, fix=fix, out=out, layout=WIRE_LAYOUT),
            setup=lambda: ((round_trip(batch),), {}),
            rounds=COLD_ROUNDS,
            warmup_rounds=1,
        )
    benchmark.extra_info["table_cells"] = TABLE_CELLS
    benchmark.extra_info["cells_written_per_step"] = TABLE_CELLS


def test_memory_floor(benchmark: Any) -> None:
    """Copying every byte of the 56 tables once: the floor of any full rewrite."""
    benchmark.group = FLOOR
    benchmark.extra_info["impl"] = "memcpy"
    source = rebuild(simulator().step(), fix=True)
    destination = {name: torch.empty_like(source[name]) for name in GROUP_NAMES}

    def copy() -> None:
        for name in GROUP_NAMES:
            destination[name].copy_(source[name])

    benchmark(copy)
    assert all(torch.equal(destination[name], source[name]) for name in GROUP_NAMES)
    benchmark.extra_info["table_cells"] = TABLE_CELLS
    benchmark.extra_info["cells_written_per_step"] = TABLE_CELLS
