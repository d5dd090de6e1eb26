"""The question table: every question the wizard asks, in asking order, with why it matters.

One source of truth (DESIGN.md's CLI contract): the CLI flags (`--seq-len` <- id `seq_len`), the
answers-file keys, the TUI's fields and the plain prompts are all generated from `QUESTIONS`.
Conditions and defaults mirror `accelerate config` for "This machine" (shared/reference/accelerate.md
§2); where the wizard knows better than accelerate's static default (it has probed the machine and
planned the memory), the default is computed and `why_default` says why.

Values are normalised by `Question.parse`: ints as int, bools as bool, choices as their canonical
spelling (FSDP/dynamo names upper-case as accelerate writes them, the rest lower-case), unset as None.

accelerate 1.16's FSDP2 parallelism config (replicate / shard / tensor / context sizes) and fp8 (backends ao
and te with their settings; MS-AMP is gone in 1.16) are asked as accelerate asks them, in detail_questions.py:
the parallelism sizes are judged by accelerate's own ParallelismConfig (wizard/config/parallelism.py), and fp8 is
offered only on GPUs of compute capability 8.9+ with a backend where the files will run (wizard/config/fp8.py).

Out of scope, never asked: SageMaker, TPU/XLA, Megatron-LM, non-NVIDIA accelerators, DeepSpeed with fp8 (the
wizard's DeepSpeed configs keep precision in ds_config.json, where accelerate asks no mixed precision either).
The parallelism config's sequence-parallel (DeepSpeed ALST/Ulysses) size, which `accelerate config` does not ask,
is asked for DeepSpeed (detail_questions.py).

The machinery (`Question`, `Context`, coercion, `_q`) is in question_base.py; the questions asked after the
plan (stage "details") are in detail_questions.py. This module holds the pre-plan questions, the whole
table and its look-ups, and the target-machine questions.

Pure and cheap to import: no torch, no UI.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

from wizard.config.detail_questions import DETAIL_QUESTIONS
from wizard.config.question_base import (  # noqa: F401 - the table's vocabulary, imported from here elsewhere
    DETAIL_GROUPS,
    KINDS,
    MAX_INT_DIGITS,
    STAGES,
    Context,
    Question,
    _a,
    _check_bf16,
    _given_bool,
    _num_machines,
    _multi_node,
    _positive,
    _q,
    _selected_gpu_count,
    _shown,
    _use_cpu,
    check_precision_pair,
    distributed_type_for,
)
from wizard.errors import InputError
from wizard.planning.plan import (
    ATTENTIONS,
    BACKENDS,
    GC_MODES,
    HEADROOM_ALLOWED,
    LOSS_CHOICES,
    MAX_HEADROOM,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    TRAINERS,
    ZERO_STAGES,
)
from wizard.probe import catalogue
from wizard.sizing.memory import CUDA_CONTEXT_BYTES
from wizard.sizing.model import TASKS as MODEL_TASKS
from wizard.units import NETWORK_GBPS_RANGE, fmt_bytes, is_network_gbps

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")     # what torchrun accepts
DEFAULT_PORT = 29500                                      # torchrun's and accelerate's default master port


# ----------------------------------------------------------------------------- validation helpers

_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_valid_host(text: str) -> bool:
    """An IPv4/IPv6 address or an RFC 1123 host name; '999.1.1.1' (a broken IPv4) is neither."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    if not text or len(text) > 253:
        return False
    labels = text.rstrip(".").split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return False
    # A name whose last label is all digits is a mistyped address, not a host name (RFC 1123 §2.1).
    return not labels[-1].isdigit()


def _check_host(value: str, ctx: Context, f: str) -> None:
    if not is_valid_host(value):
        raise InputError(f, f"{value!r} is not an IP address or host name",
                         "an IPv4/IPv6 address or a host name such as 10.0.0.1 or node01")


def _check_gbps(value: float, ctx: Context, f: str) -> None:
    if not is_network_gbps(value):
        raise InputError(f, f"{value:g} Gb/s is out of range", f"Gb/s per machine, {NETWORK_GBPS_RANGE}")


def _inter_node_why(ctx: Context) -> str:
    if ctx.hardware is None:
        return "Unset: what the machine class has (8 x 400 Gb/s for an H100 server, 8 x 200 for A100, else 100)."
    from wizard.planning.speed import inter_node_gbps
    gbps, source = inter_node_gbps(ctx.hardware)
    return f"Unset: {gbps:g} Gb/s, {source}."


def _check_port(value: int, ctx: Context, f: str) -> None:
    if not 0 <= value <= 65535:
        raise InputError(f, f"{value} is not a port", "0 (any free port) or 1..65535")


