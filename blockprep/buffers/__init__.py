"""Host buffers: persistent tensors allocated once, optionally pinned or in shared memory; the
checks every writer runs on a buffer it is handed (:func:`check_adopted`: type, dtype, shape,
device, contiguity, writable memory; :func:`claim_buffers`: no overlap within an owner's set and
one owner per byte in the process; no self-overlap for an ``out``);
and :class:`DeviceMirror`, a device copy whose copies are fenced before the host writes again."""

from blockprep.buffers.host import (
    NPU_PACKAGE,
    NamedBuffers,
    check_adopted,
    check_disjoint,
    check_no_self_overlap,
    check_writable,
    claim_buffers,
    has_self_overlap,
    host_tensor,
    mapped_writable,
    pin_memory_available,
    release_buffers,
    torch_device,
)
from blockprep.buffers.mirror import DeviceMirror, MirrorCopier, MirrorFence, wait_host_free

__all__ = [
    "NPU_PACKAGE",
    "DeviceMirror",
    "MirrorCopier",
    "MirrorFence",
    "NamedBuffers",
    "check_adopted",
    "check_disjoint",
    "check_no_self_overlap",
    "check_writable",
    "claim_buffers",
    "has_self_overlap",
    "host_tensor",
    "mapped_writable",
    "pin_memory_available",
    "release_buffers",
    "torch_device",
    "wait_host_free",
]
