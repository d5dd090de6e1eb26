"""One question of the table as a form row: label, control (built from Question.kind/choices), inline error.

The field never decides anything: it parses what the user typed with Question.parse (the same
validation as flags and answers files) and posts AnswerEntered or AnswerInvalid. The screen stores
the value in the state, re-plans, and calls `show()` on every field with the new resolved values.

A text field keeps what is typed into it: while its Input has the focus, `show()` only records the resolved
value, and the text is normalised ("1.5e9" -> "1.5B") when the focus leaves it or Enter is pressed. Writing the
resolved value back on every re-plan rewrote the text under the cursor: the re-plan of one key arrives after
the next keys were typed, so "1.5e9" typed slowly became "2B" and a burst lost keys ("16", BSpace 7 BSpace 8
left "16").
"""

from __future__ import annotations

from typing import Any, Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, Select, Static

from wizard.config.questions import Context, Question
from wizard.errors import InputError
from wizard.frontends.session import format_value
from wizard.frontends.tui.messages import AnswerEntered, AnswerInvalid, FieldFocused
from wizard.frontends.tui.widgets.typed_input import TypedInput

TEXT_KINDS = ("int", "float", "str", "path", "count", "size")


class ChoiceSelect(Select, inherit_bindings=False):
    """A Select that opens on space only: up/down move between fields as in any form, and Enter goes on
    (Next), as it does in every other field; inside the open list Enter takes the highlighted choice.
    (Textual reads inherit_bindings as a class keyword; as a class attribute it kept Select's enter/up/down.)"""

    BINDINGS = [Binding("space", "show_overlay", "Choices", show=False)]


# What an empty field means, where "not set" says too little.
EMPTY_MEANS = {
    "model": "(empty: the parameter count below)",
    "nvme_path": "(none)",
}


def placeholder(q: Question) -> str:
    """The grey text of an empty field: a hint in parentheses, never something that reads as a value (the
    metavar "1e9" or "CLASS[,CLASS]" did). The format and an example are in the help line and under F1."""
    if q.id in EMPTY_MEANS:
        return EMPTY_MEANS[q.id]
    if q.metavar and q.metavar.startswith("empty"):
        return f"({q.metavar})"
    return "(not set)"


def select_options(q: Question, ctx: Context | None, labels: dict | None = None) -> list[tuple[str, Any]]:
    if q.kind == "bool":
        return [("yes", True), ("no", False)]
    labels = labels or {}
    return [(labels.get(o, str(o)), o) for o in (q.options(ctx) or ())]


