"""Plain-text reports for the CLI: the ladder with its arithmetic, findings, what was written."""

from __future__ import annotations

import sys
from typing import TextIO

from wizard.planning.speed import fmt_duration, fmt_rate
from wizard.units import fmt_bytes, fmt_count


def hardware_line(hw) -> str:
    if hw.gpus:
        names = sorted({g.name for g in hw.gpus})
        return (f"{hw.num_gpus} x {'/'.join(names)} ({fmt_bytes(hw.min_gpu_memory)} each"
                f"{', bf16' if hw.all_bf16 else ''}), RAM {fmt_bytes(hw.ram_total)} [{hw.source}]")
    return f"no GPU ({hw.gpu_reason or 'none found'}), {hw.cpu_cores} CPU cores, RAM {fmt_bytes(hw.ram_total)} [{hw.source}]"


def model_line(m) -> str:
    exact = "exact" if m.exact else "estimated from --params"
    return (f"{m.source or m.model_type}: {fmt_count(m.params)} parameters ({m.params:,}, {exact}); "
            f"hidden {m.hidden_size}, {m.layers} layers, {m.heads} heads ({m.kv_heads} KV), vocab {m.vocab_size:,}, "
            f"largest layer {fmt_count(m.largest_layer_params)}"
            + (f", layer class {m.layer_class}" if m.layer_class else ""))


def print_plan(result, file: TextIO | None = None) -> None:
    out = file or sys.stdout
    plan = result.plan
    print(f"Hardware: {hardware_line(result.hardware)}", file=out)
    print(f"Model:    {model_line(result.model)}", file=out)
    topo = plan.topology
    kind = "CPU processes" if topo.cpu else "GPU processes"
    print(f"Budget:   {fmt_bytes(plan.usable_bytes)} usable per process of {fmt_bytes(plan.gpu_capacity_bytes)}; "
          f"{topo.world_size} {kind} on {topo.num_machines} machine(s); precision {plan.precision}", file=out)
    for note in plan.notes:
        print(f"Note:     {note}", file=out)
    print("", file=out)
    width = max((len(r.name) for r in plan.rungs), default=10)
    unit = "per process" if topo.cpu else "per GPU"
    for r in plan.rungs:
        mark = "=>" if plan.choice is not None and r.key == plan.choice.key else "  "
        verdict = "fits" if r.fits else "does not fit"
        gc = " +GC" if r.gradient_checkpointing else ""
        rate = f"{fmt_rate(r.tokens_per_second):>14}" if r.speed else ""
        print(f"{mark} {r.name + gc:<{width + 4}} {fmt_bytes(r.per_gpu_bytes):>10} {unit}   {verdict:<12} {rate}",
              file=out)
        parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r.breakdown.items() if v)
        print(f"     {parts}", file=out)
        if r.cpu_bytes:
            print(f"     host RAM {fmt_bytes(r.cpu_bytes)}", file=out)
        print(f"     {r.reason}", file=out)
    print("", file=out)
    for alt in plan.alternatives:
        print(f"Instead:  {alt.text}", file=out)
    if plan.choice is not None:
        print(f"Choice:   {plan.choice.name}"
              + (" with gradient checkpointing" if plan.choice.gradient_checkpointing else ""), file=out)
        for line in speed_lines(plan):
            print(f"          {line}", file=out)


def speed_lines(plan) -> list[str]:
    """The chosen rung's speed, its largest micro-batch, the fastest batch split and the time to train."""
    c = plan.choice
    if c is None or c.speed is None:
        return []
    s = c.speed
    unit = "process" if plan.topology.cpu else "GPU"
    lines = [f"Speed: ≈{fmt_rate(s.tokens_per_second)} ({fmt_rate(s.tokens_per_second_per_gpu)} per {unit}), "
             f"{s.step_seconds:.3g} s per optimizer step, MFU {s.mfu * 100:.0f}%, {s.bound}-bound"]
    sizes = []
    if c.max_micro_batch:
        sizes.append(f"{c.max_micro_batch} without gradient checkpointing")
    if c.max_micro_batch_gc:
        sizes.append(f"{c.max_micro_batch_gc} with it")
    if sizes:
        lines.append("Largest micro-batch that fits: " + ", ".join(sizes))
    b = plan.batch
    if b is not None:
        split = (f"--micro-batch {b.micro_batch} --grad-accum {b.grad_accum}"
                 + (" with gradient checkpointing" if b.gradient_checkpointing else ""))
        if b.current is not None and b.speed.tokens_per_second > b.current.tokens_per_second * 1.02:
            gain = b.speed.tokens_per_second / b.current.tokens_per_second
            lines.append(f"Faster for the global batch of {b.global_batch}: {split} "
                         f"(≈{fmt_rate(b.speed.tokens_per_second)}, {gain:.2f}x)")
        else:
            lines.append(f"Fastest split of the global batch of {b.global_batch}: {split}")
    if c.train_seconds is not None and plan.train_tokens:
        lines.append(f"Time to train {fmt_count(plan.train_tokens)} tokens: {fmt_duration(c.train_seconds)}")
    return lines


def nothing_fits_message(result) -> str:
    from wizard.config import answers as answers_mod
    from wizard.planning.plan import explain_nothing_fits
    a = result.answers
    text = explain_nothing_fits(result.plan, result.hardware, result.model, answers_mod.training_options(a),
                                answers_mod.strategy_options(a), answers_mod.topology(a, result.hardware))
    fitting = [alt.text for alt in result.plan.alternatives if alt.choice is not None]
    if fitting:
        text += " Fine-tuning with adapters instead (--method): " + "; ".join(fitting) + "."
    return text


