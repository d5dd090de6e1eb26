"""Screen 6, Done: where the files are, how to launch, what the script must set (config.script_settings), the
matching TrainingArguments, and "launch now".

Launch now exits the wizard and execs `python -m wizard launch --config-file ... -- SCRIPT ARGS`
(run_tui does the exec once the terminal is restored), which opens the launch view.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Iterable

from rich.markup import escape
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Button, Input, Label, Static

from wizard.frontends.report import checkpoint_lines, script_settings_lines
from wizard.frontends.snippets import (launch_commands, setup_snippet, uses_adapters, where_to_launch,
                                       wizard_launch_argv)
from wizard.frontends.tui.screens.base import WizardScreen
from wizard.frontends.tui.screens.review import syntax
from wizard.frontends.tui.widgets.typed_input import TypedInput

ARGS_TITLE = "[b]The same setup as TrainingArguments[/b] (HF Trainer, without accelerate's config)"
SETTINGS_SECTION = "[b]Your script must set[/b] (no written file carries these; the plan depends on them)"
ADAPTER_TITLE = ("[b]The same setup in Python[/b] (HF Trainer with peft's LoRA{}, without accelerate's config; "
                 "needs {})")


def commands_text(result, script: list[str]) -> str:
    """The launch commands: on one machine, accelerate's and the wizard's; on several, where each runs, as the
    CLI's Next lines say it (the other machines' own rank, or nothing to launch there with DeepSpeed's pdsh, MPI
    and slurm launchers)."""
    accel, wiz = launch_commands(result.yaml_path, script[0], script[1:])
    machines = int(result.answers.get("num_machines") or 1)
    if machines <= 1:
        return f"{accel}\n{wiz}"
    what = " ".join(shlex.quote(a) for a in script)
    lines = []
    for i, (where, command) in enumerate(where_to_launch(result.accelerate_doc or {}, str(result.yaml_path), what,
                                                         machines, result.answers.get("main_process_ip"))):
        lines.append(f"# {where}" + (":" if command else ""))
        if i == 0:
            lines.append(accel)
        if command:
            lines.append(command)
    return "\n".join(lines)

class DoneScreen(WizardScreen):
    STEP = 5
    NEXT_LABEL = "Finish"
    BODY_FOCUSABLE = True       # the launch commands and the snippet are read, and scrolled by keys
    AUTO_FOCUS = "#next"
    # One key to the script field, wherever the focus is (but in a field, where `l` is typed): Shift+Tab four
    # times from Finish is how far it is otherwise, and a count that depends on where the focus started.
    # A priority binding: the app checks it as the key arrives, so the keys typed (or pasted) right after `l` go to
    # the field; bubbling up from the focused button, it ran after they had gone to the button and were lost.
    BINDINGS = [Binding("l", "launch_field", "Launch now", priority=True)]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "launch_field" and isinstance(self.focused, Input):
            return False                # in a field `l` is a letter
        return super().check_action(action, parameters)

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="done-files")
        yield Static("[b]Launch[/b]", classes="section")
        yield Static("", id="done-commands")
        yield Static(SETTINGS_SECTION, classes="section", id="done-settings-title")
        yield Static("", id="done-settings")
        yield Static(ARGS_TITLE, classes="section", id="done-args-title")
        yield Static("", id="done-args")
        yield Static("[b]Launch now[/b] (leaves the wizard and opens the live launch view)", classes="section")
        with Horizontal(classes="launch-row"):
            yield Label("Training script", classes="q-label")
            yield TypedInput(self.state.script[0] if self.state.script else "",
                             placeholder="(path of your script, e.g. examples/train.py)", id="launch-script",
                             compact=True)
        with Horizontal(classes="launch-row"):
            yield Label("Its arguments", classes="q-label")
            yield TypedInput(shlex.join(self.state.script[1:]) if self.state.script else "",
                             placeholder="(optional: the script's own arguments)", id="launch-args", compact=True)
        yield Static("", id="launch-error")
        yield Button("Launch now", id="launch-now", compact=True)

    def mounted(self) -> None:
        super().mounted()
        self.query_one("#back", Button).disabled = False
        self.show_done()

    def screen_help(self) -> str:
        return ("Enter finishes. l goes to the training script (Tab to its arguments), then Launch now, to start "
                "training.")

    def sync(self) -> None:
        self.sync_status()
        self.update_help()
        self.mark_shown_after_paint()

    def show_done(self) -> None:
        state = self.state
        result = getattr(self.wizard, "written_result", None)
        if result is None:
            return
        writes = getattr(self.wizard, "writes", [])
        lines = []
        dry = state.request.dry_run
        if dry:
            lines.append("[yellow]Dry run: nothing written.[/yellow] These files would be written:")
        for w in writes:
            if dry:
                lines.append(f"  {escape(w.path)}")
            elif not w.changed:
                lines.append(f"[green]✓[/green] {escape(w.path)} (unchanged)")
            else:
                backup = f" (previous kept as {escape(os.path.basename(w.backup_path))})" if w.backup_path else ""
                lines.append(f"[green]✓[/green] Wrote {escape(w.path)}{backup}")
        if result.plan.topology.cpu:
            n = result.plan.topology.world_size
            lines.append(f"[yellow]A CPU-only configuration:[/yellow] {n} CPU process{'es' if n != 1 else ''}, "
                         "gloo, fp32 (no GPU here). Run the wizard again on the GPU machine, or plan for it "
                         "on the Hardware screen.")
            if result.plan.choice is not None and result.plan.choice.backend in ("deepspeed", "fsdp"):
                lines.append("[dim]default_config.yaml says use_cpu: false, as `accelerate config` writes it for "
                             "every distributed type but MULTI_CPU; with no GPU visible the processes run on "
                             "the CPU, over gloo.[/dim]")
        warnings = [f for f in result.findings if f.severity == "warning"]
        lines.append("Validated with accelerate, DeepSpeed and transformers"
                     + (f" ({len(warnings)} warning(s))" if warnings else "") + ".")
        lines += [f"[dim]{escape(line)}[/dim]" for line in checkpoint_lines(result.plan)]
        self.query_one("#done-files", Static).update("\n".join(lines))
        script = state.script or ["train.py"]     # the script measured on the Plan screen, where Measure ran one
        self.query_one("#done-commands", Static).update(
            syntax(commands_text(result, script), "bash", self.app, word_wrap=True))
        settings = script_settings_lines(result)[1:]        # the section title says the first line
        self.query_one("#done-settings-title", Static).display = bool(settings)
        self.query_one("#done-settings", Static).display = bool(settings)
        self.query_one("#done-settings", Static).update(escape("\n".join(line.strip() for line in settings)))
        ds_path = result.ds_path if result.ds_text is not None else None
        code = setup_snippet(result.answers, result.plan, result.model, ds_path)
        if uses_adapters(result.answers):
            qlora = result.answers.get("method") == "qlora"
            self.query_one("#done-args-title", Static).update(ADAPTER_TITLE.format(
                " on a 4-bit base" if qlora else "", "peft and bitsandbytes" if qlora else "peft"))
        self.query_one("#done-args", Static).update(
            syntax(code, "python", self.app, word_wrap=True))

    def status_text(self) -> str:
        return "[dim]dry run[/dim]" if self.state.request.dry_run else "[green]✓ done[/green]"

    # ------------------------------------------------------------------ actions

    def input_submitted(self, control: Input) -> None:
        if control.id in ("launch-script", "launch-args") and self.query_one("#launch-script", Input).value:
            self.launch()
        else:
            self.action_next()

    def button_pressed(self, button_id: str | None) -> None:
        if button_id == "launch-now":
            self.launch()
        else:
            super().button_pressed(button_id)

    def action_launch_field(self) -> None:
        # At once, not Widget.focus(), which defers the change to a callback queued behind the keys already waiting
        self.set_focus(self.query_one("#launch-script", Input))     # scrolls it into view

    def launch(self) -> None:
        from wizard.frontends.tui.messages import Outcome
        result = getattr(self.wizard, "written_result", None)
        error = self.query_one("#launch-error", Static)
        script = self.query_one("#launch-script", Input).value.strip()
        if self.state.request.dry_run or result is None:
            error.update("[red]✗ nothing was written (dry run): there is no config to launch with[/red]")
            return
        if not script:
            error.update("[red]✗ launch: give the training script, e.g. train.py[/red]")
            self.query_one("#launch-script", Input).focus()
            return
        if not os.path.isfile(script):
            error.update(f"[red]✗ launch: {escape(script)} is not a file (allowed: a Python script path)[/red]")
            self.query_one("#launch-script", Input).focus()
            return
        try:
            args = shlex.split(self.query_one("#launch-args", Input).value)
        except ValueError as e:
            error.update(f"[red]✗ arguments: {escape(str(e))} (allowed: shell-style words)[/red]")
            return
        argv = wizard_launch_argv(sys.executable, result.yaml_path, script, args)
        self.wizard.finish(Outcome(0, written=getattr(self.wizard, "writes", []), launch=argv,
                                   summary=self.wizard.summary_lines(launching=True)))

    def go_next(self) -> None:
        from wizard.frontends.tui.messages import Outcome
        self.wizard.finish(Outcome(0, written=getattr(self.wizard, "writes", []),
                                   summary=self.wizard.summary_lines()))

    def action_back(self) -> None:
        self.wizard.back()
