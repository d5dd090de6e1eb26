"""The memory cases: one train_one.py subprocess per configuration, its measured peak against the
wizard's prediction, and whether the fit decision was right."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from bench.gpu.cases import CaseSpec, Planner, Prediction
from bench.gpu.common import HERE
from bench.gpu.runner import Options, child_env, free_port, keep_tail, parse_result_line, run_child


def error_pct(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured in percent: positive means the wizard over-estimates."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured * 100.0


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
                  dry_run: bool, nvml_index: int | None) -> list[str]:
    """bench/gpu/train_one.py for one case; a dry run trains a tiny model of the same kind on the CPU."""
    seq, mb = (32, min(spec.micro_batch, 2)) if dry_run else (spec.seq_len, spec.micro_batch)
    cmd = [sys.executable, str(HERE / "train_one.py"), "--model-dir", model_dir, "--seq-len", str(seq),
           "--micro-batch", str(mb), "--steps", str(steps), "--gc", "on" if spec.gc else "off",
           "--output-dir", str(case_dir / "out")]
    if ds_config is not None:
        cmd += ["--ds-config", str(ds_config)]
    if dry_run:
        cmd += ["--device", "cpu", "--tiny"]
    elif nvml_index is not None:
        cmd += ["--nvml-index", str(nvml_index)]
    return cmd


def run_case(spec: CaseSpec, number: int, planner: Planner, opts: Options, work: Path,
             nvml_index: int | None, timeout: float) -> dict[str, Any]:
    case_dir = work / f"case-{number}"
    case_dir.mkdir(parents=True, exist_ok=True)
    ds_text = planner.ds_config_text(spec)
    ds_path = None
    if ds_text:
        ds_path = case_dir / "ds_config.json"
        ds_path.write_text(ds_text)
    cmd = train_command(spec, planner.model_dirs[spec.model], opts.steps, case_dir, ds_path, opts.dry_run,
                        nvml_index)
    env = child_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "4"})
    child = run_child(cmd, env, timeout, log_path=case_dir / "stderr.log")
    keep_tail(case_dir / "stderr.log", opts.results_dir / f"case-{number}-stderr.log")
    result = parse_result_line(child["lines"])
    out: dict[str, Any] = {"wall_s": child["wall_s"], "returncode": child["returncode"]}
    if child["timed_out"] and result is None:
        out.update(status="timeout", error=f"no result within {timeout:.0f} s")
    elif result is None:
        tail = (case_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
        out.update(status="crash", error=f"exit {child['returncode']} without a result line", stderr_tail=tail)
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
                   decision=verdict, decision_why=why)
    rec.update(status=status, measured_bytes=measured, run=run)
    return rec
