"""What the wizard knows between screens: the hardware planned for, what the user typed, the model, the plan.

No Textual here: the screens are views of one WizardState, and every decision goes through
wizard.pipeline (resolve -> size -> make_plan -> resolve_details -> render), exactly as the
non-interactive CLI takes it. The state only keeps track of *what the user entered* (`entered`);
every other value shown on a screen is the pipeline's default for the current inputs, so a
default that depends on an earlier answer (processes on the GPU count, mixed precision on the
plan) follows that answer until the user types over it.

Cheap to import: no torch, no UI. Sizing a model from a config (which imports transformers) is
the one slow step, so `replan` reports it instead of doing it; the app runs it in a thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from wizard import pipeline
from wizard.config.questions import (  # noqa: F401 - the target names are the session's vocabulary too
    DEFAULT_OTHER_COUNT,
    DEFAULT_OTHER_GPU,
    QUESTIONS,
    TARGET_CPU,
    TARGET_HERE,
    TARGET_OTHER,
    Context,
    Question,
    by_id,
)
from wizard.errors import InputError
from wizard.planning.plan import Plan
from wizard.planning.rungs import BY_KEY
from wizard.probe.hardware import Hardware
from wizard.sizing.model import ModelShape

# Where the files go when there is no GPU here: CPU processes on this machine (see `default_target`).
DEFAULT_CPU_PROCESSES = 2
# Parameter counts pre-filled when no model is given: a size people fine-tune on GPUs, and one
# that trains on CPU processes in a few GiB of RAM.
RECOMMENDED_PARAMS_GPU = "7B"
RECOMMENDED_PARAMS_CPU = "125M"
STRATEGY_IDS = ("backend", "zero_stage", "offload")
_ORDER = {q.id: i for i, q in enumerate(QUESTIONS)}


@dataclass(frozen=True)
class SizingJob:
    """A model that must be sized from its config before the plan can be made (slow: a thread), and the
    LoRA / QLoRA adapters (peft on the meta device) the plan or its alternatives need."""
    model: str
    trainings: tuple = ()


def model_key(answers: dict[str, Any]) -> tuple:
    if answers.get("model"):
        return ("model", answers["model"])
    return ("params", answers.get("params"), answers.get("hidden_size"), answers.get("layers"),
            answers.get("heads"), answers.get("vocab_size"))


def strategy_for_rung(key: str) -> dict[str, Any]:
    """Strategy answers whose ladder starts at (or contains) this rung; None removes an answer."""
    return BY_KEY[key].flags()


def format_value(q: Question, value: Any) -> str:
    """How a normalised answer is shown in a text field (the inverse of Question.parse)."""
    if value is None:
        return ""
    if q.kind == "bool":
        return "yes" if value else "no"
    if q.kind == "count":
        from wizard.units import fmt_count, parse_count
        text = fmt_count(value)
        try:
            return text if parse_count(text, q.id) == value else str(value)
        except InputError:
            return str(value)
    if q.kind == "size":
        from wizard.units import GiB, MiB
        if value % GiB == 0:
            return f"{value // GiB}GiB"
        if value % MiB == 0:
            return f"{value // MiB}MiB"
        return str(value)
    if q.kind == "float":
        return f"{value:g}"
    return str(value)


class WizardState:
    """One wizard session: inputs in, plan and files out, through the shared pipeline."""

    def __init__(self, request: pipeline.Request, hardware: Hardware | None = None):
        self.request = request
        self.output_dir = os.path.abspath(os.path.expanduser(request.output_dir or pipeline.default_output_dir()))
        self.probed: Hardware | None = None       # what --hardware/--assume/the probe gave
        self.hardware: Hardware | None = None     # what the plan is for (probed, or a catalogue machine)
        self.target = TARGET_HERE
        self.other_gpu = DEFAULT_OTHER_GPU
        self.other_count = DEFAULT_OTHER_COUNT
        self.other_extras: dict[str, int] = {}    # ram / cpus / disk of the other machine, where typed
        self.entered: dict[str, Any] = {}         # values the user typed or chose, by question id
        self.changed = False                      # anything entered (quitting asks first)
        self.picked: str | None = None            # a rung the user picked on the plan screen
        self.ladder_choice: str | None = None     # the rung the ladder itself chose (before any pick)
        self.pick_base: dict[str, Any] | None = None  # the strategy answers before the pick
        self.models: dict[tuple, ModelShape] = {}  # sized models, by model_key
        self.model: ModelShape | None = None
        self.answers: dict[str, Any] = {}         # pre-plan answers (model, training, strategy, machines)
        self.full_answers: dict[str, Any] = {}    # + details, once there is a plan with a choice
        self.plan: Plan | None = None
        self.error: str | None = None             # why there is no plan (bad input, model not found)
        self.error_field: str | None = None       # the question id the error is about, when known
        self.sizing: SizingJob | None = None      # a model waiting to be sized
        self.written = False
        self.script: list[str] | None = None       # the training script and its arguments measured (Measure)
        if hardware is not None:
            self.set_probed(hardware)

    # ------------------------------------------------------------------ hardware and target

    def load_hardware(self) -> Hardware:
        """--hardware FILE, --assume SPEC or the probe (call from a thread: the probe may take a while)."""
        return pipeline.load_hardware(self.request.hardware_file, self.request.assume, self.output_dir,
                                      self.request.given.get("nvme_path"))

    def set_probed(self, hw: Hardware) -> None:
        self.probed = hw
        self.set_target(self.default_target(), initial=True)

    def default_target(self) -> str:
        """With GPUs: plan for them. Without: CPU processes on this machine.

        The files land in this machine's accelerate config dir, where `accelerate launch` reads
        them: a configuration for GPUs this machine lacks would make every launch here fail, while
        2 CPU processes run here (DDP / DeepSpeed over gloo), exercise the distributed path, pass
        validation and can be launched from the Done screen. Planning for the GPU machine is one
        choice away on the Hardware screen.
        """
        return TARGET_HERE if self.probed is not None and self.probed.gpus else TARGET_CPU

    def set_target(self, target: str, *, initial: bool = False) -> None:
        from wizard.probe import hardware as hardware_mod
        if target not in (TARGET_HERE, TARGET_CPU, TARGET_OTHER):
            raise ValueError(target)
        self.target = target
        if target == TARGET_OTHER:
            self.hardware = hardware_mod.assume(self.other_spec())
            self.entered.pop("use_cpu", None)
            self.entered.pop("num_processes", None)
            self.entered.pop("gpu_ids", None)
        else:
            self.hardware = self.probed
            if target == TARGET_CPU:
                self.entered["use_cpu"] = True
                if self.request.given.get("num_processes") is None:
                    self.entered.setdefault("num_processes", DEFAULT_CPU_PROCESSES)
            else:
                self.entered.pop("use_cpu", None)
                if not initial:
                    self.entered.pop("num_processes", None)
        if not initial:
            self.changed = True

    def other_spec(self, extras: dict[str, int] | None = None) -> str:
        """The --assume spec of the other machine: COUNTxGPU, then ram=/cpus=/disk= where typed."""
        extras = self.other_extras if extras is None else extras
        tail = "".join(f",{key}={_spec_value(key, value)}" for key, value in extras.items() if value is not None)
        return f"{self.other_count}x{self.other_gpu}{tail}"

    def set_other_machine(self, count: int, gpu: str, **extras: int | None) -> None:
        """Plan for COUNT x GPU from the catalogue (same as --assume), with its RAM, CPUs and free disk
        (bytes, count, bytes; None: the catalogue's default); InputError for a bad pair."""
        from wizard.probe import hardware as hardware_mod
        merged = {**self.other_extras, **extras}
        merged = {k: v for k, v in merged.items() if v is not None}
        hw = hardware_mod.assume(f"{count}x{gpu}" + "".join(f",{k}={_spec_value(k, v)}" for k, v in merged.items()))
        self.other_count, self.other_gpu, self.other_extras = count, gpu, merged
        if self.target == TARGET_OTHER:
            self.hardware = hw
        self.changed = True

    # ------------------------------------------------------------------ answers

    def given(self, entered: dict[str, Any] | None = None) -> dict[str, Any]:
        """What resolve() sees: flags and answers file, then what was typed here (or `entered`); None means
        unset."""
        entered = self.entered if entered is None else entered
        merged = {**self.request.given, **entered}
        # Typing a model here replaces a parameter count from the flags (and the other way round).
        if entered.get("model") is not None:
            merged.pop("params", None)
        elif entered.get("params") is not None:
            merged.pop("model", None)
        merged = {k: v for k, v in merged.items() if v is not None}
        if entered.get("method") == "full":
            # Choosing full fine-tuning here drops the LoRA options given before (the pipeline refuses them
            # with full, as it should for flags: here the user has just said which method they want).
            from wizard.pipeline import ADAPTER_OPTIONS
            for key in ADAPTER_OPTIONS:
                merged.pop(key, None)
        if merged.get("model") is None and merged.get("params") is None:
            merged["params"] = self.recommended_params(merged)
        return merged

    def recommended_params(self, given: dict[str, Any] | None = None) -> str:
        given = self.given() if given is None else given
        cpu = bool(given.get("use_cpu")) or (self.hardware is not None and not self.hardware.gpus)
        return RECOMMENDED_PARAMS_CPU if cpu else RECOMMENDED_PARAMS_GPU

    def set_answer(self, qid: str, value: Any) -> None:
        """A value the user entered (already parsed by the question); None clears it to 'unset'."""
        if qid in STRATEGY_IDS:
            self.picked = self.pick_base = None
        elif qid == "method" and value != self.entered.get("method", self.answers.get("method")):
            # Another method walks another ladder: a rung picked on the old one is not the user's strategy
            # for the new one, so the strategy goes back to what it was before the pick (the ladder's).
            self._drop_pick()
        if qid == "model" and value is not None:
            self.entered.pop("params", None)
        self.entered[qid] = value
        self.changed = True

    def context(self, answers: dict[str, Any] | None = None) -> Context:
        if answers is None:
            answers = self.full_answers or self.answers
        return Context(hardware=self.hardware, model=self.model, plan=self.plan, answers=dict(answers),
                       given=self.given())

    def context_for(self, qid: str) -> Context:
        """The context a question's own value is checked in: the answers before it in asking order
        (as answers.resolve gives them). A model typed here is checked without the recommended
        parameter count, which it replaces."""
        order = _ORDER.get(qid, len(_ORDER))
        source = self.full_answers or self.answers
        if self.error:
            # the inputs do not plan: the answers are the last plan's; what was typed since (3 machines) counts
            source = {**source, **self.entered}
        answers = {k: v for k, v in source.items() if _ORDER.get(k, -1) < order}
        given = self.given()
        if qid == "model":
            given.pop("params", None)
        return Context(hardware=self.hardware, model=self.model, plan=self.plan, answers=answers, given=given)

    def value_of(self, qid: str) -> Any:
        """The current answer shown for a question (entered, else the default), or None when not asked. While the
        inputs do not plan (self.error), what was typed is shown, not the answer of the last plan that worked."""
        if self.error and qid in self.entered:
            return self.entered[qid]
        source = self.full_answers if self.full_answers else self.answers
        return source.get(qid)

    def asked(self, qid: str) -> bool:
        source = self.full_answers if by_id(qid).stage == "details" else (self.full_answers or self.answers)
        return qid in source

    # ------------------------------------------------------------------ planning

    def replan(self) -> SizingJob | None:
        """Resolve the answers, size (when cheap) and plan. Returns a job when a config must be sized.

        Fast (well under 50 ms): everything here is pure arithmetic over the question table.
        """
        self.error = self.error_field = None
        self.full_answers = {}
        self.ladder_choice = None
        if self.hardware is None:
            self.plan = None
            self.error = "the hardware is not known yet"
            return None
        given = self.given()
        try:
            # With the PLAN_DETAILS (fsdp_version): a change on the Details screen re-plans. Planning needs no
            # main_process_ip (FILES_ONLY): two machines are planned at once, and the Details screen, which shows
            # the address field then, asks for it before the files (files_problem).
            answers = pipeline.resolve_pre_plan(self.hardware, given, plan_only=True)
        except InputError as e:
            self._fail(e)
            return None
        self.answers = answers
        key = model_key(answers)
        model = self.models.get(key)
        if model is None:
            if key[0] == "model":
                self.model = None
                self.plan = None
                self.sizing = SizingJob(answers["model"])
                return self.sizing
            try:
                model = pipeline.size(answers)
            except InputError as e:
                self._fail(e)
                return None
            self.models[key] = model
        self.sizing = None
        self.model = model
        ladder = self._ladder_answers(answers)
        missing = pipeline.adapter_trainings_to_size(model, ladder, None) if model.exact else []
        if missing:
            # --method lora/qlora on a config: peft must size the adapters first (a thread, like the model).
            self.plan = None
            self.sizing = SizingJob(answers["model"], tuple(missing))
            return self.sizing
        try:
            plan = pipeline.plan_from_answers(self.hardware, model, ladder, calibrate=self.request.calibrate)
        except InputError as e:
            self._fail(e)
            return None
        if self.picked is not None and all(r.key != self.picked for r in plan.rungs):
            # The inputs changed so much that the picked rung left the ladder (DDP -> single GPU):
            # forget the pick and give the strategy answers back.
            self._drop_pick()
            return self.replan()
        self.ladder_choice = plan.choice.key if plan.choice is not None else None
        self.plan = self._apply_pick(plan)
        self.plan.alternatives = pipeline.alternatives(self.hardware, model, ladder, self.plan, cached_only=True)
        warm = pipeline.adapter_trainings_to_size(model, ladder, self.plan) if model.exact else []
        job = SizingJob(answers["model"], tuple(warm)) if warm else None   # in the background: the plan stands
        if self.plan.choice is None:
            self.error = self.nothing_fits()
            return job
        try:
            self.full_answers = pipeline.resolve_details(self.hardware, model, self.plan,
                                                         pipeline.apply_split(answers, self.plan), given)
        except InputError as e:
            self._fail(e)
        return job

    def sized(self, model_arg: str, shape: ModelShape | None, error: InputError | None) -> SizingJob | None:
        """The thread's result for SizingJob(model_arg); re-plan with it (or show why it failed). Returns the
        next job, if the new plan needs one."""
        key = ("model", model_arg)
        if shape is not None:
            self.models[key] = shape
        if self.sizing is not None and self.sizing.model == model_arg:
            self.sizing = None
            if error is not None:
                self.model = self.plan = None
                self.full_answers = {}
                self._fail(error, field="model")
                return None
        return self.replan()

    def _fail(self, e: InputError, field: str | None = None) -> None:
        self.plan = None
        self.full_answers = {}
        self.error = str(e)
        self.error_field = field or question_for_field(e.field)

    def _ladder_answers(self, answers: dict[str, Any]) -> dict[str, Any]:
        """The answers the ladder is walked with: after a pick, the strategy from before it, so
        the screen keeps showing every rung (the pick's own strategy would leave only its rung).

        That strategy is resolved as the plan before the pick resolved it, not copied from what was typed:
        on CPU processes `backend: auto` becomes deepspeed (pipeline.route_cpu_processes), and a ladder
        walked with the raw `auto` held a DDP rung that those processes cannot run (issue 29)."""
        if self.picked is None or self.pick_base is None:
            return answers
        before_pick = dict(self.entered)
        for qid, value in self.pick_base.items():
            if value is None:
                before_pick.pop(qid, None)
            else:
                before_pick[qid] = value
        try:
            base = pipeline.resolve_pre_plan(self.hardware, self.given(before_pick))
        except InputError:
            return answers          # the strategy before the pick no longer resolves: the pick's own ladder
        ladder = dict(answers)
        for qid in STRATEGY_IDS:
            if base.get(qid) is None:
                ladder.pop(qid, None)
            else:
                ladder[qid] = base[qid]
        return ladder

    def _drop_pick(self) -> None:
        for qid, value in (self.pick_base or {}).items():
            if value is None:
                self.entered.pop(qid, None)
            else:
                self.entered[qid] = value
        self.picked = self.pick_base = None

    def _apply_pick(self, plan: Plan) -> Plan:
        if self.picked is None:
            return plan
        rung = next((r for r in plan.rungs if r.key == self.picked), None)
        if rung is None or rung is plan.choice:
            return plan
        return replace(plan, choice=rung)

    def pick_rung(self, key: str) -> None:
        """Use this rung: set the strategy answers that lead to it, and keep it even where the
        ladder would stop earlier (or where it does not fit: the screens say so)."""
        if self.pick_base is None:
            self.pick_base = {qid: self.entered.get(qid) for qid in STRATEGY_IDS}
        for qid, value in strategy_for_rung(key).items():
            if value is None:
                self.entered.pop(qid, None)
            else:
                self.entered[qid] = value
        self.picked = key
        self.changed = True
        self.replan()

    def measure_request(self):
        """The request the TUI's and --plain's Measure give wizard.tune: the answers so far, and the session's
        --dry-run (under it the trials record no calibration either, as `wizard tune --dry-run`)."""
        from wizard import pipeline
        return pipeline.Request(given=self.given(), output_dir=self.output_dir, calibrate=self.request.calibrate,
                                dry_run=self.request.dry_run)

    def use_measured(self, candidate) -> None:
        """`wizard tune`'s winner (a wizard.tune.Candidate): its rung, and for a micro-batch variant its
        micro-batch, accumulation and gradient checkpointing, as if typed."""
        if candidate.variant is not None:
            for qid in ("micro_batch", "grad_accum", "gradient_checkpointing"):
                if qid in candidate.overrides:
                    self.entered[qid] = candidate.overrides[qid]
        self.pick_rung(candidate.rung_key)

    @property
    def picked_does_not_fit(self) -> bool:
        return bool(self.plan and self.plan.choice and self.picked == self.plan.choice.key and not self.plan.choice.fits)

    def nothing_fits(self) -> str:
        from wizard.config import answers as answers_mod
        from wizard.planning.plan import explain_nothing_fits
        a = self.answers
        try:
            text = explain_nothing_fits(self.plan, self.hardware, self.model, answers_mod.training_options(a),
                                        answers_mod.strategy_options(a), answers_mod.topology(a, self.hardware))
        except Exception as e:  # the explanation (it re-plans variants) is a courtesy; never let it hide the plan
            text = f"Nothing fits ({e})."
        return text     # the host RAM that would do is in it (plan._host_ram_is_short, verified by re-planning)

    @property
    def ready(self) -> bool:
        """A plan with a choice and every answer valid: the details can be asked."""
        return self.plan is not None and self.plan.choice is not None and bool(self.full_answers)

    def files_problem(self) -> InputError | None:
        """What the files still need that planning did not (main_process_ip for several machines), or None."""
        if not self.ready:
            return None
        return pipeline.missing_for_files(self.hardware, self.full_answers)

    # ------------------------------------------------------------------ files

    def result(self) -> pipeline.Result:
        """The documents for the current answers (nothing written, nothing validated yet)."""
        if not self.ready:
            raise RuntimeError(self.error or "no plan yet")
        missing = self.files_problem()
        if missing is not None:
            raise RuntimeError(str(missing))
        result = pipeline.Result(hardware=self.hardware, model=self.model, plan=self.plan,
                                 answers=dict(self.full_answers), output_dir=self.output_dir,
                                 yaml_path=os.path.join(self.output_dir, "default_config.yaml"),
                                 ds_path=os.path.join(self.output_dir, "ds_config.json"))
        pipeline.render(result)
        return result

    def write(self, result: pipeline.Result) -> list:
        writes = pipeline.write(result, self.given())
        self.written = True
        return writes


def measure_unavailable(state: WizardState) -> str | None:
    """Why Measure cannot run for this plan, in the TUI's words, or None: the TUI offers `m` and --plain its menu entry
    only where it can. Measure runs the user's script in trials on this machine (wizard.tune probes it), so it
    measures only a plan for this machine's own GPUs or CPU processes: not one for an assumed machine (--assume), a
    saved probe (--hardware) or a catalogue machine chosen on the Hardware screen."""
    probed = state.probed
    if probed is None:
        return None
    if state.target == TARGET_OTHER:
        what = "another machine from the catalogue"
    elif probed.source.startswith("assume:"):
        what = f"an assumed machine ({probed.source[len('assume:'):]})"
    elif probed.source.startswith("file:"):
        what = "the machine of a saved probe"
    else:
        return None
    return (f"Measure (m) is not offered: it runs your script in trials on this machine, and this plan is for "
            f"{what}. Run the wizard on that machine to measure there")


@dataclass(frozen=True)
class PlannedChange:
    """What Write would do to one file: the Review screen's Changes tab and --plain's summary."""
    path: str
    what: str           # "new file", "unchanged", or "replaces the file there (kept as X.bak)"
    diff: str


def planned_changes(result: pipeline.Result) -> list[PlannedChange]:
    """What Write would do to each file of the pair, the DeepSpeed file first (it is written first)."""
    from wizard import fsutil
    pairs = [(result.yaml_path, result.yaml_text)]
    if result.ds_text is not None:
        pairs.insert(0, (result.ds_path, result.ds_text))
    out = []
    for path, text in pairs:
        planned = fsutil.plan_write(path, text)
        what = ("new file" if planned.created else "unchanged" if not planned.changed else
                f"replaces the file there (kept as {os.path.basename(path)}.bak)")
        out.append(PlannedChange(path, what, planned.diff))
    return out


def _spec_value(key: str, value: int) -> str:
    """ram=512GiB, disk=2TiB, cpus=64: how --assume spells an extra."""
    if key in ("ram", "disk"):
        from wizard.units import GiB
        return f"{value // GiB}GiB" if value % GiB == 0 else str(value)
    return str(value)


def question_for_field(field: str | None) -> str | None:
    """The question id an InputError's field names ('--seq-len', 'seq-len' or 'seq_len')."""
    if not field:
        return None
    name = field.lstrip("-").replace("-", "_")
    try:
        return by_id(name).id
    except KeyError:
        return None

