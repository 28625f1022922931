"""The resync back channel across two real processes.

The scheduler (this process: a DeepSeek V4 KV manager simulation calling a
:class:`~blockprep.events.BlockEventRecorder` as it acts) sends each step's batch with a packed
message through a ``multiprocessing`` queue to a worker process (spawned: a fresh interpreter)
that prepares it; a faulty channel in between drops, duplicates, reorders, truncates,
bit-flips and replays messages. The worker answers every message it receives: applied (with
the buffers of the slot it wrote), or refused (with the proof that no buffer changed, and its
:func:`~blockprep.wire.resync_request`). The scheduler honours each resync request. Every
applied message must leave the buffers equal to the reference rebuild of the batch it was
made for, and after the faults stop, the channel must bring both ends back to exact buffers.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import struct
from typing import Any

import numpy as np
import pytest

from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.events import BlockEventRecorder
from blockprep.packed import message as packed_message
from blockprep.reference import deepseek_v4_decode_rebuild
from blockprep.simulation import DEEPSEEK_V4_CACHE_GROUPS, DeepSeekV4SchedulerSim
from blockprep.wire import is_resync_request

RANKS, BATCH, MAX_SEQ = 2, 4, 2048
GROUPS = [name for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS]


def _sim(recorder: BlockEventRecorder | None) -> DeepSeekV4SchedulerSim:
    return DeepSeekV4SchedulerSim(
        ranks=RANKS,
        decode_batch=BATCH,
        max_seq_len=MAX_SEQ,
        seed=5,
        join_probability=0.6,
        leave_probability=0.08,
        prompt_lengths=(1, 900),
        max_advance=40,
        shuffle=True,
        fresh_lists=True,
        recorder=recorder,
    )


def _layout() -> DeepSeekV4Layout:
    return DeepSeekV4Layout(
        ranks=RANKS, decode_batch=BATCH, max_seq_len=MAX_SEQ, num_blocks=_sim(None).num_blocks
    )


def _buffers(views: Any) -> dict[str, np.ndarray]:
    return {name: t.numpy().copy() for name, t in views.buffers().items()}


def worker(inbox: Any, outbox: Any) -> None:
    """The worker process: prepare each batch into slot ``seq % 2``; answer what happened."""
    preparer = DeepSeekV4DecodePreparer(_layout(), buffer_slots=2)
    while True:
        item = inbox.get()
        if item is None:
            return
        tag, batch = item
        slot = batch.block_deltas.get("seq", 0) % 2 if type(batch.block_deltas) is dict else 0
        slot = slot if type(slot) is int else 0
        before = [
            {n: t.clone() for n, t in preparer._tables.tables(s).items()}
            if preparer._tables is not None
            else {}
            for s in range(2)
        ]
        try:
            views = preparer.prepare(batch, buffer_slot=slot)
        except ValueError as error:
            after = [
                preparer._tables.tables(s) if preparer._tables is not None else {} for s in range(2)
            ]
            unchanged = all(before[s][n].equal(after[s][n]) for s in range(2) for n in before[s])
            outbox.put((tag, "refused", type(error).__name__, unchanged, preparer.resync_request()))
        else:
            outbox.put((tag, "applied", slot, _buffers(views), None))


def _rebuild(batch: DecodeBatch, layout: DeepSeekV4Layout) -> dict[str, np.ndarray]:
    full = deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
    )
    return {name: t.numpy() for name, t in full.items()}


def _corrupt(message: dict[str, Any], how: str, rng: random.Random) -> dict[str, Any]:
    """A message damaged on the way (caught by the checksum), or a sealed one that carries a
    bad record (caught by the tables: an id out of range)."""
    data = message["data"]
    if how == "truncate":
        return dict(message, data=data[: max(0, len(data) - 4 * rng.randint(1, 3))])
    if how == "flip" and data:
        i = rng.randrange(len(data))
        flipped = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
        return dict(message, data=flipped)
    if how == "flip-header":
        return dict(message, seq=message["seq"] ^ 4)
    words = data + struct.pack("<5i", 2, 0, 0, 1, -1)  # append id -1 to row 0's first group
    count = message["count"] + 1
    return packed_message(message["seq"], message["base"], count, words)


@pytest.mark.parametrize("seed", [0, 1])
def test_faulty_channel_two_processes(seed: int) -> None:
    """Lost, duplicated, reordered, truncated, bit-flipped, badly sealed and replayed messages
    between two processes: each bad one refused with nothing written, each applied one exact,
    and the resync requests bring the ends back together once the faults stop."""
    rng = random.Random(seed)
    layout = _layout()
    recorder = BlockEventRecorder(GROUPS)
    sim = _sim(recorder)
    context = multiprocessing.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = context.Process(target=worker, args=(inbox, outbox), daemon=True)
    process.start()
    made: dict[int, DecodeBatch] = {}  # message seq -> the batch it was made for
    wires: dict[int, DecodeBatch] = {}  # message seq -> what was sent for it
    faults = dict.fromkeys(["lost", "dup", "late", "bad", "replay"], 0)
    outcomes = dict.fromkeys(["applied", "refused"], 0)
    held_back: list[tuple[int, DecodeBatch]] = []
    steps, clean = 80, 8
    last = None
    try:
        for step in range(steps):
            batch = sim.step()
            message = recorder.message(batch.request_ids)
            seq = message["seq"]
            wire = dataclasses.replace(batch, block_ids_by_group=[], block_deltas=message)
            made[seq], wires[seq] = batch, wire
            faulty = step < steps - clean
            fault = rng.random() if faulty else 1.0
            sends: list[tuple[int, DecodeBatch]] = []
            if fault < 0.08:
                faults["lost"] += 1
            elif fault < 0.16:
                sends = [(seq, wire), (seq, wire)]
                faults["dup"] += 1
            elif fault < 0.24:
                held_back.append((seq, wire))
            elif fault < 0.38:
                how = rng.choice(["truncate", "flip", "flip-header", "sealed"])
                sends = [(seq, dataclasses.replace(wire, block_deltas=_corrupt(message, how, rng)))]
                faults["bad"] += 1
            else:
                sends = [(seq, wire)]
            if held_back and (fault >= 0.24 or not faulty) and step < steps - 3:
                sends.append(held_back.pop(0))  # a message arriving after newer ones
                faults["late"] += 1
            if faulty and step > 5 and rng.random() < 0.06:
                old = rng.choice(sorted(wires)[:-1])
                sends.append((old, wires[old]))
                faults["replay"] += 1
            for item in sends:
                inbox.put(item)
            for _ in sends:
                tag, outcome, info, payload, request = outbox.get(timeout=120)
                outcomes[outcome] += 1
                last = (tag, outcome)
                if outcome == "refused":
                    assert payload is True, f"message {tag}: refused ({info}) but a buffer changed"
                    assert is_resync_request(request), request
                    recorder.resync(request)
                    continue
                expected = _rebuild(made[tag], layout)
                for name, want in expected.items():
                    assert np.array_equal(payload[name], want), (
                        f"message {tag} applied into slot {info}: {name} is not the rebuild"
                    )
        assert last is not None and last == (steps - 1, "applied"), last
    finally:
        inbox.put(None)
        process.join(timeout=60)
    assert all(faults.values()) and outcomes["refused"], (faults, outcomes)
