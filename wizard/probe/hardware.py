"""What the machine has: GPUs (through NVML), CPU, RAM, disk, library versions, environment.

Three sources, one dataclass: `probe()` (this machine), `from_json()` (a saved probe,
`--hardware FILE`) and `assume(spec)` (`--assume 8xH100-80GB`, from the GPU catalogue).
Never imports torch: library versions come from package metadata.

An assumed machine (`assume`) gets, unless the spec says otherwise:
- RAM = max(64 GiB, 2 x the GPUs' total memory) rounded up to a multiple of 16 GiB, of which
  90 % counts as available (the OS, page cache and the data loader keep the rest);
- CPU cores (logical) = max(8, 16 per data-centre GPU or 8 per workstation / GeForce GPU);
- NVLink as the catalogue says for that part (SXM boards: yes), with one model only;
- free disk and driver unknown (None).
The notes of the returned Hardware say what was assumed.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any

from wizard.errors import InputError
from wizard.fsutil import nearest_existing
from wizard.paths import accelerate_config_dir
from wizard.units import NETWORK_GBPS_RANGE, GiB, fmt_bytes, is_network_gbps, parse_bytes

ASSUME_FORMAT = ("COUNTxGPU[,ram=SIZE][,cpus=N][,disk=SIZE][,nodes=N][,nvlink=yes|no][,net=GBPS], "
                 "e.g. 8xH100-80GB or 4xA100-40GB,ram=512G")
NVME_CANDIDATES = ("/local_nvme", "/nvme", "/mnt/nvme", "/scratch")
# Distribution names read from package metadata (never imported). flash-attn and bitsandbytes
# decide whether `--attention flash` and `--optimizer adamw-8bit` can run here.
LIBRARIES = ("torch", "accelerate", "deepspeed", "transformers", "textual", "flash-attn", "bitsandbytes",
             "nvidia-ml-py")
REQUIRED_LIBRARIES = ("torch", "accelerate", "deepspeed")
OLDEST_GOOD_DRIVER = (535,)
RTX40_P2P_DRIVER = (550, 40, 7)   # accelerate's check_cuda_p2p_ib_support


@dataclass
class GPU:
    index: int
    name: str
    memory_total: int                     # bytes
    memory_free: int | None = None        # bytes; None when unknown (assumed hardware)
    compute_capability: tuple[int, int] | None = None
    bf16: bool = False                    # compute capability >= 8.0
    uuid: str | None = None
    pci_bus_id: str | None = None
    nvml_index: int | None = None         # NVML's (nvidia-smi's) index; `index` is CUDA's, after CUDA_VISIBLE_DEVICES


@dataclass
class Hardware:
    gpus: list[GPU] = field(default_factory=list)
    gpu_reason: str | None = None         # why there are no GPUs ("NVML Shared Library Not Found ...")
    driver_version: str | None = None
    cuda_version: str | None = None       # CUDA version the driver supports, e.g. "12.4"
    nvlink: bool | None = None            # every GPU pair has NVLink (None: unknown / < 2 GPUs)
    p2p: list[list[str]] | None = None    # P2P matrix as NVML reports it ("OK", "NS", ...)
    cpu_cores: int = 1                    # logical CPUs this process may run on
    ram_total: int = 0                    # bytes
    ram_available: int = 0                # bytes
    output_dir: str | None = None
    disk_free_output: int | None = None   # bytes free at output_dir
    nvme_path: str | None = None          # candidate NVMe offload path
    disk_free_nvme: int | None = None     # bytes free at nvme_path
    libraries: dict[str, str | None] = field(default_factory=dict)  # torch/accelerate/deepspeed/transformers
    env: dict[str, str] = field(default_factory=dict)  # CUDA_VISIBLE_DEVICES and SLURM_* when set
    source: str = "probe"                 # "probe" | "assume:<spec>" | "file:<path>"
    num_machines_hint: int | None = None  # from SLURM_NNODES when present
    cpu_physical_cores: int | None = None
    aio_available: bool | None = None     # libaio found: DeepSpeed's async_io (NVMe offload) can build
    inter_node_gbps: float | None = None  # network per machine to the others, Gb/s (None: by machine class)
    notes: list[str] = field(default_factory=list)  # what was assumed or adjusted, for the user

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def min_gpu_memory(self) -> int:
        return min((g.memory_total for g in self.gpus), default=0)

    @property
    def all_bf16(self) -> bool:
        return bool(self.gpus) and all(g.bf16 for g in self.gpus)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for g in d["gpus"]:
            if g["compute_capability"] is not None:
                g["compute_capability"] = list(g["compute_capability"])
        return d


# ============================================================================================
# from_json / load_file


def _bad(problem: str) -> InputError:
    return InputError("hardware", problem, "the JSON written by `wizard probe --json`")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(value: Any, kind: str, where: str) -> Any:
    """Validate one JSON value against a small type language; return it converted."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    if value is None:
        if optional:
            return None
        raise _bad(f"{where} must not be null")
    ok = {
        "int": _is_int(value),
        "int>=0": _is_int(value) and value >= 0,
        "int>0": _is_int(value) and value > 0,
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "cc": isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(x) and x >= 0 for x in value),
        "matrix": isinstance(value, list) and all(isinstance(r, list) and all(isinstance(c, str) for c in r)
                                                  for r in value),
        "libs": isinstance(value, dict) and all(isinstance(v, str) or v is None for v in value.values()),
        "env": isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
        "strs": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "gbps": is_network_gbps(value),
    }[kind]
    if not ok:
        wanted = {"int": "an integer", "int>=0": "a non-negative integer", "int>0": "a positive integer",
                  "str": "a string", "bool": "true or false", "cc": "[major, minor]",
                  "matrix": "a list of lists of strings", "libs": "an object of version strings or null",
                  "env": "an object of strings", "strs": "a list of strings",
                  "gbps": f"Gb/s, {NETWORK_GBPS_RANGE}"}[kind]
        raise _bad(f"{where} must be {wanted}, got {value!r:.60}")
    if kind == "cc":
        return (int(value[0]), int(value[1]))
    if kind in ("libs", "env"):
        return dict(value)
    return value