def _port_asked(ctx: Context) -> bool:
    """Asked for several machines; on one, taken when given: accelerate launch reads the config's
    main_process_port for one machine's torchrun too (utils/launch.py prepare_multi_gpu_env and
    prepare_deepspeed_cmd_env set master_port from it), so two jobs on one machine can each have theirs."""
    return _multi_node(ctx) or ctx.given.get("main_process_port") is not None


def _check_machine_rank(value: int, ctx: Context, f: str) -> None:
    n = _num_machines(ctx)
    if not 0 <= value < n:
        raise InputError(f, f"{value} is outside the {n} machines", f"0..{n - 1}")


def _parse_gpu_ids(value: str, ctx: Context, f: str) -> str:
    n = ctx.hardware.num_gpus
    allowed = f"all, or distinct GPU indices 0..{n - 1} separated by commas" if n else "all"
    text = value.replace(" ", "")
    if text.lower() == "all":
        return "all"
    parts = text.split(",")
    if not all(re.fullmatch(r"[0-9]{1,6}", p) for p in parts):
        raise InputError(f, f"{_shown(value)} is not a list of GPU indices", allowed)
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise InputError(f, f"{value!r} names a GPU twice", allowed)
    bad = [i for i in ids if i >= n]
    if bad:
        raise InputError(f, f"GPU {bad[0]} does not exist (this machine has {n})", allowed)
    return ",".join(str(i) for i in ids)


def _check_num_processes(value: int, ctx: Context, f: str) -> None:
    _positive(value, ctx, f)
    machines = _num_machines(ctx)
    if value % machines:
        raise InputError(f, f"{value} processes do not divide evenly over {machines} machines "
                            "(num_processes is the total over all machines)",
                         f"a multiple of {machines}")
    gpus = _selected_gpu_count(ctx)
    if ctx.hardware.num_gpus and not _use_cpu(ctx) and value > gpus * machines:
        per = f"{gpus} GPU{'s' if gpus != 1 else ''}"
        raise InputError(f, f"{value} processes but only {per} per machine x {machines} machine"
                            f"{'s' if machines != 1 else ''}",
                         f"1..{gpus * machines} (one process per GPU), or --use-cpu")


def _check_lora_targets(value: str, ctx: Context, f: str) -> str | None:
    from wizard.sizing.lora import lora_options
    try:
        return lora_options("lora", targets=value).targets or "default"
    except InputError as e:
        raise InputError(f, e.problem, e.allowed) from None


def _check_lora_dropout(value: float, ctx: Context, f: str) -> None:
    if not 0 <= value < 1:
        raise InputError(f, f"{value} is out of range", "a number from 0 up to (not including) 1")


def _check_epochs(value: float, ctx: Context, f: str) -> None:
    if not 0 < value <= 10_000:
        raise InputError(f, f"{value} is not a positive number of epochs", "a number > 0 such as 1, 3 or 0.5")


def _check_headroom(value: float, ctx: Context, f: str) -> None:
    if not 0 <= value < MAX_HEADROOM:
        raise InputError(f, f"{value} is outside 0..{MAX_HEADROOM}", HEADROOM_ALLOWED)


def _check_nvme_path(value: str, ctx: Context, f: str) -> None:
    if not os.path.exists(value):
        raise InputError(f, f"{value} does not exist", "an existing directory on a fast local disk")
    if not os.path.isdir(value):
        raise InputError(f, f"{value} is not a directory", "an existing directory on a fast local disk")


def _check_offload(value: str, ctx: Context, f: str) -> None:
    z = _a(ctx, "zero_stage", "auto")
    if value == "nvme" and z in ("1", "2"):
        raise InputError(f, f"nvme offload needs ZeRO-3, not ZeRO-{z}", "none, cpu (or --zero-stage 3)")


def _check_model(value: str, ctx: Context, f: str) -> None:
    if _a(ctx, "params") is not None or ctx.given.get("params") is not None:
        raise InputError(f, "give either --model or --params, not both", "--model ID_OR_PATH or --params 7B")


# ----------------------------------------------------------------------------- defaults that need a sentence

def _precision_why(ctx: Context) -> str:
    hw = ctx.hardware
    if not hw.gpus:
        return "auto: no GPU was found, so CPU processes train in fp32."
    if hw.all_bf16:
        return "auto: every GPU supports bf16, which trains as fast as fp16 without loss scaling."
    return "auto: at least one GPU lacks bf16 (compute capability < 8.0), so fp16 with loss scaling."


def _num_machines_default(ctx: Context) -> int:
    return ctx.hardware.num_machines_hint or 1


def _num_machines_why(ctx: Context) -> str:
    if ctx.hardware.num_machines_hint:
        return f"SLURM_NNODES says this job has {ctx.hardware.num_machines_hint} nodes."
    return "One machine unless you say otherwise; nothing here says it is part of a multi-node job."


