"""DeepSeek V4 preparer in upstream's life cycle (issue 11 item 3): adopted buffers, pool sizes
bound after allocation, early prepare and re-stage, one lock per slot, dirty ranks, outputs in
batch order, MTP target chunks (k >= 2), and the real transport: shared buffers read by a forked
child. Every buffer is checked against blockprep.reference.deepseek_v4_decode_rebuild."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from blockprep.adapters.deepseek import (
    PARTITIONS_MESSAGE,
    REQUEST_ORDER_MESSAGE,
    UNBOUND,
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
    SlotBusyError,
    deepseek_v4_decode_layout,
)
from blockprep.adapters.deepseek.abi import (
    GROUP_ARGUMENTS,
    PREPARED_ARGUMENTS,
    deepseek_v4_argument_values,
    deepseek_v4_prepared_arguments,
)
from blockprep.batch import DecodeBatch
from blockprep.reference import deepseek_v4_decode_rebuild
from blockprep.testing import DeepSeekV4SchedulerSim

ARG_OF = dict(GROUP_ARGUMENTS)
ARG_OF.update({n: n for n in PREPARED_ARGUMENTS if n not in GROUP_ARGUMENTS.values()})
DYNAMIC = ("input_ids", "position_ids", "kv_seq_lens")


def make_batch(**fields: Any) -> DecodeBatch:
    fields.setdefault("hidden_states", None)
    return DecodeBatch(**fields)


def sim(ranks: int = 4, decode_batch: int = 4, seed: int = 0, **kw: Any) -> DeepSeekV4SchedulerSim:
    kw.setdefault("prompt_lengths", (1, 700))
    kw.setdefault("join_probability", 0.3)
    kw.setdefault("leave_probability", 0.05)
    return DeepSeekV4SchedulerSim(
        ranks=ranks, decode_batch=decode_batch, seed=seed, fresh_lists=True, **kw
    )


def reference(batch: DecodeBatch, layout: DeepSeekV4Layout, **kw: Any) -> dict[str, torch.Tensor]:
    """Upstream's rebuild keyed by kernel argument name."""
    rebuilt = deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        **kw,
    )
    return {ARG_OF[name]: tensor for name, tensor in rebuilt.items()}


def assert_equal(found: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    assert set(found) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name


def snapshot(preparer: DeepSeekV4DecodePreparer) -> list[dict[str, torch.Tensor]]:
    return [
        {n: t.clone() for n, t in preparer.slot_buffers(s).items()}
        for s in range(preparer.buffer_slots)
    ]


def upstream_buffers(layout: DeepSeekV4Layout, fill: int = 0) -> dict[str, torch.Tensor]:
    """A TaskArgs-like slot: every prepared argument in shared memory, plus an output."""
    found = {
        name: torch.full(spec.shape, fill, dtype=spec.dtype).share_memory_()
        for name, spec in deepseek_v4_prepared_arguments(layout).items()
    }
    found["logits"] = torch.zeros(layout.ranks, layout.decode_tokens, 3)
    return found


def retoken(batch: DecodeBatch, tokens: list[int], seq_shift: int = 0) -> DecodeBatch:
    """The same requests in the same places, other tokens (and lengths)."""
    return make_batch(
        request_ids=list(batch.request_ids),
        token_ids=torch.tensor(tokens, dtype=torch.int64),
        seq_lens=batch.seq_lens + seq_shift,
        block_ids_by_group=batch.block_ids_by_group,
        cache_partitions=list(batch.cache_partitions),
        prev_token_ids=torch.tensor(tokens, dtype=torch.int64) + 1,
    )


# --- adopted buffers ------------------------------------------------------------------------------


def test_adopted_buffers_are_written_in_place_and_equal_the_reference() -> None:
    s = sim()
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    adopted = [upstream_buffers(layout, fill=-7) for _ in range(2)]  # garbage content
    pointers = [{n: t.data_ptr() for n, t in slot.items()} for slot in adopted]
    preparer = DeepSeekV4DecodePreparer(layout, buffers=adopted)
    assert not preparer.share_memory
    for step in range(60):
        batch = s.step()
        inputs = preparer.prepare(batch, buffer_slot=step % 2)
        values = deepseek_v4_argument_values(inputs)
        assert all(values[n] is adopted[step % 2][n] for n in PREPARED_ARGUMENTS)
        assert_equal(values, reference(batch, layout))
        for slot, known in zip(adopted, pointers, strict=True):
            assert {n: t.data_ptr() for n, t in slot.items()} == known
    assert (adopted[0]["logits"] == 0).all()  # other names are not touched


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            lambda b: b.pop("idx_block_table"),
            ValueError,
            r"buffers\[1\] is missing idx_block_table",
        ),
        (
            lambda b: b.update(input_ids=b["input_ids"].int()),
            TypeError,
            r"buffers\[1\]\['input_ids'\] must be torch.int64, got torch.int32",
        ),
        (
            lambda b: b.update(kv_seq_lens=torch.zeros(4, 5, dtype=torch.int32)),
            ValueError,
            r"buffers\[1\]\['kv_seq_lens'\] must have shape \[4, 4\]",
        ),
        (
            lambda b: b.update(position_ids=torch.zeros(4, 4, dtype=torch.int32).t()),
            ValueError,
            r"buffers\[1\]\['position_ids'\] must be contiguous",
        ),
        (
            lambda b: b.update(block_table="x"),
            TypeError,
            r"buffers\[1\]\['block_table'\] must be a torch.Tensor",
        ),
    ],
)
def test_adopted_buffers_are_checked_by_name(change: Any, error: type, match: str) -> None:
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4)
    adopted = [upstream_buffers(layout), upstream_buffers(layout)]
    change(adopted[1])
    with pytest.raises(error, match=match):
        DeepSeekV4DecodePreparer(layout, buffers=adopted)


