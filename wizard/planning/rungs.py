"""The rung table: every strategy the ladder can hold, one entry each, and nothing else to edit to add one.

An entry is what a rung *is*, before any arithmetic:
- its key (stable: plan JSON, wizard_plan.json, tests), its label and the short label of the TUI's bars;
- the flags that select it (backend, ZeRO stage, offload) and the methods whose ladder holds it;
- how to recognise it from written files (`key_for`, `strategy_from_files`): the same flags;
- its memory part (`memory`: the family of sizing formulas in wizard.sizing, picked by wizard.planning.plan),
  its speed part (the flags are speed.Layout's) and its emit part (`distributed_type`, and the flags the
  DeepSpeed JSON / FSDP section are written from in wizard.config.emit);
- why the ladder holds it, and where a CUDA out-of-memory on it goes next when no saved plan says.

The ladder for given options is the table's entries that match them, in table order (cheapest first).
Adding a rung = one entry here, plus its sizing when its memory family is new.

Pure data: no imports beyond the standard library, so launch/ and the check rules can read it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

FULL = ("full",)
ADAPTERS = ("lora", "qlora")
ALL_METHODS = FULL + ADAPTERS


def distributed_type(backend: str, use_cpu: bool) -> str:
    """accelerate's distributed_type for a rung's backend."""
    types = {"single": "NO", "ddp": "MULTI_CPU" if use_cpu else "MULTI_GPU", "deepspeed": "DEEPSPEED", "fsdp": "FSDP"}
    if backend not in types:
        raise ValueError(f"unknown plan backend {backend!r}")
    return types[backend]


@dataclass(frozen=True)
class RungSpec:
    """One strategy of the ladder."""

    key: str
    label: str                            # what the user reads: "ZeRO-3 + CPU optimizer offload"
    short: str                            # the TUI's bar label: "ZeRO-3 +opt→CPU"
    backend: str                          # single | ddp | deepspeed | fsdp
    zero_stage: int | None = None
    offload_optimizer: str = "none"       # none | cpu | nvme
    offload_param: str = "none"
    fsdp_reshard: bool | None = None
    memory: str = "replicated"            # sizing family: replicated | zero1 | zero2 | zero3 | nvme | fsdp
    methods: tuple[str, ...] = FULL       # the fine-tuning methods whose ladder holds it
    auto: tuple[str, ...] = FULL          # the methods whose --backend auto / --zero-stage auto ladder holds it
    one_gpu: tuple[str, ...] = ALL_METHODS  # ... and on one GPU, where sharding alone partitions nothing
    why_one_gpu: str = ""                 # why it is there on one GPU, when that differs from `why`
    why: str = ""                         # why the ladder holds it, in a clause
    oom_next: str | None = None           # after a CUDA OOM on it and no saved plan: the next key to try
    cp_size: int = 1                      # context parallelism: GPUs each sequence is split over (FSDP2 + SDPA)
    replicate: bool = False               # HSDP: sharded within each machine, one replica per machine
    sp_size: int = 1                      # Ulysses sequence parallelism: GPUs each sequence is split over (DeepSpeed)

    @property
    def splits_sequence(self) -> bool:
        """Context or sequence parallel: each sequence is split over several GPUs."""
        return self.cp_size > 1 or self.sp_size > 1

    @property
    def seq_shards(self) -> int:
        """The GPUs one sequence is split over (1: each GPU runs whole sequences)."""
        return max(self.cp_size, self.sp_size)

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_param != "none"

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.offload_optimizer, self.offload_param)

    @property
    def offload(self) -> str:
        """The --offload value that selects it: the parameters' device where they move, else the optimizer's."""
        return self.offload_param if self.offload_param != "none" else self.offload_optimizer

    def distributed_type(self, use_cpu: bool) -> str:
        """accelerate's distributed_type for this rung (the emit part's first word)."""
        return distributed_type(self.backend, use_cpu)

    def flags(self) -> dict[str, str | None]:
        """The strategy answers that select it (None: the answer does not apply)."""
        if self.backend in ("single", "ddp"):
            return {"backend": "ddp", "zero_stage": None, "offload": None}
        if self.backend == "fsdp":
            return {"backend": "fsdp", "zero_stage": None, "offload": "cpu" if self.offloads else "none"}
        return {"backend": "deepspeed", "zero_stage": str(self.zero_stage), "offload": self.offload}

    def cli_flags(self) -> list[str]:
        """The same as `wizard` command-line flags."""
        out: list[str] = []
        for name, value in self.flags().items():
            if value is not None:
                out += [f"--{name.replace('_', '-')}", value]
        if self.cp_size > 1:
            out += ["--parallelism-config-cp-size", str(self.cp_size)]
        if self.sp_size > 1:
            out += ["--parallelism-config-sp-size", str(self.sp_size)]
        return out


# The Ulysses sizes the table holds: DeepSpeed allows any divisor of the heads (sequence.ulysses_sizes_allowed); the
# table keeps the powers of two that divide the usual head counts, up to 64 (ALST trained Llama-70B's 64 heads on
# 64 GPUs, arXiv 2506.13996 5.3.2).
ULYSSES_SIZES = (2, 4, 8, 16, 32, 64)

RUNGS: tuple[RungSpec, ...] = (
    RungSpec("single", "Single GPU", "Single GPU", "single", methods=ALL_METHODS, oom_next="zero2-offload-opt",
             why="one process holds everything: nothing to communicate"),
    RungSpec("ddp", "DDP (data parallel)", "DDP", "ddp", methods=ALL_METHODS, oom_next="zero2",
             why="every GPU holds a full replica: the least communication"),
    RungSpec("zero1", "DeepSpeed ZeRO-1", "ZeRO-1", "deepspeed", 1, memory="zero1", methods=ALL_METHODS,
             auto=(), oom_next="zero2", why="optimizer states partitioned (asked for with --zero-stage 1)"),
    RungSpec("zero2", "DeepSpeed ZeRO-2", "ZeRO-2", "deepspeed", 2, memory="zero2", methods=ALL_METHODS,
             auto=ALL_METHODS, one_gpu=ADAPTERS, oom_next="zero3",
             why_one_gpu="one GPU: nothing to partition, but DeepSpeed's engine keeps the adapters and the "
                         "unquantised parameters in 16 bits where torch AMP keeps them in fp32", why="optimizer states and gradients partitioned, weights replicated"),
    RungSpec("zero3", "DeepSpeed ZeRO-3", "ZeRO-3", "deepspeed", 3, memory="zero3", methods=ALL_METHODS,
             auto=ALL_METHODS, one_gpu=(), oom_next="zero3-offload-opt", why="weights partitioned too, gathered layer by layer"),
    RungSpec("zero1-offload-opt", "ZeRO-1 + CPU optimizer offload", "ZeRO-1 +opt→CPU", "deepspeed", 1, "cpu",
             memory="zero1", auto=(), oom_next="zero2-offload-opt",
             why="the optimizer states and step move to the CPU (asked for with --zero-stage 1)"),
    RungSpec("zero2-offload-opt", "ZeRO-2 + CPU optimizer offload", "ZeRO-2 +opt→CPU", "deepspeed", 2, "cpu",
             memory="zero2", oom_next="zero3-offload-opt",
             why="the optimizer states and step move to the CPU; no weights gathered",
             why_one_gpu="one GPU: nothing to partition; the optimizer states and step move to the CPU"),
    RungSpec("zero3-offload-opt", "ZeRO-3 + CPU optimizer offload", "ZeRO-3 +opt→CPU", "deepspeed", 3, "cpu",
             memory="zero3", one_gpu=(), oom_next="zero3-offload-all",
             why="weights partitioned and the optimizer on the CPU"),
    RungSpec("zero3-offload-all", "ZeRO-3 + CPU offload of optimizer and parameters", "ZeRO-3 +all→CPU",
             "deepspeed", 3, "cpu", "cpu", memory="zero3", methods=ALL_METHODS, auto=ALL_METHODS,
             oom_next="zero3-nvme",
             # for LoRA / QLoRA the weights are the frozen base, as peft's ZeRO-3 CPU-offload example runs it
             why="the weights live on the CPU too, fetched layer by layer",
             why_one_gpu="one GPU: nothing to partition; the weights and the optimizer live on the CPU, the weights "
                         "fetched layer by layer"),
    RungSpec("zero3-nvme", "ZeRO-3 + NVMe offload of optimizer and parameters", "ZeRO-3 +NVMe", "deepspeed", 3,
             "nvme", "nvme", memory="nvme", why="the optimizer states swap through NVMe: the last resort"),
    RungSpec("fsdp-noreshard", "FSDP2 without resharding (~ZeRO-2)", "FSDP2 keep", "fsdp", fsdp_reshard=False,
             memory="fsdp", methods=ALL_METHODS, auto=ADAPTERS, one_gpu=(), oom_next="fsdp-reshard",
             why="everything sharded; weights kept gathered between forward and backward"),
    RungSpec("fsdp-reshard", "FSDP2 with resharding (~ZeRO-3)", "FSDP2 reshard", "fsdp", fsdp_reshard=True,
             memory="fsdp", methods=ALL_METHODS, auto=ADAPTERS, one_gpu=(), oom_next="fsdp-offload", why="weights resharded after forward, gathered again in backward"),
    RungSpec("fsdp-offload", "FSDP2 + CPU offload", "FSDP2 +CPU", "fsdp", offload_optimizer="cpu",
             offload_param="cpu", fsdp_reshard=True, memory="fsdp", methods=ALL_METHODS, auto=ADAPTERS,
             why="weights, gradients and optimizer on the CPU, the step there",
             why_one_gpu="one GPU: nothing to shard; the weights, gradients and optimizer live on the CPU"),
    # Context parallelism (accelerate's ParallelismConfig cp_size, torch's ring attention over SDPA): each sequence
    # is split over cp GPUs of a machine, so each holds 1/cp of the activations and the logits. Not in the plain
    # walk: the plan tries them (context_parallel_keys) only when no rung without offload fits the sequence.
    *(RungSpec(f"fsdp-cp{cp}", f"FSDP2 + context parallel {cp}", f"FSDP2 +CP{cp}", "fsdp", fsdp_reshard=True,
               memory="fsdp", methods=ALL_METHODS, auto=(), one_gpu=(), cp_size=cp,
               oom_next=f"fsdp-cp{cp * 2}" if cp < 8 else "fsdp-offload",
               why=f"each sequence split over {cp} GPUs (ring attention): 1/{cp} of the activations and logits each")
      for cp in (2, 4, 8)),
    # HSDP (ParallelismConfig dp_replicate_size = machines, dp_shard_size = GPUs per machine): FSDP2's all-gathers and
    # reduce-scatters stay on the links inside a machine; between machines only a gradient all-reduce. Each GPU
    # holds 1/(GPUs per machine) of the states, not 1/(all GPUs). On the ladder with two machines or more.
    RungSpec("fsdp-hsdp", "FSDP2 HSDP (replica per machine)", "FSDP2 HSDP", "fsdp",
             fsdp_reshard=True, memory="fsdp", methods=ALL_METHODS, auto=(), one_gpu=(), replicate=True,
             oom_next="fsdp-reshard",
             why="sharded within each machine, one replica per machine: only a gradient all-reduce crosses the "
                 "network"),
    # Ulysses sequence parallelism (DeepSpeed ALST: accelerate's ParallelismConfig sp_size with sp_backend deepspeed,
    # DeepSpeed's UlyssesSPAttentionHF): each sequence is split over sp GPUs, which run 1/sp of its tokens through
    # every layer and, between two all-to-alls, attention over all of them for heads / sp heads. ZeRO partitions the
    # states over every process (DeepSpeed's sequence-data-parallel group). Not in the plain walk: the plan tries
    # them (sequence_parallel_keys) where the sequence is what costs memory, within a machine first. Optimizer
    # offload for full fine-tuning only, as the adapter ladder has none (the adapters' states are tiny).
    *(RungSpec(f"{base}-sp{sp}", f"{label} + Ulysses SP {sp}", f"{short} +SP{sp}", "deepspeed", stage, offload,
               memory=f"zero{stage}", methods=ALL_METHODS if offload == "none" else FULL, auto=(), one_gpu=(),
               sp_size=sp,
               oom_next=f"{base}-sp{sp * 2}" if sp < ULYSSES_SIZES[-1] else None,
               why=f"each sequence split over {sp} GPUs (Ulysses: two all-to-alls per layer, attention on heads/{sp} "
                   f"heads each): 1/{sp} of the activations and logits each; {why}")
      for base, label, short, stage, offload, why in (
          ("zero2", "DeepSpeed ZeRO-2", "ZeRO-2", 2, "none", "optimizer states and gradients partitioned"),
          ("zero3", "DeepSpeed ZeRO-3", "ZeRO-3", 3, "none", "weights partitioned too"),
          ("zero2-offload-opt", "ZeRO-2 + CPU optimizer offload", "ZeRO-2 +opt→CPU", 2, "cpu",
           "the optimizer on the CPU"),
          ("zero3-offload-opt", "ZeRO-3 + CPU optimizer offload", "ZeRO-3 +opt→CPU", 3, "cpu",
           "weights partitioned and the optimizer on the CPU"))
      for sp in ULYSSES_SIZES),
)

BY_KEY: dict[str, RungSpec] = {r.key: r for r in RUNGS}


def ladder(backend: str, zero_stage: str, offload: str, method: str, world_size: int) -> list[str]:
    """The keys of the entries these (already validated) options select: no-offload rungs first, then CPU
    offload, then NVMe, each in table order.

    `--backend auto` with `--zero-stage auto` walks single/DDP then the entries whose `auto` holds the method (for
    LoRA / QLoRA that includes FSDP: FSDP-QLoRA is the known recipe for a large model on small GPUs); a given
    stage, `--backend deepspeed` or `--backend fsdp` their own entries; `--backend ddp` the base."""
    base = "single" if world_size == 1 else "ddp"
    out = []
    for r in RUNGS:
        if method not in r.methods or r.splits_sequence or r.replicate:
            continue
        if r.backend in ("single", "ddp"):
            if r.key == base and (backend == "ddp" or (backend == "auto" and zero_stage == "auto"
                                                       and offload in ("auto", "none"))):
                out.append(r)
            continue
        if backend == "ddp" or backend not in ("auto", r.backend):
            continue
        if zero_stage != "auto":
            if str(r.zero_stage) != zero_stage:
                continue
        elif (backend == "auto" or r.backend == "deepspeed") and method not in r.auto:
            continue
        if offload != "auto" and r.offload_optimizer != offload:
            continue
        out.append(r)
    walking = backend == "auto" or (backend == "deepspeed" and zero_stage == "auto")
    if world_size == 1 and walking:
        # One GPU: a rung that only partitions (ZeRO-3, FSDP, ZeRO-3 + optimizer offload over ZeRO-2's) holds no
        # less than one that does not; the walk leaves it out unless its entry says why it is there.
        useful = [r for r in out if method in r.one_gpu]
        out = useful or out
    return [r.key for r in sorted(out, key=lambda r: (r.offloads, r.uses_nvme))]


def context_parallel_keys(backend: str, offload: str, method: str, per_machine: int, seq_len: int) -> list[str]:
    """The context-parallel entries these options allow, smallest cp first: FSDP2 (--backend auto or fsdp, no
    offload asked), cp GPUs within one machine (ring attention passes keys and values every layer), and a sequence
    torch's causal load balancer can cut into 2 x cp equal chunks (_HeadTailLoadBalancer: seq % (2 x cp) == 0).
    The FSDP version and the attention are the plan's to check (it knows them)."""
    if backend not in ("auto", "fsdp") or offload not in ("auto", "none"):
        return []
    return [r.key for r in RUNGS if r.cp_size > 1 and method in r.methods and r.cp_size <= per_machine
            and seq_len % (2 * r.cp_size) == 0]


