"""The ``blockprep`` logger: a NullHandler only; one WARNING per rejected batch at every public
preparer entry point, one per resync (instead of the rejection); DEBUG for the runtime
executor's slot claims. And the one ``RuntimeWarning`` at import when a compiled module is
missing (not when the twin is forced)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from blockprep._engine import TWIN_COST
from blockprep.adapters.deepseek import GROUP_NAMES, DeepSeekV4DecodePreparer, DeepSeekV4Layout
from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.batch import DecodeBatch
from blockprep.wire import BlockDeltaEncoder, DeltaSequenceError


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "blockprep"]


def test_the_library_logger_has_a_null_handler_only() -> None:
    logger = logging.getLogger("blockprep")
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]
    assert logger.level == logging.NOTSET  # the engine's configuration decides


def qwen_batch(seq_lens: list[int], pages: list[list[int]]) -> DecodeBatch:
    return DecodeBatch(
        request_ids=[f"r{i}" for i in range(len(pages))],
        token_ids=torch.tensor([1] * len(pages)),
        hidden_states=None,
        seq_lens=torch.tensor(seq_lens),
        block_ids=pages,
    )


def test_a_rejected_qwen_batch_is_one_warning_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="blockprep")
    preparer = QwenDecodePreparer(2, 256, 128)
    preparer.prepare(qwen_batch([3], [[4]]))
    assert records(caplog) == []
    with pytest.raises(ValueError, match="too small for decode position 200") as error:
        preparer.prepare(qwen_batch([201], [[4]]))
    assert records(caplog) == [
        (
            logging.WARNING,
            f"QwenDecodePreparer.prepare rejected a batch: {type(error.value).__name__}: "
            f"{error.value}",
        )
    ]


def test_a_resync_is_one_warning_and_no_rejection(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="blockprep")
    preparer = QwenDecodePreparer(2, 256, 128)
    encoder = BlockDeltaEncoder()
    first = encoder.encode(["r0"], [[4]])
    batch = qwen_batch([3], [[4]])
    batch.block_ids, batch.block_deltas = [], first
    preparer.prepare(batch)
    encoder.encode(["r0"], [[4, 5]])  # lost on the way
    batch.block_deltas = encoder.encode(["r0"], [[4, 5, 6]])
    batch.seq_lens = torch.tensor([300])
    with pytest.raises(DeltaSequenceError) as error:
        preparer.prepare(batch)
    assert records(caplog) == [(logging.WARNING, f"block delta resync needed: {error.value}")]


def deepseek(**options: Any) -> tuple[DeepSeekV4DecodePreparer, DecodeBatch]:
    layout = DeepSeekV4Layout(ranks=2, decode_batch=2, max_seq_len=512, **options)
    batch = DecodeBatch(
        request_ids=["a", "b"],
        token_ids=torch.tensor([5, 6]),
        hidden_states=None,
        seq_lens=torch.tensor([3, 4]),
        block_ids_by_group=[{g: [q] for g in GROUP_NAMES} for q in range(2)],
        cache_partitions=[0, 1],
    )
    return DeepSeekV4DecodePreparer(layout), batch


@pytest.mark.parametrize("call", ["prepare", "early", "prepare_mtp", "bad_slot", "restage"])
def test_every_deepseek_entry_point_logs_its_rejection_once(
    call: str, caplog: pytest.LogCaptureFixture
) -> None:
    preparer, batch = deepseek()
    preparer.prepare(batch, buffer_slot=1, early=True)
    caplog.set_level(logging.DEBUG, logger="blockprep")
    where = {"early": "prepare", "bad_slot": "prepare"}.get(call, call)
    with pytest.raises(ValueError) as error:
        if call == "prepare":
            batch.seq_lens = torch.tensor([0, 4])
            preparer.prepare(batch)
        elif call == "early":
            batch.cache_partitions = [0, 0]
            preparer.prepare(batch, early=True)
        elif call == "prepare_mtp":
            preparer.prepare_mtp(batch)  # no prev_token_ids
        elif call == "bad_slot":
            preparer.prepare(batch, buffer_slot=5)
        else:
            batch.request_ids = ["b", "a"]
            preparer.restage(batch, buffer_slot=1)
    assert records(caplog) == [
        (
            logging.WARNING,
            f"DeepSeekV4DecodePreparer.{where} rejected a batch: {type(error.value).__name__}: "
            f"{error.value}",
        )
    ]


def test_speculative_batch_and_target_rejections_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    preparer, batch = deepseek()
    caplog.set_level(logging.WARNING, logger="blockprep")
    with pytest.raises(ValueError, match="draft_token_ids must have 2 entries, got 3"):
        preparer.speculative_batch(batch, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="MTP target token rows must have shape"):
        preparer.prepare_mtp_target(batch, token_rows=[[1]], positions=[[0]], active_width=1)
    assert [message.split(" rejected")[0] for _, message in records(caplog)] == [
        "DeepSeekV4DecodePreparer.speculative_batch",
        "DeepSeekV4DecodePreparer.prepare_mtp_target",
    ]


def test_a_busy_slot_is_not_a_rejected_batch(caplog: pytest.LogCaptureFixture) -> None:
    """Only refused input is logged as a rejection (a RuntimeError is a life-cycle error)."""
    preparer, batch = deepseek(num_blocks="unbound")
    caplog.set_level(logging.DEBUG, logger="blockprep")
    with pytest.raises(RuntimeError, match="not bound"):
        preparer.prepare(batch)
    assert records(caplog) == []


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "BLOCKPREP_PURE_PYTHON"}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=True,
    )


FALLBACK = """
    import sys
    if {block}:
        class NoKernel:  # the compiled kernel missing, as on a machine without a compiler
            def find_spec(self, name, path=None, target=None):
                if name == {blocked!r}:
                    raise ImportError("no compiled kernel here")
                return None
        sys.meta_path.insert(0, NoKernel())
    import blockprep
    from blockprep import _backend
    print("backend", blockprep.kernel_backend(), _backend.diff_lists and "compiled")
