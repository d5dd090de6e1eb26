"""Evaluating a rung: the resolved inputs (_Inputs) and one rung's per-GPU, host and NVMe bytes, and whether it fits.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from wizard.planning import calibration as calibration_mod
from wizard.planning import rungs as rung_table
from wizard.planning import speed as speed_mod
from wizard.planning.rungs import RungSpec
from wizard.planning.plan_types import Rung
from wizard.sizing import memory as mem
from wizard.sizing import sequence as seqmem
from wizard.units import fmt_bytes, fmt_bytes_apart


@dataclass(frozen=True)
class CodeOptions:
    """ALST's options that need lines in the training script (off unless --allow-code-changes): DeepSpeed's TiledMLP
    and the activation checkpoints offloaded to host RAM. A rung switches them on like gradient checkpointing, only
    where it does not fit without them (_evaluate)."""

    checkpoint_offload: bool = False
    tiled_mlp: bool = False

    @property
    def any(self) -> bool:
        return self.checkpoint_offload or self.tiled_mlp


NO_CODE = CodeOptions()


def code_of(rung: Rung) -> CodeOptions:
    """The code options an evaluated rung runs with."""
    return CodeOptions(checkpoint_offload=rung.checkpoint_offload, tiled_mlp=rung.tiled_mlp)
# What a DeepSpeed rung tries, in order, when it does not fit with gradient checkpointing and code changes are
# allowed: the offload first (at long sequences its PCIe traffic hides behind the attention's compute), then the
# tiled MLP (one more forward of every MLP), then both (ALST's Table 1: 2.4M with the offload, 1.2M with the tiled
# MLP, 3.7M with both on 8 x H100, from 1.1M).
CODE_STEPS = (CodeOptions(checkpoint_offload=True), CodeOptions(tiled_mlp=True),
              CodeOptions(checkpoint_offload=True, tiled_mlp=True))


# --- Evaluating a rung ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Inputs:
    """Everything the arithmetic needs, resolved and validated once per plan."""

    params: int
    largest_layer: int
    hidden: int
    layers: int
    heads: int
    vocab: int
    ffn: int
    kv_heads: int
    experts_per_token: int
    profile: mem.LayerProfile            # what a layer of this model family saves for backward
    stack: mem.LayerStack                # the layers as the activation arithmetic sees them
    weights_bytes: int                   # bytes per weight of the checkpoint as transformers loads it
    matmul_params: int                   # parameters that go through a matmul (autocast copies them)
    head_params: int                     # the LM head's (output embedding's) parameters
    layer_params: int
    root_params: int
    seq: int
    batch: int
    precision: str
    optimizer: str
    flash: bool
    per_machine: int
    machines: int
    cpu: bool
    context: int
    capacity: int
    usable: int
    headroom: float
    ram: int | None                  # host RAM per machine; None when unknown
    nvme_path: str | None
    nvme_free: int | None
    grad_accum: int = 1
    active_params: int = 0               # what one token's matmuls run through (speed.matmul_params: MoE active)
    machine: speed_mod.Machine | None = None
    adapters: Any = None                 # wizard.sizing.lora.AdapterShape for LoRA / QLoRA; None for full fine-tuning
    task: str = "causal-lm"              # the head: what its output (the logits) is per sample
    num_labels: int = 0
    lora_dropout: float = 0.0
    calibration: Any = None              # calibration.Calibration for this machine (None: the raw model)
    fsdp_version: int = 2
    fsdp1_retains_checkpoints: bool = False   # FSDP rungs: memory.fsdp1_retained_checkpoint_bytes applies
    loss: str = "full"                   # how a causal LM's loss is computed (sequence.LOSSES), resolved
    code_changes: bool = False           # --allow-code-changes: ALST's TiledMLP and checkpoint offload may be used

    def but(self, **changes) -> "_Inputs":
        """A copy with these fields changed: dataclasses.replace without its __init__ call, which the plan's
        searches made about half of a plan's time (thousands of copies of these 45 fields; there is no
        __post_init__ to run)."""
        if not changes.keys() <= _INPUT_FIELDS:
            raise TypeError(f"_Inputs has no field {sorted(changes.keys() - _INPUT_FIELDS)}")
        new = object.__new__(_Inputs)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def ratios(self, rung_key: str) -> calibration_mod.Ratios | None:
        """`wizard tune`'s ratios for this rung and method on this machine, or None."""
        if self.calibration is None:
            return None
        return self.calibration.ratios(rung_key, self.adapters.method if self.adapters is not None else "full")

    @property
    def world(self) -> int:
        return self.per_machine * self.machines

    @property
    def unit(self) -> str:
        return "process" if self.cpu else "GPU"


