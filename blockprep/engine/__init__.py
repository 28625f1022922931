"""The table engine's kernel: compiled (``_kernel``, C) or its pure-Python twin (``twin``).

Both provide :class:`GroupKernel` with the same signatures and results (see
:mod:`blockprep.engine.twin`, the specification). The compiled one is used when it was built and
``BLOCKPREP_PURE_PYTHON`` is not set to a non-empty value other than ``0``; :func:`kernel_backend`
says which runs. As msgpack-python does, the choice is made once, at import.
"""

from __future__ import annotations

import os

from blockprep.engine import twin

_FORCED = os.environ.get("BLOCKPREP_PURE_PYTHON", "") not in ("", "0")

if _FORCED:
    GroupKernel: type[twin.GroupKernel] = twin.GroupKernel
    BACKEND = "python"
else:
    try:
        from blockprep.engine._kernel import GroupKernel  # type: ignore[no-redef]

        BACKEND = "c"
    except ImportError:  # not built (no compiler at install time): the twin
        GroupKernel = twin.GroupKernel
        BACKEND = "python"


def kernel_backend() -> str:
    """``"c"`` when the compiled kernel runs, ``"python"`` for the pure-Python twin."""
    return BACKEND


__all__ = ["BACKEND", "GroupKernel", "kernel_backend", "twin"]
