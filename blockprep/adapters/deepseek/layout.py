"""DeepSeek V4's decode layout: the 7 cache groups, their widths and ring lengths, scratch pages.

Upstream's constants and messages (seed-semantics 4), importable without anything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from blockprep._ids import INT32_MAX, as_int
from blockprep.errors import BlockprepRuntimeError, BlockprepTypeError, BlockprepValueError

GROUP_NAMES = (
    "ori",
    "cmp_c128",
    "cmp_c4",
    "idx",
    "hca_state",
    "csa_state",
    "csa_inner_state",
)
"""The 7 cache groups in upstream's canonical order (``block_counts`` column order)."""

INPUT_FIELDS = (
    "block_counts",
    "input_ids",
    "position_ids",
    "kv_seq_lens",
    "num_tokens_per_owner",
    "logit_row_indices",
)
"""A slot's buffers besides the 7 tables, by their names in :class:`DeepSeekV4DecodeInputs` and
:func:`blockprep.reference.deepseek_v4_decode_rebuild`."""

SOURCE_BLOCK_TOKENS = 128
"""Tokens per block of the ``ori``, ``cmp_*`` and ``idx`` groups (upstream ``BLOCK_SIZE``)."""
COMPILED_SOURCE_BLOCKS = 128
"""Width of the ``ori``, ``cmp_*`` and ``idx`` tables: source-token blocks a request may hold."""
SLIDING_WINDOW = 128
HCA_STATE_BLOCK_TOKENS = 8
CSA_STATE_BLOCK_TOKENS = 4
CSA_COMPRESS_RATIO = 4

UNBOUND: Final = "unbound"
"""``num_blocks=UNBOUND``: a layout whose pool sizes are bound later (:meth:`DeepSeekV4Layout.
with_num_blocks`, :meth:`~blockprep.adapters.deepseek.DeepSeekV4DecodePreparer.bind_num_blocks`),
as upstream allocates its decode buffers before it learns the KV pool sizes."""

COMPILED_LIMITS: Final = MappingProxyType(
    {
        "ori": 128,
        "cmp_c128": 128,
        "cmp_c4": 128,
        "idx": 128,
        "hca_state": 64,
        "csa_state": 65,
        "csa_inner_state": 65,
    }
)
"""Per group, the most blocks one request may address in the compiled kernel (upstream's
``*_MAX_BLOCKS``): a ring's length may not pass it, and it must exceed ``decode_batch``
(upstream's "needs more than {decode_batch} physical blocks"). It bounds a request's table, not
the physical pool: a pool may hold any number of blocks."""

DECODE_TOKENS = 8
"""Token rows per rank without MTP (upstream ``DEEPSEEK_V4_DECODE_TOKENS``)."""
MTP_DECODE_TOKENS = 16
"""Token rows per rank with MTP (upstream ``DEEPSEEK_V4_MTP_DECODE_TOKENS``)."""


@dataclass(frozen=True)
class DeepSeekV4CacheGroup:
    """One KV cache group of a layout.

    ``kind``: ``"ring"`` (``ids[j % n]`` in every column) or ``"paged"`` (full history: ids, then
    0). ``width``: decode table columns. ``block_tokens``: tokens per scheduler block.
    ``ids_per_request``: the most ids a request holds (a ring's length). ``num_blocks``: the
    scheduler-visible physical blocks per rank; padding rows use the scratch pages
    ``num_blocks + k``; ``None`` in a layout whose pool sizes are not bound yet.
    """

    name: str
    kind: Literal["ring", "paged"]
    width: int
    block_tokens: int
    ids_per_request: int
    num_blocks: int | None


