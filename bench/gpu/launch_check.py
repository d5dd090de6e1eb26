"""The launcher check: `wizard launch --headless` on one case with nvidia-smi sampling beside it,
and the launcher's metrics.jsonl compared with nvidia-smi, sample by sample, aligned in time."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.gpu.cases import CaseSpec, Planner
from bench.gpu.common import DRY_RUN_FAKE_NVML, HERE, MiB
from bench.gpu.runner import Options, child_env, kill_group, parse_result_line, run_child
from bench.gpu.smi import SMI_OPTIONAL_SAMPLE_FIELDS, SMI_SAMPLE_FIELDS, parse_smi_csv, parse_smi_samples

# "Within a few percent" (issue 6), made concrete: mean absolute differences over aligned samples.
METRIC_THRESHOLDS = {"util_pp": 5.0, "mem_pct": 2.0, "power_pct": 5.0}


def load_metrics_jsonl(path: Path, index: int) -> list[dict]:
    """The launcher's metrics.jsonl for one NVML index, in the units nvidia-smi prints."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if not sample.get("available"):
            continue
        for g in sample.get("gpus") or []:
            if g.get("index") != index:
                continue
            mem = g.get("mem_used")
            out.append({"t": float(sample["t"]), "index": index, "util": g.get("util"),
                        "mem_used_mib": None if mem is None else mem / MiB, "power_w": g.get("power_w")})
    return out


def align(reference: list[dict], measured: list[dict], max_dt: float = 0.6) -> list[tuple[dict, dict, float]]:
    """Pairs (reference, nearest measured sample, |dt|) for each reference sample with a measured one
    within max_dt seconds; each measured sample used at most once."""
    pairs = []
    used: set[int] = set()
    ordered = sorted(range(len(measured)), key=lambda i: measured[i]["t"])
    for ref in sorted(reference, key=lambda r: r["t"]):
        best, best_dt = None, None
        for i in ordered:
            if i in used:
                continue
            d = abs(measured[i]["t"] - ref["t"])
            if best_dt is None or d < best_dt:
                best, best_dt = i, d
        if best is not None and best_dt <= max_dt:
            used.add(best)
            pairs.append((ref, measured[best], best_dt))
    return pairs