def test_adopted_buffers_must_not_overlap_nor_be_moved() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2)
    slot = upstream_buffers(layout)
    with pytest.raises(ValueError, match="overlaps"):
        DeepSeekV4DecodePreparer(layout, buffers=[slot, dict(slot)])
    with pytest.raises(ValueError, match="share_memory applies only to allocated buffers"):
        DeepSeekV4DecodePreparer(
            layout, buffers=[slot, upstream_buffers(layout)], share_memory=True
        )
    with pytest.raises(ValueError, match="buffers must hold 2 buffer slots, got 1"):
        DeepSeekV4DecodePreparer(layout, buffers=[slot])


def test_allocated_buffers_are_shared_by_default() -> None:
    preparer = DeepSeekV4DecodePreparer(DeepSeekV4Layout(ranks=2, decode_batch=2))
    assert preparer.share_memory
    assert all(t.is_shared() for s in range(2) for t in preparer.slot_buffers(s).values())
    private = DeepSeekV4DecodePreparer(
        DeepSeekV4Layout(ranks=2, decode_batch=2), share_memory=False
    )
    assert not any(t.is_shared() for t in private.slot_buffers(0).values())


# --- pool sizes bound later -----------------------------------------------------------------------


def test_pool_sizes_bound_after_allocation() -> None:
    s = sim(seed=3)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=UNBOUND)
    assert not layout.bound and "unbound" in repr(layout)
    with pytest.raises(RuntimeError, match="not bound"):
        layout.num_blocks  # noqa: B018
    preparer = DeepSeekV4DecodePreparer(layout)
    pointers = {n: t.data_ptr() for n, t in preparer.slot_buffers(0).items()}
    batch = s.step()
    with pytest.raises(RuntimeError, match=r"call bind_num_blocks"):
        preparer.prepare(batch, buffer_slot=0)
    with pytest.raises(RuntimeError, match="not bound"):
        preparer.table_stats(0)
    with pytest.raises(ValueError, match="num_blocks is missing cache groups"):
        preparer.bind_num_blocks({"ori": 100})
    assert not preparer.bound
    preparer.bind_num_blocks(s.num_blocks)
    bound = preparer.layout
    assert bound.bound and dict(bound.num_blocks) == s.num_blocks
    for step in range(6):
        inputs = preparer.prepare(batch, buffer_slot=step % 2)
        assert_equal(deepseek_v4_argument_values(inputs), reference(batch, bound))
        batch = s.step()
    assert {n: t.data_ptr() for n, t in preparer.slot_buffers(0).items()} == pointers

    # Binding again invalidates every slot: no re-stage, and new scratch pages everywhere.
    bigger = {name: n + 5 for name, n in s.num_blocks.items()}
    preparer.bind_num_blocks(bigger)
    with pytest.raises(RuntimeError, match="holds no prepared step"):
        preparer.restage(batch, buffer_slot=0)
    for slot in (0, 1):
        inputs = preparer.prepare(batch, buffer_slot=slot)
        assert_equal(deepseek_v4_argument_values(inputs), reference(batch, preparer.layout))
    assert {n: t.data_ptr() for n, t in preparer.slot_buffers(0).items()} == pointers


