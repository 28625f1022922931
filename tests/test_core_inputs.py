"""The core's inputs (ids, tokens, lengths, ``DecodeBatch``, ``BlockTable``): no silent coercion of
ids, tokens or lengths; clear exception types naming the argument; ``BlockTable(verify=True)``;
and a stateful suite that interleaves bad inputs of every class with valid steps over
``BlockTable``, the builders, the slot mapping and the padded token buffer, checking every
buffer against ``blockprep.reference`` after every step and byte-identity after every failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockprep import (
    INT32_MAX,
    BlockTable,
    DecodeBatch,
    DeviceMirror,
    PaddedTokenBuffer,
    StaleRowError,
    host_tensor,
    paged_block_table,
    paged_slot_mapping,
    ring_block_table,
)
from blockprep import reference as ref
from blockprep.slots import decode_slots

META = torch.device("meta")

# Messages that come from Python, NumPy or torch internals, never from a check that names the
# argument.
INTERNAL_PHRASES = (
    "object of type",
    "has no len()",
    "truth value of an array",
    "list indices must be",
    "not subscriptable",
    "can't convert",
    "Storage size",
    "Trying to create tensor",
    "iteration over a 0-d",
    "argument 'size'",
    "not supported between instances",
    "has no attribute",
    "Cannot copy out of meta",
    "not compiled with",
    "Expected one of cpu",
    "slice indices must be",
    "only integer",
)


def _internal(message: str) -> str | None:
    return next((phrase for phrase in INTERNAL_PHRASES if phrase in message), None)


# --- 1. silent coercions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([11.7], r"^token row 0 holds 11\.7 of type float; token ids must be integers"),
        ([1.7, True], r"^token row 0 holds 1\.7"),
        ([5, True], r"^token row 1 holds True of type bool"),
        ([5, np.float64(2.0)], r"^token row 1 holds np\.float64\(2\.0\)"),
        ([5, None], r"^token row 1 holds None"),
        (
            torch.tensor([1.5, 2.0]),
            r"^tokens must be a 1-D integer array or tensor, got torch\.float32",
        ),
        (np.array([True]), r"^tokens must be a 1-D integer array or tensor, got bool"),
        ({1, 2}, r"^tokens must be a list of token ids, got set"),
    ],
)
def test_padded_token_buffer_rejects_non_integer_tokens(tokens: Any, message: str) -> None:
    buffer = PaddedTokenBuffer(3, 4)
    buffer.write([7, 8, 9])
    before = buffer.tensor.clone()
    with pytest.raises(TypeError, match=message):
        buffer.write(tokens)
    if isinstance(tokens, list):
        with pytest.raises(TypeError, match=message):
            buffer.check_tokens(tokens)
    assert torch.equal(buffer.tensor, before)
    # Integers in any integer form are taken, as plain ints.
    buffer.write([np.int64(4), 5, np.array(6)])  # type: ignore[list-item]
    buffer.write(torch.tensor([1, 2], dtype=torch.int64))
    assert buffer.tensor[:, 0].tolist() == [1, 2, 6]
    assert not buffer.fits(np.array([1.0]))  # a float array never fits: check_tokens names it


def test_padded_token_buffer_replicate_rejects_negative_and_out_of_range_indexes() -> None:
    buffer = PaddedTokenBuffer(4, 2)
    buffer.write([1, 2, 3, 4])
    before = buffer.tensor.clone()
    for src, start, error, message in [
        (-1, 1, IndexError, "replicate src -1 is out of range for 4 token rows"),
        (0, -2, IndexError, "replicate start -2 is out of range for 4 token rows"),
        (4, 1, IndexError, "replicate src 4 is out of range"),
        (0, 5, IndexError, "replicate start 5 is out of range"),
        (0.0, 1, TypeError, "replicate src must be an integer"),
        (0, True, TypeError, "replicate start must be an integer"),
    ]:
        with pytest.raises(error, match=message):
            buffer.replicate(src, start)  # type: ignore[arg-type]
        assert torch.equal(buffer.tensor, before)
    buffer.replicate(0, 4)  # start == batch: nothing to pad
    buffer.replicate(1, 2)
    assert buffer.tensor[:, 0].tolist() == [1, 2, 2, 2]


UNORDERED_OR_BYTES_ROWS: list[tuple[str, Any]] = [
    ("set", {3, 1, 2}),
    ("dict", {1: 2}),
    ("bytearray", bytearray(b"\x01\x02")),
    ("memoryview", memoryview(b"\x01\x02")),
    ("bytes", b"\x01"),
    ("str", "12"),
]


@pytest.mark.parametrize(("name", "row"), UNORDERED_OR_BYTES_ROWS)
def test_unordered_or_bytes_rows_are_rejected_everywhere(name: str, row: Any) -> None:
    message = rf"row 1 must be a sequence of block IDs, got {name}$"
    out = np.full((2, 4), 7, dtype=np.int32)
    for build in (ring_block_table, paged_block_table):
        with pytest.raises(TypeError, match=message):
            build([[5], row], 4, out=out)
    assert (out == 7).all()
    table = BlockTable(2, 4)
    table.write_rows([[5], [6]])
    before = table.numpy().copy()
    with pytest.raises(TypeError, match=message):
        table.write_row(1, row)
    with pytest.raises(TypeError, match=message):
        table.write_rows([[8], row])
    with pytest.raises(TypeError, match=rf"row 1 ids must be a sequence of block IDs, got {name}"):
        table.append(1, row)
    with pytest.raises(TypeError, match=rf"slot-mapping row 1 pages must be a sequence.*{name}"):
        paged_slot_mapping([[5], row], [1, 1], 16)
    assert np.array_equal(table.numpy(), before)
    assert table.cached_ids(1) == [6]


@pytest.mark.parametrize("rows", [{(1, 2), (3, 4)}, {0: [1], 1: [2]}, b"\x01", np.array(3)])
def test_rows_themselves_must_be_ordered(rows: Any) -> None:
    """A set of rows would assign rows to requests in arbitrary order."""
    for build in (ring_block_table, paged_block_table):
        with pytest.raises(
            TypeError, match=r"^rows must be an iterable of block-id rows, in order"
        ):
            build(rows, 4)


def test_an_id_equal_to_the_held_id_is_the_held_int_and_the_cache_stores_only_ints() -> None:
    """The id rule: ``[1.0, 2, 3, 4]`` over ``[1, 2, 3]`` is accepted (only the 4 is new, and it
    is an int), on a fresh row rejected; whatever is accepted, the cache holds plain ints."""
    table = BlockTable(2, 6, verify=True)
    table.write_row(0, [1, 2, 3])
    assert table.write_row(0, [1.0, 2, 3, 4])  # type: ignore[list-item]
    held = table.cached_ids(0)
    assert held == [1, 2, 3, 4] and all(type(x) is int for x in held)
    assert all(type(x) is int for x in table.held_rows(1)[0] or ())
    with pytest.raises(TypeError, match=r"^block-table row 1 holds 1\.0 of type float"):
        table.write_row(1, [1.0, 2, 3, 4])  # type: ignore[list-item]
    # A changed id must be an integer even next to value-equal ones.
    with pytest.raises(TypeError, match=r"^block-table row 0 holds 5\.0 of type float"):
        table.write_row(0, [1.0, 2, 3, 4, 5.0])  # type: ignore[list-item]
    # NumPy integers equal to the held ids: the held ints; a new NumPy integer: converted.
    table.write_row(0, [np.int64(1), np.int32(2), 3, 4, np.int64(9)])  # type: ignore[list-item]
    assert all(type(x) is int for x in table.cached_ids(0) or ())
    assert table.numpy()[0].tolist() == [1, 2, 3, 4, 9, -1]
    # A value-equal list is a hit, whatever its types.
    stats = table.stats
    assert not table.write_row(0, [1.0, 2.0, 3, 4, 9])  # type: ignore[list-item]
    assert table.stats.hits == stats.hits + 1
    # Ring: a value-equal slot is held; the changed slot must be an int.
    ring = BlockTable(1, 7, kind="ring", verify=True)
    ring.write_row(0, [1, 2, 3])
    ring.write_row(0, [1.0, 2, 5])  # type: ignore[list-item]
    assert ring.cached_ids(0) == [1, 2, 5] and all(type(x) is int for x in ring.cached_ids(0) or ())
    assert ring.numpy()[0].tolist() == [1, 2, 5, 1, 2, 5, 1]


@pytest.mark.parametrize(
    "seq_lens", [[True], [np.bool_(True)], torch.tensor([True]), [1.0], [np.float64(2.0)], [None]]
)
def test_bool_or_float_seq_lens_are_rejected(seq_lens: Any) -> None:
    out = torch.full((2,), 7, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^slot-mapping row 0 seq_len must be an integer"):
        paged_slot_mapping([[3, 4]], seq_lens, 16, out=out)
    with pytest.raises(TypeError, match=r"^slot-mapping row 0 seq_len must be an integer"):
        decode_slots([[3, 4]], seq_lens, 16)
    assert out.tolist() == [7, 7]
    # Integers in any integer form still work, and the slots are plain ints.
    slots = decode_slots([[3, 4]], [np.int64(17)], 16)  # type: ignore[list-item]
    assert slots == [4 * 16] and type(slots[0]) is int


# --- 2. exception types ---------------------------------------------------------------------------


def test_decode_batch_accepts_lists_and_numpy_arrays() -> None:
    """Engines build token ids and lengths as lists or arrays: they become tensors, and the Qwen
    preparer prepares them as it prepares tensors."""
    from blockprep.adapters.qwen import QwenDecodePreparer

    common: dict[str, Any] = {"request_ids": ["a", "b"], "hidden_states": None}
    pages = [[1, 2], [3]]
    built = [
        DecodeBatch(token_ids=[5, 6], seq_lens=[20, 3], block_ids=pages, **common),
        DecodeBatch(token_ids=np.array([5, 6]), seq_lens=(20, 3), block_ids=pages, **common),
        DecodeBatch(
            token_ids=torch.tensor([5, 6]),
            seq_lens=torch.tensor([20, 3]),
            block_ids=pages,
            **common,
        ),
    ]
    results = []
    for batch in built:
        assert isinstance(batch.token_ids, torch.Tensor)
        assert isinstance(batch.seq_lens, torch.Tensor)
        preparer = QwenDecodePreparer(4, 64, 16)
        inputs = preparer.prepare(batch)
        results.append([t.clone() for t in vars(inputs).values() if isinstance(t, torch.Tensor)])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))
    prev = DecodeBatch(token_ids=[5], seq_lens=[3], prev_token_ids=[4], **common)
    assert isinstance(prev.prev_token_ids, torch.Tensor)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token_ids", None),
        ("seq_lens", None),
        ("token_ids", {1, 2}),
        ("seq_lens", "12"),
        ("token_ids", [[1], [2, 3]]),
        ("seq_lens", [object()]),
    ],
)
def test_decode_batch_rejects_what_is_no_tensor_with_a_type_error(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"token_ids": [1], "seq_lens": [3]}
    fields[field] = value
    with pytest.raises(TypeError, match=rf"^DecodeBatch {field} must be an integer tensor"):
        DecodeBatch(request_ids=["a"], hidden_states=None, **fields)


def _meta(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


BAD_CALLS: list[tuple[str, Callable[[], object], type[Exception]]] = [
    # host_tensor
    ("host_tensor huge", lambda: host_tensor((2**40, 2**40), torch.int32, fill=0), ValueError),
    ("host_tensor negative", lambda: host_tensor((-1, 2), torch.int32, fill=0), ValueError),
    ("host_tensor None shape", lambda: host_tensor(None, torch.int32, fill=0), TypeError),  # type: ignore[arg-type]
    ("host_tensor float size", lambda: host_tensor((2.0,), torch.int32, fill=0), TypeError),  # type: ignore[arg-type]
    ("host_tensor str dtype", lambda: host_tensor((2,), "int32", fill=0), TypeError),  # type: ignore[arg-type]
    # BlockTable
    ("BlockTable huge", lambda: BlockTable(2**40, 2**40), ValueError),
    ("BlockTable None rows", lambda: BlockTable(None, 4), TypeError),  # type: ignore[arg-type]
    ("BlockTable float width", lambda: BlockTable(2, 4.0), TypeError),  # type: ignore[arg-type]
    ("BlockTable array kind", lambda: BlockTable(2, 4, kind=np.array(["ring"])), ValueError),  # type: ignore[arg-type]
    ("BlockTable meta buffer", lambda: BlockTable(2, 4, buffer=_meta(2, 4)), TypeError),
    ("BlockTable list buffer", lambda: BlockTable(1, 1, buffer=[0]), TypeError),  # type: ignore[arg-type]
    ("BlockTable meta ids", lambda: BlockTable(1, 4).write_row(0, _meta(2)), ValueError),
    ("BlockTable None ids", lambda: BlockTable(1, 4).write_row(0, None), TypeError),  # type: ignore[arg-type]
    ("BlockTable float row", lambda: BlockTable(1, 4).write_row(0.0, [1]), TypeError),  # type: ignore[arg-type]
    ("BlockTable array row", lambda: BlockTable(2, 4).write_row(np.array([0, 1]), [1]), TypeError),  # type: ignore[arg-type]
    ("BlockTable nested ids", lambda: BlockTable(1, 4).write_row(0, [np.array([1, 2])]), TypeError),
    ("BlockTable 2-D ids", lambda: BlockTable(1, 4).write_row(0, np.ones((2, 2), int)), ValueError),
    ("BlockTable float fill", lambda: BlockTable(2, 4).fill_rows(0, [1.0]), TypeError),  # type: ignore[list-item]
    ("BlockTable None rows_ids", lambda: BlockTable(2, 4).write_rows(None), TypeError),  # type: ignore[arg-type]
    # PaddedTokenBuffer
    ("PaddedTokenBuffer huge", lambda: PaddedTokenBuffer(2**40, 2**40), ValueError),
    ("PaddedTokenBuffer str dtype", lambda: PaddedTokenBuffer(2, 4, dtype="int32"), TypeError),  # type: ignore[arg-type]
    ("PaddedTokenBuffer meta", lambda: PaddedTokenBuffer(2, 4, buffer=_meta(2, 4)), ValueError),
    ("PaddedTokenBuffer list", lambda: PaddedTokenBuffer(1, 1, buffer=[[0]]), TypeError),  # type: ignore[arg-type]
    ("PaddedTokenBuffer None", lambda: PaddedTokenBuffer(2, 4).write(None), TypeError),  # type: ignore[arg-type]
    (
        "PaddedTokenBuffer arrays",
        lambda: PaddedTokenBuffer(2, 4).write([np.array([1, 2])]),
        TypeError,
    ),
    ("PaddedTokenBuffer meta tokens", lambda: PaddedTokenBuffer(2, 4).write(_meta(2)), TypeError),  # type: ignore[arg-type]
    ("PaddedTokenBuffer float src", lambda: PaddedTokenBuffer(2, 4).replicate(0.5, 1), TypeError),  # type: ignore[arg-type]
    # builders
    ("ring None rows", lambda: ring_block_table(None, 4), TypeError),
    ("ring 0-d rows", lambda: ring_block_table(np.array(3), 4), TypeError),
    ("ring meta rows", lambda: ring_block_table(_meta(2, 2, dtype=torch.int64), 4), ValueError),
    ("ring meta out", lambda: ring_block_table([[1]], 4, out=_meta(1, 4)), TypeError),
    ("ring None width", lambda: ring_block_table([[1]], None), TypeError),  # type: ignore[arg-type]
    ("ring nested ids", lambda: ring_block_table([[np.array([1, 2])]], 4), TypeError),
    ("ring float tensor", lambda: ring_block_table(torch.ones(2, 2), 4), TypeError),
    ("paged bool table", lambda: paged_block_table(np.ones((2, 2), bool), 4), TypeError),
    ("paged list out", lambda: paged_block_table([[1]], 4, out=[[0] * 4]), TypeError),  # type: ignore[call-overload]
    ("paged float pad", lambda: paged_block_table([[1]], 4, pad=0.5), TypeError),  # type: ignore[arg-type]
    # slot mapping
    ("slots None pages", lambda: paged_slot_mapping(None, [1], 4), TypeError),  # type: ignore[arg-type]
    ("slots None seq_lens", lambda: paged_slot_mapping([[1]], None, 4), TypeError),  # type: ignore[arg-type]
    ("slots set pages", lambda: paged_slot_mapping({(1,)}, [1], 4), TypeError),  # type: ignore[arg-type]
    ("slots float seq_len", lambda: paged_slot_mapping([[1]], [1.5], 4), TypeError),  # type: ignore[list-item]
    ("slots array seq_len", lambda: paged_slot_mapping([[1]], [np.array([1, 2])], 4), TypeError),  # type: ignore[list-item]
    ("slots None seq_len", lambda: paged_slot_mapping([[1]], [None], 4), TypeError),  # type: ignore[list-item]
    ("slots set row", lambda: paged_slot_mapping([{1, 2}], [1], 4), TypeError),  # type: ignore[list-item]
    ("slots meta out", lambda: paged_slot_mapping([[1]], [1], 4, out=_meta(4)), TypeError),
    ("slots list out", lambda: paged_slot_mapping([[1]], [1], 4, out=[0]), TypeError),  # type: ignore[arg-type]
    ("slots float page size", lambda: paged_slot_mapping([[1]], [1], 4.0), TypeError),  # type: ignore[arg-type]
    ("slots float page", lambda: paged_slot_mapping([[1.5]], [1], 4), TypeError),
    # DeviceMirror
    ("mirror unknown device", lambda: DeviceMirror(torch.zeros(2), "foo"), ValueError),
    ("mirror None host", lambda: DeviceMirror(None, "cpu"), TypeError),  # type: ignore[arg-type]
    ("mirror meta host", lambda: DeviceMirror(torch.zeros(2, device=META), "cpu"), ValueError),
    ("mirror int device", lambda: DeviceMirror(torch.zeros(2), 3), TypeError),  # type: ignore[arg-type]
    (
        "mirror float row",
        lambda: DeviceMirror(torch.zeros(2), "cpu", separate=True).sync([0.5]),  # type: ignore[list-item]
        TypeError,
    ),
]
if not torch.cuda.is_available():
    BAD_CALLS.append(
        ("mirror absent cuda", lambda: DeviceMirror(torch.zeros(2), "cuda"), ValueError)
    )


@pytest.mark.parametrize(("name", "call", "error"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_inputs_raise_clear_value_or_type_errors(
    name: str, call: Callable[[], object], error: type[Exception]
) -> None:
    """Every core entry point, bad inputs of every class: the documented type (never a
    RuntimeError, NotImplementedError, AttributeError or AssertionError) and a message of
    blockprep's own, naming the argument, not one from Python, NumPy or torch internals."""
    with pytest.raises(Exception) as info:  # the type is asserted below
        call()
    assert type(info.value) is error or (
        isinstance(info.value, error) and type(info.value).__module__.startswith("blockprep")
    ), f"{name}: {type(info.value).__name__}: {info.value}"
    phrase = _internal(str(info.value))
    assert phrase is None, f"{name}: internal message ({phrase!r}): {info.value}"


