"""A port of vLLM V1's per-step host lines for Qwen3 decode input preparation, timed against
blockprep's Qwen preparer on the bench's Qwen wire trace (repository-only experiment):

    python -c "from bench.qwen_vllm_lines import compare_with_vllm as c; print(c(256, 300))"

Not one of ``blockprep bench``'s constructions: vLLM's tables keep stale tails.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.vllm_port import PortBlockTable
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.bench.qwen_workloads import (
    QWEN_MAX_SEQ_LEN,
    QWEN_PAD,
    QWEN_PAGE_SIZE,
    QwenWireStep,
    qwen_wire_trace,
)


class _VllmRequest:
    """vLLM's ``CachedRequestState``, the fields the decode host lines touch."""

    def __init__(self, num_computed: int, block_ids: list[int], output: list[int]) -> None:
        self.num_computed_tokens = num_computed
        self.block_ids = block_ids
        self.output_token_ids = output


class VllmHostLines:
    """A port of vLLM V1's per-step host lines for decode input preparation (one token per
    request; ``vllm/v1/worker/gpu_model_runner.py`` ``_update_states`` and ``_prepare_inputs``,
    ``vllm/v1/worker/block_table.py``, ``gpu_input_batch.py``), CPU side only: the persistent
    batch (request index by id, removal into holes that new requests fill), block-table
    ``add_row``/``append_row``, the sampled token written into ``token_ids_cpu``, positions
    and seq_lens from ``num_computed_tokens``, token ids by ``torch.index_select``, and the slot
    mapping by one gather from the table. The device copies are left out."""

    def __init__(self, max_reqs: int, max_model_len: int, block_size: int) -> None:
        self.max_reqs, self.max_model_len, self.block_size = max_reqs, max_model_len, block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.table = PortBlockTable(block_size, max_reqs, self.max_blocks, max_reqs)
        self.token_ids_cpu_tensor = torch.zeros((max_reqs, max_model_len), dtype=torch.int32)
        self.token_ids_cpu = self.token_ids_cpu_tensor.numpy()
        self.num_computed_tokens_cpu = np.zeros(max_reqs, dtype=np.int32)
        self.req_id_to_index: dict[str, int] = {}
        self.req_ids: list[str | None] = [None] * max_reqs
        self.arange_np = np.arange(max(max_reqs + 1, max_model_len), dtype=np.int64)
        self.input_ids = torch.zeros(max_reqs, dtype=torch.int32)
        self.positions_np = np.zeros(max_reqs, dtype=np.int64)
        self.query_start_loc_np = np.zeros(max_reqs + 1, dtype=np.int32)
        self.seq_lens_np = np.zeros(max_reqs, dtype=np.int32)
        self.slot_mapping_np = self.table.slot_mapping.np
        self.num_reqs = 0
        self.requests: dict[str, _VllmRequest] = {}

    def step(self, out: dict[str, Any]) -> None:
        # _update_states: finished requests leave holes; new ones fill them.
        holes = []
        for req_id in out["finished"]:
            del self.requests[req_id]
            index = self.req_id_to_index.pop(req_id)
            self.req_ids[index] = None
            holes.append(index)
        holes.sort(reverse=True)
        seq_lens = out["seq_lens"]
        order = out["order"]
        tokens = out["tokens"]
        for i, req_id in enumerate(order):
            num_computed = seq_lens[i] - 1
            req_index = self.req_id_to_index.get(req_id)
            if req_index is None:  # add_request
                block_ids = out["new"][req_id]
                self.requests[req_id] = _VllmRequest(num_computed, list(block_ids), [])
                req_index = holes.pop() if holes else self.num_reqs
                self.num_reqs = max(self.num_reqs, req_index + 1)
                self.req_id_to_index[req_id] = req_index
                self.req_ids[req_index] = req_id
                self.table.add_row(block_ids, req_index)
            else:  # a scheduled cached request
                req_state = self.requests[req_id]
                req_state.num_computed_tokens = num_computed
                new_block_ids = out["new_blocks"].get(req_id)
                if new_block_ids is not None:
                    req_state.block_ids.extend(new_block_ids)
                    self.table.append_row(new_block_ids, req_index)
            self.num_computed_tokens_cpu[req_index] = num_computed
            # The token this step decodes (the last sampled one), as _bookkeeping_sync writes
            # it: token_ids_cpu[req_idx, start:end] = sampled_ids, output_token_ids extended.
            self.token_ids_cpu[req_index, num_computed : num_computed + 1] = tokens[i : i + 1]
            self.requests[req_id].output_token_ids.append(tokens[i])
        # _prepare_inputs, one token per request.
        num_reqs = self.num_reqs
        scheduled = out["num_scheduled_tokens"]
        num_scheduled_tokens = np.array(
            [scheduled[req_id] for req_id in self.req_ids[:num_reqs]], dtype=np.int32
        )
        total = int(num_scheduled_tokens.sum())
        req_indices = np.repeat(self.arange_np[:num_reqs], num_scheduled_tokens)
        cu_num_tokens = np.cumsum(num_scheduled_tokens)
        cumsums_offsets = np.repeat(cu_num_tokens - num_scheduled_tokens, num_scheduled_tokens)
        arange = self.arange_np[:total] - cumsums_offsets
        positions_np = self.positions_np[:total]
        np.add(self.num_computed_tokens_cpu[req_indices], arange, out=positions_np)
        token_indices = positions_np + req_indices * self.max_model_len
        torch.index_select(
            self.token_ids_cpu_tensor.flatten(),
            0,
            torch.from_numpy(token_indices),
            out=self.input_ids[:total],
        )
        self.table.compute_slot_mapping(req_indices, positions_np)  # the NumPy form
        self.query_start_loc_np[0] = 0
        self.query_start_loc_np[1 : num_reqs + 1] = cu_num_tokens
        self.query_start_loc_np[num_reqs + 1 :].fill(cu_num_tokens[-1])
        self.seq_lens_np[:num_reqs] = self.num_computed_tokens_cpu[:num_reqs] + num_scheduled_tokens
        self.seq_lens_np[num_reqs:].fill(0)


