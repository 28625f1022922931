"""DeepSeek V4 speculative decoding: which drafted tokens a request keeps (seed-semantics 8),
and the batch that verifies the drafts.

Contract: :func:`accept_mtp_tokens` and :func:`speculative_batch` read their arguments, raise
upstream's messages when they are wrong, and return new values; neither holds or writes state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from blockprep._ids import has_integer_dtype
from blockprep.adapters.deepseek._rows import HOST_HIDDEN_MESSAGE, integer_array
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepTypeError, BlockprepValueError
from blockprep.packed import is_packed
from blockprep.packed import message as packed_message


def accept_mtp_tokens(
    main_token_ids: torch.Tensor | Sequence[Sequence[int]],
    draft_token_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]],
) -> list[list[int]]:
    """The tokens each request commits after verifying its drafts (upstream's general form).

    ``main_token_ids [B, K+1]``: the target model's tokens; ``draft_token_ids [B, K]`` (or ``[B]``
    for K=1): the drafts. Per request: the longest prefix where ``draft[j] == main[j]``, plus the
    target token after it (so ``1..K+1`` tokens).

    Raises:
        ValueError: ``"main_token_ids must have shape [batch, {K+1}], got {shape}"``, then
            ``"draft_token_ids must have {B} entries, got {n}"``.
        TypeError: non-integer tokens.
    """
    main = integer_tensor(main_token_ids, "main_token_ids")
    draft = integer_tensor(draft_token_ids, "draft_token_ids")
    width = 2 if draft.ndim <= 1 else draft.shape[1] + 1
    if main.ndim != 2 or main.shape[1] != width:
        raise BlockprepValueError(
            f"main_token_ids must have shape [batch, {width}], got {tuple(main.shape)}"
        )
    batch = main.shape[0]
    count = draft.shape[0] if draft.ndim else 0
    if draft.ndim not in (1, 2) or count != batch:
        raise BlockprepValueError(f"draft_token_ids must have {batch} entries, got {count}")
    drafts = draft.reshape(batch, width - 1).tolist()
    accepted = []
    for target, proposed in zip(main.tolist(), drafts, strict=True):
        keep = 0
        while keep < len(proposed) and proposed[keep] == target[keep]:
            keep += 1
        accepted.append(target[: keep + 1])
    return accepted


def integer_tensor(values: object, name: str) -> torch.Tensor:
    if values is None or isinstance(values, (str, bytes)):
        raise BlockprepTypeError(
            f"{name} must be integer token ids (a tensor, array or list), got "
            f"{type(values).__name__}"
        )
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if not has_integer_dtype(tensor):
        raise BlockprepTypeError(f"{name} must hold integer token ids, got dtype {tensor.dtype}")
    return tensor


def speculative_batch(
    batch: DecodeBatch,
    draft_token_ids: torch.Tensor,
    draft_hidden_states: torch.Tensor | None,
    *,
    host: bool,
) -> DecodeBatch:
    """:meth:`~blockprep.adapters.deepseek.DeepSeekV4DecodePreparer.speculative_batch`, for a
    preparer with ``embedding="host"`` (``host``) or ``"device"``."""
    hidden = batch.hidden_states
    if host:
        if hidden is None:
            raise BlockprepValueError(HOST_HIDDEN_MESSAGE)
        if draft_hidden_states is None:
            raise BlockprepValueError('embedding="host" needs the drafts\' host embeddings')
        if tuple(draft_hidden_states.shape) != tuple(hidden.shape):
            raise BlockprepValueError("MTP previous embeddings must align with draft embeddings")
    A = len(batch.request_ids)
    drafts = integer_tensor(draft_token_ids, "draft_token_ids").reshape(-1)
    if drafts.numel() != A:
        raise BlockprepValueError(f"draft_token_ids must have {A} entries, got {drafts.numel()}")
    integer_array(drafts, "draft_token_ids")  # uint64 above int64 would wrap
    current = batch.token_ids if batch.token_ids.ndim == 1 else batch.token_ids[:, 0]
    return DecodeBatch(
        request_ids=list(batch.request_ids),
        token_ids=drafts.to(torch.int64)[:, None],
        seq_lens=batch.seq_lens + 1,
        hidden_states=(
            draft_hidden_states.to(hidden.dtype)
            if host and draft_hidden_states is not None and hidden is not None
            else None
        ),
        block_ids=batch.block_ids,
        block_ids_by_group=batch.block_ids_by_group,
        cache_partitions=list(batch.cache_partitions),
        prev_token_ids=current.clone(),
        prev_hidden_states=hidden if host else None,
        block_deltas=_unchanged(batch.block_deltas),
    )


def _unchanged(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message saying that nothing changed since ``message`` (``None`` for ``None``)."""
    if message is None:
        return None
    seq = message.get("seq")
    if is_packed(message) and type(seq) is int:  # the packed form of the same: no records
        return packed_message(seq, seq, 0, b"")
    return {"seq": seq, "base": seq, "rows": {}}
