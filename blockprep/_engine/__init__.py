"""The table engine's kernel: compiled (``_kernel``, C) or its pure-Python twin (``twin``).

Both provide ``GroupKernel`` with the same signatures and results (see
:mod:`blockprep._engine.twin`, the specification) and these functions:

- ``index_records``: the index of a packed message's records (the twin:
  :func:`blockprep.packed.index_records`);
- ``step_slots`` (a paged decode step's slots), ``paged_step`` (those slots, the tokens and the
  lengths written in one call) and ``differing_rows`` (where two lists of ids differ); the twin:
  :mod:`blockprep._engine.dynamic`.

The compiled ones are used when they were built and ``BLOCKPREP_PURE_PYTHON`` is not set (to
anything but ``""`` or ``"0"``; :mod:`blockprep._backend`, which also holds the encoders' compiled
step, ``diff_lists``); :func:`kernel_backend` says which runs. As msgpack-python does, the choice
is made once, at import; it is "c" only when both compiled modules were built. Where they were
not, importing blockprep warns (:func:`warn_fallback`), unless the twin was asked for.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from blockprep import _backend, packed
from blockprep._backend import FORCED_PURE_PYTHON
from blockprep._engine import dynamic, twin

TWIN_COST = "4-7x"
"""How much slower a DeepSeek V4 step runs on the twin than on the compiled kernel: the median step
of the bench's ``blockprep`` construction on the DeepSeek V4 wire workloads, 5 runs in turns on
2 loaded cores (by value 4.1x, by delta 4.6x, cold 7.3x; ``bench/twin_cost.py``)."""


def warn_fallback(error: ImportError) -> None:
    """A ``RuntimeWarning`` (shown without any logging set up): the compiled kernel did not
    import, why, what the twin costs, and how to build it or silence the warning."""
    warnings.warn(
        f"blockprep: the compiled table kernel was not built or did not import ({error}); the "
        f"pure-Python twin runs instead, with the same results but {TWIN_COST} slower per "
        "DeepSeek V4 step. To build it, install a C compiler and the Python headers (for "
        "example: apt-get install gcc python3-dev) and reinstall blockprep from source "
        "(pip install --force-reinstall --no-binary blockprep blockprep, or pip install -e . in "
        "a checkout); set BLOCKPREP_PURE_PYTHON=1 to choose the twin and silence this warning.",
        RuntimeWarning,
        stacklevel=2,
    )


if TYPE_CHECKING:  # both kernels have the twin's signatures
    from blockprep._engine.dynamic import (
        differing_rows,
        paged_step,
        step_slots,
    )
    from blockprep._engine.twin import GroupKernel
    from blockprep.packed import index_records

    BACKEND = "python"
elif FORCED_PURE_PYTHON:
    GroupKernel = twin.GroupKernel
    index_records = packed.index_records
    step_slots, paged_step = dynamic.step_slots, dynamic.paged_step
    differing_rows = dynamic.differing_rows
    BACKEND = "python"
else:
    try:
        from blockprep._engine._kernel import (
            GroupKernel,
            differing_rows,
            index_records,
            paged_step,
            step_slots,
        )

        if _backend.diff_lists is None:
            raise ImportError("blockprep._differ was not built")
        BACKEND = "c"
    except ImportError as error:  # not built (no compiler at install time): the twin
        GroupKernel = twin.GroupKernel
        index_records = packed.index_records
        step_slots, paged_step = dynamic.step_slots, dynamic.paged_step
        differing_rows = dynamic.differing_rows
        _backend.diff_lists = None  # one backend for everything
        BACKEND = "python"
        warn_fallback(error)  # a RuntimeWarning, once (not when forced)


def kernel_buffer(array: npt.NDArray[Any]) -> Any:
    """What the kernel's calls are given for ``array``, a persistent NumPy buffer: with the
    compiled kernel a memoryview of it, made once (taking a memoryview's buffer costs about 50
    instructions, a NumPy array's about 500: NumPy describes the array anew at each export);
    with the twin, which reads NumPy arrays directly, the array itself."""
    return memoryview(array) if BACKEND == "c" else array  # type: ignore[arg-type]


def kernel_backend() -> str:
    """``"c"`` when the compiled kernel runs, ``"python"`` for the pure-Python twin."""
    return BACKEND


__all__ = [
    "BACKEND",
    "FORCED_PURE_PYTHON",
    "GroupKernel",
    "differing_rows",
    "index_records",
    "kernel_backend",
    "kernel_buffer",
    "paged_step",
    "step_slots",
    "twin",
]
