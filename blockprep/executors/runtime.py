"""Executors over upstream's NPU runtime worker: blockprep's prepared buffers in the kernel's
positional arguments, dispatched through ``run(compiled, *args)`` / ``submit(compiled, *args)``.

Upstream pypto-serving (``9b1a264``) dispatches a decode step through
``pypto.runtime.DistributedWorker``, which forks one chip child per device: the decode inputs are
CPU tensors in shared memory, allocated before the fork, passed directly as arguments
(``model/common/runner/l3_dispatch.py``, ``buffer_set.resolve_l3_arg``). These executors do the
same over *any* object with that shape (the real worker, or a test's fake): nothing here imports
``pypto``, ``simpler`` or ``torch_npu``.

- :class:`Qwen3RuntimeExecutor`: synchronous ``worker.run`` of ``qwen3_decode_host``, one buffer
  set (upstream's ``Qwen314BModelRunner.run_decode``).
- :class:`DeepSeekV4RuntimeExecutor`: ``worker.submit`` of ``l3_decode_fwd`` into one of the
  preparer's buffer slots; the slot stays busy (this executor will not prepare it) until the
  handle has completed and the outputs were read (upstream's ping-pong ``TaskArgs``).

Each builds the argument tuple by name from the recorded ABI (:mod:`blockprep.adapters.qwen_abi`,
:mod:`blockprep.adapters.deepseek.abi`): the engine supplies its weights, caches and output
buffers by upstream's argument names, blockprep its prepared buffers. Before every dispatch each
prepared argument is checked: a torch tensor of the recorded dtype and shape, on the CPU,
contiguous, in shared memory (:class:`PreparedArgumentError` otherwise; nothing is dispatched).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from blockprep import forks, log
from blockprep._ids import as_int
from blockprep.adapters.deepseek._lifecycle import slot_number
from blockprep.adapters.deepseek._preparer import DeepSeekV4DecodeInputs, DeepSeekV4DecodePreparer
from blockprep.adapters.deepseek.abi import (
    DEEPSEEK_V4_DECODE_ARGUMENTS,
    DEEPSEEK_V4_DECODE_KERNEL,
    PREPARED_ARGUMENTS,
    deepseek_v4_argument_values,
    deepseek_v4_prepared_arguments,
)
from blockprep.adapters.kernel_abi import ArgSpec, build_arguments
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.qwen_abi import (
    QWEN3_DECODE_ARGUMENTS,
    QWEN3_DECODE_KERNEL,
    QWEN3_PREPARED_ARGUMENTS,
    qwen3_argument_values,
    qwen3_prepared_arguments,
)
from blockprep.batch import DecodeBatch, DecodeResult
from blockprep.errors import (
    BlockprepRuntimeError,
    BlockprepTypeError,
    BlockprepValueError,
)

__all__ = [
    "DeepSeekV4PendingDecode",
    "DeepSeekV4RuntimeExecutor",
    "DispatchHandle",
    "PreparedArgumentError",
    "Qwen3RuntimeExecutor",
    "RunWorker",
    "SubmitWorker",
    "check_prepared_arguments",
]


class RunWorker(Protocol):
    """Upstream's synchronous dispatch: ``worker.run(compiled, *args)``."""

    def run(self, compiled: Any, /, *args: Any) -> object: ...


class DispatchHandle(Protocol):
    """What ``submit`` returns: ``wait()`` returns once the dispatch has completed."""

    def wait(self) -> object: ...


class SubmitWorker(Protocol):
    """Upstream's asynchronous dispatch: ``worker.submit(compiled, *args) -> handle``; "mutable
    arguments must not be reused or modified until the returned handle completes"."""

    def submit(self, compiled: Any, /, *args: Any) -> DispatchHandle: ...


