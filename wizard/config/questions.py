"""The question table: every question the wizard asks, in asking order, with why it matters.

One source of truth (DESIGN.md's CLI contract): the CLI flags (`--seq-len` <- id `seq_len`), the
answers-file keys, the TUI's fields and the plain prompts are all generated from `QUESTIONS`.
Conditions and defaults mirror `accelerate config` for "This machine" (shared/reference/accelerate.md
§2); where the wizard knows better than accelerate's static default (it has probed the machine and
planned the memory), the default is computed and `why_default` says why.

Values are normalised by `Question.parse`: ints as int, bools as bool, choices as their canonical
spelling (FSDP/dynamo names upper-case as accelerate writes them, the rest lower-case), unset as None.

Out of scope, never asked: SageMaker, TPU/XLA, Megatron-LM, non-NVIDIA accelerators, fp8, FSDP2's
parallelism config.

Pure and cheap to import: no torch, no UI.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from wizard.config.vocab import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS_OFFERED,
    DYNAMO_MODES,
    FSDP1_STATE_DICT_TYPES,
    FSDP2_STATE_DICT_TYPES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    MIXED_PRECISIONS,
)
from wizard.errors import InputError
from wizard.planning.plan import (
    ATTENTIONS,
    BACKENDS,
    GC_MODES,
    HEADROOM_ALLOWED,
    MAX_HEADROOM,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    TRAINERS,
    ZERO_STAGES,
    Plan,
)
from wizard.probe import catalogue
from wizard.probe.hardware import Hardware
from wizard.sizing.memory import CUDA_CONTEXT_BYTES
from wizard.sizing.model import TASKS as MODEL_TASKS
from wizard.sizing.model import ModelShape
from wizard.units import fmt_bytes, parse_bytes, parse_count

STAGES = ("model", "training", "strategy", "machines", "details")
KINDS = ("choice", "bool", "int", "float", "str", "path", "size", "count")
DETAIL_GROUPS = ("processes", "compile", "deepspeed", "multinode", "fsdp", "precision")

RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")     # what torchrun accepts
DEFAULT_PORT = 29500                                      # torchrun's and accelerate's default master port

_TRUE = {"yes", "y", "true", "on", "1"}
_FALSE = {"no", "n", "false", "off", "0"}


@dataclass
class Context:
    """What defaults, conditions and validation may look at."""
    hardware: Hardware
    model: ModelShape | None = None
    plan: Plan | None = None
    answers: dict[str, Any] = field(default_factory=dict)   # resolved so far, earlier questions first
    given: dict[str, Any] = field(default_factory=dict)     # raw values the user gave (flags > file), by id


def _always(ctx: Context) -> bool:
    return True


def _none(ctx: Context) -> Any:
    return None


@dataclass(frozen=True)
class Question:
    id: str
    prompt: str                            # short label
    help: str                              # why it matters, 1-3 sentences
    kind: str                              # one of KINDS
    stage: str                             # one of STAGES
    group: str                             # details: one of DETAIL_GROUPS; otherwise the stage name
    choices: tuple | None = None           # shown as a select; values are canonical
    advanced: bool = False                 # rarely needed: starts collapsed in the TUI
    flag: str | None = None                # '--seq-len'; None: no CLI flag
    metavar: str | None = None
    when: Callable[[Context], bool] = _always
    compute_default: Callable[[Context], Any] = _none
    explain_default: Callable[[Context], str] | str = ""
    check: Callable[[Any, Context, str], Any] | None = None      # raises InputError(field, ...); may
                                                                 # return a normalised value
    options_for: Callable[[Context], tuple] | None = None        # choices that depend on earlier answers
    required_when: Callable[[Context], str | None] | None = None  # reason a value is required, or None
    allowed: str | None = None             # what the error message says is allowed
    fixed_default: bool = False            # the default is one value, whatever the hardware and plan (--help)
    help_default: str | None = None        # what --help says the default is, where it is neither fixed nor the plan's

    # ---- the interface front ends use

    @property
    def field(self) -> str:
        """The name an error message uses: the flag without dashes, else the id."""
        return self.flag.lstrip("-") if self.flag else self.id

    def ask_if(self, ctx: Context) -> bool:
        return bool(self.when(ctx))

    def default(self, ctx: Context) -> Any:
        return self.compute_default(ctx)

    def why_default(self, ctx: Context) -> str:
        e = self.explain_default
        return e(ctx) if callable(e) else e

    def options(self, ctx: Context | None = None) -> tuple | None:
        if self.options_for is not None and ctx is not None:
            return self.options_for(ctx)
        return self.choices

    def required(self, ctx: Context) -> str | None:
        """Why a value must be given (no usable default), or None."""
        return self.required_when(ctx) if self.required_when else None

    def allowed_text(self, ctx: Context | None = None) -> str:
        if self.allowed:
            return self.allowed
        opts = self.options(ctx)
        if opts:
            return ", ".join(str(o) for o in opts)
        return _KIND_ALLOWED[self.kind]

    def coerce(self, raw: Any, field_name: str | None = None) -> Any:
        """Type-level normalisation, no context: what an answers file can be checked against on load."""
        f = field_name or self.field
        if raw is None or (isinstance(raw, str) and raw.strip() == "" and self.kind in ("str", "path")):
            return None
        if isinstance(raw, (list, dict, tuple, set)):
            raise InputError(f, f"expected a single value, got a {type(raw).__name__}", self.allowed_text())
        kind = self.kind
        if kind == "bool":
            return _coerce_bool(raw, f)
        if kind == "int":
            value = _coerce_int(raw, f, self.allowed_text())
        elif kind == "float":
            value = _coerce_float(raw, f, self.allowed_text())
        elif kind == "count":
            value = parse_count(raw, f)
        elif kind == "size":
            value = parse_bytes(raw, f)
        elif kind in ("str", "path"):
            if isinstance(raw, bool):
                raise InputError(f, f"expected text, got {raw!r}", self.allowed_text())
            value = str(raw).strip()
            if kind == "path":
                value = os.path.abspath(os.path.expanduser(value))
        elif kind == "choice":
            return _coerce_choice(raw, self.choices or (), f)
        else:  # pragma: no cover - the table is checked by tests
            raise ValueError(f"unknown kind {kind!r}")
        if self.choices is not None and value not in self.choices:
            raise InputError(f, f"{raw!r} is not one of the choices", self.allowed_text())
        return value

    def parse(self, raw: Any, ctx: Context) -> Any:
        """Normalise and validate one raw value; raises InputError naming `self.field`."""
        value = self.coerce(raw)
        if value is None:
            reason = self.required(ctx)
            if reason:
                raise InputError(self.field, f"a value is required {reason}", self.allowed_text(ctx))
            return None
        opts = self.options(ctx)
        if opts is not None and value not in opts:
            raise InputError(self.field, f"{raw!r} is not allowed here", self.allowed_text(ctx))
        if self.check is not None:
            checked = self.check(value, ctx, self.field)
            if checked is not None:
                value = checked
        return value


_KIND_ALLOWED = {
    "bool": "yes/no, true/false, on/off, 1/0",
    "int": "a whole number",
    "float": "a number",
    "str": "text",
    "path": "a path",
    "size": "a size such as 80G, 512GB or 24GiB",
    "count": "a positive count such as 7B, 350M or 1.5e9",
    "choice": "one of the choices",
}


# ----------------------------------------------------------------------------- coercion helpers

def _coerce_bool(raw: Any, f: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f, f"{raw!r} is not yes or no", _KIND_ALLOWED["bool"])


def _coerce_int(raw: Any, f: str, allowed: str) -> int:
    if isinstance(raw, bool):
        raise InputError(f, f"{raw!r} is not a whole number", allowed)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        if raw.is_integer():
            return int(raw)
        raise InputError(f, f"{raw!r} is not a whole number", allowed)
    text = str(raw).strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise InputError(f, f"{_shown(raw)} is not a whole number", allowed)
    if len(text.lstrip("+-")) > MAX_INT_DIGITS:
        raise InputError(f, f"{_shown(raw)} has more than {MAX_INT_DIGITS} digits", allowed)
    return int(text)


MAX_INT_DIGITS = 18        # every count the wizard takes fits in 10**18 (a 64-bit integer)


def _shown(raw: Any) -> str:
    """A value inside a one-line message: quoted, and cut short when it is long."""
    text = repr(raw)
    return text if len(text) <= 60 else text[:40] + f"...' ({len(str(raw))} characters)"


def _coerce_float(raw: Any, f: str, allowed: str) -> float:
    if isinstance(raw, bool):
        raise InputError(f, f"{raw!r} is not a number", allowed)
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        text = str(raw).strip()
        m = re.fullmatch(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(%?)", text)
        if not m:
            raise InputError(f, f"{raw!r} is not a number", allowed)
        value = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f, f"{raw!r} is not a finite number", allowed)
    return value


def _coerce_choice(raw: Any, choices: tuple, f: str) -> str:
    allowed = ", ".join(str(c) for c in choices)
    if isinstance(raw, bool):
        # YAML 1.1 reads `on`/`off`/`yes`/`no` as booleans; map them back when a choice is spelt so.
        for word in (("on", "yes", "true") if raw else ("off", "no", "false")):
            if word in choices:
                return word
        raise InputError(f, f"{raw!r} is not one of the choices", allowed)
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    text = str(raw).strip()
    for c in choices:
        if str(c).lower() == text.lower():
            return c
    raise InputError(f, f"{raw!r} is not one of the choices", allowed)


# ----------------------------------------------------------------------------- context helpers

def _a(ctx: Context, key: str, fallback: Any = None) -> Any:
    return ctx.answers.get(key, fallback)


def _num_machines(ctx: Context) -> int:
    return int(_a(ctx, "num_machines", 1) or 1)


def _multi_node(ctx: Context) -> bool:
    return _num_machines(ctx) > 1


def _use_cpu(ctx: Context) -> bool:
    return bool(_a(ctx, "use_cpu", False))


def _given_bool(ctx: Context, key: str) -> bool | None:
    raw = ctx.given.get(key)
    if raw is None:
        return None
    try:
        return _coerce_bool(raw, key)
    except InputError:
        return None


def _chosen_backend(ctx: Context) -> str | None:
    """The plan's backend (single|ddp|deepspeed|fsdp) once planned; before that, the explicit strategy answer."""
    if ctx.plan is not None and ctx.plan.choice is not None:
        return ctx.plan.choice.backend
    b = _a(ctx, "backend", "auto")
    return None if b in (None, "auto") else b


