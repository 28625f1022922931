"""DeviceMirror: a device copy of a persistent host buffer whose copies are fenced before the host
writes again."""

from __future__ import annotations

from typing import Protocol

import torch

from blockprep._ids import as_int
from blockprep.buffers.host import torch_device
from blockprep.errors import (
    BlockprepIndexError,
    BlockprepTypeError,
    BlockprepValueError,
)


class MirrorFence(Protocol):
    """Marks a point in a device's queue of copies (an event recorded after them)."""

    def synchronize(self) -> None:
        """Return once every copy issued before the fence was recorded has read its source."""


class MirrorCopier(Protocol):
    """How a :class:`DeviceMirror` copies: asynchronous copies, then a fence after them.

    The default issues ``dst.copy_(src, non_blocking=True)`` on the current stream and records a
    device event (``torch.Event``); tests inject a stand-in whose copies run later."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Queue a copy of ``src`` (host) into ``dst`` (device); it may read ``src`` later."""

    def record(self) -> MirrorFence:
        """A fence after every copy queued so far."""


class _DoneFence:
    def synchronize(self) -> None:
        return None


class _TorchCopier:
    """``copy_(non_blocking=True)`` and a device event; synchronous copies on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def record(self) -> MirrorFence:
        if self._device.type in ("cpu", "meta"):  # copies done on return, or no data at all
            return _DoneFence()
        event_type = getattr(torch, "Event", None)
        if event_type is not None:
            event = event_type(device=self._device)
        else:  # torch before the generic Event: the backend's own
            event = getattr(torch, self._device.type).Event()
        event.record()
        fence: MirrorFence = event
        return fence


class DeviceMirror:
    """A device-side copy of a persistent host buffer, refreshed row by row.

    On device ``"cpu"`` the host buffer *is* the buffer (``tensor`` returns it, :meth:`sync` does
    nothing), unless ``separate=True`` asks for a distinct CPU copy (useful to test a mirror
    without an accelerator). On ``"cuda"`` or ``"npu"`` (``torch_npu`` imported first, see
    :func:`torch_device`) a device tensor of the same shape and dtype is allocated once;
    :meth:`sync` copies the given rows (dim 0), or everything, with ``non_blocking=True``.

    The copies read the host buffer when the device runs them, which may be after :meth:`sync`
    returns. So each :meth:`sync` records a fence after its copies, and whoever writes the host
    buffer next calls :meth:`wait_host_free` first (it waits on that fence: the copies of step N
    have read step N's values before step N+1 overwrites them). :func:`wait_host_free` waits on
    several mirrors. ``copier`` replaces how copies and fences are made (a :class:`MirrorCopier`;
    tests pass one whose copies are deferred).

    Raises ``TypeError`` when ``host`` is not a tensor or ``device`` not a str or
    :class:`torch.device`; ``ValueError`` when ``host`` is not on the CPU, for a device torch does
    not know, or one this torch build cannot use (``"cuda"`` without CUDA); ``ImportError`` for
    ``"npu"`` without ``torch_npu`` (see :func:`torch_device`).
    """

    def __init__(
        self,
        host: torch.Tensor,
        device: str | torch.device,
        *,
        separate: bool = False,
        copier: MirrorCopier | None = None,
    ) -> None:
        if not isinstance(host, torch.Tensor):
            raise BlockprepTypeError(f"host must be a torch.Tensor, got {type(host).__name__}")
        if host.device.type != "cpu":
            raise BlockprepValueError(f"host must be a CPU tensor, got one on {host.device}")
        if not isinstance(device, (str, torch.device)):
            raise BlockprepTypeError(
                f"device must be a str or torch.device, got {type(device).__name__}"
            )
        try:
            device = torch_device(device)  # imports torch_npu before parsing "npu"
        except RuntimeError as error:
            raise BlockprepValueError(f"unknown device {device!r}") from error
        self._host = host
        self._shared = device.type == "cpu" and not separate
        try:
            self._tensor = host if self._shared else torch.empty_like(host, device=device)
        except (RuntimeError, AssertionError) as error:  # "not compiled with CUDA", no device
            raise BlockprepValueError(
                f"device {str(device)!r} is not available to this torch build (its error is "
                "chained)"
            ) from error
        self._copier: MirrorCopier = _TorchCopier(device) if copier is None else copier
        self._fence: MirrorFence | None = None
        if not self._shared:
            self._copier.copy(self._tensor, host)
            self._fence = self._copier.record()

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
            self._copier.copy(self._tensor, self._host)
            self._fence = self._copier.record()
            return
        ordered = sorted({as_int(row, "mirror row") for row in rows})
        if ordered and (ordered[0] < 0 or ordered[-1] >= len(self._host)):
            bad = ordered[0] if ordered[0] < 0 else ordered[-1]
            raise BlockprepIndexError(
                f"mirror row {bad} is out of range for {len(self._host)} rows"
            )
        if not ordered:
            return
        for start, stop in _runs(ordered):
            self._copier.copy(self._tensor[start:stop], self._host[start:stop])
        self._fence = self._copier.record()

    def wait_host_free(self) -> None:
        """Return once every copy :meth:`sync` issued has read the host buffer: the host buffer
        may be written again. Call before writing it (a no-op when nothing is pending)."""
        fence = self._fence
        if fence is not None:
            fence.synchronize()
            self._fence = None

    @property
    def pending(self) -> bool:
        """Whether copies may still read the host buffer (:meth:`wait_host_free` would wait)."""
        return self._fence is not None


def wait_host_free(*mirrors: DeviceMirror) -> None:
    """:meth:`DeviceMirror.wait_host_free` on each of ``mirrors``: call before writing their
    host buffers."""
    for mirror in mirrors:
        mirror.wait_host_free()


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Ascending ``rows`` as ``[start, stop)`` runs of consecutive rows (fewer, larger copies)."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs
