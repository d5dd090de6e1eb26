"""bench/gpu/measure.py --dry-run-cpu end to end: the whole measuring script, its launch through
`wizard launch --headless` included, on this CPU (slow: real trainings). The pure parts are in
tests/unit/test_gpu_bench.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.report import CASE_COLUMNS

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "bench" / "gpu"


# ----------------------------------------------------------------------------- the dry run

def _dry_run(tmp_path: Path, *extra: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path / "dry.md"
    r = subprocess.run([sys.executable, str(GPU_DIR / "measure.py"), "--dry-run-cpu", "--out", str(out), *extra],
                       capture_output=True, text=True, cwd=str(REPO), timeout=timeout)
    report = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    return r, report, out.read_text() if out.exists() else ""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dry_run_quick_end_to_end(tmp_path):
    r, report, md = _dry_run(tmp_path, "--quick")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cases = report["cases"]
    assert len(cases) >= 6
    roles = [c["case"]["role"] for c in cases]
    assert roles.count("smallest-headroom") == 1 and roles.count("predicted-oom") == 1
    oom = cases[roles.index("predicted-oom")]
    assert not oom["predicted_fits"]
    assert oom["predicted_bytes"] >= 1.05 * oom["prediction"]["capacity_bytes"]
    head = cases[roles.index("smallest-headroom")]
    assert head["predicted_fits"] and head["prediction"]["per_gpu_bytes"] <= head["prediction"]["usable_bytes"]
    # one tiny CPU training per backend ran the real code path; nothing is "measured" on a CPU
    ran = [c for c in cases if c["status"] == "ok"]
    assert {c["case"]["backend"] for c in ran} == {"single", "zero2", "zero3"}
    for c in ran:
        child = c["run"]["child"]
        assert child["max_memory_reserved"] is None and child["steps_done"] == 2
        assert c["measured_bytes"] is None and c["error_pct"] is None and c["decision"] == "unknown"
        engine = child["engine"]
        if c["case"]["backend"] == "single":
            assert engine["engine_class"] != "DeepSpeedEngine"
        else:
            assert engine["engine_class"] == "DeepSpeedEngine"
            assert engine["zero_stage"] == int(c["case"]["backend"][-1])
    for c in cases:
        if c["status"] != "ok":
            assert c["status"] == "skipped" and "--quick" in c["run"]["error"]
    # the table: header + separator + one row per case, a cell per column
    rows = [line for line in md.splitlines() if line.startswith("| ") and line.count("|") ==
            len(CASE_COLUMNS) + 1]
    assert rows[0].startswith("| # | role | configuration | predicted GiB")
    assert len(rows) == 1 + len(cases)
    # probe through the fake NVML; pynvml and nvidia-smi honestly absent
    assert "NVIDIA H200" in report["meta"]["gpu"]
    assert report["nvml"]["available"] is False and report["nvidia_smi"]["available"] is False
    # launch through `wizard launch --headless`, compared against the fake reference
    la = report["launch"]
    assert la["returncode"] == 0 and la["run_status"] == "succeeded", la
    assert la["diffs"]["pairs"] >= 3 and "fake NVML" in la["reference"]
    assert la["train"]["status"] == "ok" and la["train"]["steps_done"] >= 1
    assert (tmp_path / "dry-files" / "launch-metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dry_run_out_of_budget_skips_every_training_and_says_why(tmp_path):
    r, report, md = _dry_run(tmp_path, "--quick", "--budget-s", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(report["cases"]) >= 6
    assert all(c["status"] == "skipped" and "time budget" in c["run"]["error"] for c in report["cases"])
    assert "time budget" in report["launch_skipped"] and "launch" not in report
    assert "time budget" in md
