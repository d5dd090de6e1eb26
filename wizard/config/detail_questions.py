"""The questions asked after the plan (stage "details"): process checks, torch.compile, DeepSpeed, the
DeepSpeed multi-node launcher, FSDP, FSDP2's parallelism config, mixed precision and fp8's settings, in
accelerate config's order within each group. Their defaults follow the plan's choice; questions.py appends them
to QUESTIONS. `check_details` is the one check over several answers (the parallelism sizes against the process
count), run after they are all resolved.

Pure and cheap to import: no torch, no UI.
"""

from __future__ import annotations

import os
import re

from wizard.config import fp8
from wizard.config.parallelism import CP_COMM_ID, SIZE_IDS, SP_SIZE_ID
from wizard.config.question_base import (
    Context,
    Question,
    _a,
    _at_least,
    _check_bf16,
    _chosen_zero_stage,
    _details,
    _dist_type,
    _fsdp_version,
    _is_deepspeed,
    _is_fsdp,
    _multi_node,
    _num_machines,
    _positive,
    _q,
    _use_cpu,
    check_precision_pair,
)
from wizard.config.vocab import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS_OFFERED,
    DYNAMO_MODES,
    FSDP1_STATE_DICT_TYPES,
    FSDP2_STATE_DICT_TYPES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FP8_AMAX_COMPUTE_ALGOS,
    FP8_BACKENDS,
    FP8_FORMATS,
    MIXED_PRECISIONS,
    PARALLELISM_CP_COMM_STRATEGIES,
)
from wizard.errors import InputError


# ----------------------------------------------------------------------------- validation

def _check_mixed_precision(value: str, ctx: Context, f: str) -> None:
    _check_bf16(value, ctx, f)
    check_precision_pair(ctx.given.get("precision"), value, f)


def _fp8_problem(ctx: Context) -> str | None:
    """Why fp8 cannot run for this plan (the GPUs, or no backend where the files run), or None."""
    return fp8.gpu_problem(ctx.hardware, _use_cpu(ctx)) or fp8.backend_problem(ctx.hardware)


def _mixed_precision_options(ctx: Context) -> tuple:
    return tuple(p for p in MIXED_PRECISIONS if p != "fp8" or _fp8_problem(ctx) is None)


def _mixed_precision_why_not(value: str, ctx: Context) -> str | None:
    return _fp8_problem(ctx) if value == "fp8" else None


def _check_ram_efficient_loading(value: bool, ctx: Context, f: str) -> None:
    # accelerate's Accelerator.__init__ (1.16) raises for any FSDP version: refused here, not at the script's start
    # (fp8 is asked after FSDP's questions: _ao_fp8_wanted reads the given answers).
    if value and _ao_fp8_wanted(ctx):
        raise InputError(f, "accelerate refuses CPU-RAM-efficient loading with torchao's fp8 (the Accelerator raises "
                            "'torchao with FSDP2 and cpu_ram_efficient_loading is not supported')",
                         "no, or --fp8-backend te")


def _check_cp_size(value: int, ctx: Context, f: str) -> None:
    _positive(value, ctx, f)
    attention = _a(ctx, "attention", "auto")
    if value > 1 and attention in ("flash", "eager"):
        # torch's context_parallel patches F.scaled_dot_product_attention only, and the HF Trainer raises
        # "Context parallelism is supported only with SDPA attention" for any other implementation.
        raise InputError(f, f"context parallelism splits SDPA attention only, and --attention is {attention}",
                         "1, or --attention sdpa (or auto)")


def _check_sp_size(value: int, ctx: Context, f: str) -> None:
    _positive(value, ctx, f)
    attention = _a(ctx, "attention", "auto")
    if value > 1 and attention == "eager":
        # UlyssesSPAttentionHF.register_with_transformers: eager "requires a 4D attention_mask (O(n²) memory)"
        raise InputError(f, "DeepSpeed's Ulysses refuses eager attention (its 4D mask), and --attention is eager",
                         "1, or --attention sdpa, flash or auto")


def check_details(answers: dict, ctx: Context) -> None:
    """The checks over several details answers, once all are resolved: accelerate's own ParallelismConfig
    verdict on the sizes for this many processes (parallelism.problem calls the real class). Raises InputError
    naming the last size the user gave (dp_shard_size when none was given)."""
    if not answers.get("use_parallelism_config"):
        return
    from wizard.config import parallelism

    sizes = {name: answers.get(qid) for name, qid in zip(parallelism.SIZES, SIZE_IDS)}
    n = _num_processes(ctx, answers)
    problem = parallelism.problem(sizes, n, int(answers.get("fsdp_version") or 2), answers.get(CP_COMM_ID))
    if problem is None:
        return
    given = [qid for qid in SIZE_IDS if ctx.given.get(qid) is not None]
    qid = given[-1] if given else SIZE_IDS[1]
    shown = " x ".join(str(sizes[name] if sizes[name] is not None else 1) for name in parallelism.SIZES)
    raise InputError(qid.replace("_", "-"), f"accelerate's ParallelismConfig refuses replicate x shard x tp x cp = "
                                            f"{shown} for {n} processes: {problem}",
                     f"sizes whose product is {n} (the processes over all machines), with a shard or cp size > 1")


