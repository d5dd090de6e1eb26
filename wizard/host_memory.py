"""Host RAM for one node of a multi-node job: the plan's host-RAM need (wizard_plan.json), a margin over it and the
resident memory of the node's own processes. One arithmetic for every scheduler the wizard writes a job for: the
sbatch script's --mem (launch/slurm.py) and the SkyPilot task's `resources.memory` (wizard/config/sky_task.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# headroom over the plan's host-RAM figure (memory_request):
HOST_MARGIN = 0.10          # the estimate's own error and the host allocator's fragmentation
RSS_PER_GPU_RANK_GIB = 3.0  # a GPU rank before its model states: Python, torch, the CUDA/cuBLAS/NCCL libraries
                            # mapped into host memory, pinned staging buffers, the data loader (typically 2-3 GiB)
RSS_PER_CPU_RANK_GIB = 1.0  # a CPU rank before its states: Python, torch, transformers (~0.45 GiB measured on
                            # this project's CPU launches), plus its data loading
RSS_LAUNCH_GIB = 1.0        # the node's wizard supervisor, accelerate's launcher with torchrun's agent, and the
                            # reaper (~0.45 + 0.26 + 0.05 GiB measured)
GiB = 2**30


@dataclass
class MemoryRequest:
    """The host RAM one node asks for, and the arithmetic behind it (written into the script as a comment)."""
    gib: int
    plan_gib: float             # the plan's host-RAM need on a node
    margin_gib: float
    rss_gib: float
    ranks: int
    gpu_ranks: bool
    cpu_only: bool

    def explain(self) -> list[str]:
        per = RSS_PER_GPU_RANK_GIB if self.gpu_ranks else RSS_PER_CPU_RANK_GIB
        what = ("the ranks' model states, in host memory on a CPU run" if self.cpu_only
                else "what the plan keeps in host RAM: offloaded states, model loading")
        total = self.plan_gib + self.margin_gib + self.rss_gib
        return [
            f"--mem={self.gib}G per node, from the wizard's plan (wizard_plan.json beside the config):",
            f"    {self.plan_gib:7.1f} GiB  the plan's host-RAM need on a node ({what})",
            f"  + {self.margin_gib:7.1f} GiB  {HOST_MARGIN:.0%} of it for the estimate's error and allocator fragmentation",
            f"  + {self.rss_gib:7.1f} GiB  the processes' own RSS: {self.ranks} {'GPU' if self.gpu_ranks else 'CPU'} "
            f"rank{'s' if self.ranks != 1 else ''} x {per:g} GiB (Python, torch, "
            f"{'CUDA libraries, pinned buffers' if self.gpu_ranks else 'transformers'}, data loading) + "
            f"{RSS_LAUNCH_GIB:g} GiB for the supervisor, accelerate's launcher and torchrun's agent",
            f"  = {total:7.1f} GiB, rounded up to {self.gib}G",
            "--mem is a cgroup limit on all of that together: past it the job is OOM-killed",
        ]


def memory_request(plan: dict[str, Any] | None, ranks_per_node: int, gpu_ranks: bool) -> MemoryRequest | None:
    """--mem for a node: the plan's host-RAM need, HOST_MARGIN over it, and the RSS of the node's processes.
    None when there is no plan or it names no host-RAM need (SLURM's default then applies)."""
    p = ((plan or {}).get("plan") or plan or {})
    choice = p.get("choice") or {}
    cpu_only = bool(p.get("cpu_only"))
    need = choice.get("cpu_bytes")
    need = need if isinstance(need, (int, float)) and need > 0 else 0
    per_process = choice.get("per_gpu_bytes")
    if cpu_only and isinstance(per_process, (int, float)) and per_process > 0:
        need += per_process * ranks_per_node         # a CPU "device" is host RAM
    if need <= 0:
        return None
    plan_gib = need / GiB
    margin = plan_gib * HOST_MARGIN
    rss = ranks_per_node * (RSS_PER_GPU_RANK_GIB if gpu_ranks else RSS_PER_CPU_RANK_GIB) + RSS_LAUNCH_GIB
    return MemoryRequest(max(1, math.ceil(plan_gib + margin + rss)), plan_gib, margin, rss, ranks_per_node,
                         gpu_ranks, cpu_only)
