"""A DeepSeek V4 step's dynamic rows per request: tokens and positions ``[A, S]``, the lengths
and the host hidden states, read from a batch (or a call's token rows) with upstream's checks.

Contract: every function here reads and checks, in upstream's order and with upstream's
messages, and writes no buffer; what it returns is new (tokens, positions and lengths as int64
NumPy arrays, hidden states as float32 CPU tensors, copied now so that a copy that fails fails
before any write). ``host`` is the preparer's ``embedding == "host"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import INT64_MAX, as_int, has_integer_dtype
from blockprep.adapters.deepseek._assignment import Assignment
from blockprep.adapters.deepseek._checks import normalization_error, raise_first
from blockprep.adapters.deepseek.layout import DeepSeekV4Layout
from blockprep.batch import DecodeBatch
from blockprep.errors import BlockprepTypeError, BlockprepValueError

HOST_HIDDEN_MESSAGE = "DeepSeek V4 decode requires host hidden states"
MTP_PREVIOUS_MESSAGE = "DeepSeekV4 MTP decode requires previous token IDs and embeddings"

Mode = Literal["decode", "mtp", "target"]
"""The call that staged a step: ``prepare``, ``prepare_mtp`` or ``prepare_mtp_target``."""

Hidden = tuple[torch.Tensor, torch.Tensor | None]
"""Host hidden states ``[A, hidden]`` and MTP's previous ones (``None`` outside MTP)."""


@dataclass(frozen=True)
class Rows:
    """One step's dynamic rows per request: tokens and positions ``[A, S]``, the real rows."""

    tokens: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]
    active_seq: int


@dataclass(frozen=True)
class DecodeColumns:
    """The standard step's rows as columns: request ``q``'s token ``tokens[q]`` in each of its
    ``decode_seq`` token columns at position ``seq[q] - 1``, its KV length ``seq[q]``; what
    :class:`~blockprep.adapters.deepseek._dynamic.DynamicInputs` gathers. ``last_position``: the
    largest position (``max(seq) - 1``)."""

    tokens: npt.NDArray[np.int64]
    seq: npt.NDArray[np.int64]
    decode_seq: int
    last_position: int
    active_seq: int = 1

    def rows(self) -> Rows:
        """The same rows as ``[A, S]`` arrays."""
        S = self.decode_seq
        tokens = np.repeat(self.tokens[:, None], S, axis=1)
        return Rows(tokens, np.repeat((self.seq - 1)[:, None], S, axis=1), self.active_seq)


StepRows = Rows | DecodeColumns
"""A step's rows, in either form."""


def checked_seq_lens(batch: DecodeBatch, A: int) -> npt.NDArray[np.int64]:
    """The first ``A`` seq_lens (upstream reads ``seq_lens[q]`` for the ``A`` requests only:
    extra trailing entries are ignored); fewer than ``A``, or not 1-D, is refused."""
    seq = integer_array(batch.seq_lens, "seq_lens")
    if seq.ndim != 1 or seq.shape[0] < A:
        raise BlockprepValueError(f"decode seq_lens must have shape [{A}], got {list(seq.shape)}")
    return seq[:A]


def one_per_rank(layout: DeepSeekV4Layout, assignment: Assignment) -> None:
    if layout.decode_seq != 1 and max(assignment.counts) > 1:
        raise BlockprepValueError(
            "DeepSeekV4 non-MTP decode supports at most one request per DP rank; the fixed "
            "S=2 kernel can expose only one cache-safe active token per rank"
        )


def early_device_only(host: bool) -> None:
    if host:
        raise BlockprepValueError(
            'early prepare (placeholder tokens) needs embedding="device": host embeddings '
            "of unknown tokens cannot be staged"
        )


def mtp_inputs_present(batch: DecodeBatch, host: bool) -> None:
    if host:
        if batch.hidden_states is None:
            raise BlockprepValueError(HOST_HIDDEN_MESSAGE)
        if batch.prev_token_ids is None or batch.prev_hidden_states is None:
            raise BlockprepValueError(MTP_PREVIOUS_MESSAGE)
    elif batch.prev_token_ids is None:
        raise BlockprepValueError(MTP_PREVIOUS_MESSAGE)


