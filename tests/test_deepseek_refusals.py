"""Issue 19 refusals of the DeepSeek V4 preparer and the grouped tables: each a clear error naming
the place and the value, and nothing written (every buffer compared with a copy taken before)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, deepseek_v4_decode_layout
from blockprep.adapters.deepseek.layout import UNBOUND, DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.grouped import GroupedTables, TableGroup
from blockprep.testing import DeepSeekV4SchedulerSim


def snapshot(preparer: DeepSeekV4DecodePreparer) -> list[dict[str, torch.Tensor]]:
    return [
        {n: t.clone() for n, t in preparer.slot_buffers(s).items()}
        for s in range(preparer.buffer_slots)
    ]


def assert_unchanged(preparer: DeepSeekV4DecodePreparer, before: list[dict[str, Any]]) -> None:
    for slot, saved in enumerate(snapshot(preparer)):
        for name, tensor in saved.items():
            assert torch.equal(tensor, before[slot][name]), (slot, name)


def prepared() -> tuple[DeepSeekV4DecodePreparer, DecodeBatch]:
    """A preparer with one step prepared into each slot, and the next batch."""
    sim = DeepSeekV4SchedulerSim(ranks=2, decode_batch=2, seed=3, fresh_lists=True)
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=sim.num_blocks)
    preparer = DeepSeekV4DecodePreparer(layout)
    for slot in (0, 1):
        preparer.prepare(sim.step(), buffer_slot=slot)
    return preparer, sim.step()


@pytest.mark.parametrize("slot", [torch.tensor([1]), torch.tensor([[0]])])
def test_buffer_slot_of_a_one_element_tensor_is_refused(slot: torch.Tensor) -> None:
    preparer, batch = prepared()
    before = snapshot(preparer)
    shape = list(slot.shape)
    match = rf"buffer_slot must be an integer, got a Tensor of shape \{shape}"
    with pytest.raises(TypeError, match=match):
        preparer.prepare(batch, buffer_slot=slot)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=match):
        preparer.restage(batch, buffer_slot=slot)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=match):
        preparer.slot_buffers(slot)  # type: ignore[arg-type]
    assert_unchanged(preparer, before)
    preparer.prepare(batch, buffer_slot=torch.tensor(1))  # type: ignore[arg-type]  # 0-d: a slot


def target_case() -> tuple[DeepSeekV4DecodePreparer, DecodeBatch, dict[str, Any]]:
    layout = deepseek_v4_decode_layout(2, ranks=2)  # b=4, S=4
    preparer = DeepSeekV4DecodePreparer(layout)
    groups = [{name: [q] for name in layout.num_blocks} for q in range(2)]
    batch = DecodeBatch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([1, 2]),
        hidden_states=None,
        seq_lens=torch.tensor([5, 6]),
        block_ids_by_group=groups,
        cache_partitions=[0, 1],
    )
    rows = [[1, 2, 3, 4], [5, 6, 7, 8]]
    places = [[1, 2, 3, 4], [2, 3, 4, 5]]
    preparer.prepare_mtp_target(batch, token_rows=rows, positions=places, active_width=4)
    return preparer, batch, {"token_rows": rows, "positions": places, "active_width": 4}


@pytest.mark.parametrize(
    "positions, match",
    [
        ([[1, 2, 3, 4], [2, 3, -1, 5]], "row 1 holds -1 at token 2"),
        (torch.tensor([[-7, 2, 3, 4], [2, 3, 4, 5]]), "row 0 holds -7 at token 0"),
    ],
)
def test_negative_target_positions_are_refused(positions: Any, match: str) -> None:
    preparer, batch, kw = target_case()
    before = snapshot(preparer)
    with pytest.raises(ValueError, match="MTP target positions must not be negative: " + match):
        preparer.prepare_mtp_target(batch, **{**kw, "positions": positions})
    with pytest.raises(ValueError, match="MTP target positions must not be negative: " + match):
        preparer.restage(batch, buffer_slot=0, token_rows=kw["token_rows"], positions=positions)
    assert_unchanged(preparer, before)


@pytest.mark.parametrize(
    "token_rows, match",
    [
        ([[1, 2, 3, 4], [5, 6, 7]], "ragged rows: row 1 holds 3 tokens, row 0 4 tokens"),
        ([[1, 2, 3, 4], 5], "ragged rows: row 1 holds a int, row 0 4 tokens"),
        ([[1, 2], [5, 6, 7, 8]], "ragged rows: row 1 holds 4 tokens, row 0 2 tokens"),
    ],
)
def test_ragged_target_token_rows_are_refused(token_rows: Any, match: str) -> None:
    preparer, batch, kw = target_case()
    before = snapshot(preparer)
    prefix = r"MTP target token rows must have shape \(2, 4\), got "
    with pytest.raises(ValueError, match=prefix + match):
        preparer.prepare_mtp_target(batch, **{**kw, "token_rows": token_rows})
    with pytest.raises(ValueError, match=prefix + match):
        preparer.restage(batch, buffer_slot=0, token_rows=token_rows, positions=kw["positions"])
    assert_unchanged(preparer, before)


@pytest.mark.parametrize("bound", [True, False])
def test_two_preparers_do_not_adopt_the_same_buffers(bound: bool) -> None:
    sizes = {name: 64 for name in DeepSeekV4Layout(ranks=2, decode_batch=2).num_blocks}
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=sizes if bound else UNBOUND)
    first = DeepSeekV4DecodePreparer(layout)
    buffers = [first.slot_buffers(s) for s in range(2)]
    with pytest.raises(ValueError, match="overlaps the buffer of another live"):
        DeepSeekV4DecodePreparer(layout, buffers=buffers)
    first.bind_num_blocks(sizes)  # the refused one claimed nothing; rebinding keeps its own
    del first
    DeepSeekV4DecodePreparer(layout, buffers=buffers)  # the owner gone: adoptable


def grouped() -> GroupedTables:
    tables = GroupedTables([TableGroup("a", "paged", 4), TableGroup("b", "ring", 4)], 3)
    tables.commit(tables.plan([[[1], [2], [3]], [[4], [5], [6]]], ["x", "y", "z"]), 0)
    return tables


@pytest.mark.parametrize(
    "group, row, match",
    [
        (0, -1, "row -1 out of range: there are 3 rows"),
        (-1, 0, "group -1 out of range: there are 2 groups"),
        (2, 0, "group 2 out of range: there are 2 groups"),
        (0, 3, "row 3 out of range: there are 3 rows"),
    ],
)
def test_latest_ids_does_not_index_from_the_end(group: int, row: int, match: str) -> None:
    tables = grouped()
    with pytest.raises(IndexError, match=match):
        tables.latest_ids(group, row)
    assert tables.latest_ids(1, 2) == [6]


def test_plan_without_keys_is_a_clear_type_error() -> None:
    tables = grouped()
    counts = tables.counts(0).clone()
    match = r"keys must be a sequence of 3 row keys \(None for a padding row\), got NoneType"
    with pytest.raises(TypeError, match=match):
        tables.plan([[[1], [2], [3]], [[4], [5], [6]]], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=match):
        tables.plan_deltas([{}, {}], None, lambda g, r: [0])  # type: ignore[arg-type]
    assert torch.equal(tables.counts(0), counts)
    assert tables.latest_ids(0, 0) == [1]