def sequence_parallel_keys(backend: str, zero_stage: str, offload: str, method: str, allowed_sizes, world: int,
                           seq_len: int) -> list[str]:
    """The Ulysses entries these options allow, in table order (family, then size): DeepSpeed (--backend auto or
    deepspeed) at ZeRO-2 or 3 (--zero-stage auto, 2 or 3), without offload or with the optimizer on the CPU
    (--offload auto, none or cpu), at the sizes the model's heads allow (`allowed_sizes`,
    sequence.ulysses_sizes_allowed) that divide the processes (DeepSpeed's initialize_sequence_parallel) and the
    sequence (UlyssesSPDataLoaderAdapter: "seqlen ... isn't divisible by sp-size"). The attention and the task are the
    plan's to check."""
    if backend not in ("auto", "deepspeed") or offload == "nvme" or zero_stage not in ("auto", "2", "3"):
        return []
    out = []
    for r in RUNGS:
        if r.sp_size <= 1 or method not in r.methods:
            continue
        if zero_stage != "auto" and str(r.zero_stage) != zero_stage:
            continue
        if (offload == "none" and r.offloads) or (offload == "cpu" and not r.offloads):
            continue
        if r.sp_size in allowed_sizes and world % r.sp_size == 0 and seq_len % r.sp_size == 0:
            out.append(r.key)
    return out