def placeholder(layout: DeepSeekV4Layout, A: int, active_seq: int) -> Rows:
    """Upstream's early rows: tokens and positions all 0."""
    zeros = np.zeros((A, layout.decode_seq), dtype=np.int64)
    return Rows(zeros, zeros, active_seq)


def decode_rows(
    layout: DeepSeekV4Layout, batch: DecodeBatch, seq: npt.NDArray[np.int64], A: int
) -> DecodeColumns:
    """The standard step: ``token_ids[i]`` at ``seq_len - 1``, over ``decode_seq`` (``seq``:
    :func:`checked_seq_lens`' ``A`` lengths)."""
    # argmin/argmax: a third of the instructions of two ufunc reductions on a small array
    shortest, longest = int(seq[seq.argmin()]), int(seq[seq.argmax()])
    if shortest < 1:
        raise BlockprepValueError("decode seq_lens must be positive")
    tokens = token_column(batch.token_ids, A, "token_ids")
    return DecodeColumns(tokens, seq, layout.decode_seq, longest - 1)


def mtp_rows(
    layout: DeepSeekV4Layout, batch: DecodeBatch, seq: npt.NDArray[np.int64], A: int
) -> Rows:
    """MTP verification: ``[prev, current]`` at ``(seq_len - 2, seq_len - 1)``."""
    shortest = int(seq.min())
    if shortest < layout.decode_seq:
        raise BlockprepValueError(
            f"decode seq_lens must be >= MTP sequence width ({layout.decode_seq}), got {shortest}"
        )
    previous = token_column(batch.prev_token_ids, A, "prev_token_ids")
    tokens = token_column(batch.token_ids, A, "token_ids")
    return Rows(np.stack([previous, tokens], axis=1), np.stack([seq - 2, seq - 1], axis=1), 2)


def target_rows(
    layout: DeepSeekV4Layout, token_rows: object, positions: object, active_width: object, A: int
) -> Rows:
    """Upstream's ``prepare_mtp_target_inputs`` checks, in its order."""
    S = layout.decode_seq
    ragged = _ragged(token_rows)
    if ragged is not None:
        raise BlockprepValueError(f"MTP target token rows must have shape {(A, S)}, got {ragged}")
    tokens = integer_array(token_rows, "MTP target token rows")
    if tokens.shape != (A, S):
        raise BlockprepValueError(
            f"MTP target token rows must have shape {(A, S)}, got {tuple(tokens.shape)}"
        )
    width = as_int(active_width, "active_width")
    if not 1 <= width <= S:
        raise BlockprepValueError("MTP target active width must fit the fixed decode sequence")
    if isinstance(positions, (torch.Tensor, np.ndarray)):
        places = integer_array(positions, "MTP target positions")
        aligned = places.shape == (A, S)
    else:
        if not isinstance(positions, Sequence):
            raise BlockprepTypeError("MTP target positions must be a sequence of position rows")
        aligned = len(positions) == A and all(
            isinstance(row, (Sequence, np.ndarray, torch.Tensor)) and len(row) == S
            for row in positions
        )
        places = (
            integer_array([list(row) for row in positions], "MTP target positions")
            if aligned and A
            else np.zeros((A, S), dtype=np.int64)
        )
    if not aligned:
        raise BlockprepValueError("MTP target positions must align with the fixed decode sequence")
    places = places.reshape(A, S)
    if places.size and int(places.min()) < 0:
        q, p = divmod(int(np.argmin(places)), S)
        raise BlockprepValueError(
            f"MTP target positions must not be negative: row {q} holds {int(places[q, p])} at "
            f"token {p}"
        )
    return Rows(tokens, places, width)


def _ragged(token_rows: object) -> str | None:
    """How a sequence of token rows of different lengths differs (``None`` when it does not):
    the first row whose length is not row 0's."""
    if isinstance(token_rows, (torch.Tensor, np.ndarray, str, bytes)) or not isinstance(
        token_rows, Sequence
    ):
        return None

    def size(row: object) -> str:
        if isinstance(row, (torch.Tensor, np.ndarray)) and row.ndim == 0:
            return "a scalar"
        if isinstance(row, (Sequence, np.ndarray, torch.Tensor)) and not isinstance(
            row, (str, bytes)
        ):
            return f"{len(row)} tokens"
        return f"a {type(row).__name__}"

    sizes = [size(row) for row in token_rows]
    for q, described in enumerate(sizes):
        if described != sizes[0]:
            return f"ragged rows: row {q} holds {described}, row 0 {sizes[0]}"
    return None


