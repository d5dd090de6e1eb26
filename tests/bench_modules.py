"""bench/measure_activations.py as a module, for the tests that measure through it (the activations' and the fused
loss's): one loader, so both get the same module object and the same torch threads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MEASURE_ACTIVATIONS = Path(__file__).resolve().parents[1] / "bench" / "measure_activations.py"


def measure_activations():
    import torch

    if "measure_activations" not in sys.modules:
        spec = importlib.util.spec_from_file_location("measure_activations", MEASURE_ACTIVATIONS)
        module = importlib.util.module_from_spec(spec)
        sys.modules["measure_activations"] = module
        spec.loader.exec_module(module)
    torch.set_num_threads(2)
    return sys.modules["measure_activations"]