def _chosen_zero_stage(ctx: Context) -> int | None:
    if ctx.plan is not None and ctx.plan.choice is not None:
        return ctx.plan.choice.zero_stage
    z = _a(ctx, "zero_stage", "auto")
    return None if z in (None, "auto") else int(z)


def _is_deepspeed(ctx: Context) -> bool:
    return _chosen_backend(ctx) == "deepspeed"


def _is_fsdp(ctx: Context) -> bool:
    return _chosen_backend(ctx) == "fsdp"


def _fsdp_version(ctx: Context) -> int:
    return int(_a(ctx, "fsdp_version", 2) or 2)


def _dist_type(ctx: Context) -> str:
    return distributed_type_for(ctx.answers, ctx.plan)


def _selected_gpu_count(ctx: Context) -> int:
    """GPUs per machine the processes may use: the gpu_ids subset, else every GPU probed."""
    ids = _a(ctx, "gpu_ids", "all")
    if ids and ids != "all":
        return len(str(ids).split(","))
    return ctx.hardware.num_gpus


def distributed_type_for(answers: dict[str, Any], plan: Plan | None) -> str:
    """accelerate's distributed_type for these answers and this plan (see answers.distributed_type)."""
    if plan is not None and plan.choice is not None:
        backend = plan.choice.backend
    else:
        backend = answers.get("backend", "auto") or "auto"
    num_machines = int(answers.get("num_machines", 1) or 1)
    num_processes = int(answers.get("num_processes", 1) or 1)
    use_cpu = bool(answers.get("use_cpu", False))
    if backend == "deepspeed":
        return "DEEPSPEED"
    if backend == "fsdp":
        return "FSDP"
    # accelerate refuses MULTI_GPU with one process on one machine ("Please select `No distributed
    # training`"), so a one-process data-parallel plan is written as 'NO'.
    if backend == "single" or (num_processes <= 1 and num_machines <= 1):
        return "NO"
    return "MULTI_CPU" if use_cpu else "MULTI_GPU"


# ----------------------------------------------------------------------------- validation helpers

def _at_least(minimum: int | float, what: str = "a whole number") -> Callable[[Any, Context, str], None]:
    def check(value: Any, ctx: Context, f: str) -> None:
        if value < minimum:
            raise InputError(f, f"{value} is too small; it must be at least {minimum}", f"{what} >= {minimum}")
    return check


_positive = _at_least(1)

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
    if not 0 < value <= 100_000:
        raise InputError(f, f"{value:g} Gb/s is out of range", "Gb/s per machine, a number in (0, 100000]")


def _inter_node_why(ctx: Context) -> str:
    if ctx.hardware is None:
        return "Unset: what the machine class has (8 x 400 Gb/s for an H100 server, 8 x 200 for A100, else 100)."
    from wizard.planning.speed import inter_node_gbps
    gbps, source = inter_node_gbps(ctx.hardware)
    return f"Unset: {gbps:g} Gb/s, {source}."


def _check_port(value: int, ctx: Context, f: str) -> None:
    if not 0 <= value <= 65535:
        raise InputError(f, f"{value} is not a port", "0 (any free port) or 1..65535")


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


def _check_bf16(value: str, ctx: Context, f: str) -> None:
    hw = ctx.hardware
    if value != "bf16" or not hw.gpus or hw.all_bf16:
        return
    if _use_cpu(ctx) or _given_bool(ctx, "use_cpu"):
        return
    old = next(g for g in hw.gpus if not g.bf16)
    cc = ".".join(map(str, old.compute_capability)) if old.compute_capability else "unknown"
    raise InputError(f, f"bf16 needs compute capability 8.0+, GPU {old.index} ({old.name}) has {cc}",
                     "fp16 or fp32 on this hardware")


_PRECISION_OF_MIXED = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}


def _check_mixed_precision(value: str, ctx: Context, f: str) -> None:
    _check_bf16(value, ctx, f)
    check_precision_pair(ctx.given.get("precision"), value, f)


def check_precision_pair(precision: Any, mixed: Any, f: str = "mixed-precision") -> None:
    """--mixed-precision must say what --precision said (else the plan's memory and the file disagree);
    checked on the raw answers, whether or not the plan's backend asks for mixed precision."""
    if precision is None or mixed is None:
        return
    wanted, value = str(precision).strip().lower(), str(mixed).strip().lower()
    if wanted not in _PRECISION_OF_MIXED.values() or value not in _PRECISION_OF_MIXED:
        return          # auto, or a value the table's own check refuses with its own message
    if _PRECISION_OF_MIXED[value] != wanted:
        same = next(k for k, v in _PRECISION_OF_MIXED.items() if v == wanted)
        raise InputError(f, f"{value!r} conflicts with --precision {wanted}",
                         f"{same} (what --precision {wanted} means), or drop one of the two")


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


# ----------------------------------------------------------------------------- the table

def _q(id: str, prompt: str, help: str, kind: str, stage: str, *, group: str | None = None,
       flag: str | None | bool = True, default: Any = None, why: Callable[[Context], str] | str = "",
       **kw: Any) -> Question:
    """Build a Question; the flag follows the id ('seq_len' -> '--seq-len') unless given."""
    if flag is True:
        flag = "--" + id.replace("_", "-")
    elif flag is False:
        flag = None
    compute = default if callable(default) else (lambda ctx, v=default: v)
    if "metavar" not in kw:
        kw["metavar"] = _METAVARS.get(kind)
    if kw.get("check") is _positive and "allowed" not in kw:
        kw["allowed"] = "a whole number >= 1"
    return Question(id=id, prompt=prompt, help=help, kind=kind, stage=stage, group=group or stage,
                    flag=flag, compute_default=compute, explain_default=why, fixed_default=not callable(default),
                    **kw)


def _shape_override(id: str, prompt: str, help: str) -> Question:
    """An advanced override of one dimension of the Llama-like shape that --params estimates."""
    return _q(id, prompt, help, "int", "model", advanced=True, check=_positive,
              when=lambda ctx: _a(ctx, "params") is not None,
              why="Derived from the parameter count (Llama-like shape).")


_METAVARS = {"int": "N", "float": "X", "count": "N", "size": "SIZE", "path": "PATH", "str": "TEXT",
             "bool": "yes|no", "choice": None}


def _details(group: str) -> dict[str, Any]:
    return {"stage": "details", "group": group, "advanced": group in ("processes", "compile")}


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
       "int", "machines", metavar="PORT", when=_multi_node, default=DEFAULT_PORT, check=_check_port,
       allowed="0 (any free port) or 1..65535",
       why="29500 is torchrun's default; pick another when two jobs share a machine."),
    _q("inter_node_gbps", "Network between machines (Gb/s per machine)",
       "All of one machine's NICs to the others together, e.g. 3200 for 8 x 400 Gb/s; it sets the speed of "
       "every collective that crosses machines.", "float", "machines", metavar="GBPS", advanced=True,
       when=_multi_node, check=_check_gbps, allowed="Gb/s per machine, a number in (0, 100000] such as 400 or 3200",
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
       "loaded once per process into CPU RAM.", "bool", default=True, when=_is_fsdp,
       why="On: N processes would otherwise each hold a full copy in CPU RAM.", **_details("fsdp")),
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

    # ---------------------------------------------------------------- details: precision
    _q("mixed_precision", "Mixed precision",
       "What accelerate autocasts to; it must match the precision the plan assumed or memory and speed "
       "will differ.", "choice", choices=MIXED_PRECISIONS, default=_mixed_precision_default,
       why=_mixed_precision_why, check=_check_mixed_precision,
       # With a DeepSpeed config file accelerate neither asks nor accepts it: precision lives in the JSON.
       when=lambda ctx: not _is_deepspeed(ctx), **_details("precision")),
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
