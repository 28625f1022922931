"""The vLLM-style facade (blockprep.adapters.vllm) against a port of vLLM's own block table.

``PortTable`` (tests/vllm_port.py) re-states vLLM MRv1's ``BlockTable``
(vllm/v1/worker/block_table.py at 01edfd09) in plain NumPy, independently of blockprep. The facade
must hold the same counts and, below each row's count, the same ids; past the count it must
hold 0 (vLLM may hold stale ids there). Invalid calls must raise and leave everything as it was.
"""

from __future__ import annotations

import pickle
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from vllm_port import PortTable

from blockprep import INT32_MAX
from blockprep.adapters.vllm import VllmBlockTable, VllmMultiGroupBlockTable
from blockprep.errors import StaleRowError

ROWS, WIDTH, BLOCK = 4, 6, 4


def assert_same(facade: VllmBlockTable, port: PortTable) -> None:
    counts = port.num_blocks_per_row
    assert facade.num_blocks_per_row.tolist() == counts.tolist()
    host = facade.get_numpy_array()
    live = np.arange(port.width)[None, :] < counts[:, None]
    np.testing.assert_array_equal(host[live], port.np[live])
    assert not host[~live].any(), "cells past a row's count must hold 0"
    assert facade.get_cpu_tensor().data_ptr() == facade.table.tensor.data_ptr()


def snapshot(facade: VllmBlockTable) -> tuple[Any, ...]:
    table = facade.table
    return (
        facade.get_numpy_array().tobytes(),
        facade.num_blocks_per_row.tobytes(),
        [table.cached_ids(r) for r in range(table.num_rows)],
        table.stats,
        facade.get_device_tensor().numpy().tobytes(),
        facade.slot_mapping.tobytes(),
    )


ids_st = st.integers(0, INT32_MAX)
BAD_IDS: list[Any] = [-1, -(2**31), INT32_MAX + 1, 2**63, 1.5, None, "3", True]


# --- per-row calls -----------------------------------------------------------------------------


def test_rows_follow_vllm_and_pad_with_zero() -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16)
    port = PortTable(BLOCK, ROWS, WIDTH, 16)
    for table in (facade, port):
        table.add_row([5, 6, 7, 8], 0)
        table.add_row([9], 1)
        table.move_row(1, 0)  # vLLM keeps 7, 8 past the count; the facade resets them
        table.append_row([3], 1)
        table.swap_row(0, 2)
    assert port.np[2].tolist() == [9, 6, 7, 8, 0, 0]
    assert facade.get_numpy_array()[2].tolist() == [9, 0, 0, 0, 0, 0]
    assert_same(facade, port)


def test_num_blocks_per_row_is_a_read_only_view() -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16)
    counts = facade.num_blocks_per_row
    facade.add_row([1, 2], 3)
    assert counts.tolist() == [0, 0, 0, 2]
    with pytest.raises(ValueError):
        counts[0] = 5


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("call", ["append_row", "add_row"])
def test_bad_ids_raise_naming_row_and_value_and_write_nothing(call: str, bad: Any) -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16, separate=True)
    facade.add_row([4, 5], 2)
    facade.commit_block_table(ROWS)
    before = snapshot(facade)
    with pytest.raises((TypeError, ValueError)) as error:
        getattr(facade, call)([7, bad], 2)
    assert "row 2" in str(error.value)
    assert repr(bad) in str(error.value) or str(bad) in str(error.value)
    assert snapshot(facade) == before


def test_too_many_blocks_raise_where_vllm_corrupts_the_count() -> None:
    port = PortTable(BLOCK, ROWS, WIDTH, 16)
    port.add_row([1, 2, 3, 4], 1)
    with pytest.raises(ValueError):
        port.append_row([5, 6, 7], 1)  # vLLM: the count is raised before the write fails
    assert port.num_blocks_per_row[1] == 7
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16)
    facade.add_row([1, 2, 3, 4], 1)
    before = snapshot(facade)
    for call, ids in (("append_row", [5, 6, 7]), ("add_row", list(range(WIDTH + 1)))):
        with pytest.raises(ValueError, match="row 1"):
            getattr(facade, call)(ids, 1)
        assert snapshot(facade) == before


def test_negative_ids_raise_where_vllm_writes_them() -> None:
    port = PortTable(BLOCK, ROWS, WIDTH, 16)
    port.append_row([-3], 0)
    assert port.np[0, 0] == -3
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16)
    with pytest.raises(ValueError, match=r"row 0, id -3"):
        facade.append_row([-3], 0)