def hsdp_keys(backend: str, offload: str, method: str, machines: int) -> list[str]:
    """The HSDP entries these options allow: FSDP2 (--backend auto or fsdp, no offload asked) over two machines or
    more. The FSDP version is the plan's to check."""
    if machines < 2 or backend not in ("auto", "fsdp") or offload not in ("auto", "none"):
        return []
    return [r.key for r in RUNGS if r.replicate and method in r.methods]


def why(key: str, world_size: int) -> str:
    """Why the ladder holds this rung, for this many processes."""
    r = BY_KEY[key]
    return r.why_one_gpu if world_size == 1 and r.why_one_gpu else r.why


# --- Recognising a rung from written files ---------------------------------------------------------

@dataclass(frozen=True)
class Strategy:
    """The strategy a set of files configures, in the table's words."""

    backend: str                          # single | ddp | deepspeed | fsdp
    zero_stage: int | None = None
    offload_optimizer: str = "none"
    offload_param: str = "none"
    fsdp_reshard: bool | None = None
    offload_fsdp: bool = False            # fsdp_offload_params
    cp_size: int = 1                      # parallelism_config_cp_size
    replicate: int = 1                    # parallelism_config_dp_replicate_size
    sp_size: int = 1                      # parallelism_config_sp_size (DeepSpeed's Ulysses)


