"""Screen 3, Plan: every rung as a bar of per-GPU memory against the capacity, and why it was chosen or not.

Enter on the marked rung accepts the plan; Enter on another rung that fits picks it (the strategy
answers backend / ZeRO stage / offload are set to lead to it, and the plan is made again at once).
A rung that does not fit is never picked, and Next refuses a plan whose choice does not fit: when
nothing fits, the screen says what would (more GPUs, more RAM, a smaller batch, LoRA / QLoRA) and stays.
The strategy questions under the ladder re-plan too.
"""

from __future__ import annotations

from typing import Iterable

from rich.markup import escape
from rich.text import Text
from textual.binding import Binding
from textual.containers import Grid
from textual.widget import Widget
from textual.widgets import OptionList, Static

from wizard.config.questions import for_stage
from wizard.frontends.report import longest_text
from wizard.frontends.tui.screens.base import WizardScreen, first_sentence
from wizard.frontends.tui.screens.details import asked_on_details
from wizard.frontends.session import measure_unavailable
from wizard.frontends.tui.widgets.memory_bar import legend, short_name
from wizard.frontends.tui.widgets.rung_list import RungList
from wizard.frontends.tui.words import field_name, in_words
from wizard.planning.plan import COMPONENTS
from wizard.planning.speed import fmt_rate
from wizard.units import fmt_bytes, fmt_count, fmt_duration


def budget_line(state) -> str:
    plan, hw = state.plan, state.hardware
    if plan is None:
        return ""
    topo = plan.topology
    if topo.cpu:
        where = f"{topo.world_size} CPU process{'es' if topo.world_size != 1 else ''}"
        unit = "process"
    else:
        names = " / ".join(sorted({g.name.replace('NVIDIA ', '') for g in hw.gpus}))
        where = f"{topo.world_size} x {names}"
        unit = "GPU"
    machines = f" on {topo.num_machines} machines" if topo.num_machines > 1 else ""
    model = state.model
    model_text = f" · {fmt_count(model.params)} params" if model is not None else ""
    return (f"{where}{machines} · [b]{fmt_bytes(plan.usable_bytes)}[/b] usable per {unit} of "
            f"{fmt_bytes(plan.gpu_capacity_bytes)} · {plan.precision}{model_text}{method_text(state.answers)}")


def method_text(answers) -> str:
    """' · LoRA r=16' / ' · QLoRA r=16 (4-bit base)' for the header: every figure below is for adapters then."""
    method = answers.get("method", "full")
    if method not in ("lora", "qlora"):
        return ""
    rank = answers.get("lora_rank")
    name = "LoRA" if method == "lora" else "QLoRA"
    return f" · [b]{name}[/b]" + (f" r={rank}" if rank else "") + (" (4-bit base)" if method == "qlora" else "")


def alternatives_text(plan) -> Text:
    """'Instead: LoRA r=16 fits ...' lines, and where to switch (plain text: model names may hold '[')."""
    from wizard.config.questions import by_id
    text = Text()
    for i, alt in enumerate(plan.alternatives):
        if i:
            text.append("\n")
        text.append("Instead: ", "bold yellow")
        text.append(alt.text)
    if any(alt.choice is not None for alt in plan.alternatives):
        text.append(f"\n(switch with {field_name(by_id('method'))} on the Model screen: Escape)", "dim")
    return text


def nothing_fits_text(error: str) -> Text:
    """The planner's 'Nothing fits. The closest rung ... What would fit: ... With N of host RAM ...' with the
    verdict in red and each cure on its own line, in the words of the screens."""
    text = Text()
    head, sep, rest = in_words(error).partition(" ")
    if head == "Nothing" and rest.startswith("fits."):
        text.append("✗ Nothing fits.", "bold red")
        rest = rest[len("fits."):]
    else:
        text.append("✗ ", "bold red")
        rest = f"{head}{sep}{rest}"
    for marker in ("What would fit:", "No single change tried", "With "):
        rest = rest.replace(f". {marker}", f".\n{marker}")
    text.append(rest)
    text.highlight_words(["What would fit:"], "bold green")
    return text


