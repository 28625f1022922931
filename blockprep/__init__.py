"""blockprep: decode-input preparation for LLM serving engines.

Block tables, slot mappings, sequence lengths and padded token buffers, written straight into the
persistent buffers that a compiled decode program reads.
"""

from blockprep import forks as _forks  # noqa: F401 (the fork hooks, for every import)
from blockprep.batch import (
    DecodeBatch,
    DecodeExecutor,
    DecodeResult,
    KvAllocation,
    SamplingCandidates,
)
from blockprep.block_table import BlockTable, BlockTableStats, StaleRowError, UnknownRowError
from blockprep.buffers import DeviceMirror, host_tensor
from blockprep.builders import paged_block_table, ring_block_table
from blockprep.engine import kernel_backend
from blockprep.errors import (
    BlockprepError,
    BlockprepIndexError,
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)
from blockprep.ids import INT32_MAX
from blockprep.slots import paged_slot_mapping
from blockprep.tokens import PaddedTokenBuffer

__all__ = [
    "INT32_MAX",
    "BlockTable",
    "BlockTableStats",
    "BlockprepError",
    "BlockprepIndexError",
    "BlockprepRuntimeError",
    "BlockprepTypeError",
    "BlockprepValueError",
    "DecodeBatch",
    "DecodeExecutor",
    "DecodeResult",
    "DeviceMirror",
    "KvAllocation",
    "PaddedTokenBuffer",
    "SamplingCandidates",
    "StaleRowError",
    "UnknownRowError",
    "host_tensor",
    "kernel_backend",
    "paged_block_table",
    "paged_slot_mapping",
    "ring_block_table",
]
__version__ = "0.3.0.dev0"
"""The version, PEP 440 (``pip show blockprep`` and ``blockprep --version`` say the same)."""
