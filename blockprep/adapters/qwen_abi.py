"""Qwen3-14B's decode kernel ABI as upstream dispatches it: argument names, prepared arguments.

Read from hw-native-sys/pypto-serving at merge ``9b1a264`` (2026-08-21, "Merge pull request #170";
read through the fork Little-oil/pypto-serving, whose ``main`` is that commit):

- ``pypto_serving/model/qwen/task_args.py`` (blob ``5a28be7``, last changed in ``c9e1f8c``
  "refactor(qwen): adopt the common dispatch layer, own buffers in TaskArgs"): ``_DECODE_ORDER``,
  "``qwen3_decode_host`` positional order", which the file calls "the single source of truth for
  each kernel's positional contract", and ``_decode_slot_specs`` (the host-shared buffers'
  dtypes and shapes from ``QwenLayout``);
- ``pypto_serving/model/qwen/npu_runner.py`` (blob ``1d8c7db``): ``_decode_kernel_args``
  (``task_args.build()``, with ``logits``/``next_hidden`` swapped for device scratch under device
  sampling), ``_prepare_decode_inputs`` (writes ``token_ids``, ``seq_lens``, ``block_table``,
  ``slot_mapping``; the full ``kernel_batch`` buffers are dispatched, no prefix views) and
  ``_max_blocks_per_seq`` (``(max_seq_len + page_size - 1) // page_size``);
- ``pypto_serving/model/qwen/npu_executor.py`` (blob ``1a60035``): ``QwenLayout(kernel_batch=
  model.runtime.max_batch_size, ...)`` and ``sampled_ids_width = int(getattr(qwen3_decode_fwd,
  "SAMPLED_IDS_PAD", 1))``: the token width comes from the pypto-lib kernel module.

Not read: the kernel's own signature in pypto-lib (``models/qwen3/14b/decode_fwd.py`` at the
submodule commit ``2cd5f82`` that ``9b1a264`` pins is not in the stored history; the stored
version read, ``0092512``, has another signature: ``hidden_states`` in, no ``token_ids``), so the
order here is upstream's dispatch order, and today's token width (8) is upstream's comment in
``_prepare_decode_inputs`` ("8 for Qwen3-14B"), not the kernel's constant.

Nothing here imports an NPU package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from blockprep._ids import as_int
from blockprep.adapters.kernel_abi import ArgSpec, build_arguments
from blockprep.errors import BlockprepValueError


@dataclass(frozen=True)
class QwenDecodeInputs:
    """One step's inputs: each tensor *is* a persistent buffer (same object, same address)."""

    actual_batch: int
    token_ids: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor

    def prefix_views(self) -> dict[str, torch.Tensor]:
        """The active rows' views by argument name, as upstream's newer dynamic-batch runner
        dispatches them: ``token_ids[:A]``, ``seq_lens[:A]``, ``block_table[:A * max_blocks]``,
        ``slot_mapping[:A]`` (views of the persistent buffers: same memory, same start)."""
        count = self.actual_batch
        width = self.block_table.numel() // self.seq_lens.shape[0]
        return {
            "token_ids": self.token_ids[:count],
            "seq_lens": self.seq_lens[:count],
            "block_table": self.block_table[: count * width],
            "slot_mapping": self.slot_mapping[:count],
        }


QWEN3_DECODE_KERNEL = "qwen3_decode_host"
"""The compiled decode callable (``qwen3_decode_fwd.qwen3_decode_host`` in npu_executor.py)."""

QWEN3_DECODE_ARGUMENTS: tuple[str, ...] = (
    "decode_input_rms_weight",
    "decode_wq",
    "decode_wk",
    "decode_wv",
    "decode_q_norm_weight",
    "decode_k_norm_weight",
    "seq_lens",
    "block_table",
    "slot_mapping",
    "rope_cos",
    "rope_sin",
    "k_cache",
    "v_cache",
    "decode_wo",
    "decode_w_gate",
    "decode_w_up",
    "decode_w_down",
    "decode_post_rms_weight",
    "final_norm_weight",
    "padded_lm_head_weight",
    "logits",
    "padded_embed_weight",
    "token_ids",
    "sampled_ids",
    "next_hidden",
)
"""``qwen3_decode_host``'s 25 positional arguments, in order (``_DECODE_ORDER``, task_args.py at
``9b1a264``)."""

