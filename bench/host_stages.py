"""The stages of :mod:`bench.host_path`: upstream's wire shape (msgspec structs of our
own, after pypto-serving's ``serving/server/ipc.py``), the engine side of each option (a step's
message built from the scheduler's state), the worker side (a preparation into persistent
buffers), and the transfer between them (a real ``os.pipe()``).

Engines: :class:`FullLists` (upstream's: every list copied per group each step) and
:class:`Deltas` around one of :func:`wire_deltas` (:class:`~blockprep.wire.BlockDeltaEncoder`),
:func:`packed_deltas` (:class:`~blockprep.events.PackedDeltaEncoder`, the differ) and
:func:`recorded_deltas` (:class:`~blockprep.events.BlockEventRecorder`: the step's recorded
events replayed, then ``message()``). Targets: upstream's rebuilds (:mod:`blockprep.reference`)
and blockprep's preparers. :class:`Option` joins an engine, a codec and a target.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import numpy.typing as npt
import torch

from blockprep import reference
from blockprep.adapters.deepseek import DeepSeekV4DecodePreparer
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.bench.deepseek_workloads import WIRE_LAYOUT, WIRE_SLOTS
from blockprep.bench.qwen_workloads import QWEN_MAX_SEQ_LEN, QWEN_PAD, QWEN_PAGE_SIZE
from blockprep.events import BlockEventRecorder, PackedDeltaEncoder
from blockprep.wire import BlockDeltaEncoder

# --- upstream's wire shape (our own definitions, after serving/server/ipc.py) ------------------


class DecodeRequest(msgspec.Struct):
    """One request of a decode step, as upstream's engine sends it every step."""

    request_id: str
    last_token: int
    seq_len: int
    block_ids: list[int]
    block_ids_by_group: dict[str, list[int]] = msgspec.field(default_factory=dict)
    cache_partition: int | None = None


class StepCommand(msgspec.Struct, tag="step"):
    """One scheduling step (decode only here: no new or prefill requests)."""

    new_requests: list[Any]
    prefill_requests: list[Any]
    decode_requests: list[DecodeRequest]
    finished_request_ids: list[str]
    step_id: int = 0


class DeltaStepCommand(StepCommand, tag="step"):
    """Upstream's command with the block lists left empty and blockprep's message beside them."""

    block_deltas: dict[str, Any] | None = None


# --- the scheduler's state of one step ------------------------------------------------------


@dataclass
class SchedulerStep:
    """What the engine knows of one step, made untimed: the batch order, each request's token,
    ``seq_len``, block lists (grouped: ``{group: ids}``; flat: ``ids``; the scheduler's own
    lists) and rank (``None``: flat), the requests finished since the last step, and the step's
    number."""

    request_ids: list[str]
    tokens: list[int]
    seq_lens: list[int]
    lists: list[Any]
    partitions: list[int | None]
    finished: list[str]
    step_id: int
    events: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)


# --- engine side: one message builder per option ----------------------------------------------


class Engine(Protocol):
    def message(self, step: SchedulerStep) -> StepCommand:
        """The step's command, built from the scheduler's state."""


class FullLists:
    """Upstream's engine: every request's block lists copied (``list()`` per group)."""

    def message(self, step: SchedulerStep) -> StepCommand:
        requests = []
        for rid, token, seq_len, lists, partition in zip(
            step.request_ids, step.tokens, step.seq_lens, step.lists, step.partitions, strict=True
        ):
            if partition is None:
                request = DecodeRequest(rid, token, seq_len, list(lists), {}, None)
            else:
                groups = {name: list(ids) for name, ids in lists.items()}
                request = DecodeRequest(rid, token, seq_len, [], groups, partition)
            requests.append(request)
        return StepCommand([], [], requests, step.finished, step.step_id)


