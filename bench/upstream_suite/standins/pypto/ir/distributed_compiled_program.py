"""Stand-in for ``pypto.ir.distributed_compiled_program``."""

from __future__ import annotations

from typing import Any


class DistributedConfig:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)


class DistributedCompiledProgram:
    """A compiled program: never compiled here (the unit suite fakes it)."""

    @classmethod
    def from_dir(cls, *args: Any, **kwargs: Any) -> DistributedCompiledProgram:
        raise RuntimeError("stand-in DistributedCompiledProgram: no PyPTO compiler here")
