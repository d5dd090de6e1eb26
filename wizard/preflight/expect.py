"""What the config expects of every node: the accelerate config, its DeepSpeed config, the plan the wizard saved
beside it (wizard_plan.json) and the training's own arguments (where it saves its checkpoints). No I/O beyond
reading those files; no torch.
"""

from __future__ import annotations

import os
import re
from typing import Any

from wizard.check.gpu_fit import uses_gpus as config_uses_gpus
from wizard.paths import plan_file_beside
from wizard.preflight.checks import Expectation


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def read_plan(config_file: str | None) -> dict[str, Any] | None:
    from wizard.fsutil import read_json_object
    if not config_file:
        return None
    try:
        return read_json_object(plan_file_beside(config_file))
    except Exception:            # a plan that cannot be read leaves the expectations to the config alone
        return None


def _ds_config(accel: dict[str, Any], config_file: str) -> dict[str, Any]:
    from wizard.fsutil import read_json_object
    ds = accel.get("deepspeed_config") or {}
    path = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
    if path:
        path = path if os.path.isabs(path) else os.path.join(os.path.dirname(config_file), path)
        try:
            return read_json_object(path) or {}
        except Exception:
            return {}
    if isinstance(ds, dict) and ds:        # the YAML's own DeepSpeed keys
        out: dict[str, Any] = {"zero_optimization": {"stage": ds.get("zero_stage")}}
        for which in ("optimizer", "param"):
            dev = ds.get(f"offload_{which}_device")
            if dev and dev != "none":
                out["zero_optimization"][f"offload_{which}"] = {"device": dev,
                                                                "nvme_path": ds.get(f"offload_{which}_nvme_path")}
        return out
    return {}


def _gpu_ids(value: Any) -> list[int] | None:
    text = str(value if value is not None else "all").strip().lower()
    if text in ("all", "", "none"):
        return None
    return [int(x) for x in re.findall(r"\d+", text)]


def _assumed_source(plan: dict[str, Any]) -> str:
    for note in (plan.get("plan") or {}).get("notes") or []:
        m = re.search(r"Machines are joined by .*? per machine \((.*?);", str(note))
        if m:
            return m.group(1)
    return "the plan's figure"


def checkpoint_bytes(plan: dict[str, Any] | None) -> int | None:
    """What one machine must have free for the checkpoints the run keeps: the plan's
    plan.checkpoint.per_node_total_bytes (issue 39); None where the plan has no such figure (a plan written before
    the wizard sized checkpoints), and the check then says it cannot check."""
    ckpt = ((plan or {}).get("plan") or {}).get("checkpoint")
    value = ckpt.get("per_node_total_bytes") if isinstance(ckpt, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_OUTPUT_DIR = re.compile(r"^--output[_-]dir(?:=(.*))?$")


def output_dir(script_args: list[str] | None) -> str | None:
    """The Trainer's output_dir as the training's own arguments name it (HfArgumentParser takes --output_dir and
    --output-dir, with the value after "=" or as the next argument); None when they do not."""
    args = list(script_args or [])
    for i, arg in enumerate(args):
        m = _OUTPUT_DIR.match(arg)
        if m:
            value = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args) else None)
            return value or None
    return None


def expectation(config_file: str | None, main_ip: str | None = None, main_port: int | None = None,
                checkpoint_dir: str | None = None, checkpoint_dir_from: str | None = None) -> Expectation:
    """What every node must have, from the accelerate config, its DeepSpeed config and the plan the wizard saved
    beside it (wizard_plan.json; without it, the config's own figures only). `checkpoint_dir`: where the training
    saves (its output_dir; None: the working directory of each node), `checkpoint_dir_from` says how it was found."""
    from wizard.errors import InputError
    from wizard.fsutil import read_yaml_mapping
    if not config_file or not os.path.isfile(config_file):
        raise InputError("--config-file", f"{config_file or 'no config'} does not exist",
                         "an accelerate config YAML (the wizard writes default_config.yaml)")
    accel = read_yaml_mapping(config_file) or {}
    machines = _int(accel.get("num_machines")) or 1
    total = _int(accel.get("num_processes")) or 1
    per_node = max(1, total // machines)
    plan = read_plan(config_file)
    p = (plan or {}).get("plan") or {}
    uses_gpus = config_uses_gpus(accel, plan)
    choice = p.get("choice") or {}
    ds = _ds_config(accel, config_file)
    zero = ds.get("zero_optimization") or {}
    pinned, by_default = [], []
    nvme_path = None
    for which in ("optimizer", "param"):
        block = zero.get(f"offload_{which}") or {}
        device = str(block.get("device", "none")).lower()
        if device == "nvme":
            nvme_path = block.get("nvme_path") or nvme_path
        if device != "cpu":
            continue
        pin = block.get("pin_memory")
        if pin is True or str(pin).lower() == "true":
            pinned.append(which)
        elif pin is None or pin == "auto":
            by_default.append(which)
    method = ((p.get("method") or {}).get("name")) or "full"
    params = _int(((plan or {}).get("model") or {}).get("params")) if method == "full" else None
    rung = next((r for r in p.get("rungs") or [] if r.get("key") == choice.get("key")), {})
    nvme_bytes = _int(choice.get("nvme_bytes") or rung.get("nvme_bytes")) or None
    cpu_bytes = _int(choice.get("cpu_bytes"))
    if not uses_gpus and _int(choice.get("per_gpu_bytes")):
        cpu_bytes = (cpu_bytes or 0) + _int(choice.get("per_gpu_bytes")) * per_node   # a CPU "device" is host RAM
    ip = main_ip or accel.get("main_process_ip") or None
    port = main_port or _int(accel.get("main_process_port")) or None
    return Expectation(
        config_file=os.path.abspath(config_file), num_machines=machines, processes_per_node=per_node,
        uses_gpus=uses_gpus, main_ip=str(ip) if ip else None, main_port=port, gpu_ids=_gpu_ids(accel.get("gpu_ids")),
        per_gpu_bytes=_int(choice.get("per_gpu_bytes")) if uses_gpus else None,
        gpu_capacity_bytes=_int(p.get("gpu_capacity_bytes")) if uses_gpus else None,
        host_ram_bytes=cpu_bytes or None, pinned_blocks=pinned, pin_default_blocks=by_default, params=params,
        nvme_path=nvme_path, nvme_bytes=nvme_bytes, checkpoint_bytes=checkpoint_bytes(plan),
        checkpoint_dir=checkpoint_dir,
        checkpoint_dir_from=checkpoint_dir_from or ("given" if checkpoint_dir else "the working directory"),
        assumed_gbps=float(p["inter_node_gbps"]) if p.get("inter_node_gbps") else None,
        assumed_source=_assumed_source(plan or {}) if p.get("inter_node_gbps") else "")


def class_default_gbps(exp: Expectation, facts: dict[str, Any]) -> tuple[float | None, str]:
    """Without a plan: the network the planner assumes for machines like this one (speed.inter_node_gbps)."""
    from wizard.planning.speed import inter_node_gbps
    from wizard.probe.hardware import GPU, Hardware
    gpus = (facts.get("gpus") or {}).get("gpus") or []
    hw = Hardware(gpus=[GPU(index=g["index"], name=g["name"], memory_total=g["memory_total"]) for g in gpus]
                  if exp.uses_gpus else [], source="probe")
    return inter_node_gbps(hw)
