"""The one pipeline every front end drives: hardware -> answers -> model -> plan -> files -> validation -> write.

The CLI (`--non-interactive`, `plan`), the plain prompts and the TUI all call these functions; none
re-implements a step. Heavy libraries are imported only by `size`/`validate` steps, lazily.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wizard.config import answers as answers_mod
from wizard.errors import InputError
from wizard.paths import PLAN_FILE
from wizard.planning.plan import Plan, plan_checkpoint
from wizard.probe import hardware as hardware_mod
from wizard.probe.hardware import Hardware
from wizard.sizing.adapters import adapters_cached, adapters_for, lora_options_for
from wizard.sizing.model import ModelShape

PRE_PLAN_STAGES = ("model", "training", "strategy", "machines")


def default_output_dir() -> str:
    """accelerate's config dir, where `accelerate launch` looks when given no --config_file."""
    from wizard.paths import accelerate_config_dir
    return accelerate_config_dir()


@dataclass
class Request:
    """Everything a front end collected; `given` maps question ids to raw values (flags > answers file)."""
    given: dict[str, Any] = field(default_factory=dict)
    hardware_file: str | None = None
    assume: str | None = None
    output_dir: str | None = None
    dry_run: bool = False
    plan_only: bool = False                  # `wizard plan`: nothing is rendered, so file-only answers may be missing
    calibrate: bool = True       # apply `wizard tune`'s measurements on this machine (plan --no-calibration: off)
    # `wizard compare`: an assumed machine of the kind `wizard tune` measured (same GPUs, same count) uses those
    # ratios too; `plan --assume` keeps the raw model (a plan for another machine is not this one's measurement).
    calibrate_assumed: bool = False
    # How the YAML names ds_config.json (None: by its absolute path). A config set a task carries to other machines
    # names it relative to the directory the launch runs in, as accelerate resolves it (`wizard compare --write
    # MACHINE -- SCRIPT`: the task's workdir).
    ds_config_ref: str | None = None


@dataclass
class Result:
    hardware: Hardware
    model: ModelShape
    plan: Plan
    answers: dict[str, Any]
    output_dir: str
    yaml_path: str
    ds_path: str | None
    accelerate_doc: dict[str, Any] | None = None
    ds_doc: dict[str, Any] | None = None
    yaml_text: str | None = None
    ds_text: str | None = None
    findings: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)    # what the files alone don't tell the user
    ds_config_ref: str | None = None                  # Request.ds_config_ref

    @property
    def errors(self) -> list:
        return [f for f in self.findings if f.severity == "error"]


def load_hardware(hardware_file: str | None, assume: str | None, output_dir: str | None = None,
                  nvme_path: str | None = None) -> Hardware:
    if hardware_file and assume:
        raise InputError("hardware", "use either --hardware FILE or --assume SPEC, not both")
    if hardware_file:
        return hardware_mod.load_file(hardware_file)
    if assume:
        return hardware_mod.assume(assume)
    return hardware_mod.probe(output_dir=output_dir or default_output_dir(), nvme_path=nvme_path)


def context(hw: Hardware, model: ModelShape | None, plan: Plan | None, answers: dict[str, Any]):
    from wizard.config.questions import Context
    return Context(hardware=hw, model=model, plan=plan, answers=dict(answers))


# Answers only the written files need: planning two machines needs no address (accelerate's YAML does).
FILES_ONLY = ("main_process_ip",)


def resolve_pre_plan(hw: Hardware, given: dict[str, Any], conflicts: list | None = None,
                     plan_only: bool = False, ignored: list[str] | None = None) -> dict[str, Any]:
    """Answers for the questions asked before the plan (model, training, strategy, machines). `plan_only`:
    nothing will be rendered, so FILES_ONLY answers may stay missing. `ignored` receives the given answers
    whose question does not apply (answers.resolve). The PLAN_DETAILS that were given come with them."""
    answers = answers_mod.resolve(PRE_PLAN_STAGES, context(hw, None, None, {}), given, conflicts=conflicts,
                                  waive=FILES_ONLY if plan_only else (), ignored=ignored)
    return with_plan_details(route_cpu_processes(answers, given), given)


