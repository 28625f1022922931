"""The pure-Python twin's cost per DeepSeek V4 step against the compiled kernel: the median time
of a step of the bench's ``blockprep`` construction on the DeepSeek V4 wire workloads (by value,
by delta, cold), in this process's backend, on one torch thread with the garbage collector off
while a step runs. Run it in turns, from the repository root::

    for i in 1 2 3 4 5; do
        python -m bench.twin_cost; BLOCKPREP_PURE_PYTHON=1 python -m bench.twin_cost
    done

and divide the medians of the runs' medians: the figure the fallback warning names
(``blockprep._engine.TWIN_COST``).
"""

import gc
import statistics
import time

import torch

from blockprep import kernel_backend
from blockprep.bench.workloads import standard_workloads

WORKLOADS = ("deepseek-v4-wire", "deepseek-v4-wire-delta", "deepseek-v4-wire-cold")
STEPS = 120


def median_step_us(name: str) -> float:
    """The median microseconds of a step of ``name``'s blockprep construction."""
    workload = standard_workloads()[name]
    make = workload.constructions["blockprep"]
    trace = list(workload.trace(STEPS, 0))
    stepper = make()
    if not workload.cold:
        stepper.step(stepper.receive(trace[0]))
    times = []
    for item in trace[1:]:
        if workload.cold:
            stepper = make()
        received = stepper.receive(item)
        gc.disable()
        start = time.perf_counter_ns()
        stepper.step(received)
        times.append(time.perf_counter_ns() - start)
        gc.enable()
    return statistics.median(times) / 1000


def main() -> None:
    torch.set_num_threads(1)
    medians = {name: round(median_step_us(name), 1) for name in WORKLOADS}
    print(kernel_backend(), medians)


if __name__ == "__main__":
    main()
