"""The runtime executors (:mod:`blockprep.executors.runtime`): their slot bookkeeping with
dispatch identity, and their argument checks; every refusal writes nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from test_runtime_executors import (
    COMPILED,
    MAX_SEQ,
    PAGE,
    B,
    FakeQwenWorker,
    deepseek_setup,
    one_per_rank,
    qwen_engine,
    reclaim_and_check,
    shared,
)

from blockprep import BlockprepError, DecodeBatch
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.executors.runtime import DeepSeekV4RuntimeExecutor, Qwen3RuntimeExecutor
from blockprep.reference import deepseek_v4_decode_rebuild
from blockprep.wire import BlockDeltaEncoder


def snapshot(executor: DeepSeekV4RuntimeExecutor, slot: int) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in executor.preparer.slot_buffers(slot).items()}


def assert_unchanged(
    executor: DeepSeekV4RuntimeExecutor, slot: int, before: dict[str, torch.Tensor]
) -> None:
    for name, tensor in executor.preparer.slot_buffers(slot).items():
        assert torch.equal(tensor, before[name]), name


def refused(call: Any, words: str) -> None:
    with pytest.raises(RuntimeError, match=words) as info:
        call()
    assert isinstance(info.value, BlockprepError)


def early_setup() -> tuple[DeepSeekV4RuntimeExecutor, Any, Any]:
    executor, worker, _, _ = deepseek_setup()
    worker.gate = threading.Event()
    worker.gate.set()
    return executor, worker, one_per_rank(executor.preparer.layout)


def expected_of(executor: DeepSeekV4RuntimeExecutor, batch: DecodeBatch) -> dict[str, Any]:
    layout = executor.preparer.layout
    return deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
    )


def test_submit_prepared_twice_on_one_early_slot_is_refused() -> None:
    """9ea27c1 re-staged the slot's tokens while the first dispatch was in flight and
    dispatched again (the first dispatch ran with one token, its buffer held another)."""
    executor, worker, scheduler = early_setup()
    batch = scheduler.step()
    slot = executor.prepare_early(batch, buffer_slot=0)
    assert executor.slot_stage(slot) == "prepared"
    pending = executor.submit_prepared(batch, slot)
    assert executor.slot_stage(slot) == "in flight"
    before = snapshot(executor, slot)
    again = DecodeBatch(**{**batch.__dict__, "token_ids": batch.token_ids + 11})
    refused(lambda: executor.submit_prepared(again, slot), "not prepared by prepare_early")
    assert_unchanged(executor, slot, before)
    assert len(worker.calls) == 1
    reclaim_and_check(executor, pending)
    assert executor.busy_slots() == frozenset()


def test_submit_prepared_refuses_a_slot_that_submit_dispatched() -> None:
    executor, worker, scheduler = early_setup()
    pending = executor.submit(scheduler.step(), buffer_slot=1)
    before = snapshot(executor, 1)
    refused(lambda: executor.submit_prepared(scheduler.step(), 1), "it is in flight")
    assert_unchanged(executor, 1, before)
    assert len(worker.calls) == 1 and executor.slot_stage(1) == "in flight"
    reclaim_and_check(executor, pending)


def test_a_failed_submit_prepared_leaves_the_slot_prepared() -> None:
    """9ea27c1 released the claimed slot on any error, so the next submit into it was accepted
    while the early step was still the engine's; now the slot stays prepared."""
    executor, worker, scheduler = early_setup()
    batch = scheduler.step()
    slot = executor.prepare_early(batch, buffer_slot=0)
    before = snapshot(executor, slot)
    moved = DecodeBatch(**{**batch.__dict__, "request_ids": ["someone else"] * 2})
    with pytest.raises(ValueError):
        executor.submit_prepared(moved, slot)
    assert executor.slot_stage(slot) == "prepared" and worker.calls == []
    assert_unchanged(executor, slot, before)
    refused(lambda: executor.submit(scheduler.step(), buffer_slot=slot), "still in flight")
    pending = executor.submit_prepared(batch, slot)  # the right batch: dispatched
    for name, tensor in pending.inputs.buffers().items():
        assert torch.equal(tensor, expected_of(executor, batch)[name]), name
    reclaim_and_check(executor, pending)


