"""Resolving and validating a plan's inputs once (precision, attention, adapters, host RAM, NVMe) into _Inputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from wizard.errors import InputError
from wizard.planning import speed as speed_mod
from wizard.planning.rungs import BY_KEY
from wizard.planning.plan_types import (
    ATTENTIONS, GC_MODES, HEADROOM_ALLOWED, LOSS_CHOICES, MAX_HEADROOM, METHODS, OPTIMIZERS, PRECISIONS,
    StrategyOptions, Topology, TrainingOptions,
)
from wizard.planning.ladder import _check_choice
from wizard.planning.evaluate import _Inputs
from wizard.sizing import memory as mem
from wizard.sizing import sequence as seqmem
from wizard.units import NETWORK_GBPS_RANGE, fmt_bytes, is_network_gbps


# --- Resolving the inputs ---------------------------------------------------------------------------

class NoGpusError(InputError):
    """GPU processes asked of a machine without GPUs. The field is the flag the user gave (--hardware, --assume) or,
    for this machine, --use-cpu: it read "--hardware: no GPUs found" when no --hardware was given, and named no way
    to CPU processes (`wizard tune` rewrites it: it refuses --assume)."""

    def __init__(self, hw):
        self.reason = hw.gpu_reason or "unknown reason"
        source = str(getattr(hw, "source", "probe") or "probe")
        if source.startswith("assume:"):
            field, where = "--assume", f"{source[len('assume:'):]} has no GPUs"
        elif source.startswith("file:"):
            field, where = "--hardware", f"{source[len('file:'):]} lists no GPUs"
        else:
            field, where = "--use-cpu", f"no GPUs found on this machine ({self.reason})"
        allowed = ("--use-cpu yes --num-processes N (CPU processes on this machine), a machine with GPUs, or "
                   "--assume SPEC to plan another machine" if field == "--use-cpu" else
                   "a machine with GPUs, or --use-cpu yes --num-processes N")
        super().__init__(field, f"{where}, and GPU processes were asked for", allowed)


def resolve_precision(precision: str, hw, cpu: bool) -> str:
    """'auto': fp32 for CPU processes, bf16 where every GPU supports it, else fp16."""
    _check_choice(precision, PRECISIONS, "--precision")
    if precision != "auto":
        return precision
    if cpu:
        return "fp32"
    return "bf16" if hw.all_bf16 else "fp16"


def resolve_attention(attention: str, precision: str, cpu: bool, model_default: str | None = None) -> bool:
    """True when the s x s attention scores are never materialised (flash / SDPA memory-efficient).

    'auto' is what transformers picks for the model class (ModelShape.attn_implementation, read from
    config._attn_implementation after building it): "eager" for classes without SDPA support (Gemma-2,
    Mamba); otherwise sdpa, which only reaches a fused kernel for 16-bit inputs on GPUs, so on CPUs and
    in fp32 it is counted as eager/math, which is conservative.
    """
    _check_choice(attention, ATTENTIONS, "--attention")
    if attention in ("flash", "sdpa"):
        return True
    if attention == "eager":
        return False
    if model_default == "eager":
        return False
    return not cpu and precision in ("bf16", "fp16")


def _positive(value: int, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(flag, f"{value!r} must be a whole number of at least 1", "1, 2, 3, ...")
    return value


def _available_host_ram(hw) -> int | None:
    # Probed machines know what is available now; assumed ones only know the total (or nothing).
    return hw.ram_available or hw.ram_total or None


def _resolve(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology,
             notes: list[str]) -> _Inputs:
    cpu = bool(topology.cpu)
    per_machine = _positive(topology.processes_per_machine, "--num-processes")
    machines = _positive(topology.num_machines, "--num-machines")
    seq = _positive(training.seq_len, "--seq-len")
    batch = _positive(training.micro_batch, "--micro-batch")
    _positive(training.grad_accum, "--grad-accum")
    _check_choice(training.gradient_checkpointing, GC_MODES, "--gradient-checkpointing")
    _check_choice(training.optimizer, OPTIMIZERS, "--optimizer")
    headroom = strategy.headroom
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < MAX_HEADROOM:
        raise InputError("--headroom", f"{headroom!r} is outside 0..{MAX_HEADROOM}", HEADROOM_ALLOWED)
    ssm = getattr(model, "ssm_state_size", 0) or 0
    if model.params < 1 or model.layers < 1 or model.hidden_size < 1 or (model.heads < 1 and not ssm):
        raise InputError("--model", "the model shape needs params, layers, hidden size and heads >= 1")
    precision = resolve_precision(training.precision, hw, cpu)
    attn_default = getattr(model, "attn_implementation", None)
    flash = resolve_attention(training.attention, precision, cpu, attn_default)
    ram = _available_host_ram(hw)

    if cpu:
        if ram is None:
            raise InputError("--hardware", "host RAM is unknown, so CPU processes cannot be planned",
                             "a probed machine, or --assume with ram=SIZE")
        capacity = ram // per_machine
        context = mem.CPU_PROCESS_OVERHEAD_BYTES
        n = per_machine * machines
        notes.append((f"These are {n} CPU processes" if n != 1 else "This is 1 CPU process") +
                     f" (DeepSpeed's CPU accelerator over gloo): each gets host RAM / {per_machine}, in {precision}; "
                     f"offload rungs are left out because the process{'es' if n != 1 else ''} already "
                     f"live{'' if n != 1 else 's'} in host RAM.")
        if precision == "fp16":
            notes.append("fp16 on CPUs is poorly supported by torch and DeepSpeed's CPU accelerator; use fp32 or bf16.")
    else:
        if hw.num_gpus == 0:
            raise NoGpusError(hw)
        if per_machine > hw.num_gpus:
            raise InputError("--num-processes", f"{per_machine} processes per machine but only {hw.num_gpus} GPUs",
                             f"1..{hw.num_gpus}")
        capacity = hw.min_gpu_memory
        context = strategy.cuda_context_bytes
        sizes = sorted({g.memory_total for g in hw.gpus})
        if len(sizes) > 1:
            notes.append(f"The GPUs have different memory sizes ({', '.join(fmt_bytes(b) for b in sizes)}): every "
                         f"process is planned on the smallest, {fmt_bytes(capacity)}, so the larger GPUs keep "
                         "memory unused.")
        if precision == "bf16" and not hw.all_bf16:
            notes.append("bf16 was asked for but not every GPU supports it (compute capability < 8.0).")
        if training.attention == "flash" and precision == "fp32":
            notes.append("flash-attention has no fp32 kernels: attention 'flash' needs bf16 or fp16.")
        busy = [g for g in hw.gpus if g.memory_free is not None
                and g.memory_free < mem.usable_bytes(capacity, headroom)]
        if busy:
            ids = ", ".join(str(g.index) for g in busy)
            notes.append(f"GPU {ids} has less free memory now than the planned usable amount: other processes are "
                         "using it.")
    if ram is None:
        notes.append("Host RAM is unknown, so the host-RAM needs of the rungs are shown but not checked.")
    elif not hw.ram_available:
        notes.append("Host RAM available is unknown; the total is used for the host-RAM check.")
    if training.optimizer in mem.GUESSED_OPTIMIZERS:
        notes.append(f"Optimizer state for {training.optimizer} is a guess "
                     f"({mem.OPTIMIZER_STATE_BYTES[training.optimizer]} B/param).")
    if not getattr(model, "exact", True):
        notes.append("The model shape is estimated from a parameter count, not read from a config.")
    # The MLP family follows from model_type; the config's own `gated_mlp` (T5's is_gated_act) overrides it.
    profile = mem.layer_profile(getattr(model, "model_type", None), getattr(model, "gated_mlp", None))
    mlp_text = "gated (SwiGLU) MLP" if profile.gated_mlp else "plain MLP"
    follows = (f" (transformers runs this model with {attn_default} attention)"
               if training.attention == "auto" and attn_default == "eager" else "")
    if ssm:
        notes.append("Mamba (selective state space) layers: activations are those MEASURED on transformers' PyTorch "
                     "reference path, which it runs when mamba_ssm / causal_conv1d are not installed; their fused "
                     "CUDA kernels keep far less, so this is an upper estimate.")
    else:
        notes.append("Activations are what PyTorch saves for backward in Hugging Face models, measured per tensor "
                     f"(Korthikanti et al. 2022's terms, HF's fp32 norms and softmax); {mlp_text}, attention counted "
                     f"as {'flash/SDPA (no s x s scores)' if flash else 'eager/math'}{follows}."
                     + (" With gradient checkpointing they are each layer's input plus what the recomputed layer "
                        "needs beyond the loss's peak (logits): the two never coexist in backward."
                        if training.gradient_checkpointing != "off" else ""))
    context_len = getattr(model, "max_position_embeddings", None)
    if context_len and seq > context_len:
        notes.append(f"Warning: --seq-len {seq} is longer than the model's context ({context_len} positions, "
                     "max_position_embeddings); it was not trained on such lengths and may fail or degrade.")

    nvme_path = strategy.nvme_path or hw.nvme_path
    nvme_free = nvme_free_bytes(hw, nvme_path)
    layer_params, root_params = mem.layer_and_root_params(model.params, model.hidden_size, model.layers,
                                                          model.vocab_size, model.tied_embeddings)
    network = topology.inter_node_gbps
    if network is not None and not is_network_gbps(network):
        raise InputError("--inter-node-gbps", f"{network!r} is not a network speed",
                         f"Gb/s per machine, {NETWORK_GBPS_RANGE}, e.g. 400")
    machine = speed_mod.machine_from_hardware(hw, precision, per_machine, cpu, network,
                                              network_source=topology.inter_node_source)
    notes.extend(machine.assumptions)
    if machines > 1:
        notes.append(speed_mod.inter_node_note(machine))
    weights_bytes = getattr(model, "weights_dtype_bytes", None)
    if weights_bytes is None:
        weights_bytes = 2
        notes.append("The checkpoint's dtype is not recorded (config.json has no dtype): loading it is counted at "
                     "2 B/param, a 16-bit checkpoint; an fp32 one needs twice that host RAM.")
    embedding = model.vocab_size * model.hidden_size
    task = _task(training, model, notes)
    usable = mem.usable_bytes(capacity, headroom)
    loss = resolve_loss(training, task, getattr(model, "model_type", None), hw, cpu,
                        mem.logits_bytes(seq, batch, model.vocab_size, precision), usable, notes)
    num_labels = getattr(model, "num_labels", 0) or 2
    lm = task in ("causal-lm", "masked-lm", "seq2seq-lm")
    head_params = min(embedding, model.params) if lm else model.hidden_size * num_labels
    # The input embedding is a lookup (no autocast copy) unless it is also the LM head.
    matmul_params = model.params if model.tied_embeddings else max(model.params - embedding, 0)
    return _Inputs(
        params=model.params, largest_layer=model.largest_layer_params, hidden=model.hidden_size,
        layers=model.layers, heads=model.heads, vocab=model.vocab_size,
        ffn=model.intermediate_size or 4 * model.hidden_size,
        kv_heads=getattr(model, "kv_heads", None) or model.heads,
        experts_per_token=(getattr(model, "experts_per_token", 0) or 0) if getattr(model, "num_experts", 0) else 0,
        profile=profile, weights_bytes=weights_bytes,
        stack=seqmem.stack_for_loss(layer_stack(model, profile), loss, getattr(model, "model_type", None)),
        matmul_params=matmul_params, head_params=head_params, layer_params=layer_params, root_params=root_params,
        seq=seq, batch=batch, precision=precision, optimizer=training.optimizer, flash=flash,
        per_machine=per_machine, machines=machines, cpu=cpu, context=context, capacity=capacity,
        usable=usable, headroom=headroom, ram=ram, loss=loss, code_changes=bool(training.allow_code_changes),
        nvme_path=nvme_path, nvme_free=nvme_free,
        grad_accum=training.grad_accum, machine=machine, active_params=_active_params(model),
        task=task, num_labels=num_labels, fsdp_version=_fsdp_version(strategy.fsdp_version),
    )


# The fused loss is recommended (--loss auto) where the full logits take at least this share of a GPU's usable
# memory: where the plan's note has named their size and what would avoid them since issue 30.
LOSS_SHARE = 0.2


def liger_problem(model_type: str | None, hw, cpu: bool) -> str | None:
    """Why Liger Kernel cannot compute this model's loss on these GPUs, or None: its kernels are Triton (NVIDIA
    GPUs of compute capability 8.0+, sequence.LIGER_MIN_COMPUTE_CAPABILITY) and it patches the model types it
    knows (sequence.LIGER_MODEL_TYPES)."""
    if cpu:
        return "Liger's kernels are Triton, which runs on GPUs only, and these are CPU processes"
    old = sorted({g.name for g in hw.gpus if g.compute_capability is not None
                  and tuple(g.compute_capability) < seqmem.LIGER_MIN_COMPUTE_CAPABILITY})
    if old:
        cc = ".".join(map(str, seqmem.LIGER_MIN_COMPUTE_CAPABILITY))
        return (f"Liger's kernels are Triton, which needs NVIDIA GPUs of compute capability {cc}+, and "
                f"{', '.join(old)} is older")
    if (model_type or "") not in seqmem.LIGER_MODEL_TYPES:
        return f"Liger Kernel does not patch {model_type or 'this'} models (it keeps their full logits)"
    return None


def resolve_loss(training: TrainingOptions, task: str, model_type: str | None, hw, cpu: bool, full_logits: int,
                 usable: int, notes: list[str]) -> str:
    """The loss the plan counts (sequence.LOSSES) for --loss: as given, refused with the reason where it cannot run
    or needs code that --allow-code-changes has not allowed; auto is the full logits unless they take LOSS_SHARE of
    the usable memory, then Liger where it runs without code (the HF Trainer's use_liger_kernel), else DeepSpeed's
    tiled loss where code changes are allowed."""
    loss = training.loss
    _check_choice(loss, LOSS_CHOICES, "--loss")
    code = bool(training.allow_code_changes)
    if loss == "full":
        return "full"
    if task != "causal-lm":
        if loss != "auto":
            raise InputError("--loss", f"{loss!r} fuses a causal LM's head with its loss, and the task is {task}",
                             "full or auto")
        return "full"
    problem = liger_problem(model_type, hw, cpu)
    needs_code = training.trainer != "hf"
    if loss == "liger":
        if problem:
            raise InputError("--loss", f"'liger' cannot run here: {problem}", "full, auto, or tiled")
        if needs_code and not code:
            raise InputError("--loss", "'liger' with your own Accelerate loop needs a line in the training script "
                                       "(the HF Trainer's use_liger_kernel is a TrainingArguments field), and code "
                                       "changes are not allowed", "full, auto, or --allow-code-changes yes")
        return "liger"
    if loss == "tiled":
        if not code:
            raise InputError("--loss", "'tiled' (DeepSpeed's TiledFusedLogitsLoss) needs lines in the training "
                                       "script, and code changes are not allowed",
                             "full, liger, auto, or --allow-code-changes yes")
        return "tiled"
    if full_logits < LOSS_SHARE * usable:
        return "full"
    if not problem and (not needs_code or code):
        notes.append(f"Loss: the full logits would take {fmt_bytes(full_logits)} per GPU, so the plan counts Liger "
                     "Kernel's fused linear cross-entropy instead (--loss auto; --loss full keeps them): "
                     "pip install liger-kernel on the training machine (Triton: NVIDIA GPUs of compute capability "
                     "8.0+)" + ("; the TrainingArguments turn it on (use_liger_kernel=True)." if not needs_code else
                                "; the script's lines are printed with the files."))
        return "liger"
    if code:
        notes.append(f"Loss: the full logits would take {fmt_bytes(full_logits)} per GPU, so the plan counts "
                     f"DeepSpeed's TiledFusedLogitsLoss (code changes allowed; {problem or 'Liger needs code here'}); "
                     "the lines for the training script are printed with the files.")
        return "tiled"
    return "full"


def _fsdp_version(value: Any) -> int:
    _check_choice(str(value).strip(), ("1", "2"), "--fsdp-version")
    return int(value)


def _task(training: TrainingOptions, model, notes: list[str]) -> str:
    """--task, else the head of the class the config names (ModelShape.task)."""
    from wizard.sizing.model import TASKS
    _check_choice(training.task, ("auto",) + TASKS, "--task")
    built = getattr(model, "task", "causal-lm")
    if training.task == "auto":
        if built not in ("causal-lm", "seq2seq-lm"):
            notes.append(f"The config's architecture is a {built} model: its head's output is sized as such "
                         f"({getattr(model, 'num_labels', 0) or 2} labels where it has labels), not as a vocabulary.")
        return built
    if training.task != built and getattr(model, "exact", True):
        notes.append(f"--task {training.task}: the head's output is sized for it; the parameters are those of the "
                     f"config's architecture ({built}).")
    return training.task


def _fsdp1_note(x: _Inputs, keys: list[str]) -> list[str]:
    """Why the FSDP rungs hold more activations, when they do and the ladder has an FSDP rung to say it of."""
    if not x.fsdp1_retains_checkpoints or not any(BY_KEY[k].backend == "fsdp" for k in keys):
        return []
    return ["FSDP1 with adapters under transformers 4.x's reentrant gradient checkpointing keeps every layer's "
            "input and its gradient until backward ends (FSDP1's hook on each frozen layer unit's input): the FSDP "
            "rungs count that. FSDP2 (fsdp_version: 2) or gradient_checkpointing_kwargs={\"use_reentrant\": False} "
            "avoids it."]


def _with_adapters(x: _Inputs, model, training: TrainingOptions, adapters, notes: list[str]) -> _Inputs:
    """The inputs with LoRA / QLoRA's adapters, checked against the options; unchanged for full fine-tuning."""
    _check_choice(training.method, METHODS, "--method")
    if training.method == "full":
        return x
    from wizard.sizing import lora
    options = lora.lora_options(training.method, training.lora_rank, training.lora_alpha, training.lora_dropout,
                                training.lora_targets)
    if adapters is None:
        if getattr(model, "exact", True):
            raise ValueError("make_plan needs the AdapterShape (wizard.sizing.lora.size_adapters) for a model read from "
                             "a config")
        adapters = lora.size_llama_adapters(model, options)
    if adapters.method != training.method or adapters.rank != training.lora_rank:
        raise ValueError(f"the AdapterShape is for {adapters.method} r={adapters.rank}, not {training.method} "
                         f"r={training.lora_rank}")
    if x.cpu and training.method == "qlora":
        raise InputError("--method", "qlora needs bitsandbytes' 4-bit kernels on GPUs; these are CPU processes",
                         "full, lora")
    if x.fsdp_version == 1 and training.reentrant_checkpoint_call and training.gradient_checkpointing != "off":
        x = replace(x, fsdp1_retains_checkpoints=True)      # said by _fsdp1_note once the ladder is known
    if training.optimizer in ("adamw-8bit",) and training.method == "qlora":
        notes.append("8-bit AdamW on the adapters saves almost nothing: they are a few per mille of the model.")
    share = adapters.trainable_params / max(x.params, 1) * 100
    what = "LoRA" if training.method == "lora" else "QLoRA (NF4" + (", double quantisation)" if adapters.double_quant
                                                                    else ")")
    notes.append(f"{what} r={adapters.rank} on {', '.join(adapters.targets)}: {adapters.trainable_params:,} trainable "
                 f"parameters ({share:.2f}% of {x.params:,}), counted by peft on the meta-built model"
                 + ("" if adapters.exact else " (analytically, for a Llama-like shape)")
                 + "; the frozen base has no gradients or optimizer states.")
    if adapters.method == "qlora":
        # What bitsandbytes leaves is more than embeddings, norms and the head where weights live outside
        # nn.Linear: transformers 5's fused MoE experts (3-D parameters) are the bulk of Mixtral.
        head = x.vocab * x.hidden * (1 if getattr(model, "tied_embeddings", False) else 2)
        other = adapters.unquantized_params - head - 2 * x.layers * x.hidden
        what = "(embeddings, norms, LM head)"
        if other > 0.01 * x.params:
            what = (f"(embeddings, norms, LM head, and {other:,} in parameters outside nn.Linear layers, such as "
                    "fused MoE experts, which bitsandbytes does not quantise)")
        notes.append(f"The 4-bit base: {fmt_bytes(adapters.nf4_weight_bytes)} of NF4 weights and "
                     f"{fmt_bytes(adapters.nf4_constant_bytes)} of quantisation constants, with "
                     f"{adapters.unquantized_params:,} parameters {what} left unquantised, "
                     "as transformers' bitsandbytes quantiser leaves them.")
    notes.append("The adapters' activations (dropout copies of their inputs, the rank-wide intermediate) are an "
                 "estimate from peft's LoRA layer, not a measurement.")
    return replace(x, adapters=adapters, lora_dropout=float(training.lora_dropout))


# peft keeps (and saves) the adapters in fp32 whatever the base's dtype (get_peft_model's autocast_adapter_dtype=True
# casts bf16/fp16 adapters up), so adapter_model.safetensors holds 4 bytes per trainable parameter.
ADAPTER_SAVE_BYTES = 4


def method_json(training: TrainingOptions, params: int, adapters) -> dict[str, Any]:
    """DESIGN.md's plan.method: what is trained, as fields (scripts should not parse the notes)."""
    if adapters is None:
        return {"name": "full", "rank": None, "alpha": None, "targets": None, "trainable_params": params,
                "adapter_bytes": None}
    alpha = training.lora_alpha if training.lora_alpha is not None else 2 * adapters.rank
    return {"name": adapters.method, "rank": adapters.rank, "alpha": int(alpha), "targets": list(adapters.targets),
            "trainable_params": adapters.trainable_params,
            "adapter_bytes": adapters.trainable_params * ADAPTER_SAVE_BYTES}


def _active_params(model) -> int:
    experts = getattr(model, "num_experts", 0) or 0
    return speed_mod.matmul_params(
        model.params, model.hidden_size, model.vocab_size, model.tied_embeddings, model.layers,
        num_experts=experts, experts_per_token=getattr(model, "experts_per_token", 0) or 0,
        expert_intermediate=getattr(model, "moe_intermediate_size", None) or model.intermediate_size,
        moe_layers=getattr(model, "moe_layers", None))
def layer_stack(model, profile: mem.LayerProfile | None = None) -> mem.LayerStack:
    """The model's layers as memory.stack_activation_bytes needs them, from a ModelShape (older shapes
    without the newer fields read as a uniform decoder)."""
    profile = profile or mem.layer_profile(getattr(model, "model_type", None), getattr(model, "gated_mlp", None))
    experts = (getattr(model, "experts_per_token", 0) or 0) if getattr(model, "num_experts", 0) else 0
    moe_layers = getattr(model, "moe_layers", None)
    encoder, decoder = getattr(model, "encoder_layers", 0) or 0, getattr(model, "decoder_layers", 0) or 0
    return mem.LayerStack(
        hidden=model.hidden_size, heads=model.heads, kv_heads=getattr(model, "kv_heads", None) or model.heads,
        layers=model.layers, ffn=model.intermediate_size or 4 * model.hidden_size, profile=profile,
        experts_per_token=experts, expert_ffn=getattr(model, "moe_intermediate_size", 0) or 0,
        shared_ffn=getattr(model, "shared_expert_intermediate_size", 0) or 0,
        moe_layers=(model.layers if moe_layers is None else moe_layers) if experts else 0,
        cross_attention_layers=decoder if encoder and decoder else 0,
        head_dim=getattr(model, "head_dim", None), v_head_dim=getattr(model, "v_head_dim", None),
        kv_lora_rank=getattr(model, "kv_lora_rank", 0) or 0,
        ssm_state=getattr(model, "ssm_state_size", 0) or 0, ssm_inner=getattr(model, "ssm_inner_size", 0) or 0,
        attention_dropout=(getattr(model, "attention_dropout", 0.0) or 0.0) > 0)


def activation_estimate(model, seq_len: int, micro_batch: int, precision: str, attention: str = "auto",
                        gradient_checkpointing: bool = False, cpu: bool = False) -> int:
    """The activations a plan counts for this ModelShape (the breakdown's "activations"), on its own."""
    flash = resolve_attention(attention, precision, cpu, getattr(model, "attn_implementation", None))
    return mem.stack_activation_bytes(layer_stack(model), seq_len, micro_batch, flash, gradient_checkpointing,
                                      precision)


def nvme_free_bytes(hw, path: str | None) -> int | None:
    """Free bytes at the NVMe offload path, or None when unknown.

    A probed machine measured its own candidate (or the --nvme-path it was probed with); another path on
    this machine is measured now. An assumed machine (--assume ...,disk=SIZE) has one disk: disk= is the
    free space at whatever path is given. A saved probe knows only the path it recorded.
    """
    if not path:
        return None
    if path == hw.nvme_path:
        return hw.disk_free_nvme
    if hw.source.startswith("assume:"):
        return hw.disk_free_nvme
    if hw.source == "probe":
        from wizard.probe.hardware import free_disk

        return free_disk(path)
    return None