class DeepSeekV4Layout:
    """The decode shapes of a DeepSeek V4 deployment (upstream ``DeepSeekV4CacheLayout``).

    Args:
        ranks: DP ranks (one cache partition each).
        decode_batch: kernel rows per rank (``b``).
        decode_seq: token slots per row (``S``; 2 for MTP verification).
        max_seq_len: longest sequence, at most 16384 (128 source blocks of 128 tokens).
        num_blocks: group name -> scheduler-visible physical blocks per rank, every group named,
            each positive and of any size (upstream's rule: a request's ids lie in ``[0,
            num_blocks)``; a rank's padding row ``k`` takes the scratch page ``num_blocks + k``,
            ``0 <= k < decode_batch``): upstream's ``_cache_group_num_blocks``, which may be one
            maximum-length request's worth. Default: enough for ``decode_batch`` requests of
            ``ids_per_request`` ids each.
            :data:`UNBOUND` (``"unbound"``): not known yet (upstream learns them after the
            buffers exist); bind them with :meth:`with_num_blocks` or the preparer's
            ``bind_num_blocks``. An unbound layout has every shape, but no pool sizes.
        max_in_flight_prefill_tokens: prefill tokens a ring must cover besides its window (256);
            it sets the ring lengths: ori 4, hca_state 48, csa_state and csa_inner_state 65.

    ``decode_tokens = decode_batch * decode_seq`` (``T``). Tables are 128 wide, except hca_state
    2048 and the two csa tables 4096.

    Raises:
        ValueError: upstream's messages (seed-semantics 4.1): ``"decode_batch must be
            positive"``, ``"max_seq_len must be positive"``, ``"DeepSeekV4 max_seq_len={m} needs
            {n} source-token blocks, but the compiled block tables support 128"``, ``"DeepSeekV4
            {name} cache needs {required} blocks per request to cover ..."``, ``"DeepSeekV4 {name}
            cache needs more than {decode_batch} physical blocks"`` (a group's compiled limit,
            :data:`COMPILED_LIMITS`, not above ``decode_batch``: upstream's check, whatever the
            pool size), ``"unknown DeepSeekV4 cache group: {name}"``; and for ``ranks``,
            ``decode_seq``, a missing group, a pool below 1 or one whose scratch pages would pass
            ``2**31 - 1``.
        TypeError: a non-integer argument.
    """

    __slots__ = ("_groups", "_prefill", "decode_batch", "decode_seq", "max_seq_len", "ranks")

    def __init__(
        self,
        ranks: int = 8,
        decode_batch: int = 8,
        decode_seq: int = 1,
        max_seq_len: int = 16384,
        num_blocks: Mapping[str, int] | Literal["unbound"] | None = None,
        *,
        max_in_flight_prefill_tokens: int = 256,
    ) -> None:
        ranks = as_int(ranks, "ranks")
        decode_batch = as_int(decode_batch, "decode_batch")
        decode_seq = as_int(decode_seq, "decode_seq")
        max_seq_len = as_int(max_seq_len, "max_seq_len")
        prefill = as_int(max_in_flight_prefill_tokens, "max_in_flight_prefill_tokens")
        if ranks <= 0:
            raise BlockprepValueError(f"ranks must be positive, got {ranks}")
        if decode_batch <= 0:
            raise BlockprepValueError("decode_batch must be positive")
        if decode_seq <= 0:
            raise BlockprepValueError(f"decode_seq must be positive, got {decode_seq}")
        if max_seq_len <= 0:
            raise BlockprepValueError("max_seq_len must be positive")
        if prefill < 0:
            raise BlockprepValueError(
                f"max_in_flight_prefill_tokens must be non-negative, got {prefill}"
            )
        source_blocks = math.ceil(max_seq_len / SOURCE_BLOCK_TOKENS)
        if source_blocks > COMPILED_SOURCE_BLOCKS:
            raise BlockprepValueError(
                f"DeepSeekV4 max_seq_len={max_seq_len} needs {source_blocks} source-token blocks, "
                f"but the compiled block tables support {COMPILED_SOURCE_BLOCKS}"
            )
        csa_ring = math.ceil((CSA_COMPRESS_RATIO + prefill) / CSA_STATE_BLOCK_TOKENS)
        rings = {
            "ori": math.ceil((SLIDING_WINDOW - 1 + prefill) / SOURCE_BLOCK_TOKENS) + 1,
            "hca_state": math.ceil((SLIDING_WINDOW + prefill) / HCA_STATE_BLOCK_TOKENS),
            "csa_state": csa_ring,
            "csa_inner_state": csa_ring,
        }
        for name, required in rings.items():
            if required > COMPILED_LIMITS[name]:
                raise BlockprepValueError(
                    f"DeepSeekV4 {name} cache needs {required} blocks per request to cover the "
                    "rolling history and in-flight prefill tokens, but the compiled block table "
                    f"supports {COMPILED_LIMITS[name]}"
                )
        for name in GROUP_NAMES:  # upstream's check of each group's compiled table limit
            if COMPILED_LIMITS[name] <= decode_batch:
                raise BlockprepValueError(
                    f"DeepSeekV4 {name} cache needs more than {decode_batch} physical blocks"
                )
        shapes: dict[str, tuple[Literal["ring", "paged"], int, int, int]] = {
            "ori": ("ring", 128, SOURCE_BLOCK_TOKENS, rings["ori"]),
            "cmp_c128": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "cmp_c4": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "idx": ("paged", 128, SOURCE_BLOCK_TOKENS, source_blocks),
            "hca_state": ("ring", 2048, HCA_STATE_BLOCK_TOKENS, rings["hca_state"]),
            "csa_state": ("ring", 4096, CSA_STATE_BLOCK_TOKENS, csa_ring),
            "csa_inner_state": ("ring", 4096, CSA_STATE_BLOCK_TOKENS, csa_ring),
        }
        pools: Mapping[str, int | None]
        if isinstance(num_blocks, str) and num_blocks == UNBOUND:
            pools = dict.fromkeys(GROUP_NAMES)
        else:
            pools = _pool_sizes(num_blocks, decode_batch, {g: s[3] for g, s in shapes.items()})
        self._prefill = prefill
        self.ranks = ranks
        self.decode_batch = decode_batch
        self.decode_seq = decode_seq
        self.max_seq_len = max_seq_len
        self._groups = tuple(
            DeepSeekV4CacheGroup(name, *shapes[name], pools[name]) for name in GROUP_NAMES
        )

    @property
    def decode_tokens(self) -> int:
        """Token rows per rank: ``decode_batch * decode_seq``."""
        return self.decode_batch * self.decode_seq

    @property
    def groups(self) -> tuple[DeepSeekV4CacheGroup, ...]:
        """The 7 groups in :data:`GROUP_NAMES` order."""
        return self._groups

    @property
    def bound(self) -> bool:
        """Whether the pool sizes are known (a layout built with ``num_blocks=UNBOUND`` is not)."""
        return self._groups[0].num_blocks is not None

    @property
    def num_blocks(self) -> Mapping[str, int]:
        """Group name -> scheduler-visible physical blocks per rank (read-only).

        Raises:
            RuntimeError: the layout is not bound (``num_blocks=UNBOUND``).
        """
        pools = {g.name: g.num_blocks for g in self._groups}
        bound = {name: n for name, n in pools.items() if n is not None}
        if len(bound) != len(pools):
            raise BlockprepRuntimeError(UNBOUND_MESSAGE)
        return MappingProxyType(bound)

    def with_num_blocks(self, num_blocks: Mapping[str, int]) -> DeepSeekV4Layout:
        """This layout's shapes with the pool sizes ``num_blocks`` (every group named; the
        checks of the constructor). ``TypeError`` for anything but a mapping: binding never
        falls back to the default pools (``None``) nor unbinds (``"unbound"``)."""
        if not isinstance(num_blocks, Mapping):
            raise BlockprepTypeError(
                f"binding pool sizes needs num_blocks mapping every group name to its block "
                f"count, got {num_blocks!r}"
            )
        return DeepSeekV4Layout(
            self.ranks,
            self.decode_batch,
            self.decode_seq,
            self.max_seq_len,
            num_blocks,
            max_in_flight_prefill_tokens=self._prefill,
        )

    def same_shapes(self, other: DeepSeekV4Layout) -> bool:
        """Whether ``other`` has this layout's buffer shapes (pool sizes aside)."""
        return (self.ranks, self.decode_batch, self.decode_seq) == (
            other.ranks,
            other.decode_batch,
            other.decode_seq,
        ) and [(g.kind, g.width) for g in self._groups] == [
            (g.kind, g.width) for g in other._groups
        ]

    def group(self, name: str) -> DeepSeekV4CacheGroup:
        """The group called ``name``; ``ValueError("unknown DeepSeekV4 cache group: {name}")``."""
        for group in self._groups:
            if group.name == name:
                return group
        raise BlockprepValueError(f"unknown DeepSeekV4 cache group: {name}")

    def __repr__(self) -> str:
        return (
            f"DeepSeekV4Layout(ranks={self.ranks}, decode_batch={self.decode_batch}, "
            f"decode_seq={self.decode_seq}, max_seq_len={self.max_seq_len}, "
            f"num_blocks={dict(self.num_blocks) if self.bound else UNBOUND!r})"
        )