def _slurm_int(ctx: Context, name: str) -> int | None:
    raw = ctx.hardware.env.get(name)
    return int(raw) if raw is not None and raw.isdigit() else None


def _machine_rank_default(ctx: Context) -> int:
    rank = _slurm_int(ctx, "SLURM_NODEID")
    return rank if rank is not None and rank < _num_machines(ctx) else 0


def _machine_rank_why(ctx: Context) -> str:
    if _slurm_int(ctx, "SLURM_NODEID") is not None and _machine_rank_default(ctx):
        return "SLURM_NODEID gives this node's rank."
    return "Rank 0 is the machine that hosts the main process; run the wizard on it first."


def first_slurm_host(nodelist: str | None) -> str | None:
    """First host of a SLURM node list: 'gpu[01-04,07],cpu1' -> 'gpu01'. None when it can't be read."""
    if not nodelist:
        return None
    m = re.match(r"([^,\[]+)(?:\[([0-9]+)[^\]]*\])?", nodelist.strip())
    if not m:
        return None
    host = m.group(1) + (m.group(2) or "")
    return host if is_valid_host(host) else None


def _main_ip_default(ctx: Context) -> str | None:
    return first_slurm_host(ctx.hardware.env.get("SLURM_JOB_NODELIST") or ctx.hardware.env.get("SLURM_NODELIST"))


def _main_ip_why(ctx: Context) -> str:
    if _main_ip_default(ctx):
        return "The first node of SLURM's node list runs rank 0 under srun."
    return "No default: only you know which machine hosts rank 0 (every node must reach it)."


def _plans_gpus(ctx: Context) -> bool:
    """GPU processes are planned (a CPU plan has no CUDA context: memory.CPU_PROCESS_OVERHEAD_BYTES instead)."""
    if _given_bool(ctx, "use_cpu"):
        return False
    return ctx.hardware is None or bool(ctx.hardware.num_gpus)


SPLIT_HELP_DEFAULT = "1; with --global-batch, its fastest split"


def _split_default(ctx: Context) -> int | None:
    """1; unset (None) when a global batch is given: the plan then picks the fastest split of it and the answer
    becomes that split (pipeline.apply_split)."""
    return None if ctx.given.get("global_batch") is not None or _a(ctx, "global_batch") is not None else 1


def _grad_accum_why(ctx: Context) -> str:
    split = ctx.plan.batch if ctx.plan is not None else None
    if split is not None and split.applied:
        return f"Unset: {split.grad_accum}, the fastest split of the global batch of {split.global_batch}."
    return "1: no accumulation; raise it for a larger effective batch."


def _micro_batch_why(ctx: Context) -> str:
    """With a plan: the largest micro-batch the chosen rung holds and the fastest split of the batch."""
    least = "1 uses the least memory"
    choice = ctx.plan.choice if ctx.plan is not None else None
    if choice is None or not choice.max_micro_batch:
        return f"{least}; raise it if the plan shows room to spare."
    text = f"{least}; on {choice.name} up to {choice.max_micro_batch} fits"
    if choice.max_micro_batch_gc and choice.max_micro_batch_gc != choice.max_micro_batch:
        text += f" ({choice.max_micro_batch_gc} with gradient checkpointing)"
    split = ctx.plan.batch
    if split is not None and split.applied:
        gc = " with gradient checkpointing" if split.gradient_checkpointing else ""
        return (f"Unset: {split.micro_batch} x accumulation {split.grad_accum}{gc}, the fastest split of the global "
                f"batch of {split.global_batch} on {choice.name} (up to {choice.max_micro_batch} fits).")
    if split is not None:
        gc = " with gradient checkpointing" if split.gradient_checkpointing else ""
        text += (f"; the fastest split of the global batch of {split.global_batch} is micro-batch "
                 f"{split.micro_batch} x accumulation {split.grad_accum}{gc}")
    return text + "."


def _use_cpu_default(ctx: Context) -> bool:
    if ctx.hardware.num_gpus:
        return False
    # DESIGN/issue 2: with no GPU, an explicit --backend or --num-processes means CPU processes.
    return _a(ctx, "backend", "auto") not in (None, "auto") or ctx.given.get("num_processes") is not None


def _use_cpu_why(ctx: Context) -> str:
    if ctx.hardware.num_gpus:
        return f"This machine has {ctx.hardware.num_gpus} GPU(s); train on them."
    if _use_cpu_default(ctx):
        return ("No GPU was found and you asked for a backend or a process count, so the wizard "
                "writes CPU processes (gloo, fp32) to let you try the pipeline before the GPUs are there.")
    return "No GPU was found; give --backend and --num-processes to try the pipeline on CPU processes."