class QuestionField(Vertical):
    """A labelled control for one Question, with the InputError text shown under it."""

    DEFAULT_CSS = """
    QuestionField { height: auto; }
    QuestionField > Horizontal { height: auto; }
    QuestionField .q-label { width: 36; padding-right: 1; }
    QuestionField .q-control { width: 1fr; }
    QuestionField .q-error { color: $error; padding-left: 2; display: none; }
    QuestionField.-invalid .q-error { display: block; }
    """

    def __init__(self, question: Question, context: Callable[[], Context], value: Any,
                 suggestions: list[str] | None = None, labels: dict | None = None) -> None:
        super().__init__(id=f"field-{question.id}", classes="question-field")
        self.question = question
        self._ctx_fn = context
        self._shown: Any = value          # the value the control starts with
        self._option_values: list[Any] = []
        self._suggestions = suggestions
        self._labels = labels
        self.error: str | None = None
        self.external_error = False       # the error came from the plan/sizing, not from parsing
        self._resolved: Any = value       # the state's value, last given to show()
        self._typed_since_shown = False   # the user typed after that value was given (its re-plan is pending)

    @property
    def qid(self) -> str:
        return self.question.id

    def compose(self) -> ComposeResult:
        q = self.question
        with Horizontal():
            yield Label(q.prompt, classes="q-label")
            if q.kind in ("choice", "bool"):
                options = select_options(q, self._ctx_fn(), self._labels)
                self._option_values = [v for _, v in options]
                value = self._shown if any(v == self._shown for _, v in options) else Select.NULL
                yield ChoiceSelect(options, value=value, allow_blank=value is Select.NULL, compact=True,
                                   id=f"q-{q.id}", classes="q-control")
            else:
                suggester = (SuggestFromList(self._suggestions, case_sensitive=False)
                             if self._suggestions else None)
                text = format_value(q, self._shown)
                self._shown = text
                yield TypedInput(text, placeholder=placeholder(q), compact=True, suggester=suggester,
                            select_on_focus=False, id=f"q-{q.id}", classes="q-control")
        yield Static("", classes="q-error")

    @property
    def control(self) -> Input | Select:
        return self.query_one(f"#q-{self.qid}")

    # ------------------------------------------------------------------ showing values

    def show(self, value: Any) -> None:
        """Put the resolved value in the control (unless the user is mid-way through a bad entry).

        Programmatic updates post no Changed message (prevent), so they never read as user edits.
        """
        self._resolved = value
        self._typed_since_shown = False
        if self.error is not None:
            return
        try:
            control = self.control
        except NoMatches:               # not composed yet: compose will show this value
            self._shown = value
            return
        if isinstance(control, Input) and control.has_focus:
            return                      # being typed in: normalised when the focus leaves (normalise)
        if isinstance(control, Select):
            options = select_options(self.question, self._ctx_fn(), self._labels)
            values = [v for _, v in options]
            with control.prevent(Select.Changed):
                if values != self._option_values:
                    self._option_values = values
                    control.set_options(options)
                if any(v == value for v in values) and control.value != value:
                    control.value = value
                self._shown = control.value
        else:
            text = format_value(self.question, value)
            if text != control.value:
                with control.prevent(Input.Changed):
                    control.value = text
            self._shown = text

    def normalise(self) -> None:
        """Show a text field's value in its normal form ("1.5e9" -> "1.5B"): the state's resolved value, or,
        when the re-plan of the last key has not come back yet, the parse of the text (that re-plan's own
        show() follows, on a field that no longer has the focus). Nothing changes while the text is invalid."""
        try:
            control = self.control
        except NoMatches:
            return
        if not isinstance(control, Input) or self.error is not None:
            return
        if self._typed_since_shown:
            try:
                value = self.question.parse(control.value, self._ctx_fn())
            except InputError:
                return
            if value is None:
                return                  # emptied: the default the re-plan resolves is shown by its show()
        else:
            value = self._resolved
        text = format_value(self.question, value)
        if text != control.value:
            with control.prevent(Input.Changed):
                control.value = text
        self._shown = text

    def set_error(self, error: str | None) -> None:
        self.error = error
        self.set_class(error is not None, "-invalid")
        self.query_one(".q-error", Static).update(f"✗ {error}" if error else "")

    # ------------------------------------------------------------------ user edits

    def _parse(self, raw: Any) -> None:
        try:
            value = self.question.parse(raw, self._ctx_fn())
        except InputError as e:
            self.set_error(str(e))
            self.post_message(AnswerInvalid(self.qid, str(e)))
            return
        self.set_error(None)
        self.post_message(AnswerEntered(self.qid, value))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._user_value(event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.value is not Select.NULL:
            self._user_value(event.value)

    def _user_value(self, raw: Any) -> None:
        # Mounting a control can report its initial value; only a different value is an edit.
        if raw == self._shown and self.error is None:
            return
        self._shown = raw
        self._typed_since_shown = True
        self._parse(raw)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.normalise()                # and the screen goes on with the event (Enter = Next)

    def holds(self, value: Any) -> bool:
        """Whether the control's text (or choice) is still `value`: a message about a value typed before the
        last key must not mark the text typed since."""
        try:
            raw = self.control.value
        except NoMatches:
            return False
        if isinstance(self.control, Select):
            return raw == value
        try:
            return self.question.parse(raw, self._ctx_fn()) == value
        except InputError:
            return False

    def revalidate(self) -> str | None:
        """Parse what the control holds now (the context may have changed); the error, or None."""
        try:
            control = self.control
        except NoMatches:
            return None
        raw = control.value
        if raw is Select.NULL:
            return None
        try:
            self.question.parse(raw, self._ctx_fn())
        except InputError as e:
            self.set_error(str(e))
            return str(e)
        if self.error is not None:
            self.set_error(None)
        return None

    def on_descendant_focus(self) -> None:
        self.add_class("-focused")          # wizard.tcss marks the label (a class: :focus-within can go stale)
        self.post_message(FieldFocused(self.qid))

    def on_descendant_blur(self) -> None:
        self.remove_class("-focused")
        self.normalise()
