"""GPU metrics for a run: a 1 Hz NVML sampler thread, a bounded metrics.jsonl writer, a summary.

nvitop's split (shared/reference/launcher_tui.md §2.3): collection runs in a daemon thread and
produces plain dicts; nothing here renders. The sampler never raises: a metric NVML cannot read
is None (shown as N/A), a whole sample that fails becomes an "unavailable" sample with the
reason, and no NVML at all gives `available: False` with "no GPU metrics on this machine".

One sample (one line of metrics.jsonl):
    {"t": epoch seconds, "available": bool, "reason": str | None,
     "gpus": [{"index", "name", "util", "mem_used", "mem_total", "mem_reserved", "power_w", "power_limit_w",
               "temp_c", "sm_clock_mhz", "processes": [{"pid", "used_memory", "rank"}]}]}
mem_used is what nvidia-smi shows as used: NVML's v2 memory info, which reports the driver's reserve apart
(mem_reserved); where only v1 answers, mem_used includes the reserve and mem_reserved is None.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from launch.rundir import BoundedJsonl, read_jsonl
from wizard.probe.nvml import GpuSample, GpuStatic, NvmlApi

NO_GPU_METRICS = "no GPU metrics on this machine"
DEFAULT_METRICS_CAP_BYTES = 8 * 1024 * 1024   # about 1.5 h of 8-GPU samples at 1 Hz
MIN_INTERVAL_S = 0.25                         # nvitop's floor: NVML calls are not free

Sample = dict[str, Any]


def unavailable_sample(t: float, detail: str | None) -> Sample:
    reason = f"{NO_GPU_METRICS} ({detail})" if detail else NO_GPU_METRICS
    return {"t": t, "available": False, "reason": reason, "gpus": []}


def _rank_of(pid: int, pid_to_rank: Callable[[int], int | None] | None) -> int | None:
    if pid_to_rank is None:
        return None
    try:
        return pid_to_rank(pid)
    except (OSError, LookupError):  # a /proc lookup racing with a dying process (ProcessLookupError), a table miss
        return None


def gpu_sample_to_dict(s: GpuSample, static: GpuStatic | None,
                       pid_to_rank: Callable[[int], int | None] | None = None) -> dict[str, Any]:
    mem_total = s.mem_total if s.mem_total is not None else (static.memory_total if static else None)
    return {
        "index": s.index,
        "name": static.name if static else None,
        "util": s.util,
        "mem_used": s.mem_used,
        "mem_total": mem_total,
        "mem_reserved": s.mem_reserved,
        "power_w": s.power_w,
        "power_limit_w": s.power_limit_w,
        "temp_c": s.temp_c,
        "sm_clock_mhz": s.sm_clock_mhz,
        "processes": [
            {"pid": p.pid, "used_memory": p.used_memory, "rank": _rank_of(p.pid, pid_to_rank)}
            for p in (s.processes or [])
        ],
    }


class Sampler:
    """Samples `api` every `interval` seconds in a daemon thread and hands each dict to `on_sample`.

    `sample_once()` is the same work without the thread (tests, one-shot status). The thread keeps
    a fixed cadence (deadline-based, so slow NVML calls don't make it drift) and survives any
    exception from NVML or from `on_sample`.
    """

    def __init__(self, api: NvmlApi, interval: float = 1.0,
                 on_sample: Callable[[Sample], None] | None = None,
                 pid_to_rank: Callable[[int], int | None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.interval = max(float(interval), MIN_INTERVAL_S)
        self.on_sample = on_sample
        self.pid_to_rank = pid_to_rank
        self.clock = clock
        self.latest: Sample | None = None
        self.count = 0                    # samples produced by the thread
        self.callback_errors = 0          # exceptions raised by on_sample (swallowed)
        self._static: dict[int, GpuStatic] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _devices(self) -> dict[int, GpuStatic]:
        # Names and totals don't change during a run: ask once (NVML's name query is not free).
        if self._static is None:
            try:
                self._static = {d.index: d for d in self.api.devices()}
            except Exception:         # devices() must not raise (NvmlApi); a binding that does costs the names only
                return {}
        return self._static

    def sample_once(self) -> Sample:
        t = self.clock()
        try:
            if not getattr(self.api, "available", False):
                return unavailable_sample(t, getattr(self.api, "reason", None))
            static = self._devices()
            raw = self.api.sample()
            if not raw:
                return unavailable_sample(t, "NVML reports no GPUs")
            gpus = [gpu_sample_to_dict(s, static.get(s.index), self.pid_to_rank) for s in raw]
            return {"t": t, "available": True, "reason": None, "gpus": gpus}
        except Exception as exc:          # the protocol says sample() never raises; be sure
            return unavailable_sample(t, f"NVML query failed: {type(exc).__name__}: {exc}")

    def _emit(self, sample: Sample) -> None:
        self.latest = sample
        self.count += 1
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception as exc:  # the sampler must outlive its consumer's failures (metrics.jsonl on a full disk)
                self.callback_errors += 1
                if self.callback_errors == 1:       # said once, in the supervisor's log; later ones are counted
                    print(f"wizard launch: a GPU metrics sample was not recorded: {type(exc).__name__}: {exc}",
                          file=sys.stderr, flush=True)

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self._emit(self.sample_once())
            deadline += self.interval
            now = time.monotonic()
            if deadline < now:             # fell behind (suspended laptop, slow NVML): resync
                deadline = now + self.interval
            self._stop.wait(deadline - now)

    def start(self) -> "Sampler":
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="wizard-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- summary (headless status line)

@dataclass
class GpuSummary:
    index: int
    name: str | None = None
    mem_total: int | None = None
    peak_mem_used: int | None = None
    util_sum: float = 0.0
    util_n: int = 0

    @property
    def mean_util(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None


@dataclass
class RunningSummary:
    """Peak memory and mean utilisation per GPU, accumulated sample by sample (constant memory)."""
    gpus: dict[int, GpuSummary] = field(default_factory=dict)
    samples: int = 0
    available_samples: int = 0
    reason: str | None = None

    def add(self, sample: Sample) -> None:
        self.samples += 1
        if not sample.get("available"):
            self.reason = sample.get("reason") or NO_GPU_METRICS
            return
        self.available_samples += 1
        for g in sample.get("gpus") or []:
            idx = g.get("index")
            if idx is None:
                continue
            s = self.gpus.setdefault(idx, GpuSummary(index=idx))
            s.name = g.get("name") or s.name
            s.mem_total = g.get("mem_total") or s.mem_total
            used = g.get("mem_used")
            if isinstance(used, (int, float)):
                s.peak_mem_used = used if s.peak_mem_used is None else max(s.peak_mem_used, used)
            util = g.get("util")
            if isinstance(util, (int, float)):
                s.util_sum += util
                s.util_n += 1

    def as_dict(self) -> dict[str, Any]:
        per_gpu = [
            {"index": s.index, "name": s.name, "mem_total": s.mem_total,
             "peak_mem_used": s.peak_mem_used, "mean_util": s.mean_util}
            for s in sorted(self.gpus.values(), key=lambda s: s.index)
        ]
        peaks = [g for g in per_gpu if g["peak_mem_used"] is not None]
        top = max(peaks, key=lambda g: g["peak_mem_used"]) if peaks else None
        utils = [g["mean_util"] for g in per_gpu if g["mean_util"] is not None]
        return {
            "available": self.available_samples > 0,
            "reason": None if self.available_samples else (self.reason or NO_GPU_METRICS),
            "samples": self.samples,
            "gpus": per_gpu,
            "peak_mem_used": top["peak_mem_used"] if top else None,
            "peak_mem_total": top["mem_total"] if top else None,
            "peak_gpu": top["index"] if top else None,
            "mean_util": sum(utils) / len(utils) if utils else None,
        }


def summarise(samples: Iterable[Sample]) -> dict[str, Any]:
    """Peak memory per GPU and mean utilisation over `samples` (metrics.jsonl lines)."""
    acc = RunningSummary()
    for s in samples:
        acc.add(s)
    return acc.as_dict()


def format_summary(summary: dict[str, Any]) -> str:
    """One phrase for the headless status line: 'peak GPU mem 61.2 GiB/80.0 GiB (GPU 3), util 87%'."""
    from wizard.units import fmt_bytes
    if not summary.get("available"):
        return NO_GPU_METRICS
    parts = []
    if summary.get("peak_mem_used") is not None:
        total = summary.get("peak_mem_total")
        mem = fmt_bytes(summary["peak_mem_used"]) + (f"/{fmt_bytes(total)}" if total else "")
        parts.append(f"peak GPU mem {mem} (GPU {summary['peak_gpu']})")
    else:
        parts.append("peak GPU mem N/A")
    util = summary.get("mean_util")
    parts.append(f"util {util:.0f}%" if util is not None else "util N/A")
    return ", ".join(parts)


# ---------------------------------------------------------------- metrics.jsonl writer

class MetricsWriter(BoundedJsonl):
    """Appends samples to metrics.jsonl, keeping the file under `max_bytes` (newest samples kept)."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = DEFAULT_METRICS_CAP_BYTES,
                 keep_fraction: float = 0.5) -> None:
        super().__init__(path, max_bytes, keep_fraction)

    def write(self, sample: Sample) -> None:
        self.append(sample)

    __call__ = write    # so a writer can be a Sampler's on_sample directly


def read_samples(path: str | os.PathLike[str], last: int | None = None) -> list[Sample]:
    """Whole samples from metrics.jsonl (a torn last line is skipped)."""
    return read_jsonl(path, last)