def _num_processes_default(ctx: Context) -> int:
    machines = _num_machines(ctx)
    if _use_cpu(ctx) or not ctx.hardware.num_gpus:
        return machines
    return max(1, _selected_gpu_count(ctx)) * machines


def _num_processes_why(ctx: Context) -> str:
    machines = _num_machines(ctx)
    if _use_cpu(ctx) or not ctx.hardware.num_gpus:
        return "One CPU process per machine; give --num-processes for more."
    gpus = _selected_gpu_count(ctx)
    tail = f" x {machines} machines (the total over all machines)" if machines > 1 else ""
    return f"One process per GPU: {gpus} GPU(s){tail}."


def _nvme_default(ctx: Context) -> str | None:
    return ctx.hardware.nvme_path


def _nvme_why(ctx: Context) -> str:
    hw = ctx.hardware
    if hw.nvme_path:
        free = f" with {fmt_bytes(hw.disk_free_nvme)} free" if hw.disk_free_nvme else ""
        return f"The probe found {hw.nvme_path}{free} as the candidate NVMe offload path."
    return "No NVMe path found; NVMe offload stays out of the ladder unless you give one."


# ----------------------------------------------------------------------------- the table

def _shape_override(id: str, prompt: str, help: str) -> Question:
    """An advanced override of one dimension of the Llama-like shape that --params estimates."""
    return _q(id, prompt, help, "int", "model", advanced=True, check=_positive,
              when=lambda ctx: _a(ctx, "params") is not None,
              why="Derived from the parameter count (Llama-like shape).")


