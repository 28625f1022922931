"""Instructions per step of a bench workload's blockprep construction, for callgrind.

Usage (from a directory that holds no ``blockprep``, so the package under test is the one on
``PYTHONPATH`` or installed)::

    valgrind --tool=callgrind --callgrind-out-file=out.10 python bench/callgrind_step.py WORKLOAD 10
    valgrind --tool=callgrind --callgrind-out-file=out.30 python bench/callgrind_step.py WORKLOAD 30

and take (total at 30 - total at 10) / 20 (``callgrind_annotate`` or the ``summary:`` line of
each file): the trace (45 steps) is made and every item received (unpickled) in both runs, and
5 warm-up steps run first, so the difference is the 20 steps alone.
"""

import gc
import sys

import torch

from blockprep.bench import workloads


def main() -> None:
    name, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    workload = workloads.standard_workloads()[name]
    items = list(workload.trace(45, 0))
    stepper = workload.constructions["blockprep"]()
    receive = getattr(stepper, "receive", lambda item: item)  # older benches have none
    received = [receive(item) for item in items]
    for item in received[:5]:
        stepper.step(item)
    gc.disable()
    for item in received[5 : 5 + steps]:
        stepper.step(item)


if __name__ == "__main__":
    main()