@pytest.mark.parametrize("row", [-1, ROWS, 10**12])
def test_bad_rows_raise_and_write_nothing(row: int) -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16)
    facade.add_row([1, 2], ROWS - 1)
    before = snapshot(facade)
    calls = [
        lambda: facade.append_row([3], row),
        lambda: facade.add_row([3], row),
        lambda: facade.clear_row(row),
        lambda: facade.move_row(row, 0),
        lambda: facade.move_row(0, row),
        lambda: facade.swap_row(row, 0),
        lambda: facade.apply_step(finished=[row]),
        lambda: facade.apply_step(appended={row: [3]}),
        lambda: facade.apply_step(added=[(row, [3])]),
        lambda: facade.apply_step(appended={0: [3]}, moves=[(0, row)]),
    ]
    for call in calls:
        with pytest.raises(IndexError, match=str(row)):
            call()
        assert snapshot(facade) == before


# --- slot mapping ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_slot_mapping_equals_vllms(data: st.DataObject) -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 24)
    port = PortTable(BLOCK, ROWS, WIDTH, 24)
    for row in range(ROWS):
        ids = data.draw(st.lists(ids_st, max_size=WIDTH))
        facade.add_row(ids, row)
        port.add_row(ids, row)
    held = [r for r in range(ROWS) if port.num_blocks_per_row[r]]
    tokens = data.draw(st.lists(st.sampled_from(held), max_size=24)) if held else []
    positions = [
        data.draw(st.integers(0, int(port.num_blocks_per_row[r]) * BLOCK - 1)) for r in tokens
    ]
    req, pos = np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64)
    port.compute_slot_mapping(req, pos)
    out = facade.compute_slot_mapping(req, pos)
    np.testing.assert_array_equal(facade.slot_mapping, port.slot_mapping)
    assert out.base is not None and len(out) == len(tokens)


def test_slot_mapping_refuses_a_position_past_the_rows_blocks() -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 8)
    facade.add_row([3], 1)
    facade.compute_slot_mapping(np.array([1]), np.array([2]))
    before = facade.slot_mapping.copy()
    for req, pos, error in (
        ([1], [BLOCK], ValueError),
        ([1], [-1], ValueError),
        ([7], [0], IndexError),
    ):
        with pytest.raises(error, match="token 0"):
            facade.compute_slot_mapping(np.array(req), np.array(pos))
    with pytest.raises(ValueError, match="exceed"):
        facade.compute_slot_mapping(np.ones(9, dtype=np.int64), np.zeros(9, dtype=np.int64))
    np.testing.assert_array_equal(facade.slot_mapping, before)


# --- device copy -------------------------------------------------------------------------------


def test_commit_copies_the_written_rows_below_num_reqs() -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 8, separate=True)
    assert facade.get_device_tensor().data_ptr() != facade.get_cpu_tensor().data_ptr()
    facade.add_row([1, 2], 0)
    facade.add_row([3], 3)
    facade.commit_block_table(2)
    device = facade.get_device_tensor().numpy()
    assert device[0].tolist() == [1, 2, 0, 0, 0, 0] and not device[3].any()
    facade.commit_block_table(4)  # row 3, written before, now below num_reqs
    assert device[3].tolist() == [3, 0, 0, 0, 0, 0]
    assert facade.get_device_tensor(2).shape == (2, WIDTH)
    shared = VllmBlockTable(BLOCK, ROWS, WIDTH, 8)
    assert shared.get_device_tensor().data_ptr() == shared.get_cpu_tensor().data_ptr()


def test_clear_empties_host_and_device() -> None:
    facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 8, separate=True)
    facade.add_row([1, 2], 0)
    facade.commit_block_table(ROWS)
    facade.clear()
    assert not facade.get_numpy_array().any() and not facade.get_device_tensor().any()
    assert not facade.num_blocks_per_row.any()
    facade.append_row([4], 0)
    assert facade.get_numpy_array()[0, 0] == 4


# --- random traces: a state machine mixing per-row and batched calls ---------------------------


def wire(value: Any) -> Any:
    """What the worker receives: new lists of new int objects."""
    return pickle.loads(pickle.dumps(value))


class FacadeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # verify mode on: every call also checked against the lists the calls gave
        self.facade = VllmBlockTable(BLOCK, ROWS, WIDTH, 16, separate=True, verify=True)
        self.port = PortTable(BLOCK, ROWS, WIDTH, 16)
        # Rows committed since their last write: their device copy must hold what they hold.
        # (Inferring this from the port's host and device rows being equal is unsound: vLLM's
        # stale tails can make a row equal to an old commit by coincidence.)
        self.synced: set[int] = set()

    def count(self, row: int) -> int:
        return int(self.port.num_blocks_per_row[row])

    def expect_error(self, call: Any) -> None:
        before = snapshot(self.facade)
        with pytest.raises((TypeError, ValueError, IndexError)):
            call()
        assert snapshot(self.facade) == before

    @rule(row=st.integers(0, ROWS - 1), data=st.data())
    def append_row(self, row: int, data: st.DataObject) -> None:
        ids = data.draw(st.lists(ids_st, max_size=WIDTH - self.count(row)))
        self.facade.append_row(wire(ids), row)
        self.port.append_row(ids, row)
        self.synced.discard(row)

    @rule(row=st.integers(0, ROWS - 1), ids=st.lists(ids_st, max_size=WIDTH))
    def add_row(self, row: int, ids: list[int]) -> None:
        self.facade.add_row(wire(ids), row)
        self.port.add_row(ids, row)
        self.synced.discard(row)

    @rule(row=st.integers(0, ROWS - 1))
    def clear_row(self, row: int) -> None:
        self.facade.clear_row(row)
        self.port.clear_row(row)
        self.synced.discard(row)

    @rule(src=st.integers(0, ROWS - 1), tgt=st.integers(0, ROWS - 1))
    def move_row(self, src: int, tgt: int) -> None:
        self.facade.move_row(src, tgt)
        self.port.move_row(src, tgt)
        self.synced.discard(tgt)

    @rule(src=st.integers(0, ROWS - 1), tgt=st.integers(0, ROWS - 1))
    def swap_row(self, src: int, tgt: int) -> None:
        self.facade.swap_row(src, tgt)
        self.port.swap_row(src, tgt)
        self.synced -= {src, tgt}

    @rule(data=st.data())
    def apply_step(self, data: st.DataObject) -> None:
        rows = list(range(ROWS))
        finished = data.draw(st.lists(st.sampled_from(rows), unique=True, max_size=ROWS))
        added_rows = data.draw(st.lists(st.sampled_from(rows), unique=True, max_size=2))
        added = [(r, data.draw(st.lists(ids_st, max_size=WIDTH))) for r in added_rows]
        free = [r for r in rows if r not in added_rows]
        appended_rows = data.draw(st.lists(st.sampled_from(free), unique=True)) if free else []
        appended: list[tuple[int, list[int] | None]] = []
        for r in appended_rows:
            room = WIDTH - (0 if r in finished else self.count(r))
            appended.append((r, data.draw(st.none() | st.lists(ids_st, max_size=room))))
        moves = data.draw(
            st.lists(st.tuples(st.sampled_from(rows), st.sampled_from(rows)), max_size=3)
        )
        as_dict = data.draw(st.booleans())
        num_reqs = data.draw(st.none() | st.integers(0, ROWS))
        self.facade.apply_step(
            finished=wire(finished),
            appended=dict(wire(appended)) if as_dict else wire(appended),
            added=wire(added),
            moves=wire(moves),
            num_reqs=num_reqs,
        )
        self.port.step(finished, appended, added, moves)
        self.synced -= {*finished, *added_rows, *appended_rows, *(tgt for _, tgt in moves)}
        if num_reqs is not None:
            self.port.commit_block_table(num_reqs)
            self.synced |= set(range(num_reqs))

    @rule(num_reqs=st.integers(0, ROWS))
    def commit(self, num_reqs: int) -> None:
        self.facade.commit_block_table(num_reqs)
        self.port.commit_block_table(num_reqs)
        self.synced |= set(range(num_reqs))

    @rule(data=st.data())
    def slot_mapping(self, data: st.DataObject) -> None:
        held = [r for r in range(ROWS) if self.count(r)]
        if not held:
            return
        tokens = data.draw(st.lists(st.sampled_from(held), max_size=16))
        positions = [data.draw(st.integers(0, self.count(r) * BLOCK - 1)) for r in tokens]
        req, pos = np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64)
        self.facade.compute_slot_mapping(req, pos)
        self.port.compute_slot_mapping(req, pos)
        np.testing.assert_array_equal(
            self.facade.slot_mapping[: len(req)], self.port.slot_mapping[: len(req)]
        )

    # --- invalid calls: raise, change nothing

    @rule(row=st.integers(0, ROWS - 1), bad=st.sampled_from(BAD_IDS), data=st.data())
    def bad_id(self, row: int, bad: Any, data: st.DataObject) -> None:
        ids = data.draw(st.lists(ids_st, max_size=2))
        ids.insert(data.draw(st.integers(0, len(ids))), bad)
        self.expect_error(lambda: self.facade.append_row(wire(ids), row))
        self.expect_error(lambda: self.facade.add_row(wire(ids), row))
        other = (row + 1) % ROWS
        self.expect_error(
            lambda: self.facade.apply_step(
                finished=[other], appended=[(row, wire(ids))], num_reqs=ROWS
            )
        )
        self.expect_error(
            lambda: self.facade.apply_step(added={row: wire(ids)}, moves=[(row, other)])
        )

    @rule(row=st.integers(0, ROWS - 1))
    def too_many(self, row: int) -> None:
        over = list(range(WIDTH - self.count(row) + 1))
        self.expect_error(lambda: self.facade.append_row(over, row))
        self.expect_error(lambda: self.facade.add_row(list(range(WIDTH + 1)), row))
        self.expect_error(lambda: self.facade.apply_step(appended={row: over}, num_reqs=1))

    @rule(row=st.sampled_from([-1, ROWS, ROWS + 5]))
    def bad_row(self, row: int) -> None:
        self.expect_error(lambda: self.facade.append_row([1], row))
        self.expect_error(lambda: self.facade.apply_step(finished=[0], added=[(row, [1])]))
        self.expect_error(lambda: self.facade.apply_step(finished=[0], moves=[(0, row)]))

    @invariant()
    def same_as_vllm(self) -> None:
        assert_same(self.facade, self.port)

    @invariant()
    def device_rows_committed(self) -> None:
        device = self.facade.get_device_tensor().numpy()
        live = np.arange(WIDTH)[None, :] < self.port.num_blocks_per_row[:, None]
        # rows committed since their last write: the device copy holds their ids
        for row in sorted(self.synced):
            np.testing.assert_array_equal(device[row][live[row]], self.port.np[row][live[row]])


