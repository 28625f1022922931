"""The executors over upstream's runtime worker (``blockprep.executors.runtime``), proven on a CPU
with a fake worker of upstream's ``run(compiled, *args)`` / ``submit(compiled, *args)`` shape
(upstream's own ``tests/unit/model/qwen/test_npu_runner_inputs.py`` records dispatches the same
way): argument names, positions, dtypes and shapes against the recorded ABI, every prepared
argument shared and contiguous with a constant ``data_ptr()``, outputs read back in batch order,
and DeepSeek's slot released only after its dispatch completed."""

from __future__ import annotations

import pickle
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.deepseek.abi import (
    DEEPSEEK_V4_DECODE_ARGUMENTS,
    PREPARED_ARGUMENTS,
    deepseek_v4_prepared_arguments,
)
from blockprep.adapters.kernel_abi import KernelArgumentError
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.qwen_abi import (
    QWEN3_DECODE_ARGUMENTS,
    QWEN3_PREPARED_ARGUMENTS,
    qwen3_prepared_arguments,
)
from blockprep.batch import DecodeBatch, KvAllocation
from blockprep.executors.runtime import (
    DeepSeekV4RuntimeExecutor,
    PreparedArgumentError,
    Qwen3RuntimeExecutor,
)
from blockprep.reference import QwenDecodePrep97
from blockprep.testing import DeepSeekV4SchedulerSim

B, MAX_SEQ, PAGE, VOCAB, PADDED_VOCAB = 4, 512, 64, 10, 16
COMPILED = object()


def shared(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).share_memory_()  # type: ignore[no-untyped-call]


