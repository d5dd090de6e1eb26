"""What the Done screen (and the plain prompts) print after writing: launch commands and the
TrainingArguments that match the plan. Pure: no UI, no heavy imports."""

from __future__ import annotations

import shlex
from typing import Any

def checkpointing_argument() -> str:
    """TrainingArguments' name for gradient checkpointing in the installed transformers:
    `activation_checkpointing` where it exists (`gradient_checkpointing` is its deprecated alias
    there), else `gradient_checkpointing`. Reads the dataclass only when transformers is already
    imported (validation did it), never importing it here."""
    import sys
    module = sys.modules.get("transformers.training_args")
    if module is not None:
        fields = getattr(module.TrainingArguments, "__dataclass_fields__", {})
        return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    try:
        from importlib.metadata import version
        major = int(version("transformers").split(".")[0])
    except Exception:
        return "gradient_checkpointing"
    return "activation_checkpointing" if major >= 5 else "gradient_checkpointing"


HF_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "sgd": "sgd", "adafactor": "adafactor"}


def launch_commands(yaml_path: str, script: str = "train.py", args: list[str] | None = None) -> tuple[str, str]:
    """(`accelerate launch ...`, `wizard launch ...`) for this config and script."""
    tail = " ".join(shlex.quote(a) for a in [script, *(args or [])])
    cfg = shlex.quote(yaml_path)
    return (f"accelerate launch --config_file {cfg} {tail}",
            f"wizard launch --config-file {cfg} -- {tail}")


def wizard_launch_argv(python: str, yaml_path: str, script: str, args: list[str]) -> list[str]:
    return [python, "-m", "wizard", "launch", "--config-file", yaml_path, "--", script, *args]


def training_arguments(answers: dict[str, Any], plan, ds_path: str | None) -> dict[str, Any]:
    """TrainingArguments keyword arguments equivalent to the written configs (ordered for reading)."""
    choice = plan.choice
    kwargs: dict[str, Any] = {"output_dir": "out",
                              "per_device_train_batch_size": int(answers.get("micro_batch") or 1),
                              "gradient_accumulation_steps": int(answers.get("grad_accum") or 1)}
    precision = plan.precision
    if answers.get("mixed_precision") in ("bf16", "fp16", "no"):
        precision = {"no": "fp32"}.get(answers["mixed_precision"], answers["mixed_precision"])
    if plan.topology.cpu:
        # use_cpu=True would make accelerate pick MULTI_CPU and silently drop DeepSpeed; with DeepSpeed
        # its CPU accelerator is chosen by DeepSpeed itself (verified with accelerate 1.15).
        if choice.backend != "deepspeed":
            kwargs["use_cpu"] = True
    elif precision == "bf16":
        kwargs["bf16"] = True
    elif precision == "fp16":
        kwargs["fp16"] = True
    kwargs["optim"] = HF_OPTIM.get(answers.get("optimizer") or "adamw", "adamw_torch")
    gc = bool(choice.gradient_checkpointing)
    checkpointing = checkpointing_argument()
    if choice.backend == "deepspeed":
        kwargs[checkpointing] = gc
        kwargs["deepspeed"] = ds_path
        if answers.get("gradient_clipping") is not None:
            kwargs["max_grad_norm"] = float(answers["gradient_clipping"])
    elif choice.backend == "fsdp":
        # With FSDP, its own activation checkpointing replaces the Trainer's (which would gather twice).
        kwargs[checkpointing] = False
        kwargs["fsdp"] = True
        config: dict[str, Any] = {"version": int(answers.get("fsdp_version") or 2)}
        reshard = answers.get("fsdp_reshard_after_forward")
        config["reshard_after_forward"] = bool(choice.fsdp_reshard if reshard is None else reshard)
        if answers.get("fsdp_offload_params"):
            config["cpu_offload"] = True
        policy = answers.get("fsdp_auto_wrap_policy") or "TRANSFORMER_BASED_WRAP"
        config["auto_wrap_policy"] = policy
        if policy == "TRANSFORMER_BASED_WRAP" and answers.get("fsdp_transformer_layer_cls_to_wrap"):
            config["transformer_layer_cls_to_wrap"] = str(answers["fsdp_transformer_layer_cls_to_wrap"]).split(",")
        if policy == "SIZE_BASED_WRAP" and answers.get("fsdp_min_num_params"):
            config["min_num_params"] = int(answers["fsdp_min_num_params"])
        if answers.get("fsdp_state_dict_type"):
            config["state_dict_type"] = answers["fsdp_state_dict_type"]
        config["activation_checkpointing"] = bool(answers.get("fsdp_activation_checkpointing", gc))
        config["cpu_ram_efficient_loading"] = bool(answers.get("fsdp_cpu_ram_efficient_loading", True))
        kwargs["fsdp_config"] = config
    else:
        kwargs[checkpointing] = gc
        if choice.backend == "ddp":
            kwargs["ddp_backend"] = "gloo" if plan.topology.cpu else "nccl"
            kwargs["ddp_find_unused_parameters"] = False
    return kwargs


def training_arguments_code(answers: dict[str, Any], plan, ds_path: str | None) -> str:
    """`TrainingArguments(...)` as Python source, one argument a line."""
    kwargs = training_arguments(answers, plan, ds_path)
    body = "".join(f"    {key}={value!r},\n" for key, value in kwargs.items())
    return f"TrainingArguments(\n{body})"
