"""Time `wizard compare` over the default machine set (33 machines) for Llama-3-70B after the first sizing
(target: the whole comparison <= 5 s), full fine-tuning and LoRA, and print per-row figures.

The first build sizes the model (or reads the sizing cache); every row after it is `wizard plan --assume MACHINE`
through wizard.pipeline.build. Usage: python bench/bench_compare.py [repeats]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from wizard import compare as compare_mod
from wizard.pipeline import Request, build

ROOT = Path(__file__).resolve().parents[1]
LLAMA_70B = str(ROOT / "tests" / "fixtures" / "models" / "llama-3-70b")
TARGET_S = 5.0


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    machines = compare_mod.default_machines()
    t = time.perf_counter()
    build(Request(given={"model": LLAMA_70B}, assume="8xH100-80GB", plan_only=True))
    print(f"first sizing and plan: {time.perf_counter() - t:.2f} s")
    for label, given in (("full fine-tuning", {"model": LLAMA_70B, "train_tokens": "1e9"}),
                         ("LoRA r=16", {"model": LLAMA_70B, "method": "lora", "train_tokens": "1e9"})):
        # The first comparison sizes what the first build did not: LoRA's adapters per precision (fp16 on V100s
        # sizes them again, with peft); on a second run they come from the cache, like the model.
        t = time.perf_counter()
        compare_mod.compare(given, machines)
        print(f"70B {label}: first comparison {time.perf_counter() - t:.2f} s")
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            result = compare_mod.compare(given, machines)
            times.append(time.perf_counter() - t)
        times.sort()
        fits = sum(r.fits for r in result.rows)
        errors = sum(r.error is not None for r in result.rows)
        print(f"70B {label}: {len(machines)} machines, median {times[len(times) // 2]:.2f} s, worst {times[-1]:.2f} s "
              f"over {repeats} runs ({times[-1] / len(machines) * 1000:.0f} ms per machine); {fits} fit, "
              f"{len(machines) - fits - errors} do not, {errors} errors; target <= {TARGET_S:.0f} s: "
              f"{'met' if times[-1] <= TARGET_S else 'MISSED'}")
        best = result.fastest
        if best is not None:
            print(f"  fastest: {best.machine.label}, {best.rung}, {best.tokens_per_second:,.0f} tok/s")


if __name__ == "__main__":
    main()
