"""The probe step: `wizard probe --json`, pynvml read directly and nvidia-smi, compared field by
field; and the hardware to plan for (--assume, the probe, or its host with nvidia-smi's / torch's GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.gpu.common import REPO, MiB
from bench.gpu.smi import as_float, gpus_from_smi


def cc_text(cc: Any) -> str | None:
    if cc is None:
        return None
    if isinstance(cc, (list, tuple)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    return str(cc)


def _same(a: Any, b: Any, tolerance: float = 0.0) -> bool | None:
    """None when either side is missing (nothing to compare), else equal within tolerance."""
    if a is None or b is None:
        return None
    na, nb = as_float(a), as_float(b)
    if na is not None and nb is not None:
        return abs(na - nb) <= tolerance
    return str(a).strip() == str(b).strip()


def compare_probe(probe: dict | None, nvml: dict, smi_rows: list[dict]) -> list[dict]:
    """One row per GPU and field: the probe's value, pynvml's, nvidia-smi's, and whether they agree.

    GPUs are matched by UUID (else NVML index). Memory in MiB (1 MiB tolerance: nvidia-smi rounds
    down), compute capability as 'major.minor', the max SM clock in MHz (pynvml vs nvidia-smi only:
    the probe does not read clocks).
    """
    rows: list[dict] = []
    gpus = (probe or {}).get("gpus") or []
    nvml_gpus = nvml.get("gpus") or []
    targets = gpus or [{"nvml_index": g.get("index"), "uuid": g.get("uuid")} for g in nvml_gpus]
    for g in targets:
        idx = g.get("nvml_index", g.get("index"))
        uuid = g.get("uuid")
        n = next((x for x in nvml_gpus if uuid and x.get("uuid") == uuid), None) or \
            next((x for x in nvml_gpus if x.get("index") == idx), {})
        s = next((x for x in smi_rows if uuid and x.get("uuid") == uuid), None) or \
            next((x for x in smi_rows if as_float(x.get("index")) == idx), {})
        mem = lambda b: None if b is None else int(b) // MiB  # noqa: E731
        fields = [
            ("name", g.get("name"), n.get("name"), s.get("name"), 0.0),
            ("memory.total MiB", mem(g.get("memory_total")), mem(n.get("memory_total")), s.get("memory.total"), 1.0),
            ("compute capability", cc_text(g.get("compute_capability")), cc_text(n.get("compute_capability")),
             s.get("compute_cap"), 0.0),
            ("driver", (probe or {}).get("driver_version") if gpus else None, nvml.get("driver_version"),
             s.get("driver_version"), 0.0),
            ("clocks.max.sm MHz", None, n.get("clocks_max_sm_mhz"), s.get("clocks.max.sm"), 0.0),
        ]
        for name, pv, nv, sv, tol in fields:
            present = [v for v in (pv, nv, sv) if v is not None]
            checks = [_same(a, b, tol) for a, b in ((pv, nv), (pv, sv), (nv, sv))]
            checks = [c for c in checks if c is not None]
            rows.append({"gpu": idx, "field": name, "probe": pv, "pynvml": nv, "nvidia_smi": sv,
                         "ok": (all(checks) if checks else None) if len(present) >= 2 else None})
    return rows


def run_probe(env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    try:
        r = subprocess.run([sys.executable, "-m", "wizard", "probe", "--json"], capture_output=True, text=True,
                           env=env, cwd=str(REPO), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"wizard probe --json took more than {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": f"wizard probe --json exited {r.returncode}: {r.stderr.strip()[-500:]}"}
    try:
        return {"hardware": json.loads(r.stdout)}
    except ValueError as exc:
        return {"error": f"wizard probe --json printed no JSON: {exc}"}


def nvml_direct() -> dict[str, Any]:
    """pynvml itself, independently of wizard/probe/nvml.py: what the driver says, to compare with both."""
    out: dict[str, Any] = {"available": False, "reason": None, "gpus": []}
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:
        out["reason"] = f"{type(exc).__name__}: {exc}"
        return out

    def call(fn, *a):
        try:
            v = fn(*a)
            return v.decode() if isinstance(v, bytes) else v
        except Exception:
            return None

    try:
        out["available"] = True
        out["driver_version"] = call(pynvml.nvmlSystemGetDriverVersion)
        cuda = call(pynvml.nvmlSystemGetCudaDriverVersion)
        out["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = call(pynvml.nvmlDeviceGetMemoryInfo, h)
            cc = call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            sm = getattr(pynvml, "NVML_CLOCK_SM", 1)
            memclk = getattr(pynvml, "NVML_CLOCK_MEM", 2)
            limit = call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            out["gpus"].append({
                "index": i, "name": call(pynvml.nvmlDeviceGetName, h), "uuid": call(pynvml.nvmlDeviceGetUUID, h),
                "memory_total": int(mem.total) if mem is not None else None,
                "memory_used": int(mem.used) if mem is not None else None,
                "compute_capability": list(cc) if cc else None,
                "clocks_max_sm_mhz": call(pynvml.nvmlDeviceGetMaxClockInfo, h, sm),
                "clocks_max_mem_mhz": call(pynvml.nvmlDeviceGetMaxClockInfo, h, memclk),
                "clocks_sm_mhz": call(pynvml.nvmlDeviceGetClockInfo, h, sm),
                "power_limit_w": limit / 1000 if isinstance(limit, (int, float)) else None,
            })
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def gpus_from_torch(torch_cuda: dict | None) -> list[dict]:
    """Probe-style GPU entries from torch's device properties: the last fallback."""
    return [{"index": i, "name": d["name"], "memory_total": int(d["total_memory"]),
             "compute_capability": d.get("capability"), "nvml_index": i}
            for i, d in enumerate((torch_cuda or {}).get("devices") or [])]


def load_hardware(probe: dict, assume: str | None, smi_rows: list[dict] | None = None,
                  torch_cuda: dict | None = None):
    """(Hardware, where it came from): --assume, else the probe, else the probe's host with
    nvidia-smi's (or torch's) GPUs; (None, why) when there is nothing to plan for."""
    from wizard.probe import hardware
    if assume:
        return hardware.assume(assume), f"assumed: {assume}"
    data = probe.get("hardware")
    if data and data.get("gpus"):
        return hardware.from_json(data, source="probe"), "probe"
    for name, fallback in (("nvidia-smi", gpus_from_smi(smi_rows or [])), ("torch", gpus_from_torch(torch_cuda))):
        if data and fallback:
            return (hardware.from_json({**data, "gpus": fallback}, source=f"probe+{name}"),
                    f"probe's host with {name}'s GPUs (the probe saw none: {data.get('gpu_reason')})")
    return None, probe.get("error") or (data or {}).get("gpu_reason") or "no probe"
