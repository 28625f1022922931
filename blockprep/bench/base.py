"""What every benchmark workload is made of: its three constructions' names, the
:class:`Stepper` protocol each construction follows, :class:`Workload`, and :class:`FullRewrite`
(a construction that rewrites every table cell each step).

A workload's constructions are upstream's before its fix (``pre-fix``), upstream's fix (``fix``)
and blockprep (``blockprep``), all fed the same precomputed trace. Every construction is a
:class:`Stepper`: it receives one step's input (untimed; on the wire workloads the trace carries
pickled bytes and each construction unpickles only the payload it consumes), prepares it and
exposes the buffers it wrote, so the runner can check that all three agree cell for cell before
it times anything, and counts what it wrote.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy.typing as npt

CONSTRUCTIONS = ("pre-fix", "fix", "blockprep")


class Stepper(Protocol):
    """One construction of one workload, with its own persistent buffers."""

    def receive(self, item: Any) -> Any:
        """What :meth:`step` is given for the trace's ``item``, made just before it and untimed:
        the transfer, not the preparation (on the wire workloads, the payload this construction
        consumes, unpickled); ``item`` itself by default."""
        return item

    def step(self, item: Any) -> None:
        """Prepare one step's input (what :meth:`receive` made of the trace's item)."""

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        """The buffers the step wrote, by name, as NumPy arrays (views, not copies)."""

    def written(self) -> tuple[int, int] | None:
        """``(rows, cells)`` of tables written so far, or ``None`` if the construction cannot
        count them (the bench then reports no figure)."""


@dataclass(frozen=True)
class Workload:
    """A benchmark workload.

    ``trace(steps, seed)`` yields ``steps + 1`` step inputs, lazily, as a scheduler would: the
    same sequence on every call, each input made just before it is prepared (and it may be
    mutated once the next one is made, like a scheduler's live page lists); every construction
    gets a trace of its own, and :meth:`Stepper.receive` makes its step's input from each item.
    The first input warms the constructions up and is not timed, unless
    ``cold``, where every timed step runs on a fresh construction. ``rows`` and ``cells`` are the
    block-table rows and cells one full rewrite writes (the memory floor is the time to copy
    ``cells`` int32 values). ``description`` names the conditions the workload assumes.
    """

    name: str
    description: str
    trace: Callable[[int, int], Iterator[Any]]
    constructions: Mapping[str, Callable[[], Stepper]]
    rows: int
    cells: int
    cold: bool = False
    quick: bool = True


class FullRewrite(Stepper, abc.ABC):
    """A construction that rewrites every table row and cell each step: ``rows`` and ``cells``
    a step, counted by :meth:`step` around the subclass's :meth:`_prepare`."""

    def __init__(self, rows: int, cells: int) -> None:
        self._size = rows, cells
        self._steps = 0

    def step(self, item: Any) -> None:
        self._prepare(item)
        self._steps += 1

    @abc.abstractmethod
    def _prepare(self, item: Any) -> None:
        """Prepare one step's input."""

    def written(self) -> tuple[int, int] | None:
        rows, cells = self._size
        return rows * self._steps, cells * self._steps
