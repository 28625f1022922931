"""The table engine's kernel: compiled (``_kernel``, C) or its pure-Python twin (``twin``).

Both provide ``GroupKernel`` with the same signatures and results (see
:mod:`blockprep.engine.twin`, the specification). The compiled one is used when it was built and
``BLOCKPREP_PURE_PYTHON`` is not set (to anything but ``""`` or ``"0"``); :func:`kernel_backend`
says which runs. As msgpack-python does, the choice is made once, at import.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from blockprep import log
from blockprep.engine import twin

FORCED_PURE_PYTHON = os.environ.get("BLOCKPREP_PURE_PYTHON", "") not in ("", "0")
"""Whether ``BLOCKPREP_PURE_PYTHON`` forced the twin."""

if TYPE_CHECKING:  # both kernels have the twin's signatures
    from blockprep.engine.twin import GroupKernel

    BACKEND = "python"
elif FORCED_PURE_PYTHON:
    GroupKernel = twin.GroupKernel
    BACKEND = "python"
else:
    try:
        from blockprep.engine._kernel import GroupKernel

        BACKEND = "c"
    except ImportError as error:  # not built (no compiler at install time): the twin
        GroupKernel = twin.GroupKernel
        BACKEND = "python"
        log.fallback(error)  # a WARNING record, once (not when forced)


def kernel_backend() -> str:
    """``"c"`` when the compiled kernel runs, ``"python"`` for the pure-Python twin."""
    return BACKEND


__all__ = ["BACKEND", "FORCED_PURE_PYTHON", "GroupKernel", "kernel_backend", "twin"]
