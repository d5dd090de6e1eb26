"""Screen 1, Hardware: what the probe found, warnings, and which machine to plan for.

With no GPU it says so plainly and offers CPU processes here (the default: see
WizardState.default_target) or a machine from the GPU catalogue (the same as --assume).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Iterable

from rich.markup import escape
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from wizard.config.questions import (
    CPUS_QUESTION,
    DISK_QUESTION,
    GPU_QUESTION,
    OTHER_MACHINE_FIELDS,
    RAM_QUESTION,
    TARGET_LABELS,
    by_id,
    target_question,
)
from wizard.config.questions import TARGET_COUNT_QUESTION as COUNT_QUESTION
from wizard.errors import InputError
from wizard.frontends.session import TARGET_CPU, TARGET_HERE, TARGET_OTHER
from wizard.frontends.tui.screens.base import WizardScreen, first_sentence
from wizard.frontends.tui.widgets.question_field import QuestionField
from wizard.probe import hardware as hardware_mod

def machine_name(hw) -> str:
    """What the probed hardware is to the user: this machine, or the one --assume / --hardware describes."""
    if hw.source.startswith("assume:"):
        return "the assumed machine"
    if hw.source.startswith("file:"):
        return "the machine of the saved probe"
    return "this machine"


class HardwareScreen(WizardScreen):
    STEP = 0
    AUTO_FOCUS = "#next"

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="hw-headline")
        yield Static("", id="hw-warnings")
        yield Vertical(id="hw-target")
        yield Static("", id="hw-describe")

    def mounted(self) -> None:
        self._built = False
        self.refused: set[str] = set()     # fields whose value the catalogue refused (answer_entered)
        super().mounted()

    def screen_help(self) -> str:
        where = machine_name(self.state.probed) if self.state.probed is not None else "this machine"
        return (f"What the wizard found on {where}. Enter plans for it; Tab to the fields to plan "
                "for another machine (GPUs, RAM, CPU cores, disk).")

    # ------------------------------------------------------------------ build once the probe is done

    def _build_target(self) -> None:
        state = self.state
        hw = state.probed
        names = sorted({g.name.replace("NVIDIA ", "") for g in hw.gpus})
        here = f"{hw.num_gpus} x {' / '.join(names)}" if hw.gpus else "no GPU"
        self.target_q = target_question(bool(hw.gpus), here, machine_name(hw))
        box = self.query_one("#hw-target", Vertical)
        ctx = state.context
        fields = [
            QuestionField(self.target_q, ctx, state.target,
                          labels={**TARGET_LABELS, TARGET_HERE: f"{machine_name(hw)} ({here})"}),
            QuestionField(by_id("num_processes"), partial(state.context_for, "num_processes"),
                          state.value_of("num_processes")),
            QuestionField(COUNT_QUESTION, ctx, state.other_count),
            QuestionField(GPU_QUESTION, ctx, state.other_gpu),
            QuestionField(RAM_QUESTION, ctx, None),
            QuestionField(CPUS_QUESTION, ctx, None),
            QuestionField(DISK_QUESTION, ctx, None),
        ]
        box.mount_all(fields)
        self._built = True

    def sync(self) -> None:
        state = self.state
        spinner = self.spinner()
        if state.probed is None:
            if state.error:
                spinner.stop()
                self.query_one("#hw-headline", Static).update(f"[red]✗ {state.error}[/red]")
            else:
                spinner.start("Probing GPUs (NVML), CPU, RAM, disks, libraries ...")
            return
        spinner.stop()
        if not self._built:
            self._build_target()
        self._show_hardware()
        super().sync()

    def field_visible(self, f: QuestionField) -> bool:
        target = self.state.target
        if f.qid == "num_processes":
            return target == TARGET_CPU
        if f.qid in OTHER_MACHINE_FIELDS:
            return target == TARGET_OTHER
        return True

    def field_value(self, f: QuestionField) -> Any:
        state = self.state
        other = state.hardware if state.target == TARGET_OTHER else None
        if f.qid in ("target_ram", "target_cpus", "target_disk"):
            if other is None:
                return None
            if f.qid == "target_ram":
                return other.ram_total
            if f.qid == "target_cpus":
                return other.cpu_cores
            return _spec_size(other.disk_free_nvme)
        return {"target_machine": state.target, "target_count": state.other_count,
                "target_gpu": state.other_gpu}.get(f.qid, state.value_of(f.qid))

    def _show_hardware(self) -> None:
        state = self.state
        probed, planned = state.probed, state.hardware
        headline = self.query_one("#hw-headline", Static)
        if not probed.gpus:
            headline.update(f"[b]No NVIDIA GPU here[/b] ({probed.gpu_reason or 'none found'}). "
                            "Plan for CPU processes on this machine, or for a GPU machine from the catalogue.")
        elif probed.source.startswith("assume:"):
            headline.update(f"[b]Planning for an assumed machine:[/b] {probed.source[len('assume:'):]}")
        elif probed.source.startswith("file:"):
            headline.update(f"[b]Hardware from a saved probe:[/b] {probed.source[len('file:'):]}")
        else:
            headline.update(f"[b]Found {probed.num_gpus} GPU{'s' if probed.num_gpus != 1 else ''}[/b] on this machine.")
        shown = planned if (state.target == TARGET_OTHER and planned is not None) else probed
        lines = [_escape(line) for line in compress_gpu_lines(hardware_mod.describe(shown))]
        if shown is not probed:
            # --assume's "say ram=SIZE to change it": here the fields above change it.
            lines = [re.sub(r"; say \w+=\S+ to change it", " (the field above changes it)", line) for line in lines]
            lines.insert(0, f"[b]Target machine[/b] ({_escape(state.other_spec())}):")
        self.query_one("#hw-describe", Static).update("\n".join(lines))
        warnings = hardware_mod.warnings(shown)
        if not shown.gpus and state.target == TARGET_CPU:
            warnings = [w for w in warnings if not w.startswith("no NVIDIA GPU")]
        box = self.query_one("#hw-warnings", Static)
        box.update("\n".join(f"[yellow]⚠ {_escape(w)}[/yellow]" for w in warnings))
        box.display = bool(warnings)

    def status_text(self) -> str:
        state = self.state
        if state.probed is None:
            return ""
        if state.error and state.error_field not in ("num_processes",):
            return f"[red]✗ {escape(first_sentence(state.error))}[/red]"
        if state.plan is not None and state.plan.choice is not None:
            what = {TARGET_HERE: machine_name(state.probed), TARGET_CPU: "CPU processes here",
                    TARGET_OTHER: state.other_spec()}[state.target]
            return f"Planning for {what}."
        return ""

    # ------------------------------------------------------------------ edits

    def answer_entered(self, qid: str, value: Any) -> None:
        state = self.state
        try:
            if qid == "target_machine":
                state.set_target(value)
            elif qid == "target_count":
                state.set_other_machine(value, state.other_gpu)
            elif qid == "target_gpu":
                state.set_other_machine(state.other_count, value)
            elif qid in ("target_ram", "target_cpus", "target_disk"):
                key = {"target_ram": "ram", "target_cpus": "cpus", "target_disk": "disk"}[qid]
                state.set_other_machine(state.other_count, state.other_gpu, **{key: value})
            else:
                state.set_answer(qid, value)
        except InputError as e:
            # The catalogue refuses what the field's own parse let through ("0" on the way to "0.5TiB" of RAM):
            # shown under the field, as a parse error is; the machine stays as it was. Unless the field already
            # holds a later entry (keys typed in a burst): this value is no longer what it says.
            f = self.field(qid)
            if f is not None and f.holds(value):
                f.set_error(str(e))
                self.refused.add(qid)
            self.sync_status()
            return
        if qid in self.refused:
            self.refused.discard(qid)
            f = self.field(qid)
            if f is not None:
                f.set_error(None)
        self.wizard.replan()

    def result_pending(self) -> str | None:
        return "Probing the hardware" if self.state.probed is None else None

    def busy(self) -> str | None:
        return "Probing the hardware" if self.state.probed is None else None

    def blocking_problem(self) -> str | None:
        problem = super().blocking_problem()
        if problem:
            return problem
        if self.state.hardware is None and self.state.error:
            return self.state.error
        return None


def compress_gpu_lines(lines: list[str]) -> list[str]:
    """'  GPU 0: X, ...' .. '  GPU 7: X, ...' with the same text after the index -> '  GPU 0-7: X, ...'."""
    out: list[str] = []
    run: list[tuple[int, str]] = []

    def flush() -> None:
        if not run:
            return
        first, text = run[0]
        last = run[-1][0]
        out.append(f"  GPU {first}: {text}" if first == last else f"  GPU {first}-{last}: {text}")
        run.clear()

    for line in lines:
        m = re.match(r"  GPU (\d+): (.*)$", line)
        if m and (not run or (run[-1][1] == m.group(2) and run[-1][0] + 1 == int(m.group(1)))):
            run.append((int(m.group(1)), m.group(2)))
            continue
        flush()
        if m:
            run.append((int(m.group(1)), m.group(2)))
            continue
        out.append(line)
    flush()
    return out


def _spec_size(value: int | None) -> str:
    if value is None:
        return ""
    from wizard.frontends.session import _spec_value
    return _spec_value("disk", value)


def _escape(text: str) -> str:
    return text.replace("[", "\\[")
