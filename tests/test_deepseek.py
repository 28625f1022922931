"""DeepSeek V4 adapter: upstream's test expectations (seed-semantics 6.3, 6.6, 7.4, 8, 9), every
error path with upstream's message, nothing written on error, slot isolation, the hidden-state
contract, and what a step writes. Buffers are compared with blockprep.reference."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from blockprep.adapters.deepseek import (
    GROUP_NAMES,
    INPUT_FIELDS,
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
    accept_mtp_tokens,
)
from blockprep.batch import DecodeBatch
from blockprep.reference import (
    block_table_per_row,
    deepseek_v4_decode_rebuild,
    deepseek_v4_x_hc,
    ring_block_table_repeat,
)

HOST = "DeepSeek V4 decode requires host hidden states"
PREVIOUS = "DeepSeekV4 MTP decode requires previous token IDs and embeddings"


def groups(base: int, **overrides: list[int]) -> dict[str, list[int]]:
    """One request's ids: ``[base]`` in every group unless overridden."""
    ids = {name: [base] for name in GROUP_NAMES}
    ids.update(overrides)
    return ids


def make_batch(
    partitions: list[int],
    *,
    tokens: list[int] | None = None,
    seq_lens: list[int] | None = None,
    ids: list[dict[str, list[int]]] | None = None,
    **fields: Any,
) -> DecodeBatch:
    A = len(partitions)
    fields.setdefault("hidden_states", None)
    return DecodeBatch(
        request_ids=[f"r{q}" for q in range(A)],
        token_ids=torch.tensor(tokens if tokens is not None else [5 + q for q in range(A)]),
        seq_lens=torch.tensor(seq_lens if seq_lens is not None else [1] * A),
        block_ids_by_group=ids if ids is not None else [groups(q) for q in range(A)],
        cache_partitions=list(partitions),
        **fields,
    )


def everything(preparer: DeepSeekV4DecodePreparer) -> list[torch.Tensor]:
    """Clones of every buffer of every slot (slot by slot, buffer by buffer)."""
    found = []
    for slot in range(preparer.buffer_slots):
        inputs = views(preparer, slot)
        found += [t.clone() for t in inputs.buffers().values()]
    return found


_VIEWS: dict[tuple[int, int], DeepSeekV4DecodeInputs] = {}


def views(preparer: DeepSeekV4DecodePreparer, slot: int) -> DeepSeekV4DecodeInputs:
    return _VIEWS[id(preparer), slot]


def prepare(
    preparer: DeepSeekV4DecodePreparer, batch: DecodeBatch, slot: int = 0, *, mtp: bool = False
) -> DeepSeekV4DecodeInputs:
    run = preparer.prepare_mtp if mtp else preparer.prepare
    inputs = run(batch, buffer_slot=slot)
    _VIEWS[id(preparer), slot] = inputs
    return inputs


def assert_reference(
    inputs: DeepSeekV4DecodeInputs,
    batch: DecodeBatch,
    layout: DeepSeekV4Layout,
    *,
    mtp: bool = False,
) -> None:
    expected = deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        mtp=mtp,
    )
    for name in GROUP_NAMES:
        assert torch.equal(inputs.tables[name], expected[name]), name
    for name in INPUT_FIELDS:
        assert torch.equal(getattr(inputs, name), expected[name]), name


def primed(layout: DeepSeekV4Layout, **options: Any) -> DeepSeekV4DecodePreparer:
    """A preparer whose two slots hold a valid step each."""
    preparer = DeepSeekV4DecodePreparer(layout, **options)
    mtp = layout.decode_seq == 2
    extra: dict[str, Any] = {}
    if mtp:
        extra["prev_token_ids"] = torch.tensor([1, 2])
    if options.get("embedding") == "host":
        extra["hidden_states"] = torch.ones(2, options["hidden_size"])
        if mtp:
            extra["prev_hidden_states"] = torch.zeros(2, options["hidden_size"])
    for slot in (0, 1):
        batch = make_batch([0, 1], seq_lens=[3, 9], **extra)
        prepare(preparer, batch, slot, mtp=mtp)
    return preparer


# --- layout ---------------------------------------------------------------------------------------