QUESTIONS: tuple[Question, ...] = (
    # ---------------------------------------------------------------- model
    _q("model", "Model (local dir, config.json or cached Hub id)",
       "The model's config gives the exact parameter count, layer sizes and vocabulary, which decide every "
       "memory figure. Only the config is read (no weights), and Hub ids come from the local cache only.",
       "str", "model", metavar="ID_OR_PATH", check=_check_model,
       why="No model yet: give one, or a parameter count with --params."),
    _q("params", "Parameter count (when there is no config)",
       "Without a config the wizard sizes a Llama-like model of this many parameters, so the plan is an "
       "estimate. Use it to plan for a model you have not downloaded.",
       "count", "model", metavar="7B", when=lambda ctx: _a(ctx, "model") is None,
       why="Only needed when no --model is given."),
    _shape_override("hidden_size", "Hidden size", "Overrides the estimated width; activations and the largest "
                    "layer grow with it."),
    _shape_override("layers", "Layers", "Overrides the estimated depth; activation memory is per layer."),
    _shape_override("heads", "Attention heads", "Overrides the estimated head count; without flash attention the "
                    "attention scores take memory in proportion to heads x sequence length squared."),
    _shape_override("vocab_size", "Vocabulary size", "Overrides the estimated vocabulary; the fp32 logits take "
                    "sequence x batch x vocabulary x 4 bytes, large for 128k-150k vocabularies."),

    _q("task", "Task (the model's head)",
       "What the head outputs decides the logits' memory: a language model's vocabulary per token, a sequence "
       "classifier's labels per sample.", "choice", "model", choices=("auto",) + MODEL_TASKS, default="auto",
       advanced=True, why="auto: the head of the architecture the config names (a causal LM without one)."),

    # ---------------------------------------------------------------- training
    _q("seq_len", "Sequence length (tokens)",
       "Activation memory grows with it (quadratically without flash attention), so it often decides "
       "whether a rung fits.", "int", "training", default=2048, check=_positive,
       why="2048 tokens is a common fine-tuning context; raise it to what your data needs."),
    _q("micro_batch", "Micro-batch per device",
       "Samples each process (one per GPU, or per CPU process) holds at once; activations scale with it. "
       "Bigger is faster until memory runs out.",
       "int", "training", default=_split_default, check=_positive, why=_micro_batch_why,
       help_default=SPLIT_HELP_DEFAULT),
    _q("grad_accum", "Gradient accumulation steps",
       "Gives a bigger effective batch (micro-batch x accumulation x processes) at no extra memory, "
       "at the cost of fewer optimizer steps per sample.", "int", "training", default=_split_default,
       check=_positive, why=_grad_accum_why, help_default=SPLIT_HELP_DEFAULT),
    _q("global_batch", "Global batch (samples per optimizer step)",
       "The plan looks for the fastest micro-batch x accumulation that gives this batch on the chosen rung "
       "(bigger micro-batches use the GPU better until memory runs out).", "int", "training",
       check=_positive, advanced=True, allowed="a whole number >= 1, a multiple of the number of processes",
       why="Unset: keep micro-batch x accumulation x processes."),
    _q("train_tokens", "Tokens to train on",
       "With it the plan says how long the run takes at each rung's predicted speed.", "count", "training",
       metavar="1e9", advanced=True, why="Unset: no time to train is shown."),
    _q("dataset_tokens", "Tokens in the dataset",
       "With --epochs, the tokens to train on (dataset x epochs), when --train-tokens is not given.", "count",
       "training", metavar="1e9", advanced=True, when=lambda ctx: _a(ctx, "train_tokens") is None,
       why="Unset: no time to train is shown."),
    _q("epochs", "Epochs over the dataset",
       "Passes over --dataset-tokens; fractions are allowed.", "float", "training", advanced=True,
       when=lambda ctx: _a(ctx, "dataset_tokens") is not None, check=_check_epochs,
       allowed="a number > 0 such as 1, 3 or 0.5", why="Unset: one epoch."),
    _q("save_total_limit", "Checkpoints kept (save_total_limit)",
       "The Trainer's save_total_limit: the plan sizes the disk its checkpoints take (each one, and this many plus "
       "the one being written, as the Trainer deletes the oldest only after the new one is saved).", "int",
       "training", check=_positive, advanced=True,
       why="Unset: the Trainer keeps every checkpoint; the plan sizes the last one and the one being written."),
    _q("method", "Fine-tuning method",
       "full trains every weight; lora trains small low-rank adapters beside a frozen base (a fraction of the "
       "memory for gradients and optimizer states); qlora also stores the frozen base in 4 bits (bitsandbytes "
       "NF4), for the largest model per GPU.", "choice", "training", choices=METHODS, default="full",
       why="full: what the rest of the plan assumes unless you ask for adapters; the plan names LoRA and QLoRA "
           "when full fine-tuning would need offload or does not fit."),
    _q("lora_rank", "LoRA rank",
       "The adapters' rank r: trainable parameters grow linearly with it.", "int", "training", default=16,
       check=_positive, when=lambda ctx: _a(ctx, "method", "full") != "full",
       why="16: the rank of TRL's and most recipes' defaults."),
    _q("lora_alpha", "LoRA alpha",
       "Scales the adapters' update (alpha / r); it changes no memory figure.", "int", "training",
       check=_positive, advanced=True, when=lambda ctx: _a(ctx, "method", "full") != "full",
       why="Unset: 2 x rank, TRL's default."),
    _q("lora_targets", "LoRA target modules",
       "Which linear layers get adapters: by default every Linear layer but the output layer (named one by one), "
       "all-linear (peft's shorthand), or names such as q_proj,k_proj,v_proj,o_proj.", "str", "training",
       advanced=True,
       when=lambda ctx: _a(ctx, "method", "full") != "full", check=_check_lora_targets,
       allowed="default, all-linear, or comma-separated module names",
       why="Unset: every Linear layer, as the QLoRA paper found necessary to match full fine-tuning and as "
           "LLaMA-Factory's and axolotl's recipes do (attention's q and v alone, peft's default, fall short)."),
    _q("lora_dropout", "LoRA dropout",
       "Dropout on the adapters' input; above 0 each adapter keeps a copy of its input for backward.", "float",
       "training", default=0.05, advanced=True, when=lambda ctx: _a(ctx, "method", "full") != "full",
       check=_check_lora_dropout, allowed="a number from 0 up to (not including) 1",
       why="0.05: TRL's default."),
    _q("precision", "Training precision",
       "bf16/fp16 halve the activations and the working copy of weights and gradients; bf16 needs "
       "compute capability 8.0+ (A100, H100, RTX 30xx and newer).", "choice", "training", choices=PRECISIONS,
       default="auto", why=_precision_why, check=_check_bf16),
    _q("gradient_checkpointing", "Gradient checkpointing",
       "Recomputes activations in the backward pass instead of storing them: much less memory, about "
       "a third more compute.", "choice", "training", choices=GC_MODES, default="auto",
       why="auto: switched on only at the first rung where activations, not model states, don't fit."),
    _q("optimizer", "Optimizer",
       "Optimizer state is usually the largest memory item: AdamW keeps 12 bytes per parameter (fp32 copy "
       "and two moments), 8-bit AdamW about 6, SGD 8, Adafactor less.", "choice", "training",
       choices=OPTIMIZERS, default="adamw", why="AdamW is the Trainer's default and what most recipes assume."),
    _q("attention", "Attention implementation",
       "Flash attention and SDPA never store the sequence x sequence score matrix, which changes the "
       "activation estimate a lot at long sequences.", "choice", "training", choices=ATTENTIONS,
       default="auto", advanced=True,
       why="auto: the implementation transformers picks by default (SDPA where available)."),
    _q("trainer", "Training loop",
       "The HF Trainer fills every \"auto\" in ds_config.json from its TrainingArguments; a custom "
       "Accelerate loop fills fewer, so concrete values are written where it can't.", "choice",
       "training", choices=TRAINERS, default="hf",
       why="hf: the Trainer keeps DeepSpeed's batch, clipping and optimizer settings in step with your arguments."),

    _q("loss", "Loss computation",
       "A causal LM's loss materialises its logits: 12 bytes per token x vocabulary element at its peak, gigabytes "
       "at long sequences with 128k-150k vocabularies. liger: Liger Kernel's fused linear cross-entropy never "
       "materialises them (the Trainer's use_liger_kernel; Triton, NVIDIA GPUs of compute capability 8.0+; pip "
       "install liger-kernel); tiled: DeepSpeed's TiledFusedLogitsLoss, one slice of the logits at a time (lines in "
       "the training script).", "choice", "training", choices=LOSS_CHOICES, default="auto", advanced=True,
       why="auto: the full logits, unless they take a fifth of a GPU's usable memory; then Liger where it runs, else "
           "DeepSpeed's tiled loss where code changes are allowed."),
    _q("allow_code_changes", "Allow changes to the training script",
       "ALST's long-sequence techniques that no config file turns on: DeepSpeed's TiledMLP, the activation "
       "checkpoints offloaded to host RAM, DeepSpeed's tiled loss. Allowed, the plan uses them where a rung needs "
       "them to fit (like gradient checkpointing), sizes and times them, and prints the lines to add.", "bool",
       "training", default=False, advanced=True,
       why="no: the plan uses only what the files and the TrainingArguments turn on."),

    # ---------------------------------------------------------------- strategy
    _q("backend", "Distributed backend",
       "How the work and the memory are split over GPUs: DDP copies the whole model to each GPU, DeepSpeed "
       "ZeRO and FSDP shard it. auto picks the cheapest that fits.", "choice", "strategy",
       choices=BACKENDS, default="auto",
       why="auto walks the ladder (DDP -> ZeRO-2 -> ZeRO-3 -> offload) and stops at the first rung that fits."),
    _q("zero_stage", "DeepSpeed ZeRO stage",
       "Stage 1 shards optimizer state, 2 also gradients, 3 also the weights: each saves memory and "
       "costs more communication.", "choice", "strategy", choices=ZERO_STAGES, default="auto",
       when=lambda ctx: _a(ctx, "backend", "auto") in ("auto", "deepspeed"),
       why="auto: the lowest stage that fits, because every stage up communicates more."),
    _q("offload", "Offload to CPU / NVMe",
       "Moves optimizer state (and with ZeRO-3 the weights) off the GPU when nothing else fits; it lets "
       "big models train on small GPUs but is several times slower.", "choice", "strategy",
       choices=OFFLOADS, default="auto", check=_check_offload,
       when=lambda ctx: _a(ctx, "backend", "auto") != "ddp",
       options_for=lambda ctx: ("auto", "none", "cpu") if _a(ctx, "backend") == "fsdp" else OFFLOADS,
       why="auto: offload only when no rung without it fits, because it is slow."),
    _q("nvme_path", "NVMe offload directory",
       "DeepSpeed swaps offloaded tensors into files here; it must be a fast local disk with room "
       "for them (the plan checks the free space).", "path", "strategy",
       when=lambda ctx: _a(ctx, "backend", "auto") in ("auto", "deepspeed")
       and _a(ctx, "offload", "auto") in ("auto", "nvme"),
       default=_nvme_default, why=_nvme_why, check=_check_nvme_path,
       required_when=lambda ctx: "when offload is nvme" if _a(ctx, "offload") == "nvme" else None,
       allowed="an existing directory on a fast local disk"),
    _q("headroom", "Memory headroom",
       "The share of the smallest GPU's memory the plan keeps free for fragmentation and allocations the "
       "estimate can't see; less headroom risks out-of-memory mid-run.", "float", "strategy",
       default=0.10, check=_check_headroom, allowed=HEADROOM_ALLOWED,
       why="10% leaves room for the caching allocator's fragmentation and the estimate's error without wasting much."),
    _q("cuda_context", "CUDA context per process",
       "Every process pays for its CUDA context and kernels before any tensor exists; the plan counts it "
       "on each GPU.", "size", "strategy", advanced=True, default=CUDA_CONTEXT_BYTES, when=_plans_gpus,
       why="About 1.3 GiB per process: what nvidia-smi shows for PyTorch's CUDA context and kernels before the "
           "first tensor (1343 MiB measured); nvidia-smi shows yours."),

    # ---------------------------------------------------------------- machines
    _q("num_machines", "Machines (nodes)",
       "More than one machine needs the same config on every node, each with its own rank, and a main "
       "machine the others can reach.", "int", "machines", default=_num_machines_default,
       why=_num_machines_why, check=_positive),
    _q("machine_rank", "Rank of this machine",
       "Each machine runs the same config with its own rank; rank 0 hosts the main process.", "int",
       "machines", when=_multi_node, default=_machine_rank_default, why=_machine_rank_why,
       check=_check_machine_rank),
    _q("main_process_ip", "Main machine's IP or host name",
       "Every node connects to the rank-0 machine at this address to start training; a wrong one hangs "
       "the start-up.", "str", "machines", metavar="IP", when=_multi_node, default=_main_ip_default,
       why=_main_ip_why, check=_check_host,
       required_when=lambda ctx: "when num_machines > 1" if _multi_node(ctx) else None,
       allowed="an IPv4/IPv6 address or a host name such as 10.0.0.1 or node01"),
    _q("main_process_port", "Main process port",
       "The rendezvous port on the main machine; it must be free and open between nodes. 0 picks a free one.",
       "int", "machines", metavar="PORT", when=_port_asked, default=DEFAULT_PORT, check=_check_port,
       allowed="0 (any free port) or 1..65535",
       why="29500 is torchrun's default; pick another when two jobs share a machine."),
    _q("inter_node_gbps", "Network between machines (Gb/s per machine)",
       "All of one machine's NICs to the others together, e.g. 3200 for 8 x 400 Gb/s; it sets the speed of "
       "every collective that crosses machines.", "float", "machines", metavar="GBPS", advanced=True,
       when=_multi_node, check=_check_gbps, allowed=f"Gb/s per machine, {NETWORK_GBPS_RANGE} such as 400 or 3200",
       why=_inter_node_why),
    _q("same_network", "All machines on the same local network?",
       "Nodes on one network rendezvous directly at the main address; across clouds or networks a "
       "rendezvous backend is needed. `accelerate launch` only honours this from its --same_network flag.",
       "bool", "machines", when=_multi_node, default=True,
       why="Nodes of one cluster usually share a network."),
    _q("rdzv_backend", "Rendezvous backend",
       "How nodes on different networks find each other; c10d tolerates nodes joining late. `accelerate "
       "launch` only honours this from its --rdzv_backend flag.", "choice", "machines",
       choices=RDZV_BACKENDS, when=lambda ctx: _multi_node(ctx) and not _a(ctx, "same_network", True),
       default="static", why="static is accelerate's default: fixed ranks, no extra service."),
    _q("use_cpu", "CPU processes only (no GPU)",
       "Runs every process on the CPU (DeepSpeed's CPU accelerator over gloo, fp32): slow, but it tries the "
       "whole pipeline before the GPUs are there.", "bool", "machines", advanced=True,
       default=_use_cpu_default, why=_use_cpu_why),
    _q("gpu_ids", "GPUs to use", "Restricts training to these GPUs of each machine (the others stay free "
       "for other jobs); 'all' uses every visible GPU.", "str", "machines", metavar="all|0,1,3",
       when=lambda ctx: ctx.hardware.num_gpus > 0 and not _use_cpu(ctx), default="all",
       why="all: every visible GPU trains.", check=_parse_gpu_ids,
       allowed="all, or distinct GPU indices separated by commas such as 0,1,3"),
    _q("num_processes", "Processes (total over all machines)",
       "One process per GPU is the rule; this is the total over all machines, as accelerate expects "
       "(2 nodes x 8 GPUs = 16).", "int", "machines", default=_num_processes_default,
       why=_num_processes_why, check=_check_num_processes),

    # ---------------------------------------------------------------- details (detail_questions.py)
    *DETAIL_QUESTIONS,
)