def test_reclaim_accepts_only_the_slots_current_dispatch_once() -> None:
    """9ea27c1: submit(a), reclaim(a), submit(b) into the slot, reclaim(a) again returned b's
    logits as a's and freed the slot under b."""
    executor, worker, _, scheduler = deepseek_setup()
    worker.gate = threading.Event()
    first = executor.submit(scheduler.step(), buffer_slot=0)
    worker.gate.set()
    reclaim_and_check(executor, first)
    refused(lambda: executor.reclaim(first), f"dispatch {first.dispatch} of buffer slot 0")
    worker.gate = threading.Event()  # b's dispatch stays in flight
    second = executor.submit(scheduler.step(), buffer_slot=0)
    assert second.dispatch != first.dispatch
    refused(lambda: executor.reclaim(first), "not in flight on this executor")
    assert executor.slot_stage(0) == "in flight" and not second.handle.waited
    refused(lambda: executor.submit(scheduler.step(), buffer_slot=0), "still in flight")
    worker.gate.set()
    reclaim_and_check(executor, second)
    with pytest.raises(TypeError, match="DeepSeekV4PendingDecode"):
        executor.reclaim(object())  # type: ignore[arg-type]


def test_reclaiming_another_executors_pending_decode_is_refused() -> None:
    one, worker_one, _, scheduler_one = deepseek_setup()
    two, worker_two, _, scheduler_two = deepseek_setup()
    worker_one.gate, worker_two.gate = threading.Event(), threading.Event()
    mine = one.submit(scheduler_one.step(), buffer_slot=0)
    theirs = two.submit(scheduler_two.step(), buffer_slot=0)
    refused(lambda: one.reclaim(theirs), "another executor's")
    assert one.slot_stage(0) == "in flight" and two.slot_stage(0) == "in flight"
    assert not mine.handle.waited and not theirs.handle.waited
    worker_one.gate.set()
    worker_two.gate.set()
    reclaim_and_check(one, mine)
    reclaim_and_check(two, theirs)


def test_cancel_releases_a_prepared_slot_the_engine_drops() -> None:
    """9ea27c1 had no way to release a slot prepare_early claimed: it stayed busy forever."""
    executor, worker, scheduler = early_setup()
    refused(lambda: executor.cancel(0), "cannot cancel buffer slot 0: it is free")
    slot = executor.prepare_early(scheduler.step(), buffer_slot=0)
    executor.cancel(slot)
    assert executor.busy_slots() == frozenset() and worker.calls == []
    refused(lambda: executor.submit_prepared(scheduler.step(), slot), "not prepared")
    refused(lambda: executor.cancel(slot), "it is free")
    batch = scheduler.step()
    pending = executor.submit(batch, buffer_slot=slot)  # prepared anew
    for name, tensor in pending.inputs.buffers().items():
        assert torch.equal(tensor, expected_of(executor, batch)[name]), name
    refused(lambda: executor.cancel(slot), "it is in flight")
    reclaim_and_check(executor, pending)
    for call in (executor.cancel, executor.slot_stage, executor.prepared_inputs):
        with pytest.raises(ValueError, match=r"^decode buffer_slot must be 0 or 1, got 5$"):
            call(5)  # the preparer's (upstream's) words, as prepare_early's


# --- the executors' arguments --------------------------------------------------------------------


