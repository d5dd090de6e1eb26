"""The Plan screen's Measure action (`m`): `wizard tune` with a progress bar per candidate.

The user types the training script and its arguments; the trials run in a thread (wizard.tune, the same
runner as the CLI); Escape stops the trial in progress (its supervisor ends every process) and writes nothing.
At the end a table shows predicted against measured, with the columns that fit the terminal; the highlighted
row's other columns and what the table alone does not say are under it. Enter makes the measured winner the
plan's choice (the Review screen then writes it, with the same set write as ever).

The script field is read-only while the trials run (a stray key must not change the command being measured),
and the trials' notes are said in the TUI's words: the screen has no `wizard tune` flags to give.
"""

from __future__ import annotations

import re
import shlex
import threading
from typing import Any

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, ProgressBar, Static

from wizard.frontends.tui.widgets.typed_input import TypedInput
from wizard.frontends.tui.words import field_name, in_words

# The result table's columns (report.tune_rows' order), and which are dropped first when the terminal is narrow:
# the candidate, how it ended and its speed stay; peak memory, step time, its split and MFU follow as room allows.
COLUMN_PRIORITY = (0, 2, 5, 3, 4, 1, 6)
CELL_PADDING = 2            # DataTable's cell padding, one column each side
TABLE_CHROME = 4            # the modal's padding and the table's scrollbar

# What a user of this screen does where wizard.tune's notes name a `wizard tune` flag (the screen has none).
_GLOBAL_BATCH = re.compile(r"tune again with --allow-global-batch-change, or plan with --global-batch (\d+)")
_NOT_ELIGIBLE = " (--allow-global-batch-change lets it)"
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_ASIDE = re.compile(r"\(([^()]*)\)")
MIN_CANDIDATE_CELLS = 16    # the candidate column is cut (with …) to no less; its whole name is under the table


def in_screen_words(text: str) -> str:
    """A tune message or note as this screen says it: no `wizard tune` flags (the screen has none), the plan's
    questions named by their fields, and what to do here instead where there is something to do. Any other
    clause that names a `wizard tune` flag ("; --max-micro-batch changes it") is left out: the screen has no
    such setting to change."""
    from wizard.config.questions import by_id
    global_batch = field_name(by_id("global_batch"))
    text = _GLOBAL_BATCH.sub(lambda m: f"set {global_batch} to {m.group(1)} on the Model screen (Escape) and "
                             "measure again", text)
    text = text.replace(_NOT_ELIGIBLE, " (Measure keeps your global batch)")
    text = in_words(text)                       # the plan's own flags: the fields that set them

    def aside(m: re.Match) -> str:
        kept = [c for c in m.group(1).split("; ") if not _FLAG.search(c)]
        return f"({'; '.join(kept)})" if kept else ""

    text = _ASIDE.sub(aside, text)
    sentences = [s for s in re.split(r"(?<=\.) ", text) if not _FLAG.search(s)]
    return re.sub(r" +([.,;])", r"\1", " ".join(sentences)).strip()


def visible_columns(widths: list[int], room: int) -> list[int]:
    """The columns (indices into report.tune_rows' header) that fit in `room` cells, in the table's order: by
    COLUMN_PRIORITY, always the first three (candidate_cells cuts the candidate's to make them fit)."""
    chosen: list[int] = []
    used = 0
    for i in COLUMN_PRIORITY:
        need = widths[i] + CELL_PADDING
        if len(chosen) >= 3 and used + need > room:
            continue
        chosen.append(i)
        used += need
    return sorted(chosen)


def candidate_cells(widths: list[int], columns: list[int], room: int) -> int:
    """How wide the candidate column may be: what the other columns leave of `room` (its whole width if it fits)."""
    others = sum(widths[i] + CELL_PADDING for i in columns if i != 0)
    return max(MIN_CANDIDATE_CELLS, min(widths[0], room - others - CELL_PADDING))


def cut(text: str, cells: int) -> str:
    return text if len(text) <= cells else text[:cells - 1].rstrip() + "…"


class MeasureBox(Vertical):
    """The modal's frame: when its width changes (the terminal was resized), the table takes the columns that fit."""

    def on_resize(self) -> None:
        screen = self.screen
        if isinstance(screen, MeasureModal) and screen.rows:
            self.call_after_refresh(screen._show_table)


