"""Padded token buffers: the ``[batch, width]`` token ABI whose padding columns are written once.

A compiled decode program may read a token buffer wider than one token per row (upstream Qwen:
``SAMPLED_IDS_PAD = 8`` columns, the same layout as its sampled-ids output) and requires columns
``1..width-1`` to hold 0. Upstream once zeroed the whole buffer every step; the padding never
changes, so :class:`PaddedTokenBuffer` zeroes it once and afterwards writes column 0 only.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import as_int, has_integer_dtype, is_integer_id
from blockprep.buffers import check_writable, host_tensor
from blockprep.errors import BlockprepIndexError, BlockprepTypeError, BlockprepValueError


class PaddedTokenBuffer:
    """A persistent ``[batch, width]`` token buffer: column 0 holds tokens, the rest 0.

    Args:
        batch: rows (the compiled batch size), positive.
        width: columns, at least 1.
        dtype: an integer dtype (upstream: int32).
        buffer: adopt this CPU tensor of shape ``[batch, width]`` and ``dtype`` instead of
            allocating one; its padding is zeroed now.
        pin_memory, share_memory: how to allocate (see :func:`blockprep.buffers.host_tensor`).

    The padding columns are zeroed when the buffer is made or adopted and by :meth:`reset`, and
    never written otherwise.

    Tokens are integers: a ``float`` (``11.7``), a ``bool``, a float or bool array or tensor is a
    ``TypeError`` naming the row and the value, never truncated or taken as 0/1; NumPy integers
    and 0-d integer arrays are converted. A token outside ``dtype`` is a ``ValueError`` naming the
    row. Nothing is written on any error.
    """

    def __init__(
        self,
        batch: int,
        width: int,
        *,
        dtype: torch.dtype = torch.int32,
        buffer: torch.Tensor | None = None,
        pin_memory: bool = False,
        share_memory: bool = False,
    ) -> None:
        batch, width = as_int(batch, "batch"), as_int(width, "width")
        if batch <= 0:
            raise BlockprepValueError(f"batch must be positive, got {batch}")
        if width < 1:
            raise BlockprepValueError("compiled decode token buffer must have at least one column")
        if not isinstance(dtype, torch.dtype):
            raise BlockprepTypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise BlockprepTypeError(f"dtype must be an integer dtype, got {dtype}")
        if buffer is None:
            buffer = host_tensor(
                (batch, width), dtype, fill=0, pin_memory=pin_memory, share_memory=share_memory
            )
        elif not isinstance(buffer, torch.Tensor):
            raise BlockprepTypeError(f"buffer must be a torch.Tensor, got {type(buffer).__name__}")
        elif tuple(buffer.shape) != (batch, width) or buffer.dtype != dtype:
            raise BlockprepValueError(
                f"buffer must be {dtype} of shape {(batch, width)}, "
                f"got {buffer.dtype} of shape {tuple(buffer.shape)}"
            )
        elif buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise BlockprepValueError("buffer must be a contiguous CPU tensor")
        check_writable(buffer, "buffer")  # a tensor over read-only memory: no SIGSEGV
        self._tensor = buffer
        self._rows: npt.NDArray[Any] = buffer.numpy()
        self._column = self._rows[:, 0]  # what a step writes
        self._wide = self._rows.dtype in (np.dtype(np.int32), np.dtype(np.int64))  # paged_step's
        info = np.iinfo(self._rows.dtype)
        self._low, self._high = int(info.min), int(info.max)
        self.reset()

    @property
    def tensor(self) -> torch.Tensor:
        """The persistent buffer (same object and address for life)."""
        return self._tensor

    def numpy(self) -> npt.NDArray[Any]:
        """A NumPy view sharing the buffer's memory."""
        return self._rows

    @property
    def int_column(self) -> npt.NDArray[Any] | None:
        """Column 0 (what a step writes) as a NumPy view when the buffer is int32 or int64, the
        types a compiled writer takes; ``None`` for any other dtype."""
        return self._column if self._wide else None

    def reset(self) -> None:
        """Zero the padding columns again (after anything else wrote the buffer)."""
        self._rows[:, 1:] = 0

    def check_tokens(self, tokens: list[int]) -> None:
        """Raise ``TypeError`` naming the first row whose token is not an integer (``bool`` and
        ``float`` included), ``ValueError`` naming the first row whose token does not fit the
        dtype, or when there are more tokens than rows."""
        self.check_int_tokens(_token_list(tokens))

    def check_int_tokens(self, tokens: list[int]) -> None:
        """:meth:`check_tokens` of a list known to hold ints only (an integer tensor's
        ``tolist()``): the count and range checks, same messages."""
        if len(tokens) > len(self._rows):
            raise BlockprepValueError(
                f"{len(tokens)} tokens for a token buffer of {len(self._rows)} rows"
            )
        if not tokens or (self._low <= min(tokens) and max(tokens) <= self._high):
            return
        for row, token in enumerate(tokens):
            if not self._low <= token <= self._high:
                raise BlockprepValueError(
                    f"token row {row} holds token id {token}, outside {self._rows.dtype}"
                )

    def fits(self, tokens: npt.NDArray[Any]) -> bool:
        """Whether an integer array of tokens fits the dtype and the rows (no message: on
        ``False``, :meth:`check_tokens` on its ``tolist()`` names the row)."""
        if len(tokens) > len(self._rows) or tokens.dtype.kind not in "iu":
            return False
        if not len(tokens) or tokens.dtype == self._rows.dtype:
            return True
        low, high = np.minimum.reduce(tokens), np.maximum.reduce(tokens)
        return bool(self._low <= low and high <= self._high)

    def write_array(self, tokens: npt.NDArray[Any] | list[int]) -> None:
        """Write ``tokens[i]`` into column 0 of row ``i``, unchecked: call :meth:`fits` (or
        :meth:`check_tokens`) first."""
        self._column[: len(tokens)] = tokens

    def write(self, tokens: list[int]) -> None:
        """Write ``tokens[i]`` into column 0 of row ``i``; checked first (see
        :meth:`check_tokens`), so a bad token writes nothing. ``tokens``: a list or tuple of
        integers, or a 1-D integer array or tensor."""
        values = _token_list(tokens)
        self.check_tokens(values)
        self._rows[: len(values), 0] = values

    def replicate(self, src: int, start: int) -> None:
        """Copy row ``src``'s token into column 0 of rows ``start..batch-1`` (batch padding).

        Raises:
            IndexError: ``src`` outside ``[0, batch)`` or ``start`` outside ``[0, batch]``
                (negative indexes are not taken from the end); nothing is written.
            TypeError: a non-integer index.
        """
        batch = len(self._rows)
        src_index = as_int(src, "replicate src")
        start_index = as_int(start, "replicate start")
        if not 0 <= src_index < batch:
            raise BlockprepIndexError(
                f"replicate src {src_index} is out of range for {batch} token rows"
            )
        if not 0 <= start_index <= batch:
            raise BlockprepIndexError(
                f"replicate start {start_index} is out of range for {batch} token rows"
            )
        self._rows[start_index:, 0] = self._rows[src_index, 0]


