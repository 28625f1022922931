"""The DeepSeek V4 inputs record: one prepared step, as views of one buffer slot's buffers.

Contract: :class:`DeepSeekV4DecodeInputs` is frozen and holds the slot's persistent tensors
themselves (the same objects every step of that slot, valid until it is prepared again), plus
where each request sits (rank, local row) and the step's token rows; ``buffers()`` names them as
the kernel's arguments, ``gather_rows()`` reads a kernel output back in batch order. Nothing
here writes a buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from blockprep._ids import as_int
from blockprep.adapters.deepseek.layout import INPUT_FIELDS
from blockprep.errors import BlockprepTypeError, BlockprepValueError


@dataclass(frozen=True)
class DeepSeekV4DecodeInputs:
    """One prepared step: views of one buffer slot's persistent buffers (valid until that slot
    is prepared again). ``R`` ranks, ``b`` decode_batch, ``T`` decode_tokens.

    - ``tables``: group name -> int32 ``[R, b, width]`` (:data:`GROUP_NAMES` order);
    - ``block_counts``: int32 ``[R, b, 7]``, ids per row and group (1 for padding rows);
    - ``input_ids``: int64 ``[R, T]``; ``position_ids``: int32 ``[R, T]``;
      ``kv_seq_lens``: int32 ``[R, b]``;
    - ``num_tokens_per_owner``: int32 ``[R]``, real token rows per rank;
    - ``logit_row_indices``: int32 ``[R, T]``, ``0..rows-1`` then -1;
    - ``x_hc``: float32 ``[R, T, hidden]`` host embeddings (``embedding="host"``), else ``None``;
    - ``ranks``, ``local_rows``: per request (batch order), its rank and kernel row there;
    - ``buffer_slot``: the slot these views belong to;
    - ``decode_seq``: token rows per kernel row (``S``); ``active_seq``: the real token rows of
      each request (1, 2 for MTP verification, ``active_width`` for a target chunk);
    - ``request_ids``: the batch's request ids, in batch order.
    """

    tables: Mapping[str, torch.Tensor]
    block_counts: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    kv_seq_lens: torch.Tensor
    num_tokens_per_owner: torch.Tensor
    logit_row_indices: torch.Tensor
    x_hc: torch.Tensor | None
    ranks: tuple[int, ...]
    local_rows: tuple[int, ...]
    buffer_slot: int
    decode_seq: int = 1
    active_seq: int = 1
    request_ids: tuple[Any, ...] = ()

    def buffers(self) -> dict[str, torch.Tensor]:
        """The 7 tables and the :data:`INPUT_FIELDS` buffers, by name (not ``x_hc``)."""
        return {**self.tables, **{name: getattr(self, name) for name in INPUT_FIELDS}}

    def gather_rows(self, output: torch.Tensor, tokens: int | None = None) -> torch.Tensor:
        """A kernel output ``[R, T, ...]`` (``logits``, ``sampled_ids``, ``hidden_out``) in batch
        order: request ``i``'s rows start at token row ``local_rows[i] * decode_seq`` of rank
        ``ranks[i]`` (upstream: ``logits[rank, local_row]`` in ``_run_autoregressive_decode``,
        ``logits[rank, local_row * width : ... + real_width]`` in ``_verify_mtp_drafts``).

        ``tokens=None``: each request's first row, ``[A, ...]``; ``tokens=n`` (``1..decode_seq``,
        e.g. :attr:`active_seq`): its first ``n`` rows, ``[A, n, ...]``. Works on any device
        (the result is a new tensor there).

        Raises:
            TypeError: ``output`` not a tensor.
            ValueError: ``output`` not ``[R, T, ...]``, or ``tokens`` out of range.
        """
        if not isinstance(output, torch.Tensor):
            raise BlockprepTypeError(
                f"kernel output must be a torch.Tensor, got {type(output).__name__}"
            )
        R, T = self.input_ids.shape
        if output.ndim < 2 or tuple(output.shape[:2]) != (R, T):
            raise BlockprepValueError(
                f"kernel output must have shape [{R}, {T}, ...] (ranks, decode_tokens), got "
                f"{list(output.shape)}"
            )
        S = self.decode_seq
        ranks = torch.tensor(self.ranks, dtype=torch.long, device=output.device)
        rows = torch.tensor(self.local_rows, dtype=torch.long, device=output.device) * S
        if tokens is None:
            return output[ranks, rows]
        n = as_int(tokens, "tokens")
        if not 1 <= n <= S:
            raise BlockprepValueError(f"tokens must be in [1, {S}] (decode_seq), got {n}")
        offsets = torch.arange(n, dtype=torch.long, device=output.device)
        return output[ranks[:, None], rows[:, None] + offsets]
