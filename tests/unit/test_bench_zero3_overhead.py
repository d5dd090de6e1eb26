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
    assert "| plain | 3.00 | 2.00 | – | – |" in lines
    assert "| zero3 | 22.00 | 9.00 | 7.00 | – |" in lines


def test_warm_up_is_skipped_only_when_there_are_steps_after_it():
    assert bench.median_after_warmup([5.0, 5.0, 1.0, 2.0, 3.0]) == 2.0
    assert bench.median_after_warmup([4.0, 2.0]) == 3.0


def _trace() -> list[dict]:
    """A CUDA step as torch.profiler's chrome trace has it: overlapping kernels on two streams, a copy, syncs."""
    def x(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    return [
        x("kernel", "gemm", 1000.0, 300.0),           # 1000-1300
        x("kernel", "nccl", 1200.0, 300.0),           # overlaps: 1300-1500 new
        x("gpu_memcpy", "Memcpy DtoD", 2000.0, 100.0),
        x("gpu_memset", "Memset", 2050.0, 100.0),     # 2100-2150 new
        x("kernel", "adam", 5000.0, 500.0),
        x("cuda_runtime", "cudaLaunchKernel", 990.0, 5.0),
        x("cuda_runtime", "cudaLaunchKernel", 1190.0, 5.0),
        x("cuda_runtime", "cudaStreamSynchronize", 1600.0, 2000.0),
        x("cuda_runtime", "cudaEventSynchronize", 4000.0, 900.0),
        x("cuda_runtime", "cudaEventRecord", 4950.0, 2.0),
        x("cuda_runtime", "cudaDeviceSynchronize", 3000.0, 10.0),    # DeepSpeed's own: counted
        x("cuda_runtime", "cudaDeviceSynchronize", 5100.0, 400.0),   # the bench's, ending the step: apart
        x("cpu_op", "aten::mm", 900.0, 50.0),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0.0},   # an instant: no duration, not GPU time
    ]


def test_the_trace_gives_gpu_busy_time_once_per_overlap_and_the_hosts_time_in_syncs():
    f = bench.trace_figures(_trace())
    assert abs(f["gpu_busy_s"] - (500 + 150 + 500) / 1e6) < 1e-12
    assert abs(f["gpu_span_s"] - (5500 - 1000) / 1e6) < 1e-12
    assert abs(f["sync_s"] - 2910 / 1e6) < 1e-12 and abs(f["final_sync_s"] - 400 / 1e6) < 1e-12
    assert f["sync_calls"] == {"cudaStreamSynchronize": 1, "cudaEventSynchronize": 1, "cudaDeviceSynchronize": 1}
    assert (f["kernels"], f["launches"]) == (3, 2)


def test_a_trace_without_gpu_events_has_no_busy_time():
    f = bench.trace_figures([e for e in _trace() if e.get("cat") not in bench.GPU_CATEGORIES])
    assert f["gpu_busy_s"] is None and f["gpu_span_s"] is None


def test_the_verdict_separates_gpu_bound_host_bound_and_serialised_steps():
    assert bench.verdict(1.0, {"gpu_busy_s": 0.9, "sync_s": 0.0, "wall_s": 1.0}).startswith("GPU-bound")
    assert "host-bound" in bench.verdict(1.0, {"gpu_busy_s": 0.4, "sync_s": 0.05, "wall_s": 1.0})
    assert "serialised" in bench.verdict(1.0, {"gpu_busy_s": 0.4, "sync_s": 0.5, "wall_s": 1.0})
    assert bench.verdict(1.0, None) == "–"


def test_the_profiled_columns_and_the_gpu_busy_slope_appear_when_a_run_was_profiled():
    runs = [_run("zero3", n, 0.009, 0.037) for n in (4, 12)]
    for r, busy in zip(runs, (0.08, 0.20)):
        r["profile"] = {"wall_s": 0.2, "gpu_busy_s": busy, "sync_s": 0.01, "sync_calls": {"cudaMemcpyAsync": 3},
                        "kernels": 900}
    lines = bench.summarise(runs)
    assert any(l.startswith("| zero3 | 12 |") and "| 200.0 | 200.0 | 10.0 (3) | 900 | GPU-bound" in l for l in lines)
    assert "| zero3 | 37.00 | 9.00 | – | 15.00 |" in lines


def test_a_presets_children_get_its_shape_not_the_command_lines():
    args = bench.parse_args(["--preset", "gpu-misses", "--device", "cuda", "--width", "64"])
    groups = bench.groups(args)
    assert [g[2] for g in groups] == [("zero3", "plain"), ("plain",), ("zero2",), ("zero3",)]
    title, run_args, modes, layers = groups[0]
    cmd = bench.child_command(run_args, "zero3", layers[-1])
    assert cmd[cmd.index("--width") + 1] == "4096" and cmd[cmd.index("--micro-batch") + 1] == "7"
    assert cmd[-3:] == ["--child", "zero3", "12"] and "--profile" in cmd      # cuda profiles by default
    assert bench.child_command(bench.groups(args)[3][1], "zero3", 4)[cmd.index("--seq") + 1] == "1024"
    plain = bench.parse_args(["--width", "64", "--no-profile"])
    cmd = bench.child_command(bench.groups(plain)[0][1], "plain", 4)
    assert cmd[cmd.index("--width") + 1] == "64" and "--no-profile" in cmd and "--device" in cmd


def test_a_spent_budget_starts_no_run_and_says_which_were_not_run(tmp_path, capsys):
    md, js = tmp_path / "z.md", tmp_path / "z.json"
    assert bench.main(["--preset", "gpu-misses", "--budget-s", "-1", "--md", str(md), "--json", str(js)]) == 0
    text = md.read_text()
    assert "## Llama-2-7B row's shape, one process: plain torch against ZeRO-3" in text
    assert "zero3 with 12 layers (budget of -1 s spent)" in text
    import json
    assert json.loads(js.read_text())["results"] == [] and len(json.loads(js.read_text())["not_run"]) == 10
