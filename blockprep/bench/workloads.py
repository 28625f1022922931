"""The standard benchmark workloads: each a trace of step inputs and three ways to prepare them.

A workload's constructions are upstream's before its fix (``pre-fix``), upstream's fix (``fix``)
and blockprep (``blockprep``), all fed the same precomputed trace. Every construction is a
:class:`Stepper`: it receives one step's input (untimed; on the wire workloads the trace carries
pickled bytes and each construction unpickles only the payload it consumes), prepares it and
exposes the buffers it wrote, so the runner can check that all three agree cell for cell before
it times anything, and counts what it wrote.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import pickle
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.deepseek import (
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.block_table import BlockTable
from blockprep.builders import paged_block_table, ring_block_table
from blockprep.simulation import DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder

CONSTRUCTIONS = ("pre-fix", "fix", "blockprep")


class Stepper(Protocol):
    """One construction of one workload, with its own persistent buffers."""

    def receive(self, item: Any) -> Any:
        """What :meth:`step` is given for the trace's ``item``, made just before it and untimed:
        the transfer, not the preparation (on the wire workloads, the payload this construction
        consumes, unpickled); ``item`` itself by default."""
        return item

    def step(self, item: Any) -> None:
        """Prepare one step's input (what :meth:`receive` made of the trace's item)."""

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        """The buffers the step wrote, by name, as NumPy arrays (views, not copies)."""

    def written(self) -> tuple[int, int] | None:
        """``(rows, cells)`` of tables written so far, or ``None`` if the construction cannot
        count them (the bench then reports no figure)."""


@dataclass(frozen=True)
class Workload:
    """A benchmark workload.

    ``trace(steps, seed)`` yields ``steps + 1`` step inputs, lazily, as a scheduler would: the
    same sequence on every call, each input made just before it is prepared (and it may be
    mutated once the next one is made, like a scheduler's live page lists); every construction
    gets a trace of its own, and :meth:`Stepper.receive` makes its step's input from each item.
    The first input warms the constructions up and is not timed, unless
    ``cold``, where every timed step runs on a fresh construction. ``rows`` and ``cells`` are the
    block-table rows and cells one full rewrite writes (the memory floor is the time to copy
    ``cells`` int32 values). ``description`` names the conditions the workload assumes.
    """

    name: str
    description: str
    trace: Callable[[int, int], Iterator[Any]]
    constructions: Mapping[str, Callable[[], Stepper]]
    rows: int
    cells: int
    cold: bool = False
    quick: bool = True


class _FullRewrite(Stepper, abc.ABC):
    """A construction that rewrites every table row and cell each step: ``rows`` and ``cells``
    a step, counted by :meth:`step` around the subclass's :meth:`_prepare`."""

    def __init__(self, rows: int, cells: int) -> None:
        self._size = rows, cells
        self._steps = 0

    def step(self, item: Any) -> None:
        self._prepare(item)
        self._steps += 1

    @abc.abstractmethod
    def _prepare(self, item: Any) -> None:
        """Prepare one step's input."""

    def written(self) -> tuple[int, int] | None:
        rows, cells = self._size
        return rows * self._steps, cells * self._steps


# --- builders: one table per step, rebuilt whole -----------------------------------------------


class _BuilderStepper(_FullRewrite):
    """A stateless builder rebuilding the whole table from the step's rows (``wire``: each item
    the rows pickled, unpickled by :meth:`receive`)."""

    def __init__(
        self,
        build: Callable[[Any, torch.Tensor], torch.Tensor],
        shape: tuple[int, int],
        wire: bool = False,
    ):
        super().__init__(shape[0], shape[0] * shape[1])
        self._build = build
        self._out = torch.empty(shape, dtype=torch.int32)
        self._wire = wire

    def receive(self, item: Any) -> Any:
        return pickle.loads(item) if self._wire else item

    def _prepare(self, item: Any) -> None:
        self._build(item, self._out)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {"table": self._out.numpy()}


def _same_rows(rows: int, lengths: Callable[[random.Random], int]) -> Callable[[int, int], Any]:
    def trace(steps: int, seed: int) -> Iterator[list[list[int]]]:
        rng = random.Random(seed)
        table = [rng.sample(range(100_000), lengths(rng)) for _ in range(rows)]
        for _ in range(steps + 1):
            yield table

    return trace


def _rebuild(
    builder: Callable[..., torch.Tensor], rows: int, width: int, wire: bool = False
) -> Callable[[], Stepper]:
    """An upstream builder as upstream used it: build the table, copy it into the buffer."""
    return lambda: _BuilderStepper(
        lambda ids, out: out.copy_(builder(ids, max_blocks=width)), (rows, width), wire
    )


_BUILDERS: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor], Any]] = {
    "ring": (
        reference.ring_block_table_repeat,
        reference.ring_block_table_gather,
        ring_block_table,
    ),
    "paged": (reference.block_table_per_row, reference.block_table_one_tensor, paged_block_table),
}
"""Per table kind: upstream's builder before its fix, after it, and blockprep's."""


