"""The SkyPilot task `wizard compare --write MACHINE -- SCRIPT ARGS` writes beside the config set: one more emit
target over the same plan, read back by SkyPilot's own parser in the tests (sky.Task.from_yaml).

What the task says, and where each figure comes from:
- `resources.accelerators`: the machine's GPUs per node in SkyPilot's names (wizard.probe.catalogue.SKYPILOT_NAMES;
  several names are alternatives SkyPilot chooses among), `num_nodes` the machine's nodes;
- `resources.memory`: host RAM per node, the plan's need plus margin and the processes' own (wizard.host_memory, the
  sbatch script's --mem arithmetic), as a lower bound ("N+");
- `resources.disk_size`: the plan's checkpoints on a node (the plan's `checkpoint.per_node_total_bytes`, where the
  plan sizes them), the model's weights as downloaded (parameters x their dtype's bytes), the NVMe offload files of
  the rung, and ENVIRONMENT_GIB for the Python environment and its caches; never less than SkyPilot's default;
- `workdir`: the directory the command ran in (the script and the config set are inside it: SkyPilot syncs it to
  ~/sky_workdir on every node, and `setup` and `run` start there); `file_mounts` carry the wizard itself (its two
  packages, put on PYTHONPATH: the name `wizard` on PyPI is another project, never installed);
- `setup`: the libraries the plan was made with, at the versions installed here (the wizard's own requirements,
  each pinned to its installed version), then the workdir's requirements.txt when there is one;
- `secrets`: on several nodes, the preflight's shared secret (SECURITY.md), made fresh for this task file: SkyPilot
  exports it on every node and shows it redacted; the file is written 0600;
- `run`: a supervised `wizard launch --headless` on every node, with `--preflight` on several, the node's rank from
  $SKYPILOT_NODE_RANK and the main address, the head node's, the first line of $SKYPILOT_NODE_IPS. The YAML names
  ds_config.json relative to the workdir, as accelerate resolves it (against the launch's directory), so nothing in
  the set is a path of the machine that wrote it.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

TASK_NAME = "sky.yaml"
SKY_DEFAULT_DISK_GIB = 256        # SkyPilot's own default disk_size (GB): asked for at least that
ENVIRONMENT_GIB = 40              # the Python environment (torch with its CUDA libraries ~ 10 GB, DeepSpeed, the
                                  # others), pip's cache and DeepSpeed's JIT-built ops, beside the image's own OS
SOURCE_ROOT = "~/.wizard-task/src"    # where file_mounts put the wizard's packages on each node
MARKER = "written by `wizard compare --write"
# The launch line's fixed parts, which `wizard check` looks for (wizard/check/rules/sky_task.py).
LAUNCH = "python3 -m wizard launch --headless"
RANK_FLAG = '--machine-rank "$SKYPILOT_NODE_RANK"'
ADDRESS_FLAG = '--main-process-ip "$MAIN_ADDR"'
MAIN_ADDR_LINE = 'MAIN_ADDR=$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | head -n1)'
SECRET_ENV = "WIZARD_PREFLIGHT_SECRET"
GiB = 2**30


@dataclass
class TaskInputs:
    machine: str                      # the compare row's label: "2x8xH100-80GB"
    accelerators: tuple[str, ...]     # SkyPilot's names for the GPU (alternatives)
    gpus_per_node: int
    nodes: int
    workdir: str                      # absolute, on the writing machine (read there by `sky launch`)
    config_ref: str                   # default_config.yaml relative to the workdir
    script: str                       # relative to the workdir
    script_args: list[str] = field(default_factory=list)
    plan: dict[str, Any] | None = None    # wizard_plan.json
    pins: list[str] = field(default_factory=list)      # "accelerate==1.16.0", ...
    sources: dict[str, str] = field(default_factory=dict)   # package name -> its directory here
    secret: str | None = None
    name: str = "wizard-train"


@dataclass
class Disk:
    gib: int
    lines: list[str]


def _plan(doc: dict[str, Any] | None) -> dict[str, Any]:
    return ((doc or {}).get("plan") or {}) if isinstance(doc, dict) else {}


def _int(x: Any) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else 0


def disk_request(doc: dict[str, Any] | None) -> Disk:
    """disk_size per node (GiB) and the arithmetic behind it, from wizard_plan.json."""
    plan = _plan(doc)
    model = (doc or {}).get("model") or {}
    ckpt = _int((plan.get("checkpoint") or {}).get("per_node_total_bytes"))
    weights = _int(model.get("params")) * (_int(model.get("weights_dtype_bytes")) or 2)
    choice = plan.get("choice") or {}
    chosen = next((r for r in plan.get("rungs") or [] if r.get("key") == choice.get("key")), {})
    nvme = _int(chosen.get("nvme_bytes")) if "nvme" in (choice.get("offload_optimizer"), choice.get("offload_param")) \
        else 0
    total = (ckpt + weights + nvme) / GiB + ENVIRONMENT_GIB
    lines = [f"{ckpt / GiB:8.1f} GiB  checkpoints on this node (the plan's)" if ckpt else
             "     -      checkpoints: not sized by this plan; add what your saves keep (`wizard plan` sizes them "
             "where it knows the checkpoint settings)",
             f"{weights / GiB:8.1f} GiB  the model's weights as downloaded (parameters x their dtype)",
             *([f"{nvme / GiB:8.1f} GiB  NVMe offload files of the chosen rung"] if nvme else []),
             f"{ENVIRONMENT_GIB:8.1f} GiB  the Python environment, pip's cache, DeepSpeed's built ops",
             f"= {total:.1f} GiB; at least SkyPilot's default {SKY_DEFAULT_DISK_GIB} GB"]
    return Disk(max(SKY_DEFAULT_DISK_GIB, math.ceil(total)), lines)


def memory_lines(doc: dict[str, Any] | None, ranks_per_node: int) -> tuple[int | None, list[str]]:
    """resources.memory per node (GiB, a lower bound) and why: the sbatch script's arithmetic (wizard.host_memory)."""
    from wizard.host_memory import memory_request
    req = memory_request(doc, ranks_per_node, gpu_ranks=True)
    if req is None:
        return None, []
    return req.gib, [f"{req.plan_gib:8.1f} GiB  the plan's host-RAM need on a node",
                     f"{req.margin_gib:8.1f} GiB  margin for the estimate's error and fragmentation",
                     f"{req.rss_gib:8.1f} GiB  the processes' own RSS ({req.ranks} GPU ranks, the supervisor)",
                     f"= {req.gib} GiB or more"]