def test_layout_groups_widths_and_ring_lengths() -> None:
    layout = DeepSeekV4Layout()
    assert [g.name for g in layout.groups] == list(GROUP_NAMES)
    assert [g.width for g in layout.groups] == [128, 128, 128, 128, 2048, 4096, 4096]
    assert [g.kind for g in layout.groups] == ["ring", "paged", "paged", "paged"] + ["ring"] * 3
    assert [g.block_tokens for g in layout.groups] == [128, 128, 128, 128, 8, 4, 4]
    assert [g.ids_per_request for g in layout.groups] == [4, 128, 128, 128, 48, 65, 65]
    assert dict(layout.num_blocks) == {g.name: 8 * g.ids_per_request for g in layout.groups}
    assert (layout.ranks, layout.decode_batch, layout.decode_seq, layout.decode_tokens) == (
        8,
        8,
        1,
        8,
    )
    assert DeepSeekV4Layout(decode_seq=2).decode_tokens == 16
    assert DeepSeekV4Layout(max_seq_len=1000).group("idx").ids_per_request == 8
    assert "num_blocks" in repr(layout)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"decode_batch": 0}, ValueError, "decode_batch must be positive"),
        ({"max_seq_len": 0}, ValueError, "max_seq_len must be positive"),
        ({"ranks": 0}, ValueError, "ranks must be positive, got 0"),
        ({"decode_seq": 0}, ValueError, "decode_seq must be positive, got 0"),
        (
            {"max_seq_len": 16385},
            ValueError,
            "DeepSeekV4 max_seq_len=16385 needs 129 source-token blocks, but the compiled block "
            "tables support 128",
        ),
        (
            {"max_in_flight_prefill_tokens": 512},
            ValueError,
            "DeepSeekV4 hca_state cache needs 80 blocks per request to cover the rolling history "
            "and in-flight prefill tokens, but the compiled block table supports 64",
        ),
        (
            {"max_in_flight_prefill_tokens": 257},
            ValueError,
            "DeepSeekV4 csa_state cache needs 66 blocks per request to cover the rolling history "
            "and in-flight prefill tokens, but the compiled block table supports 65",
        ),
        (
            {"max_in_flight_prefill_tokens": -1},
            ValueError,
            "max_in_flight_prefill_tokens must be non-negative, got -1",
        ),
        (
            {"num_blocks": {"ori": 9, "bogus": 9}},
            ValueError,
            "unknown DeepSeekV4 cache group: bogus",
        ),
        ({"num_blocks": {"ori": 9}}, ValueError, "num_blocks is missing cache groups: cmp_c128, "),
        (
            {"decode_batch": 64},
            ValueError,
            "DeepSeekV4 hca_state cache needs more than 64 physical blocks",
        ),
        (
            {"num_blocks": {**{g: 100 for g in GROUP_NAMES}, "idx": 0}},
            ValueError,
            "num_blocks['idx'] must be positive, got 0",
        ),
        (
            {"num_blocks": {**{g: 100 for g in GROUP_NAMES}, "idx": 2**31 - 3}},
            ValueError,
            "num_blocks['idx']=2147483645: scratch pages up to 2147483652 would pass",
        ),
        ({"num_blocks": [1, 2]}, TypeError, "num_blocks must map group names to block counts"),
        ({"decode_batch": 2.0}, TypeError, "decode_batch must be an integer"),
        ({"ranks": True}, TypeError, "ranks must be an integer"),
    ],
)
def test_layout_errors(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        DeepSeekV4Layout(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"buffer_slots": 0}, ValueError, "buffer_slots must be positive, got 0"),
        ({"embedding": "gpu"}, ValueError, "embedding must be 'device' or 'host', got 'gpu'"),
        ({"embedding": "host"}, ValueError, 'embedding="host" requires hidden_size'),
        ({"embedding": "host", "hidden_size": 0}, ValueError, "hidden_size must be positive"),
        ({"hidden_size": 4}, ValueError, 'hidden_size applies only to embedding="host"'),
    ],
)
def test_preparer_errors(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        DeepSeekV4DecodePreparer(DeepSeekV4Layout(ranks=1, decode_batch=2), **kwargs)
    with pytest.raises(TypeError, match="layout must be a DeepSeekV4Layout"):
        DeepSeekV4DecodePreparer(object())  # type: ignore[arg-type]


# --- upstream test expectations -------------------------------------------------------------------


def test_buffers_have_upstream_shapes_dtypes_and_stable_shared_addresses() -> None:
    """seed-semantics 6.4's buffer table; 7.3: same data_ptr on every step, in shared memory."""
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout, share_memory=True)
    batch = make_batch([0, 3], seq_lens=[5, 130])
    first = prepare(preparer, batch)
    widths = dict(zip(GROUP_NAMES, (128, 128, 128, 128, 2048, 4096, 4096), strict=True))
    for name, tensor in first.tables.items():
        assert (tuple(tensor.shape), tensor.dtype) == ((8, 4, widths[name]), torch.int32)
    expected = {
        "block_counts": ((8, 4, 7), torch.int32),
        "input_ids": ((8, 8), torch.int64),
        "position_ids": ((8, 8), torch.int32),
        "kv_seq_lens": ((8, 4), torch.int32),
        "num_tokens_per_owner": ((8,), torch.int32),
        "logit_row_indices": ((8, 8), torch.int32),
    }
    for name, (shape, dtype) in expected.items():
        tensor = getattr(first, name)
        assert (tuple(tensor.shape), tensor.dtype) == (shape, dtype)
    pointers = [t.data_ptr() for t in first.buffers().values()]
    for seq in ([6, 131], [7, 132]):
        again = prepare(preparer, make_batch([0, 3], seq_lens=seq))
        assert again.tables["ori"] is first.tables["ori"]
        tensors = tuple(again.buffers().values())
        assert [t.data_ptr() for t in tensors] == pointers
        assert all(t.is_shared() for t in tensors)


def test_padding_rows_get_isolated_scratch_pages_and_block_count_one() -> None:
    """seed-semantics 6.3: ((0,1),(0,2)) with ori A=8 and 4 rows gives ((0,1),(0,2),(8,),(9,));
    requests may share prefix pages; an empty rank's row r gets (A+r,)."""
    pools = {name: 8 for name in GROUP_NAMES}
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks=pools)
    preparer = DeepSeekV4DecodePreparer(layout)
    ids = [groups(0, ori=[0, 1], csa_state=[0, 1]), groups(1, ori=[0, 2], csa_state=[3, 0])]
    batch = make_batch([0, 0], ids=ids)
    inputs = prepare(preparer, batch)
    padded = [[0, 1], [0, 2], [8], [9]]
    assert torch.equal(inputs.tables["ori"][0], ring_block_table_repeat(padded, max_blocks=128))
    assert (
        inputs.tables["ori"][1].tolist()
        == ring_block_table_repeat([[8], [9], [10], [11]], max_blocks=128).tolist()
    )
    paged = block_table_per_row([[0], [1], [8], [9]], max_blocks=128)
    assert torch.equal(inputs.tables["idx"][0], paged)
    assert inputs.block_counts[0].tolist() == [
        [2, 1, 1, 1, 1, 2, 1],
        [2, 1, 1, 1, 1, 2, 1],
        [1] * 7,
        [1] * 7,
    ]
    assert inputs.block_counts[1].tolist() == [[1] * 7] * 4
    assert_reference(inputs, batch, layout)


def test_single_request_repeats_its_token_over_decode_seq() -> None:
    """seed-semantics 6.6: one request, token 5, S=2 layout: input_ids[0, :2] == [5, 5]."""
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    batch = make_batch([0], tokens=[5], seq_lens=[7])
    inputs = prepare(DeepSeekV4DecodePreparer(layout), batch)
    assert inputs.input_ids[0, :2].tolist() == [5, 5]
    assert inputs.position_ids[0, :2].tolist() == [6, 6]
    assert inputs.num_tokens_per_owner.tolist() == [1] + [0] * 7
    assert_reference(inputs, batch, layout)


def test_multiple_local_rows_on_one_rank() -> None:
    """seed-semantics 9: four requests on rank 0 of layout(0) get local rows 0..3."""
    layout = DeepSeekV4Layout(num_blocks={name: 64 for name in GROUP_NAMES})
    batch = make_batch([0, 0, 0, 0], tokens=[5, 6, 7, 8], seq_lens=[3, 4, 5, 6])
    inputs = prepare(DeepSeekV4DecodePreparer(layout), batch)
    assert inputs.local_rows == (0, 1, 2, 3) and inputs.ranks == (0, 0, 0, 0)
    assert inputs.input_ids[0, :4].tolist() == [5, 6, 7, 8]
    assert inputs.input_ids[0, 4:].tolist() == [5] * 4  # padding rows copy the rank's first
    assert inputs.input_ids[3].tolist() == [5] * 8  # an empty rank copies request 0
    assert inputs.num_tokens_per_owner.tolist() == [4] + [0] * 7
    assert inputs.logit_row_indices[0, :4].tolist() == [0, 1, 2, 3]
    assert inputs.logit_row_indices[0, 4:].tolist() == [-1] * 4
    assert_reference(inputs, batch, layout)


def test_one_active_request_dispatches_one_row() -> None:
    """seed-semantics 7.4: num_tokens_per_owner == [1, 0, ...]."""
    layout = DeepSeekV4Layout()
    inputs = prepare(DeepSeekV4DecodePreparer(layout), make_batch([0]))
    assert inputs.num_tokens_per_owner.tolist() == [1] + [0] * 7


def mtp_batch(hidden: int | None = None) -> DecodeBatch:
    """seed-semantics 7.4: two requests on ranks 0 and 1, seq_lens 128 and 5, prev/current
    tokens 3/5 and 7/9, ori ids (0,) and (6,)."""
    fields: dict[str, Any] = {"prev_token_ids": torch.tensor([3, 7])}
    if hidden is not None:
        fields["hidden_states"] = torch.arange(2 * hidden, dtype=torch.float32).view(2, hidden)
        fields["prev_hidden_states"] = -fields["hidden_states"]
    return make_batch(
        [0, 1],
        tokens=[5, 9],
        seq_lens=[128, 5],
        ids=[groups(0), groups(6)],
        **fields,
    )


def test_mtp_feeds_two_real_tokens_per_request() -> None:
    """seed-semantics 7.4, ..._builds_sliding_window_metadata and ..._feeds_two_real_tokens."""
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=3)
    batch = mtp_batch(hidden=3)
    inputs = prepare(preparer, batch, mtp=True)
    assert tuple(inputs.tables["ori"].shape) == (8, 4, 128)
    assert inputs.tables["ori"][0, 0, :4].tolist() == [0, 0, 0, 0]
    assert inputs.tables["ori"][1, 0, :4].tolist() == [6, 6, 6, 6]
    assert inputs.num_tokens_per_owner.tolist() == [2, 2, 0, 0, 0, 0, 0, 0]
    assert inputs.logit_row_indices[0].tolist() == [0, 1] + [-1] * 6
    assert inputs.input_ids[0, :6].tolist() == [3, 5, 3, 5, 3, 5]
    assert inputs.input_ids[1, :2].tolist() == [7, 9]
    assert inputs.position_ids[0, :2].tolist() == [126, 127]
    assert inputs.position_ids[1, :2].tolist() == [3, 4]
    assert inputs.kv_seq_lens[0].tolist() == [128] * 4
    assert inputs.kv_seq_lens[1].tolist() == [5] * 4
    assert inputs.x_hc is not None
    hidden, previous = batch.hidden_states, batch.prev_hidden_states
    assert hidden is not None and previous is not None
    assert torch.equal(inputs.x_hc[0, 0], previous[0])  # slot 0: the previous token's embedding
    assert torch.equal(inputs.x_hc[0, 1], hidden[0])  # slot 1: the current one
    assert torch.equal(inputs.x_hc[0, 4], hidden[0])  # a padding row: request 0's last embedding
    expected = deepseek_v4_x_hc(batch, ranks=8, decode_batch=4, decode_seq=2, mtp=True)
    assert torch.equal(inputs.x_hc, expected)
    assert_reference(inputs, batch, layout, mtp=True)


