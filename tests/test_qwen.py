"""Qwen decode preparation: buffers equal upstream's constructions after every step of simulated
traces; upstream's validation messages; nothing written on a rejected batch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep import DecodeBatch, DecodeResult
from blockprep.adapters.qwen import QwenDecodeAdapter, QwenDecodeInputs, QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97, QwenDecodePrepBefore

BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


def snapshot(inputs: QwenDecodeInputs) -> dict[str, torch.Tensor]:
    return {name: getattr(inputs, name).clone() for name in BUFFERS}


def assert_same_buffers(inputs: QwenDecodeInputs, reference: Any) -> None:
    for name in BUFFERS:
        assert torch.equal(getattr(inputs, name), getattr(reference, name)), name


class PagedScheduler:
    """A small paged KV scheduler: requests join with a prompt, decode a token per step, get a
    page from a shuffled free pool every ``page_size`` tokens, finish and free their pages."""

    def __init__(self, rng: random.Random, batch: int, max_seq_len: int, page_size: int) -> None:
        self.rng, self.batch, self.max_seq_len, self.page_size = rng, batch, max_seq_len, page_size
        pages_per_request = -(-max_seq_len // page_size)
        self.free = list(range(batch * pages_per_request * 2))
        rng.shuffle(self.free)
        self.requests: dict[str, dict[str, Any]] = {}
        self.counter = 0

    def join(self) -> None:
        seq_len = self.rng.randint(1, self.max_seq_len)
        pages = [self.free.pop() for _ in range(-(-seq_len // self.page_size))]
        self.requests[f"r{self.counter}"] = {"seq_len": seq_len, "pages": pages}
        self.counter += 1

    def step(self) -> DecodeBatch:
        for rid in list(self.requests):
            request = self.requests[rid]
            if request["seq_len"] >= self.max_seq_len or self.rng.random() < 0.05:
                self.free.extend(self.requests.pop(rid)["pages"])
        while len(self.requests) < self.batch and (not self.requests or self.rng.random() < 0.3):
            self.join()
        active = list(self.requests)
        if self.rng.random() < 0.2:
            self.rng.shuffle(active)  # requests move to other rows
        active = active[: self.rng.randint(1, len(active))]
        batch = DecodeBatch(
            request_ids=active,
            token_ids=torch.tensor([self.rng.randrange(1000) for _ in active]).reshape(
                -1, *([1] if self.rng.random() < 0.5 else [])
            ),
            hidden_states=None,
            seq_lens=torch.tensor([self.requests[rid]["seq_len"] for rid in active]),
            block_ids=[
                list(self.requests[r]["pages"])
                if self.rng.random() < 0.7
                else tuple(self.requests[r]["pages"])  # type: ignore[misc]
                for r in active
            ],
        )
        for rid in self.requests:  # every request advances, active or not
            request = self.requests[rid]
            request["seq_len"] += 1
            needs_page = (request["seq_len"] - 1) // self.page_size >= len(request["pages"])
            if needs_page and request["seq_len"] <= self.max_seq_len:
                request["pages"].append(self.free.pop())  # the scheduler's list grows
        return batch


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 6),
    page_size=st.sampled_from([1, 4, 16, 128]),
    max_seq_len=st.sampled_from([1, 7, 64, 300]),
)
def test_buffers_equal_upstream_constructions_after_every_step(
    seed: int, batch: int, page_size: int, max_seq_len: int
) -> None:
    rng = random.Random(seed)
    preparer = QwenDecodePreparer(batch, max_seq_len, page_size)
    references = [
        QwenDecodePrep97(batch, max_seq_len, page_size, 8),
        QwenDecodePrepBefore(batch, max_seq_len, page_size, 8),
    ]
    scheduler = PagedScheduler(rng, batch, max_seq_len, page_size)
    first = preparer.prepare(scheduler.step())
    addresses = {name: getattr(first, name).data_ptr() for name in BUFFERS}
    for _ in range(60):
        step = scheduler.step()
        inputs = preparer.prepare(step)
        assert inputs.actual_batch == len(step.request_ids)
        for reference in references:
            reference.prepare(step)
            assert_same_buffers(inputs, reference)
        for name in BUFFERS:
            assert getattr(inputs, name) is getattr(first, name)
            assert getattr(inputs, name).data_ptr() == addresses[name]
        preparer.block_table.check()


# --- seed-semantics 9: upstream's tests ---------------------------------------------------------


def test_writes_compiled_buffers_and_replicates_padding() -> None:
    preparer = QwenDecodePreparer(max_batch_size=2, max_seq_len=128, page_size=64)
    batch = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([[7]]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids=[[9]],
    )
    inputs = preparer.prepare(batch)
    assert inputs.token_ids[:, :1].tolist() == [[7], [7]]
    assert (inputs.token_ids[:, 1:] == 0).all() and inputs.token_ids.shape == (2, 8)
    assert inputs.seq_lens.tolist() == [1, 1]
    assert inputs.block_table.reshape(2, 2).tolist() == [[9, -1], [9, -1]]
    assert inputs.slot_mapping.tolist() == [9 * 64, 9 * 64]
    assert all(getattr(inputs, name).dtype == torch.int32 for name in BUFFERS)


def test_caches_block_table_until_pages_change() -> None:
    preparer = QwenDecodePreparer(max_batch_size=1, max_seq_len=128, page_size=64)
    pages = [3]

    def step(seq_len: int) -> None:
        preparer.prepare(
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([1]),
                hidden_states=None,
                seq_lens=torch.tensor([seq_len]),
                block_ids=[pages],
            )
        )

    step(1)
    written = preparer.block_table.stats.cells_written
    step(2)
    assert preparer.block_table.stats.cells_written == written  # a hit: the row is not touched
    pages.append(5)  # the scheduler appends a page in place when the request crosses 64 tokens
    step(65)
    assert preparer.block_table.stats.cells_written == written + 1
    assert preparer.block_table.numpy().tolist() == [[3, 5]]


def test_rejects_multi_token_rows() -> None:
    preparer = QwenDecodePreparer(max_batch_size=2, max_seq_len=128, page_size=64)
    batch = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([[1, 2]]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids=[[0]],
    )
    with pytest.raises(ValueError, match="exactly one token per row"):
        preparer.prepare(batch)


# --- validation: upstream's messages, nothing written ---------------------------------------------

GOOD = DecodeBatch(
    request_ids=["a", "b"],
    token_ids=torch.tensor([5, 6]),
    hidden_states=None,
    seq_lens=torch.tensor([3, 70]),
    block_ids=[[1], [2, 4]],
)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            DecodeBatch(
                request_ids=[],
                token_ids=torch.tensor([]),
                hidden_states=None,
                seq_lens=torch.tensor([]),
            ),
            r"^batch must contain at least one request$",
        ),
        (
            DecodeBatch(
                request_ids=list("abcd"),
                token_ids=torch.tensor([1] * 4),
                hidden_states=None,
                seq_lens=torch.tensor([1] * 4),
            ),
            r"^batch has 4 requests, but runtime max_batch_size is 3$",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([[1, 2], [3, 4]]),
                hidden_states=None,
                seq_lens=torch.tensor([1, 1]),
            ),
            r"^decode token_ids must contain exactly one token per row, got shape \(2, 2\)$",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([1, 2, 3]),
                hidden_states=None,
                seq_lens=torch.tensor([1, 1]),
            ),
            r"^decode token_ids must contain exactly one token per row, got shape \(3,\)$",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([1, 2]),
                hidden_states=None,
                seq_lens=torch.tensor([1]),
            ),
            r"^decode token_ids must contain exactly one token per row, got shape \(2,\) "
            r"\(decode seq_lens has 1 rows for 2 request ids\)$",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([1, 2]),
                hidden_states=None,
                seq_lens=torch.tensor([1, 0]),
                block_ids=[[1], [2]],
            ),
            r"^decode seq_lens must be positive$",
        ),
        (
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([1]),
                hidden_states=None,
                seq_lens=torch.tensor([257]),
                block_ids=[[1, 2, 3, 4, 5]],
            ),
            r"^decode seq_len 257 exceeds max_seq_len 256$",
        ),
        (
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([1]),
                hidden_states=None,
                seq_lens=torch.tensor([3]),
                block_ids=[[1, 2, 3, 4, 5]],
            ),
            r"^page_ids list length 5 exceeds block-table width 4$",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([1, 2]),
                hidden_states=None,
                seq_lens=torch.tensor([3, 65]),
                block_ids=[[1], [2]],
            ),
            r"^page_ids list length 1 is too small for decode position 64; need at least 2 pages$",
        ),
        (
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([1]),
                hidden_states=None,
                seq_lens=torch.tensor([3]),
                block_ids=[[-2]],
            ),
            r"^block IDs must not be negative",
        ),
        (
            DecodeBatch(
                request_ids=["a", "b"],
                token_ids=torch.tensor([1, 2]),
                hidden_states=None,
                seq_lens=torch.tensor([3, 3]),
                block_ids=[[1], [1, 2.5]],
            ),
            r"^block-table row 1 holds 2\.5 of type float",
        ),
        (
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([1]),
                hidden_states=None,
                seq_lens=torch.tensor([3]),
                block_ids=[[2**25]],
            ),
            r"^slot-mapping row 0 maps to slot 2147483650 \(page 33554432\), above 2147483647$",
        ),
        (
            DecodeBatch(
                request_ids=["a"],
                token_ids=torch.tensor([2**31]),
                hidden_states=None,
                seq_lens=torch.tensor([3]),
                block_ids=[[1]],
            ),
            r"^token row 0 holds token id 2147483648, outside int32$",
        ),
    ],
)
def test_rejected_batch_writes_nothing_and_the_next_one_prepares(
    batch: DecodeBatch, message: str
) -> None:
    preparer = QwenDecodePreparer(max_batch_size=3, max_seq_len=256, page_size=64)
    reference = QwenDecodePrep97(3, 256, 64, 8)
    inputs = preparer.prepare(GOOD)
    reference.prepare(GOOD)
    before = snapshot(inputs)
    with pytest.raises((ValueError, TypeError), match=message):
        preparer.prepare(batch)
    for name in BUFFERS:
        assert torch.equal(getattr(inputs, name), before[name]), name
    preparer.block_table.check()
    following = DecodeBatch(
        request_ids=["x"],
        token_ids=torch.tensor([1]),
        hidden_states=None,
        seq_lens=torch.tensor([1]),
        block_ids=[[0]],
    )
    preparer.prepare(following)
    reference.prepare(following)
    assert_same_buffers(inputs, reference)


def test_reset_after_a_warmup_write_restores_every_buffer() -> None:
    preparer = QwenDecodePreparer(max_batch_size=3, max_seq_len=256, page_size=64)
    reference = QwenDecodePrep97(3, 256, 64, 8)
    inputs = preparer.prepare(GOOD)
    # What upstream's warm-up dispatch does to the compiled buffers.
    inputs.block_table.fill_(0)
    inputs.slot_mapping.fill_(-1)
    inputs.token_ids.fill_(3)
    preparer.reset()
    reference.reset()
    assert (inputs.token_ids[:, 1:] == 0).all()
    preparer.prepare(GOOD)
    reference.prepare(GOOD)
    assert_same_buffers(inputs, reference)


def test_share_memory_buffers() -> None:
    inputs = QwenDecodePreparer(2, 128, 64, share_memory=True).prepare(GOOD)
    assert all(getattr(inputs, name).is_shared() for name in BUFFERS)


def test_bad_configuration() -> None:
    with pytest.raises(ValueError, match="max_batch_size must be positive"):
        QwenDecodePreparer(0, 128)
    with pytest.raises(
        ValueError, match="compiled decode token buffer must have at least one column"
    ):
        QwenDecodePreparer(2, 128, 64, sampled_ids_pad=0)


# --- executor hand-off -----------------------------------------------------------------------


class RecordingExecutor:
    """Records what it was handed; returns logits built from the token buffer."""

    def __init__(self) -> None:
        self.seen: list[QwenDecodeInputs] = []

    def run_decode(self, inputs: QwenDecodeInputs) -> DecodeResult:
        self.seen.append(inputs)
        tokens = inputs.token_ids[: inputs.actual_batch, 0].to(torch.float32)
        return DecodeResult(
            hidden_states=None, logits=tokens[:, None], sampled_token_ids=tokens.long()
        )


def test_adapter_hands_the_persistent_buffers_to_the_executor_without_hidden_states() -> None:
    executor = RecordingExecutor()
    adapter = QwenDecodeAdapter(QwenDecodePreparer(3, 256, 64), executor)
    result = adapter.run_decode(GOOD)
    assert GOOD.hidden_states is None
    assert result.hidden_states is None
    assert result.sampled_token_ids is not None and result.sampled_token_ids.tolist() == [5, 6]
    (inputs,) = executor.seen
    assert not hasattr(inputs, "hidden_states")
    assert inputs.token_ids is adapter.preparer.prepare(GOOD).token_ids


def test_prepare_does_not_read_hidden_states() -> None:
    class NoHidden:
        def __init__(self) -> None:
            self.request_ids = ["a"]
            self.token_ids = torch.tensor([1])
            self.seq_lens = torch.tensor([1])
            self.block_ids = [[0]]

        @property
        def hidden_states(self) -> Any:
            raise AssertionError("hidden states were read")

    executor = RecordingExecutor()
    adapter = QwenDecodeAdapter(QwenDecodePreparer(2, 64, 64), executor)
    adapter.run_decode(NoHidden())  # type: ignore[arg-type]
    assert np.array_equal(executor.seen[0].seq_lens.numpy(), [1, 1])


def test_device_preparer_hands_out_device_buffers() -> None:
    """With a device other than the CPU the inputs are device mirrors of the host buffers (the
    meta device stands in for an accelerator: it allocates and copies without data)."""
    preparer = QwenDecodePreparer(3, 256, 64, device="meta")
    inputs = preparer.prepare(GOOD)
    again = preparer.prepare(GOOD)
    for name in BUFFERS:
        tensor = getattr(inputs, name)
        assert tensor.device.type == "meta" and tensor is getattr(again, name)
    assert inputs.block_table.shape == (3 * 4,) and inputs.token_ids.shape == (3, 8)
    preparer.reset()


def test_kv_allocations_give_the_pages_first_as_upstream() -> None:
    """Upstream's Qwen runner counts rows by ``kv_allocations`` when there are any and takes
    each row's pages from them before ``block_ids``: a batch carrying only allocations prepares
    exactly as the same batch with ``block_ids`` (checked against upstream's construction)."""
    from blockprep.batch import KvAllocation

    pages = [[3, 9], [4]]
    allocations = [
        KvAllocation(request_id=rid, model_id="m", page_ids=ids, tokens_capacity=256)
        for rid, ids in zip(["a", "b"], pages, strict=True)
    ]
    common = {
        "request_ids": ["a", "b"],
        "token_ids": torch.tensor([5, 6]),
        "hidden_states": None,
        "seq_lens": torch.tensor([130, 7]),
    }
    ours = QwenDecodePreparer(4, 256, 128).prepare(
        DecodeBatch(**common, kv_allocations=allocations, block_ids=[[1, 2], [8]])
    )
    upstream = QwenDecodePrep97(4, 256, 128, 8)
    upstream.prepare(DecodeBatch(**common, block_ids=pages))
    for name in ("token_ids", "seq_lens", "block_table", "slot_mapping"):
        assert torch.equal(getattr(ours, name), getattr(upstream, name)), name


def test_every_upstream_field_by_keyword() -> None:
    """Upstream's DecodeBatch and DecodeResult fields (``config/types.py`` at ``9b1a264``), all
    given by keyword and in upstream's positional order."""
    from blockprep.batch import SamplingCandidates

    batch = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([5]),
        hidden_states=None,
        seq_lens=torch.tensor([3]),
        allow_device_greedy_sampling=True,
        allow_device_topk_sampling=False,
        kv_allocations=[],
        block_ids=[[8]],
        block_ids_by_group=[],
        cache_partitions=[],
        prev_token_ids=None,
        prev_hidden_states=None,
    )
    positional = DecodeBatch(["a"], torch.tensor([5]), None, torch.tensor([3]))
    assert positional.seq_lens.tolist() == [3] and positional.hidden_states is None
    inputs = QwenDecodePreparer(2, 256, 128).prepare(batch)
    assert inputs.slot_mapping.tolist() == [8 * 128 + 2] * 2
    result = DecodeResult(
        hidden_states=None,
        logits=None,
        sampled_token_ids=torch.tensor([1]),
        sampling_candidates=SamplingCandidates(values=torch.zeros(1), token_ids=torch.zeros(1)),
        next_hidden_states=None,
        accepted_token_ids=[[1]],
    )
    assert DecodeResult(None, None).sampled_token_ids is None and result.accepted_token_ids
