"""The results: a markdown table for people and its JSON twin, rewritten after every step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.gpu.common import GiB
from bench.gpu.probe_compare import cc_text

ERROR_TARGET_PCT = 10.0               # issue 6: predicted peak within +-10 % of the measured one
STEP_TARGET_PCT = 15.0                # issue 28: predicted step time within +-15 % of the measured one


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GiB:.1f}"


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def summarize(cases: list[dict]) -> dict[str, Any]:
    decided = [c for c in cases if c.get("decision") in ("right", "wrong")]
    fitting = [c for c in cases if c.get("predicted_fits") and c.get("error_pct") is not None]
    within = [c for c in fitting if abs(c["error_pct"]) <= ERROR_TARGET_PCT]
    timed = [c for c in cases if c.get("step_error_pct") is not None]
    measured = sum(1 for c in cases if c.get("status") == "oom" or
                   (c.get("status") == "ok" and c.get("measured_bytes") is not None))
    return {"cases": len(cases), "measured": measured,
            "decisions_right": sum(1 for c in decided if c["decision"] == "right"),
            "decisions_wrong": sum(1 for c in decided if c["decision"] == "wrong"),
            "fitting_with_error": len(fitting), "within_target": len(within),
            "max_abs_error_pct": max((abs(c["error_pct"]) for c in fitting), default=None),
            "timed": len(timed), "step_within_target": sum(abs(c["step_error_pct"]) <= STEP_TARGET_PCT for c in timed),
            "max_abs_step_error_pct": max((abs(c["step_error_pct"]) for c in timed), default=None)}


def secs(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


CASE_COLUMNS = ("#", "role", "configuration", "predicted GiB", "wizard: fits?", "% of usable", "measured GiB",
                "error %", "predicted step s", "measured step s", "step error %", "outcome", "fit decision",
                "non-torch GiB", "NVML process peak GiB", "note")


def render_markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [f"# GPU ground truth ({meta['mode']}), {meta['date']}", ""]
    lines.append(f"Machine: {meta.get('gpu') or 'no GPU'}; host {meta['host']}; "
                 f"budget {meta['budget_s']:.0f} s, used {meta.get('elapsed_s', 0):.0f} s; "
                 f"planned against: {meta.get('hardware_source')}.")
    env = report.get("environment") or {}
    libs = env.get("libraries") or {}
    lines.append("Libraries: " + ", ".join(f"{k} {v.get('version') or 'MISSING'}" for k, v in libs.items()) + ".")
    if env.get("missing"):
        lines.append(f"**Missing: {', '.join(env['missing'])}** (the parts that need them were skipped).")
    lines += ["", "## Memory: prediction vs measurement", ""]
    lines.append("Predicted = the wizard's per-GPU estimate for the forced rung (pipeline.build). Measured = "
                 "torch.cuda.max_memory_reserved + the memory NVML shows for the process beyond torch's "
                 "reserved pool (CUDA context, NCCL buffers), taken at the end of the run. NVML process peak = "
                 "the highest per-process memory NVML showed, sampled every 20 ms (a cross-check). "
                 "Step: the rung's predicted optimizer step (raw model) against the median measured step after "
                 "the first. Error = (predicted - measured) / measured. "
                 f"Target: every fit decision right, |error| <= {ERROR_TARGET_PCT:g}% where it fits, step time "
                 f"within ±{STEP_TARGET_PCT:g}%.")
    lines += ["", "| " + " | ".join(CASE_COLUMNS) + " |", "|" + "---|" * len(CASE_COLUMNS)]
    for i, c in enumerate(report.get("cases") or [], 1):
        p = c.get("prediction") or {}
        run = c.get("run") or {}
        child = run.get("child") or {}
        ratio = p["per_gpu_bytes"] / p["usable_bytes"] * 100 if p.get("usable_bytes") else None
        note = run.get("error") or c["case"].get("why") or ""
        cells = [str(i), c["case"]["role"], c["label"], gib(p.get("per_gpu_bytes")),
                 "—" if not p else ("yes" if p.get("fits") else "no"), "—" if ratio is None else f"{ratio:.1f}",
                 gib(c.get("measured_bytes")), pct(c.get("error_pct")), secs(c.get("predicted_step_s")),
                 secs(c.get("measured_step_s")), pct(c.get("step_error_pct")), c.get("status", "—"),
                 f"{c.get('decision', '—')}", gib(child.get("non_torch_bytes")), gib(child.get("max_process_used")),
                 note.replace("|", "/")[:160]]
        lines.append("| " + " | ".join(cells) + " |")
    s = report.get("summary") or {}
    if s:
        worst = "—" if s["max_abs_error_pct"] is None else f"{s['max_abs_error_pct']:.1f}%"
        worst_step = "—" if s.get("max_abs_step_error_pct") is None else f"{s['max_abs_step_error_pct']:.1f}%"
        lines += ["", f"Summary: {s['measured']}/{s['cases']} measured; fit decisions right {s['decisions_right']}, "
                      f"wrong {s['decisions_wrong']}; within ±{ERROR_TARGET_PCT:g}%: {s['within_target']}/"
                      f"{s['fitting_with_error']} fitting cases (max |error| {worst}); step time within "
                      f"±{STEP_TARGET_PCT:g}%: {s.get('step_within_target', 0)}/{s.get('timed', 0)} "
                      f"(max |error| {worst_step})."]
    for note in report.get("selection_notes") or []:
        lines.append(f"- {note}")
    for note in report.get("skipped") or []:
        lines.append(f"- skipped: {note}")

    lines += render_qlora_load(report) + render_tune(report)
    for model, ck in (report.get("checkpoints") or {}).items():
        lines.append(f"- checkpoint {model} (random bf16 safetensors, for QLoRA): {ck.get('status')}, "
                     f"{gib(ck.get('checkpoint_bytes'))} GiB, built {ck.get('build_s')} s, saved {ck.get('save_s')} s"
                     + (f" ({ck['error']})" if ck.get("error") else ""))

    lines += ["", "## Probe vs pynvml vs nvidia-smi", ""]
    probe = report.get("probe") or {}
    if probe.get("error"):
        lines.append(f"wizard probe: **{probe['error']}**")
    nv = report.get("nvml") or {}
    if not nv.get("available"):
        lines.append(f"pynvml: not available ({nv.get('reason')})")
    else:
        lines.append(f"pynvml: driver {nv.get('driver_version')}, CUDA driver API {nv.get('cuda_driver_version')}.")
        for g in nv.get("gpus") or []:
            lines.append(f"- GPU {g['index']} {g.get('name')}: {gib(g.get('memory_total'))} GiB "
                         f"({gib(g.get('memory_used'))} GiB used before the runs), compute capability "
                         f"{cc_text(g.get('compute_capability'))}, SM clock {g.get('clocks_sm_mhz')} MHz now / "
                         f"{g.get('clocks_max_sm_mhz')} max, memory clock max {g.get('clocks_max_mem_mhz')} MHz, "
                         f"power limit {g.get('power_limit_w')} W")
    smi = report.get("nvidia_smi") or {}
    if not smi.get("available"):
        lines.append(f"nvidia-smi: not available ({smi.get('reason')})")
    rows = report.get("probe_comparison") or []
    if rows:
        lines += ["", "| GPU | field | wizard probe | pynvml | nvidia-smi | agree |", "|---|---|---|---|---|---|"]
        for r in rows:
            ok = {True: "yes", False: "**MISMATCH**", None: "—"}[r["ok"]]
            cells = ["—" if r[k] is None else str(r[k]) for k in ("probe", "pynvml", "nvidia_smi")]
            lines.append(f"| {r['gpu']} | {r['field']} | " + " | ".join(cells) + f" | {ok} |")

    lines += ["", "## Launch: metrics.jsonl vs nvidia-smi", ""]
    la = report.get("launch")
    if not la:
        lines.append("not run" + (f": {report.get('launch_skipped')}" if report.get("launch_skipped") else ""))
    else:
        d = la.get("diffs") or {}
        v = la.get("verdict") or {}
        t = la.get("thresholds") or {}

        def cell(key, unit):
            value = d.get(key)
            return "—" if value is None else f"{value:.2f}{unit}"

        def ok(key):
            return {True: "yes", False: "**NO**", None: "—"}[v.get(key)]
        lines.append(f"`wizard launch --headless` on {la['case']}: exit {la.get('returncode')}, run status "
                     f"{la.get('run_status')}, {la.get('wall_s')} s; reference: {la.get('reference')}"
                     + (f" ({la['reference_error']})" if la.get("reference_error") else "") + ".")
        lines.append(f"Samples: {la.get('reference_samples')} reference, {la.get('metrics_samples')} in metrics.jsonl, "
                     f"{d.get('pairs', 0)} aligned (mean |dt| {cell('mean_dt_s', ' s')}).")
        lines += ["", "| metric | mean abs difference | threshold | within |", "|---|---|---|---|",
                  f"| utilisation | {cell('util_pp', ' pp')} | {t.get('util_pp')} pp | {ok('util_pp')} |",
                  f"| memory used | {cell('mem_mib', ' MiB')} ({cell('mem_pct', '%')}) | {t.get('mem_pct')}% | {ok('mem_pct')} |",
                  f"| power | {cell('power_w', ' W')} ({cell('power_pct', '%')}) | {t.get('power_pct')}% | {ok('power_pct')} |"]
        for key, name in (("power_instant_pct", "power.draw.instant"), ("power_average_pct", "power.draw.average")):
            if d.get(key) is not None:
                lines.append(f"| power vs {name} | ({cell(key, '%')}) | for information | — |")
    return "\n".join(lines) + "\n"


def render_qlora_load(report: dict) -> list[str]:
    lines = ["", "## QLoRA loading premise: every rank holds the whole 4-bit model while loading", ""]
    q = report.get("qlora_load")
    if not q:
        return lines + ["not run" + (f": {report['qlora_load_skipped']}" if report.get("qlora_load_skipped") else "")]
    p = q.get("prediction") or {}
    lines.append(f"{q['processes']} processes on one GPU, each `from_pretrained({q['model']}, "
                 f"quantization_config=BitsAndBytesConfig(NF4, quant storage {((q.get('setup') or {}).get('bnb') or {}).get('bnb_4bit_quant_storage')}))` "
                 "under accelerate's FSDP environment with cpu_ram_efficient_loading. Predicted per GPU while loading "
                 f"({p.get('rung')}, {q['processes']} GPUs): {gib(p.get('load_bytes'))} GiB, of which the 4-bit model "
                 f"{gib(p.get('nf4_model_bytes'))} GiB (the rest: the CUDA context). "
                 f"**Premise: {q.get('verdict')}** — {q.get('verdict_why')}.")
    lines += ["", "| rank | status | FSDP env seen | load s | on the GPU GiB | on CPU GiB | on meta GiB | "
                  "torch allocated GiB | error % (4-bit model vs allocated) | NVML process GiB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(q.get("ranks") or []):
        held = r.get("held_bytes") or {}
        lines.append(f"| {i} | {r.get('status')}{': ' + str(r['error'])[:80] if r.get('error') else ''} | "
                     f"{r.get('fsdp_enabled')} | {r.get('load_s')} | {gib(held.get('cuda'))} | {gib(held.get('cpu'))} | "
                     f"{gib(held.get('meta'))} | {gib(r.get('memory_allocated_after_load'))} | {pct(r.get('error_pct'))} | "
                     f"{gib(r.get('process_used_after_load'))} |")
    return lines


def render_tune(report: dict) -> list[str]:
    lines = ["", "## wizard tune with a Trainer script", ""]
    t = report.get("tune")
    if not t:
        return lines + ["not run" + (f": {report['tune_skipped']}" if report.get("tune_skipped") else "")]
    s = t.get("settings") or {}
    lines.append(f"`wizard tune` {t['model']} s{s.get('seq_len')} b{s.get('micro_batch')}, {s.get('candidates')} "
                 f"candidates + {s.get('variants')} variant(s), {s.get('warmup')} warm-up + {s.get('steps')} steps each "
                 f"(the script runs {s.get('script_steps')}), budget {s.get('budget_s')} s: exit {t.get('returncode')}, "
                 f"{t.get('wall_s')} s, winner {t.get('winner')}. **{t.get('verdict')}** — {t.get('verdict_why')}.")
    lines += ["", "| trial | rung | batch | status | predicted GiB | measured GiB | error % | predicted step s | "
                  "measured step s | step error % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in t.get("trials") or []:
        lines.append(f"| {r['label']} | {r['rung']} | {r['batch']} | {r['status']} | {gib(r['predicted_bytes'])} | "
                     f"{gib(r['measured_bytes'])} | {pct(r['error_pct'])} | {secs(r['predicted_step_s'])} | "
                     f"{secs(r['measured_step_s'])} | {pct(r['step_error_pct'])} |")
    return lines


def write_report(report: dict, md_path: Path) -> None:
    md_path.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((md_path, render_markdown(report)),
                       (md_path.with_suffix(".json"), json.dumps(report, indent=1, default=str) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
