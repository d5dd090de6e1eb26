"""The memory cases: one train_one.py subprocess per configuration, its measured peak against the
wizard's prediction, and whether the fit decision was right."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu.cases import CaseSpec, Planner, Prediction, is_fsdp
from bench.gpu.common import HERE
from bench.gpu.runner import Options, child_env, free_port, keep_tail, parse_result_line, run_child


def error_pct(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured in percent: positive means the wizard over-estimates."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured * 100.0


def measured_step_seconds(step_times: list[float] | None) -> float | None:
    """The median optimizer step after the first (the first holds the warm-up: cuBLAS autotuning, DeepSpeed's
    and FSDP's lazy buffers, CPU Adam's first pass); None with fewer than two steps."""
    if not step_times or len(step_times) < 2:
        return None
    return float(statistics.median(step_times[1:]))


# A case whose ds_config has DeepSpeed's CPU Adam (the offload rungs) JIT-builds it on its first run where no
# earlier run left it in ~/.cache/torch_extensions: about a minute on the GPU machine's 16 cores (estimate), a few
# on a 2-core CI runner. Those cases get at least this long.
OFFLOAD_TIMEOUT_S = {"gpu": 180.0, "dry_run": 300.0}


def is_offload(backend: str) -> bool:
    return backend.endswith(("offload-opt", "offload-all"))


def torch_extensions_root() -> Path:
    """Where torch JIT-builds extensions (torch.utils.cpp_extension): $TORCH_EXTENSIONS_DIR, else
    ~/.cache/torch_extensions (one folder per Python and CUDA version under it)."""
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")


def remove_stale_build_locks(since: float, root: Path | None = None) -> list[str]:
    """Remove the JIT build locks created since `since` (a case's start) under the extensions root.

    torch's build takes a file lock (FileBaton) and deletes it when the build ends; a build that the case's
    timeout killed leaves it, and every later build of that op, in the next case too, waits on it forever.
    Called only after the bench killed a case, whose process group built nothing else."""
    root = root or torch_extensions_root()
    removed = []
    for lock in list(root.glob("*/lock")) + list(root.glob("*/*/lock")):
        try:
            if lock.stat().st_mtime >= since:
                lock.unlink()
                removed.append(str(lock))
        except OSError:
            continue
    return removed


def case_timeout(spec: CaseSpec, case_timeout_s: float, dry_run: bool, left: float) -> float:
    """The case's timeout: the per-case one, at least OFFLOAD_TIMEOUT_S for an offload rung, never past the budget."""
    timeout = case_timeout_s
    if is_offload(spec.backend):
        timeout = max(timeout, OFFLOAD_TIMEOUT_S["dry_run" if dry_run else "gpu"])
    return min(timeout, left)


def decide(pred_fits: bool, status: str, measured: int | None, usable: int) -> tuple[str, str]:
    """(right | wrong | unknown, why) for the wizard's fit decision against what happened.

    A 'fits' is right when the run completes (and says so when the measured peak ate into the
    headroom). A 'does not fit' is right when the run runs out of memory, or when it completes but
    its measured peak exceeds the usable memory (the headroom the rule keeps would be gone);
    completing within the usable memory means the wizard was too cautious.
    """
    if status == "ok":
        if pred_fits:
            if measured is not None and measured > usable:
                return "right", "ran, but the measured peak is above the usable memory (headroom eaten)"
            return "right", "predicted to fit and ran"
        if measured is None:
            return "unknown", "predicted not to fit, ran, no measured peak"
        if measured > usable:
            return "right", "predicted not to fit; ran, but above the usable memory"
        return "wrong", "predicted not to fit but ran within the usable memory (too cautious)"
    if status == "oom":
        if pred_fits:
            return "wrong", "predicted to fit but ran out of memory"
        return "right", "predicted not to fit and ran out of memory"
    return "unknown", f"not measured ({status})"


def train_command(spec: CaseSpec, model_dir: str, steps: int, case_dir: Path, ds_config: Path | None,
                  dry_run: bool, nvml_index: int | None, adapter_json: Path | None = None,
                  checkpoint: str | None = None, accelerate_yaml: Path | None = None,
                  port: int | None = None) -> list[str]:
    """bench/gpu/train_one.py for one case; a dry run trains a tiny model of the same kind on the CPU.
    FSDP runs under `accelerate launch` with the wizard's YAML (the environment the Trainer reads FSDP from)."""
    seq, mb = (32, min(spec.micro_batch, 2)) if dry_run else (spec.seq_len, spec.micro_batch)
    cmd = [sys.executable]
    if accelerate_yaml is not None:
        cmd += ["-m", "accelerate.commands.launch", "--config_file", str(accelerate_yaml), "--num_processes", "1"]
        if port is not None:
            cmd += ["--main_process_port", str(port)]
    cmd += [str(HERE / "train_one.py"), "--model-dir", model_dir, "--seq-len", str(seq),
            "--micro-batch", str(mb), "--steps", str(steps), "--gc", "on" if spec.gc else "off",
            "--output-dir", str(case_dir / "out")]
    if ds_config is not None:
        cmd += ["--ds-config", str(ds_config)]
    if accelerate_yaml is not None:
        cmd += ["--expect-fsdp"]
    if spec.method != "full":
        cmd += ["--method", spec.method, "--adapter-json", str(adapter_json)]
    if spec.method == "qlora":
        cmd += ["--checkpoint", str(checkpoint)]
    if spec.alst:
        cmd += ["--alst", spec.alst]
    if dry_run:
        cmd += ["--device", "cpu", "--tiny"]
    elif nvml_index is not None:
        cmd += ["--nvml-index", str(nvml_index)]
    return cmd


def run_case(spec: CaseSpec, number: int, planner: Planner, opts: Options, work: Path,
             nvml_index: int | None, timeout: float, checkpoint: str | None = None) -> dict[str, Any]:
    case_dir = work / f"case-{number}"
    case_dir.mkdir(parents=True, exist_ok=True)
    ds_text = planner.ds_config_text(spec)
    ds_path = None
    if ds_text:
        ds_path = case_dir / "ds_config.json"
        ds_path.write_text(ds_text)
    adapter_path = None
    setup = planner.adapter_setup(spec)
    if setup is not None:
        adapter_path = case_dir / "adapters.json"
        adapter_path.write_text(json.dumps(setup))
    yaml_path = None
    if is_fsdp(spec.backend):
        yaml_path = case_dir / "default_config.yaml"
        yaml_path.write_text(planner.accelerate_yaml(spec))
    port = free_port()
    cmd = train_command(spec, planner.model_dirs[spec.model], opts.steps, case_dir, ds_path, opts.dry_run,
                        nvml_index, adapter_path, checkpoint, yaml_path, port)
    env = child_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "4"})
    if is_offload(spec.backend):
        # The host step's threads are what the plan's offload speed turns on (OMP_NUM_THREADS as the probe read
        # it in this environment; unset with one process = every core): the case runs in the same environment.
        if "OMP_NUM_THREADS" in os.environ:
            env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        else:
            env.pop("OMP_NUM_THREADS")
    if yaml_path is not None:             # accelerate launch sets the ranks itself
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(key, None)
    started = time.time()
    child = run_child(cmd, env, timeout, log_path=case_dir / "stderr.log")
    keep_tail(case_dir / "stderr.log", opts.results_dir / f"case-{number}-stderr.log")
    result = parse_result_line(child["lines"])
    out: dict[str, Any] = {"wall_s": child["wall_s"], "returncode": child["returncode"]}
    if child["timed_out"] and is_offload(spec.backend):
        removed = remove_stale_build_locks(started)
        if removed:
            out["removed_build_locks"] = removed
    if child["timed_out"] and result is None:
        out.update(status="timeout", error=f"no result within {timeout:.0f} s")
    elif result is None:
        tail = (case_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
        out.update(status="crash", error=f"exit {child['returncode']} without a result line", stderr_tail=tail)
    elif result.get("status") == "unsupported":
        out.update(status="skipped", child=result, error=f"{'on the CPU' if opts.dry_run else 'here'}: "
                                                          f"{result.get('error')}")
    else:
        out.update(status=result.get("status", "error"), child=result)
        if result.get("status") == "error":
            out["error"] = result.get("error")
        if child["timed_out"]:
            out["note"] = f"the result came, then the process hung until the {timeout:.0f} s timeout"
    return out


def case_record(spec: CaseSpec, pred: Prediction | None, run: dict | None, dry_run: bool) -> dict[str, Any]:
    child = (run or {}).get("child") or {}
    measured = child.get("measured_peak_bytes")
    status = (run or {}).get("status", "not run")
    rec: dict[str, Any] = {"case": dataclasses.asdict(spec), "label": spec.label()}
    if pred is not None:
        rec["prediction"] = dataclasses.asdict(pred)
        verdict, why = decide(pred.fits, status, measured, pred.usable_bytes)
        if dry_run and status in ("ok", "oom"):
            verdict, why = "unknown", "dry run: a tiny model on the CPU, nothing measured"
        rec.update(predicted_bytes=pred.per_gpu_bytes, predicted_fits=pred.fits,
                   error_pct=None if dry_run else error_pct(pred.per_gpu_bytes, measured if status == "ok" else None),
                   decision=verdict, decision_why=why, predicted_step_s=pred.step_seconds)
    step = None if dry_run or status != "ok" else measured_step_seconds(child.get("step_times_s"))
    rec.update(status=status, measured_bytes=measured, measured_step_s=step,
               step_error_pct=None if pred is None or pred.step_seconds is None else error_pct(pred.step_seconds, step),
               run=run)
    return rec
