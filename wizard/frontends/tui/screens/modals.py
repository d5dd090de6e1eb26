"""Small modal screens: the F1 explanation and the "quit without writing?" question."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ExplainModal(ModalScreen[None]):
    """Question.help and why its default was chosen; any of Escape, Enter, F1, ? closes it."""

    BINDINGS = [Binding("escape,enter,f1,question_mark,q", "dismiss", "Close")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self._title = title
        self._body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="explain", classes="modal"):
            yield Static(f"[b]{self._title}[/b]", classes="modal-title")
            with VerticalScroll():
                yield Static(self._body, id="explain-body")
            yield Static("[dim]Enter or Escape closes[/dim]", classes="modal-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class QuitModal(ModalScreen[bool]):
    """Quit without writing? Enter/Escape keep going (the safe answer); q, y or ctrl+q/ctrl+c quit."""

    BINDINGS = [
        Binding("escape,n", "stay", "Keep going"),
        Binding("q,y", "quit_now", "Quit"),
        Binding("ctrl+q,ctrl+c", "quit_now", "Quit", priority=True),
    ]

    def __init__(self, message: str) -> None:
        super().__init__()
        self._message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="quit", classes="modal"):
            yield Static("[b]Quit the wizard?[/b]", classes="modal-title")
            yield Static(self._message, id="quit-message")
            with Horizontal(classes="modal-buttons"):
                yield Button("Keep going", id="stay", variant="primary", compact=True)
                yield Button("Quit without writing", id="quit-now", variant="error", compact=True)

    def on_mount(self) -> None:
        self.query_one("#stay", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "quit-now")

    def action_stay(self) -> None:
        self.dismiss(False)

    def action_quit_now(self) -> None:
        self.dismiss(True)