def test_negative_id_errors_name_row_and_value() -> None:
    """Upstream's message stays the prefix; the place is appended (tests match the prefix)."""
    prefix = r"^block IDs must not be negative"
    for call, place in [
        (lambda: ring_block_table([[1], [2, -3]], 4), r"\(ring block-table row 1, id -3\)$"),
        (lambda: paged_block_table([[1], np.array([2, -4])], 4), r"\(block-table row 1, id -4\)$"),
        (lambda: paged_block_table(torch.tensor([[1], [-5]]), 4), r"\(block-table row 1, id -5\)$"),
        (lambda: BlockTable(3, 4).write_row(2, [1, -6]), r"\(block-table row 2, id -6\)$"),
        (lambda: BlockTable(3, 4).write_rows([[1], [-7]]), r"\(block-table row 1, id -7\)$"),
        (lambda: paged_slot_mapping([[1], [-8]], [1, 1], 4), r"\(block-table row 1, id -8\)$"),
    ]:
        with pytest.raises(ValueError, match=prefix + " " + place):
            call()


# --- 3. verify mode -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["paged", "ring"])
def test_verify_mode_names_the_first_row_and_column_that_differ(kind: str) -> None:
    table = BlockTable(3, 6, kind=kind, verify=True)  # type: ignore[arg-type]
    table.write_rows([[1, 2], [3, 4, 5], [6]])
    table.numpy()[1, 4] = 99  # behind the table's back
    with pytest.raises(StaleRowError, match=r"verify: block-table row 1 column 4 holds 99") as info:
        table.write_row(0, [1, 2, 7])
    assert "blockprep.reference" in str(info.value)
    assert str(info.value).endswith("(after write_row)")
    # Off by default: the same corruption goes unnoticed until check().
    plain = BlockTable(3, 6, kind=kind)  # type: ignore[arg-type]
    plain.write_rows([[1, 2], [3, 4, 5], [6]])
    plain.numpy()[1, 4] = 99
    plain.write_row(0, [1, 2, 7])
    with pytest.raises(StaleRowError, match="row 1 column 4"):
        plain.verify()


