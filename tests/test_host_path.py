"""``python -m bench.host_path``: it checks every option against upstream's rebuild
before it times, and reports each stage."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

msgspec = pytest.importorskip("msgspec")
if not (Path(__file__).parents[1] / "bench" / "host_path.py").exists():
    pytest.skip("bench/ (a repository checkout's harnesses) is not here", allow_module_level=True)

from bench import host_path  # noqa: E402
from bench.host_stages import (  # noqa: E402
    DecodeRequest,
    FullLists,
    Pipe,
    SchedulerStep,
    StepCommand,
)
from blockprep.bench.runner import MismatchError  # noqa: E402


def test_cli_verifies_then_reports_every_stage(capsys: Any) -> None:
    argv = ["--workload", "qwen3-14b-host-path-b16", "--steps", "3", "--runs", "2"]
    assert host_path.main([*argv, "--verify-steps", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("blockprep host path: 3 timed steps, 2 runs")
    options = list(host_path.workloads()["qwen3-14b-host-path-b16"].options)
    assert lines[1] == (
        f"verified qwen3-14b-host-path-b16: {len(options)} options equal upstream cell for "
        f"cell after each of {4 + host_path.WARM} steps"
    )
    head = lines.index(next(line for line in lines if line.startswith("workload ")))
    assert lines[head].split() == [
        "workload",
        "option",
        "engine",
        "us",
        "transfer",
        "us",
        "worker",
        "us",
        "whole",
        "us",
        "p10-p90",
        "vs",
        "upstream",
        "message",
        "B",
        "blocks",
        "B",
    ]
    rows = [line.split() for line in lines[head + 1 : head + 1 + len(options)]]
    assert [row[1] for row in rows] == options
    for row in rows:
        engine, transfer, worker, whole = (float(x.replace(",", "")) for x in row[2:6])
        assert whole > 0 and min(engine, transfer, worker) >= 0
        assert row[7].endswith("x") and row[8].startswith("(")  # two runs: a min-max spread
    assert rows[0][7] == "1.0x"
    assert rows[0][9] == rows[1][9] == rows[2][9]  # the same full-list message
    envelope = lines[head + 1 + len(options)].split()
    assert envelope[1] == "envelope" and envelope[3:5] == ["-", "-"] and envelope[-1] == "0"
    assert lines[head + 2 + len(options)] == ""
    split = lines[head + 3 + len(options) : head + 4 + 2 * len(options)]
    parts = ["decode", "us", "batch", "us", "prepare", "us", "free", "us"]
    assert split[0].split() == ["workload", "option", *parts]
    assert [line.split()[1] for line in split[1:]] == options


def test_verification_catches_an_option_that_writes_one_wrong_cell() -> None:
    workload = host_path.workloads()["qwen3-14b-host-path-b16"]
    make = workload.options["by-value"]

    def broken() -> Any:
        option = make()
        prepare = option.target.prepare

        def wrong(batch: Any, slot: int) -> None:
            prepare(batch, slot)
            option.target.buffers()["slot_mapping"][3] += 1  # every step: one cell off

        option.target.prepare = wrong  # type: ignore[method-assign]
        return option

    options = {"upstream": workload.options["upstream"], "broken": broken}
    bad = dataclasses.replace(workload, options=options)
    with pytest.raises(
        MismatchError, match=r"broken differs from upstream at step 0, slot_mapping"
    ):
        host_path.verify(bad, 2, 0)


def test_the_full_list_message_has_upstreams_shape() -> None:
    step = SchedulerStep(
        request_ids=["a", "b"],
        tokens=[5, 6],
        seq_lens=[130, 7],
        lists=[{"ori": [1, 2], "idx": [3]}, {"ori": [4], "idx": []}],
        partitions=[0, 3],
        finished=["z"],
        step_id=9,
    )
    command = FullLists().message(step)
    assert command.decode_requests[0].block_ids_by_group["ori"] is not step.lists[0]["ori"]
    plain = msgspec.msgpack.decode(msgspec.msgpack.encode(command))  # untyped: field names
    assert plain == {
        "type": "step",
        "new_requests": [],
        "prefill_requests": [],
        "decode_requests": [
            {
                "request_id": "a",
                "last_token": 5,
                "seq_len": 130,
                "block_ids": [],
                "block_ids_by_group": {"ori": [1, 2], "idx": [3]},
                "cache_partition": 0,
            },
            {
                "request_id": "b",
                "last_token": 6,
                "seq_len": 7,
                "block_ids": [],
                "block_ids_by_group": {"ori": [4], "idx": []},
                "cache_partition": 3,
            },
        ],
        "finished_request_ids": ["z"],
        "step_id": 9,
    }
    typed = msgspec.msgpack.Decoder(StepCommand).decode(msgspec.msgpack.encode(command))
    assert typed.decode_requests[1] == DecodeRequest("b", 6, 7, [], {"ori": [4], "idx": []}, 3)


def test_the_pipe_carries_more_than_its_capacity() -> None:
    pipe = Pipe()
    try:
        data = np.random.default_rng(0).bytes(3 * pipe.capacity + 17)
        assert pipe.transfer(data) == data
        assert pipe.transfer(b"x") == b"x"
    finally:
        pipe.close()


def test_qwen_events_replay_into_the_lists() -> None:
    """The Qwen trace's events, applied to plain lists, give every step's lists."""
    held: dict[str, list[int]] = {}
    for step in host_path.qwen_steps(16)(30, 0):
        for name, args in step.events:
            if name == "start":
                held[args[0]] = list(args[1])
            elif name == "append":
                held[args[0]] += args[1]
            else:
                assert name == "finish"
                del held[args[0]]
        assert held == dict(zip(step.request_ids, step.lists, strict=True))


def test_deepseek_events_replay_into_the_lists() -> None:
    """The events the simulation told its recorder, applied to plain lists, give every step's
    lists (the first step's: every request started)."""
    held: dict[str, dict[str, list[int]]] = {}
    for step in host_path.deepseek_steps(6, 0):
        for name, args in step.events:
            if name == "start":
                held[args[0]] = {g: list(ids) for g, ids in args[1].items()}
            elif name == "append":
                request, block, group = args
                held[request][group].append(block)
            elif name == "set":
                request, slot, block, group = args
                held[request][group][slot] = block
            else:
                assert name == "finish"
                del held[args[0]]
        assert {r: held[r] for r in step.request_ids} == dict(
            zip(step.request_ids, step.lists, strict=True)
        )


def test_sequential_times_each_option_alone(capsys: Any) -> None:
    argv = ["--workload", "qwen3-14b-host-path", "--steps", "2", "--runs", "1", "--sequential"]
    assert host_path.main([*argv, "--verify-steps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "each option alone over its own trace, one after the other (--sequential)" in lines[0]
    assert [line.split()[0] for line in lines[1:3]] == ["verified", "verified"]
    head = next(i for i, line in enumerate(lines) if line.startswith("workload "))
    rows = [line.split() for line in lines[head + 1 : lines.index("", head)]]
    options = [*host_path.workloads()["qwen3-14b-host-path-b16"].options, "envelope"]
    assert [row[1] for row in rows] == options * 2
    assert [row[0] for row in rows] == ["qwen3-14b-host-path-b16"] * 7 + [
        "qwen3-14b-host-path-b256"
    ] * 7


def test_without_msgspec_it_names_the_extra() -> None:
    code = (
        "import sys, runpy; sys.modules['msgspec'] = None; "
        "runpy.run_module('bench.host_path', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert done.returncode == 1
    assert "needs msgspec: pip install 'blockprep[bench]'" in done.stderr
