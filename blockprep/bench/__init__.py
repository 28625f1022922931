"""The ``blockprep bench`` command's machinery: standard workloads, a checking timer, reports."""
