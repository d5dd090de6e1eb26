"""The Plan screen's Measure action (`m`): `wizard tune` with a progress bar per candidate.

The user types the training script and its arguments; the trials run in a thread (wizard.tune, the same
runner as the CLI); Escape stops the trial in progress (its supervisor ends every process) and writes nothing.
At the end the table shows predicted against measured, and Enter makes the measured winner the plan's choice
(the Review screen then writes it, with the same set write as ever).
"""

from __future__ import annotations

import shlex
import threading
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, ProgressBar, Static


class MeasureModal(ModalScreen[Any]):
    """Dismissed with the winner (a wizard.tune.Candidate: its rung, and a variant's split), or None."""

    BINDINGS = [Binding("escape", "cancel", "Stop / close")]

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
        self.cancel = threading.Event()
        self.result = None
        self.running = False
        self.bars: dict[str, ProgressBar] = {}
        self.labels: dict[str, Static] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="measure", classes="modal"):
            yield Static("[b]Measure the best candidates with your training script[/b]", classes="modal-title")
            yield Input(placeholder="train.py --your-args", id="measure-command")
            yield Static("", id="measure-status")
            yield VerticalScroll(id="measure-rows")
            yield Static("[dim]Enter starts · Escape stops and closes[/dim]", classes="modal-hint",
                         id="measure-hint")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.running:
            return
        if self.result is not None:
            self._finish()
            return
        try:
            command = shlex.split(event.value)
        except ValueError as e:
            self._status(f"[red]{e}[/red]")
            return
        if not command:
            return
        self.running = True
        self._status("Planning the candidates ...")
        threading.Thread(target=self._run, args=(command,), name="wizard-measure", daemon=True).start()

    def _run(self, command: list[str]) -> None:
        from wizard import tune
        from wizard.errors import WizardError
        state = self.state
        request = state.measure_request()
        opts = tune.TuneOptions(script=command[0], script_args=command[1:], cancel=self.cancel)
        try:
            result = tune.tune(request, opts, progress=lambda e: self.app.call_from_thread(self._progress, e),
                               write=False)
        except KeyboardInterrupt:
            self.app.call_from_thread(self._done, None, "Stopped: nothing written.")
            return
        except (WizardError, OSError) as e:
            self.app.call_from_thread(self._done, None, f"[red]{e}[/red]")
            return
        self.app.call_from_thread(self._done, result, None)

    def _status(self, text: str) -> None:
        self.query_one("#measure-status", Static).update(text)

    def _progress(self, e: dict) -> None:
        rows = self.query_one("#measure-rows", VerticalScroll)
        kind = e.get("event")
        if kind == "plan":
            self._status(f"{len(e['candidates'])} candidates; trials in {e['run_dir']}")
            for label in e["candidates"]:
                self.labels[label] = Static(label)
                self.bars[label] = ProgressBar(total=None, show_eta=False)
                rows.mount(self.labels[label], self.bars[label])
        elif kind == "step" and e["label"] in self.bars:
            self.bars[e["label"]].update(total=e["total"], progress=e["step"])
        elif kind == "end" and e["label"] in self.labels:
            self.labels[e["label"]].update(f"{e['label']}: {e['trial']['status']}")

    def _done(self, result, message: str | None) -> None:
        self.running = False
        self.result = result
        if result is None:
            self._status(message or "")
            return
        from wizard.frontends.report import tune_messages, tune_rows
        rows = tune_rows(result)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
        # why a faster row did not win (another global batch), a row not applicable: as the text result says
        table = "\n".join([table, *tune_messages(result)])
        from rich.markup import escape
        winner = result.winner.candidate.label if result.winner else None
        self._status(escape(table) + "\n" + (f"Winner: [b]{escape(winner)}[/b] · Enter makes it the plan's choice"
                                             if winner else "No candidate was measured to completion."))
        self.query_one("#measure-hint", Static).update("[dim]Enter uses the winner · Escape closes[/dim]")
        self.query_one(Input).focus()

    def _finish(self) -> None:
        w = self.result.winner if self.result is not None else None
        self.dismiss(w.candidate if w is not None else None)

    def action_cancel(self) -> None:
        if self.running:
            self.cancel.set()
            self._status("Stopping the trial ...")
            return
        self.dismiss(None)