def test_unbound_layout_with_num_blocks_matches_a_bound_one() -> None:
    pools = DeepSeekV4Layout(ranks=2, decode_batch=2).num_blocks
    late = DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=UNBOUND).with_num_blocks(pools)
    assert repr(late) == repr(DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=pools))


# --- early prepare and re-stage -------------------------------------------------------------------


def test_early_prepare_writes_placeholders_and_restage_only_the_dynamic_inputs() -> None:
    s = sim(decode_batch=1, seed=5)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout)
    s.step()
    batch = s.step()
    A = len(batch.request_ids)
    inputs = preparer.prepare(batch, buffer_slot=1, early=True)
    zeros = [[0] * layout.decode_seq] * A
    placeholder = reference(batch, layout, token_rows=zeros, positions=zeros, active_seq=1)
    assert_equal(deepseek_v4_argument_values(inputs), placeholder)
    assert (inputs.input_ids == 0).all() and (inputs.position_ids == 0).all()

    before = snapshot(preparer)
    real = retoken(batch, [7 + i for i in range(A)], seq_shift=1)
    assert preparer.restage(real, buffer_slot=1) is inputs
    after = snapshot(preparer)
    assert_equal(after[0], before[0])  # the other slot: every byte
    for name in PREPARED_ARGUMENTS:
        if name not in DYNAMIC:
            assert torch.equal(after[1][name], before[1][name]), name
    assert_equal(after[1], reference(real, layout))


def test_restage_rejects_other_batches_and_writes_nothing() -> None:
    s = sim(seed=6)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout)
    with pytest.raises(RuntimeError, match="slot 0 holds no prepared step"):
        preparer.restage(s.step(), buffer_slot=0)
    s.step()
    batch = s.step()
    while len(batch.request_ids) < 2:
        batch = s.step()
    preparer.prepare(batch, buffer_slot=0)
    before = snapshot(preparer)
    ids = list(batch.request_ids)
    swapped = make_batch(
        request_ids=[ids[1], ids[0], *ids[2:]],
        token_ids=batch.token_ids,
        seq_lens=batch.seq_lens,
        block_ids_by_group=batch.block_ids_by_group,
        cache_partitions=list(batch.cache_partitions),
    )
    moved = make_batch(
        request_ids=ids,
        token_ids=batch.token_ids,
        seq_lens=batch.seq_lens,
        block_ids_by_group=batch.block_ids_by_group,
        cache_partitions=[(p + 1) % 4 for p in batch.cache_partitions],
    )
    bad_len = retoken(batch, [1] * len(ids))
    bad_len.seq_lens = torch.zeros_like(bad_len.seq_lens)
    too_long = retoken(batch, [1] * len(ids))
    too_long.seq_lens = torch.full_like(too_long.seq_lens, layout.max_seq_len + 1)
    cases = [
        (swapped, ValueError, REQUEST_ORDER_MESSAGE, {}),
        (moved, ValueError, PARTITIONS_MESSAGE, {}),
        (bad_len, ValueError, "decode seq_lens must be positive", {}),
        (too_long, ValueError, "exceeds max_seq_len", {}),
        (
            batch,
            ValueError,
            "apply only to a slot prepared by prepare_mtp_target",
            {"positions": []},
        ),
        (batch, ValueError, "decode buffer_slot must be 0 or 1, got 2", {"buffer_slot": 2}),
    ]
    for bad, error, match, kw in cases:
        kw.setdefault("buffer_slot", 0)
        with pytest.raises(error, match=match):
            preparer.restage(bad, **kw)
        after = snapshot(preparer)
        for slot in (0, 1):
            assert_equal(after[slot], before[slot])


