"""`wizard --plain` (and TERM=dumb): the wizard's questions inline with questionary, one after another.

The same question table, defaults and validation as the TUI and the flags (Question.parse runs on each answer;
a refused one gets its whole message and the question again), the same state and pipeline (wizard.frontends.session.WizardState, which imports
no UI): hardware -> model and training -> the plan (printed by wizard.frontends.report) -> use it, or change
the strategy (defaulting to the plan's choice) or any one answer by name and plan again ->
machines and details -> validation -> "Write these files?" (--yes skips it) -> atomic writes.
Questions marked advanced keep their recommended value (or the flag's) and are not asked, to keep
the sequence short. Every slow step (probe, sizing, validation) prints a line first, and keys typed
during it are dropped rather than taken as answers to questions the user has not seen.

Ctrl+C anywhere: "Cancelled; nothing written.", exit 130 (prompts use unsafe_ask, so Ctrl+C is
never mistaken for an answer). Choosing to quit, or not to write: "Quit; nothing written.", exit 0.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from wizard import pipeline
from wizard.config.questions import Question, for_stage
from wizard.errors import EXIT_INTERRUPTED, EXIT_NOTHING_FITS, InputError

CANCELLED = "Cancelled; nothing written."        # Ctrl+C: exit 130
QUIT = "Quit; nothing written."                 # the user chose not to write (Quit, "Write these files?" no): exit 0


class _Prompter:
    """Asks Questions with questionary; `input`/`output` are prompt_toolkit's (tests pass pipes)."""

    def __init__(self, state, input=None, output=None, out: TextIO | None = None) -> None:
        self.state = state
        self.input = input
        self.output = output
        from wizard.frontends.report import wrapping
        self.out = wrapping(out or sys.stdout)      # on a terminal: wrapped between words, to its width

    def _kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.input is not None:
            kw["input"] = self.input
        if self.output is not None:
            kw["output"] = self.output
        return kw

    def say(self, text: str = "") -> None:
        print(text, file=self.out)
        self.out.flush()


    def drop_typeahead(self) -> None:
        """Keys typed during a slow step would answer questions not yet shown: drop them (a real terminal only)."""
        if self.input is not None or not sys.stdin.isatty():
            return
        import select
        import termios
        try:
            pending = select.select([sys.stdin], [], [], 0)[0]
            if pending:
                termios.tcflush(sys.stdin, termios.TCIFLUSH)
                self.say("  (keys typed meanwhile were dropped: answer each question once it is shown)")
        except (OSError, ValueError, termios.error):
            pass

    def ask(self, q: Question, current: Any, *, extra=None, labels: dict[Any, str] | None = None) -> Any:
        """One question, pre-filled with `current`; returns the parsed value. `labels` name a choice's values."""
        import questionary

        from wizard.frontends.session import format_value

        ctx = self.state.context_for(q.id)
        message = q.prompt
        if q.kind == "bool":
            return bool(questionary.confirm(message, default=bool(current), **self._kw()).unsafe_ask())
        if q.kind == "choice":
            options = q.options(ctx) or ()
            choices = [questionary.Choice((labels or {}).get(o, str(o)), value=o) for o in options]
            default = next((c for c in choices if c.value == current), None)
            value = questionary.select(message, choices=choices, default=default, **self._kw()).unsafe_ask()
            return q.parse(value, ctx)
        # Checked after Enter, not by a validator inside the prompt: prompt_toolkit shows a validator's message on one
        # line, cut at the terminal's width, and anything printed meanwhile (sizing a model) scrolls the prompt away,
        # leaving the rejected text in it, unseen, for the next entry to be appended to. A rejected value gets its
        # whole message, wrapped, and the question again as it was first asked.
        while True:
            raw = questionary.text(message, default=format_value(q, current), **self._kw()).unsafe_ask()
            try:
                value = q.parse(raw, self.state.context_for(q.id))
                if extra is not None:
                    extra(value)
            except InputError as e:
                self.say(f"  ✗ {e}")
                continue
            return value

    def ask_stage(self, stages: tuple[str, ...], skip: tuple[str, ...] = (),
                  defaults: dict[str, Any] | None = None) -> None:
        """Every applicable, not-advanced question of these stages, re-planning after each answer
        so that conditions and defaults follow the earlier answers (as in the table's order).
        `defaults` pre-fill some questions instead of their recommended value (the plan's choice)."""
        defaults = defaults or {}
        for stage in stages:
            for q in for_stage(stage):
                if q.advanced or q.id in skip or not self.state.asked(q.id):
                    continue
                self.ask_one(q, defaults.get(q.id, self.state.value_of(q.id)))

    def ask_one(self, q: Question, current: Any) -> None:
        extra = self._size_check if q.id == "model" else None
        value = self.ask(q, current, extra=extra)
        self.state.set_answer(q.id, value)
        self.replan()

    def _size_check(self, value: Any) -> None:
        """The model question's validation also sizes it: a path without config.json is refused
        at the prompt, with the same message as everywhere else."""
        if value and ("model", value) not in self.state.models:
            self.say(f"Sizing {value} from its config (no weights) ...")
            try:
                self.state.models[("model", value)] = _size(value)
            finally:
                self.drop_typeahead()

    def replan(self) -> None:
        import time
        job = self.state.replan()
        while job is not None:
            what = "LoRA adapters of " if job.trainings else ""
            self.say(f"Sizing {what}{job.model} from its config (no weights) ...")
            started = time.monotonic()
            try:
                shape, error = pipeline.size_for_plan(job.model, job.trainings), None
            except InputError as e:
                shape, error = None, e
            self.say(f"  done in {time.monotonic() - started:.1f} s")
            self.drop_typeahead()
            job = self.state.sized(job.model, shape, error)