class FakeQwenWorker:
    """Records each ``run``; plays the kernel's outputs: logits row r holds seq_lens[r] in
    column 0 and r in column 1, sampled_ids row r holds token_ids[r, 0] + 1000."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, tuple[object, ...]]] = []

    def run(self, compiled: object, *args: object) -> None:
        self.calls.append((compiled, args))
        values: dict[str, Any] = dict(zip(QWEN3_DECODE_ARGUMENTS, args, strict=True))
        logits, sampled = values["logits"], values["sampled_ids"]
        logits.zero_()
        logits[:, 0] = values["seq_lens"].float()
        logits[:, 1] = torch.arange(logits.shape[0], dtype=torch.float32)
        sampled[:, 0] = values["token_ids"][:, 0] + 1000


def qwen_engine(width: int = 8) -> dict[str, object]:
    """The engine's 21 arguments: weight stand-ins, and upstream's host-shared outputs."""
    engine: dict[str, object] = {
        name: torch.zeros(1)
        for name in QWEN3_DECODE_ARGUMENTS
        if name not in QWEN3_PREPARED_ARGUMENTS
    }
    engine["logits"] = shared(B, PADDED_VOCAB)
    engine["sampled_ids"] = shared(B, width, dtype=torch.int32)
    engine["next_hidden"] = shared(B, 4, dtype=torch.bfloat16)
    return engine


def qwen_trace(steps: int, seed: int) -> Iterator[DecodeBatch]:
    """Batches of 1..B requests with growing sequences, pages appended at page boundaries,
    requests joining and leaving, some steps carrying only ``kv_allocations``."""
    rng = random.Random(seed)
    free = list(range(200))
    rng.shuffle(free)
    live: list[list[Any]] = []
    counter = 0
    for step in range(steps):
        while len(live) < rng.randint(1, B):
            counter += 1
            seq = rng.randint(1, 300)
            live.append([f"r{counter}", seq, [free.pop() for _ in range(-(-seq // PAGE))]])
        rng.shuffle(live)
        ids = [r[0] for r in live]
        pages = [list(r[2]) for r in live]
        common: dict[str, Any] = {
            "request_ids": ids,
            "token_ids": torch.tensor([rng.randrange(150_000) for _ in live]),
            "hidden_states": None,
            "seq_lens": torch.tensor([r[1] for r in live]),
        }
        if step % 3 == 2:  # upstream's offline path: pages only in kv_allocations
            allocations = [
                KvAllocation(request_id=i, model_id="m", page_ids=p, tokens_capacity=MAX_SEQ)
                for i, p in zip(ids, pages, strict=True)
            ]
            yield DecodeBatch(**common, kv_allocations=allocations)
        else:
            yield DecodeBatch(**common, block_ids=pages)
        for request in list(live):
            if rng.random() < 0.1 or request[1] >= MAX_SEQ - 1:
                live.remove(request)
                free.extend(request[2])
            else:
                request[1] += 1
                if (request[1] - 1) // PAGE >= len(request[2]):
                    request[2].append(free.pop())


def as_block_ids(batch: DecodeBatch) -> DecodeBatch:
    """The same batch with its pages in ``block_ids`` (what upstream's reference reads)."""
    if not batch.kv_allocations:
        return batch
    return DecodeBatch(
        request_ids=batch.request_ids,
        token_ids=batch.token_ids,
        hidden_states=None,
        seq_lens=batch.seq_lens,
        block_ids=[list(a.page_ids) for a in batch.kv_allocations],
    )


# --- Qwen3 -------------------------------------------------------------------------------------


def test_qwen_dispatch_matches_the_recorded_abi_every_step() -> None:
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE)  # shared by default on the CPU
    engine = qwen_engine()
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, engine, vocab_size=VOCAB)
    specs = qwen3_prepared_arguments(B, MAX_SEQ, PAGE)
    buffers = preparer.buffers()
    pointers = {name: tensor.data_ptr() for name, tensor in buffers.items()}
    upstream = QwenDecodePrep97(B, MAX_SEQ, PAGE, 8)
    for step, batch in enumerate(qwen_trace(60, seed=1)):
        greedy = step % 4 == 1
        batch.allow_device_greedy_sampling = greedy
        result = executor.run_decode(batch)
        compiled, args = worker.calls[-1]
        assert compiled is COMPILED and len(args) == 25
        for position, name in enumerate(QWEN3_DECODE_ARGUMENTS):
            if name in specs:
                spec = specs[name]
                value = args[position]
                assert isinstance(value, torch.Tensor) and position == spec.position
                assert value is buffers[name]
                assert value.dtype == spec.dtype and tuple(value.shape) == spec.shape
                assert value.is_shared() and value.is_contiguous()  # type: ignore[no-untyped-call]
                assert value.data_ptr() == pointers[name], name
            else:
                assert args[position] is engine[name], name
        upstream.prepare(as_block_ids(batch))
        for name in QWEN3_PREPARED_ARGUMENTS:
            assert torch.equal(buffers[name], getattr(upstream, name)), (step, name)
        rows = len(batch.request_ids)
        if greedy:
            assert result.logits is None
            assert result.sampled_token_ids is not None
            assert result.sampled_token_ids.shape == (rows, 1)
            assert result.sampled_token_ids[:, 0].tolist() == [
                t + 1000 for t in batch.token_ids.tolist()
            ]
        else:
            assert result.sampled_token_ids is None and result.logits is not None
            assert result.logits.shape == (rows, VOCAB)
            assert result.logits[:, 0].tolist() == [float(s) for s in batch.seq_lens.tolist()]
            assert result.logits[:, 1].tolist() == list(map(float, range(rows)))
            engine_logits = engine["logits"]
            assert isinstance(engine_logits, torch.Tensor)
            assert result.logits.data_ptr() != engine_logits.data_ptr()  # a copy
        for row, allocation in enumerate(batch.kv_allocations):
            assert allocation.tokens_used == int(batch.seq_lens[row])


def test_qwen_adopts_upstreams_buffers_in_place() -> None:
    """Upstream's decode ``TaskArgs`` slots (``torch.empty(...).share_memory_()`` before the
    fork), handed over by name: written in place and dispatched as the very same objects."""
    max_blocks = -(-MAX_SEQ // PAGE)
    upstream_slots = {
        "token_ids": shared(B, 8, dtype=torch.int32),
        "seq_lens": shared(B, dtype=torch.int32),
        "block_table": shared(B * max_blocks, dtype=torch.int32),
        "slot_mapping": shared(B, dtype=torch.int32),
    }
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE, buffers=upstream_slots)
    assert all(preparer.buffers()[n] is t for n, t in upstream_slots.items())
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, qwen_engine())
    upstream = QwenDecodePrep97(B, MAX_SEQ, PAGE, 8)
    for batch in qwen_trace(20, seed=2):
        executor.run_decode(batch)
        upstream.prepare(as_block_ids(batch))
        args = worker.calls[-1][1]
        for name, tensor in upstream_slots.items():
            assert args[QWEN3_DECODE_ARGUMENTS.index(name)] is tensor
            assert torch.equal(tensor, getattr(upstream, name)), name