def test_host_embedding_standard_path_packs_x_hc() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=4)
    hidden = torch.randn(2, 4, dtype=torch.bfloat16)
    batch = make_batch([1, 0], hidden_states=hidden)
    inputs = prepare(preparer, batch)
    expected = deepseek_v4_x_hc(batch, ranks=2, decode_batch=2, decode_seq=2)
    assert inputs.x_hc is not None and inputs.x_hc.dtype == torch.float32
    assert torch.equal(inputs.x_hc, expected)
    assert torch.equal(inputs.x_hc[1, :2], hidden[0].float().expand(2, 4))


def test_speculative_batch_puts_the_draft_after_the_current_token() -> None:
    """seed-semantics 8.1: token 2 (e2), seq 129, draft 5 -> prev [2], tokens [[5]], seq [130],
    prev_hidden e2, hidden e5."""
    embedding = torch.randn(10, 4, dtype=torch.bfloat16)
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    host = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=4)
    batch = make_batch([0], tokens=[2], seq_lens=[129], hidden_states=embedding[[2]])
    draft = torch.tensor([5])
    main = host.speculative_batch(batch, draft, embedding[[5]].float())
    assert main.prev_token_ids is not None and main.prev_hidden_states is not None
    assert main.prev_token_ids.tolist() == [2]
    assert main.token_ids.tolist() == [[5]]
    assert main.seq_lens.tolist() == [130]
    assert torch.equal(main.prev_hidden_states, embedding[[2]])
    assert main.hidden_states is not None and main.hidden_states.dtype == torch.bfloat16
    assert torch.equal(main.hidden_states, embedding[[5]])
    assert main.request_ids == batch.request_ids and main.cache_partitions == [0]
    inputs = prepare(host, main, mtp=True)
    assert inputs.input_ids[0, :2].tolist() == [2, 5]
    assert inputs.position_ids[0, :2].tolist() == [128, 129]
    device = DeepSeekV4DecodePreparer(layout).speculative_batch(make_batch([0], tokens=[2]), draft)
    assert device.hidden_states is None and device.prev_hidden_states is None


def test_accept_mtp_tokens_general_form() -> None:
    """seed-semantics 8.2: the longest matching draft prefix plus one target token."""
    main = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]])
    drafts = torch.tensor([[11, 12, 13], [21, 99, 23], [99, 32, 33]])
    assert accept_mtp_tokens(main, drafts) == [[11, 12, 13, 14], [21, 22], [31]]
    # K=1 (seed-semantics 8.1): main[:,1] only when the draft matched main[:,0].
    assert accept_mtp_tokens([[4, 5], [6, 7]], [4, 9]) == [[4, 5], [6]]


@pytest.mark.parametrize(
    ("main", "draft", "error", "message"),
    [
        ([[1, 2, 3]], [1], ValueError, "main_token_ids must have shape [batch, 2], got (1, 3)"),
        ([1, 2], [1], ValueError, "main_token_ids must have shape [batch, 2], got (2,)"),
        ([[1, 2, 3]], [[1]], ValueError, "main_token_ids must have shape [batch, 2], got (1, 3)"),
        ([[1, 2], [3, 4]], [1], ValueError, "draft_token_ids must have 2 entries, got 1"),
        ([[1, 2, 3]], [[1, 2], [3, 4]], ValueError, "draft_token_ids must have 1 entries, got 2"),
        ([[1.0, 2.0]], [1], TypeError, "main_token_ids must hold integer token ids"),
        ([[1, 2]], [True], TypeError, "draft_token_ids must hold integer token ids"),
    ],
)
def test_accept_mtp_tokens_errors(
    main: Any, draft: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        accept_mtp_tokens(main, draft)


# --- the hidden-state contract --------------------------------------------------------------------


def test_host_embedding_consumers_require_hidden_states_before_any_other_check() -> None:
    """seed-semantics 3: all three consumers raise before the group-id (or any other) checks."""
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=4)
    bare = DecodeBatch(
        request_ids=[],
        token_ids=torch.tensor([]),
        hidden_states=None,
        seq_lens=torch.tensor([]),
        cache_partitions=[],
    )
    with pytest.raises(ValueError, match=f"^{HOST}$"):
        preparer.prepare(bare, buffer_slot=7)
    with pytest.raises(ValueError, match=f"^{HOST}$"):
        preparer.prepare_mtp(bare, buffer_slot=7)
    with pytest.raises(ValueError, match=f"^{HOST}$"):
        preparer.speculative_batch(bare, torch.tensor([1, 2]))


def test_device_embedding_accepts_no_hidden_states() -> None:
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout)
    batch = make_batch([0, 1], seq_lens=[4, 9], prev_token_ids=torch.tensor([1, 2]))
    assert batch.hidden_states is None
    assert prepare(preparer, batch).x_hc is None
    assert prepare(preparer, batch, 1, mtp=True).x_hc is None
    main = preparer.speculative_batch(batch, torch.tensor([3, 4]))
    assert main.hidden_states is None and main.token_ids.tolist() == [[3], [4]]


