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
    if answers.get("save_total_limit"):     # what plan.checkpoint sized the disk for
        kwargs["save_total_limit"] = int(answers["save_total_limit"])
    if getattr(plan, "loss", "full") == "liger" and (answers.get("trainer") or "hf") == "hf":
        kwargs["use_liger_kernel"] = True
        if choice.tiled_mlp:
            kwargs["liger_kernel_config"] = {"swiglu": False}     # TiledMLP patches the MLP (script_code)
    if choice.checkpoint_offload:
        # reentrant checkpointing saves each layer's input through autograd, where save_on_cpu moves it (script_code)
        kwargs[script_settings.checkpointing_argument() + "_kwargs"] = {"use_reentrant": True}
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
        text = adapter_snippet(answers, plan, model, ds_path)
    else:
        text = training_arguments_code(answers, plan, ds_path)
    code = script_code(plan, answers, model)
    return text + ("\n\n" + code if code else "")


# --- Long sequences: what the training script must do or hold beyond the files -------------------------------------

def _mlp_class(model) -> str:
    """The model's MLP class as transformers names it: its decoder layer's prefix + MLP (LlamaDecoderLayer ->
    LlamaMLP); the Llama class when the layer is not known."""
    layer = getattr(model, "layer_class", None) or "LlamaDecoderLayer"
    return layer.replace("DecoderLayer", "") + "MLP"


def _modeling_module(model) -> str:
    kind = (getattr(model, "model_type", None) or "llama").replace("-", "_")
    return f"transformers.models.{kind}.modeling_{kind}"


def script_requirements(plan, answers: dict[str, Any], model=None) -> list[str]:
    """What the training script must do for the chosen rung and loss that no written file carries, in sentences
    (empty when nothing): Ulysses' batches, Liger, and the code options (script_code has their lines)."""
    c = plan.choice
    if c is None:
        return []
    hf = (answers.get("trainer") or "hf") == "hf"
    out = []
    if c.sp_size > 1:
        from wizard.config.parallelism import SP_ATTENTION
        attn = SP_ATTENTION.get(str(answers.get("attention") or "auto"), "sdpa")
        who = ("The HF Trainer (and TRL's SFTTrainer) wraps the data loader with DeepSpeed's UlyssesSPDataLoaderAdapter "
               "(each batch sharded over the group, the labels shifted first) and averages the loss over the group by "
               "its tokens" if hf else
               "accelerator.prepare wraps the data loader with DeepSpeed's UlyssesSPDataLoaderAdapter (each batch "
               "sharded over the group, the labels shifted into batch['shift_labels']); the loop must average the "
               "loss over the group by its tokens (the lines below)")
        out.append(f"Ulysses SP {c.sp_size}: {who}. The batches must carry position_ids (the adapter refuses batches "
                   f"without them), each sequence a multiple of {c.sp_size} tokens (TRL: SFTConfig(pad_to_multiple_of="
                   f"{c.sp_size})), and the model must be loaded with attn_implementation={attn!r}, the files' "
                   "sp_attn_implementation (DeepSpeed refuses a mismatch).")
    loss = getattr(plan, "loss", "full")
    if loss == "liger":
        out.append("Loss: Liger Kernel's fused linear cross-entropy (pip install liger-kernel on the training machine; "
                   "NVIDIA GPUs of compute capability 8.0+): "
                   + ("use_liger_kernel=True in the TrainingArguments." if hf else
                      "build the model with Liger's AutoLigerKernelForCausalLM (the lines below)."))
    elif loss == "tiled":
        out.append("Loss: DeepSpeed's TiledFusedLogitsLoss, the logits one slice at a time (the lines below).")
    if c.tiled_mlp:
        out.append(f"Tiled MLP: DeepSpeed's TiledMLP in every {_mlp_class(model)}, patched before the model is built "
                   "(the lines below)" + ("; Liger's SwiGLU is left off (liger_kernel_config), as ALST does, since it "
                                          "would replace the patched MLP." if loss == "liger" else "."))
    if c.checkpoint_offload:
        out.append("Activation checkpoints to host RAM: each decoder layer checkpointed reentrantly, and what autograd "
                   "saves in the forward kept on the CPU (torch.autograd.graph.save_on_cpu: the standard-API "
                   "equivalent of ALST's patch of torch.utils.checkpoint; the lines below).")
    return out


