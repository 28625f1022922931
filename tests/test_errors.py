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
from blockprep.adapters.deepseek.layout import GROUP_NAMES
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.vllm import VllmBlockTable
from blockprep.events import PackedDeltaEncoder
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


class EqRaises:
    """A value whose ``==`` raises (and so cannot be hashed either)."""

    def __eq__(self, other: object) -> bool:
        raise ZeroDivisionError("a comparison that fails")

    __hash__ = None  # type: ignore[assignment]


class IndexRaises:
    """A value whose ``__index__`` raises."""

    def __index__(self) -> int:
        raise ZeroDivisionError("an __index__ that fails")


class HashRaises:
    def __hash__(self) -> int:
        raise ZeroDivisionError("a hash that fails")


def held_table() -> blockprep.BlockTable:
    table = blockprep.BlockTable(2, 4)
    table.write_row(0, [1, 2, 3])
    return table


def sent_encoder() -> BlockDeltaEncoder:
    encoder = BlockDeltaEncoder()
    encoder.encode(["a"], [[1, 2]])
    return encoder


def sent_packed() -> PackedDeltaEncoder:
    encoder = PackedDeltaEncoder()
    encoder.encode(["a"], [[1, 2]])
    return encoder


def held_grouped() -> GroupedTables:
    tables = GroupedTables([GROUP], 1)
    tables.commit(tables.plan([[[1]]], ["a"]), 0)
    return tables


def deepseek_batch(request_id: object = "a", ids: object = 1) -> DecodeBatch:
    groups = {name: [ids if name == "ori" else 1] for name in GROUP_NAMES}
    return DecodeBatch(
        request_ids=[request_id],
        token_ids=torch.tensor([42]),
        hidden_states=None,
        seq_lens=torch.tensor([9]),
        block_ids_by_group=[groups],
        cache_partitions=[1],
    )


def vllm_table() -> VllmBlockTable:
    table = VllmBlockTable(16, 2, 4, 8)
    table.add_row([1, 2], 0)
    return table


HOSTILE: list[tuple[str, Callable[[], object], type[Exception]]] = [
    ("hostile eq id", lambda: held_table().write_row(0, [1, EqRaises(), 3]), TypeError),
    ("hostile index row", lambda: held_table().write_row(IndexRaises(), [1]), TypeError),  # type: ignore[arg-type]
    ("hostile index length", lambda: held_table().truncate(0, IndexRaises()), TypeError),  # type: ignore[arg-type]
    ("huge max_blocks", lambda: blockprep.paged_block_table([[1]], max_blocks=2**70), ValueError),
    ("hostile eq encoder", lambda: sent_encoder().encode(["a"], [[1, EqRaises()]]), TypeError),
    ("hostile eq key", lambda: held_grouped().plan([[[1]]], [EqRaises()]), TypeError),
    ("hostile hash key", lambda: held_grouped().plan([[[1]]], [HashRaises()]), TypeError),
    ("hostile vllm finished", lambda: vllm_table().apply_step(finished=[EqRaises()]), TypeError),  # type: ignore[list-item]
    (
        "hostile deepseek id",
        lambda: deepseek().prepare(deepseek_batch(ids=IndexRaises())),
        TypeError,
    ),
    ("hostile deepseek request", lambda: deepseek().prepare(deepseek_batch(EqRaises())), TypeError),
    ("hostile op tag", lambda: apply_ops([[EqRaises(), [1]]], [1]), ValueError),
    ("hostile request id", lambda: BlockDeltaEncoder().encode([EqRaises()], [[1]]), TypeError),
    ("hostile packed id", lambda: sent_packed().encode(["a"], [[1, EqRaises()]]), TypeError),
    ("fill_rows no rows", lambda: held_table().fill_rows(0, 5), TypeError),  # type: ignore[arg-type]
]
"""Values whose ``==``, hash or ``__index__`` raise, or an int past every size: the refusal is
the ``BlockprepError`` of the value's place, never the callback's own exception."""

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
    ("name", "call", "error"),
    BAD_CALLS + MORE + HOSTILE,
    ids=[c[0] for c in BAD_CALLS + MORE + HOSTILE],
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
