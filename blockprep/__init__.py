"""blockprep: decode-input preparation for LLM serving engines.

Block tables, slot mappings, sequence lengths and padded token buffers, written straight into the
persistent buffers that a compiled decode program (an NPU program, a CUDA graph) reads; the host
cost of a step follows what changed, and every buffer equals a from-scratch rebuild.

Three ways in:

- a vLLM-like worker: ``blockprep.adapters.vllm.VllmBlockTable`` (vLLM's worker block-table API,
  validated and all-or-nothing; ``apply_step`` / ``apply_packed`` for a whole step);
- Qwen3 on upstream's NPU runtime, or any paged decode:
  ``blockprep.adapters.qwen.QwenDecodePreparer``;
- DeepSeek V4 on upstream's NPU runtime: ``blockprep.adapters.deepseek.DeepSeekV4DecodePreparer``.

Below them, exported here: the builders (``ring_block_table``, ``paged_block_table``), the
persistent ``BlockTable``, ``PaddedTokenBuffer``, ``paged_slot_mapping``, ``DecodeBatch``, the
errors (``BlockprepError``: the input was refused and nothing was written). Which table kernel
runs: ``kernel_backend()`` (``blockprep --version``). Docs: ``docs/index.md`` (the map),
``docs/api.md`` (reference), ``docs/troubleshooting.md``; the bench: ``python -m blockprep bench``.
"""

from blockprep import forks as _forks  # noqa: F401 (the fork hooks, for every import)
from blockprep._engine import kernel_backend
from blockprep._ids import INT32_MAX
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
from blockprep.errors import (
    BlockprepError,
    BlockprepIndexError,
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)
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
__version__ = "0.3.0"
"""The version, PEP 440 (``pip show blockprep`` and ``blockprep --version`` say the same)."""
