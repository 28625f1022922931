"""Stand-in for ``pypto.runtime``: device tensor handles and the run configuration."""

from __future__ import annotations

import dataclasses
from typing import Any


class DeviceTensor:
    """A worker-resident tensor handle: an address, a shape, a dtype."""

    def __init__(self, ptr: int, shape: Any, dtype: Any, *args: Any, **kwargs: Any) -> None:
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), dtype
        self.args, self.kwargs = args, kwargs

    def data_ptr(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"DeviceTensor({self.ptr:#x}, {self.shape}, {self.dtype})"


class StackedDeviceTensor:
    """One shard per worker of a buffer stacked on its first axis."""

    def __init__(self, shards: Any, full_shape: Any, worker_ids: Any) -> None:
        self.shards, self.worker_ids = list(shards), tuple(worker_ids)
        self.full_shape = self.shape = tuple(full_shape)


@dataclasses.dataclass
class RunConfig:
    """The runtime's configuration (a dataclass: upstream's compiler ``replace``s fields)."""

    platform: Any = None
    device_id: int = 0
    backend_type: Any = None
    codegen_only: bool = False
    save_kernels: bool = False
    save_kernels_dir: Any = None
    distributed_config: Any = None


class DistributedWorker:
    """Never started here: the unit suite replaces it (monkeypatch) where it runs one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("stand-in pypto.runtime.DistributedWorker: no NPU runtime here")
