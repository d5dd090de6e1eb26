"""Cold sizing time for the 70B and 405B fixture configs (target: under 5 s cold).

Each figure is a fresh Python process running `size_model` once, so imports of torch and
transformers are included (they are most of the cost). Two cases per config:
- uncached: an empty sizing cache (what a first `wizard plan --model X` costs);
- cached: the same config sized again (the on-disk sizing cache skips torch/transformers).
For reference the import floor (torch, transformers, and the Llama config + modeling modules
that any transformers-based sizing must load) is measured the same way: sizing itself adds
about 0.2 s to it; the rest is transformers' import time.

Run: python bench/bench_sizing.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
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
CONFIGS = ["llama-3-70b", "llama-3.1-405b"]
TARGET_S = 5.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_process(code: str, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one fresh process. CPU time is printed too because
    on a shared 2-core box wall time mostly measures the neighbours."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env={**os.environ, **env})
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"bench process failed:\n{result.stderr}")
    return elapsed, _children_cpu() - cpu_before, result.stdout.strip()


def _row(label: str, runs: list[tuple[float, float]], extra: str = "") -> str:
    walls = [w for w, _ in runs]
    cpus = [c for _, c in runs]
    return (f"{label:32s} wall median {statistics.median(walls):5.2f} s (min {min(walls):5.2f})   "
            f"cpu median {statistics.median(cpus):5.2f} s   {extra}").rstrip()


def _size_code(path: Path) -> str:
    return ("import json; from wizard.model import size_model;"
            f"s = size_model({str(path)!r}); print(json.dumps([s.params, s.largest_layer_params]))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per figure (median reported)")
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    floor = [_timed_process("import torch, transformers", {})[:2] for _ in range(args.repeat)]
    print(_row("import torch, transformers", floor))
    # What any transformers-based sizing must import: the config and modeling modules.
    imports = ("import torch, transformers; transformers.LlamaConfig; transformers.LlamaForCausalLM")
    floor_llama = [_timed_process(imports, {})[:2] for _ in range(args.repeat)]
    print(_row("+ Llama config and modeling", floor_llama))

    for name in CONFIGS:
        uncached, cached, counts = [], [], None
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as cache:
                env = {"WIZARD_CACHE_DIR": cache}
                wall, cpu, out = _timed_process(_size_code(MODELS / name), env)
                uncached.append((wall, cpu))
                wall, cpu, out_again = _timed_process(_size_code(MODELS / name), env)
                cached.append((wall, cpu))
                assert out == out_again, (out, out_again)
                counts = json.loads(out)
        best = min(w for w, _ in uncached)
        verdict = "OK" if best < TARGET_S else f"OVER the {TARGET_S:.0f} s target"
        print(_row(f"{name} uncached", uncached, f"best wall {verdict}; params={counts[0]:,}"))
        print(_row(f"{name} cached", cached))

if __name__ == "__main__":
    main()
