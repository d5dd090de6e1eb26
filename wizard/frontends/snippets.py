"""What the Done screen (and the plain prompts) print after writing: launch commands and the
TrainingArguments that match the plan. Pure: no UI, no heavy imports."""

from __future__ import annotations

import shlex
from typing import Any

from wizard.config import script_settings


def launch_commands(yaml_path: str, script: str = "train.py", args: list[str] | None = None) -> tuple[str, str]:
    """(`accelerate launch ...`, `wizard launch ...`) for this config and script."""
    tail = " ".join(shlex.quote(a) for a in [script, *(args or [])])
    cfg = shlex.quote(yaml_path)
    return (f"accelerate launch --config_file {cfg} {tail}",
            f"wizard launch --config-file {cfg} -- {tail}")


def where_to_launch(doc: dict[str, Any], yaml_path: str, what: str, machines: int = 1,
                    main_ip: str | None = None) -> list[tuple[str, str | None]]:
    """Where to run `wizard launch` with this config: (where, the command there or None) pairs, the main machine's
    first (`what`: the script and its arguments as typed in a shell; one machine: no where). accelerate's launchers
    (and DeepSpeed's `standard` and `nossh`) run a launch on every machine, each with its own rank; DeepSpeed's pdsh
    and MPI launchers reach the other hosts of the hostfile over ssh, and its slurm launcher with srun, from the main
    machine alone, where a second launch would start a second world."""
    from wizard.preflight.fanout import hostfile_path, main_starts_every_node
    # a line to paste into a shell: the config's path quoted as the script's is (a directory with a space)
    config = shlex.quote(yaml_path)
    launch = f"wizard launch --config-file {config} -- {what}"
    if machines <= 1:
        return [("", launch)]
    main = f"on the main machine{f' ({main_ip})' if main_ip else ''}"
    launcher = main_starts_every_node(doc)
    if launcher == "slurm":
        return [("inside the SLURM allocation, on its first node", launch),
                ("DeepSpeed's slurm launcher starts every machine from there with srun: launch nothing on the "
                 "others", None)]
    if launcher is not None:
        return [(f"{main}, the first host of {shlex.quote(hostfile_path(doc))}", launch),
                (f"DeepSpeed's {launcher} launcher starts the other machines of the hostfile from there over ssh: "
                 "launch nothing on them; they need passwordless ssh from the main machine, and the same files and "
                 "Python environment at the same paths", None)]
    # every machine runs the same files with its own rank: the config holds the main machine's (0)
    others = ("on the second machine" if machines == 2 else
              f"on each of the other {machines - 1} machines, K = 1..{machines - 1}")
    rank = "1" if machines == 2 else "K"
    return [(main, launch),
            (f"{others}, with the same files", f"wizard launch --config-file {config} --machine-rank {rank} -- {what}")]


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
    elif answers.get("mixed_precision") == "fp8":
        pass    # neither bf16 nor fp16: TrainingArguments then keeps accelerate launch's ACCELERATE_MIXED_PRECISION
                # (fp8); bf16=True would replace it (TrainingArguments.__post_init__) and train in bf16
    elif precision == "bf16":
        kwargs["bf16"] = True
    elif precision == "fp16":
        kwargs["fp16"] = True
    kwargs["optim"] = script_settings.HF_OPTIM.get(answers.get("optimizer") or "adamw", "adamw_torch")
    gc = bool(choice.gradient_checkpointing)
    checkpointing = script_settings.checkpointing_argument()
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
    return call_code("TrainingArguments", training_arguments(answers, plan, ds_path))


def call_code(name: str, kwargs: dict[str, Any]) -> str:
    """`name(...)` as Python source, one keyword argument a line (values as their repr)."""
    body = "".join(f"    {key}={value!r},\n" for key, value in kwargs.items())
    return f"{name}(\n{body})"


# --- LoRA / QLoRA: the peft and bitsandbytes objects that go with the plan -----------------------------------

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "uint8": "uint8"}


def uses_adapters(answers: dict[str, Any]) -> bool:
    return (answers.get("method") or "full") in ("lora", "qlora")


def _lora_options(answers: dict[str, Any]):
    from wizard.sizing import lora
    return lora.lora_options(answers.get("method") or "full", answers.get("lora_rank") or 16,
                             answers.get("lora_alpha"), answers.get("lora_dropout", 0.05),
                             answers.get("lora_targets"))