def compare_with_vllm(batch: int, steps: int, seed: int = 0) -> dict[str, float]:
    """Median microseconds a step of blockprep's Qwen preparer (deltas, and full lists) and of
    :class:`VllmHostLines` on :func:`qwen_wire_trace`, interleaved step by step on one torch
    thread with the garbage collector off, each unpickling its own form of a step just before
    it (untimed); their seq_lens, slots and tokens are compared on every step."""
    import gc
    import time

    trace = list(qwen_wire_trace(batch, steps, seed))
    deltas = QwenDecodePreparer(batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
    by_value = QwenDecodePreparer(batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
    vllm = VllmHostLines(batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE)
    lanes: dict[str, tuple[Callable[[QwenWireStep], bytes], Callable[[Any], object]]] = {
        "blockprep deltas": (lambda item: item.deltas, deltas.prepare),
        "blockprep full lists": (lambda item: item.by_value, by_value.prepare),
        "vllm host lines": (lambda item: item.vllm, vllm.step),
    }
    for form, run in lanes.values():
        run(pickle.loads(form(trace[0])))
    times: dict[str, list[int]] = {name: [] for name in lanes}
    threads, was_enabled = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(1)
    gc.disable()
    try:
        for index, item in enumerate(trace[1:]):
            names = list(lanes)
            names = names[index % 3 :] + names[: index % 3]
            for name in names:
                form, run = lanes[name]
                received = pickle.loads(form(item))  # off the wire: untimed
                start = time.perf_counter_ns()
                run(received)
                times[name].append(time.perf_counter_ns() - start)
            inputs = deltas._inputs(batch)
            if not (
                np.array_equal(inputs.seq_lens.numpy(), vllm.seq_lens_np[:batch])
                and np.array_equal(inputs.slot_mapping.numpy(), vllm.slot_mapping_np[:batch])
                and np.array_equal(inputs.token_ids.numpy()[:, 0], vllm.input_ids.numpy())
            ):
                raise AssertionError(f"vLLM port and blockprep differ at step {index + 1}")
    finally:
        torch.set_num_threads(threads)
        if was_enabled:
            gc.enable()
    return {name: float(np.median(t)) / 1000 for name, t in times.items()}
