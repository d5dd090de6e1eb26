"""One node's facts, gathered by the node's own interpreter: `python -m wizard.preflight.node --main-host H
[--path P ...] [--checkpoint-dir D] [--timeout S]` prints one JSON object.

It runs as a child of `wizard preflight` (which kills it past its deadline) with the environment the launch would
give the training, so the versions are those the node's training would import: the module `find_spec` locates
first on this interpreter's sys.path (PYTHONPATH, a virtualenv, user site) and the distribution installed beside it,
never a package that merely exists elsewhere. Nothing heavy is imported: torch's version and CUDA come from its
version.py, read as text. Each fact is gathered in a thread with its own deadline: one that hangs (NVML on a
wedged driver, statvfs on a stale NFS mount, a DNS server that never answers) is recorded as {"timeout": S}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
from typing import Any, Callable

from wizard.preflight.checks import PACKAGES


def with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """fn()'s value, or {"timeout": seconds} when it has not returned by then (the thread is abandoned: a daemon,
    it dies with this process), or {"error": text} when it raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except Exception as exc:                 # a fact that fails is a finding, not a crash of the probe
            box["value"] = {"error": f"{type(exc).__name__}: {exc}"}
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return box["value"] if "value" in box else {"timeout": seconds}


# ----------------------------------------------------------------------------- versions


def imported_version(module: str, dist: str) -> dict[str, Any]:
    """The version of `module` as this interpreter would import it: where find_spec locates it (without running
    it), and the version of the distribution whose metadata sits beside that location (a .dist-info in the same
    directory, which is what pip and a PYTHONPATH install leave). {"version": None} when it is not importable."""
    import importlib.util
    from importlib import metadata
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not (spec.origin or spec.submodule_search_locations):
        return {"version": None}
    origin = spec.origin if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations)[0]
    pkg_dir = os.path.dirname(origin) if os.path.basename(origin) == "__init__.py" else origin
    site = os.path.dirname(pkg_dir)
    version = None
    wanted = dist.lower().replace("-", "_")
    for d in metadata.distributions(path=[site]):
        name = (d.metadata.get("Name") or "").lower().replace("-", "_")
        if name == wanted:
            version = d.version
            break
    if version is None:                          # an editable or odd install: the first one on sys.path
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
    return {"version": version, "path": pkg_dir}


def torch_build(path: str | None) -> tuple[str | None, str | None]:
    """(torch's __version__, the CUDA it was built with) from torch/version.py, read as text: importing torch takes
    seconds and is the collective's job."""
    if not path:
        return None, None
    try:
        text = open(os.path.join(path, "version.py"), encoding="utf-8").read()
    except OSError:
        return None, None
    import re
    ver = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]+)", text, re.M)
    return (ver.group(1) if ver else None), (cuda.group(1) if cuda else None)


def nccl_version() -> str | None:
    """The NCCL torch loads on a CUDA build: the nvidia-nccl-cu* wheel beside it (torch's own NCCL is reported by
    the collective child, which imports torch anyway)."""
    from importlib import metadata
    for d in metadata.distributions():
        name = (d.metadata.get("Name") or "").lower()
        if name.startswith("nvidia-nccl-cu"):
            return d.version
    return None


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable}
    for dist, module in PACKAGES.items():
        out[dist] = imported_version(module, dist)
    ver, cuda = torch_build(out["torch"].get("path"))
    if ver and not out["torch"].get("version"):
        out["torch"]["version"] = ver
    out["torch_cuda"] = cuda
    out["nccl"] = nccl_version() if cuda else None
    return out


# ----------------------------------------------------------------------------- GPUs, limits, network