def lora_config_kwargs(answers: dict[str, Any], model, plan=None) -> dict[str, Any]:
    """peft LoraConfig keyword arguments of the planned adapters: the same config wizard.sizing.lora sized
    (lora._apply_lora), with the default targets (every Linear layer) written out by name as sizing found them."""
    from wizard.sizing import lora
    options = _lora_options(answers)
    if options.targets == lora.ALL_LINEAR:
        targets: Any = lora.ALL_LINEAR
    elif options.targets is None:
        # What sizing used (Plan.adapters.targets); "all-linear" names the same modules for a dense model.
        adapters = getattr(plan, "adapters", None)
        targets = list(adapters.targets) if adapters is not None and adapters.targets else lora.ALL_LINEAR
    else:
        targets = options.target_list
    return {"r": options.rank, "lora_alpha": options.lora_alpha, "lora_dropout": options.dropout,
            "target_modules": targets, "bias": "none", "task_type": "CAUSAL_LM"}


def bnb_config_kwargs(answers: dict[str, Any], plan) -> dict[str, Any]:
    """transformers BitsAndBytesConfig keyword arguments for QLoRA on the chosen rung: NF4, double
    quantisation as sized, compute dtype = the plan's precision, quant storage as wizard.sizing.lora's
    qlora_requirements says for that strategy (the compute dtype under ZeRO-3 / FSDP, else uint8)."""
    from wizard.sizing import lora
    options = _lora_options(answers)
    choice = plan.choice
    need = lora.qlora_requirements(choice.backend, choice.zero_stage, plan.precision)
    return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": options.double_quant,
            "bnb_4bit_compute_dtype": TORCH_DTYPES[plan.precision],
            "bnb_4bit_quant_storage": TORCH_DTYPES[need.quant_storage]}


def kbit_prepared(plan) -> bool:
    """Whether the QLoRA snippet calls peft's prepare_model_for_kbit_training: yes where the 4-bit weights
    stay uint8 (what the memory model assumes: the unquantised parameters upcast to fp32), no where the weights
    are sharded (ZeRO-3, FSDP), which keep them in the compute dtype (TRL's SFTTrainer skips it for such sharded
    QLoRA as well, `is_sharded_qlora`)."""
    choice = plan.choice
    return not (choice.backend == "fsdp" or (choice.backend == "deepspeed" and choice.zero_stage == 3))


def model_reference(model) -> str:
    """What to pass to from_pretrained: the planned model's path or Hub id, or a placeholder for --params."""
    source = getattr(model, "source", "") or ""
    if not getattr(model, "exact", False) or not source or source.startswith("--params"):
        return "YOUR_MODEL"
    if source.endswith("config.json"):
        import os
        return os.path.dirname(source) or "."
    return source


def adapter_snippet(answers: dict[str, Any], plan, model, ds_path: str | None) -> str:
    """The runnable setup for --method lora/qlora: TrainingArguments (first: with a ZeRO-3 config it arms
    zero.Init before the model is built), BitsAndBytesConfig for QLoRA, the model, LoraConfig and
    get_peft_model; the dataset and Trainer call are the user's."""
    qlora = answers.get("method") == "qlora"
    dtype = TORCH_DTYPES[plan.precision]
    lines = ["import torch", "from peft import LoraConfig, get_peft_model"
             + (", prepare_model_for_kbit_training" if qlora and kbit_prepared(plan) else ""),
             "from transformers import AutoModelForCausalLM, "
             + ("BitsAndBytesConfig, " if qlora else "") + "Trainer, TrainingArguments", "",
             "args = " + training_arguments_code(answers, plan, ds_path)]
    load = f"model = AutoModelForCausalLM.from_pretrained({model_reference(model)!r}, dtype=torch.{dtype}"
    if qlora:
        lines.append("quantization_config = " + call_code("BitsAndBytesConfig", bnb_config_kwargs(answers, plan)))
        lines.append(load + ", quantization_config=quantization_config)")
        if kbit_prepared(plan):
            gc = bool(plan.choice.gradient_checkpointing)
            lines.append(f"model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={gc})")
    else:
        lines.append(load + ")")
    lines.append("lora_config = " + call_code("LoraConfig", lora_config_kwargs(answers, model, plan)))
    lines.append("model = get_peft_model(model, lora_config)")
    lines.append("# trainer = Trainer(model=model, args=args, train_dataset=your_dataset); trainer.train()")
    return "\n".join(lines)


def setup_snippet(answers: dict[str, Any], plan, model, ds_path: str | None) -> str:
    """What the Done screen and the text front ends print: the adapter setup for LoRA / QLoRA, else the
    TrainingArguments alone."""
    if uses_adapters(answers):
        return adapter_snippet(answers, plan, model, ds_path)
    return training_arguments_code(answers, plan, ds_path)
