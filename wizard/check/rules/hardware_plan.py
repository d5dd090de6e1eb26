"""The configured strategy against the memory plan (needs --model and a hardware with GPUs).

The strategy in the files (single / DDP / ZeRO stage + offload / FSDP reshard + offload) is mapped to
its rung of wizard.planning.plan's ladder; that rung's per-GPU estimate is compared with the smallest GPU.
Over the GPU: error; under 5 % of it left free: warning. Either way the finding names the cheapest
rung that fits this model on this hardware (plan with backend auto, or FSDP's ladder for FSDP).
"""

from __future__ import annotations

from typing import Any, Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, rule

FAMILY = "hardware"
LOW_FREE_FRACTION = 0.05


def configured_rung_key(ctx: CheckContext) -> tuple[str, str] | None:
    """(rung key, backend option for wizard.planning.plan) of the strategy the files configure, None if not on the ladder."""
    from wizard.planning import rungs

    if ctx.uses_deepspeed:
        # a Ulysses rung: the sequence split over sp GPUs (parallelism_config_sp_size beside the DeepSpeed config)
        sp = as_int(ctx.acc_get("parallelism_config", "parallelism_config_sp_size"), 1) or 1
        strategy = rungs.Strategy("deepspeed", ctx.zero_stage(), ctx.offload_device("optimizer"),
                                  ctx.offload_device("param"), sp_size=max(sp, 1))
    elif ctx.uses_fsdp:
        strategy = rungs.fsdp_strategy(ctx.fsdp_options())
        cp = as_int(ctx.acc_get("parallelism_config", "parallelism_config_cp_size"), 1) or 1
        replicate = as_int(ctx.acc_get("parallelism_config", "parallelism_config_dp_replicate_size"), 1) or 1
        if cp > 1 or replicate > 1:
            # a context-parallel or HSDP rung: the sequence split over cp GPUs, replicas across machines (key_for)
            strategy = rungs.Strategy("fsdp", fsdp_reshard=strategy.fsdp_reshard, offload_fsdp=strategy.offload_fsdp,
                                      cp_size=cp, replicate=replicate)
    elif ctx.distributed_type in ("MULTI_GPU", "NO", "MULTI_CPU"):
        strategy = rungs.Strategy("ddp")
    else:
        return None
    key = rungs.key_for(strategy, processes=ctx.num_processes)
    if key is None:
        return None
    flags = rungs.BY_KEY[key].flags()
    return key, flags["backend"]


def _optimizer(ctx: CheckContext) -> str:
    optim = str(ctx.ta_value("optim") or "adamw_torch").lower() if ctx.ta is not None else "adamw_torch"
    if "8bit" in optim:
        return "adamw-8bit"
    if optim.startswith("sgd"):
        return "sgd"
    if optim.startswith("adafactor"):
        return "adafactor"
    return "adamw"


def _precision(ctx: CheckContext) -> str:
    if ctx.ds is not None:
        for name, value in (("bf16", ctx.ds_get("bf16.enabled")), ("fp16", ctx.ds_get("fp16.enabled"))):
            if value is True:
                return name
    if ctx.ta is not None:
        if ctx.ta_value("bf16"):
            return "bf16"
        if ctx.ta_value("fp16"):
            return "fp16"
    mp = ctx.acc_get("mixed_precision")
    if mp in ("bf16", "fp16"):
        return mp
    return "auto"


def _gradient_checkpointing(ctx: CheckContext) -> str:
    if str(ctx.fsdp_options().get("activation_checkpointing")).lower() == "true":
        return "on"
    if ctx.ta is not None:
        return "on" if ctx.activation_checkpointing() else "off"
    return "auto"            # unknown script: let the plan switch it on where it helps (lenient)


def _int_from(ctx: CheckContext, ta_key: str, ds_key: str, default: int) -> int:
    if ctx.ta is not None and ta_key in ctx.ta:
        return as_int(ctx.ta[ta_key], default) or default
    value = as_int(ctx.ds_get(ds_key), None) if ctx.ds is not None else None
    return value if value and value > 0 else default


