"""The question table's machinery: `Question` and its `Context`, value coercion, the helpers that read the
answers so far, and `_q` / `_details` that build the table's entries (questions.py: the pre-plan questions and the
table; detail_questions.py: what is asked after the plan).

Pure and cheap to import: no torch, no UI.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from wizard.errors import InputError
from wizard.planning.plan import Plan
from wizard.probe.hardware import Hardware
from wizard.sizing.model import ModelShape
from wizard.units import parse_bytes, parse_count

STAGES = ("model", "training", "strategy", "machines", "details")
KINDS = ("choice", "bool", "int", "float", "str", "path", "size", "count")
DETAIL_GROUPS = ("processes", "compile", "deepspeed", "multinode", "fsdp", "parallelism", "precision")

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
    why_not: Callable[[Any, Context], str | None] | None = None  # why a choice options_for leaves out is not
                                                                 # offered here (the error's problem)
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
            reason = self.why_not(value, ctx) if self.why_not is not None else None
            raise InputError(self.field, reason or f"{raw!r} is not allowed here", self.allowed_text(ctx))
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


_PRECISION_OF_MIXED = {"bf16": "bf16", "fp16": "fp16", "no": "fp32", "fp8": "bf16"}   # fp8: bf16 beside the fp8 matmuls

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


# ----------------------------------------------------------------------------- building the table

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


_METAVARS = {"int": "N", "float": "X", "count": "N", "size": "SIZE", "path": "PATH", "str": "TEXT",
             "bool": "yes|no", "choice": None}


def _details(group: str) -> dict[str, Any]:
    return {"stage": "details", "group": group, "advanced": group in ("processes", "compile")}
