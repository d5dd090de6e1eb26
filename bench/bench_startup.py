"""Cold start of the wizard's light commands against `accelerate config --help`, same machine, same run.

Target (issue 2): each wizard command under 0.15 of accelerate's time. Prints the figures and the
ratios; it asserts nothing (speed targets are figures, not tests). Also reports whether torch,
transformers or deepspeed were imported (they must not be).

    python bench/bench_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "deepspeed")

COMMANDS = {
    "wizard --help": ["-m", "wizard", "--help"],
    "wizard probe --json": ["-m", "wizard", "probe", "--json"],
    "wizard plan --params 7B --assume 8xA100-80GB --json": [
        "-m", "wizard", "plan", "--params", "7B", "--assume", "8xA100-80GB", "--json"],
}


def time_cmd(argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def heavy_imports(args: list[str]) -> list[str]:
    code = ("import sys, runpy; sys.argv=['wizard'] + %r\n"
            "try:\n    runpy.run_module('wizard', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(','.join(m for m in %r if m in sys.modules), file=sys.stderr)") % (args[2:], HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    return [m for m in last.split(",") if m in HEAVY]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    accel = shutil.which("accelerate")
    base = time_cmd([accel, "config", "--help"], args.repeat) if accel else None
    print(f"{'command':<58} {'median s':>9} {'ratio':>7}  heavy imports")
    if base:
        print(f"{'accelerate config --help':<58} {base:>9.3f} {1.0:>7.2f}")
    for name, argv in COMMANDS.items():
        t = time_cmd([sys.executable, *argv], args.repeat)
        ratio = f"{t / base:.3f}" if base else "n/a"
        heavy = heavy_imports(argv) or ["none"]
        print(f"{name:<58} {t:>9.3f} {ratio:>7}  {','.join(heavy)}")
    print(f"target: ratio < 0.15 (python {sys.version.split()[0]}, {os.cpu_count()} cpus)")


if __name__ == "__main__":
    main()
