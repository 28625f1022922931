"""Host buffers: persistent tensors allocated once, optionally pinned or in shared memory; the
checks every writer runs on a buffer it is handed (:func:`check_adopted`: type, dtype, shape,
device, contiguity, writable memory; :func:`claim_buffers`: no overlap within an owner's set and
one owner per byte in the process; no self-overlap for an ``out``);
and :class:`DeviceMirror`, a device copy whose copies are fenced before the host writes again."""

from __future__ import annotations

import gc
import importlib
import itertools
import math
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from blockprep.errors import (
    BlockprepIndexError,
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)
from blockprep.ids import as_int

NPU_PACKAGE = "torch_npu"
"""The package that registers torch's ``"npu"`` device (Ascend's PyTorch backend). blockprep
imports it only for an ``"npu"`` device and never lists it as a dependency: the PyPI package pins
its own torch and needs Huawei's CANN libraries, without which ``import torch`` itself fails."""


def torch_device(device: str | torch.device) -> torch.device:
    """``device`` parsed as a :class:`torch.device`, importing ``torch_npu`` first when it names
    an ``"npu"`` device (torch itself does not know the type until that package registers it).

    Raises:
        ImportError: an ``"npu"`` device and ``torch_npu`` absent, or failing to import (the
            message names the package; the import's own error is chained).
        RuntimeError: ``torch_npu`` imported but the device still does not parse (it did not
            register ``"npu"``), or any other device torch does not know.
    """
    if isinstance(device, torch.device):
        return device  # parsed already: its backend is registered
    if isinstance(device, str) and device.split(":", 1)[0].strip().lower() == "npu":
        try:
            importlib.import_module(NPU_PACKAGE)
        except Exception as error:  # absent, or present without CANN: name the package
            raise ImportError(
                f"device {device!r} needs the {NPU_PACKAGE} package (Ascend's PyTorch backend, "
                f"installed with CANN), which could not be imported: {error}. blockprep does not "
                f"install it; on a host without an NPU use device='cpu'",
                name=NPU_PACKAGE,
            ) from error
        try:
            return torch.device(device)
        except RuntimeError as error:
            raise BlockprepRuntimeError(
                f"{NPU_PACKAGE} was imported but torch still does not know device {device!r}: "
                f"{error}"
            ) from None
    return torch.device(device)


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
        ValueError: both ``pin_memory`` and ``share_memory``: torch cannot pin shared memory here;
            a negative size; a size too large to allocate (torch's error chained).
        TypeError: ``shape`` not a tuple or list of integers, ``dtype`` not a ``torch.dtype``.
    """
    if pin_memory and share_memory:
        raise BlockprepValueError("pin_memory and share_memory cannot be combined")
    if not isinstance(shape, (tuple, list)):
        raise BlockprepTypeError(f"shape must be a tuple of integers, got {type(shape).__name__}")
    sizes = tuple(as_int(size, "shape size") for size in shape)
    if any(size < 0 for size in sizes):
        raise BlockprepValueError(f"shape {sizes} has a negative size")
    if not isinstance(dtype, torch.dtype):
        raise BlockprepTypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    pin = pin_memory and pin_memory_available()
    try:
        tensor = torch.full(sizes, fill, dtype=dtype, pin_memory=pin)
    except (RuntimeError, MemoryError) as error:  # overflowed or failed allocation
        nbytes = math.prod(sizes) * dtype.itemsize
        raise BlockprepValueError(
            f"cannot allocate a host buffer of shape {sizes} and {dtype} ({nbytes} bytes)"
        ) from error
    if share_memory:
        tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


# --- checks on a buffer handed in ---------------------------------------------------------------


def check_writable(buffer: torch.Tensor | npt.NDArray[Any], name: str) -> None:
    """Raise ``ValueError("{name} is read-only memory")`` when writing ``buffer`` would fault
    (``TypeError`` for a sparse tensor: no memory to write).

    A write through a tensor over read-only memory (``torch.from_numpy`` of an array over a
    read-only ``mmap``) kills the process with SIGSEGV; this check runs before the first write.

    - NumPy arrays: their ``writeable`` flag (NumPy clears it for read-only memory).
    - CPU tensors whose storage torch allocated (resizable storages: the CPU, pinned and
      shared-memory allocators) are writable: no further work.
    - Other CPU tensors (``from_numpy``, ``frombuffer``, ``from_dlpack``): on Linux, every mapping
      under the storage's bytes in ``/proc/self/maps`` must be writable (a gap, unmapped memory,
      fails too). The answer is cached per storage for as long as the storage lives, so a
      persistent buffer pays the file read once. Elsewhere (no ``/proc/self/maps``) such memory
      is taken as writable: the fallback cannot tell.
    - Device tensors: nothing to check here.

    Memory that is writable to the OS but immutable to Python (a tensor over a ``bytes``
    object's buffer) cannot be told apart from a tensor: only the ``writeable`` flag of the NumPy
    array it came from said so.
    """
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.writeable:
            raise BlockprepValueError(f"{name} is read-only memory")
        return
    _check_strided(buffer, name)
    storage = buffer.untyped_storage()
    if storage.resizable() or buffer.device.type != "cpu":
        return
    start, nbytes = storage.data_ptr(), storage.nbytes()
    if nbytes == 0:
        return
    key = id(storage)
    with _LOCK:
        known = _WRITABLE.get(key)
        if known is not None and known[0]() is storage and known[1:] == (start, nbytes):
            return
    if mapped_writable(start, nbytes) is False:
        raise BlockprepValueError(f"{name} is read-only memory")

    def forget(ref: weakref.ref[Any], key: int = key) -> None:
        # No lock (a weakref callback may run inside a locked section); a newer entry stays.
        if _WRITABLE.get(key, (None,))[0] is ref:
            _WRITABLE.pop(key, None)

    with _LOCK:
        _WRITABLE[key] = (weakref.ref(storage, forget), start, nbytes)


def _check_strided(tensor: torch.Tensor, name: str) -> None:
    """``TypeError`` for a sparse (or any non-strided) tensor: it has no memory to write."""
    if tensor.layout != torch.strided:
        raise BlockprepTypeError(
            f"{name} must be a dense (strided) tensor, got layout {tensor.layout}"
        )


def mapped_writable(start: int, nbytes: int) -> bool | None:
    """Whether the process may write every byte of ``[start, start + nbytes)``: each mapping
    under it in ``/proc/self/maps`` writable, no gap. ``None`` where that file cannot be read
    (not Linux): unknown."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", "rb") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    position, end = start, start + nbytes
    for line in lines:  # ascending, non-overlapping address ranges
        span, perms = line.split(b" ", 2)[:2]
        low_text, high_text = span.split(b"-")
        low, high = int(low_text, 16), int(high_text, 16)
        if high <= position:
            continue
        if low > position or perms[1:2] != b"w":
            return False
        position = high
        if position >= end:
            return True
    return False