def test_mtp_requires_previous_tokens_and_embeddings() -> None:
    layout = DeepSeekV4Layout(decode_batch=4, decode_seq=2)
    host = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=2)
    with_hidden = make_batch([0], hidden_states=torch.ones(1, 2), prev_token_ids=torch.tensor([1]))
    with pytest.raises(ValueError, match=f"^{PREVIOUS}$"):
        host.prepare_mtp(with_hidden)
    without_tokens = make_batch(
        [0], hidden_states=torch.ones(1, 2), prev_hidden_states=torch.ones(1, 2)
    )
    with pytest.raises(ValueError, match=f"^{PREVIOUS}$"):
        host.prepare_mtp(without_tokens)
    with pytest.raises(ValueError, match=f"^{PREVIOUS}$"):
        DeepSeekV4DecodePreparer(layout).prepare_mtp(make_batch([0]))


# --- errors: exact messages, nothing written ------------------------------------------------------

Case = tuple[Callable[[], DecodeBatch], int, type[Exception], str]


def std_cases() -> list[tuple[str, dict[str, Any], Case]]:
    """(name, layout kwargs, (batch factory, buffer slot, error, message)) on the standard path."""
    big = {name: 300 for name in GROUP_NAMES}
    big["hca_state"] = 3000
    small = {"ranks": 2, "decode_batch": 4, "num_blocks": {name: 8 for name in GROUP_NAMES}}
    s2 = {"ranks": 2, "decode_batch": 4, "decode_seq": 2}
    return [
        (
            "empty",
            {},
            (lambda: make_batch([]), 0, ValueError, "DeepSeekV4 decode batch must not be empty"),
        ),
        (
            "partition count",
            {},
            (
                lambda: DecodeBatch(
                    request_ids=["a", "b"],
                    token_ids=torch.tensor([1, 2]),
                    hidden_states=None,
                    seq_lens=torch.tensor([1, 1]),
                    cache_partitions=[0],
                ),
                0,
                ValueError,
                "DeepSeekV4 decode requires one cache partition per request",
            ),
        ),
        (
            "partition range",
            {},
            (
                lambda: make_batch([0, 8]),
                0,
                ValueError,
                "DeepSeekV4 decode cache partitions must be in [0, 7]",
            ),
        ),
        (
            "partition none",
            {},
            (
                lambda: make_batch([None]),
                0,
                ValueError,
                "DeepSeekV4 decode cache partitions must be in [0, 7]",
            ),
        ),  # type: ignore[list-item]
        (
            "capacity",
            small,
            (
                lambda: make_batch([1] * 5),
                0,
                ValueError,
                "DeepSeekV4 rank 1 decode batch exceeds local capacity 4",
            ),
        ),
        (
            "one request per rank",
            s2,
            (
                lambda: make_batch([1, 1]),
                0,
                ValueError,
                "DeepSeekV4 non-MTP decode supports at most one request per DP rank; the fixed S=2 "
                "kernel can expose only one cache-safe active token per rank",
            ),
        ),
        (
            "seq positive",
            {},
            (
                lambda: make_batch([0, 1], seq_lens=[3, 0]),
                0,
                ValueError,
                "decode seq_lens must be positive",
            ),
        ),
        (
            "seq shape",
            {},
            (
                lambda: make_batch([0, 1], seq_lens=[3]),
                0,
                ValueError,
                "decode seq_lens must have shape [2], got [1]",
            ),
        ),
        (
            "seq dtype",
            {},
            (
                lambda: DecodeBatch(
                    request_ids=["a"],
                    token_ids=torch.tensor([1]),
                    hidden_states=None,
                    seq_lens=torch.tensor([1.0]),
                    block_ids_by_group=[groups(0)],
                    cache_partitions=[0],
                ),
                0,
                TypeError,
                "decode seq_lens must be integers, got dtype torch.float32",
            ),
        ),
        (
            "token shape",
            {},
            (
                lambda: make_batch([0, 1], tokens=[1]),
                0,
                ValueError,
                "decode token_ids must have shape [2] or [2, k], got [1]",
            ),
        ),
        (
            "no groups",
            {},
            (
                lambda: make_batch([0], ids=[]),
                0,
                ValueError,
                "DeepSeekV4 requires grouped KV block IDs",
            ),
        ),
        (
            "group rows",
            {},
            (
                lambda: make_batch([0, 1], ids=[groups(0)]),
                0,
                ValueError,
                "grouped KV metadata has 1 rows, expected decode batch 2",
            ),
        ),
        (
            "missing groups",
            {},
            (
                lambda: make_batch([0, 1], ids=[groups(0), {**groups(1, csa_state=[])}]),
                0,
                ValueError,
                "decode row 1 is missing grouped KV blocks: csa_state",
            ),
        ),
        (
            "missing keys",
            {},
            (
                lambda: make_batch([0, 1], ids=[groups(0), {"ori": [1]}]),
                0,
                ValueError,
                "decode row 1 is missing grouped KV blocks: cmp_c128, cmp_c4, idx, hca_state, "
                "csa_state, csa_inner_state",
            ),
        ),
        (
            "position",
            {},
            (
                lambda: make_batch([0, 1], seq_lens=[4, 16385]),
                0,
                ValueError,
                "decode position 16384 exceeds max_seq_len=16384",
            ),
        ),
        (
            "missing groups before position",
            {},
            (
                lambda: make_batch([0, 1], seq_lens=[4, 16385], ids=[groups(0), {"ori": [1]}]),
                0,
                ValueError,
                "decode row 1 is missing grouped KV blocks",
            ),
        ),
        (
            "slot 2",
            {},
            (lambda: make_batch([0]), 2, ValueError, "decode buffer_slot must be 0 or 1, got 2"),
        ),
        (
            "slot -1",
            {},
            (lambda: make_batch([0]), -1, ValueError, "decode buffer_slot must be 0 or 1, got -1"),
        ),
        (
            "slot bool",
            {},
            (lambda: make_batch([0]), True, TypeError, "buffer_slot must be an integer"),
        ),
        (
            "position before slot",
            {},
            (
                lambda: make_batch([0], seq_lens=[20000]),
                5,
                ValueError,
                "decode position 19999 exceeds",
            ),
        ),
        (
            "repeat",
            small,
            (
                lambda: make_batch([0], ids=[groups(0, ori=[0, 0])]),
                0,
                ValueError,
                "a grouped KV row must not repeat physical blocks",
            ),
        ),
        (
            "range",
            small,
            (
                lambda: make_batch([0], ids=[groups(0, hca_state=[1, 8])]),
                0,
                ValueError,
                "grouped KV block IDs must be in [0, 8); [8, 12) is reserved for kernel padding",
            ),
        ),
        (
            "negative",
            small,
            (
                lambda: make_batch([0], ids=[groups(0, idx=[-1])]),
                0,
                ValueError,
                "grouped KV block IDs must be in [0, 8)",
            ),
        ),
        (
            "scratch id",
            small,
            (
                lambda: make_batch([0], ids=[groups(8)]),
                0,
                ValueError,
                "[8, 12) is reserved for kernel padding",
            ),
        ),
        (
            "ori length",
            {"num_blocks": big},
            (
                lambda: make_batch([0, 0], ids=[groups(0), groups(1, ori=list(range(129)))]),
                0,
                ValueError,
                "ori ring row 1 has 129 blocks, maximum is 128",
            ),
        ),
        (
            "paged length",
            {"num_blocks": big},
            (
                lambda: make_batch([3, 3], ids=[groups(0), groups(1, cmp_c4=list(range(129)))]),
                0,
                ValueError,
                "row 1 has 129 blocks, maximum is 128",
            ),
        ),
        (
            "state ring length",
            {"num_blocks": big},
            (
                lambda: make_batch([0], ids=[groups(0, hca_state=list(range(2049)))]),
                0,
                ValueError,
                "ring block-table row 0 has 2049 blocks, maximum is 2048",
            ),
        ),
        (
            "padding before length",
            {"num_blocks": big},
            (
                lambda: make_batch(
                    [0], ids=[groups(0, ori=list(range(129)), csa_inner_state=[1, 1])]
                ),
                0,
                ValueError,
                "a grouped KV row must not repeat physical blocks",
            ),
        ),
        (
            "rank order",
            {"num_blocks": big},
            (
                lambda: make_batch(
                    [2, 1], ids=[groups(0, idx=[3, 3]), groups(1, cmp_c128=list(range(130)))]
                ),
                0,
                ValueError,
                "row 0 has 130 blocks, maximum is 128",
            ),
        ),
        (
            "float id",
            {},
            (
                lambda: make_batch([0], ids=[groups(0, csa_state=[1, 2.0])]),
                0,
                TypeError,
                "decode row 0 group csa_state holds 2.0 of type float; block IDs must be integers",
            ),  # type: ignore[list-item]
        ),
        (
            "bool id",
            {},
            (
                lambda: make_batch([0, 1], ids=[groups(0), groups(1, ori=[2, True])]),
                0,
                TypeError,
                "decode row 1 group ori holds True of type bool",
            ),  # type: ignore[list-item]
        ),
        (
            "not a mapping",
            {},
            (
                lambda: make_batch([0], ids=[[1, 2]]),
                0,
                TypeError,
                "decode row 0 grouped KV blocks must map group names to block IDs, got list",
            ),  # type: ignore[list-item]
        ),
        (
            "not a sequence",
            {},
            (
                lambda: make_batch([0], ids=[groups(0, idx=5)]),
                0,
                TypeError,
                "decode row 0 group idx must be a sequence of block IDs, got int",
            ),  # type: ignore[arg-type]
        ),
    ]


