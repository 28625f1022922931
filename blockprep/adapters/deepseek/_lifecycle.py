"""DeepSeek V4 buffer slots and their life cycle: each slot's buffers (allocated here, or
upstream's own adopted), its lock, and the step it holds for a re-stage.

Contract (the threading rules of :class:`~blockprep.adapters.deepseek.DeepSeekV4DecodePreparer`):

- :func:`holding` takes one slot's lock without waiting and raises :class:`SlotBusyError` when
  another thread holds it; :func:`preparing` takes a prepare's slot lock (when ``buffer_slot``
  names a slot: otherwise the step's checks raise upstream's message in upstream's order), then
  the planning lock shared by every slot; :func:`all_slots` takes every slot's lock, then the
  planning lock;
- :func:`slot_number` checks a ``buffer_slot`` (``"decode buffer_slot must be 0 or 1, got
  ..."``);
- a :class:`Slot` holds what its last prepare staged (:class:`Prepared`, ``None`` until then and
  after binding or invalidating); :func:`prepared_step` hands it to a re-stage of a batch with the
  same requests in the same order on the same partitions, upstream's messages otherwise;
- :func:`allocated` and :func:`adopted` give every slot's buffers by kernel argument name, once:
  their addresses never change.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from blockprep import log
from blockprep._ids import as_int
from blockprep.adapters.deepseek._assignment import Assignment
from blockprep.adapters.deepseek._dynamic import DynamicInputs
from blockprep.adapters.deepseek._inputs import DeepSeekV4DecodeInputs
from blockprep.adapters.deepseek._rows import Mode
from blockprep.adapters.deepseek.abi import GROUP_ARGUMENTS, PREPARED_ARGUMENTS
from blockprep.adapters.deepseek.layout import DeepSeekV4Layout
from blockprep.adapters.kernel_abi import ArgSpec
from blockprep.batch import DecodeBatch
from blockprep.buffers import check_adopted, check_disjoint, claim_buffers, host_tensor
from blockprep.errors import BlockprepRuntimeError, BlockprepTypeError, BlockprepValueError

REQUEST_ORDER_MESSAGE = "prepared decode request order changed before execution"
PARTITIONS_MESSAGE = "prepared decode cache partitions changed before execution"


class SlotBusyError(BlockprepRuntimeError):
    """A call on a buffer slot that another thread is preparing or re-staging right now (raised
    at once, never waited for; ``slot`` names it)."""

    def __init__(self, slot: int, what: str) -> None:
        super().__init__(
            f"DeepSeekV4 decode buffer slot {slot} is busy (another thread is preparing or "
            f"re-staging it); {what} does not wait"
        )
        self.slot = slot


@dataclass(frozen=True)
class Prepared:
    """What a slot's last prepare wrote, for :meth:`DeepSeekV4DecodePreparer.restage`."""

    mode: Mode
    request_ids: tuple[Any, ...]
    partitions: list[Any]
    assignment: Assignment
    inputs: DeepSeekV4DecodeInputs