_LOCK = threading.RLock()  # re-entrant: a finalizer may run (GC) while it is held


def _new_lock() -> None:
    """In a forked child: a new lock (another thread may have held the parent's at the fork)."""
    global _LOCK
    _LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_new_lock)
_WRITABLE: dict[int, tuple[weakref.ref[Any], int, int]] = {}
"""Storages found writable: ``id(storage) -> (weak reference, data_ptr, nbytes)``."""


def check_no_self_overlap(array: npt.NDArray[Any], name: str) -> None:
    """Raise ``ValueError`` when two elements of ``array`` share memory (an ``expand``ed or
    ``as_strided`` view with a zero or overlapping stride): writing it, rows overwrite rows."""
    if has_self_overlap(array):
        shape, strides = tuple(array.shape), tuple(array.strides)
        raise BlockprepValueError(
            f"{name} overlaps itself (shape {shape}, byte strides {strides}): distinct cells "
            "share memory, so writing one row would overwrite another"
        )


def has_self_overlap(array: npt.NDArray[Any]) -> bool:
    """Whether two elements of ``array`` share a byte.

    The usual layouts decide in one pass over the dims (sorted by stride, each stride at least
    the extent of the smaller ones: no overlap); anything else (zero strides, interleaved
    strides) is decided exactly from every element's offset."""
    flags = array.flags
    if flags.c_contiguous or flags.f_contiguous or array.size <= 1:
        return False
    shape_strides = zip(array.shape, array.strides, strict=True)
    dims = sorted((abs(stride), size) for size, stride in shape_strides if size > 1)
    extent = array.itemsize
    for stride, size in dims:
        if stride < extent:
            break
        extent += stride * (size - 1)
    else:
        return False
    offsets = np.zeros(1, dtype=np.int64)
    for stride, size in dims:
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    offsets.sort()
    return bool(np.any(np.diff(offsets) < array.itemsize))


