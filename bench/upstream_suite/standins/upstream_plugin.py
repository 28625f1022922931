"""A pytest plugin for upstream's unit suite run here: ``torch.npu`` as a namespace the suite
monkeypatches (``mem_get_info``), where no torch_npu is installed."""

import types

import torch

if not hasattr(torch, "npu"):
    torch.npu = types.SimpleNamespace(  # type: ignore[attr-defined]
        mem_get_info=lambda device=None: (0, 0),
    )
