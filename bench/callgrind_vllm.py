"""Instructions per step of a vLLM facade construction (:mod:`bench.vllm_compare`), for
callgrind.

Usage (as ``bench/callgrind_step.py``: from a directory that holds no ``blockprep``, ``python`` the
interpreter itself)::

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --toggle-collect=functools_reduce --callgrind-out-file=out python \\
        bench/callgrind_vllm.py CONSTRUCTION REQUESTSxBLOCK 100

and take the total / 100. ``CONSTRUCTION`` is ``vllm`` (vLLM's table ported), ``per-row``,
``batched`` or ``packed``. The trace (its first step adds every request, then 20 warm-up steps and
the timed ones) is made and every step unpickled with instrumentation off; the steps run inside
one ``functools.reduce`` call, the only place events are collected.
"""

import functools
import gc
import os
import pickle
import subprocess
import sys
from typing import Any

import torch

from bench import vllm_compare

WARM = 20


def main() -> None:
    construction, shape, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    num_reqs, block_size = (int(x) for x in shape.split("x"))
    trace = vllm_compare._trace(num_reqs, block_size, WARM + steps, 0)
    stepper = vllm_compare.MAKERS[construction](num_reqs, block_size)
    received = [stepper.receive(pickle.loads(wire)) for wire in trace]
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
    for item in received[: WARM + 1]:
        stepper.step(item)
    gc.disable()

    def step(count: int, item: Any) -> int:
        stepper.step(item)
        return count + 1

    functools.reduce(step, received[WARM + 1 :], 0)


if __name__ == "__main__":
    main()