def plan_inputs(ctx: CheckContext):
    from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions

    training = TrainingOptions(
        seq_len=ctx.seq_len,
        micro_batch=_int_from(ctx, "per_device_train_batch_size", "train_micro_batch_size_per_gpu",
                              8 if ctx.ta is not None else 1),
        grad_accum=_int_from(ctx, "gradient_accumulation_steps", "gradient_accumulation_steps", 1),
        precision=_precision(ctx), gradient_checkpointing=_gradient_checkpointing(ctx),
        optimizer=_optimizer(ctx), trainer=ctx.trainer, **_method_fields(ctx.method))
    cpu = ctx.acc_get("use_cpu") is True
    topology = Topology(num_machines=ctx.num_machines,
                        processes_per_machine=max(1, ctx.num_processes // ctx.num_machines), cpu=cpu)
    return training, topology, StrategyOptions


def _method_fields(options) -> dict[str, Any]:
    """TrainingOptions' method fields for --method lora/qlora (wizard.sizing.lora.LoraOptions), {} for full fine-tuning."""
    if options is None or options.method == "full":
        return {}
    return {"method": options.method, "lora_rank": options.rank, "lora_alpha": options.alpha,
            "lora_targets": options.targets, "lora_dropout": options.dropout}


def _adapters(model, training):
    """The AdapterShape make_plan needs for LoRA / QLoRA (peft on the meta device, remembered), else None."""
    from wizard.sizing.adapters import adapters_for
    return adapters_for(model, training)


@rule("PLAN-EXCEEDS-GPU", FAMILY, "estimated per-GPU memory over the GPU, or under 5 % free (with --model)")
def plan_memory(ctx: CheckContext) -> Iterable:
    hw, model = ctx.hardware, ctx.model
    if hw is None or model is None:
        return
    configured = configured_rung_key(ctx)
    cpu = ctx.acc_get("use_cpu") is True
    if configured is None or (not hw.gpus and not cpu):
        return
    from wizard.errors import InputError
    from wizard.planning.plan import make_plan, rung_by_key

    key, backend = configured
    training, topology, StrategyOptions = plan_inputs(ctx)
    from wizard.planning.rungs import BY_KEY

    stage = BY_KEY[key].flags()["zero_stage"] or "auto"
    try:
        configured_plan = make_plan(hw, model, training, StrategyOptions(backend=backend, zero_stage=stage), topology,
                                    adapters=_adapters(model, training))
    except InputError:
        return              # e.g. more processes than GPUs: ACC-NUM-PROCESSES-EXCEEDS-GPUS says so
    rung = rung_by_key(configured_plan, key)
    if rung is None:
        return
    capacity = configured_plan.gpu_capacity_bytes
    if capacity <= 0:
        return
    # QLoRA on a sharding rung first loads the whole 4-bit model onto every GPU (Rung.load_bytes): where that
    # is the larger figure, it is the one that runs out of memory, before training starts.
    loading = rung.load_bytes > rung.per_gpu_bytes
    need = max(rung.per_gpu_bytes, rung.load_bytes)
    free = capacity - need
    if free >= LOW_FREE_FRACTION * capacity:
        return
    adapters = _adapters(model, training)
    better = (_checkpointing_fits(ctx, hw, model, training, topology, StrategyOptions(backend=backend, zero_stage=stage),
                                  key, adapters)
              or _cheapest_fit(ctx, hw, model, training, topology, StrategyOptions, backend, key, adapters))
    from wizard.units import fmt_bytes

    unit = "process (host RAM)" if cpu else "GPU"
    file, where = _where(ctx)
    gc = " with gradient checkpointing" if rung.gradient_checkpointing else ""
    if free < 0 and loading:
        if better.startswith("No rung"):
            better = ("No rung of the ladder fits QLoRA here (more GPUs do not lower the loading peak): "
                      "`wizard plan --method lora` says whether LoRA, whose 16-bit base is sharded while it "
                      "loads, does.")
        yield finding(
            "error", "PLAN-EXCEEDS-GPU", file, where,
            f"{rung.name} needs about {fmt_bytes(need)} per {unit} for {ctx.model_id} while loading (bitsandbytes "
            f"quantises the whole model onto every GPU before it is sharded; training then needs "
            f"{fmt_bytes(rung.per_gpu_bytes)}), but the {unit} has {fmt_bytes(capacity)}: CUDA out of memory while "
            f"loading.",
            fix=better, when="prepare")
    elif free < 0:
        yield finding(
            "error", "PLAN-EXCEEDS-GPU", file, where,
            f"{rung.name}{gc or _without_checkpointing(training)} needs about {fmt_bytes(rung.per_gpu_bytes)} per "
            f"{unit} for {ctx.model_id} at seq {training.seq_len} x micro-batch {training.micro_batch}, but the "
            f"{unit} has {fmt_bytes(capacity)}: CUDA out of memory at step 0 (or while loading).",
            fix=better, when="step 0")
    else:
        yield finding(
            "warning", "PLAN-LOW-HEADROOM", file, where,
            f"{rung.name}{gc or _without_checkpointing(training)} needs about {fmt_bytes(need)} of "
            f"{fmt_bytes(capacity)} per {unit}{' while loading' if loading else ''}: "
            f"under 5 % left for fragmentation and spikes, a late OOM is likely.",
            fix=better, when="step 0")


def _without_checkpointing(training) -> str:
    return " without gradient checkpointing" if training.gradient_checkpointing == "off" else ""


def checkpointing_switch(ctx: CheckContext) -> str:
    """Where these files' run turns gradient checkpointing on: FSDP's own in the YAML (with the Trainer's it would
    gather twice, TRN-FSDP-AC-WITH-GC), else the training arguments' key (the spelling the file uses, else the
    installed transformers' name), or the model's method in an own loop."""
    if ctx.uses_fsdp:
        return "fsdp_activation_checkpointing: true in fsdp_config"
    if not ctx.hf_trainer:
        return "model.gradient_checkpointing_enable() in your loop"
    from wizard.config.script_settings import checkpointing_argument
    given = [k for k in ("activation_checkpointing", "gradient_checkpointing") if ctx.ta and k in ctx.ta]
    return f"{given[0] if given else checkpointing_argument()}: true in the training arguments"


def _checkpointing_fits(ctx, hw, model, training, topology, strategy, key: str, adapters) -> str | None:
    """The cheapest change, first: the configured rung with gradient checkpointing on, where the files turn it off
    and it then fits (no other strategy, no other batch)."""
    from dataclasses import replace

    from wizard.errors import InputError
    from wizard.planning.plan import make_plan, rung_by_key
    if training.gradient_checkpointing != "off":
        return None
    try:
        plan = make_plan(hw, model, replace(training, gradient_checkpointing="on"), strategy, topology,
                         adapters=adapters)
    except InputError:
        return None
    rung = rung_by_key(plan, key)
    if rung is None or not rung.fits:
        return None
    return (f"Turn gradient checkpointing on ({checkpointing_switch(ctx)}): {rung.name} then needs about "
            f"{_gib(rung.per_gpu_bytes)} per GPU at the same micro-batch, and fits.")


def _where(ctx: CheckContext) -> tuple[str | None, str]:
    if ctx.uses_deepspeed and ctx.ds is not None:
        return ctx.ds_path, "zero_optimization"
    return ctx.acc_path, "distributed_type"


def _cheapest_fit(ctx, hw, model, training, topology, StrategyOptions, backend: str, key: str, adapters) -> str:
    """The plan's own choice for these inputs, gradient checkpointing left to it as `wizard plan` leaves it (auto:
    on at the first rung where activations, not model states, are what does not fit)."""
    from dataclasses import replace

    from wizard.errors import InputError
    from wizard.planning.plan import make_plan

    was_off = training.gradient_checkpointing == "off"
    training = replace(training, gradient_checkpointing="auto") if was_off else training
    ladders: list[Any] = [StrategyOptions(backend="fsdp")] if backend == "fsdp" else []
    ladders.append(StrategyOptions())
    for strategy in ladders:
        try:
            plan = make_plan(hw, model, training, strategy, topology, adapters=adapters)
        except InputError:
            continue
        if plan.choice is not None and plan.choice.key != key:
            gc = " with gradient checkpointing" if plan.choice.gradient_checkpointing else ""
            switch = ""
            if was_off and plan.choice.gradient_checkpointing and plan.choice.backend != "fsdp":
                switch = " and turn gradient checkpointing on in the training arguments"
            return f"{plan.choice.name}{gc} fits (about {_gib(plan.choice.per_gpu_bytes)} per GPU): use it " \
                   f"(wizard writes it){switch}."
    smaller = " or a smaller micro-batch" if training.micro_batch > 1 else ""
    return f"No rung of the ladder fits this model here: more GPUs or a shorter sequence{smaller}."


def _gib(n: int) -> str:
    from wizard.units import fmt_bytes

    return fmt_bytes(n)