def gpus() -> dict[str, Any]:
    """Through the NVML interface (the fake one where WIZARD_FAKE_NVML is set), as `wizard probe` reads them, with
    each GPU's health (health.py judges it) and the XID errors the kernel log holds since boot."""
    from wizard.probe import hardware
    from wizard.probe.catalogue import match_device
    hw = hardware.Hardware(source="probe")
    hardware._probe_gpus(hw)
    consumer = any(getattr(match_device(g.name, g.memory_total), "consumer", False) for g in hw.gpus)
    out = {"gpus": [{"index": g.index, "name": g.name, "memory_total": g.memory_total, "memory_free": g.memory_free,
                     "pci_bus_id": g.pci_bus_id} for g in hw.gpus],
           "driver": hw.driver_version, "cuda": hw.cuda_version, "nvlink": hw.nvlink, "p2p": hw.p2p,
           "consumer": consumer, "reason": hw.gpu_reason}
    if hw.gpus:
        out["health"] = gpu_health({g.nvml_index: g.index for g in hw.gpus if g.nvml_index is not None})
        out["kernel_xids"] = kernel_xids()
    return out


def gpu_health(cuda_index_of: dict[int, int]) -> list[dict[str, Any]]:
    """NVML's health of the GPUs the training sees, by their CUDA index."""
    from dataclasses import asdict

    from wizard.probe.nvml import open_nvml
    api = open_nvml()
    try:
        out = []
        for h in api.health():
            if h.index in cuda_index_of:
                entry = asdict(h)
                entry["index"] = cuda_index_of[h.index]
                entry["clock_events"] = list(h.clock_events) if h.clock_events is not None else None
                out.append(entry)
        return out
    finally:
        api.close()


KMSG = "/dev/kmsg"
KMSG_MAX_RECORDS = 200_000


def kernel_xids(path: str | None = None) -> dict[str, Any]:
    """The NVIDIA driver's XID lines in the kernel log since boot (health.parse_xids reads them); {"unreadable":
    why} where this user may not read it (kernel.dmesg_restrict, a container)."""
    from wizard.preflight.health import parse_xids
    path = path or KMSG
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return {"unreadable": f"{path}: {exc.strerror or exc}"}
    lines = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:          # the end of the buffer
                break
            except OSError as exc:
                if exc.errno == 32:          # EPIPE: records overwritten while reading; go on from the next
                    continue
                break
            if not record:
                break
            text = record.decode("utf-8", "replace")
            if "Xid" in text:
                lines.append(text.split(";", 1)[-1].strip())
    finally:
        os.close(fd)
    return {"xids": parse_xids(lines)}


def limits(paths: list[str], checkpoint_dir: str | None = None, shm_path: str = "/dev/shm") -> dict[str, Any]:
    import shutil

    import psutil

    from wizard.check.rules.deepspeed_json import memlock_limit
    from wizard.probe.hardware import cgroup_memory
    vm = psutil.virtual_memory()
    total, avail = int(vm.total), int(vm.available)
    capped = cgroup_memory()
    if capped and capped[0] < total:            # a SLURM job's --mem, a container's limit
        total, avail = capped[0], max(0, min(avail, capped[0] - capped[1]))
    cwd = os.getcwd()
    disk = {}
    for p in [cwd, *paths]:
        try:
            disk[p] = shutil.disk_usage(p).free
        except OSError:
            disk[p] = None
    shm = space(shm_path)
    return {"ram_total": total, "ram_available": avail, "memlock": memlock_limit(), "cwd": cwd, "disk": disk,
            "shm_total": shm.get("total"), "shm": shm, "checkpoint": space(checkpoint_dir or cwd),
            **process_limits()}


def space(path: str) -> dict[str, Any]:
    """A directory's file system: its size, what this user may still write there (statvfs' f_bavail: the root
    reserve excluded) and whether a file can be created in it. A directory that does not exist yet (the Trainer
    makes its output_dir) is judged by the nearest one above it that does."""
    from wizard.fsutil import nearest_existing
    at = nearest_existing(path)
    out: dict[str, Any] = {"path": path, "at": at}
    try:
        st = os.statvfs(at)
    except OSError as exc:
        return {**out, "error": exc.strerror or str(exc)}
    out.update(total=st.f_blocks * st.f_frsize, free=st.f_bavail * st.f_frsize)
    out["writable"], out["write_error"] = _can_write(at)
    return out