class PreparedArgumentError(BlockprepValueError):
    """A prepared argument is not what the runtime's chip workers can read: a torch tensor of the
    recorded dtype and shape, on the CPU, contiguous, in shared memory allocated before the fork.
    ``kernel``, ``name``, ``position``: the argument."""

    def __init__(self, kernel: str, spec: ArgSpec, problem: str) -> None:
        self.kernel, self.name, self.position = kernel, spec.name, spec.position
        super().__init__(f"{kernel} argument {spec.name} (position {spec.position}): {problem}")


def check_prepared_arguments(
    kernel: str, specs: Mapping[str, ArgSpec], values: Mapping[str, object]
) -> None:
    """Raise :class:`PreparedArgumentError` for the first argument of ``specs`` (kernel order)
    whose value in ``values`` is missing, no tensor, of another dtype or shape, not on the CPU,
    not contiguous or not in shared memory."""
    for name, spec in specs.items():
        value = values.get(name)
        if value is None:
            raise PreparedArgumentError(kernel, spec, "missing")
        try:
            spec.check(value)
        except (TypeError, ValueError) as error:
            raise PreparedArgumentError(kernel, spec, str(error)) from None
        assert isinstance(value, torch.Tensor)
        if value.device.type != "cpu":
            raise PreparedArgumentError(
                kernel,
                spec,
                f"must be a CPU tensor (the runtime reads host memory), got {value.device}",
            )
        if not value.is_contiguous():
            raise PreparedArgumentError(kernel, spec, "must be contiguous")
        if not value.is_shared():  # type: ignore[no-untyped-call]
            raise PreparedArgumentError(
                kernel,
                spec,
                "must be in shared memory, allocated before the runtime's worker forks (its chip "
                "children read it through the inherited mapping): create the preparer with "
                "share_memory=True, or hand it upstream's shared buffers (buffers=)",
            )


def _engine_arguments(
    kernel: str, order: Sequence[str], prepared: Sequence[str], engine: Mapping[str, object]
) -> dict[str, object]:
    """``engine`` checked to name exactly the kernel's arguments that blockprep does not
    prepare (``KernelArgumentError`` naming every missing, unknown or doubled name)."""
    placeholders = dict.fromkeys(prepared)
    build_arguments(kernel, order, placeholders, engine)
    return dict(engine)


def _overrides(
    kernel: str, engine: Mapping[str, object], arguments: Mapping[str, object] | None
) -> Mapping[str, object]:
    """The engine's arguments with this step's replacements (device scratch under device
    sampling, as upstream's ``_decode_kernel_args`` splices them); only the engine's names."""
    if arguments is None:
        return engine
    _check_mapping(arguments, "arguments")
    foreign = [name for name in arguments if name not in engine]
    if foreign:
        raise BlockprepValueError(
            f"{kernel}: a step may replace only the engine's arguments, not {foreign}"
        )
    if not arguments:
        return engine
    return {**engine, **arguments}


def _clone_rows(buffer: object, rows: int, columns: int | None, name: str) -> torch.Tensor:
    """``buffer[:rows, :columns]`` copied (the buffer is rewritten by the next step)."""
    if not isinstance(buffer, torch.Tensor):
        raise BlockprepTypeError(
            f"the engine's {name} argument is a {type(buffer).__name__}, not a host tensor: "
            "nothing to read back (device sampling swaps it for device scratch)"
        )
    return buffer[:rows, :columns].clone()


