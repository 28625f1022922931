"""The DeepSeek V4 benchmark workloads: 8 ranks x 8 rows, 56 tables (7 KV groups x 8 ranks),
live lists on one slot, and the wire (a pickle round trip, churn, two buffer slots in turn) by
value, by delta and cold; each against upstream's rebuild before and after its fix."""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.deepseek import (
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.batch import DecodeBatch
from blockprep.bench.base import FullRewrite, Stepper, Workload
from blockprep.simulation import DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder

DS_RANKS, DS_BATCH, DS_WARMUP = 8, 8, 100
DS_SHAPE = f"{DS_RANKS} ranks x {DS_BATCH} rows, 56 tables"


class DeepSeekStep(NamedTuple):
    """One DeepSeek V4 step input: the batch and the buffer slot it is prepared into."""

    batch: DecodeBatch
    slot: int


class DeepSeekWireStep(NamedTuple):
    """One DeepSeek V4 step as the wire carries it: the batch pickled, the slot, and ``delta``:
    the same batch carrying a :mod:`blockprep.wire` message instead of its block lists, pickled
    on its own (``None`` where the trace sends none)."""

    batch: bytes
    slot: int
    delta: bytes | None = None


def _receive(item: DeepSeekStep | DeepSeekWireStep, delta: bool = False) -> DeepSeekStep:
    """A wire step's batch (``delta``: its delta batch) unpickled; a live step as it is."""
    if isinstance(item, DeepSeekStep):
        return item
    payload = item.delta if delta else item.batch
    assert payload is not None
    return DeepSeekStep(pickle.loads(payload), item.slot)


def deepseek_steady_sim(seed: int, **options: Any) -> DeepSeekV4SchedulerSim:
    """8 ranks x 8 requests, every rank full, prompts long enough that every ring is full and
    rotating; a request leaves only at its target length and is replaced. ``options``: more
    :class:`DeepSeekV4SchedulerSim` arguments (``fresh_lists``, ...)."""
    return DeepSeekV4SchedulerSim(
        ranks=DS_RANKS,
        decode_batch=DS_BATCH,
        seed=seed,
        join_probability=1.0,
        leave_probability=0.0,
        prompt_lengths=(300, 8000),
        **options,
    )


DS_LAYOUT = DeepSeekV4Layout(
    ranks=DS_RANKS, decode_batch=DS_BATCH, num_blocks=deepseek_steady_sim(0).num_blocks
)

WIRE_POOL, WIRE_SLOTS, WIRE_CHURN, WIRE_PROMPTS = 4096, 2, 0.005, (1, 3000)
WIRE_LAYOUT = DeepSeekV4Layout(
    ranks=DS_RANKS,
    decode_batch=DS_BATCH,
    num_blocks={name: WIRE_POOL for name in DS_LAYOUT.num_blocks},
)


def deepseek_wire_sim(seed: int) -> DeepSeekV4SchedulerSim:
    """8 ranks x 8 requests, prompts of 1-3000 tokens, pools of 4096 pages per group and rank;
    each request leaves with probability 0.5% a step (or at its target length) and is replaced in
    the same rank in the same step, so every rank stays full."""
    return DeepSeekV4SchedulerSim(
        ranks=DS_RANKS,
        decode_batch=DS_BATCH,
        seed=seed,
        num_blocks=dict(WIRE_LAYOUT.num_blocks),
        join_probability=1.0,
        leave_probability=WIRE_CHURN,
        prompt_lengths=WIRE_PROMPTS,
    )


def deepseek_trace(steps: int, seed: int) -> Iterator[DeepSeekStep]:
    """``steps + 1`` consecutive batches of :func:`deepseek_steady_sim` after ``DS_WARMUP``
    steps, on the scheduler's live lists, all into slot 0."""
    sim = deepseek_steady_sim(seed)
    for _ in range(DS_WARMUP):
        sim.step()
    for _ in range(steps + 1):
        yield DeepSeekStep(sim.step(), 0)


def deepseek_wire_trace(steps: int, seed: int) -> Iterator[DeepSeekWireStep]:
    """``steps + 1`` consecutive batches of :func:`deepseek_wire_sim` after ``DS_WARMUP`` steps,
    each pickled (each construction unpickles it into new lists of new int objects, as upstream's
    msgpack queue delivers them, untimed in its :meth:`Stepper.receive`), step ``k`` into slot
    ``k % 2``."""
    sim = deepseek_wire_sim(seed)
    for _ in range(DS_WARMUP):
        sim.step()
    for index in range(steps + 1):
        yield DeepSeekWireStep(pickle.dumps(sim.step()), index % WIRE_SLOTS)


def deepseek_wire_delta_trace(steps: int, seed: int) -> Iterator[DeepSeekWireStep]:
    """:func:`deepseek_wire_trace`'s batches, each also encoded on the scheduler side by a
    :class:`~blockprep.wire.BlockDeltaEncoder` into a batch carrying only what changed, pickled
    on its own: the rebuilds unpickle the full batch, blockprep only the delta one."""
    sim = deepseek_wire_sim(seed)
    encoder = BlockDeltaEncoder()
    for _ in range(DS_WARMUP):
        sim.step()
    for index in range(steps + 1):
        batch = sim.step()
        message = encoder.encode(batch.request_ids, batch.block_ids_by_group)
        delta = dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message)
        yield DeepSeekWireStep(pickle.dumps(batch), index % WIRE_SLOTS, pickle.dumps(delta))