@pytest.mark.parametrize(
    ("buffers", "error", "match"),
    [
        ({"seq_len": torch.zeros(B, dtype=torch.int32)}, ValueError, "unknown Qwen decode buffers"),
        (
            {"seq_lens": torch.zeros(B, dtype=torch.int64)},
            TypeError,
            "seq_lens must be torch.int32",
        ),
        ({"seq_lens": torch.zeros(B + 1, dtype=torch.int32)}, ValueError, r"shape \[4\]"),
        ({"token_ids": torch.zeros(8, B, dtype=torch.int32).t()}, ValueError, "contiguous"),
        ({"slot_mapping": [0] * B}, TypeError, "must be a torch.Tensor"),
    ],
)
def test_qwen_adoption_is_checked(buffers: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        QwenDecodePreparer(B, MAX_SEQ, PAGE, buffers=buffers)


def test_qwen_adoption_needs_the_cpu() -> None:
    with pytest.raises(ValueError, match="device must be 'cpu'"):
        QwenDecodePreparer(
            B, MAX_SEQ, PAGE, device="meta", buffers={"seq_lens": torch.zeros(B, dtype=torch.int32)}
        )


def test_qwen_shared_by_default_on_the_cpu_only() -> None:
    assert all(t.is_shared() for t in QwenDecodePreparer(B, MAX_SEQ, PAGE).buffers().values())  # type: ignore[no-untyped-call]
    private = QwenDecodePreparer(B, MAX_SEQ, PAGE, share_memory=False)
    assert not any(t.is_shared() for t in private.buffers().values())  # type: ignore[no-untyped-call]


def test_qwen_refuses_private_memory_before_dispatch() -> None:
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE, share_memory=False)
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, qwen_engine())
    batch = next(qwen_trace(1, seed=3))
    with pytest.raises(PreparedArgumentError, match=r"seq_lens \(position 6\).*shared memory"):
        executor.run_decode(batch)
    assert worker.calls == []


def test_qwen_engine_arguments_are_checked() -> None:
    engine = qwen_engine()
    del engine["rope_cos"]
    engine["rope_cosine"] = torch.zeros(1)
    engine["seq_lens"] = torch.zeros(1)
    with pytest.raises(KernelArgumentError) as caught:
        Qwen3RuntimeExecutor(
            FakeQwenWorker(), COMPILED, QwenDecodePreparer(B, MAX_SEQ, PAGE), engine
        )
    assert caught.value.missing == ("rope_cos",)
    assert set(caught.value.unknown) | set(caught.value.duplicated) >= {"rope_cosine", "seq_lens"}


def test_qwen_step_overrides_and_refusals() -> None:
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE)
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, qwen_engine())
    batch = next(qwen_trace(1, seed=4))
    scratch = shared(B, PADDED_VOCAB)
    batch.allow_device_greedy_sampling = True
    executor.run_decode(batch, arguments={"logits": scratch})  # device scratch, as upstream
    assert worker.calls[-1][1][QWEN3_DECODE_ARGUMENTS.index("logits")] is scratch
    with pytest.raises(ValueError, match="only the engine's arguments"):
        executor.run_decode(batch, arguments={"seq_lens": scratch})
    batch.allow_device_topk_sampling = True
    with pytest.raises(ValueError, match="topk_select"):
        executor.run_decode(batch)
    untouched = QwenDecodePreparer(B, MAX_SEQ, PAGE, padding="untouched")
    with pytest.raises(ValueError, match="replicate row 0"):
        Qwen3RuntimeExecutor(worker, COMPILED, untouched, qwen_engine())