def fsdp_reshards(value: Any) -> bool:
    """fsdp_reshard_after_forward (FSDP2 bool) or the FSDP1 sharding strategy it replaced, as a bool; accelerate's
    default (absent) reshards."""
    if value is None or value is True:
        return True
    return str(value).upper() in ("TRUE", "FULL_SHARD", "HYBRID_SHARD", "1")


def strategy_from_files(accel_config: dict[str, Any] | None, ds_config: dict[str, Any] | None) -> Strategy | None:
    """The strategy in accelerate's YAML and DeepSpeed's JSON (either may be None); None when neither says."""
    acc = accel_config or {}
    dtype = str(acc.get("distributed_type", "")).upper()
    if ds_config is not None or dtype == "DEEPSPEED":
        inline = acc.get("deepspeed_config") or {}
        zero = (ds_config or {}).get("zero_optimization") or {}
        stage = zero.get("stage")
        if stage is None:
            stage = inline.get("zero_stage")
        try:
            stage = int(stage if stage is not None else 0)
        except (TypeError, ValueError):
            stage = 0

        def device(which: str) -> str:
            if ds_config is not None:
                value = (zero.get(f"offload_{which}") or {}).get("device")
            else:
                value = inline.get(f"offload_{which}_device")
            return str(value).lower() if value else "none"

        return Strategy("deepspeed", stage, device("optimizer"), device("param"),
                        sp_size=parallelism_size(acc, "sp_size"))
    if dtype == "FSDP":
        fsdp = {k[5:] if k.startswith("fsdp_") else k: v for k, v in (acc.get("fsdp_config") or {}).items()}
        s = fsdp_strategy(fsdp)
        cp, replicate = parallelism_size(acc, "cp_size"), parallelism_size(acc, "dp_replicate_size")
        return Strategy(s.backend, fsdp_reshard=s.fsdp_reshard, offload_fsdp=s.offload_fsdp, cp_size=cp,
                        replicate=replicate) if cp > 1 or replicate > 1 else s
    if dtype.startswith("MULTI_"):
        return Strategy("ddp")
    if dtype == "NO" or (dtype == "" and acc):
        return Strategy("single")
    return None


