"""SkyPilot task rules: a task file `wizard compare --write MACHINE -- SCRIPT` wrote (`wizard check --sky-task P`)
against the accelerate config it runs. Nodes and GPUs per node must be the config's (SkyPilot would rent another
machine than the one planned, or accelerate would wait for ranks that never come), and the `run` must be the
wizard's launch line: a supervised `wizard launch` of this config, each node with its own rank and the head node's
address from SkyPilot's variables (wizard/config/sky_task.py writes it; this reads it back)."""

from __future__ import annotations

import os
from typing import Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, rule
from wizard.config import sky_task
from wizard.findings import Finding

FAMILY = "task"
FIX = "write the task again: wizard compare --write MACHINE --output-dir D -- SCRIPT [ARGS...]"


def _per_node(ctx: CheckContext) -> int:
    return max(1, ctx.num_processes // max(1, ctx.num_machines))


def _accelerators(task: dict) -> dict[str, int] | None:
    """{name: count per node} of resources.accelerators ("H100:8", "H100", {H100: 8, H100-SXM: 8}); None: none."""
    acc = (task.get("resources") or {}).get("accelerators") if isinstance(task.get("resources"), dict) else None
    if acc is None:
        return None
    items = acc.items() if isinstance(acc, dict) else [tuple((str(a).split(":") + ["1"])[:2]) for a in
                                                      (acc if isinstance(acc, list) else [acc])]
    return {str(name): as_int(count, 0) or 0 for name, count in items}


def _uses_gpus(ctx: CheckContext) -> bool:
    return str(ctx.acc_get("use_cpu", default=False)).lower() not in ("true", "1", "yes") and \
        (ctx.distributed_type or "NO").upper() not in ("MULTI_CPU", "XLA", "TPU")


@rule("SKY-NODES", FAMILY, "the SkyPilot task's num_nodes is not the config's num_machines")
def sky_nodes(ctx: CheckContext) -> Iterable[Finding]:
    if ctx.sky is None:
        return
    nodes = as_int(ctx.sky.get("num_nodes", 1), None)
    if nodes != ctx.num_machines:
        yield finding("error", "SKY-NODES", ctx.sky_path, "num_nodes",
                      f"num_nodes is {ctx.sky.get('num_nodes', 1)!r}; the config is for {ctx.num_machines} "
                      f"machine{'s' if ctx.num_machines != 1 else ''} (num_machines)",
                      fix=f"num_nodes: {ctx.num_machines}, or {FIX}", when="launch")


@rule("SKY-GPUS", FAMILY, "the SkyPilot task's GPUs per node are not the config's processes per node")
def sky_gpus(ctx: CheckContext) -> Iterable[Finding]:
    if ctx.sky is None or not _uses_gpus(ctx):
        return
    want = _per_node(ctx)
    acc = _accelerators(ctx.sky)
    if not acc:
        yield finding("error", "SKY-GPUS", ctx.sky_path, "resources.accelerators",
                      f"asks for no GPU; the config runs {want} GPU process{'es' if want != 1 else ''} per node",
                      fix=f"resources.accelerators: NAME:{want}, or {FIX}", when="launch")
        return
    wrong = {name: n for name, n in acc.items() if n != want}
    if wrong:
        said = ", ".join(f"{name}:{n}" for name, n in wrong.items())
        yield finding("error", "SKY-GPUS", ctx.sky_path, "resources.accelerators",
                      f"asks for {said} per node; the config runs {want} process{'es' if want != 1 else ''} per node "
                      f"(num_processes {ctx.num_processes} / num_machines {ctx.num_machines})",
                      fix=f"{' and '.join(f'{name}:{want}' for name in wrong)}, or {FIX}", when="launch")


def _config_of(words: list[str]) -> str | None:
    for i, w in enumerate(words):
        if w == "--config-file" and i + 1 < len(words):
            return words[i + 1]
        if w.startswith("--config-file="):
            return w.split("=", 1)[1]
    return None


def _same_file(ref: str, workdir: str | None, config: str | None) -> bool:
    if not config:
        return True
    base = os.path.expanduser(str(workdir)) if workdir else os.path.dirname(os.path.abspath(config))
    return os.path.realpath(os.path.join(base, os.path.expanduser(ref))) == os.path.realpath(config)


@rule("SKY-LAUNCH", FAMILY, "the SkyPilot task's run is not the wizard's launch of this config on every node")
def sky_launch(ctx: CheckContext) -> Iterable[Finding]:
    if ctx.sky is None:
        return
    run = ctx.sky.get("run")
    words = sky_task.launch_words(run) if isinstance(run, str) else None
    if not words:
        yield finding("error", "SKY-LAUNCH", ctx.sky_path, "run",
                      "runs no `wizard launch`: nothing supervises the training, and no node runs the preflight",
                      fix=FIX, when="launch")
        return
    problems = []
    ref = _config_of(words)
    workdir = ctx.sky.get("workdir") if isinstance(ctx.sky.get("workdir"), str) else None
    if ref is None:
        problems.append("names no --config-file (accelerate's default config would run, not this one)")
    elif not _same_file(ref, workdir, ctx.acc_path):
        problems.append(f"runs --config-file {ref}, not {ctx.acc_path}")
    if ctx.num_machines > 1:
        if "$SKYPILOT_NODE_RANK" not in words:
            problems.append("gives no node its rank from $SKYPILOT_NODE_RANK (every node would be rank 0)")
        if "--main-process-ip" not in words or "SKYPILOT_NODE_IPS" not in run:
            problems.append("takes the main address from the config, not the head node's ($SKYPILOT_NODE_IPS)")
    for p in problems:
        yield finding("error", "SKY-LAUNCH", ctx.sky_path, "run", f"the wizard launch line {p}", fix=FIX,
                      when="launch")
