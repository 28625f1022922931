"""vLLM-style block tables: vLLM MRv1's worker block-table API on :class:`~blockprep.BlockTable`.

:class:`VllmBlockTable` and :class:`VllmMultiGroupBlockTable` take vLLM's method names, argument
order and semantics (``vllm/v1/worker/block_table.py``, ``BlockTable`` and
``MultiGroupBlockTable``, read at vllm-project/vllm commit
``01edfd091847f63b5db913c293f4834c823dac40``), so that a vLLM-like worker can swap them in, and
add what vLLM's lacks: every id and row is checked before anything is written (an error names the
row and the value and leaves table, counts and caches as they were), rows past their count always
hold 0, :meth:`VllmBlockTable.apply_step` applies a whole scheduler step's row operations in a
few NumPy calls, and :meth:`VllmBlockTable.apply_packed` a step sent as a :mod:`blockprep.packed`
message, its payload read in place by the table kernel (the step's checks and the packed path:
:mod:`blockprep.adapters.vllm._steps`). The differences from vLLM are listed in
:class:`VllmBlockTable`'s docstring.

Example::

    table = VllmBlockTable(16, max_num_reqs=4, max_num_blocks_per_req=8,
                           max_num_batched_tokens=32)
    table.add_row([7, 3], 0)
    table.append_row([9], 0)
    table.commit_block_table(1)
    table.compute_slot_mapping(np.array([0, 0]), np.array([15, 40]))  # [7*16+15, 9*16+8]
"""

from blockprep.adapters.vllm._groups import VllmMultiGroupBlockTable
from blockprep.adapters.vllm._table import PAD_SLOT_ID, VllmBlockTable

__all__ = ["PAD_SLOT_ID", "VllmBlockTable", "VllmMultiGroupBlockTable"]