class MeasureModal(ModalScreen[Any]):
    """Dismissed with the winner (a wizard.tune.Candidate: its rung, and a variant's split), or None."""

    BINDINGS = [Binding("escape", "cancel", "Stop / close")]

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
        self.cancel = threading.Event()
        self.result = None
        self.running = False
        self.command: list[str] | None = None
        self.bars: dict[str, ProgressBar] = {}
        self.labels: dict[str, Static] = {}
        self.rows: list[list[str]] = []      # report.tune_rows(result): the header, then one row per trial
        self._columns: tuple = ()           # (the table's columns, the candidate column's width) as shown

    def compose(self) -> ComposeResult:
        with MeasureBox(id="measure", classes="modal"):
            yield Static("[b]Measure the best candidates with your training script[/b]", classes="modal-title")
            with Horizontal(id="measure-command-row"):
                yield Label("Training script and its arguments", classes="q-label")
                yield TypedInput(placeholder="(e.g. train.py --your-args)", id="measure-command", compact=True)
            yield VerticalScroll(id="measure-rows")
            table: DataTable = DataTable(id="measure-table", cursor_type="row", zebra_stripes=False)
            table.display = False
            yield table
            yield Static("", id="measure-detail")
            with VerticalScroll(id="measure-status-box"):
                yield Static("", id="measure-status")
            yield Static("[dim]Enter starts · Escape stops and closes[/dim]", classes="modal-hint",
                         id="measure-hint")

    def on_mount(self) -> None:
        self.query_one(TypedInput).focus()

    def on_input_submitted(self, event: TypedInput.Submitted) -> None:
        event.stop()
        if self.running:
            return
        if self.result is not None:
            self._finish()
            return
        try:
            command = shlex.split(event.value)
        except ValueError as e:
            self._status(f"[red]{escape(str(e))}[/red]")
            return
        if not command:
            return
        self.running = True
        self.command = command
        self.query_one(TypedInput).disabled = True      # read-only while its trials run
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
            self.app.call_from_thread(self._done, None, f"[red]{escape(in_screen_words(str(e)))}[/red]")
            return
        self.app.call_from_thread(self._done, result, None)

    def _status(self, text: str) -> None:
        self.query_one("#measure-status", Static).update(text)

    def _progress(self, e: dict) -> None:
        rows = self.query_one("#measure-rows", VerticalScroll)
        kind = e.get("event")
        if kind == "plan":
            self._status(f"{len(e['candidates'])} candidates; trials in {escape(e['run_dir'])}")
            for label in e["candidates"]:
                self.labels[label] = Static(escape(label))
                self.bars[label] = ProgressBar(total=None, show_eta=False)
                rows.mount(self.labels[label], self.bars[label])
        elif kind == "step" and e["label"] in self.bars:
            self.bars[e["label"]].update(total=e["total"], progress=e["step"])
        elif kind == "end" and e["label"] in self.labels:
            self.labels[e["label"]].update(f"{escape(e['label'])}: {e['trial']['status']}")

    def _done(self, result, message: str | None) -> None:
        self.running = False
        self.result = result
        command_input = self.query_one(TypedInput)
        if result is None:
            command_input.disabled = False              # stopped or refused: the command can be corrected
            self._status(message or "")
            command_input.focus()
            return
        from wizard.frontends.report import tune_messages, tune_rows
        self.rows = tune_rows(result)
        self.query_one("#measure-rows", VerticalScroll).display = False
        self._show_table()
        # why a faster row did not win (another global batch), a row not applicable, the notes: as the text
        # result says them, in this screen's words
        winner = result.winner.candidate.label if result.winner else None
        lines = [f"Winner: [b]{escape(winner)}[/b] · Enter makes it the plan's choice" if winner   # first: in view
                 else "No candidate was measured to completion."]
        lines += [escape(in_screen_words(line)) for line in tune_messages(result)]
        self._status("\n".join(lines))
        self.query_one("#measure-hint", Static).update(
            "[dim]↑↓ a row's other figures · Enter uses the winner · Escape closes[/dim]" if winner else
            "[dim]↑↓ a row's other figures · Escape closes[/dim]")

    # ------------------------------------------------------------------ the result table

    def _room(self) -> int:
        return max(self.query_one("#measure", Vertical).size.width - TABLE_CHROME, 20)

    def _show_table(self) -> None:
        """The columns that fit now (again on resize); the cursor stays on its row."""
        if not self.rows:
            return
        header, body = self.rows[0], self.rows[1:]
        widths = [max(len(r[i]) for r in self.rows) for i in range(len(header))]
        room = self._room()
        columns = visible_columns(widths, room)
        first = candidate_cells(widths, columns, room)
        table = self.query_one("#measure-table", DataTable)
        if (columns, first) == self._columns and table.row_count:
            return
        self._columns = (columns, first)
        row = table.cursor_row if table.row_count else self._winner_index()
        table.clear(columns=True)
        table.add_columns(*(header[i] for i in columns))
        for r in body:
            table.add_row(*(cut(r[i], first) if i == 0 else r[i] for i in columns))
        table.display = True
        table.move_cursor(row=min(row, len(body) - 1))
        table.focus()
        self._show_detail(row)

    def _winner_index(self) -> int:
        result = self.result
        if result is None or result.winner is None:
            return 0
        return next((i for i, t in enumerate(result.trials) if t is result.winner), 0)

    def _show_detail(self, index: int) -> None:
        """The highlighted row's columns that the table has no room for, and its message."""
        if not self.rows or not 0 <= index < len(self.rows) - 1:
            return
        header, row = self.rows[0], self.rows[index + 1]
        shown = self._columns[0] if self._columns else []
        hidden = [f"{header[i]} {row[i]}" for i in range(1, len(header)) if i not in shown]
        parts = [f"[b]{escape(row[0].strip(' =>'))}[/b] (predicted / measured)"]
        if hidden:
            parts.append(escape(" · ".join(hidden)))
        message = self.result.trials[index].message if self.result is not None else ""
        text = ": ".join(parts)
        if message:
            text += "\n" + escape(in_screen_words(message))
        self.query_one("#measure-detail", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_detail(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if not self.running and self.result is not None:
            self._finish()

    # ------------------------------------------------------------------ closing

    def _finish(self) -> None:
        w = self.result.winner if self.result is not None else None
        if w is not None and self.command:
            # the script measured is the one the files are for: the Done screen and the exit text name it, with
            # the arguments that run the winner's split where the trial set them (TuneResult.script_args)
            args = self.result.script_args if self.result.script_args is not None else self.command[1:]
            self.state.script = [self.command[0], *args]
        self.dismiss(w.candidate if w is not None else None)

    def action_cancel(self) -> None:
        if self.running:
            self.cancel.set()
            self._status("Stopping the trial ...")
            return
        self.dismiss(None)
