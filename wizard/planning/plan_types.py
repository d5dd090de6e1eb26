"""Plan's vocabulary: the option tuples, the inputs' dataclasses (training, strategy, topology) and what a plan
returns (Rung, BatchSplit, Alternative, Plan). Split from plan.py, which re-exports every name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from wizard.planning import speed as speed_mod
from wizard.sizing import memory as mem
from wizard.units import fmt_bytes


PRECISIONS = ("auto", "bf16", "fp16", "fp32")
GC_MODES = ("auto", "on", "off")
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd", "adafactor")
ATTENTIONS = ("auto", "flash", "sdpa", "eager")
TRAINERS = ("hf", "accelerate")
BACKENDS = ("auto", "ddp", "deepspeed", "fsdp")
ZERO_STAGES = ("auto", "1", "2", "3")
OFFLOADS = ("auto", "none", "cpu", "nvme")
METHODS = ("full", "lora", "qlora")
LOSS_CHOICES = ("auto", "full", "liger", "tiled")
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
    save_total_limit: int | None = None   # checkpoints the Trainer keeps (None: every one); sizes plan.checkpoint
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
    # How a causal LM's loss is computed (sequence.LOSSES, or auto: a fused loss where the logits are a large share
    # of memory and one can run), and whether ALST's options that need lines in the training script may be used.
    loss: str = "auto"
    allow_code_changes: bool = False


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
    # accelerate's parallelism_config_cp_size / _sp_size when given: honoured (the ladder holds only rungs of that
    # size; 1 holds none that splits the sequence) or refused with the reason; None: the plan decides.
    cp_size: int | None = None
    sp_size: int | None = None


@dataclass
class Topology:
    num_machines: int = 1
    processes_per_machine: int = 1
    cpu: bool = False                     # CPU processes (no GPU): DeepSpeed CPU accelerator / gloo, fp32
    inter_node_gbps: float | None = None  # network per machine (Gb/s); None: the machine's or its class default
    inter_node_source: str | None = None  # where inter_node_gbps comes from when not --inter-node-gbps (a measurement)

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
    cp_size: int = 1                      # context parallelism: GPUs each sequence is split over
    max_seq_len: int = 0                  # the longest --seq-len that fits at this micro-batch (the choice only)
    sp_size: int = 1                      # Ulysses sequence parallelism: GPUs each sequence is split over
    checkpoint_offload: bool = False      # ALST's activation-checkpoint offload to host RAM (needs code)
    tiled_mlp: bool = False               # DeepSpeed's TiledMLP (needs code)

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def tokens_per_second(self) -> float:
        return self.speed.tokens_per_second if self.speed else 0.0

    @property
    def seq_shards(self) -> int:
        """The GPUs one sequence is split over (context or sequence parallel; 1 otherwise)."""
        return max(self.cp_size, self.sp_size)

    @property
    def suffix(self) -> str:
        """" +GC +ckpt→CPU +tiled MLP": what the rung switched on, as the ladder lists it."""
        return ((" +GC" if self.gradient_checkpointing else "") + (" +ckpt→CPU" if self.checkpoint_offload else "")
                + (" +tiled MLP" if self.tiled_mlp else ""))

    @property
    def name_with_gc(self) -> str:
        """"DeepSpeed ZeRO-3 with gradient checkpointing": the rung as the plan runs it."""
        extras = (["gradient checkpointing"] if self.gradient_checkpointing else []) + \
            (["its checkpoints offloaded to the CPU"] if self.checkpoint_offload else []) + \
            (["tiled MLP"] if self.tiled_mlp else [])
        if not extras:
            return self.name
        return self.name + " with " + (extras[0] if len(extras) == 1 else
                                       ", ".join(extras[:-1]) + " and " + extras[-1])

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
        # Written only where they say something, so the JSON of plans without them is unchanged.
        for key, absent in (("cp_size", 1), ("max_seq_len", 0), ("sp_size", 1), ("checkpoint_offload", False),
                            ("tiled_mlp", False)):
            if d[key] == absent:
                del d[key]
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
    checkpoint: Any = None                # wizard.sizing.checkpoint.CheckpointSize of the choice (None: no choice)
    loss: str = "full"                    # how the loss is counted (sequence.LOSSES): --loss, resolved
    # The longest --seq-len over every rung the options allow and how it is reached (split.Longest); None when none
    # takes a token.
    longest: Any = None

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
                # only where they say something (a context-parallel rung; a --seq-len near its limit)
                **({"cp_size": c.cp_size} if c.cp_size > 1 else {}),
                **({"sp_size": c.sp_size} if c.sp_size > 1 else {}),
                **({"checkpoint_offload": True} if c.checkpoint_offload else {}),
                **({"tiled_mlp": True} if c.tiled_mlp else {}),
                **({"max_seq_len": c.max_seq_len} if c.max_seq_len else {}),
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
            "loss": self.loss,
            "longest": None if self.longest is None else self.longest.to_json(),
            "notes": list(self.notes),
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_json(),
            "rungs": [r.to_json() for r in self.rungs],
        }


def _scaled_speed(s: speed_mod.Speed, ratio: float) -> speed_mod.Speed:
    """`s` `ratio` times as fast: every part of the step shrinks alike (a measurement gives only the total)."""
    t = 1 / ratio
    return replace(s, step_seconds=s.step_seconds * t, tokens_per_second=s.tokens_per_second * ratio,
                   tokens_per_second_per_gpu=s.tokens_per_second_per_gpu * ratio, mfu=s.mfu * ratio,
                   compute_seconds=s.compute_seconds * t, communication_seconds=s.communication_seconds * t,
                   offload_seconds=s.offload_seconds * t, overhead_seconds=s.overhead_seconds * t,
                   optimizer_seconds=s.optimizer_seconds * t)
