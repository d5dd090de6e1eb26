"""nvidia-smi: its static query and its -lms samples, read and parsed."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from typing import Any, Iterable

from bench.gpu.common import MiB

SMI_STATIC_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap", "clocks.max.sm")
SMI_SAMPLE_FIELDS = ("timestamp", "index", "utilization.gpu", "memory.used", "power.draw")
# Newer drivers also report both power readings; NVML's nvmlDeviceGetPowerUsage may be either.
SMI_OPTIONAL_SAMPLE_FIELDS = ("power.draw.instant", "power.draw.average")


def parse_smi_csv(text: str, fields: Iterable[str]) -> list[dict[str, str | None]]:
    """nvidia-smi --format=csv,noheader,nounits output -> one dict per line ('[N/A]' -> None)."""
    fields = list(fields)
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        rows.append({f: (None if p in ("[N/A]", "N/A", "[Not Supported]", "") else p) for f, p in zip(fields, parts)})
    return rows


def as_float(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def parse_smi_timestamp(text: str) -> float | None:
    """nvidia-smi's 'YYYY/MM/DD HH:MM:SS.fff' (local time) -> epoch seconds."""
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(text.strip(), fmt).timestamp()
        except ValueError:
            continue
    return None


def parse_smi_samples(text: str, fields: Iterable[str] = SMI_SAMPLE_FIELDS) -> list[dict]:
    """Lines of `nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw[,...]
    --format=csv,noheader,nounits -lms 1000` -> [{t, index, util, mem_used_mib, power_w, ...}]."""
    out = []
    for row in parse_smi_csv(text, fields):
        t = parse_smi_timestamp(row["timestamp"] or "")
        if t is None:
            continue
        sample = {"t": t, "index": int(as_float(row["index"]) or 0), "util": as_float(row["utilization.gpu"]),
                  "mem_used_mib": as_float(row["memory.used"]), "power_w": as_float(row["power.draw"])}
        for extra in SMI_OPTIONAL_SAMPLE_FIELDS:
            if extra in row:
                sample[extra.replace("power.draw.", "power_") + "_w"] = as_float(row[extra])
        out.append(sample)
    return out


def smi_static() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "rows": []}
    for fields in (SMI_STATIC_FIELDS, tuple(f for f in SMI_STATIC_FIELDS if f != "compute_cap")):
        try:
            r = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return {"available": False, "reason": "nvidia-smi took more than 30 s", "rows": []}
        if r.returncode == 0:
            return {"available": True, "reason": None, "fields": list(fields), "rows": parse_smi_csv(r.stdout, fields),
                    "raw": r.stdout.strip()}
        last = (r.stdout + r.stderr).strip()
    return {"available": False, "reason": f"nvidia-smi failed: {last[-300:]}", "rows": []}


def gpus_from_smi(rows: list[dict]) -> list[dict]:
    """Probe-style GPU entries from nvidia-smi rows: the fallback when the probe sees no GPU
    (nvidia-ml-py missing on the machine) but nvidia-smi does."""
    out = []
    for i, r in enumerate(rows):
        mem = as_float(r.get("memory.total"))
        if not r.get("name") or mem is None:
            continue
        cc = r.get("compute_cap")
        cc_pair = [int(x) for x in cc.split(".")] if cc and "." in cc else None
        out.append({"index": i, "name": r["name"], "memory_total": int(mem) * MiB, "compute_capability": cc_pair,
                    "uuid": r.get("uuid"), "nvml_index": int(as_float(r.get("index")) or i)})
    return out