def test_early_rule_one_request_per_rank() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4)
    preparer = DeepSeekV4DecodePreparer(layout)
    ids = {name: [n] for name, n in zip(layout.num_blocks, range(7), strict=True)}
    batch = make_batch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([1, 2]),
        seq_lens=torch.tensor([3, 4]),
        block_ids_by_group=[ids, {k: [v[0] + 1] for k, v in ids.items()}],
        cache_partitions=[0, 0],
    )
    preparer.prepare(batch, buffer_slot=0)  # decode_seq 1: the synchronous path allows it
    with pytest.raises(
        ValueError, match=r"^DeepSeekV4 non-MTP decode supports at most one request per DP rank$"
    ):
        preparer.prepare(batch, buffer_slot=1, early=True)
    host = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=4)
    with pytest.raises(ValueError, match='needs embedding="device"'):
        host.prepare(batch, buffer_slot=0, early=True)


def test_early_mtp_prepare_and_restage() -> None:
    s = sim(seed=8, max_advance=2)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=8, decode_seq=2, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout)
    for step in range(20):
        batch = s.step()
        A = len(batch.request_ids)
        zeros = [[0, 0]] * A
        inputs = preparer.prepare_mtp(batch, buffer_slot=step % 2, early=True)
        expected = reference(batch, layout, token_rows=zeros, positions=zeros, active_seq=2)
        assert_equal(deepseek_v4_argument_values(inputs), expected)
        preparer.restage(batch, buffer_slot=step % 2)
        assert_equal(deepseek_v4_argument_values(inputs), reference(batch, layout, mtp=True))


# --- threads --------------------------------------------------------------------------------------


class SlowBatch:
    """A batch whose ``seq_lens`` blocks until released: holds the preparer inside a call."""

    def __init__(self, batch: DecodeBatch) -> None:
        self._batch = batch
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        if name == "seq_lens":
            self.entered.set()
            assert self.release.wait(10)
        return getattr(self._batch, name)


def test_a_busy_slot_raises_at_once_and_other_slots_proceed() -> None:
    s = sim(seed=9)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout, track_dirty_ranks=True)
    first = s.step()
    preparer.prepare(first, buffer_slot=1)
    second = s.step()
    slow = SlowBatch(second)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            preparer.prepare(slow, buffer_slot=0)  # type: ignore[arg-type]
        except BaseException as error:
            errors.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    assert slow.entered.wait(10)
    for call in (
        lambda: preparer.prepare(second, buffer_slot=0),
        lambda: preparer.restage(second, buffer_slot=0),
        lambda: preparer.invalidate(0),
        lambda: preparer.bind_num_blocks(s.num_blocks),
        lambda: preparer.reset(),
        lambda: preparer.take_dirty_ranks(0),
    ):
        started = time.perf_counter()
        with pytest.raises(SlotBusyError, match="slot 0 is busy") as info:
            call()
        assert info.value.slot == 0 and time.perf_counter() - started < 1
    # Re-staging slot 1 runs while slot 0 is being prepared (it never touches the tables).
    real = retoken(first, [5] * len(first.request_ids))
    preparer.restage(real, buffer_slot=1)
    slow.release.set()
    worker.join(10)
    assert not errors
    assert_equal(preparer.slot_buffers(1), reference(real, layout))
    assert_equal(preparer.slot_buffers(0), reference(second, layout))