UNBOUND_MESSAGE = (
    "DeepSeekV4 KV pool sizes are not bound yet: call bind_num_blocks(num_blocks) (or "
    "DeepSeekV4Layout.with_num_blocks) before preparing"
)


def deepseek_v4_decode_layout(
    num_speculative_tokens: int,
    *,
    ranks: int = 8,
    max_seq_len: int = 16384,
    num_blocks: Mapping[str, int] | Literal["unbound"] | None = None,
    max_in_flight_prefill_tokens: int = 256,
) -> DeepSeekV4Layout:
    """Upstream's decode tile for an MTP depth ``k`` (``deepseek_v4_decode_layout``,
    pypto_serving/model/deepseek/npu_runner.py at ``9b1a264``): ``k=0``: ``b=8, S=1`` (8 token
    rows); ``k=1``: ``b=8, S=2``; ``k=2..3``: ``b=4, S=4``; ``k>=4``: ``b=2, S=8`` (16 token rows
    with MTP; depths past 7 run repeated ``S=8`` target chunks).

    Raises:
        ValueError: ``"num_speculative_tokens must be non-negative"``, and the layout's own.
    """
    k = as_int(num_speculative_tokens, "num_speculative_tokens")
    if k < 0:
        raise BlockprepValueError("num_speculative_tokens must be non-negative")
    tokens = DECODE_TOKENS if k == 0 else MTP_DECODE_TOKENS
    seq = 1 if k == 0 else 2 if k == 1 else 4 if k <= 3 else 8
    return DeepSeekV4Layout(
        ranks,
        tokens // seq,
        seq,
        max_seq_len,
        num_blocks,
        max_in_flight_prefill_tokens=max_in_flight_prefill_tokens,
    )


