"""The engine-facing types of one decode step: what the scheduler hands in, what comes back.

Model-neutral: an adapter (``blockprep.adapters.*``) turns a :class:`DecodeBatch` into a model's
persistent decode buffers and hands them to a :class:`DecodeExecutor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from blockprep.errors import BlockprepTypeError

InputsT_contra = TypeVar("InputsT_contra", contravariant=True)


@dataclass
class KvAllocation:
    """Upstream's paged KV allocation of one request (``config/types.py`` at ``9b1a264``); the
    Qwen adapter reads ``page_ids`` only."""

    request_id: str
    model_id: str
    page_ids: list[int]
    tokens_capacity: int
    tokens_used: int = 0


@dataclass
class SamplingCandidates:
    """Upstream's device-selected sampling candidates, for host-side final sampling."""

    values: torch.Tensor
    token_ids: torch.Tensor


@dataclass
class DecodeBatch:
    """One decode step's active requests, in batch order (``A`` of them).

    Upstream's fields in upstream's positional order (pypto-serving ``config/types.py`` at
    ``9b1a264``), then blockprep's own; construct it by keyword. Upstream's own objects (and
    newer ones with more fields) work too: the adapters read them through
    :func:`as_decode_batch` or with the same defaults.

    - ``request_ids``: ``A`` request ids (a 1-D NumPy array becomes a list, as
      ``cache_partitions`` does: NumPy's ``==`` and truth value are elementwise).
    - ``token_ids``: ``[A]`` or ``[A, 1]`` integer tensor, the token each request decodes now
      (``[A, T]`` for multi-token layouts such as DeepSeek MTP).
    - ``hidden_states``: ``[A, hidden]`` host embeddings, or ``None``, the normal case for
      executors that embed ``token_ids`` on device.
    - ``seq_lens``: ``[A]`` integer tensor, tokens in each sequence *including* the one being
      decoded: its absolute position is ``seq_len - 1``.
    - ``allow_device_greedy_sampling``, ``allow_device_topk_sampling``: upstream's sampling
      switches, for executors (the preparers do not read them).
    - ``kv_allocations``: per request, upstream's :class:`KvAllocation`; a paged adapter takes a
      row's pages from ``kv_allocations[i].page_ids`` first, as upstream's Qwen runner does.
    - ``block_ids``: per request, its KV page ids (paged caches).
    - ``block_ids_by_group``: per request, ``{group: ids}`` for models with several KV groups.
    - ``cache_partitions``: per request, the rank (KV partition) that holds it, or ``None``.
    - ``prev_token_ids`` ``[A]`` and ``prev_hidden_states`` ``[A, hidden]``: the token at position
      ``seq_len - 2`` and its embedding, for MTP decoders; ``None`` otherwise.
    - ``block_deltas``: blockprep's own field (after upstream's): a :mod:`blockprep.wire` message,
      or a :mod:`blockprep.packed` one (int32 records in one ``bytes``), carrying what changed in
      the block lists since the worker's last step, instead of ``block_ids`` /
      ``block_ids_by_group`` (leave those empty); ``None`` otherwise.

    ``token_ids``, ``seq_lens`` and ``prev_token_ids`` may also be given as lists, tuples or
    NumPy arrays, as engines build them: they become CPU tensors on construction
    (``torch.as_tensor``; a NumPy array shares its memory), so the adapters always read tensors.
    Anything else (``None`` for ``token_ids`` or ``seq_lens``, a set, a string, a ragged list) is
    a ``TypeError`` naming the field and saying what is expected. The values are not checked
    here: the adapters check them (a float token id or a bool seq_len is rejected there).
    """

    request_ids: list[str]
    token_ids: torch.Tensor
    hidden_states: torch.Tensor | None
    seq_lens: torch.Tensor
    allow_device_greedy_sampling: bool = False
    allow_device_topk_sampling: bool = False
    kv_allocations: list[KvAllocation] = field(default_factory=list)
    block_ids: list[list[int]] = field(default_factory=list)
    block_ids_by_group: list[dict[str, list[int]]] = field(default_factory=list)
    cache_partitions: list[int | None] = field(default_factory=list)
    prev_token_ids: torch.Tensor | None = None
    prev_hidden_states: torch.Tensor | None = None
    block_deltas: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if type(self.token_ids) is not torch.Tensor:
            self.token_ids = _as_tensor(self.token_ids, "token_ids")
        if type(self.seq_lens) is not torch.Tensor:
            self.seq_lens = _as_tensor(self.seq_lens, "seq_lens")
        if self.prev_token_ids is not None and type(self.prev_token_ids) is not torch.Tensor:
            self.prev_token_ids = _as_tensor(self.prev_token_ids, "prev_token_ids")
        for name in ("request_ids", "cache_partitions"):  # NumPy's == and truth are elementwise
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                if value.ndim != 1:
                    raise BlockprepTypeError(
                        f"{name} must be a list or a 1-D array, got an array of shape "
                        f"{list(value.shape)}"
                    )
                setattr(self, name, value.tolist())