_BY_ID: dict[str, Question] = {q.id: q for q in QUESTIONS}


def by_id(id: str) -> Question:
    try:
        return _BY_ID[id]
    except KeyError:
        raise KeyError(f"no question {id!r}") from None


def ids() -> tuple[str, ...]:
    return tuple(_BY_ID)


def for_stage(stage: str) -> tuple[Question, ...]:
    return tuple(q for q in QUESTIONS if q.stage == stage)


def for_group(group: str) -> tuple[Question, ...]:
    return tuple(q for q in QUESTIONS if q.group == group)

# ----------------------------------------------------------------------------- the machine the files are for

# Which machine to plan for, and for "another machine" its GPUs, RAM, CPU cores and free disk: what --assume SPEC
# says on the command line, so these are not flags and not in QUESTIONS. The TUI's Hardware screen and --plain
# both ask them from here.
TARGET_HERE, TARGET_CPU, TARGET_OTHER = "here", "cpu", "other"
TARGET_LABELS = {
    TARGET_HERE: "this machine",
    TARGET_CPU: "CPU processes on this machine",
    TARGET_OTHER: "another machine (GPU catalogue)",
}
DEFAULT_OTHER_GPU = "H100-80GB"
DEFAULT_OTHER_COUNT = 8
MAX_ASSUMED_GPUS = 64