def print_findings(findings, file: TextIO | None = None) -> None:
    out = file or sys.stdout
    for f in findings:
        where = f"{f.file}" + (f":{f.key}" if f.key else "")
        line = f"{f.severity}: [{f.rule}] {where}: {f.message}"
        if getattr(f, "fix", None):
            line += f" Fix: {f.fix}"
        print(line, file=out)


def print_written(result, dry_run: bool, file: TextIO | None = None) -> None:
    out = file or sys.stdout
    if dry_run:
        print(f"Dry run: nothing written. Would write {result.yaml_path}"
              + (f" and {result.ds_path}" if result.ds_text is not None else ""), file=out)
        return
    for w in result.writes:
        if not w.changed:
            print(f"Unchanged: {w.path}", file=out)
            continue
        backup = f" (previous kept as {w.backup_path})" if w.backup_path else ""
        print(f"Wrote {w.path}{backup}", file=out)
        if w.diff:
            lines = w.diff.splitlines()
            shown = lines[:40]
            for line in shown:
                print(f"    {line}", file=out)
            if len(lines) > len(shown):
                print(f"    ... {len(lines) - len(shown)} more diff lines", file=out)
    for note in result.notes:
        print(f"Note: {note}", file=out)
    warnings = [f for f in result.findings if f.severity == "warning"]
    print("Validated with accelerate, DeepSpeed and transformers: "
          + ("OK" if not warnings else f"OK with {len(warnings)} warning(s)"), file=out)
    print_findings(warnings, file=out)
    print(f"Next: wizard launch --config-file {result.yaml_path} -- your_train.py [args]", file=out)


def print_adapter_snippet(result, file: TextIO | None = None) -> None:
    """For --method lora/qlora: the Python that sets up the same run (peft, bitsandbytes, TrainingArguments)."""
    from wizard.frontends.snippets import setup_snippet, uses_adapters
    if not uses_adapters(result.answers):
        return
    out = file or sys.stdout
    print("The same setup in Python (HF Trainer with peft):", file=out)
    ds = result.ds_path if result.ds_text is not None else None
    for line in setup_snippet(result.answers, result.plan, result.model, ds).splitlines():
        print(f"    {line}" if line else "", file=out)


# ----------------------------------------------------------------------------- wizard tune

def _dur(s) -> str:
    return "-" if s is None else (f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s")


def _pair(pred: str, meas: str) -> str:
    return f"{pred} / {meas}"


def tune_rows(result) -> list[list[str]]:
    """One row per candidate: predicted / measured peak memory per GPU, step time, tokens/s, MFU."""
    rows = [["candidate", "result", "peak per GPU", "step time", "tokens/s", "MFU"]]
    for t in result.trials:
        p = t.candidate.predicted
        mark = "=> " if result.winner is t else "   "
        peak = fmt_bytes(t.peak_bytes) + (" RSS" if t.peak_kind == "rss" else "") if t.peak_bytes else "-"
        rows.append([mark + t.candidate.label, t.status,
                     _pair(fmt_bytes(p.get("per_gpu_bytes")) if p.get("per_gpu_bytes") else "-", peak),
                     _pair(_dur(p.get("step_seconds")), _dur(t.step_seconds)),
                     _pair(fmt_rate(p["tokens_per_second"]) if p.get("tokens_per_second") else "-",
                           fmt_rate(t.tokens_per_second) if t.tokens_per_second else "-"),
                     _pair(f"{p['mfu']:.1%}" if p.get("mfu") is not None else "-",
                           f"{t.mfu:.1%}" if t.mfu is not None else "-")])
    return rows


def print_tune(result, file: TextIO | None = None, written_note: str = "Dry run: nothing written.") -> None:
    out = file or sys.stdout
    if not result.trials:
        return
    rows = tune_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("Measured (predicted / measured):", file=out)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)
    for t in result.trials:
        if t.message:
            print(f"  {t.candidate.label}: {t.message}", file=out)
    for note in result.notes:
        print(f"Note:     {note}", file=out)
    if result.winner is None:
        print("No candidate was measured to completion: nothing written.", file=out)
    else:
        w = result.winner
        print(f"Winner:   {w.candidate.label}: {fmt_rate(w.tokens_per_second)} measured"
              + (f" (noise ±{w.noise:.0%})" if w.noise is not None else ""), file=out)
        if result.written is not None:
            print_written(result.written, dry_run=False, file=out)
        else:
            print(written_note, file=out)
    print(f"Trials:   logs and probe records in {result.run_dir}", file=out)


def tune_progress_printer(out: TextIO):
    """Plain progress lines (--headless, and any terminal): one per candidate start/end, one per step seen."""
    state = {"n": 0}

    def progress(e: dict) -> None:
        kind = e.get("event")
        if kind == "plan":
            state["n"] = len(e["candidates"])
            line = f"[tune] {state['n']} candidates: {', '.join(e['candidates'])}; trials in {e['run_dir']}"
        elif kind == "start":
            line = f"[tune] {e['index'] + 1}/{state['n']} {e['label']}: starting"
        elif kind == "step":
            if not e["step"]:
                return
            line = f"[tune]     {e['label']}: step {e['step']}/{e['total']}"
        elif kind == "end":
            t = e["trial"]
            m = t["measured"]
            rate = f", {fmt_rate(m['tokens_per_second'])}" if m.get("tokens_per_second") else ""
            line = f"[tune] {e['index'] + 1}/{state['n']} {e['label']}: {t['status']}{rate}"
        else:
            return
        try:
            print(line, file=out, flush=True)
        except (OSError, ValueError):
            pass
    return progress