@dataclass
class DecodeResult:
    """What an executor returns for one step, upstream's fields in upstream's order
    (``config/types.py`` at ``9b1a264``): ``hidden_states`` (``None`` for every executor
    blockprep adapts), ``logits [A, vocab]`` (or ``None`` when it sampled on device),
    ``sampled_token_ids [A]`` when it sampled, ``sampling_candidates`` (device top-k),
    ``next_hidden_states`` and ``accepted_token_ids`` (MTP). Construct it by keyword."""

    hidden_states: torch.Tensor | None
    logits: torch.Tensor | None
    sampled_token_ids: torch.Tensor | None = None
    sampling_candidates: SamplingCandidates | None = None
    next_hidden_states: torch.Tensor | None = None
    accepted_token_ids: list[list[int]] | None = None


_REQUIRED = ("request_ids", "token_ids", "seq_lens")
_OPTIONAL: tuple[tuple[str, Callable[[], object] | None], ...] = (
    ("hidden_states", None),
    ("allow_device_greedy_sampling", bool),
    ("allow_device_topk_sampling", bool),
    ("kv_allocations", list),
    ("block_ids", list),
    ("block_ids_by_group", list),
    ("cache_partitions", list),
    ("prev_token_ids", None),
    ("prev_hidden_states", None),
    ("block_deltas", None),
)
"""The fields besides the required three, each with what makes upstream's default (``None``:
``None``)."""


def as_decode_batch(batch: object) -> DecodeBatch:
    """``batch`` as a :class:`DecodeBatch`, what every adapter entry point reads.

    A :class:`DecodeBatch` (or a subclass) is returned as it is. Any other object (upstream's own
    ``DecodeBatch`` at ``9b1a264``, a newer one with more fields, a namespace) is read by
    attribute name into a new one: ``request_ids``, ``token_ids`` and ``seq_lens`` must be there;
    every other field it lacks takes upstream's default (``hidden_states``, ``prev_token_ids``,
    ``prev_hidden_states`` and ``block_deltas`` ``None``, the switches ``False``, the lists
    empty); attributes of no field here are ignored. The tensors and lists are the caller's own
    objects, not copies.

    Raises:
        TypeError: a required attribute missing (named, with the object's type), and the
            conversions of :class:`DecodeBatch` (a ``token_ids`` that is no tensor or list).
    """
    if isinstance(batch, DecodeBatch):
        return batch
    missing = [name for name in _REQUIRED if not hasattr(batch, name)]
    if missing:
        raise BlockprepTypeError(
            f"a decode batch needs {', '.join(missing)}: {type(batch).__name__} has no "
            f"attribute {missing[0]!r}"
        )
    values = {name: getattr(batch, name) for name in _REQUIRED}
    for name, default in _OPTIONAL:
        values[name] = getattr(batch, name, None)
        if values[name] is None and default is not None:
            values[name] = default()
    return DecodeBatch(**values)


def _as_tensor(value: object, name: str) -> torch.Tensor:
    """A list, tuple or NumPy array of numbers as a tensor (a tensor as it is); ``TypeError``
    naming ``name`` otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise BlockprepTypeError(
                f"DecodeBatch {name} must be an integer tensor, or a list, tuple or NumPy array "
                f"of integers of one shape; {type(value).__name__} could not be converted "
                f"({error})"
            ) from None
    raise BlockprepTypeError(
        f"DecodeBatch {name} must be an integer tensor, or a list, tuple or NumPy array of "
        f"integers, got {type(value).__name__}"
    )


class DecodeExecutor(Protocol[InputsT_contra]):
    """Runs one compiled decode step on a model's prepared inputs."""

    def run_decode(self, inputs: InputsT_contra) -> DecodeResult: ...
