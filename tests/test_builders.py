"""The builders equal upstream's constructions (blockprep.reference) and validate before writing."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from blockprep import INT32_MAX, paged_block_table, ring_block_table
from blockprep import reference as ref
from blockprep.testing import CONTAINERS, as_container, in_containers, paged_tables, ring_tables

RING_REFERENCES = (ref.ring_block_table_repeat, ref.ring_block_table_gather)
PAGED_REFERENCES = (ref.block_table_per_row, ref.block_table_one_tensor)

OUT_KINDS = ("none", "tensor", "numpy", "strided-tensor")


def make_out(kind: str, shape: tuple[int, int], fill: int = 12345) -> Any:
    """An ``out`` argument of the given kind, prefilled so that unwritten cells show."""
    if kind == "none":
        return None
    if kind == "tensor":
        return torch.full(shape, fill, dtype=torch.int32)
    if kind == "numpy":
        return np.full(shape, fill, dtype=np.int32)
    parent = torch.full((shape[0], 2 * shape[1]), fill, dtype=torch.int32)
    return parent[:, ::2]


def as_tensor(table: Any) -> torch.Tensor:
    return torch.from_numpy(table) if isinstance(table, np.ndarray) else table


def snapshot(out: Any) -> Any:
    return None if out is None else as_tensor(out).clone()


# --- equivalence ---------------------------------------------------------------------------------


@given(ring_tables(), st.data(), st.sampled_from(OUT_KINDS))
@example(([], 1), None, "none")
@example(([[INT32_MAX]], 1), None, "tensor")
@example(([[5], [INT32_MAX, 0, 1]], 3), None, "numpy")
@example(([list(range(300))], 300), None, "strided-tensor")
def test_ring_equals_reference(table: Any, data: Any, out_kind: str) -> None:
    rows, max_blocks = table
    containers = rows if data is None else data.draw(in_containers(rows))
    out = make_out(out_kind, (len(rows), max_blocks))
    result = ring_block_table(containers, max_blocks, out=out)
    if out is not None:
        assert result is out
    for reference in RING_REFERENCES:
        assert torch.equal(as_tensor(result), reference(rows, max_blocks=max_blocks))
    assert as_tensor(result).dtype == torch.int32


@given(paged_tables(), st.data(), st.sampled_from(OUT_KINDS), st.sampled_from([0, -1, INT32_MAX]))
@example(([], 1), None, "none", 0)
@example(([[], [INT32_MAX]], 1), None, "numpy", -1)
@example(([list(range(300)), []], 300), None, "strided-tensor", 0)
def test_paged_equals_reference(table: Any, data: Any, out_kind: str, pad: int) -> None:
    rows, max_blocks = table
    containers = rows if data is None else data.draw(in_containers(rows))
    out = make_out(out_kind, (len(rows), max_blocks))
    result = paged_block_table(containers, max_blocks, pad=pad, out=out)
    if out is not None:
        assert result is out
    for reference in PAGED_REFERENCES:
        assert torch.equal(as_tensor(result), reference(rows, max_blocks=max_blocks, pad=pad))


@given(st.integers(1, 40), st.integers(0, 6), st.integers(1, 40), st.sampled_from(CONTAINERS[2:]))
def test_two_dimensional_tables_equal_reference(
    max_blocks: int, count: int, width: int, container: str
) -> None:
    width = min(width, max_blocks)
    rows = [[(7 * r + j) % 251 for j in range(width)] for r in range(count)]
    table = as_container([x for row in rows for x in row], container).reshape(count, width)
    assert torch.equal(
        ring_block_table(table, max_blocks),
        ref.ring_block_table_repeat(rows, max_blocks=max_blocks),
    )
    assert torch.equal(
        paged_block_table(table, max_blocks), ref.block_table_per_row(rows, max_blocks=max_blocks)
    )


def test_upstream_examples() -> None:
    assert ring_block_table([(7, 9, 4)], max_blocks=8).tolist() == [[7, 9, 4, 7, 9, 4, 7, 9]]
    assert ring_block_table([(6,)], max_blocks=4).tolist() == [[6, 6, 6, 6]]
    assert paged_block_table([[64, 65]], max_blocks=4).tolist() == [[64, 65, 0, 0]]
    assert ring_block_table([], max_blocks=5).shape == (0, 5)
    assert paged_block_table([], max_blocks=5).shape == (0, 5)


def test_generators_and_numpy_scalars_are_accepted() -> None:
    rows = ([np.int16(3), np.uint64(4)] for _ in range(2))
    assert ring_block_table(rows, 3).tolist() == [[3, 4, 3], [3, 4, 3]]
    assert paged_block_table([[torch.tensor(9)]], 2).tolist() == [[9, 0]]


# --- upstream-checked faults: same error type and message as upstream, out untouched ------------


def inject(draw: Any, rows: list[list[int]], max_blocks: int, fault: str) -> list[list[int]]:
    """A copy of ``rows`` with ``fault`` put into one row: "empty", "long" or "negative"."""
    rows = [list(row) for row in rows]
    r = draw(st.integers(0, len(rows) - 1))
    if fault == "empty":
        rows[r] = []
    elif fault == "long":
        rows[r] += [0] * (max_blocks + draw(st.integers(1, 3)) - len(rows[r]))
    else:
        negative = draw(st.integers(-(2**40), -1))
        if rows[r]:
            rows[r][draw(st.integers(0, len(rows[r]) - 1))] = negative
        else:
            rows[r] = [negative]
    return rows


@st.composite
def ring_faults(draw: Any) -> tuple[list[list[int]], int]:
    rows, max_blocks = draw(ring_tables(max_width=60))
    rows = rows or [[1]]
    for fault in draw(st.lists(st.sampled_from(["empty", "negative"]), min_size=1, max_size=3)):
        rows = inject(draw, rows, max_blocks, fault)
    return rows, max_blocks


@st.composite
def paged_faults(draw: Any) -> tuple[list[list[int]], int]:
    rows, max_blocks = draw(paged_tables(max_width=60))
    rows = rows or [[]]
    for fault in draw(st.lists(st.sampled_from(["long", "negative"]), min_size=1, max_size=3)):
        rows = inject(draw, rows, max_blocks, fault)
    return rows, max_blocks


def raised(call: Any) -> tuple[type[BaseException], str]:
    """The exception's type and message, less the place blockprep appends to upstream's message
    (``" (block-table row 3, id -1)"``): tests match upstream's text as the prefix."""
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    builtin = next(t for t in info.type.__mro__ if t.__module__ == "builtins")  # upstream's type
    return builtin, re.sub(r" \((ring )?block-table row \d+, id -?\d+\)$", "", str(info.value))


