"""The preparers' edge cases: pool binding, the scheduler simulation's pools, sparse outs, restage
in verify mode, meta tokens, speculative drafts, NumPy request ids and partitions, and a Qwen
batch carrying both block ids and deltas. Every refusal is a BlockprepError of the documented
type and leaves the buffers byte-identical."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from test_deepseek_lifecycle import assert_equal, reference, sim

from blockprep import BlockprepError, BlockTable, DecodeBatch, paged_block_table, ring_block_table
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.deepseek.abi import deepseek_v4_argument_values
from blockprep.adapters.deepseek.layout import UNBOUND
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97
from blockprep.testing import DeepSeekV4SchedulerSim


def raises(error: type[BaseException], words: str, call: Any) -> None:
    with pytest.raises(error, match=words) as info:
        call()
    assert isinstance(info.value, BlockprepError), type(info.value)


def snapshot(preparer: DeepSeekV4DecodePreparer, slot: int = 0) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in preparer.slot_buffers(slot).items()}


def unchanged(preparer: DeepSeekV4DecodePreparer, before: dict[str, torch.Tensor]) -> None:
    for name, tensor in preparer.slot_buffers(0).items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize("value", [None, UNBOUND, 7])
def test_bind_num_blocks_needs_a_mapping(value: object) -> None:
    """9ea27c1: ``None`` silently bound the default pools, ``"unbound"`` an AssertionError."""
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, num_blocks=UNBOUND)
    preparer = DeepSeekV4DecodePreparer(layout)
    raises(
        TypeError,
        "binding pool sizes needs num_blocks mapping",
        lambda: preparer.bind_num_blocks(value),
    )  # type: ignore[arg-type]
    assert not preparer.bound
    raises(TypeError, "num_blocks mapping", lambda: layout.with_num_blocks(value))  # type: ignore[arg-type]


def test_scheduler_sim_refuses_pools_too_small_up_front() -> None:
    """9ea27c1 accepted them and died with IndexError at step 26."""
    default = DeepSeekV4SchedulerSim(ranks=2, decode_batch=2, max_seq_len=1024, seed=0)
    small = dict(default.num_blocks, ori=7)  # 2 requests x ring length 4 need 8
    raises(
        ValueError,
        r"num_blocks\['ori'\]=7 is too small: 2 requests per rank holding up to 4 pages each "
        "need at least 8",
        lambda: DeepSeekV4SchedulerSim(ranks=2, decode_batch=2, max_seq_len=1024, num_blocks=small),
    )
    missing = {k: v for k, v in default.num_blocks.items() if k != "idx"}
    raises(
        ValueError, "missing cache groups: idx", lambda: DeepSeekV4SchedulerSim(num_blocks=missing)
    )
    # The least pools accepted run a long trace without running dry.
    least = {name: 2 * most for name, most in default.ids_per_request.items()}
    tight = DeepSeekV4SchedulerSim(
        ranks=2, decode_batch=2, max_seq_len=1024, num_blocks=least, seed=3, join_probability=1.0
    )
    for _ in range(300):
        tight.step()


def test_a_sparse_out_is_a_type_error_before_writing() -> None:
    """9ea27c1 raised NotImplementedError ("Cannot access storage of SparseTensorImpl")."""
    sparse = torch.zeros(1, 4, dtype=torch.int32).to_sparse()
    words = "must be a dense \\(strided\\) tensor, got layout torch.sparse_coo"
    raises(TypeError, "out " + words, lambda: ring_block_table([[1]], 4, out=sparse))
    raises(TypeError, "out " + words, lambda: paged_block_table([[1]], 4, out=sparse))
    raises(TypeError, "buffer " + words, lambda: BlockTable(1, 4, buffer=sparse))


def early_preparer(verify: bool = True) -> tuple[DeepSeekV4DecodePreparer, Any, DeepSeekV4Layout]:
    s = sim(ranks=2, decode_batch=1, seed=4)
    layout = DeepSeekV4Layout(ranks=2, decode_batch=1, num_blocks=s.num_blocks)
    return DeepSeekV4DecodePreparer(layout, verify=verify), s, layout


def test_restage_in_verify_mode_checks_the_contract_and_the_rebuild() -> None:
    """9ea27c1's restage skipped verify mode: a seq_len the held pages cannot cover passed."""
    preparer, s, layout = early_preparer()
    batch = s.step()
    preparer.prepare(batch, early=True)
    before = snapshot(preparer)
    grown = dataclasses.replace(batch, seq_lens=batch.seq_lens + 600)
    raises(
        ValueError,
        "DeepSeekV4 input contract: decode row 0 .* fewer than seq_len",
        lambda: preparer.restage(grown, buffer_slot=0),
    )
    unchanged(preparer, before)
    inputs = preparer.restage(batch, buffer_slot=0)  # the right step: verified, equal
    assert_equal(deepseek_v4_argument_values(inputs), reference(batch, layout))