def test_two_lanes_as_upstreams_worker_runs_them() -> None:
    """A command thread prepares slot step % 2 early; a device thread re-stages and dispatches the
    other; the fake submit snapshots the arguments and its completion asserts they were not
    modified meanwhile."""
    steps = 120
    s = sim(decode_batch=1, seed=10, join_probability=0.5)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout)
    free = [threading.Semaphore(1), threading.Semaphore(1)]
    ready: queue.Queue[tuple[int, DecodeBatch, DeepSeekV4DecodeInputs] | None] = queue.Queue(2)
    failures: list[str] = []

    class Handle:
        def __init__(self, args: dict[str, torch.Tensor]) -> None:
            self.args = args
            self.seen = {n: t.clone() for n, t in args.items()}

        def wait(self) -> None:
            time.sleep(0.001)  # the "device" runs while the command thread prepares
            for name, tensor in self.args.items():
                if not torch.equal(tensor, self.seen[name]):
                    failures.append(f"{name} modified before completion")

    def submit(args: dict[str, torch.Tensor]) -> Handle:
        return Handle(args)

    def command() -> None:
        for step in range(steps):
            batch = s.step()
            free[step % 2].acquire()
            inputs = preparer.prepare(batch, buffer_slot=step % 2, early=True)
            ready.put((step, batch, inputs))
        ready.put(None)

    def device() -> None:
        while (item := ready.get()) is not None:
            step, batch, _inputs = item
            slot = step % 2
            restaged = preparer.restage(batch, buffer_slot=slot)
            args = deepseek_v4_argument_values(restaged)
            expected = reference(batch, layout)
            if any(not torch.equal(args[n], expected[n]) for n in expected):
                failures.append(f"step {step}: buffers differ from the reference")
            submit(args).wait()
            free[slot].release()

    lanes = [threading.Thread(target=command), threading.Thread(target=device)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join(60)
    assert not failures, failures[:3]


# --- dirty ranks, outputs in batch order ----------------------------------------------------------


def test_dirty_ranks_name_the_ranks_written_since_taken() -> None:
    layout = DeepSeekV4Layout(ranks=4, decode_batch=2)
    preparer = DeepSeekV4DecodePreparer(layout, track_dirty_ranks=True)
    assert preparer.dirty_ranks(0) == {0, 1, 2, 3}
    groups = [{name: [r * 2 + j] for j, name in enumerate(layout.num_blocks)} for r in range(3)]
    batch = make_batch(
        request_ids=["a", "b", "c"],
        token_ids=torch.tensor([1, 2, 3]),
        seq_lens=torch.tensor([5, 6, 7]),
        block_ids_by_group=groups,
        cache_partitions=[0, 1, 2],
    )
    preparer.prepare(batch, buffer_slot=0)
    assert preparer.take_dirty_ranks(0) == {0, 1, 2, 3}
    assert preparer.take_dirty_ranks(0) == set()
    preparer.prepare(batch, buffer_slot=0)
    assert preparer.take_dirty_ranks(0) == set()
    preparer.prepare(retoken(batch, [1, 9, 3]), buffer_slot=0)
    assert preparer.take_dirty_ranks(0) == {1}
    grown = [dict(g) for g in groups]
    grown[2] = {**grown[2], "cmp_c4": [*grown[2]["cmp_c4"], 30]}
    moved = make_batch(
        request_ids=["a", "b", "c"],
        token_ids=torch.tensor([1, 9, 3]),
        seq_lens=torch.tensor([5, 6, 7]),
        block_ids_by_group=grown,
        cache_partitions=[0, 1, 2],
    )
    preparer.prepare(moved, buffer_slot=0)
    assert preparer.take_dirty_ranks(0) == {2}
    preparer.restage(retoken(moved, [4, 9, 3]), buffer_slot=0)
    assert preparer.take_dirty_ranks(0) == {0, 3}  # empty rank 3 replicates request 0
    # Slot 1 catches up on everything at its first prepare.
    preparer.prepare(moved, buffer_slot=1)
    assert preparer.take_dirty_ranks(1) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="track_dirty_ranks=True"):
        DeepSeekV4DecodePreparer(layout).dirty_ranks(0)


