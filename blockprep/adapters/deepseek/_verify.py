"""DeepSeek V4 verify mode (``DeepSeekV4DecodePreparer(..., verify=True)``): the input contract
before a step writes, every buffer of the slot against upstream's full rebuild after it.

Contract: :func:`verify_lists` gives each request's ids per group as a planned (valid) step
makes them (a delta step's: its operations applied to the lists kept of the steps before, apart
from the tables); :func:`check_contract` raises ``ValueError`` naming the row, request, group and
count when a ring group holds more than its ring length of ids or a full-history group fewer than
``ceil(seq_len / block_tokens)`` (checks upstream did not make); :func:`verify_slot` compares
every buffer of the slot (and ``x_hc``) with :func:`blockprep.reference.deepseek_v4_decode_rebuild`
(and :func:`~blockprep.reference.deepseek_v4_x_hc`) of the same step, raising
:class:`~blockprep.block_table.StaleRowError` naming the first differing buffer, rank, row and
column. ``blockprep.reference`` is imported only when a slot is verified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from blockprep._verify import check_buffer
from blockprep.adapters.deepseek._inputs import DeepSeekV4DecodeInputs
from blockprep.adapters.deepseek._rows import DecodeColumns, Hidden, Mode, StepRows
from blockprep.adapters.deepseek.layout import GROUP_NAMES, DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepValueError
from blockprep.packed import is_packed, unpack
from blockprep.wire import apply_ops


def verify_lists(
    batch: DecodeBatch, kept: Mapping[Any, dict[str, list[int]]]
) -> list[dict[str, list[int]]]:
    """Each request's ids per group as this (planned, valid) step makes them: the batch's,
    or the message's ops applied to what the verifier kept of the steps before (``kept``)."""
    message = batch.block_deltas
    if is_packed(message):
        message = unpack(message, batch.request_ids, GROUP_NAMES)
    if message is None:
        return [
            {name: [int(x) for x in row[name]] for name in GROUP_NAMES}
            for row in batch.block_ids_by_group
        ]
    held: Mapping[Any, dict[str, list[int]]] = {} if message.get("base") is None else kept
    ops_by_request = message.get("rows") or {}
    lists = []
    for request in batch.request_ids:
        groups = dict(held.get(request, {}))
        for name, ops in ops_by_request.get(request, {}).items():
            groups[name] = [int(x) for x in apply_ops(ops, groups.get(name))]
        lists.append(groups)
    return lists


def check_contract(
    layout: DeepSeekV4Layout,
    batch: DecodeBatch,
    groups: list[dict[str, list[int]]],
    seq: npt.NDArray[np.int64],
) -> None:
    """The input contract (docs/api.md): rings hold at most their ring length of ids,
    full-history groups at least ``ceil(seq_len / 128)``. Upstream checked neither."""
    for q, (row, seq_len) in enumerate(zip(groups, seq.tolist(), strict=True)):
        for group in layout.groups:
            n = len(row[group.name])
            where = f"decode row {q} (request {batch.request_ids[q]!r}) group {group.name}"
            if group.kind == "ring" and n > group.ids_per_request:
                raise BlockprepValueError(
                    f"DeepSeekV4 input contract: {where} holds {n} block IDs, more than its "
                    f"ring length {group.ids_per_request}"
                )
            need = -(-seq_len // group.block_tokens)
            if group.kind == "paged" and n < need:
                raise BlockprepValueError(
                    f"DeepSeekV4 input contract: {where} holds {n} block IDs, fewer than "
                    f"seq_len {seq_len} needs (ceil({seq_len} / {group.block_tokens}) = "
                    f"{need})"
                )


def verify_slot(
    layout: DeepSeekV4Layout,
    inputs: DeepSeekV4DecodeInputs,
    batch: DecodeBatch,
    groups: list[dict[str, list[int]]],
    seq: npt.NDArray[np.int64],
    rows: StepRows,
    hidden: Hidden | None,
    mode: Mode,
    early: bool,
) -> None:
    """Every buffer of the slot against upstream's full rebuild of the same step."""
    from blockprep.reference import deepseek_v4_decode_rebuild, deepseek_v4_x_hc

    if isinstance(rows, DecodeColumns):
        rows = rows.rows()

    A = len(groups)
    explicit = early or mode == "target"  # the call's rows, not the batch's tokens
    exact = DecodeBatch(
        request_ids=list(batch.request_ids),
        token_ids=torch.zeros(A, dtype=torch.int64) if explicit else batch.token_ids,
        hidden_states=batch.hidden_states,
        seq_lens=torch.tensor(seq.tolist(), dtype=torch.int64),
        block_ids_by_group=groups,
        cache_partitions=list(inputs.ranks),
        prev_token_ids=batch.prev_token_ids,
        prev_hidden_states=batch.prev_hidden_states,
    )
    expected = deepseek_v4_decode_rebuild(
        exact,
        ranks=layout.ranks,
        decode_batch=layout.decode_batch,
        decode_seq=layout.decode_seq,
        num_blocks=layout.num_blocks,
        mtp=mode == "mtp",
        fix=True,
        token_rows=rows.tokens.tolist() if explicit else None,
        positions=rows.positions.tolist() if explicit else None,
        active_seq=rows.active_seq if explicit else None,
    )
    got = inputs.buffers()
    if hidden is not None and inputs.x_hc is not None:
        got["x_hc"] = inputs.x_hc
        expected["x_hc"] = deepseek_v4_x_hc(
            exact,
            ranks=layout.ranks,
            decode_batch=layout.decode_batch,
            decode_seq=layout.decode_seq,
            mtp=mode == "mtp",
        )
    for name, tensor in got.items():
        check_buffer(
            f"DeepSeekV4 decode (slot {inputs.buffer_slot})",
            name,
            tensor,
            expected[name],
            _place(name),
        )


_PLACES = {
    "kv_seq_lens": ("rank", "row"),
    "input_ids": ("rank", "token row"),
    "position_ids": ("rank", "token row"),
    "logit_row_indices": ("rank", "token row"),
    "num_tokens_per_owner": ("rank",),
    "x_hc": ("rank", "token row", "column"),
}


def _place(name: str) -> Callable[[tuple[int, ...]], str]:
    """Names an index of slot buffer ``name``: ``rank r, row l, column c`` of a table or
    ``block_counts``, ``rank r, token row t`` of the token rows, ``rank r, row l`` of
    ``kv_seq_lens``."""
    parts = _PLACES.get(name, ("rank", "row", "column"))

    def place(index: tuple[int, ...]) -> str:
        return ", ".join(f"{part} {i}" for part, i in zip(parts, index, strict=False))

    return place
