"""The fake NVML: the interface of wizard/probe/nvml.py over made-up devices, for tests, demos and the
snapshot tests of the live view. `wizard.probe.nvml.open_nvml()` returns it when WIZARD_FAKE_NVML is set;
nothing else in the product imports this module.

WIZARD_FAKE_NVML (empty or unset: the real NVML):
    "8xH100-80GB"                       eight catalogue GPUs (any name `catalogue.resolve` takes)
    "4xA100-80GB+4xA100-40GB"           mixed models, in that order
    "2xRTX4090,driver=535.104.05"       options after commas: seed=N, frozen[=yes], idle[=yes],
                                        driver=V, cuda=V, nvlink=yes|no
    "none"                              no NVML at all (available=False), like a box without a driver
    "/path/fake.json"                   full control (health and XID errors too), see `_fake_from_json`
Samples move (utilisation oscillates, power and temperature follow it, memory is ~60 % used, as
in a training run) one step per sample() call, deterministically from the seed; `frozen` keeps
every sample identical, for snapshots; `idle` gives an idle machine (0 % busy, memory nearly
free), what a probe before training sees.
"""

from __future__ import annotations

import json
import math
import os
import threading
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from wizard.errors import InputError
from wizard.probe.nvml_api import (
    FAKE_ENV,
    SAMPLE_METRICS,
    STATIC_METRICS,
    GpuHealth,
    GpuProcess,
    GpuSample,
    GpuStatic,
    NvmlApi,
    UnavailableNvml,
    XidWatch,
    parse_gpu_groups,
    parse_yes_no,
)


@dataclass
class FakeDevice:
    static: GpuStatic
    power_limit_w: float = 300.0
    nvlink: bool = False                  # the catalogue says this part is NVLinked in servers
    consumer: bool = False                # GeForce: P2P over PCIe is disabled by the driver
    fixed: dict[str, Any] = field(default_factory=dict)   # metric -> constant value
    fail: set[str] = field(default_factory=set)           # metrics that read as None
    processes: list[GpuProcess] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)  # GpuHealth fields that differ from a healthy GPU's
    xids: list[int] = field(default_factory=list)          # XID errors that occur while a watch is open


HEALTH_FIELDS = tuple(f for f in GpuHealth.__dataclass_fields__ if f != "index")


class _FakeXidWatch:
    def __init__(self, events: list[tuple[int, int]]) -> None:
        self.events = events

    def poll(self) -> list[tuple[int, int]]:
        out, self.events = self.events, []
        return out

    def close(self) -> None:
        pass


