"""Rules where the accelerate config, the ds_config and the TrainingArguments meet (transformers 5.24,
`Trainer.create_accelerator_and_postprocess` and `TrainingArguments.__post_init__`), and library versions.

The Trainer-side rules need `--training-args`; without it the TrainingArguments are unknown and they stay quiet.
"""

from __future__ import annotations

from typing import Any, Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, older, rule

FAMILY = "integration"
ENVIRONMENT = "<environment>"

MIN_ACCELERATE = "1.1.0"            # transformers' dependency table: accelerate>=1.1.0
MIN_ACCELERATE_COMPILE = "1.2.0"    # transformers hands torch_compile to accelerate (TorchDynamoPlugin) from 1.2.0
MIN_DEEPSPEED = "0.9.3"             # accelerate: "DeepSpeed version must be >= 0.9.3"


def _ta_file(ctx: CheckContext) -> str | None:
    return ctx.ta_path


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def _fsdp_state_dict_type(ctx: CheckContext) -> str:
    opts = ctx.fsdp_options()
    value = opts.get("state_dict_type")
    if value:
        return str(value)
    # FullyShardedDataParallelPlugin: FULL_STATE_DICT for FSDP1, SHARDED_STATE_DICT for FSDP2
    return "SHARDED_STATE_DICT" if as_int(opts.get("version"), 1) == 2 else "FULL_STATE_DICT"


