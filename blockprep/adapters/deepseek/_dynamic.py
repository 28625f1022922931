"""A DeepSeek V4 buffer slot's dynamic inputs: every buffer besides the tables and
``block_counts`` (tokens, positions, KV lengths, per-rank owners, logit rows, host ``x_hc``).

Contract: :class:`DynamicInputs` writes a step that the caller has checked whole (its rows,
lengths, hidden states and assignment); its writes cannot raise. Padding rows replicate their
rank's first request (request 0 on an empty rank); ``num_tokens_per_owner`` and the logit rows
are rewritten only when the per-rank counts or the real rows per request change.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import torch

from blockprep.adapters.deepseek._assignment import Assignment
from blockprep.adapters.deepseek._rows import DecodeColumns, StepRows
from blockprep.adapters.deepseek.layout import DeepSeekV4Layout
from blockprep.buffers import host_tensor


class DynamicInputs:
    """A slot's buffers besides the tables: tokens, positions, KV lengths, owners, logits, x_hc."""

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        buffers: Mapping[str, torch.Tensor],
        hidden_size: int | None,
        share: bool,
    ) -> None:
        R, b, T, S = layout.ranks, layout.decode_batch, layout.decode_tokens, layout.decode_seq
        self.ranks = R
        self.input_ids = buffers["input_ids"]
        self.position_ids = buffers["position_ids"]
        self.kv_seq_lens = buffers["kv_seq_lens"]
        self.num_tokens_per_owner = buffers["num_tokens_per_owner"]
        self.logit_row_indices = buffers["logit_row_indices"]
        self.x_hc = (
            None
            if hidden_size is None
            else host_tensor((R, T, hidden_size), torch.float32, fill=0, share_memory=share)
        )
        self.input_np = self.input_ids.numpy().reshape(R * b, S)
        self.positions_np = self.position_ids.numpy().reshape(R * b, S)
        self.kv_np = self.kv_seq_lens.numpy().reshape(R * b)
        # [S, R * b] views: a [R * b] column assigned to them fills each of the S token columns
        self.input_columns, self.position_columns = self.input_np.T, self.positions_np.T
        self.owner_key: tuple[tuple[int, ...], int] | None = None

    def write(
        self,
        assignment: Assignment,
        rows: StepRows,
        seq: npt.NDArray[np.int64],
        dirty: set[int] | None,
        owners: bool = True,
    ) -> None:
        """Stage one step (seed-semantics 6.5): every kernel row its request's token and position
        rows (padding rows: the rank's first request, or request 0); with ``owners``, also
        ``num_tokens_per_owner`` and the logit rows. ``dirty``: gets the ranks that changed."""
        source = assignment.source
        R = self.ranks
        if isinstance(rows, DecodeColumns) and dirty is None:
            # Gathers first, then writes: an input that is a view of these buffers (an engine
            # feeding the last step's column back) is read whole before it is overwritten.
            tokens, kv = rows.tokens[source], rows.seq[source]
            self.kv_np[...] = kv
            self.input_columns[...] = tokens
            self.position_columns[...] = kv - 1
        else:
            if isinstance(rows, DecodeColumns):
                rows = rows.rows()
            tokens = rows.tokens[source]
            positions = rows.positions[source]
            kv = seq[source]
            if dirty is not None:
                changed = (
                    (self.input_np != tokens).reshape(R, -1).any(axis=1)
                    | (self.positions_np != positions).reshape(R, -1).any(axis=1)
                    | (self.kv_np != kv).reshape(R, -1).any(axis=1)
                )
                dirty.update(np.flatnonzero(changed).tolist())
            self.input_np[...] = tokens
            self.positions_np[...] = positions
            self.kv_np[...] = kv
        key = (assignment.counts, rows.active_seq)
        if owners and self.owner_key != key:  # num_tokens_per_owner and logit rows: the counts
            active_seq = rows.active_seq
            logits = self.logit_row_indices.numpy()
            self.num_tokens_per_owner.numpy()[...] = np.array(assignment.counts) * active_seq
            logits[...] = -1
            for rank, count in enumerate(assignment.counts):
                logits[rank, : count * active_seq] = np.arange(count * active_seq)
            self.owner_key = key
            if dirty is not None:
                dirty.update(range(R))

    def write_x_hc(
        self, assignment: Assignment, hidden: torch.Tensor, previous: torch.Tensor | None
    ) -> None:
        """Upstream's ``_pack_decode_x_hc``: every row request 0's last embedding, then each
        request's rows (its embedding over ``decode_seq``; MTP: ``[previous, current]``)."""
        assert self.x_hc is not None
        rows = len(assignment.occupants)
        x = self.x_hc.view(rows, self.input_np.shape[1], -1)
        x[...] = hidden[0]
        index = torch.from_numpy(assignment.request_rows)
        if previous is None:
            x[index] = hidden[:, None, :]
        else:
            x[index, 0] = previous
            x[index, 1] = hidden
