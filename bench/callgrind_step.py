"""Instructions per step of a bench workload's blockprep construction, for callgrind.

Usage (from a directory that holds no ``blockprep``, so the package under test is the one on
``PYTHONPATH`` or installed; ``python`` the interpreter itself, not a shell shim)::

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --toggle-collect=functools_reduce --callgrind-out-file=out python \\
        bench/callgrind_step.py WORKLOAD 20

and take the total (``callgrind_annotate`` or the ``summary:`` line) / 20: the trace (45 steps)
is made and every item received (unpickled) with valgrind's instrumentation off (it runs at
near native speed), the script turns it on (``callgrind_control -i on``), 5 warm-up steps run,
then the 20 steps inside one ``functools.reduce`` call, the only place events are collected (a
cold workload's steps each on a fresh construction, made before instrumentation starts).
(``WORKLOAD save FILE`` writes the trace to ``FILE``, ``WORKLOAD N FILE`` reads it from there.)
"""

import functools
import gc
import os
import pickle
import subprocess
import sys
from typing import Any

import torch

from blockprep.bench import workloads

TRACE_STEPS = 45


def main() -> None:
    name, steps = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    workload = workloads.standard_workloads()[name]
    if steps == "save":
        with open(sys.argv[3], "wb") as out:
            pickle.dump(list(workload.trace(TRACE_STEPS, 0)), out)
        return
    if len(sys.argv) > 3:
        with open(sys.argv[3], "rb") as file:
            items = pickle.load(file)
    else:
        items = list(workload.trace(TRACE_STEPS, 0))
    stepper = workload.constructions["blockprep"]()
    receive = getattr(stepper, "receive", lambda item: item)  # older benches have none
    received = [receive(item) for item in items]
    # A cold workload's steps each run on a fresh construction, made here, outside collection.
    fresh = [workload.constructions["blockprep"]() for _ in received] if workload.cold else []
    # Instrumentation on (under callgrind; elsewhere the command fails, harmlessly).
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
    for k, item in enumerate(received[:5]):
        (fresh[k] if fresh else stepper).step(item)
    gc.disable()

    def step(k: int, item: Any) -> int:
        (fresh[k] if fresh else stepper).step(item)
        return k + 1

    functools.reduce(step, received[5 : 5 + int(steps)], 5)  # events collected in here only


if __name__ == "__main__":
    main()
