"""The real transport, on a CPU: upstream's runtime forks its chip workers after the decode
buffers exist, and each child reads them through the mapping it inherited. Here the Qwen preparer
is built (shared memory, its CPU default), a child is forked, the parent prepares a few hundred
steps of a scheduler trace, and after each step the child, which never writes, checks what it
sees in the inherited buffers against upstream's construction (``blockprep.reference``) run on
the same trace. Parent and child go in lockstep over a pipe."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import traceback
from multiprocessing.connection import Connection

import pytest
import torch
from test_runtime_executors import MAX_SEQ, PAGE, B, as_block_ids, qwen_trace

from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97

STEPS, SEED = 300, 11
REJECT_EVERY = 37  # an invalid batch now and then: the parent's buffers must stay as they were


def trace() -> list[tuple[bool, object]]:
    """``(valid, batch)`` per step, the same in parent and child (seeded)."""
    steps: list[tuple[bool, object]] = []
    for step, batch in enumerate(qwen_trace(STEPS, SEED)):
        if step % REJECT_EVERY == REJECT_EVERY - 1:
            seq_lens = batch.seq_lens.clone()
            seq_lens[-1] = MAX_SEQ + 1  # "decode seq_len ... exceeds max_seq_len"
            steps.append((False, dataclasses.replace(as_block_ids(batch), seq_lens=seq_lens)))
        steps.append((True, batch))
    return steps


def child(connection: Connection, buffers: dict[str, torch.Tensor]) -> None:
    """Check every step the parent announces; reply ``None`` or the failure."""
    try:
        upstream = QwenDecodePrep97(B, MAX_SEQ, PAGE, 8)
        for index, (valid, batch) in enumerate(trace()):
            assert connection.recv() == index
            if valid:
                upstream.prepare(as_block_ids(batch))  # type: ignore[arg-type]
            mismatched = [
                name
                for name, tensor in buffers.items()
                if not torch.equal(tensor, getattr(upstream, name))
            ]
            connection.send(f"step {index}: {mismatched} differ" if mismatched else None)
        connection.send("done")
    except BaseException:
        connection.send(traceback.format_exc())
    finally:
        connection.close()


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method"
)
def test_forked_child_sees_every_step() -> None:
    preparer = QwenDecodePreparer(B, MAX_SEQ, PAGE)  # shared memory by default on the CPU
    buffers = preparer.buffers()
    assert all(t.is_shared() for t in buffers.values())  # type: ignore[no-untyped-call]
    pointers = {name: t.data_ptr() for name, t in buffers.items()}
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    worker = context.Process(target=child, args=(theirs, buffers), daemon=True)
    sys.stdout.flush()
    worker.start()  # the fork: after the buffers exist, before any step, as upstream's worker
    theirs.close()
    try:
        for index, (valid, batch) in enumerate(trace()):
            if valid:
                preparer.prepare(batch)  # type: ignore[arg-type]
            else:
                with pytest.raises(ValueError, match="exceeds max_seq_len"):
                    preparer.prepare(batch)  # type: ignore[arg-type]
            ours.send(index)
            assert ours.poll(60), f"the child did not answer step {index}"
            reply = ours.recv()
            assert reply is None, reply
        assert ours.recv() == "done"
    finally:
        ours.close()  # a child still waiting for a step sees the end of the pipe
        worker.join(60)
        if worker.is_alive():  # pragma: no cover - a hung child
            worker.kill()
    assert worker.exitcode == 0
    assert {name: t.data_ptr() for name, t in preparer.buffers().items()} == pointers