def _builder_workload(
    name: str, kind: str, rows: int, width: int, lengths: Callable[[random.Random], int], what: str
) -> Workload:
    pre_fix, fix, ours = _BUILDERS[kind]
    constructions = {
        "pre-fix": _rebuild(pre_fix, rows, width),
        "fix": _rebuild(fix, rows, width),
        "blockprep": lambda: _BuilderStepper(
            lambda ids, out: ours(ids, width, out=out), (rows, width)
        ),
    }
    return Workload(name, what, _same_rows(rows, lengths), constructions, rows, rows * width)


# --- BlockTable: a ring table kept across steps ---------------------------------------------------


def ring_rotation_trace(
    rows: int,
    ring: int,
    steps: int,
    seed: int,
    *,
    rotate: bool = True,
    ordered: bool = True,
    wire: bool = False,
) -> Iterator[list[list[int]] | bytes]:
    """``steps + 1`` states of ``rows`` ring rows of ``ring`` ids (live lists, rotated in place):
    step s rotates one slot of each row r with ``(r + s) % 4 == 0`` to a fresh page from a free
    queue, in slot order (``ordered=False``: a slot drawn at random, never the one after the
    slot that rotated last, as a scheduler that rotates out of order); with ``rotate=False``
    nothing changes between steps. ``wire``: each state pickled (bytes), for each construction
    to unpickle into new lists of new ints (untimed, in its :meth:`Stepper.receive`)."""
    rng = random.Random(seed)
    pool = list(range(rows * ring * 4))
    rng.shuffle(pool)
    table = [[pool.pop() for _ in range(ring)] for _ in range(rows)]
    free = collections.deque(pool)
    next_slot = [0] * rows
    yield pickle.dumps(table) if wire else table
    for step in range(1, steps + 1):
        for r in range(rows):
            if rotate and (r + step) % 4 == 0:
                slot = next_slot[r]
                if not ordered:
                    slot = (slot + rng.randrange(1, ring)) % ring
                free.append(table[r][slot])
                table[r][slot] = free.popleft()
                next_slot[r] = (slot + 1) % ring
        yield pickle.dumps(table) if wire else table


class _BlockTableStepper(Stepper):
    def __init__(self, rows: int, width: int, wire: bool = False) -> None:
        self.table = BlockTable(rows, width, kind="ring")
        self._wire = wire

    def receive(self, item: Any) -> Any:
        return pickle.loads(item) if self._wire else item

    def step(self, item: Any) -> None:
        self.table.write_rows(item)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {"table": self.table.numpy()}

    def written(self) -> tuple[int, int] | None:
        stats = self.table.stats
        return stats.misses, stats.cells_written


def _block_table_workload(
    rows: int,
    width: int,
    ring: int,
    *,
    idle: bool = False,
    ordered: bool = True,
    wire: bool = False,
) -> Workload:
    what = "no row changes" if idle else "1/4 of rows rotate one slot per step"
    suffix = ("-wire" if wire else "") + ("-idle" if idle else "" if ordered else "-unordered")
    if not ordered:
        what += ", a slot other than the next one"
    if wire:
        what += ", pickle round trip (new lists of new ints)"
    return Workload(
        f"blocktable-ring-{rows}x{width}{suffix}",
        f"BlockTable, ring {rows}x{width} n={ring}: {what}",
        lambda steps, seed: ring_rotation_trace(
            rows, ring, steps, seed, rotate=not idle, ordered=ordered, wire=wire
        ),
        {
            "pre-fix": _rebuild(reference.ring_block_table_repeat, rows, width, wire),
            "fix": _rebuild(reference.ring_block_table_gather, rows, width, wire),
            "blockprep": lambda: _BlockTableStepper(rows, width, wire),
        },
        rows,
        rows * width,
    )


# --- Qwen3-14B decode preparation -----------------------------------------------------------------

QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD = 16, 4096, 128, 8
QWEN_WIDTH = -(-QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE)


