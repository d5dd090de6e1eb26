"""The one small interface to NVIDIA's NVML, shared by the probe and the launch sampler.

Like nvitop's api layer: nothing here raises for one missing metric; it reports None (shown as
N/A). `open_nvml()` returns the real binding (nvidia-ml-py's `pynvml`), an unavailable API with
the reason when there is no driver, or, when WIZARD_FAKE_NVML is set, the fake used by tests
(the only test double in the project): a catalogue spec such as "8xH100-80GB" or a JSON file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
    mem_used: int | None = None                       # bytes
    mem_total: int | None = None                      # bytes
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
    def p2p_matrix(self) -> list[list[str]] | None: ...  # "OK" / "NS" / ... per pair, None if unknown
    def nvlink_all(self) -> bool | None: ...          # every pair joined by NVLink
    def sample(self) -> list[GpuSample]: ...          # never raises
    def close(self) -> None: ...


def open_nvml() -> NvmlApi:
    raise NotImplementedError
