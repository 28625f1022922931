"""Issue 19, the table faces: bad or shifting input is refused with a clear error and writes
nothing. Each case failed before its fix (a list kept past its check, a group written before
another group's row was checked, a Python-internal message); rows are checked against
:mod:`blockprep.reference`."""

from __future__ import annotations

import re
from typing import Any

import pytest

from blockprep import BlockTable, UnknownRowError
from blockprep import reference as ref
from blockprep.adapters.vllm import VllmBlockTable, VllmMultiGroupBlockTable

WIDTH = 8


def state(table: BlockTable) -> tuple[Any, ...]:
    held = [table.cached_ids(r) for r in range(table.num_rows)]
    return table.numpy().tolist(), held, table.lengths.tolist(), table.stats


@pytest.mark.parametrize("bad", [-7, 2.5, 2**40, "x"])
def test_ring_plan_rows_keeps_no_caller_list(bad: Any) -> None:
    """A list changed between plan and commit: the commit writes the ids that were checked."""
    table = BlockTable(2, WIDTH, kind="ring")
    table.write_rows([[1, 2, 3], [4, 5]])
    ids = [1, 2, 9]  # one rotated slot: the old fast path kept the list and read it at commit
    plan = table.plan_rows({0: ids, 1: [4, 6]})
    ids[2] = bad
    ids.append(bad)
    assert table.commit(plan) == 2
    expected = ref.ring_block_table_repeat([[1, 2, 9], [4, 6]], max_blocks=WIDTH).tolist()
    assert table.numpy().tolist() == expected
    assert table.cached_ids(0) == [1, 2, 9]
    table.verify()


def test_paged_plan_rows_keeps_no_caller_list() -> None:
    table = BlockTable(1, WIDTH)
    table.write_row(0, [1, 2])
    ids = [1, 2, 3]
    plan = table.plan_rows([(0, ids)])
    ids[:] = [-1] * WIDTH
    table.commit(plan)
    expected = ref.block_table_per_row([[1, 2, 3]], max_blocks=WIDTH, pad=-1)
    assert table.numpy().tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (None, "plan_rows must be (row, value) pairs or a {row: value} mapping, got NoneType"),
        (5, "plan_rows must be (row, value) pairs or a {row: value} mapping, got int"),
        ("01", "plan_rows must be (row, value) pairs or a {row: value} mapping, got str"),
        ([(0, [1]), 3], "plan_rows items must be (row, value) pairs, got 3"),
        ([(0, [1], [2])], "plan_rows items must be (row, value) pairs, got (0, [1], [2])"),
    ],
)
def test_plan_rows_refuses_what_is_not_pairs(items: Any, message: str) -> None:
    table = BlockTable(2, WIDTH)
    before = state(table)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        table.plan_rows(items)
    assert state(table) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"set_ids": [(0, [0])]}, r"set_ids items must be \(row, positions, ids\) triples"),
        ({"set_ids": [5]}, r"set_ids items must be \(row, positions, ids\) triples, got 5"),
        ({"set_ids": None}, r"set_ids must be \(row, positions, ids\) triples, got NoneType"),
        ({"truncate": None}, r"truncate must be \(row, value\) pairs"),
        (
            {"append": 7},
            r"append must be \(row, value\) pairs or a \{row: value\} mapping, got int",
        ),
        ({"append": [(1, [2]), (0,)]}, r"append items must be \(row, value\) pairs, got \(0,\)"),
    ],
)
def test_apply_deltas_refuses_malformed_arguments(kwargs: dict[str, Any], message: str) -> None:
    table = BlockTable(2, WIDTH)
    table.write_rows([[1, 2], [3]])
    before = state(table)
    with pytest.raises(TypeError, match=message):
        table.apply_deltas(**kwargs)
    assert state(table) == before