QWEN3_PREPARED_ARGUMENTS: tuple[str, ...] = ("seq_lens", "block_table", "slot_mapping", "token_ids")
"""The arguments blockprep prepares (upstream's ``_prepare_decode_inputs`` writes them), in
kernel order; every other argument (weights, RoPE tables, KV caches, outputs) is the engine's."""

QWEN3_HOST_SHARED_OUTPUTS: tuple[str, ...] = ("logits", "sampled_ids", "next_hidden")
"""The other host-shared slots of the decode ``TaskArgs`` (``_decode_slot_specs``): outputs the
engine allocates (``logits`` float32 ``[B, padded_vocab]``, ``sampled_ids`` int32 ``[B, width]``,
``next_hidden`` bfloat16 ``[B, hidden]``); ``logits`` and ``next_hidden`` are replaced by
worker-resident scratch under device sampling."""

QWEN3_INPUT_ARGUMENTS: Mapping[str, str] = MappingProxyType(
    {
        "token_ids": "token_ids",
        "seq_lens": "seq_lens",
        "block_table": "block_table",
        "slot_mapping": "slot_mapping",
    }
)
""":class:`~blockprep.adapters.qwen.QwenDecodeInputs` field -> kernel argument name."""

QWEN3_SAMPLED_IDS_WIDTH = 8
"""Token columns with today's kernel (upstream reads ``SAMPLED_IDS_PAD`` from the kernel module)."""

QWEN3_SAMPLED_IDS_FALLBACK = 1
"""Upstream's token width when the kernel module has no ``SAMPLED_IDS_PAD``."""


def qwen3_prepared_arguments(
    max_batch_size: int,
    max_seq_len: int,
    page_size: int,
    token_width: int = QWEN3_SAMPLED_IDS_WIDTH,
) -> dict[str, ArgSpec]:
    """The prepared arguments of ``qwen3_decode_host``, in kernel order, for a deployment.

    ``B = max_batch_size`` (upstream's ``kernel_batch``), ``max_blocks = ceil(max_seq_len /
    page_size)``; all int32 (``_decode_slot_specs``):

    - ``seq_lens`` (position 6) ``[B]``;
    - ``block_table`` (7) flat ``[B * max_blocks]``;
    - ``slot_mapping`` (8) ``[B]``;
    - ``token_ids`` (22) ``[B, token_width]``.

    Raises:
        ValueError: an argument below 1. TypeError: a non-integer argument.
    """
    batch = as_int(max_batch_size, "max_batch_size")
    seq = as_int(max_seq_len, "max_seq_len")
    page = as_int(page_size, "page_size")
    width = as_int(token_width, "token_width")
    for name, value in (
        ("max_batch_size", batch),
        ("max_seq_len", seq),
        ("page_size", page),
        ("token_width", width),
    ):
        if value < 1:
            raise BlockprepValueError(f"{name} must be positive, got {value}")
    max_blocks = (seq + page - 1) // page
    shapes = {
        "seq_lens": (batch,),
        "block_table": (batch * max_blocks,),
        "slot_mapping": (batch,),
        "token_ids": (batch, width),
    }
    return {
        name: ArgSpec(name, QWEN3_DECODE_ARGUMENTS.index(name), shapes[name], torch.int32)
        for name in QWEN3_PREPARED_ARGUMENTS
    }


def qwen3_argument_values(inputs: QwenDecodeInputs) -> dict[str, torch.Tensor]:
    """A prepared step's buffers by kernel argument name (the same tensor objects)."""
    return {argument: getattr(inputs, field) for field, argument in QWEN3_INPUT_ARGUMENTS.items()}


def qwen3_decode_args(*sources: Mapping[str, object]) -> tuple[object, ...]:
    """``qwen3_decode_host``'s positional argument tuple from values by name.

    Typically ``qwen3_decode_args(qwen3_argument_values(inputs), engine_values)``: blockprep's
    four prepared buffers and the engine's 21 other arguments; together exactly the 25 names of
    :data:`QWEN3_DECODE_ARGUMENTS`, each once.

    Raises:
        KernelArgumentError: naming every missing, unknown and doubly given argument.
    """
    return build_arguments(QWEN3_DECODE_KERNEL, QWEN3_DECODE_ARGUMENTS, *sources)
