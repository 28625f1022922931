"""DeepSeek V4 adapter on long simulated traces: after every step, every buffer of every slot
equals upstream's full rebuild (blockprep.reference.deepseek_v4_decode_rebuild)."""

from __future__ import annotations

import random
from dataclasses import dataclass

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
from blockprep.reference import deepseek_v4_decode_rebuild, deepseek_v4_x_hc
from blockprep.testing import DeepSeekV4SchedulerSim

STEPS = 500


def buffers(inputs: DeepSeekV4DecodeInputs) -> dict[str, torch.Tensor]:
    found = {name: inputs.tables[name] for name in GROUP_NAMES}
    found.update({name: getattr(inputs, name) for name in INPUT_FIELDS})
    if inputs.x_hc is not None:
        found["x_hc"] = inputs.x_hc
    return found


def expected(
    batch: DecodeBatch, layout: DeepSeekV4Layout, *, mtp: bool, host: bool, fix: bool
) -> dict[str, torch.Tensor]:
    shape = {"ranks": layout.ranks, "decode_batch": layout.decode_batch}
    rebuilt = deepseek_v4_decode_rebuild(
        batch,
        **shape,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        mtp=mtp,
        fix=fix,
    )
    if host:
        rebuilt["x_hc"] = deepseek_v4_x_hc(batch, **shape, decode_seq=layout.decode_seq, mtp=mtp)
    return rebuilt


@dataclass(frozen=True)
class Trace:
    seed: int
    ranks: int = 8
    decode_batch: int = 8
    sim_batch: int | None = None  # requests per rank the scheduler admits (default decode_batch)
    decode_seq: int = 1
    mtp: bool = False
    host: bool = False
    shuffle: bool = False
    join: float = 0.3
    leave: float = 0.02
    fix: bool = False


TRACES = [
    Trace(seed=1, join=0.15, leave=0.03),
    Trace(seed=2, ranks=4, decode_batch=4, shuffle=True, join=0.4, leave=0.08, fix=True),
    Trace(seed=3, ranks=4, decode_batch=6, decode_seq=2, mtp=True, host=True, leave=0.05, fix=True),
    Trace(seed=4, ranks=3, decode_batch=4, sim_batch=1, decode_seq=2, join=0.2, leave=0.1),
]


@pytest.mark.parametrize("trace", TRACES, ids=lambda t: f"seed{t.seed}")
def test_every_buffer_equals_the_reference_rebuild_after_every_step(trace: Trace) -> None:
    sim = DeepSeekV4SchedulerSim(
        ranks=trace.ranks,
        decode_batch=trace.sim_batch or trace.decode_batch,
        seed=trace.seed,
        join_probability=trace.join,
        leave_probability=trace.leave,
        prompt_lengths=(1, 700),
        max_advance=2 if trace.mtp else 1,
        shuffle=trace.shuffle,
        hidden_size=8 if trace.host else None,
    )
    layout = DeepSeekV4Layout(
        ranks=trace.ranks,
        decode_batch=trace.decode_batch,
        decode_seq=trace.decode_seq,
        num_blocks=sim.num_blocks,
    )
    preparer = DeepSeekV4DecodePreparer(
        layout, embedding="host" if trace.host else "device", hidden_size=8 if trace.host else None
    )
    rng = random.Random(trace.seed)
    last: dict[int, dict[str, torch.Tensor]] = {}
    views: dict[int, DeepSeekV4DecodeInputs] = {}
    pointers: dict[int, dict[str, int]] = {}
    occupancy: set[int] = set()
    for step in range(STEPS):
        batch = sim.step()
        occupancy.update(sim.counts())
        # Mostly ping-pong, sometimes the same slot twice in a row.
        slot = step % 2 if rng.random() < 0.8 else rng.randrange(2)
        prepare = preparer.prepare_mtp if trace.mtp else preparer.prepare
        inputs = views[slot] = prepare(batch, buffer_slot=slot)
        assert inputs.buffer_slot == slot
        last[slot] = expected(batch, layout, mtp=trace.mtp, host=trace.host, fix=trace.fix)
        found = buffers(inputs)
        ptrs = {name: tensor.data_ptr() for name, tensor in found.items()}
        assert pointers.setdefault(slot, ptrs) == ptrs, "a buffer moved"
        for name, tensor in found.items():
            assert torch.equal(tensor, last[slot][name]), (step, slot, name)
        other = 1 - slot
        if other in last:  # the other slot still holds exactly its own last step
            for name, tensor in buffers(views[other]).items():
                assert torch.equal(tensor, last[other][name]), (step, other, name)
    ceiling = trace.sim_batch or trace.decode_batch
    assert occupancy == set(range(ceiling + 1)), "ranks did not run from empty to full"