@pytest.mark.parametrize(
    ("name", "layout_kwargs", "case"), std_cases(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_standard_errors_write_nothing(
    name: str, layout_kwargs: dict[str, Any], case: Case
) -> None:
    factory, slot, error, message = case
    layout = DeepSeekV4Layout(**layout_kwargs)
    preparer = primed(layout)
    before = everything(preparer)
    with pytest.raises(error, match=re.escape(message)):
        preparer.prepare(factory(), buffer_slot=slot)
    after = everything(preparer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # The caches were left as they were: the next good step equals the reference.
    batch = make_batch([0, 1], seq_lens=[3, 9])
    assert_reference(prepare(preparer, batch, 0), batch, layout)
    assert_reference(prepare(preparer, batch, 1), batch, layout)


def test_mtp_errors_write_nothing() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, decode_seq=2)
    preparer = primed(layout, embedding="host", hidden_size=2)
    before = everything(preparer)
    h = torch.ones(2, 2)
    cases: list[tuple[DecodeBatch, str]] = [
        (
            make_batch(
                [0, 1],
                seq_lens=[2, 1],
                hidden_states=h,
                prev_hidden_states=h,
                prev_token_ids=torch.tensor([1, 2]),
            ),
            "decode seq_lens must be >= MTP sequence width (2), got 1",
        ),
        (
            make_batch(
                [0, 1],
                seq_lens=[2, 3],
                hidden_states=h,
                prev_hidden_states=torch.ones(2, 3),
                prev_token_ids=torch.tensor([1, 2]),
            ),
            "MTP previous embeddings must align with draft embeddings",
        ),
        (
            make_batch(
                [0, 1],
                seq_lens=[2, 3],
                hidden_states=torch.ones(2, 3),
                prev_hidden_states=h,
                prev_token_ids=torch.tensor([1, 2]),
            ),
            "hidden_states must have shape [2, 2], got [2, 3]",
        ),
        (
            make_batch(
                [0, 1],
                seq_lens=[2, 3],
                hidden_states=h,
                prev_hidden_states=h,
                prev_token_ids=torch.tensor([1]),
            ),
            "decode prev_token_ids must have shape [2] or [2, k], got [1]",
        ),
    ]
    for batch, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            preparer.prepare_mtp(batch)
    after = everything(preparer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    s1 = DeepSeekV4DecodePreparer(DeepSeekV4Layout(ranks=2, decode_batch=4))
    with pytest.raises(ValueError, match=r"^DeepSeekV4 MTP verification requires decode_seq=2$"):
        s1.prepare_mtp(make_batch([0], prev_token_ids=torch.tensor([1])))


def test_speculative_batch_errors() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, decode_seq=2)
    host = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=2)
    batch = make_batch([0, 1], hidden_states=torch.ones(2, 2))
    with pytest.raises(ValueError, match="the drafts' host embeddings"):
        host.speculative_batch(batch, torch.tensor([1, 2]))
    with pytest.raises(
        ValueError, match="MTP previous embeddings must align with draft embeddings"
    ):
        host.speculative_batch(batch, torch.tensor([1, 2]), torch.ones(2, 3))
    with pytest.raises(ValueError, match=re.escape("draft_token_ids must have 2 entries, got 3")):
        host.speculative_batch(batch, torch.tensor([1, 2, 3]), torch.ones(2, 2))


def test_errors_in_incremental_updates_write_nothing() -> None:
    """A scheduler that corrupts its live lists between steps: the changed ids alone are checked,
    with upstream's messages, and a failed step leaves buffers and caches as they were."""
    pools = {name: 300 for name in GROUP_NAMES}
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks=pools)
    preparer = DeepSeekV4DecodePreparer(layout)
    ids = [
        groups(0, csa_state=list(range(65))),
        groups(1, csa_state=list(range(100, 165)), cmp_c4=[1, 2]),
    ]
    batch = make_batch([0, 1], seq_lens=[300, 400], ids=ids)
    prepare(preparer, batch, 0)
    prepare(preparer, batch, 1)
    csa, cmp = ids[1]["csa_state"], ids[1]["cmp_c4"]
    mutations: list[tuple[Callable[[], None], type[Exception], str]] = [
        (
            lambda: csa.__setitem__(7, 103),
            ValueError,
            "a grouped KV row must not repeat physical blocks",
        ),
        (
            lambda: csa.__setitem__(7, 300),
            ValueError,
            "grouped KV block IDs must be in [0, 300); [300, 304)",
        ),
        (lambda: csa.__setitem__(7, -5), ValueError, "grouped KV block IDs must be in [0, 300)"),
        (
            lambda: csa.__setitem__(7, 7.0),
            TypeError,
            "decode row 1 group csa_state holds 7.0 of type float",
        ),
        (lambda: cmp.append(2), ValueError, "a grouped KV row must not repeat physical blocks"),
        (lambda: cmp.append(400), ValueError, "grouped KV block IDs must be in [0, 300)"),
        (lambda: cmp.extend(range(3, 130)), ValueError, "row 0 has 129 blocks, maximum is 128"),
    ]
    for mutate, error, message in mutations:
        saved = {name: list(values) for name, values in ids[1].items()}
        mutate()
        before = everything(preparer)
        with pytest.raises(error, match=re.escape(message)):
            preparer.prepare(batch, buffer_slot=0)
        after = everything(preparer)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        for name, values in saved.items():
            ids[1][name][:] = values
    csa[7] = 299  # a valid rotation: one strided write, and the reference agrees
    assert_reference(prepare(preparer, batch, 0), batch, layout)


