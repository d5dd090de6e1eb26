"""The NVML interface the probe, the launch sampler and the fake share: the data a GPU reports, the protocol a
driver implements (wizard/probe/nvml.py: the real one; wizard/probe/fake_nvml.py: WIZARD_FAKE_NVML), the
answer when there is none, and the --assume / fake spec parsers. No driver code here, so the real driver and
the fake both import it and neither imports the other at module level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from wizard.errors import InputError

FAKE_ENV = "WIZARD_FAKE_NVML"


@dataclass
class GpuStatic:
    index: int
    name: str
    memory_total: int                                 # bytes
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None


@dataclass
class GpuProcess:
    pid: int
    used_memory: int | None                           # bytes


@dataclass
class GpuSample:
    index: int
    util: int | None = None                           # percent
    mem_used: int | None = None                       # bytes, as nvidia-smi's "used" (without the driver's reserve)
    mem_total: int | None = None                      # bytes
    # Bytes the driver reserves (NVML's v2 memory info), not in mem_used; None when only NVML's v1 answered, whose
    # "used" counts them (615 MiB on an idle H200 where nvidia-smi shows 0: shared/gpu/2026-12-04).
    mem_reserved: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: int | None = None
    sm_clock_mhz: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)


class NvmlApi(Protocol):
    available: bool                                   # False: no driver / no NVML
    reason: str | None                                # why unavailable, one line

    def driver_version(self) -> str | None: ...
    def cuda_version(self) -> str | None: ...         # e.g. "12.4"
    def devices(self) -> list[GpuStatic]: ...
    # "OK" / "NS" / ... per pair ("X" on the diagonal), None if unknown. `indices` (NVML indices)
    # restricts the matrix to those devices, in that order; None means all.
    def p2p_matrix(self, indices: list[int] | None = None) -> list[list[str]] | None: ...
    def nvlink_all(self, indices: list[int] | None = None) -> bool | None: ...  # every pair NVLinked
    def sample(self) -> list[GpuSample]: ...          # never raises
    def close(self) -> None: ...


SAMPLE_METRICS = ("util", "mem_used", "mem_total", "mem_reserved", "power_w", "power_limit_w", "temp_c",
                  "sm_clock_mhz", "processes")
STATIC_METRICS = ("uuid", "pci_bus_id", "compute_capability")


class UnavailableNvml:
    """No NVML: every query answers None / nothing, and `reason` says why in one line."""

    def __init__(self, reason: str):
        self.available = False
        self.reason = reason

    def driver_version(self) -> str | None:
        return None

    def cuda_version(self) -> str | None:
        return None

    def devices(self) -> list[GpuStatic]:
        return []

    def p2p_matrix(self, indices: list[int] | None = None) -> list[list[str]] | None:
        return None

    def nvlink_all(self, indices: list[int] | None = None) -> bool | None:
        return None

    def sample(self) -> list[GpuSample]:
        return []

    def close(self) -> None:
        pass


def parse_gpu_groups(text: str, field: str) -> list[tuple[int, Any, str | None]]:
    """'8xH100-80GB' or '4xA100-80GB+4xA100-40GB' -> [(count, GpuSpec, note)]. Counts 1..64 each."""
    from wizard.probe import catalogue

    groups = []
    for part in text.split("+"):
        m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\S.*?)\s*", part)
        if not m:
            raise InputError(field, f"{part.strip()!r} is not COUNTxGPU",
                             "COUNTxGPU[,key=value...] such as 8xH100-80GB or 4xA100-40GB,ram=512G")
        count = int(m.group(1))
        if not 1 <= count <= 64:
            raise InputError(field, f"GPU count {count} is out of range", "1 to 64 GPUs")
        spec, note = catalogue.resolve(m.group(2), field)
        groups.append((count, spec, note))
    total = sum(c for c, _, _ in groups)
    if total > 64:
        raise InputError(field, f"{total} GPUs in all is out of range", "1 to 64 GPUs")
    return groups


def parse_yes_no(value: str, field: str, key: str) -> bool:
    v = value.strip().lower()
    if v in ("yes", "y", "true", "1", "on", ""):
        return True
    if v in ("no", "n", "false", "0", "off"):
        return False
    raise InputError(field, f"{key}={value!r} is not yes or no", f"{key}=yes or {key}=no")