def max_micro_batch_text(rung) -> str:
    """'micro-batch up to 8 (24 with GC)': the largest that fits on this rung."""
    parts = []
    if rung.max_micro_batch:
        parts.append(str(rung.max_micro_batch))
    if rung.max_micro_batch_gc and rung.max_micro_batch_gc != rung.max_micro_batch:
        parts.append(f"{rung.max_micro_batch_gc} with GC" if parts else f"{rung.max_micro_batch_gc} (with GC)")
    if not parts:
        return ""
    return "micro-batch up to " + (f"{parts[0]} ({parts[1]})" if len(parts) == 2 else parts[0])




def choice_status_parts(plan) -> tuple[str, str, str, str]:
    """The chosen rung for the one-line status: its name (+GC), speed, split (the --global-batch split, else the
    largest micro-batch that fits) and time to train; "" where there is none."""
    c = plan.choice
    name = f"[b]{c.name}[/b]" + (" +GC" if c.gradient_checkpointing else "") + \
        (" +code" if c.checkpoint_offload or c.tiled_mlp else "")
    rate = f"≈{fmt_rate(c.speed.tokens_per_second)}" if c.speed is not None else ""
    if plan.batch is not None and plan.batch.applied:
        split = f"batch {c.micro_batch}x{c.grad_accum}"
    else:
        split = short_micro_batch_text(c)
    time = fmt_duration(c.train_seconds) if c.train_seconds is not None else ""
    return name, rate, split, time


def fit_status(parts: tuple[str, str, str, str], width: int) -> str:
    """name · speed · split · time to train, within `width` cells (an 80-column screen has 60): "to train" goes
    first (the time stays), then the split, the time, the speed; the name stays (the status line cuts it with an
    ellipsis if it must). Cut by the line itself, the time read "2h 53m to …"."""
    from rich.text import Text
    name, rate, split, time = parts
    options = [(name, rate, split, f"{time} to train" if time else ""),
               (name, rate, split, time),
               (name, rate, f"{time} to train" if time else ""),
               (name, rate, time),
               (name, rate)]
    for option in options:
        text = " · ".join(p for p in option if p)
        if Text.from_markup(text).cell_len <= width:
            return text
    return name


def short_micro_batch_text(rung) -> str:
    """'micro-batch ≤2 (8 +GC)': max_micro_batch_text for the one-line status of an 80-column screen."""
    if not rung.max_micro_batch and not rung.max_micro_batch_gc:
        return ""
    if not rung.max_micro_batch:
        return f"micro-batch ≤{rung.max_micro_batch_gc} +GC"
    gc = (f" ({rung.max_micro_batch_gc} +GC)" if rung.max_micro_batch_gc
          and rung.max_micro_batch_gc != rung.max_micro_batch else "")
    return f"micro-batch ≤{rung.max_micro_batch}{gc}"


def near_limit(plan) -> bool:
    """Whether the Plan screen shows the machine's longest sequence under the ladder: where the asked length is near
    the chosen rung's limit (its max_seq_len is shown) or beyond what the chosen rung allows (the explanation pane,
    F1 on the ladder, always shows it)."""
    c = plan.choice
    return plan.longest is not None and c is not None and bool(c.max_seq_len)


