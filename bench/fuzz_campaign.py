"""A long differential campaign of the compiled table kernel and encoders against their twins.

Usage (from the repository root, after ``pip install -e ".[test]"``)::

    python -m bench.fuzz_campaign [--kernel-steps N] [--encoder-steps N] [--callback-steps N]

It drives the suite's own differential machines far past their per-run budget, on fresh random
seeds (no example database), and counts the steps it ran:

- the kernel pair (``tests/test_engine_differential.py::KernelPair``): one compiled and one twin
  ``GroupKernel`` given the same steps by value, by ops and by packed records, one-row and
  scheduler-step changes, clears, invalidations, resets and re-initialisations (a plan staged
  before committed after), ids of every type and value; after every step both must agree on the
  fault or the error (type and message), held ids, tables and counts, and every slot must equal a
  rebuild of its held ids;
- the encoders (``tests/test_differ_differential.py::DifferMachine``): the compiled and the
  Python ``BlockDeltaEncoder`` step on the same batches, odd ids and requests included;
- callbacks (``_callback_step``, ``_callback_ops_step``): ids whose ``__eq__``, and converts that,
  change the step's lists or raise, by value and by ops: both kernels must run the same callbacks
  and end alike;
- the faces (``faces_trace``): two ``GroupedTables``, one on each kernel, on DeepSeek-shaped
  traces with faults injected: the same buffers, counters and errors after every step.

A divergence stops the campaign with the machine's shrunk counterexample and exit status 1. Under
AddressSanitizer, build the kernel with ``CFLAGS="-fsanitize=address"`` and run this with
``LD_PRELOAD`` set as ``.ci/run`` does.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from tests import test_differ_differential as differ
from tests import test_engine_differential as engine


def run_machine(machine: type, steps: int, step_count: int, name: str) -> int:
    """Runs of ``machine`` (up to ``step_count`` steps each, fresh seeds) until ``steps`` of its
    states were checked (after its first step and after every later one); the states checked."""
    count = [0]

    class Counted(machine):  # type: ignore[misc, valid-type]
        @invariant()
        def counted(self) -> None:
            count[0] += 1

    start = time.monotonic()
    while count[0] < steps:
        run_state_machine_as_test(
            Counted,
            settings=settings(
                max_examples=200,
                stateful_step_count=step_count,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
        print(f"{name}: {count[0]:,} steps, {time.monotonic() - start:.0f} s", flush=True)
    return count[0]


def run_callbacks(steps: int) -> int:
    """Seeded callback steps by value and by ops on both kernels; the steps."""
    base = random.randrange(2**32)
    for i in range(steps // 2):
        seed = base + i
        for make in (engine._callback_step, engine._callback_ops_step):
            compiled = make(engine.compiled.GroupKernel, seed)
            twin = make(engine.twin.GroupKernel, seed)
            if compiled != twin:
                print(f"callbacks: seed {seed} of {make.__name__} diverges:")
                print(f"  compiled {compiled}\n  twin     {twin}")
                raise SystemExit(1)
    print(f"callbacks: {steps // 2 * 2:,} steps (seeds {base}..{base + steps // 2 - 1})")
    return steps // 2 * 2


def run_faces(steps: int) -> int:
    """Traces of two ``GroupedTables`` faces, one on each kernel (DeepSeek-shaped groups,
    requests coming, going and moving, faults injected, batches through a pickle round trip), on
    fresh seeds of 300 steps each, until ``steps`` steps ran; the steps."""
    done = 0
    while done < steps:
        seed = random.randrange(2**32)
        with pytest.MonkeyPatch.context() as monkeypatch:
            engine.faces_trace(monkeypatch, seed, 300)
        done += 300
    print(f"faces: {done:,} steps", flush=True)
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-steps", type=int, default=680_000)
    parser.add_argument("--encoder-steps", type=int, default=600_000)
    parser.add_argument("--callback-steps", type=int, default=200_000)
    parser.add_argument("--face-steps", type=int, default=30_000)
    args = parser.parse_args(argv)
    start = time.monotonic()
    kernel = run_machine(engine.KernelPair, args.kernel_steps, 30, "kernel pair")
    encoder = run_machine(differ.DifferMachine, args.encoder_steps, 40, "encoders")
    callbacks = run_callbacks(args.callback_steps)
    face_steps = run_faces(args.face_steps)
    print(
        f"0 divergences: {kernel:,} kernel steps, {encoder:,} encoder steps, "
        f"{callbacks:,} callback steps, {face_steps:,} face steps, "
        f"{time.monotonic() - start:.0f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