def test_qwen_untouched_padding_and_prefix_views() -> None:
    """``padding="untouched"``: rows past the active batch keep what they held (the newer
    dynamic-batch kernel is handed prefix views and never reads them)."""
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE, padding="untouched")
    full = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([9]),
        hidden_states=None,
        seq_lens=torch.tensor([70]),
        block_ids=[[5, 6]],
    )
    buffers = preparer.buffers()
    for tensor in buffers.values():
        tensor.fill_(77)
    preparer.reset()
    inputs = preparer.prepare(full)
    assert buffers["seq_lens"][1:].tolist() == [77] * (B - 1)
    assert buffers["slot_mapping"][1:].tolist() == [77] * (B - 1)
    assert buffers["token_ids"][1:, 0].tolist() == [77] * (B - 1)
    width = -(-MAX_SEQ // PAGE)
    assert buffers["block_table"][width:].tolist() == [77] * ((B - 1) * width)
    upstream = QwenDecodePrep97(B, MAX_SEQ, PAGE, 8)
    upstream.prepare(as_block_ids(full))
    views = inputs.prefix_views()
    assert views["block_table"].shape == (width,) and views["token_ids"].shape == (1, 8)
    for name, view in views.items():
        assert view.data_ptr() == buffers[name].data_ptr()
        reference = getattr(upstream, name)
        assert torch.equal(view, reference[: view.shape[0]]), name


def test_qwen_token_width_one() -> None:
    """Upstream's fallback width (a kernel module without ``SAMPLED_IDS_PAD``)."""
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE, sampled_ids_pad=1)
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, qwen_engine(width=1))
    assert executor.specs["token_ids"].shape == (B, 1)
    executor.run_decode(next(qwen_trace(1, seed=6)))
    assert worker.calls[-1][1][QWEN3_DECODE_ARGUMENTS.index("token_ids")].shape == (B, 1)


# --- DeepSeek V4 ---------------------------------------------------------------------------------

R, b = 2, 2
DS_VOCAB = 6


class FakeHandle:
    """Completes when ``done`` is set; ``wait`` asserts the prepared arguments were not modified
    between ``submit`` and completion, then plays the kernel's outputs."""

    def __init__(self, args: tuple[object, ...], done: threading.Event | None) -> None:
        self.args = args
        self.done = done
        self.snapshot = {
            name: args[DEEPSEEK_V4_DECODE_ARGUMENTS.index(name)].clone()  # type: ignore[union-attr]
            for name in PREPARED_ARGUMENTS
        }
        self.waited = False

    def wait(self) -> None:
        if self.done is not None:
            assert self.done.wait(10)
        for name, before in self.snapshot.items():
            now = self.args[DEEPSEEK_V4_DECODE_ARGUMENTS.index(name)]
            assert isinstance(now, torch.Tensor) and torch.equal(now, before), name
        values: dict[str, Any] = dict(zip(DEEPSEEK_V4_DECODE_ARGUMENTS, self.args, strict=True))
        logits, sampled = values["logits"], values["sampled_ids"]
        tokens = logits.shape[1]
        code = torch.arange(R)[:, None] * 100 + torch.arange(tokens)[None, :]
        logits[...] = code[:, :, None].float()
        sampled[...] = (code[:, :, None] + 7).int()
        self.waited = True


class FakeSubmitWorker:
    def __init__(self) -> None:
        self.calls: list[tuple[object, tuple[object, ...]]] = []
        self.gate: threading.Event | None = None

    def submit(self, compiled: object, *args: object) -> FakeHandle:
        self.calls.append((compiled, args))
        return FakeHandle(args, self.gate)


def deepseek_setup(
    slots: int = 2, share: bool = True
) -> tuple[DeepSeekV4RuntimeExecutor, FakeSubmitWorker, list[dict[str, object]], Any]:
    layout = DeepSeekV4Layout(ranks=R, decode_batch=b, max_seq_len=1024)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=slots, share_memory=share)
    T = layout.decode_tokens
    weights = {
        name: torch.zeros(1)
        for name in DEEPSEEK_V4_DECODE_ARGUMENTS
        if name not in PREPARED_ARGUMENTS
        and name not in ("logits", "sampled_ids", "hidden_out", "pre_hc_hidden_out")
    }
    engine = [
        {
            **weights,
            "logits": shared(R, T, DS_VOCAB),
            "sampled_ids": shared(R, T, 8, dtype=torch.int32),
            "hidden_out": shared(R, T, 4, dtype=torch.bfloat16),
            "pre_hc_hidden_out": object(),  # device-resident upstream
        }
        for _ in range(slots)
    ]
    worker = FakeSubmitWorker()
    executor = DeepSeekV4RuntimeExecutor(worker, COMPILED, preparer, engine)
    scheduler = DeepSeekV4SchedulerSim(
        ranks=R, decode_batch=b, max_seq_len=1024, num_blocks=dict(layout.num_blocks), seed=0
    )
    return executor, worker, engine, scheduler


