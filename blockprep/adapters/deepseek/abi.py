"""DeepSeek V4's decode kernel ABI as upstream dispatches it: argument names, prepared arguments,
the cache group -> block-table argument map.

Read from hw-native-sys/pypto-serving at merge ``9b1a264`` (2026-08-21, "Merge pull request #170";
read through the fork Little-oil/pypto-serving, whose ``main`` is that commit):

- ``pypto_serving/model/deepseek/task_args.py`` (blob ``49af7ad``, last changed in ``3db0170``
  "support ds prefix cache"): ``_DECODE_FWD_TENSOR_ORDER``, the argument order "for the packed
  all-43-layer ``l3_decode_fwd`` kernel", which the file calls "each kernel's positional
  contract -- this module is their single source of truth", and ``_decode_slot_specs`` (the
  host-shared buffers' dtypes and shapes from ``DeepSeekV4CacheLayout``);
- ``pypto_serving/model/deepseek/npu_runner.py`` (blob ``f97474b``):
  ``DEEPSEEK_V4_CACHE_GROUP_NAMES`` (the ``block_counts`` column order), the table-width
  constants (``DEEPSEEK_V4_ORI_TABLE_MAX_BLOCKS`` ... ``DEEPSEEK_V4_PREFILL_CSA_INNER_STATE_
  MAX_BLOCKS``), ``_prepare_decode_inputs`` (the ``static_values`` dict that builds each table
  argument from one group's padded ids: the group -> argument map below) and
  ``_stage_decode_dynamic_inputs`` (``input_ids``, ``position_ids``, ``kv_seq_lens``), and
  ``_decode_fwd_args`` (``self._decode_task_args[inputs.buffer_slot].build()``: the slot's
  buffers, full shape, no splicing).

Not read: the kernel's own signature in pypto-lib (``decode_fwd.py`` ``l3_decode_fwd`` at the
submodule commit ``2cd5f82`` that ``9b1a264`` pins is not in the stored history), so the order
here is upstream's dispatch order. Other upstream versions order the arguments differently:
re-read ``_DECODE_FWD_TENSOR_ORDER`` before trusting this against another commit.

Nothing here imports an NPU package.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from blockprep.adapters.deepseek.layout import GROUP_NAMES, INPUT_FIELDS, DeepSeekV4Layout
from blockprep.adapters.kernel_abi import ArgSpec, build_arguments
from blockprep.errors import BlockprepTypeError, BlockprepValueError

if TYPE_CHECKING:
    from blockprep.adapters.deepseek._inputs import DeepSeekV4DecodeInputs

DEEPSEEK_V4_DECODE_KERNEL = "l3_decode_fwd"
"""The compiled packed all-layer decode callable (``modules["decode_fwd"].l3_decode_fwd``)."""

DEEPSEEK_V4_DECODE_ARGUMENTS: tuple[str, ...] = (
    "embed_weight",
    "hc_attn_fn",
    "hc_attn_scale",
    "hc_attn_base",
    "attn_norm_w",
    "wq_a",
    "wq_b",
    "wq_b_scale",
    "wkv",
    "gamma_cq",
    "gamma_ckv",
    "kv_cache",
    "attn_sink",
    "wo_a",
    "wo_b",
    "wo_b_scale",
    "hca_cmp_wkv",
    "hca_cmp_wgate",
    "hca_cmp_ape",
    "hca_cmp_norm_w",
    "hca_compress_state",
    "csa_cmp_wkv",
    "csa_cmp_wgate",
    "csa_cmp_ape",
    "csa_cmp_norm_w",
    "csa_compress_state",
    "csa_idx_wq_b",
    "csa_idx_wq_b_scale",
    "csa_weights_proj",
    "csa_hadamard_idx",
    "csa_inner_wkv",
    "csa_inner_wgate",
    "csa_inner_ape",
    "csa_inner_norm_w",
    "csa_inner_compress_state",
    "hca_cmp_kv",
    "csa_cmp_kv",
    "idx_kv_cache",
    "idx_kv_scale",
    "hc_ffn_fn",
    "hc_ffn_scale",
    "hc_ffn_base",
    "norm_w",
    "gate_w",
    "gate_bias",
    "tid2eid",
    "routed_w1",
    "routed_w1_scale",
    "routed_w3",
    "routed_w3_scale",
    "routed_w2",
    "routed_w2_scale",
    "shared_w1",
    "shared_w1_scale",
    "shared_w3",
    "shared_w3_scale",
    "shared_w2",
    "shared_w2_scale",
    "freqs_cos",
    "freqs_sin",
    "block_table",
    "position_ids",
    "kv_seq_lens",
    "hca_compress_state_block_table",
    "csa_compress_state_block_table",
    "csa_inner_compress_state_block_table",
    "hca_cmp_block_table",
    "csa_cmp_block_table",
    "idx_block_table",
    "block_counts",
    "input_ids",
    "hc_head_fn",
    "hc_head_scale",
    "hc_head_base",
    "final_norm_w",
    "pre_hc_hidden_out",
    "lm_head_weight",
    "hidden_out",
    "logits",
    "sampled_ids",
    "num_tokens_per_owner",
    "logit_row_indices",
)
"""``l3_decode_fwd``'s 82 positional arguments, in order (``_DECODE_FWD_TENSOR_ORDER``,
deepseek/task_args.py at ``9b1a264``)."""

GROUP_ARGUMENTS: Mapping[str, str] = MappingProxyType(
    {
        "ori": "block_table",
        "cmp_c128": "hca_cmp_block_table",
        "cmp_c4": "csa_cmp_block_table",
        "idx": "idx_block_table",
        "hca_state": "hca_compress_state_block_table",
        "csa_state": "csa_compress_state_block_table",
        "csa_inner_state": "csa_inner_compress_state_block_table",
    }
)
"""Cache group (:data:`~blockprep.adapters.deepseek.layout.GROUP_NAMES` order) -> the block-table
argument built from its ids (``static_values`` in ``_prepare_decode_inputs``, npu_runner.py at
``9b1a264``: ``"hca_cmp_block_table": block_table_from_ids(padded_group_ids["cmp_c128"], ...)``
and so on; ``ori`` through ``paged_ori_block_table_from_ids``)."""

INPUT_ARGUMENTS: Mapping[str, str] = MappingProxyType({name: name for name in INPUT_FIELDS})
""":class:`~blockprep.adapters.deepseek._inputs.DeepSeekV4DecodeInputs` buffer field (besides the
tables) -> kernel argument name: upstream's slot names, which blockprep's fields share
(``block_counts``, ``input_ids``, ``position_ids``, ``kv_seq_lens``, ``num_tokens_per_owner``,
``logit_row_indices``)."""

BLOCK_COUNTS_COLUMNS: tuple[str, ...] = GROUP_NAMES
"""``block_counts[..., j]`` counts the ids of group ``j`` (``DEEPSEEK_V4_CACHE_GROUP_NAMES``,
npu_runner.py at ``9b1a264``; the same order as blockprep's ``GROUP_NAMES``)."""

DEEPSEEK_V4_TABLE_WIDTHS: Mapping[str, int] = MappingProxyType(
    {
        "block_table": 128,
        "hca_cmp_block_table": 128,
        "csa_cmp_block_table": 128,
        "idx_block_table": 128,
        "hca_compress_state_block_table": 2048,
        "csa_compress_state_block_table": 4096,
        "csa_inner_compress_state_block_table": 4096,
    }
)
"""Upstream's table widths (last dimension), fixed by the compiled kernel: ``ori_table_max_blocks``
(``DEEPSEEK_V4_ORI_TABLE_MAX_BLOCKS = 128``), ``cmp_max_blocks`` (128), ``idx_max_blocks`` (128),
``prefill_hca_state_max_blocks`` (2048), ``prefill_csa_state_max_blocks`` and
``prefill_csa_inner_state_max_blocks`` (4096), as ``_decode_slot_specs`` sizes them (task_args.py
and the npu_runner.py constants at ``9b1a264``). :class:`DeepSeekV4Layout` has the same widths."""

_PREPARED = {*GROUP_ARGUMENTS.values(), *INPUT_ARGUMENTS.values()}
PREPARED_ARGUMENTS: tuple[str, ...] = tuple(
    name for name in DEEPSEEK_V4_DECODE_ARGUMENTS if name in _PREPARED
)
"""The 13 arguments blockprep prepares, in kernel order: ``block_table`` (60), ``position_ids``
(61), ``kv_seq_lens`` (62), the state tables (63-65), the cmp/idx tables (66-68),
``block_counts`` (69), ``input_ids`` (70), ``num_tokens_per_owner`` (80), ``logit_row_indices``
(81). Every other argument (weights, cache pools, outputs) is the engine's."""

HOST_SHARED_OUTPUTS: tuple[str, ...] = ("hidden_out", "logits", "sampled_ids")
"""The other host-shared slots of a decode ``TaskArgs`` (``_decode_slot_specs``), per buffer slot:
``hidden_out`` bfloat16 ``[R, T, hidden]``, ``logits`` float32 ``[R, T, vocab]``, ``sampled_ids``
int32 ``[R, T, 8]`` (``DEEPSEEK_V4_SAMPLED_IDS_PAD``); ``pre_hc_hidden_out`` float32 ``[R, T,
hc_mult, hidden]`` is a device-resident slot. All the engine's."""


def deepseek_v4_prepared_arguments(layout: DeepSeekV4Layout) -> dict[str, ArgSpec]:
    """The prepared arguments of ``l3_decode_fwd``, in kernel order, for ``layout``.

    ``R`` ranks, ``b`` decode_batch, ``T`` decode_tokens (``_decode_slot_specs``):

    - the 7 tables, int32 ``[R, b, width]`` (:data:`DEEPSEEK_V4_TABLE_WIDTHS`);
    - ``block_counts`` int32 ``[R, b, 7]``;
    - ``input_ids`` **int64** ``[R, T]``; ``position_ids`` int32 ``[R, T]``;
    - ``kv_seq_lens`` int32 ``[R, b]``;
    - ``num_tokens_per_owner`` int32 ``[R]``; ``logit_row_indices`` int32 ``[R, T]``.

    Raises:
        TypeError: ``layout`` is not a :class:`DeepSeekV4Layout`.
    """
    if not isinstance(layout, DeepSeekV4Layout):
        raise BlockprepTypeError(f"layout must be a DeepSeekV4Layout, got {type(layout).__name__}")
    R, b, T = layout.ranks, layout.decode_batch, layout.decode_tokens
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        name: ((R, b, width), torch.int32) for name, width in DEEPSEEK_V4_TABLE_WIDTHS.items()
    }
    shapes.update(
        block_counts=((R, b, len(GROUP_NAMES)), torch.int32),
        input_ids=((R, T), torch.int64),
        position_ids=((R, T), torch.int32),
        kv_seq_lens=((R, b), torch.int32),
        num_tokens_per_owner=((R,), torch.int32),
        logit_row_indices=((R, T), torch.int32),
    )
    return {
        name: ArgSpec(name, DEEPSEEK_V4_DECODE_ARGUMENTS.index(name), *shapes[name])
        for name in PREPARED_ARGUMENTS
    }


