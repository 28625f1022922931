"""Fixtures shared by the test suites."""

from __future__ import annotations

import pytest

from blockprep._engine import twin


@pytest.fixture(params=["c", "py"])
def K(request: pytest.FixtureRequest) -> type:
    """Each table kernel class in turn: the compiled one (skipped where the extension was not
    built; imported directly, so it runs in the twin-forced pass too), then the twin."""
    if request.param == "c":
        kernel: type = pytest.importorskip("blockprep._engine._kernel").GroupKernel
        return kernel
    return twin.GroupKernel