def test_deepseek_dispatch_matches_the_recorded_abi_in_batch_order() -> None:
    executor, worker, engine, scheduler = deepseek_setup()
    specs = deepseek_v4_prepared_arguments(executor.preparer.layout)
    pointers: dict[tuple[int, str], int] = {}
    pending = None
    for step in range(30):
        batch = scheduler.step()
        batch.allow_device_greedy_sampling = step % 2 == 0
        submitted = executor.submit(batch)  # slot step % 2
        assert submitted.buffer_slot == step % 2
        compiled, args = worker.calls[-1]
        assert compiled is COMPILED and len(args) == 82
        for position, name in enumerate(DEEPSEEK_V4_DECODE_ARGUMENTS):
            value = args[position]
            if name in specs:
                spec = specs[name]
                assert isinstance(value, torch.Tensor) and spec.position == position
                assert value.dtype == spec.dtype and tuple(value.shape) == spec.shape, name
                assert value.is_shared() and value.is_contiguous()  # type: ignore[no-untyped-call]
                key = (submitted.buffer_slot, name)
                assert pointers.setdefault(key, value.data_ptr()) == value.data_ptr(), key
            else:
                assert value is engine[submitted.buffer_slot][name], name
        if pending is not None:  # the previous slot completes while this one is in flight
            reclaim_and_check(executor, pending)
        pending = submitted
    assert pending is not None
    reclaim_and_check(executor, pending)
    assert executor.busy_slots() == frozenset()
    assert len({ptr for (slot, _), ptr in pointers.items() if slot == 0}) == len(PREPARED_ARGUMENTS)


def reclaim_and_check(executor: DeepSeekV4RuntimeExecutor, pending: Any) -> None:
    inputs = pending.inputs
    result = executor.reclaim(pending)
    assert pending.handle.waited
    expected = [rank * 100 + row for rank, row in zip(inputs.ranks, inputs.local_rows, strict=True)]
    assert result.logits.dtype == torch.float32
    assert result.logits.shape == (len(expected), DS_VOCAB)
    assert result.logits[:, 0].tolist() == [float(v) for v in expected]
    if pending.greedy:
        assert result.sampled_token_ids[:, 0].tolist() == [v + 7 for v in expected]
    else:
        assert result.sampled_token_ids is None


def test_deepseek_busy_slot_is_refused_until_its_dispatch_completed() -> None:
    executor, worker, _, scheduler = deepseek_setup()
    worker.gate = threading.Event()
    first = executor.submit(scheduler.step(), buffer_slot=0)
    tables = {n: t.clone() for n, t in first.inputs.buffers().items()}
    with pytest.raises(RuntimeError, match="buffer slot 0 is still in flight"):
        executor.submit(scheduler.step(), buffer_slot=0)
    for name, before in tables.items():  # the refused step wrote nothing
        assert torch.equal(first.inputs.buffers()[name], before), name
    second = executor.submit(scheduler.step(), buffer_slot=1)
    assert executor.busy_slots() == {0, 1}
    # The device lane reclaims slot 0 on another thread; slot 0 stays busy until wait() returns.
    reclaimed: list[Any] = []
    lane = threading.Thread(target=lambda: reclaimed.append(executor.reclaim(first)))
    lane.start()
    lane.join(0.05)
    assert lane.is_alive() and 0 in executor.busy_slots()
    with pytest.raises(RuntimeError, match="still in flight"):
        executor.submit(scheduler.step(), buffer_slot=0)
    worker.gate.set()
    lane.join(10)
    assert reclaimed and executor.busy_slots() == {1}
    executor.reclaim(second)
    executor.submit(scheduler.step(), buffer_slot=0)  # free again


