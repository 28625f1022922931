"""Which implementation runs, compiled or pure Python, decided once at import.

``BLOCKPREP_PURE_PYTHON`` set (to anything but ``""`` or ``"0"``) forces pure Python everywhere
(:data:`FORCED_PURE_PYTHON`). Otherwise the compiled modules run where they were built:
:data:`diff_lists` here (``blockprep._differ``, the block-list encoders' compiled step, or
``None``), and the table engine's kernel (:mod:`blockprep._engine`, which reads
:data:`FORCED_PURE_PYTHON` from here). A module of its own so that :mod:`blockprep.wire`, below
the engine, can take the encoders' step. Imports nothing from blockprep.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

FORCED_PURE_PYTHON = os.environ.get("BLOCKPREP_PURE_PYTHON", "") not in ("", "0")
"""Whether ``BLOCKPREP_PURE_PYTHON`` forced the twin."""

DiffLists = Callable[..., tuple[Any, int, dict[Any, Any]] | None]
"""``diff_lists(held, request_ids, block_lists, names, as_ops=False)``: one encoder step,
``(payload or wire rows, record count, new held copies)``, or ``None`` (nothing changed) for a
step it does not take, which the encoder's Python code then takes (the specification)."""

diff_lists: DiffLists | None
if TYPE_CHECKING or FORCED_PURE_PYTHON:
    diff_lists = None
else:
    try:
        from blockprep._differ import diff_lists
    except ImportError:  # not built: blockprep._engine logs the fallback (they build together)
        diff_lists = None
