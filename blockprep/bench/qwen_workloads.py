"""Qwen3 decode preparation fed the way upstream's worker receives a batch: through a pickle round
trip (new lists of new ints every step), with churn; blockprep gets block-list deltas
(:mod:`blockprep.wire`, encoded on the scheduler side, untimed), upstream's constructions the full
lists, each construction unpickling only its own (untimed, in its ``receive``). Also a port of
vLLM V1's per-step host lines for the same job, for comparison at 256 requests
(:class:`VllmHostLines`; not one of the runner's constructions, its tables keep stale tails)."""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.bench.vllm_port import PortBlockTable
from blockprep.bench.workloads import (
    QWEN_MAX_SEQ_LEN,
    QWEN_PAD,
    QWEN_PAGE_SIZE,
    Stepper,
    Workload,
)
from blockprep.wire import BlockDeltaEncoder

QWEN_WIRE_CHURN = 0.005
"""Chance that a request finishes in a step (a new one takes its row)."""

_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class QwenWireStep(NamedTuple):
    """One step as each side receives it, each pickled on its own: full lists (upstream) and
    deltas (blockprep) as a :class:`DecodeBatch`, and what vLLM's scheduler output would carry
    (a dict: finished, new and each request's new pages)."""

    by_value: bytes
    deltas: bytes
    vllm: bytes


def qwen_wire_trace(batch: int, steps: int, seed: int) -> Iterator[QwenWireStep]:
    """``steps + 1`` steps of ``batch`` requests around sequence length 3338 (page 128), a page
    appended every 128 tokens, each request finishing with chance ``QWEN_WIRE_CHURN`` a step and
    a new one (a prompt of 1000-3800 tokens) taking its row; each step's three forms pickled
    (a consumer unpickles the one it takes, untimed)."""
    rng = random.Random(seed)
    free = list(range(batch * 2 * QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE))
    rng.shuffle(free)
    counter = 0

    def new_request(seq_len: int) -> list[Any]:
        nonlocal counter
        counter += 1
        return [f"req-{counter}", seq_len, [free.pop() for _ in range(-(-seq_len // 128))]]

    requests = [new_request(3338 + rng.randrange(-200, 200)) for _ in range(batch)]
    encoder = BlockDeltaEncoder()
    known: dict[str, int] = {}  # vLLM: pages the worker has been sent, per request
    for _ in range(steps + 1):
        ids = [r[0] for r in requests]
        seq_lens = [r[1] for r in requests]
        pages = [r[2] for r in requests]
        tokens = [rng.randrange(151_000) for _ in requests]
        new = {r[0]: list(r[2]) for r in requests if r[0] not in known}
        appended = {r[0]: r[2][known[r[0]] :] for r in requests if r[0] in known}
        vllm = {
            "finished": [rid for rid in known if rid not in set(ids)],
            "new": new,
            "new_blocks": {rid: ids_ for rid, ids_ in appended.items() if ids_},
            "order": ids,
            "num_scheduled_tokens": dict.fromkeys(ids, 1),
            "seq_lens": seq_lens,
            "tokens": tokens,
        }
        known = {r[0]: len(r[2]) for r in requests}
        full = DecodeBatch(
            request_ids=ids,
            token_ids=torch.tensor(tokens),
            hidden_states=None,
            seq_lens=torch.tensor(seq_lens),
            block_ids=pages,
        )
        delta = DecodeBatch(
            request_ids=ids,
            token_ids=torch.tensor(tokens),
            hidden_states=None,
            seq_lens=torch.tensor(seq_lens),
            block_deltas=encoder.encode(ids, pages),
        )
        yield QwenWireStep(pickle.dumps(full), pickle.dumps(delta), pickle.dumps(vllm))
        for i, request in enumerate(requests):
            if rng.random() < QWEN_WIRE_CHURN or request[1] >= QWEN_MAX_SEQ_LEN:
                free.extend(request[2])
                requests[i] = request = new_request(rng.randrange(1000, 3800))
            else:
                request[1] += 1
                if (request[1] - 1) // QWEN_PAGE_SIZE >= len(request[2]):
                    request[2].append(free.pop())


class _ReferenceStepper(Stepper):
    def __init__(self, prep: reference.QwenDecodeBuffers, batch: int) -> None:
        self.prep, self._batch, self._steps = prep, batch, 0

    def receive(self, item: QwenWireStep) -> DecodeBatch:
        batch: DecodeBatch = pickle.loads(item.by_value)
        return batch

    def step(self, item: DecodeBatch) -> None:
        self.prep.prepare(item)  # type: ignore[attr-defined]
        self._steps += 1

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self.prep, name).numpy() for name in _BUFFERS}

    def written(self) -> tuple[int, int] | None:
        width = -(-QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE)
        return self._batch * self._steps, self._batch * width * self._steps


class _DeltaStepper(Stepper):
    def __init__(self, batch: int, by_value: bool = False) -> None:
        self.preparer = QwenDecodePreparer(batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
        self._by_value = by_value

    def receive(self, item: QwenWireStep) -> DecodeBatch:
        batch: DecodeBatch = pickle.loads(item.by_value if self._by_value else item.deltas)
        return batch

    def step(self, item: DecodeBatch) -> None:
        self._last = self.preparer.prepare(item)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self._last, name).numpy() for name in _BUFFERS}

    def written(self) -> tuple[int, int] | None:
        stats = self.preparer.block_table.stats
        return stats.misses, stats.cells_written


def qwen_wire_workload(batch: int, *, by_value: bool = False) -> Workload:
    """Upstream's constructions on full lists, blockprep on deltas (``by_value``: full lists)."""
    args = (batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
    width = -(-QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE)
    form = "full lists" if by_value else "deltas"
    return Workload(
        f"qwen3-14b-wire-b{batch}{'-by-value' if by_value else ''}",
        f"Qwen3-14B decode prepare: B={batch}, seq ~3338, page {QWEN_PAGE_SIZE}, pickle round "
        f"trip, {QWEN_WIRE_CHURN:.1%} churn a request and step, blockprep fed {form}",
        lambda steps, seed: qwen_wire_trace(batch, steps, seed),
        {
            "pre-fix": lambda: _ReferenceStepper(reference.QwenDecodePrepBefore(*args), batch),
            "fix": lambda: _ReferenceStepper(reference.QwenDecodePrep97(*args), batch),
            "blockprep": lambda: _DeltaStepper(batch, by_value),
        },
        batch,
        batch * width,
    )


def qwen_wire_workloads() -> list[Workload]:
    """The Qwen wire workloads: B=16 and 256 on deltas, 256 on full lists."""
    return [qwen_wire_workload(16), qwen_wire_workload(256), qwen_wire_workload(256, by_value=True)]


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
