"""Skip markers for tests that depend on what this machine has."""

from __future__ import annotations

import pytest


def no_nvidia_driver() -> bool:
    """NVML cannot start here (no driver): the real probe must say so, not fail."""
    from wizard.probe.nvml import RealNvml

    api = RealNvml()
    try:
        return not api.available
    finally:
        api.close()


needs_no_driver = pytest.mark.skipif(not no_nvidia_driver(), reason="an NVIDIA driver is present")