"""


@pytest.mark.parametrize("blocked", ["blockprep._engine._kernel", "blockprep._differ"])
def test_the_fallback_warns_once_at_import_unless_forced(blocked: str) -> None:
    """Either compiled module missing: the twin runs everywhere (one backend), and importing
    blockprep says so once, as a ``RuntimeWarning`` shown with no logging set up: why, what it
    costs, how to build the kernel or silence the warning. Asked for, the twin is silent."""
    missing = run_python(FALLBACK.format(block=True, blocked=blocked))
    assert missing.stdout.strip() == "backend python None"
    warned = [line for line in missing.stderr.splitlines() if "RuntimeWarning: blockprep:" in line]
    assert len(warned) == 1, missing.stderr
    text = warned[0]
    assert "the compiled table kernel was not built or did not import (" in text
    assert f"{TWIN_COST} slower per DeepSeek V4 step" in text
    assert "pip install --force-reinstall --no-binary blockprep blockprep" in text
    assert "BLOCKPREP_PURE_PYTHON=1" in text
    plain = run_python(FALLBACK.format(block=False, blocked=blocked))
    if plain.stdout.strip() == "backend c compiled":  # where the kernel was built: nothing to say
        assert plain.stderr == ""
        assert "no compiled kernel here" in text or "_differ was not built" in text
    forced = run_python(FALLBACK.format(block=True, blocked=blocked), BLOCKPREP_PURE_PYTHON="1")
    assert forced.stdout.strip() == "backend python None"
    assert forced.stderr == ""


def test_the_executors_slot_claims_and_releases_are_debug_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from test_runtime_executors import deepseek_setup

    executor, _, _, scheduler = deepseek_setup()
    caplog.set_level(logging.DEBUG, logger="blockprep")
    pending = executor.submit(scheduler.step())
    executor.reclaim(pending)
    slot = pending.buffer_slot
    assert records(caplog) == [
        (logging.DEBUG, f"DeepSeekV4RuntimeExecutor claimed buffer slot {slot}"),
        (logging.DEBUG, f"DeepSeekV4RuntimeExecutor released buffer slot {slot}"),
    ]


def test_a_refused_bind_is_no_rejected_batch(caplog: pytest.LogCaptureFixture) -> None:
    preparer, _ = deepseek(num_blocks="unbound")
    caplog.set_level(logging.DEBUG, logger="blockprep")
    with pytest.raises(ValueError, match="num_blocks is missing cache groups"):
        preparer.bind_num_blocks({"ori": 4})
    assert records(caplog) == []