@given(ring_faults(), st.data(), st.sampled_from(OUT_KINDS[1:]))
def test_ring_faults_match_upstream_and_write_nothing(table: Any, data: Any, out_kind: str) -> None:
    rows, max_blocks = table
    out = make_out(out_kind, (len(rows), max_blocks))
    before = snapshot(out)
    containers = data.draw(in_containers_allowing_negatives(rows))
    ours = raised(lambda: ring_block_table(containers, max_blocks, out=out))
    for reference in RING_REFERENCES:
        assert ours == raised(lambda ref_=reference: ref_(rows, max_blocks=max_blocks))
    assert torch.equal(as_tensor(out), before)


@given(paged_faults(), st.data(), st.sampled_from(OUT_KINDS[1:]))
def test_paged_faults_match_upstream_and_write_nothing(
    table: Any, data: Any, out_kind: str
) -> None:
    rows, max_blocks = table
    out = make_out(out_kind, (len(rows), max_blocks))
    before = snapshot(out)
    containers = data.draw(in_containers_allowing_negatives(rows))
    ours = raised(lambda: paged_block_table(containers, max_blocks, pad=-1, out=out))
    for reference in PAGED_REFERENCES:
        assert ours == raised(lambda ref_=reference: ref_(rows, max_blocks=max_blocks))
    assert torch.equal(as_tensor(out), before)


@st.composite
def in_containers_allowing_negatives(draw: Any, rows: list[list[int]]) -> list[Any]:
    """Rows in containers; a row with a negative id goes into one that can hold any of them."""
    signed = ["list", "tuple", "numpy-int64", "torch-int64"]
    return [
        as_container(row, draw(st.sampled_from(signed if any(x < 0 for x in row) else CONTAINERS)))
        for row in rows
    ]


@pytest.mark.parametrize("max_blocks", [0, -3])
def test_non_positive_max_blocks_is_checked_first(max_blocks: int) -> None:
    for build in (ring_block_table, paged_block_table):
        with pytest.raises(ValueError, match=r"^max_blocks must be positive$"):
            build([[-1], []], max_blocks)
        with pytest.raises(ValueError, match=r"^max_blocks must be positive$"):
            build([], max_blocks)


# --- deliberate improvements over upstream -------------------------------------------------------


def test_long_ring_row_raises_instead_of_truncating() -> None:
    out = torch.full((2, 3), 7, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^ring block-table row 1 has 4 blocks, maximum is 3$"):
        ring_block_table([[1], [1, 2, 3, 4]], 3, out=out)
    assert (out == 7).all()
    # Upstream silently truncated the same row.
    assert ref.ring_block_table_repeat([[1], [1, 2, 3, 4]], max_blocks=3)[1].tolist() == [1, 2, 3]


NON_INTEGERS = [True, False, np.True_, 1.0, 2.5, np.float32(3), "4", None, torch.tensor(1.0)]


@pytest.mark.parametrize("bad", NON_INTEGERS, ids=repr)
@pytest.mark.parametrize("build", [ring_block_table, paged_block_table])
def test_non_integer_id_raises_type_error_naming_the_row(bad: object, build: Any) -> None:
    out = np.full((3, 4), 7, dtype=np.int32)
    with pytest.raises(TypeError, match=r"row 2 holds .*block IDs must be integers"):
        build([[5, 6], [0, 1], [3, bad]], 4, out=out)
    assert (out == 7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.float16])