class FakeNvml:
    """A deterministic NVML: devices from the catalogue or a JSON file, samples from a tick count."""

    PERIOD = 20                           # samples per utilisation cycle

    def __init__(self, devices: list[FakeDevice], driver: str | None = "550.54.15", cuda: str | None = "12.4",
                 nvlink: bool | None = None, p2p: list[list[str]] | str | None = None,
                 seed: int = 0, frozen: bool = False, idle: bool = False) -> None:
        self.available = True
        self.reason: str | None = None
        self._devices = devices
        self._driver = driver
        self._cuda = cuda
        self._nvlink = nvlink
        self._p2p = p2p
        self.seed = seed
        self.frozen = frozen
        self.idle = idle
        self.ticks = 0                    # sample() calls so far
        self._lock = threading.Lock()

    def driver_version(self) -> str | None:
        return self._driver

    def cuda_version(self) -> str | None:
        return self._cuda

    def devices(self) -> list[GpuStatic]:
        out = []
        for d in self._devices:
            s = d.static
            out.append(GpuStatic(s.index, s.name, s.memory_total,
                                 None if "uuid" in d.fail else s.uuid,
                                 None if "pci_bus_id" in d.fail else s.pci_bus_id,
                                 None if "compute_capability" in d.fail else s.compute_capability))
        return out

    def _pick(self, indices: list[int] | None) -> list[FakeDevice]:
        if indices is None:
            return list(self._devices)
        return [self._devices[i] for i in indices if 0 <= i < len(self._devices)]

    def p2p_matrix(self, indices: list[int] | None = None) -> list[list[str]] | None:
        picked = self._pick(indices)
        if not picked:
            return None
        if isinstance(self._p2p, list):
            pos = [d.static.index for d in picked]
            return [[self._p2p[i][j] for j in pos] for i in pos]
        return [["X" if a is b else self._pair_status(a, b) for b in picked] for a in picked]

    def _pair_status(self, a: FakeDevice, b: FakeDevice) -> str:
        if isinstance(self._p2p, str):
            return self._p2p
        return "NS" if (a.consumer or b.consumer) else "OK"

    def nvlink_all(self, indices: list[int] | None = None) -> bool | None:
        picked = self._pick(indices)
        if len(picked) < 2:
            return None
        if self._nvlink is not None:
            return self._nvlink
        return all(d.nvlink for d in picked) and len({d.static.name for d in picked}) == 1

    def sample(self) -> list[GpuSample]:
        with self._lock:
            tick = 0 if self.frozen else self.ticks
            self.ticks += 1
        return [self._sample_one(d, tick) for d in self._devices]

    def _wave(self, d: FakeDevice, tick: int, period: int) -> float:
        phase = (self.seed * 7 + d.static.index * 3) % period
        return math.sin(2 * math.pi * (tick + phase) / period)

    def _sample_one(self, d: FakeDevice, tick: int) -> GpuSample:
        total = d.static.memory_total
        util = 0 if self.idle else max(0, min(100, round(55 + 40 * self._wave(d, tick, self.PERIOD))))
        util = int(d.fixed.get("util", util))
        mem_fraction = 0.005 if self.idle else 0.6 + 0.05 * self._wave(d, tick, 3 * self.PERIOD)
        values: dict[str, Any] = {
            "util": util,
            "mem_used": int(total * mem_fraction),
            "mem_total": total,
            "mem_reserved": 0,                      # a fake driver reserves nothing (NVML v2 answers)
            "power_w": round(d.power_limit_w * (0.15 + 0.75 * util / 100), 1),
            "power_limit_w": float(d.power_limit_w),
            "temp_c": 30 + round(0.45 * util),
            "sm_clock_mhz": 210 + round(17.7 * util),
            "processes": [GpuProcess(p.pid, p.used_memory) for p in d.processes],
        }
        values.update({k: v for k, v in d.fixed.items() if k in values})
        for metric in d.fail:
            if metric in values:
                values[metric] = [] if metric == "processes" else None
        return GpuSample(index=d.static.index, **values)

    def health(self) -> list[GpuHealth]:
        """A healthy GPU (ECC on for data-centre parts, no error, nothing pending, no slowdown) unless the device's
        `health` says otherwise."""
        out = []
        for d in self._devices:
            base = GpuHealth(d.static.index, ecc_enabled=not d.consumer, ecc_uncorrected_volatile=0,
                             ecc_uncorrected_aggregate=0, ecc_corrected_volatile=0, retired_pages=0,
                             retired_pending=False, remapped_correctable=0, remapped_uncorrectable=0,
                             remap_pending=False, remap_failed=False,
                             clock_events=("gpu_idle",) if self.idle else ())
            for key, value in d.health.items():
                setattr(base, key, tuple(value) if key == "clock_events" and value is not None else value)
            out.append(base)
        return out

    def xid_watch(self) -> XidWatch:
        return _FakeXidWatch([(d.static.index, x) for d in self._devices for x in d.xids])

    def close(self) -> None:
        pass


_FAKE_UUID_NAMESPACE = uuidlib.UUID("7f1d0c52-53c4-4f0e-9a57-6b7a3a3e5a10")


