"""Screen 5, Review: the files with syntax highlighting, the diff against what is there, validation, Write.

Validation (accelerate, DeepSpeed and transformers load the files) runs in a thread; Write waits
for it (pressing it early writes as soon as validation passes) and refuses when it found an error.
Writing is pipeline.write: atomic, the previous file kept as .bak.
"""

from __future__ import annotations

from typing import Iterable

from rich.console import Group
from rich.markup import escape
from rich.syntax import Syntax
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane

from wizard import pipeline
from wizard.errors import WizardError
from wizard.findings import finding_words
from wizard.frontends.session import planned_changes
from wizard.frontends.tui.messages import ValidationDone
from wizard.frontends.tui.screens.base import WizardScreen


def syntax(text: str, lexer: str, app, word_wrap: bool = False) -> Syntax:
    """Highlighted text on the screen's own background (light and dark themes alike)."""
    theme = app.current_theme
    dark = theme.dark if theme is not None else True
    background = app.get_css_variables().get("background", "default")
    return Syntax(text, lexer, theme="ansi_dark" if dark else "ansi_light", background_color=background,
                  word_wrap=word_wrap)


class ReviewScreen(WizardScreen):
    STEP = 4
    NEXT_LABEL = "Write ▶"
    AUTO_FOCUS = "#next"
    TAB_ORDER = ("tab-yaml", "tab-ds", "tab-diff", "tab-validation")
    BINDINGS = [
        Binding("left", "tab(-1)", "Previous tab", show=False),
        Binding("right", "tab(1)", "Next tab", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.result: pipeline.Result | None = None
        self.token = 0
        self.findings: list | None = None
        self.validation_error: str | None = None
        self.write_when_validated = False

    def compose_body(self) -> Iterable[Widget]:
        with TabbedContent(id="review-tabs"):
            with TabPane("default_config.yaml", id="tab-yaml"):
                with VerticalScroll():
                    yield Static("", id="yaml-text")
            with TabPane("ds_config.json", id="tab-ds"):
                with VerticalScroll():
                    yield Static("", id="ds-text")
            with TabPane("Changes", id="tab-diff"):
                with VerticalScroll():
                    yield Static("", id="diff-text")
            with TabPane("Validation", id="tab-validation"):
                with VerticalScroll():
                    yield Static("", id="validation-text")

    def mounted(self) -> None:
        if self.state.request.dry_run:
            self.NEXT_LABEL = "Finish (dry run) ▶"
            self.next_button().label = self.NEXT_LABEL
        super().mounted()

    def resumed(self) -> None:
        self.render_files()
        if self.result is not None:
            self.show_changes(self.result)    # back from Done: the files on disk are the written ones now

    def action_tab(self, step: int) -> None:
        """←/→ switch the tabs wherever the focus is (the Write button has it at first)."""
        tabs = self.query_one(TabbedContent)
        shown = [t for t in self.TAB_ORDER if not (t == "tab-ds" and self.result is not None
                                                    and self.result.ds_text is None)]
        at = shown.index(tabs.active) if tabs.active in shown else 0
        tabs.active = shown[(at + step) % len(shown)]

    def sync(self) -> None:
        if self.result is None:
            self.render_files()
        self.sync_status()
        self.update_help()
        self.mark_shown_after_paint()

    def screen_help(self) -> str:
        return (f"Files for {escape(self.state.output_dir)}. Enter writes them (atomically; an existing file is "
                "kept as .bak). ←/→: the other file, the changes, the validation.")

    # ------------------------------------------------------------------ rendering and validation

    def render_files(self) -> None:
        state = self.state
        try:
            result = state.result()
        except (RuntimeError, WizardError) as e:
            self.result = None
            self.query_one("#yaml-text", Static).update(Text(f"Nothing to show: {e}", style="red"))
            return
        same = (self.result is not None and self.result.yaml_text == result.yaml_text
                and self.result.ds_text == result.ds_text)
        if same:
            return          # back from Done, or a resume with nothing changed: keep the validation
        self.result = result
        self.findings = None
        self.validation_error = None
        self.query_one("#yaml-text", Static).update(syntax(result.yaml_text, "yaml", self.app))
        tabs = self.query_one(TabbedContent)
        if result.ds_text is not None:
            self.query_one("#ds-text", Static).update(syntax(result.ds_text, "json", self.app))
            tabs.show_tab("tab-ds")
        else:
            tabs.hide_tab("tab-ds")
        self.show_changes(result)
        self.query_one("#validation-text", Static).update("Validating ...")
        self.token = self.wizard.validate_in_thread(result)
        self.spinner().start("Validating with accelerate, DeepSpeed and transformers ...")
        self.sync_status()

    def show_changes(self, result: pipeline.Result) -> None:
        parts = []
        for change in planned_changes(result):
            parts.append(Text(f"{change.path}: {change.what}", style="bold"))
            if change.diff:
                parts.append(syntax(change.diff.rstrip("\n"), "diff", self.app))
            parts.append(Text(""))
        self.query_one("#diff-text", Static).update(Group(*parts))

    def validation_done(self, message: ValidationDone) -> None:
        if message.token != self.token:
            return
        self.spinner().stop()
        self.findings = message.findings
        self.validation_error = message.error
        self.query_one("#validation-text", Static).update(self.findings_text())
        self.sync_status()
        if self.write_when_validated and self.is_current:
            self.write_when_validated = False
            self.action_next()

    def findings_text(self) -> str:
        if self.validation_error:
            return f"[red]✗ validation could not run: {escape(self.validation_error)}[/red]"
        if not self.findings:
            return "[green]✓ accelerate, DeepSpeed and transformers accept both files.[/green]"
        lines = []
        for f in self.findings:
            w = finding_words(f)
            colour = "red" if w.severity == "error" else "yellow"
            mark = "✗" if w.severity == "error" else "⚠"
            line = (f"[{colour}]{mark} {w.severity} [{escape(w.rule)}][/{colour}] {escape(w.location)}: "
                    f"{escape(w.message)}")
            if w.fix:
                line += f"\n    Fix: {escape(w.fix)}"
            lines.append(line)
        return "\n".join(lines)

    @property
    def errors(self) -> list:
        return [f for f in (self.findings or []) if f.severity == "error"]

    def status_text(self) -> str:
        if self.result is None:
            return f"[red]✗ {escape(self.state.error or 'nothing to write')}[/red]"
        if self.findings is None and self.validation_error is None:
            return "[dim]Write waits for validation[/dim]" if self.write_when_validated else ""
        if self.validation_error:
            return "[red]✗ validation could not run: not writing[/red]"
        if self.errors:
            return f"[red]✗ validation found {len(self.errors)} error(s): not writing (see Validation)[/red]"
        warnings = len(self.findings or [])
        return "[green]✓ validated[/green]" + (f" [yellow]({warnings} warning(s))[/yellow]" if warnings else "")

    # ------------------------------------------------------------------ writing

    def blocking_problem(self) -> str | None:
        if self.result is None:
            return self.state.error or "nothing to write"
        if self.validation_error:
            return f"validation could not run: {self.validation_error}"
        if self.errors:
            self.query_one(TabbedContent).active = "tab-validation"
            return f"validation found {len(self.errors)} error(s); nothing written"
        return None

    def busy(self) -> str | None:
        return "Validating" if self.findings is None and self.validation_error is None else None

    def action_next(self) -> None:
        if self.busy():
            self.write_when_validated = True
        super().action_next()

    def go_next(self) -> None:
        result = self.result
        if not self.state.request.dry_run:
            try:
                writes = self.state.write(result)
            except (OSError, WizardError, RuntimeError) as e:
                self.set_status(f"[red]✗ could not write: {escape(str(e))}[/red]")
                return
            except KeyboardInterrupt as e:
                # A stop signal the set write held until a safe point: rolled back, or after the set was in place.
                from wizard.fsutil import InterruptedAfterWrite
                self.wizard.stop_for_signal(str(e) or "a signal", files_written=isinstance(e, InterruptedAfterWrite))
                return
        else:
            from wizard.config import emit
            writes = emit.write_files(result.yaml_text, result.ds_text, result.output_dir, dry_run=True)
        self.wizard.written_result = result
        self.wizard.writes = writes
        super().go_next()
