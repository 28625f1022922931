"""Every benchmark runs on one torch thread, as ``python -m blockprep bench`` times its
constructions (``blockprep.bench.runner.quiet_process``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """``torch.set_num_threads(1)`` for the test, restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
