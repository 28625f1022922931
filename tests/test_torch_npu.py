"""``"npu"`` devices: ``torch_npu`` is imported before torch parses the device string (torch
knows no ``"npu"`` until that package registers it), and its absence is a clear error naming the
package, not torch's ``Expected one of cpu, cuda, ...``. torch_npu is absent here (it is never a
dependency); a fake module stands in for it where it must be present."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from blockprep.adapters.qwen import QwenDecodePreparer
from blockprep.adapters.vllm import VllmBlockTable
from blockprep.buffers import DeviceMirror, torch_device

ABSENT = importlib.util.find_spec("torch_npu") is None


@pytest.mark.skipif(not ABSENT, reason="torch_npu is installed here")
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch_device("npu"),
        lambda: torch_device("npu:1"),
        lambda: DeviceMirror(torch.zeros(2), "npu"),
        lambda: DeviceMirror(torch.zeros(2), "npu:0"),
        lambda: QwenDecodePreparer(2, 256, 64, device="npu"),
        lambda: VllmBlockTable(16, 2, 4, 8, device="npu"),
    ],
)
def test_absent_torch_npu_is_named(make: object) -> None:
    with pytest.raises(ImportError, match="needs the torch_npu package") as caught:
        make()  # type: ignore[operator]
    assert "Expected one of" not in str(caught.value)
    assert caught.value.name == "torch_npu"


def test_other_devices_parse_as_before() -> None:
    cpu = torch.device("cpu")
    assert torch_device(cpu) is cpu
    assert torch_device("cpu") == cpu and torch_device("meta").type == "meta"
    with pytest.raises(RuntimeError, match="Expected one of"):
        torch_device("tpu")  # not ours to explain


def test_fake_module_that_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module named torch_npu that does not register ``"npu"``: imported, then named."""
    fake = types.ModuleType("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    with pytest.raises((RuntimeError, ValueError)) as caught:  # the mirror may wrap it
        DeviceMirror(torch.zeros(2), "npu")
    messages = f"{caught.value} {caught.value.__cause__}"
    assert "torch_npu was imported but torch still does not know" in messages
    with pytest.raises(RuntimeError, match="torch_npu was imported"):
        QwenDecodePreparer(2, 256, 64, device="npu")


def run_with_fake(tmp_path: Path, module: str, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter whose ``torch_npu`` is ``module`` (renaming torch's
    private backend is once per process: never in the test process)."""
    (tmp_path / "torch_npu.py").write_text(textwrap.dedent(module))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_fake_module_is_imported_before_the_device_is_parsed(tmp_path: Path) -> None:
    done = run_with_fake(
        tmp_path,
        """
        import torch
        torch.utils.rename_privateuse1_backend("npu")
        IMPORTED = True
        """,
        """
        import sys, torch
        try:
            torch.device("npu")
        except RuntimeError as error:
            assert "Expected one of" in str(error)
        else:
            raise AssertionError("npu parsed before torch_npu was imported")
        assert "torch_npu" not in sys.modules
        from blockprep.buffers import torch_device
        device = torch_device("npu:0")
        assert sys.modules["torch_npu"].IMPORTED and device.type == "npu" and device.index == 0
        print("ok")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_broken_torch_npu_is_named(tmp_path: Path) -> None:
    """torch_npu present but failing (no CANN libraries): an ImportError naming it, the
    package's own error chained."""
    done = run_with_fake(
        tmp_path,
        """
        raise OSError("libascendcl.so: cannot open shared object file")
        """,
        """
        from blockprep.adapters.qwen import QwenDecodePreparer
        try:
            QwenDecodePreparer(2, 256, 64, device="npu")
        except ImportError as error:
            assert "torch_npu" in str(error) and "libascendcl.so" in str(error), error
            assert isinstance(error.__cause__, OSError)
            print("ok")
        """,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
