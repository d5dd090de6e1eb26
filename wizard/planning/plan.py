"""The ladder: cheapest strategy that fits, with the per-GPU arithmetic of every rung.

Pure: takes Hardware, ModelShape and options, returns a Plan. Formulas live in memory.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from wizard.errors import InputError
from wizard.planning import calibration as calibration_mod
from wizard.planning import rungs as rung_table
from wizard.planning import speed as speed_mod
from wizard.planning.rungs import BY_KEY, RungSpec
from wizard.sizing import memory as mem
from wizard.units import GiB, fmt_bytes, fmt_bytes_apart, fmt_duration

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GC_MODES = ("auto", "on", "off")
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd", "adafactor")
ATTENTIONS = ("auto", "flash", "sdpa", "eager")
TRAINERS = ("hf", "accelerate")
BACKENDS = ("auto", "ddp", "deepspeed", "fsdp")
ZERO_STAGES = ("auto", "1", "2", "3")
OFFLOADS = ("auto", "none", "cpu", "nvme")
METHODS = ("full", "lora", "qlora")
# Keeping more than 90 % of a GPU free is a typo, not a plan: one rule for the flag and for make_plan.
MAX_HEADROOM = 0.9
HEADROOM_ALLOWED = f"a fraction 0 <= x < {MAX_HEADROOM}, such as 0.10 or 10%"

# Names of the breakdown components, in the order the UI stacks them.
COMPONENTS = ("parameters", "gradients", "optimizer", "autocast", "activations", "logits", "buffers", "context",
              "margin")


@dataclass
class TrainingOptions:
    seq_len: int = 2048
    micro_batch: int = 1                  # per device
    grad_accum: int = 1
    precision: str = "auto"               # auto: bf16 where every GPU supports it, else fp16 (fp32 on CPU)
    gradient_checkpointing: str = "auto"
    optimizer: str = "adamw"
    attention: str = "auto"
    trainer: str = "hf"                   # hf: Trainer fills every "auto"; accelerate: own loop
    global_batch: int | None = None       # target for the batch-split advice; None: micro x accum x world
    train_tokens: int | None = None       # tokens the run will train on, for the time to train
    dataset_tokens: int | None = None     # with epochs: train_tokens = dataset_tokens x epochs
    epochs: float | None = None
    method: str = "full"                  # full | lora | qlora
    lora_rank: int = 16
    lora_alpha: int | None = None         # None: 2 x rank
    lora_targets: str | None = None       # None: peft's default for the architecture; "all-linear"; names
    lora_dropout: float = 0.05
    # Which of micro-batch and accumulation a global_batch decides (answers.training_options sets it from what was
    # given): "auto" (neither: the fastest split of the global batch on each rung), "micro" (micro-batch given:
    # accumulation follows), "accum" (accumulation given: micro-batch follows), "given" (both given: they win).
    # Without a global_batch it does not matter.
    split: str = "auto"
    task: str = "auto"                    # the head trained: auto (the config's architectures) or a TASKS name
    # Gradient checkpointing re-runs each layer's __call__ reentrantly: transformers 4.x's default (answers'
    # training_options sets it from the installed transformers). Under FSDP1 with adapters it keeps every layer's
    # input and gradient to the end of backward (memory.fsdp1_retained_checkpoint_bytes).
    reentrant_checkpoint_call: bool = False


SPLITS = ("given", "auto", "micro", "accum")


@dataclass
class StrategyOptions:
    backend: str = "auto"
    zero_stage: str = "auto"
    offload: str = "auto"
    nvme_path: str | None = None
    headroom: float = 0.10
    cuda_context_bytes: int = mem.CUDA_CONTEXT_BYTES   # per process (configurable); the measurement in memory.py
    fsdp_version: int = 2                 # the FSDP the files select (1: the older wrapper API)


@dataclass
class Topology:
    num_machines: int = 1
    processes_per_machine: int = 1
    cpu: bool = False                     # CPU processes (no GPU): DeepSpeed CPU accelerator / gloo, fp32
    inter_node_gbps: float | None = None  # network per machine (Gb/s); None: the machine's or its class default

    @property
    def world_size(self) -> int:
        return self.num_machines * self.processes_per_machine


@dataclass
class Rung:
    key: str                              # stable id: "single", "ddp", "zero2", "zero3", "zero3-offload-opt", ...
    name: str                             # what the user reads: "ZeRO-3 + CPU optimizer offload"
    backend: str                          # single | ddp | deepspeed | fsdp
    zero_stage: int | None = None
    offload_optimizer: str = "none"       # none | cpu | nvme
    offload_param: str = "none"
    fsdp_reshard: bool | None = None
    gradient_checkpointing: bool = False
    per_gpu_bytes: int = 0
    cpu_bytes: int = 0                    # host RAM needed (offload, model init)
    nvme_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    fits: bool = False
    reason: str = ""
    speed: speed_mod.Speed | None = None
    train_seconds: float | None = None    # time to train --train-tokens at this rung's speed
    max_micro_batch: int = 0              # largest micro-batch whose per-GPU estimate fits (0: none)
    max_micro_batch_gc: int = 0           # the same with gradient checkpointing on
    load_bytes: int = 0                   # per GPU while loading, where that is its own peak (QLoRA sharded)
    why: str = ""                         # why the ladder holds this rung (rungs.why)
    per_gpu_bytes_gc: int | None = None   # with gradient checkpointing, for a rung evaluated without it (GC auto)
    micro_batch: int = 0                  # the split its speed and memory are for (micro-batch x accumulation)
    grad_accum: int = 0
    # `wizard tune`'s ratios applied to this rung (speed_ratio, memory_ratio as measured, memory_bytes added to
    # the estimate, trials, date); None when the plan is the raw model for it.
    calibration: dict[str, Any] | None = None

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def tokens_per_second(self) -> float:
        return self.speed.tokens_per_second if self.speed else 0.0

    @property
    def name_with_gc(self) -> str:
        """"DeepSpeed ZeRO-3 with gradient checkpointing": the rung as the plan runs it."""
        return self.name + (" with gradient checkpointing" if self.gradient_checkpointing else "")

    def uncalibrated(self) -> Rung:
        """This rung's figures as the raw model gives them (what `wizard tune` measures against); fit and
        reason stay the calibrated plan's."""
        c = self.calibration
        if not c:
            return self
        extra = int(c.get("memory_bytes") or 0)
        speed = self.speed
        if speed is not None and c.get("speed_ratio"):
            speed = _scaled_speed(speed, 1 / c["speed_ratio"])
        return replace(self, per_gpu_bytes=self.per_gpu_bytes - extra, speed=speed, calibration=None,
                       breakdown={**self.breakdown, "margin": self.breakdown.get("margin", 0) - extra},
                       train_seconds=None if self.train_seconds is None or speed is None else
                       self.train_seconds * self.speed.tokens_per_second / speed.tokens_per_second)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.speed is not None:
            d["speed"] = self.speed.to_json()
            if self.train_seconds is not None:
                d["speed"]["train_seconds"] = round(self.train_seconds, 1)
        del d["train_seconds"]
        return d