def _size(model_arg: str):
    from wizard.sizing import model as model_mod
    return model_mod.size_model(model_arg)


def _choose_target(p: _Prompter) -> None:
    """No GPU here: CPU processes on this machine (default), or a machine from the catalogue: the question table's
    target-machine questions, as the TUI's Hardware screen asks them."""
    from wizard.config.questions import (
        CPUS_QUESTION,
        DISK_QUESTION,
        GPU_QUESTION,
        RAM_QUESTION,
        TARGET_COUNT_QUESTION,
        TARGET_LABELS,
        other_machine_extras,
        target_question,
    )
    from wizard.frontends.session import DEFAULT_OTHER_COUNT, DEFAULT_OTHER_GPU, TARGET_CPU, TARGET_OTHER
    from wizard.probe import hardware
    state = p.state
    labels = {**TARGET_LABELS, TARGET_CPU: "CPU processes on this machine (try the whole pipeline here)"}
    target = p.ask(target_question(has_gpus=False, here="no GPU"), TARGET_CPU, labels=labels)
    state.set_target(target)
    if target == TARGET_OTHER:
        count = p.ask(TARGET_COUNT_QUESTION, DEFAULT_OTHER_COUNT)
        gpu = p.ask(GPU_QUESTION, DEFAULT_OTHER_GPU)
        catalogue_hw = hardware.assume(f"{count}x{gpu}")
        ram = p.ask(RAM_QUESTION, catalogue_hw.ram_total)
        cpus = p.ask(CPUS_QUESTION, catalogue_hw.cpu_cores)
        disk = p.ask(DISK_QUESTION, None)
        state.set_other_machine(count, gpu, **other_machine_extras(catalogue_hw, ram, cpus, disk))
    p.replan()


def _change_lines(result: pipeline.Result) -> list[str]:
    from wizard.frontends.session import planned_changes
    return [f"  {c.path}: {c.what}" for c in planned_changes(result)]


def _strategy_of(choice) -> dict[str, Any]:
    """The strategy answers that lead to the plan's choice: what the strategy questions start from."""
    if choice is None:
        return {}
    from wizard.frontends.session import strategy_for_rung
    return {k: v for k, v in strategy_for_rung(choice.key).items() if v is not None}


def _change_one_answer(p: _Prompter, allow_quit: bool = False) -> bool:
    """Pick one question by name (model, training or strategy), answer it, plan again. False: quit."""
    import questionary
    state = p.state
    asked = [q for stage in ("model", "training", "strategy") for q in for_stage(stage)
             if not q.advanced and state.asked(q.id)]
    if not asked:                                  # no plan to ask from (a bad model): the model question
        asked = [q for q in for_stage("model") if not q.advanced]
    from wizard.frontends.session import format_value
    choices = [questionary.Choice(f"{q.prompt} ({format_value(q, state.value_of(q.id)) or 'unset'})", value=q.id)
               for q in asked]
    if allow_quit:
        choices.append(questionary.Choice("Quit", value=None))
    qid = questionary.select("Which answer?", choices=choices, default=choices[0], **p._kw()).unsafe_ask()
    if qid is None:
        return False
    q = next(q for q in asked if q.id == qid)
    p.ask_one(q, state.value_of(q.id))
    return True


def _measure(p: _Prompter) -> None:
    """`wizard tune` from the plan: bounded trials with the user's script; the measured winner becomes the
    plan's choice (picked like a rung on the Plan screen), written by the usual "Write these files?"."""
    import shlex

    import questionary

    from wizard import tune
    from wizard.errors import InputError
    from wizard.frontends import report
    state = p.state
    if state.hardware is None or state.hardware.source != "probe":
        p.say("Measuring runs trials on this machine: plan for this machine to use it.")
        return
    raw = questionary.text("Training script and its arguments (e.g. train.py --epochs 1)", **p._kw()).unsafe_ask()
    try:
        command = shlex.split(raw or "")
    except ValueError as e:
        p.say(f"wizard: {e}")
        return
    if not command:
        return
    request = state.measure_request()
    try:
        result = tune.tune(request, tune.TuneOptions(script=command[0], script_args=command[1:]),
                           progress=report.tune_progress_printer(p.out), write=False)
    except InputError as e:
        p.say(f"wizard: {e}")
        return
    report.print_tune(result, file=p.out, written_note="The winner is now the plan's choice: use it to write it.")
    if result.winner is not None:
        state.use_measured(result.winner.candidate)


