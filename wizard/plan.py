"""The ladder: cheapest strategy that fits, with the per-GPU arithmetic of every rung.

Pure: takes Hardware, ModelShape and options, returns a Plan. Formulas live in memory.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from wizard.units import GiB

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GC_MODES = ("auto", "on", "off")
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd", "adafactor")
ATTENTIONS = ("auto", "flash", "sdpa", "eager")
TRAINERS = ("hf", "accelerate")
BACKENDS = ("auto", "ddp", "deepspeed", "fsdp")
ZERO_STAGES = ("auto", "1", "2", "3")
OFFLOADS = ("auto", "none", "cpu", "nvme")

# Names of the breakdown components, in the order the UI stacks them.
COMPONENTS = ("parameters", "gradients", "optimizer", "activations", "logits", "buffers", "context", "margin")


@dataclass
class TrainingOptions:
    seq_len: int = 2048
    micro_batch: int = 1                  # per device
    grad_accum: int = 1
    precision: str = "auto"               # auto: bf16 where every GPU supports it, else fp16 (fp32 on CPU)
    gradient_checkpointing: str = "auto"
    optimizer: str = "adamw"
    attention: str = "auto"
    trainer: str = "hf"                   # hf: Trainer fills every "auto"; accelerate: own loop


@dataclass
class StrategyOptions:
    backend: str = "auto"
    zero_stage: str = "auto"
    offload: str = "auto"
    nvme_path: str | None = None
    headroom: float = 0.10
    cuda_context_bytes: int = 1 * GiB     # per process; DESIGN.md: "about 1 GiB per process (configurable)"


@dataclass
class Topology:
    num_machines: int = 1
    processes_per_machine: int = 1
    cpu: bool = False                     # CPU processes (no GPU): DeepSpeed CPU accelerator / gloo, fp32

    @property
    def world_size(self) -> int:
        return self.num_machines * self.processes_per_machine


@dataclass
class Rung:
    key: str                              # stable id: "single", "ddp", "zero2", "zero3", "zero3-offload-opt", ...
    name: str                             # what the user reads: "ZeRO-3 + CPU optimizer offload"
    backend: str                          # single | ddp | deepspeed | fsdp
    zero_stage: int | None = None
    offload_optimizer: str = "none"       # none | cpu | nvme
    offload_param: str = "none"
    fsdp_reshard: bool | None = None
    gradient_checkpointing: bool = False
    per_gpu_bytes: int = 0
    cpu_bytes: int = 0                    # host RAM needed (offload, model init)
    nvme_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    fits: bool = False
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    rungs: list[Rung]
    choice: Rung | None
    gpu_capacity_bytes: int               # smallest GPU's memory (per-process budget before headroom)
    usable_bytes: int                     # (1 - headroom) * capacity
    precision: str                        # resolved: bf16 | fp16 | fp32
    topology: Topology
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        c = self.choice
        return {
            "choice": None if c is None else {
                "backend": c.backend, "zero_stage": c.zero_stage,
                "offload_optimizer": c.offload_optimizer, "offload_param": c.offload_param,
                "gradient_checkpointing": c.gradient_checkpointing,
                "per_gpu_bytes": c.per_gpu_bytes, "cpu_bytes": c.cpu_bytes, "key": c.key, "name": c.name,
            },
            "gpu_capacity_bytes": self.gpu_capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "precision": self.precision,
            "world_size": self.topology.world_size,
            "num_machines": self.topology.num_machines,
            "cpu_only": self.topology.cpu,
            "notes": list(self.notes),
            "rungs": [r.to_json() for r in self.rungs],
        }


def make_plan(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology) -> Plan:
    """Walk the ladder of DESIGN.md and return every rung with its breakdown and the choice."""
    raise NotImplementedError
