"""pytest-benchmark suite: ``pytest bench/ --benchmark-only`` (see docs/benchmarks.md).

A package so that its test modules do not clash with same-named ones under tests/.
"""
