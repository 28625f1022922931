"""Instructions per step inside one function of a workload's blockprep construction, for
callgrind: where a step's instructions go.

Usage (from a directory that holds no ``blockprep``, as for ``bench/callgrind_step.py``)::

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
        --toggle-collect=_operator_call --callgrind-out-file=out python \\
        bench/callgrind_part.py WORKLOAD KIND 80 MODULE:QUALNAME

and take the total (the ``summary:`` line of ``out``) / the count the script prints on stderr.
``MODULE:QUALNAME`` names the function as its callers look it up (``blockprep.grouped:
GroupedTables.commit``; a function imported by name into another module: that module's name,
``blockprep.adapters.deepseek._preparer:assign``); it runs inside ``operator.call``, the only
place events are collected, on the trace's steps of ``KIND`` (``all``, or a kind of
``bench/callgrind_churn.py``) from the fifth on, and as itself elsewhere.
"""

import importlib
import operator
import sys
from typing import Any

from callgrind_churn import KINDS, prepared  # beside this script


def main() -> None:
    name, kind, steps, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if kind not in ("all", *KINDS):
        raise SystemExit(f"KIND must be all or one of {', '.join(KINDS)}, got {kind!r}")
    module, _, qualname = target.partition(":")
    *path, attribute = qualname.split(".")
    owner: Any = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, attribute)

    def counted(*args: Any, **kwargs: Any) -> Any:
        return operator.call(function, *args, **kwargs)

    stepper, steps_chosen = prepared(name, steps, kind)
    total = 0
    for item, chosen in steps_chosen:
        setattr(owner, attribute, counted if chosen else function)
        stepper.step(item)
        total += chosen
    setattr(owner, attribute, function)
    print(kind, total, file=sys.stderr)


if __name__ == "__main__":
    main()
