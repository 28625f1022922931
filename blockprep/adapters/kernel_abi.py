"""Recorded kernel ABIs, model-neutral: a prepared argument's spec and the positional tuple by name.

A compiled decode kernel upstream takes its arguments by position (``worker.run(compiled,
*args)``). The model modules (:mod:`blockprep.adapters.qwen_abi`,
:mod:`blockprep.adapters.deepseek.abi`) record each kernel's argument names in order, as read
from upstream's source; this module holds what they share: :class:`ArgSpec` (where a prepared
argument sits and what it must be) and :func:`build_arguments` (the positional tuple from values
given by name, every missing, unknown or doubly given name reported at once).

Nothing here imports an NPU package (``torch_npu``, ``pypto``, ``simpler``): the ABI is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from blockprep.errors import BlockprepTypeError, BlockprepValueError


@dataclass(frozen=True)
class ArgSpec:
    """One prepared kernel argument: its name, 0-based position in the kernel's positional
    arguments, and the shape and dtype of the tensor passed there."""

    name: str
    position: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    def check(self, value: object, where: str | None = None) -> None:
        """Raise unless ``value`` is a tensor of this spec's shape and dtype; errors name it
        ``where`` (default: the argument's name).

        Raises:
            TypeError: ``"{where} must be a torch.Tensor, got {type}"``, or ``"{where} must be
                {dtype}, got {dtype}"``.
            ValueError: ``"{where} must have shape {shape}, got {shape}"``.
        """
        where = self.name if where is None else where
        if not isinstance(value, torch.Tensor):
            raise BlockprepTypeError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype != self.dtype:
            raise BlockprepTypeError(f"{where} must be {self.dtype}, got {value.dtype}")
        if tuple(value.shape) != self.shape:
            raise BlockprepValueError(
                f"{where} must have shape {list(self.shape)}, got {list(value.shape)}"
            )


class KernelArgumentError(BlockprepValueError):
    """The values given by name do not name a kernel's arguments exactly.

    ``missing``: arguments no source gave, in kernel order; ``unknown``: names that are no
    argument of the kernel; ``duplicated``: arguments given by more than one source.
    """

    def __init__(
        self,
        kernel: str,
        missing: Sequence[str],
        unknown: Sequence[str],
        duplicated: Sequence[str],
    ) -> None:
        self.kernel = kernel
        self.missing = tuple(missing)
        self.unknown = tuple(unknown)
        self.duplicated = tuple(duplicated)
        parts = []
        if self.missing:
            parts.append(f"missing {len(self.missing)}: {', '.join(self.missing)}")
        if self.unknown:
            parts.append(f"unknown {len(self.unknown)}: {', '.join(self.unknown)}")
        if self.duplicated:
            parts.append(
                f"given more than once {len(self.duplicated)}: {', '.join(self.duplicated)}"
            )
        super().__init__(f"{kernel} arguments do not match its ABI: {'; '.join(parts)}")


def build_arguments(
    kernel: str, order: Sequence[str], *sources: Mapping[str, object]
) -> tuple[object, ...]:
    """The positional argument tuple of ``kernel``: ``order[i]``'s value at position ``i``.

    Each source maps argument names to values (typically blockprep's prepared buffers, then the
    engine's weights, KV caches and output buffers); together they must give every name of
    ``order`` exactly once and nothing else.

    Raises:
        KernelArgumentError: naming every missing, unknown and doubly given argument at once.
    """
    values: dict[str, object] = {}
    duplicated: list[str] = []
    for source in sources:
        for name, value in source.items():
            if name in values and name not in duplicated:
                duplicated.append(name)
            values[name] = value
    known = set(order)
    missing = [name for name in order if name not in values]
    unknown = [name for name in values if name not in known]
    if missing or unknown or duplicated:
        raise KernelArgumentError(kernel, missing, unknown, duplicated)
    return tuple(values[name] for name in order)
