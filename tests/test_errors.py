"""Errors (:mod:`blockprep.errors`): every error blockprep raises on bad input is a
``BlockprepError`` and still the built-in type it was. The core cases are the core-input suite's
table; the rest walk the tables, the wire, both preparers, the executors and the simulation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from test_core_inputs import BAD_CALLS
from test_runtime_executors import deepseek_setup

import blockprep
from blockprep import BlockprepError, DecodeBatch
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.grouped import GroupedTables, TableGroup
from blockprep.testing import DeepSeekV4SchedulerSim
from blockprep.wire import BlockDeltaEncoder, DeltaCursor, apply_ops

GROUP = TableGroup("g", "paged", 4, id_limit=10, pad=-1)


def qwen_batch(**fields: object) -> DecodeBatch:
    values: dict[str, object] = {
        "request_ids": ["a"],
        "token_ids": torch.tensor([1]),
        "hidden_states": None,
        "seq_lens": torch.tensor([3]),
        "block_ids": [[1]],
    }
    values.update(fields)
    return DecodeBatch(**values)  # type: ignore[arg-type]


def qwen(**fields: object) -> object:
    return QwenDecodePreparer(1, 8, 4).prepare(qwen_batch(**fields))


def adopted_table() -> blockprep.BlockTable:
    return blockprep.BlockTable(1, 4, buffer=torch.zeros(1, 4, dtype=torch.int32))


def sim_batch() -> DecodeBatch:
    return DeepSeekV4SchedulerSim(ranks=2, decode_batch=2).step()


def empty_batch() -> DecodeBatch:
    none = torch.tensor([], dtype=torch.int64)
    return qwen_batch(request_ids=[], token_ids=none, seq_lens=none, block_ids=[])


def deepseek() -> DeepSeekV4DecodePreparer:
    return DeepSeekV4DecodePreparer(DeepSeekV4Layout(ranks=2, decode_batch=2))


def grouped() -> GroupedTables:
    return GroupedTables([GROUP], 1)


MORE: list[tuple[str, Callable[[], object], type[Exception]]] = [
    ("grouped id over limit", lambda: grouped().plan([[[11]]], ["a"]), ValueError),
    ("grouped float id", lambda: grouped().plan([[[1.5]]], ["a"]), TypeError),
    ("grouped slot", lambda: grouped().tables(3), IndexError),
    ("grouped no groups", lambda: GroupedTables([], 1), TypeError),
    ("block table row", lambda: blockprep.BlockTable(1, 4).write_row(5, [1]), IndexError),
    ("block table unknown", lambda: adopted_table().append(0, [1]), ValueError),
    ("wire cursor", lambda: DeltaCursor().check({"seq": 1, "base": 0, "rows": {}}), ValueError),
    ("wire malformed", lambda: DeltaCursor().check([]), ValueError),
    ("wire ops", lambda: apply_ops([["x"]], [1]), ValueError),
    ("encoder float", lambda: BlockDeltaEncoder().encode(["a"], [[1.5]]), TypeError),
    ("qwen seq_len", lambda: qwen(seq_lens=torch.tensor([9])), ValueError),
    ("qwen negative page", lambda: qwen(block_ids=[[-1]]), ValueError),
    ("qwen float tokens", lambda: qwen(token_ids=torch.tensor([1.5])), TypeError),
    (
        "qwen buffers",
        lambda: QwenDecodePreparer(1, 8, 4, buffers={"x": torch.zeros(1)}),
        ValueError,
    ),
    ("deepseek slot", lambda: deepseek().slot_buffers(7), ValueError),
    ("deepseek unprepared", lambda: deepseek().restage(sim_batch(), buffer_slot=0), RuntimeError),
    ("deepseek layout", lambda: DeepSeekV4Layout(ranks=0, decode_batch=2), ValueError),
    ("deepseek empty batch", lambda: deepseek().prepare(empty_batch()), ValueError),
    ("executor cancel free", lambda: deepseek_setup()[0].cancel(0), RuntimeError),
    ("executor reclaim", lambda: deepseek_setup()[0].reclaim(object()), TypeError),  # type: ignore[arg-type]
    ("sim pools", lambda: DeepSeekV4SchedulerSim(num_blocks={}), ValueError),
    ("batch 2-D ids", lambda: qwen_batch(request_ids=np.array([["a"]])), TypeError),
]


@pytest.mark.parametrize(
    ("name", "call", "error"), BAD_CALLS + MORE, ids=[c[0] for c in BAD_CALLS + MORE]
)
def test_every_bad_input_error_is_a_blockprep_error(
    name: str, call: Callable[[], object], error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, BlockprepError), f"{name}: {type(info.value).__mro__}"


def test_the_hierarchy_keeps_the_builtin_types() -> None:
    for name, base in [
        ("BlockprepTypeError", TypeError),
        ("BlockprepValueError", ValueError),
        ("BlockprepIndexError", IndexError),
        ("BlockprepRuntimeError", RuntimeError),
    ]:
        cls = getattr(blockprep, name)
        assert issubclass(cls, BlockprepError) and issubclass(cls, base)
    from blockprep.adapters.deepseek import SlotBusyError
    from blockprep.grouped import BlockIdTypeError, BlockIdValueError
    from blockprep.wire import DeltaMessageError, DeltaSequenceError

    for cls, base in [
        (BlockIdTypeError, TypeError),
        (BlockIdValueError, ValueError),
        (DeltaSequenceError, ValueError),
        (DeltaMessageError, ValueError),
        (SlotBusyError, RuntimeError),
        (blockprep.StaleRowError, RuntimeError),
        (blockprep.UnknownRowError, ValueError),
    ]:
        assert issubclass(cls, BlockprepError) and issubclass(cls, base), cls