class PlanScreen(WizardScreen):
    STEP = 2
    # c: Compare machines (hidden from the footer, which stays the Plan screen's own; F1 and README name it)
    BINDINGS = [Binding("m", "measure", "Measure"), Binding("c", "compare", "Compare machines", show=False)]
    BODY_SCROLLS = False        # the rung list scrolls by itself; summary and strategy stay in view
    AUTO_FOCUS = "#rungs"

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="plan-summary")
        yield Static("", id="plan-legend")
        yield RungList(id="rungs")
        yield Static("", id="plan-warning")
        with Grid(id="strategy"):
            for q in for_stage("strategy"):
                yield self.make_field(q)

    def mounted(self) -> None:
        super().mounted()
        self.wizard.start_preload()

    def measure_unavailable(self) -> str | None:
        """Why Measure is not offered (it runs the user's script on this machine), or None."""
        return measure_unavailable(self.state)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Measure is not offered (no key hint, `m` does nothing) where it cannot run; F1 on the ladder says why.
        if action == "measure" and self.measure_unavailable():
            return False
        return super().check_action(action, parameters)

    def action_compare(self) -> None:
        """`wizard compare` from here: the same answers on the default machines; a chosen row is planned."""
        if self.state.model is None:
            return
        from wizard.frontends.tui.screens.compare import CompareScreen, plan_for_machine

        def chosen(machine) -> None:            # a wizard.compare.Machine, or None
            if machine is not None:
                plan_for_machine(self.state, machine)
                self.wizard.replan()
        self.app.push_screen(CompareScreen(self.state), chosen)

    def action_measure(self) -> None:
        """`wizard tune` from here: the measured winner becomes the picked rung."""
        if self.state.plan is None or self.state.plan.choice is None or self.measure_unavailable():
            return
        from wizard.frontends.tui.screens.measure import MeasureModal

        def picked(candidate) -> None:          # the measured winner (a wizard.tune.Candidate), or None
            if candidate is not None:
                self.state.use_measured(candidate)
                self.sync()
        self.app.push_screen(MeasureModal(self.state), picked)

    def screen_help(self) -> str:
        plan = self.state.plan
        if plan is not None and plan.choice is None:
            return ("Nothing fits; what would is listed under the ladder. Escape: the model and training (LoRA, "
                    "QLoRA) · Tab: the strategy · F1 explains the highlighted rung")
        return ("↑↓ rungs · Enter on the marked rung goes on, on another picks it · Tab: backend, ZeRO stage, "
                "offload, headroom · F1 explains the highlighted rung")

    def sync(self) -> None:
        super().sync()
        self.refresh_bindings()             # Measure's key hint follows the machine planned for
        state = self.state
        plan = state.plan
        self.query_one("#plan-summary", Static).update(budget_line(state))
        self.query_one("#plan-legend", Static).update(legend(plan) if plan is not None else "")
        self.query_one(RungList).show_plan(plan, state.picked, state.ladder_choice)
        warning = self.query_one("#plan-warning", Static)
        if plan is not None and plan.choice is None:
            text = nothing_fits_text(state.error or "Nothing fits.")
            if plan.alternatives:
                text.append("\n")
                text.append_text(alternatives_text(plan))
            warning.update(text)
        elif state.picked_does_not_fit:
            c = plan.choice
            warning.update(Text(f"⚠ {c.name} does not fit: it needs {fmt_bytes(c.per_gpu_bytes)} per GPU and "
                                f"{fmt_bytes(plan.usable_bytes)} is usable. Training would run out of memory, so "
                                "Next waits: pick a rung marked ✓ or set the backend back to auto.", "red"))
        elif state.error and plan is None:
            warning.update(Text(f"✗ {in_words(state.error)}", "red"))
        elif plan is not None and plan.alternatives:
            warning.update(alternatives_text(plan))
        elif plan is not None and near_limit(plan):
            warning.update(Text(longest_text(plan) + "."))
        else:
            warning.update("")
        warning.display = bool(str(warning.render()))

    def status_text(self) -> str:
        state = self.state
        if state.sizing is not None:
            return f"[dim]Sizing {state.sizing.model} ...[/dim]"
        plan = state.plan
        if plan is None and self.fixed_on_details():
            # an answer of the Details screen does not plan: say which, and that Next goes there to fix it
            return f"[red]✗ {escape(first_sentence(state.error, 44))} · Next: fix it on Details[/red]"
        if plan is None or plan.choice is None:
            return "[red]✗ Nothing fits · Escape: the inputs · Tab: the strategy[/red]"
        return fit_status(choice_status_parts(plan), self.status_width())

    def on_resize(self, event) -> None:     # Textual also calls WizardScreen.on_resize (every class in the MRO)
        self.call_after_refresh(self.sync_status)       # the status line's parts follow its width

    # ------------------------------------------------------------------ picking

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        key = event.option.id
        plan = self.state.plan
        if plan is not None and plan.choice is not None and key == plan.choice.key:
            self.action_next()
            return
        rung = next((r for r in plan.rungs if r.key == key), None) if plan is not None else None
        if rung is not None and not rung.fits:
            # Picking it would only walk the user to files that run out of memory.
            self.set_status(f"[red]✗ {self.does_not_fit(rung)}[/red]")
            self.app.bell()
            return
        self.state.pick_rung(key)
        self.wizard.refresh_state()

    def does_not_fit(self, rung) -> str:
        """One status line: why Enter on this rung (or Next with it) goes nowhere."""
        plan = self.state.plan
        if plan is not None and plan.choice is None:
            return "Nothing fits: what would is under the ladder"
        return f"{short_name(rung)} does not fit: pick a rung marked ✓"

    def result_pending(self) -> str | None:
        return self.sizing_busy()

    def busy(self) -> str | None:
        return self.sizing_busy()

    def fixed_on_details(self) -> bool:
        """No plan because of an answer the Details screen asks (machines, details): Next goes there, where the
        field shows the error, instead of waiting here for a plan only that screen can fix."""
        state = self.state
        return state.plan is None and bool(state.error) and asked_on_details(state.error_field)

    def blocking_problem(self) -> str | None:
        problem = WizardScreen.blocking_problem(self)
        if problem:
            return problem
        if self.fixed_on_details():
            return None
        plan = self.state.plan
        if self.state.sizing is None and plan is not None and (plan.choice is None or not plan.choice.fits):
            return self.does_not_fit(plan.choice)
        return self.plan_needed_problem("there is no plan yet")

    def explanation(self) -> tuple[str, str]:
        rungs = self.query_one(RungList)
        plan = self.state.plan
        if self.focused is not rungs or plan is None or rungs.highlighted_key is None:
            return super().explanation()
        rung = next(r for r in plan.rungs if r.key == rungs.highlighted_key)
        lines = [in_words(rung.reason), ""]
        width = max(len(name) for name in COMPONENTS)
        for name in COMPONENTS:
            lines.append(f"  {name:<{width}}  {fmt_bytes(rung.breakdown.get(name, 0)):>10}")
        lines.append(f"  {'total':<{width}}  {fmt_bytes(rung.per_gpu_bytes):>10}   "
                     f"(usable {fmt_bytes(plan.usable_bytes)} of {fmt_bytes(plan.gpu_capacity_bytes)})")
        if rung.cpu_bytes:
            lines.append(f"  host RAM needed: {fmt_bytes(rung.cpu_bytes)}")
        if rung.nvme_bytes:
            lines.append(f"  NVMe needed: {fmt_bytes(rung.nvme_bytes)}")
        if rung.speed is not None:
            s = rung.speed
            lines += ["", f"  speed            ≈{fmt_rate(s.tokens_per_second)} "
                          f"({fmt_rate(s.tokens_per_second_per_gpu)} per GPU), {s.step_seconds:.3g} s per step, "
                          f"MFU {s.mfu * 100:.0f}%, {s.bound}-bound"]
            biggest = max_micro_batch_text(rung)
            if biggest:
                lines.append(f"  {biggest}")
            if rung.max_seq_len:
                lines.append(f"  longest sequence that fits: --seq-len {rung.max_seq_len} (the asked one is near it)")
        if plan.longest is not None:
            lines += ["", f"  {longest_text(plan)}."]
            if plan.batch is not None and plan.batch.applied and rung.micro_batch:
                lines.append(f"  batch            micro-batch {rung.micro_batch} x accumulation {rung.grad_accum} x "
                             f"{plan.topology.world_size} processes = {plan.batch.global_batch} (its fastest split)")
            if rung.train_seconds is not None and plan.train_tokens:
                lines.append(f"  time to train    {fmt_duration(rung.train_seconds)} for "
                             f"{fmt_count(plan.train_tokens)} tokens")
        lines += ["", "The wizard takes the fastest rung that fits, by its speed model, but never offloads while a "
                      "rung without offload fits (offload is the slow last resort). Gradient checkpointing (+GC) is "
                      "switched on where activations, not model states, are what does not fit."]
        lines += [f"[dim]• {in_words(n)}[/dim]" for n in plan.notes]
        unavailable = self.measure_unavailable()
        lines.append(f"[dim]{unavailable}.[/dim]" if unavailable else
                     "[dim]m measures the best rungs with your training script, in short trials on this machine.[/dim]")
        lines.append("[dim]c compares machines: this plan's time and cost on other GPUs and counts.[/dim]")
        return rung.name, "\n".join(lines)