def token_column(values: torch.Tensor | None, A: int, name: str) -> npt.NDArray[np.int64]:
    """Column 0 of ``[A]`` or ``[A, k]`` token ids, as int64."""
    tokens = integer_array(values, name)
    if tokens.ndim == 2 and tokens.shape[0] == A and tokens.shape[1] >= 1:
        return tokens[:, 0]
    if tokens.shape != (A,):
        raise BlockprepValueError(
            f"decode {name} must have shape [{A}] or [{A}, k], got {list(tokens.shape)}"
        )
    return tokens


def host_hidden(
    batch: DecodeBatch, A: int, *, mtp: bool, host: bool, hidden_size: int | None
) -> Hidden | None:
    """``embedding="host"``: the hidden states ``[A, hidden]`` (and MTP's previous ones),
    copied to the host as float32 now, so that a copy that fails fails before any write."""
    hidden = batch.hidden_states
    if not host or hidden is None:
        return None
    expected = (A, hidden_size)
    if tuple(hidden.shape) != expected:
        raise BlockprepValueError(
            f"hidden_states must have shape {list(expected)}, got {list(hidden.shape)}"
        )
    previous = batch.prev_hidden_states
    if mtp and (previous is None or tuple(previous.shape) != expected):
        raise BlockprepValueError("MTP previous embeddings must align with draft embeddings")
    return host_float(hidden, "hidden_states"), (
        None if not mtp or previous is None else host_float(previous, "prev_hidden_states")
    )


def check_position(layout: DeepSeekV4Layout, batch: DecodeBatch, rows: StepRows) -> None:
    if isinstance(rows, DecodeColumns):
        position = rows.last_position
    else:
        position = int(rows.positions.max()) if rows.positions.size else 0
    if position >= layout.max_seq_len:
        raise_first(normalization_error(batch))
        raise BlockprepValueError(
            f"decode position {position} exceeds max_seq_len={layout.max_seq_len}"
        )


def host_float(states: torch.Tensor, name: str) -> torch.Tensor:
    """``states`` as a float32 CPU tensor; ``ValueError`` when it cannot be copied there."""
    try:
        return states.detach().to("cpu", torch.float32)
    except (RuntimeError, NotImplementedError) as error:
        raise BlockprepValueError(f"{name} cannot be copied to the host: {error}") from None


def integer_array(values: object, name: str) -> npt.NDArray[np.int64]:
    """An integer tensor (or array, or list) as an int64 NumPy array; ``TypeError`` otherwise."""
    if type(values) is torch.Tensor and values.dtype == torch.int64 and values.is_cpu:
        return values.numpy()  # the common case: a CPU int64 tensor, read in place
    if values is None:
        raise BlockprepValueError(f"decode {name} are missing")
    array = values if isinstance(values, torch.Tensor) else np.asarray(values)
    if not has_integer_dtype(array):
        raise BlockprepTypeError(f"decode {name} must be integers, got dtype {array.dtype}")
    if isinstance(array, torch.Tensor):
        if array.is_meta:
            raise BlockprepTypeError(f"decode {name} is a meta tensor (no data to read)")
        array = array.detach().cpu().numpy()
    if array.dtype.kind == "u" and array.dtype.itemsize == 8 and array.size:
        flat = array.reshape(-1)
        over = np.flatnonzero(flat > np.uint64(INT64_MAX))
        if over.size:  # astype would wrap them to negative ids
            where = np.unravel_index(int(over[0]), array.shape)
            row = int(where[0]) if where else 0
            raise BlockprepValueError(
                f"decode {name} must fit int64: row {row} holds {int(flat[over[0]])}, above "
                f"{INT64_MAX}"
            )
    return array.astype(np.int64, copy=False)