def script_code(plan, answers: dict[str, Any], model=None) -> str:
    """The lines to add to the training script for what script_requirements names; "" when none are needed."""
    c = plan.choice
    if c is None:
        return ""
    hf = (answers.get("trainer") or "hf") == "hf"
    loss = getattr(plan, "loss", "full")
    blocks: list[str] = []
    if c.tiled_mlp:
        blocks.append(f"""# Tiled MLP (DeepSpeed's TiledMLP; before the model is built)
import math
import deepspeed
from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
import {_modeling_module(model)} as modeling

def tiled_mlp_forward(self, x):
    shards = torch.tensor(math.ceil(x.shape[-2] / x.shape[-1]), device=x.device)
    deepspeed.comm.all_reduce(shards, op=deepspeed.comm.ReduceOp.MAX)   # every rank the same count
    params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
    return TiledMLP.apply(lambda mlp, x: mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)),
                          self, x, int(shards.item()), params)

modeling.{_mlp_class(model)}.forward = tiled_mlp_forward""")
    if loss == "liger" and not hf:
        blocks.append("""# Liger Kernel's fused loss (and its norms and SwiGLU)
from liger_kernel.transformers import AutoLigerKernelForCausalLM
model = AutoLigerKernelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16)""")
    if loss == "tiled" or c.checkpoint_offload or (c.sp_size > 1 and not hf):
        blocks.append(_loss_code(plan, hf, loss == "tiled", c.checkpoint_offload, c.sp_size))
    if not blocks:
        return ""
    return "import torch\n\n" + "\n\n".join(blocks)


def _loss_code(plan, hf: bool, tiled: bool, offload: bool, sp: int) -> str:
    """The loss step: DeepSpeed's tiled loss over the model's hidden states, the checkpoints kept on the CPU during
    the forward, and under Ulysses the loss as transformers' deepspeed_sp_compute_loss makes it: the value the mean
    over the whole sequence, each rank backpropagating its own tokens' share (DeepSpeed sums the gradients over the
    group)."""
    head = ("class LongSequenceTrainer(Trainer):\n    def compute_loss(self, model, inputs, return_outputs=False, "
            "num_items_in_batch=None):" if hf else "def training_loss(model, inputs):")
    body = ["# the labels shifted once over the whole sequence (under Ulysses the data-loader adapter did it)",
            "labels = inputs.pop(\"shift_labels\", None)",
            "if labels is None:",
            "    labels = torch.nn.functional.pad(inputs[\"labels\"], (0, 1), value=-100)[..., 1:]",
            "inputs.pop(\"labels\", None)",
            "good = (labels != -100).sum()",
            "tokens = good.float()             # the tokens the mean is over"]
    if sp > 1:
        body += ["from deepspeed.utils import groups",
                 "group = groups._get_sequence_parallel_group()   # DeepSpeed's Ulysses group",
                 "tokens = tokens.clone()",
                 "torch.distributed.all_reduce(tokens, group=group)   # the whole sequence's",
                 "# (ZeRO-3 before DeepSpeed 0.20.2 averages the group's gradients: multiply `local` by sp there)"]
    context = "torch.autograd.graph.save_on_cpu(pin_memory=True)" if offload else "contextlib.nullcontext()"
    body.append(f"with {context}:" + ("   # the checkpoints (use_reentrant=True) to host RAM" if offload else ""))
    if tiled:
        body += ["    unwrapped = getattr(model, \"module\", model)",
                 "    hidden = unwrapped.model(**inputs).last_hidden_state",
                 "    vocab = unwrapped.config.vocab_size",
                 "    shards = max(1, math.ceil(labels.numel() * vocab * 4 / 2**30))   # ~1 GiB of fp32 logits each",
                 "",
                 "    def shard_loss(m, h, y):   # the shard's share of the mean: its backward runs in the forward",
                 "        return m.loss_function(logits=m.lm_head(h), labels=None, vocab_size=vocab, shift_labels=y,",
                 "                               num_items_in_batch=1) / tokens",
                 "",
                 "    local = TiledFusedLogitsLoss.apply(shard_loss, unwrapped, hidden, labels, None, shards,",
                 "                                       [unwrapped.lm_head.weight], \"sum\")"]
    else:
        body += ["    out = model(**inputs, labels=labels, shift_labels=labels)",
                 "    local = torch.where(good > 0, out.loss.float(), 0.0) * good / tokens.clamp(min=1)"]
    if sp > 1:
        body += ["total = local.detach().clone()",
                 "torch.distributed.all_reduce(total, group=group)",
                 "loss = local + (total - local.detach())   # the whole mean; this rank's share backpropagates"]
    else:
        body.append("loss = local")
    body.append("return (loss, None) if return_outputs else loss" if hf else "return loss")
    indent = "        " if hf else "    "
    imports = ["import contextlib", "import math"]
    if tiled:
        imports.append("from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss")
    text = "\n".join(imports) + "\n\n" + head + "\n" + "\n".join(indent + b if b else "" for b in body)
    if offload:
        text += (f"\n# and in the TrainingArguments: {script_settings.checkpointing_argument()}_kwargs={{\"use_reentrant\": True}}"
                 if hf else "\n# and model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                            "{\"use_reentrant\": True})")
    if hf:
        text += "\n# trainer = LongSequenceTrainer(model=model, args=args, train_dataset=your_dataset)"
    return text