_INPUT_FIELDS = frozenset(f.name for f in fields(_Inputs))


def _rung_optimizer(spec: RungSpec, x: _Inputs) -> str:
    """The optimizer that really runs on this rung: DeepSpeed optimizer offload runs DeepSpeedCPUAdam, never
    8-bit AdamW (memory.optimizer_for_rung)."""
    if spec.backend != "deepspeed":
        return x.optimizer
    return mem.optimizer_for_rung(x.optimizer, spec.offload_optimizer != "none")


def _adapter_strategy(spec: RungSpec) -> str:
    return spec.backend if spec.memory == "replicated" else spec.memory


def _states(spec: RungSpec, x: _Inputs) -> mem.ModelStates:
    """The model states of the rung's memory family (rungs.RungSpec.memory). HSDP shards within a machine only:
    its states are one machine's FSDP (each machine holds a whole replica)."""
    if spec.replicate:
        x = x.but(machines=1)
    if x.adapters is not None:
        from wizard.sizing import lora
        return lora.adapter_model_states(x.adapters, _adapter_strategy(spec), x.precision, x.optimizer,
                                         x.per_machine, x.machines, largest_frozen_layer_params=x.largest_layer,
                                         offload_optimizer=spec.offload_optimizer == "cpu",
                                         offload_param=spec.offload_param == "cpu",
                                         reshard=spec.fsdp_reshard is not False,
                                         kbit_prepared=x.adapters.kbit_prepared)
    family = spec.memory
    if family == "replicated":
        return mem.states_single_or_ddp(x.params, x.precision, x.optimizer, x.per_machine)
    if family == "fsdp":
        return mem.states_fsdp(x.params, x.precision, x.optimizer, x.per_machine, x.machines,
                               reshard=bool(spec.fsdp_reshard), offload=spec.offloads)
    optimizer = _rung_optimizer(spec, x)
    if family in ("zero1", "zero2"):
        states_of = mem.states_zero1 if family == "zero1" else mem.states_zero2
        return states_of(x.params, x.precision, optimizer, x.per_machine, x.machines,
                         offload_optimizer=spec.offload_optimizer == "cpu")
    if family == "nvme":
        return mem.states_zero3_nvme(x.params, x.largest_layer, x.precision, optimizer, x.per_machine, x.machines)
    return mem.states_zero3(x.params, x.largest_layer, x.precision, optimizer, x.per_machine, x.machines,
                            offload_optimizer=spec.offload_optimizer == "cpu",
                            offload_param=spec.offload_param == "cpu")


def _buffers(spec: RungSpec, x: _Inputs, freed_before_step: int = 0) -> int:
    """Framework buffers. `freed_before_step`: the activations and logits at the backward's peak, gone when the
    optimizer steps (ZeRO-3's step-time fp32 gradients are counted against them, memory.zero3_buffers)."""
    if spec.backend == "single":
        return 0
    if spec.backend == "ddp":
        # DDP buckets only parameters that require grad (torch's _build_params_for_reducer): the adapters' for LoRA.
        return mem.ddp_buffers(x.params if x.adapters is None else x.adapters.trainable_params, x.precision)
    if spec.backend == "fsdp":
        if x.adapters is not None:
            from wizard.sizing import lora
            return lora.adapter_fsdp_buffers(x.adapters, x.layers, x.root_params, x.precision,
                                             bool(spec.fsdp_reshard))
        return mem.fsdp_buffers(x.layer_params, x.root_params, x.precision, bool(spec.fsdp_reshard))
    if spec.zero_stage in (1, 2):
        return mem.zero12_buffers(x.hidden, spec.zero_stage, x.precision)
    trained = x.params if x.adapters is None else x.adapters.trainable_params
    offload_param = spec.offload_param != "none"
    step = mem.zero3_step_bytes(trained, x.world, x.precision, offload_optimizer=spec.offload_optimizer != "none")
    return mem.zero3_buffers(x.params, x.hidden, x.precision, x.world, offload_param=offload_param,
                             step_bytes=step, freed_before_step=freed_before_step)