def check_adopted(
    tensor: object,
    where: str,
    *,
    dtype: torch.dtype | None = None,
    shapes: Sequence[tuple[int, ...]] = (),
) -> torch.Tensor:
    """``tensor`` as a buffer a caller hands in to be written: the one check every owner runs.

    In order: a ``torch.Tensor`` (``TypeError``); of ``dtype`` (when given) on the CPU, dense
    (``TypeError``); of one of ``shapes`` (when given, ``ValueError``); contiguous, not
    requiring grad, over writable memory (:func:`check_writable`), each a ``ValueError``. Every
    message starts with ``where``. Overlap with the owner's other buffers is
    :func:`claim_buffers`'s check.
    """
    if not isinstance(tensor, torch.Tensor):
        raise BlockprepTypeError(f"{where} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtype is not None and (tensor.dtype != dtype or tensor.device.type != "cpu"):
        kind = str(dtype).removeprefix("torch.")
        article = "an" if kind[0] in "aeiou" else "a"
        raise BlockprepTypeError(
            f"{where} must be {article} {kind} CPU tensor, got {tensor.dtype} on {tensor.device}"
        )
    if tensor.device.type != "cpu":
        raise BlockprepTypeError(f"{where} must be a CPU tensor, got one on {tensor.device}")
    _check_strided(tensor, where)
    if shapes and tuple(tensor.shape) not in shapes:
        wanted = " or ".join(str(shape) for shape in shapes)
        raise BlockprepValueError(f"{where} must have shape {wanted}, got {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise BlockprepValueError(f"{where} must be contiguous")
    if tensor.requires_grad:
        raise BlockprepValueError(f"{where} must not require grad")
    check_writable(tensor, where)  # read-only memory: an error here, not SIGSEGV later
    return tensor


NamedBuffers = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
"""Buffers by the name an error gives them: a mapping, or ``(name, tensor)`` pairs."""


def check_disjoint(buffers: NamedBuffers) -> None:
    """``ValueError`` naming both when two of ``buffers`` share a byte (``seq_lens`` and
    ``slot_mapping`` given as one tensor, a ``counts`` tensor over a table's last row): one
    owner's writes to one would overwrite the other. CPU tensors; others are skipped."""
    spans = sorted(_spans(_named(buffers)))
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise BlockprepValueError(f"{second} overlaps {first}: give each buffer its own memory")


def claim_buffers(owner: object, buffers: NamedBuffers, what: str) -> None:
    """Register ``buffers``' bytes as ``owner``'s until ``owner`` is garbage-collected: one owner
    per byte across every owner in the process (``BlockTable``, ``GroupedTables``, the
    preparers).

    Raises ``ValueError`` (nothing claimed) when two of ``buffers`` overlap
    (:func:`check_disjoint`), or when one overlaps a buffer another live owner claimed: two
    owners over the same memory would each trust a row cache that the other one's writes
    falsify. The claims are released when ``owner`` is collected; an owner kept alive only by a
    reference cycle is collected (``gc.collect()``) before refusing. ``what`` names the owner's
    kind in the other owner's error. Empty and non-CPU tensors claim nothing.
    """
    named = _named(buffers)
    check_disjoint(named)
    spans = _spans(named)
    if not spans:
        return
    keys: list[int] = []
    for attempt in range(2):
        with _LOCK:  # check and claim at once: two threads cannot both claim the same bytes
            clashes = [(span, other) for span in spans if (other := _clash(*span[:2]))]
            if not clashes:
                keys = [next(_CLAIM_KEYS) for _ in spans]
                for key, (start, end, _) in zip(keys, spans, strict=True):
                    _CLAIMS[key] = (start, end, what)
                break
        if attempt == 0:
            gc.collect()  # a dead owner in a reference cycle still holds its claim
    else:
        (start, end, where), other = clashes[0]
        raise BlockprepValueError(
            f"{where} overlaps the buffer of another live {other} "
            f"(bytes {start:#x}..{end:#x}); give each {what} its own memory"
        )
    finalizer = weakref.finalize(owner, _release, keys)
    with _LOCK:
        _FINALIZERS.setdefault(owner, []).append(finalizer)


def release_buffers(owner: object) -> None:
    """Release every claim of ``owner`` now (as its collection would): for an owner replaced by
    a new one over the same buffers (a preparer rebinding its tables). A no-op when it holds
    none."""
    with _LOCK:
        finalizers = _FINALIZERS.pop(owner, [])
    for finalizer in finalizers:
        finalizer()


def _named(buffers: NamedBuffers) -> list[tuple[str, torch.Tensor]]:
    if isinstance(buffers, Mapping):
        return list(buffers.items())
    return list(buffers)


def _spans(buffers: list[tuple[str, torch.Tensor]]) -> list[tuple[int, int, str]]:
    """``(first byte, end, name)`` of each non-empty CPU buffer (contiguous: checked before)."""
    spans = []
    for where, buffer in buffers:
        nbytes = buffer.numel() * buffer.element_size()
        if nbytes and buffer.device.type == "cpu":
            start = buffer.data_ptr()
            spans.append((start, start + nbytes, where))
    return spans


def _clash(start: int, end: int) -> str | None:
    while True:  # a finalizer (the garbage collector, at any allocation) may release a claim
        try:
            claims = tuple(_CLAIMS.values())
            break
        except RuntimeError:  # "dictionary changed size during iteration": take it again
            continue
    for low, high, what in claims:
        if low < end and start < high:
            return what
    return None


def _release(keys: list[int]) -> None:
    for key in keys:
        _CLAIMS.pop(key, None)  # atomic; no lock: a finalizer may run inside a locked section


_CLAIMS: dict[int, tuple[int, int, str]] = {}
"""Claimed buffers: ``key -> (first byte, end, what)``."""
_FINALIZERS: weakref.WeakKeyDictionary[Any, list[weakref.finalize[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)
"""Per live owner, the finalizers that release its claims (for :func:`release_buffers`)."""
_CLAIM_KEYS = itertools.count()


# --- device mirror -------------------------------------------------------------------------------


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
