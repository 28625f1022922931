"""DeepSeek V4 decode inputs: 7 KV groups x DP ranks, scratch padding, ping-pong buffer slots, MTP.

Reproduces upstream pypto-serving's DeepSeek V4 decode ABI (seed-semantics 4-8): per buffer slot,
one ``[ranks, decode_batch, width]`` int32 table per cache group, ``block_counts``, and the dynamic
inputs (tokens, positions, KV lengths, per-rank row counts, logit row indices), with upstream's
padding rules and error messages. The tables live in a :class:`~blockprep.grouped.GroupedTables`
(one row per ``rank * decode_batch + local`` kernel row, keyed by request id), so a step costs what
changed since the latest step of any slot and every buffer still equals upstream's full rebuild
(:func:`blockprep.reference.deepseek_v4_decode_rebuild`). This package holds only what is
DeepSeek's: the public modules ``layout`` (groups, widths, ring lengths, scratch pages) and
``abi`` (upstream's recorded ``l3_decode_fwd`` arguments: names, positions, shapes, dtypes); and
the internal ones ``_assignment`` (ranks and local rows), ``_checks`` (upstream's block-id checks
in upstream's order), ``_rows`` (a step's token and position rows, lengths and hidden states,
with upstream's checks), ``_inputs`` (the record a step returns), ``_dynamic`` (the writes of the
buffers besides the tables), ``_lifecycle`` (buffer slots, their buffers and locks, what a slot
holds), ``_tables`` (binding and planning the tables), ``_verify`` (verify mode), ``_mtp``
(accepted drafts, the speculative batch) and ``_preparer`` (:class:`DeepSeekV4DecodePreparer`,
the step), whose public names are exported here.

Upstream's life cycle (pypto-runtime.md section 5): the buffers are named as the kernel's
arguments and may be upstream's own (``buffers=``); they are allocated in shared memory by default,
before any fork; a layout may leave the pool sizes unbound (``num_blocks=UNBOUND``) until
``bind_num_blocks``; ``prepare(..., early=True)`` writes placeholder tokens, ``restage`` the real
ones later, one lock per slot (see :class:`DeepSeekV4DecodePreparer`).

A step checks everything (upstream's checks, then the id rule of :mod:`blockprep.grouped`, then
the hidden states' copy to the host) before its first write; a rejected batch leaves every slot,
cache and record as it was. Deliberate differences from upstream:

- a changed block id must be a plain int (``TypeError`` naming the batch row, group and value)
  where upstream coerced with ``int()``; an id equal to the one its row holds is taken as that int;
- a state ring longer than its table width raises
  ``"ring block-table row {r} has {n} blocks, maximum is {width}"`` where upstream truncated;
- upstream's padding and builder messages are kept word for word, so they name no rank; the
  first failing (rank, group, local row) in upstream's order is the one reported.
"""

from blockprep.adapters.deepseek._mtp import accept_mtp_tokens
from blockprep.adapters.deepseek._preparer import (
    HOST_HIDDEN_MESSAGE,
    MTP_PREVIOUS_MESSAGE,
    PARTITIONS_MESSAGE,
    REQUEST_ORDER_MESSAGE,
    DeepSeekV4DecodeInputs,
    DeepSeekV4DecodePreparer,
    Embedding,
    SlotBusyError,
)
from blockprep.adapters.deepseek.layout import (
    COMPILED_SOURCE_BLOCKS,
    CSA_COMPRESS_RATIO,
    CSA_STATE_BLOCK_TOKENS,
    DECODE_TOKENS,
    GROUP_NAMES,
    HCA_STATE_BLOCK_TOKENS,
    INPUT_FIELDS,
    MTP_DECODE_TOKENS,
    SLIDING_WINDOW,
    SOURCE_BLOCK_TOKENS,
    UNBOUND,
    DeepSeekV4CacheGroup,
    DeepSeekV4Layout,
    deepseek_v4_decode_layout,
)

__all__ = [
    "COMPILED_SOURCE_BLOCKS",
    "CSA_COMPRESS_RATIO",
    "CSA_STATE_BLOCK_TOKENS",
    "DECODE_TOKENS",
    "GROUP_NAMES",
    "HCA_STATE_BLOCK_TOKENS",
    "HOST_HIDDEN_MESSAGE",
    "INPUT_FIELDS",
    "MTP_DECODE_TOKENS",
    "MTP_PREVIOUS_MESSAGE",
    "PARTITIONS_MESSAGE",
    "REQUEST_ORDER_MESSAGE",
    "SLIDING_WINDOW",
    "SOURCE_BLOCK_TOKENS",
    "UNBOUND",
    "DeepSeekV4CacheGroup",
    "DeepSeekV4DecodeInputs",
    "DeepSeekV4DecodePreparer",
    "DeepSeekV4Layout",
    "Embedding",
    "SlotBusyError",
    "accept_mtp_tokens",
    "deepseek_v4_decode_layout",
]
