"""Plain-text reports for the CLI: the ladder with its arithmetic, findings, what was written.

On a terminal the lines are wrapped at word boundaries to its width (a terminal cuts them anywhere: "do" at
the end of one line, "es not fit" on the next); to a pipe or a file they stay whole, one record a line, for grep.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import TextIO

from wizard.findings import finding_line
from wizard.planning.speed import fmt_rate
from wizard.units import fmt_bytes, fmt_count, fmt_duration


def terminal_width(out: TextIO) -> int | None:
    """Columns of the terminal `out` writes to (COLUMNS, as the shell sets it, else the terminal's own), or None
    when `out` is not a terminal."""
    try:
        if not out.isatty():
            return None
    except (AttributeError, ValueError, OSError):
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


_HANG = re.compile(r"\s*(?:[\w ]{1,20}:\s+(?=\S))?")


def wrap_line(line: str, width: int) -> list[str]:
    """`line` in lines of at most `width` columns, broken between words only (a word longer than a line, such
    as a path, stays whole); continuation lines start under the text, after the line's indent and its
    "Label:" prefix ("Note:     ", "     ", "wizard: ")."""
    if len(line) <= width:
        return [line]
    hang = len(_HANG.match(line).group(0))
    if hang > width // 2:
        hang = len(line) - len(line.lstrip())
        hang = hang if hang <= width // 2 else 4
    return textwrap.wrap(line, width, subsequent_indent=" " * hang, break_long_words=False,
                         break_on_hyphens=False) or [line]


class Wrapping:
    """A text stream that wraps what is printed to it with `wrap_line`, one whole line at a time."""

    def __init__(self, out: TextIO, width: int) -> None:
        self.out = out
        self.width = width
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self.out.write("".join(part + "\n" for part in wrap_line(line, self.width)))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.out.write("\n".join(wrap_line(self._pending, self.width)))
            self._pending = ""
        self.out.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.out.fileno()


def wrapping(out: TextIO | None) -> TextIO:
    """`out` (default stdout), wrapped at word boundaries to its terminal's width when it is a terminal."""
    out = out or sys.stdout
    if isinstance(out, Wrapping):
        return out
    width = terminal_width(out)
    return Wrapping(out, width) if width else out


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
    out = wrapping(file)
    plan = result.plan
    print(f"Hardware: {hardware_line(result.hardware)}", file=out)
    print(f"Model:    {model_line(result.model)}", file=out)
    topo = plan.topology
    n, m = int(topo.world_size), int(topo.num_machines)
    kind = f"{'CPU' if topo.cpu else 'GPU'} process{'es' if n != 1 else ''}"
    print(f"Budget:   {fmt_bytes(plan.usable_bytes)} usable per process of {fmt_bytes(plan.gpu_capacity_bytes)}; "
          f"{n} {kind} on {m} machine{'s' if m != 1 else ''}; precision {plan.precision}", file=out)
    for note in plan.notes:
        print(f"Note:     {note}", file=out)
    print("", file=out)
    width = max((len(r.name) for r in plan.rungs), default=10)
    applied = plan.batch is not None and plan.batch.applied
    unit = "per process" if topo.cpu else "per GPU"
    mixed_gc = any(r.gradient_checkpointing for r in plan.rungs)
    for r in plan.rungs:
        mark = "=>" if plan.choice is not None and r.key == plan.choice.key else "  "
        verdict = "fits" if r.fits else "does not fit"
        gc = r.suffix
        rate = f"{fmt_rate(r.tokens_per_second):>14}" if r.speed else ""
        split = f"  (micro-batch {r.micro_batch} x {r.grad_accum})" if applied and r.micro_batch else ""
        print(f"{mark} {r.name + gc:<{width + 4}} {fmt_bytes(r.per_gpu_bytes):>10} {unit}   {verdict:<12} {rate}{split}",
              file=out)
        if r.why:
            print(f"     why: {r.why}", file=out)
        if mixed_gc and r.per_gpu_bytes_gc is not None:
            # the ladder mixes GC settings: this rung's figure with GC too, to compare like with like
            print(f"     with gradient checkpointing: {fmt_bytes(r.per_gpu_bytes_gc)} {unit}", file=out)
        parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r.breakdown.items() if v)
        print(f"     {parts}", file=out)
        if r.cpu_bytes:
            print(f"     host RAM {fmt_bytes(r.cpu_bytes)}", file=out)
        print(f"     {r.reason}", file=out)
    print("", file=out)
    for alt in plan.alternatives:
        print(f"Instead:  {alt.text}", file=out)
    if plan.choice is not None:
        print(f"Choice:   {plan.choice.name_with_gc}", file=out)
        for line in speed_lines(plan):
            print(f"          {line}", file=out)
        for line in checkpoint_lines(plan):
            print(f"          {line}", file=out)
        print_script_lines(result, out)
    elif longest_text(plan):
        print(f"Limit:    {longest_text(plan)}", file=out)
    out.flush()


