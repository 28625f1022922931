"""The Qwen preparer's verify mode: each step's page lists rebuilt from the batch alone (never
from the table), and every prepared buffer compared with upstream's own construction of them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from blockprep._verify import check_buffer, rows_and_columns
from blockprep.adapters._qwen_batch import page_lists
from blockprep.batch import DecodeBatch
from blockprep.packed import is_packed, unpack
from blockprep.reference import QwenDecodePrep97
from blockprep.wire import apply_ops


def verified_lists(
    batch: DecodeBatch, count: int, held: Mapping[Hashable, list[int]]
) -> list[list[int]]:
    """Each of the ``count`` rows' page ids as plain ints: the batch's lists, or its
    ``block_deltas`` applied to ``held`` (the verifier's own lists of the previous step)."""
    message = getattr(batch, "block_deltas", None)
    if is_packed(message):
        message = unpack(message, batch.request_ids)
    if message is None:
        source = page_lists(batch)
        return [[int(x) for x in source[row]] if row < len(source) else [] for row in range(count)]
    known = {} if message["base"] is None else held
    ops_by_request = message["rows"]
    lists = []
    for request in batch.request_ids:
        ops = ops_by_request.get(request)
        ids = known[request] if ops is None else apply_ops(ops, known.get(request))
        lists.append([int(x) for x in ids])
    return lists


def check_against_rebuild(
    rebuilt: QwenDecodePrep97,
    batch: DecodeBatch,
    lists: list[list[int]],
    rows: int,
    width: int,
    sets: Sequence[tuple[str, Mapping[str, torch.Tensor]]],
) -> None:
    """Prepare ``rebuilt`` (a fresh upstream construction) from the batch's tokens, lengths and
    ``lists``, then compare the first ``rows`` rows of every buffer of each ``(where, buffers)``
    set with it (:func:`~blockprep._verify.check_buffer` names the first differing cell)."""
    count = len(lists)
    rebuilt.prepare(
        DecodeBatch(
            request_ids=[str(row) for row in range(count)],
            token_ids=torch.tensor(batch.token_ids.reshape(-1)[:count].tolist()),
            hidden_states=None,
            seq_lens=torch.tensor(batch.seq_lens.reshape(-1)[:count].tolist()),
            block_ids=lists,
        )
    )
    expected = {
        "token_ids": rebuilt.token_ids,
        "seq_lens": rebuilt.seq_lens,
        "block_table": rebuilt.block_table.view(-1, width),
        "slot_mapping": rebuilt.slot_mapping,
    }
    for where, buffers in sets:
        for name, want in expected.items():
            got = buffers[name]
            if name == "block_table":
                got = got.view(-1, width)
            check_buffer(f"Qwen decode ({where})", name, got[:rows], want[:rows], rows_and_columns)