def test_gather_rows_returns_outputs_in_batch_order() -> None:
    layout = DeepSeekV4Layout(ranks=3, decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout)
    groups = [{name: [q] for name in layout.num_blocks} for q in range(4)]
    batch = make_batch(
        request_ids=["a", "b", "c", "d"],
        token_ids=torch.tensor([1, 2, 3, 4]),
        seq_lens=torch.tensor([5, 6, 7, 8]),
        block_ids_by_group=groups,
        cache_partitions=[2, 0, 2, 1],
        prev_token_ids=torch.tensor([0, 0, 0, 0]),
    )
    inputs = preparer.prepare_mtp(batch, buffer_slot=0)
    R, T = 3, 8
    logits = torch.arange(R * T * 5, dtype=torch.float32).view(R, T, 5)
    rows = inputs.gather_rows(logits)
    assert rows.shape == (4, 5)
    # a: rank 2 row 0; b: rank 0 row 0; c: rank 2 local 1 -> token row 2; d: rank 1 row 0
    for q, (rank, row) in enumerate([(2, 0), (0, 0), (2, 2), (1, 0)]):
        assert torch.equal(rows[q], logits[rank, row])
    both = inputs.gather_rows(logits, tokens=inputs.active_seq)
    assert both.shape == (4, 2, 5) and torch.equal(both[2, 1], logits[2, 3])
    sampled = torch.zeros(R, T, 8, dtype=torch.int32)
    assert inputs.gather_rows(sampled).shape == (4, 8)
    with pytest.raises(ValueError, match=r"kernel output must have shape \[3, 8, ...\]"):
        inputs.gather_rows(torch.zeros(3, 7))
    with pytest.raises(ValueError, match=r"tokens must be in \[1, 2\]"):
        inputs.gather_rows(logits, tokens=3)


# --- MTP depth k >= 2: target chunks --------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "b", "S"), [(0, 8, 1), (1, 8, 2), (2, 4, 4), (3, 4, 4), (4, 2, 8), (9, 2, 8)]
)
def test_upstream_decode_layouts(k: int, b: int, S: int) -> None:
    layout = deepseek_v4_decode_layout(k)
    assert (layout.ranks, layout.decode_batch, layout.decode_seq) == (8, b, S)
    assert layout.decode_tokens == (8 if k == 0 else 16)
    with pytest.raises(ValueError, match="num_speculative_tokens must be non-negative"):
        deepseek_v4_decode_layout(-1)


def target_chunk(
    batch: DecodeBatch, S: int, width: int, offset: int, rng: torch.Generator
) -> tuple[list[list[int]], list[list[int]]]:
    """Upstream's _verify_mtp_drafts rows: real_width tokens (current, then drafts), the last
    repeated; positions base - 1 + offset + j, the last repeated."""
    A = len(batch.request_ids)
    real = torch.randint(0, 1000, (A, width), generator=rng).tolist()
    tokens = [row + [row[-1]] * (S - width) for row in real]
    positions = []
    for s in batch.seq_lens.tolist():
        first = int(s) - 1 + offset
        places = [first + j for j in range(width)]
        positions.append(places + [places[-1]] * (S - width))
    return tokens, positions


@pytest.mark.parametrize("k", [2, 4])
def test_mtp_target_chunks_equal_the_reference(k: int) -> None:
    layout0 = deepseek_v4_decode_layout(k, ranks=4)
    S, b = layout0.decode_seq, layout0.decode_batch
    rng = torch.Generator().manual_seed(k)
    for full, sim_batch in ((True, b), (False, 1)):
        s = sim(ranks=4, decode_batch=sim_batch, seed=k, max_advance=S)
        layout = deepseek_v4_decode_layout(k, ranks=4, num_blocks=s.num_blocks)
        preparer = DeepSeekV4DecodePreparer(layout)
        for step in range(30):
            batch = s.step()
            width = S if full else 1 + step % S
            tokens, positions = target_chunk(batch, S, width, 0, rng)
            inputs = preparer.prepare_mtp_target(
                batch,
                token_rows=torch.tensor(tokens),
                positions=positions,
                active_width=width,
                buffer_slot=step % 2,
            )
            assert inputs.active_seq == width
            expected = reference(
                batch, layout, token_rows=tokens, positions=positions, active_seq=width
            )
            assert_equal(deepseek_v4_argument_values(inputs), expected)
            # a re-stage with other rows: the same places, new tokens and positions
            tokens2, positions2 = target_chunk(batch, S, width, 1, rng)
            preparer.restage(batch, buffer_slot=step % 2, token_rows=tokens2, positions=positions2)
            expected = reference(
                batch, layout, token_rows=tokens2, positions=positions2, active_seq=width
            )
            assert_equal(deepseek_v4_argument_values(inputs), expected)


