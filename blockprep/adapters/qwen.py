"""Qwen3 decode preparation: upstream pypto-serving's PR #97 decode-input ABI over blockprep's core.

The compiled Qwen3-14B decode program reads four persistent int32 buffers (seed-semantics 2.1):

- ``token_ids`` ``[B, sampled_ids_pad]``: column 0 the row's token, the other columns 0;
- ``seq_lens`` ``[B]``: tokens per sequence, the current one included;
- ``block_table`` flat ``[B * ceil(max_seq_len / page_size)]``: each row's page ids, then -1;
- ``slot_mapping`` ``[B]``: the cache slot the current token writes.

``B`` is the compiled batch: rows ``A..B-1`` past the ``A`` active requests replicate row 0 (its
token, seq_len, slot and pages), so the fixed-batch program rewrites row 0's slot idempotently and
never writes another request's page; with ``padding="untouched"`` they are left as they are, for
upstream's newer dynamic-batch kernel, which is handed prefix views and never reads them.
Validation and its messages are upstream's (seed-semantics 2.3), but every check runs before
anything is written: a rejected batch leaves the buffers holding the previous step's inputs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import numpy as np
import numpy.typing as npt
import torch

from blockprep import log
from blockprep._engine import BACKEND, kernel_buffer, paged_step, step_slots
from blockprep._ids import INT32_MAX, as_int
from blockprep.adapters._qwen_batch import (
    INTEGER_DTYPES,
    adopted_buffers,
    check_integer_dtype,
    check_page_row,
    int64_values,
    page_lists,
    raise_token_shape,
    rows_of,
    tensor_values,
)
from blockprep.adapters._qwen_deltas import DeltaStep, delta_step
from blockprep.adapters._qwen_verify import check_against_rebuild, verified_lists
from blockprep.adapters.qwen_abi import QwenDecodeInputs as QwenDecodeInputs  # re-exported
from blockprep.batch import DecodeBatch, DecodeExecutor, DecodeResult
from blockprep.block_table import BlockTable
from blockprep.buffers import (
    DeviceMirror,
    claim_buffers,
    host_tensor,
    torch_device,
    wait_host_free,
)
from blockprep.errors import BlockprepValueError
from blockprep.reference import QwenDecodePrep97
from blockprep.slots import decode_slot
from blockprep.tokens import PaddedTokenBuffer
from blockprep.wire import DeltaCursor

SAMPLED_IDS_PAD = 8
"""Token columns of upstream's compiled Qwen decode program today. Upstream reads it from the
kernel module (``getattr(qwen3_decode_fwd, "SAMPLED_IDS_PAD", 1)``): a kernel without the
constant takes 1 column, so pass ``sampled_ids_pad=1`` for one."""

Padding = Literal["replicate", "untouched"]
"""What the rows past the active batch hold: ``"replicate"`` row 0 (upstream's fixed-batch kernel
at ``9b1a264``), or ``"untouched"`` (upstream's newer dynamic-batch kernel, handed prefix views)."""


COMPILED = BACKEND == "c"
"""Whether the small delta path takes ``_engine.paged_step``: compiled, one call beats the row
checks and writes it replaces; the twin's (its specification, tested against it) costs more than
the general path, which the pure-Python fallback keeps."""

ROW_LOOP_MAX = 24
"""Batches of at most this many rows (by value or deltas) are checked row by row in Python
(cheaper than the array checks' fixed cost); larger ones on NumPy arrays."""


class QwenDecodePreparer:
    """Owns the Qwen decode buffers and writes one step's inputs into them.

    Args:
        max_batch_size: the compiled batch ``B``.
        max_seq_len: longest sequence; the block table is ``ceil(max_seq_len / page_size)`` wide.
        page_size: tokens per KV page.
        sampled_ids_pad: token buffer columns: today's kernel's 8 by default; upstream falls back
            to 1 for a kernel module without ``SAMPLED_IDS_PAD``.
        device: ``"cpu"`` (the host buffers are the buffers), ``"cuda"`` or ``"npu"`` (device
            mirrors, refreshed each step; only block-table rows that changed are copied;
            ``"npu"`` imports ``torch_npu`` first, a clear ``ImportError`` when it is absent).
        share_memory: allocate the host buffers in shared memory, for workers forked afterwards.
            ``None`` (the default): shared on ``"cpu"``, where the host buffers are what
            upstream's runtime dispatches and its chip workers, forked after, must see them
            (:mod:`blockprep.executors.runtime` refuses anything else); page-locked instead on a
            device (mirrors copy from pinned memory; torch cannot pin shared memory).
        buffers: adopt upstream's own buffers by its argument names (``token_ids``,
            ``seq_lens``, ``block_table``, ``slot_mapping``; any of them, the others
            allocated): each checked (int32, the recorded shape, contiguous, CPU, writable) and
            written in place, never reallocated. ``device`` must be ``"cpu"``.
        padding: rows past the active batch: ``"replicate"`` row 0 (the default, upstream's
            fixed-batch kernel) or ``"untouched"`` (for the dynamic-batch kernel handed
            :meth:`QwenDecodeInputs.prefix_views`).
        verify: after every :meth:`prepare`, compare every buffer (host, and device mirror
            when there is one) with a from-scratch rebuild of the same step through
            :class:`blockprep.reference.QwenDecodePrep97` (delta steps: of the id lists the
            message makes, kept apart from the table) and raise
            :class:`~blockprep.block_table.StaleRowError` naming the first differing buffer, row
            and column; the block table's row cache is verified too. Slow (a whole rebuild per
            step), off by default: the first thing to switch on when wiring blockprep into an
            engine (docs/integration.md).

    Raises:
        ValueError: a size below 1; an unknown buffer name, a wrong shape, a non-contiguous or
            read-only buffer, or ``buffers`` with a device; an unknown ``padding``.
        TypeError: a buffer that is no tensor, not int32, or not on the CPU.
        ImportError: ``device="npu"`` without ``torch_npu``.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_seq_len: int,
        page_size: int = 128,
        sampled_ids_pad: int = SAMPLED_IDS_PAD,
        *,
        device: str | torch.device = "cpu",
        share_memory: bool | None = None,
        buffers: Mapping[str, torch.Tensor] | None = None,
        padding: Padding = "replicate",
        verify: bool = False,
    ) -> None:
        self.max_batch_size = as_int(max_batch_size, "max_batch_size")
        self.max_seq_len = as_int(max_seq_len, "max_seq_len")
        self.page_size = as_int(page_size, "page_size")
        for name in ("max_batch_size", "max_seq_len", "page_size"):
            if getattr(self, name) <= 0:
                raise BlockprepValueError(f"{name} must be positive, got {getattr(self, name)}")
        if padding not in ("replicate", "untouched"):
            raise BlockprepValueError(
                f"padding must be 'replicate' or 'untouched', got {padding!r}"
            )
        self.padding: Padding = padding
        batch = self.max_batch_size
        self.max_blocks = math.ceil(self.max_seq_len / self.page_size)
        device = torch_device(device)  # torch_npu imported before "npu" is parsed or pinned
        adopted = adopted_buffers(
            buffers, batch, self.max_seq_len, self.page_size, sampled_ids_pad, device
        )
        if share_memory is None:
            share_memory = device.type == "cpu"
        # Device mirrors copy with non_blocking=True, which needs page-locked host memory.
        pin = device.type != "cpu" and not share_memory

        def buffer(name: str, size: int, fill: int) -> torch.Tensor:
            if name in adopted:
                return adopted[name]
            return host_tensor(
                (size,), torch.int32, fill=fill, pin_memory=pin, share_memory=share_memory
            )

        self._seq_lens = buffer("seq_lens", batch, 0)
        self._slots = buffer("slot_mapping", batch, -1)
        flat_table = buffer("block_table", batch * self.max_blocks, -1)
        self._table = BlockTable(batch, self.max_blocks, kind="paged", pad=-1, buffer=flat_table)
        self._table_host = flat_table
        # One owner per byte (the table is its BlockTable's), claimed before anything is written.
        owned = [("seq_lens", self._seq_lens), ("slot_mapping", self._slots)]
        if "token_ids" in adopted:
            owned.append(("token_ids", adopted["token_ids"]))
        claim_buffers(self, owned, "QwenDecodePreparer")
        self._tokens = PaddedTokenBuffer(
            batch,
            sampled_ids_pad,
            buffer=adopted.get("token_ids"),
            pin_memory=pin and "token_ids" not in adopted,
            share_memory=share_memory and "token_ids" not in adopted,
        )
        if "token_ids" not in adopted:
            claim_buffers(self, [("token_ids", self._tokens.tensor)], "QwenDecodePreparer")
        self.token_width = int(self._tokens.tensor.shape[1])
        self._token_column = self._tokens.int_column  # paged_step's (None: another dtype)
        self._mirrors = {
            name: DeviceMirror(host, device)
            for name, host in (
                ("token_ids", self._tokens.tensor),
                ("seq_lens", self._seq_lens),
                ("slot_mapping", self._slots),
            )
        }
        # The block table mirrors row by row, through a [B, max_blocks] view of the flat buffer.
        self._table_mirror = DeviceMirror(flat_table.view(batch, self.max_blocks), device)
        # The mirrors whose copies a write must wait for: none when they are the host buffers.
        self._copied = (
            () if self._table_mirror.is_host else (*self._mirrors.values(), self._table_mirror)
        )
        self._table_buffer = (
            flat_table if self._table_mirror.is_host else self._table_mirror.tensor.view(-1)
        )
        self._inputs_by_count: dict[int, QwenDecodeInputs] = {}
        self.row_loop_max = ROW_LOOP_MAX
        self._flat_table = self._table.numpy().reshape(-1)
        self._lengths = self._table.lengths
        self._row_starts = np.arange(batch, dtype=np.int64) * self.max_blocks
        self._seq_view, self._slot_view = self._seq_lens.numpy(), self._slots.numpy()
        # paged_step's arguments after the step's own three (its buffers through
        # kernel_buffer); None: the general path (a token dtype the kernel does not write, or
        # the twin, whose step through paged_step cost more than the general path).
        column = self._token_column
        self._paged_args = (
            None
            if column is None or not COMPILED
            else (
                kernel_buffer(self._lengths),
                kernel_buffer(self._flat_table),
                self.max_blocks,
                self.page_size,
                self.max_seq_len,
                kernel_buffer(column),
                kernel_buffer(self._seq_view),
                kernel_buffer(self._slot_view),
            )
        )
        # Deltas: the last message applied, and each request's row as of that step.
        self._cursor = DeltaCursor()
        self._request_ids: list[Hashable] | None = None
        self._request_rows: dict[Hashable, int] = {}
        self.verify = bool(verify)
        self._verify_lists: dict[Hashable, list[int]] = {}  # by request: the message's lists
        if self.verify:  # the unverified prepare pays nothing for the option
            self.prepare = self._verified_prepare  # type: ignore[method-assign]

    @property
    def block_table(self) -> BlockTable:
        """The host block table (row cache, dirty rows, stats)."""
        return self._table

    def buffers(self) -> dict[str, torch.Tensor]:
        """The host buffers by upstream's argument names (``token_ids``, ``seq_lens``,
        ``block_table`` flat, ``slot_mapping``): the same objects for the preparer's life, there
        from construction (before any step: what a worker forked now inherits)."""
        return {
            "token_ids": self._tokens.tensor,
            "seq_lens": self._seq_lens,
            "block_table": self._table_host,
            "slot_mapping": self._slots,
        }

    def prepare(self, batch: DecodeBatch) -> QwenDecodeInputs:
        """Write ``batch`` into the persistent buffers and return them.

        The block lists come by value (``batch.block_ids``; upstream's ``kv_allocations`` first
        when the batch has them: then one row per allocation, its ``page_ids``) or as a
        :mod:`blockprep.wire` message (``batch.block_deltas``, one op list per request id, or a
        :mod:`blockprep.packed` one of group 0; ``block_ids`` left empty: both given is a
        ``ValueError``, as for DeepSeek).
        Rows are batch rows: a request at the row it held in the last applied step gets its ops
        applied there (a page append writes one cell); one that moved rows gets the list it held
        plus its ops written whole; a new one must come whole. A by-value batch makes the worker
        forget the message numbers: the next message must build on nothing (``base`` ``None``).

        Raises (upstream's messages, in upstream's order; nothing is written, the delta cursor
        included):
            ValueError: ``"batch must contain at least one request"``; ``"batch has {n}
                requests, but runtime max_batch_size is {B}"``; ``"decode token_ids must contain
                exactly one token per row, got shape {shape}"`` (only ``[A]`` and ``[A, 1]``
                are taken; upstream's reshape also took ``[1, A]``; also for fewer ``seq_lens``
                rows than request ids without ``kv_allocations``, as upstream, which counts the
                ``seq_lens`` rows, then the counts named); ``"decode seq_lens has {n} rows,
                expected {A}"`` (fewer rows than ``kv_allocations``; or more rows than request
                ids without them: with them, extra trailing rows are ignored, as upstream);
                then, for deltas, :class:`~blockprep.wire.DeltaSequenceError`
                (the message does not build on the last one applied) and
                :class:`~blockprep.wire.DeltaMessageError` (a malformed message or op, the
                request named); then per row ``"decode seq_lens must be positive"``, ``"decode
                seq_len {s} exceeds max_seq_len {m}"``, ``"page_ids list length {n} exceeds
                block-table width {w}"``, ``"page_ids list length {n} is too small for decode
                position {t}; need at least {k} pages"``, a bad page id at the decode position or
                a slot above int32 (row named); then bad token ids, then bad page ids (row named).
            TypeError: ``token_ids`` or ``seq_lens`` of a non-integer dtype (a bool or float
                tensor: upstream's int32 copy would make ``True`` 1 and ``11.7`` 11), after the
                shape checks; a non-integer page id (row named).

        ``block_ids`` rows past the batch are ignored (upstream reads ``block_ids[i]`` for the
        ``A`` rows only); a missing row is ``[]``. ``batch`` may be upstream's own object, or any
        with ``request_ids``, ``token_ids`` and ``seq_lens``: each optional field it lacks reads
        as upstream's default, and ``hidden_states`` is never read. A rejection is logged
        (:mod:`blockprep.log`).
        """
        try:
            return self._prepare(batch)
        except log.REJECTIONS as error:
            log.rejected("QwenDecodePreparer.prepare", error)
            raise

    def _prepare(self, batch: DecodeBatch) -> QwenDecodeInputs:
        allocations = getattr(batch, "kv_allocations", None)  # upstream's: pages come first
        if allocations:
            count = len(allocations)
        else:
            count = len(batch.request_ids) if batch.request_ids else int(batch.seq_lens.shape[0])
        if count <= 0:
            raise BlockprepValueError("batch must contain at least one request")
        if count > self.max_batch_size:
            raise BlockprepValueError(
                f"batch has {count} requests, but runtime max_batch_size is {self.max_batch_size}"
            )
        tokens = batch.token_ids
        shape = tokens.shape
        if shape != (count,) and shape != (count, 1):
            raise_token_shape(tokens, count)
        seq_count = batch.seq_lens.numel()
        if seq_count < count and not allocations:
            # upstream counts the seq_lens rows, and its token_ids reshape to them fails first
            raise BlockprepValueError(
                "decode token_ids must contain exactly one token per row, got shape "
                f"{tuple(shape)} (decode seq_lens has {seq_count} rows for {count} request ids)"
            )
        if seq_count < count:
            raise BlockprepValueError(f"decode seq_lens has {seq_count} rows, expected {count}")
        if seq_count > count and not allocations:
            # upstream counts seq_lens rows when it has no kv_allocations: more seq_lens than
            # request ids contradict each other (with kv_allocations, extras are ignored)
            raise BlockprepValueError(
                f"decode seq_lens has {seq_count} rows, expected {count} (one per request id; "
                "extra seq_lens rows are ignored only when kv_allocations set the batch size, "
                "as upstream)"
            )
        if tokens.dtype not in INTEGER_DTYPES or batch.seq_lens.dtype not in INTEGER_DTYPES:
            check_integer_dtype(batch.seq_lens, "seq_lens")
            check_integer_dtype(tokens, "token_ids")
        message = getattr(batch, "block_deltas", None)  # upstream's DecodeBatch has none
        if message is not None and getattr(batch, "block_ids", None):  # as DeepSeek's
            raise BlockprepValueError("a Qwen batch carries block_ids or block_deltas, not both")
        step = None
        if message is not None:  # checked against what this worker holds: nothing changes
            step = delta_step(
                message,
                batch.request_ids,
                count,
                self._cursor,
                self._request_ids,
                self._request_rows,
                self._table.cached_ids,
            )
        if count <= self.row_loop_max:
            return self._prepare_small(batch, count, step)
        rows: Sequence[Sequence[int]] | None
        if message is None:  # by value: every row is written (a hit costs one comparison)
            block_ids = page_lists(batch)
            rows = block_ids if len(block_ids) == count else rows_of(block_ids, count)
            items: Any = enumerate(rows)
            try:
                row_lengths = list(map(len, rows))
            except TypeError:  # a row with no length: name it
                for row, ids in enumerate(rows):
                    check_page_row(row, ids)
                raise
            too_long = max(row_lengths) > self.max_blocks
            lengths: npt.NDArray[Any] = np.array(row_lengths)
        else:  # deltas: only the rows of requests that changed or moved
            assert step is not None
            items = step.items
            rows = None
            lengths = self._lengths[:count].astype(np.int64)  # the table's, patched
            too_long = False
            if items:
                for row, ids in items.items():
                    lengths[row] = len(ids)
                    too_long |= len(ids) > self.max_blocks
        seq = int64_values(batch.seq_lens, count)
        token_values = int64_values(tokens, count)
        page_size = self.page_size
        position = seq - 1
        column = position // page_size
        # Upstream's per-row checks, on arrays (a seq_len below 1 wraps to a huge unsigned
        # position); on a fault the row loop picks the message.
        if (
            too_long
            or np.maximum.reduce(position.view(np.uint64)) >= self.max_seq_len
            or np.count_nonzero(column >= lengths)
            or not self._tokens.fits(token_values)
        ):
            self._raise_first_fault(seq, rows, items, tokens)
        plan = None
        if rows is not None or items:  # deltas that change nothing: no table work at all
            try:
                plan = self._table.plan_rows(items)
            except (TypeError, ValueError):
                self._raise_first_fault(seq, rows, items, tokens)
        # Each row's page at its decode position: one gather from the table as it stands, the
        # rows the plan rewrites patched from their new ids; checked before anything is written.
        pages = self._flat_table[self._row_starts[:count] + column].astype(np.int64)
        new_ids = rows if rows is not None else items
        for row in plan.rows if plan is not None else ():
            pages[row] = operator.index(new_ids[row][column[row]])
        slots = pages * page_size
        slots += position
        slots -= column * page_size
        if np.maximum.reduce(slots) > INT32_MAX:
            self._raise_first_fault(seq, rows, items, tokens)
        # Everything is checked: from here on nothing raises.
        wait_host_free(*self._copied)  # step N-1 copies done
        if plan is not None:
            self._table.commit(plan)
        self._took(step, batch.request_ids)
        self._write_rows(count, token_values, seq, slots)
        return self._inputs(count)

    def _prepare_small(
        self, batch: DecodeBatch, count: int, step: DeltaStep | None
    ) -> QwenDecodeInputs:
        """A small batch (by value, or the rows a checked message ``step`` changes): upstream's
        checks row by row in Python, which beats the fixed cost of the array checks below
        ``row_loop_max`` rows; same results and errors."""
        seq_lens = tensor_values(batch.seq_lens, count)
        width, page_size = self.max_blocks, self.page_size
        table, max_seq_len = self._table, self.max_seq_len
        items = None if step is None else step.items
        fixed = self._paged_args
        if items is not None and fixed is not None:  # deltas: in one or two calls
            assert step is not None
            args = (seq_lens, tensor_values(batch.token_ids, count), items, *fixed)
            if not items or paged_step(*args, False):  # every check but the table's
                plan = table.plan_rows(items) if items else None  # the last check
                if self._copied:
                    wait_host_free(*self._copied)
                if paged_step(*args):  # the same checks, then the writes
                    if plan is not None:
                        table.commit(plan)
                    self._took(step, batch.request_ids)
                    if self._copied or (
                        count < self.max_batch_size and self.padding == "replicate"
                    ):
                        self._pad_and_sync(count)
                    return self._inputs(count)
        pages: list[Sequence[Any]] = []
        fast = None  # every row's slot when every row passes (None: the row loop decides)
        if items is not None:  # the rows a message leaves alone read from the table
            fast = step_slots(
                seq_lens, items, self._lengths, self._flat_table, width, page_size, max_seq_len
            )
        slots: list[int] = [] if fast is None else fast
        if fast is None:
            self._slot_rows(batch, seq_lens, items, count, slots, pages)
        token_values = tensor_values(batch.token_ids, count)  # ints: its dtype was checked
        self._tokens.check_int_tokens(token_values)
        if items is None:
            if self._copied:
                wait_host_free(*self._copied)  # step N-1 copies done
            table.write_rows(pages)  # the last check: every changed row before writing any
        else:
            assert step is not None
            plan = table.plan_rows(items) if items else None  # the last check
            if self._copied:
                wait_host_free(*self._copied)
            if plan is not None:
                table.commit(plan)
        self._took(step, batch.request_ids)
        self._write_rows(count, token_values, seq_lens, slots)
        return self._inputs(count)

    def _slot_rows(
        self,
        batch: DecodeBatch,
        seq_lens: list[Any],
        items: dict[int, Any] | None,
        count: int,
        slots: list[int],
        pages: list[Sequence[Any]],
    ) -> None:
        """Upstream's row checks in its order, row by row, each row's slot appended to ``slots``
        and (by value) its pages to ``pages``; for deltas, the rows as the table holds them with
        the message's changes patched in."""
        width, page_size, max_seq_len = self.max_blocks, self.page_size, self.max_seq_len
        page_max = (INT32_MAX - page_size + 1) // page_size  # no slot of these overflows
        lists: Sequence[Sequence[Any] | None]
        if items is None:
            block_ids = page_lists(batch)
            lists = block_ids if len(block_ids) == count else rows_of(block_ids, count)
        else:  # the rows as the table holds them, the message's changes patched in
            lists = self._table.held_rows(count)
            for row, ids in items.items():
                lists[row] = ids
        for row, (seq_len, held) in enumerate(zip(seq_lens, lists, strict=False)):
            # upstream's checks, in its order, row by row
            if seq_len <= 0:
                raise BlockprepValueError("decode seq_lens must be positive")
            if seq_len > max_seq_len:
                raise BlockprepValueError(
                    f"decode seq_len {seq_len} exceeds max_seq_len {max_seq_len}"
                )
            row_pages: Any = [] if held is None else held
            if type(row_pages) is not list:  # a set, a str, a scalar: TypeError, row named
                check_page_row(row, row_pages)
            if len(row_pages) > width:
                raise BlockprepValueError(
                    f"page_ids list length {len(row_pages)} exceeds block-table width {width}"
                )
            position = seq_len - 1
            index = position // page_size
            page = row_pages[index] if index < len(row_pages) else None
            if type(page) is int and 0 <= page <= page_max:  # decode_slot, inline
                slots.append(page * page_size + position - index * page_size)
            else:  # raises what upstream's row check raises, or converts a NumPy integer
                slots.append(decode_slot(row, row_pages, seq_len, page_size))
            pages.append(row_pages)

    def _verified_prepare(self, batch: DecodeBatch) -> QwenDecodeInputs:
        """:meth:`prepare`, then every buffer against a from-scratch rebuild (``verify=True``)."""
        inputs = QwenDecodePreparer.prepare(self, batch)
        count = inputs.actual_batch
        lists = verified_lists(batch, count, self._verify_lists)
        requests = list(batch.request_ids)
        self._verify_lists = dict(zip(requests, lists, strict=True)) if requests else {}
        self._table.verify()
        rebuilt = QwenDecodePrep97(
            self.max_batch_size, self.max_seq_len, self.page_size, self.token_width
        )
        sets = [("host", self.buffers())]
        if not self._table_mirror.is_host:
            device = {
                "token_ids": inputs.token_ids,
                "seq_lens": inputs.seq_lens,
                "block_table": inputs.block_table,
                "slot_mapping": inputs.slot_mapping,
            }
            sets.append(("device", device))
        rows = self.max_batch_size if self.padding == "replicate" else count
        check_against_rebuild(rebuilt, batch, lists, rows, self.max_blocks, sets)
        return inputs

    def resync_request(self) -> dict[str, Any]:
        """The resync back channel's message to send the scheduler after a refused
        ``block_deltas`` message (:func:`blockprep.wire.resync_request` of the last message
        applied): its encoder's next message carries every request whole."""
        return self._cursor.resync_request()

    def reset(self) -> None:
        """What upstream's warm-up does: forget every cached block-table row (the next step
        rewrites them all) and re-initialise the token padding. The delta cursor is forgotten
        too: the next message must build on nothing. Call after anything else wrote the
        buffers."""
        self._table.invalidate()
        wait_host_free(*self._copied)
        self._tokens.reset()
        self._took(None, ())
        self._sync_all()

    def _took(self, step: DeltaStep | None, request_ids: Sequence[Hashable]) -> None:
        """The worker's delta state after a step: ``step``'s message the last applied, and the
        batch's requests by row when they changed; a by-value step (``None``) forgets both (the
        next message must build on nothing)."""
        if step is None:
            self._cursor.last = None
            self._request_ids = None
            self._request_rows = {}
            return
        self._cursor.last = step.seq
        if step.rows is not self._request_rows:  # requests joined, left or moved
            self._request_ids = list(request_ids)
            self._request_rows = step.rows

    def _raise_first_fault(
        self,
        seq: npt.NDArray[np.int64],
        rows: Sequence[Sequence[int]] | None,
        items: Any,
        tokens: torch.Tensor,
    ) -> NoReturn:
        """Upstream's row-by-row checks, in its order, raising the first fault's message; then
        the tokens, then the new block ids. Called only once the array checks found a fault."""
        width, page_size = self.max_blocks, self.page_size
        for row, seq_len in enumerate(seq.tolist()):
            if seq_len <= 0:
                raise BlockprepValueError("decode seq_lens must be positive")
            if seq_len > self.max_seq_len:
                raise BlockprepValueError(
                    f"decode seq_len {seq_len} exceeds max_seq_len {self.max_seq_len}"
                )
            if rows is not None:
                row_pages: Sequence[Any] = rows[row]
            elif row in items:
                row_pages = items[row]
            else:
                row_pages = self._table.cached_ids(row) or []
            if len(row_pages) > width:
                raise BlockprepValueError(
                    f"page_ids list length {len(row_pages)} exceeds block-table width {width}"
                )
            decode_slot(row, row_pages, seq_len, page_size)
        self._tokens.check_tokens(tokens.reshape(-1).tolist())
        self._table.plan_rows(enumerate(rows) if rows is not None else items)
        raise AssertionError("the array checks found a fault that the row checks do not")

    def _write_rows(
        self,
        count: int,
        tokens: npt.NDArray[np.int64] | list[int],
        seq_lens: npt.NDArray[np.int64] | list[int],
        slots: npt.NDArray[np.int64] | list[int],
    ) -> None:
        """Write the checked step and replicate row 0 into rows ``count..B-1``."""
        self._tokens.write_array(tokens)
        seq_view, slot_view = self._seq_view, self._slot_view
        seq_view[: len(seq_lens)] = seq_lens  # count values: lists (small batches) or arrays
        slot_view[: len(slots)] = slots
        self._pad_and_sync(count)

    def _pad_and_sync(self, count: int) -> None:
        """After a step's rows are written: the padding rows (``"replicate"``) and the device
        copies of the rows written since the last step."""
        seq_view, slot_view = self._seq_view, self._slot_view
        if count < self.max_batch_size and self.padding == "replicate":
            self._tokens.replicate(0, count)
            seq_view[count:] = seq_view[0]
            slot_view[count:] = slot_view[0]
            self._table.fill_rows(0, range(count, self.max_batch_size))
        if self._copied:  # device copies: the rows written since the last step go
            for mirror in self._mirrors.values():
                mirror.sync()
            self._table_mirror.sync(self._table.take_dirty())

    def _sync_all(self) -> None:
        for mirror in (*self._mirrors.values(), self._table_mirror):
            mirror.sync()

    def _inputs(self, count: int) -> QwenDecodeInputs:
        inputs = self._inputs_by_count.get(count)
        if inputs is None:  # the same buffers every step: one frozen record per batch size
            mirrors = self._mirrors
            inputs = self._inputs_by_count[count] = QwenDecodeInputs(
                actual_batch=count,
                token_ids=mirrors["token_ids"].tensor,
                seq_lens=mirrors["seq_lens"].tensor,
                block_table=self._table_buffer,
                slot_mapping=mirrors["slot_mapping"].tensor,
            )
        return inputs


class QwenDecodeAdapter:
    """Prepares a :class:`~blockprep.batch.DecodeBatch` and hands the buffers to an executor.

    Device-embedding executors receive no hidden states: nothing looks embeddings up on the host,
    and ``batch.hidden_states`` is never read.
    """

    def __init__(
        self, preparer: QwenDecodePreparer, executor: DecodeExecutor[QwenDecodeInputs]
    ) -> None:
        self.preparer = preparer
        self.executor = executor

    def run_decode(self, batch: DecodeBatch) -> DecodeResult:
        return self.executor.run_decode(self.preparer.prepare(batch))