_GPU_FIELDS = {"index": "int>=0", "name": "str", "memory_total": "int>0", "memory_free": "int>=0?",
               "compute_capability": "cc?", "bf16": "bool", "uuid": "str?", "pci_bus_id": "str?",
               "nvml_index": "int>=0?"}
_HW_FIELDS = {"gpu_reason": "str?", "driver_version": "str?", "cuda_version": "str?", "nvlink": "bool?",
              "p2p": "matrix?", "cpu_cores": "int>0", "ram_total": "int>=0", "ram_available": "int>=0",
              "output_dir": "str?", "disk_free_output": "int>=0?", "nvme_path": "str?",
              "disk_free_nvme": "int>=0?", "libraries": "libs", "env": "env", "source": "str",
              "num_machines_hint": "int>0?", "cpu_physical_cores": "int>0?", "aio_available": "bool?",
              "inter_node_gbps": "gbps?", "notes": "strs"}


def _gpu_from_json(raw: Any, position: int) -> GPU:
    where = f"gpus[{position}]"
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be an object")
    for required in ("name", "memory_total"):
        if required not in raw:
            raise _bad(f"{where}.{required} is missing")
    values = {k: _check(raw[k], kind, f"{where}.{k}") for k, kind in _GPU_FIELDS.items() if k in raw}
    values.setdefault("index", position)
    if "bf16" not in values:
        cc = values.get("compute_capability")
        values["bf16"] = cc is not None and cc >= (8, 0)
    return GPU(**values)


def from_json(data: dict[str, Any], source: str | None = None) -> Hardware:
    """Rebuild a Hardware from `wizard probe --json` output. Raises InputError on bad data.

    Also takes the whole `wizard plan --json` document (its "hardware" member). Missing
    optional fields get their defaults; unknown fields are ignored (a newer wizard's probe).
    `source` replaces the recorded source when given (load_file passes "file:<path>").
    """
    if isinstance(data, dict) and "gpus" not in data and isinstance(data.get("hardware"), dict):
        data = data["hardware"]
    if not isinstance(data, dict):
        raise _bad(f"expected a JSON object, got {type(data).__name__}")
    if "gpus" not in data:
        raise _bad("no 'gpus' list: this is not a saved probe")
    if not isinstance(data["gpus"], list):
        raise _bad("gpus must be a list")
    gpus = [_gpu_from_json(g, i) for i, g in enumerate(data["gpus"])]
    values = {k: _check(data[k], kind, k) for k, kind in _HW_FIELDS.items() if k in data}
    hw = Hardware(gpus=gpus, **values)
    if source is not None:
        hw.source = source
    return hw


