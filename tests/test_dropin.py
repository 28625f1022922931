"""blockprep as a drop-in for upstream pypto-serving (issue 18): upstream's own ``DecodeBatch``
objects at every entry point, upstream's DeepSeek pool rule, upstream's messages where blockprep
differed. Every buffer is compared with :mod:`blockprep.reference` (upstream's constructions)."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from blockprep.adapters.deepseek import (
    GROUP_NAMES,
    INPUT_FIELDS,
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.adapters.qwen import QwenDecodeAdapter, QwenDecodePreparer
from blockprep.batch import DecodeBatch, DecodeResult, KvAllocation, as_decode_batch
from blockprep.reference import QwenDecodePrep97, deepseek_v4_decode_rebuild


@dataclasses.dataclass(slots=True)
class UpstreamDecodeBatch:
    """pypto-serving's ``DecodeBatch`` at ``9b1a264`` (``pypto_serving/config/types.py``):
    exactly its fields, in its order, and nothing more (``slots``: no other attribute reads)."""

    request_ids: list[str]
    token_ids: torch.Tensor
    hidden_states: torch.Tensor | None
    seq_lens: torch.Tensor
    allow_device_greedy_sampling: bool = False
    allow_device_topk_sampling: bool = False
    kv_allocations: list[Any] = dataclasses.field(default_factory=list)
    block_ids: list[list[int]] = dataclasses.field(default_factory=list)
    block_ids_by_group: list[dict[str, list[int]]] = dataclasses.field(default_factory=list)
    cache_partitions: list[int | None] = dataclasses.field(default_factory=list)
    prev_token_ids: torch.Tensor | None = None
    prev_hidden_states: torch.Tensor | None = None


UPSTREAM_FIELDS = [
    "request_ids",
    "token_ids",
    "hidden_states",
    "seq_lens",
    "allow_device_greedy_sampling",
    "allow_device_topk_sampling",
    "kv_allocations",
    "block_ids",
    "block_ids_by_group",
    "cache_partitions",
    "prev_token_ids",
    "prev_hidden_states",
]
"""The field list of pypto-runtime.md section 3, in order."""


def test_the_stand_in_has_exactly_upstreams_fields() -> None:
    assert [f.name for f in dataclasses.fields(UpstreamDecodeBatch)] == UPSTREAM_FIELDS
    batch = UpstreamDecodeBatch(["a"], torch.tensor([1]), None, torch.tensor([1]))
    assert not hasattr(batch, "block_deltas")
    with pytest.raises(AttributeError):
        batch.block_deltas = None  # type: ignore[attr-defined]


# --- DeepSeek ------------------------------------------------------------------------------------


def request_groups(seq_len: int, base: int = 0) -> dict[str, list[int]]:
    """A request's ids as upstream's cache manager sizes them for ``seq_len`` tokens (ring
    groups capped at their ring length), ``base`` added to every id."""
    blocks = math.ceil(seq_len / 128)
    counts = {
        "ori": min(blocks, 4),
        "cmp_c128": blocks,
        "cmp_c4": blocks,
        "idx": blocks,
        "hca_state": min(math.ceil(seq_len / 8), 48),
        "csa_state": min(math.ceil(seq_len / 4), 65),
        "csa_inner_state": min(math.ceil(seq_len / 4), 65),
    }
    return {name: [base + i for i in range(n)] for name, n in counts.items()}


def upstream_batch(
    partitions: list[int], seq_lens: list[int], *, mtp: bool = False, **fields: Any
) -> UpstreamDecodeBatch:
    A = len(partitions)
    return UpstreamDecodeBatch(
        request_ids=[f"r{q}" for q in range(A)],
        token_ids=torch.tensor([[10 + q] for q in range(A)]),
        hidden_states=None,
        seq_lens=torch.tensor(seq_lens),
        block_ids_by_group=[request_groups(s, 100 * q) for q, s in enumerate(seq_lens)],
        cache_partitions=list(partitions),
        prev_token_ids=torch.tensor([20 + q for q in range(A)]) if mtp else None,
        **fields,
    )


def assert_rebuilt(
    inputs: DeepSeekV4DecodeInputs, batch: Any, layout: DeepSeekV4Layout, **options: Any
) -> None:
    expected = deepseek_v4_decode_rebuild(
        batch,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        **options,
    )
    for name in GROUP_NAMES:
        assert torch.equal(inputs.tables[name], expected[name]), name
    for name in INPUT_FIELDS:
        assert torch.equal(getattr(inputs, name), expected[name]), name


POOLS = {g: 1000 for g in GROUP_NAMES}


@pytest.mark.parametrize("verify", [False, True])
def test_every_deepseek_entry_point_takes_upstreams_own_batch(verify: bool) -> None:
    # prepare, on two slots
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, max_seq_len=1024, num_blocks=POOLS)
    preparer = DeepSeekV4DecodePreparer(layout, verify=verify)
    batch = upstream_batch([0, 1, 0], [5, 130, 300])
    assert_rebuilt(preparer.prepare(batch, buffer_slot=0), batch, layout)
    assert_rebuilt(preparer.prepare(batch, buffer_slot=1), batch, layout)
    # early=True, then restage (one request per rank: upstream's early rule)
    early = upstream_batch([1, 0], [9, 200])
    placeholder = [[0] * layout.decode_seq] * 2
    inputs = preparer.prepare(early, buffer_slot=0, early=True)
    assert_rebuilt(
        inputs, early, layout, token_rows=placeholder, positions=placeholder, active_seq=1
    )
    assert_rebuilt(preparer.restage(early, buffer_slot=0), early, layout)


@pytest.mark.parametrize("verify", [False, True])
def test_upstreams_own_batch_through_mtp_target_and_speculative_batch(verify: bool) -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=8, decode_seq=2, num_blocks=POOLS)
    preparer = DeepSeekV4DecodePreparer(layout, verify=verify)
    batch = upstream_batch([0, 1, 1], [7, 129, 40], mtp=True)
    assert_rebuilt(preparer.prepare_mtp(batch, buffer_slot=0), batch, layout, mtp=True)
    inputs = preparer.prepare_mtp(batch, buffer_slot=1, early=True)
    assert_rebuilt(preparer.restage(batch, buffer_slot=1), batch, layout, mtp=True)
    assert inputs.buffer_slot == 1

    verified = preparer.speculative_batch(batch, torch.tensor([31, 32, 33]))
    assert verified.request_ids == batch.request_ids
    assert verified.token_ids.tolist() == [[31], [32], [33]]
    assert verified.prev_token_ids is not None
    assert verified.prev_token_ids.tolist() == [10, 11, 12]
    assert verified.seq_lens.tolist() == [8, 130, 41]
    assert verified.block_ids_by_group is batch.block_ids_by_group
    assert verified.cache_partitions == [0, 1, 1]

    target = DeepSeekV4Layout(ranks=2, decode_batch=4, decode_seq=4, num_blocks=POOLS)
    chunk = DeepSeekV4DecodePreparer(target, verify=verify)
    one = upstream_batch([0, 1], [50, 60])
    rows = [[1, 2, 3, 3], [4, 5, 6, 6]]
    positions = [[46, 47, 48, 49], [56, 57, 58, 59]]
    inputs = chunk.prepare_mtp_target(
        one, token_rows=rows, positions=positions, active_width=3, buffer_slot=0
    )
    assert_rebuilt(inputs, one, target, token_rows=rows, positions=positions, active_seq=3)
    restaged = chunk.restage(one, buffer_slot=0, token_rows=rows, positions=positions)
    assert_rebuilt(restaged, one, target, token_rows=rows, positions=positions, active_seq=3)


def test_upstreams_pool_of_one_maximum_length_request_is_taken() -> None:
    """Issue 18's pools: one maximum-length (260-token) request per rank; padding rows take the
    scratch pages ``num_blocks + k``, past the pool."""
    one = {
        "ori": 4,
        "cmp_c128": 3,
        "cmp_c4": 3,
        "idx": 3,
        "hca_state": 48,
        "csa_state": 65,
        "csa_inner_state": 65,
    }
    layout = DeepSeekV4Layout(
        ranks=8, decode_batch=4, decode_seq=2, max_seq_len=260, num_blocks=one
    )
    assert dict(layout.num_blocks) == one
    preparer = DeepSeekV4DecodePreparer(layout, verify=True)
    batch = UpstreamDecodeBatch(
        request_ids=[f"r{q}" for q in range(8)],
        token_ids=torch.arange(8),
        hidden_states=None,
        seq_lens=torch.tensor([260] * 8),
        block_ids_by_group=[request_groups(260) for _ in range(8)],
        cache_partitions=list(range(8)),
    )
    inputs = preparer.prepare(batch)
    assert_rebuilt(inputs, batch, layout)
    # a rank's k-th padding row (k = 0 right after its requests) holds num_blocks + k alone
    assert inputs.tables["cmp_c128"][3, 1:, :2].tolist() == [[3, 0], [4, 0], [5, 0]]
    assert inputs.tables["hca_state"][3, 1:, :3].tolist() == [[48] * 3, [49] * 3, [50] * 3]

    before = [t.clone() for t in inputs.buffers().values()]
    batch.block_ids_by_group[2]["idx"] = [0, 1, 3]  # 3: the first scratch page
    with pytest.raises(
        ValueError,
        match=re.escape(
            "grouped KV block IDs must be in [0, 3); [3, 7) is reserved for kernel padding"
        ),
    ):
        preparer.prepare(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, inputs.buffers().values(), strict=True))


def test_the_physical_blocks_check_is_upstreams_compiled_limit() -> None:
    """Upstream checks each group's compiled table limit (128, or hca 64, csa 65) against
    ``decode_batch``, whatever the pool size."""
    assert DeepSeekV4Layout(decode_batch=63).decode_batch == 63
    with pytest.raises(
        ValueError, match=r"^DeepSeekV4 hca_state cache needs more than 64 physical blocks$"
    ):
        DeepSeekV4Layout(decode_batch=64, decode_seq=1)
    with pytest.raises(ValueError, match=r"^DeepSeekV4 ori cache needs more than 128 physical"):
        DeepSeekV4Layout(decode_batch=128, num_blocks="unbound")
    tiny = {g: 1 for g in GROUP_NAMES}
    assert dict(DeepSeekV4Layout(decode_batch=8, num_blocks=tiny).num_blocks) == tiny


def test_deepseek_ignores_extra_seq_lens_as_upstream() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=4, num_blocks=POOLS)
    preparer = DeepSeekV4DecodePreparer(layout)
    batch = upstream_batch([0, 1], [5, 9])
    batch.seq_lens = torch.tensor([5, 9, 77, 1])
    assert_rebuilt(preparer.prepare(batch), batch, layout)
    short = upstream_batch([0, 1], [5, 9])
    short.seq_lens = torch.tensor([5])
    with pytest.raises(ValueError, match=re.escape("decode seq_lens must have shape [2], got [1]")):
        preparer.prepare(short)


# --- Qwen ----------------------------------------------------------------------------------------


def qwen_pair(**options: Any) -> tuple[QwenDecodePreparer, QwenDecodePrep97]:
    preparer = QwenDecodePreparer(4, 512, 128, **options)
    return preparer, QwenDecodePrep97(4, 512, 128, preparer.token_width)


def assert_qwen_equal(preparer: QwenDecodePreparer, reference: QwenDecodePrep97) -> None:
    buffers = preparer.buffers()
    assert torch.equal(buffers["token_ids"], reference.token_ids)
    assert torch.equal(buffers["seq_lens"], reference.seq_lens)
    assert torch.equal(buffers["block_table"], reference.block_table)
    assert torch.equal(buffers["slot_mapping"], reference.slot_mapping)


@pytest.mark.parametrize("verify", [False, True])
def test_qwen_takes_upstreams_own_batch(verify: bool) -> None:
    preparer, reference = qwen_pair(verify=verify)
    by_pages = UpstreamDecodeBatch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([[7], [8]]),
        hidden_states=None,
        seq_lens=torch.tensor([3, 130]),
        block_ids=[[5], [6, 9]],
    )
    inputs = preparer.prepare(by_pages)
    reference.prepare(by_pages)  # type: ignore[arg-type]
    assert inputs.actual_batch == 2
    assert_qwen_equal(preparer, reference)
    allocations = UpstreamDecodeBatch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([4, 2]),
        hidden_states=None,
        seq_lens=torch.tensor([200, 3, 99]),  # extra rows: ignored under kv_allocations
        kv_allocations=[KvAllocation("a", "m", [1, 3], 256), KvAllocation("b", "m", [2], 128)],
    )
    preparer.prepare(allocations)
    reference.prepare(allocations)  # type: ignore[arg-type]
    assert_qwen_equal(preparer, reference)


def test_qwen_adapter_and_a_namespace_without_optional_fields() -> None:
    preparer, reference = qwen_pair()
    seen: list[Any] = []

    class Executor:
        def run_decode(self, inputs: Any) -> DecodeResult:
            seen.append(inputs)
            return DecodeResult(hidden_states=None, logits=None)

    batch = SimpleNamespace(
        request_ids=["x"],
        token_ids=torch.tensor([3]),
        seq_lens=torch.tensor([2]),
        block_ids=[[4]],
    )
    QwenDecodeAdapter(preparer, Executor()).run_decode(batch)  # type: ignore[arg-type]
    reference.prepare(as_decode_batch(batch))
    assert seen[0].actual_batch == 1
    assert_qwen_equal(preparer, reference)


def test_qwen_fewer_seq_lens_says_what_upstream_says() -> None:
    """Upstream counts the ``seq_lens`` rows; its token reshape to them fails first."""
    preparer, reference = qwen_pair()
    batch = UpstreamDecodeBatch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([[1], [2]]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids=[[1], [2]],
    )
    with pytest.raises(ValueError) as upstream:
        reference.prepare(batch)  # type: ignore[arg-type]
    assert str(upstream.value) == (
        "decode token_ids must contain exactly one token per row, got shape (2, 1)"
    )
    before = {name: t.clone() for name, t in preparer.buffers().items()}
    with pytest.raises(ValueError) as ours:
        preparer.prepare(batch)
    assert str(ours.value).startswith(str(upstream.value) + " (")
    assert "decode seq_lens has 1 rows for 2 request ids" in str(ours.value)
    assert all(torch.equal(t, before[name]) for name, t in preparer.buffers().items())


# --- as_decode_batch -----------------------------------------------------------------------------


def test_as_decode_batch_reads_every_field_and_defaults_the_rest() -> None:
    values: dict[str, Any] = {
        "request_ids": ["a"],
        "token_ids": torch.tensor([1]),
        "hidden_states": torch.ones(1, 2),
        "seq_lens": torch.tensor([4]),
        "allow_device_greedy_sampling": True,
        "allow_device_topk_sampling": True,
        "kv_allocations": [KvAllocation("a", "m", [3], 128)],
        "block_ids": [[3]],
        "block_ids_by_group": [{"g": [1]}],
        "cache_partitions": [0],
        "prev_token_ids": torch.tensor([2]),
        "prev_hidden_states": torch.zeros(1, 2),
        "block_deltas": {"seq": 0, "base": None, "rows": {}},
    }
    assert set(values) == {f.name for f in dataclasses.fields(DecodeBatch)}
    full = as_decode_batch(SimpleNamespace(**values, sampling_params=[], constraint_states={}))
    for name, value in values.items():
        assert getattr(full, name) is value, name
    bare = as_decode_batch(
        SimpleNamespace(**{k: values[k] for k in ("request_ids", "token_ids", "seq_lens")})
    )
    expected = DecodeBatch(
        request_ids=["a"],
        token_ids=values["token_ids"],
        hidden_states=None,
        seq_lens=values["seq_lens"],
    )
    assert bare == expected
    own = DecodeBatch(request_ids=[], token_ids=[1], hidden_states=None, seq_lens=[1])
    assert as_decode_batch(own) is own
    with pytest.raises(TypeError, match="a decode batch needs seq_lens: SimpleNamespace has no"):
        as_decode_batch(SimpleNamespace(request_ids=["a"], token_ids=[1]))