def _check_use_mpirun(value: bool, ctx: Context, f: str) -> None:
    if value:
        raise InputError(f, "not supported: the wizard does not write accelerate's mpirun_config, so the config "
                            "would start one CPU process", "no; for several CPU processes use --backend deepspeed "
                                                           "(DeepSpeed's CPU accelerator over gloo)")


def _check_class_names(value: str, ctx: Context, f: str) -> None:
    names = [n.strip() for n in value.split(",")]
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in names):
        raise InputError(f, f"{value!r} is not a comma-separated list of class names",
                         "Python class names such as LlamaDecoderLayer or MixtralSparseMoeBlock,Foo")


def _check_class_list(value: str, ctx: Context, f: str) -> str:
    _check_class_names(value, ctx, f)
    return ",".join(n.strip() for n in value.split(","))


def _check_non_negative(value: float, ctx: Context, f: str) -> None:
    if value < 0:
        raise InputError(f, f"{value} is negative", "a number >= 0 (0 turns clipping off)")


# ----------------------------------------------------------------------------- defaults that need a sentence

def _plan_gc(ctx: Context) -> bool:
    return bool(ctx.plan and ctx.plan.choice and ctx.plan.choice.gradient_checkpointing)


def _mixed_precision_default(ctx: Context) -> str:
    precision = ctx.plan.precision if ctx.plan is not None else _a(ctx, "precision", "auto")
    return {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")


def _mixed_precision_why(ctx: Context) -> str:
    value = _mixed_precision_default(ctx)
    if value == "no":
        return "The plan trains in fp32 (CPU processes, or you asked for fp32), so no mixed precision."
    return f"The plan's resolved precision is {value}; the memory figures assume it."


def _fsdp_reshard_default(ctx: Context) -> bool:
    r = ctx.plan.choice.fsdp_reshard if ctx.plan is not None and ctx.plan.choice is not None else None
    return True if r is None else bool(r)


def _fsdp_offload_default(ctx: Context) -> bool:
    c = ctx.plan.choice if ctx.plan is not None else None
    return bool(c and (c.offload_param != "none" or c.offload_optimizer != "none"))


def _layer_class_default(ctx: Context) -> str | None:
    return ctx.model.layer_class if ctx.model is not None else None


def _layer_class_why(ctx: Context) -> str:
    if _layer_class_default(ctx):
        return f"The model's decoder layer class is {_layer_class_default(ctx)}; one FSDP unit per layer."
    return ("No layer class known (no config was read): empty means accelerate wraps the model's "
            "own _no_split_modules.")


def _multinode_ds(ctx: Context) -> bool:
    return _is_deepspeed(ctx) and _multi_node(ctx)


def _hostfile_needed(ctx: Context) -> bool:
    return _multinode_ds(ctx) and _a(ctx, "deepspeed_multinode_launcher", "standard") != "standard"


_DYNAMO_CUSTOM = ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")


def _dynamo_custom(ctx: Context) -> bool:
    return bool(_a(ctx, "use_dynamo")) and bool(_a(ctx, "dynamo_customize"))


def _fsdp_sharding_default(ctx: Context) -> str:
    return "FULL_SHARD" if _fsdp_reshard_default(ctx) else "SHARD_GRAD_OP"


# ---- fp8

def _given_text(ctx: Context, key: str) -> str:
    raw = ctx.given.get(key)
    return "" if raw is None else str(raw).strip().lower()


def _fp8_backend_default(ctx: Context) -> str:
    """ao, accelerate config's first choice, where it is offered; else the backend that is."""
    offered = fp8.backends_for(ctx.hardware)
    return "ao" if "ao" in offered or not offered else offered[0]


def _ao_fp8_wanted(ctx: Context) -> bool:
    """fp8 through torchao was asked for (read from the given answers: fp8 is asked after FSDP's questions)."""
    if _given_text(ctx, "mixed_precision") != "fp8":
        return False
    return (_given_text(ctx, "fp8_backend") or _fp8_backend_default(ctx)) == "ao"


def _ram_efficient_why(ctx: Context) -> str:
    if _ao_fp8_wanted(ctx):
        return ("Off: accelerate refuses torchao's fp8 with it (the Accelerator raises at start); each process "
                "then loads the weights into CPU RAM itself.")
    return "On: N processes would otherwise each hold a full copy in CPU RAM."


def _mixed_precision_why_fp8(ctx: Context) -> str:
    text = _mixed_precision_why(ctx)
    if _fp8_problem(ctx) is not None or _mixed_precision_default(ctx) != "bf16":
        return text                     # fp8 runs beside bf16 (its autocast): said where bf16 is the plan's
    where = ("here, with " + " or ".join(fp8.NAMES[b] for b in fp8.backends_for(ctx.hardware))
             if fp8.is_this_machine(ctx.hardware) else
             "on these GPUs (with torchao or Transformer Engine installed where they train)")
    return (text + f" fp8 can run {where}: the large matmuls take fp8 inputs (bf16 elsewhere), faster where the "
            "matrices are big (hidden sizes in the thousands) and little or not at all for small models; its 3-4 "
            "mantissa bits are scaled per tensor, so compare the loss curve with a bf16 run. The plan's memory "
            "figures stay bf16's.")


def _fp8(ctx: Context) -> bool:
    return _a(ctx, "mixed_precision") == "fp8"


def _fp8_te(ctx: Context) -> bool:
    return _fp8(ctx) and _a(ctx, "fp8_backend") == "te"


def _fp8_ao(ctx: Context) -> bool:
    return _fp8(ctx) and _a(ctx, "fp8_backend") == "ao"


# ---- FSDP2's parallelism config

def _fsdp2(ctx: Context) -> bool:
    return _is_fsdp(ctx) and _fsdp_version(ctx) == 2


def _parallelism(ctx: Context) -> bool:
    # Unanswered (only where the table's conflict check asks "would another answer ask it?"): a given size says
    # yes, so --fsdp-version 1 or --backend ddp beside a size is a conflict, not a silently ignored answer.
    return _fsdp2(ctx) and bool(_a(ctx, "use_parallelism_config", _parallelism_given(ctx)))


def _parallelism_given(ctx: Context) -> bool:
    return any(ctx.given.get(k) is not None for k in SIZE_IDS + (CP_COMM_ID,))


def _plan_cp(ctx: Context) -> int:
    """The chosen rung's context-parallel size (1 when the plan did not choose context parallelism)."""
    choice = ctx.plan.choice if ctx.plan is not None else None
    return int(getattr(choice, "cp_size", 1) or 1) if choice is not None else 1


def _plan_replicate(ctx: Context) -> int:
    """The machines' replicas of the chosen rung: one per machine on the HSDP rung, else 1."""
    from wizard.planning.rungs import BY_KEY

    choice = ctx.plan.choice if ctx.plan is not None else None
    spec = BY_KEY.get(choice.key) if choice is not None else None
    return _num_machines(ctx) if spec is not None and spec.replicate else 1


def _parallelism_default(ctx: Context) -> bool:
    return _parallelism_given(ctx) or _plan_cp(ctx) > 1 or _plan_replicate(ctx) > 1


def _cp_default(ctx: Context) -> int:
    return _plan_cp(ctx)


def _cp_why(ctx: Context) -> str:
    cp = _plan_cp(ctx)
    if cp > 1:
        return (f"{cp}: the plan's rung splits each sequence over {cp} GPUs; nothing without it (or offload) fits "
                "the sequence.")
    return "1: the plan fits the sequence without splitting it."


def _plan_sp(ctx: Context) -> int:
    """The chosen rung's Ulysses size (1 when the plan did not choose sequence parallelism)."""
    choice = ctx.plan.choice if ctx.plan is not None else None
    return int(getattr(choice, "sp_size", 1) or 1) if choice is not None else 1


def _sp_why(ctx: Context) -> str:
    sp = _plan_sp(ctx)
    if sp > 1:
        return (f"{sp}: the plan's rung splits each sequence over {sp} GPUs (Ulysses); written with the rest data "
                "parallel, so replicate x shard x sp = the processes.")
    return "1: the plan fits the sequence without splitting it."


def _whole(raw, fallback: int) -> int:
    """A positive whole number from an answer or a raw given value; `fallback` for anything else (its own
    question refuses a bad value, with its own message)."""
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return fallback
    return value if value > 0 else fallback


def _num_processes(ctx: Context, answers: dict | None = None) -> int:
    world = ctx.plan.topology.world_size if ctx.plan is not None else 1
    return _whole((answers or ctx.answers).get("num_processes"), world)


def _shard_default(ctx: Context) -> int:
    """Every process that replicas, tensor and context parallelism leave: N / (replicate x tp x cp)."""
    others = (_whole(_a(ctx, SIZE_IDS[0]), 1) * _whole(ctx.given.get(SIZE_IDS[2]), 1)
              * _whole(ctx.given.get(SIZE_IDS[3]), _plan_cp(ctx)))
    return max(1, _num_processes(ctx) // others)


def _hsdp_note(ctx: Context) -> str:
    machines = _num_machines(ctx)
    n = _num_processes(ctx)
    per = max(1, n // machines)
    return (f"HSDP, replicate {machines} x shard {per}, keeps FSDP's all-gathers and reduce-scatters inside each "
            f"machine and sends only a gradient all-reduce between machines, often faster over slow links; but "
            f"each GPU then holds {machines} times its share of the sharded weights, gradients and optimizer "
            f"states; the plan sizes it as its HSDP rung, and it is not the default because another rung is "
            f"faster or it does not fit")


def _use_parallelism_why(ctx: Context) -> str:
    if _parallelism_given(ctx):
        return "On: you gave parallelism sizes."
    if _plan_cp(ctx) > 1:
        return f"On: the plan's rung is context parallel (cp {_plan_cp(ctx)})."
    if _plan_replicate(ctx) > 1:
        return f"On: the plan's rung is HSDP (a replica on each of the {_plan_replicate(ctx)} machines)."
    n = _num_processes(ctx)
    text = f"Off, accelerate's default: FSDP2 shards over all {n} processes, as the plan sized it"
    if _multi_node(ctx):
        return text + f". {_hsdp_note(ctx)}: turn this on and set the sizes to use it."
    return text + "; turn it on for tensor or context parallelism."


def _replicate_why(ctx: Context) -> str:
    if _plan_replicate(ctx) > 1:
        return (f"{_plan_replicate(ctx)}: the plan's rung is HSDP, a replica per machine sharded over its GPUs; only a "
                "gradient all-reduce crosses the network (the plan's note compares it with full sharding).")
    if _multi_node(ctx):
        return f"1, accelerate's default: FSDP over every process. {_hsdp_note(ctx)}."
    return "1: no replicas on one machine; every process shards (plain FSDP)."


def _shard_why(ctx: Context) -> str:
    return (f"{_shard_default(ctx)}: the {_num_processes(ctx)} processes divided by replicate x tp x cp, so every "
            "process not used otherwise shards (FSDP).")


DETAIL_QUESTIONS: tuple[Question, ...] = (
    # ---------------------------------------------------------------- details: processes
    _q("debug", "Check distributed operations for errors",
       "Catches mismatched collective calls that otherwise hang until the NCCL timeout, but slows training.",
       "bool", default=False, when=lambda ctx: _dist_type(ctx) != "NO",
       why="Off: it slows every step; turn it on to chase a hang.", **_details("processes")),
    _q("enable_cpu_affinity", "Pin processes to their GPU's CPUs (NUMA)",
       "Binds each process to the CPU cores nearest its GPU, which can speed data loading on multi-socket "
       "machines. NVIDIA only.", "bool", default=False,
       when=lambda ctx: _dist_type(ctx) in ("NO", "MULTI_GPU") and not _use_cpu(ctx),
       why=("Off, as in accelerate: the probe can't see the NUMA layout, and `accelerate launch` ignores "
            "this key in the YAML (only its --enable_cpu_affinity flag sets it)."),
       **_details("processes")),
    _q("use_mpirun", "Launch CPU processes with mpirun",
       "mpirun starts CPU processes on several hosts from one command, given a hostfile.", "bool",
       default=False, when=lambda ctx: _dist_type(ctx) == "MULTI_CPU", check=_check_use_mpirun,
       allowed="no (mpirun launching is not supported yet)",
       why="Off: torchrun starts the processes on this machine without MPI.", **_details("processes")),
    _q("mpirun_hostfile", "mpirun hostfile", "Lists the hosts (and slots) mpirun starts processes on.",
       "path", default=lambda ctx: os.path.expanduser("~/hostfile"),
       when=lambda ctx: _dist_type(ctx) == "MULTI_CPU" and bool(_a(ctx, "use_mpirun")),
       why="accelerate's default location.", **_details("processes")),

    # ---------------------------------------------------------------- details: compile
    _q("use_dynamo", "Compile with torch.compile (dynamo)",
       "Compiling fuses kernels and can speed training, but adds minutes at start-up and not every model "
       "compiles cleanly.", "bool", default=False,
       why="Off: get the run working first, then try compiling.", **_details("compile")),
    _q("dynamo_backend", "Compiler backend", "Which backend torch.compile hands the graph to; inductor is the "
       "one PyTorch develops and tests for training.", "choice", choices=DYNAMO_BACKENDS_OFFERED, default="INDUCTOR",
       when=lambda ctx: bool(_a(ctx, "use_dynamo")), why="inductor: PyTorch's default compiler.",
       **_details("compile")),
    _q("dynamo_customize", "Customise torch.compile options",
       "The mode, full-graph, dynamic-shape and regional options below; without them accelerate passes "
       "torch.compile's own defaults (and writes none of these keys).", "bool",
       default=lambda ctx: any(ctx.given.get(k) is not None for k in _DYNAMO_CUSTOM),
       when=lambda ctx: bool(_a(ctx, "use_dynamo")),
       why=lambda ctx: ("On: you gave one of the compile options." if any(
           ctx.given.get(k) is not None for k in _DYNAMO_CUSTOM) else "Off: torch.compile's defaults suit most models."),
       **_details("compile")),
    _q("dynamo_mode", "Compile mode", "reduce-overhead uses CUDA graphs (more memory), max-autotune searches "
       "for faster kernels (much longer compile).", "choice", choices=DYNAMO_MODES, default="default",
       when=_dynamo_custom, why="default: the fastest compile with most of the gain.",
       **_details("compile")),
    _q("dynamo_use_fullgraph", "Require one full graph",
       "Fails on any graph break instead of splitting the model into several compiled pieces.", "bool",
       default=False, when=_dynamo_custom,
       why="Off: graph breaks are common in model code and only cost some speed.", **_details("compile")),
    _q("dynamo_use_dynamic", "Dynamic shapes",
       "Compiles for varying sequence lengths instead of recompiling for each new shape.", "bool",
       default=False, when=_dynamo_custom,
       why="Off: with fixed-length (packed or padded) batches, static shapes compile faster code.",
       **_details("compile")),
    _q("dynamo_use_regional_compilation", "Regional compilation",
       "Compiles one repeated block (a decoder layer) and reuses it, cutting compile time a lot.", "bool",
       default=False, when=_dynamo_custom, why="Off, as in accelerate.",
       **_details("compile")),

    # ---------------------------------------------------------------- details: deepspeed
    _q("zero3_init_flag", "Build the model already sharded (zero.Init)",
       "With ZeRO-3, each layer is partitioned as it is created, so a model larger than one GPU (or than "
       "CPU RAM x processes) can be built at all.", "bool",
       default=lambda ctx: _chosen_zero_stage(ctx) == 3, when=_is_deepspeed,
       why=lambda ctx: ("On for ZeRO-3: otherwise every process first builds the full model in CPU RAM."
                        if _chosen_zero_stage(ctx) == 3 else
                        "Off: zero.Init only applies to ZeRO-3 (accelerate turns it off below stage 3)."),
       **_details("deepspeed")),
    _q("zero3_save_16bit_model", "Save a full 16-bit model with ZeRO-3",
       "ZeRO-3 scatters the weights over GPUs; this gathers them when saving so save_model writes usable "
       "weights instead of only sharded checkpoints.", "bool", default=True,
       when=lambda ctx: _is_deepspeed(ctx) and _chosen_zero_stage(ctx) == 3,
       why="On: without it, save_pretrained under ZeRO-3 writes no usable weights.", **_details("deepspeed")),
    _q("gradient_clipping", "Gradient clipping (max norm)",
       "Caps the gradient norm so one bad batch can't blow up training; 0 turns it off.", "float",
       default=1.0, check=_check_non_negative, when=_is_deepspeed,
       why=lambda ctx: ("1.0, the Trainer's max_grad_norm; with the HF Trainer ds_config.json says \"auto\" "
                        "and the Trainer's value is used." if _a(ctx, "trainer", "hf") == "hf" else
                        "1.0, the value most recipes use."),
       **_details("deepspeed")),
    _q("deepspeed_moe_layer_cls_names", "MoE layer classes (Mixture-of-Experts)",
       "For MoE models, names the expert block classes; ZeRO-3 then gathers each block as a whole, "
       "which avoids hangs when ranks route their tokens to different experts.", "str", metavar="CLASS[,CLASS]", check=_check_class_list,
       when=_is_deepspeed, advanced=True, why="None: the model is treated as dense.",
       stage="details", group="deepspeed"),

    # ---------------------------------------------------------------- details: multinode (DeepSpeed)
    _q("deepspeed_multinode_launcher", "DeepSpeed multi-node launcher",
       "How the processes on the other nodes are started: 'standard' runs torchrun on each node; pdsh, "
       "openmpi, mvapich, mpich and slurm start them all from the main node.", "choice",
       choices=DEEPSPEED_MULTINODE_LAUNCHERS, default="standard", when=_multinode_ds,
       why=("standard: torchrun on each node needs nothing else; pdsh (accelerate's default) needs "
            "passwordless ssh from the main node to every node and a hostfile."),
       **_details("multinode")),
    _q("deepspeed_hostfile", "DeepSpeed hostfile",
       "Lists every node as `hostname slots=<GPUs>`; the launcher reads it on the main node to start the others.",
       "path", default="/job/hostfile", when=_hostfile_needed,
       why="/job/hostfile is DeepSpeed's default location.", **_details("multinode")),
    _q("deepspeed_exclusion_filter", "Exclude hosts/GPUs",
       "DeepSpeed's --exclude filter, e.g. 'node1:0,1', to leave some hosts or GPUs out of the hostfile's set.",
       "str", advanced=True, when=_hostfile_needed, why="None: every host in the hostfile is used.",
       stage="details", group="multinode"),
    _q("deepspeed_inclusion_filter", "Include only these hosts/GPUs",
       "DeepSpeed's --include filter, e.g. 'node1@node2:0,1', to use only part of the hostfile.", "str",
       advanced=True, when=_hostfile_needed, why="None: every host in the hostfile is used.",
       stage="details", group="multinode"),

    # ---------------------------------------------------------------- details: fsdp
    _q("fsdp_version", "FSDP version",
       "FSDP2 (per-parameter sharding, DTensor) is the maintained one and what the plan models; FSDP1 is "
       "the older wrapper API.", "int", choices=(1, 2), default=2, metavar="1|2", when=_is_fsdp,
       why="2: accelerate's default and the one the plan's memory figures follow.", **_details("fsdp")),
    _q("fsdp_reshard_after_forward", "Reshard weights after forward",
       "On frees each layer's gathered weights after its forward pass (like ZeRO-3: less memory, more "
       "communication); off keeps them until backward (like ZeRO-2).", "bool",
       default=_fsdp_reshard_default, when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 2,
       why="The plan's choice; changing it changes the memory the plan computed.", **_details("fsdp")),
    _q("fsdp_sharding_strategy", "Sharding strategy (FSDP1)",
       "FULL_SHARD shards weights, gradients and optimizer state; SHARD_GRAD_OP keeps weights gathered "
       "between forward and backward; HYBRID_* shard within a node only.", "choice",
       choices=FSDP_SHARDING_STRATEGIES, default=_fsdp_sharding_default,
       when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 1,
       why="Follows the plan's resharding choice.", **_details("fsdp")),
    _q("fsdp_offload_params", "Offload parameters and gradients to CPU",
       "Keeps sharded weights and gradients in CPU RAM between uses: fits much larger models, much slower.",
       "bool", default=_fsdp_offload_default, when=_is_fsdp,
       why="The plan's choice: on only when no rung without offload fits.", **_details("fsdp")),
    _q("fsdp_auto_wrap_policy", "Auto-wrap policy",
       "Decides the units FSDP gathers one at a time; wrapping each transformer layer keeps only one "
       "layer's full weights on a GPU at once.", "choice", choices=FSDP_AUTO_WRAP_POLICIES,
       default="TRANSFORMER_BASED_WRAP", when=_is_fsdp,
       why="One unit per decoder layer: the usual choice for transformers.", **_details("fsdp")),
    _q("fsdp_transformer_layer_cls_to_wrap", "Layer classes to wrap",
       "The decoder layer class name(s), case-sensitive; a wrong name fails at start-up with 'Could not "
       "find the transformer layer class to wrap'.", "str", metavar="CLASS[,CLASS]",
       default=_layer_class_default, why=_layer_class_why, check=_check_class_list,
       when=lambda ctx: _is_fsdp(ctx) and _a(ctx, "fsdp_auto_wrap_policy") == "TRANSFORMER_BASED_WRAP",
       **_details("fsdp")),
    _q("fsdp_min_num_params", "Minimum parameters per wrapped unit",
       "With size-based wrapping, modules with at least this many parameters become their own FSDP unit.",
       "count", default=100_000_000, metavar="1e8",
       when=lambda ctx: _is_fsdp(ctx) and _a(ctx, "fsdp_auto_wrap_policy") == "SIZE_BASED_WRAP",
       why="1e8, accelerate's default.", **_details("fsdp")),
    _q("fsdp_backward_prefetch", "Backward prefetch (FSDP1)",
       "Fetches the next layer's weights during backward so communication overlaps compute.", "choice",
       choices=FSDP_BACKWARD_PREFETCH, default="BACKWARD_PRE",
       when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 1,
       why="BACKWARD_PRE: most overlap, accelerate's default.", **_details("fsdp")),
    _q("fsdp_state_dict_type", "Checkpoint format",
       "SHARDED_STATE_DICT has each rank write its own shard (fast, no full copy in memory); "
       "FULL_STATE_DICT gathers one file on rank 0.", "choice", choices=FSDP1_STATE_DICT_TYPES,
       options_for=lambda ctx: FSDP1_STATE_DICT_TYPES if _fsdp_version(ctx) == 1 else FSDP2_STATE_DICT_TYPES,
       default=lambda ctx: "FULL_STATE_DICT" if _fsdp_version(ctx) == 1 else "SHARDED_STATE_DICT",
       when=_is_fsdp, why=lambda ctx: "accelerate's default for FSDP%d." % _fsdp_version(ctx),
       **_details("fsdp")),
    _q("fsdp_forward_prefetch", "Forward prefetch (FSDP1)",
       "Fetches the next layer's weights during forward; helps CPU-bound steps, costs memory.", "bool",
       default=False, when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 1,
       why="Off, as in accelerate.", **_details("fsdp")),
    _q("fsdp_use_orig_params", "Keep original parameters (FSDP1)",
       "Lets the optimizer see the original parameters, needed for parameter groups and torch.compile.",
       "bool", default=True, when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 1,
       why="On, as in accelerate.", **_details("fsdp")),
    _q("fsdp_cpu_ram_efficient_loading", "CPU-RAM-efficient loading",
       "Only rank 0 loads the pretrained weights and sends them to the others, so a big model isn't "
       "loaded once per process into CPU RAM.", "bool", default=lambda ctx: not _ao_fp8_wanted(ctx), when=_is_fsdp,
       why=_ram_efficient_why, check=_check_ram_efficient_loading, help_default="on (off with fp8 through torchao)",
       **_details("fsdp")),
    _q("fsdp_sync_module_states", "Broadcast weights from rank 0 (FSDP1)",
       "Makes every rank start from rank 0's weights; needed when only rank 0 loaded them.", "bool",
       default=True,
       when=lambda ctx: _is_fsdp(ctx) and _fsdp_version(ctx) == 1 and not _a(ctx, "fsdp_cpu_ram_efficient_loading"),
       why="On, as in accelerate.", **_details("fsdp")),
    _q("fsdp_activation_checkpointing", "FSDP activation checkpointing",
       "Recomputes each wrapped layer's activations in backward; with FSDP use this instead of the "
       "Trainer's gradient_checkpointing, which would gather the weights twice.", "bool",
       default=_plan_gc, when=_is_fsdp,
       why=lambda ctx: ("On: the plan needs checkpointing to fit." if _plan_gc(ctx) else
                        "Off: the plan fits without recomputing activations."),
       **_details("fsdp")),

    # ---------------------------------------------------------------- details: parallelism (FSDP2)
    _q("use_parallelism_config", "Use a parallelism config",
       "FSDP2 can compose with replicas (HSDP), tensor and context parallelism over a device mesh; accelerate asks "
       "for the sizes of each dimension and the script's Accelerator builds the mesh from them.", "bool",
       default=_parallelism_default, when=_fsdp2, why=_use_parallelism_why,
       help_default="off (on when a size is given or the plan is context parallel)", **_details("parallelism")),
    _q(SIZE_IDS[0], "Data-parallel replicas (HSDP)",
       "Full copies of the sharded model: each replica shards over dp_shard_size processes and the replicas "
       "all-reduce their gradients (HSDP). More replicas mean more memory per GPU and less traffic per step.",
       "int", default=_plan_replicate, check=_positive, when=_parallelism, why=_replicate_why,
       help_default="the plan's (the machines on its HSDP rung, else 1)", **_details("parallelism")),
    _q(SIZE_IDS[1], "FSDP shard size",
       "Processes each replica's weights, gradients and optimizer states are sharded over.", "int",
       default=_shard_default, check=_positive, when=_parallelism, why=_shard_why,
       help_default="processes / (replicate x tp x cp)", **_details("parallelism")),
    _q(SIZE_IDS[2], "Tensor-parallel size",
       "Splits each layer's matmuls over this many GPUs (transformers' tp_plan for the model), for layers too "
       "big even when sharded; it communicates inside every layer, so keep it within one machine.", "int",
       default=1, check=_positive, when=_parallelism,
       why="1: the plan fits with sharding alone, and tensor parallelism needs the model loaded split over the "
           "tp mesh; the plan did not size it.", **_details("parallelism")),
    _q(SIZE_IDS[3], "Context-parallel size",
       "Splits every sequence over this many GPUs, so each holds 1/cp of the activations: for sequences whose "
       "activations do not fit. It needs SDPA attention and the steps inside accelerator.maybe_context_parallel "
       "(the HF Trainer does that).", "int", default=_cp_default, check=_check_cp_size, when=_parallelism,
       allowed="a whole number >= 1", why=_cp_why, help_default="the plan's (1 unless it is context parallel)",
       **_details("parallelism")),
    _q(CP_COMM_ID, "Context-parallel communication",
       "How the ranks exchange keys and values: allgather gathers them all at once per layer; alltoall passes "
       "them round the ranks in steps, overlapping compute (less memory for long sequences).", "choice",
       choices=PARALLELISM_CP_COMM_STRATEGIES, default="allgather",
       when=lambda ctx: _parallelism(ctx) and int(_a(ctx, SIZE_IDS[3]) or 1) > 1,
       why="allgather, accelerate's default.", **_details("parallelism")),

    _q(SP_SIZE_ID, "Sequence-parallel size (DeepSpeed Ulysses)",
       "Splits every sequence over this many GPUs: each runs 1/sp of its tokens through every layer and, between two "
       "all-to-alls per layer, attention over all of them for heads/sp heads (DeepSpeed's ALST). For sequences whose "
       "activations and logits do not fit; it needs SDPA or flash attention and a head count it divides, and the HF "
       "Trainer and TRL do the rest (a custom loop: the lines the files' notes give).", "int", default=_plan_sp,
       check=_check_sp_size, when=lambda ctx: _is_deepspeed(ctx) and not _use_cpu(ctx), allowed="a whole number >= 1",
       why=_sp_why, help_default="the plan's (1 unless it is sequence parallel)", **_details("parallelism")),

    # ---------------------------------------------------------------- details: precision
    _q("mixed_precision", "Mixed precision",
       "What accelerate autocasts to; it must match the precision the plan assumed or memory and speed "
       "will differ. fp8 is offered where it runs: GPUs of compute capability 8.9+ and torchao or Transformer "
       "Engine installed.", "choice", choices=MIXED_PRECISIONS, default=_mixed_precision_default,
       why=_mixed_precision_why_fp8, check=_check_mixed_precision, options_for=_mixed_precision_options,
       why_not=_mixed_precision_why_not,
       # With a DeepSpeed config file accelerate neither asks nor accepts it: precision lives in the JSON.
       when=lambda ctx: not _is_deepspeed(ctx), **_details("precision")),
    _q("fp8_backend", "fp8 backend",
       "ao: torchao swaps the Linear layers for Float8Linear (with FSDP2 it can all-gather weights in fp8); te: "
       "NVIDIA Transformer Engine's recipe with delayed scaling (its own layers get fp8, others stay bf16). "
       "accelerate 1.16 has no third (MS-AMP is gone).", "choice", choices=FP8_BACKENDS,
       default=_fp8_backend_default, when=_fp8,
       options_for=lambda ctx: fp8.backends_for(ctx.hardware) or FP8_BACKENDS,
       why_not=lambda value, ctx: fp8.backend_problem(ctx.hardware, value),
       why=lambda ctx: ("ao, accelerate config's first choice: torchao converts a plain transformers model "
                        "without code changes." if _fp8_backend_default(ctx) == "ao" else
                        "te: the backend installed here."),
       help_default="ao (te when only Transformer Engine is installed here)", **_details("precision")),
    _q("fp8_use_autocast_during_eval", "fp8 during evaluation (TE)",
       "Runs evaluation in fp8 as well; metrics are usually better in bf16.", "bool", default=False, when=_fp8_te,
       why="Off, accelerate's default: evaluate in bf16.", **_details("precision")),
    _q("fp8_margin", "Scaling margin (TE)",
       "Backs the scaling factor off by 2^margin to leave headroom against overflow.", "int", default=0,
       check=_at_least(0), when=_fp8_te, why="0, accelerate's and Transformer Engine's default.",
       **_details("precision")),
    _q("fp8_interval", "Scaling interval (TE)",
       "Steps between recomputations of the scaling factors.", "int", default=1, check=_positive, when=_fp8_te,
       why="1, accelerate's default: every step.", **_details("precision")),
    _q("fp8_format", "fp8 format (TE)",
       "HYBRID uses E4M3 (more precision) forward and E5M2 (more range) for gradients; E4M3 or E5M2 use one "
       "format throughout.", "choice", choices=FP8_FORMATS, default="HYBRID", when=_fp8_te,
       why="HYBRID, accelerate's default and the usual choice for training.", **_details("precision")),
    _q("fp8_amax_history_len", "amax history length (TE)",
       "How many steps of absolute maxima the scaling factor is computed from.", "int", default=1024,
       check=_positive, when=_fp8_te, why="1024, accelerate's default.", **_details("precision")),
    _q("fp8_amax_compute_algo", "amax algorithm (TE)",
       "max takes the largest of the history, most_recent the last step's.", "choice",
       choices=FP8_AMAX_COMPUTE_ALGOS, default="most_recent", when=_fp8_te,
       why=("most_recent: the default of accelerate's TE recipe, and what a file from `accelerate config` runs "
            "with: its prompt offers max first but writes amax_compute_algorithm, a key `accelerate launch` never "
            "reads (the wizard writes amax_compute_algo, which it does)."), **_details("precision")),
    _q("fp8_override_linear_precision", "Some GEMMs in higher precision (TE)",
       "Runs the forward (fprop), input-gradient (dgrad) or weight-gradient (wgrad) matmuls in bf16 instead of "
       "fp8, for stability at a cost in speed.", "bool", default=False, when=_fp8_te,
       why="Off, accelerate's default: every matmul in fp8.", **_details("precision")),
    *(_q(f"fp8_override_{gemm}", f"{gemm} in higher precision (TE)",
         f"Runs the {what} matmuls in bf16 instead of fp8: steadier, slower.", "bool", default=False,
         when=lambda ctx: _fp8_te(ctx) and bool(_a(ctx, "fp8_override_linear_precision")),
         why="Off, accelerate's default.", **_details("precision"))
      for gemm, what in (("fprop", "forward"), ("dgrad", "input-gradient"), ("wgrad", "weight-gradient"))),
    _q("fp8_enable_fsdp_float8_all_gather", "All-gather weights in fp8 (torchao, FSDP2)",
       "With FSDP2, casts each weight shard to fp8 before its all-gather: half of bf16's bytes on the wire. "
       "Without FSDP2 it changes nothing.", "bool", default=True, when=_fp8_ao,
       why="On, accelerate's default.", **_details("precision")),
    _q("fp8_pad_inner_dim", "Pad matmul dimensions (torchao)",
       "torch._scaled_mm needs dimensions divisible by 16; padding lets any model run, at some memory.", "bool",
       default=True, when=_fp8_ao, why="On, accelerate's default: without it a model with odd sizes fails.",
       **_details("precision")),
)
