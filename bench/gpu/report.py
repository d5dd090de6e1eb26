"""The results: a markdown table for people and its JSON twin, rewritten after every step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.gpu.common import GiB
from bench.gpu.probe_compare import cc_text

ERROR_TARGET_PCT = 10.0               # issue 6: predicted peak within +-10 % of the measured one


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GiB:.1f}"


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def summarize(cases: list[dict]) -> dict[str, Any]:
    decided = [c for c in cases if c.get("decision") in ("right", "wrong")]
    fitting = [c for c in cases if c.get("predicted_fits") and c.get("error_pct") is not None]
    within = [c for c in fitting if abs(c["error_pct"]) <= ERROR_TARGET_PCT]
    measured = sum(1 for c in cases if c.get("status") == "oom" or
                   (c.get("status") == "ok" and c.get("measured_bytes") is not None))
    return {"cases": len(cases), "measured": measured,
            "decisions_right": sum(1 for c in decided if c["decision"] == "right"),
            "decisions_wrong": sum(1 for c in decided if c["decision"] == "wrong"),
            "fitting_with_error": len(fitting), "within_target": len(within),
            "max_abs_error_pct": max((abs(c["error_pct"]) for c in fitting), default=None)}


CASE_COLUMNS = ("#", "role", "configuration", "predicted GiB", "wizard: fits?", "% of usable", "measured GiB",
                "error %", "outcome", "fit decision", "non-torch GiB", "NVML process peak GiB", "note")


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
                 "Error = (predicted - measured) / measured. "
                 f"Target: every fit decision right, |error| <= {ERROR_TARGET_PCT:g}% where it fits.")
    lines += ["", "| " + " | ".join(CASE_COLUMNS) + " |", "|" + "---|" * len(CASE_COLUMNS)]
    for i, c in enumerate(report.get("cases") or [], 1):
        p = c.get("prediction") or {}
        run = c.get("run") or {}
        child = run.get("child") or {}
        ratio = p["per_gpu_bytes"] / p["usable_bytes"] * 100 if p.get("usable_bytes") else None
        note = run.get("error") or c["case"].get("why") or ""
        cells = [str(i), c["case"]["role"], c["label"], gib(p.get("per_gpu_bytes")),
                 "—" if not p else ("yes" if p.get("fits") else "no"), "—" if ratio is None else f"{ratio:.1f}",
                 gib(c.get("measured_bytes")), pct(c.get("error_pct")), c.get("status", "—"),
                 f"{c.get('decision', '—')}", gib(child.get("non_torch_bytes")), gib(child.get("max_process_used")),
                 note.replace("|", "/")[:160]]
        lines.append("| " + " | ".join(cells) + " |")
    s = report.get("summary") or {}
    if s:
        worst = "—" if s["max_abs_error_pct"] is None else f"{s['max_abs_error_pct']:.1f}%"
        lines += ["", f"Summary: {s['measured']}/{s['cases']} measured; fit decisions right {s['decisions_right']}, "
                      f"wrong {s['decisions_wrong']}; within ±{ERROR_TARGET_PCT:g}%: {s['within_target']}/"
                      f"{s['fitting_with_error']} fitting cases (max |error| {worst})."]
    for note in report.get("selection_notes") or []:
        lines.append(f"- {note}")
    for note in report.get("skipped") or []:
        lines.append(f"- skipped: {note}")

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


def write_report(report: dict, md_path: Path) -> None:
    md_path.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((md_path, render_markdown(report)),
                       (md_path.with_suffix(".json"), json.dumps(report, indent=1, default=str) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
