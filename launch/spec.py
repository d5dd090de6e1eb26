"""What `wizard launch` runs: the launch's settings (LaunchSpec, the run directory's spec.json) and the
`accelerate launch` command line built from them and the accelerate config, with the rendezvous port it meets on.
Split from launch/supervisor.py, whose attempts run these commands; launch/commands.py and wizard tune build specs.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from launch.accel_config import world_size_of
from launch.rundir import DEFAULT_STALL_TIMEOUT_S, JSONL_CAP_BYTES, LOG_CAP_BYTES
from wizard.fsutil import read_json_object
from wizard.probe.ports import free_port, port_in_use

WORKER = str(Path(__file__).with_name("_worker.py"))


@dataclass
class LaunchSpec:
    script: str
    script_args: list[str] = field(default_factory=list)
    config_file: str | None = None        # None: accelerate's default (if it exists)
    run_dir: str = ""
    max_restarts: int = 0
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT_S    # None: no stall detection
    grace: float = 30.0
    headless: bool = True
    detached: bool = False
    echo: bool = True                     # headless: rank-prefixed lines on stdout
    status_interval: float = 30.0
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    metrics_interval: float = 1.0
    log_cap_bytes: int = LOG_CAP_BYTES
    jsonl_cap_bytes: int = JSONL_CAP_BYTES
    accelerate_args: list[str] = field(default_factory=list)
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)       # for every attempt's ranks (--resume's WIZARD_RESUME)
    resume: dict[str, Any] | None = None    # what --resume found and did (run.json's "resume")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls_, d: dict[str, Any]) -> "LaunchSpec":
        known = {k: v for k, v in d.items() if k in cls_.__dataclass_fields__}
        return cls_(**known)


# ------------------------------------------------------------------ configs and the command

def yaml_only_flags(accel: dict[str, Any] | None) -> list[str]:
    """accelerate launch ignores these YAML keys (its CLI defaults win): pass them explicitly."""
    a = accel or {}
    flags: list[str] = []
    rdzv = a.get("rdzv_backend")
    if rdzv and str(rdzv) != "static":
        flags += ["--rdzv_backend", str(rdzv)]
    if a.get("same_network") is True:
        flags.append("--same_network")
    if a.get("enable_cpu_affinity") is True:
        flags.append("--enable_cpu_affinity")
    if str(a.get("downcast_bf16", "no")).lower() in ("yes", "true"):
        flags.append("--downcast_bf16")
    return flags


# accelerate's launchers that rendezvous through torchrun on main_process_port (and check that it is free)
TORCHRUN_TYPES = ("MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM")
DEFAULT_PORT = 29500          # accelerate's when neither the config nor the command line names one


def _int_or(value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _own_flag(spec: LaunchSpec, *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in spec.accelerate_args for f in flags)


def rendezvous_port(spec: LaunchSpec, accel: dict[str, Any] | None) -> int | None:
    """The port this run's processes meet on (--main-process-port, else the config's main_process_port, else
    accelerate's 29500; 0: accelerate picks one), or None when the run meets on none (a single process outside
    the torchrun launchers) or the user passes accelerate a port of their own (--accelerate-arg)."""
    a = accel or {}
    if not a or _own_flag(spec, "--main_process_port"):
        return None
    multi = (_int_or(a.get("num_machines"), 1) or 1) > 1
    if not multi and str(a.get("distributed_type") or "") not in TORCHRUN_TYPES and (world_size_of(a) or 1) <= 1:
        return None
    if spec.main_process_port is not None:
        return spec.main_process_port
    return _int_or(a.get("main_process_port"), DEFAULT_PORT)


def free_port_instead(spec: LaunchSpec, accel: dict[str, Any] | None, busy: Callable[[int], bool] = port_in_use,
                      pick: Callable[[], int] = free_port) -> tuple[int, int] | None:
    """(busy port, free port) when a single-machine run's port is in use as an attempt starts: accelerate would
    warn and fall back to torchrun --standalone on a port of its own; passing a free one ourselves keeps the
    launch as configured and the port known (run.json, events.jsonl). None otherwise: a free port, port 0
    (accelerate picks one), and every multi-machine run (all machines must agree on the port: the config's
    ACC-PORT-IN-USE finding says so) or one whose --num_machines the user passes accelerate."""
    port = rendezvous_port(spec, accel)
    if not port or (_int_or((accel or {}).get("num_machines"), 1) or 1) > 1 or _own_flag(spec, "--num_machines"):
        return None
    if not busy(port):
        return None
    return port, pick()


def build_command(spec: LaunchSpec, accel: dict[str, Any] | None, config_file: str | None,
                  main_process_port: int | None = None) -> list[str]:
    """`main_process_port`: the port this attempt passes instead of spec's (free_port_instead)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file:
        cmd += ["--config_file", config_file]
    cmd += ["--max_restarts", "0"]
    cmd += yaml_only_flags(accel)
    if spec.machine_rank is not None:
        cmd += ["--machine_rank", str(spec.machine_rank)]
    if spec.main_process_ip:
        cmd += ["--main_process_ip", spec.main_process_ip]
    port = main_process_port if main_process_port is not None else spec.main_process_port
    if port is not None:
        cmd += ["--main_process_port", str(port)]
    cmd += list(spec.accelerate_args)
    cmd += [WORKER, spec.script, *spec.script_args]
    return cmd


PLAN_FILES = ("wizard_plan.json", "plan.json")


def load_plan_near(config_file: str | None) -> dict[str, Any] | None:
    """The plan the wizard saved next to default_config.yaml (wizard_plan.json), if any."""
    if not config_file:
        return None
    for name in PLAN_FILES:
        plan = read_json_object(Path(config_file).with_name(name))
        if plan:
            return plan
    return None