@dataclass
class _Estimate:
    breakdown: dict[str, int]
    per_gpu: int
    cpu: int
    nvme: int
    load: int = 0                       # per GPU while the model loads, when that is a moment of its own

    @property
    def model_states(self) -> int:
        b = self.breakdown
        return b["parameters"] + b["gradients"] + b["optimizer"]

    @property
    def fixed(self) -> int:
        """What gradient checkpointing cannot shrink: model states, buffers and context."""
        b = self.breakdown
        return self.model_states + b["buffers"] + b["context"] + b.get("autocast", 0)


def _loader(spec: RungSpec, x: _Inputs) -> str:
    """Which processes load the pretrained weights into host RAM (memory.load_host_bytes)."""
    if x.adapters is not None and x.adapters.method == "qlora" and not x.cpu and spec.memory in ("zero3", "fsdp"):
        return "device"                 # quantised models skip zero.Init and FSDP's meta loading (qlora_load_gpu_bytes)
    if spec.backend == "fsdp":
        return "local-rank0"            # fsdp_cpu_ram_efficient_loading, the wizard's default
    if spec.backend == "deepspeed" and spec.zero_stage == 3:
        return "rank0"                  # zero.Init: global rank 0 reads the state dict, the rest stay on meta
    if x.adapters is not None and x.adapters.method == "qlora" and not x.cpu:
        return "device"                 # bitsandbytes loads each tensor straight to the rank's GPU
    return "every"


def _host_ram(spec: RungSpec, x: _Inputs, states: mem.ModelStates, checkpoints: int = 0) -> int:
    """Host RAM per machine: the larger of loading the checkpoint and the states an offload rung keeps
    there (they happen one after the other: the weights are loaded before the optimizer exists), plus the
    activation checkpoints ALST's offload keeps there during the step (`checkpoints`)."""
    load = mem.load_host_bytes(x.params, x.weights_bytes, x.per_machine, _loader(spec, x),
                               largest_module_params=max(x.largest_layer, x.vocab * x.hidden))
    offloaded = mem.offloaded_host_bytes(states, x.params, x.precision, _rung_optimizer(spec, x), x.machines,
                                         spec.zero_stage,
                                         spec.offload_optimizer != "none", spec.offload_param != "none")
    return max(load, offloaded + checkpoints)


def _autocast(spec: RungSpec, x: _Inputs, gc: bool) -> int:
    if spec.backend not in ("single", "ddp") or x.cpu:
        return 0                        # ZeRO and FSDP run 16-bit weights; CPU processes train in what they load
    if x.adapters is not None:
        # Only fp32 weights get an autocast copy: the adapters (peft keeps them fp32 over a 16-bit base) and,
        # for QLoRA, the LM head that prepare_model_for_kbit_training casts to fp32.
        if x.precision == "fp32":
            return 0
        fp32 = x.adapters.trainable_params + (x.head_params if x.adapters.method == "qlora" else 0)
        return mem.working_bytes(x.precision) * fp32
    return mem.autocast_weight_bytes(x.matmul_params, x.layer_params, x.head_params, x.precision, gc)