@dataclass
class BatchSplit:
    """The fastest micro-batch x accumulation for a global batch on the chosen rung."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    speed: speed_mod.Speed
    current: speed_mod.Speed | None       # the asked-for split's speed (None when it does not fit)
    applied: bool = False                 # the plan runs this split (--global-batch without --micro-batch/--grad-accum)

    def to_json(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "gradient_checkpointing": self.gradient_checkpointing, "applied": self.applied,
                "speed": self.speed.to_json(),
                "speedup": None if self.current is None else
                round(self.speed.tokens_per_second / self.current.tokens_per_second, 3)}


@dataclass
class Alternative:
    """What another fine-tuning method would need on the same machine (the plan never switches by itself)."""

    method: str                           # lora | qlora
    rank: int
    trainable_params: int
    choice: Rung | None                   # its plan's choice (at its fastest split); None when it does not fit either
    reference: Rung | None                # the full fine-tuning choice it is compared with
    # Both sides at their fastest split of the same global batch (Plan.batch), so neither is judged at a
    # micro-batch it would not run: None falls back to the rungs' own speeds.
    speed: speed_mod.Speed | None = None
    reference_speed: speed_mod.Speed | None = None
    split: tuple[int, int] | None = None  # the alternative's (micro-batch, accumulation)
    reference_split: tuple[int, int] | None = None

    @property
    def text(self) -> str:
        label = f"{'LoRA' if self.method == 'lora' else 'QLoRA'} r={self.rank}"
        if self.choice is None:
            return f"{label}: does not fit either"
        c = self.choice
        where = f"fits with {c.name_with_gc} ({fmt_bytes(c.per_gpu_bytes)} per GPU)"
        own = self.speed or c.speed
        at = f" at micro-batch {self.split[0]} x {self.split[1]}" if self.split else ""
        ref = self.reference_speed or (self.reference.speed if self.reference is not None else None)
        if self.reference is not None and ref is not None and own is not None:
            rel = speed_mod.relative(own, ref)
            ref_at = f" (at micro-batch {self.reference_split[0]} x {self.reference_split[1]})" \
                if self.reference_split else ""
            return (f"{label}: {where}, ≈{speed_mod.fmt_rate(own.tokens_per_second)}{at}, {rel} than "
                    f"{self.reference.name}{ref_at}")
        return f"{label}: {where}, ≈{speed_mod.fmt_rate(c.tokens_per_second)}{at}"

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "rank": self.rank, "trainable_params": self.trainable_params,
                "text": self.text, "choice": None if self.choice is None else self.choice.to_json()}


@dataclass
class Plan:
    rungs: list[Rung]
    choice: Rung | None
    gpu_capacity_bytes: int               # smallest GPU's memory (per-process budget before headroom)
    usable_bytes: int                     # (1 - headroom) * capacity
    precision: str                        # resolved: bf16 | fp16 | fp32
    topology: Topology
    notes: list[str] = field(default_factory=list)
    batch: BatchSplit | None = None       # the fastest split of the global batch on the chosen rung
    train_tokens: int | None = None
    alternatives: list[Alternative] = field(default_factory=list)   # LoRA / QLoRA when full FT would offload
    # wizard.sizing.lora.AdapterShape the plan was made with (None: full fine-tuning): re-planning a variant
    # (what_would_fit) must reuse it, since make_plan cannot size a config's adapters itself.
    adapters: Any = field(default=None, repr=False)
    method: dict[str, Any] = field(default_factory=lambda: {"name": "full"})   # method_json: plan --json's "method"
    inter_node_gbps: float | None = None  # the network between machines the speeds assume (None: one machine)
    # An offload-bound choice: the same rung at its largest micro-batch (same accumulation), whose CPU optimizer
    # step is spread over more tokens. None otherwise.
    amortised: BatchSplit | None = None
    # The calibration.Calibration the plan was made with (None: the raw model): re-planning a variant
    # (what_would_fit, the alternatives) must use it too.
    calibration: Any = field(default=None, repr=False)
    calibrated_from: str | None = None    # the raw model's choice (key) when the calibration changed it

    def to_json(self) -> dict[str, Any]:
        c = self.choice
        return {
            "choice": None if c is None else {
                "backend": c.backend, "zero_stage": c.zero_stage,
                "offload_optimizer": c.offload_optimizer, "offload_param": c.offload_param,
                "gradient_checkpointing": c.gradient_checkpointing,
                "per_gpu_bytes": c.per_gpu_bytes, "cpu_bytes": c.cpu_bytes, "key": c.key, "name": c.name,
                "speed": c.to_json()["speed"],       # with train_seconds, as in its rung
                "max_micro_batch": c.max_micro_batch, "max_micro_batch_gc": c.max_micro_batch_gc,
                "micro_batch": c.micro_batch, "grad_accum": c.grad_accum,
            },
            "method": dict(self.method),
            "batch": None if self.batch is None else self.batch.to_json(),
            "alternatives": [a.to_json() for a in self.alternatives],
            "train_tokens": self.train_tokens,
            "gpu_capacity_bytes": self.gpu_capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "precision": self.precision,
            "world_size": self.topology.world_size,
            "num_machines": self.topology.num_machines,
            "inter_node_gbps": self.inter_node_gbps,
            "amortised": None if self.amortised is None else self.amortised.to_json(),
            "cpu_only": self.topology.cpu,
            "calibration": None if not any(r.calibration for r in self.rungs) else {
                "rungs": {r.key: dict(r.calibration) for r in self.rungs if r.calibration},
                "changed_choice_from": self.calibrated_from},
            "notes": list(self.notes),
            "rungs": [r.to_json() for r in self.rungs],
        }


# --- The ladder ------------------------------------------------------------------------------------

# The rung table's entries by key (wizard.planning.rungs), under the name older callers import.
RUNG_SPECS = BY_KEY


def _check_choice(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise InputError(flag, f"{value!r} is not a valid choice", ", ".join(allowed))


def ladder_keys(strategy: StrategyOptions, world_size: int, cpu: bool = False, method: str = "full") -> list[str]:
    """The rung keys to evaluate, cheapest first, for these strategy options. InputError on bad combos."""
    backend, stage, offload = strategy.backend, str(strategy.zero_stage), strategy.offload
    if method != "full":
        return _adapter_ladder(strategy, world_size, cpu, method)
    _check_choice(backend, BACKENDS, "--backend")
    _check_choice(stage, ZERO_STAGES, "--zero-stage")
    _check_choice(offload, OFFLOADS, "--offload")
    if cpu and offload in ("cpu", "nvme"):
        raise InputError("--offload", f"{offload!r} needs GPUs; these are CPU processes", "auto, none")
    if backend == "ddp":
        if stage != "auto":
            raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not ddp", "auto")
        if offload in ("cpu", "nvme"):
            raise InputError("--offload", f"{offload!r} needs --backend deepspeed or fsdp, not ddp", "auto, none")
    if backend == "fsdp":
        if stage != "auto":
            raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not fsdp", "auto")
        if offload == "nvme":
            raise InputError("--offload", "FSDP has no NVMe offload", "auto, none, cpu")
    keys = rung_table.ladder(backend, stage, offload, method, world_size)
    if not keys:
        raise InputError("--offload", "NVMe offload is available only with ZeRO stage 3", "auto, none, cpu")
    if cpu:
        keys = [k for k in keys if not BY_KEY[k].offloads]
    return keys


def _steppable_by(optimizer: str, strategy: StrategyOptions, keys: list[str]) -> list[str]:
    """The rungs whose parameters `optimizer` can step. bitsandbytes' 8-bit AdamW cannot step FSDP2's sharded
    parameters (DTensor): with bitsandbytes 0.50.2 and torch 2.13 its first step fails with
    "optimizer_update_8bit_blockwise got mixed torch.Tensor and DTensor" (tests/functional/
    test_fsdp_8bit_optimizer.py runs it on 2 CPU ranks; bitsandbytes issue #1633 has it on GPUs). So the FSDP
    rungs leave the ladder for --optimizer adamw-8bit, and --backend fsdp with it is refused."""
    if optimizer != "adamw-8bit":
        return keys
    if strategy.backend == "fsdp":
        raise InputError("--optimizer", "'adamw-8bit' cannot step FSDP2's sharded (DTensor) parameters: "
                         "bitsandbytes' 8-bit update rejects them at the first step",
                         "adamw, sgd or adafactor with --backend fsdp; or --backend deepspeed / auto")
    return [k for k in keys if BY_KEY[k].backend != "fsdp"]


def _adapter_ladder(strategy: StrategyOptions, world_size: int, cpu: bool, method: str) -> list[str]:
    """LoRA / QLoRA: one GPU / DDP, ZeRO-2, ZeRO-3, FSDP2 (with and without resharding), then the rungs that
    move the frozen base to the CPU (ZeRO-3 parameter offload, FSDP2 CPU offload).

    No optimizer-only offload rung: the adapters' optimizer states are a few per mille of the model and the
    frozen base has none, so offloading them saves next to nothing. No NVMe rung."""
    _check_choice(strategy.backend, BACKENDS, "--backend")
    _check_choice(str(strategy.zero_stage), ZERO_STAGES, "--zero-stage")
    _check_choice(strategy.offload, OFFLOADS, "--offload")
    stage = str(strategy.zero_stage)
    if strategy.offload == "nvme":
        raise InputError("--offload", f"'nvme' with --method {method}: the adapters' states are tiny and the "
                         "frozen base has none to swap", "auto, none, cpu")
    if cpu and strategy.offload == "cpu":
        raise InputError("--offload", "'cpu' needs GPUs; these are CPU processes", "auto, none")
    if strategy.backend in ("ddp", "fsdp") and stage != "auto":
        raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not {strategy.backend}", "auto")
    if strategy.backend == "ddp" and strategy.offload == "cpu":
        raise InputError("--offload", "'cpu' needs --backend deepspeed or fsdp, not ddp", "auto, none")
    keys = rung_table.ladder(strategy.backend, stage, strategy.offload, method, world_size)
    if not keys:
        raise InputError("--offload", f"'cpu' with --method {method} offloads the frozen base: ZeRO stage 3 or FSDP "
                         "(the adapters' optimizer states are too small to be worth offloading)", "auto, none")
    if cpu:
        keys = [k for k in keys if not BY_KEY[k].offloads]
    return keys


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


def _rung_optimizer(spec: RungSpec, x: _Inputs) -> str:
    """The optimizer that really runs on this rung: DeepSpeed optimizer offload runs DeepSpeedCPUAdam, never
    8-bit AdamW (memory.optimizer_for_rung)."""
    if spec.backend != "deepspeed":
        return x.optimizer
    return mem.optimizer_for_rung(x.optimizer, spec.offload_optimizer != "none")


def _adapter_strategy(spec: RungSpec) -> str:
    return spec.backend if spec.memory == "replicated" else spec.memory


def _states(spec: RungSpec, x: _Inputs) -> mem.ModelStates:
    """The model states of the rung's memory family (rungs.RungSpec.memory)."""
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


def _host_ram(spec: RungSpec, x: _Inputs, states: mem.ModelStates) -> int:
    """Host RAM per machine: the larger of loading the checkpoint and the states an offload rung keeps
    there (they happen one after the other: the weights are loaded before the optimizer exists)."""
    load = mem.load_host_bytes(x.params, x.weights_bytes, x.per_machine, _loader(spec, x),
                               largest_module_params=max(x.largest_layer, x.vocab * x.hidden))
    offloaded = mem.offloaded_host_bytes(states, x.params, x.precision, _rung_optimizer(spec, x), x.machines,
                                         spec.zero_stage,
                                         spec.offload_optimizer != "none", spec.offload_param != "none")
    return max(load, offloaded)


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


def _estimate(spec: RungSpec, x: _Inputs, gc: bool) -> _Estimate:
    states = _states(spec, x)
    precision = _activation_precision(spec, x)
    kept, recomputed = mem.stack_activation_parts(x.stack, x.seq, x.batch, x.flash, gc, precision)
    if x.adapters is not None:
        adapters = _adapter_activation_bytes(x, gc)     # one recomputed layer's worth under checkpointing
        if gc:
            recomputed += adapters
        else:
            kept += adapters
    if gc and spec.backend == "fsdp" and x.fsdp1_retains_checkpoints:
        recomputed += mem.fsdp1_retained_checkpoint_bytes(x.seq * x.batch, x.hidden, x.layers, precision)
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
    # CPU processes: everything is already host RAM inside the per-process figure.
    return _Estimate(breakdown, sum(breakdown.values()), 0 if x.cpu else _host_ram(spec, x, states), states.nvme,
                     _load_bytes(spec, x))


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


def _evaluate(spec: RungSpec, x: _Inputs, gc_mode: str) -> tuple[Rung, int | None]:
    """The rung with its breakdown and fit; also its per-GPU bytes without GC when GC was switched on."""
    gc = gc_mode == "on"
    est = _estimate(spec, x, gc)
    without_gc = None
    if gc_mode == "auto" and est.per_gpu > x.usable and est.fixed <= x.usable:
        # Model states fit but the total does not: activations are the problem, so checkpoint them.
        without_gc, gc = est.per_gpu, True
        est = _estimate(spec, x, True)
    name = "Single process" if x.cpu and spec.key == "single" else spec.label
    # Like with like: a rung that runs without GC also says what it needs with it, as the rungs that switched
    # it on do (their reason gives the figure without it).
    with_gc = _estimate(spec, x, True).per_gpu if gc_mode == "auto" and not gc else None
    rung = Rung(key=spec.key, name=name, backend=spec.backend, zero_stage=spec.zero_stage,
                offload_optimizer=spec.offload_optimizer, offload_param=spec.offload_param,
                fsdp_reshard=spec.fsdp_reshard, gradient_checkpointing=gc, per_gpu_bytes=est.per_gpu,
                cpu_bytes=est.cpu, nvme_bytes=est.nvme, breakdown=est.breakdown, load_bytes=est.load,
                why=rung_table.why(spec.key, x.world), per_gpu_bytes_gc=with_gc)
    ratios = x.ratios(spec.key)
    if ratios is not None:
        extra = 0 if ratios.memory_applied <= 1 else est.per_gpu - _estimate(spec, replace(x, calibration=None),
                                                                             gc).per_gpu
        rung.calibration = {"speed_ratio": ratios.speed, "memory_ratio": ratios.memory, "memory_bytes": extra,
                            "trials": ratios.trials, "date": calibration_mod.date_of(ratios.updated)}
    problems = _problems(spec, est, x)
    rung.fits = not problems
    if problems:
        gc_text = " even with gradient checkpointing" if without_gc is not None else ""
        first = problems[0]
        if gc_text and first.startswith("needs ") and " per " in first and "while loading" not in first:
            first = first.replace(f" per {x.unit} ", f" per {x.unit}{gc_text} ", 1)
        rung.reason = _sentence("; and ".join([first] + problems[1:]))
    return rung, without_gc


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _fit_reason(rung: Rung, x: _Inputs, without_gc: int | None, choice: Rung, tie: bool = False,
                forced_offload: str | None = None) -> str:
    """`forced_offload`: the --offload value when it left the ladder no rung of a cheaper class than the choice's,
    so the plan cannot say that nothing cheaper fits (it did not try)."""
    used = f"{fmt_bytes(rung.per_gpu_bytes)} of {fmt_bytes(x.usable)} usable per {x.unit}"
    gc = ""
    if without_gc is not None:
        gc = f", with gradient checkpointing switched on ({fmt_bytes(without_gc)} without it)"
    elif rung.gradient_checkpointing:
        gc = ", with gradient checkpointing (forced on)"
    rate = speed_mod.fmt_rate(rung.tokens_per_second)
    if rung is choice:
        spare = fmt_bytes(x.usable - rung.per_gpu_bytes)
        fastest = "the first rung that fits within 3% of the fastest" if tie else "the fastest rung that fits"
        why = (fastest if _rung_class(rung) == 0 else
               f"{fastest} of those --offload {forced_offload} allows" if forced_offload else
               "no rung without offload fits, and it is the fastest offload rung that fits" if _rung_class(rung) == 1
               else "nothing fits without NVMe")
        return f"Fits with {spare} to spare ({used}){gc}; ≈{rate}; chosen: {why}{_threads_clause(rung, x)}."
    rel = speed_mod.relative(rung.speed, choice.speed)
    slower = rung.tokens_per_second < choice.tokens_per_second * (1 - SPEED_TIE)
    if _rung_class(rung) > _rung_class(choice) and not slower:
        return f"Fits ({used}){gc}, {rel} (≈{rate}), but no offload while a rung without it fits."
    if not slower:
        return f"Fits ({used}){gc}, {rel} (≈{rate}); the earlier rung ({choice.name}) wins the tie."
    measured = any((r.calibration or {}).get("speed_ratio") for r in (rung, choice))
    because = "as measured on this machine (`wizard tune`)" if measured else _slower_because(rung, choice, x)
    return f"Fits ({used}){gc}, {rel} (≈{rate}): {because}{_threads_clause(rung, x)}."


def _threads_clause(rung: Rung, x: _Inputs) -> str:
    """', its host step on 1 thread per process (OMP_NUM_THREADS, see the notes)' for an optimizer-offload rung
    whose step OMP_NUM_THREADS starves; '' otherwise."""
    starved = _starved_threads(x) if rung.offload_optimizer != "none" else None
    if starved is None:
        return ""
    threads, cores = starved
    return (f", its host step on {threads:g} thread{'s' if threads != 1 else ''} per process of {cores} cores "
            f"(OMP_NUM_THREADS, see the notes)")


def _slower_because(rung: Rung, choice: Rung, x: _Inputs | None = None) -> str:
    """What costs this rung its speed, in a few words."""
    smaller = _smaller_micro_batch(rung, choice)
    if smaller:
        return smaller
    if "nvme" in (rung.offload_optimizer, rung.offload_param):
        return "optimizer states swapped through NVMe"
    if rung.offload_param != "none":
        return "weights and optimizer on the CPU"
    if rung.offload_optimizer != "none":
        return "optimizer on the CPU"
    if rung.gradient_checkpointing and not choice.gradient_checkpointing:
        return "gradient checkpointing recomputes the forward pass"
    if rung.speed and rung.speed.bound == "communication":
        return "more communication per step"
    if rung.zero_stage == 3 and choice.fsdp_reshard:
        adapters = x is not None and x.adapters is not None
        return ("ZeRO-3 gathers weights module by module" +
                (", and the adapters add two modules (lora_A, lora_B) to each adapted Linear" if adapters else "") +
                "; FSDP2 gathers a whole layer at once")
    if rung.zero_stage == 3 or rung.fsdp_reshard:
        return "weights gathered for every layer, forward and backward"
    return "more communication per step"


def _smaller_micro_batch(rung: Rung, choice: Rung) -> str | None:
    """When the rung runs a smaller micro-batch of the same global batch than the choice, at the same
    checkpointing, and compute is the largest part of its longer step, that is the reason, not its
    communication (a rung that fits only micro-batch 1 was said to be slower for gathering its weights, with
    0 s of exposed communication)."""
    r, c = rung.speed, choice.speed
    if (r is None or c is None or rung.micro_batch >= choice.micro_batch
            or rung.gradient_checkpointing != choice.gradient_checkpointing):
        return None
    parts = ("compute_seconds", "communication_seconds", "offload_seconds", "optimizer_seconds", "overhead_seconds")
    gaps = {p: getattr(r, p) - getattr(c, p) for p in parts}
    if max(gaps, key=gaps.get) != "compute_seconds" or gaps["compute_seconds"] <= 0:
        return None
    largest = rung.max_micro_batch_gc if rung.gradient_checkpointing else rung.max_micro_batch
    which = " (the largest that fits)" if largest and rung.micro_batch >= largest else ""
    return (f"it runs micro-batch {rung.micro_batch}{which}, against {choice.micro_batch} for {choice.name}: "
            "smaller matrix multiplies use the GPU less well")


# --- Resolving the inputs ---------------------------------------------------------------------------

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
        notes.append(f"These are {per_machine * machines} CPU processes (DeepSpeed's CPU accelerator over gloo): "
                     f"each gets host RAM / {per_machine}, in {precision}; offload rungs are left out because "
                     "the processes already live in host RAM.")
        if precision == "fp16":
            notes.append("fp16 on CPUs is poorly supported by torch and DeepSpeed's CPU accelerator; use fp32 or bf16.")
    else:
        if hw.num_gpus == 0:
            raise InputError("--hardware", f"no GPUs found ({hw.gpu_reason or 'unknown reason'}) for GPU processes",
                             "a machine with GPUs, --assume SPEC, or CPU processes")
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
    if network is not None and (isinstance(network, bool) or not isinstance(network, (int, float))
                                or not 0 < network <= 100_000):
        raise InputError("--inter-node-gbps", f"{network!r} is not a network speed", "Gb/s per machine, e.g. 400")
    machine = speed_mod.machine_from_hardware(hw, precision, per_machine, cpu, network)
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
        profile=profile, stack=layer_stack(model, profile), weights_bytes=weights_bytes,
        matmul_params=matmul_params, head_params=head_params, layer_params=layer_params, root_params=root_params,
        seq=seq, batch=batch, precision=precision, optimizer=training.optimizer, flash=flash,
        per_machine=per_machine, machines=machines, cpu=cpu, context=context, capacity=capacity,
        usable=mem.usable_bytes(capacity, headroom), headroom=headroom, ram=ram,
        nvme_path=nvme_path, nvme_free=nvme_free,
        grad_accum=training.grad_accum, machine=machine, active_params=_active_params(model),
        task=task, num_labels=num_labels, fsdp_version=_fsdp_version(strategy.fsdp_version),
    )


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


