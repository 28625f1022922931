"""Stand-in for ``simpler.worker``."""

from __future__ import annotations

from typing import Any


class Worker:
    """Never started here: the unit suite replaces it where it runs one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stand-in simpler.worker.Worker: no NPU runtime here")