def test_non_integer_tensor_row_raises_type_error(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=r"row 1 has dtype torch\.\w+; block IDs must be integers"):
        ring_block_table([[1], torch.ones(2, dtype=dtype)], 4)
    with pytest.raises(TypeError, match=r"row 0 has dtype .*block IDs must be integers"):
        paged_block_table(np.ones((2, 2), dtype=np.float64), 4)


@pytest.mark.parametrize("value", [INT32_MAX + 1, 2**63, 2**80])
@pytest.mark.parametrize("container", ["list", "numpy", "tensor"])
def test_id_above_int32_raises_naming_row_and_id(value: int, container: str) -> None:
    row: Any = [3, value]
    if container == "numpy" and value < 2**64:
        row = np.array(row, dtype=np.uint64)
    elif container == "tensor" and value < 2**63:
        row = torch.tensor(row, dtype=torch.int64)
    out = torch.full((2, 4), 7, dtype=torch.int32)
    for build, label in (
        (ring_block_table, "ring block-table"),
        (paged_block_table, "block-table"),
    ):
        with pytest.raises(ValueError, match=rf"^{label} row 1 holds block ID {value}, maximum is"):
            build([[1], row], 4, out=out)
        assert (out == 7).all()


def test_errors_follow_row_order_across_kinds() -> None:
    with pytest.raises(
        ValueError, match=r"^block IDs must not be negative \(ring block-table row 1, id -1\)$"
    ):
        ring_block_table([[1], [-1], [2.5]], 4)
    with pytest.raises(TypeError, match=r"row 1 holds 2\.5"):
        ring_block_table([[1], [2.5], [-1]], 4)
    with pytest.raises(ValueError, match="row 1 holds block ID"):
        paged_block_table([[1], [2**31], [1, 2, 3, 4, 5]], 4)
    with pytest.raises(ValueError, match=r"^row 1 has 5 blocks, maximum is 4$"):
        paged_block_table([[1], [1, 2, 3, 4, 5], [2**31]], 4)


@pytest.mark.parametrize("build", [ring_block_table, paged_block_table])
def test_malformed_rows_raise_type_or_value_errors(build: Any) -> None:
    with pytest.raises(TypeError, match="rows must be an iterable"):
        build(5, 4)
    with pytest.raises(TypeError, match="row 1 must be a sequence of block IDs, got int"):
        build([[1], 7], 4)
    with pytest.raises(ValueError, match=r"row 0 must be one-dimensional, got shape \(1, 1\)"):
        build([np.ones((1, 1), dtype=np.int64)], 4)
    with pytest.raises(TypeError, match="row 0 holds"):
        build([[[1, 2]]], 4)


@pytest.mark.parametrize("bad_max_blocks", [True, 2.0, "4", None])
def test_max_blocks_must_be_an_integer(bad_max_blocks: object) -> None:
    with pytest.raises(TypeError, match="max_blocks must be an integer"):
        ring_block_table([[1]], bad_max_blocks)  # type: ignore[arg-type]


def test_pad_must_be_an_int32() -> None:
    with pytest.raises(TypeError, match="pad must be an integer"):
        paged_block_table([[1]], 2, pad=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pad must be an integer"):
        paged_block_table([[1]], 2, pad=False)
    with pytest.raises(ValueError, match="pad 2147483648 is outside the int32 range"):
        paged_block_table([[1]], 2, pad=2**31)


@pytest.mark.parametrize(
    ("out", "error", "message"),
    [
        (torch.zeros((2, 4), dtype=torch.int64), TypeError, "out must be an int32 CPU tensor"),
        (torch.zeros((2, 5), dtype=torch.int32), ValueError, r"out must have shape \(2, 4\)"),
        (np.zeros((2, 4), dtype=np.int64), TypeError, "out must be an int32 array"),
        (np.zeros((4, 2), dtype=np.int32), ValueError, r"out must have shape \(2, 4\)"),
        ([[0] * 4] * 2, TypeError, "out must be a torch.Tensor or numpy.ndarray"),
    ],
)
def test_bad_out_is_rejected(out: Any, error: type[Exception], message: str) -> None:
    for build in (ring_block_table, paged_block_table):
        with pytest.raises(error, match=message):
            build([[1], [2]], 4, out=out)


def test_read_only_out_is_rejected() -> None:
    out = np.zeros((1, 4), dtype=np.int32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        ring_block_table([[1]], 4, out=out)


def test_callers_ids_are_only_read() -> None:
    """Read-only inputs work: a builder or a BlockTable never writes the caller's ids."""
    from blockprep import BlockTable

    table = np.array([[3, 4, 5], [6, 7, 8]], dtype=np.int32)
    table.flags.writeable = False
    assert ring_block_table(table, 7).tolist() == [[3, 4, 5, 3, 4, 5, 3], [6, 7, 8, 6, 7, 8, 6]]
    assert paged_block_table(table, 4).tolist() == [[3, 4, 5, 0], [6, 7, 8, 0]]
    rows = BlockTable(2, 4, kind="ring")
    rows.write_rows(list(table))
    rows.write_row(0, table[1])
    assert rows.numpy().tolist() == [[6, 7, 8, 6], [6, 7, 8, 6]]
