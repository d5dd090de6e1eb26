"""What every rule needs: the loaded inputs (CheckContext), the registry, and small accessors.

The context holds the files exactly as read (raw text too: some problems, like an unquoted `NO`,
are only visible there) plus what they mean once combined: which backend is in effect, the ZeRO
stage, the FSDP options, the TrainingArguments values (user's, over transformers' defaults).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from wizard.findings import Finding

# ----------------------------------------------------------------------------- registry


@dataclass
class Rule:
    id: str
    family: str                    # integration | accelerate | deepspeed | hardware | library | method
    summary: str
    func: Callable[["CheckContext"], Iterable[Finding]]
    fixable: bool = False


RULES: list[Rule] = []
# rule id -> fixer(ctx, findings of that rule) -> list of "what changed" lines; edits ctx.acc / ctx.ds in place
FIXERS: dict[str, Callable[["CheckContext", list[Finding]], list[str]]] = {}


def rule(rule_id: str, family: str, summary: str, fixable: bool = False):
    def register(func):
        RULES.append(Rule(rule_id, family, summary, func, fixable))
        return func
    return register


def fixer(rule_id: str):
    def register(func):
        FIXERS[rule_id] = func
        return func
    return register


# ----------------------------------------------------------------------------- context


@dataclass(frozen=True)
class PlannedFiles:
    """What the check before a write knows beyond the files: the answers and the plan they were written
    from, and the names the findings give the scratch copies (the final paths)."""
    answers: dict[str, Any] | None
    plan: Any                                  # wizard.planning.plan.Plan
    model: Any                                 # wizard.sizing.model.ModelShape
    displays: dict[str, str] = field(default_factory=dict)   # scratch path -> final path


@dataclass
class PlainScalar:
    """A YAML scalar written without quotes, as it appeared in the file."""
    raw: str
    line: int                      # 1-based
    tag: str                       # what YAML resolved it to, e.g. tag:yaml.org,2002:bool


@dataclass
class CheckContext:
    # accelerate YAML
    acc_path: str | None = None
    acc_text: str | None = None
    acc: dict[str, Any] | None = None
    acc_plain: dict[tuple[str, ...], PlainScalar] = field(default_factory=dict)
    # DeepSpeed JSON (from --ds-config, TrainingArguments(deepspeed=...) or the YAML's deepspeed_config_file)
    ds_path: str | None = None
    ds_text: str | None = None
    ds: dict[str, Any] | None = None
    ds_duplicates: list[tuple[str, str]] = field(default_factory=list)   # (dotted parent path, key)
    ds_from: str | None = None            # "--ds-config" | "training-args" | "deepspeed_config_file"
    ds_missing_ref: str | None = None     # the YAML names a deepspeed_config_file that does not exist
    # TrainingArguments keyword arguments (what the user passes in code)
    ta_path: str | None = None
    ta: dict[str, Any] | None = None
    ta_ignored: list[str] = field(default_factory=list)   # keys of a training YAML that are not TrainingArguments
    # model, hardware, trainer, versions
    model_id: str | None = None
    model: Any = None                     # wizard.sizing.model.ModelShape
    module_classes: set[str] | None = None  # class names of every module of the model (meta build)
    hardware: Any = None                  # wizard.probe.hardware.Hardware
    trainer: str = "hf"                   # hf: HF Trainer; accelerate: own loop with accelerator.prepare
    seq_len: int = 2048
    versions: dict[str, str | None] = field(default_factory=dict)
    method: Any = None                    # wizard.sizing.lora.LoraOptions from --method lora/qlora; None: full fine-tuning
    aio_available: bool | None = None     # DeepSpeed's async_io op builds here; None: ask DeepSpeed
    fp8_backends: tuple[str, ...] | None = None   # fp8 backends (ao, te) importable here; None: look (config.fp8)
    # the live machine, as an input: port -> "something listens there now"; None: probe this machine
    port_in_use: Callable[[int], bool] | None = None
    # () -> this machine's RLIMIT_MEMLOCK (soft) in bytes, None when unlimited; None: read this machine
    memlock_limit: Callable[[], int | None] | None = None
    # a SkyPilot task file (`--sky-task`) that runs this config (check/rules/sky_task.py)
    sky_path: str | None = None
    sky: dict[str, Any] | None = None
    # files the wizard is about to write, with the plan they were written for (check/rules/planned.py)
    planned: "PlannedFiles | None" = None
    # the wizard_plan.json the wizard wrote beside the YAML, when there is one (what it planned the files for)
    plan_beside: dict[str, Any] | None = None
    # cached results shared between rules
    cache: dict[str, Any] = field(default_factory=dict)

    # --- accelerate YAML ----------------------------------------------------------------------
    def acc_get(self, *path: str, default: Any = None) -> Any:
        node: Any = self.acc or {}
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    @property
    def distributed_type(self) -> str | None:
        value = self.acc_get("distributed_type")
        return value if isinstance(value, str) else None

    @property
    def num_machines(self) -> int:
        return as_int(self.acc_get("num_machines"), 1) or 1

    @property
    def num_processes(self) -> int:
        """Total processes over all machines, as accelerate means it (-1/absent: 1 for `NO`)."""
        n = as_int(self.acc_get("num_processes"), None)
        return n if n and n > 0 else 1

    @property
    def uses_deepspeed(self) -> bool:
        return self.distributed_type == "DEEPSPEED" or bool(self.ta_given("deepspeed")) or self.ds is not None

    @property
    def hf_trainer(self) -> bool:
        """transformers' Trainer fills "auto" (trl's trainers are Trainer subclasses)."""
        return self.trainer in ("hf", "trl")

    @property
    def uses_fsdp(self) -> bool:
        return self.distributed_type == "FSDP" or bool(self.ta_given("fsdp"))

    def fsdp_options(self) -> dict[str, Any]:
        """FSDP settings without the `fsdp_` prefix: the YAML's fsdp_config, then TrainingArguments.fsdp_config."""
        out: dict[str, Any] = {}
        sources = [self.acc_get("fsdp_config") if self.distributed_type == "FSDP" else None]
        ta_cfg = self.ta_given("fsdp_config")
        sources.append(ta_cfg if isinstance(ta_cfg, dict) else None)
        for src in sources:
            for key, value in (src or {}).items():
                out[key[5:] if key.startswith("fsdp_") else key] = value
        return out

    # --- DeepSpeed ----------------------------------------------------------------------------
    def ds_get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.ds or {}
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    def zero_stage(self) -> int | None:
        """The ZeRO stage in effect, from whichever file carries it: the JSON's zero_optimization.stage (given
        with --ds-config, named by the YAML or by TrainingArguments.deepspeed, or built by accelerate from an
        inline YAML), else the YAML's inline zero_stage. None when DeepSpeed is not used or the stage is not a
        number."""
        if not self.uses_deepspeed:
            return None
        if self.ds is not None:
            stage = self.ds_get("zero_optimization.stage", 0)
            return as_int(stage, None)
        stage = self.acc_get("deepspeed_config", "zero_stage")
        # DeepSpeedPlugin without a config file: ACCELERATE_DEEPSPEED_ZERO_STAGE, default 2.
        return as_int(stage, None) if stage is not None else 2

    @property
    def ds_is_virtual(self) -> bool:
        """The DeepSpeed config is what accelerate builds from the YAML's inline deepspeed_config (no JSON)."""
        return self.ds_from == "accelerate-yaml"

    def offload_device(self, which: str) -> str:
        """'none' | 'cpu' | 'nvme' for which in (optimizer, param)."""
        if self.ds is not None:
            value = self.ds_get(f"zero_optimization.offload_{which}.device", "none")
        else:
            value = self.acc_get("deepspeed_config", f"offload_{which}_device", default="none")
        return str(value).lower() if value is not None else "none"

    # --- TrainingArguments --------------------------------------------------------------------
    def ta_given(self, name: str) -> Any:
        return (self.ta or {}).get(name)

    def ta_value(self, name: str) -> Any:
        """The user's value, else the default of the trainer's arguments class."""
        if self.ta and name in self.ta:
            return self.ta[name]
        return trainer_defaults(self.trainer, self.ta).get(name)

    def activation_checkpointing(self) -> bool:
        # transformers 5: gradient_checkpointing is a deprecated alias of activation_checkpointing.
        return bool(self.ta_value("activation_checkpointing") or self.ta_value("gradient_checkpointing"))

    def accelerator_config(self) -> dict[str, Any]:
        value = self.ta_given("accelerator_config")
        return value if isinstance(value, dict) else {}


