"""Ground truth for the memory plan and the launcher on a real NVIDIA GPU (issue 6).

    python bench/gpu/measure.py [--out bench/results/gpu-<date>.md] [--quick] [--dry-run-cpu]
                                [--budget-s 450] [--case-timeout-s 90] [--assume SPEC]

1. Probe: `python -m wizard probe --json`, pynvml read directly (name, memory, compute capability,
   driver, clocks) and `nvidia-smi --query-gpu=...`; every field compared, mismatches flagged.
2. Memory: for each configuration (bench/gpu/cases.json: fixed coverage cases, plus the recommended
   configuration with the smallest headroom and one predicted not to fit, both picked from the
   planner's numbers for the GPU found) the wizard's prediction from the real pipeline
   (wizard.pipeline.build, answers forcing backend / stage / GC / sequence / micro-batch, hardware
   from the probe) and the measured peak of a few HF Trainer steps in a subprocess
   (bench/gpu/train_one.py: torch.cuda.max_memory_reserved + the non-torch memory NVML sees).
   Every row has the predicted step time (the rung's speed, raw model) beside the measured one (the
   median step after the first). v2 (issue 28) adds LoRA (bf16 base) and QLoRA (NF4) of an 8B model,
   ZeRO-2 CPU optimizer offload, ZeRO-3 parameter + optimizer offload and FSDP2 on one process.
3. QLoRA loading premise: two processes on the one GPU each from_pretrained an 8B model in NF4 under
   accelerate's FSDP environment (cpu_ram_efficient_loading); what each holds on the GPU after loading
   against the plan's per-GPU loading peak (qlora_load_check.py).
4. `wizard tune` of a real-size model with a Trainer script (train_real.py), every trial complete
   (tune_check.py).
5. Launcher: `wizard launch --headless` on one configuration while `nvidia-smi -lms 1000` samples
   in parallel; metrics.jsonl (util, mem_used, power_w) compared with it, aligned by time.
6. Results: a markdown table (prediction, measurement, error %, fit decision right or wrong) plus
   a JSON twin, rewritten after every step so that a run cut short still leaves its results.

--alst: only the ALST series of cases.json (issue 38: one GPU, a long sequence, ALST's single-GPU techniques added one
at a time: DeepSpeed's tiled fused loss, tiled MLP, checkpoint offload to CPU; bench/gpu/alst.py), nothing else: no
grid selection, loading premise, tune or launch. Its own device call (run_on_device.sh --alst, under 4 minutes).

--dry-run-cpu does everything a CPU can: the probe (with WIZARD_FAKE_NVML=1xH200), predictions
and case selection for an assumed 1xH200, tiny versions of the trainings on the CPU (measured
peaks are null), and the launch + metrics comparison against the fake NVML instead of nvidia-smi.
--quick: 2 steps instead of 3, a shorter tune and launch; in a dry run, one tiny training per kind
(method and rung). QLoRA runs in a dry run too (bitsandbytes' CPU backend); FSDP does not (accelerate
makes FSDP only on an accelerator): its case goes as far as the Trainer and says it is skipped on the CPU.

Order, so that a run cut short by its budget loses the least: the v2 cases, the QLoRA loading premise,
tune, the smallest-headroom and predicted-OOM cases, the launch case, the rest of the coverage (measured
on 2026-12-04); the launch keeps its reserve throughout.

Nothing is downloaded (run_on_device.sh installs the carried wheels of bench/gpu/wheels, offline); what is missing (torch, CUDA, DeepSpeed, nvidia-ml-py,
nvidia-smi) is detected and reported, and the parts that need it are skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:        # run from a checkout without `pip install -e .`; also finds bench.gpu
    sys.path.insert(0, str(REPO))

from bench.gpu.cases import Planner, Selection, alst_cases, select_cases, spec_from_json, write_models  # noqa: E402
from bench.gpu.common import DRY_RUN_ASSUME, DRY_RUN_FAKE_NVML, GiB  # noqa: E402
from bench.gpu.environment import blocking, environment  # noqa: E402
from bench.gpu.launch_check import run_launch  # noqa: E402
from bench.gpu.memory_check import case_record, case_timeout, run_case  # noqa: E402
from bench.gpu.qlora_load_check import run_qlora_load  # noqa: E402
from bench.gpu.tune_check import run_tune  # noqa: E402
from bench.gpu.probe_compare import compare_probe, load_hardware, nvml_direct, run_probe  # noqa: E402
from bench.gpu.report import gib, summarize, write_report  # noqa: E402
from bench.gpu.runner import (  # noqa: E402
    Budget,
    Interrupted,
    Options,
    child_env,
    keep_tail,
    kill_current_child,
    on_signal,
    parse_result_line,
    run_child,
)
from bench.gpu.smi import gpus_from_smi, smi_static  # noqa: E402

# ============================================================================ main

def default_out(dry_run: bool) -> Path:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    if dry_run:     # a dry run is not a result: keep it out of bench/results
        return Path(tempfile.gettempdir()) / "wizard-gpu-bench" / f"dryrun-cpu-{stamp}.md"
    return REPO / "bench" / "results" / f"gpu-{stamp}.md"


def parse_args(argv=None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="markdown output (JSON twin beside it); default "
                   "bench/results/gpu-<date>.md, or a temp file for --dry-run-cpu")
    p.add_argument("--quick", action="store_true", help="2 steps, a shorter tune and launch; dry run: one training per kind")
    p.add_argument("--dry-run-cpu", action="store_true", help="everything a CPU can do (see the module doc)")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting new work after this (default 450; "
                   "dry run 900: its first offload case may JIT-build DeepSpeed's CPU Adam on a small CPU)")
    p.add_argument("--case-timeout-s", type=float, default=None, help="per configuration (default 120; 60 dry run)")
    p.add_argument("--assume", default=None, help=f"plan for this hardware instead of the probe's "
                   f"(dry run default: {DRY_RUN_ASSUME})")
    p.add_argument("--alst", action="store_true", help="only the ALST series of cases.json (see the module doc)")
    a = p.parse_args(argv)
    dry = bool(a.dry_run_cpu)
    alst = bool(a.alst)
    return Options(
        out_md=Path(a.out) if a.out else default_out(dry), quick=bool(a.quick), dry_run=dry,
        budget_s=float(a.budget_s if a.budget_s is not None else (900.0 if dry else 450.0)),
        case_timeout_s=float(a.case_timeout_s or (60.0 if dry else 120.0)),
        launch_reserve_s=0.0 if alst else 50.0 if a.quick else 60.0, min_case_s=20.0 if dry else 30.0,
        steps=2 if a.quick else 3, launch_seconds=(6.0 if dry else 12.0) if a.quick else 25.0,
        assume=a.assume or (DRY_RUN_ASSUME if dry else None), min_tune_s=30.0 if dry else 60.0, alst=alst)


def main(argv=None) -> int:
    opts = parse_args(argv)
    budget = Budget(opts.budget_s)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    results_dir = opts.out_md.parent / (opts.out_md.stem + "-files")
    results_dir.mkdir(parents=True, exist_ok=True)
    opts.results_dir = results_dir
    report: dict[str, Any] = {"meta": {"mode": "dry run on the CPU" if opts.dry_run else "GPU",
                                       "date": dt.datetime.now().isoformat(timespec="seconds"),
                                       "host": socket.gethostname(), "budget_s": opts.budget_s, "quick": opts.quick,
                                       "steps": opts.steps, "argv": sys.argv[1:], "alst": opts.alst},
                              "cases": [], "skipped": [], "checkpoints": {}}

    def save() -> None:
        report["meta"]["elapsed_s"] = round(budget.elapsed(), 1)
        report["summary"] = summarize(report["cases"])
        write_report(report, opts.out_md)

    code = 0
    work = Path(tempfile.mkdtemp(prefix="wizard-gpu-bench-"))
    try:
        report["environment"] = environment(opts.dry_run)
        print(f"[measure] environment: missing {report['environment']['missing'] or 'nothing'}", flush=True)
        save()
        # 1. probe
        probe_env = child_env({"WIZARD_FAKE_NVML": DRY_RUN_FAKE_NVML} if opts.dry_run else {})
        report["probe"] = run_probe(probe_env)
        report["nvml"] = nvml_direct()
        report["nvidia_smi"] = smi_static()
        report["probe_comparison"] = compare_probe((report["probe"] or {}).get("hardware"), report["nvml"],
                                                   report["nvidia_smi"]["rows"])
        gpus = ((report["probe"] or {}).get("hardware") or {}).get("gpus") or \
            gpus_from_smi(report["nvidia_smi"]["rows"])
        report["meta"]["gpu"] = ", ".join(f"{g['name']} {g['memory_total'] / GiB:.1f} GiB" for g in gpus) or None
        mismatches = [r for r in report["probe_comparison"] if r["ok"] is False]
        print(f"[measure] probe: {report['meta']['gpu']}; {len(mismatches)} mismatch(es)", flush=True)
        save()

        # 2. plan and select
        libs = report["environment"]["libraries"]
        if not (libs["torch"]["importable"] and libs["transformers"]["importable"]):
            report["skipped"].append("memory cases and launch: torch/transformers missing (the model is sized "
                                     "with them and trained with them)")
            save()
            return 2
        hw, source = load_hardware(report["probe"], opts.assume, report["nvidia_smi"]["rows"],
                                   report["environment"].get("torch_cuda"))
        report["meta"]["hardware_source"] = source if hw is not None else "nothing"
        if hw is None or not hw.gpus:
            report["skipped"].append(f"memory cases and launch: no GPU to plan for ({source}; "
                                     f"{(hw.gpu_reason if hw else '')})")
            save()
            return 2
        if not opts.dry_run and report["environment"]["missing"]:
            report["skipped"].append("measurements: missing " + ", ".join(report["environment"]["missing"]))
        cfg = json.loads((HERE / "cases.json").read_text())
        shapes = json.loads((HERE / "models.json").read_text())
        model_dirs = write_models(shapes, work / "models")
        planner = Planner(hw, model_dirs)
        t0 = time.monotonic()
        if opts.alst:
            selection = Selection(alst_cases(cfg), [], [], ["--alst: the ALST series only"])
        else:
            selection = select_cases(cfg, list(model_dirs), planner.predict, planner.recommend)
        report["selection_notes"] = selection.notes
        report["meta"]["selection_s"] = round(time.monotonic() - t0, 1)
        report["meta"]["params"] = {m: planner.params(m) for m in model_dirs}
        torch_mod = sys.modules.get("torch")
        # Sizing builds models on the meta device: this process must hold no CUDA context.
        report["meta"]["driver_cuda_initialized"] = bool(torch_mod and torch_mod.cuda.is_initialized())
        preds = {s.key(): planner.predict(s) for s in selection.cases}
        report["cases"] = [case_record(s, preds[s.key()], None, opts.dry_run) for s in selection.cases]
        print(f"[measure] {len(selection.cases)} cases selected in {report['meta']['selection_s']} s", flush=True)
        save()

        missing = report["environment"]["missing"]
        nvml_index = next((g.get("nvml_index") for g in gpus if g.get("nvml_index") is not None), 0)
        launch_spec = spec_from_json(cfg["launch"])
        trained_kinds: set[str] = set()
        checkpoints: dict[str, str] = {}

        def checkpoint_for(model: str, timeout: float) -> tuple[str | None, str | None]:
            """The model saved once (random bf16 safetensors) for QLoRA's from_pretrained: (path, why not)."""
            if model in checkpoints:
                return checkpoints[model], None
            path = work / "checkpoints" / model
            cmd = [sys.executable, str(HERE / "train_one.py"), "--model-dir", model_dirs[model],
                   "--make-checkpoint", str(path)] + (["--device", "cpu", "--tiny"] if opts.dry_run else [])
            print(f"[measure] saving a random {model} checkpoint for QLoRA (timeout {timeout:.0f} s)", flush=True)
            log = work / f"checkpoint-{model}.log"
            child = run_child(cmd, child_env(), timeout, log_path=log)
            keep_tail(log, results_dir / f"checkpoint-{model}-stderr.log", lines=40)
            result = parse_result_line(child["lines"]) or {}
            report["checkpoints"][model] = {k: result.get(k) for k in ("status", "error", "build_s", "save_s",
                                                                       "checkpoint_bytes")}
            report["checkpoints"][model]["wall_s"] = child["wall_s"]
            if result.get("status") != "ok":
                return None, f"its checkpoint could not be saved: {result.get('error') or 'timeout/crash'}"
            checkpoints[model] = str(path)
            return str(path), None

        def run_cases(indices: list[int]) -> None:
            for i in indices:
                spec = selection.cases[i]
                left = budget.left() - opts.launch_reserve_s
                why_skip = None
                blockers = blocking(missing, spec.backend, spec.method, spec.alst)
                if blockers:
                    why_skip = "missing " + ", ".join(blockers)
                elif opts.dry_run and opts.quick and spec.kind in trained_kinds:
                    why_skip = "--quick dry run: one tiny training per kind (method and rung)"
                elif left < opts.min_case_s:
                    why_skip = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
                checkpoint = None
                if why_skip is None and spec.method == "qlora":
                    checkpoint, why_skip = checkpoint_for(spec.model, min(opts.case_timeout_s, left))
                    left = budget.left() - opts.launch_reserve_s
                    if why_skip is None and left < opts.min_case_s:
                        why_skip = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
                if why_skip:
                    report["cases"][i]["status"] = "skipped"
                    report["cases"][i]["run"] = {"status": "skipped", "error": why_skip}
                    report["cases"][i].update(decision="unknown", decision_why=why_skip)
                    save()
                    continue
                timeout = case_timeout(spec, opts.case_timeout_s, opts.dry_run, left)
                print(f"[measure] case {i + 1}/{len(selection.cases)} {spec.role}: {spec.label()} "
                      f"(timeout {timeout:.0f} s)", flush=True)
                run = run_case(spec, i + 1, planner, opts, work, nvml_index, timeout, checkpoint)
                trained_kinds.add(spec.kind)
                report["cases"][i] = case_record(spec, preds[spec.key()], run, opts.dry_run)
                c = report["cases"][i]
                print(f"[measure]   -> {c['status']} measured {gib(c['measured_bytes'])} GiB predicted "
                      f"{gib(c.get('predicted_bytes'))} GiB, step {c.get('measured_step_s')} s predicted "
                      f"{c.get('predicted_step_s') and round(c['predicted_step_s'], 3)} s, decision "
                      f"{c.get('decision')} ({run['wall_s']} s)", flush=True)
                save()

        v2 = [i for i, c in enumerate(selection.cases) if c.role == "v2"]
        run_cases(v2)

        # 3. the QLoRA loading premise
        load_cfg = None if opts.alst else cfg.get("qlora_load")
        if load_cfg:
            left = budget.left() - opts.launch_reserve_s
            blockers = blocking(missing, "qlora-load")
            if blockers:
                report["qlora_load_skipped"] = "missing " + ", ".join(blockers)
            elif left < opts.min_case_s:
                report["qlora_load_skipped"] = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
            else:
                checkpoint, why = checkpoint_for(load_cfg["model"], min(opts.case_timeout_s, left))
                left = budget.left() - opts.launch_reserve_s
                if why:
                    report["qlora_load_skipped"] = why
                elif left < opts.min_case_s:
                    report["qlora_load_skipped"] = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
                else:
                    print(f"[measure] QLoRA loading premise: {load_cfg['processes']} processes load "
                          f"{load_cfg['model']} in NF4", flush=True)
                    report["qlora_load"] = run_qlora_load(load_cfg, planner, opts, work, results_dir, checkpoint,
                                                          nvml_index, timeout=min(opts.case_timeout_s, left))
                    print(f"[measure]   -> {report['qlora_load']['verdict']}: {report['qlora_load']['verdict_why']}",
                          flush=True)
            save()
        shutil.rmtree(work / "checkpoints", ignore_errors=True)      # 16 GB for an 8B model

        # 4. wizard tune
        tune_cfg = None if opts.alst else cfg.get("tune")
        if tune_cfg:
            left = budget.left() - opts.launch_reserve_s
            blockers = blocking(missing, "tune")
            if blockers:
                report["tune_skipped"] = "missing " + ", ".join(blockers)
            elif left < opts.min_tune_s:
                report["tune_skipped"] = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
            else:
                print(f"[measure] wizard tune: {tune_cfg['model']} (timeout {left:.0f} s)", flush=True)
                report["tune"] = run_tune(tune_cfg, model_dirs, opts, work, results_dir, timeout=left)
                print(f"[measure]   -> {report['tune']['verdict']}: {report['tune']['verdict_why']}", flush=True)
            save()

        # 5. the selected cases, then the launch case, then the rest of the coverage; the launch last
        run_cases([i for i in range(len(selection.cases)) if i not in v2])

        # 6. launch
        left = budget.left()
        blockers = blocking(missing, "launch")
        if opts.alst:
            report["launch_skipped"] = "--alst: the ALST series only"
        elif blockers:
            report["launch_skipped"] = "missing " + ", ".join(blockers)
        elif left < 25:
            report["launch_skipped"] = f"time budget: {left:.0f} s left"
        else:
            print(f"[measure] launch: {launch_spec.label()}", flush=True)
            report["launch"] = run_launch(launch_spec, planner, opts, work, results_dir, nvml_index,
                                          timeout=max(20.0, min(left - 5, opts.launch_seconds + 90)))
        save()
    except Interrupted as exc:
        report["skipped"].append(f"interrupted by {exc} after {budget.elapsed():.0f} s: the rest was not run")
        for c in report["cases"]:
            if c.get("status") == "not run":
                c.update(status="skipped", decision="unknown", decision_why="interrupted",
                         run={"status": "skipped", "error": f"interrupted by {exc}"})
        code = 124
    except Exception as exc:    # a bug must not cost the figures already measured: they are saved below
        report["skipped"].append(f"measure.py failed after {budget.elapsed():.0f} s: {type(exc).__name__}: {exc}")
        report["traceback"] = traceback.format_exc().splitlines()[-20:]
        print("".join(traceback.format_exc()), file=sys.stderr, flush=True)
        code = 1
    finally:
        kill_current_child()
        save()
        shutil.rmtree(work, ignore_errors=True)
        print(f"[measure] wrote {opts.out_md} and {opts.out_md.with_suffix('.json')}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
