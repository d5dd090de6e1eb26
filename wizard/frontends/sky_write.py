"""`wizard compare --write MACHINE -- SCRIPT ARGS`: the SkyPilot task beside the machine's config set.

Before the set is written (prepare): the task's workdir is the directory the command runs in; the script and the
output dir must be inside it (SkyPilot syncs the workdir to every node and starts setup and run there), the YAML
names ds_config.json relative to it, a multi-node config gets a per-node launcher and a placeholder main address
(the run passes the head node's). After (write): the task, rendered from the files just written (the YAML and
wizard_plan.json, as `--emit-slurm` reads them), written 0600 (it holds the nodes' preflight secret).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path

from wizard import compare as compare_mod
from wizard.config import sky_task
from wizard.errors import InputError
from wizard.probe import catalogue

# DeepSpeed launchers that start every node from the main one (over ssh or MPI): a SkyPilot task starts each node's
# own `wizard launch`, so only the per-node ones fit ('standard': torchrun on each node; 'nossh').
PER_NODE_LAUNCHERS = ("standard", "nossh")
PLACEHOLDER_ADDRESS = "127.0.0.1"    # in the YAML only: every node's run passes the head node's address
ALLOWED = "--write MACHINE [--output-dir D inside the current directory] -- SCRIPT [ARGS...] (SCRIPT inside it)"


@dataclass
class Prepared:
    machine: compare_mod.Machine
    workdir: str
    output_dir: str
    script: str
    script_args: list[str]
    name: str


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)


def prepare(ns: argparse.Namespace, chosen: compare_mod.Machine, words: list[str]) -> Prepared:
    """Check the task can carry `words` (SCRIPT ARGS) and what it needs, and set the answers the task's config set
    needs (exit 2 otherwise)."""
    script, args = words[0], words[1:]
    workdir = os.getcwd()
    if not os.path.isfile(script):
        raise InputError("write", f"the script {script!r} is not a file here", ALLOWED)
    if not _inside(script, workdir):
        raise InputError("write", f"the script {script!r} is outside the current directory {workdir}, which the "
                         "SkyPilot task carries to the nodes as its workdir", ALLOWED)
    names = catalogue.skypilot_names(catalogue.by_name(chosen.gpu_names[0])) if len(chosen.gpu_names) == 1 else ()
    if not names:
        raise InputError("write", f"SkyPilot has no name for the GPUs of {chosen.label}: no task can ask for them",
                         "a machine of GPUs SkyPilot rents: " + ", ".join(catalogue.SKYPILOT_NAMES))
    out = getattr(ns, "output_dir", None) or f"wizard-{chosen.key.lower()}"
    if not _inside(out, workdir):
        raise InputError("output-dir", f"{out} is outside the current directory {workdir}: the SkyPilot task carries "
                         "the config set in its workdir", ALLOWED)
    name = ns.sky_task or sky_task.TASK_NAME
    if os.sep in name or name in (".", "..") or not name.strip():
        raise InputError("sky-task", f"{name!r} is not a file name", "a file name such as sky.yaml")
    if chosen.nodes > 1:
        launcher = getattr(ns, "deepspeed_multinode_launcher", None)
        if launcher is not None and str(launcher) not in PER_NODE_LAUNCHERS:
            raise InputError("deepspeed-multinode-launcher", f"{launcher} starts the other nodes from the main one; "
                             "the SkyPilot task starts a `wizard launch` on every node", "|".join(PER_NODE_LAUNCHERS))
        if getattr(ns, "main_process_ip", None) is None:
            ns.main_process_ip = PLACEHOLDER_ADDRESS
    ns.output_dir = out
    rel = os.path.relpath(os.path.abspath(out), workdir)
    ns.ds_config_ref = "ds_config.json" if rel == "." else os.path.join(rel, "ds_config.json")
    return Prepared(chosen, workdir, os.path.abspath(out), os.path.relpath(os.path.abspath(script), workdir), args,
                    name)


def pins(given_method: str | None, optimizer: str | None) -> list[str]:
    """The wizard's own requirements pinned to the versions installed here (torch without its local build tag:
    the node takes its own CUDA build of that version), and bitsandbytes where the plan quantises."""
    from packaging.requirements import Requirement
    names: list[str] = []
    try:
        requires = metadata.requires("wizard") or []
    except metadata.PackageNotFoundError:     # run from a checkout, not installed: the tested libraries and the rest
        from wizard.versions import TESTED
        requires = [v.name for v in TESTED if not v.optional] + ["pyyaml", "packaging", "psutil", "questionary"]
    for text in requires:
        req = Requirement(text)
        if req.marker is None:
            names.append(req.name)
    if given_method == "qlora" or optimizer == "adamw-8bit":
        names.append("bitsandbytes")
    out = []
    for name in dict.fromkeys(names):
        try:
            version = metadata.version(name).split("+")[0]
        except metadata.PackageNotFoundError:
            out.append(name)
            continue
        out.append(f"{name}=={version}")
    return out


def sources() -> dict[str, str]:
    """The wizard's two packages here: `wizard` and `launch`, carried to the nodes."""
    import wizard
    spec = util.find_spec("launch")
    launch_dir = list(spec.submodule_search_locations or [])[0] if spec else None
    out = {"wizard": str(Path(wizard.__file__).resolve().parent)}
    if launch_dir:
        out["launch"] = str(Path(launch_dir).resolve())
    return out


def write(ns: argparse.Namespace, p: Prepared) -> str | None:
    """Render the task from the written set and write it (0600); None with --dry-run."""
    from wizard.fsutil import read_json_object, read_yaml_mapping, replace_file
    from wizard.paths import plan_file_beside
    if getattr(ns, "dry_run", False):
        print(f"A SkyPilot task would be written to {os.path.join(p.output_dir, p.name)}.",
              file=sys.stderr if getattr(ns, "json", False) else sys.stdout)
        return None
    config_file = os.path.join(p.output_dir, "default_config.yaml")
    accel = read_yaml_mapping(config_file) or {}
    plan = read_json_object(plan_file_beside(config_file))
    given = (plan or {}).get("given") or {}
    nodes = int(accel.get("num_machines") or 1)
    per_node = int(accel.get("num_processes") or 1) // max(1, nodes)
    spec = catalogue.by_name(p.machine.gpu_names[0])
    inputs = sky_task.TaskInputs(
        machine=p.machine.label, accelerators=catalogue.skypilot_names(spec), gpus_per_node=per_node, nodes=nodes,
        workdir=p.workdir, config_ref=os.path.relpath(os.path.join(p.output_dir, "default_config.yaml"), p.workdir),
        script=p.script, script_args=p.script_args, plan=plan,
        pins=pins(given.get("method"), given.get("optimizer")), sources=sources(),
        secret=secrets.token_hex(32) if nodes > 1 else None,
        name="wizard-" + "".join(c if c.isalnum() else "-" for c in p.machine.key.lower()))
    path = os.path.join(p.output_dir, p.name)
    replace_file(path, sky_task.render(inputs), mode=0o600)     # no .bak: it would keep an old secret
    out = sys.stderr if getattr(ns, "json", False) else sys.stdout      # --json keeps stdout one JSON document
    print(f"SkyPilot task: {path}\nNext: sky launch -c NAME {os.path.relpath(path)}   (SkyPilot picks the cheapest "
          f"offer of {' or '.join(inputs.accelerators)} x {per_node} on {nodes} node{'s' if nodes != 1 else ''}, "
          "syncs this directory, installs the pinned libraries, and starts `wizard launch` on every node)", file=out)
    return path
