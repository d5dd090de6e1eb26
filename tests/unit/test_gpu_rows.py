"""The raw plan against every row of one GPU session (shared/gpu/2026-12-04, issue 28; bench/bench_gpu_rows.py).

The figures are the copy in bench/results/gpu-2026-12-04.json, so this runs without the shared folder. The held-out
half (the bench's memory cases) is held to the issue's targets: peak memory within +-10 %, step time within +-15 %,
less the misses named here with their reason; a named miss that comes within the target fails too, so that the list
is shortened when the model improves. The fit half (the `wizard tune` trials, on which the CPU step's per-thread
bandwidth and the LoRA adapter bytes were chosen) is held to the same targets.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu_rows", ROOT / "bench" / "bench_gpu_rows.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

MEMORY_PCT, STEP_PCT = bench.MEMORY_BOUND_PCT, bench.STEP_BOUND_PCT

# Held-out step times the model misses, and why (bench/results/gpu-2026-12-04.md, "Named misses, and what was ruled
# out"): no mechanism is established for them, so no constant was chosen on them.
KNOWN_STEP_MISSES = {
    # 22 ms per decoder layer per step in both rows, not per token or byte. Ruled out: gathers (none at world size
    # 1), the sub-group optimizer step and the gradient path (about a tenth), allocator flushes (the 3B had
    # 48 GiB free); ZeRO-3's hooks measured on the CPU (bench/bench_zero3_overhead.py) cover a fraction, and the
    # published multi-GPU ZeRO-3 rows show 0-7 ms per layer. A GPU run of that script decides.
    "llama-2-7b zero3 s512 b7 GC off",
    "llama-3.2-3b zero3 s2048 b4 GC off",
    # A 0.5B model's 87 ms step: a host-bound step or memory-bound work outside the matmuls; one step cannot tell.
    "qwen2.5-0.5b single s512 b8 GC off",
}
# Fit-half memory the model misses: torch's caching allocator held 9.2 GiB beyond the live tensors, which the
# estimate matches to 0.2 % (the allocator releases its cache before it reports an out-of-memory).
KNOWN_MEMORY_MISSES = {"tune-lora-run2/03-single-mb8x1-gc"}


@pytest.fixture(scope="module")
def results():
    return {r.id: r for r in bench.evaluate()}


def test_every_row_of_the_session_is_predicted(results):
    assert len(results) == 14
    assert {r.half for r in results.values()} == {"fit", "held-out"}
    assert sum(r.half == "held-out" for r in results.values()) == 7


def test_held_out_memory_within_ten_per_cent(results):
    for r in results.values():
        if r.half == "held-out":
            assert abs(r.memory_error_pct) <= MEMORY_PCT, (r.id, r.memory_error_pct)


def test_held_out_step_time_within_fifteen_per_cent_but_the_named_misses(results):
    held = [r for r in results.values() if r.half == "held-out"]
    missed = {r.id for r in held if abs(r.step_error_pct) > STEP_PCT}
    assert missed == KNOWN_STEP_MISSES, {r.id: round(r.step_error_pct, 1) for r in held}


def test_fit_half_within_the_targets(results):
    fit = [r for r in results.values() if r.half == "fit"]
    for r in fit:
        assert abs(r.step_error_pct) <= STEP_PCT, (r.id, r.step_error_pct)
    missed = {r.id for r in fit if abs(r.memory_error_pct) > MEMORY_PCT}
    assert missed == KNOWN_MEMORY_MISSES
    for rid in KNOWN_MEMORY_MISSES:
        assert abs(results[rid].tensors_error_pct) <= 2.0           # the live tensors are right


def test_zero3_with_one_process_is_neither_double_counted_nor_short(results):
    """The ZeRO-3 rows were +13.8 % and +15.7 % (the fp32 gradient partition, the gathered copies); their tensors
    now match torch's max_memory_allocated to about 1 %."""
    for rid in ("llama-2-7b zero3 s512 b7 GC off", "llama-3.2-3b zero3 s2048 b4 GC off"):
        r = results[rid]
        assert r.before_error_pct > 13 and abs(r.memory_error_pct) <= 5 and abs(r.tensors_error_pct) <= 2


def test_cpu_offload_step_is_no_longer_thirty_six_times_too_slow(results):
    r = results["tune-offload/01-zero2-offload-opt"]
    assert r.before_step / r.measured_step > 30                    # 34.77 s predicted, 0.968 s measured
    assert abs(r.step_error_pct) <= STEP_PCT and r.bound == "offload"


def test_launch_memory_matches_nvidia_smi_once_the_driver_reserve_is_apart():
    """The recorded metrics.jsonl (NVML v1) read 615 MiB above nvidia-smi throughout; the v2 figure the sampler now
    reads agrees within 2 % where nvidia-smi shows at least 1 GiB."""
    cmp = bench.launch_comparison()
    assert 600 < cmp["recorded"]["mem_mib"] < 630
    assert cmp["v2"]["mem_mib"] < 5 and cmp["v2"]["mem_pct_busy"] < 2.0
    # Utilisation: the pairs are 70 ms apart; the two straddling the run's start and end carry the 5.5 pp.
    assert cmp["recorded"]["mean_dt_s"] < 0.1
    assert cmp["recorded"]["util_pp"] > 5 and cmp["recorded"]["util_pp_steady"] < 3
