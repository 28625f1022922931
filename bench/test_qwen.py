"""Benchmarks: one Qwen3-14B decode step's input preparation, blockprep against upstream's.

Workload (the shape of upstream PR #97's isolated benchmark): B=16 requests decoding together,
sequence lengths around 3338, page size 128, max_seq_len 4096 (32-page block table rows). Each
step every request decodes one token; a request gets a new page every 128 tokens (appended to its
page list). Per step:

- ``pre-fix``: ``reference.QwenDecodePrepBefore``, upstream before PR #97 (fresh tensors, full
  row copies, token memset every step);
- ``fix``: ``reference.QwenDecodePrep97``, the PR #97 form (torch row views, per-row list cache);
- ``blockprep``: ``QwenDecodePreparer.prepare``.

Each round is one step of a precomputed trace. Before timing, the whole trace runs through all
three and their buffers are compared after every step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from blockprep import DecodeBatch
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.reference import QwenDecodePrep97, QwenDecodePrepBefore

BATCH, MAX_SEQ_LEN, PAGE_SIZE, PAD = 16, 4096, 128, 8
STEPS = 400
GROUP = f"qwen3-14b decode prepare: B={BATCH}, seq ~3338, page {PAGE_SIZE}"
BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


def trace(steps: int = STEPS) -> list[DecodeBatch]:
    rng = random.Random(3338)
    free = list(range(BATCH * MAX_SEQ_LEN // PAGE_SIZE))
    rng.shuffle(free)
    seq_lens = [3338 + rng.randrange(-200, 200) for _ in range(BATCH)]
    pages = [[free.pop() for _ in range(-(-s // PAGE_SIZE))] for s in seq_lens]
    batches = []
    for _ in range(steps + 1):
        batches.append(
            DecodeBatch(
                request_ids=[f"r{i}" for i in range(BATCH)],
                token_ids=torch.tensor([rng.randrange(151_000) for _ in range(BATCH)]),
                seq_lens=torch.tensor(seq_lens),
                block_ids=[list(row) for row in pages],
            )
        )
        for i in range(BATCH):
            seq_lens[i] += 1
            if (seq_lens[i] - 1) // PAGE_SIZE >= len(pages[i]):
                pages[i].append(free.pop())
    return batches


TRACE = trace()
IMPLEMENTATIONS: dict[str, Callable[[], Any]] = {
    "pre-fix": lambda: QwenDecodePrepBefore(BATCH, MAX_SEQ_LEN, PAGE_SIZE, PAD),
    "fix": lambda: QwenDecodePrep97(BATCH, MAX_SEQ_LEN, PAGE_SIZE, PAD),
    "blockprep": lambda: QwenDecodePreparer(BATCH, MAX_SEQ_LEN, PAGE_SIZE, PAD),
}


def buffers(impl: Any, inputs: Any) -> list[torch.Tensor]:
    source = impl if inputs is None else inputs
    return [getattr(source, name) for name in BUFFERS]


def test_trace_is_checked_step_by_step() -> None:
    """Not a benchmark: all three constructions hold the same buffers after every step."""
    impls = {name: make() for name, make in IMPLEMENTATIONS.items()}
    for batch in TRACE:
        results = {name: buffers(impl, impl.prepare(batch)) for name, impl in impls.items()}
        for name in ("pre-fix", "fix"):
            assert all(map(torch.equal, results[name], results["blockprep"])), name


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_decode_prepare_step(benchmark: Any, impl: str) -> None:
    benchmark.group = GROUP
    benchmark.extra_info["impl"] = impl
    preparer = IMPLEMENTATIONS[impl]()
    preparer.prepare(TRACE[0])
    steps = iter(TRACE[1:])
    benchmark.pedantic(
        preparer.prepare, setup=lambda: ((next(steps),), {}), rounds=STEPS, warmup_rounds=0
    )
    reference = QwenDecodePrepBefore(BATCH, MAX_SEQ_LEN, PAGE_SIZE, PAD)
    reference.prepare(TRACE[-1])
    last = preparer.prepare(TRACE[-1])
    assert all(map(torch.equal, buffers(preparer, last), buffers(reference, None)))
