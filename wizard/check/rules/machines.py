"""Rules on the processes, machines and GPUs an accelerate config asks for: the numbers themselves (whole, in the
range accelerate and torchrun can use), how the processes divide over the machines, and whether the machine the
check is for has the GPUs they need.

accelerate's loader and launch checks accept `num_processes: 0`, `num_machines: 0` or a machine rank past the
last machine (its own verdicts, ACC-LAUNCH-REJECTS, catch `num_processes: -1`); torchrun then asserts or waits
forever. Those are this module's rules.

Whether a machine has the GPUs the processes need is wizard/check/gpu_fit.py's one decision: `wizard preflight`
makes each node's GPUs row from it, `wizard check` and `wizard launch` (which runs check with this machine's
probe) their finding here.
"""

from __future__ import annotations

from typing import Any, Iterable

from wizard.check.gpu_fit import GpuFit, gpu_fit, gpu_ids_of, uses_gpus
from wizard.check.rules.common import CheckContext, as_int, finding, rule
from wizard.check.rules.yaml_verdicts import loader_error

FAMILY = "accelerate"
MAX_PORT = 65535

# ----------------------------------------------------------------------------- the numbers

COUNT_KEYS = ("num_processes", "num_machines", "machine_rank", "main_process_port")


@rule("ACC-COUNT-NOT-INTEGER", FAMILY, "num_processes / num_machines / machine_rank / port that is not a number")
def count_not_integer(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or loader_error(ctx) is not None:
        return
    for key in COUNT_KEYS:
        value = ctx.acc_get(key)
        if value is None or as_int(value, None) is not None:
            continue
        yield finding(
            "error", "ACC-COUNT-NOT-INTEGER", ctx.acc_path, key,
            f"{key}: {value!r} is not a whole number: accelerate's loader and launch checks pass it through, and "
            f"the launch fails when torchrun parses it", fix=f"write a whole number for {key}", when="launch")


def count_range_problems(acc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, what goes wrong, the values allowed) for each whole number of the YAML that accelerate's loader and
    launch checks pass on but torchrun cannot use. -1 processes is accelerate's own 'pass --num_processes' and
    raises in launch's checks (ACC-LAUNCH-REJECTS), so it is left to that verdict."""
    out = []
    processes = as_int(acc.get("num_processes"), None)
    if processes is not None and processes < 1 and processes != -1:
        out.append(("num_processes", f"num_processes: {processes}: torchrun starts no worker (its WorkerSpec "
                    "asserts local_world_size > 0) and the launch fails with an AssertionError traceback",
                    "a whole number of 1 or more: the processes over all machines, one per GPU"))
    machines = as_int(acc.get("num_machines"), None)
    if machines is not None and machines < 1:
        out.append(("num_machines", f"num_machines: {machines} is no number of machines: accelerate launches "
                    "anything below 2 as one machine, so the file does not say which it was meant for",
                    "a whole number of 1 or more"))
    rank = as_int(acc.get("machine_rank"), None)
    if rank is not None and machines is not None and machines > 1 and not 0 <= rank < machines:
        out.append(("machine_rank", f"machine_rank: {rank} with num_machines: {machines}: torchrun's static "
                    f"rendezvous waits for ranks 0-{machines - 1}, so this machine never joins and the start hangs "
                    "until the rendezvous timeout", f"0 to {machines - 1} (0 on the main machine)"))
    port = as_int(acc.get("main_process_port"), None)
    if port is not None and not 0 <= port <= MAX_PORT:
        out.append(("main_process_port", f"main_process_port: {port} is no TCP port: the rendezvous store "
                    "cannot listen on it", f"0 (any free port) or 1 to {MAX_PORT}"))
    return out


@rule("ACC-COUNT-OUT-OF-RANGE", FAMILY, "num_processes / num_machines below 1, a machine rank or port out of range")
def count_out_of_range(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or loader_error(ctx) is not None:
        return
    for key, problem, allowed in count_range_problems(ctx.acc):
        yield finding("error", "ACC-COUNT-OUT-OF-RANGE", ctx.acc_path, key,
                      f"{problem}; accelerate's loader and launch checks let it through",
                      fix=f"{key}: {allowed}", when="launch")


@rule("ACC-NUM-PROCESSES-PER-NODE", FAMILY, "num_processes looks per-node on a multi-machine config")
def num_processes_per_node(ctx: CheckContext) -> Iterable:
    machines = ctx.num_machines
    total = as_int(ctx.acc_get("num_processes"), None)
    if machines <= 1 or total is None or total <= 0:
        return
    if total < machines or total % machines:
        yield finding(
            "error", "ACC-NUM-PROCESSES-PER-NODE", ctx.acc_path, "num_processes",
            f"num_processes={total} over num_machines={machines}: num_processes is the TOTAL over all machines; "
            f"torchrun gets nproc_per_node={total // machines} and the machines disagree on the world size",
            fix=f"set num_processes to machines x GPUs per machine, e.g. {machines * max(1, total)}",
            when="launch")
        return
    local_gpus = _local_gpus(ctx)
    if local_gpus and total == local_gpus and total // machines < local_gpus:
        yield finding(
            "warning", "ACC-NUM-PROCESSES-PER-NODE", ctx.acc_path, "num_processes",
            f"num_processes={total} equals the GPUs of one machine, but it is the total over {machines} machines: "
            f"each machine will start only {total // machines} of its {local_gpus} GPUs",
            fix=f"num_processes: {total * machines}", when="launch")


def _local_gpus(ctx: CheckContext) -> int:
    hw = ctx.hardware
    return len(hw.gpus) if hw is not None else 0


# ----------------------------------------------------------------------------- GPUs on the machine


def _plan_for(ctx: CheckContext) -> dict[str, Any] | None:
    """The plan the files were written from, as wizard_plan.json says it: the one beside the YAML, or the one
    the wizard is about to write it from."""
    if ctx.planned is not None and ctx.planned.plan is not None:
        return {"plan": {"cpu_only": bool(ctx.planned.plan.topology.cpu)}}
    return ctx.plan_beside


@rule("ACC-NUM-PROCESSES-EXCEEDS-GPUS", FAMILY, "more processes per machine than GPUs (or none) on the machine")
def num_processes_exceeds_gpus(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or not uses_gpus(ctx.acc, _plan_for(ctx)):
        return
    hw = ctx.hardware
    ids = gpu_id_list(ctx)
    per_machine = max(1, ctx.num_processes // ctx.num_machines)
    if hw is None or not hw.gpus:
        if ids is not None and per_machine > len(ids):     # the file contradicts itself, whatever the machine
            fit = gpu_fit(per_machine, ctx.num_machines, True, len(ids), ids)
            yield _exceeds(ctx, fit)
        if hw is not None and str(getattr(hw, "source", "")) == "probe":
            yield from _no_gpu_here(ctx, hw, per_machine)
        return          # no machine known (files read alone), or one planned without its GPUs
    fit = gpu_fit(per_machine, ctx.num_machines, True, len(hw.gpus), ids)
    if fit.verdict in ("bad-ids", "too-few"):
        yield _exceeds(ctx, fit)


def _exceeds(ctx: CheckContext, fit: GpuFit):
    then = ("CUDA_VISIBLE_DEVICES then hides the GPUs the processes expect" if fit.verdict == "bad-ids" else
            "two processes land on one GPU and NCCL fails at init ('Duplicate GPU detected') or they run out of "
            "memory")
    return finding("error", "ACC-NUM-PROCESSES-EXCEEDS-GPUS", ctx.acc_path, fit.key, f"{fit.problem}: {then}",
                   fix=fit.fix, when="launch")


def _no_gpu_here(ctx: CheckContext, hw: Any, per_machine: int) -> Iterable:
    """This machine (the probe) has no GPU for a GPU config: a warning, not an error. The config may be right for
    the machines it is for (check runs on a login node), and launched here it runs, on the CPU."""
    if ctx.distributed_type in (None, "NO") and per_machine <= 1:
        return          # one process, no distributed type: accelerate's plain config, for the CPU as well
    fit = gpu_fit(per_machine, ctx.num_machines, True, 0, None)
    cores = getattr(hw, "cpu_cores", None)
    where = f" ({per_machine} rank{'s' if per_machine != 1 else ''} on {cores} CPU cores)" if cores else ""
    reason = getattr(hw, "gpu_reason", None)
    yield finding(
        "warning", "ACC-NUM-PROCESSES-EXCEEDS-GPUS", ctx.acc_path, fit.key,
        f"this machine has no GPU{f' ({reason})' if reason else ''}: {fit.problem}{where}, far slower than "
        f"planned. If this is a login node and the config is for the GPU machines, check it for them with "
        f"--assume (e.g. --assume {per_machine}xH100-80GB) or --hardware FILE",
        fix=fit.fix, when="launch")


def gpu_id_list(ctx: CheckContext) -> list[str] | None:
    """The ids of `gpu_ids` when it names GPUs, None for 'all' or absent."""
    return gpu_ids_of(ctx.acc_get("gpu_ids"))
