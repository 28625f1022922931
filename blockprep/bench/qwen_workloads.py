"""The Qwen3-14B benchmark workloads: B=16 on live lists (upstream PR #97's benchmark shape), and
decode preparation fed the way upstream's worker receives a batch: through a pickle round
trip (new lists of new ints every step), with churn; blockprep gets block-list deltas
(:mod:`blockprep.wire`, encoded on the scheduler side, untimed), upstream's constructions the full
lists, each construction unpickling only its own (untimed, in its ``receive``)."""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.bench.base import FullRewrite, Stepper, Workload
from blockprep.wire import BlockDeltaEncoder

QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD = 16, 4096, 128, 8
QWEN_WIDTH = -(-QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE)


def qwen_trace(steps: int, seed: int) -> Iterator[DecodeBatch]:
    """B=16 requests around sequence length 3338 decoding together, a page appended to a
    request's live list every 128 tokens (upstream PR #97's benchmark shape)."""
    rng = random.Random(seed)
    free = list(range(QWEN_BATCH * QWEN_MAX_SEQ_LEN // QWEN_PAGE_SIZE))
    rng.shuffle(free)
    seq_lens = [3338 + rng.randrange(-200, 200) for _ in range(QWEN_BATCH)]
    pages = [[free.pop() for _ in range(-(-s // QWEN_PAGE_SIZE))] for s in seq_lens]
    request_ids = [f"r{i}" for i in range(QWEN_BATCH)]
    for _ in range(steps + 1):
        yield DecodeBatch(
            request_ids=request_ids,
            token_ids=torch.tensor([rng.randrange(151_000) for _ in range(QWEN_BATCH)]),
            hidden_states=None,
            seq_lens=torch.tensor(seq_lens),
            block_ids=pages,
        )
        for i in range(QWEN_BATCH):
            seq_lens[i] += 1
            if (seq_lens[i] - 1) // QWEN_PAGE_SIZE >= len(pages[i]):
                pages[i].append(free.pop())


_QWEN_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class _QwenReferenceStepper(FullRewrite):
    def __init__(self, prep: reference.QwenDecodeBuffers) -> None:
        super().__init__(QWEN_BATCH, QWEN_BATCH * QWEN_WIDTH)
        self.prep = prep

    def _prepare(self, item: Any) -> None:
        self.prep.prepare(item)  # type: ignore[attr-defined]

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self.prep, name).numpy() for name in _QWEN_BUFFERS}


class _QwenStepper(Stepper):
    def __init__(self) -> None:
        self.preparer = QwenDecodePreparer(QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)

    def step(self, item: Any) -> None:
        self._last = self.preparer.prepare(item)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self._last, name).numpy() for name in _QWEN_BUFFERS}

    def written(self) -> tuple[int, int] | None:
        stats = self.preparer.block_table.stats
        return stats.misses, stats.cells_written


def qwen_workload() -> Workload:
    args = (QWEN_BATCH, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
    return Workload(
        "qwen3-14b",
        f"Qwen3-14B decode prepare: B={QWEN_BATCH}, seq ~3338, page {QWEN_PAGE_SIZE}, live lists",
        qwen_trace,
        {
            "pre-fix": lambda: _QwenReferenceStepper(reference.QwenDecodePrepBefore(*args)),
            "fix": lambda: _QwenReferenceStepper(reference.QwenDecodePrep97(*args)),
            "blockprep": _QwenStepper,
        },
        QWEN_BATCH,
        QWEN_BATCH * QWEN_WIDTH,
    )


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
