"""A pytest plugin: docs/integration.md section 10 applied to upstream's runners before its
unit suite is collected, for the route named in ``BLOCKPREP_UPSTREAM_ROUTE`` (``pristine``:
nothing applied)."""

import os

from bench.upstream_suite import swap

ROUTE = os.environ.get("BLOCKPREP_UPSTREAM_ROUTE", "pristine")
if ROUTE != "pristine":
    swap.install(ROUTE)