class Slot:
    """One buffer slot: its buffers by kernel argument name, its lock, what it holds."""

    def __init__(
        self,
        layout: DeepSeekV4Layout,
        buffers: Mapping[str, torch.Tensor],
        hidden_size: int | None,
        share: bool,
    ) -> None:
        R, b = layout.ranks, layout.decode_batch
        self.buffers = dict(buffers)
        self.lock = threading.Lock()
        self.dynamic = DynamicInputs(layout, buffers, hidden_size, share)
        self.tables = {group: buffers[argument] for group, argument in GROUP_ARGUMENTS.items()}
        self.flat_tables = {g: t.view(R * b, -1) for g, t in self.tables.items()}
        self.counts = buffers["block_counts"]
        self.prepared: Prepared | None = None
        self.dirty: set[int] = set(range(R))

    def record(
        self, mode: Mode, assignment: Assignment, number: int, decode_seq: int, active_seq: int
    ) -> DeepSeekV4DecodeInputs:
        """Take the step just written (by ``mode``, into slot ``number``) as what the slot holds,
        and return its record: the last one when it held the same requests the same way."""
        prepared = self.prepared
        if (
            prepared is None
            or prepared.assignment is not assignment
            or prepared.mode != mode
            or prepared.inputs.active_seq != active_seq
        ):
            inputs = self.inputs(assignment, number, decode_seq, active_seq)
            ids, partitions = tuple(assignment.request_ids), list(assignment.partitions)
            self.prepared = prepared = Prepared(mode, ids, partitions, assignment, inputs)
        return prepared.inputs

    def inputs(
        self, assignment: Assignment, number: int, decode_seq: int, active_seq: int
    ) -> DeepSeekV4DecodeInputs:
        """The record of the step just written into this slot (slot ``number``)."""
        dynamic = self.dynamic
        return DeepSeekV4DecodeInputs(  # by position: keywords cost a dict a record
            MappingProxyType(self.tables),
            self.counts,
            dynamic.input_ids,
            dynamic.position_ids,
            dynamic.kv_seq_lens,
            dynamic.num_tokens_per_owner,
            dynamic.logit_row_indices,
            dynamic.x_hc,
            assignment.ranks,
            assignment.local_rows,
            number,
            decode_seq,
            active_seq,
            tuple(assignment.request_ids),
        )


def prepared_step(slot: Slot, number: int, batch: DecodeBatch) -> Prepared:
    """The step ``slot`` holds, for a re-stage of ``batch`` (upstream's checks)."""
    prepared = slot.prepared
    if prepared is None:
        raise BlockprepRuntimeError(
            f"DeepSeekV4 decode buffer slot {number} holds no prepared step to re-stage "
            "(prepare it first; binding the pool sizes or invalidating forgets it)"
        )
    if tuple(batch.request_ids) != prepared.request_ids:
        raise BlockprepValueError(REQUEST_ORDER_MESSAGE)
    if list(batch.cache_partitions) != prepared.partitions:
        raise BlockprepValueError(PARTITIONS_MESSAGE)
    return prepared


# --- locks ---------------------------------------------------------------------------------------


def slot_number(buffer_slot: object, slots: int) -> int:
    number = buffer_slot if type(buffer_slot) is int else as_slot(buffer_slot)
    if not 0 <= number < slots:
        raise BlockprepValueError(
            f"decode buffer_slot must be {_slot_choices(slots)}, got {buffer_slot}"
        )
    return number


def as_slot(buffer_slot: object) -> int:
    """``buffer_slot`` as an int: ``TypeError`` for anything but an integer (a tensor or array of
    one element included: it is no slot number)."""
    if isinstance(buffer_slot, (torch.Tensor, np.ndarray)) and buffer_slot.ndim != 0:
        raise BlockprepTypeError(
            f"buffer_slot must be an integer, got a {type(buffer_slot).__name__} of shape "
            f"{list(buffer_slot.shape)}"
        )
    return as_int(buffer_slot, "buffer_slot")


def _slot_choices(slots: int) -> str:
    choices = [str(s) for s in range(slots)]
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


@contextmanager
def holding(slot: Slot, number: object, what: str) -> Iterator[None]:
    if not slot.lock.acquire(blocking=False):
        raise SlotBusyError(as_int(number, "buffer_slot"), what)
    try:
        yield
    except log.REJECTIONS as error:  # a re-stage's rejected batch: a WARNING record (once)
        if what == "restage":
            log.rejected("DeepSeekV4DecodePreparer.restage", error)
        raise
    finally:
        slot.lock.release()


