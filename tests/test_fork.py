"""Fork safety (:mod:`blockprep.forks`): a child forked whatever the parent's threads were doing
works (a child forked while another thread was inside a DeepSeek prepare once inherited the plan
lock held and hung in its first prepare, and verify mode hung on torch's OpenMP pool). Each
child runs under a deadline: a hang fails the test (the child is killed), it never blocks the
suite."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_deepseek_lifecycle import assert_equal, reference, sim
from test_runtime_executors import deepseek_setup

from blockprep import BlockTable, buffers
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.deepseek.abi import deepseek_v4_argument_values

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

DEADLINE = 60.0


def in_child(work: Callable[[], object]) -> object:
    """``work()``'s result in a forked child, or its traceback; ``AssertionError`` when the
    child did not finish within ``DEADLINE`` seconds (it is killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one thread, whatever the parent's were doing
        os.close(read)
        try:
            payload = pickle.dumps(("ok", work()))
        except BaseException:
            payload = pickle.dumps(("error", traceback.format_exc()))
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read)
        raise AssertionError(f"the forked child did not finish within {DEADLINE} s (a hang)")
    with os.fdopen(read, "rb") as source:
        status, value = pickle.loads(source.read())
    assert status == "ok", value
    return value


def hold_inside(preparer: DeepSeekV4DecodePreparer, batch: Any) -> tuple[Any, Any, Any]:
    """A thread inside ``preparer.prepare(batch, buffer_slot=1)``, holding the slot's lock and
    the plan lock, blocked until the returned event is set."""
    inside, release = threading.Event(), threading.Event()
    original = preparer._grouped

    def blocking() -> Any:
        inside.set()
        release.wait(30)
        return original()

    preparer._grouped = blocking  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: preparer.prepare(batch, buffer_slot=1))
    thread.start()
    assert inside.wait(10)
    assert preparer._plan_lock.locked()
    return thread, release, original


@pytest.mark.parametrize("verify", [False, True])
def test_a_child_forked_during_a_prepare_on_another_thread_prepares(verify: bool) -> None:
    s = sim(ranks=2, decode_batch=2, seed=5)
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=2, verify=verify)
    preparer.prepare(s.step(), buffer_slot=0)
    torch.zeros(1 << 22).add_(1).sum()  # torch's intra-op pool running in the parent
    batch = s.step()
    thread, release, original = hold_inside(preparer, batch)
    try:
        following = s.step()

        def child() -> str:
            preparer._grouped = original  # type: ignore[method-assign]
            for slot in (1, 0):  # the held slot too: its step never finished here
                assert_equal(
                    deepseek_v4_argument_values(preparer.prepare(following, buffer_slot=slot)),
                    expected,
                )
            return "prepared"

        expected = reference(following, layout)
        assert in_child(child) == "prepared"
    finally:
        release.set()
        thread.join(30)
    assert_equal(deepseek_v4_argument_values(preparer.prepare(following, buffer_slot=0)), expected)


def test_verify_mode_works_in_a_forked_child() -> None:
    """torch's OpenMP pool after a fork: the child's first parallel operation waited forever."""
    s = sim(ranks=4, decode_batch=4, seed=2)
    layout = DeepSeekV4Layout(ranks=4, decode_batch=4, num_blocks=s.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout, verify=True)
    preparer.prepare(s.step())
    torch.zeros(1 << 22).add_(1).sum()
    batch = s.step()
    expected = reference(batch, layout)

    def child() -> bool:
        assert_equal(deepseek_v4_argument_values(preparer.prepare(batch)), expected)
        big = torch.ones(1 << 22)
        return bool(big.add(1).sum().item() == 2 * (1 << 22))

    assert in_child(child) is True


def test_a_child_forked_while_the_buffer_registry_is_locked_claims_buffers() -> None:
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with buffers.host._LOCK:
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    try:
        assert in_child(lambda: BlockTable(2, 4).write_row(0, [1, 2])) is not None
    finally:
        release.set()
        thread.join(30)


def test_an_executor_in_a_child_forked_during_a_reclaim() -> None:
    """The reclaiming thread is gone in the child: its slot is back in flight there (the child
    may not reuse it), the executor's lock is new, the other slot takes a step."""
    executor, worker, _, scheduler = deepseek_setup()
    worker.gate = threading.Event()
    pending = executor.submit(scheduler.step(), buffer_slot=0)
    lane = threading.Thread(target=lambda: executor.reclaim(pending))
    lane.start()
    deadline = time.monotonic() + 10
    while executor.slot_stage(0) != "reclaiming" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert executor.slot_stage(0) == "reclaiming"
    batch = scheduler.step()

    def child() -> tuple[Any, Any, Any]:
        stage = executor.slot_stage(0)
        worker.gate = None  # the child's dispatches complete at once
        other = executor.submit(batch, buffer_slot=1)
        executor.reclaim(other)
        return stage, executor.slot_stage(1), sorted(executor.busy_slots())

    try:
        assert in_child(child) == ("in flight", None, [0])
    finally:
        worker.gate.set()
        lane.join(30)
    assert executor.busy_slots() == frozenset()


if sys.platform != "linux":  # pragma: no cover - the suite's CI runs on Linux
    pytestmark = pytest.mark.skip(reason="fork semantics checked on Linux")