def _idle_batch(layout: DeepSeekV4Layout) -> DecodeBatch:
    """One request on rank 0 holding page 0 of every group: a rebuild of it writes every cell."""
    return DecodeBatch(
        request_ids=["idle"],
        token_ids=torch.tensor([0]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids_by_group=[{group.name: [0] for group in layout.groups}],
        cache_partitions=[0],
    )


def _deepseek_rebuild(
    layout: DeepSeekV4Layout,
    batch: DecodeBatch,
    out: dict[str, torch.Tensor] | None,
    *,
    fix: bool,
) -> dict[str, torch.Tensor]:
    """``reference.deepseek_v4_decode_rebuild`` of ``batch`` for ``layout``."""
    return reference.deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        fix=fix,
        out=out,
    )


@functools.cache
def _rebuild_template(layout: DeepSeekV4Layout) -> dict[str, torch.Tensor]:
    """A slot's buffers for ``layout``, every cell written (never handed out: copy it)."""
    return _deepseek_rebuild(layout, _idle_batch(layout), None, fix=True)


class _DeepSeekRebuildStepper(FullRewrite):
    """Upstream's step: every table and input rebuilt into the slot's persistent buffers, which
    are allocated and written at construction (as upstream allocates them at start-up), so a
    cold step pays no allocation or first-touch page faults."""

    def __init__(self, layout: DeepSeekV4Layout, slots: int, *, fix: bool) -> None:
        super().__init__(
            layout.ranks * layout.decode_batch * len(layout.groups), _table_cells(layout)
        )
        self._layout = layout
        self._fix = fix
        template = _rebuild_template(layout)
        self._out = [{name: t.clone() for name, t in template.items()} for _ in range(slots)]
        self._slot = 0

    def receive(self, item: DeepSeekStep | DeepSeekWireStep) -> DeepSeekStep:
        return _receive(item)

    def _prepare(self, item: DeepSeekStep) -> None:
        _deepseek_rebuild(self._layout, item.batch, self._out[item.slot], fix=self._fix)
        self._slot = item.slot

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: tensor.numpy() for name, tensor in self._out[self._slot].items()}