def test_vllm_device_must_parse() -> None:
    """blockprep's words only: not torch's internal list of device types."""
    message = (
        r"^device 'bogus' is not a torch device \(a device type torch knows, such as 'cpu' or "
        r"'cuda:0', or a torch.device\)$"
    )
    with pytest.raises(ValueError, match=message):
        VllmBlockTable(16, 2, 4, 8, device="bogus")
    with pytest.raises(ValueError, match=message):
        VllmMultiGroupBlockTable(2, 64, 8, False, "bogus", [16])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"finished": None}, "^finished must be an iterable of rows, got NoneType$"),
        ({"finished": 3}, "^finished must be an iterable of rows, got int$"),
        ({"appended": None}, "^appended must be .row, ids. pairs or a mapping, got NoneType$"),
        ({"added": 4}, "^added must be .row, ids. pairs or a mapping, got int$"),
        ({"moves": None}, r"^moves must be \(src, tgt\) pairs, got NoneType$"),
    ],
)
def test_vllm_apply_step_refuses_non_iterables(kwargs: dict[str, Any], message: str) -> None:
    single = VllmBlockTable(16, 3, 4, 8)
    single.add_row([1, 2], 0)
    multi = VllmMultiGroupBlockTable(3, 64, 8, False, "cpu", [16, 32])
    multi.add_row([[1, 2], [3]], 0)
    group = {k: v for k, v in kwargs.items() if k in ("finished", "moves") or v is None}
    for facade, arguments in ((single, kwargs), (multi, {**kwargs, **group})):
        before = facade_state(facade)
        with pytest.raises(TypeError, match=message):
            facade.apply_step(**arguments)
        assert facade_state(facade) == before


def facade_state(facade: Any) -> list[Any]:
    tables = facade.block_tables if isinstance(facade, VllmMultiGroupBlockTable) else [facade]
    return [state(t.table) for t in tables]


def test_multi_group_checks_every_group_before_writing_any() -> None:
    """Group 1's row unknown (after the documented invalidate): append_row and apply_step raise
    naming the group, and group 0 is left as it was."""
    multi = VllmMultiGroupBlockTable(3, 64, 8, False, "cpu", [16, 32])
    multi.add_row([[1, 2], [3]], 0)
    multi.add_row([[4], [5]], 1)
    multi[1].table.invalidate(0)
    before = facade_state(multi)
    unknown = "^KV cache group 1 block-table row 0 holds unknown ids"
    with pytest.raises(UnknownRowError, match=unknown):
        multi.append_row([[7], [8]], 0)
    assert facade_state(multi) == before
    with pytest.raises(UnknownRowError, match=unknown):
        multi.apply_step(appended={1: [[6], [9]], 0: [[7], [8]]})
    assert facade_state(multi) == before
    with pytest.raises(UnknownRowError, match=unknown):
        multi.apply_step(finished=[0])
    assert facade_state(multi) == before
    # the documented remedy: add_row writes the invalidated row whole, in every group
    multi.add_row([[7, 8], [9]], 0)
    expected = ref.block_table_per_row([[7, 8], [4]], max_blocks=multi[0].max_num_blocks_per_req)
    assert multi[0].get_cpu_tensor()[:2].tolist() == expected.tolist()
    assert multi[1].table.cached_ids(0) == [9]
    assert multi[1].num_blocks_per_row.tolist()[:2] == [1, 1]
    multi[1].table.verify()


def test_single_group_add_row_writes_an_invalidated_row() -> None:
    table = VllmBlockTable(16, 2, 4, 8)
    table.add_row([1, 2, 3], 0)
    table.table.invalidate(0)
    table.get_numpy_array()[0] = 99  # something else wrote it
    with pytest.raises(TypeError, match=r"block-table row 0 holds 1\.5 of type float"):
        table.add_row([1.5], 0)
    assert table.get_numpy_array()[0].tolist() == [99] * 4
    table.add_row([5], 0)
    assert table.get_numpy_array()[0].tolist() == [5, 0, 0, 0]
    assert table.num_blocks_per_row.tolist() == [1, 0]


def test_gather_rows_refuses_a_list() -> None:
    from blockprep.adapters.deepseek import DeepSeekV4DecodeInputs

    inputs = object.__new__(DeepSeekV4DecodeInputs)
    with pytest.raises(TypeError, match=r"^kernel output must be a torch\.Tensor, got list$"):
        inputs.gather_rows([[1.0]])  # type: ignore[arg-type]
