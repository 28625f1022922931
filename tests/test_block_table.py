"""BlockTable contracts: the upstream invalidation cases (seed-semantics 2.4), the stale-row bug of
11.1, incremental writes, buffer adoption, errors. Rows are checked against blockprep.reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from blockprep import INT32_MAX, BlockTable, StaleRowError
from blockprep import reference as ref

WIDTH = 8


def paged(*rows: list[int], width: int = WIDTH) -> list[list[int]]:
    return ref.block_table_per_row(list(rows), max_blocks=width, pad=-1).tolist()


def ring(*rows: list[int], width: int = WIDTH) -> list[list[int]]:
    return ref.ring_block_table_repeat(list(rows), max_blocks=width).tolist()


def cells(table: BlockTable) -> int:
    return table.stats.cells_written


# --- seed-semantics 2.4: one test per invalidation case ---------------------------------------


def test_same_pages_are_a_hit_and_touch_nothing() -> None:
    table = BlockTable(1, WIDTH)
    pages = [3, 4]
    assert table.write_row(0, pages)
    before = table.stats
    table.numpy()  # a view, not a write
    assert not table.write_row(0, pages)
    assert not table.write_row(0, (3, 4))
    assert not table.write_row(0, np.array([3, 4], dtype=np.int64))
    assert not table.write_row(0, torch.tensor([3, 4], dtype=torch.int32))
    assert table.stats.hits == before.hits + 4
    assert cells(table) == before.cells_written
    assert table.numpy().tolist() == paged([3, 4])


def test_page_appended_in_place_is_detected_and_only_the_new_column_is_written() -> None:
    table = BlockTable(1, WIDTH)
    pages = [3, 4]
    table.write_row(0, pages)
    pages.append(9)  # the scheduler mutates its own list, as KvCacheManager does
    before = cells(table)
    assert table.write_row(0, pages)
    assert cells(table) - before == 1
    assert table.numpy().tolist() == paged([3, 4, 9])
    assert table.cached_ids(0) == [3, 4, 9]


def test_shrunk_or_changed_pages_clear_the_stale_tail() -> None:
    table = BlockTable(1, WIDTH)
    table.write_row(0, [3, 4, 5, 6])
    before = cells(table)
    assert table.write_row(0, [3, 4])
    assert cells(table) - before == 2  # only the old tail is reset
    assert table.numpy().tolist() == paged([3, 4])
    assert table.write_row(0, [7, 4, 1])
    assert table.numpy().tolist() == paged([7, 4, 1])


def test_another_request_moving_into_a_row_rewrites_it() -> None:
    table = BlockTable(2, WIDTH)
    table.write_rows([[1, 2, 3], [4]])
    assert table.write_row(0, [4])  # request of row 1 moves to row 0
    assert table.numpy().tolist() == paged([4], [4])
    assert not table.write_row(1, [4])  # identical content: skipping is safe


def test_request_moving_into_a_padded_row() -> None:
    table = BlockTable(3, WIDTH)
    table.write_row(0, [5, 6])
    assert table.fill_rows(0, [1, 2]) == 2  # rows 1 and 2 pad by replicating row 0
    assert table.write_row(1, [8])  # a new request takes padded row 1
    assert not table.write_row(2, [5, 6])  # and one with row 0's pages takes row 2: a hit
    assert table.numpy().tolist() == paged([5, 6], [8], [5, 6])


def test_row_zero_changing_rewrites_every_padding_row_once() -> None:
    table = BlockTable(4, WIDTH)
    table.write_row(0, [5])
    table.fill_rows(0, [1, 2, 3])
    table.take_dirty()
    table.write_row(0, [5, 6])
    assert table.fill_rows(0, [1, 2, 3]) == 3
    assert table.fill_rows(0, [1, 2, 3]) == 0
    assert table.take_dirty() == [0, 1, 2, 3]
    assert table.numpy().tolist() == paged(*[[5, 6]] * 4)


def test_shrinking_batch_rewrites_new_padding_rows_only_when_they_differ() -> None:
    table = BlockTable(3, WIDTH)
    table.write_rows([[1], [2], [1]])
    table.take_dirty()
    assert table.fill_rows(0, [1, 2]) == 1  # row 2 already holds row 0's pages
    assert table.take_dirty() == [1]
    assert table.numpy().tolist() == paged([1], [1], [1])


def test_growing_batch_compares_former_padding_rows_with_their_own_requests() -> None:
    table = BlockTable(3, WIDTH)
    table.write_row(0, [1])
    table.fill_rows(0, [1, 2])
    assert table.write_rows([[1], [2, 3], [1]]) == 1
    assert table.numpy().tolist() == paged([1], [2, 3], [1])


def test_invalidate_forces_full_rewrites_as_a_cache_reset_does() -> None:
    table = BlockTable(2, WIDTH)
    table.write_rows([[1, 2], [3]])
    table.invalidate()
    before = cells(table)
    assert table.write_rows([[1, 2], [3]]) == 2
    assert cells(table) - before == 2 * WIDTH
    table.invalidate(1)
    assert not table.write_row(0, [1, 2])
    assert table.write_row(1, [3])


def test_warmup_writing_the_buffer_then_invalidate_restores_every_row() -> None:
    table = BlockTable(2, WIDTH)
    table.write_rows([[1, 2], [3]])
    table.tensor.fill_(0)  # what upstream's warm-up dispatch does to the compiled buffer
    with pytest.raises(StaleRowError, match="row 0 column 0 holds 0"):
        table.check()
    table.invalidate()
    table.check()
    assert table.write_rows([[1, 2], [3]]) == 2
    assert table.numpy().tolist() == paged([1, 2], [3])


# --- seed-semantics 11.1: a failed write must not leave a stale row behind ---------------------


@pytest.mark.parametrize("bad", [[1, 2**31], [1, 2.5], [1, -4], [1, None], list(range(WIDTH + 1))])
def test_failed_write_then_old_ids_leaves_the_correct_row(bad: list[Any]) -> None:
    for kind, layout in (("paged", paged), ("ring", ring)):
        table = BlockTable(1, WIDTH, kind=kind)  # type: ignore[arg-type]
        old = [6, 7]
        table.write_row(0, old)
        snapshot = table.numpy().copy()
        with pytest.raises((ValueError, TypeError)):
            table.write_row(0, bad)
        assert np.array_equal(table.numpy(), snapshot)
        assert not table.write_row(0, old)  # a hit, and a correct one
        assert table.numpy().tolist() == layout(old)
        table.check()


# --- incremental writes ---------------------------------------------------------------------------


def test_ring_rotation_writes_only_the_rotated_slot_columns() -> None:
    width, n = 4096, 65
    table = BlockTable(1, width, kind="ring")
    ids = list(range(100, 100 + n))
    table.write_row(0, ids)
    for step in range(2 * n + 3):  # rotate slots in order, as the scheduler does, and wrap
        ids[step % n] = 1000 + step
        before = cells(table)
        assert table.write_row(0, ids)
        assert cells(table) - before == len(range(step % n, width, n))
        assert table.numpy().tolist() == ring(ids, width=width)


@pytest.mark.parametrize("changed", [2, 4, 5, 30, 65])
def test_ring_rows_differing_in_k_slots_write_k_strided_columns(changed: int) -> None:
    """Up to four changed slots: their strided columns; more: the whole row (one doubling
    copy in the kernel)."""
    width, n = 300, 65
    rng = np.random.default_rng(changed)
    table = BlockTable(1, width, kind="ring")
    ids = rng.integers(0, 1000, size=n).tolist()
    table.write_row(0, ids)
    slots = sorted(rng.choice(n, size=changed, replace=False).tolist())
    for slot in slots:
        ids[slot] += 1000
    before = cells(table)
    table.write_row(0, ids)
    strided = sum(len(range(s, width, n)) for s in slots)
    assert cells(table) - before == (strided if changed <= 4 else width)
    assert table.numpy().tolist() == ring(ids, width=width)


def test_ring_length_change_rewrites_the_row() -> None:
    table = BlockTable(1, 10, kind="ring")
    table.write_row(0, [1, 2])
    before = cells(table)
    table.write_row(0, [1, 2, 3])
    assert cells(table) - before == 10
    assert table.numpy().tolist() == ring([1, 2, 3], width=10)


def test_cleared_ring_row_is_pad_and_never_a_hit() -> None:
    table = BlockTable(1, 5, kind="ring", pad=-1)
    assert table.numpy().tolist() == [[-1] * 5]
    with pytest.raises(ValueError, match="ring block-table row 0 has no allocated blocks"):
        table.write_row(0, [])
    table.write_row(0, [4])
    assert table.clear_row(0)
    assert not table.clear_row(0)
    assert table.numpy().tolist() == [[-1] * 5]
    assert table.cached_ids(0) == []


def test_paged_clear_resets_only_the_written_cells() -> None:
    table = BlockTable(1, WIDTH)
    table.write_row(0, [1, 2, 3])
    before = cells(table)
    assert table.clear_row(0)
    assert cells(table) - before == 3
    assert not table.write_row(0, [])  # an empty paged row is a cleared row
    assert table.numpy().tolist() == paged([])


def test_swap_and_copy_rows_move_content_and_cache() -> None:
    table = BlockTable(3, WIDTH, kind="ring")
    table.write_rows([[1, 2], [3], [4, 5, 6]])
    assert table.swap_rows(0, 2)
    assert table.numpy().tolist() == ring([4, 5, 6], [3], [1, 2])
    assert not table.write_row(0, [4, 5, 6])
    assert table.copy_row(1, 0)
    assert not table.copy_row(1, 0)
    assert not table.swap_rows(0, 1)
    assert table.numpy().tolist() == ring([3], [3], [1, 2])
    table.check()


def test_take_dirty_lists_rows_written_since_last_call() -> None:
    table = BlockTable(4, WIDTH)
    assert table.take_dirty() == []
    table.write_row(2, [1])
    table.write_row(0, [1])
    table.write_row(2, [1])  # hit
    assert table.take_dirty() == [0, 2]
    assert table.take_dirty() == []


def test_stats_count_hits_misses_and_cells() -> None:
    table = BlockTable(2, WIDTH)
    table.write_row(0, [1, 2])
    table.write_row(0, [1, 2])
    table.write_row(1, [3])
    assert (table.stats.hits, table.stats.misses, table.stats.cells_written) == (1, 2, 3)
    table.reset_stats()
    assert (table.stats.hits, table.stats.misses, table.stats.cells_written) == (0, 0, 0)


# --- buffers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, WIDTH), (3 * WIDTH,)])
def test_adopted_buffer_keeps_identity_and_address(shape: tuple[int, ...]) -> None:
    buffer = torch.full(shape, 42, dtype=torch.int32)
    address = buffer.data_ptr()
    table = BlockTable(3, WIDTH, buffer=buffer)
    assert table.tensor is buffer
    assert table.cached_ids(0) is None  # content unknown until written
    table.write_rows([[1, 2], [3], []])
    table.clear_row(1)
    assert table.tensor is buffer and buffer.data_ptr() == address
    assert buffer.reshape(3, WIDTH).tolist() == paged([1, 2], [], [])
    assert np.shares_memory(table.numpy(), buffer.numpy())


def test_owned_buffer_starts_cleared_and_shares_memory_when_asked() -> None:
    table = BlockTable(2, WIDTH, pad=0, share_memory=True)
    assert table.tensor.is_shared()
    assert table.tensor.dtype == torch.int32 and table.tensor.shape == (2, WIDTH)
    assert table.numpy().tolist() == [[0] * WIDTH] * 2
    assert BlockTable(1, 1, pin_memory=True).tensor.shape == (1, 1)  # a no-op without accelerator


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"buffer": torch.zeros(2, WIDTH, dtype=torch.int64)}, TypeError, "int32 CPU tensor"),
        ({"buffer": torch.zeros(3, WIDTH, dtype=torch.int32)}, ValueError, "must have shape"),
        ({"buffer": torch.zeros(WIDTH, 2, dtype=torch.int32).T}, ValueError, "contiguous"),
        ({"buffer": np.zeros((2, WIDTH), np.int32)}, TypeError, "must be a torch.Tensor"),
        (
            {"buffer": torch.zeros(2, WIDTH, dtype=torch.int32), "share_memory": True},
            ValueError,
            "only to an allocated buffer",
        ),
        ({"kind": "tiled"}, ValueError, "kind must be 'paged' or 'ring'"),
        ({"pad": 2**31}, ValueError, "outside the int32 range"),
        ({"pad": 1.5}, TypeError, "pad must be an integer"),
        ({"pin_memory": True, "share_memory": True}, ValueError, "cannot be combined"),
    ],
)
def test_bad_construction_is_rejected(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BlockTable(2, WIDTH, **kwargs)


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_blocks must be positive"):
        BlockTable(2, 0)
    with pytest.raises(ValueError, match="num_rows must be non-negative"):
        BlockTable(-1, 4)


# --- errors name the row and value, and write nothing ---------------------------------------------


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        (
            [1, 2**31],
            ValueError,
            rf"^block-table row 2 holds block ID 2147483648, maximum is {INT32_MAX}$",
        ),
        ([1, True], TypeError, "^block-table row 2 holds True of type bool"),
        ([1, -1], ValueError, r"^block IDs must not be negative \(block-table row 2, id -1\)$"),
        (
            list(range(WIDTH + 1)),
            ValueError,
            rf"^row 2 has {WIDTH + 1} blocks, maximum is {WIDTH}$",
        ),
        (np.array([1.0, 2.0]), TypeError, "^block-table row 2 has dtype float64"),
        (7, TypeError, "^block-table row 2 must be a sequence of block IDs, got int$"),
    ],
)
def test_bad_ids_raise_naming_row_and_value(ids: Any, error: type[Exception], message: str) -> None:
    table = BlockTable(3, WIDTH)
    table.write_rows([[1], [2], [1, 3]])
    snapshot, stats = table.numpy().copy(), table.stats
    with pytest.raises(error, match=message):
        table.write_row(2, ids)
    with pytest.raises(error, match=message):
        table.write_rows([[5], [6], ids])  # rows 0 and 1 would change, but nothing is written
    assert np.array_equal(table.numpy(), snapshot)
    assert table.stats == stats
    assert table.take_dirty() == [0, 1, 2]  # from the first write_rows only
    assert [table.cached_ids(r) for r in range(3)] == [[1], [2], [1, 3]]


@pytest.mark.parametrize("row", [-1, 3, 10])
def test_bad_row_index_raises_index_error(row: int) -> None:
    table = BlockTable(3, WIDTH)
    for call in (
        lambda: table.write_row(row, [1]),
        lambda: table.copy_row(0, row),
        lambda: table.fill_rows(0, [1, row]),
        lambda: table.swap_rows(row, 0),
        lambda: table.clear_row(row),
        lambda: table.invalidate(row),
        lambda: table.cached_ids(row),
    ):
        with pytest.raises(
            IndexError, match=f"block-table row {row} is out of range for a table of 3 rows"
        ):
            call()
    with pytest.raises(TypeError, match="row index must be an integer, got True"):
        table.write_row(True, [1])  # type: ignore[arg-type]
    assert table.take_dirty() == []
    assert table.numpy().tolist() == paged([], [], [])


@pytest.mark.parametrize("kind", ["ring", "paged"])
def test_write_rows_of_mixed_row_types(kind: str) -> None:
    """Lists beside tuples, arrays and tensors: the table written as of the rows made lists; a
    bad row (wrong type, dtype, shape, value, an empty ring row) raises what writing that row
    alone raises, the first bad row first (a bad row of another type before or after a list
    with a bad id), and nothing is written."""
    good: list[list[Any]] = [
        [[1, 2], (3, 4), np.array([5, 6])],
        [torch.tensor([7, 8]), [9], (10, 11, 12)],
    ]
    for rows in good:
        table, listed = BlockTable(4, 8, kind=kind), BlockTable(4, 8, kind=kind)
        assert table.write_rows(rows, 1) == listed.write_rows([list(map(int, r)) for r in rows], 1)
        assert torch.equal(table.tensor, listed.tensor)
    bad: list[tuple[list[Any], int]] = [
        ([[1, 2], "ab"], 1),
        ([(1, 2), [3, 2**40]], 1),
        ([(1, 1.5), [3, 2**40]], 0),
        ([[1, 2], None, [3, 4]], 1),
        ([[1, 2**40], None], 0),
        ([[1, 2], np.array([1.0, 2.0])], 1),
        ([[1, 2], np.array([[1, 2]])], 1),
    ]
    for rows, first in bad:
        table, alone = BlockTable(4, 8, kind=kind), BlockTable(4, 8, kind=kind)
        before = table.tensor.clone()
        with pytest.raises((TypeError, ValueError)) as caught:
            table.write_rows(rows, 1)
        with pytest.raises((TypeError, ValueError)) as direct:
            alone.write_row(1 + first, rows[first])
        assert (caught.type, str(caught.value)) == (direct.type, str(direct.value))
        assert torch.equal(table.tensor, before)
    if kind == "ring":  # an empty ring row is refused wherever it sits
        with pytest.raises(ValueError, match="row 2 has no allocated blocks"):
            BlockTable(4, 8, kind=kind).write_rows([(1,), [], [2]], 1)
