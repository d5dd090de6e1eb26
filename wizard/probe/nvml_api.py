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


# NVML's clock event ("throttle") reasons, bit -> name (nvml.h nvmlClocksEventReason*; the same bits as the older
# nvmlClocksThrottleReason*). Idle, application clocks, sync boost and display clocks are not slowdowns.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def clock_event_names(mask: int) -> tuple[str, ...]:
    """The reasons set in NVML's bitmask, by name (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return tuple(names + ([hex(rest)] if rest else []))


@dataclass
class GpuHealth:
    """What NVML says of a GPU's health; None where it cannot say (an older GPU, a driver without the call)."""
    index: int
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None       # uncorrectable ECC errors since the driver loaded
    ecc_uncorrected_aggregate: int | None = None      # over the GPU's life
    ecc_corrected_volatile: int | None = None
    retired_pages: int | None = None                  # pages retired for ECC errors (before Ampere)
    retired_pending: bool | None = None               # a retirement that waits for the next GPU reset
    remapped_uncorrectable: int | None = None         # rows remapped for uncorrectable errors (Ampere on)
    remapped_correctable: int | None = None
    remap_pending: bool | None = None                 # a remap that waits for the next GPU reset
    remap_failed: bool | None = None                  # a row could not be remapped: the GPU needs service
    clock_events: tuple[str, ...] | None = None       # the active clock event (throttle) reasons, by name


class XidWatch(Protocol):
    """XID errors (NVML's critical error events) from the moment it was opened: poll() -> [(GPU index, XID)]."""

    def poll(self) -> list[tuple[int, int]]: ...
    def close(self) -> None: ...


class NoXids:
    def poll(self) -> list[tuple[int, int]]:
        return []

    def close(self) -> None:
        pass


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
    def health(self) -> list[GpuHealth]: ...          # never raises; a field NVML cannot read is None
    def xid_watch(self) -> XidWatch: ...              # never raises; NoXids where NVML cannot watch
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

    def health(self) -> list[GpuHealth]:
        return []

    def xid_watch(self) -> XidWatch:
        return NoXids()

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