def _pool_sizes(
    num_blocks: Mapping[str, int] | None, decode_batch: int, per_request: Mapping[str, int]
) -> dict[str, int]:
    if num_blocks is None:
        return {name: decode_batch * count for name, count in per_request.items()}
    if not isinstance(num_blocks, Mapping):
        raise BlockprepTypeError(
            f"num_blocks must map group names to block counts, got {type(num_blocks).__name__}"
        )
    for name in num_blocks:
        if name not in per_request:
            raise BlockprepValueError(f"unknown DeepSeekV4 cache group: {name}")
    missing = [name for name in GROUP_NAMES if name not in num_blocks]
    if missing:
        raise BlockprepValueError(f"num_blocks is missing cache groups: {', '.join(missing)}")
    pools = {}
    for name in GROUP_NAMES:
        count = as_int(num_blocks[name], f"num_blocks[{name!r}]")
        if count <= 0:
            raise BlockprepValueError(f"num_blocks[{name!r}] must be positive, got {count}")
        if count + decode_batch - 1 > INT32_MAX:
            raise BlockprepValueError(
                f"num_blocks[{name!r}]={count}: scratch pages up to {count + decode_batch - 1} "
                f"would pass the int32 maximum {INT32_MAX}"
            )
        pools[name] = count
    return pools