def _token_list(tokens: object) -> list[int]:
    """``tokens`` as a list of plain ints, checked: ``TypeError`` naming the row and value for a
    token that is not an integer, or for a container that is not a sequence of tokens."""
    if isinstance(tokens, (np.ndarray, torch.Tensor)):
        if (
            tokens.ndim != 1
            or not has_integer_dtype(tokens)
            or (isinstance(tokens, torch.Tensor) and tokens.is_meta)
        ):
            raise BlockprepTypeError(
                f"tokens must be a 1-D integer array or tensor, got {tokens.dtype} of shape "
                f"{tuple(tokens.shape)}" + (" on meta" if getattr(tokens, "is_meta", False) else "")
            )
        values: list[int] = tokens.tolist()
        return values
    if type(tokens) is not list:
        if not isinstance(tokens, (list, tuple)):
            raise BlockprepTypeError(
                f"tokens must be a list of token ids, got {type(tokens).__name__}"
            )
        tokens = list(tokens)
    if set(map(type, tokens)) <= {int}:  # the common case, decided in C
        return tokens
    ints = []
    for row, token in enumerate(tokens):
        if not is_integer_id(token):
            name = type(token).__name__
            raise BlockprepTypeError(
                f"token row {row} holds {token!r} of type {name}; token ids must be integers"
            )
        ints.append(operator.index(token))
    return ints