def test_mtp_target_errors_follow_upstream() -> None:
    layout = deepseek_v4_decode_layout(2, ranks=2)  # b=4, S=4
    preparer = DeepSeekV4DecodePreparer(layout)
    groups = [{name: [q] for name in layout.num_blocks} for q in range(2)]
    batch = make_batch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([1, 2]),
        seq_lens=torch.tensor([5, 6]),
        block_ids_by_group=groups,
        cache_partitions=[0, 0],
    )
    rows = torch.zeros(2, 4, dtype=torch.int64)
    places = [[1, 2, 3, 4], [1, 2, 3, 4]]
    cases = [
        (
            {"token_rows": rows[:, :3]},
            r"MTP target token rows must have shape \(2, 4\), got \(2, 3\)",
        ),
        ({"active_width": 5}, "MTP target active width must fit the fixed decode sequence"),
        ({"active_width": 0}, "MTP target active width must fit the fixed decode sequence"),
        (
            {"positions": [[1, 2, 3]] * 2},
            "MTP target positions must align with the fixed decode sequence",
        ),
        ({"active_width": 2}, "partial MTP target chunks require at most one request per rank"),
        ({"positions": [[1, 2, 3, 99999]] * 2}, "decode position 99999 exceeds max_seq_len=16384"),
    ]
    before = snapshot(preparer)
    for change, match in cases:
        kw: dict[str, Any] = {"token_rows": rows, "positions": places, "active_width": 4}
        kw.update(change)
        with pytest.raises(ValueError, match=match):
            preparer.prepare_mtp_target(batch, buffer_slot=0, **kw)
    for slot, saved in enumerate(before):
        assert_equal(snapshot(preparer)[slot], saved)
    preparer.prepare_mtp_target(batch, token_rows=rows, positions=places, active_width=4)
    with pytest.raises(ValueError, match="re-staged with token_rows and positions"):
        preparer.restage(batch, buffer_slot=0)


# --- the real transport: a forked child reads the shared buffers ----------------------------------


FORK_STEPS = 300
FORK_SEED = 21


def _fork_layout() -> tuple[DeepSeekV4SchedulerSim, DeepSeekV4Layout]:
    s = sim(ranks=4, decode_batch=4, seed=FORK_SEED, join_probability=0.4, leave_probability=0.05)
    return s, DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=UNBOUND)


def _child(buffers: list[dict[str, torch.Tensor]], conn: Any) -> None:
    torch.set_num_threads(1)
    s, layout = _fork_layout()
    layout = layout.with_num_blocks(s.num_blocks)
    while (message := conn.recv()) is not None:
        step, slot = message
        batch = s.step()  # the same trace as the parent's, replayed here
        expected = reference(batch, layout)
        bad = [n for n, t in expected.items() if not torch.equal(buffers[slot][n], t)]
        conn.send((step, bad))
    conn.close()


def _run_fork(share_memory: bool, steps: int) -> list[tuple[int, list[str]]]:
    s, layout = _fork_layout()
    preparer = DeepSeekV4DecodePreparer(layout, share_memory=share_memory)  # before the fork
    buffers = [preparer.slot_buffers(slot) for slot in range(2)]
    context = multiprocessing.get_context("fork")
    parent, child_end = context.Pipe()
    child = context.Process(target=_child, args=(buffers, child_end))
    child.start()
    child_end.close()
    preparer.bind_num_blocks(s.num_blocks)  # after the fork, as upstream learns the pool sizes
    results = []
    try:
        for step in range(steps):
            batch = s.step()
            preparer.prepare(batch, buffer_slot=step % 2)
            parent.send((step, step % 2))
            assert parent.poll(30), "the child did not answer"
            results.append(parent.recv())
        parent.send(None)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    return results


def test_fork_child_sees_every_step_in_shared_buffers() -> None:
    results = _run_fork(True, FORK_STEPS)
    assert [step for step, _ in results] == list(range(FORK_STEPS))
    assert [r for r in results if r[1]] == []


def test_fork_child_sees_nothing_without_shared_memory() -> None:
    results = _run_fork(False, 3)
    assert all(bad for _, bad in results)  # the control: private buffers never reach the child