def parallelism_size(accel_config: dict[str, Any], name: str) -> int:
    """`parallelism_config_<name>` of accelerate's YAML as a whole number >= 1 (1 when absent or unreadable)."""
    section = accel_config.get("parallelism_config") or {}
    if not isinstance(section, dict):
        return 1
    try:
        return max(int(section.get(f"parallelism_config_{name}") or 1), 1)
    except (TypeError, ValueError):
        return 1


def fsdp_strategy(options: dict[str, Any]) -> Strategy:
    """FSDP settings without their `fsdp_` prefix, as a Strategy."""
    reshard = options.get("reshard_after_forward", options.get("sharding_strategy"))
    return Strategy("fsdp", fsdp_reshard=fsdp_reshards(reshard),
                    offload_fsdp=str(options.get("offload_params")).lower() == "true")


def key_for(s: Strategy, processes: int | None = None, exact: bool = True) -> str | None:
    """The table's key for a strategy; None when no entry is exactly it (exact), else the closest entry of
    the same backend and stage (fewest differing offload devices; on a tie the later, more offloaded one).
    ZeRO-0 is DDP's memory: read as DDP when not exact. Without DeepSpeed or FSDP, `processes` (when known)
    tells one process from DDP."""
    if s.backend in ("single", "ddp"):
        return s.backend if processes is None else ("ddp" if processes > 1 else "single")
    if s.backend == "fsdp":
        if s.offload_fsdp:
            return "fsdp-offload"
        if s.cp_size > 1:
            same = [r for r in RUNGS if r.cp_size == s.cp_size]
            if same or exact:
                return same[0].key if same else None
            return max((r for r in RUNGS if r.cp_size > 1), key=lambda r: r.cp_size).key   # the closest: most split
        if s.replicate > 1:
            return next(r.key for r in RUNGS if r.replicate)
        return "fsdp-reshard" if s.fsdp_reshard else "fsdp-noreshard"
    same = [r for r in RUNGS if r.backend == "deepspeed" and r.zero_stage == s.zero_stage and r.sp_size == s.sp_size]
    if not same and s.sp_size > 1 and not exact:
        same = [r for r in RUNGS if r.backend == "deepspeed" and r.zero_stage == s.zero_stage and r.sp_size == 1]
    found = next((r.key for r in same if (r.offload_optimizer, r.offload_param) == (s.offload_optimizer,
                                                                                     s.offload_param)), None)
    if found or exact:
        return found
    if not same:
        return "ddp" if s.zero_stage == 0 else None

    def distance(r: RungSpec) -> int:
        return (r.offload_optimizer != s.offload_optimizer) + (r.offload_param != s.offload_param)

    best = min(distance(r) for r in same)
    return [r.key for r in same if distance(r) == best][-1]


def labels(keys: Iterable[str]) -> list[str]:
    return [BY_KEY[k].label for k in keys]


def next_after(rungs: list, key: str, key_of, fits_of):
    """What to try after the rung `key` failed (a CUDA out-of-memory): the first later rung of the plan's ladder
    that fits, else the next one up; None when `key` is the last rung or not in it. One rule for the plan's
    objects (planning.plan.next_rung) and for its JSON (launch.classify, reading wizard_plan.json)."""
    keys = [key_of(r) for r in rungs]
    if key not in keys:
        return None
    later = rungs[keys.index(key) + 1:]
    return next((r for r in later if fits_of(r)), later[0] if later else None)
