"""CPU cost of the GPU metrics sampler at 1 Hz with 8 fake GPUs (target: <= 1 % of one core).

Runs launch.metrics.Sampler against the fake NVML (WIZARD_FAKE_NVML=8xH100-80GB) with the real
MetricsWriter as its callback, for --seconds of wall time, and prints process CPU time over wall
time. The process does nothing else meanwhile (the main thread sleeps), so the figure is the
sampler's. The fake's per-call cost is not real NVML's (real nvmlDeviceGet* calls are ioctls into
the driver, typically tens of microseconds each); run it on a GPU box without the env var to
measure the real thing.

    python bench/bench_sampler.py [--seconds 20] [--interval 1.0] [--gpus 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.metrics import MetricsWriter, Sampler  # noqa: E402
from wizard.probe.nvml import open_nvml  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--real", action="store_true", help="use the real NVML (no fake)")
    args = ap.parse_args()

    if not args.real:
        os.environ["WIZARD_FAKE_NVML"] = f"{args.gpus}xH100-80GB"
    api = open_nvml()
    with tempfile.TemporaryDirectory() as tmp:
        writer = MetricsWriter(Path(tmp) / "metrics.jsonl")
        sampler = Sampler(api, interval=args.interval, on_sample=writer)

        # cost of one sample, measured over many back-to-back calls
        n = 200
        c0, w0 = cpu_seconds(), time.perf_counter()
        for _ in range(n):
            writer(sampler.sample_once())
        per_sample_cpu = (cpu_seconds() - c0) / n
        per_sample_wall = (time.perf_counter() - w0) / n

        c0, w0 = cpu_seconds(), time.perf_counter()
        sampler.start()
        time.sleep(args.seconds)
        sampler.stop()
        cpu, wall = cpu_seconds() - c0, time.perf_counter() - w0
        size = (Path(tmp) / "metrics.jsonl").stat().st_size
    api.close()

    print(f"nvml: {'real' if args.real else 'fake ' + os.environ['WIZARD_FAKE_NVML']}, "
          f"available={api.available}")
    print(f"one sample + write:   {per_sample_cpu * 1e3:.3f} ms CPU, {per_sample_wall * 1e3:.3f} ms wall")
    print(f"sampler thread:       {sampler.count} samples in {wall:.1f} s at {args.interval:g} s interval")
    print(f"CPU use:              {cpu:.4f} s CPU over {wall:.1f} s wall = "
          f"{100 * cpu / wall:.3f} % of one core (target <= 1 %)")
    print(f"metrics.jsonl:        {size / max(1, sampler.count + n):.0f} bytes per sample")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