def test_deepseek_two_lanes() -> None:
    """Upstream's lanes: a command thread submits slot ``step % 2`` while a device thread
    reclaims the other; every handle checks its arguments were untouched until completion."""
    executor, _, _, scheduler = deepseek_setup()
    # The simulator's lists are live: each batch is made on the command lane, once a step.
    batch_of = once_a_step(scheduler.step)
    run_two_lanes(
        40,
        lambda step: executor.submit(batch_of(step), buffer_slot=step % 2),
        lambda pending: reclaim_and_check(executor, pending),
    )
    assert executor.busy_slots() == frozenset()


def once_a_step(make: Any) -> Any:
    """``make()``'s result for each step, made on the first call for that step (a command
    retried while its slot is in flight takes the same batch)."""
    made: dict[int, Any] = {}

    def of(step: int) -> Any:
        if step not in made:
            made[step] = make()
        return made[step]

    return of


def run_two_lanes(steps: int, command: Any, device: Any) -> None:
    """Upstream's worker lanes: a command thread runs ``command(step)`` (retrying while the
    slot is in flight: ``RuntimeError``) and queues its result; a device thread runs
    ``device(result)`` on each, in order. Errors of either lane fail the test."""
    queue: list[Any] = []
    ready = threading.Condition()
    errors: list[BaseException] = []

    def command_lane() -> None:
        try:
            for step in range(steps):
                while True:
                    try:
                        item = command(step)
                        break
                    except RuntimeError:  # that slot is still in flight: wait for the device
                        with ready:
                            ready.wait(0.01)
                with ready:
                    queue.append(item)
                    ready.notify_all()
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def device_lane() -> None:
        try:
            for _ in range(steps):
                with ready:
                    while not queue and not errors:
                        ready.wait(1)
                    if errors:
                        return
                    item = queue.pop(0)
                device(item)
                with ready:
                    ready.notify_all()
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=command_lane), threading.Thread(target=device_lane)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


def test_deepseek_refuses_private_memory_and_frees_the_slot() -> None:
    executor, worker, _, scheduler = deepseek_setup(share=False)
    with pytest.raises(PreparedArgumentError, match="shared memory"):
        executor.submit(scheduler.step(), buffer_slot=0)
    assert worker.calls == [] and executor.busy_slots() == frozenset()


def test_deepseek_engine_arguments_per_slot() -> None:
    executor, _, engine, _ = deepseek_setup()
    with pytest.raises(ValueError, match="one mapping per buffer slot"):
        DeepSeekV4RuntimeExecutor(FakeSubmitWorker(), COMPILED, executor.preparer, engine[:1])
    broken = [dict(engine[0]), dict(engine[1])]
    del broken[1]["logits"]
    with pytest.raises(KernelArgumentError, match="missing 1: logits"):
        DeepSeekV4RuntimeExecutor(FakeSubmitWorker(), COMPILED, executor.preparer, broken)


def test_deepseek_engine_arguments_resolved_at_the_first_dispatch() -> None:
    """Engine arguments given as a callable: the executor is built and a step prepared early
    before any weight exists (upstream's shape-only runner); the first dispatch resolves and
    checks them, once; a resolution that fails leaves the prepared slot prepared."""
    executor, _, engine, _ = deepseek_setup()
    layout = executor.preparer.layout
    calls: list[int] = []
    broken = [dict(engine[0]), dict(engine[1])]
    del broken[1]["logits"]
    answers = iter([broken, engine])

    def resolve() -> list[dict[str, object]]:
        calls.append(1)
        return next(answers)

    worker = FakeSubmitWorker()
    lazy = DeepSeekV4RuntimeExecutor(worker, COMPILED, executor.preparer, resolve)
    batch = one_per_rank(layout).step()
    slot = lazy.prepare_early(batch, buffer_slot=0)
    assert calls == [] and lazy.slot_stage(slot) == "prepared"
    with pytest.raises(KernelArgumentError, match="missing 1: logits"):
        lazy.submit_prepared(batch, slot)
    assert lazy.slot_stage(slot) == "prepared" and calls == [1]
    lazy.reclaim(lazy.submit_prepared(batch, slot))
    lazy.reclaim(lazy.submit(one_per_rank(layout).step(), buffer_slot=1))
    assert calls == [1, 1] and lazy.engine_arguments is not None