class _DeepSeekStepper(Stepper):
    """``DeepSeekV4DecodePreparer.prepare`` into the step's slot; :meth:`buffers` are the views
    of the slot last prepared."""

    def __init__(self, layout: DeepSeekV4Layout, slots: int) -> None:
        self.preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=slots)
        self.slots = slots
        self.inputs: DeepSeekV4DecodeInputs | None = None

    def receive(self, item: DeepSeekStep | DeepSeekWireStep) -> DeepSeekStep:
        return _receive(item)

    def step(self, item: DeepSeekStep) -> None:
        self.inputs = self.preparer.prepare(item.batch, buffer_slot=item.slot)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        assert self.inputs is not None
        return {name: tensor.numpy() for name, tensor in self.inputs.buffers().items()}

    def written(self) -> tuple[int, int] | None:
        """Rows and cells written into every slot, from the preparer's per-group table counters
        (``misses``, ``cells_written``); ``None`` if it keeps no such counters."""
        table_stats = getattr(self.preparer, "table_stats", None)
        if table_stats is None:
            return None
        stats = [s for k in range(self.slots) for s in table_stats(k).values()]
        try:
            return sum(s.misses for s in stats), sum(s.cells_written for s in stats)
        except AttributeError:
            return None


class _DeepSeekDeltaStepper(_DeepSeekStepper):
    """The preparer fed each step's delta batch (``DeepSeekWireStep.delta``, the only payload it
    unpickles)."""

    def receive(self, item: DeepSeekStep | DeepSeekWireStep) -> DeepSeekStep:
        return _receive(item, delta=True)


def _table_cells(layout: DeepSeekV4Layout) -> int:
    return layout.ranks * layout.decode_batch * sum(group.width for group in layout.groups)


def _deepseek_workload(
    name: str,
    description: str,
    trace: Callable[[int, int], Iterator[DeepSeekStep | DeepSeekWireStep]],
    layout: DeepSeekV4Layout,
    slots: int,
    *,
    cold: bool,
    delta: bool = False,
) -> Workload:
    stepper = _DeepSeekDeltaStepper if delta else _DeepSeekStepper
    return Workload(
        name,
        f"{description}: {DS_SHAPE}",
        trace,
        {
            "pre-fix": lambda: _DeepSeekRebuildStepper(layout, slots, fix=False),
            "fix": lambda: _DeepSeekRebuildStepper(layout, slots, fix=True),
            "blockprep": lambda: stepper(layout, slots),
        },
        layout.ranks * layout.decode_batch * len(layout.groups),
        _table_cells(layout),
        cold=cold,
    )


WIRE_CONDITIONS = (
    "pickle round trip (new lists of new ints), 2 slots in turn, 0.5% churn a request and step, "
    "prompts 1-3000, pools 4096"
)
LIVE_CONDITIONS = "live lists (the scheduler's own objects), 1 slot, no churn, prompts 300-8000"


def deepseek_workloads() -> list[Workload]:
    """The round-trip workloads first (what upstream's worker receives), then the live-list
    ones."""
    return [
        _deepseek_workload(
            "deepseek-v4-wire-delta",
            f"DeepSeek V4 steady step, block lists sent as deltas, {WIRE_CONDITIONS}",
            deepseek_wire_delta_trace,
            WIRE_LAYOUT,
            WIRE_SLOTS,
            cold=False,
            delta=True,
        ),
        _deepseek_workload(
            "deepseek-v4-wire",
            f"DeepSeek V4 steady step, {WIRE_CONDITIONS}",
            deepseek_wire_trace,
            WIRE_LAYOUT,
            WIRE_SLOTS,
            cold=False,
        ),
        _deepseek_workload(
            "deepseek-v4-wire-cold",
            f"DeepSeek V4 first step of a fresh preparer, {WIRE_CONDITIONS}",
            deepseek_wire_trace,
            WIRE_LAYOUT,
            WIRE_SLOTS,
            cold=True,
        ),
        _deepseek_workload(
            "deepseek-v4-steady",
            f"DeepSeek V4 steady step, {LIVE_CONDITIONS}",
            deepseek_trace,
            DS_LAYOUT,
            1,
            cold=False,
        ),
        _deepseek_workload(
            "deepseek-v4-cold",
            f"DeepSeek V4 first step of a fresh preparer, {LIVE_CONDITIONS}",
            deepseek_trace,
            DS_LAYOUT,
            1,
            cold=True,
        ),
    ]
