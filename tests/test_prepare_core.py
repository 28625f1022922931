"""The model-neutral prepare layer: padded token buffers, slot mapping, host and device buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from blockprep import INT32_MAX
from blockprep.buffers import DeviceMirror, host_tensor, pin_memory_available
from blockprep.slots import paged_slot_mapping
from blockprep.tokens import PaddedTokenBuffer

# --- PaddedTokenBuffer ----------------------------------------------------------------------------


def test_padding_is_zeroed_once_and_only_column_zero_is_written() -> None:
    adopted = torch.full((3, 8), 77, dtype=torch.int32)  # upstream's buffer began as torch.empty
    tokens = PaddedTokenBuffer(3, 8, buffer=adopted)
    assert tokens.tensor is adopted
    assert (adopted[:, 1:] == 0).all()
    tokens.write([5, 6])
    tokens.replicate(0, 2)
    assert adopted.tolist() == [[5] + [0] * 7, [6] + [0] * 7, [5] + [0] * 7]
    adopted[:, 1:] = 9  # a writer that is not blockprep
    tokens.write([1])
    assert (adopted[:, 1:] == 9).all()  # padding is never written again ...
    tokens.reset()
    assert (adopted[:, 1:] == 0).all()  # ... until reset()


def test_token_out_of_dtype_range_names_the_row_and_writes_nothing() -> None:
    tokens = PaddedTokenBuffer(2, 4)
    tokens.write([3, 4])
    with pytest.raises(
        ValueError, match=r"^token row 1 holds token id -2147483649, outside int32$"
    ):
        tokens.write([5, -(2**31) - 1])
    tokens_i16 = PaddedTokenBuffer(2, 4, dtype=torch.int16)
    with pytest.raises(ValueError, match=r"^token row 1 holds token id 40000, outside int16$"):
        tokens_i16.write([5, 40000])
    assert tokens.numpy()[:, 0].tolist() == [3, 4]
    with pytest.raises(ValueError, match="3 tokens for a token buffer of 2 rows"):
        tokens.write([1, 2, 3])


def test_bad_token_buffer_configuration() -> None:
    with pytest.raises(ValueError, match="at least one column"):
        PaddedTokenBuffer(2, 0)
    with pytest.raises(TypeError, match="integer dtype"):
        PaddedTokenBuffer(2, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="shape"):
        PaddedTokenBuffer(2, 8, buffer=torch.zeros(2, 4, dtype=torch.int32))


# --- slot mapping -------------------------------------------------------------------------------


@given(
    st.integers(1, 256),
    st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 2**16)), min_size=1, max_size=8),
)
def test_slot_mapping_equals_the_definition(page_size: int, rows: list[tuple[int, int]]) -> None:
    pages = [[base + 3 * k for k in range(-(-seq // page_size))] for seq, base in rows]
    seq_lens = [seq for seq, _ in rows]
    expected = [
        row_pages[(s - 1) // page_size] * page_size + (s - 1) % page_size
        for row_pages, s in zip(pages, seq_lens, strict=True)
    ]
    if max(expected) > INT32_MAX:
        with pytest.raises(ValueError, match="above 2147483647"):
            paged_slot_mapping(pages, seq_lens, page_size)
        return
    assert paged_slot_mapping(pages, seq_lens, page_size).tolist() == expected
    out = np.full(len(rows) + 2, -9, dtype=np.int32)
    paged_slot_mapping(pages, seq_lens, page_size, out=out)
    assert out.tolist() == [*expected, -9, -9]


def test_slot_mapping_errors_write_nothing() -> None:
    out = torch.full((2,), -9, dtype=torch.int32)
    cases = [
        (
            ([[1], [2]], [1, 130], 128),
            ValueError,
            "page_ids list length 1 is too small for decode position 129; need at least 2 pages",
        ),
        (
            ([[1], [2**24]], [1, 1], 128),
            ValueError,
            r"row 1 maps to slot 2147483648 \(page 16777216\)",
        ),
        (([[1], [2]], [1, 0], 128), ValueError, "row 1 has seq_len 0; it must be positive"),
        (([[1], [2.0]], [1, 1], 128), TypeError, "row 1 holds 2.0 of type float"),
        (([[1], [-3]], [1, 1], 128), ValueError, "block IDs must not be negative"),
        (([[1]], [1, 1], 128), ValueError, "1 page lists for 2 seq_lens"),
        (([[1]], [1], 0), ValueError, "page_size must be positive"),
    ]
    for (pages, seq_lens, page_size), error, message in cases:
        with pytest.raises(error, match=message):
            paged_slot_mapping(pages, seq_lens, page_size, out=out)
        assert out.tolist() == [-9, -9]


# --- host and device buffers ----------------------------------------------------------------------


def test_host_tensor_allocation() -> None:
    shared = host_tensor((2, 3), torch.int32, fill=-1, share_memory=True)
    assert shared.is_shared() and shared.tolist() == [[-1] * 3] * 2
    pinned = host_tensor((4,), torch.int64, fill=0, pin_memory=True)
    assert pinned.is_pinned() == pin_memory_available()
    with pytest.raises(ValueError, match="cannot be combined"):
        host_tensor((1,), torch.int32, fill=0, pin_memory=True, share_memory=True)


def test_cpu_mirror_is_the_host_buffer() -> None:
    host = torch.zeros(4, 3, dtype=torch.int32)
    mirror = DeviceMirror(host, "cpu")
    assert mirror.tensor is host and mirror.is_host
    mirror.sync([1])  # nothing to copy


def test_separate_mirror_copies_only_the_rows_asked_for() -> None:
    host = torch.arange(15, dtype=torch.int32).reshape(5, 3)
    mirror = DeviceMirror(host, "cpu", separate=True)
    assert mirror.tensor is not host and torch.equal(mirror.tensor, host)
    host += 100
    mirror.sync([1, 2, 4])
    expected = torch.arange(15, dtype=torch.int32).reshape(5, 3)
    expected[[1, 2, 4]] += 100
    assert torch.equal(mirror.tensor, expected)
    host += 1
    with pytest.raises(IndexError, match="mirror row 5 is out of range for 5 rows"):
        mirror.sync([0, 5])
    assert torch.equal(mirror.tensor, expected)  # nothing copied
    mirror.sync([3, 0, 3])  # any order, repeats allowed
    expected[[0, 3]] = host[[0, 3]]
    assert torch.equal(mirror.tensor, expected)
    mirror.sync()
    assert torch.equal(mirror.tensor, host)