# --- Public API ---------------------------------------------------------------------------------------

def make_plan(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology,
              adapters=None, calibration: calibration_mod.Calibration | None = None) -> Plan:
    """Walk the ladder of DESIGN.md and return every rung with its breakdown, speed and the choice.

    `adapters` (wizard.sizing.lora.AdapterShape) is required for --method lora/qlora on a model read from a config;
    a --params shape is sized analytically here. `calibration`: `wizard tune`'s ratios for this machine
    (calibration.for_machine), applied to every rung's speed and per-GPU memory before fit and choice; the plan
    says so, and names the raw model's choice when the calibration changed it."""
    plan = _make_plan(hw, model, training, strategy, topology, adapters, calibration)
    if calibration is None:
        return plan
    if calibration.problem:
        plan.notes.append(calibration.problem)
    if calibration.machine != calibration_mod.machine_key(hw, topology):
        return plan
    used = [(r.name, calibration.ratios(r.key, training.method)) for r in plan.rungs if r.calibration is not None]
    stale = sum(calibration.is_stale(r.key, training.method) for r in plan.rungs)
    changed = None
    if used:
        raw = _make_plan(hw, model, training, strategy, topology, adapters, None).choice
        if _choice_id(raw) != _choice_id(plan.choice):
            changed = (_choice_text(raw), _choice_text(plan.choice))
            plan.calibrated_from = raw.key if raw is not None else None
    plan.notes.extend(calibration_mod.notes(used, stale, changed))
    return plan