def test_meta_tokens_are_a_type_error_in_prepare_and_restage() -> None:
    preparer, s, _ = early_preparer(verify=False)
    batch = s.step()
    preparer.prepare(batch, early=True)
    before = snapshot(preparer)
    meta = dataclasses.replace(
        batch, token_ids=torch.empty(batch.token_ids.shape, dtype=torch.int64, device="meta")
    )
    words = "decode token_ids is a meta tensor"
    raises(TypeError, words, lambda: preparer.restage(meta, buffer_slot=0))
    raises(TypeError, words, lambda: preparer.prepare(meta))
    unchanged(preparer, before)


@pytest.mark.parametrize("drafts", [None, "12"])
def test_speculative_batch_needs_draft_tokens(drafts: object) -> None:
    """9ea27c1: ``drafts=None`` a RuntimeError from torch ("Could not infer dtype")."""
    preparer, s, _ = early_preparer(verify=False)
    raises(
        TypeError,
        "draft_token_ids must be integer token ids",
        lambda: preparer.speculative_batch(s.step(), drafts),  # type: ignore[arg-type]
    )


def test_numpy_request_ids_and_partitions_are_taken_as_lists() -> None:
    """9ea27c1 took them once, then raised NumPy's "truth value ... is ambiguous"."""
    preparer, s, layout = early_preparer(verify=False)
    for _ in range(4):
        batch = s.step()
        given = dataclasses.replace(
            batch,
            request_ids=np.array(batch.request_ids),
            cache_partitions=np.array(batch.cache_partitions),
        )
        assert given.request_ids == list(batch.request_ids)
        inputs = preparer.prepare(given)
        assert_equal(deepseek_v4_argument_values(inputs), reference(batch, layout))
        preparer.prepare(given, early=True)
        preparer.restage(given, buffer_slot=0)
    qwen, upstream = QwenDecodePreparer(2, 64, 16), QwenDecodePrep97(2, 64, 16, 8)
    for step in range(3):
        batch = DecodeBatch(
            request_ids=np.array(["a", "b"]),
            token_ids=torch.tensor([1, 2]),
            hidden_states=None,
            seq_lens=torch.tensor([3 + step, 17 + step]),
            block_ids=[[1], [2, 5]],
        )
        inputs = qwen.prepare(batch)
        upstream.prepare(batch)
        assert torch.equal(inputs.slot_mapping, upstream.slot_mapping)
        assert torch.equal(inputs.block_table, upstream.block_table)
    with pytest.raises(TypeError, match="request_ids must be a list or a 1-D array"):
        DecodeBatch(
            request_ids=np.array([["a"]]),  # type: ignore[arg-type]
            token_ids=torch.tensor([1]),
            hidden_states=None,
            seq_lens=torch.tensor([3]),
        )


def test_qwen_refuses_block_ids_beside_block_deltas() -> None:
    """9ea27c1 silently took the deltas over disagreeing block_ids; DeepSeek raised."""
    preparer = QwenDecodePreparer(1, 64, 16)
    message = {"seq": 0, "base": None, "rows": {"a": [["w", [3]]]}}
    batch = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([1]),
        hidden_states=None,
        seq_lens=torch.tensor([5]),
        block_ids=[[9]],
        block_deltas=message,
    )
    before = {n: t.clone() for n, t in preparer.buffers().items()}
    raises(
        ValueError, "carries block_ids or block_deltas, not both", lambda: preparer.prepare(batch)
    )
    for name, tensor in preparer.buffers().items():
        assert torch.equal(tensor, before[name]), name
    preparer.prepare(dataclasses.replace(batch, block_ids=[]))  # the message alone
    assert preparer.buffers()["block_table"][0].item() == 3