TestFacadeMachine = FacadeMachine.TestCase
TestFacadeMachine.settings = settings(
    max_examples=120, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)


# --- multi-group -------------------------------------------------------------------------------


def test_multi_group_widths_and_ids_per_group() -> None:
    table = VllmMultiGroupBlockTable(4, 100, 16, False, "cpu", [16, 32])
    assert [t.max_num_blocks_per_req for t in table.block_tables] == [8, 4]  # vLLM's rounding
    table.add_row(([1, 2], [7]), 0)
    table.append_row(([3], []), 0)
    assert table[0].get_numpy_array()[0, :4].tolist() == [1, 2, 3, 0]
    assert table[1].get_numpy_array()[0, :2].tolist() == [7, 0]
    table.compute_slot_mapping(np.array([0, 0]), np.array([0, 31]))
    assert table[0].slot_mapping[:3].tolist() == [16, 2 * 16 + 15, -1]
    assert table[1].slot_mapping[:3].tolist() == [7 * 32, 7 * 32 + 31, -1]
    with pytest.raises(ValueError, match="KV cache group 1 token 0"):
        table.compute_slot_mapping(np.array([0]), np.array([33]))  # group 0 holds it, 1 not
    assert table[0].slot_mapping[:3].tolist() == [16, 2 * 16 + 15, -1]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_multi_group_follows_vllm_and_checks_every_group_first(data: st.DataObject) -> None:
    sizes = [4, 8]
    table = VllmMultiGroupBlockTable(
        ROWS, 32, 16, False, "cpu", sizes, max_num_blocks=[8, 4], verify=True
    )  # verify mode: every group checked against the lists the calls gave, after every call
    widths = [t.max_num_blocks_per_req for t in table.block_tables]
    ports = [PortTable(b, ROWS, w, 16) for b, w in zip(sizes, widths, strict=True)]
    for _ in range(data.draw(st.integers(1, 12))):
        row = data.draw(st.integers(0, ROWS - 1))
        op = data.draw(st.sampled_from(["append", "add", "clear", "move", "step", "bad"]))
        if op in ("append", "add"):
            room = [
                w - (int(p.num_blocks_per_row[row]) if op == "append" else 0)
                for w, p in zip(widths, ports, strict=True)
            ]
            ids = tuple(data.draw(st.lists(ids_st, max_size=r)) for r in room)
            getattr(table, f"{op}_row")(wire(ids), row)
            for port, group_ids in zip(ports, ids, strict=True):
                getattr(port, f"{op}_row")(group_ids, row)
        elif op == "clear":
            table.clear_row(row)
            for port in ports:
                port.clear_row(row)
        elif op == "move":
            tgt = data.draw(st.integers(0, ROWS - 1))
            table.move_row(row, tgt)
            for port in ports:
                port.move_row(row, tgt)
        elif op == "step":
            ids = tuple(data.draw(st.lists(ids_st, max_size=w)) for w in widths)
            tgt = data.draw(st.integers(0, ROWS - 1))
            table.apply_step(
                finished=[tgt], added=[(row, wire(ids))], moves=[(row, tgt)], num_reqs=ROWS
            )
            for port, group_ids in zip(ports, ids, strict=True):
                port.step([tgt], [], [(row, group_ids)], [(row, tgt)])
        else:  # the last group's ids are bad: the first group must not be written either
            room = widths[0] - int(ports[0].num_blocks_per_row[row])  # group 0 stays valid
            good = data.draw(st.lists(ids_st, max_size=min(1, room)))
            bad = data.draw(st.sampled_from([[-1], [INT32_MAX + 1], list(range(widths[1] + 1))]))
            before = [snapshot(t) for t in table.block_tables]
            ids = (good, bad)
            for call in (
                partial(table.append_row, ids, row),
                partial(table.add_row, ids, row),
                partial(table.apply_step, appended={row: ids}),
                partial(table.apply_step, finished=[row], added={row: ids}),
            ):
                with pytest.raises(ValueError, match=f"group 1 block-table row {row}"):
                    call()
                assert [snapshot(t) for t in table.block_tables] == before
        for facade, port in zip(table.block_tables, ports, strict=True):
            assert_same(facade, port)