def test_verify_mode_passes_every_write_operation_of_a_correct_table() -> None:
    for kind in ("paged", "ring"):
        table = BlockTable(4, 8, kind=kind, pad=0, verify=True)  # type: ignore[arg-type]
        assert table.write_row.__name__ == "write_row"
        table.write_rows([[1, 2, 3], [4], [5, 6]])
        table.write_row(0, [1, 2, 9])
        plan = table.plan_rows({3: [7, 8]})
        table.commit(plan)
        table.copy_row(0, 1)
        table.fill_rows(2, [3])
        table.swap_rows(0, 2)
        table.append(0, [10])
        table.set_ids(0, [0], [11])
        table.truncate(0, 1)
        table.apply_deltas(append={1: [12]}, truncate={2: 1})
        table.clear_row(3)
        table.invalidate(2)
        table.numpy()[2] = 42  # an unknown row is not compared
        table.write_row(1, [1])
    assert "verify" not in vars(BlockTable(1, 1))  # off: the class's own methods, no wrapper


# --- 4. stateful suite: bad inputs of every class between valid steps ---------------------------

# Model ids are at least 2, so no bad id below equals a held id by value (the id rule would take
# ``True`` over a held 1 as the held int).
IDS = st.integers(2, 500)


def _bad_ids(max_blocks: int, kind: str) -> list[Any]:
    """Bad id rows of every class: floats, bools, unordered and bytes-like containers, negative and
    too-large ids, non-sequences, arrays of the wrong dtype, shape or device, too long rows."""
    bad: list[Any] = [
        [2.5],
        [3, True],
        [np.float64(2.5)],
        {3, 4},
        {3: 4},
        bytearray(b"\x03"),
        memoryview(b"\x03"),
        "34",
        None,
        7,
        [-1],
        [3, -(2**40)],
        [INT32_MAX + 1],
        [[3]],
        [np.array([3, 4])],
        [object()],
        np.array([3.0]),
        np.array([True]),
        torch.tensor([3.5]),
        np.ones((1, 2), dtype=np.int64),
        torch.empty(2, dtype=torch.int32, device=META),
        list(range(2, max_blocks + 3)),
    ]
    if kind == "ring":
        bad.append([])
    return bad


