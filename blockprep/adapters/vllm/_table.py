"""VllmBlockTable: vLLM MRv1's worker ``BlockTable`` API on :class:`~blockprep.BlockTable` (see
:mod:`blockprep.adapters.vllm`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from blockprep._engine.rules import ROW_WHOLE
from blockprep._ids import as_int
from blockprep.adapters.vllm._steps import (
    Ids,
    RowItems,
    apply_packed,
    checked_ids,
    step_deltas,
    step_items,
)
from blockprep.adapters.vllm._verify import CallerLists
from blockprep.block_table import BlockTable
from blockprep.buffers import DeviceMirror, host_tensor, torch_device
from blockprep.errors import BlockprepIndexError, BlockprepValueError
from blockprep.wire import DeltaCursor

PAD_SLOT_ID = -1
"""The slot of a token past the step's tokens (vLLM's ``PAD_SLOT_ID``)."""

_ROW_COPY_LOOP_MAX = 8
"""A commit to a CPU copy copies up to this many rows one by one; more, in one gathered copy."""


def _positive(value: object, name: str) -> int:
    number = as_int(value, name)
    if number < 1:
        raise BlockprepValueError(f"{name} must be positive, got {number}")
    return number


def _kernel_block_size(block_size: int, kernel_block_size: int | None) -> None:
    if kernel_block_size is not None and kernel_block_size != block_size:
        raise BlockprepValueError(
            f"kernel_block_size {kernel_block_size} differs from block_size {block_size}: "
            "hybrid kernel blocks are not supported"
        )


class VllmBlockTable:
    """vLLM's worker ``BlockTable`` (one KV cache group) on a validated, atomic ``BlockTable``.

    Args, in vLLM's order:
        block_size: tokens per block (positive).
        max_num_reqs: rows.
        max_num_blocks_per_req: columns.
        max_num_batched_tokens: length of the ``slot_mapping`` buffer.
        pin_memory: pin the host buffers (when an accelerator is present).
        device: where :meth:`get_device_tensor` lives (a torch device string). On ``"cpu"`` the
            device tensor is the host tensor itself, unless ``separate=True`` asks for a distinct
            copy that :meth:`commit_block_table` refreshes, as vLLM's ``CpuGpuBuffer`` does.
        kernel_block_size: ``None`` or ``block_size`` (hybrid kernel blocks are not supported).
        verify: after every call that writes rows, the table and ``num_blocks_per_row`` against
            a rebuild of the block lists the calls gave (:mod:`blockprep.adapters.vllm._verify`;
            ``StaleRowError`` names the first differing row and column). Slow: for wiring.

    Buffers: ``get_cpu_tensor()`` int32 ``[max_num_reqs, max_num_blocks_per_req]`` (persistent,
    address fixed for life), ``get_numpy_array()`` a view of it, ``num_blocks_per_row`` int32
    ``[max_num_reqs]`` (read-only view that follows every write), ``slot_mapping`` NumPy int64
    ``[max_num_batched_tokens]`` (a view of ``slot_mapping_cpu``).

    Differences from vLLM (``vllm/v1/worker/block_table.py`` at ``01edfd09``):

    - Validation, all-or-nothing: a negative id, an id above ``2**31 - 1``, a non-integer id,
      more blocks than the row has columns, or a row index out of range raises ``ValueError``,
      ``TypeError`` or ``IndexError`` naming the row and the value, having written nothing. vLLM
      writes negative ids as they are, wraps a negative row index around, and on an oversized
      ``append_row`` raises only after it has raised the row's count (the row keeps a wrong count
      for later appends and for the slot mapping).
    - No stale tails: a row holds 0 past its count after every call. vLLM's ``move_row`` and
      ``add_row`` leave the target's old ids past the new count.
    - ``num_blocks_per_row`` is read-only (vLLM's is a writable array the methods update).
    - ``compute_slot_mapping(req_indices, positions)`` is vLLM's NumPy form (before the Triton
      kernel that takes ``query_start_loc``); like the kernel it pads the buffer past the tokens
      with -1, and it refuses a position past its row's blocks (vLLM reads whatever the cell
      holds) and a row or token count out of range. It returns the filled ``slot_mapping`` view.
    - ``commit_block_table(num_reqs)`` copies only the span of rows below ``num_reqs`` written
      since they were last copied, and nothing when none was (vLLM copies ``num_reqs`` rows every
      step); on a shared CPU "device" there is nothing to copy.
    - ``get_device_tensor(num_reqs=None)``: every row when ``num_reqs`` is omitted.
    - :meth:`apply_step` (a whole scheduler step in one call) and :meth:`apply_packed` (one sent
      as packed int32 records), with :meth:`resync_request`, have no vLLM counterpart.
    - Hybrid kernel block sizes and decode context parallelism are not supported.
    - Rows must be written through these methods: writing the NumPy view directly bypasses the
      row cache (call ``table.invalidate()``; afterwards only ``add_row`` may write the row).
    """

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        pin_memory: bool = False,
        device: str | torch.device = "cpu",
        kernel_block_size: int | None = None,
        *,
        separate: bool = False,
        verify: bool = False,
    ) -> None:
        self.block_size = _positive(block_size, "block_size")
        _kernel_block_size(self.block_size, kernel_block_size)
        self.max_num_reqs = as_int(max_num_reqs, "max_num_reqs")
        self.max_num_blocks_per_req = _positive(max_num_blocks_per_req, "max_num_blocks_per_req")
        self.max_num_batched_tokens = as_int(max_num_batched_tokens, "max_num_batched_tokens")
        if self.max_num_batched_tokens < 0:
            raise BlockprepValueError(
                f"max_num_batched_tokens must be non-negative, got {self.max_num_batched_tokens}"
            )
        self.pin_memory = pin_memory
        try:
            self.device = torch_device(device)  # torch_npu imported first for "npu"
        except RuntimeError:  # a device string torch does not know
            raise BlockprepValueError(
                f"device {device!r} is not a torch device (a device type torch knows, such as "
                "'cpu' or 'cuda:0', or a torch.device)"
            ) from None
        self._table = BlockTable(
            self.max_num_reqs,
            self.max_num_blocks_per_req,
            kind="paged",
            pad=0,
            pin_memory=pin_memory,
        )
        self._mirror = DeviceMirror(self._table.tensor, self.device, separate=separate)
        self._mirror_is_host = self._mirror.is_host
        self._host = self._table.tensor
        self._host_np = self._table.numpy()
        device_tensor = self._mirror.tensor
        self._device_np: npt.NDArray[np.int32] | None = (
            device_tensor.numpy() if device_tensor.device.type == "cpu" else None
        )
        self._stale: set[int] = set()  # rows written but not yet copied to the device tensor
        self._cursor = DeltaCursor()  # the last packed message applied (apply_packed)
        self._row_list = list(range(self.max_num_reqs))  # a packed record's row: the table row
        self._lengths = self._table.lengths
        self.slot_mapping_cpu = host_tensor(
            (self.max_num_batched_tokens,), torch.int64, fill=PAD_SLOT_ID, pin_memory=pin_memory
        )
        self.slot_mapping: npt.NDArray[np.int64] = self.slot_mapping_cpu.numpy()
        self.verify = bool(verify)
        if self.verify:  # the plain methods pay nothing for the option
            CallerLists(self).install()

    # --- buffers ---------------------------------------------------------------------------------

    @property
    def table(self) -> BlockTable:
        """The underlying :class:`~blockprep.BlockTable` (``kind="paged"``, ``pad=0``)."""
        return self._table

    @property
    def num_blocks_per_row(self) -> npt.NDArray[np.int32]:
        """Blocks each row holds, int32 ``[max_num_reqs]``: a read-only view."""
        return self._lengths

    def get_numpy_array(self) -> npt.NDArray[np.int32]:
        """The host table as a NumPy view ``[max_num_reqs, max_num_blocks_per_req]``."""
        return self._table.numpy()

    def get_cpu_tensor(self) -> torch.Tensor:
        """The persistent host table, int32 ``[max_num_reqs, max_num_blocks_per_req]``."""
        return self._host

    def get_device_tensor(self, num_reqs: int | None = None) -> torch.Tensor:
        """The device table (its first ``num_reqs`` rows); current after
        :meth:`commit_block_table`."""
        device = self._mirror.tensor
        return device if num_reqs is None else device[:num_reqs]

    # --- per-row operations (vLLM's) -----------------------------------------------------------

    def append_row(self, block_ids: Ids, row_idx: int) -> None:
        """Row ``row_idx`` gains ``block_ids`` after its current blocks."""
        self._table.append(row_idx, block_ids)

    def add_row(self, block_ids: Ids, row_idx: int) -> None:
        """Row ``row_idx`` holds ``block_ids`` (then 0), whatever it held before (an invalidated
        row included)."""
        table = self._table
        if table._apply_row(ROW_WHOLE, row_idx, block_ids) is not None:  # plain ints: at once
            return
        if not table.knows(row_idx):  # invalidated: written whole, its ids checked
            where = f"block-table row {row_idx}"
            table.write_row(row_idx, checked_ids(where, block_ids, 0, self.max_num_blocks_per_req))
            return
        table.apply_deltas(truncate={row_idx: 0}, append={row_idx: block_ids})

    def clear_row(self, row_idx: int) -> None:
        """Row ``row_idx`` holds no blocks (its used cells reset to 0)."""
        self._table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        """Row ``tgt`` becomes a copy of row ``src`` (which keeps its blocks)."""
        self._table.copy_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        """Rows ``src`` and ``tgt`` exchange their blocks."""
        self._table.swap_rows(src, tgt)

    def clear(self) -> None:
        """Every row holds no blocks; the device table is zeroed too."""
        for row in np.flatnonzero(self._lengths).tolist():
            self._table.clear_row(row)
        self._table.take_dirty()
        self._stale.clear()
        if not self._mirror.is_host:
            self._mirror.tensor.fill_(0)

    # --- a whole step ----------------------------------------------------------------------------

    def apply_step(
        self,
        *,
        finished: Iterable[int] = (),
        appended: RowItems[Ids | None] = (),
        added: RowItems[Ids] = (),
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """Apply one scheduler step's row operations at once, all-or-nothing.

        In this order, as a vLLM worker applies a ``SchedulerOutput``: ``finished`` rows are
        cleared (``clear_row``); each ``appended`` row gains its new block ids (``append_row``;
        ``None`` or an empty list: nothing, as vLLM's ``new_block_ids`` may be); each ``added``
        row holds its ids (``add_row``, a new or resumed request); each ``(src, tgt)`` of
        ``moves`` copies ``src`` into ``tgt`` in order (``move_row``, closing gaps); then, when
        ``num_reqs`` is given, :meth:`commit_block_table`. ``appended`` and ``added`` are
        ``{row: ids}`` mappings or ``(row, ids)`` pairs (a row once in each, and not in both).

        Everything is checked before anything is written: an error leaves table, counts and
        caches as they were. A step of lists of plain ints on rows whose ids the table knows is
        checked and written by one kernel call (``GroupKernel.apply_step``); any other goes
        through one :meth:`BlockTable.apply_deltas` call, then one row copy per move.
        """
        if num_reqs is not None and (
            type(num_reqs) is not int or not 0 <= num_reqs <= self.max_num_reqs
        ):
            num_reqs = self._num_reqs(num_reqs)
        table = self._table
        if not table._apply_step(finished, appended, added, moves):  # plain ints: at once
            truncate, append, pairs = step_deltas(
                table, finished, step_items(appended, "appended"), step_items(added, "added"), moves
            )
            if truncate or append:
                table.apply_deltas(truncate=truncate, append=append)
            for src, tgt in pairs:  # rows checked: cannot raise
                table.copy_row(src, tgt)
        if num_reqs is not None and not self._mirror_is_host:
            self.commit_block_table(num_reqs)

    def apply_packed(
        self,
        message: object,
        *,
        moves: Iterable[tuple[int, int]] = (),
        num_reqs: int | None = None,
    ) -> None:
        """Apply one step sent as a :mod:`blockprep.packed` message, all-or-nothing: the table's
        kernel reads the records in place (no Python int per id), then ``moves`` and
        ``num_reqs`` as in :meth:`apply_step`.

        A record's ``row`` is the table row, ``group`` 0. The records stand for vLLM's calls:
        whole for ``add_row``, append for ``append_row``, truncate for a truncation (to 0:
        ``clear_row``), set for ids at positions; a row's records apply in order to what it
        holds. The message must build on the last one this table applied (``base``; ``None``,
        a resync: each row named starts whole, the others keep what they hold); after a
        refusal send :meth:`resync_request` back to the scheduler. Rows written by the other
        methods change what later records apply to.

        Raises (nothing written):
            DeltaMessageError: the header (version, checksum) or a record malformed, a row out
                of range, records that do not fit the row's ids (a truncation or position past
                its length, a row of unknown ids not starting whole: the row named).
            DeltaSequenceError: ``base`` is not the last message applied.
            ValueError: a negative id, more blocks than the row has columns (the row named);
                ``num_reqs`` out of range.
            TypeError, IndexError: a move that is no pair of rows.
        """
        if num_reqs is not None and (
            type(num_reqs) is not int or not 0 <= num_reqs <= self.max_num_reqs
        ):
            num_reqs = self._num_reqs(num_reqs)
        apply_packed([self._table], self._row_list, self._cursor, message, moves)
        if num_reqs is not None:
            self.commit_block_table(num_reqs)

    def resync_request(self) -> dict[str, Any]:
        """What the worker sends back after a refused :meth:`apply_packed` message:
        :func:`blockprep.wire.resync_request` of the last message applied."""
        return self._cursor.resync_request()

    # --- hand-off --------------------------------------------------------------------------------

    def commit_block_table(self, num_reqs: int) -> None:
        """Make the device table's first ``num_reqs`` rows equal the host's (``non_blocking``)."""
        if type(num_reqs) is not int or not 0 <= num_reqs <= self.max_num_reqs:
            num_reqs = self._num_reqs(num_reqs)
        if self._mirror_is_host:  # nothing to copy (the table's dirty rows are left to it)
            return
        dirty = self._table.take_dirty()
        stale = self._stale
        if dirty:
            stale.update(dirty)
        if not stale:
            return
        below = [row for row in stale if row < num_reqs]
        if not below:
            return
        device_np = self._device_np
        if device_np is not None:  # a CPU copy: only the rows written
            if len(below) <= _ROW_COPY_LOOP_MAX:
                host_np = self._host_np
                for row in below:
                    device_np[row] = host_np[row]
            else:
                device_np[below] = self._host_np[below]
        else:  # one copy of the span that holds them
            lo, hi = min(below), max(below) + 1
            self._mirror.tensor[lo:hi].copy_(self._host[lo:hi], non_blocking=True)
        stale.difference_update(below)

    def compute_slot_mapping(
        self, req_indices: npt.ArrayLike, positions: npt.ArrayLike
    ) -> npt.NDArray[np.int64]:
        """Token ``i``'s KV slot: ``table[req_indices[i], positions[i] // block_size] *
        block_size + positions[i] % block_size``, into ``slot_mapping[:n]`` (one NumPy gather),
        -1 after; returns ``slot_mapping[:n]``.

        Raises ``ValueError``/``IndexError`` (nothing written) for arrays of different lengths,
        more tokens than ``max_num_batched_tokens``, a row out of range, a negative position or
        one past its row's blocks.
        """
        req, pos = self._token_arrays(req_indices, positions)
        block = pos // self.block_size
        self._check_positions(req, pos, block, "")
        return self._write_slots(req, pos, block)

    # --- internals -------------------------------------------------------------------------------

    def _num_reqs(self, num_reqs: object) -> int:
        count = as_int(num_reqs, "num_reqs")
        if not 0 <= count <= self.max_num_reqs:
            raise BlockprepValueError(f"num_reqs must be in [0, {self.max_num_reqs}], got {count}")
        return count

    def _token_arrays(
        self, req_indices: npt.ArrayLike, positions: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        req, pos = np.asarray(req_indices), np.asarray(positions)
        for name, array in (("req_indices", req), ("positions", pos)):
            if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
                raise BlockprepValueError(
                    f"{name} must be a 1-D integer array, got shape {array.shape} of {array.dtype}"
                )
        if len(req) != len(pos):
            raise BlockprepValueError(f"{len(req)} req_indices but {len(pos)} positions")
        if len(req) > self.max_num_batched_tokens:
            raise BlockprepValueError(
                f"{len(req)} tokens exceed max_num_batched_tokens {self.max_num_batched_tokens}"
            )
        return req.astype(np.int64, copy=False), pos.astype(np.int64, copy=False)

    def _check_positions(
        self,
        req: npt.NDArray[np.int64],
        pos: npt.NDArray[np.int64],
        block: npt.NDArray[np.int64],
        where: str,
    ) -> None:
        if not len(req):
            return
        if int(req.min()) < 0 or int(req.max()) >= self.max_num_reqs:
            token = int(np.flatnonzero((req < 0) | (req >= self.max_num_reqs))[0])
            raise BlockprepIndexError(
                f"{where}token {token}: block-table row {int(req[token])} is out of range for a "
                f"table of {self.max_num_reqs} rows"
            )
        held = self._lengths[req]
        bad = (pos < 0) | (block >= held)
        if bad.any():
            token = int(np.flatnonzero(bad)[0])
            raise BlockprepValueError(
                f"{where}token {token}: position {int(pos[token])} of block-table row "
                f"{int(req[token])} needs block {int(block[token])}, but the row holds "
                f"{int(held[token])} blocks of {self.block_size} tokens"
            )

    def _write_slots(
        self, req: npt.NDArray[np.int64], pos: npt.NDArray[np.int64], block: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        n = len(req)
        out = self.slot_mapping[:n]
        flat = self._table.numpy().reshape(-1)
        np.multiply(flat[req * self.max_num_blocks_per_req + block], self.block_size, out=out)
        out += pos % self.block_size
        self.slot_mapping[n:] = PAD_SLOT_ID
        return out
