"""Upstream pypto-serving's unit suite, run here on blockprep as docs/integration.md section 10
swaps it in (repository-only: not installed). See :mod:`bench.upstream_suite.run`."""