def test_verify_mode_catches_a_page_the_table_lost() -> None:
    """A page dropped behind the facade's back (here through the underlying ``BlockTable``,
    which keeps its held ids consistent, so its own ``verify()`` passes): the facade's verify
    mode, comparing with the lists the calls gave, names the row and column at the next call."""
    facade = VllmBlockTable(16, 3, 4, 8, verify=True)
    facade.add_row([5, 6, 7], 0)
    facade.append_row([8], 0)
    facade.apply_step(appended={1: None}, added=iter([(2, np.array([9, 10]))]), moves=[(2, 1)])
    assert facade.get_numpy_array().tolist() == [[5, 6, 7, 8], [9, 10, 0, 0], [9, 10, 0, 0]]
    facade.table.truncate(0, 3)  # the lost page
    facade.table.verify()  # the table agrees with itself
    with pytest.raises(StaleRowError, match=r"block_table .* row 0, column 3: holds 0, the "):
        facade.clear_row(2)
    plain = VllmBlockTable(16, 3, 4, 8)
    plain.add_row([5, 6, 7], 0)
    plain.table.truncate(0, 2)
    plain.clear_row(2)  # without verify mode: unnoticed


def test_multi_group_verify_mode_catches_a_page_a_group_lost() -> None:
    """The same for every group of a ``VllmMultiGroupBlockTable``: a page group 1 lost behind
    the tables' back is named, group and row and column, at the next call."""
    tables = VllmMultiGroupBlockTable(3, 64, 8, False, "cpu", [16, 32], verify=True)
    tables.add_row(([1, 2, 3], [7, 8]), 0)
    tables.apply_step(appended={0: ([4], [9])}, added={1: ([5], [6])}, moves=[(1, 2)])
    assert tables[1].get_numpy_array()[:, :3].tolist() == [[7, 8, 9], [6, 0, 0], [6, 0, 0]]
    tables[1].table.truncate(0, 2)  # the lost page
    lost = r"KV cache group 1 buffer block_table .* row 0, column 2: holds 0"
    with pytest.raises(StaleRowError, match=lost):
        tables.clear_row(2)
    with pytest.raises(ValueError, match="group 0 block-table row 1"):
        tables.append_row(([-1], []), 1)  # refused: recorded nowhere


def test_verify_mode_leaves_a_refused_call_unrecorded() -> None:
    facade = VllmBlockTable(16, 2, 3, 8, verify=True)
    facade.add_row([1, 2], 0)
    with pytest.raises(ValueError, match="maximum is 3"):
        facade.append_row([3, 4], 0)
    with pytest.raises(ValueError, match="must not be negative"):
        facade.apply_step(added={1: [-1]})
    facade.append_row([3], 0)  # the lists kept [1, 2]: this call checks against [1, 2, 3]
    assert facade.get_numpy_array().tolist() == [[1, 2, 3], [0, 0, 0]]