def checkpoint_lines(plan) -> list[str]:
    """The chosen rung's checkpoint on disk (plan.checkpoint): one checkpoint, the disk the kept ones take, per
    machine, and what was assumed."""
    c = getattr(plan, "checkpoint", None)
    if c is None:
        return []
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in c.parts.items() if v)
    machines = int(plan.topology.num_machines)
    lines = [f"Checkpoint: {fmt_bytes(c.bytes)} each ({parts}; {c.layout})",
             f"Disk for checkpoints: {fmt_bytes(c.total_bytes)} ({c.keep} on disk at once and the final model, "
             f"{fmt_bytes(c.export_bytes)})"
             + (f"; the most on one machine {fmt_bytes(c.per_node_total_bytes)}" if machines > 1 else "")]
    lines += [f"Assumed: {a}" for a in c.assumptions]
    return lines


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
    if c.max_seq_len:
        lines.append(f"Longest sequence that fits: --seq-len {c.max_seq_len} at micro-batch {c.micro_batch or 1}"
                     + (" with gradient checkpointing" if c.gradient_checkpointing else "")
                     + " (the asked length is near the limit)")
    longest = longest_text(plan)
    if longest:
        lines.append(longest)
    b = plan.batch
    if b is not None and b.applied:
        gc = " with gradient checkpointing" if b.gradient_checkpointing else ""
        lines.append(f"Batch: micro-batch {b.micro_batch} x accumulation {b.grad_accum} x {plan.topology.world_size} "
                     f"processes = the global batch of {b.global_batch}{gc}: its fastest split on this rung, which "
                     "these figures and the files use")
    elif b is not None:
        split = (f"--micro-batch {b.micro_batch} --grad-accum {b.grad_accum}"
                 + (" with gradient checkpointing" if b.gradient_checkpointing else ""))
        if b.current is not None and b.speed.tokens_per_second > b.current.tokens_per_second * 1.02:
            gain = b.speed.tokens_per_second / b.current.tokens_per_second
            lines.append(f"Faster for the global batch of {b.global_batch}: {split} "
                         f"(≈{fmt_rate(b.speed.tokens_per_second)}, {gain:.2f}x)")
        else:
            lines.append(f"Fastest split of the global batch of {b.global_batch}: {split}")
    a = plan.amortised
    if a is not None and s.bound == "offload":
        gc = " with gradient checkpointing" if a.gradient_checkpointing else ""
        lines.append(f"Offload-bound: the CPU optimizer step takes {s.optimizer_seconds:.3g} s of the "
                     f"{s.step_seconds:.3g} s step, once per optimizer step; a larger micro-batch amortises it: "
                     f"micro-batch {a.micro_batch}{gc} (global batch {a.global_batch}) reaches "
                     f"≈{fmt_rate(a.speed.tokens_per_second)}, {a.speed.tokens_per_second / s.tokens_per_second:.1f}x")
    if c.train_seconds is not None and plan.train_tokens:
        lines.append(f"Time to train {fmt_count(plan.train_tokens)} tokens: {fmt_duration(c.train_seconds)}")
    return lines


def print_script_lines(result, out) -> None:
    """What the training script must do for the choice that no written file carries (snippets.script_requirements),
    and the lines to add (snippets.script_code)."""
    from wizard.frontends.snippets import script_code, script_requirements
    needs = script_requirements(result.plan, result.answers, result.model)
    for i, line in enumerate(needs):
        print(f"{'Script:  ' if i == 0 else '         '} {line}", file=out)
    code = script_code(result.plan, result.answers, result.model)
    if code:
        print("          The lines to add to the training script:", file=out)
        for line in code.splitlines():
            print(f"              {line}" if line else "", file=out)


def longest_text(plan) -> str:
    """"Longest sequence this machine takes: ...": the machine's limit over every rung the options allow (not only
    the chosen rung's), and how it is reached; "" when the plan has none."""
    longest = getattr(plan, "longest", None)
    if longest is None:
        return ""
    return (f"Longest sequence this machine takes: --seq-len {longest.seq_len:,} at micro-batch 1, on {longest.name} "
            f"with {longest.how} (every rung the options allow; --backend, --offload and --allow-code-changes widen "
            "or narrow them)")


