"""The preflight on a real GPU (issue 41): what a CPU box cannot show.

    python bench/gpu/preflight_check.py [--out $OUT/preflight-<date>.md] [--dry-run-cpu] [--budget-s 150]

1. Health: each GPU's health as the wizard reads it through NVML (wizard/probe/nvml.py: ECC errors, retired pages,
   remapped rows, clock event reasons) beside nvidia-smi's own answer for the same fields (`--query-gpu`, one
   field at a time: a field this driver lacks is said, the rest still compared); every field matched or MISMATCH.
2. The collectives on NCCL: `python -m wizard.preflight.collective --backend nccl` on the GPUs: with two or more,
   one process per GPU (the real within-node figures: all-reduce, all-gather, reduce-scatter, all-to-all at
   three sizes, data checked, NVML's XID events watched); with one GPU (NCCL takes one rank per GPU) one process
   with --selftest: every operation's code path and data check on the device, no bandwidth.
3. `wizard preflight --json` end to end on a config of one process per GPU: the rows a user would see, with the
   real NVML, the real /dev/shm and limits, and (two or more GPUs) the collectives through the preflight.
Each part writes its result into the report at once; a part that fails or is missing says why.
--dry-run-cpu runs the same on this CPU box (fake NVML, gloo), for the script's own test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# GpuHealth field -> nvidia-smi --query-gpu field(s), the first this driver knows
SMI_HEALTH = {
    "ecc_enabled": ("ecc.mode.current",),
    "ecc_uncorrected_volatile": ("ecc.errors.uncorrected.volatile.total",),
    "ecc_uncorrected_aggregate": ("ecc.errors.uncorrected.aggregate.total",),
    "ecc_corrected_volatile": ("ecc.errors.corrected.volatile.total",),
    "retired_pending": ("retired_pages.pending",),
    "remapped_correctable": ("remapped_rows.correctable",),
    "remapped_uncorrectable": ("remapped_rows.uncorrectable",),
    "remap_pending": ("remapped_rows.pending",),
    "remap_failed": ("remapped_rows.failure",),
    "clock_events": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
}


def smi_value(field: str, text: str | None) -> Any:
    """One nvidia-smi answer as the wizard's field holds it (None: not supported / N/A)."""
    if text is None:
        return None
    t = text.strip()
    if t in ("", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]"):
        return None
    if field == "ecc_enabled":
        return t.lower() == "enabled"
    if field in ("retired_pending", "remap_pending", "remap_failed"):
        return t.lower() in ("yes", "1", "true")
    if field == "clock_events":
        from wizard.probe.nvml_api import clock_event_names
        return clock_event_names(int(t, 16))
    try:
        return int(t)
    except ValueError:
        return t


def smi_health(count: int) -> dict[str, list[Any]]:
    """field -> one value per GPU, from nvidia-smi (each field queried alone: one this driver lacks fails alone)."""
    out: dict[str, list[Any]] = {}
    if not shutil.which("nvidia-smi"):
        return out
    for field, names in SMI_HEALTH.items():
        for name in names:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={name}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                values = [smi_value(field, line) for line in r.stdout.splitlines() if line.strip()]
                out[field] = values[:count] + [None] * (count - len(values))
                break
    return out


def compare_health(wizard: list[dict[str, Any]], smi: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """One row per GPU and field: the wizard's value, nvidia-smi's, and whether they agree (None: one side
    cannot say)."""
    rows = []
    for h in wizard:
        i = h["index"]
        for field in SMI_HEALTH:
            mine, theirs = h.get(field), (smi.get(field) or [None] * (i + 1))[i] if field in smi else None
            if field == "clock_events" and mine is not None:
                mine = tuple(mine)
            ok = None if mine is None or theirs is None else mine == theirs
            rows.append({"gpu": i, "field": field, "wizard": mine, "nvidia_smi": theirs, "ok": ok})
    return rows


def run(cmd: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-4000:],
                "wall_s": round(time.monotonic() - start, 1)}
    except subprocess.TimeoutExpired as exc:
        return {"rc": None, "stdout": exc.stdout or "", "stderr": f"timed out after {timeout:.0f} s",
                "wall_s": round(time.monotonic() - start, 1)}


def collective_cmd(gpus: int, backend: str, nbytes: int, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "wizard.preflight.collective", "--addr", "127.0.0.1", "--port", str(port),
           "--nodes", "1", "--node", "0", "--local", str(max(1, gpus)), "--backend", backend,
           "--nbytes", str(nbytes), "--timeout", "60"]
    return cmd + (["--selftest"] if gpus < 2 else [])


def last_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and "result" in msg:
            return msg["result"]
    return None


