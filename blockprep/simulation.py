"""A DeepSeek V4 KV cache manager simulation (:class:`DeepSeekV4SchedulerSim`, seed-semantics 4.3):
one :class:`~blockprep.batch.DecodeBatch` per step, for traces, tests and the benchmarks.

Needs only blockprep's own dependencies (no ``hypothesis``): the bench command imports it on an
install with only the ``bench`` extra. :mod:`blockprep.testing` re-exports it.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from blockprep._ids import as_int
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepRuntimeError, BlockprepTypeError, BlockprepValueError

if TYPE_CHECKING:
    from blockprep.events import BlockEventRecorder

DEEPSEEK_V4_CACHE_GROUPS: tuple[tuple[str, int, int | None], ...] = (
    ("ori", 128, 4),
    ("cmp_c128", 128, None),
    ("cmp_c4", 128, None),
    ("idx", 128, None),
    ("hca_state", 8, 48),
    ("csa_state", 4, 65),
    ("csa_inner_state", 4, 65),
)
"""DeepSeek V4's cache groups as the scheduler sees them: (name, tokens per block, ring length,
or ``None`` for a full-history group), in canonical order."""


@dataclass
class _SimRequest:
    request_id: str
    rank: int
    seq_len: int
    target_len: int
    token: int
    prev_token: int
    blocks: dict[str, list[int]]
    logical: dict[str, int]


def _checked_pools(
    num_blocks: object, decode_batch: int, ids_per_request: dict[str, int]
) -> dict[str, int]:
    """``num_blocks`` as pages per group, each pool large enough for ``decode_batch`` requests
    holding their most pages at once (``ValueError`` up front, not an ``IndexError`` steps
    later when a queue runs dry)."""
    if not isinstance(num_blocks, Mapping):
        raise BlockprepTypeError(
            f"num_blocks must map group names to pages, got {type(num_blocks).__name__}"
        )
    missing = [name for name in ids_per_request if name not in num_blocks]
    if missing:
        raise BlockprepValueError(f"num_blocks is missing cache groups: {', '.join(missing)}")
    pools = {}
    for name, most in ids_per_request.items():
        count = as_int(num_blocks[name], f"num_blocks[{name!r}]")
        if count < decode_batch * most:
            raise BlockprepValueError(
                f"num_blocks[{name!r}]={count} is too small: {decode_batch} requests per rank "
                f"holding up to {most} pages each need at least {decode_batch * most}"
            )
        pools[name] = count
    return pools


class DeepSeekV4SchedulerSim:
    """A DeepSeek V4 KV cache manager and request mix that yields one :class:`DecodeBatch` per step.

    Per rank and group a FIFO free queue of physical pages ``[0, num_blocks[group])``. Each step
    every request decodes ``1..max_advance`` more tokens (its ``seq_len`` counts them, the current
    one included) and its pages follow upstream's ``ensure_group_blocks``: a full-history group
    appends a page each time the tokens cross a 128-token block; a ring group appends a page per
    block until it holds its ring length (ori 4, hca_state 48, csa_state and csa_inner_state 65),
    then each new block ``b`` releases slot ``b % n``'s page to the queue and takes the queue's
    next one. Requests leave at their target length (or at random, ``leave_probability``), and
    each rank below ``decode_batch`` requests takes a new one with ``join_probability`` per step,
    so ranks run from empty to full; a step never has no request at all.

    Args:
        ranks, decode_batch, max_seq_len: the deployment's shape.
        seed: drives every random choice (the trace is a function of the arguments).
        num_blocks: pages per rank and group; default ``decode_batch * (ids per request + 4)``;
            at least ``decode_batch * ids per request`` (``ValueError`` otherwise).
        prompt_lengths: inclusive range of a new request's prompt tokens (its first decode step
            has ``seq_len = prompt + 1``); target lengths are drawn up to ``max_seq_len``.
        max_advance: tokens a request advances per step, drawn in ``1..max_advance`` (2 for MTP).
        shuffle: reorder the batch at random each step (requests change local rows).
        hidden_size: also produce ``hidden_states`` and ``prev_hidden_states`` (rows of a fixed
            random float32 embedding table of ``vocab`` tokens).
        fresh_lists: give each batch its own copies of the id lists; by default a batch holds the
            manager's live lists, which later steps mutate in place, as upstream's manager does.
        recorder: a grouped :class:`~blockprep.events.BlockEventRecorder` (groups in
            ``DEEPSEEK_V4_CACHE_GROUPS`` order) the KV manager tells what it does: ``start`` when
            a request joins (its lists whole), ``append`` for each page a full-history group (or
            a ring group still filling) takes, ``set`` for each ring slot rotated, ``finish``
            when a request leaves. The caller makes each step's message with
            ``recorder.message(batch.request_ids)``. It changes nothing else (the same batches).
    """

    def __init__(
        self,
        *,
        ranks: int = 8,
        decode_batch: int = 8,
        max_seq_len: int = 16384,
        seed: int = 0,
        num_blocks: dict[str, int] | None = None,
        join_probability: float = 0.3,
        leave_probability: float = 0.005,
        prompt_lengths: tuple[int, int] = (1, 4096),
        max_advance: int = 1,
        shuffle: bool = False,
        hidden_size: int | None = None,
        vocab: int = 1000,
        fresh_lists: bool = False,
        recorder: BlockEventRecorder | None = None,
    ) -> None:
        self.ranks = ranks
        self.decode_batch = decode_batch
        self.max_seq_len = max_seq_len
        self.join_probability = join_probability
        self.leave_probability = leave_probability
        self.prompt_lengths = prompt_lengths
        self.max_advance = max_advance
        self.shuffle = shuffle
        self.fresh_lists = fresh_lists
        self.vocab = vocab
        self.recorder = recorder
        self._rng = random.Random(seed)
        full_history = math.ceil(max_seq_len / 128)
        self.ids_per_request = {
            name: full_history if ring is None else ring
            for name, _, ring in DEEPSEEK_V4_CACHE_GROUPS
        }
        if num_blocks is None:
            num_blocks = {
                name: decode_batch * (count + 4) for name, count in self.ids_per_request.items()
            }
        self.num_blocks = _checked_pools(num_blocks, decode_batch, self.ids_per_request)
        self._free: list[dict[str, collections.deque[int]]] = []
        for _ in range(ranks):
            queues = {}
            for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS:
                pages = list(range(self.num_blocks[name]))
                self._rng.shuffle(pages)
                queues[name] = collections.deque(pages)
            self._free.append(queues)
        self._requests: list[_SimRequest] = []
        self._next_id = 0
        self._embedding = (
            None
            if hidden_size is None
            else torch.randn((vocab, hidden_size), generator=torch.Generator().manual_seed(seed))
        )

    def counts(self) -> list[int]:
        """Requests per rank now."""
        counts = [0] * self.ranks
        for request in self._requests:
            counts[request.rank] += 1
        return counts

    def step(self) -> DecodeBatch:
        """Advance every request, let requests leave and join, and return the step's batch."""
        rng = self._rng
        staying = []
        for request in self._requests:
            advance = rng.randint(1, self.max_advance)
            done = request.seq_len + advance > request.target_len
            if done or rng.random() < self.leave_probability:
                self._release(request)
                continue
            request.seq_len += advance
            request.prev_token = request.token if advance == 1 else rng.randrange(self.vocab)
            request.token = rng.randrange(self.vocab)
            self._ensure_blocks(request)
            staying.append(request)
        self._requests = staying
        counts = self.counts()
        for rank in range(self.ranks):
            while counts[rank] < self.decode_batch and rng.random() < self.join_probability:
                self._join(rank)
                counts[rank] += 1
        if not self._requests:
            self._join(rng.randrange(self.ranks))
        order = list(self._requests)
        if self.shuffle:
            rng.shuffle(order)
        return self._batch(order)

    def trace(self, steps: int) -> Iterator[DecodeBatch]:
        """``steps`` consecutive batches."""
        for _ in range(steps):
            yield self.step()

    def _join(self, rank: int) -> None:
        rng = self._rng
        low, high = self.prompt_lengths
        seq_len = min(rng.randint(low, high) + 1, self.max_seq_len - 1)
        seq_len = max(seq_len, 2)
        request = _SimRequest(
            request_id=f"req-{self._next_id}",
            rank=rank,
            seq_len=seq_len,
            target_len=rng.randint(seq_len, self.max_seq_len),
            token=rng.randrange(self.vocab),
            prev_token=rng.randrange(self.vocab),
            blocks={name: [] for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS},
            logical={name: 0 for name, _, _ in DEEPSEEK_V4_CACHE_GROUPS},
        )
        self._next_id += 1
        self._ensure_blocks(request, record=False)
        if self.recorder is not None:
            self.recorder.start(request.request_id, request.blocks)
        self._requests.append(request)

    def _ensure_blocks(self, request: _SimRequest, *, record: bool = True) -> None:
        """Upstream's ``ensure_group_blocks`` for ``request.seq_len`` tokens (see the class);
        each page taken told to the recorder (``record``: the request has started)."""
        free = self._free[request.rank]
        recorder = self.recorder if record else None
        for name, block_tokens, ring in DEEPSEEK_V4_CACHE_GROUPS:
            ids, queue = request.blocks[name], free[name]
            needed = math.ceil(request.seq_len / block_tokens)
            while request.logical[name] < needed:
                block = request.logical[name]
                if ring is None or block < ring:
                    if ring is None and block >= self.ids_per_request[name]:
                        raise BlockprepRuntimeError(
                            "Full-history KV cache table capacity exceeded "
                            f"({name}: {block + 1} > {self.ids_per_request[name]})"
                        )
                    ids.append(queue.popleft())
                    if recorder is not None:
                        recorder.append(request.request_id, ids[-1], name)
                else:
                    slot = block % ring
                    queue.append(ids[slot])
                    ids[slot] = queue.popleft()
                    if recorder is not None:
                        recorder.set(request.request_id, slot, ids[slot], name)
                request.logical[name] = block + 1

    def _release(self, request: _SimRequest) -> None:
        free = self._free[request.rank]
        for name, ids in request.blocks.items():
            free[name].extend(ids)
            ids.clear()
        if self.recorder is not None:
            self.recorder.finish(request.request_id)

    def _batch(self, order: list[_SimRequest]) -> DecodeBatch:
        tokens = torch.tensor([r.token for r in order], dtype=torch.int64)
        previous = torch.tensor([r.prev_token for r in order], dtype=torch.int64)
        groups = [
            {name: list(ids) for name, ids in r.blocks.items()} if self.fresh_lists else r.blocks
            for r in order
        ]
        embedding = self._embedding
        return DecodeBatch(
            request_ids=[r.request_id for r in order],
            token_ids=tokens,
            seq_lens=torch.tensor([r.seq_len for r in order], dtype=torch.int64),
            hidden_states=None if embedding is None else embedding[tokens],
            block_ids_by_group=groups,
            cache_partitions=[r.rank for r in order],
            prev_token_ids=previous,
            prev_hidden_states=None if embedding is None else embedding[previous],
        )