def _requests(step: SchedulerStep) -> list[DecodeRequest]:
    """The step's requests with their block lists left empty."""
    return [
        DecodeRequest(rid, token, seq_len, [], {}, partition)
        for rid, token, seq_len, partition in zip(
            step.request_ids, step.tokens, step.seq_lens, step.partitions, strict=True
        )
    ]


class Envelope:
    """Not an option: upstream's command with every block list empty, the floor of the
    message's shape (what every option sends besides its blocks)."""

    def message(self, step: SchedulerStep) -> StepCommand:
        return StepCommand([], [], _requests(step), step.finished, step.step_id)


class Deltas:
    """A delta engine: the block lists left empty, ``encode(request_ids, lists)``'s message
    carried in the command's ``block_deltas``."""

    def __init__(self, encode: Callable[[SchedulerStep], dict[str, Any]]) -> None:
        self._encode = encode

    def message(self, step: SchedulerStep) -> StepCommand:
        requests = _requests(step)
        deltas = self._encode(step)
        return DeltaStepCommand([], [], requests, step.finished, step.step_id, deltas)


def wire_deltas() -> Deltas:
    """:class:`~blockprep.wire.BlockDeltaEncoder`: the lists diffed in Python, a dict message."""
    encoder = BlockDeltaEncoder()
    return Deltas(lambda step: encoder.encode(step.request_ids, step.lists))


def packed_deltas(groups: Sequence[str] | None) -> Deltas:
    """The differ, :class:`~blockprep.events.PackedDeltaEncoder`: a packed message."""
    encoder = PackedDeltaEncoder(groups)
    return Deltas(lambda step: encoder.encode(step.request_ids, step.lists))


def recorded_deltas(groups: Sequence[str] | None) -> Deltas:
    """The recorder, :class:`~blockprep.events.BlockEventRecorder`: the step's events (as the
    scheduler made them, :attr:`SchedulerStep.events`) replayed into it, then its message."""
    recorder = BlockEventRecorder(groups)
    calls: dict[str, Callable[..., None]] = {
        "start": recorder.start,
        "append": recorder.append,
        "set": recorder.set,
        "truncate": recorder.truncate,
        "finish": recorder.finish,
    }

    def encode(step: SchedulerStep) -> dict[str, Any]:
        for name, args in step.events:
            calls[name](*args)
        return recorder.message(step.request_ids)

    return Deltas(encode)


# --- worker side: one preparation per option --------------------------------------------------


class Target(Protocol):
    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        """Write one step into buffer slot ``slot``."""

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        """The buffers the last step wrote (views)."""


class DeepSeekRebuild:
    """``reference.deepseek_v4_decode_rebuild`` into per-slot persistent buffers."""

    def __init__(self, *, fix: bool) -> None:
        self._fix = fix
        self._out: list[dict[str, torch.Tensor] | None] = [None] * WIRE_SLOTS
        self._slot = 0

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        layout = WIRE_LAYOUT
        self._out[slot] = reference.deepseek_v4_decode_rebuild(
            batch,
            ranks=layout.ranks,
            decode_batch=layout.decode_batch,
            decode_seq=layout.decode_seq,
            num_blocks=layout.num_blocks,
            fix=self._fix,
            out=self._out[slot],
        )
        self._slot = slot

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        out = self._out[self._slot]
        assert out is not None
        return {name: tensor.numpy() for name, tensor in out.items()}


class DeepSeekBlockprep:
    """:class:`DeepSeekV4DecodePreparer` (by value or by delta, as the batch carries)."""

    def __init__(self) -> None:
        self._preparer = DeepSeekV4DecodePreparer(WIRE_LAYOUT, buffer_slots=WIRE_SLOTS)
        self._inputs: Any = None

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        self._inputs = self._preparer.prepare(batch, buffer_slot=slot)

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: t.numpy() for name, t in self._inputs.buffers().items()}


_QWEN_BUFFERS = ("token_ids", "seq_lens", "block_table", "slot_mapping")