def test_executors_refuse_the_wrong_preparer_or_engine_arguments_with_a_type_error() -> None:
    deepseek, _, engine, _ = deepseek_setup()
    qwen = QwenDecodePreparer(B, MAX_SEQ, PAGE)
    cases = [
        (
            lambda: Qwen3RuntimeExecutor(
                FakeQwenWorker(),
                COMPILED,
                deepseek.preparer,  # type: ignore[arg-type]
                qwen_engine(),
            ),
            "preparer must be a QwenDecodePreparer, got DeepSeekV4DecodePreparer",
        ),
        (
            lambda: Qwen3RuntimeExecutor(
                FakeQwenWorker(),
                COMPILED,
                qwen,
                list(qwen_engine().items()),  # type: ignore[arg-type]
            ),
            "engine_arguments must map upstream's argument names to values, got list",
        ),
        (
            lambda: DeepSeekV4RuntimeExecutor(
                FakeQwenWorker(),  # type: ignore[arg-type]
                COMPILED,
                qwen,  # type: ignore[arg-type]
                engine,
            ),
            "preparer must be a DeepSeekV4DecodePreparer, got QwenDecodePreparer",
        ),
        (
            lambda: DeepSeekV4RuntimeExecutor(
                FakeQwenWorker(),  # type: ignore[arg-type]
                COMPILED,
                deepseek.preparer,
                {0: engine[0], 1: engine[1]},  # type: ignore[arg-type]
            ),
            "engine_arguments must be a sequence of mappings, one per buffer slot, got dict",
        ),
        (
            lambda: DeepSeekV4RuntimeExecutor(
                FakeQwenWorker(),  # type: ignore[arg-type]
                COMPILED,
                deepseek.preparer,
                [engine[0], list(engine[1].items())],  # type: ignore[list-item]
            ),
            r"engine_arguments\[1\] must map upstream's argument names to values, got list",
        ),
    ]
    for call, words in cases:
        with pytest.raises(TypeError, match=words) as info:
            call()
        assert isinstance(info.value, BlockprepError)


@pytest.mark.parametrize("vocab_size", [0, -3, 17])
def test_qwen_vocab_size_must_fit_the_logits(vocab_size: int) -> None:
    """9ea27c1 accepted 0 (empty logits) and silently returned 16 columns for 17."""
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE)
    with pytest.raises(ValueError, match=rf"vocab_size must be in \[1, 16\].*got {vocab_size}$"):
        Qwen3RuntimeExecutor(
            FakeQwenWorker(), COMPILED, preparer, qwen_engine(), vocab_size=vocab_size
        )
    executor = Qwen3RuntimeExecutor(
        FakeQwenWorker(), COMPILED, preparer, qwen_engine(), vocab_size=16
    )
    with pytest.raises(ValueError, match="logits have 8 columns, fewer than vocab_size 16"):
        executor.arguments(_qwen_batch(), arguments={"logits": shared(B, 8)})


def _qwen_batch(message: dict[str, Any] | None = None, seq: int = 5) -> DecodeBatch:
    return DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([3]),
        hidden_states=None,
        seq_lens=torch.tensor([seq]),
        block_ids=None if message is not None else [[1, 2]],
        block_deltas=message,
    )


@pytest.mark.parametrize(
    "arguments", [{"seq_lens": None}, {"not an argument": 1}, [("logits", None)]]
)
def test_qwen_refuses_a_bad_arguments_before_preparing(arguments: Any) -> None:
    """9ea27c1 prepared first: the buffers held the refused step and the delta cursor had
    moved, so the engine's retry of the same message was refused as out of sequence."""
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE)
    worker = FakeQwenWorker()
    executor = Qwen3RuntimeExecutor(worker, COMPILED, preparer, qwen_engine())
    encoder = BlockDeltaEncoder()
    executor.run_decode(_qwen_batch(encoder.encode(["a"], [[1]]), seq=5))
    message = encoder.encode(["a"], [[1, 2]])
    before = {n: t.clone() for n, t in preparer.buffers().items()}
    with pytest.raises((ValueError, TypeError)) as info:
        executor.run_decode(_qwen_batch(message, seq=70), arguments=arguments)
    assert isinstance(info.value, BlockprepError)
    for name, tensor in preparer.buffers().items():
        assert torch.equal(tensor, before[name]), name
    assert len(worker.calls) == 1
    result = executor.run_decode(_qwen_batch(message, seq=70))  # the same message: in sequence
    assert result.logits is not None and result.logits[0, 0].item() == 70.0
