"""How long the hardware probe takes: cold (a fresh interpreter, as `wizard probe` pays it) and
warm (in-process), on this machine's NVML and on the fake 8xH100. Prints figures, asserts nothing.

    python bench/bench_probe.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def cold(fake: str, runs: int) -> list[float]:
    code = "import wizard.probe.hardware as h; h.probe()"
    env = {**os.environ, "WIZARD_FAKE_NVML": fake}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
        times.append(time.perf_counter() - start)
    return times


def baseline(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
        times.append(time.perf_counter() - start)
    return times


def warm(fake: str, runs: int) -> list[float]:
    from wizard.probe import hardware

    old = os.environ.get("WIZARD_FAKE_NVML")
    os.environ["WIZARD_FAKE_NVML"] = fake
    try:
        hardware.probe()                               # first call pays the imports
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            hardware.probe()
            times.append(time.perf_counter() - start)
        return times
    finally:
        if old is None:
            os.environ.pop("WIZARD_FAKE_NVML", None)
        else:
            os.environ["WIZARD_FAKE_NVML"] = old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    empty = statistics.median(baseline(runs))
    print(f"python -c pass (interpreter start):        {empty * 1000:7.1f} ms")
    for label, fake in (("this machine's NVML", ""), ("fake 8xH100-80GB", "8xH100-80GB")):
        c = statistics.median(cold(fake, runs))
        w = statistics.median(warm(fake, runs))
        print(f"probe, {label:22s} cold: {c * 1000:7.1f} ms ({(c - empty) * 1000:6.1f} ms over start-up), "
              f"warm: {w * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