def _fake_uuid(seed: int, index: int) -> str:
    # Distinct, stable, and as unlike each other as real UUIDs are (prefix matching is tested).
    return f"GPU-{uuidlib.uuid5(_FAKE_UUID_NAMESPACE, f'{seed}/{index}')}"


def _fake_bus_id(index: int) -> str:
    return f"00000000:{(0x18 + 0x10 * index) % 256:02X}:00.0"


def _device_from_spec(index: int, spec: Any, seed: int) -> FakeDevice:
    return FakeDevice(
        static=GpuStatic(index, spec.nvml_name, spec.memory, _fake_uuid(seed, index), _fake_bus_id(index),
                         spec.compute_capability),
        power_limit_w=float(spec.power_limit_w), nvlink=spec.nvlink, consumer=spec.consumer)


def fake_from_spec(spec: str) -> NvmlApi:
    """Build the fake from WIZARD_FAKE_NVML's value (see the module doc)."""
    text = spec.strip()
    if text.lower() in ("none", "0", "nogpu", "no-gpu"):
        return UnavailableNvml(f"NVML Shared Library Not Found: no NVIDIA driver on this machine "
                               f"({FAKE_ENV}={text})")
    if text.lower().endswith(".json") or os.path.sep in text:
        return _fake_from_json_file(text)
    head, *opts = [p.strip() for p in text.split(",")]
    options: dict[str, str] = {}
    for opt in opts:
        key, _, value = opt.partition("=")
        key = key.strip().lower()
        if key not in ("seed", "frozen", "idle", "driver", "cuda", "nvlink"):
            raise InputError(FAKE_ENV, f"unknown option {key!r}",
                             "seed=N, frozen, idle, driver=V, cuda=V, nvlink=yes|no")
        options[key] = value.strip()
    try:
        seed = int(options.get("seed", "0"))
    except ValueError:
        raise InputError(FAKE_ENV, f"seed={options['seed']!r} is not an integer", "seed=N") from None
    devices: list[FakeDevice] = []
    for count, gpu, _note in parse_gpu_groups(head, FAKE_ENV):
        for _ in range(count):
            devices.append(_device_from_spec(len(devices), gpu, seed))
    return FakeNvml(
        devices,
        driver=options.get("driver", "550.54.15"),
        cuda=options.get("cuda", "12.4"),
        nvlink=parse_yes_no(options["nvlink"], FAKE_ENV, "nvlink") if "nvlink" in options else None,
        seed=seed,
        frozen=parse_yes_no(options["frozen"], FAKE_ENV, "frozen") if "frozen" in options else False,
        idle=parse_yes_no(options["idle"], FAKE_ENV, "idle") if "idle" in options else False,
    )


def _fake_from_json_file(path: str) -> NvmlApi:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(FAKE_ENV, f"cannot read fake NVML file {path!r}: {exc}", "a JSON file or a spec such as 8xH100-80GB") from None
    return _fake_from_json(data, path)


