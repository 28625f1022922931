"""The recorded kernel ABIs (blockprep.adapters.qwen_abi, blockprep.adapters.deepseek.abi): names,
positions, the prepared arguments against what the preparers allocate, the argument tuple."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from blockprep.adapters.deepseek import (
    GROUP_NAMES,
    INPUT_FIELDS,
    DeepSeekV4DecodePreparer,
    DeepSeekV4Layout,
)
from blockprep.adapters.deepseek import abi as ds
from blockprep.adapters.kernel_abi import ArgSpec, KernelArgumentError, build_arguments
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.qwen_abi import (
    QWEN3_DECODE_ARGUMENTS,
    QWEN3_DECODE_KERNEL,
    QWEN3_HOST_SHARED_OUTPUTS,
    QWEN3_INPUT_ARGUMENTS,
    QWEN3_PREPARED_ARGUMENTS,
    QWEN3_SAMPLED_IDS_WIDTH,
    qwen3_argument_values,
    qwen3_decode_args,
    qwen3_prepared_arguments,
)
from blockprep.batch import DecodeBatch

# --- names and positions ------------------------------------------------------------------------


def test_qwen_names_are_unique_and_complete() -> None:
    assert QWEN3_DECODE_KERNEL == "qwen3_decode_host"
    assert len(QWEN3_DECODE_ARGUMENTS) == 25
    assert len(set(QWEN3_DECODE_ARGUMENTS)) == 25
    assert set(QWEN3_PREPARED_ARGUMENTS) <= set(QWEN3_DECODE_ARGUMENTS)
    assert set(QWEN3_HOST_SHARED_OUTPUTS) <= set(QWEN3_DECODE_ARGUMENTS)
    assert not set(QWEN3_HOST_SHARED_OUTPUTS) & set(QWEN3_PREPARED_ARGUMENTS)
    assert set(QWEN3_INPUT_ARGUMENTS.values()) == set(QWEN3_PREPARED_ARGUMENTS)
    # Prepared names are listed in kernel order; the positions recorded upstream.
    positions = [QWEN3_DECODE_ARGUMENTS.index(name) for name in QWEN3_PREPARED_ARGUMENTS]
    assert positions == sorted(positions) == [6, 7, 8, 22]


def test_deepseek_names_are_unique_and_complete() -> None:
    names = ds.DEEPSEEK_V4_DECODE_ARGUMENTS
    assert ds.DEEPSEEK_V4_DECODE_KERNEL == "l3_decode_fwd"
    assert len(names) == 82
    assert len(set(names)) == 82
    # Every group, in GROUP_NAMES order, maps to its own table argument.
    assert tuple(ds.GROUP_ARGUMENTS) == GROUP_NAMES
    assert len(set(ds.GROUP_ARGUMENTS.values())) == len(GROUP_NAMES)
    assert set(ds.GROUP_ARGUMENTS.values()) == set(ds.DEEPSEEK_V4_TABLE_WIDTHS)
    assert set(ds.INPUT_ARGUMENTS) == set(INPUT_FIELDS)
    assert ds.BLOCK_COUNTS_COLUMNS == GROUP_NAMES
    prepared = set(ds.GROUP_ARGUMENTS.values()) | set(ds.INPUT_ARGUMENTS.values())
    assert set(ds.PREPARED_ARGUMENTS) == prepared
    assert len(ds.PREPARED_ARGUMENTS) == 13
    assert prepared <= set(names)
    assert set(ds.HOST_SHARED_OUTPUTS) <= set(names) - prepared
    positions = {name: names.index(name) for name in ds.PREPARED_ARGUMENTS}
    assert list(positions.values()) == sorted(positions.values())
    assert positions == {
        "block_table": 60,
        "position_ids": 61,
        "kv_seq_lens": 62,
        "hca_compress_state_block_table": 63,
        "csa_compress_state_block_table": 64,
        "csa_inner_compress_state_block_table": 65,
        "hca_cmp_block_table": 66,
        "csa_cmp_block_table": 67,
        "idx_block_table": 68,
        "block_counts": 69,
        "input_ids": 70,
        "num_tokens_per_owner": 80,
        "logit_row_indices": 81,
    }
    assert {g: ds.GROUP_ARGUMENTS[g] for g in ("ori", "cmp_c128", "cmp_c4", "idx")} == {
        "ori": "block_table",
        "cmp_c128": "hca_cmp_block_table",
        "cmp_c4": "csa_cmp_block_table",
        "idx": "idx_block_table",
    }


def test_specs_positions_match_the_name_tuples() -> None:
    for name, spec in qwen3_prepared_arguments(4, 256, 64).items():
        assert spec.name == name
        assert QWEN3_DECODE_ARGUMENTS[spec.position] == name
    specs = ds.deepseek_v4_prepared_arguments(DeepSeekV4Layout())
    assert tuple(specs) == ds.PREPARED_ARGUMENTS
    for name, spec in specs.items():
        assert spec.name == name
        assert ds.DEEPSEEK_V4_DECODE_ARGUMENTS[spec.position] == name


# --- the prepared arguments against the preparers -----------------------------------------------


@pytest.mark.parametrize(
    ("batch", "max_seq_len", "page_size", "width"),
    [
        (1, 128, 128, 8),
        (2, 256, 64, 8),
        (5, 1000, 128, 1),
        (16, 4096, 128, QWEN3_SAMPLED_IDS_WIDTH),
    ],
)
def test_qwen_specs_equal_the_preparer_buffers(
    batch: int, max_seq_len: int, page_size: int, width: int
) -> None:
    specs = qwen3_prepared_arguments(batch, max_seq_len, page_size, width)
    assert tuple(specs) == QWEN3_PREPARED_ARGUMENTS
    preparer = QwenDecodePreparer(batch, max_seq_len, page_size, width)
    step = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([5]),
        seq_lens=torch.tensor([3]),
        hidden_states=None,
        block_ids=[[2]],
    )
    inputs = preparer.prepare(step)
    values = qwen3_argument_values(inputs)
    assert list(values) == list(QWEN3_INPUT_ARGUMENTS.values())
    assert set(values) == set(specs)
    for name, value in values.items():
        assert value is getattr(inputs, name)
        specs[name].check(value)
        assert (tuple(value.shape), value.dtype) == (specs[name].shape, specs[name].dtype)
    max_blocks = -(-max_seq_len // page_size)
    assert specs["block_table"].shape == (batch * max_blocks,)
    assert specs["token_ids"].shape == (batch, width)


def _groups() -> dict[str, list[int]]:
    return {name: [1] for name in GROUP_NAMES}


@pytest.mark.parametrize(
    "layout",
    [
        DeepSeekV4Layout(),
        DeepSeekV4Layout(ranks=2, decode_batch=2, max_seq_len=1024),
        DeepSeekV4Layout(ranks=3, decode_batch=8, decode_seq=2, max_seq_len=4096),
        DeepSeekV4Layout(ranks=2, decode_batch=4, decode_seq=4, max_seq_len=2048),
        DeepSeekV4Layout(ranks=1, decode_batch=2, decode_seq=8, max_seq_len=16384),
    ],
    ids=repr,
)
def test_deepseek_specs_equal_the_preparer_buffers(layout: DeepSeekV4Layout) -> None:
    specs = ds.deepseek_v4_prepared_arguments(layout)
    widths = {ds.GROUP_ARGUMENTS[g.name]: g.width for g in layout.groups}
    assert widths == dict(ds.DEEPSEEK_V4_TABLE_WIDTHS)  # blockprep's layout = upstream's widths
    R, b, T = layout.ranks, layout.decode_batch, layout.decode_tokens
    assert specs["input_ids"].shape == (R, T) and specs["input_ids"].dtype == torch.int64
    assert specs["block_counts"].shape == (R, b, 7)
    preparer = DeepSeekV4DecodePreparer(layout, buffer_slots=2)
    step = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([7]),
        seq_lens=torch.tensor([9]),
        hidden_states=None,
        block_ids_by_group=[_groups()],
        cache_partitions=[0],
    )
    for slot in (0, 1):
        inputs = preparer.prepare(step, buffer_slot=slot)
        values = ds.deepseek_v4_argument_values(inputs)
        assert tuple(values) == ds.PREPARED_ARGUMENTS
        for group, table in inputs.tables.items():
            assert values[ds.GROUP_ARGUMENTS[group]] is table
        for field in INPUT_FIELDS:
            assert values[ds.INPUT_ARGUMENTS[field]] is getattr(inputs, field)
        for name, value in values.items():
            specs[name].check(value)
            assert (tuple(value.shape), value.dtype) == (specs[name].shape, specs[name].dtype)


def test_deepseek_values_refuse_host_embeddings() -> None:
    layout = DeepSeekV4Layout(ranks=1, decode_batch=2, max_seq_len=1024)
    preparer = DeepSeekV4DecodePreparer(layout, embedding="host", hidden_size=4)
    step = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([7]),
        seq_lens=torch.tensor([9]),
        hidden_states=torch.zeros(1, 4),
        block_ids_by_group=[_groups()],
        cache_partitions=[0],
    )
    inputs = preparer.prepare(step)
    with pytest.raises(ValueError, match="no x_hc argument"):
        ds.deepseek_v4_argument_values(inputs)


def test_deepseek_specs_need_a_layout() -> None:
    with pytest.raises(TypeError, match="DeepSeekV4Layout"):
        ds.deepseek_v4_prepared_arguments(object())  # type: ignore[arg-type]


def test_qwen_specs_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="page_size must be positive, got 0"):
        qwen3_prepared_arguments(2, 128, 0)
    with pytest.raises(TypeError):
        qwen3_prepared_arguments(2, 128.5, 64)  # type: ignore[arg-type]


def test_argspec_check() -> None:
    spec = ArgSpec("seq_lens", 6, (4,), torch.int32)
    spec.check(torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"seq_lens must be a torch\.Tensor, got list"):
        spec.check([0, 0, 0, 0])
    with pytest.raises(TypeError, match=r"seq_lens must be torch\.int32, got torch\.int64"):
        spec.check(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"seq_lens must have shape \[4\], got \[2, 2\]"):
        spec.check(torch.zeros(2, 2, dtype=torch.int32))


# --- the argument tuple -------------------------------------------------------------------------


def _engine(names: tuple[str, ...], prepared: tuple[str, ...]) -> dict[str, object]:
    return {name: f"engine:{name}" for name in names if name not in prepared}


def test_qwen_args_put_each_value_at_its_position() -> None:
    preparer = QwenDecodePreparer(2, 256, 64)
    step = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([5]),
        seq_lens=torch.tensor([3]),
        hidden_states=None,
        block_ids=[[2]],
    )
    prepared = qwen3_argument_values(preparer.prepare(step))
    engine = _engine(QWEN3_DECODE_ARGUMENTS, QWEN3_PREPARED_ARGUMENTS)
    assert len(engine) == 21
    args = qwen3_decode_args(prepared, engine)
    assert len(args) == 25
    for position, name in enumerate(QWEN3_DECODE_ARGUMENTS):
        expected = prepared[name] if name in prepared else engine[name]
        assert args[position] is expected
    specs = qwen3_prepared_arguments(2, 256, 64)
    for name, spec in specs.items():
        assert args[spec.position] is prepared[name]
    assert qwen3_decode_args({**prepared, **engine}) == args  # one mapping works too


def test_deepseek_args_put_each_value_at_its_position() -> None:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, max_seq_len=1024)
    preparer = DeepSeekV4DecodePreparer(layout)
    step = DecodeBatch(
        request_ids=["a"],
        token_ids=torch.tensor([7]),
        seq_lens=torch.tensor([9]),
        hidden_states=None,
        block_ids_by_group=[_groups()],
        cache_partitions=[1],
    )
    prepared = ds.deepseek_v4_argument_values(preparer.prepare(step, buffer_slot=1))
    engine = _engine(ds.DEEPSEEK_V4_DECODE_ARGUMENTS, ds.PREPARED_ARGUMENTS)
    assert len(engine) == 69
    args = ds.deepseek_v4_decode_args(prepared, engine)
    assert len(args) == 82
    for position, name in enumerate(ds.DEEPSEEK_V4_DECODE_ARGUMENTS):
        assert args[position] is (prepared[name] if name in prepared else engine[name])
    for name, spec in ds.deepseek_v4_prepared_arguments(layout).items():
        assert args[spec.position] is prepared[name]


def test_args_name_every_missing_unknown_and_duplicated_name() -> None:
    engine = _engine(QWEN3_DECODE_ARGUMENTS, QWEN3_PREPARED_ARGUMENTS)
    del engine["k_cache"], engine["logits"]
    prepared: dict[str, object] = {name: name for name in QWEN3_PREPARED_ARGUMENTS}
    prepared["hidden_states"] = None
    prepared["x_hc"] = None
    engine["seq_lens"] = "again"
    with pytest.raises(KernelArgumentError) as caught:
        qwen3_decode_args(prepared, engine)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.kernel == "qwen3_decode_host"
    assert error.missing == ("k_cache", "logits")  # kernel order
    assert error.unknown == ("hidden_states", "x_hc")
    assert error.duplicated == ("seq_lens",)
    assert str(error) == (
        "qwen3_decode_host arguments do not match its ABI: missing 2: k_cache, logits; "
        "unknown 2: hidden_states, x_hc; given more than once 1: seq_lens"
    )
    with pytest.raises(KernelArgumentError, match=r"^l3_decode_fwd .*missing 82: embed_weight, "):
        ds.deepseek_v4_decode_args({})
    with pytest.raises(KernelArgumentError) as only_missing:
        ds.deepseek_v4_decode_args(_engine(ds.DEEPSEEK_V4_DECODE_ARGUMENTS, ()), {"block_table": 0})
    assert only_missing.value.duplicated == ("block_table",)
    assert only_missing.value.missing == only_missing.value.unknown == ()


def test_build_arguments_is_model_neutral() -> None:
    assert build_arguments("k", ("a", "b", "c"), {"c": 3, "a": 1}, {"b": 2}) == (1, 2, 3)
    assert build_arguments("k", ()) == ()
    with pytest.raises(
        KernelArgumentError, match=r"^k arguments do not match its ABI: unknown 1: z$"
    ):
        build_arguments("k", ("a",), {"a": 1, "z": 0})


# --- importable without an NPU package ----------------------------------------------------------


def test_abi_modules_import_without_npu_packages() -> None:
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch_npu", "pypto", "simpler"):
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, Block())
        import blockprep.adapters.qwen_abi as q
        import blockprep.adapters.deepseek.abi as d
        d.deepseek_v4_prepared_arguments(d.DeepSeekV4Layout())
        q.qwen3_prepared_arguments(4, 4096, 128)
        loaded = [m for m in sys.modules if m.split(".")[0] in ("torch_npu", "pypto", "simpler")]
        assert not loaded, loaded
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