def as_int(value: Any, default: int | None) -> int | None:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return default


@functools.lru_cache(maxsize=1)
def training_defaults() -> dict[str, Any]:
    """TrainingArguments' field defaults, read from the dataclass without instantiating it
    (instantiating checks the device: bf16=True raises on a CPU box)."""
    from transformers import TrainingArguments

    out: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
    return out


# trl's SFTConfig defaults that differ from TrainingArguments, as trl states them (trl 1.10.0.dev0,
# trl/trainer/sft_config.py docstring); used when trl is not installed here.
TRL_SFT_STATED_DEFAULTS: dict[str, Any] = {"learning_rate": 2e-5, "logging_steps": 10,
                                           "gradient_checkpointing": True}


@functools.lru_cache(maxsize=1)
def trl_sft_defaults() -> tuple[dict[str, Any], str]:
    """SFTConfig's defaults that differ from TrainingArguments', and where they come from."""
    base = training_defaults()
    try:
        from trl import SFTConfig  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - trl missing or broken: what trl states
        return dict(TRL_SFT_STATED_DEFAULTS), "stated (trl not installed)"
    out: dict[str, Any] = {}
    for f in dataclasses.fields(SFTConfig):
        if f.default is not dataclasses.MISSING and f.name in base and f.default != base[f.name]:
            out[f.name] = f.default
    return out, "installed trl"