HARDWARE_FILE_MAX_BYTES = 4 * 1024 * 1024   # a probe of 64 GPUs is under 100 KiB


def load_file(path: str) -> Hardware:
    """`--hardware FILE`: read a saved probe. InputError (field 'hardware') if unreadable."""
    from wizard.fsutil import loads_limited, quote_path, read_text_limited

    allowed = "a file written by `wizard probe --json > FILE`"
    text = read_text_limited(path, HARDWARE_FILE_MAX_BYTES, "hardware", allowed)
    data = loads_limited(text, "json", "hardware", quote_path(path), allowed)
    return from_json(data, source=f"file:{path}")


# ============================================================================================
# assume


def _assume_int(key: str, value: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d+", value.strip()):
        raise InputError("assume", f"{key}={value!r} is not a whole number", f"{key}={low}..{high}")
    n = int(value)
    if not low <= n <= high:
        raise InputError("assume", f"{key}={n} is out of range", f"{key}={low}..{high}")
    return n


def _assume_options(extras: list[str]) -> dict[str, Any]:
    from wizard.probe.nvml import parse_yes_no

    options: dict[str, Any] = {}
    for extra in extras:
        key, eq, value = extra.partition("=")
        key = key.strip().lower()
        if not eq or not key:
            raise InputError("assume", f"{extra.strip()!r} is not key=value", ASSUME_FORMAT)
        if key in options:
            raise InputError("assume", f"{key} is given twice", ASSUME_FORMAT)
        if key in ("ram", "disk"):
            try:
                options[key] = parse_bytes(value, "assume")
            except InputError as exc:
                raise InputError("assume", f"{key}={value.strip()!r}: {exc.problem}", exc.allowed) from None
        elif key == "cpus":
            options[key] = _assume_int(key, value, 1, 8192)
        elif key == "nodes":
            options[key] = _assume_int(key, value, 1, 4096)
        elif key == "nvlink":
            options[key] = parse_yes_no(value, "assume", "nvlink")
        elif key == "net":
            options[key] = parse_gbps(value, "assume")
        else:
            raise InputError("assume", f"unknown key {key!r}",
                             "ram=SIZE, cpus=N, disk=SIZE, nodes=N, nvlink=yes|no, net=GBPS")
    return options


GBPS_ALLOWED = "Gb/s of network per machine, such as 400G, 3200G or 3.2T (from 0.1G up to 100T)"


def parse_gbps(value: Any, field_name: str) -> float:
    """'400G', '400Gb', '400gbps', '3.2T', '400' -> Gb/s (a machine's network to the others, all NICs together)."""
    text = str(value).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(g|gb|gbit|gbps|gb/s|t|tb|tbps|tb/s)?", text)
    if not m:
        raise InputError(field_name, f"net={value!r} is not a network speed", GBPS_ALLOWED)
    gbps = float(m.group(1)) * (1000 if (m.group(2) or "g").startswith("t") else 1)
    if not is_network_gbps(gbps):
        raise InputError(field_name, f"net={value!r} is out of range", GBPS_ALLOWED)
    return gbps


def assumed_ram(gpu_memory_total: int) -> int:
    """RAM of an assumed machine: max(64 GiB, 2 x its GPUs' total memory), in whole 16 GiB."""
    step = 16 * GiB
    return max(64 * GiB, -(-2 * gpu_memory_total // step) * step)


def assumed_cpus(kinds: list[str]) -> int:
    """Logical CPUs of an assumed machine: 16 per data-centre GPU, 8 per other GPU, at least 8."""
    return max(8, sum(16 if k == "datacenter" else 8 for k in kinds))


def assume(spec: str) -> Hardware:
    """`--assume 8xH100-80GB`, `4xA100-40GB,ram=512G`, `2xRTX4090` from the catalogue.

    Mixed models join with '+': `4xA100-80GB+4xA100-40GB`. See the module doc for defaults.
    """
    from wizard.probe.nvml import parse_gpu_groups

    if not isinstance(spec, str) or not spec.strip():
        raise InputError("assume", "the machine description is empty", ASSUME_FORMAT)
    head, *extras = spec.split(",")
    if not re.match(r"\s*\d+\s*[xX×]", head):
        raise InputError("assume", f"{spec.strip()!r} does not start with COUNTxGPU", ASSUME_FORMAT)
    nodes = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+\s*[xX×]\s*\S.*?)\s*", head)
    if nodes:       # "2x8xH100": the machine count is an option, as accelerate's num_machines is its own answer
        rest = ",".join([nodes.group(2).replace(" ", "")] + [e.strip() for e in extras] + [f"nodes={nodes.group(1)}"])
        raise InputError("assume", f"{head.strip()!r}: machines are given as nodes=N, not as a second count",
                         f"{rest} ({nodes.group(1)} machines of {nodes.group(2).replace(' ', '')})")
    groups = parse_gpu_groups(head, "assume")
    options = _assume_options(extras)

    gpus: list[GPU] = []
    kinds: list[str] = []
    notes = [note for _, _, note in groups if note]
    for count, gpu, _ in groups:
        for _ in range(count):
            gpus.append(GPU(index=len(gpus), name=gpu.nvml_name, memory_total=gpu.memory,
                            compute_capability=gpu.compute_capability, bf16=gpu.bf16, nvml_index=len(gpus)))
            kinds.append(gpu.kind)
    gpu_memory = sum(g.memory_total for g in gpus)

    if "ram" in options:
        ram = options["ram"]
    else:
        ram = assumed_ram(gpu_memory)
        notes.append(f"assumed {fmt_bytes(ram)} of RAM, max(64 GiB, 2 x GPU memory); say ram=SIZE to change it")
    if "cpus" in options:
        cpus = options["cpus"]
    else:
        cpus = assumed_cpus(kinds)
        notes.append(f"assumed {cpus} CPU cores; say cpus=N to change it")
    if "nvlink" in options:
        nvlink: bool | None = options["nvlink"] if len(gpus) > 1 else None
    else:
        one_model = len({g.name for g in gpus}) == 1
        nvlink = (all(gpu.nvlink for _, gpu, _ in groups) and one_model) if len(gpus) > 1 else None
    disk = options.get("disk")
    return Hardware(
        gpus=gpus,
        nvlink=nvlink,
        cpu_cores=cpus,
        ram_total=ram,
        ram_available=int(ram * 0.9),
        disk_free_output=disk,
        disk_free_nvme=disk,
        source=f"assume:{spec.strip()}",
        num_machines_hint=options.get("nodes"),
        inter_node_gbps=options.get("net"),
        notes=notes,
    )


# ============================================================================================
# probe


def free_disk(path: str) -> int | None:
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    """Installed versions from package metadata; None when not installed. Imports none of them."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, OMP_NUM_THREADS (the threads of ZeRO offload's host optimizer step,
    planning.speed.cpu_step_threads) and every SLURM_* variable that is set, sorted."""
    environ = os.environ if environ is None else environ
    keep = {k: v for k, v in environ.items()
            if k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS") or k.startswith("SLURM_")}
    return dict(sorted(keep.items()))


def slurm_nodes(env: dict[str, str]) -> int | None:
    for key in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        value = env.get(key, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def aio_available() -> bool:
    """Whether libaio is installed: DeepSpeed's async_io op (NVMe offload) needs it to build."""
    import ctypes.util

    try:
        return ctypes.util.find_library("aio") is not None
    except OSError:         # find_library shells out to ldconfig/gcc in a temp file; it catches their OSErrors
                            # but not an unusable temp directory's: a broken toolchain is "not found"
        return False


_UNLIMITED = 1 << 60


def cgroup_memory(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> tuple[int, int | None] | None:
    """(limit, usage) of this process's memory cgroup when it is limited, else None.

    Containers and SLURM jobs cap memory below what the host has (and what psutil reports);
    the training is OOM-killed at the cap, so the plan must use it. cgroup v2 and v1.
    """
    paths = ["/"]
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            for line in f:
                parts = line.strip().split(":", 2)
                if len(parts) == 3 and (parts[0] == "0" or "memory" in parts[1].split(",")):
                    paths.append(parts[2] or "/")
    except OSError:
        pass
    best: tuple[int, int | None] | None = None
    for rel in paths:
        rel = rel.lstrip("/")
        for limit_file, usage_file in ((os.path.join(root, rel, "memory.max"), os.path.join(root, rel, "memory.current")),
                                       (os.path.join(root, "memory", rel, "memory.limit_in_bytes"),
                                        os.path.join(root, "memory", rel, "memory.usage_in_bytes"))):
            limit = _read_int(limit_file)
            if limit is None or limit >= _UNLIMITED:
                continue
            if best is None or limit < best[0]:
                best = (limit, _read_int(usage_file))
    return best


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _probe_gpus(hw: Hardware) -> None:
    from wizard.probe.nvml import open_nvml, visible_devices

    api = open_nvml()       # a malformed WIZARD_FAKE_NVML raises InputError: that is a usage error
    try:
        if not api.available:
            hw.gpu_reason = api.reason or "NVML is not available"
            return
        hw.driver_version = api.driver_version()
        hw.cuda_version = api.cuda_version()
        devices = api.devices()
        visible, note = visible_devices(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if note:
            hw.notes.append(note)
        samples = {s.index: s for s in api.sample()}
        for cuda_index, d in enumerate(visible):
            s = samples.get(d.index)
            total = d.memory_total or (s.mem_total if s and s.mem_total else 0)
            # NVML v2's used leaves out the driver's reserve, which is not free either
            free = (total - s.mem_used - (s.mem_reserved or 0)) if s and s.mem_used is not None and total else None
            hw.gpus.append(GPU(index=cuda_index, name=d.name, memory_total=total, memory_free=free,
                               compute_capability=d.compute_capability,
                               bf16=d.compute_capability is not None and d.compute_capability >= (8, 0),
                               uuid=d.uuid, pci_bus_id=d.pci_bus_id, nvml_index=d.index))
        if not devices:
            hw.gpu_reason = "NVML works but reports no GPU"
        elif not visible:
            hw.gpu_reason = note or "no GPU is visible"
        nvml_indices = [d.index for d in visible]
        if len(nvml_indices) > 1:
            hw.nvlink = api.nvlink_all(nvml_indices)
            hw.p2p = api.p2p_matrix(nvml_indices)
    finally:
        api.close()


def _probe_host(hw: Hardware) -> None:
    import psutil

    try:
        hw.cpu_cores = len(os.sched_getaffinity(0))      # what this process (a SLURM job, a container) may use
    except (AttributeError, OSError):
        hw.cpu_cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    hw.cpu_physical_cores = psutil.cpu_count(logical=False) or None
    vm = psutil.virtual_memory()
    hw.ram_total, hw.ram_available = int(vm.total), int(vm.available)
    capped = cgroup_memory()
    if capped and capped[0] < hw.ram_total:
        limit, usage = capped
        hw.notes.append(f"memory is capped at {fmt_bytes(limit)} by this process's cgroup "
                        f"(the host has {fmt_bytes(hw.ram_total)}); planning with the cap")
        hw.ram_total = limit
        hw.ram_available = min(hw.ram_available, max(0, limit - (usage or 0)))


def probe(output_dir: str | None = None, nvme_path: str | None = None) -> Hardware:
    """Probe this machine. Never raises for a missing GPU/driver: zero GPUs and the reason."""
    hw = Hardware(source="probe")
    try:
        _probe_gpus(hw)
    except InputError:
        raise
    except Exception as exc:          # an NVML surprise must not cost the user the rest of the probe
        hw.gpus, hw.gpu_reason = [], f"GPU probe failed: {type(exc).__name__}: {exc}"
    _probe_host(hw)

    hw.output_dir = os.path.abspath(os.path.expanduser(output_dir or accelerate_config_dir()))
    hw.disk_free_output = free_disk(hw.output_dir)
    if nvme_path:
        hw.nvme_path = os.path.abspath(os.path.expanduser(nvme_path))
    else:
        hw.nvme_path = next((p for p in NVME_CANDIDATES if os.path.isdir(p)), None)
    hw.disk_free_nvme = free_disk(hw.nvme_path) if hw.nvme_path else None
    hw.aio_available = aio_available()

    hw.libraries = library_versions()
    hw.env = relevant_env()
    hw.num_machines_hint = slurm_nodes(hw.env)
    return hw


# ============================================================================================
# describe / warnings


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts) if parts else None


def _cc_text(cc: tuple[int, int] | None) -> str:
    return f"cc {cc[0]}.{cc[1]}" if cc else "cc ?"


def _source_text(hw: Hardware) -> str:
    if hw.source.startswith("assume:"):
        return f"assumed machine ({hw.source[len('assume:'):]})"
    if hw.source.startswith("file:"):
        return f"saved probe ({hw.source[len('file:'):]})"
    return "this machine" if hw.source == "probe" else hw.source


def _gpu_summary(hw: Hardware) -> str:
    counts: dict[str, int] = {}
    for g in hw.gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    return " + ".join(f"{n} x {name}" for name, n in counts.items())


def _p2p_text(p2p: list[list[str]]) -> str:
    n = len(p2p)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if j < len(p2p[i]) and i < len(p2p[j])]
    if not pairs:
        return "P2P: n/a"
    bad = [(i, j) for i, j in pairs if p2p[i][j] != "OK" or p2p[j][i] != "OK"]
    if not bad:
        return "P2P: OK between every pair"
    codes = ", ".join(sorted({p2p[i][j] for i, j in bad} | {p2p[j][i] for i, j in bad} - {"OK"}))
    return f"P2P: not available for {len(bad)} of {len(pairs)} pairs ({codes})"


def describe(hw: Hardware) -> list[str]:
    """Plain-text lines for `wizard probe`: what the plan will be based on."""
    lines = [f"Source: {_source_text(hw)}"]
    if not hw.gpus:
        lines.append(f"GPUs: none ({hw.gpu_reason or 'no NVIDIA GPU found'})")
    else:
        lines.append(f"GPUs: {_gpu_summary(hw)}")
        for g in hw.gpus:
            parts = [f"  GPU {g.index}: {g.name}", f"{fmt_bytes(g.memory_total)} total"]
            if g.memory_free is not None:
                parts[-1] += f", {fmt_bytes(g.memory_free)} free"
            parts.append(_cc_text(g.compute_capability))
            parts.append("bf16" if g.bf16 else "no bf16 (fp16)")
            if g.nvml_index is not None and g.nvml_index != g.index:
                parts.append(f"nvidia-smi #{g.nvml_index}")
            if g.pci_bus_id:
                parts.append(g.pci_bus_id)
            lines.append(", ".join(parts))
    if hw.driver_version or hw.cuda_version:
        lines.append(f"Driver: {hw.driver_version or 'unknown'}, CUDA {hw.cuda_version or 'unknown'}")
    if len(hw.gpus) > 1:
        link = {True: "NVLink between every pair", False: "PCIe (not every pair has NVLink)",
                None: "NVLink unknown"}[hw.nvlink]
        lines.append(f"Interconnect: {link}" + (f"; {_p2p_text(hw.p2p)}" if hw.p2p else ""))
    cpu = f"CPU: {hw.cpu_cores} logical cores"
    if hw.cpu_physical_cores:
        cpu += f" ({hw.cpu_physical_cores} physical)"
    lines.append(cpu)
    lines.append(f"RAM: {fmt_bytes(hw.ram_total)} total, {fmt_bytes(hw.ram_available)} available")
    if hw.output_dir or hw.disk_free_output is not None:
        where = f" at {hw.output_dir}" if hw.output_dir else ""
        lines.append(f"Disk: {fmt_bytes(hw.disk_free_output)} free{where} (output)")
    if hw.nvme_path:
        lines.append(f"NVMe offload: {fmt_bytes(hw.disk_free_nvme)} free at {hw.nvme_path}")
    elif hw.disk_free_nvme is not None:
        lines.append(f"NVMe offload: {fmt_bytes(hw.disk_free_nvme)} free (path not given)")
    elif hw.source == "probe":
        lines.append(f"NVMe offload: no candidate path ({', '.join(NVME_CANDIDATES)}); use --nvme-path")
    if hw.aio_available is not None:
        lines.append("DeepSpeed async I/O: libaio " + ("found" if hw.aio_available
                                                       else "not found (NVMe offload needs libaio-dev)"))
    if hw.libraries:
        have = [f"{k} {v}" for k, v in hw.libraries.items() if v]
        missing = [k for k, v in hw.libraries.items() if not v]
        lines.append("Libraries: " + (", ".join(have) or "none") + (f"; not installed: {', '.join(missing)}"
                                                                  if missing else ""))
    if hw.env:
        lines.append("Environment: " + " ".join(f"{k}={v}" for k, v in hw.env.items()))
    if hw.num_machines_hint:
        lines.append(f"Machines: {hw.num_machines_hint} (from SLURM)" if hw.source == "probe"
                     else f"Machines: {hw.num_machines_hint}")
    lines += [f"Note: {n}" for n in hw.notes]
    return lines


def warnings(hw: Hardware) -> list[str]:
    """Problems worth saying before planning on this hardware (one line each, most serious first)."""
    out: list[str] = []
    if not hw.gpus:
        out.append(f"no NVIDIA GPU ({hw.gpu_reason or 'none found'}): plan for another machine with "
                   "--assume SPEC or --hardware FILE, or train with CPU processes (--backend and --num-processes)")
        return out + _library_warnings(hw)
    n = len(hw.gpus)
    names = {g.name for g in hw.gpus}
    driver = _version_tuple(hw.driver_version)
    if len(names) > 1:
        out.append(f"mixed GPU models ({_gpu_summary(hw)}): every rank is sized for the smallest "
                   f"({fmt_bytes(hw.min_gpu_memory)}) and the slowest sets the pace")
        if hw.source == "probe" and hw.env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            out.append("with mixed GPUs CUDA numbers devices fastest-first, not as nvidia-smi does: "
                       "export CUDA_DEVICE_ORDER=PCI_BUS_ID so that GPU ids mean the same cards everywhere")
    if n > 1 and hw.nvlink is False:
        text = f"no NVLink between the {n} GPUs: gradients and ZeRO-3/FSDP gathers go over PCIe, which is slower"
        if hw.p2p and any(c not in ("OK", "X") for row in hw.p2p for c in row):
            text += "; P2P is not available between some of them, so that traffic goes through host memory"
        out.append(text)
    rtx40 = [g.name for g in hw.gpus if "RTX 40" in g.name]
    if n > 1 and rtx40 and driver is not None and driver < RTX40_P2P_DRIVER:
        out.append(f"RTX 40xx GPUs with driver {hw.driver_version} (older than 550.40.07): P2P/InfiniBand "
                   "transfers are broken, so accelerate sets NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 "
                   "(slower); update the driver to 550.40.07 or newer")
    if driver is not None and driver < OLDEST_GOOD_DRIVER:
        out.append(f"NVIDIA driver {hw.driver_version} is older than 535: current CUDA 12 builds of PyTorch and "
                   "NCCL may refuse to start or miss fixes; update the driver")
    for g in hw.gpus:
        if g.memory_free is None or not g.memory_total:
            continue
        used = g.memory_total - g.memory_free
        if used > max(GiB, g.memory_total // 20):
            out.append(f"GPU {g.index} already has {fmt_bytes(used)} of {fmt_bytes(g.memory_total)} in use by "
                       "another process; the plan counts on the whole GPU")
    return out + _library_warnings(hw)


def _library_warnings(hw: Hardware) -> list[str]:
    if not hw.libraries:       # assumed hardware: its software is not this machine's
        return []
    hints = {"torch": "PyTorch is not installed: nothing can train here (install torch first)",
             "accelerate": "accelerate is not installed: `accelerate launch` and the config check need it "
                           "(pip install accelerate)",
             "deepspeed": "DeepSpeed is not installed: ZeRO plans can be written but not run or checked here "
                          "(pip install deepspeed)"}
    return [hints[name] for name in REQUIRED_LIBRARIES if name in hw.libraries and not hw.libraries[name]]