@rule("TRN-FSDP-AC-WITH-GC", FAMILY, "FSDP activation checkpointing together with gradient_checkpointing=True")
def fsdp_ac_with_gc(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not ctx.uses_fsdp or not ctx.hf_trainer:
        return
    if not (_truthy(ctx.fsdp_options().get("activation_checkpointing")) and ctx.activation_checkpointing()):
        return
    key = "gradient_checkpointing" if ctx.ta_given("gradient_checkpointing") else "activation_checkpointing"
    yield finding(
        "error", "TRN-FSDP-AC-WITH-GC", _ta_file(ctx), key,
        f"{key}=True while FSDP's own activation checkpointing is on: the Trainer raises \"`fsdp_config"
        f"['activation_checkpointing']` ... and the `activation_checkpointing` training argument can't both be set "
        f"to True\" when it builds its Accelerator (after the model is loaded)",
        fix=f"drop {key} from TrainingArguments and keep FSDP's activation checkpointing", when="launch")


@rule("TRN-FSDP2-8BIT-OPTIMIZER", FAMILY, "a bitsandbytes 8-bit optimizer with FSDP2")
def fsdp2_8bit_optimizer(ctx: CheckContext) -> Iterable:
    """bitsandbytes' 8-bit step cannot take FSDP2's DTensor parameters (0.50.2, torch 2.13: "got mixed
    torch.Tensor and DTensor"; tests/functional/test_fsdp_8bit_optimizer.py; bitsandbytes issue #1633)."""
    if ctx.ta is None or not ctx.uses_fsdp or as_int(ctx.fsdp_options().get("version"), 1) != 2:
        return
    optim = str(ctx.ta_value("optim") or "")
    if "8bit" not in optim:
        return
    yield finding(
        "error", "TRN-FSDP2-8BIT-OPTIMIZER", _ta_file(ctx), "optim",
        f"optim={optim!r} under FSDP2: bitsandbytes' 8-bit update rejects FSDP2's sharded (DTensor) parameters "
        "(\"got mixed torch.Tensor and DTensor\") at the first optimizer step",
        fix="optim: adamw_torch (or DeepSpeed ZeRO, which keeps plain tensors)", when="step 0")


@rule("TRN-SAVE-ONLY-MODEL-SHARDED", FAMILY, "save_only_model with a SHARDED_STATE_DICT FSDP checkpoint")
def save_only_model_sharded(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not ctx.uses_fsdp or not _truthy(ctx.ta_value("save_only_model")):
        return
    if "SHARDED_STATE_DICT" not in _fsdp_state_dict_type(ctx):
        return
    yield finding(
        "error", "TRN-SAVE-ONLY-MODEL-SHARDED", _ta_file(ctx), "save_only_model",
        "save_only_model=True with FSDP state_dict_type SHARDED_STATE_DICT (the FSDP2 default): the Trainer raises "
        "\"save_only_model option is not compatible with FSDP state dict type 'SHARDED_STATE_DICT'\" when it builds "
        "its Accelerator", fix="fsdp_state_dict_type: FULL_STATE_DICT, or drop save_only_model", when="launch")


@rule("TRN-AUTO-BATCH-ZERO3", FAMILY, "auto_find_batch_size with DeepSpeed ZeRO-3")
def auto_batch_zero3(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not _truthy(ctx.ta_value("auto_find_batch_size")) or ctx.zero_stage() != 3:
        return
    yield finding(
        "error", "TRN-AUTO-BATCH-ZERO3", _ta_file(ctx), "auto_find_batch_size",
        "auto_find_batch_size=True with ZeRO-3: the Trainer raises \"`auto_find_batch_size` isn't supported yet "
        "with DeepSpeed Zero-3\" when it builds its Accelerator",
        fix="drop auto_find_batch_size (set per_device_train_batch_size from the plan) or use ZeRO-2/FSDP",
        when="launch")


@rule("TRN-SAVE-ONLY-MODEL-BEST", FAMILY, "save_only_model with load_best_model_at_end under DeepSpeed or FSDP")
def save_only_model_best(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not (ctx.uses_deepspeed or ctx.uses_fsdp):
        return
    if not (_truthy(ctx.ta_value("save_only_model")) and _truthy(ctx.ta_value("load_best_model_at_end"))):
        return
    wrapper = "DeepSpeed" if ctx.uses_deepspeed else "FSDP"
    yield finding(
        "error", "TRN-SAVE-ONLY-MODEL-BEST", _ta_file(ctx), "save_only_model",
        f"save_only_model=True with load_best_model_at_end=True under {wrapper}: the Trainer raises \"{wrapper} "
        f"can't be used with `save_only_model` along with `load_best_model_at_end`\"",
        fix="drop one of the two", when="launch")


@rule("INT-FSDP-AND-DEEPSPEED", FAMILY, "FSDP and DeepSpeed both configured")
def fsdp_and_deepspeed(ctx: CheckContext) -> Iterable:
    dtype = ctx.distributed_type
    ds_sources, fsdp_sources = [], []
    if dtype == "DEEPSPEED":
        ds_sources.append(("acc", "distributed_type"))
    if ctx.ta_given("deepspeed"):
        ds_sources.append(("ta", "deepspeed"))
    if dtype == "FSDP":
        fsdp_sources.append(("acc", "distributed_type"))
    if ctx.ta_given("fsdp"):
        fsdp_sources.append(("ta", "fsdp"))
    # a leftover section of the other backend in the YAML is copied onto launch's args and ignored
    if dtype == "DEEPSPEED" and ctx.acc_get("fsdp_config"):
        fsdp_sources.append(("acc", "fsdp_config"))
    if dtype == "FSDP" and ctx.acc_get("deepspeed_config"):
        ds_sources.append(("acc", "deepspeed_config"))
    if not ds_sources or not fsdp_sources:
        return
    where, key = fsdp_sources[-1] if dtype == "DEEPSPEED" or ds_sources[0][0] == "ta" else ds_sources[-1]
    ignored = "FSDP" if (dtype == "DEEPSPEED" or ctx.ta_given("deepspeed")) else "DeepSpeed"
    yield finding(
        "error", "INT-FSDP-AND-DEEPSPEED", ctx.acc_path if where == "acc" else ctx.ta_path, key,
        f"both DeepSpeed ({', '.join(k for _, k in ds_sources)}) and FSDP ({', '.join(k for _, k in fsdp_sources)}) "
        f"are configured: only one can shard the model; accelerate uses "
        f"{'DeepSpeed' if ignored == 'FSDP' else 'FSDP'} and silently ignores the {ignored} settings",
        fix=f"remove the {ignored} settings", when="launch")


@rule("TRN-PRECISION-OVERRIDES-FP8", FAMILY, "bf16/fp16 in TrainingArguments beside mixed_precision: fp8")
def precision_overrides_fp8(ctx: CheckContext) -> Iterable:
    """TrainingArguments.__post_init__ takes ACCELERATE_MIXED_PRECISION (fp8 from launch) unless fp16 or bf16
    is set, which replace it, and the Trainer builds its Accelerator with that: the run trains in bf16/fp16."""
    if ctx.ta is None or not ctx.hf_trainer or str(ctx.acc_get("mixed_precision") or "").lower() != "fp8":
        return
    for key in ("bf16", "fp16"):
        if _truthy(ctx.ta_value(key)):
            yield finding(
                "warning", "TRN-PRECISION-OVERRIDES-FP8", _ta_file(ctx), key,
                f"{key}=True beside mixed_precision: fp8 in the accelerate config: TrainingArguments replaces "
                f"launch's fp8 with {key}, so the Trainer trains in {key} and the fp8_config is never used",
                fix=f"drop {key} (fp8 autocasts the rest to bf16 by itself), or set mixed_precision: {key}",
                when="prepare")
            return


@rule("TRN-NON-BLOCKING-NO-PIN", FAMILY, "non_blocking without dataloader_pin_memory")
def non_blocking_no_pin(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not _truthy(ctx.accelerator_config().get("non_blocking")):
        return
    if _truthy(ctx.ta_value("dataloader_pin_memory")):
        return
    yield finding(
        "warning", "TRN-NON-BLOCKING-NO-PIN", _ta_file(ctx), "accelerator_config.non_blocking",
        "non_blocking=True without dataloader_pin_memory: copies from pageable memory are synchronous anyway, so "
        "non_blocking gains nothing (the Trainer only logs a warning)", fix="dataloader_pin_memory: true",
        when="launch")


@rule("TRN-SPLIT-BATCHES-INDIVISIBLE", FAMILY, "split_batches with a batch not divisible by the processes")
def split_batches_indivisible(ctx: CheckContext) -> Iterable:
    if ctx.ta is None or not _truthy(ctx.accelerator_config().get("split_batches")):
        return
    batch = as_int(ctx.ta_value("per_device_train_batch_size"), None)
    procs = ctx.num_processes
    if batch is None or procs <= 1 or batch % procs == 0:
        return
    yield finding(
        "error", "TRN-SPLIT-BATCHES-INDIVISIBLE", _ta_file(ctx), "per_device_train_batch_size",
        f"split_batches=True splits each batch of {batch} over {procs} processes: accelerate raises 'the batch "
        f"size ({batch}) needs to be a round multiple of the number of processes ({procs})' when the dataloader "
        f"is prepared", fix=f"per_device_train_batch_size: {max(procs, batch - batch % procs)} "
        f"(with split_batches it is the global batch)", when="prepare")


# ----------------------------------------------------------------------------- versions


def _uses_compile(ctx: CheckContext) -> bool:
    if ctx.ta is not None and (ctx.ta_given("torch_compile") or ctx.ta_given("torch_compile_backend")
                               or ctx.ta_given("torch_compile_mode")):
        return True
    backend = ctx.acc_get("dynamo_config", "dynamo_backend") or ctx.acc_get("dynamo_backend")
    return isinstance(backend, str) and backend.upper() not in ("NO", "")


@rule("VER-ACCELERATE-OLD", FAMILY, "accelerate below 1.1.0")
def accelerate_old(ctx: CheckContext) -> Iterable:
    version = ctx.versions.get("accelerate")
    if older(version, MIN_ACCELERATE):
        yield finding(
            "error", "VER-ACCELERATE-OLD", ENVIRONMENT, "accelerate",
            f"accelerate {version} is below {MIN_ACCELERATE}: transformers' Trainer refuses to start "
            f"(dependency check accelerate>={MIN_ACCELERATE})", fix=f"pip install -U 'accelerate>={MIN_ACCELERATE}'",
            when="launch")


@rule("VER-ACCELERATE-COMPILE", FAMILY, "accelerate below 1.2.0 with torch compile")
def accelerate_compile(ctx: CheckContext) -> Iterable:
    version = ctx.versions.get("accelerate")
    if not _uses_compile(ctx) or older(version, MIN_ACCELERATE) or not older(version, MIN_ACCELERATE_COMPILE):
        return
    yield finding(
        "warning", "VER-ACCELERATE-COMPILE", ENVIRONMENT, "accelerate",
        f"torch compile with accelerate {version}: transformers hands its torch_compile settings to accelerate "
        f"(TorchDynamoPlugin) only from {MIN_ACCELERATE_COMPILE}; below it falls back to ACCELERATE_DYNAMO_* "
        f"environment variables, which accelerate launch overwrites from its own config",
        fix=f"pip install -U 'accelerate>={MIN_ACCELERATE_COMPILE}'", when="launch")


@rule("VER-DEEPSPEED-OLD", FAMILY, "DeepSpeed below 0.9.3")
def deepspeed_old(ctx: CheckContext) -> Iterable:
    version = ctx.versions.get("deepspeed")
    if not ctx.uses_deepspeed or not older(version, MIN_DEEPSPEED):
        return
    yield finding(
        "error", "VER-DEEPSPEED-OLD", ENVIRONMENT, "deepspeed",
        f"DeepSpeed {version} is below {MIN_DEEPSPEED}: accelerate raises ImportError 'DeepSpeed version must be "
        f">= {MIN_DEEPSPEED}' when it builds the Accelerator", fix=f"pip install -U 'deepspeed>={MIN_DEEPSPEED}'",
        when="launch")