def run_script(t: TaskInputs) -> str:
    q = shlex.quote
    launch = [LAUNCH, f"--config-file {q(t.config_ref)}", RANK_FLAG]
    lines = ["set -euo pipefail",
             "# the wizard's own packages, carried by file_mounts (not installed from PyPI)",
             'export PYTHONPATH="$HOME/' + SOURCE_ROOT[2:] + '${PYTHONPATH:+:$PYTHONPATH}"']
    if t.nodes > 1:
        lines += ["# SkyPilot gives each node its rank ($SKYPILOT_NODE_RANK, 0 on the head node) and every node's",
                  "# address ($SKYPILOT_NODE_IPS, one per line, the head node first): the main node is the head node",
                  MAIN_ADDR_LINE]
        launch += [ADDRESS_FLAG, "--preflight"]
    tail = " ".join(q(a) for a in [t.script, *t.script_args])
    lines.append("exec " + " \\\n  ".join(launch) + f" \\\n  -- {tail}")
    return "\n".join(lines) + "\n"


def setup_script(t: TaskInputs) -> str:
    pins = " ".join(shlex.quote(p) for p in t.pins)
    return "\n".join([
        "set -euo pipefail",
        "# the libraries the plan was made with, at the versions installed where it was written",
        f"python3 -m pip install {pins}" if pins else "true",
        "if [ -f requirements.txt ]; then python3 -m pip install -r requirements.txt; fi",
    ]) + "\n"


def task_doc(t: TaskInputs) -> tuple[dict[str, Any], list[str]]:
    """The task as a mapping (SkyPilot's schema) and the header comment lines."""
    disk = disk_request(t.plan)
    mem, mem_lines = memory_lines(t.plan, t.gpus_per_node)
    accel: Any = (f"{t.accelerators[0]}:{t.gpus_per_node}" if len(t.accelerators) == 1 else
                  {name: t.gpus_per_node for name in t.accelerators})
    resources: dict[str, Any] = {"accelerators": accel, "disk_size": disk.gib}
    if mem:
        resources["memory"] = f"{mem}+"
    doc: dict[str, Any] = {"name": t.name, "workdir": t.workdir, "num_nodes": t.nodes, "resources": resources,
                           "file_mounts": {f"{SOURCE_ROOT}/{pkg}": path for pkg, path in sorted(t.sources.items())}}
    if t.secret:
        doc["secrets"] = {SECRET_ENV: t.secret}
    doc["setup"] = setup_script(t)
    doc["run"] = run_script(t)
    header = [f"{MARKER} {t.machine}`: run it with `sky launch -c NAME {TASK_NAME}` (README: Rent and run)",
              f"accelerators: {t.gpus_per_node} x {' or '.join(t.accelerators)} per node, {t.nodes} "
              f"node{'s' if t.nodes != 1 else ''}: the machine the plan was made for",
              *(["memory per node, from the plan (wizard_plan.json):", *("  " + x for x in mem_lines)] if mem else []),
              "disk_size per node:", *("  " + x for x in disk.lines)]
    if t.secret:
        header.append(f"secrets.{SECRET_ENV}: the nodes' preflight secret, fresh for this file (keep it 0600; "
                      f"`sky launch --secret {SECRET_ENV}` with your own overrides it)")
    return doc, header


def render(t: TaskInputs) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, data: str):
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    doc, header = task_doc(t)
    body = yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=120)
    return "".join(f"# {line}\n" for line in header) + body


def launch_words(run: str) -> list[str] | None:
    """The words of the run's `wizard launch` command (without `exec`), or None when it has none: what `wizard
    check` judges."""
    joined = run.replace("\\\n", " ")
    for line in joined.splitlines():
        if "-m wizard launch" in line:
            try:
                words = shlex.split(line, posix=True)
            except ValueError:
                return None
            return words[1:] if words and words[0] == "exec" else words
    return None
