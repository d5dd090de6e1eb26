"""`wizard plan --model`, cold against the torch + transformers import floor (target: ratio <= 1.5) and
warm from the caches (target: <= 0.5 s).

Every figure is a fresh Python process, so imports are included (they are nearly all of the cost):
- floor, bare: `import torch, transformers` (the issue's yardstick; transformers is lazy, so this
  does not yet load any modeling code);
- floor, honest: the bare floor plus `AutoConfig`, `AutoModelForCausalLM` and the Llama config and
  modeling classes: what any sizing that builds a Llama through transformers has to import;
- floor, bare, GC paused: the bare floor importing the way sizing does (cyclic GC off during the
  import, then gc.freeze), to show how much of the gap is that treatment rather than less work;
- cold plan: `wizard plan --model <config> --assume 8xH100-80GB --dry-run` with WIZARD_NO_CACHE=1
  (sizing from scratch, then the plan), for the Llama-3.1-8B and Llama-3-70B fixture configs, and 70B with
  `--method qlora`. The 70B full fine-tune does not fit one 8xH100 node, so its plan also sizes the LoRA
  and QLoRA adapters it names instead (counted on the same meta model);
- warm plan: each of those again with the sizing and adapter caches filled (no torch, transformers or peft).
The processes run round-robin, so a neighbour's burst lands on every figure alike. The box this
runs on is often shared: the spread (min..max) is printed next to each median, wall and CPU time
both (CPU time is less disturbed by neighbours, wall time is what a user waits). The ratios divide
medians; the cold verdict uses the bare floor, as the issue does; the warm one the wall median (and, for a
busy box, the CPU median beside it).

Run: python bench/bench_sizing.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "fixtures" / "models"
TARGET_RATIO = 1.5       # cold plan / bare floor
TARGET_WARM = 0.5        # seconds, wall, of a warm plan
PLAN_OK = (0, 3)   # 3: nothing fits (the 70B full fine-tune on one 8xH100 node); the sizing still ran


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh process."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **env})
    wall = time.perf_counter() - start
    if result.returncode not in ok:
        raise SystemExit(f"bench process {argv} failed ({result.returncode}):\n{result.stderr}")
    return wall, _children_cpu() - cpu_before


def _plan_argv(model: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "wizard", "plan", "--model", str(MODELS / model), "--assume", "8xH100-80GB",
            "--dry-run", *extra]


PLANS = {"Llama-3.1-8B": ("llama-3.1-8b",), "Llama-3-70B": ("llama-3-70b",),
         "Llama-3-70B qlora": ("llama-3-70b", "--method", "qlora")}


def _cases(cache_dir: str) -> dict[str, tuple[list[str], dict[str, str], tuple[int, ...]]]:
    honest = ("import torch, transformers; from transformers import AutoConfig, AutoModelForCausalLM;"
              "transformers.LlamaConfig; transformers.LlamaForCausalLM")
    cold = {"WIZARD_NO_CACHE": "1"}
    warm = {"WIZARD_CACHE_DIR": cache_dir, "WIZARD_NO_CACHE": ""}
    cases = {
        "floor, bare": ([sys.executable, "-c", "import torch, transformers"], {}, (0,)),
        "floor, bare, GC paused": ([sys.executable, "-c", "import gc; gc.disable(); import torch, transformers;"
                                                        "gc.freeze(); gc.enable()"], {}, (0,)),
        "floor, honest (+Llama modeling)": ([sys.executable, "-c", honest], {}, (0,)),
    }
    for name, (model, *extra) in PLANS.items():
        cases[f"cold plan, {name}"] = (_plan_argv(model, *extra), cold, PLAN_OK)
    for name, (model, *extra) in PLANS.items():
        cases[f"warm plan, {name}"] = (_plan_argv(model, *extra), warm, PLAN_OK)
    return cases


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} s ({min(values):.2f}..{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per figure (median reported)")
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average before "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as cache_dir:
        cases = _cases(cache_dir)
        for name, (argv, env, ok) in cases.items():
            if name.startswith("warm"):
                _timed(argv, env, ok)   # fills the sizing and adapter caches the warm rows read
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, (argv, env, ok) in cases.items():
                runs[name].append(_timed(argv, env, ok))

    wall = {name: statistics.median(w for w, _ in r) for name, r in runs.items()}
    cpu = {name: statistics.median(c for _, c in r) for name, r in runs.items()}
    bare, honest = "floor, bare", "floor, honest (+Llama modeling)"
    print(f"{'':34s} {'wall median (min..max)':25s} {'cpu median (min..max)':25s} "
          f"{'/bare wall/cpu':15s} {'/honest wall/cpu':17s} target")
    for name, r in runs.items():
        ratios, verdict = "", ""
        if not name.startswith("floor"):
            ratios = (f"{wall[name] / wall[bare]:5.2f}/{cpu[name] / cpu[bare]:<5.2f}    "
                      f"{wall[name] / wall[honest]:5.2f}/{cpu[name] / cpu[honest]:<5.2f}     ")
            if name.startswith("cold"):
                verdict = f"<= {TARGET_RATIO} x bare: {'OK' if wall[name] / wall[bare] <= TARGET_RATIO else 'OVER'}"
            else:
                verdict = f"<= {TARGET_WARM} s: {'OK' if wall[name] <= TARGET_WARM else 'OVER'}"
        print(f"{name:34s} {_spread([w for w, _ in r]):25s} {_spread([c for _, c in r]):25s} {ratios}{verdict}")
    for label, medians in (("wall", wall), ("cpu", cpu)):
        worst = max(medians[n] / medians[bare] for n in medians if n.startswith("cold"))
        verdict = "OK" if worst <= TARGET_RATIO else "OVER"
        print(f"worst cold plan / bare floor ({label} medians): {worst:.2f} -> {verdict} (target <= {TARGET_RATIO})")
    for label, medians in (("wall", wall), ("cpu", cpu)):
        slowest = max(medians[n] for n in medians if n.startswith("warm"))
        print(f"slowest warm plan ({label} median): {slowest:.2f} s -> {'OK' if slowest <= TARGET_WARM else 'OVER'} "
              f"(target <= {TARGET_WARM} s)")
    print(f"load average after {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
