"""The engine-facing types of one decode step: what the scheduler hands in, what comes back.

Model-neutral: an adapter (``blockprep.adapters.*``) turns a :class:`DecodeBatch` into a model's
persistent decode buffers and hands them to a :class:`DecodeExecutor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

InputsT_contra = TypeVar("InputsT_contra", contravariant=True)


@dataclass
class DecodeBatch:
    """One decode step's active requests, in batch order (``A`` of them).

    - ``request_ids``: ``A`` request ids.
    - ``token_ids``: ``[A]`` or ``[A, 1]`` integer tensor, the token each request decodes now
      (``[A, T]`` for multi-token layouts such as DeepSeek MTP).
    - ``seq_lens``: ``[A]`` integer tensor, tokens in each sequence *including* the one being
      decoded: its absolute position is ``seq_len - 1``.
    - ``hidden_states``: ``[A, hidden]`` host embeddings, or ``None``, the normal case for
      executors that embed ``token_ids`` on device.
    - ``block_ids``: per request, its KV page ids (paged caches).
    - ``block_ids_by_group``: per request, ``{group: ids}`` for models with several KV groups.
    - ``cache_partitions``: per request, the rank (KV partition) that holds it, or ``None``.
    - ``prev_token_ids`` ``[A]`` and ``prev_hidden_states`` ``[A, hidden]``: the token at position
      ``seq_len - 2`` and its embedding, for MTP decoders; ``None`` otherwise.
    - ``block_deltas``: blockprep's own field (after upstream's): a :mod:`blockprep.wire` message
      carrying what changed in the block lists since the worker's last step, instead of
      ``block_ids`` / ``block_ids_by_group`` (leave those empty); ``None`` otherwise.
    """

    request_ids: list[str]
    token_ids: torch.Tensor
    seq_lens: torch.Tensor
    hidden_states: torch.Tensor | None = None
    block_ids: list[list[int]] = field(default_factory=list)
    block_ids_by_group: list[dict[str, list[int]]] = field(default_factory=list)
    cache_partitions: list[int | None] = field(default_factory=list)
    prev_token_ids: torch.Tensor | None = None
    prev_hidden_states: torch.Tensor | None = None
    block_deltas: dict[str, Any] | None = None


@dataclass
class DecodeResult:
    """What an executor returns for one step: ``logits [A, vocab]`` (or ``None`` when it sampled
    on device), ``sampled_token_ids [A]`` when it sampled, and ``hidden_states``, which is ``None``
    for every executor blockprep adapts (kept for the upstream ABI)."""

    logits: torch.Tensor | None
    sampled_token_ids: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


class DecodeExecutor(Protocol[InputsT_contra]):
    """Runs one compiled decode step on a model's prepared inputs."""

    def run_decode(self, inputs: InputsT_contra) -> DecodeResult: ...