def _can_write(directory: str) -> tuple[bool, str | None]:
    """Create, write one byte to and remove a file there (a read-only or full file system says so here)."""
    import tempfile
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".wizard-preflight-") as f:
            f.write(b"\0")
            f.flush()
    except OSError as exc:
        return False, exc.strerror or str(exc)
    return True, None


def process_limits() -> dict[str, Any]:
    """Open files per process (RLIMIT_NOFILE) and processes per user (RLIMIT_NPROC, which counts threads), soft and
    hard (None: unlimited), with this user's threads now; the cgroup's pids.max (a container's, a SLURM job's)."""
    import resource
    out: dict[str, Any] = {}
    for key, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        out[key] = [None if soft == resource.RLIM_INFINITY else soft, None if hard == resource.RLIM_INFINITY else hard]
    out["user_threads"] = user_threads()
    out["root"] = os.geteuid() == 0             # RLIMIT_NPROC does not hold root
    out["pids"] = cgroup_pids()
    return out


def user_threads() -> int | None:
    import psutil
    me, count = os.getuid(), 0
    try:
        for p in psutil.process_iter(["uids", "num_threads"]):
            uids = p.info.get("uids")
            if uids and uids.real == me:
                count += p.info.get("num_threads") or 1
    except psutil.Error:
        return None
    return count


def cgroup_pids(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> list[int] | None:
    """[pids.max, pids.current] of this process's cgroup (v2, or v1's pids controller) when it is limited."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            entries = [line.strip().split(":", 2) for line in f]
    except OSError:
        return None
    for parts in entries:
        if len(parts) != 3 or not (parts[0] == "0" or "pids" in parts[1].split(",")):
            continue
        base = os.path.join(root, parts[2].lstrip("/")) if parts[0] == "0" else \
            os.path.join(root, "pids", parts[2].lstrip("/"))
        try:
            with open(os.path.join(base, "pids.max"), encoding="utf-8") as f:
                limit = f.read().strip()
            with open(os.path.join(base, "pids.current"), encoding="utf-8") as f:
                current = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit != "max":
            return [int(limit), current]
    return None


NCCL_ENV_PREFIXES = ("NCCL_", "GLOO_", "TP_SOCKET_IFNAME")


def network() -> dict[str, Any]:
    try:
        ifaces = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        ifaces = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    ib = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    env = {k: v for k, v in os.environ.items() if k.startswith(NCCL_ENV_PREFIXES)}
    return {"interfaces": ifaces, "ib_devices": ib, "env": dict(sorted(env.items()))}


def resolve(host: str) -> dict[str, Any]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    seen: list[list[Any]] = []
    for fam, _, _, _, sa in infos:
        entry = [4 if fam == socket.AF_INET else 6, sa[0]]
        if entry not in seen:
            seen.append(entry)
    return {"addresses": seen}


def _resolve_or_error(host: str) -> dict[str, Any]:
    try:
        return resolve(host)
    except socket.gaierror as exc:
        return {"error": exc.strerror or str(exc)}


def gather(main_host: str | None, paths: list[str], timeout: float, checkpoint_dir: str | None = None
           ) -> dict[str, Any]:
    facts: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    jobs = {"versions": versions, "gpus": gpus, "limits": lambda: limits(paths, checkpoint_dir), "net": network}
    if main_host:
        jobs["resolve"] = lambda: _resolve_or_error(main_host)
    # in parallel: the deadline is per fact, and together they take the slowest one's time
    results: dict[str, Any] = {}
    threads = []
    for name, fn in jobs.items():
        t = threading.Thread(target=lambda n=name, f=fn: results.__setitem__(n, with_timeout(f, timeout)),
                             daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout + 1)
    for name in jobs:
        facts[name] = results.get(name, {"timeout": timeout})
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m wizard.preflight.node")
    p.add_argument("--main-host", default=None)
    p.add_argument("--path", action="append", default=[])
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--timeout", type=float, default=10.0)
    a = p.parse_args(argv)
    print(json.dumps(gather(a.main_host, a.path, a.timeout, a.checkpoint_dir), default=str))
    sys.stdout.flush()
    os._exit(0)             # a fact thread that hangs must not keep this process alive


if __name__ == "__main__":
    main()
