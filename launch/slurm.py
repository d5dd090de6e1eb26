"""`wizard launch --emit-slurm NODES`: an sbatch script running `wizard launch --headless` on every node.

One task per node (srun --ntasks-per-node=1); each task is one node's supervisor, which runs
`accelerate launch` for that node's processes. SLURM gives what accelerate needs:
- the machine rank: $SLURM_NODEID (0 on the first node of the allocation);
- the main node's address: the first host of `scontrol show hostnames $SLURM_JOB_NODELIST`.
These are passed as --machine-rank / --main-process-ip / --main-process-port, which override the
YAML, so the same accelerate config serves every node. The config's num_machines must equal NODES.
"""

from __future__ import annotations

import shlex
from pathlib import Path

DEFAULT_PORT = 29500


def render_sbatch(nodes: int, script: str, script_args: list[str], *, config_file: str | None,
                  launch_flags: list[str] | None = None, port: int = DEFAULT_PORT,
                  job_name: str = "wizard-train", gpus_per_node: int | None = None,
                  wizard: str = "wizard", run_root: str | None = None) -> str:
    if nodes < 1:
        from wizard.errors import InputError
        raise InputError("--emit-slurm", f"{nodes} nodes", "a positive number of nodes")
    q = shlex.quote
    sb = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --output=%x-%j.out",
    ]
    if gpus_per_node:
        sb.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    flags = ["--headless"]
    if config_file:
        flags += ["--config-file", config_file]
    flags += list(launch_flags or [])
    root = run_root or "wizard-runs/slurm-${SLURM_JOB_ID}"
    per_node = ('exec "$WIZARD" launch --machine-rank "$SLURM_NODEID" --main-process-ip "$MAIN_ADDR" '
                '--main-process-port "$MAIN_PORT" --run-dir "$RUN_ROOT/node-$SLURM_NODEID" "$@"')
    args = [*flags, "--", script, *script_args]
    body = [
        "",
        "set -euo pipefail",
        "# written by `wizard launch --emit-slurm`: one supervisor per node, same config everywhere",
        'export MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"export MAIN_PORT={int(port)}",
        f'export RUN_ROOT="{root}"',
        f"export WIZARD={q(wizard)}",
        'echo "main node: $MAIN_ADDR:$MAIN_PORT, nodes: $SLURM_JOB_NUM_NODES"',
        "",
        "# $SLURM_NODEID is expanded by each task on its own node (single quotes), not here",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {q(per_node)} bash \\",
        "    " + " ".join(q(a) for a in args),
        "",
    ]
    return "\n".join(sb + body)


def write_sbatch(path: str | Path, text: str) -> Path:
    from wizard.fsutil import replace_file
    p = Path(path)
    replace_file(p, text, mode=0o755)
    return p