def deepseek_v4_argument_values(inputs: DeepSeekV4DecodeInputs) -> dict[str, torch.Tensor]:
    """A prepared step's buffers by kernel argument name (the slot's tensors themselves), in
    kernel order.

    Raises:
        ValueError: ``inputs.x_hc`` is set (``embedding="host"``): ``l3_decode_fwd`` at
            ``9b1a264`` embeds ``input_ids`` on the device and takes no host embeddings.
    """
    if inputs.x_hc is not None:
        raise BlockprepValueError(
            "l3_decode_fwd embeds input_ids on the device and has no x_hc argument; "
            'prepare with embedding="device"'
        )
    values: dict[str, torch.Tensor] = {
        GROUP_ARGUMENTS[group]: table for group, table in inputs.tables.items()
    }
    values.update({argument: getattr(inputs, field) for field, argument in INPUT_ARGUMENTS.items()})
    return {name: values[name] for name in PREPARED_ARGUMENTS}


def deepseek_v4_decode_args(*sources: Mapping[str, object]) -> tuple[object, ...]:
    """``l3_decode_fwd``'s positional argument tuple from values by name.

    Typically ``deepseek_v4_decode_args(deepseek_v4_argument_values(inputs), engine_values)``:
    blockprep's 13 prepared buffers and the engine's 69 other arguments; together exactly the 82
    names of :data:`DEEPSEEK_V4_DECODE_ARGUMENTS`, each once.

    Raises:
        KernelArgumentError: naming every missing, unknown and doubly given argument.
    """
    return build_arguments(DEEPSEEK_V4_DECODE_KERNEL, DEEPSEEK_V4_DECODE_ARGUMENTS, *sources)