def _choice_id(rung: Rung | None) -> tuple | None:
    return None if rung is None else (rung.key, rung.gradient_checkpointing)


def _choice_text(rung: Rung | None) -> str:
    if rung is None:
        return "none (nothing fits)"
    return rung.name_with_gc


def _make_plan(hw, model, training: TrainingOptions, strategy: StrategyOptions, topology: Topology,
               adapters, calibration) -> Plan:
    notes: list[str] = []
    _check_choice(training.split, SPLITS, "split")
    training, auto_split = _split_training(training, topology, notes)
    x = _resolve(hw, model, training, strategy, topology, notes)
    x = _with_adapters(x, model, training, adapters, notes)
    if calibration is not None and calibration.machine == calibration_mod.machine_key(hw, topology):
        x = replace(x, calibration=calibration)      # a variant on another machine (what_would_fit) stays raw
    train_tokens = _train_tokens(training)
    global_batch = _global_batch(training, x.world)
    keys = _steppable_by(training.optimizer, strategy, ladder_keys(strategy, x.world, x.cpu, training.method))
    notes.extend(_fsdp1_note(x, keys))
    evaluated = [_evaluate(BY_KEY[k], x, training.gradient_checkpointing) for k in keys]
    at: dict[str, _Inputs] = {k: x for k in keys}        # the inputs (micro-batch x accumulation) each rung runs
    splits: dict[str, BatchSplit] = {}
    if auto_split:
        # Every rung that fits runs its own fastest split of the global batch, so rungs (and LoRA against full
        # fine-tuning) are compared as each would really run, and the choice's figures are the split's.
        for i, (rung, _) in enumerate(evaluated):
            spec = BY_KEY[rung.key]
            split = fastest_split(spec, x, global_batch, training.gradient_checkpointing, None) if rung.fits else None
            if split is None:
                continue
            splits[rung.key] = replace(split, applied=True)
            at[rung.key] = replace(x, batch=split.micro_batch, grad_accum=split.grad_accum)
            evaluated[i] = _evaluate(spec, at[rung.key], training.gradient_checkpointing)
    rungs = [r for r, _ in evaluated]
    for rung in rungs:
        spec = BY_KEY[rung.key]
        rx = at[rung.key]
        rung.micro_batch, rung.grad_accum = rx.batch, rx.grad_accum
        rung.speed = _speed(spec, rx, rx.batch, rx.grad_accum, rung.gradient_checkpointing)
        if train_tokens:
            rung.train_seconds = rung.speed.train_seconds(train_tokens)
        if training.gradient_checkpointing != "on":
            rung.max_micro_batch = largest_micro_batch(spec, x, gc=False)
        if training.gradient_checkpointing != "off":
            rung.max_micro_batch_gc = largest_micro_batch(spec, x, gc=True)
    choice = choose(rungs)
    if choice is not None:
        tie = any(r.fits and _rung_class(r) == _rung_class(choice) and r.tokens_per_second > choice.tokens_per_second
                  for r in rungs)
        forced = (strategy.offload if strategy.offload in ("cpu", "nvme")
                  and not any(_rung_class(r) < _rung_class(choice) for r in rungs) else None)
        for rung, without_gc in evaluated:
            if rung.fits:
                rung.reason = _fit_reason(rung, x, without_gc, choice, tie, forced)
    notes.extend(_omp_threads_note(rungs, choice, at))
    if x.nvme_path and x.nvme_free is None and any(BY_KEY[k].uses_nvme for k in keys):
        notes.append(f"Free space at the NVMe path {x.nvme_path} is unknown, so the NVMe rung's disk need is not "
                     "checked.")
    batch = None
    if choice is not None and choice.key in splits:
        batch = splits[choice.key]
    elif choice is not None:
        batch = fastest_split(BY_KEY[choice.key], x, global_batch,
                              training.gradient_checkpointing, choice.speed if choice.fits else None)
    amortised = None
    if choice is not None and choice.fits and choice.speed is not None and choice.speed.bound == "offload":
        amortised = _amortised(BY_KEY[choice.key], at[choice.key], choice, global_batch)
    return Plan(rungs=rungs, choice=choice, gpu_capacity_bytes=x.capacity, usable_bytes=x.usable, amortised=amortised,
                precision=x.precision, topology=topology, notes=notes, batch=batch, train_tokens=train_tokens,
                adapters=x.adapters, method=method_json(training, x.params, x.adapters),
                inter_node_gbps=x.machine.inter_node_gbps if x.machines > 1 else None, calibration=calibration)