def config(tmp: Path, gpus: int, cpu: bool) -> Path:
    cfg = tmp / "one-node.yaml"
    kind = "MULTI_CPU" if cpu else ("MULTI_GPU" if gpus > 1 else "'NO'")
    cfg.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nnum_machines: 1\n"
                   f"num_processes: {max(1, gpus)}\nmachine_rank: 0\nmixed_precision: 'no'\n"
                   f"use_cpu: {'true' if cpu else 'false'}\ngpu_ids: all\n")
    return cfg


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# The preflight on {report['meta']['gpu'] or 'no GPU'} ({report['meta']['mode']}, "
             f"{report['meta']['date']})", ""]
    rows = report.get("health_comparison") or []
    lines += ["## GPU health: the wizard (NVML) beside nvidia-smi", "",
              "| GPU | field | wizard | nvidia-smi | agree |", "|---|---|---|---|---|"]
    lines += [f"| {r['gpu']} | {r['field']} | {r['wizard']} | {r['nvidia_smi']} | "
              f"{'yes' if r['ok'] else 'MISMATCH' if r['ok'] is False else 'n/a'} |" for r in rows]
    c = report.get("collective") or {}
    lines += ["", f"## Collectives ({c.get('backend')}, {c.get('processes')} process(es), {c.get('wall_s')} s)", ""]
    res = c.get("result") or {}
    if res.get("error") or not res:
        lines.append(f"failed: {res.get('error') or c.get('stderr', '')[-500:]}")
    for scope, s in (res.get("scopes") or {}).items():
        for op, runs in (s.get("ops") or {}).items():
            for r in runs:
                lines.append(f"- {scope} {op} {r.get('bytes')} B: bus bandwidth {r.get('busbw_gbps')} Gb/s "
                             f"({r.get('low_gbps')}-{r.get('high_gbps')}), check {r.get('check') or r.get('unsupported')}")
    lines.append(f"- XID events during the run: {res.get('xids')}")
    p = report.get("preflight") or {}
    lines += ["", f"## wizard preflight --json (exit {p.get('rc')}, {p.get('wall_s')} s)", ""]
    for row in (p.get("doc") or {}).get("rows") or []:
        lines.append(f"- {row['status'].upper():4s} {row['check']}: {row['detail']}")
    lines.append((p.get("doc") or {}).get("verdict") or p.get("stderr", "")[-500:])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/gpu/preflight_check.py")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dry-run-cpu", action="store_true")
    ap.add_argument("--budget-s", type=float, default=150.0)
    a = ap.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = a.out or Path(os.environ.get("OUT") or REPO / "bench" / "results") / f"preflight-{stamp}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"]
                                                   if os.environ.get("PYTHONPATH") else "")}
    if a.dry_run_cpu:
        env["WIZARD_FAKE_NVML"] = "1xH200"
        os.environ["WIZARD_FAKE_NVML"] = "1xH200"
    report: dict[str, Any] = {"meta": {"date": stamp, "mode": "dry run on the CPU" if a.dry_run_cpu else "GPU"}}

    def save() -> None:
        out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
        out.write_text(markdown(report))
    start = time.monotonic()
    from dataclasses import asdict

    from wizard.probe.nvml import open_nvml
    from wizard.probe.ports import free_port
    api = open_nvml()
    try:
        devices = api.devices()
        health = [asdict(h) for h in api.health()]
    finally:
        api.close()
    report["meta"]["gpu"] = ", ".join(sorted({d.name for d in devices})) or None
    report["health"] = health
    report["health_comparison"] = compare_health(health, {} if a.dry_run_cpu else smi_health(len(devices)))
    save()
    gpus = 0 if a.dry_run_cpu else len(devices)
    backend = "gloo" if a.dry_run_cpu else "nccl"
    left = a.budget_s - (time.monotonic() - start)
    c = run(collective_cmd(gpus, backend, (16 << 20) if a.dry_run_cpu else (256 << 20), free_port()),
            max(30.0, left / 2), env)
    report["collective"] = {"backend": backend, "processes": max(1, gpus), "wall_s": c["wall_s"], "rc": c["rc"],
                            "stderr": c["stderr"], "result": last_result(c["stdout"])}
    save()
    work = Path(tempfile.mkdtemp(prefix="wizard-preflight-bench-"))
    try:
        left = a.budget_s - (time.monotonic() - start)
        p = run([sys.executable, "-m", "wizard", "preflight", "--config-file",
                 str(config(work, gpus, a.dry_run_cpu)), "--json"], max(30.0, left), env)
        try:
            doc = json.loads(p["stdout"]) if p["stdout"].strip() else None
        except ValueError:
            doc = None
        report["preflight"] = {"rc": p["rc"], "wall_s": p["wall_s"], "stderr": p["stderr"], "doc": doc}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["meta"]["elapsed_s"] = round(time.monotonic() - start, 1)
    save()
    print(f"[preflight_check] wrote {out} and {out.with_suffix('.json')} in {report['meta']['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