def qwen_trace(steps: int, seed: int) -> Iterator[DecodeBatch]:
    """B=16 requests around sequence length 3338 decoding together, a page appended to a
    request's live list every 128 tokens (upstream PR #97's benchmark shape)."""
    rng = random.Random(seed)
    free = list(range(QWEN_BATCH * QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE))
    rng.shuffle(free)
    seq_lens = [3338 + rng.randrange(-200, 200) for _ in range(QWEN_BATCH)]
    pages = [[free.pop() for _ in range(-(-s // QWEN_PAGE_SIZE))] for s in seq_lens]
    request_ids = [f"r{i}" for i in range(QWEN_BATCH)]
    for _ in range(steps + 1):
        yield DecodeBatch(
            request_ids=request_ids,
            token_ids=torch.tensor([rng.randrange(151_000) for _ in range(QWEN_BATCH)]),
            hidden_states=None,
            seq_lens=torch.tensor(seq_lens),
            block_ids=pages,
        )
        for i in range(QWEN_BATCH):
            seq_lens[i] += 1
            if (seq_lens[i] - 1) // QWEN_PAGE_SIZE >= len(pages[i]):
                pages[i].append(free.pop())


_QWEN_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class _QwenReferenceStepper(_FullRewrite):
    def __init__(self, prep: reference.QwenDecodeBuffers) -> None:
        super().__init__(QWEN_BATCH, QWEN_BATCH * QWEN_WIDTH)
        self.prep = prep

    def _prepare(self, item: Any) -> None:
        self.prep.prepare(item)  # type: ignore[attr-defined]

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self.prep, name).numpy() for name in _QWEN_BUFFERS}


class _QwenStepper(Stepper):
    def __init__(self) -> None:
        self.preparer = QwenDecodePreparer(QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)

    def step(self, item: Any) -> None:
        self._last = self.preparer.prepare(item)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self._last, name).numpy() for name in _QWEN_BUFFERS}

    def written(self) -> tuple[int, int] | None:
        stats = self.preparer.block_table.stats
        return stats.misses, stats.cells_written


def _qwen_workload() -> Workload:
    args = (QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
    return Workload(
        "qwen3-14b",
        f"Qwen3-14B decode prepare: B={QWEN_BATCH}, seq ~3338, page {QWEN_PAGE_SIZE}, live lists",
        qwen_trace,
        {
            "pre-fix": lambda: _QwenReferenceStepper(reference.QwenDecodePrepBefore(*args)),
            "fix": lambda: _QwenReferenceStepper(reference.QwenDecodePrep97(*args)),
            "blockprep": _QwenStepper,
        },
        QWEN_BATCH,
        QWEN_BATCH * QWEN_WIDTH,
    )


# --- DeepSeek V4 decode preparation ---------------------------------------------------------------

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


class _DeepSeekRebuildStepper(_FullRewrite):
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


def _deepseek_workloads() -> list[Workload]:
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


def _fixed(n: int) -> Callable[[random.Random], int]:
    return lambda rng: n


def standard_workloads() -> dict[str, Workload]:
    """Every standard workload by name, in the order the bench command runs them: the DeepSeek V4
    round-trip workloads (the batches upstream's worker really receives) lead."""
    mixed_ring: Callable[[random.Random], int] = lambda rng: rng.randint(1, 65)  # noqa: E731
    mixed_paged: Callable[[random.Random], int] = lambda rng: rng.randint(1, 30)  # noqa: E731
    workloads = [
        *_deepseek_workloads(),
        _qwen_workload(),
        _block_table_workload(64, 4096, 65),
        _block_table_workload(64, 4096, 65, ordered=False),
        _block_table_workload(64, 4096, 65, idle=True),
        _block_table_workload(64, 4096, 65, wire=True),
        _block_table_workload(64, 4096, 65, ordered=False, wire=True),
        _block_table_workload(64, 4096, 65, idle=True, wire=True),
        _builder_workload(
            "ring-64x4096-n65", "ring", 64, 4096, _fixed(65), "ring_block_table 64x4096, n=65"
        ),
        _builder_workload(
            "ring-8x4096-n65", "ring", 8, 4096, _fixed(65), "ring_block_table 8x4096, n=65"
        ),
        _builder_workload(
            "ring-64x4096-mixed",
            "ring",
            64,
            4096,
            mixed_ring,
            "ring_block_table 64x4096, lengths 1..65",
        ),
        _builder_workload(
            "paged-8x128-mixed", "paged", 8, 128, mixed_paged, "paged_block_table 8x128, 1..30 ids"
        ),
    ]
    from blockprep.bench.qwen_workloads import qwen_wire_workloads  # it imports this module

    workloads += qwen_wire_workloads()
    return {workload.name: workload for workload in workloads}
