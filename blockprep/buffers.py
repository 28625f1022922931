"""Host buffers: persistent tensors allocated once, optionally pinned or in shared memory."""

from __future__ import annotations

import importlib

import torch


def pin_memory_available() -> bool:
    """Whether page-locked host memory can be allocated (an accelerator backend is present)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


def host_tensor(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    fill: int | float,
    pin_memory: bool = False,
    share_memory: bool = False,
) -> torch.Tensor:
    """A new CPU tensor of ``shape`` and ``dtype`` filled with ``fill``.

    ``pin_memory=True`` page-locks it when an accelerator is present (:func:`pin_memory_available`)
    and is a no-op otherwise, so that one configuration runs on both. ``share_memory=True`` moves it
    into shared memory, which processes forked afterwards see. Its address is final on return.

    Raises:
        ValueError: both ``pin_memory`` and ``share_memory``: torch cannot pin shared memory here.
    """
    if pin_memory and share_memory:
        raise ValueError("pin_memory and share_memory cannot be combined")
    pin = pin_memory and pin_memory_available()
    tensor = torch.full(shape, fill, dtype=dtype, pin_memory=pin)
    if share_memory:
        tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


class DeviceMirror:
    """A device-side copy of a persistent host buffer, refreshed row by row.

    On device ``"cpu"`` the host buffer *is* the buffer (``tensor`` returns it, :meth:`sync` does
    nothing), unless ``separate=True`` asks for a distinct CPU copy (useful to test a mirror
    without an accelerator). On ``"cuda"`` or ``"npu"`` (``torch_npu`` is imported when present)
    a device tensor of the same shape and dtype is allocated once; :meth:`sync` copies the given
    rows (dim 0), or everything, with ``non_blocking=True``.
    """

    def __init__(
        self, host: torch.Tensor, device: str | torch.device, *, separate: bool = False
    ) -> None:
        device = torch.device(device)
        if device.type == "npu":
            importlib.import_module("torch_npu")
        self._host = host
        self._shared = device.type == "cpu" and not separate
        self._tensor = host if self._shared else torch.empty_like(host, device=device)
        if not self._shared:
            self._tensor.copy_(host)

    @property
    def tensor(self) -> torch.Tensor:
        """The buffer the device program reads (the host buffer itself on a plain CPU mirror)."""
        return self._tensor

    @property
    def is_host(self) -> bool:
        """Whether :attr:`tensor` is the host buffer itself (nothing to copy)."""
        return self._shared

    def sync(self, rows: list[int] | None = None) -> None:
        """Copy ``rows`` of the host buffer (all of it when ``None``) to the device copy.

        Raises:
            IndexError: a row out of range (nothing is copied).
        """
        if self._shared:
            return
        if rows is None:
            self._tensor.copy_(self._host, non_blocking=True)
            return
        ordered = sorted(set(rows))
        if ordered and (ordered[0] < 0 or ordered[-1] >= len(self._host)):
            bad = ordered[0] if ordered[0] < 0 else ordered[-1]
            raise IndexError(f"mirror row {bad} is out of range for {len(self._host)} rows")
        for start, stop in _runs(ordered):
            self._tensor[start:stop].copy_(self._host[start:stop], non_blocking=True)


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending ``rows`` as ``[start, stop)`` runs of consecutive rows (fewer, larger copies)."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs
