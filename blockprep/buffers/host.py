"""Host buffers: persistent tensors allocated once, optionally pinned or in shared memory, and the
checks every writer runs on a buffer it is handed (:func:`check_adopted`: type, dtype, shape,
device, contiguity, writable memory; :func:`claim_buffers`: no overlap within an owner's set and
one owner per byte in the process; no self-overlap for an ``out``)."""

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
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from blockprep._ids import as_int
from blockprep.errors import (
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)

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