class preparing:  # a context manager, named like the functions beside it
    """A prepare: its slot's lock (when ``buffer_slot`` names one; otherwise the checks
    raise upstream's message in upstream's order), then the planning lock."""

    __slots__ = ("_number", "_plan_lock", "_slot", "_what")

    def __init__(
        self, slots: Sequence[Slot], plan_lock: threading.Lock, buffer_slot: object, what: str
    ) -> None:
        if type(buffer_slot) is int:
            number = buffer_slot
        else:
            try:
                number = as_slot(buffer_slot)
            except (TypeError, ValueError):
                number = -1  # not a slot: the checks raise upstream's message in upstream's order
        self._slot = slots[number] if 0 <= number < len(slots) else None
        self._number, self._plan_lock, self._what = number, plan_lock, what

    def __enter__(self) -> None:
        slot = self._slot
        if slot is not None and not slot.lock.acquire(blocking=False):
            raise SlotBusyError(self._number, self._what)
        try:
            self._plan_lock.acquire()
        except BaseException:
            self._release_slot()
            raise

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        self._plan_lock.release()
        self._release_slot()
        if isinstance(error, log.REJECTIONS):  # a WARNING record (once)
            log.rejected(f"DeepSeekV4DecodePreparer.{self._what}", error)

    def _release_slot(self) -> None:
        if self._slot is not None:
            self._slot.lock.release()


@contextmanager
def all_slots(slots: Sequence[Slot], plan_lock: threading.Lock, what: str) -> Iterator[None]:
    with ExitStack() as stack:
        for number, slot in enumerate(slots):
            stack.enter_context(holding(slot, number, what))
        stack.enter_context(plan_lock)
        yield


# --- buffers -------------------------------------------------------------------------------------


def allocated(
    specs: Mapping[str, ArgSpec], slots: int, share: bool
) -> list[dict[str, torch.Tensor]]:
    """Every slot's buffers, new: zeros (``logit_row_indices``: -1), in shared memory with
    ``share``."""
    return [
        {
            name: host_tensor(
                spec.shape,
                spec.dtype,
                fill=-1 if name == "logit_row_indices" else 0,
                share_memory=share,
            )
            for name, spec in specs.items()
        }
        for _ in range(slots)
    ]


TABLE_ARGUMENTS = frozenset([*GROUP_ARGUMENTS.values(), "block_counts"])
"""The buffers a bound preparer's :class:`~blockprep.grouped.GroupedTables` owns."""


def claim_inputs(owner: object, slot_buffers: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """One owner per byte (:func:`~blockprep.buffers.claim_buffers`): every slot's buffers but the
    tables and ``block_counts`` as ``owner``'s (those are its tables', once bound); a
    ``ValueError`` naming ``buffers[slot][name]`` when another live owner holds one."""
    claim_buffers(
        owner,
        [
            (f"buffers[{s}][{name!r}]", tensor)
            for s, named in enumerate(slot_buffers)
            for name, tensor in named.items()
            if name not in TABLE_ARGUMENTS
        ],
        "DeepSeekV4DecodePreparer",
    )


def adopted(
    buffers: Sequence[Mapping[str, torch.Tensor]],
    specs: Mapping[str, ArgSpec],
    slots: int,
) -> list[dict[str, torch.Tensor]]:
    """Upstream's buffers, checked: per slot, every prepared argument by name, a contiguous,
    writable CPU tensor of the recorded dtype and shape; no two overlapping."""
    if isinstance(buffers, Mapping) or not isinstance(buffers, Sequence):
        raise BlockprepTypeError("buffers must be a sequence of mappings, one per buffer slot")
    if len(buffers) != slots:
        raise BlockprepValueError(f"buffers must hold {slots} buffer slots, got {len(buffers)}")
    adopted = []
    named: list[tuple[str, torch.Tensor]] = []
    for s, given in enumerate(buffers):
        if not isinstance(given, Mapping):
            raise BlockprepTypeError(f"buffers[{s}] must map kernel argument names to tensors")
        missing = [name for name in PREPARED_ARGUMENTS if name not in given]
        if missing:
            raise BlockprepValueError(f"buffers[{s}] is missing {', '.join(missing)}")
        slot = {}
        for name in PREPARED_ARGUMENTS:
            tensor, where = given[name], f"buffers[{s}][{name!r}]"
            specs[name].check(tensor, where)  # a tensor of the recorded dtype and shape
            slot[name] = check_adopted(tensor, where)  # CPU, contiguous, no grad, writable
            named.append((where, tensor))
        adopted.append(slot)
    check_disjoint(named)
    return adopted
