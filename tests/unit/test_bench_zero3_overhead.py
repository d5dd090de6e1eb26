"""bench/bench_zero3_overhead.py's summary: per-layer slopes from two layer counts, after the warm-up steps.

bench/results/gpu-2026-12-04.md quotes these slopes (ZeRO-3's hooks against plain torch); the runs themselves need
DeepSpeed and minutes of CPU, so they are a bench, not a test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_zero3_overhead", ROOT / "bench" / "bench_zero3_overhead.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def _run(mode: str, layers: int, per_layer_host: float, per_layer_wall: float) -> dict:
    # two slow warm-up steps, then steady ones: the summary must ignore the former
    host = [1.0, 1.0] + [0.010 + per_layer_host * layers] * 2
    wall = [2.0, 2.0] + [0.020 + per_layer_wall * layers] * 2
    return {"mode": mode, "layers": layers, "tensors": 9 * layers + 3, "host_s": host, "wall_s": wall}


def test_slopes_are_per_layer_after_warm_up_and_zero3_is_compared_with_plain_torch():
    results = [_run("plain", 4, 0.002, 0.003), _run("plain", 32, 0.002, 0.003),
               _run("zero3", 4, 0.009, 0.022), _run("zero3", 32, 0.009, 0.022)]
    lines = bench.summarise(results)
    assert "| plain | 3.00 | 2.00 | – |" in lines
    assert "| zero3 | 22.00 | 9.00 | 7.00 |" in lines


def test_warm_up_is_skipped_only_when_there_are_steps_after_it():
    assert bench.median_after_warmup([5.0, 5.0, 1.0, 2.0, 3.0]) == 2.0
    assert bench.median_after_warmup([4.0, 2.0]) == 3.0