def missing_for_files(hw: Hardware, answers: dict[str, Any]) -> InputError | None:
    """The first FILES_ONLY answer the files need that is still missing from answers resolved with `plan_only`
    (two machines and no main_process_ip), as resolve would have refused it; None when the files can be written."""
    from wizard.config.questions import by_id
    ctx = context(hw, None, None, answers)
    for qid in FILES_ONLY:
        q = by_id(qid)
        if answers.get(qid) is None and q.ask_if(ctx):
            reason = q.required(ctx)
            if reason:
                return InputError(q.field, f"a value is required {reason}", q.allowed_text(ctx))
    return None


# Details asked after the plan that its figures depend on: fsdp_version 1 changes FSDP's activation memory
# (plan.TrainingOptions.reentrant_checkpoint_call); a context- or sequence-parallel size given is the ladder's
# (plan.StrategyOptions.cp_size / sp_size: honoured, or refused with the reason). Checked by type here;
# resolve_details checks them in context.
PLAN_DETAILS = ("fsdp_version", "parallelism_config_cp_size", "parallelism_config_sp_size")


def with_plan_details(answers: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The pre-plan answers plus the PLAN_DETAILS that were given (flags, answers file), coerced by their
    questions (the table's types, choices and messages)."""
    from wizard.config.questions import by_id
    extra = {k: by_id(k).coerce(given[k]) for k in PLAN_DETAILS if given.get(k) is not None}
    return {**answers, **extra} if extra else answers


def route_cpu_processes(answers: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Several CPU processes train together only through DeepSpeed's launcher (or mpirun).

    Verified with accelerate 1.15 on a CPU box: a MULTI_CPU config starts ONE process (the simple
    launcher runs mpirun only when asked), and MULTI_GPU/FSDP configs under torchrun start N processes
    that never form a process group (each trains alone). So without mpirun, N CPU processes mean
    DeepSpeed's CPU accelerator over gloo, which really partitions across ranks.
    """
    if not answers.get("use_cpu") or int(answers.get("num_processes") or 1) <= 1:
        return answers
    if _truthy(given.get("use_mpirun")):
        return answers
    backend = answers.get("backend", "auto")
    if backend == "auto":
        return {**answers, "backend": "deepspeed"}
    if backend in ("ddp", "fsdp"):
        raise InputError("backend", f"{backend} cannot run {answers['num_processes']} CPU processes through "
                         "accelerate launch (they would not form a process group)",
                         "deepspeed for CPU processes over gloo")
    return answers


def refuse_mpirun(given: dict[str, Any]) -> None:
    """--use-mpirun is refused wherever it is given (asked or not), never dropped silently."""
    if given.get("use_mpirun") is not None:
        from wizard.config.questions import by_id
        q = by_id("use_mpirun")
        if q.coerce(given["use_mpirun"]):
            q.check(True, None, q.field)


ADAPTER_OPTIONS = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout")


def refuse_adapter_options(given: dict[str, Any], answers: dict[str, Any]) -> None:
    """LoRA options with full fine-tuning are refused, not dropped: the conflict check only sees answers that
    were given, and the method's default (full) is a real answer, not one the plan makes later, so
    `--lora-rank 64` without --method planned full fine-tuning without a word."""
    if answers.get("method", "full") != "full":
        return
    from wizard.config.questions import by_id
    for key in ADAPTER_OPTIONS:
        if given.get(key) is not None:
            q = by_id(key)
            raise InputError(q.field, f"{given[key]!r} is used only with --method lora or qlora, and the method "
                             "is full", f"add --method lora or --method qlora, or drop {q.flag}")


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on") if value is not None else False


def size(answers: dict[str, Any]) -> ModelShape:
    from wizard.sizing import model as model_mod
    if answers.get("model"):
        return model_mod.size_model(answers["model"])
    if answers.get("params"):
        return model_mod.from_params(answers["params"], hidden_size=answers.get("hidden_size"),
                                     layers=answers.get("layers"), heads=answers.get("heads"),
                                     vocab_size=answers.get("vocab_size"))
    raise InputError("model", "no model given", "--model ID_OR_PATH or --params 7B")


def plan_from_answers(hw: Hardware, model: ModelShape, answers: dict[str, Any], calibrate: bool = True,
                      assumed_too: bool = False) -> Plan:
    from wizard.planning import plan as plan_mod
    training = answers_mod.training_options(answers)
    topology = answers_mod.topology(answers, hw)
    measured = None
    # `wizard tune`'s measurements are for this machine only, unless a comparison asks (Request.calibrate_assumed)
    if calibrate and (hw.source == "probe" or assumed_too):
        from wizard.planning import calibration
        measured = calibration.for_machine(hw, topology)
    return plan_mod.make_plan(hw, model, training, answers_mod.strategy_options(answers), topology,
                              adapters=adapters_for(model, training), calibration=measured)


def apply_split(answers: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """The answers with the micro-batch and accumulation the plan runs, where they were left to --global-batch:
    from here on (files, TrainingArguments, --json's answers) the split is the plan's, as if typed."""
    c = plan.choice
    if c is None or not c.micro_batch:
        return answers
    out = dict(answers)
    for qid, value in (("micro_batch", c.micro_batch), ("grad_accum", c.grad_accum)):
        if out.get(qid) is None:
            out[qid] = value
    return out


ALTERNATIVE_METHODS = ("lora", "qlora")


def alternative_methods(plan: Plan, answers: dict[str, Any]) -> tuple[str, ...]:
    """Full fine-tuning that needs offload or does not fit: the plan names LoRA and QLoRA. QLoRA that does not
    fit (on a sharding rung every rank first loads the whole 4-bit model): LoRA, whose 16-bit base is sharded
    while it loads."""
    method = answers.get("method", "full")
    if answers.get("use_cpu"):
        return ()
    if method == "full":
        return ALTERNATIVE_METHODS if plan.choice is None or plan.choice.offloads else ()
    if method == "qlora" and plan.choice is None:
        return ("lora",)
    return ()


def wants_alternatives(plan: Plan, answers: dict[str, Any]) -> bool:
    return bool(alternative_methods(plan, answers))


def alternative_answers(answers: dict[str, Any], method: str, global_batch: int | None = None) -> dict[str, Any]:
    """The same answers with --method `method` and the strategy left to the ladder; the adapter options at
    their defaults when the user's method has none (full), else the user's; with `global_batch`, the
    micro-batch and accumulation are left to its fastest split of that batch."""
    out = {**answers, "method": method, "backend": "auto", "zero_stage": "auto", "offload": "auto"}
    if answers.get("method", "full") == "full":
        out.update(lora_rank=16, lora_alpha=None, lora_targets=None, lora_dropout=0.05)
    if global_batch is not None:
        out.update(global_batch=global_batch, micro_batch=None, grad_accum=None)
    return out


def alternatives(hw: Hardware, model: ModelShape, answers: dict[str, Any], plan: Plan,
                 cached_only: bool = False) -> list:
    """What the methods of `alternative_methods` would need and how fast (LoRA and QLoRA at r=16 and the
    default targets instead of full fine-tuning; LoRA with the user's options instead of QLoRA); [] otherwise.
    `cached_only`: skip a method whose adapters are not sized yet (the TUI sizes them in a thread first)."""
    from wizard.planning import plan as plan_mod
    if not wants_alternatives(plan, answers):
        return []
    out = []
    best = plan.batch                     # the full fine-tuning choice at its fastest split of the global batch
    for method in alternative_methods(plan, answers):
        alt = alternative_answers(answers, method, best.global_batch if best is not None else None)
        training = answers_mod.training_options(alt)
        if cached_only and not adapters_cached(model, training):
            continue
        try:
            alt_plan = plan_from_answers(hw, model, alt, calibrate=plan.calibration is not None,
                                         assumed_too=plan.calibration is not None)
            adapters = adapters_for(model, training)
        except InputError:
            continue
        c = alt_plan.choice
        out.append(plan_mod.Alternative(
            method, training.lora_rank, adapters.trainable_params, c, plan.choice,
            speed=c.speed if c is not None else None, reference_speed=best.speed if best is not None else None,
            split=(c.micro_batch, c.grad_accum) if c is not None and best is not None else None,
            reference_split=(best.micro_batch, best.grad_accum) if best is not None else None))
    return out


def size_for_plan(model_arg: str, trainings=()) -> ModelShape:
    """What a front end's sizing thread does: size the model from its config and the adapters the plan will
    need for each of `trainings` (so plan_from_answers, on the UI thread, finds them remembered)."""
    from wizard.sizing import model as model_mod
    shape = model_mod.size_model(model_arg)
    for training in trainings:
        try:
            adapters_for(shape, training)
        except InputError:
            pass                           # remembered; plan_from_answers reports it where it matters
    return shape


def adapter_trainings_to_size(model: ModelShape, answers: dict[str, Any], plan: Plan | None) -> list:
    """TrainingOptions whose adapters plan_from_answers (and the alternatives) need but are not sized yet."""
    wanted = [answers_mod.training_options(answers)]
    if plan is not None and wants_alternatives(plan, answers):
        g = plan.batch.global_batch if plan.batch is not None else None
        wanted += [answers_mod.training_options(alternative_answers(answers, m, g))
                   for m in alternative_methods(plan, answers)]
    return [t for t in wanted if not adapters_cached(model, t)]


def resolve_details(hw: Hardware, model: ModelShape, plan: Plan, answers: dict[str, Any],
                    given: dict[str, Any], conflicts: list | None = None,
                    ignored: list[str] | None = None) -> dict[str, Any]:
    ctx = context(hw, model, plan, answers)
    details = answers_mod.resolve(("details",), ctx, given, conflicts=conflicts, ignored=ignored)
    resolved = {**answers, **details}
    from wizard.config.detail_questions import check_details
    check_details(resolved, replace(ctx, answers=resolved, given=dict(given)))
    return resolved


def ignored_note(ignored: list[str]) -> str | None:
    """One line naming the given flags whose questions do not apply to this plan (one machine, the backend
    the plan chose, ...): they change nothing, and a user who set one should know."""
    from wizard.config.questions import by_id
    flags = sorted({by_id(q).flag or q for q in ignored})
    if not flags:
        return None
    return (f"Given but not used by this plan: {', '.join(flags)} (the question does not apply here, e.g. a "
            "multi-machine setting on one machine or a setting of a backend the plan did not choose).")


def render(result: Result) -> None:
    """Fill the documents and their text from the answers and the plan (nothing written)."""
    from wizard.config import emit
    result.ds_doc = emit.deepspeed_config(result.answers, result.plan, result.model)
    ds_path = result.ds_path if result.ds_doc is not None else None
    result.accelerate_doc = emit.accelerate_config(result.answers, result.plan, ds_path, result.model)
    if ds_path is not None and result.ds_config_ref:
        result.accelerate_doc["deepspeed_config"]["deepspeed_config_file"] = result.ds_config_ref
    result.yaml_text = emit.render_yaml(result.accelerate_doc)
    result.ds_text = None if result.ds_doc is None else emit.render_json(result.ds_doc)
    result.notes = list(emit.notes(result.answers, result.plan))


def validate(result: Result) -> None:
    """Load the rendered files with accelerate, DeepSpeed and transformers (in a scratch dir)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="wizard-validate-") as tmp:
        ds_tmp = None
        yaml_text = result.yaml_text
        if result.ds_text is not None:
            ds_tmp = os.path.join(tmp, "ds_config.json")
            Path(ds_tmp).write_text(result.ds_text)
            # The YAML names the final path; point the scratch copy at the scratch JSON (re-rendered,
            # not a text replace: yaml escapes a non-ASCII path, so the text need not contain it).
            from wizard.config.emit import yaml_naming
            yaml_text = yaml_naming(yaml_text, ds_tmp)
        yaml_tmp = os.path.join(tmp, "default_config.yaml")
        Path(yaml_tmp).write_text(yaml_text, encoding="utf-8")
        result.findings = check_before_write(result, yaml_tmp, ds_tmp)


# judged on the libraries installed where the wizard runs, which the training machine may not share
TRAINING_MACHINE_ONLY = ("METHOD-BNB-MISSING", "METHOD-BNB-OLD", "ACC-SP-ZERO12-GRADIENTS")


def lora_options_from_answers(answers: dict[str, Any]) -> Any:
    """wizard.sizing.lora.LoraOptions for --method lora/qlora (what `wizard check --method` checks), None for full."""
    training = answers_mod.training_options(answers)
    return None if training.method == "full" else lora_options_for(training)


def check_before_write(result: Result, yaml_tmp: str, ds_tmp: str | None) -> list:
    """`wizard check`'s rules, once, on the scratch copies of the files about to be written, with the plan they
    were written for: the wizard writes nothing it would flag. Findings name the final paths."""
    import dataclasses

    from wizard.check.doctor import check_planned
    displays = {yaml_tmp: result.yaml_path}
    if ds_tmp:
        displays[ds_tmp] = result.ds_path
    found = check_planned(yaml_tmp, ds_tmp, answers=result.answers, plan=result.plan, model=result.model,
                          hardware=result.hardware, method=lora_options_from_answers(result.answers),
                          trainer=result.answers.get("trainer", "hf"), seq_len=result.answers.get("seq_len", 2048),
                          displays=displays)
    # bitsandbytes is optional where the wizard runs (sizing never needs it): planning QLoRA for another machine
    # must not be refused for it; `wizard check --method qlora` on the training machine keeps it an error.
    return [dataclasses.replace(f, severity="warning") if f.rule in TRAINING_MACHINE_ONLY else f for f in found]


def build(request: Request, hw: Hardware | None = None) -> Result:
    """Everything but writing: the same decisions for every front end."""
    output_dir = os.path.abspath(os.path.expanduser(request.output_dir or default_output_dir()))
    if hw is None:
        hw = load_hardware(request.hardware_file, request.assume, output_dir,
                           request.given.get("nvme_path"))
    # Flags and an answers file that contradict each other are refused, not silently resolved.
    conflicts: list[InputError] = []
    refuse_mpirun(request.given)
    from wizard.config.questions import check_precision_pair
    check_precision_pair(request.given.get("precision"), request.given.get("mixed_precision"))
    ignored: list[str] = []
    answers = resolve_pre_plan(hw, request.given, conflicts, plan_only=request.plan_only, ignored=ignored)
    if conflicts:
        raise conflicts[0]
    refuse_adapter_options(request.given, answers)
    model = size(answers)
    plan = plan_from_answers(hw, model, answers, calibrate=request.calibrate, assumed_too=request.calibrate_assumed)
    plan.alternatives = alternatives(hw, model, answers, plan)
    answers = apply_split(answers, plan)
    result = Result(hardware=hw, model=model, plan=plan, answers=answers, output_dir=output_dir,
                    yaml_path=os.path.join(output_dir, "default_config.yaml"),
                    ds_path=os.path.join(output_dir, "ds_config.json"), ds_config_ref=request.ds_config_ref)
    if plan.choice is not None:
        result.answers = resolve_details(hw, model, plan, answers, request.given, conflicts, ignored)
        if conflicts:
            raise conflicts[0]
        a = result.answers
        plan.checkpoint = plan_checkpoint(plan, model.params, a.get("optimizer") or "adamw", a.get("save_total_limit"),
                                          a.get("fsdp_state_dict_type"), a.get("zero3_save_16bit_model") is not False)
    note = ignored_note(ignored)
    if note:
        plan.notes.append(note)
    if plan.choice is None:
        return result
    if not request.plan_only:
        render(result)
    return result


def plan_record(result: Result, given: dict[str, Any]) -> str:
    """What the launcher reads after a CUDA OOM to name the next rung and the command that makes it."""
    doc = {"plan": result.plan.to_json(), "model": result.model.to_json(),
           "given": {k: v for k, v in given.items() if v is not None},
           "script_settings": script_settings_json(result)}
    return json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"


def write(result: Result, given: dict[str, Any]) -> list:
    """The YAML, the JSON and the plan record as one set (emit.write_files); refuses when validation found an error."""
    from wizard.config import emit
    if result.errors:
        raise RuntimeError("refusing to write configs with validation errors")
    writes = emit.write_files(result.yaml_text, result.ds_text, result.output_dir, dry_run=False,
                              extra=((PLAN_FILE, plan_record(result, given)),))
    result.writes = writes
    result.notes = [w.note for w in writes if w.note] + list(result.notes)
    return writes


def to_json(result: Result) -> dict[str, Any]:
    files = {"accelerate_config": None, "deepspeed_config": None}
    if result.writes or result.yaml_text:
        files["accelerate_config"] = result.yaml_path
        files["deepspeed_config"] = result.ds_path if result.ds_text is not None else None
    return {
        "hardware": result.hardware.to_json(),
        "model": result.model.to_json(),
        "plan": result.plan.to_json(),
        "answers": {k: v for k, v in result.answers.items()},
        "files": files,
        "findings": [f.__dict__ for f in result.findings],
        "script_settings": script_settings_json(result),
    }


def script_settings_json(result: Result) -> list[dict[str, Any]]:
    """What the training script must set that no written file carries (config.script_settings): --json's and
    wizard_plan.json's `script_settings`, read by `wizard launch`."""
    from wizard.config.script_settings import settings_json
    return settings_json(result.answers, result.plan)