def _starved_threads(x: _Inputs) -> tuple[float, int] | None:
    """(threads the host optimizer step gets per process, the cores it could have) when OMP_NUM_THREADS leaves it
    fewer threads than its share of the machine's cores (speed.cpu_step_threads); None otherwise."""
    m = x.machine
    if m is None or x.cpu:
        return None
    cores = int(m.cpu_cores_per_process)
    return (m.threads, cores) if m.threads < cores else None


def _omp_threads_note(rungs: list[Rung], choice: Rung | None, at: dict[str, _Inputs]) -> list[str]:
    """What OMP_NUM_THREADS costs the optimizer-offload rungs, and the export that fixes it: the chosen rung when it
    offloads, else the fastest offload rung that fits."""
    offload = [r for r in rungs if r.fits and r.offload_optimizer != "none" and r.speed is not None]
    if not offload:
        return []
    rung = choice if choice is not None and choice in offload else max(offload, key=lambda r: r.tokens_per_second)
    rx = at[rung.key]
    starved = _starved_threads(rx)
    if starved is None:
        return []
    threads, cores = starved
    spec = BY_KEY[rung.key]
    full = _speed(spec, replace(rx, machine=replace(rx.machine, cpu_step_threads=float(cores))), rx.batch,
                  rx.grad_accum, rung.gradient_checkpointing)
    why = ("torchrun sets OMP_NUM_THREADS=1 for each of a machine's processes when it is not set"
           if threads == 1 and rx.per_machine > 1 else f"OMP_NUM_THREADS is {threads:g}")
    return [f"CPU offload: the host optimizer step runs on OpenMP's threads, {threads:g} per process ({why}), of "
            f"the {cores} cores each of the {rx.per_machine} processes per machine could use. Run "
            f"`export OMP_NUM_THREADS={cores}` before `wizard launch` (or accelerate launch): {rung.name} then takes "
            f"≈{fmt_duration(full.step_seconds)} per step instead of ≈{fmt_duration(rung.speed.step_seconds)} "
            f"(the host's memory bandwidth, not its cores, caps it beyond that)."]


# --- Speed: the fastest rung that fits, the largest micro-batch, the best batch split ----------------

# Rung classes in the order the product allows them: no offload while a rung without offload fits, and
# NVMe only when nothing on the host fits. Within a class the fastest rung that fits wins.
def _rung_class(rung: Rung) -> int:
    if "nvme" in (rung.offload_optimizer, rung.offload_param):
        return 2
    return 1 if rung.offloads else 0


# Speeds closer than this are a tie: the model is not that precise, and the earlier (cheaper, simpler) rung
# of the ladder wins one, so ZeRO-3 is never taken over ZeRO-2 for a rounding difference.
SPEED_TIE = 0.03