BAD_ROW_INDEXES: list[Any] = [1.0, -1, "0", None, np.float64(0), True, 10**6]


class CoreMachine(RuleBasedStateMachine):
    """A ``BlockTable`` (maybe ``verify=True``), builders writing an ``out``, a slot mapping
    writing an ``out`` and a ``PaddedTokenBuffer``; after every step each buffer equals what
    ``blockprep.reference`` rebuilds from the model, and a failed step left every byte, the cache
    and the counters as they were."""

    @initialize(
        kind=st.sampled_from(["paged", "ring"]),
        num_rows=st.integers(1, 5),
        max_blocks=st.sampled_from([1, 3, 8, 33]),
        pad=st.sampled_from([-1, 0]),
        verify=st.booleans(),
    )
    def start(self, kind: str, num_rows: int, max_blocks: int, pad: int, verify: bool) -> None:
        self.kind, self.num_rows, self.max_blocks, self.pad = kind, num_rows, max_blocks, pad
        self.table = BlockTable(num_rows, max_blocks, kind=kind, pad=pad, verify=verify)  # type: ignore[arg-type]
        self.model: list[list[int]] = [[] for _ in range(num_rows)]  # [] = cleared
        self.out = np.full((num_rows, max_blocks), 5, dtype=np.int32)
        self.out_rows: list[list[int]] | None = None
        self.out_kind = kind
        self.slots = torch.full((num_rows,), -9, dtype=torch.int32)
        self.slot_values = [-9] * num_rows
        self.tokens = PaddedTokenBuffer(num_rows, 3)
        self.token_values = [0] * num_rows

    # --- helpers ---

    def ids(self, data: Any, shortest: int = 1) -> list[int]:
        if self.kind == "paged":
            shortest = 0
        return data.draw(st.lists(IDS, min_size=shortest, max_size=self.max_blocks))

    def container(self, data: Any, ids: list[int], floats: bool = True) -> Any:
        forms = ["list", "tuple", "numpy", "torch", "np-ints"] + (["floats"] if floats else [])
        form = data.draw(st.sampled_from(forms))
        held = self.model[0]
        if form == "tuple":
            return tuple(ids)
        if form == "numpy":
            return np.array(ids, dtype=np.int64)
        if form == "torch":
            return torch.tensor(ids, dtype=torch.int32)
        if form == "np-ints":
            return [np.int64(x) for x in ids]
        if form == "floats" and held:  # value-equal floats where ids match the held ones
            return [float(x) if i < len(held) and x == held[i] else x for i, x in enumerate(ids)]
        return list(ids)

    def snapshot(self) -> tuple[Any, ...]:
        table = self.table
        return (
            table.numpy().tobytes(),
            [table.cached_ids(r) for r in range(self.num_rows)],
            table.lengths.tobytes(),
            table.stats,
            self.out.tobytes(),
            self.slots.numpy().tobytes(),
            self.tokens.numpy().tobytes(),
        )

    def fails(self, call: Callable[[], object]) -> None:
        before = self.snapshot()
        with pytest.raises((TypeError, ValueError, IndexError)) as info:
            call()
        assert _internal(str(info.value)) is None, str(info.value)
        assert self.snapshot() == before  # byte-identity: nothing written, nothing counted

    # --- valid steps ---

    @rule(data=st.data(), row=st.integers(0, 4))
    def write_row(self, data: Any, row: int) -> None:
        row %= self.num_rows
        ids = self.ids(data)
        self.table.write_row(row, self.container(data, ids) if row == 0 else list(ids))
        self.model[row] = ids

    @rule(data=st.data())
    def write_rows(self, data: Any) -> None:
        rows = [self.ids(data) for _ in range(self.num_rows)]
        self.table.write_rows(rows)
        self.model = [list(r) for r in rows]

    @rule(data=st.data(), row=st.integers(0, 4))
    def append_or_truncate(self, data: Any, row: int) -> None:
        row %= self.num_rows
        held = self.model[row]
        room = self.max_blocks - len(held)
        if data.draw(st.booleans()) and room:
            new = data.draw(st.lists(IDS, min_size=1, max_size=room))
            self.table.append(row, new)
            self.model[row] = held + new
        elif held and (self.kind == "paged" or len(held) > 1):
            keep = data.draw(st.integers(0 if self.kind == "paged" else 1, len(held)))
            self.table.truncate(row, keep)
            self.model[row] = held[:keep]

    @rule(src=st.integers(0, 4), dst=st.integers(0, 4), swap=st.booleans())
    def copy_or_swap(self, src: int, dst: int, swap: bool) -> None:
        src, dst = src % self.num_rows, dst % self.num_rows
        if swap:
            self.table.swap_rows(src, dst)
            self.model[src], self.model[dst] = self.model[dst], self.model[src]
        else:
            self.table.copy_row(src, dst)
            self.model[dst] = list(self.model[src])

    @rule(row=st.integers(0, 4))
    def clear(self, row: int) -> None:
        row %= self.num_rows
        self.table.clear_row(row)
        self.model[row] = []

    @rule(data=st.data())
    def build(self, data: Any) -> None:
        kind = data.draw(st.sampled_from(["paged", "ring"]))
        rows = [
            data.draw(st.lists(IDS, min_size=1, max_size=self.max_blocks))
            for _ in range(self.num_rows)
        ]
        builder = ring_block_table if kind == "ring" else paged_block_table
        kwargs = {} if kind == "ring" else {"pad": self.pad}
        builder(
            [self.container(data, r, False) for r in rows], self.max_blocks, out=self.out, **kwargs
        )
        self.out_rows, self.out_kind = rows, kind

    @rule(data=st.data())
    def slot_mapping(self, data: Any) -> None:
        pages = [data.draw(st.lists(IDS, min_size=1, max_size=4)) for _ in range(self.num_rows)]
        seq = [data.draw(st.integers(1, len(p) * 16)) for p in pages]
        paged_slot_mapping(pages, seq, 16, out=self.slots)
        self.slot_values = [
            p[(s - 1) // 16] * 16 + (s - 1) % 16 for p, s in zip(pages, seq, strict=True)
        ]

    @rule(data=st.data())
    def tokens_step(self, data: Any) -> None:
        values = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=self.num_rows))
        self.tokens.write(values)
        self.token_values[: len(values)] = values
        if len(values) < self.num_rows:
            self.tokens.replicate(0, len(values))
            self.token_values[len(values) :] = [values[0]] * (self.num_rows - len(values))

    # --- bad steps: every class, nothing changes ---

    @rule(data=st.data(), row=st.integers(0, 4))
    def bad_write(self, data: Any, row: int) -> None:
        row %= self.num_rows
        bad = data.draw(st.sampled_from(_bad_ids(self.max_blocks, self.kind)))
        how = data.draw(st.sampled_from(["write_row", "write_rows", "plan_rows", "append"]))
        if how == "write_row":
            self.fails(lambda: self.table.write_row(row, bad))
        elif how == "write_rows":  # all-or-nothing: the bad row comes after good ones
            rows: list[Any] = [self.ids(data) for _ in range(self.num_rows)]
            rows[row] = bad
            self.fails(lambda: self.table.write_rows(rows))
        elif how == "plan_rows":
            self.fails(lambda: self.table.plan_rows([(0, self.ids(data)), (row, bad)]))
        elif (
            bad is not None and not isinstance(bad, int) and not (isinstance(bad, list) and not bad)
        ):  # appending nothing is a hit, not a fault
            self.fails(lambda: self.table.append(row, bad))

    @rule(data=st.data())
    def bad_row_index(self, data: Any) -> None:
        index = data.draw(st.sampled_from(BAD_ROW_INDEXES))
        call = data.draw(st.sampled_from(["write_row", "clear_row", "copy_row", "truncate"]))
        ids = self.ids(data)
        calls = {
            "write_row": lambda: self.table.write_row(index, ids),
            "clear_row": lambda: self.table.clear_row(index),
            "copy_row": lambda: self.table.copy_row(0, index),
            "truncate": lambda: self.table.truncate(index, 0),
        }
        self.fails(calls[call])

    @rule(data=st.data(), row=st.integers(0, 4))
    def bad_delta(self, data: Any, row: int) -> None:
        row %= self.num_rows
        length = len(self.model[row])
        bad = data.draw(
            st.sampled_from(
                [
                    lambda: self.table.truncate(row, 0.5),
                    lambda: self.table.truncate(row, length + 1),
                    lambda: self.table.truncate(row, True),
                    lambda: self.table.set_ids(row, [0], [2.5]),
                    lambda: self.table.set_ids(row, {0}, [3]),
                    lambda: self.table.set_ids(row, [length], [3]),
                    lambda: self.table.apply_deltas(append={row: [3, True]}),
                    lambda: self.table.apply_deltas(append={row: bytearray(b"\x03")}),
                    lambda: self.table.apply_deltas(truncate={row: -1}),
                ]
            )
        )
        self.fails(bad)

    @rule(data=st.data(), row=st.integers(0, 4))
    def bad_build(self, data: Any, row: int) -> None:
        kind = data.draw(st.sampled_from(["paged", "ring"]))
        rows: list[Any] = [[2] for _ in range(self.num_rows)]
        rows[row % self.num_rows] = data.draw(st.sampled_from(_bad_ids(self.max_blocks, kind)))
        builder = ring_block_table if kind == "ring" else paged_block_table
        self.fails(lambda: builder(rows, self.max_blocks, out=self.out))
        if data.draw(st.booleans()):
            unordered: Any = data.draw(st.sampled_from([{(2,), (3,)}, {0: [2]}, np.array(2)]))
            self.fails(lambda: builder(unordered, self.max_blocks, out=self.out))

    @rule(data=st.data())
    def bad_slots(self, data: Any) -> None:
        n = self.num_rows
        pages: list[Any] = [[2, 3] for _ in range(n)]
        seq: list[Any] = [1] * n
        r = data.draw(st.integers(0, n - 1))
        fault = data.draw(
            st.sampled_from(["bool", "float", "none", "set", "bytes", "neg", "short"])
        )
        if fault == "bool":
            seq[r] = True
        elif fault == "float":
            seq[r] = 1.0
        elif fault == "none":
            seq[r] = None
        elif fault == "set":
            pages[r] = {2, 3}
        elif fault == "bytes":
            pages[r] = bytearray(b"\x02")
        elif fault == "neg":
            pages[r] = [-2]
        else:
            seq[r] = 33
        self.fails(lambda: paged_slot_mapping(pages, seq, 16, out=self.slots))

    @rule(data=st.data())
    def bad_tokens(self, data: Any) -> None:
        bad = data.draw(
            st.sampled_from(
                [
                    [1.5],
                    [True],
                    [np.float64(3.0)],
                    [None],
                    [2**40],
                    torch.tensor([1.0]),
                    np.array([True]),
                    list(range(self.num_rows + 1)),
                ]
            )
        )
        self.fails(lambda: self.tokens.write(bad))
        self.fails(lambda: self.tokens.replicate(-1, 0))

    # --- after every step ---

    @invariant()
    def buffers_equal_the_reference(self) -> None:
        if not hasattr(self, "table"):
            return
        width, pad = self.max_blocks, self.pad
        expected = np.full((self.num_rows, width), pad, dtype=np.int32)
        for r, ids in enumerate(self.model):
            if ids:
                if self.kind == "ring":
                    expected[r] = ref.ring_block_table_repeat([ids], max_blocks=width)[0].numpy()
                else:
                    expected[r] = ref.block_table_per_row([ids], max_blocks=width, pad=pad)[
                        0
                    ].numpy()
        assert np.array_equal(self.table.numpy(), expected)
        for r, ids in enumerate(self.model):
            held = self.table.cached_ids(r)
            assert held == ids and all(type(x) is int for x in held or ())
        self.table.check()
        self.table.verify()
        if self.out_rows is not None:
            if self.out_kind == "ring":
                rebuilt = ref.ring_block_table_repeat(self.out_rows, max_blocks=width)
            else:
                rebuilt = ref.block_table_per_row(self.out_rows, max_blocks=width, pad=pad)
            assert np.array_equal(self.out, rebuilt.numpy())
        assert self.slots.tolist() == self.slot_values
        assert self.tokens.numpy()[:, 0].tolist() == self.token_values
        assert not self.tokens.numpy()[:, 1:].any()


CoreMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_core_machine = CoreMachine.TestCase