def _check_gpu_count(value: int, ctx: Any, field: str) -> None:
    if value < 1:
        raise InputError(field, f"{value} GPUs: the machine needs at least one", f"1 to {MAX_ASSUMED_GPUS}")
    if value > MAX_ASSUMED_GPUS:
        raise InputError(field, f"{value} GPUs is more than one machine holds", f"1 to {MAX_ASSUMED_GPUS}")


def target_question(has_gpus: bool, here: str, name: str = "this machine") -> Question:
    choices = (TARGET_HERE, TARGET_OTHER) if has_gpus else (TARGET_CPU, TARGET_OTHER)
    return Question(
        id="target_machine", prompt="Plan for", kind="choice", stage="machines", group="hardware",
        choices=choices,
        help=("The files are for the machine you will train on. " + (
            f"{name[0].upper()}{name[1:]} has {here}; or plan for another machine from the GPU catalogue"
            ", with its RAM, CPU cores and free disk."
            if has_gpus else
            "There is no GPU here: write a CPU-only configuration to try the whole pipeline on this machine "
            "(DDP / DeepSpeed over gloo, fp32; it runs here, so `wizard launch` works), or plan for a GPU "
            "machine from the catalogue and copy the files there.")),
        explain_default=(f"GPUs in {name}: plan for them." if has_gpus else
                         "CPU processes: the files go to this machine's accelerate config dir, where a "
                         "configuration for absent GPUs would make every `accelerate launch` here fail; "
                         "2 CPU processes run here and exercise the distributed path."),
        compute_default=lambda ctx: choices[0])