def _estimate(spec: RungSpec, x: _Inputs, gc: bool, code: CodeOptions = NO_CODE) -> _Estimate:
    states = _states(spec, x)
    precision = _activation_precision(spec, x)
    full_seq = x.seq
    if spec.splits_sequence:
        # Context or sequence parallelism: each GPU runs 1/cp (1/sp) of every sequence (its activations and its
        # logits); the model states are FSDP's over every process (accelerate shards over dp_shard x cp), or ZeRO's
        # over every process (DeepSpeed partitions over its sequence-data-parallel group, all of them).
        x = x.but(seq=x.seq // spec.seq_shards)
    offload_checkpoints = code.checkpoint_offload and gc
    if spec.sp_size > 1 or code.any:
        kept, recomputed = seqmem.layer_parts(x.stack, x.seq, x.batch, x.flash, gc, precision,
                                              tiled_mlp=code.tiled_mlp, sp=spec.sp_size,
                                              checkpoint_offload=offload_checkpoints)
    else:
        kept, recomputed = mem.stack_activation_parts(x.stack, x.seq, x.batch, x.flash, gc, precision)
    if x.adapters is not None:
        adapters = _adapter_activation_bytes(x, gc)     # one recomputed layer's worth under checkpointing
        if gc:
            recomputed += adapters
        else:
            kept += adapters
    if gc and spec.backend == "fsdp" and x.fsdp1_retains_checkpoints:
        recomputed += mem.fsdp1_retained_checkpoint_bytes(x.seq * x.batch, x.hidden, x.layers, precision)
    if spec.cp_size > 1:
        kv = seqmem.context_parallel_kv_bytes(full_seq, x.batch, x.kv_heads * (x.hidden // max(x.heads, 1)), precision)
        if gc:
            recomputed += kv
        else:
            kept += kv
    logits = _head_output_bytes(x)
    activations = mem.peak_activation_bytes(kept, recomputed, logits)
    buffers = _buffers(spec, x, activations + logits)
    autocast = _autocast(spec, x, gc)
    margin = mem.margin_bytes(states.gpu + autocast + activations + logits + buffers)
    breakdown = {
        "parameters": states.parameters, "gradients": states.gradients, "optimizer": states.optimizer,
        "autocast": autocast, "activations": activations, "logits": logits, "buffers": buffers,
        "context": x.context, "margin": margin,
    }
    # A measured peak above the model's raises the estimate, at every micro-batch, before anything is fitted;
    # the excess is shown as margin (what the model did not account for). Never lowered (Ratios.memory_applied).
    ratios = x.ratios(spec.key)
    if ratios is not None and ratios.memory_applied > 1:
        breakdown["margin"] += round(sum(breakdown.values()) * (ratios.memory_applied - 1))
    checkpoints = (seqmem.checkpoint_offload_host_bytes(x.seq, x.batch, x.hidden, x.layers, precision, x.per_machine)
                   if offload_checkpoints else 0)
    # CPU processes: everything is already host RAM inside the per-process figure.
    return _Estimate(breakdown, sum(breakdown.values()), 0 if x.cpu else _host_ram(spec, x, states, checkpoints),
                     states.nvme, _load_bytes(spec, x))


def _activation_precision(spec: RungSpec, x: _Inputs) -> str:
    """The dtype of the residual stream and of most activations: the compute dtype, except for QLoRA under
    torch AMP (one GPU, DDP), where prepare_model_for_kbit_training (which the snippet calls there,
    snippets.kbit_prepared) casts the embeddings and every norm to fp32. The embeddings' output and each
    RMSNorm's (weight * x) are then fp32, bitsandbytes' Linear4bit returns its input's dtype (out.to(inp_dtype)),
    so the residual stream, every checkpointed layer input and the MLP's intermediates are fp32 under autocast.
    MEASURED (CPU, bitsandbytes 0.50.2, peft 0.21.2, transformers 5.24, tiny Llama, bf16 autocast): every
    decoder layer's input is fp32. DeepSpeed ZeRO-1/2 cast every floating parameter back to the compute dtype
    (lora.adapter_model_states), and sharded QLoRA (FSDP, ZeRO-3) skips the call: 16-bit there."""
    if (x.adapters is not None and x.adapters.method == "qlora" and x.adapters.kbit_prepared and not x.cpu
            and spec.backend in ("single", "ddp") and x.precision in ("bf16", "fp16")):
        return "fp32"
    return x.precision


def _load_bytes(spec: RungSpec, x: _Inputs) -> int:
    """Per GPU while loading, where that exceeds nothing else the rung counts: QLoRA on a rung that shards the
    weights quantises the whole model onto every GPU first (lora.qlora_load_gpu_bytes), plus the CUDA context.
    0 elsewhere (the steady state is the peak)."""
    if x.adapters is None or x.cpu or spec.memory not in ("zero3", "fsdp"):
        return 0
    from wizard.sizing import lora
    whole = lora.qlora_load_gpu_bytes(x.adapters, x.precision)
    return whole + x.context if whole else 0


def _head_output_bytes(x: _Inputs) -> int:
    """The head's output and its loss at their peak (memory.logits_bytes per element): a language model's
    vocabulary per token; a sequence classifier's num_labels per sample (the pooled first token); a token
    classifier's num_labels per token; extractive QA's start and end logits per token; a bare model none."""
    labels = max(x.num_labels, 1)
    width, tokens = {"sequence-classification": (labels, 1), "token-classification": (labels, x.seq),
                     "question-answering": (2, x.seq), "base": (0, 0)}.get(x.task, (x.vocab, x.seq))
    if x.task == "causal-lm" and x.loss != "full":
        # a fused / tiled loss over the LM head (sequence.loss_bytes): the plan's --loss
        return seqmem.loss_bytes(x.loss, x.seq, x.batch, x.vocab, x.hidden, x.precision)
    return mem.logits_bytes(tokens, x.batch, width, x.precision)


# Adapted modules whose input is the MLP's intermediate activation rather than the hidden state.
_FFN_INPUT_MODULES = frozenset({"down_proj", "w2", "fc2", "dense_4h_to_h", "wo", "c_proj"})


def _adapter_activation_bytes(x: _Inputs, gc: bool) -> int:
    """What LoRA changes in the activations: what its adapters save, less what a frozen base does not save.
    Under gradient checkpointing only one layer's worth is alive (the layer being recomputed).

    Adapters (peft tuners/lora/layer.py; MEASURED, torch 2.13, transformers Llama, CPU, saved_tensors_hooks,
    exact to the byte): peft keeps the adapters in fp32 over a 16-bit base (autocast_adapter_dtype) and casts
    their input to it, so each adapter keeps an fp32 copy of its input (4 B; with dropout > 0 the dropout's
    output, plus the mask: 1 B on CUDA's fused dropout) and lora_A's fp32 r-wide output for lora_B.
    Frozen base (LoRA, not QLoRA): memory.frozen_base_unsaved_bytes_per_token. Without it the plan counted the
    inputs of frozen linears as saved, over-estimating LoRA by 1.2 GiB for Llama-2-7B at 2 x 512 tokens
    (bench/results/memory-model.md, litgpt-hub-llama-2-7b-lora-mb2-s512-1xA10G) and planning LoRA runs that
    fit on 24 GB cards as not fitting. QLoRA keeps the full-model count: bitsandbytes' MatMul4Bit saved its
    input on ctx up to the 0.4x releases, and the fit half's QLoRA rows are already under-predicted by 7-8 %.
    """
    adapter_dtype = 4
    per_token = 0
    for name, count in x.adapters.modules_per_target.items():
        width = x.ffn if name in _FFN_INPUT_MODULES else x.hidden
        per_token += count * ((adapter_dtype + (1 if x.lora_dropout > 0 else 0)) * width
                              + adapter_dtype * x.adapters.rank)
    layers = max(x.layers, 1)
    if x.adapters.method == "lora":
        per_token -= layers * mem.frozen_base_unsaved_bytes_per_token(
            x.hidden, x.ffn, x.flash, x.precision, x.profile, x.experts_per_token)
    total = per_token * x.seq * x.batch
    return total // layers if gc else total


def _problems(spec: RungSpec, est: _Estimate, x: _Inputs) -> list[str]:
    """Why this estimate does not fit, as clauses; empty when it fits."""
    out = []
    if est.per_gpu > x.usable:
        out.append(f"needs {fmt_bytes(est.per_gpu)} per {x.unit} (model states {fmt_bytes(est.model_states)}) "
                   f"but {fmt_bytes(x.usable)} is usable ({_capacity_text(x)})")
    if est.load > x.usable:
        out.append(f"needs {fmt_bytes(est.load)} per {x.unit} while loading, before it shards the weights "
                   f"(bitsandbytes quantises the whole model onto every GPU) but {fmt_bytes(x.usable)} is usable")
    if x.ram is not None and est.cpu > x.ram:
        need, have = fmt_bytes_apart(est.cpu, x.ram)
        out.append(f"needs {need} of host RAM per machine but {have} is available")
    if spec.uses_nvme:
        if not x.nvme_path:
            out.append("needs an NVMe path for offload (--nvme-path) and none was given")
        elif x.nvme_free is not None and est.nvme > x.nvme_free:
            out.append(f"needs {fmt_bytes(est.nvme)} on NVMe at {x.nvme_path} but {fmt_bytes(x.nvme_free)} is free")
    return out


def _capacity_text(x: _Inputs) -> str:
    pct = f"{x.headroom * 100:g}%"
    if x.cpu:
        return f"{fmt_bytes(x.capacity * x.per_machine)} RAM / {x.per_machine} processes - {pct} headroom"
    return f"{fmt_bytes(x.capacity)} - {pct} headroom"


def code_words(code: CodeOptions) -> str:
    """"checkpoints offloaded to the CPU and the MLP tiled": the code options a rung runs with, in words."""
    parts = (["checkpoints offloaded to the CPU"] if code.checkpoint_offload else []) + \
        (["the MLP tiled"] if code.tiled_mlp else [])
    return " and ".join(parts)


def _with_code(spec: RungSpec, x: _Inputs, est: _Estimate, gc: bool) -> tuple[_Estimate, CodeOptions]:
    """A DeepSpeed rung that does not fit with gradient checkpointing, where code changes are allowed: the first of
    CODE_STEPS that fits, else the last (the most saving); unchanged elsewhere. Only the activations shrink, so
    nothing is tried where the model states alone do not fit."""
    if not (gc and x.code_changes and spec.backend == "deepspeed" and not x.cpu) or not _problems(spec, est, x) \
            or est.fixed > x.usable:
        return est, NO_CODE
    for code in CODE_STEPS:
        trial = _estimate(spec, x, True, code)
        if not _problems(spec, trial, x):
            break
    return trial, code


def _evaluate(spec: RungSpec, x: _Inputs, gc_mode: str) -> tuple[Rung, int | None]:
    """The rung with its breakdown and fit; also its per-GPU bytes without GC when GC was switched on."""
    gc = gc_mode == "on"
    est = _estimate(spec, x, gc)
    without_gc = None
    if gc_mode == "auto" and est.per_gpu > x.usable and est.fixed <= x.usable:
        # Model states fit but the total does not: activations are the problem, so checkpoint them.
        without_gc, gc = est.per_gpu, True
        est = _estimate(spec, x, True)
    est, code = _with_code(spec, x, est, gc)
    name = "Single process" if x.cpu and spec.key == "single" else spec.label
    # Like with like: a rung that runs without GC also says what it needs with it, as the rungs that switched
    # it on do (their reason gives the figure without it).
    with_gc = _estimate(spec, x, True).per_gpu if gc_mode == "auto" and not gc else None
    rung = Rung(key=spec.key, name=name, backend=spec.backend, zero_stage=spec.zero_stage,
                offload_optimizer=spec.offload_optimizer, offload_param=spec.offload_param,
                fsdp_reshard=spec.fsdp_reshard, gradient_checkpointing=gc, per_gpu_bytes=est.per_gpu,
                cpu_bytes=est.cpu, nvme_bytes=est.nvme, breakdown=est.breakdown, load_bytes=est.load,
                why=rung_table.why(spec.key, x.world), per_gpu_bytes_gc=with_gc, cp_size=spec.cp_size,
                sp_size=spec.sp_size, checkpoint_offload=code.checkpoint_offload, tiled_mlp=code.tiled_mlp)
    ratios = x.ratios(spec.key)
    if ratios is not None:
        extra = 0 if ratios.memory_applied <= 1 else est.per_gpu - _estimate(spec, replace(x, calibration=None),
                                                                             gc, code).per_gpu
        rung.calibration = {"speed_ratio": ratios.speed, "memory_ratio": ratios.memory, "memory_bytes": extra,
                            "trials": ratios.trials, "date": calibration_mod.date_of(ratios.updated),
                            "model": ratios.model}
    problems = _problems(spec, est, x)
    rung.fits = not problems
    if problems:
        gc_text = " even with gradient checkpointing" if without_gc is not None or (gc and code.any) else ""
        if code.any:
            gc_text += f" and {code_words(code)}"
        first = problems[0]
        if gc_text and first.startswith("needs ") and " per " in first and "while loading" not in first:
            first = first.replace(f" per {x.unit} ", f" per {x.unit}{gc_text} ", 1)
        rung.reason = _sentence("; and ".join([first] + problems[1:]))
    return rung, without_gc


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."