def nothing_fits_message(result, alternatives_shown: bool = False) -> str:
    """The exit-3 line. `alternatives_shown`: the text plan above it printed the `Instead:` lines, so the fitting
    adapter alternatives are pointed at, not printed a second time."""
    from wizard.config import answers as answers_mod
    from wizard.planning.plan import explain_nothing_fits
    a = result.answers
    text = explain_nothing_fits(result.plan, result.hardware, result.model, answers_mod.training_options(a),
                                answers_mod.strategy_options(a), answers_mod.topology(a, result.hardware))
    fitting = [alt.text for alt in result.plan.alternatives if alt.choice is not None]
    listed = ("see the Instead: line" + ("s" if len(fitting) > 1 else "") + " above" if alternatives_shown
              else "; ".join(fitting))
    if fitting and a.get("method") == "qlora":
        text += (" With --method lora (its 16-bit base is sharded while it loads, where QLoRA's 4-bit model is "
                 f"loaded whole onto every GPU first): {listed}.")
    elif fitting:
        text += f" Fine-tuning with adapters instead (--method): {listed}."
    return text


def print_findings(findings, file: TextIO | None = None) -> None:
    out = wrapping(file)
    for f in findings:
        print(finding_line(f), file=out)
    out.flush()


def print_written(result, dry_run: bool, file: TextIO | None = None, script: list[str] | None = None) -> None:
    out = file or sys.stdout
    if dry_run:
        print(f"Dry run: nothing written. Would write {result.yaml_path}"
              + (f" and {result.ds_path}" if result.ds_text is not None else ""), file=out)
        print_script_settings(result, file=out)
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
    print_script_settings(result, file=out)
    import shlex
    what = shlex.join(script) if script else "your_train.py [args]"
    from wizard.frontends.snippets import where_to_launch
    steps = where_to_launch(result.accelerate_doc or {}, str(result.yaml_path), what,
                            machines=int(result.answers.get("num_machines") or 1),
                            main_ip=result.answers.get("main_process_ip"))
    for i, (where, command) in enumerate(steps):
        line = f"{where}: {command}" if where and command else where or command
        print(f"{'Next: ' if i == 0 else '      '}{line}", file=out)


def script_settings_lines(result) -> list[str]:
    """What the training script must set for the plan to hold and no written file carries (gradient checkpointing
    first): config.script_settings, the list every face prints."""
    from wizard.config.script_settings import SETTINGS_TITLE, script_settings
    if result.plan.choice is None:
        return []
    trainer = str(result.answers.get("trainer") or "hf")
    settings = script_settings(result.answers, result.plan)
    return [SETTINGS_TITLE] + [f"  - {s.line(trainer)}" for s in settings] if settings else []


def print_script_settings(result, file: TextIO | None = None) -> None:
    out = wrapping(file)
    for line in script_settings_lines(result):
        print(line, file=out)
    out.flush()


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
    """One row per candidate: its split (micro-batch x accumulation per process, gradient checkpointing), then
    predicted / measured peak memory per GPU (per process on CPU processes), step time, tokens/s, MFU."""
    peak = "peak per process" if getattr(result, "cpu", False) else "peak per GPU"
    rows = [["candidate", "micro-batch x accum", "result", peak, "step time", "tokens/s", "MFU"]]
    for t in result.trials:
        p = t.candidate.predicted
        mark = "=> " if result.winner is t else "   "
        peak = fmt_bytes(t.peak_bytes) + (" RSS" if t.peak_kind == "rss" else "") if t.peak_bytes else "-"
        rows.append([mark + t.candidate.label, t.candidate.batch_text, t.status,
                     _pair(fmt_bytes(p.get("per_gpu_bytes")) if p.get("per_gpu_bytes") else "-", peak),
                     _pair(_dur(p.get("step_seconds")), _dur(t.step_seconds)),
                     _pair(fmt_rate(p["tokens_per_second"]) if p.get("tokens_per_second") else "-",
                           fmt_rate(t.tokens_per_second) if t.tokens_per_second else "-"),
                     _pair(f"{p['mfu']:.1%}" if p.get("mfu") is not None else "-",
                           f"{t.mfu:.1%}" if t.mfu is not None else "-")])
    return rows


def print_tune(result, file: TextIO | None = None, written_note: str = "Dry run: nothing written.",
               script: list[str] | None = None) -> None:
    out = file or sys.stdout
    if not result.trials:
        return
    rows = tune_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("Measured (predicted / measured):", file=out)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)
    for line in tune_messages(result):
        print(line, file=out)
    if result.winner is None:
        print("No candidate was measured to completion: nothing written.", file=out)
    else:
        w = result.winner
        print(f"Winner:   {w.candidate.label}: {fmt_rate(w.tokens_per_second)} measured"
              + (f" (noise ±{w.noise:.0%})" if w.noise is not None else ""), file=out)
        if result.written is not None:
            print_written(result.written, dry_run=False, file=out, script=script)
        else:
            print(written_note, file=out)
    print(f"Trials:   logs and probe records in {result.run_dir}", file=out)


def tune_messages(result) -> list[str]:
    """What the table alone does not say (why a faster row did not win, a row not applicable, the notes): under
    the table in the text result and in the TUI's Measure."""
    return ([f"  {t.candidate.label}: {t.message}" for t in result.trials if t.message]
            + [f"Note:     {note}" for note in result.notes])


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
