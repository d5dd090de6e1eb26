"""The installed libraries as the first judge: accelerate's launch checks and plugin, DeepSpeed's own
`DeepSpeedConfig` on the config the trainer really hands it, and `TrainingArguments(**args)`.

Each exception becomes one error finding with the library's message and when it would happen. The other
rules run on top, for what the libraries accept but get wrong; where one of them already names the
problem, `wizard check` keeps that finding and drops the library's (check.run_rules: one problem, one
finding).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import typing
import warnings
from typing import Any, Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, rule
from wizard.check.rules.yaml_verdicts import launch_outcome, loader_error

FAMILY = "library"
LIBRARY_RULES = frozenset({"ACC-LAUNCH-REJECTS", "DS-LIBRARY-REJECTS", "TRN-LIBRARY-REJECTS"})

# pydantic model (the ValidationError's title) -> where its fields sit in ds_config.json
DS_MODEL_PREFIX = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
    "CompileConfig": "compile",
    "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedActivationCheckpointingConfig": "activation_checkpointing",
    "DeepSpeedCommsConfig": "comms_logger",
    "DeepSpeedMonitorConfig": "",
    "DeepSpeedAIOConfig": "aio",
}


def _mixed_precision_for(ctx: CheckContext, env: dict[str, str]) -> str:
    """The precision the plugin is set to: TrainingArguments' fp16/bf16 win over accelerate's
    ACCELERATE_MIXED_PRECISION (TrainingArguments.__post_init__); an own loop takes the environment."""
    if ctx.hf_trainer and (ctx.ta is not None or ctx.trainer == "trl"):
        if ctx.ta_value("fp16"):
            return "fp16"
        if ctx.ta_value("bf16"):
            return "bf16"
    return env.get("ACCELERATE_MIXED_PRECISION", "no")


def accelerate_built_ds(ctx: CheckContext) -> dict[str, Any] | None:
    """The DeepSpeed config accelerate builds from an inline `deepspeed_config` YAML (no JSON file): the
    DeepSpeedPlugin the script gets in launch's environment, with the mixed precision set as the Trainer or
    Accelerator sets it. None when launch or the plugin fail (ACC-LAUNCH-REJECTS says why)."""
    outcome = launch_outcome(ctx)
    if outcome is None or outcome.plugin is None or not hasattr(outcome.plugin, "deepspeed_config"):
        return None
    plugin = copy.deepcopy(outcome.plugin)
    with contextlib.suppress(Exception):    # it refuses a precision the config contradicts: judge it as built
        plugin.set_mixed_precision(_mixed_precision_for(ctx, outcome.env or {}))
    cfg = copy.deepcopy(plugin.deepspeed_config)
    if cfg.get("steps_per_print") == float("inf"):
        cfg.pop("steps_per_print")      # accelerate's own placeholder, not JSON
    return cfg


# ----------------------------------------------------------------------------- accelerate


@rule("ACC-LAUNCH-REJECTS", FAMILY, "accelerate launch or the script's DeepSpeed/FSDP plugin rejects the YAML")
def launch_rejects(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or loader_error(ctx) is not None or ctx.ds_missing_ref:
        return                  # ACC-LOADER-REJECTS / ACC-UNKNOWN-KEY / ACC-DS-CONFIG-FILE-MISSING say it
    outcome = launch_outcome(ctx)
    if outcome is None or outcome.error is None:
        return
    where = ("`accelerate launch` raises, before any process starts" if outcome.stage == "launch" else
             "the script raises when it builds its Accelerator / TrainingArguments (accelerate's plugin)")
    if "on this machine" in outcome.error:
        # e.g. FP8 without Transformer Engine / MS-AMP / torchao installed: a fact about where check runs
        yield finding("warning", "ACC-LAUNCH-REJECTS", ctx.acc_path, None,
                      f"on the machine where check runs, {where}: {outcome.error}",
                      fix="install what the message names on the machines that run it", when="launch")
        return
    yield finding("error", "ACC-LAUNCH-REJECTS", ctx.acc_path, None, f"{where}: {outcome.error}",
                  fix="fix the value the message names", when="launch")


@rule("ACC-DISTRIBUTED-TYPE-CONTRADICTS", FAMILY, "distributed_type contradicts the rest of the YAML")
def distributed_type_contradicts(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or loader_error(ctx) is not None:
        return
    outcome = launch_outcome(ctx)
    args = getattr(outcome, "args", None)
    if args is None:
        return
    dtype = ctx.acc_get("distributed_type")
    shown = repr(dtype) if not isinstance(dtype, str) else dtype
    ds_block = ctx.acc_get("deepspeed_config")
    if isinstance(ds_block, dict) and ds_block and not args.use_deepspeed:
        yield finding(
            "error", "ACC-DISTRIBUTED-TYPE-CONTRADICTS", ctx.acc_path, "distributed_type",
            f"distributed_type {shown} beside a deepspeed_config block: accelerate launch does not use DeepSpeed, "
            f"so the whole DeepSpeed setup ({', '.join(sorted(map(str, ds_block)))}) is silently ignored",
            fix="distributed_type: DEEPSPEED (or remove deepspeed_config)", when="launch")
        return
    fsdp_block = ctx.acc_get("fsdp_config")
    if isinstance(fsdp_block, dict) and fsdp_block and not args.use_fsdp and not args.use_deepspeed:
        yield finding(
            "error", "ACC-DISTRIBUTED-TYPE-CONTRADICTS", ctx.acc_path, "distributed_type",
            f"distributed_type {shown} beside an fsdp_config block: accelerate launch does not use FSDP, so the "
            f"FSDP setup is silently ignored", fix="distributed_type: FSDP (or remove fsdp_config)", when="launch")
        return
    launchers = (args.use_deepspeed, args.use_fsdp, args.multi_gpu, getattr(args, "tpu", False),
                 getattr(args, "use_megatron_lm", False))
    if ctx.num_processes > 1 and not any(launchers) and ctx.acc_get("use_cpu") is not True:
        yield finding(
            "error", "ACC-DISTRIBUTED-TYPE-CONTRADICTS", ctx.acc_path, "distributed_type",
            f"distributed_type {shown} with num_processes {ctx.num_processes}: accelerate launch picks its "
            f"single-process launcher, so one process starts, not {ctx.num_processes}",
            fix="distributed_type: MULTI_GPU (or DEEPSPEED / FSDP), or num_processes: 1", when="launch")


@rule("INT-STAGE-CONFLICT", FAMILY, "the files disagree about the ZeRO stage")
def stage_conflict(ctx: CheckContext) -> Iterable:
    init = ctx.acc_get("deepspeed_config", "zero3_init_flag")
    stage = as_int(ctx.ds_get("zero_optimization.stage"), None)
    if ctx.ds is None or ctx.ds_is_virtual or not (init is True or str(init).lower() == "true") or stage in (3, None):
        return
    yield finding(
        "warning", "INT-STAGE-CONFLICT", ctx.acc_path, "deepspeed_config.zero3_init_flag",
        f"zero3_init_flag: true, but {ctx.ds_path} says ZeRO stage {stage}: accelerate warns 'DeepSpeed Zero3 Init "
        f"flag is only applicable for ZeRO Stage 3. Setting it to False.' and loads the full model on every "
        f"process", fix=f"zero3_init_flag: false (or stage 3 in {ctx.ds_path})", when="launch")


# ----------------------------------------------------------------------------- DeepSpeed


def deepspeed_config_errors(cfg: dict[str, Any], world_size: int) -> list[tuple[str | None, str]]:
    """(dotted key or None, message) for each error DeepSpeedConfig raises on cfg at world_size."""
    from wizard.config.validate import deepspeed_config_check

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            deepspeed_config_check(cfg, world_size)
    except Exception as exc:  # noqa: BLE001 - whatever DeepSpeed raises is the finding
        return _split_error(exc)
    return []


def _split_error(exc: Exception) -> list[tuple[str | None, str]]:
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if callable(errors) and title is not None:
        prefix = DS_MODEL_PREFIX.get(title)
        if prefix is None:          # a model not listed: where the installed DeepSpeed puts it (TPTrainingConfig)
            from wizard.check.rules.deepspeed_json import ds_schema
            schema = ds_schema()
            prefix = schema.prefixes.get(title, "") if schema is not None else ""
        out = []
        for e in errors():
            loc = ".".join(str(p) for p in e.get("loc", ()))
            key = ".".join(p for p in (prefix, loc) if p) or None
            out.append((key, f"{title}: {e.get('msg')} (got {e.get('input')!r})"))
        return out
    text = " ".join(str(exc).split())[:400]
    return [(None, f"{type(exc).__name__}: {text}" if text else type(exc).__name__)]


@rule("DS-LIBRARY-REJECTS", FAMILY, "DeepSpeed's own DeepSpeedConfig rejects the config the trainer hands it")
def ds_library_rejects(ctx: CheckContext) -> Iterable:
    from wizard.check.rules.deepspeed_json import fill_analysis

    if ctx.ds is None:
        return
    fill = fill_analysis(ctx)
    if fill is None or fill.plugin_error or fill.unfilled:
        return                  # DS-NO-ZERO-OPTIMIZATION / ACC-* / DS-AUTO-UNFILLED say why
    cfg = copy.deepcopy(fill.filled)
    if cfg.get("steps_per_print") == float("inf"):
        cfg.pop("steps_per_print")
    world = ctx.num_processes
    original = ctx.ds_get("train_batch_size")
    if ctx.acc is None and (original == "auto" or as_int(original, None) is not None):
        # the world size is unknown without the accelerate config: let DeepSpeed derive the global batch
        # (a value that is no count at all, such as NaN, still goes to DeepSpeed)
        cfg.pop("train_batch_size", None)
    filler = {"hf": "transformers' Trainer", "trl": "trl's trainer", "accelerate": "accelerate"}[ctx.trainer]
    for key, message in deepspeed_config_errors(cfg, world):
        yield finding(
            "error", "DS-LIBRARY-REJECTS", ctx.ds_path, key,
            f"DeepSpeed {_ds_version(ctx)} rejects it (after {filler} fills \"auto\", world size {world}): {message}; "
            f"this happens at deepspeed.initialize, after the model is loaded",
            fix=_unknown_key_fix(key, message) or "fix the value the message names", when="prepare")


def _unknown_key_fix(key: str | None, message: str) -> str | None:
    """For a key a DeepSpeed model forbids: where DeepSpeed reads a key of that name, or its close spelling."""
    if not key or "Extra inputs are not permitted" not in message:
        return None
    from wizard.check.rules.deepspeed_json import where_it_belongs

    hint = where_it_belongs(key)
    if not hint:
        return f"remove '{key}' (no DeepSpeed model reads it there)"
    parent = key.rpartition(".")[0]
    if all(h.rpartition(".")[0] == parent for h in hint):
        return f"did you mean {' or '.join(repr(h) for h in hint)}?"
    return f"move it to {' or '.join(repr(h) for h in hint)}"


def _ds_version(ctx: CheckContext) -> str:
    if (ctx.versions or {}).get("deepspeed"):
        return str(ctx.versions["deepspeed"])
    from wizard.check.rules.deepspeed_json import ds_schema
    schema = ds_schema()            # the DeepSpeed whose models just judged the file
    return schema.version if schema is not None else ""


# ----------------------------------------------------------------------------- TrainingArguments


@contextlib.contextmanager
def _planned_machine():
    """TrainingArguments as on the GPU machine the config is for: bf16 counts as supported (whether *these*
    GPUs have it is DS-BF16-UNSUPPORTED's question), and nothing it exports leaks into this process."""
    import transformers.training_args as ta_module

    from wizard.config.validate import environ_replaced

    saved = ta_module.is_torch_bf16_gpu_available
    ta_module.is_torch_bf16_gpu_available = lambda *a, **k: True
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    try:
        with environ_replaced(env), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        ta_module.is_torch_bf16_gpu_available = saved


def _arguments_class(ctx: CheckContext):
    if ctx.trainer == "trl":
        with contextlib.suppress(Exception):    # trl missing or broken: TrainingArguments' verdict
            from trl import SFTConfig  # type: ignore[import-not-found]
            return SFTConfig
    from transformers import TrainingArguments

    return TrainingArguments


@rule("TRN-LIBRARY-REJECTS", FAMILY, "TrainingArguments(**your args) raises")
def training_args_rejects(ctx: CheckContext) -> Iterable:
    if not ctx.ta:
        return
    # TrainingArguments.deepspeed is judged by the DeepSpeed rules (DS-*) on the file it names
    args = {k: v for k, v in ctx.ta.items() if k != "deepspeed"}
    cls = _arguments_class(ctx)
    try:
        with _planned_machine():
            cls(**args)
    except Exception as exc:  # noqa: BLE001 - the library's verdict
        text = " ".join(str(exc).split())[:400]
        yield finding("error", "TRN-LIBRARY-REJECTS", ctx.ta_path, _named_key(text, args),
                      f"{cls.__name__}(**args) raises {type(exc).__name__}: {text}; the script fails there, "
                      f"before the model is loaded", fix="fix the value the message names", when="launch")


def _named_key(text: str, args: dict[str, Any]) -> str | None:
    for key in sorted(args, key=lambda k: -len(str(k))):
        if str(key) in text:
            return str(key)
    return None


_SIMPLE = {int: "an integer", float: "a number", bool: "true or false"}


def _simple_type(annotation: Any) -> type | None:
    """int / float / bool for a field annotated with one of them (or with it | None)."""
    if isinstance(annotation, str):
        names = {a.strip() for a in annotation.replace("Optional[", "").rstrip("]").split("|")} - {"None"}
        return {"int": int, "float": float, "bool": bool}.get(names.pop()) if len(names) == 1 else None
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return args[0] if len(args) == 1 and args[0] in _SIMPLE else None


def _fits(value: Any, kind: type) -> bool:
    """Whether the value reads as `kind`. A string is fine where the framework converts it (trl's parser
    hands YAML values to argparse, which converts a "2e-5"; axolotl's schema converts its own values):
    only a string that cannot convert (per_device_train_batch_size: "x") is flagged, and bool fields
    take framework words like "auto" (axolotl)."""
    if value is None:
        return True
    if isinstance(value, str):
        if kind is bool:
            return True
        try:
            kind(value.strip())
        except ValueError:
            return False
        return True
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@rule("TRN-VALUE-TYPE", FAMILY, "a TrainingArguments value of the wrong type (accepted, then fails in use)")
def training_value_type(ctx: CheckContext) -> Iterable:
    if not ctx.ta:
        return
    from transformers import TrainingArguments

    kinds = {f.name: _simple_type(f.type) for f in dataclasses.fields(TrainingArguments)}
    for key, value in ctx.ta.items():
        kind = kinds.get(str(key))
        if kind is None or _fits(value, kind):
            continue
        yield finding(
            "error", "TRN-VALUE-TYPE", ctx.ta_path, str(key),
            f"{key}={value!r} is a {type(value).__name__}, but TrainingArguments declares {kind.__name__}: "
            f"TrainingArguments(**args) does not check it, so it fails (or silently misbehaves) where the Trainer "
            f"first uses it", fix=f"write {_SIMPLE[kind]}", when="launch")


@rule("TRN-IGNORED-KEYS", FAMILY, "keys of a training YAML that are not TrainingArguments")
def ignored_keys(ctx: CheckContext) -> Iterable:
    if not ctx.ta_ignored:
        return
    shown = ", ".join(ctx.ta_ignored[:12]) + (f", ... ({len(ctx.ta_ignored)} in all)" if len(ctx.ta_ignored) > 12
                                               else "")
    yield finding("info", "TRN-IGNORED-KEYS", ctx.ta_path, None,
                  f"checked the TrainingArguments keys only; not TrainingArguments fields, so not checked: {shown}")

