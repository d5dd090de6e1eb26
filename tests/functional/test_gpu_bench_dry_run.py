"""bench/gpu/measure.py --dry-run-cpu end to end: the whole measuring script, its launch through
`wizard launch --headless` included, on this CPU (slow: real trainings). The pure parts are in
tests/unit/test_gpu_bench.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu.report import CASE_COLUMNS

pytestmark = pytest.mark.bench    # the GPU bench's own harness: CI runs it with the newest libraries only (.ci/run)

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
@pytest.mark.timeout(900)      # the first offload case may JIT-build DeepSpeed's CPU Adam (minutes on 2 cores)
def test_dry_run_quick_end_to_end(tmp_path):
    r, report, md = _dry_run(tmp_path, "--quick", timeout=880)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cases = report["cases"]
    assert len(cases) >= 11
    roles = [c["case"]["role"] for c in cases]
    assert roles.count("smallest-headroom") == 1 and roles.count("predicted-oom") == 1
    oom = cases[roles.index("predicted-oom")]
    assert not oom["predicted_fits"]
    assert oom["predicted_bytes"] >= 1.05 * oom["prediction"]["capacity_bytes"]
    head = cases[roles.index("smallest-headroom")]
    assert head["predicted_fits"] and head["prediction"]["per_gpu_bytes"] <= head["prediction"]["usable_bytes"]
    # one tiny CPU training per kind (method and rung) ran the real code path; nothing is "measured" on a CPU
    ran = [c for c in cases if c["status"] == "ok"]
    kinds = {(c["case"]["method"], c["case"]["backend"]) for c in ran}
    assert kinds >= {("full", "single"), ("full", "zero2"), ("full", "zero3"), ("lora", "single"),
                     ("qlora", "single"), ("full", "zero2-offload-opt"), ("full", "zero3-offload-all")}, kinds
    for c in cases:                 # every row has the predicted step time beside the memory
        assert c["predicted_step_s"] and c["predicted_step_s"] > 0, c["label"]
    for c in ran:
        child = c["run"]["child"]
        assert child["max_memory_reserved"] is None and child["steps_done"] == 2
        assert c["measured_bytes"] is None and c["error_pct"] is None and c["decision"] == "unknown"
        assert c["measured_step_s"] is None and c["step_error_pct"] is None and len(child["step_times_s"]) == 2
        engine, backend, method = child["engine"], c["case"]["backend"], c["case"]["method"]
        if backend == "single":
            assert engine["engine_class"] != "DeepSpeedEngine"
        else:
            assert engine["engine_class"] == "DeepSpeedEngine"
            assert engine["zero_stage"] == int(backend[len("zero")])
        if "offload" in backend:    # the wizard's ds_config hands the step to DeepSpeed's CPU Adam
            assert engine["inner_optimizer_class"] == "DeepSpeedCPUAdam", engine
        if method != "full":
            assert engine["model_class"].startswith("PeftModel") and child["trainable_params"] < child["params"]
        assert (engine["linear4bit_modules"] > 0) == (method == "qlora")   # bitsandbytes' CPU backend quantised it
    fsdp = next(c for c in cases if c["case"]["backend"] == "fsdp-reshard")
    # accelerate makes FSDP only on an accelerator: the case ran up to the Trainer and says so, nothing trained
    assert fsdp["status"] == "skipped" and "on the CPU" in fsdp["run"]["error"], fsdp["run"]
    assert fsdp["run"]["child"]["phase"] == "trainer_init" and "steps_done" not in fsdp["run"]["child"]
    for c in cases:
        if c["status"] != "ok" and c is not fsdp:
            assert c["status"] == "skipped" and "--quick" in c["run"]["error"], c["run"]
    # the QLoRA checkpoint, and the loading premise: two ranks under accelerate's FSDP environment, no verdict
    assert report["checkpoints"]["llama-3.1-8b"]["status"] == "ok"
    q = report["qlora_load"]
    assert [r["status"] for r in q["ranks"]] == ["ok", "ok"] and all(r["fsdp_enabled"] for r in q["ranks"])
    assert all(r["held_bytes"].get("cpu") for r in q["ranks"]) and q["verdict"] == "unknown"
    assert q["prediction"]["nf4_model_bytes"] > 0 and "dry run" in q["verdict_why"]
    # wizard tune with the Trainer script: every trial completed, nothing compared on a CPU
    t = report["tune"]
    assert t["returncode"] == 0 and t["verdict"] == "complete", t
    assert all(row["error_pct"] is None for row in t["trials"])
    assert "## QLoRA loading premise" in md and "## wizard tune with a Trainer script" in md
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
    assert len(report["cases"]) >= 11
    assert all(c["status"] == "skipped" and "time budget" in c["run"]["error"] for c in report["cases"])
    assert "time budget" in report["launch_skipped"] and "launch" not in report
    assert "time budget" in report["qlora_load_skipped"] and "time budget" in report["tune_skipped"]
    assert not report["checkpoints"]
    assert "time budget" in md


def test_run_on_device_diagnose_writes_its_two_files_into_out_even_when_nothing_runs(tmp_path):
    """`run_on_device.sh --diagnose` (the named misses' GPU call): the install step without wheels, then
    bench_zero3_overhead's gpu-misses preset; with its budget spent before the first run it still leaves the .md and
    .json in $OUT saying what was not run (a GPU session's call cut short keeps its files the same way)."""
    env = dict(os.environ, OUT=str(tmp_path), GPU_BENCH_BUDGET="-1", GPU_BENCH_WHEELS=str(tmp_path / "no-wheels"),
               PYTHON=sys.executable)
    r = subprocess.run(["bash", str(GPU_DIR / "run_on_device.sh"), "--diagnose"], capture_output=True, text=True,
                       cwd=str(REPO), env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "bench_zero3_overhead.py --preset gpu-misses" in r.stdout and "measure.py" not in r.stdout
    md = list(tmp_path.glob("zero3-overhead-*.md"))
    js = list(tmp_path.glob("zero3-overhead-*.json"))
    assert len(md) == 1 and len(js) == 1, list(tmp_path.iterdir())
    text = md[0].read_text()
    assert "device cuda" in text and "zero3 with 4 layers (budget of -1 s spent)" in text
    assert json.loads(js[0].read_text())["args"]["device"] == "cuda"


@pytest.mark.timeout(180)
def test_the_preflights_gpu_check_runs_its_three_parts_on_the_cpu(tmp_path):
    """bench/gpu/preflight_check.py --dry-run-cpu (issue 41): the health read through the fake NVML, every
    operation's code path and data check in one process (--selftest, as on a machine of one GPU), and
    `wizard preflight --json`; each part's result in the report."""
    r = subprocess.run([sys.executable, str(GPU_DIR / "preflight_check.py"), "--dry-run-cpu", "--out",
                        str(tmp_path / "pf.md")], capture_output=True, text=True, cwd=str(REPO), timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "pf.json").read_text())
    assert report["health"] and report["health"][0]["ecc_uncorrected_volatile"] == 0
    runs = report["collective"]["result"]["scopes"]["node"]["ops"]
    assert sorted(runs) == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"]
    assert all(run["check"] == "ok" for op in runs.values() for run in op)
    assert report["preflight"]["rc"] == 0 and report["preflight"]["doc"]["exit_code"] == 0
    assert "| 0 | ecc_enabled | True |" in (tmp_path / "pf.md").read_text()


# ----------------------------------------------------------------------------- the ALST series (issue 38)

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_alst_dry_run_lists_only_the_series_and_skips_the_rest_with_the_reason(tmp_path):
    """`measure.py --alst` (its own device call): the four ALST cases and nothing else; with no budget every case
    says why it did not run, and the grid, the loading premise, tune and the launch are not part of it."""
    r, report, md = _dry_run(tmp_path, "--alst", "--budget-s", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    cases = report["cases"]
    assert [c["case"]["alst"] for c in cases] == ["none", "fused-loss", "fused-loss+tiled-mlp",
                                                  "fused-loss+tiled-mlp+ckpt-offload"]
    assert all(c["case"]["role"] == "alst" and c["status"] == "skipped" and "time budget" in c["run"]["error"]
               for c in cases)
    assert report["launch_skipped"] == "--alst: the ALST series only" and "launch" not in report
    assert "qlora_load" not in report and "tune" not in report and report["meta"]["alst"] is True
    assert "ALST fused-loss+tiled-mlp" in md


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("techniques", ["fused-loss+tiled-mlp", "fused-loss+tiled-mlp+ckpt-offload"])
def test_train_one_runs_alsts_techniques_on_the_cpu_and_refuses_the_offload_there(tmp_path, techniques):
    """The dry run's training of an ALST case: DeepSpeed's fused loss and tiled MLP train a tiny model on the CPU;
    the checkpoint offload has no device memory to free here and says so (status unsupported, nothing trained)."""
    model = tmp_path / "m"
    model.mkdir()
    shapes = json.loads((GPU_DIR / "models.json").read_text())
    (model / "config.json").write_text(json.dumps(shapes["llama-3.2-3b"]))
    r = subprocess.run([sys.executable, str(GPU_DIR / "train_one.py"), "--model-dir", str(model), "--device", "cpu",
                        "--tiny", "--seq-len", "32", "--steps", "2", "--gc", "on", "--alst", techniques,
                        "--output-dir", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=str(REPO), timeout=280,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    line = next(x for x in r.stdout.splitlines() if x.startswith("GPU_BENCH_RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    if techniques.endswith("ckpt-offload"):
        assert r.returncode == 4 and result["status"] == "unsupported" and "on a CPU there is none" in result["error"]
        return
    assert r.returncode == 0 and result["status"] == "ok", result
    assert result["steps_done"] == 2 and result["alst"]["techniques"] == ["fused-loss", "tiled-mlp"]
    assert result["alst"]["tiled_mlps"] == 2 and result["alst"]["fused_loss_shards"] == 1
