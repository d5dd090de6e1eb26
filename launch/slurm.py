"""`wizard launch --emit-slurm NODES`: an sbatch script running `wizard launch --headless` on every node.

One task per node (srun --ntasks-per-node=1); each task is one node's supervisor, which runs
`accelerate launch` for that node's processes. SLURM gives what accelerate needs:
- the machine rank: $SLURM_NODEID (0 on the first node of the allocation);
- the main node's address: the NodeAddr SLURM itself uses for the first host of the allocation
  (`scontrol show node`), which is what the other nodes can reach, falling back to its name;
- the port: the config's main_process_port, or, when the config leaves it to the launcher, one
  derived from the job id (two jobs sharing a node do not collide on 29500).
These are passed as --machine-rank / --main-process-ip / --main-process-port, which override the
YAML, so the same accelerate config serves every node. NODES must equal the config's num_machines:
otherwise each node would train its own independent copy (refused, exit 2).

What each node asks for (one task per node, so per task = per node):
- GPUs: num_processes / num_machines of them (--gpus-per-node) unless the config runs on CPU: a config
  with use_cpu or a CPU distributed type, or one the wizard wrote for CPU processes (its
  wizard_plan.json beside the config says cpu_only; a DeepSpeed CPU-accelerator config keeps
  `use_cpu: false` on purpose, so the YAML alone cannot tell);
- CPUs: --cpus-per-task = processes per node x CPUS_PER_RANK (SLURM's default is 1 CPU per task,
  which would pin every rank of the node and its data loading onto one core);
- memory: --mem when the plan (wizard_plan.json beside the config) knows the node's host-RAM need:
  that need plus headroom (memory_request), explained in a comment in the script. --mem is a cgroup
  limit on everything the job runs on the node, so it must hold the processes' own RSS as well as
  the states the plan puts in host RAM.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PORT = 29500
PORT_BASE, PORT_SPAN = 20000, 20000        # job-derived ports: 20000-39999
CPUS_PER_RANK_GPU = 4                      # a GPU rank: its own thread plus data loading/tokenising
CPUS_PER_RANK_CPU = 1                      # a CPU rank runs with OMP_NUM_THREADS=1 under torchrun
from wizard.host_memory import (  # noqa: F401 - the node's host-RAM request is shared with the SkyPilot task
    GiB, HOST_MARGIN, RSS_LAUNCH_GIB, RSS_PER_CPU_RANK_GIB, RSS_PER_GPU_RANK_GIB, MemoryRequest, memory_request)


def wizard_wrote_for_cpu(plan: dict[str, Any] | None) -> bool:
    """The plan beside the config says the wizard wrote it for CPU processes (no GPU to ask for)."""
    return bool(((plan or {}).get("plan") or plan or {}).get("cpu_only"))


@dataclass
class NodeResources:
    processes_per_node: int
    gpus_per_node: int | None              # None: a CPU config
    cpus_per_task: int
    mem_gib: int | None                    # None: not known
    port: int | None                       # None: derived from the job id
    memory: MemoryRequest | None = None    # how mem_gib was computed


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def uses_gpus(accel: dict[str, Any]) -> bool:
    if str(accel.get("use_cpu", False)).lower() in ("true", "yes", "1"):
        return False
    return str(accel.get("distributed_type", "NO")).upper() not in ("MULTI_CPU", "XLA", "TPU")


def node_resources(nodes: int, accel: dict[str, Any] | None, plan: dict[str, Any] | None = None,
                   port: int | None = None, gpus_per_node: int | None = None) -> NodeResources:
    """What one node needs, from the accelerate config (and the wizard's plan, for memory).
    InputError when NODES disagrees with the config's num_machines."""
    from wizard.errors import InputError
    if nodes < 1:
        raise InputError("--emit-slurm", f"{nodes} nodes", "a positive number of nodes")
    if accel is None:
        raise InputError("--emit-slurm", "no accelerate config to take the machines from",
                         "--config-file P (a config with num_machines)")
    machines = _as_int(accel.get("num_machines")) or 1
    if machines != nodes:
        raise InputError("--emit-slurm", f"{nodes} nodes but the config's num_machines is {machines}",
                         f"--emit-slurm {machines}, or a config made with --num-machines {nodes}")
    total = _as_int(accel.get("num_processes")) or 1
    if total % machines:
        raise InputError("--emit-slurm", f"num_processes {total} is not a multiple of num_machines {machines}",
                         "the same number of processes on every node")
    per_node = total // machines
    if gpus_per_node is not None:          # the user knows the cluster: 0 = a CPU job
        gpus = gpus_per_node or None
    else:
        gpus = per_node if uses_gpus(accel) and not wizard_wrote_for_cpu(plan) else None
    cpus = per_node * (CPUS_PER_RANK_GPU if gpus else CPUS_PER_RANK_CPU)
    memory = memory_request(plan, per_node, gpu_ranks=bool(gpus))
    if port is None:
        cfg_port = _as_int(accel.get("main_process_port"))
        port = cfg_port if cfg_port and 0 < cfg_port < 65536 else None
    return NodeResources(per_node, gpus, cpus, memory.gib if memory else None, port, memory)


def render_sbatch(nodes: int, script: str, script_args: list[str], *, config_file: str | None,
                  launch_flags: list[str] | None = None, resources: NodeResources | None = None,
                  job_name: str = "wizard-train", wizard: str = "wizard", run_root: str | None = None) -> str:
    if nodes < 1:
        from wizard.errors import InputError
        raise InputError("--emit-slurm", f"{nodes} nodes", "a positive number of nodes")
    res = resources or NodeResources(1, None, CPUS_PER_RANK_CPU, None, DEFAULT_PORT)
    q = shlex.quote
    sb = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={res.cpus_per_task}",
        "#SBATCH --output=%x-%j.out",
    ]
    if res.gpus_per_node:
        sb.append(f"#SBATCH --gpus-per-node={res.gpus_per_node}")
    if res.mem_gib:
        sb.append(f"#SBATCH --mem={res.mem_gib}G")
    flags = ["--headless"]
    if config_file:
        flags += ["--config-file", config_file]
    flags += list(launch_flags or [])
    root = run_root or "wizard-runs/slurm-${SLURM_JOB_ID}"
    per_node = ('exec $WIZARD launch --machine-rank "$SLURM_NODEID" --main-process-ip "$MAIN_ADDR" '
                '--main-process-port "$MAIN_PORT" --run-dir "$RUN_ROOT/node-$SLURM_NODEID" "$@"')
    args = [*flags, "--", script, *script_args]
    port_line = (f"export MAIN_PORT={int(res.port)}" if res.port else
                 f"export MAIN_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))   # the config leaves it to the launcher")
    body = [
        "",
        "set -euo pipefail",
        "# written by `wizard launch --emit-slurm`: one supervisor per node, same config everywhere",
        *(f"# {line}" for line in (res.memory.explain() if res.memory and res.mem_gib == res.memory.gib else [])),
        'MAIN_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        "# the address SLURM reaches that node at (NodeAddr), else its name",
        'MAIN_ADDR=$(scontrol show node "$MAIN_NODE" | grep -o "NodeAddr=[^ ]*" | head -n1 | cut -d= -f2 || true)',
        'export MAIN_ADDR=${MAIN_ADDR:-$MAIN_NODE}',
        port_line,
        f'export RUN_ROOT="{root}"',
        f"export WIZARD=${{WIZARD:-{q(wizard)}}}",
        "# the nodes' shared preflight secret, fresh for each job: srun gives it to every node in the environment",
        "# (only this job's user and root can read a process's environment), so no stranger who reaches the main",
        "# port is taken for a node (README: Security)",
        "export WIZARD_PREFLIGHT_SECRET=${WIZARD_PREFLIGHT_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')}",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
        'echo "main node: $MAIN_NODE ($MAIN_ADDR:$MAIN_PORT), nodes: $SLURM_JOB_NUM_NODES"',
        "",
        "# $SLURM_NODEID is expanded by each task on its own node (single quotes), not here",
        f"srun --ntasks-per-node=1 --cpus-per-task={res.cpus_per_task} --kill-on-bad-exit=1 "
        f"bash -c {q(per_node)} bash \\",
        "    " + " ".join(q(a) for a in args),
        "",
    ]
    return "\n".join(sb + body)
def write_sbatch(path: str | Path, text: str) -> Path:
    from wizard.fsutil import replace_file
    p = Path(path)
    replace_file(p, text, mode=0o755)
    return p
