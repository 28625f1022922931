"""DeepSeek V4 speculative decoding: which drafted tokens a request keeps (seed-semantics 8)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blockprep.ids import has_integer_dtype


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
        raise ValueError(
            f"main_token_ids must have shape [batch, {width}], got {tuple(main.shape)}"
        )
    batch = main.shape[0]
    count = draft.shape[0] if draft.ndim else 0
    if draft.ndim not in (1, 2) or count != batch:
        raise ValueError(f"draft_token_ids must have {batch} entries, got {count}")
    drafts = draft.reshape(batch, width - 1).tolist()
    accepted = []
    for target, proposed in zip(main.tolist(), drafts, strict=True):
        keep = 0
        while keep < len(proposed) and proposed[keep] == target[keep]:
            keep += 1
        accepted.append(target[: keep + 1])
    return accepted


def integer_tensor(values: object, name: str) -> torch.Tensor:
    tensor = values if isinstance(values, torch.Tensor) else torch.as_tensor(values)
    if not has_integer_dtype(tensor):
        raise TypeError(f"{name} must hold integer token ids, got dtype {tensor.dtype}")
    return tensor