def test_a_request_moved_onto_a_padding_row_is_checked() -> None:
    """A request that moves to a former padding row, its ids now that row's scratch page."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks={g: 8 for g in GROUP_NAMES})
    preparer = DeepSeekV4DecodePreparer(layout)
    batch = make_batch([0, 0], ids=[groups(0), groups(1)])
    prepare(preparer, batch, 0)
    prepare(preparer, batch, 1)
    before = everything(preparer)
    moved = DecodeBatch(
        request_ids=["r1"],
        token_ids=torch.tensor([5]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids_by_group=[groups(1, csa_state=[8])],
        cache_partitions=[1],
    )
    with pytest.raises(ValueError, match=re.escape("[8, 12) is reserved for kernel padding")):
        preparer.prepare(moved)
    assert all(torch.equal(a, b) for a, b in zip(before, everything(preparer), strict=True))


# --- containers, slots, costs ---------------------------------------------------------------------


def test_rows_in_tuples_arrays_and_tensors() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4)
    preparer = DeepSeekV4DecodePreparer(layout)
    ids = [
        groups(0, csa_state=(1, 2, 3)),  # type: ignore[arg-type]
        groups(1, csa_state=np.array([4, 5], dtype=np.int64), ori=torch.tensor([9])),  # type: ignore[arg-type]
        groups(2, idx=[np.int32(5), 6]),  # type: ignore[list-item]
    ]
    batch = make_batch([0, 1, 1], ids=ids)
    expected_ids = [
        groups(0, csa_state=[1, 2, 3]),
        groups(1, csa_state=[4, 5], ori=[9]),
        groups(2, idx=[5, 6]),
    ]
    plain = make_batch([0, 1, 1], ids=expected_ids)
    for slot in (0, 0, 1):
        assert_reference(prepare(preparer, batch, slot), plain, layout)
    assert_reference(prepare(preparer, plain, 0), plain, layout)


def test_slots_are_independent() -> None:
    """seed-semantics 9: isolated ping-pong slots; preparing slot 1 never touches slot 0."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, decode_seq=2)
    preparer = DeepSeekV4DecodePreparer(layout)
    zero = make_batch([0, 1], tokens=[0, 0], seq_lens=[1, 1])
    first = prepare(preparer, zero, 0)
    second = prepare(preparer, zero, 1)
    assert first.input_ids.data_ptr() != second.input_ids.data_ptr()
    assert first.tables["ori"].data_ptr() != second.tables["ori"].data_ptr()
    assert first.input_ids.abs().sum() == 0 and second.input_ids.abs().sum() == 0
    snapshot = [t.clone() for t in first.buffers().values()]
    preparer.reset_stats()
    other = make_batch([1, 0], tokens=[4, 5], seq_lens=[200, 300], ids=[groups(3), groups(4)])
    assert_reference(prepare(preparer, other, 1), other, layout)
    assert all(s.cells_written == 0 and s.misses == 0 for s in preparer.table_stats(0).values())
    now = list(first.buffers().values())
    assert all(torch.equal(a, b) for a, b in zip(snapshot, now, strict=True))
    assert_reference(prepare(preparer, zero, 0), zero, layout)


