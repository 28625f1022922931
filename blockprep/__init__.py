"""blockprep: decode-input preparation for LLM serving engines.

Block tables, slot mappings, sequence lengths and padded token buffers, written straight into the
persistent buffers that a compiled decode program reads.
"""

from blockprep.batch import DecodeBatch, DecodeExecutor, DecodeResult
from blockprep.block_table import BlockTable, BlockTableStats, StaleRowError
from blockprep.builders import paged_block_table, ring_block_table
from blockprep.ids import INT32_MAX

__all__ = [
    "INT32_MAX",
    "BlockTable",
    "BlockTableStats",
    "DecodeBatch",
    "DecodeExecutor",
    "DecodeResult",
    "StaleRowError",
    "paged_block_table",
    "ring_block_table",
]
__version__ = "0.1.0"