def next_actions(state) -> list[tuple[str, str]]:
    """(value, label) of the "Next" menu after the plan. Measure only where it can run: for a plan of this machine
    (session.measure_unavailable, the TUI's own test), never offered and then refused."""
    from wizard.frontends.session import measure_unavailable
    choice = state.plan.choice if state.plan is not None else None
    actions = [("use", f"Use {choice.name}")] if choice is not None else []
    actions += [("strategy", "Change the strategy (backend, ZeRO stage, offload, ...)"),
                ("one", "Change one answer and plan again")]
    if choice is not None and not measure_unavailable(state):
        actions.append(("measure", "Measure the best candidates with your training script (wizard tune)"))
    return actions + [("quit", "Quit without writing")]


def run_plain(request: pipeline.Request, *, input=None, output=None, out: TextIO | None = None,
              yes: bool = False) -> int:
    """Ask, plan, ask the details, validate, confirm (unless `yes`), write. Returns the exit code (130 on Ctrl+C;
    0 when the user quits or declines the writing, as the TUI's Quit key; 3 quitting where nothing fits)."""
    from wizard.fsutil import written_files
    already = len(written_files())
    try:
        return _run(request, input, output, out, yes)
    except KeyboardInterrupt:
        # A signal just after the set was written (InterruptedAfterWrite, or later) must not say "nothing written".
        written = len(written_files()) > already
        print("Interrupted; the files were written." if written else CANCELLED, file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(request: pipeline.Request, input, output, out: TextIO | None, yes: bool) -> int:
    import questionary

    from wizard.frontends import report
    from wizard.frontends.session import WizardState
    from wizard.frontends.snippets import launch_commands, setup_snippet, uses_adapters
    from wizard.probe import hardware

    state = WizardState(request)
    p = _Prompter(state, input, output, out)
    p.say("Probing the hardware ...")
    state.set_probed(state.load_hardware())
    p.drop_typeahead()
    for line in hardware.describe(state.probed):
        p.say(f"  {line}")
    for line in hardware.warnings(state.probed):
        if state.probed.gpus:
            p.say(f"  warning: {line}")
    if not state.probed.gpus:
        _choose_target(p)
    else:
        p.replan()

    p.ask_stage(("model", "training"))
    while True:
        if state.error and not state.plan:
            p.say(f"wizard: {state.error}")
            if not _change_one_answer(p, allow_quit=True):
                return 2
            continue
        result = pipeline.Result(hardware=state.hardware, model=state.model, plan=state.plan,
                                 answers=dict(state.answers), output_dir=state.output_dir, yaml_path="", ds_path="")
        p.say()
        report.print_plan(result, file=p.out)
        p.say()
        choice = state.plan.choice
        if choice is None:
            p.say(f"wizard: {state.error}")
        options = [questionary.Choice(label, value=value) for value, label in next_actions(state)]
        action = questionary.select("Next", choices=options, default=options[0], **p._kw()).unsafe_ask()
        if action == "use":
            break
        if action == "quit":
            p.say(QUIT)
            return EXIT_NOTHING_FITS if choice is None else 0
        if action == "measure":
            _measure(p)
        elif action == "strategy":
            p.ask_stage(("strategy",), defaults=_strategy_of(choice))
        else:
            _change_one_answer(p)

    p.ask_stage(("machines", "details"))
    if not state.ready:
        p.say(f"wizard: {state.error}")
        return 2
    result = state.result()
    p.say("Validating with accelerate, DeepSpeed and transformers ...")
    pipeline.validate(result)
    p.drop_typeahead()
    if result.errors:
        report.print_findings(result.findings, file=sys.stderr)
        print("wizard: the generated configuration failed validation; nothing was written", file=sys.stderr)
        return 1
    if not request.dry_run:
        for line in _change_lines(result):
            p.say(line)
        if not yes and not questionary.confirm("Write these files?", default=True, **p._kw()).unsafe_ask():
            p.say(QUIT)
            return 0
        state.write(result)
    report.print_written(result, dry_run=request.dry_run, file=p.out)
    if not request.dry_run:
        accel, wiz = launch_commands(result.yaml_path)
        p.say(f"Or: {accel}")
        p.say("The same setup in Python (HF Trainer with peft):" if uses_adapters(result.answers)
              else "The same setup as TrainingArguments (HF Trainer):")
        ds = result.ds_path if result.ds_text is not None else None
        for line in setup_snippet(result.answers, result.plan, result.model, ds).splitlines():
            p.say(f"  {line}")
    return 0