def metric_diffs(pairs: list[tuple[dict, dict, float]]) -> dict[str, Any]:
    """Mean absolute differences: util in percentage points, memory and power in units and in percent
    of nvidia-smi's value."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    util = [abs(m["util"] - r["util"]) for r, m, _ in pairs if r["util"] is not None and m["util"] is not None]
    mem = [(abs(m["mem_used_mib"] - r["mem_used_mib"]), r["mem_used_mib"]) for r, m, _ in pairs
           if r["mem_used_mib"] is not None and m["mem_used_mib"] is not None]
    power = [(abs(m["power_w"] - r["power_w"]), r["power_w"]) for r, m, _ in pairs
             if r["power_w"] is not None and m["power_w"] is not None]
    extra = {}
    for key in ("power_instant_w", "power_average_w"):
        # Which nvidia-smi power reading NVML's power_w matches (when the driver reports both).
        alt = [abs(m["power_w"] - r[key]) / r[key] * 100 for r, m, _ in pairs
               if r.get(key) and m["power_w"] is not None]
        if alt:
            extra[key.replace("_w", "_pct")] = mean(alt)
    # For information (shared/gpu/2026-12-04, issue 28): NVML's utilisation is a mean over the driver's last sample
    # period, so two readers 70 ms apart disagree most where the GPU starts or stops work; "steady" leaves out the
    # pairs whose nvidia-smi reading differs by more than 20 pp from its neighbour's. The memory percentage over the
    # pairs where nvidia-smi shows at least 1 GiB, the per-cent of a few MiB being no measure of agreement.
    ordered = sorted(pairs, key=lambda p: p[0]["t"])
    steady = []
    for i, (r, m, _) in enumerate(ordered):
        if r["util"] is None or m["util"] is None:
            continue
        around = [ordered[j][0]["util"] for j in (i - 1, i + 1) if 0 <= j < len(ordered)]
        if all(a is not None and abs(a - r["util"]) <= 20 for a in around):
            steady.append(abs(m["util"] - r["util"]))
    return {
        **extra,
        "util_pp_steady": mean(steady), "util_pairs_steady": len(steady),
        "mem_pct_busy": mean([d / ref * 100 for d, ref in mem if ref >= 1024]),
        "pairs": len(pairs),
        "mean_dt_s": mean([d for _, _, d in pairs]),
        "util_pp": mean(util),
        "mem_mib": mean([d for d, _ in mem]),
        "mem_pct": mean([d / ref * 100 for d, ref in mem if ref > 0]),
        "power_w": mean([d for d, _ in power]),
        "power_pct": mean([d / ref * 100 for d, ref in power if ref > 0]),
        "util_pairs": len(util), "mem_pairs": len(mem), "power_pairs": len(power),
    }


def metrics_verdict(diffs: dict[str, Any], thresholds: dict[str, float] = METRIC_THRESHOLDS) -> dict[str, Any]:
    out = {}
    for key, limit in thresholds.items():
        value = diffs.get(key)
        out[key] = None if value is None else bool(value <= limit)
    return out


def run_launch(spec: CaseSpec, planner: Planner, opts: Options, work: Path, results_dir: Path,
               nvml_index: int, timeout: float) -> dict[str, Any]:
    """`wizard launch --headless` on one case, nvidia-smi (or, in a dry run, the fake NVML) beside it."""
    run_dir = work / "launch-run"
    cfg = work / "launch_config.yaml"
    if opts.dry_run:
        cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\n"
                       "num_processes: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\n")
    else:
        cfg.write_text(planner.accelerate_yaml(spec) or "")
    script_args = ["--model-dir", planner.model_dirs[spec.model], "--steps", "100000",
                   "--max-seconds", str(opts.launch_seconds), "--gc", "on" if spec.gc else "off",
                   "--output-dir", str(work / "launch-out")]
    if opts.dry_run:
        script_args += ["--device", "cpu", "--tiny", "--seq-len", "32", "--micro-batch", "2"]
    else:
        script_args += ["--seq-len", str(spec.seq_len), "--micro-batch", str(spec.micro_batch),
                        "--nvml-index", str(nvml_index)]
    cmd = [sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg), "--run-dir",
           str(run_dir), "--metrics-interval", "1", "--grace", "5", "--status-interval", "10", "--",
           str(HERE / "train_one.py"), *script_args]
    extra = {"WIZARD_FAKE_NVML": DRY_RUN_FAKE_NVML} if opts.dry_run else {}
    env = child_env(extra)
    env.pop("RANK", None)
    ref_path = results_dir / "launch-nvidia-smi.csv"
    ref = ReferenceSampler(ref_path, fake=opts.dry_run, index=nvml_index)
    ref.start()
    try:
        # grace: the supervisor ends its workers on SIGTERM (its own --grace 5) before it exits
        child = run_child(cmd, env, timeout, log_path=results_dir / "launch-stderr.log", grace=15.0)
    finally:
        ref.stop()
    out: dict[str, Any] = {"case": spec.label(), "returncode": child["returncode"], "timed_out": child["timed_out"],
                           "wall_s": child["wall_s"], "reference": ref.description, "reference_error": ref.error,
                           "reference_fields": list(ref.fields),
                           "stdout_tail": [line.rstrip() for line in child["lines"][-15:]]}
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        shutil.copy(metrics, results_dir / "launch-metrics.jsonl")
    try:
        state = json.loads((run_dir / "run.json").read_text())
        out["run_status"] = state.get("status")
        out["run_exit_code"] = state.get("exit_code")
    except (OSError, ValueError):
        out["run_status"] = None
    result = parse_result_line(child["lines"])
    if result is None:
        log = run_dir / "logs" / "attempt-1" / "rank-0.log"
        if log.exists():
            result = parse_result_line(log.read_text(errors="replace").splitlines())
    out["train"] = result
    reference = parse_smi_samples(ref_path.read_text(), ref.fields) if ref_path.exists() else []
    measured = load_metrics_jsonl(metrics, nvml_index)
    pairs = align(reference, measured)
    diffs = metric_diffs(pairs)
    out.update(reference_samples=len(reference), metrics_samples=len(measured), diffs=diffs,
               verdict=metrics_verdict(diffs), thresholds=METRIC_THRESHOLDS)
    return out


class ReferenceSampler:
    """nvidia-smi -lms 1000 in the background (its CSV straight to a file). In a dry run there is no
    nvidia-smi: a thread writes the same CSV from the fake NVML, so the parsing and alignment are
    exercised, and the report says the reference was fake."""

    def __init__(self, path: Path, fake: bool, index: int):
        self.path = path
        self.fake = fake
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.file = None
        self.fields: tuple[str, ...] = SMI_SAMPLE_FIELDS
        self.description = "fake NVML sampled by the driver (dry run: no nvidia-smi)" if fake else None

    def _accepted_fields(self, exe: str) -> tuple[str, ...]:
        """The sample fields plus the optional power readings when this nvidia-smi knows them."""
        wanted = SMI_SAMPLE_FIELDS + SMI_OPTIONAL_SAMPLE_FIELDS
        try:
            r = subprocess.run([exe, f"--query-gpu={','.join(wanted)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and parse_smi_csv(r.stdout, wanted):
                return wanted
        except subprocess.TimeoutExpired:
            pass
        return SMI_SAMPLE_FIELDS

    def start(self) -> None:
        self.file = open(self.path, "w")
        if self.fake:
            self.thread = threading.Thread(target=self._fake_loop, daemon=True)
            self.thread.start()
            return
        exe = shutil.which("nvidia-smi")
        if not exe:
            self.error = "nvidia-smi not found"
            self.description = "none"
            return
        self.fields = self._accepted_fields(exe)
        cmd = [exe, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits", "-lms", "1000"]
        self.description = " ".join(cmd[1:])
        stdbuf = shutil.which("stdbuf")      # line-buffered into the file, so a stop loses no sample
        self.proc = subprocess.Popen(([stdbuf, "-oL"] if stdbuf else []) + cmd, stdout=self.file,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def _fake_loop(self) -> None:
        from wizard.probe.fake_nvml import fake_from_spec
        api = fake_from_spec(DRY_RUN_FAKE_NVML)
        while not self.stop_event.is_set():
            now = dt.datetime.now()
            for s in api.sample():
                stamp = now.strftime("%Y/%m/%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"
                self.file.write(f"{stamp}, {s.index}, {s.util}, {s.mem_used // MiB}, {s.power_w:.2f}\n")
                self.file.flush()
            self.stop_event.wait(1.0)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(timeout=3)
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)     # nvidia-smi's own clean stop (flushes)
                self.proc.wait(timeout=3)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
            kill_group(self.proc, grace=2)
        if self.file:
            self.file.close()
