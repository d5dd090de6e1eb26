"""What the machine has: GPUs (through NVML), CPU, RAM, disk, library versions, environment.

Three sources, one dataclass: `probe()` (this machine), `from_json()` (a saved probe,
`--hardware FILE`) and `assume(spec)` (`--assume 8xH100-80GB`, from the GPU catalogue).
Never imports torch: library versions come from package metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GPU:
    index: int
    name: str
    memory_total: int                     # bytes
    memory_free: int | None = None        # bytes; None when unknown (assumed hardware)
    compute_capability: tuple[int, int] | None = None
    bf16: bool = False                    # compute capability >= 8.0
    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass
class Hardware:
    gpus: list[GPU] = field(default_factory=list)
    gpu_reason: str | None = None         # why there are no GPUs ("NVML Shared Library Not Found ...")
    driver_version: str | None = None
    cuda_version: str | None = None       # CUDA version the driver supports, e.g. "12.4"
    nvlink: bool | None = None            # every GPU pair has NVLink (None: unknown / < 2 GPUs)
    p2p: list[list[str]] | None = None    # P2P matrix as NVML reports it ("OK", "NS", ...)
    cpu_cores: int = 1
    ram_total: int = 0                    # bytes
    ram_available: int = 0                # bytes
    output_dir: str | None = None
    disk_free_output: int | None = None   # bytes free at output_dir
    nvme_path: str | None = None          # candidate NVMe offload path
    disk_free_nvme: int | None = None     # bytes free at nvme_path
    libraries: dict[str, str | None] = field(default_factory=dict)  # torch/accelerate/deepspeed/transformers
    env: dict[str, str] = field(default_factory=dict)  # CUDA_VISIBLE_DEVICES and SLURM_* when set
    source: str = "probe"                 # "probe" | "assume:<spec>" | "file:<path>"
    num_machines_hint: int | None = None  # from SLURM_NNODES when present

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def min_gpu_memory(self) -> int:
        return min((g.memory_total for g in self.gpus), default=0)

    @property
    def all_bf16(self) -> bool:
        return bool(self.gpus) and all(g.bf16 for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for g in d["gpus"]:
            if g["compute_capability"] is not None:
                g["compute_capability"] = list(g["compute_capability"])
        return d


def from_json(data: dict[str, Any], source: str = "file") -> Hardware:
    """Rebuild a Hardware from `wizard probe --json` output. Raises InputError on bad data."""
    raise NotImplementedError


def load_file(path: str) -> Hardware:
    """`--hardware FILE`: read a saved probe. InputError (field 'hardware') if unreadable."""
    raise NotImplementedError


def assume(spec: str) -> Hardware:
    """`--assume 8xH100-80GB`, `4xA100-40GB,ram=512G`, `2xRTX4090` from the catalogue."""
    raise NotImplementedError


def probe(output_dir: str | None = None, nvme_path: str | None = None) -> Hardware:
    """Probe this machine. Never raises for a missing GPU/driver: zero GPUs and the reason."""
    raise NotImplementedError
