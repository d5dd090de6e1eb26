"""Screen 2, Model and training: the 'model' and 'training' questions of the table.

Each field is built from its Question and pre-filled with its default. A model path or Hub id is
sized in a thread (a spinner says so); a parameter count is sized at once. Every change re-plans,
and the line under the fields shows where the plan lands.
"""

from __future__ import annotations

from typing import Iterable

from textual.widget import Widget
from textual.widgets import Collapsible, Static

from wizard.config.questions import for_stage
from wizard.frontends.tui.screens.base import WizardScreen
from wizard.frontends.tui.widgets.question_field import QuestionField
from wizard.units import fmt_bytes, fmt_count


def plan_line(state) -> str:
    """One line: where the plan lands for the current inputs (or why there is none)."""
    plan = state.plan
    if plan is not None and plan.choice is None and state.error:
        from rich.markup import escape
        from wizard.frontends.tui.words import in_words
        return f"[red]✗ {escape(in_words(state.error))}[/red]"   # the whole story; the status line has room for less
    if plan is None or plan.choice is None:
        return ""
    c = plan.choice
    unit = "process" if plan.topology.cpu else "GPU"
    gc = " with gradient checkpointing" if c.gradient_checkpointing else ""
    verdict = "" if c.fits else " [red](does not fit)[/red]"
    return (f"Plan: [b]{c.name}[/b]{gc}: {fmt_bytes(c.per_gpu_bytes)} of {fmt_bytes(plan.usable_bytes)} "
            f"usable per {unit}{verdict}")


def model_summary(model) -> str:
    if model is None:
        return ""
    how = "exact, from its config" if model.exact else "estimated from a parameter count"
    name = model.source or model.model_type or "model"
    # A shape from a parameter count is named by its flag ("--params 7B"): the count says it all here.
    head = "" if name.startswith("--") else f"{name}: "
    return (f"{head}{fmt_count(model.params)} parameters ({how}), {model.layers} layers, hidden "
            f"{model.hidden_size}, vocab {model.vocab_size:,}")


# Advanced questions (--plain leaves them at their recommendation) that the form shows beside the batch anyway:
# the batch the user trains and how long the run is are where people look for them, not under "Advanced".
IN_SIGHT = ("global_batch", "train_tokens")
ADVANCED_TITLE = "Advanced: model shape, task, dataset and epochs, LoRA details, attention"


def on_the_form(q) -> bool:
    """Whether the question's field is on the form itself (else under the Advanced fold)."""
    return not q.advanced or q.id in IN_SIGHT


class ModelScreen(WizardScreen):
    STEP = 1
    AUTO_FOCUS = "#q-model"

    def compose_body(self) -> Iterable[Widget]:
        questions = for_stage("model") + for_stage("training")
        from wizard.sizing.model import cached_model_ids
        try:
            cached = cached_model_ids()
        except OSError:
            cached = []
        for q in questions:
            if on_the_form(q):
                yield self.make_field(q, suggestions=cached if q.id == "model" and cached else None)
        with Collapsible(title=ADVANCED_TITLE, collapsed=True, id="advanced"):
            for q in questions:
                if not on_the_form(q):
                    yield self.make_field(q)
        yield Static("", id="model-summary")
        yield Static("", id="plan-line")

    def screen_help(self) -> str:
        return "The model decides the memory of every rung; the training settings scale the activations."

    def sync(self) -> None:
        super().sync()
        state = self.state
        advanced = self.query_one("#advanced", Collapsible)
        advanced.display = any(f.display for f in advanced.query(QuestionField))
        spinner = self.spinner()
        if state.sizing is not None:
            spinner.start(f"Sizing {state.sizing.model} from its config (no weights) ...")
        else:
            spinner.stop()
        self.query_one("#model-summary", Static).update(model_summary(state.model) if state.sizing is None else "")
        self.query_one("#plan-line", Static).update(plan_line(state))

    def status_text(self) -> str:
        if self.state.sizing is not None:
            return ""
        return super().status_text()

    def busy(self) -> str | None:
        return self.sizing_busy()

    def blocking_problem(self) -> str | None:
        problem = super().blocking_problem()
        if problem:
            return problem
        state = self.state
        # A model that can't be sized, or a training input the planner refuses, is this screen's
        # business; "nothing fits" is shown on the Plan screen, where it can be fixed.
        if state.error and state.model is None and state.sizing is None:
            return state.error
        if state.error and state.error_field and self.field(state.error_field) is not None:
            return state.error
        return None