def test_deepseek_prepared_inputs_give_upstreams_prepare_decode_its_record() -> None:
    """``prepare_early`` returns the slot; ``prepared_inputs(slot)`` the record upstream's
    ``prepare_decode`` returns (the slot's views and the assignment), while the slot is
    prepared; after the dispatch or a cancel there is none."""
    executor, _, _, _ = deepseek_setup()
    scheduler = one_per_rank(executor.preparer.layout)
    batch = scheduler.step()
    with pytest.raises(RuntimeError, match="holds no step prepared by prepare_early: it is free"):
        executor.prepared_inputs(0)
    slot = executor.prepare_early(batch, buffer_slot=1)
    record = executor.prepared_inputs(slot)
    assert record.buffer_slot == 1 and record.request_ids == tuple(batch.request_ids)
    assert record.input_ids.data_ptr() == executor.preparer.slot_buffers(1)["input_ids"].data_ptr()
    executor.cancel(slot)
    with pytest.raises(RuntimeError, match="it is free"):
        executor.prepared_inputs(slot)
    slot = executor.prepare_early(batch, buffer_slot=1)
    pending = executor.submit_prepared(batch, slot)
    with pytest.raises(RuntimeError, match="it is in flight"):
        executor.prepared_inputs(slot)
    executor.reclaim(pending)


def test_deepseek_two_lanes_with_early_prepare() -> None:
    """Upstream's worker as it runs DeepSeek: the command lane prepares slot ``step % 2`` early
    (placeholder tokens) while the device lane re-stages the other slot's tokens, dispatches and
    reclaims it. Every dispatched slot equals the reference rebuild of its batch, every handle
    checks its arguments were untouched until completion."""
    from blockprep.reference import deepseek_v4_decode_rebuild

    executor, _, _, _ = deepseek_setup()
    layout = executor.preparer.layout
    scheduler = one_per_rank(layout)  # upstream's early rule: one request per rank

    batch_of = once_a_step(lambda: pickle.loads(pickle.dumps(scheduler.step())))  # the wire

    def command(step: int) -> tuple[DecodeBatch, int]:
        batch = batch_of(step)
        return batch, executor.prepare_early(batch, buffer_slot=step % 2)

    def device(item: tuple[DecodeBatch, int]) -> None:
        batch, slot = item
        pending = executor.submit_prepared(batch, slot)
        expected = deepseek_v4_decode_rebuild(
            batch,
            ranks=R,
            decode_batch=b,
            decode_seq=layout.decode_seq,
            num_blocks=layout.num_blocks,
        )
        for name, tensor in pending.inputs.buffers().items():
            assert torch.equal(tensor, expected[name]), f"slot {slot} {name}"
        reclaim_and_check(executor, pending)

    run_two_lanes(40, command, device)
    assert executor.busy_slots() == frozenset()


def one_per_rank(layout: DeepSeekV4Layout) -> DeepSeekV4SchedulerSim:
    return DeepSeekV4SchedulerSim(
        ranks=R, decode_batch=1, max_seq_len=1024, num_blocks=dict(layout.num_blocks), seed=1
    )


def test_deepseek_submit_prepared_needs_an_early_prepare() -> None:
    executor, worker, _, _ = deepseek_setup()
    scheduler = one_per_rank(executor.preparer.layout)
    batch = scheduler.step()
    with pytest.raises(RuntimeError, match="was not prepared by prepare_early"):
        executor.submit_prepared(batch, 0)
    slot = executor.prepare_early(batch, buffer_slot=0)
    other = scheduler.step()
    other.request_ids = [f"not {r}" for r in other.request_ids]  # not the requests prepared there
    with pytest.raises(ValueError, match="request order changed"):
        executor.submit_prepared(other, slot)
    # The slot stays prepared (submit it again, or cancel it), nothing dispatched.
    assert executor.busy_slots() == {slot} and worker.calls == []
    executor.cancel(slot)
    assert executor.busy_slots() == frozenset()