def choose(rungs: list[Rung]) -> Rung | None:
    """The fastest fitting rung of the cheapest class that has one; on a tie, the earlier rung."""
    for cls in (0, 1, 2):
        fitting = [r for r in rungs if r.fits and _rung_class(r) == cls]
        if fitting:
            best = max(r.tokens_per_second for r in fitting)
            return next(r for r in fitting if r.tokens_per_second >= best * (1 - SPEED_TIE))
    return None


def _layout(spec: RungSpec, x: _Inputs) -> speed_mod.Layout:
    return speed_mod.Layout(backend=spec.backend, zero_stage=spec.zero_stage,
                            offload_optimizer=spec.offload_optimizer, offload_param=spec.offload_param,
                            fsdp_reshard=spec.fsdp_reshard, per_machine=x.per_machine, machines=x.machines)


def _speed(spec: RungSpec, x: _Inputs, batch: int, grad_accum: int, gc: bool) -> speed_mod.Speed:
    a = x.adapters
    work = speed_mod.Workload(matmul_params=x.active_params, params=x.params, layers=x.layers, hidden=x.hidden,
                              seq=x.seq, micro_batch=batch, grad_accum=grad_accum, precision=x.precision,
                              flash=x.flash, gradient_checkpointing=gc,
                              trainable_params=None if a is None else a.trainable_params,
                              dequant_params=a.quantized_params if a is not None and a.method == "qlora" else 0,
                              weight_bytes=a.frozen_bytes(mem.working_bytes(x.precision)) +
                              a.trainable_params * mem.working_bytes(x.precision) if a is not None else None,
                              adapter_modules=0 if a is None else a.adapted_modules,
                              adapter_io_elements=0 if a is None else a.trainable_params // max(a.rank, 1))
    speed = speed_mod.estimate(x.machine, work, _layout(spec, x))
    ratios = x.ratios(spec.key)
    return _scaled_speed(speed, ratios.speed) if ratios is not None and ratios.speed else speed


def _scaled_speed(s: speed_mod.Speed, ratio: float) -> speed_mod.Speed:
    """`s` `ratio` times as fast: every part of the step shrinks alike (a measurement gives only the total)."""
    t = 1 / ratio
    return replace(s, step_seconds=s.step_seconds * t, tokens_per_second=s.tokens_per_second * ratio,
                   tokens_per_second_per_gpu=s.tokens_per_second_per_gpu * ratio, mfu=s.mfu * ratio,
                   compute_seconds=s.compute_seconds * t, communication_seconds=s.communication_seconds * t,
                   offload_seconds=s.offload_seconds * t, overhead_seconds=s.overhead_seconds * t,
                   optimizer_seconds=s.optimizer_seconds * t)


def _fits_gpu(spec: RungSpec, x: _Inputs, batch: int, gc: bool) -> bool:
    est = _estimate(spec, replace(x, batch=batch), gc)
    return est.per_gpu <= x.usable and est.load <= x.usable


# Above this a micro-batch is not a planning question any more; the search stops there.
MAX_MICRO_BATCH = 1 << 20


def largest_micro_batch(spec: RungSpec, x: _Inputs, gc: bool) -> int:
    """The largest micro-batch whose per-GPU estimate fits (0 when even 1 does not), by doubling then
    bisection over the memory model: about 2 log2(answer) estimates, never a linear scan."""
    if not _fits_gpu(spec, x, 1, gc):
        return 0
    low, high = 1, 2
    while high <= MAX_MICRO_BATCH and _fits_gpu(spec, x, high, gc):
        low, high = high, high * 2
    if high > MAX_MICRO_BATCH:
        return MAX_MICRO_BATCH
    while high - low > 1:                     # low fits, high does not
        mid = (low + high) // 2
        if _fits_gpu(spec, x, mid, gc):
            low = mid
        else:
            high = mid
    return low


def _global_batch(training: TrainingOptions, world: int) -> int:
    if training.global_batch is None:
        return training.micro_batch * training.grad_accum * world
    g = _positive(training.global_batch, "--global-batch")
    if g % world:
        raise InputError("--global-batch", f"{g} is not a multiple of the {world} processes",
                         f"a multiple of {world}")
    return g


def _amortised(spec: RungSpec, x: _Inputs, choice: Rung, global_batch: int) -> BatchSplit | None:
    """An offload rung pays its CPU optimizer step (and the upload of the updated weights) once per optimizer step,
    whatever the tokens in it: the same rung at its largest micro-batch, accumulation unchanged, shows what that is
    worth (a larger global batch: say so). None when no larger micro-batch fits."""
    largest = max(choice.max_micro_batch, choice.max_micro_batch_gc)
    if largest <= x.batch:
        return None
    gc = largest > choice.max_micro_batch
    speed = _speed(spec, x, largest, x.grad_accum, gc)
    return BatchSplit(largest * x.grad_accum * x.world, largest, x.grad_accum, gc, speed, choice.speed)


def _split_training(training: TrainingOptions, topology: Topology, notes: list[str]) -> tuple[TrainingOptions, bool]:
    """The micro-batch and accumulation the ladder is walked with, and whether each rung then takes its fastest
    split of --global-batch (True only when neither --micro-batch nor --grad-accum was given: given ones win)."""
    if training.global_batch is None:
        return replace(training, split="given"), False
    world = _positive(topology.num_machines, "--num-machines") * _positive(topology.processes_per_machine,
                                                                          "--num-processes")
    g = _global_batch(training, world)
    per = g // world
    if training.split == "auto":
        return replace(training, micro_batch=1, grad_accum=per), True
    if training.split in ("micro", "accum"):
        # One of the two was given: the other follows from the global batch.
        flag, given = (("--micro-batch", training.micro_batch) if training.split == "micro"
                       else ("--grad-accum", training.grad_accum))
        given = _positive(given, flag)
        if per % given:
            raise InputError(flag, f"{given} does not divide the {per} samples per process of --global-batch {g}",
                             f"a divisor of {per}")
        other = per // given
        if training.split == "micro":
            notes.append(f"--micro-batch {given} was given: accumulation {other} makes the global batch of {g}.")
            return replace(training, grad_accum=other, split="given"), False
        notes.append(f"--grad-accum {given} was given: micro-batch {other} makes the global batch of {g}.")
        return replace(training, micro_batch=other, split="given"), False
    own = training.micro_batch * training.grad_accum * world
    if own != g:
        notes.append(f"--micro-batch {training.micro_batch} and --grad-accum {training.grad_accum} were given: they "
                     f"win, so a step takes {own} samples, not the --global-batch of {g}.")
    return replace(training, global_batch=None), False


def _train_tokens(training: TrainingOptions) -> int | None:
    if training.train_tokens is not None:
        return _positive(training.train_tokens, "--train-tokens")
    if training.dataset_tokens is None:
        return None
    tokens = _positive(training.dataset_tokens, "--dataset-tokens")
    epochs = 1.0 if training.epochs is None else training.epochs
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not 0 < epochs <= 10_000:
        raise InputError("--epochs", f"{epochs!r} is not a positive number of epochs", "e.g. 1, 3 or 0.5")
    return max(int(tokens * epochs), 1)


def _divisors_up_to(n: int, limit: int) -> list[int]:
    """Divisors of n that are <= limit, ascending, in O(min(sqrt(n), limit)) steps."""
    out = set()
    root = math.isqrt(n)
    if root <= limit:
        for d in range(1, root + 1):
            if n % d == 0:
                out.update(v for v in (d, n // d) if v <= limit)
    else:
        out.update(d for d in range(1, limit + 1) if n % d == 0)
    return sorted(out)


def fastest_split(spec: RungSpec, x: _Inputs, global_batch: int, gc_mode: str,
                  current: speed_mod.Speed | None) -> BatchSplit | None:
    """Among micro-batch x accumulation splits of `global_batch` that fit on this rung, the fastest.

    Gradient checkpointing follows the mode: off/on as asked; auto uses it only for micro-batches that do
    not fit without it. None when no split fits (not even micro-batch 1)."""
    per_gpu = global_batch // x.world
    limits = {False: largest_micro_batch(spec, x, False) if gc_mode != "on" else 0,
              True: largest_micro_batch(spec, x, True) if gc_mode != "off" else 0}
    best: BatchSplit | None = None
    for b in _divisors_up_to(per_gpu, max(limits.values())):
        gc = not (b <= limits[False])
        speed = _speed(spec, x, b, per_gpu // b, gc)
        if best is None or speed.tokens_per_second > best.speed.tokens_per_second * (1 + 1e-9):
            best = BatchSplit(global_batch, b, per_gpu // b, gc, speed, current)
    return best


def rung_by_key(plan: Plan, key: str) -> Rung | None:
    """The evaluated rung with this key, or None when the plan's ladder did not include it."""
    return next((r for r in plan.rungs if r.key == key), None)


def next_rung(plan: Plan, current_key: str) -> Rung | None:
    """What to try after `current_key` failed (e.g. CUDA OOM): the first later rung that fits,
    else the next rung up the ladder; None when `current_key` is the last rung or unknown."""
    return rung_table.next_after(plan.rungs, current_key, lambda r: r.key, lambda r: r.fits)


def _shortfall(rung: Rung, plan: Plan, hw, strategy: StrategyOptions) -> tuple[float, str]:
    """(need / have of the tightest constraint, a phrase saying it) for a rung that does not fit."""
    unit = "process" if plan.topology.cpu else "GPU"
    usable = max(plan.usable_bytes, 1)
    failures = []
    if rung.per_gpu_bytes > plan.usable_bytes:
        failures.append((rung.per_gpu_bytes / usable,
                         f"needs {fmt_bytes(rung.per_gpu_bytes)} per {unit}, "
                         f"{fmt_bytes(rung.per_gpu_bytes - plan.usable_bytes)} "
                         f"({(rung.per_gpu_bytes / usable - 1) * 100:.0f}%) more than the "
                         f"{fmt_bytes(plan.usable_bytes)} usable"))
    if rung.load_bytes > plan.usable_bytes:
        failures.append((rung.load_bytes / usable,
                         f"needs {fmt_bytes(rung.load_bytes)} per {unit} while loading (bitsandbytes quantises the "
                         f"whole model onto every GPU before it is sharded), "
                         f"{fmt_bytes(rung.load_bytes - plan.usable_bytes)} "
                         f"({(rung.load_bytes / usable - 1) * 100:.0f}%) more than the "
                         f"{fmt_bytes(plan.usable_bytes)} usable"))
    ram = _available_host_ram(hw)
    if ram and not plan.topology.cpu and rung.cpu_bytes > ram:
        failures.append((rung.cpu_bytes / ram,
                         f"needs {fmt_bytes(rung.cpu_bytes)} of host RAM per machine, "
                         f"{fmt_bytes(rung.cpu_bytes - ram)} ({(rung.cpu_bytes / ram - 1) * 100:.0f}%) more than "
                         f"the {fmt_bytes(ram)} available"))
    if failures:
        return max(failures)
    # Memory fits: only the NVMe side is missing (no path, or not enough free disk).
    path = strategy.nvme_path or hw.nvme_path
    free = nvme_free_bytes(hw, path)
    if path and free and rung.nvme_bytes > free:
        return (rung.nvme_bytes / free,
                f"needs {fmt_bytes(rung.nvme_bytes)} on NVMe at {path}, {fmt_bytes(rung.nvme_bytes - free)} "
                f"({(rung.nvme_bytes / free - 1) * 100:.0f}%) more than the {fmt_bytes(free)} free")
    return (1.0, "fits in GPU memory and host RAM but needs an NVMe path (--nvme-path)")


_MAX_MACHINES_TRIED = 128
_MAX_SPLITS_TRIED = 24


def _spread(values: list[int], most: int) -> list[int]:
    """At most `most` of the sorted `values`, evenly spread and always keeping the largest."""
    if len(values) <= most:
        return values
    step = (len(values) - 1) / (most - 1)
    return sorted({values[round(i * step)] for i in range(most)})


def _try(hw, model, training, strategy, topology, adapters=None, calibration=None) -> Plan | None:
    try:
        plan = _make_plan(hw, model, training, strategy, topology, adapters, calibration)
    except InputError:
        return None
    return plan if plan.choice is not None else None


def _fits_text(plan: Plan) -> str:
    c = plan.choice
    unit = "process" if plan.topology.cpu else "GPU"
    return f"{c.name_with_gc} fits ({fmt_bytes(c.per_gpu_bytes)} of {fmt_bytes(plan.usable_bytes)} per {unit})"


@dataclass
class Suggestion:
    """One change that makes a rung fit, already verified by recomputing the plan with it."""

    text: str                             # "with 16 GPUs (2 machines x 8): DeepSpeed ZeRO-3 fits (...)"
    training: TrainingOptions
    strategy: StrategyOptions
    topology: Topology
    choice_key: str


def what_would_fit(hw, model, training: TrainingOptions, strategy: StrategyOptions,
                   topology: Topology, adapters=None, calibration=None) -> list[Suggestion]:
    """Single changes that make some rung fit, each verified by recomputing the plan.

    `adapters`: the plan's AdapterShape for --method lora/qlora (Plan.adapters). No change tried here alters
    the LoRA options, so every variant is planned with the same adapters. `calibration`: the plan's
    (Plan.calibration), so a variant fits by the same measured figures."""
    out: list[Suggestion] = []

    def plan_for(t: TrainingOptions, s: StrategyOptions, topo: Topology) -> Plan | None:
        return _try(hw, model, t, s, topo, adapters, calibration)

    def attempt(label: str, t: TrainingOptions = training, s: StrategyOptions = strategy,
                topo: Topology = topology, without_offload: bool = False) -> bool:
        plan = plan_for(t, s, topo)
        if plan is None or (without_offload and BY_KEY[plan.choice.key].offloads):
            return False
        out.append(Suggestion(f"{label}: {_fits_text(plan)}", t, s, topo, plan.choice.key))
        return True

    # More GPUs: first the rest of this machine's GPUs, then more machines like it.
    candidates = []
    if not topology.cpu:
        candidates = [replace(topology, processes_per_machine=p)
                      for p in range(topology.processes_per_machine + 1, hw.num_gpus + 1)]
    per_machine = topology.processes_per_machine if topology.cpu else max(topology.processes_per_machine,
                                                                          hw.num_gpus)
    candidates += [replace(topology, processes_per_machine=per_machine, num_machines=m)
                   for m in range(topology.num_machines + 1, _MAX_MACHINES_TRIED + 1)]
    unit = "processes" if topology.cpu else "GPUs"
    for topo in candidates:
        where = f" ({topo.num_machines} machines x {topo.processes_per_machine})" if topo.num_machines > 1 else ""
        if attempt(f"with {topo.world_size} {unit}{where}", topo=topo):
            break
    # A smaller micro-batch: bisection finds the largest that fits (fitting shrinks monotonically with the
    # micro-batch, so log2 plans), then among the splits of the same global batch up to it the fastest
    # plan wins, cheapest rung class first: "--micro-batch 8 --grad-accum 8" on ZeRO-2 beats
    # "--micro-batch 38" that only fits with offload.
    total = training.micro_batch * training.grad_accum

    def smaller(b: int) -> TrainingOptions:
        return replace(training, micro_batch=b, grad_accum=total // b if total % b == 0 else training.grad_accum)

    if training.micro_batch > 1 and plan_for(smaller(1), strategy, topology) is not None:
        low, high = 1, training.micro_batch          # low fits, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if plan_for(smaller(mid), strategy, topology) is not None else (low, mid)
        best: tuple[tuple, int] | None = None
        for b in _spread(_divisors_up_to(total, low), _MAX_SPLITS_TRIED):
            plan = plan_for(smaller(b), strategy, topology)
            if plan is not None:
                rank = (-_rung_class(plan.choice), plan.choice.tokens_per_second)
                if best is None or rank > best[0]:
                    best = (rank, b)
        b = best[1] if best is not None else low
        keep = f" and --grad-accum {total // b} to keep the global batch of {total}" if total % b == 0 else ""
        attempt(f"with --micro-batch {b}{keep}", t=smaller(b))
    if training.gradient_checkpointing != "on":
        attempt("with --gradient-checkpointing on", t=replace(training, gradient_checkpointing="on"))
    seq = training.seq_len // 2
    while seq >= 128 and not attempt(f"with --seq-len {seq}", t=replace(training, seq_len=seq)):
        seq //= 2
    precision = resolve_precision(training.precision, hw, topology.cpu)
    if not topology.cpu and not resolve_attention(training.attention, precision, topology.cpu):
        attempt("with --attention sdpa", t=replace(training, attention="sdpa"))
    if training.optimizer == "adamw":
        # 8-bit AdamW is never paired with CPU offload (memory.optimizer_for_rung): suggested only
        # where the rung it makes fit keeps the optimizer states on the GPU
        attempt("with --optimizer adamw-8bit", t=replace(training, optimizer="adamw-8bit"), without_offload=True)
    if (strategy.backend, str(strategy.zero_stage), strategy.offload) != ("auto", "auto", "auto"):
        attempt("with --backend auto --zero-stage auto --offload auto",
                s=replace(strategy, backend="auto", zero_stage="auto", offload="auto"))
    return out


def _host_ram_is_short(plan: Plan, hw, model, training: TrainingOptions, strategy: StrategyOptions,
                       topology: Topology) -> str:
    """When a rung fits on the GPUs and only host RAM stops it: which, how much RAM it needs against what the
    machine has, and the RAM that makes the plan fit (verified by re-planning); "" otherwise."""
    ram = _available_host_ram(hw)
    if not ram or plan.topology.cpu:
        return ""
    short = [r for r in plan.rungs if not r.fits and r.per_gpu_bytes <= plan.usable_bytes and r.cpu_bytes > ram
             and not BY_KEY[r.key].uses_nvme]
    if not short:
        return ""
    rung = min(short, key=lambda r: (_rung_class(r), r.cpu_bytes))
    assumed = hw.source.startswith("assume:")
    total = hw.ram_total or ram
    need_total = _whole_ram_for(rung.cpu_bytes, hw)
    richer = with_host_ram(hw, need_total)
    fixed = _try(hw=richer, model=model, training=training, strategy=strategy, topology=topology,
                 adapters=plan.adapters, calibration=plan.calibration)
    have = (f"the machine has {fmt_bytes(ram)} available ({fmt_bytes(total)} in all)" if total != ram
            else f"the machine has {fmt_bytes(ram)}")
    text = (f"Host RAM is what stops {rung.name}: it fits on the {'GPU' if plan.topology.world_size == 1 else 'GPUs'}"
            f" ({fmt_bytes(rung.per_gpu_bytes)} of {fmt_bytes(plan.usable_bytes)} per GPU) but needs "
            f"{fmt_bytes(rung.cpu_bytes)} of host RAM per machine, and {have}.")
    if fixed is not None:
        how = (f"--assume ...,ram={need_total // GiB}G" if assumed else "a machine with that much")
        text += (f" With {fmt_bytes(need_total)} of RAM ({how}) {_fits_text(fixed)}"
                 f"{', ≈' + speed_mod.fmt_rate(fixed.choice.tokens_per_second) if fixed.choice.speed else ''}.")
    return text


def explain_nothing_fits(plan: Plan, hw, model, training: TrainingOptions, strategy: StrategyOptions,
                         topology: Topology) -> str:
    """For exit 3: how far the closest rung is from fitting, and what would fit (each one verified)."""
    misses = [(_shortfall(r, plan, hw, strategy), r) for r in plan.rungs if not r.fits]
    lines = []
    phrase = ""
    ram_text = _host_ram_is_short(plan, hw, model, training, strategy, topology)
    if misses:
        (_, phrase), best = min(misses, key=lambda m: m[0][0])
        lines.append(f"Nothing fits. The closest rung, {best.name}, {phrase}.")
    else:
        lines.append("Nothing fits.")
    raw = rung_by_key(plan, plan.calibrated_from) if plan.calibrated_from else None
    if raw is not None:
        lines.append(f"The raw model would choose {raw.name}: the memory `wizard tune` measured on this machine is "
                     "what rules it out (`--no-calibration` shows the raw model).")
    if ram_text:
        # Host RAM, not GPU memory, stops a rung that fits on the GPUs: say how much would do, before the
        # other changes (more GPUs) that also make something fit.
        lines.append(ram_text)
    nvme_missing = any(BY_KEY[r.key].uses_nvme and "--nvme-path" in r.reason for r in plan.rungs)
    if nvme_missing and "--nvme-path" not in phrase:
        lines.append("NVMe offload (the last rung) was not possible: give --nvme-path on a fast local disk.")
    fixes = what_would_fit(hw, model, training, strategy, topology, adapters=plan.adapters,
                           calibration=plan.calibration)
    if fixes:
        lines.append("What would fit: " + "; ".join(f.text for f in fixes) + ".")
    else:
        lines.append("No single change tried (more GPUs up to "
                     f"{_MAX_MACHINES_TRIED} machines, a smaller micro-batch, gradient checkpointing, a shorter "
                     "sequence, SDPA attention, 8-bit AdamW) makes a rung fit.")
    return " ".join(lines)


def host_ram_to_fit(plan: Plan, hw) -> int | None:
    """The least total host RAM per machine with which some rung of `plan` would fit, or None when RAM is not
    what stops them (every rung also misses GPU memory). NVMe rungs are left out: more RAM is the cure for the
    CPU-offload rungs, NVMe the last resort. The share of the total that is available now (an assumed
    machine: 90 %) is kept. Not verified: re-plan with `with_host_ram` to be sure."""
    ram = _available_host_ram(hw)
    if not ram or plan.topology.cpu:
        return None
    needs = [r.cpu_bytes for r in plan.rungs
             if not r.fits and r.per_gpu_bytes <= plan.usable_bytes and r.cpu_bytes > ram
             and not BY_KEY[r.key].uses_nvme]
    if not needs:
        return None
    return _whole_ram_for(min(needs), hw)


def _whole_ram_for(need: int, hw) -> int:
    """The total host RAM per machine that leaves `need` available, in whole 16 GiB as RAM is sold. The share
    of the total that is available now is kept (an assumed machine: 90 %; a probed one what is free now)."""
    ram = _available_host_ram(hw) or need
    total = math.ceil(need * (hw.ram_total or ram) / ram)
    return -(-total // (16 * GiB)) * 16 * GiB


def with_host_ram(hw, total: int):
    """The same machine with `total` bytes of host RAM, the same share of it available."""
    ram = _available_host_ram(hw) or total
    share = ram / (hw.ram_total or ram)
    return replace(hw, ram_total=total, ram_available=int(total * share))
