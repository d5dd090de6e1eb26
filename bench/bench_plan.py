"""Time one plan (target for the UI: a re-plan well under 50 ms) and one nothing-fits explanation.

Usage: python bench/bench_plan.py [repeats]
"""

from __future__ import annotations

import sys
import time

from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions, explain_nothing_fits, make_plan
from wizard.probe.hardware import GPU, Hardware
from wizard.sizing.model import ModelShape
from wizard.units import GiB

LLAMA3_70B = ModelShape(params=70_553_706_496, largest_layer_params=128_256 * 8192, hidden_size=8192, layers=80,
                        heads=64, kv_heads=8, vocab_size=128_256, intermediate_size=28_672)


def machine(n: int, gib: int, ram_gib: int) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name="H100", memory_total=gib * GiB, bf16=True) for i in range(n)],
                    ram_total=ram_gib * GiB, ram_available=ram_gib * GiB)


def timed(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1000, times[-1] * 1000


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    t0 = time.perf_counter()
    hw = machine(8, 80, 2048)
    topo = Topology(processes_per_machine=8)
    make_plan(hw, LLAMA3_70B, TrainingOptions(), StrategyOptions(), topo)
    print(f"first plan (cold): {(time.perf_counter() - t0) * 1000:.2f} ms")
    median, worst = timed(lambda: make_plan(hw, LLAMA3_70B, TrainingOptions(), StrategyOptions(), topo), repeats)
    print(f"make_plan 70B on 8x80GB, {repeats} runs: median {median:.3f} ms, worst {worst:.3f} ms (target < 50 ms)")

    small = machine(1, 24, 64)
    one = Topology()
    plan = make_plan(small, LLAMA3_70B, TrainingOptions(), StrategyOptions(), one)
    assert plan.choice is None
    median, worst = timed(lambda: explain_nothing_fits(plan, small, LLAMA3_70B, TrainingOptions(),
                                                       StrategyOptions(), one), max(repeats // 20, 3))
    print(f"explain_nothing_fits 70B on 1x24GB (searches up to 128 machines): median {median:.1f} ms, "
          f"worst {worst:.1f} ms")


if __name__ == "__main__":
    main()