TARGET_COUNT_QUESTION = Question(
    id="target_count", prompt="GPUs in that machine", kind="int", stage="machines", group="hardware",
    help="How many GPUs the target machine has (one training process each).", check=_check_gpu_count,
    allowed=f"1 to {MAX_ASSUMED_GPUS}", explain_default="8 GPUs: the usual size of a training server.",
    compute_default=lambda ctx: 8)

GPU_QUESTION = Question(
    id="target_gpu", prompt="GPU model", kind="choice", stage="machines", group="hardware",
    choices=tuple(catalogue.names()),
    help="From the catalogue of NVIDIA GPUs: its memory and bf16 support decide the plan.",
    explain_default="H100 80GB: the most common training GPU in clouds and clusters.",
    compute_default=lambda ctx: "H100-80GB")

def _check_disk(value: str, ctx: Any, field: str) -> int:
    from wizard.units import parse_bytes
    return parse_bytes(value, field)


RAM_QUESTION = Question(
    id="target_ram", prompt="RAM in that machine", kind="size", stage="machines", group="hardware",
    help=("Host memory of the target machine: it decides whether the CPU-offload rungs fit (their optimizer "
          "states and parameters live there) or the plan falls to NVMe."),
    explain_default="From the catalogue: max(64 GiB, 2 x the GPUs' memory), in whole 16 GiB.")

CPUS_QUESTION = Question(
    id="target_cpus", prompt="CPU cores in that machine", kind="int", stage="machines", group="hardware",
    help="Logical CPUs of the target machine; CPU offload runs the optimizer on them.",
    check=lambda v, ctx, f: _check_cpus(v, f), allowed="1 to 8192",
    explain_default="From the catalogue: 16 per data-centre GPU, 8 per other GPU, at least 8.")

DISK_QUESTION = Question(
    id="target_disk", prompt="Free disk for NVMe offload", kind="str", stage="machines", group="hardware",
    help=("Free space at the NVMe offload path of the target machine; the NVMe rung fits only where its need "
          "is below it. Empty: not checked."),
    check=_check_disk, allowed="a size such as 2T or 800GiB, or empty (not checked)", metavar="empty: not checked",
    explain_default="Unknown for a catalogue machine: empty, so the NVMe rung's disk need is not checked.")


def _check_cpus(value: int, field: str) -> None:
    if not 1 <= value <= 8192:
        raise InputError(field, f"{value} CPU cores", "1 to 8192")


OTHER_MACHINE_FIELDS = ("target_count", "target_gpu", "target_ram", "target_cpus", "target_disk")
OTHER_MACHINE_QUESTIONS = (TARGET_COUNT_QUESTION, GPU_QUESTION, RAM_QUESTION, CPUS_QUESTION, DISK_QUESTION)


def other_machine_extras(catalogue_hw, ram: int | None, cpus: int | None, disk: int | None) -> dict[str, int]:
    """ram=/cpus=/disk= of --assume for the answers that differ from the catalogue machine's defaults."""
    extras: dict[str, int] = {}
    if ram is not None and ram != catalogue_hw.ram_total:
        extras["ram"] = ram
    if cpus is not None and cpus != catalogue_hw.cpu_cores:
        extras["cpus"] = cpus
    if disk is not None:
        extras["disk"] = disk
    return extras
