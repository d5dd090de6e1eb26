"""GPU health as NVML and the kernel report it, and the drivers compared across nodes: facts in, rows out (pure).

A GPU with uncorrectable memory errors, a row remap or page retirement waiting for a reset, or one that raised a
hardware XID while the preflight's collectives ran, corrupts or stops a training: a finding, with the node to drain
or exclude. Hardware XIDs earlier since boot, lifetime ECC errors and clocks slowed by heat or power are warnings:
the run starts, at the pace of its slowest GPU. What NVML cannot read on a GPU (an older part, a driver without the
call) is said, never guessed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from wizard.preflight.checks import FAIL, INFO, OK, WARN, Row

# NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors): the ones that mean the hardware (or its firmware), not
# the application. 13, 31, 43 and 45 (a kernel's exception, a page fault, a stopped or killed context) are the
# program's and are not findings.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 61: "micro-controller breakpoint", 62: "micro-controller halt",
    63: "ECC page retirement / row remap recorded", 64: "page retirement / row remap failed", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error",
    140: "unrecovered ECC error",
}
SLOWDOWNS = {"hw_slowdown": "hardware slowdown (power or heat)", "hw_thermal_slowdown": "hardware thermal slowdown",
             "sw_thermal_slowdown": "driver thermal slowdown", "hw_power_brake_slowdown": "power brake"}
DRAIN_FIX = ("exclude this node (srun/sbatch --exclude={host}) or drain it (`scontrol update nodename={host} "
             "state=drain reason=\"GPU health\"`) until the GPU is reset or serviced")
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:, (.*))?")


def parse_xids(lines: list[str]) -> list[dict[str, Any]]:
    """The XID records of kernel log lines: [{"pci": "0000:3b:00", "xid": 79, "text": ...}]."""
    out = []
    for line in lines:
        m = _XID_LINE.search(line)
        if m:
            out.append({"pci": m.group(1).lower(), "xid": int(m.group(2)), "text": (m.group(3) or "")[:160]})
    return out


def _pci_key(bus_id: str | None) -> str:
    """NVML's "00000000:3B:00.0" and the kernel's "0000:3b:00" as one key ("3b:00")."""
    parts = (bus_id or "").lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else ""


def _gpu_of_pci(gpus: list[dict[str, Any]], pci: str) -> str:
    key = _pci_key(pci)
    hit = next((g for g in gpus if _pci_key(g.get("pci_bus_id")) == key), None)
    return f"GPU {hit['index']}" if hit else f"the GPU at PCI {pci}"


def xid_row(node: int, host: str, during: list | None) -> Row | None:
    """The hardware XIDs NVML reported while the preflight's collectives ran ([[NVML index, XID]]): a GPU that fails
    under load."""
    seen = [(index, xid) for index, xid in during or [] if xid in HARDWARE_XIDS]
    if not seen:
        return None
    return Row(node, host, "GPU XID", FAIL, "; ".join(f"NVML GPU {index}: XID {xid} ({HARDWARE_XIDS[xid]})"
                                                      for index, xid in seen) + " during the preflight's collectives",
               DRAIN_FIX.format(host=host))


def health_row(node: int, host: str, facts: dict[str, Any]) -> Row | None:
    """One row per node with GPUs: the worst of its GPUs' health."""
    g = facts.get("gpus") or {}
    gpus = g.get("gpus") or []
    if not gpus:
        return None
    health = {h.get("index"): h for h in g.get("health") or [] if isinstance(h, dict)}
    fails, warns, unknown = [], [], []
    for gpu in gpus:
        h = health.get(gpu["index"])
        if h is None:
            unknown.append(str(gpu["index"]))
            continue
        who = f"GPU {gpu['index']}"
        if h.get("ecc_uncorrected_volatile"):
            fails.append(f"{who}: {h['ecc_uncorrected_volatile']} uncorrectable ECC errors since the driver loaded")
        if h.get("remap_failed"):
            fails.append(f"{who}: a memory row could not be remapped")
        if h.get("remap_pending"):
            fails.append(f"{who}: a row remap waits for a GPU reset")
        if h.get("retired_pending"):
            fails.append(f"{who}: a page retirement waits for a GPU reset")
        if h.get("ecc_uncorrected_aggregate") and not h.get("ecc_uncorrected_volatile"):
            warns.append(f"{who}: {h['ecc_uncorrected_aggregate']} uncorrectable ECC errors in its life")
        slow = [SLOWDOWNS[c] for c in h.get("clock_events") or [] if c in SLOWDOWNS]
        if slow:
            warns.append(f"{who}: clocks held down ({', '.join(slow)})")
    log = g.get("kernel_xids") or {}
    seen = Counter((x["pci"], x["xid"]) for x in log.get("xids") or [] if x.get("xid") in HARDWARE_XIDS)
    for (pci, xid), count in sorted(seen.items()):
        warns.append(f"{_gpu_of_pci(gpus, pci)}: XID {xid} ({HARDWARE_XIDS[xid]}) in the kernel log since boot"
                     + (f", {count} times" if count > 1 else ""))
    if fails:
        return Row(node, host, "GPU health", FAIL, "; ".join(fails + warns), DRAIN_FIX.format(host=host))
    if warns:
        return Row(node, host, "GPU health", WARN, "; ".join(warns),
                   "ask the cluster's admins to look at these GPUs (nvidia-smi -q); " + DRAIN_FIX.format(host=host))
    said = "kernel log: no hardware XID" if "xids" in log else \
        f"kernel log not read ({log.get('unreadable') or 'not asked'}): past XIDs unknown"
    if unknown:
        return Row(node, host, "GPU health", INFO, f"NVML gave no health for GPU {', '.join(unknown)}; {said}")
    return Row(node, host, "GPU health", OK, f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: no uncorrectable ECC "
               f"error, nothing waiting for a reset, clocks not held down; {said}")


def _major(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def driver_rows(per_node: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[Row]:
    """Each GPU node's driver beside the CUDA its torch was built for (a torch built for a newer CUDA major than the
    driver supports cannot initialise CUDA), and the drivers compared across nodes: a node whose driver differs
    from most is named (NCCL's behaviour and its bugs follow the driver)."""
    drivers = {n: ((f.get("gpus") or {}).get("driver"), (f.get("gpus") or {}).get("cuda"))
               for n, f in per_node.items() if (f.get("gpus") or {}).get("gpus")}
    rows = []
    for node, (driver, cuda) in sorted(drivers.items()):
        built = ((per_node[node].get("versions") or {}).get("torch_cuda"))
        if _major(built) is not None and _major(cuda) is not None and _major(built) > _major(cuda):
            rows.append(Row(node, hosts.get(node, "?"), "driver", FAIL,
                            f"driver {driver} supports CUDA {cuda}; this node's torch is built for CUDA {built}: it "
                            "cannot initialise CUDA", f"a driver for CUDA {built} or newer, or a torch built for "
                            f"CUDA {cuda}"))
    if len(set(drivers.values())) > 1:
        common, _ = Counter(drivers.values()).most_common(1)[0]
        for node, pair in sorted(drivers.items()):
            if pair != common:
                rows.append(Row(node, hosts.get(node, "?"), "driver", WARN,
                                f"driver {pair[0]} (CUDA {pair[1]}); {sum(1 for p in drivers.values() if p == common)}"
                                f" of {len(drivers)} nodes have {common[0]} (CUDA {common[1]})",
                                "one driver on every node of a run (the cluster image)"))
    return rows
