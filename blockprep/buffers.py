"""Host buffers: persistent tensors allocated once, optionally pinned or in shared memory."""

from __future__ import annotations

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