def test_a_step_writes_only_what_changed() -> None:
    """Unchanged rows are skipped, a rotated ring slot is a strided write, a grown
    full-history row one cell, a padding row only when its scratch page changes."""
    pools = {name: 300 for name in GROUP_NAMES}
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks=pools)
    preparer = DeepSeekV4DecodePreparer(layout)
    ids = [groups(q, csa_state=list(range(65 * q, 65 * q + 65)), idx=[q]) for q in range(3)]
    batch = make_batch([0, 0, 1], seq_lens=[260, 261, 262], ids=ids)
    prepare(preparer, batch)
    preparer.reset_stats()
    prepare(preparer, make_batch([0, 0, 1], seq_lens=[261, 262, 263], ids=ids))
    assert all(s.cells_written == 0 for s in preparer.table_stats(0).values())
    ids[1]["csa_state"][5] = 299
    ids[2]["idx"].append(298)
    batch = make_batch([0, 0, 1], ids=ids)
    assert_reference(prepare(preparer, batch), batch, layout)
    stats = preparer.table_stats(0)
    assert stats["csa_state"].misses == 1
    assert stats["csa_state"].cells_written == len(range(5, 4096, 65))
    assert stats["idx"].misses == 1 and stats["idx"].cells_written == 1
    assert sum(s.misses for s in stats.values()) == 2
    # Request 1 leaves: request 2's rank is untouched; rank 0's padding rows 1..3 now take the
    # scratch pages 300..302 (upstream: num_blocks + local row - count), so each is rewritten.
    preparer.reset_stats()
    batch = make_batch([0, 1], ids=[ids[0], ids[2]])
    assert_reference(prepare(preparer, batch), batch, layout)
    stats = preparer.table_stats(0)
    assert all(s.misses == 3 for s in stats.values())


def test_invalidate_rewrites_what_something_else_wrote() -> None:
    """After anything else scribbles on a slot, invalidate(slot) makes its next step equal a
    rebuild again; the other slot keeps its own step. reset() forgets every slot."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4)
    preparer = DeepSeekV4DecodePreparer(layout)
    batch = make_batch([0, 1, 1], seq_lens=[5, 6, 7], ids=[groups(q) for q in range(3)])
    prepare(preparer, batch, 0)
    other = prepare(preparer, batch, 1)
    snapshot = [t.clone() for t in other.buffers().values()]
    scribbled = views(preparer, 0)
    for tensor in scribbled.buffers().values():
        tensor.fill_(77)
    preparer.invalidate(0)
    assert_reference(prepare(preparer, batch, 0), batch, layout)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, other.buffers().values(), strict=True))
    for slot in (0, 1):
        for tensor in views(preparer, slot).buffers().values():
            tensor.fill_(-3)
    preparer.reset()
    moved = make_batch([1, 0], seq_lens=[8, 9], ids=[groups(5), groups(6)])
    assert_reference(prepare(preparer, moved, 1), moved, layout)
    assert_reference(prepare(preparer, moved, 0), moved, layout)


def test_table_stats_count_rows_left_alone() -> None:
    """hits: rows a step left as they were; misses: rows it wrote."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=1)
    batch = make_batch([0, 1], ids=[groups(0), groups(1)])
    prepare(preparer, batch)
    preparer.reset_stats()
    prepare(preparer, batch)
    stats = preparer.table_stats(0)
    assert all(s.hits == 8 and s.misses == 0 and s.cells_written == 0 for s in stats.values())


def test_requests_in_the_leading_rows_then_padding() -> None:
    """Two requests on rank 0 of a 2x2 layout fill table rows 0 and 1 in order; rows 2 and 3
    are padding whose scratch index happens to equal their row (regression)."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, max_seq_len=1024)
    preparer = DeepSeekV4DecodePreparer(layout)
    batch = make_batch([0, 0], ids=[groups(0), groups(1)])
    assert_reference(prepare(preparer, batch, 0), batch, layout)
