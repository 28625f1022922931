"""The preparers' inputs (Qwen and DeepSeek): no silent coercion in the Qwen preparer
(bool or float ``seq_lens`` and ``token_ids``, ``token_ids`` shaped ``[1, A]``, more ``seq_lens``
rows than request ids), no uint64 token id wrapping to a negative one in DeepSeek, DeepSeek's
input contract, verify mode on both preparers, and a stateful suite interleaving bad inputs of
every class with valid Qwen steps (by value and deltas, the row loop and the array path), every
buffer checked against ``blockprep.reference`` after every step and byte-identity after every
failure."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from blockprep import DecodeBatch, KvAllocation, StaleRowError
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97, deepseek_v4_decode_rebuild
from blockprep.wire import BlockDeltaEncoder

BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")
U64_ABOVE_INT64 = 2**63 + 5


def qwen_batch(
    tokens: Any,
    seq_lens: Any,
    pages: list[list[int]],
    request_ids: list[str] | None = None,
    **extra: Any,
) -> DecodeBatch:
    count = len(pages)
    return DecodeBatch(
        request_ids=request_ids if request_ids is not None else [f"r{i}" for i in range(count)],
        token_ids=tokens,
        hidden_states=None,
        seq_lens=seq_lens,
        block_ids=pages,
        **extra,
    )


def snapshot(preparer: QwenDecodePreparer) -> tuple[Any, ...]:
    table = preparer.block_table
    return (
        tuple(tensor.clone() for tensor in preparer.buffers().values()),
        table.held_rows(preparer.max_batch_size),
        table.lengths.copy().tolist(),
        preparer._cursor.last,
    )


def assert_same(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    for old, new in zip(before[0], after[0], strict=True):
        assert torch.equal(old, new)
    assert before[1:] == after[1:]


def preparer_for(path: str, **options: Any) -> QwenDecodePreparer:
    """``"rows"``: the small-batch row loop; ``"array"``: the NumPy checks, whatever the size."""
    preparer = QwenDecodePreparer(4, 64, page_size=8, **options)
    if path == "array":
        preparer.row_loop_max = 0
    return preparer


PATHS = ("rows", "array")
VALID = qwen_batch(torch.tensor([5, 6]), torch.tensor([3, 9]), [[1], [2, 3]])


# --- 1. Qwen: no silent coercions --------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("deltas", [False, True])
@pytest.mark.parametrize(
    ("field", "value", "dtype"),
    [
        ("seq_lens", torch.tensor([True, True]), "torch.bool"),
        ("seq_lens", torch.tensor([3.0, 9.0]), "torch.float32"),
        ("seq_lens", np.array([3.5, 9.0]), "torch.float64"),
        ("token_ids", torch.tensor([5.0, 6.7]), "torch.float32"),
        ("token_ids", torch.tensor([[True], [False]]), "torch.bool"),
        ("token_ids", [11.7, 2.0], "torch.float32"),
    ],
)
def test_qwen_rejects_bool_and_float_seq_lens_and_tokens(
    path: str, deltas: bool, field: str, value: Any, dtype: str
) -> None:
    preparer = preparer_for(path)
    encoder = BlockDeltaEncoder()
    preparer.prepare(qwen_batch([5, 6], [3, 9], [[1], [2, 3]]))
    good: dict[str, Any] = {"tokens": [5, 6], "seq_lens": [3, 9]}
    good["tokens" if field == "token_ids" else "seq_lens"] = value
    pages = [[1], [2, 3]]
    if deltas:
        message = encoder.encode(["r0", "r1"], pages)
        batch = qwen_batch(good["tokens"], good["seq_lens"], [], ["r0", "r1"], block_deltas=message)
    else:
        batch = qwen_batch(good["tokens"], good["seq_lens"], pages)
    before = snapshot(preparer)
    with pytest.raises(TypeError, match=rf"^decode {field} must be an integer tensor .*{dtype}"):
        preparer.prepare(batch)
    assert_same(before, snapshot(preparer))


@pytest.mark.parametrize("path", PATHS)
def test_qwen_token_ids_must_be_a_or_a_by_1(path: str) -> None:
    preparer = preparer_for(path)
    prefix = r"^decode token_ids must contain exactly one token per row, got shape "
    for shape in [(1, 2), (2, 1, 1), (1, 1, 2)]:
        tokens = torch.tensor([5, 6]).reshape(shape)
        before = snapshot(preparer)
        with pytest.raises(ValueError, match=prefix + r"\(.*\) \(expected \[2\] or \[2, 1\]\)"):
            preparer.prepare(qwen_batch(tokens, [3, 9], [[1], [2, 3]]))
        assert_same(before, snapshot(preparer))
    with pytest.raises(ValueError, match=prefix + r"\(2, 2\)$"):  # upstream's own message
        preparer.prepare(qwen_batch(torch.tensor([[5, 1], [6, 1]]), [3, 9], [[1], [2, 3]]))
    for tokens in (torch.tensor([5, 6]), torch.tensor([[5], [6]])):
        inputs = preparer.prepare(qwen_batch(tokens, [3, 9], [[1], [2, 3]]))
        assert inputs.token_ids[:2, 0].tolist() == [5, 6]
    one = preparer.prepare(qwen_batch(torch.tensor([[7]]), [3], [[1]]))  # [1, 1] is [A, 1]
    assert one.token_ids[0, 0] == 7


@pytest.mark.parametrize("path", PATHS)
def test_qwen_more_seq_lens_than_request_ids_are_rejected(path: str) -> None:
    preparer = preparer_for(path)
    before = snapshot(preparer)
    with pytest.raises(ValueError, match=r"^decode seq_lens has 3 rows, expected 2 \(one per"):
        preparer.prepare(qwen_batch([5, 6], [3, 9, 4], [[1], [2, 3]]))
    assert_same(before, snapshot(preparer))


@pytest.mark.parametrize("path", PATHS)
def test_qwen_extra_rows_upstream_ignored_stay_ignored(path: str) -> None:
    """Upstream (seed-semantics 2.3): with ``kv_allocations`` the batch size is theirs and extra
    ``seq_lens`` rows are ignored; ``block_ids`` rows past the batch are never read."""
    preparer = preparer_for(path)
    allocations = [KvAllocation("a", "m", [1], 8), KvAllocation("b", "m", [2, 3], 16)]
    batch = qwen_batch([5, 6], [3, 9, 40], [[7], [8], [9, 9]], [], kv_allocations=allocations)
    inputs = preparer.prepare(batch)
    assert inputs.actual_batch == 2
    assert inputs.seq_lens.tolist() == [3, 9, 3, 3]
    assert inputs.block_table.view(4, 8)[:2, :2].tolist() == [[1, -1], [2, 3]]
    extra = preparer.prepare(qwen_batch([5, 6], [3, 9], [[1], [2, 3], [4, 4, 4]], ["a", "b"]))
    assert extra.actual_batch == 2
    assert extra.block_table.view(4, 8)[:2, :2].tolist() == [[1, -1], [2, 3]]


@pytest.mark.parametrize("path", PATHS)
def test_qwen_uint64_tokens_above_int64_name_the_real_value(path: str) -> None:
    preparer = preparer_for(path)
    tokens = torch.tensor([5, U64_ABOVE_INT64], dtype=torch.uint64)
    before = snapshot(preparer)
    with pytest.raises(ValueError, match=rf"^token row 1 holds token id {U64_ABOVE_INT64}"):
        preparer.prepare(qwen_batch(tokens, [3, 9], [[1], [2, 3]]))
    assert_same(before, snapshot(preparer))


@pytest.mark.parametrize("path", PATHS)
def test_qwen_page_rows_in_any_ordered_container_and_sets_rejected_naming_the_row(
    path: str,
) -> None:
    """The row loop used to fail on a NumPy page row ("truth value of an array ... is
    ambiguous") and on a set ("'set' object is not subscriptable")."""
    preparer = preparer_for(path)
    for row in (np.array([1, 2]), torch.tensor([1, 2]), (1, 2)):
        inputs = preparer.prepare(qwen_batch([5], [9], [row]))  # type: ignore[list-item]
        assert inputs.slot_mapping[0] == 2 * 8
    before = snapshot(preparer)
    for bad in ({1, 2}, "ab", 7):
        with pytest.raises(TypeError, match=r"row 0 .*(pages|page_ids) must be a sequence"):
            preparer.prepare(qwen_batch([5], [9], [bad]))  # type: ignore[list-item]
        assert_same(before, snapshot(preparer))


# --- 2. DeepSeek: uint64 ids, the input contract ------------------------------------------------


GROUPS = ("ori", "cmp_c128", "cmp_c4", "idx", "hca_state", "csa_state", "csa_inner_state")


def ds_layout(decode_seq: int = 1) -> DeepSeekV4Layout:
    return DeepSeekV4Layout(
        ranks=2,
        decode_batch=2,
        decode_seq=decode_seq,
        max_seq_len=1024,
        num_blocks=dict.fromkeys(GROUPS, 200),
    )


def ds_groups(seq_len: int, base: int = 0) -> dict[str, list[int]]:
    """Ids that keep the contract: rings within their ring length, full history enough."""
    full = math.ceil(seq_len / 128)
    return {
        "ori": [base + 1, base + 2],
        "cmp_c128": list(range(base, base + full)),
        "cmp_c4": list(range(base + 1, base + 1 + full)),
        "idx": list(range(base + 2, base + 2 + full)),
        "hca_state": [base + 3, base + 4, base + 5],
        "csa_state": [base + 6],
        "csa_inner_state": [base + 7, base + 8],
    }


def ds_batch(
    tokens: Any, seq_lens: list[int], groups: list[dict[str, list[int]]] | None, **extra: Any
) -> DecodeBatch:
    count = len(seq_lens)
    extra.setdefault("hidden_states", None)
    return DecodeBatch(
        request_ids=[f"q{i}" for i in range(count)],
        token_ids=tokens,
        seq_lens=torch.tensor(seq_lens),
        block_ids_by_group=groups if groups is not None else [],
        cache_partitions=[i % 2 for i in range(count)],
        **extra,
    )


def ds_snapshot(preparer: DeepSeekV4DecodePreparer) -> list[torch.Tensor]:
    return [
        tensor.clone()
        for slot in range(preparer.buffer_slots)
        for tensor in preparer.slot_buffers(slot).values()
    ]


def assert_ds_same(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_deepseek_uint64_token_ids_above_int64_are_rejected_naming_row_and_value() -> None:
    preparer = DeepSeekV4DecodePreparer(ds_layout())
    groups = [ds_groups(9), ds_groups(300, base=20)]
    preparer.prepare(ds_batch(torch.tensor([1, 2]), [9, 300], groups))
    before = ds_snapshot(preparer)
    tokens = torch.tensor([7, U64_ABOVE_INT64], dtype=torch.uint64)
    message = rf"^decode token_ids must fit int64: row 1 holds {U64_ABOVE_INT64}, above"
    with pytest.raises(ValueError, match=message):
        preparer.prepare(ds_batch(tokens, [9, 300], groups))
    with pytest.raises(ValueError, match=message):
        preparer.prepare(ds_batch(tokens.numpy()[:, None], [9, 300], groups))
    assert_ds_same(before, ds_snapshot(preparer))
    ok = preparer.prepare(ds_batch(torch.tensor([7, 2**40], dtype=torch.uint64), [9, 300], groups))
    assert ok.input_ids[1, 0].item() == 2**40


def test_deepseek_mtp_uint64_previous_tokens_and_drafts_are_rejected() -> None:
    preparer = DeepSeekV4DecodePreparer(ds_layout(decode_seq=2))
    groups = [ds_groups(9)]
    previous = torch.tensor([U64_ABOVE_INT64], dtype=torch.uint64)
    batch = ds_batch(torch.tensor([1]), [9], groups, prev_token_ids=previous)
    with pytest.raises(ValueError, match=r"^decode prev_token_ids must fit int64: row 0 holds"):
        preparer.prepare_mtp(batch)
    drafts = torch.tensor([U64_ABOVE_INT64], dtype=torch.uint64)
    with pytest.raises(ValueError, match=r"^decode draft_token_ids must fit int64: row 0"):
        preparer.speculative_batch(ds_batch(torch.tensor([1]), [9], groups), drafts)


@pytest.mark.parametrize(
    ("group", "ids", "message"),
    [
        ("ori", [1, 2, 3, 4, 5], r"group ori holds 5 block IDs, more than its ring length 4"),
        ("hca_state", list(range(49)), r"group hca_state holds 49 block IDs, more than its ring"),
        ("csa_state", list(range(66)), r"group csa_state holds 66 block IDs, more than its ring"),
        ("cmp_c128", [1, 2], r"group cmp_c128 holds 2 block IDs, fewer than seq_len 300 needs"),
        ("idx", [1], r"group idx holds 1 block IDs, fewer than seq_len 300 needs \(ceil\(300"),
    ],
)
def test_deepseek_verify_mode_rejects_what_contradicts_the_layout(
    group: str, ids: list[int], message: str
) -> None:
    """Upstream accepted these (no check against the ring length or ``seq_len``); so does
    blockprep by default. Verify mode rejects them, nothing written."""
    layout = ds_layout()
    bad = ds_groups(300)
    bad[group] = ids
    batch = ds_batch(torch.tensor([1]), [300], [bad])
    DeepSeekV4DecodePreparer(layout).prepare(batch)  # upstream's rule: accepted
    strict = DeepSeekV4DecodePreparer(layout, verify=True)
    strict.prepare(ds_batch(torch.tensor([1]), [300], [ds_groups(300)]))
    before = ds_snapshot(strict)
    with pytest.raises(
        ValueError,
        match=r"^DeepSeekV4 input contract: decode row 0 \(request "
        r"'q0'\) " + message,
    ):
        strict.prepare(batch)
    assert_ds_same(before, ds_snapshot(strict))


def test_deepseek_contract_holds_after_delta_ops() -> None:
    preparer = DeepSeekV4DecodePreparer(ds_layout(), verify=True)
    encoder = BlockDeltaEncoder()
    groups = [ds_groups(127)]
    preparer.prepare(
        ds_batch(torch.tensor([1]), [127], None, block_deltas=encoder.encode(["q0"], groups))
    )
    # seq_len 129 needs a second full-history block the message does not bring
    message = encoder.encode(["q0"], groups)
    with pytest.raises(ValueError, match=r"group cmp_c128 holds 1 block IDs, fewer than seq_len"):
        preparer.prepare(ds_batch(torch.tensor([1]), [129], None, block_deltas=message))
    encoder.reset()
    grown = {**groups[0], "ori": [1, 2, 9, 10, 11]}  # a ring appended past its length 4
    message = encoder.encode(["q0"], [grown])
    with pytest.raises(ValueError, match=r"group ori holds 5 block IDs, more than its ring"):
        preparer.prepare(ds_batch(torch.tensor([1]), [127], None, block_deltas=message))
    encoder.reset()
    good = {**groups[0], "cmp_c128": [0, 30], "cmp_c4": [1, 31], "idx": [2, 32]}
    message = encoder.encode(["q0"], [good])
    preparer.prepare(ds_batch(torch.tensor([1]), [129], None, block_deltas=message))


# --- 3. verify mode -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("padding", ["replicate", "untouched"])
def test_qwen_verify_mode_passes_correct_steps_by_value_and_deltas(path: str, padding: Any) -> None:
    preparer = preparer_for(path, verify=True, padding=padding)
    encoder = BlockDeltaEncoder()
    pages = {"a": [1], "b": [2, 3], "c": [4]}
    for step in range(12):
        order = ["a", "b", "c"][: 1 + step % 3]
        if step % 4 == 3:
            order.reverse()
        lists = [list(pages[r]) for r in order]
        seq_lens = [min(len(pages[r]) * 8, 64) for r in order]
        if step % 3:  # deltas, building on the step before
            batch = qwen_batch(
                [step] * len(order),
                seq_lens,
                [],
                order,
                block_deltas=encoder.encode(order, lists),
            )
        else:
            encoder.reset()
            batch = qwen_batch([step] * len(order), seq_lens, lists, order)
        preparer.prepare(batch)
        for r in order:
            if len(pages[r]) < 8:
                pages[r].append(10 + step * 3 + len(pages[r]))


@pytest.mark.parametrize("path", PATHS)
def test_qwen_verify_mode_names_the_buffer_row_and_column_that_differ(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparer = preparer_for(path, verify=True)
    preparer.prepare(VALID)
    write_rows = preparer._write_rows

    def broken(*args: Any) -> None:  # a slot-mapping bug: row 1 off by one
        write_rows(*args)
        preparer.buffers()["slot_mapping"][1] += 1

    monkeypatch.setattr(preparer, "_write_rows", broken)
    with pytest.raises(
        StaleRowError,
        match=r"^verify: Qwen decode \(host\) buffer slot_mapping differs from the "
        r"blockprep.reference rebuild at row 1: holds 25, the rebuild 24",
    ):
        preparer.prepare(VALID)
    monkeypatch.setattr(preparer, "_write_rows", write_rows)
    replicate = preparer._tokens.replicate
    monkeypatch.setattr(preparer._tokens, "replicate", lambda src, start: None)  # no padding
    preparer.buffers()["token_ids"][2:, 0] = 99
    with pytest.raises(StaleRowError, match=r"buffer token_ids .* at row 2, column 0: holds 99"):
        preparer.prepare(VALID)
    monkeypatch.setattr(preparer._tokens, "replicate", replicate)
    preparer.prepare(VALID)
    preparer.buffers()["block_table"][8 + 1] = 5  # behind the table's back, a cached row
    with pytest.raises(StaleRowError, match=r"row 1"):
        preparer.prepare(VALID)


def test_qwen_verify_mode_is_off_by_default_and_costs_the_plain_path_nothing() -> None:
    plain = QwenDecodePreparer(2, 64, page_size=8)
    assert plain.verify is False and "prepare" not in vars(plain)
    assert QwenDecodePreparer(2, 64, page_size=8, verify=True).verify is True


def test_deepseek_verify_mode_passes_every_kind_of_step() -> None:
    standard = DeepSeekV4DecodePreparer(ds_layout(), verify=True, buffer_slots=2)
    encoder = BlockDeltaEncoder()
    for step in range(9):
        seq = [9 + 40 * step, 130 + step, 20 + step][: 1 + step % 3]
        groups = [ds_groups(s, base=30 * q) for q, s in enumerate(seq)]
        if step % 3:  # deltas, building on the step before
            message = encoder.encode([f"q{q}" for q in range(len(seq))], groups)
            batch = ds_batch(torch.arange(len(seq)), seq, None, block_deltas=message)
        else:
            encoder.reset()
            batch = ds_batch(torch.arange(len(seq)), seq, groups)
        standard.prepare(batch, buffer_slot=step % 2, early=step == 3)
    mtp = DeepSeekV4DecodePreparer(ds_layout(decode_seq=2), verify=True)
    groups = [ds_groups(9), ds_groups(200, base=40)]
    batch = ds_batch(torch.tensor([3, 4]), [9, 200], groups, prev_token_ids=torch.tensor([1, 2]))
    mtp.prepare_mtp(batch)
    mtp.prepare_mtp(batch, early=True)
    mtp.prepare_mtp_target(
        batch,
        token_rows=torch.tensor([[3, 5], [4, 6]]),
        positions=[[8, 9], [199, 200]],
        active_width=2,
    )
    host = DeepSeekV4DecodePreparer(ds_layout(), verify=True, embedding="host", hidden_size=3)
    host.prepare(ds_batch(torch.tensor([1]), [9], [ds_groups(9)], hidden_states=torch.ones(1, 3)))


def test_deepseek_verify_mode_names_the_buffer_rank_row_and_column_that_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    preparer = DeepSeekV4DecodePreparer(ds_layout(), verify=True)
    batch = ds_batch(torch.tensor([1, 2]), [9, 300], [ds_groups(9), ds_groups(300, base=20)])
    preparer.prepare(batch)
    dynamic = preparer._slots[0].dynamic
    write = dynamic.write

    def broken(*args: Any, **kwargs: Any) -> None:  # a staging bug: rank 1's KV length
        write(*args, **kwargs)
        dynamic.kv_seq_lens[1, 0] += 1

    monkeypatch.setattr(dynamic, "write", broken)
    with pytest.raises(
        StaleRowError,
        match=r"^verify: DeepSeekV4 decode \(slot 0\) buffer kv_seq_lens differs from the "
        r"blockprep.reference rebuild at rank 1, row 0: holds 301, the rebuild 300",
    ):
        preparer.prepare(batch)
    monkeypatch.setattr(dynamic, "write", write)
    preparer.invalidate()
    preparer.prepare(batch)
    commit = preparer._grouped().commit

    def stale(step: Any, number: int) -> None:  # a table bug: a cell left stale
        commit(step, number)
        preparer.slot_buffers(0)["block_table"][0, 1, 3] = 77

    monkeypatch.setattr(preparer._grouped(), "commit", stale)
    with pytest.raises(StaleRowError, match=r"buffer ori differs .* at rank 0, row 1, column 3"):
        preparer.prepare(batch)


def test_deepseek_verify_mode_compares_with_the_reference_not_itself() -> None:
    """The comparison's expectation is ``deepseek_v4_decode_rebuild`` of the batch."""
    preparer = DeepSeekV4DecodePreparer(ds_layout(), verify=True)
    batch = ds_batch(torch.tensor([1, 2]), [9, 300], [ds_groups(9), ds_groups(300, base=20)])
    views = preparer.prepare(batch)
    expected = deepseek_v4_decode_rebuild(
        batch, ranks=2, decode_batch=2, decode_seq=1, num_blocks=ds_layout().num_blocks
    )
    for name, tensor in views.buffers().items():
        assert torch.equal(tensor, expected[name]), name


# --- 5. a stateful suite over the Qwen preparer --------------------------------------------------

B, MAX_SEQ, PAGE = 4, 64, 8
BAD_KINDS = (
    "bool_seq",
    "float_seq",
    "float_token",
    "bool_token",
    "wide_tokens",
    "row_tokens",
    "extra_seq",
    "seq_zero",
    "seq_too_long",
    "few_pages",
    "many_pages",
    "negative_page",
    "float_page",
    "set_page",
    "token_too_big",
    "uint64_token",
    "unknown_request",
)
WIDTH = MAX_SEQ // PAGE


class QwenMachine(RuleBasedStateMachine):
    """Valid steps (by value, with ``kv_allocations``, or as deltas; requests joining, leaving,
    moving rows, growing; tokens and ids in every container) interleaved with bad inputs of every
    class; the expectation is a fresh :class:`QwenDecodePrep97` of the model's batch."""

    @initialize(
        path=st.sampled_from(PATHS),
        padding=st.sampled_from(["replicate", "untouched"]),
        verify=st.booleans(),
        start_kind=st.integers(0, 16),
    )
    def start(self, path: str, padding: Any, verify: bool, start_kind: int) -> None:
        self.preparer = preparer_for(path, padding=padding, verify=verify)
        self.padding = padding
        self.encoder = BlockDeltaEncoder()
        self.requests: dict[str, list[Any]] = {}  # id: [seq_len, pages]
        self.counter = 0
        self.last: tuple[list[int], list[int], list[list[int]]] | None = None  # tokens, seqs, pages
        self.by_value_last = True
        self.bad_steps = start_kind

    def batch_of(self, data: Any) -> tuple[list[str], list[int], list[int], list[list[int]]]:
        draw = data.draw
        for rid in list(self.requests):
            if draw(st.booleans()) and draw(st.booleans()):
                del self.requests[rid]
        while len(self.requests) < B and (not self.requests or draw(st.booleans())):
            seq_len = draw(st.integers(1, MAX_SEQ))
            need = -(-seq_len // PAGE)
            pages = draw(st.lists(st.integers(0, 200), min_size=need, max_size=WIDTH))
            self.requests[f"r{self.counter}"] = [seq_len, pages]
            self.counter += 1
        order = draw(st.permutations(sorted(self.requests)))
        active = list(order[: draw(st.integers(1, len(order)))])
        for rid in active:  # grow: a token, maybe a page
            seq_len, pages = self.requests[rid]
            if seq_len < MAX_SEQ and draw(st.booleans()):
                seq_len += 1
                if len(pages) < -(-seq_len // PAGE):
                    pages.append(draw(st.integers(0, 200)))
                self.requests[rid][0] = seq_len
        tokens = [draw(st.integers(0, 2**31 - 1)) for _ in active]
        seqs = [self.requests[r][0] for r in active]
        return active, tokens, seqs, [list(self.requests[r][1]) for r in active]

    def as_batch(
        self,
        data: Any,
        active: list[str],
        tokens: Any,
        seqs: Any,
        pages: list[list[int]],
        how: str,
    ) -> DecodeBatch:
        draw = data.draw
        container = draw(st.sampled_from(["tensor", "column", "list", "numpy"]))
        if container == "tensor":
            tokens, seqs = torch.tensor(tokens), torch.tensor(seqs)
        elif container == "column":
            tokens, seqs = torch.tensor(tokens, dtype=torch.int32)[:, None], torch.tensor(seqs)
        elif container == "numpy":
            tokens, seqs = np.array(tokens), np.array(seqs, dtype=np.int32)
        if how == "deltas":
            if self.by_value_last:
                self.encoder.reset()
            message = self.encoder.encode(active, pages)
            return qwen_batch(tokens, seqs, [], active, block_deltas=message)
        if how == "allocations":
            allocations = [KvAllocation(r, "m", p, 64) for r, p in zip(active, pages, strict=True)]
            return qwen_batch(tokens, seqs, [], active, kv_allocations=allocations)
        rows: list[Any] = [
            draw(st.sampled_from([list, tuple, np.array]))(p) if p else p for p in pages
        ]
        return qwen_batch(tokens, seqs, rows, active)

    @rule(data=st.data(), how=st.sampled_from(["value", "allocations", "deltas"]))
    def step(self, data: Any, how: str) -> None:
        active, tokens, seqs, pages = self.batch_of(data)
        self.preparer.prepare(self.as_batch(data, active, tokens, seqs, pages, how))
        self.by_value_last = how != "deltas"
        self.last = (tokens, seqs, pages)

    @rule(data=st.data(), how=st.sampled_from(["value", "deltas"]))
    def bad_step(self, data: Any, how: str) -> None:
        draw = data.draw
        active, tokens, seqs, pages = self.batch_of(data)
        # every class in turn (hypothesis draws the first of a list most often)
        kind = BAD_KINDS[(self.bad_steps + draw(st.integers(0, 2))) % len(BAD_KINDS)]
        self.bad_steps += 1
        A = len(active)
        expected: tuple[type[Exception], ...] = (ValueError,)
        tensor_tokens: Any = torch.tensor(tokens)
        tensor_seqs: Any = torch.tensor(seqs)
        if kind == "bool_seq":
            tensor_seqs, expected = torch.ones(A, dtype=torch.bool), (TypeError,)
        elif kind == "float_seq":
            tensor_seqs, expected = tensor_seqs.double(), (TypeError,)
        elif kind == "float_token":
            tensor_tokens, expected = tensor_tokens.float() + 0.5, (TypeError,)
        elif kind == "bool_token":
            tensor_tokens, expected = torch.zeros(A, dtype=torch.bool), (TypeError,)
        elif kind == "wide_tokens":
            tensor_tokens = torch.stack([tensor_tokens, tensor_tokens], dim=1)
        elif kind == "row_tokens":
            # [1, A], or for one request [1, 1, 1]
            tensor_tokens = tensor_tokens.reshape(1, 1, 1) if A < 2 else tensor_tokens[None, :]
        elif kind == "extra_seq":
            tensor_seqs = torch.tensor([*seqs, 1])
        elif kind == "seq_zero":
            tensor_seqs[draw(st.integers(0, A - 1))] = 0
        elif kind == "seq_too_long":
            tensor_seqs[draw(st.integers(0, A - 1))] = MAX_SEQ + 1
        elif kind == "few_pages":
            row = draw(st.integers(0, A - 1))
            pages[row] = pages[row][: (seqs[row] - 1) // PAGE]
        elif kind == "many_pages":
            pages[draw(st.integers(0, A - 1))] = list(range(WIDTH + 1))
        elif kind == "negative_page":
            row = draw(st.integers(0, A - 1))
            pages[row] = [*pages[row][:-1], -1]
        elif kind == "float_page":
            row = draw(st.integers(0, A - 1))
            pages[row] = [*pages[row][:-1], 1.5]  # type: ignore[list-item]
            expected = (TypeError, ValueError)  # ValueError: at the decode position
        elif kind == "set_page":
            if how == "deltas":
                row = draw(st.integers(0, A - 1))
                pages[row] = [*pages[row][:-1], True]  # type: ignore[list-item]
            else:
                pages[draw(st.integers(0, A - 1))] = set(range(WIDTH))  # type: ignore[call-overload]
            expected = (TypeError,)
        elif kind == "token_too_big":
            tensor_tokens[draw(st.integers(0, A - 1))] = 2**31
        elif kind == "uint64_token":
            values = [*tokens[:-1], U64_ABOVE_INT64]
            tensor_tokens = torch.tensor(values, dtype=torch.uint64)
        if how == "deltas":
            if self.by_value_last:
                self.encoder.reset()
            try:
                message = self.encoder.encode(active, pages)
            except (TypeError, ValueError):  # the encoder refuses what it cannot carry
                self.encoder.reset()
                return
            if kind == "unknown_request":
                message["rows"]["ghost"] = [["w", [1]]]
            batch = qwen_batch(tensor_tokens, tensor_seqs, [], active, block_deltas=message)
        else:
            if kind == "unknown_request":  # by value, a ragged page row instead
                pages[0] = [[1, 2]]  # type: ignore[list-item]
                expected = (TypeError, ValueError)
            batch = qwen_batch(tensor_tokens, tensor_seqs, pages, active)
        before = snapshot(self.preparer)
        with pytest.raises((ValueError, TypeError)) as caught:
            self.preparer.prepare(batch)
        assert isinstance(caught.value, expected), (kind, caught.value)
        assert_same(before, snapshot(self.preparer))
        self.encoder.reset()  # the message was not applied: the next one comes whole
        self.by_value_last = True

    @invariant()
    def buffers_equal_the_reference(self) -> None:
        if getattr(self, "last", None) is None:
            return
        assert self.last is not None
        tokens, seqs, pages = self.last
        count = len(tokens)
        rebuilt = QwenDecodePrep97(B, MAX_SEQ, PAGE, self.preparer.token_width)
        rebuilt.prepare(
            DecodeBatch(
                request_ids=[str(i) for i in range(count)],
                token_ids=torch.tensor(tokens),
                hidden_states=None,
                seq_lens=torch.tensor(seqs),
                block_ids=pages,
            )
        )
        rows = B if self.padding == "replicate" else count
        got = self.preparer.buffers()
        for name in BUFFERS:
            want = getattr(rebuilt, name)
            if name == "block_table":
                assert torch.equal(got[name].view(B, WIDTH)[:rows], want.view(B, WIDTH)[:rows])
            else:
                assert torch.equal(got[name][:rows], want[:rows]), name
        held = self.preparer.block_table.held_rows(count)
        assert all(all(type(x) is int for x in row or []) for row in held)


QwenMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_qwen_machine = QwenMachine.TestCase


@pytest.mark.parametrize("call", ["prepare", "restage"])
@pytest.mark.parametrize("aliased", ["token_ids", "seq_lens"])
def test_deepseek_inputs_that_are_views_of_the_slot_are_read_before_they_are_overwritten(
    call: str, aliased: str
) -> None:
    """An engine that feeds the last step's column back: ``token_ids`` or ``seq_lens`` a view of
    the slot's own ``input_ids``, in the order that a row-by-row write would overwrite before it
    reads (request a on rank 1, b on rank 0: row 0 holds b's, row 2 a's). The slot equals a
    fresh preparer's given copies of the same values."""
    layout = ds_layout()
    groups = [ds_groups(9), ds_groups(300, base=20)]

    def batch(tokens: Any, seq_lens: Any) -> DecodeBatch:
        return DecodeBatch(
            request_ids=["a", "b"],
            token_ids=tokens,
            seq_lens=seq_lens,
            block_ids_by_group=groups,
            cache_partitions=[1, 0],
            hidden_states=None,
        )

    preparer = DeepSeekV4DecodePreparer(layout)
    first = preparer.prepare(batch(torch.tensor([7, 9]), torch.tensor([7, 9])))
    column = first.input_ids.view(-1)[::2]  # [b's, a's]: a view
    assert column._base is not None and column.tolist() == [9, 7]
    tokens, seq = (column, [9, 7]) if aliased == "token_ids" else ([11, 22], column)
    values = batch(torch.tensor(column.tolist()) if aliased == "token_ids" else tokens, [9, 7])
    if call == "prepare":
        preparer.prepare(batch(tokens, seq))
    else:
        preparer.restage(batch(tokens, seq), buffer_slot=0)
    fresh = DeepSeekV4DecodePreparer(layout)
    fresh.prepare(values)
    got, want = preparer.slot_buffers(0), fresh.slot_buffers(0)
    assert all(torch.equal(got[name], want[name]) for name in want)
    want_ids = [7, 7, 9, 9] if aliased == "token_ids" else [22, 22, 11, 11]
    assert first.input_ids.view(-1).tolist() == want_ids
    assert first.kv_seq_lens.view(-1).tolist() == [7, 7, 9, 9]