def _fake_from_json(data: Any, where: str) -> NvmlApi:
    """A fake from a JSON document:

    {"driver_version": "550.54.15", "cuda_version": "12.4", "seed": 0, "frozen": false, "idle": false,
     "nvlink": true | false | null, "p2p": "OK" | [["X", "OK"], ["OK", "X"]] | null,
     "unavailable": "reason"                       (instead of devices: NVML is not there)
     "devices": [{"gpu": "H100-80GB",              (catalogue name; fills the fields below)
                  "name": "...", "memory_total": bytes or "80GB", "compute_capability": [9, 0],
                  "uuid": "...", "pci_bus_id": "...", "power_limit_w": 700,
                  "util": 50, "mem_used": "10GB", "power_w": 300, "temp_c": 60, "sm_clock_mhz": 1980,
                  "fail": ["power_w", "temp_c", "uuid", ...],
                  "processes": [{"pid": 1234, "used_memory": "10GB" | bytes | null}],
                  "health": {"ecc_uncorrected_volatile": 2, "remap_pending": true, "clock_events": ["hw_slowdown"],
                             ...: any GpuHealth field, null where NVML cannot say},
                  "xid": [79, ...]                 (XID errors an xid_watch() sees)}, ...]}
    A metric given a value stays at that value; the others move with the tick count.
    """
    from wizard.probe import catalogue
    from wizard.units import parse_bytes

    def bad(problem: str) -> InputError:
        return InputError(FAKE_ENV, f"{where}: {problem}", "see wizard/probe/fake_nvml.py _fake_from_json")

    if not isinstance(data, dict):
        raise bad("the document must be a JSON object")
    if data.get("unavailable"):
        return UnavailableNvml(str(data["unavailable"]))
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise bad("seed must be an integer")
    raw_devices = data.get("devices")
    if not isinstance(raw_devices, list):
        raise bad("'devices' must be a list")

    def size(value: Any, what: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        try:
            return parse_bytes(value, FAKE_ENV)
        except InputError:
            raise bad(f"{what} {value!r} is not a size") from None

    devices = []
    for index, raw in enumerate(raw_devices):
        if not isinstance(raw, dict):
            raise bad(f"devices[{index}] must be an object")
        spec = catalogue.lookup(raw["gpu"], FAKE_ENV) if raw.get("gpu") else None
        name = raw.get("name") or (spec.nvml_name if spec else None)
        memory = size(raw.get("memory_total"), "memory_total") or (spec.memory if spec else None)
        if not name or not memory:
            raise bad(f"devices[{index}] needs 'gpu' or both 'name' and 'memory_total'")
        cc = raw.get("compute_capability", list(spec.compute_capability) if spec else None)
        fail = raw.get("fail", [])
        if not isinstance(fail, list) or any(m not in SAMPLE_METRICS + STATIC_METRICS for m in fail):
            raise bad(f"devices[{index}].fail must list metrics from {', '.join(SAMPLE_METRICS + STATIC_METRICS)}")
        fixed: dict[str, Any] = {}
        for metric in ("util", "power_w", "temp_c", "sm_clock_mhz"):
            if metric in raw:
                fixed[metric] = raw[metric]
        if "mem_used" in raw:
            fixed["mem_used"] = size(raw["mem_used"], "mem_used")
        procs = [GpuProcess(int(p["pid"]), size(p.get("used_memory"), "used_memory"))
                 for p in raw.get("processes", [])]
        health = raw.get("health", {})
        if not isinstance(health, dict) or any(k not in HEALTH_FIELDS for k in health):
            raise bad(f"devices[{index}].health takes {', '.join(HEALTH_FIELDS)}")
        xids = raw.get("xid", [])
        if not isinstance(xids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in xids):
            raise bad(f"devices[{index}].xid must be a list of XID numbers")
        devices.append(FakeDevice(
            static=GpuStatic(index, name, memory, raw.get("uuid", _fake_uuid(seed, index)),
                             raw.get("pci_bus_id", _fake_bus_id(index)),
                             (int(cc[0]), int(cc[1])) if cc else None),
            power_limit_w=float(raw.get("power_limit_w", spec.power_limit_w if spec else 300)),
            nvlink=spec.nvlink if spec else False,
            consumer=spec.consumer if spec else "GeForce" in name,
            fixed=fixed, fail=set(fail), processes=procs, health=health, xids=xids))
    p2p = data.get("p2p")
    if isinstance(p2p, list) and (len(p2p) != len(devices) or any(len(r) != len(devices) for r in p2p)):
        raise bad("p2p must be a square matrix with one row per device")
    return FakeNvml(devices, driver=data.get("driver_version", "550.54.15"), cuda=data.get("cuda_version", "12.4"),
                    nvlink=data.get("nvlink"), p2p=p2p, seed=seed, frozen=bool(data.get("frozen", False)),
                    idle=bool(data.get("idle", False)))
