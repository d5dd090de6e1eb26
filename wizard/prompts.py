"""`wizard --plain` (and TERM=dumb): the wizard's questions inline with questionary, one after another.

The same question table, defaults and validation as the TUI and the flags (Question.parse runs as
questionary's validator), the same state and pipeline (wizard.tui.state.WizardState, which imports
no UI): hardware -> model and training -> strategy -> the plan (printed by wizard.report) ->
machines and details -> validation -> atomic writes. Questions marked advanced keep their
recommended value (or the flag's) and are not asked, to keep the sequence short.

Ctrl+C anywhere: "Cancelled; nothing written.", exit 130 (prompts use unsafe_ask, so Ctrl+C is
never mistaken for an answer).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from wizard import pipeline
from wizard.errors import EXIT_INTERRUPTED, EXIT_NOTHING_FITS, InputError
from wizard.questions import Question, for_stage

CANCELLED = "Cancelled; nothing written."


class _Prompter:
    """Asks Questions with questionary; `input`/`output` are prompt_toolkit's (tests pass pipes)."""

    def __init__(self, state, input=None, output=None, out: TextIO | None = None) -> None:
        self.state = state
        self.input = input
        self.output = output
        self.out = out or sys.stdout

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

    def validator(self, q: Question, extra=None):
        def validate(raw: str) -> bool | str:
            try:
                value = q.parse(raw, self.state.context_for(q.id))
                if extra is not None:
                    extra(value)
            except InputError as e:
                return str(e)
            return True
        return validate

    def ask(self, q: Question, current: Any, *, extra=None) -> Any:
        """One question, pre-filled with `current`; returns the parsed value."""
        import questionary
        from wizard.tui.state import format_value

        ctx = self.state.context_for(q.id)
        message = q.prompt
        if q.kind == "bool":
            return bool(questionary.confirm(message, default=bool(current), **self._kw()).unsafe_ask())
        if q.kind == "choice":
            options = q.options(ctx) or ()
            choices = [questionary.Choice(str(o), value=o) for o in options]
            default = next((c for c in choices if c.value == current), None)
            value = questionary.select(message, choices=choices, default=default, **self._kw()).unsafe_ask()
            return q.parse(value, ctx)
        raw = questionary.text(message, default=format_value(q, current), validate=self.validator(q, extra),
                               validate_while_typing=False, **self._kw()).unsafe_ask()
        return q.parse(raw, self.state.context_for(q.id))

    def ask_stage(self, stages: tuple[str, ...], skip: tuple[str, ...] = ()) -> None:
        """Every applicable, not-advanced question of these stages, re-planning after each answer
        so that conditions and defaults follow the earlier answers (as in the table's order)."""
        for stage in stages:
            for q in for_stage(stage):
                if q.advanced or q.id in skip or not self.state.asked(q.id):
                    continue
                extra = self._size_check if q.id == "model" else None
                value = self.ask(q, self.state.value_of(q.id), extra=extra)
                self.state.set_answer(q.id, value)
                self.replan()

    def _size_check(self, value: Any) -> None:
        """The model question's validation also sizes it: a path without config.json is refused
        at the prompt, with the same message as everywhere else."""
        if value:
            self.state.models.setdefault(("model", value), _size(value))

    def replan(self) -> None:
        job = self.state.replan()
        while job is not None:
            try:
                shape, error = pipeline.size_for_plan(job.model, job.trainings), None
            except InputError as e:
                shape, error = None, e
            job = self.state.sized(job.model, shape, error)


def _size(model_arg: str):
    from wizard import model as model_mod
    return model_mod.size_model(model_arg)


def _choose_target(p: _Prompter) -> None:
    """No GPU here: CPU processes on this machine (default), or a machine from the catalogue."""
    import questionary
    from wizard import catalogue, hardware
    from wizard.tui.state import DEFAULT_OTHER_COUNT, DEFAULT_OTHER_GPU, TARGET_CPU, TARGET_OTHER
    state = p.state
    choices = [questionary.Choice("CPU processes on this machine (try the whole pipeline here)", value=TARGET_CPU),
               questionary.Choice("another machine with GPUs from the catalogue (like --assume)",
                                  value=TARGET_OTHER)]
    target = questionary.select("No GPU here. Plan for", choices=choices, default=choices[0], **p._kw()).unsafe_ask()
    state.set_target(target)
    if target == TARGET_OTHER:
        def check_count(raw: str) -> bool | str:
            try:
                hardware.assume(f"{int(raw)}x{DEFAULT_OTHER_GPU}")
            except (ValueError, InputError) as e:
                return str(e) if isinstance(e, InputError) else f"GPUs: {raw!r} is not a whole number"
            return True
        count = int(questionary.text("GPUs in that machine", default=str(DEFAULT_OTHER_COUNT), validate=check_count,
                                     **p._kw()).unsafe_ask())
        gpu_choices = [questionary.Choice(name, value=name) for name in catalogue.names()]
        default = next(c for c in gpu_choices if c.value == DEFAULT_OTHER_GPU)
        gpu = questionary.select("GPU model", choices=gpu_choices, default=default, **p._kw()).unsafe_ask()
        state.set_other_machine(count, gpu)
    p.replan()


def run_plain(request: pipeline.Request, *, input=None, output=None, out: TextIO | None = None) -> int:
    """Ask, plan, ask the details, validate, write. Returns the exit code (130 on Ctrl+C)."""
    try:
        return _run(request, input, output, out)
    except KeyboardInterrupt:
        print(CANCELLED, file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(request: pipeline.Request, input, output, out: TextIO | None) -> int:
    import questionary
    from wizard import hardware, report
    from wizard.tui.snippets import launch_commands, setup_snippet, uses_adapters
    from wizard.tui.state import WizardState

    state = WizardState(request)
    p = _Prompter(state, input, output, out)
    p.say("Probing the hardware ...")
    state.set_probed(state.load_hardware())
    for line in hardware.describe(state.probed):
        p.say(f"  {line}")
    for line in hardware.warnings(state.probed):
        if state.probed.gpus:
            p.say(f"  warning: {line}")
    if not state.probed.gpus:
        _choose_target(p)
    else:
        p.replan()

    stages = ("model", "training", "strategy")
    while True:
        p.ask_stage(stages)
        if state.error and not state.plan:
            p.say(f"wizard: {state.error}")
            if not questionary.confirm("Change the answers?", default=True, **p._kw()).unsafe_ask():
                return 2
            continue
        result = pipeline.Result(hardware=state.hardware, model=state.model, plan=state.plan,
                                 answers=dict(state.answers), output_dir=state.output_dir, yaml_path="", ds_path="")
        p.say()
        report.print_plan(result, file=p.out)
        p.say()
        if state.plan.choice is None:
            p.say(f"wizard: {state.error}")
            if not questionary.confirm("Change the answers and plan again?", default=True, **p._kw()).unsafe_ask():
                return EXIT_NOTHING_FITS
            continue
        if questionary.confirm(f"Use {state.plan.choice.name}?", default=True, **p._kw()).unsafe_ask():
            break
        stages = ("strategy",)

    p.ask_stage(("machines", "details"))
    if not state.ready:
        p.say(f"wizard: {state.error}")
        return 2
    result = state.result()
    p.say("Validating with accelerate, DeepSpeed and transformers ...")
    pipeline.validate(result)
    if result.errors:
        report.print_findings(result.findings, file=sys.stderr)
        print("wizard: the generated configuration failed validation; nothing was written", file=sys.stderr)
        return 1
    if not request.dry_run:
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
