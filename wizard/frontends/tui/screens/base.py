"""What every wizard screen shares: title, scrolling body, help line, status line with Back/Next, footer.

Keys: Enter = Next (an Input's Enter too, when its value is valid), Escape = Back (answers kept:
they live in the app's WizardState, not in the screen), F1 or ? = explain the focused question,
up/down move between fields, ctrl+q quits (asking first when something changed).
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, Iterable

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Static

from wizard.config.questions import Question, by_id
from wizard.frontends.session import format_value
from wizard.frontends.tui.messages import AnswerEntered, AnswerInvalid, FieldFocused, StateChanged
from wizard.frontends.tui.widgets.question_field import QuestionField
from wizard.frontends.tui.words import in_words
from wizard.frontends.tui.widgets.spinner import Spinner

if TYPE_CHECKING:
    from wizard.frontends.session import WizardState
    from wizard.frontends.tui.app import WizardApp

STEPS = ("Hardware", "Model and training", "Plan", "Details", "Review", "Done")
MIN_WIDTH, MIN_HEIGHT = 80, 24      # every screen is laid out for at least this (wizard.tcss)


def first_sentence(text: str, limit: int = 56) -> str:
    """The status line is one line of an 80-column screen: the error's first sentence, cut at `limit`
    (the whole error is on the screen above or under F1)."""
    end = text.find(". ")
    head = text if end < 0 else text[:end + 1]
    return head if len(head) <= limit else head[:limit - 1].rstrip() + "…"


STATUS_CELLS_AT_80 = 60     # the status line's width on an 80-column screen (Back and Next take the rest)


def status_problem(problem: str, width: int, shown_in_full: bool) -> str:
    """A problem on the one-line status, never cut mid-sentence: the whole text when it fits in `width` cells (after
    "✗ "), else its first complete part that does (without the "(allowed: ...)" aside, its first sentence, the part
    before a ";" or a trailing parenthesis); else, when the screen shows it in full under its field, a pointer
    there. Only a problem shown nowhere else is cut (with "…")."""
    room = max(width - 2, 10)
    parts = [problem, problem.split(" (allowed:")[0]]
    parts += [parts[-1].split(". ")[0], parts[-1].split("; ")[0]]
    parts.append(parts[-1].split(" (")[0])
    fitting = next((p.rstrip(" .;,") for p in parts if len(p.rstrip(" .;,")) <= room), None)
    if fitting:
        return fitting
    if shown_in_full:
        name = problem.split(":")[0] if ":" in problem[:40] else "this field"
        pointer = f"{name}: the message under the field says what to change"
        return pointer if len(pointer) <= room else "the message under the field says what to change"
    return first_sentence(problem, room)


def too_small_text(width: int, height: int) -> str:
    return (f"The terminal is {width}×{height}; the wizard needs at least {MIN_WIDTH}×{MIN_HEIGHT}. "
            "Enlarge the window, or use `wizard --plain`.")


class WizardScreen(Screen):
    STEP = 0
    NEXT_LABEL = "Next ▶"
    BODY_SCROLLS = True
    # The scrolling body takes no focus of its own: Tab goes from Next (or the start) to the first field, not
    # to an invisible container. A screen of text to read (Done) lets the body take it, to scroll by keys.
    BODY_FOCUSABLE = False
    BINDINGS = [
        Binding("enter", "next", "Next", key_display="⏎"),
        Binding("escape", "back", "Back"),
        Binding("f1", "explain", "Explain"),
        Binding("question_mark", "explain", "Explain", show=False),
        Binding("down", "app.focus_next", "Next field", show=False),
        Binding("up", "app.focus_previous", "Previous field", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.focused_qid: str | None = None
        self.advance_when_ready = False     # Next was pressed while a thread was still working
        self.shown_at: float | None = None  # when this screen's result was last painted (None: not yet)
        self.leaving = False                # Next was accepted: the next screen is being built

    # ------------------------------------------------------------------ layout

    @property
    def wizard(self) -> "WizardApp":
        return self.app  # type: ignore[return-value]

    @property
    def state(self) -> "WizardState":
        return self.wizard.state

    def title_text(self) -> str:
        steps = " › ".join(f"[reverse] {name} [/reverse]" if i == self.STEP else name
                           for i, name in enumerate(STEPS))
        return f" {self.STEP + 1}/6 {steps}"

    def compose(self) -> ComposeResult:
        yield Static("", id="too-small")
        yield Static(self.title_text(), id="title")
        body = (VerticalScroll(id="body", can_focus=self.BODY_FOCUSABLE) if self.BODY_SCROLLS else
                Vertical(id="body"))
        with body:
            yield from self.compose_body()
        yield Static("", id="help")
        with Horizontal(id="navbar"):
            # The buttons get their width first; the spinner and status share what is left, so a long
            # spinner text in 80 columns is cut with an ellipsis instead of cutting "Write ▶" to "Write".
            with Horizontal(id="nav-left"):
                yield Spinner(id="spinner")
                yield Static("", id="status")
            with Horizontal(id="nav-buttons"):
                yield Button("◀ Back", id="back", compact=True, disabled=self.STEP == 0)
                yield Button(self.NEXT_LABEL, id="next", variant="primary", compact=True)
        yield Footer()

    def compose_body(self) -> Iterable[Widget]:
        return ()

    def fields(self) -> list[QuestionField]:
        return list(self.query(QuestionField))

    def field(self, qid: str) -> QuestionField | None:
        found = self.query(f"#field-{qid}")
        return found.first() if found else None  # type: ignore[return-value]

    def make_field(self, q: Question, suggestions: list[str] | None = None) -> QuestionField:
        return QuestionField(q, partial(self.state.context_for, q.id), self.state.value_of(q.id),
                             suggestions=suggestions)

    # ------------------------------------------------------------------ state -> screen

    # Textual calls a handler of every class in the MRO, so subclasses override these plain
    # methods (mounted, resumed, ...) instead of the handlers.

    def on_mount(self) -> None:
        self.show_size(self.app.size.width, self.app.size.height)
        self.mounted()

    def on_resize(self, event) -> None:
        self.show_size(event.size.width, event.size.height)

    def show_size(self, width: int, height: int) -> None:
        """Below 80x24 the layout breaks (selects stack, lines are cut): say so at the top."""
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        self.set_class(small, "-too-small")
        self.query_one("#too-small", Static).update(too_small_text(width, height) if small else "")

    def mounted(self) -> None:
        self.sync()

    def on_screen_resume(self) -> None:
        self.leaving = False
        self.shown_at = None            # back (or out of a modal): Enter counts once it is shown again
        self.resumed()
        self.mark_shown_after_paint()

    def resumed(self) -> None:
        self.sync()

    def on_state_changed(self, message: StateChanged) -> None:
        self.sync()

    def sync(self) -> None:
        """Show the state: values of untouched fields, which questions are asked, errors, status."""
        state = self.state
        for f in self.fields():
            visible = self.field_visible(f)
            f.display = visible
            if state.error_field == f.qid and state.error:
                f.set_error(state.error)
                f.external_error = True
            elif f.external_error:
                f.external_error = False
                f.set_error(None)
            if visible and f.error is None:
                f.show(self.field_value(f))
        self.sync_status()
        self.update_help()
        self.mark_shown_after_paint()

    # ------------------------------------------------------------------ type-ahead

    # Enter typed while a screen is being built or is still working is not an answer to what the
    # screen shows: the app drops it (WizardApp.on_event), so type-ahead never falls through a
    # screen whose result was not on the terminal, and files are written only from a Review
    # screen that was seen.

    def result_pending(self) -> str | None:
        """What this screen's own result still waits for (the probe, the sizing), or None."""
        return None

    def mark_shown_after_paint(self) -> None:
        """The screen's widgets now hold its result and are painted at the end of this cycle. The mark is
        taken now, not after the paint: a key read while the paint is still queued was typed by someone
        looking at the previous frame of this screen, not at an earlier screen."""
        if self.result_pending():
            self.shown_at = None
        elif self.shown_at is None and self.is_current:
            self.shown_at = time.monotonic()

    def accepts_enter_typed_at(self, when: float) -> bool:
        """Enter typed at `when` (monotonic) answers this screen: it came after the screen was painted."""
        return not self.leaving and self.shown_at is not None and when >= self.shown_at

    def typed_ahead(self) -> None:
        """An Enter typed before the screen was shown was dropped: say so, and what it waits for."""
        if self.leaving:
            return
        waiting = self.result_pending()
        self.set_status(f"[dim]{waiting} ... (Enter again once it is shown)[/dim]" if waiting else
                        "[dim]Enter typed before this screen was shown: ignored[/dim]")

    def field_visible(self, f: QuestionField) -> bool:
        state = self.state
        if not (state.answers or state.full_answers):
            return True
        return state.asked(f.qid)

    def field_value(self, f: QuestionField) -> Any:
        return self.state.value_of(f.qid)

    def sync_status(self) -> None:
        self.set_status(self.status_text())

    def status_text(self) -> str:
        state = self.state
        if state.error and not self.error_is_inline():
            return f"[red]✗ {escape(status_problem(state.error, self.status_width(), False))}[/red]"
        return ""

    def status_width(self) -> int:
        """The status line's cells: its laid-out width, or an 80-column screen's before the first layout."""
        found = self.query("#status")
        width = found.first(Static).size.width if found else 0
        return width if width > 0 else STATUS_CELLS_AT_80

    def error_is_inline(self) -> bool:
        f = self.field(self.state.error_field) if self.state.error_field else None
        return f is not None and f.display

    def set_status(self, markup: str) -> None:
        # A key can reach a screen that is current but not yet composed (pushed, compose still
        # queued): there is no status line to write to yet, and mounting will write its own.
        status = self.query("#status")
        if status:
            status.first(Static).update(markup)

    def spinner(self) -> Spinner:
        return self.query_one("#spinner", Spinner)

    # ------------------------------------------------------------------ help

    def on_field_focused(self, message: FieldFocused) -> None:
        self.focused_qid = message.qid
        self.update_help()

    def on_descendant_focus(self, event) -> None:
        widget = event.widget if hasattr(event, "widget") else None
        if widget is not None and not any(isinstance(a, QuestionField) for a in widget.ancestors_with_self):
            self.focused_qid = None
            self.update_help()

    def question(self, qid: str | None) -> Question | None:
        if qid is None:
            return None
        f = self.field(qid)
        if f is not None:
            return f.question
        try:
            return by_id(qid)
        except KeyError:
            return None

    def update_help(self) -> None:
        help_line = self.query_one("#help", Static)
        q = self.question(self.focused_qid)
        if q is None:
            help_line.update(self.screen_help())
            return
        keys = "Space: the choices · F1: why this default" if q.kind in ("choice", "bool") else "F1: why this default"
        help_line.update(f"[b]{q.prompt}[/b]: {in_words(q.help)}  [dim]({keys})[/dim]")

    def screen_help(self) -> str:
        return ""

    def explanation(self) -> tuple[str, str]:
        """(title, body) for F1: the focused question's help and why its default was chosen."""
        q = self.question(self.focused_qid)
        if q is None:
            return STEPS[self.STEP], self.screen_help() or "Enter accepts the recommendations; Escape goes back."
        ctx = self.state.context()
        try:
            default = q.default(ctx)
            why = q.why_default(ctx)
        except (AttributeError, TypeError):   # a default reading the hardware, model or plan we don't have yet
            default, why = None, ""
        lines = [in_words(q.help), ""]
        shown = format_value(q, default) if default is not None else "none"
        lines.append(f"[b]Recommended:[/b] {shown}" + (f": {why}" if why else ""))
        current = self.state.value_of(q.id)
        if q.id in self.state.entered:
            lines.append(f"[b]You entered:[/b] {format_value(q, current) or 'nothing'}")
        if q.flag:
            lines.append(f"[dim]Flag: {q.flag}   answers-file key: {q.id}   allowed: {q.allowed_text(ctx)}[/dim]")
        return q.prompt, "\n".join(lines)

    def action_explain(self) -> None:
        from wizard.frontends.tui.screens.modals import ExplainModal
        title, body = self.explanation()
        self.app.push_screen(ExplainModal(title, body))

    # ------------------------------------------------------------------ field -> state

    def on_answer_entered(self, message: AnswerEntered) -> None:
        message.stop()
        self.answer_entered(message.qid, message.value)

    def answer_entered(self, qid: str, value: Any) -> None:
        self.wizard.answer(qid, value)

    def on_answer_invalid(self, message: AnswerInvalid) -> None:
        self.sync_status()

    # ------------------------------------------------------------------ navigation

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.input_submitted(event.input)

    def input_submitted(self, control: Input) -> None:
        self.action_next()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.button_pressed(event.button.id)

    def button_pressed(self, button_id: str | None) -> None:
        if button_id == "next":
            self.action_next()
        elif button_id == "back":
            self.action_back()

    def blocking_problem(self) -> str | None:
        """Why Next can't go on now (an invalid field, no plan), or None."""
        for f in self.fields():
            if not f.display:
                continue
            error = f.error or (f.revalidate() if f.qid in self.state.entered else None)
            if error:
                f.control.focus()
                return error
        return None

    def busy(self) -> str | None:
        """What a thread is still doing for this screen (Next waits for it), or None."""
        return None

    def sizing_busy(self) -> str | None:
        """`busy` for the screens whose content depends on the model being sized."""
        sizing = self.state.sizing
        return f"Sizing {sizing.model}" if sizing is not None else None

    def plan_needed_problem(self, no_plan: str) -> str | None:
        """`blocking_problem` for the screens that need a plan: a field error first, then no plan
        (unless a sizing is under way, which Next waits for instead)."""
        problem = WizardScreen.blocking_problem(self)
        if problem:
            return problem
        state = self.state
        if state.sizing is None and not state.ready:
            return state.error or no_plan
        return None

    def action_next(self) -> None:
        if self.leaving:
            return
        problem = self.blocking_problem()
        if problem:
            inline = any(f.display and f.error == problem for f in self.fields())
            self.set_status(f"[red]✗ {escape(status_problem(problem, self.status_width(), inline))}[/red]")
            self.app.bell()
            return
        busy = self.busy()
        if busy:
            self.advance_when_ready = True
            self.set_status(f"[dim]{busy}: going on when it is done[/dim]")
            return
        self.advance_when_ready = False
        self.go_next()

    def go_next(self) -> None:
        # Building the next screen can take a moment on a busy machine: say so first (painted before
        # the push), and let no Enter typed meanwhile act on this screen again.
        self.leaving = True
        self.spinner().start("Opening the next screen ...")
        self.call_after_refresh(self._advance)

    def _advance(self) -> None:
        self.spinner().stop()
        self.wizard.advance(self)

    def ready_again(self) -> None:
        """A thread finished: go on if Next was pressed while it worked."""
        if self.advance_when_ready and self.is_current:
            self.advance_when_ready = False
            self.action_next()

    def action_back(self) -> None:
        if self.STEP > 0:
            self.wizard.back()

    def next_button(self) -> Button:
        return self.query_one("#next", Button)

