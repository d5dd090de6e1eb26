"""Does a machine have the GPUs an accelerate config's processes need: the one decision of `wizard preflight`'s GPUs
row for each node, and of `wizard check`'s and `wizard launch`'s finding for this machine
(check/rules/machines.py). Pure functions over the config's values and a GPU count; no imports beyond Python's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def uses_gpus(acc: dict[str, Any], plan: dict[str, Any] | None = None) -> bool:
    """Whether the config's processes run on GPUs: not with `use_cpu`, a CPU distributed type, or the plan the
    wizard saved beside it saying cpu_only (its DeepSpeed CPU-accelerator config keeps `use_cpu: false`)."""
    if str(acc.get("use_cpu", False)).lower() in ("true", "1", "yes"):
        return False
    if str(acc.get("distributed_type", "NO")).upper() in ("MULTI_CPU", "XLA", "TPU"):
        return False
    return not ((plan or {}).get("plan") or {}).get("cpu_only")


def gpu_ids_of(value: Any) -> list[str] | None:
    """The ids `gpu_ids` names, None for 'all' or absent."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "")):
        return None
    if isinstance(value, list):
        return [str(v) for v in value]
    return [part.strip() for part in str(value).split(",") if part.strip()]


@dataclass(frozen=True)
class GpuFit:
    """Whether a machine with `gpus` GPUs can run the config's processes: verdict ok | cpu (CPU processes: none
    needed) | no-gpu | bad-ids | too-few, and for the last three what goes wrong and the fix, with `place` (node,
    machine) in the words."""
    verdict: str
    problem: str = ""
    fix: str = ""
    key: str | None = None               # the config key to change


def gpu_fit(per_machine: int, machines: int, gpus_used: bool, gpus: int, ids: list[str] | None,
            place: str = "machine") -> GpuFit:
    if not gpus_used:
        return GpuFit("cpu")
    s = "es" if per_machine != 1 else ""
    if gpus == 0:
        # accelerate runs a GPU config's processes on the CPU (DDP over gloo) where torch finds no CUDA device:
        # the run starts, every process on the host's cores, far slower than planned
        return GpuFit("no-gpu", f"the config asks for {per_machine} GPU process{s} per {place}, so accelerate "
                      f"would run {'them' if per_machine != 1 else 'it'} on the CPU over gloo",
                      "run on GPU nodes (SLURM: --gpus-per-node), install the NVIDIA driver, or make a CPU config "
                      "(`wizard --use-cpu yes`)", "num_processes")
    if ids is not None:
        missing = [i for i in ids if not (i.isdigit() and int(i) < gpus)]
        if missing:
            return GpuFit("bad-ids", f"gpu_ids names {', '.join(missing)} but this {place} has {gpus} "
                          f"GPU{'s' if gpus != 1 else ''} (0-{gpus - 1})", f"gpu_ids: all, or ids below {gpus}",
                          "gpu_ids")
    available = len(ids) if ids is not None else gpus
    if per_machine > available:
        what = f"gpu_ids lists {available}" if ids is not None else f"this {place} has {available}"
        return GpuFit("too-few", f"the config runs {per_machine} processes per {place}, one per GPU, but {what}",
                      f"a {place} with {per_machine} GPUs, or num_processes {available * machines} for "
                      f"{machines} {place}{'s' if machines != 1 else ''} of {available}", "num_processes")
    return GpuFit("ok")