class Qwen3RuntimeExecutor:
    """``qwen3_decode_host`` through ``worker.run``, as upstream's ``Qwen314BModelRunner``.

    Args:
        worker: anything with ``run(compiled, *args)`` (upstream's ``DistributedWorker``).
        compiled: what ``run`` dispatches (upstream's ``compiled.decode``).
        preparer: a :class:`~blockprep.adapters.qwen.QwenDecodePreparer` on ``"cpu"`` with
            ``padding="replicate"`` (the recorded kernel is fixed-batch), its buffers in shared
            memory (its default on the CPU).
        engine_arguments: the kernel's 21 other arguments by upstream's names (weights, RoPE
            tables, KV caches, the ``logits``, ``sampled_ids`` and ``next_hidden`` outputs).
        vocab_size: logits columns returned (upstream trims the padded vocabulary to
            ``model.config.vocab_size``); ``None``: every column.

    Raises:
        TypeError: ``preparer`` no ``QwenDecodePreparer``, ``engine_arguments`` no mapping.
        KernelArgumentError: ``engine_arguments`` does not name exactly the engine's arguments.
        ValueError: a preparer leaving rows past the batch untouched; ``vocab_size`` not
            positive, or above the columns of the engine's ``logits``.
    """

    def __init__(
        self,
        worker: RunWorker,
        compiled: object,
        preparer: QwenDecodePreparer,
        engine_arguments: Mapping[str, object],
        *,
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(preparer, QwenDecodePreparer):
            raise BlockprepTypeError(
                f"preparer must be a QwenDecodePreparer, got {type(preparer).__name__}"
            )
        if preparer.padding != "replicate":
            raise BlockprepValueError(
                "qwen3_decode_host at 9b1a264 computes every row of the compiled batch: rows past "
                "the active batch must replicate row 0 (padding='replicate'); the dynamic-batch "
                "kernel's prefix views are not this ABI"
            )
        _check_mapping(engine_arguments, "engine_arguments")
        self.worker = worker
        self.compiled = compiled
        self.preparer = preparer
        self.engine_arguments = _engine_arguments(
            QWEN3_DECODE_KERNEL, QWEN3_DECODE_ARGUMENTS, QWEN3_PREPARED_ARGUMENTS, engine_arguments
        )
        self.vocab_size = None if vocab_size is None else as_int(vocab_size, "vocab_size")
        if self.vocab_size is not None:
            logits = self.engine_arguments["logits"]
            width = logits.shape[-1] if isinstance(logits, torch.Tensor) else None
            if self.vocab_size <= 0 or (width is not None and self.vocab_size > width):
                raise BlockprepValueError(
                    f"vocab_size must be in [1, {width if width is not None else 'logits width'}]"
                    f" (the engine's logits columns), got {self.vocab_size}"
                )
        self.specs = qwen3_prepared_arguments(
            preparer.max_batch_size,
            preparer.max_seq_len,
            preparer.page_size,
            preparer.token_width,
        )

    def arguments(
        self, batch: DecodeBatch, *, arguments: Mapping[str, object] | None = None
    ) -> tuple[int, tuple[object, ...]]:
        """Prepare ``batch`` and return ``(active rows, the checked positional tuple)`` without
        dispatching (``arguments``: this step's replacements of engine arguments, checked
        before anything is prepared: a refused step leaves the preparer and its delta cursor
        as they were)."""
        engine = _overrides(QWEN3_DECODE_KERNEL, self.engine_arguments, arguments)
        logits = engine["logits"]
        if isinstance(logits, torch.Tensor) and (self.vocab_size or 0) > logits.shape[-1]:
            raise BlockprepValueError(
                f"the step's logits have {logits.shape[-1]} columns, fewer than vocab_size "
                f"{self.vocab_size}"
            )
        inputs = self.preparer.prepare(batch)
        prepared = qwen3_argument_values(inputs)
        check_prepared_arguments(QWEN3_DECODE_KERNEL, self.specs, prepared)
        order = QWEN3_DECODE_ARGUMENTS
        return inputs.actual_batch, build_arguments(QWEN3_DECODE_KERNEL, order, prepared, engine)

    def run_decode(
        self, batch: DecodeBatch, *, arguments: Mapping[str, object] | None = None
    ) -> DecodeResult:
        """Prepare, check, ``worker.run(compiled, *args)``, read the outputs back.

        As upstream's ``run_decode``: ``logits`` is ``logits[:A, :vocab_size]`` (a copy) unless
        the batch allows device sampling (then ``None``); ``sampled_token_ids`` is
        ``sampled_ids[:A, :1]`` (a copy) when it allows device greedy sampling; each
        ``kv_allocations[i].tokens_used`` grows to ``seq_lens[i]``. ``arguments`` replaces engine
        arguments for this step (upstream swaps ``logits`` / ``next_hidden`` for device scratch
        under device sampling).

        Raises:
            ValueError: device top-k sampling (upstream runs its ``topk_select`` program after
                the decode; not dispatched here), before anything is prepared.
            PreparedArgumentError: a prepared buffer the runtime cannot read; not dispatched.
        """
        greedy = bool(getattr(batch, "allow_device_greedy_sampling", False))
        if getattr(batch, "allow_device_topk_sampling", False):
            raise BlockprepValueError(
                "device top-k sampling runs upstream's topk_select program after the decode, "
                "which this executor does not dispatch"
            )
        rows, args = self.arguments(batch, arguments=arguments)
        self.worker.run(self.compiled, *args)
        for row, allocation in enumerate(getattr(batch, "kv_allocations", None) or ()):
            allocation.tokens_used = max(allocation.tokens_used, int(batch.seq_lens[row].item()))
        values = dict(zip(QWEN3_DECODE_ARGUMENTS, args, strict=True))
        logits = None if greedy else _clone_rows(values["logits"], rows, self.vocab_size, "logits")
        sampled = _clone_rows(values["sampled_ids"], rows, 1, "sampled_ids") if greedy else None
        return DecodeResult(hidden_states=None, logits=logits, sampled_token_ids=sampled)


@dataclass(frozen=True)
class DeepSeekV4PendingDecode:
    """A submitted DeepSeek step: its handle, the prepared inputs (slot, ranks, local rows), the
    positional arguments dispatched, whether the batch asked for device greedy sampling, and
    ``dispatch``, the id (unique in the process) that :meth:`DeepSeekV4RuntimeExecutor.reclaim`
    checks against its slot's current dispatch."""

    handle: DispatchHandle
    inputs: DeepSeekV4DecodeInputs
    arguments: tuple[object, ...]
    greedy: bool
    dispatch: int = -1

    @property
    def buffer_slot(self) -> int:
        return self.inputs.buffer_slot


PREPARING, PREPARED, DISPATCHING, IN_FLIGHT, RECLAIMING = (
    "preparing",
    "prepared",
    "dispatching",
    "in flight",
    "reclaiming",
)
"""A claimed slot's stages (a free slot has none): ``submit`` and ``prepare_early`` hold it
``preparing``; ``prepare_early`` leaves it ``prepared``; ``submit_prepared`` holds it
``dispatching``; a dispatch leaves it ``in flight``; ``reclaim`` holds it ``reclaiming``."""

_DISPATCH_IDS = itertools.count()  # next() is atomic: ids unique across executors and threads


class DeepSeekV4RuntimeExecutor:
    """``l3_decode_fwd`` through ``worker.submit``, one preparer buffer slot per dispatch in
    flight, as upstream's ping-pong decode ``TaskArgs``.

    Args:
        worker: anything with ``submit(compiled, *args) -> handle`` (``handle.wait()``).
        compiled: what ``submit`` dispatches (upstream's decode callable).
        preparer: a :class:`~blockprep.adapters.deepseek.DeepSeekV4DecodePreparer` with
            ``embedding="device"`` and ``share_memory=True``.
        engine_arguments: per buffer slot, the kernel's 69 other arguments by upstream's names
            (weights and cache pools, usually shared; ``hidden_out``, ``pre_hc_hidden_out``,
            ``logits``, ``sampled_ids``: the slot's own outputs, as upstream's per-slot
            ``TaskArgs``); or a callable returning them, called at the first dispatch (an
            engine whose weights are not loaded yet, as upstream's shape-only runner, can
            build the executor and prepare early; the values are checked then).

    The slot life cycle (every transition under one lock; a call that raises leaves the slot
    as it was)::

        free --submit--------------------------------> in flight --reclaim--> free
        free --prepare_early--> prepared --submit_prepared--> in flight
                                prepared --cancel--> free

    :meth:`submit` and :meth:`prepare_early` take only a free slot; :meth:`submit_prepared` only
    a slot :meth:`prepare_early` claimed and nothing dispatched since; :meth:`reclaim` only the
    pending decode of its slot's current dispatch, once (every dispatch carries an id; another
    executor's pending decode, or one already reclaimed, is refused); :meth:`cancel` releases a
    prepared slot the engine drops. Refusals are :class:`~blockprep.BlockprepRuntimeError`
    (a ``RuntimeError``) and write nothing. So the preparer never writes a slot the kernel may
    still read, as long as every write goes through this executor (a caller preparing the
    preparer's slots directly bypasses the contract). The calls may run on different threads
    (upstream's command and device lanes).
    """

    def __init__(
        self,
        worker: SubmitWorker,
        compiled: object,
        preparer: DeepSeekV4DecodePreparer,
        engine_arguments: (
            Sequence[Mapping[str, object]] | Callable[[], Sequence[Mapping[str, object]]]
        ),
    ) -> None:
        if not isinstance(preparer, DeepSeekV4DecodePreparer):
            raise BlockprepTypeError(
                f"preparer must be a DeepSeekV4DecodePreparer, got {type(preparer).__name__}"
            )
        if preparer.embedding != "device":
            raise BlockprepValueError(
                'l3_decode_fwd embeds input_ids on the device: use embedding="device"'
            )
        self.worker = worker
        self.compiled = compiled
        self.preparer = preparer
        self._resolve = engine_arguments if callable(engine_arguments) else None
        self.engine_arguments: list[dict[str, object]] | None = (
            None if callable(engine_arguments) else self._checked_engine(engine_arguments)
        )
        self.specs = deepseek_v4_prepared_arguments(preparer.layout)
        self._lock = threading.Lock()
        self._stage: dict[int, str] = {}  # claimed slots: their stage
        self._dispatch_of: dict[int, int] = {}  # in-flight slots: their dispatch id
        self._early: dict[int, DeepSeekV4DecodeInputs] = {}  # prepare_early's record, by slot
        self._steps = 0
        forks.register(self)

    def _checked_engine(self, engine_arguments: object) -> list[dict[str, object]]:
        """One checked mapping of the engine's arguments per buffer slot."""
        if isinstance(engine_arguments, Mapping) or not isinstance(engine_arguments, Sequence):
            raise BlockprepTypeError(
                "engine_arguments must be a sequence of mappings, one per buffer slot, got "
                f"{type(engine_arguments).__name__}"
            )
        slots = self.preparer.buffer_slots
        if len(engine_arguments) != slots:
            raise BlockprepValueError(
                f"engine_arguments must hold one mapping per buffer slot ({slots}), got "
                f"{len(engine_arguments)}"
            )
        for slot, values in enumerate(engine_arguments):
            _check_mapping(values, f"engine_arguments[{slot}]")
        return [
            _engine_arguments(
                DEEPSEEK_V4_DECODE_KERNEL, DEEPSEEK_V4_DECODE_ARGUMENTS, PREPARED_ARGUMENTS, values
            )
            for values in engine_arguments
        ]

    def _engine(self, slot: int) -> dict[str, object]:
        """Slot ``slot``'s engine arguments, resolved and checked at the first dispatch when
        they were given as a callable."""
        engine = self.engine_arguments
        if engine is None:
            assert self._resolve is not None
            engine = self._checked_engine(self._resolve())
            with self._lock:
                if self.engine_arguments is None:
                    self.engine_arguments = engine
                engine = self.engine_arguments
        return engine[slot]

    def _after_fork(self) -> None:
        """In a forked child (:mod:`blockprep.forks`): a new lock, and a slot some thread was
        moving (its call gone with the thread) back to the stage that call started from."""
        self._lock = threading.Lock()
        undone = {PREPARING: None, DISPATCHING: PREPARED, RECLAIMING: IN_FLIGHT}
        for slot, stage in list(self._stage.items()):
            if stage in undone:
                before = undone[stage]
                if before is None:
                    del self._stage[slot]
                else:
                    self._stage[slot] = before

    def busy_slots(self) -> frozenset[int]:
        """The claimed slots: being prepared, prepared early, dispatched and not reclaimed."""
        with self._lock:
            return frozenset(self._stage)

    def slot_stage(self, buffer_slot: int) -> str | None:
        """``buffer_slot``'s stage (``"prepared"``, ``"in flight"``, ...; ``None``: free)."""
        slot = self._slot(buffer_slot)
        with self._lock:
            return self._stage.get(slot)

    def submit(
        self, batch: DecodeBatch, *, buffer_slot: int | None = None
    ) -> DeepSeekV4PendingDecode:
        """Prepare ``batch`` into ``buffer_slot`` (``None``: the steps so far modulo the slot
        count), check the prepared arguments, and ``worker.submit`` the kernel.

        Raises:
            RuntimeError: the slot is not free (nothing written).
            PreparedArgumentError: a prepared buffer the runtime cannot read (not dispatched;
                the slot free again).
            ValueError, TypeError, IndexError: the preparer's, a slot out of range included
                (``ValueError``, the preparer's words; nothing written, the slot free again).
        """
        slot = self._claim(buffer_slot)
        try:
            inputs = self.preparer.prepare(batch, buffer_slot=slot)
            return self._dispatch(batch, inputs)
        except BaseException:
            self._release(slot)
            raise

    def prepare_early(self, batch: DecodeBatch, *, buffer_slot: int | None = None) -> int:
        """Upstream's command lane: claim ``buffer_slot`` and prepare ``batch`` into it early
        (tables, KV lengths, placeholder tokens; ``DeepSeekV4DecodePreparer.prepare(...,
        early=True)``); return the slot, now ``"prepared"``. :meth:`submit_prepared` re-stages
        and dispatches it later, on the device lane, while this lane may prepare the other
        slot; :meth:`cancel` releases it when the engine drops the step.

        Raises: as :meth:`submit` (the slot free again on an error).
        """
        slot = self._claim(buffer_slot)
        try:
            self._early[slot] = self.preparer.prepare(batch, buffer_slot=slot, early=True)
        except BaseException:
            self._release(slot)
            raise
        self._move(slot, PREPARING, PREPARED)
        return slot

    def prepared_inputs(self, buffer_slot: int) -> DeepSeekV4DecodeInputs:
        """The record of the step :meth:`prepare_early` prepared in ``buffer_slot`` (views of
        the slot's buffers, the assignment: what upstream's ``prepare_decode`` returns, as its
        own record), while the slot is ``"prepared"``.

        Raises:
            RuntimeError: the slot is not ``"prepared"`` (free, dispatched, or being prepared).
        """
        slot = self._slot(buffer_slot)
        with self._lock:
            stage = self._stage.get(slot)
            if stage != PREPARED:
                raise BlockprepRuntimeError(
                    f"buffer slot {slot} holds no step prepared by prepare_early: it is "
                    f"{stage or 'free'}"
                )
            return self._early[slot]

    def submit_prepared(self, batch: DecodeBatch, buffer_slot: int) -> DeepSeekV4PendingDecode:
        """Upstream's device lane: re-stage ``batch``'s tokens, positions and KV lengths into
        the slot :meth:`prepare_early` prepared (same requests in the same places), check the
        prepared arguments and ``worker.submit`` the kernel.

        Raises:
            RuntimeError: the slot is not ``"prepared"``: not claimed by :meth:`prepare_early`,
                dispatched already, or being dispatched by another thread (nothing written).
            ValueError, TypeError: the preparer's re-stage errors; PreparedArgumentError. On
                any error the slot stays ``"prepared"`` (submit again, or :meth:`cancel`).
        """
        slot = self._slot(buffer_slot)
        with self._lock:
            stage = self._stage.get(slot)
            if stage != PREPARED:
                raise BlockprepRuntimeError(
                    f"buffer slot {slot} was not prepared by prepare_early"
                    + ("" if stage is None else f": it is {stage}")
                    + " (submit_prepared dispatches a slot prepare_early prepared, once)"
                )
            self._stage[slot] = DISPATCHING
        try:
            inputs = self.preparer.restage(batch, buffer_slot=slot)
            return self._dispatch(batch, inputs)
        except BaseException:
            self._move(slot, DISPATCHING, PREPARED)
            raise

    def cancel(self, buffer_slot: int) -> None:
        """Release a slot :meth:`prepare_early` claimed whose step the engine drops (nothing
        dispatched); its next :meth:`submit` or :meth:`prepare_early` prepares it anew.

        Raises:
            RuntimeError: the slot is not ``"prepared"`` (free, being prepared, or dispatched:
                an in-flight slot is released by :meth:`reclaim` only); nothing changes.
        """
        slot = self._slot(buffer_slot)
        with self._lock:
            stage = self._stage.get(slot)
            if stage != PREPARED:
                raise BlockprepRuntimeError(
                    f"cannot cancel buffer slot {slot}: it is {stage or 'free'}; cancel releases "
                    "a slot prepare_early prepared and nothing dispatched"
                )
            del self._stage[slot]
        log.slot_released(slot, "DeepSeekV4RuntimeExecutor")

    def _slot(self, buffer_slot: object) -> int:
        """``buffer_slot`` as a slot number of the preparer, checked in the preparer's (and
        upstream's) words: ``ValueError`` "decode buffer_slot must be 0 or 1, got 5"."""
        return slot_number(buffer_slot, self.preparer.buffer_slots)

    def _claim(self, buffer_slot: int | None) -> int:
        """Take a free slot (``None``: the steps so far modulo the slot count)."""
        with self._lock:
            slot = self._steps % self.preparer.buffer_slots if buffer_slot is None else buffer_slot
        slot = self._slot(slot)
        with self._lock:
            stage = self._stage.get(slot)
            if stage is not None:
                raise BlockprepRuntimeError(
                    f"buffer slot {slot} is still in flight ({stage}): reclaim its dispatch (or "
                    "cancel its early prepare) before preparing the slot again (the kernel may "
                    "still read its buffers)"
                )
            self._stage[slot] = PREPARING  # claimed before writing: another thread cannot take it
        log.slot_claimed(slot, "DeepSeekV4RuntimeExecutor")
        return slot

    def _move(self, slot: int, stage: str, to: str) -> None:
        with self._lock:
            assert self._stage.get(slot) == stage, (slot, self._stage.get(slot), stage)
            self._stage[slot] = to

    def _release(self, slot: int) -> None:
        with self._lock:
            self._stage.pop(slot, None)
            self._dispatch_of.pop(slot, None)
        log.slot_released(slot, "DeepSeekV4RuntimeExecutor")

    def _dispatch(
        self, batch: DecodeBatch, inputs: DeepSeekV4DecodeInputs
    ) -> DeepSeekV4PendingDecode:
        """Check the slot's prepared arguments and submit the kernel on them; the slot is then
        in flight under a new dispatch id."""
        prepared = deepseek_v4_argument_values(inputs)
        check_prepared_arguments(DEEPSEEK_V4_DECODE_KERNEL, self.specs, prepared)
        slot = inputs.buffer_slot
        args = build_arguments(
            DEEPSEEK_V4_DECODE_KERNEL, DEEPSEEK_V4_DECODE_ARGUMENTS, prepared, self._engine(slot)
        )
        greedy = bool(getattr(batch, "allow_device_greedy_sampling", False))
        handle = self.worker.submit(self.compiled, *args)
        dispatch = next(_DISPATCH_IDS)
        with self._lock:
            self._steps += 1
            self._stage[slot] = IN_FLIGHT
            self._dispatch_of[slot] = dispatch
        return DeepSeekV4PendingDecode(handle, inputs, args, greedy, dispatch)

    def reclaim(self, pending: DeepSeekV4PendingDecode) -> DecodeResult:
        """Wait for the dispatch, read its outputs in batch order, release its slot.

        ``logits``: float32 ``[A, vocab]``, request ``i``'s first token row, ``logits[rank_i,
        local_row_i * decode_seq]`` (upstream's ``_run_autoregressive_decode``, where
        ``decode_seq`` is 1 or each rank holds one request); ``sampled_token_ids``: ``[A, 1]``
        from ``sampled_ids`` the same way, when the batch allowed device greedy sampling.
        Copies: the slot's buffers are rewritten once it is released. The slot is released even
        when ``wait()`` raises (the dispatch is over either way); the error propagates.

        Raises:
            TypeError: ``pending`` is no :class:`DeepSeekV4PendingDecode`.
            RuntimeError: ``pending`` is not its slot's current dispatch on this executor
                (reclaimed already, another executor's, or its slot re-dispatched since):
                nothing waited for, the slot left as it was.
        """
        if not isinstance(pending, DeepSeekV4PendingDecode):
            raise BlockprepTypeError(
                f"reclaim takes the DeepSeekV4PendingDecode that submit returned, got "
                f"{type(pending).__name__}"
            )
        inputs = pending.inputs
        slot = inputs.buffer_slot
        with self._lock:
            if self._stage.get(slot) != IN_FLIGHT or self._dispatch_of.get(slot) != (
                pending.dispatch
            ):
                raise BlockprepRuntimeError(
                    f"dispatch {pending.dispatch} of buffer slot {slot} is not in flight on this "
                    "executor (reclaimed already, another executor's, or the slot dispatched "
                    "again since): reclaim each pending decode once, on the executor that "
                    "submitted it"
                )
            self._stage[slot] = RECLAIMING
        try:
            pending.handle.wait()
            values = dict(zip(DEEPSEEK_V4_DECODE_ARGUMENTS, pending.arguments, strict=True))
            logits = _batch_rows(inputs, values["logits"], "logits").float()
            sampled = (
                _batch_rows(inputs, values["sampled_ids"], "sampled_ids")[:, :1]
                if pending.greedy
                else None
            )
        finally:
            self._release(slot)
        return DecodeResult(hidden_states=None, logits=logits, sampled_token_ids=sampled)

    def run_decode(self, batch: DecodeBatch, *, buffer_slot: int | None = None) -> DecodeResult:
        """:meth:`submit` then :meth:`reclaim`: one synchronous step."""
        return self.reclaim(self.submit(batch, buffer_slot=buffer_slot))


def _check_mapping(values: object, what: str) -> None:
    if not isinstance(values, Mapping):
        raise BlockprepTypeError(
            f"{what} must map upstream's argument names to values, got {type(values).__name__}"
        )


def _batch_rows(inputs: DeepSeekV4DecodeInputs, buffer: object, name: str) -> torch.Tensor:
    """A per-rank ``[R, T, ...]`` output in batch order, each request's first token row
    (:meth:`DeepSeekV4DecodeInputs.gather_rows`: one gather, a copy)."""
    if not isinstance(buffer, torch.Tensor):
        raise BlockprepTypeError(
            f"the engine's {name} argument is a {type(buffer).__name__}, not a host tensor: "
            "nothing to read back"
        )
    return inputs.gather_rows(buffer)
