"""The table engine's kernel: compiled (``_kernel``, C) or its pure-Python twin (``twin``).

Both provide ``GroupKernel`` with the same signatures and results (see
:mod:`blockprep.engine.twin`, the specification), and ``index_records``, the index of a packed
message's records (the twin: :func:`blockprep.packed.index_records`), and ``diff_lists``, the
packed differ's compiled step (``None`` under the twin: the differ's Python code,
:meth:`blockprep.events.PackedDeltaEncoder.encode`, is its specification, and it returns
``None`` for any step it does not take, having changed nothing). The compiled ones are
used when they were built and ``BLOCKPREP_PURE_PYTHON`` is not set (to anything but ``""`` or
``"0"``); :func:`kernel_backend` says which runs. As msgpack-python does, the choice is made
once, at import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from blockprep import log, packed
from blockprep.engine import twin

FORCED_PURE_PYTHON = os.environ.get("BLOCKPREP_PURE_PYTHON", "") not in ("", "0")
"""Whether ``BLOCKPREP_PURE_PYTHON`` forced the twin."""

if TYPE_CHECKING:  # both kernels have the twin's signatures
    from blockprep.engine.twin import GroupKernel
    from blockprep.packed import index_records

    diff_lists: Callable[..., tuple[bytes, int, dict[Any, Any]] | None] | None
    BACKEND = "python"
elif FORCED_PURE_PYTHON:
    GroupKernel = twin.GroupKernel
    index_records = packed.index_records
    diff_lists = None
    BACKEND = "python"
else:
    try:
        from blockprep.engine._kernel import GroupKernel, diff_lists, index_records

        BACKEND = "c"
    except ImportError as error:  # not built (no compiler at install time): the twin
        GroupKernel = twin.GroupKernel
        index_records = packed.index_records
        diff_lists = None
        BACKEND = "python"
        log.fallback(error)  # a WARNING record, once (not when forced)


def kernel_backend() -> str:
    """``"c"`` when the compiled kernel runs, ``"python"`` for the pure-Python twin."""
    return BACKEND


__all__ = [
    "BACKEND",
    "FORCED_PURE_PYTHON",
    "GroupKernel",
    "diff_lists",
    "index_records",
    "kernel_backend",
    "twin",
]