class QwenTarget:
    """A Qwen preparation of ``batch`` requests: upstream's before #97 (``"pre-fix"``), #97
    (``"fix"``) or blockprep's :class:`QwenDecodePreparer` (``"blockprep"``)."""

    def __init__(self, batch: int, kind: str) -> None:
        args = (batch, QWEN_MAX_SEQ_LEN, QWEN_PAGE_SIZE, QWEN_PAD)
        self._prep: Any = {
            "pre-fix": reference.QwenDecodePrepBefore,
            "fix": reference.QwenDecodePrep97,
            "blockprep": QwenDecodePreparer,
        }[kind](*args)
        self._out: Any = self._prep

    def prepare(self, batch: DecodeBatch, slot: int) -> None:
        out = self._prep.prepare(batch)
        self._out = self._prep if out is None else out

    def buffers(self) -> dict[str, npt.NDArray[Any]]:
        return {name: getattr(self._out, name).numpy() for name in _QWEN_BUFFERS}


def to_batch(command: StepCommand) -> DecodeBatch:
    """The worker's :class:`DecodeBatch` of a decoded command (block lists, or its deltas)."""
    requests = command.decode_requests
    deltas = getattr(command, "block_deltas", None)
    grouped = bool(requests) and requests[0].cache_partition is not None
    lists: dict[str, Any] = {}
    if deltas is not None:
        lists["block_deltas"] = deltas
    elif grouped:
        lists["block_ids_by_group"] = [r.block_ids_by_group for r in requests]
    else:
        lists["block_ids"] = [r.block_ids for r in requests]
    return DecodeBatch(
        request_ids=[r.request_id for r in requests],
        token_ids=torch.tensor([r.last_token for r in requests]),
        hidden_states=None,
        seq_lens=torch.tensor([r.seq_len for r in requests]),
        cache_partitions=[r.cache_partition for r in requests] if grouped else [],
        **lists,
    )


# --- the three stages ---------------------------------------------------------------------------


class Pipe:
    """A real ``os.pipe()``: :meth:`transfer` writes the bytes in, then reads them out."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self.capacity = 1 << 16
        with contextlib.suppress(AttributeError, OSError):  # else (not Linux) 64 KiB chunks
            self.capacity = fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, 1 << 20)

    def transfer(self, data: bytes) -> bytes:
        view, parts = memoryview(data), []
        for start in range(0, len(data), self.capacity):
            chunk = view[start : start + self.capacity]
            written = 0
            while written < len(chunk):
                written += os.write(self._write, chunk[written:])
            got = 0
            while got < written:
                part = os.read(self._read, written - got)
                parts.append(part)
                got += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


def block_bytes(data: bytes) -> int:
    """How many of an encoded command's bytes carry blocks: its length less that of the same
    command with every block list empty and no ``block_deltas``."""
    plain = msgspec.msgpack.decode(data)
    for request in plain["decode_requests"]:
        request["block_ids"], request["block_ids_by_group"] = [], {}
    plain.pop("block_deltas", None)
    return len(data) - len(msgspec.msgpack.encode(plain))


class Option:
    """One option's two ends: an engine, a worker target, and the codec between them."""

    def __init__(self, engine: Engine, target: Target, command: type[StepCommand]) -> None:
        self.engine, self.target = engine, target
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(command)

    def encode(self, step: SchedulerStep) -> bytes:
        """The engine stage: the step's command built and encoded."""
        return self._encoder.encode(self.engine.message(step))

    def work(self, data: bytes) -> tuple[int, int, int]:
        """The worker stage: decode, build the batch, prepare slot ``step_id % 2``; the
        ``perf_counter_ns`` after each (the step's message and batch are freed on return)."""
        clock = time.perf_counter_ns
        command = self._decoder.decode(data)
        decoded = clock()
        batch = to_batch(command)
        built = clock()
        self.target.prepare(batch, command.step_id % WIRE_SLOTS)
        return decoded, built, clock()