def trainer_defaults(trainer: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The defaults a value not given falls back to: TrainingArguments', or SFTConfig's for trl (whose bf16
    defaults to True unless fp16 is set)."""
    if trainer != "trl":
        return training_defaults()
    out = dict(training_defaults())
    out.update(trl_sft_defaults()[0])
    out["bf16"] = not bool((given or {}).get("fp16"))
    return out


@functools.lru_cache(maxsize=1)
def training_fields() -> frozenset[str]:
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments) if f.init)


def finding(severity: str, rule_id: str, file: str | None, key: str | None, message: str,
            fix: str | None = None, when: str | None = None, fixable: bool = False) -> Finding:
    return Finding(severity=severity, rule=rule_id, file=file or "<none>", key=key, message=message,
                   fix=fix, when=when, fixable=fixable)


# A file can repeat one problem thousands of times (200,000 unknown keys): past this many findings of one rule in
# one file, the rest are one finding that counts them, so the report stays readable and the work stays linear.
MAX_FINDINGS_PER_RULE = 20


def more_like_these(severity: str, rule_id: str, file: str | None, keys: list, what: str,
                    fix: str | None = None, when: str | None = None) -> Finding:
    """One finding for the keys past MAX_FINDINGS_PER_RULE: how many, and the first few by name."""
    names = ", ".join(repr(str(k)[:40]) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return finding(severity, rule_id, file, None,
                   f"{len(keys):,} more {what} besides the {MAX_FINDINGS_PER_RULE} listed: {names}", fix=fix, when=when)


def walk(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Every (dotted path, value) of leaves and branches of nested dicts."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, value
            yield from walk(value, path)


def older(version: str | None, minimum: str) -> bool:
    """True when an installed `version` is below `minimum` (unknown or unparsable versions are not)."""
    if not version:
        return False
    from packaging.version import InvalidVersion, Version
    try:
        return Version(version) < Version(minimum)
    except InvalidVersion:
        return False


def relative_to_naming_file(path: str, base_file: str | None) -> str:
    """A relative path as the script would see it (cwd), else next to the file that names it."""
    path = os.path.expanduser(path)
    if os.path.isabs(path) or os.path.exists(path) or not base_file:
        return path
    directory = os.path.dirname(os.path.abspath(base_file))
    while True:
        # beside the naming file, then each folder above it: a training YAML's `deepspeed: examples/ds.json`
        # is relative to the repository root the script is started from
        candidate = os.path.join(directory, path)
        if os.path.exists(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return path
        directory = parent
