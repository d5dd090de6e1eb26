"""`wizard check --method lora|qlora`: are peft (and, for QLoRA, bitsandbytes) installed in versions that
support what the files plan?

These rules are in the one registry (family "method") and say nothing unless a method is given
(`ctx.method`): a full fine-tuning check never sees them.

Minimum versions, and where each comes from:
- peft >= 0.8.0 for `target_modules="all-linear"`: the shorthand was added by huggingface/peft PR #1295
  (merged December 2023) and first released in v0.8.0; older peft looks for a module literally named
  "all-linear" and raises "Target modules ... not found in the base model".
- QLoRA with its 4-bit weights partitioned (DeepSpeed ZeRO-3 or FSDP): peft >= 0.10.0, bitsandbytes >= 0.43.0,
  transformers >= 4.39.0 (`bnb_4bit_quant_storage` in BitsAndBytesConfig: "transformers>4.38.2"): the peft
  v0.10.0 release notes ("Support for QLoRA with DeepSpeed ZeRO3 and FSDP ... requires bitsandbytes>=0.43.0,
  accelerate>=0.28.0, transformers>4.38.2"). accelerate's 0.28.0 is below what transformers' Trainer asks
  anyway (VER-ACCELERATE-OLD), so it needs no rule here.
- QLoRA at all: the bitsandbytes that the installed transformers itself demands before it quantises
  (transformers.utils.import_utils.BITSANDBYTES_MIN_VERSION, 0.46.1 in transformers 5.24; the 4-bit
  quantiser raises ImportError below it), read from the installed transformers.
- QLoRA with ZeRO-3 also needs accelerate's `zero3_init_flag: true` (peft's DeepSpeed guide, and
  wizard.sizing.lora.qlora_requirements): the wizard's emitter refuses the opposite; a hand-written YAML is
  flagged here.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, older, rule
from wizard.findings import Finding

ENVIRONMENT = "<environment>"
PEFT_ALL_LINEAR = "0.8.0"
PEFT_SHARDED_QLORA = "0.10.0"
BNB_SHARDED_QLORA = "0.43.0"
TRANSFORMERS_QUANT_STORAGE = "4.39.0"
# Used only when the installed transformers does not say (it is not installed, or has no such constant).
BNB_FALLBACK_MINIMUM = "0.39.0"     # the first bitsandbytes with 4-bit (NF4/FP4) Linear4bit, for QLoRA


def method_rule(rule_id: str, summary: str):
    """A rule of the "method" family: `func(ctx, options)` runs only for --method lora/qlora."""
    def register(func):
        @functools.wraps(func)
        def with_options(ctx: CheckContext) -> Iterable[Finding]:
            options = ctx.method
            if options is None or options.method not in ("lora", "qlora"):
                return ()
            return func(ctx, options)
        rule(rule_id, "method", summary)(with_options)
        return func
    return register


def method_options(method: str, rank: Any = 16, targets: str | None = None):
    """wizard.sizing.lora.LoraOptions from `wizard check --method/--lora-rank/--lora-targets`; None for full.
    InputError (exit 2) for a bad value."""
    from wizard.sizing.lora import lora_options
    options = lora_options(method, rank, targets=targets)
    return None if options.method == "full" else options


def installed_version(ctx: CheckContext, name: str) -> str | None:
    """ctx.versions[name] when given (tests, check_texts callers), else the installed distribution's."""
    if name in ctx.versions:
        return ctx.versions[name]
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def sharded_qlora(ctx: CheckContext, options) -> bool:
    """QLoRA whose 4-bit weights are partitioned: DeepSpeed ZeRO-3 or FSDP."""
    return options.method == "qlora" and (ctx.zero_stage() == 3 or ctx.uses_fsdp)


def _strategy(ctx: CheckContext) -> str:
    return "FSDP" if ctx.uses_fsdp else "DeepSpeed ZeRO-3"


def transformers_bnb_minimum() -> str:
    """The bitsandbytes version the installed transformers requires for 4-bit loading."""
    try:
        from transformers.utils.import_utils import BITSANDBYTES_MIN_VERSION
    except ImportError:
        return BNB_FALLBACK_MINIMUM
    return str(BITSANDBYTES_MIN_VERSION)


def _max_version(*versions: str) -> str:
    from packaging.version import Version
    return max(versions, key=Version)


@method_rule("METHOD-PEFT-MISSING", "--method lora/qlora without peft installed")
def peft_missing(ctx: CheckContext, options) -> Iterable[Finding]:
    if installed_version(ctx, "peft") is None:
        yield finding("error", "METHOD-PEFT-MISSING", ENVIRONMENT, "peft",
                      f"--method {options.method} needs peft (LoraConfig, get_peft_model), which is not installed: "
                      "the training script fails at its import", fix=f"pip install {peft_requirement(ctx, options)}",
                      when="launch")


def peft_requirement(ctx: CheckContext, options) -> str:
    """'peft' or 'peft>=X' (quoted for the shell) for what this plan uses."""
    needs = []
    if options.targets == "all-linear":
        needs.append(PEFT_ALL_LINEAR)
    if sharded_qlora(ctx, options):
        needs.append(PEFT_SHARDED_QLORA)
    return f"'peft>={_max_version(*needs)}'" if needs else "peft"


@method_rule("METHOD-PEFT-OLD", "peft too old for all-linear targets or sharded QLoRA")
def peft_old(ctx: CheckContext, options) -> Iterable[Finding]:
    version = installed_version(ctx, "peft")
    reasons = []
    if options.targets == "all-linear" and older(version, PEFT_ALL_LINEAR):
        reasons.append(f"target_modules='all-linear' exists from peft {PEFT_ALL_LINEAR} (older peft looks for a "
                       "module named 'all-linear' and finds none)")
    if sharded_qlora(ctx, options) and older(version, PEFT_SHARDED_QLORA):
        reasons.append(f"QLoRA with {_strategy(ctx)} is supported from peft {PEFT_SHARDED_QLORA}")
    if reasons:
        yield finding("error", "METHOD-PEFT-OLD", ENVIRONMENT, "peft",
                      f"peft {version} is too old for this plan: " + "; ".join(reasons),
                      fix=f"pip install -U {peft_requirement(ctx, options)}", when="prepare")


def bnb_minimum(ctx: CheckContext, options) -> str:
    needs = [transformers_bnb_minimum()]
    if sharded_qlora(ctx, options):
        needs.append(BNB_SHARDED_QLORA)
    return _max_version(*needs)


@method_rule("METHOD-BNB-MISSING", "--method qlora without bitsandbytes installed")
def bnb_missing(ctx: CheckContext, options) -> Iterable[Finding]:
    if options.method == "qlora" and installed_version(ctx, "bitsandbytes") is None:
        yield finding("error", "METHOD-BNB-MISSING", ENVIRONMENT, "bitsandbytes",
                      "--method qlora loads the base in 4 bits with bitsandbytes, which is not installed: "
                      "from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True)) raises ImportError "
                      "(the wizard sizes QLoRA without it; training needs it)",
                      fix=f"pip install 'bitsandbytes>={bnb_minimum(ctx, options)}'", when="launch")


@method_rule("METHOD-BNB-OLD", "bitsandbytes too old for 4-bit loading or sharded QLoRA")
def bnb_old(ctx: CheckContext, options) -> Iterable[Finding]:
    if options.method != "qlora":
        return
    version = installed_version(ctx, "bitsandbytes")
    reasons = []
    base = transformers_bnb_minimum()
    if older(version, base):
        reasons.append(f"the installed transformers loads 4-bit weights only with bitsandbytes >= {base}")
    if sharded_qlora(ctx, options) and older(version, BNB_SHARDED_QLORA):
        reasons.append(f"{_strategy(ctx)} partitions the 4-bit weights only when bnb_4bit_quant_storage is a float "
                       f"dtype, which bitsandbytes supports from {BNB_SHARDED_QLORA}")
    if reasons:
        yield finding("error", "METHOD-BNB-OLD", ENVIRONMENT, "bitsandbytes",
                      f"bitsandbytes {version} is too old for this plan: " + "; ".join(reasons),
                      fix=f"pip install -U 'bitsandbytes>={bnb_minimum(ctx, options)}'", when="launch")


@method_rule("METHOD-TRANSFORMERS-QUANT-STORAGE", "sharded QLoRA with transformers below 4.39 (no quant storage)")
def transformers_quant_storage(ctx: CheckContext, options) -> Iterable[Finding]:
    version = installed_version(ctx, "transformers")
    if sharded_qlora(ctx, options) and older(version, TRANSFORMERS_QUANT_STORAGE):
        yield finding("error", "METHOD-TRANSFORMERS-QUANT-STORAGE", ENVIRONMENT, "transformers",
                      f"transformers {version} has no bnb_4bit_quant_storage (from {TRANSFORMERS_QUANT_STORAGE}): "
                      f"the 4-bit weights stay uint8, which {_strategy(ctx)} cannot partition with the rest",
                      fix=f"pip install -U 'transformers>={TRANSFORMERS_QUANT_STORAGE}'", when="prepare")


@method_rule("METHOD-QLORA-ZERO3-INIT", "QLoRA with ZeRO-3 and zero3_init_flag false")
def qlora_zero3_init(ctx: CheckContext, options) -> Iterable[Finding]:
    if options.method != "qlora" or ctx.zero_stage() != 3 or ctx.acc is None:
        return
    flag = ctx.acc_get("deepspeed_config", "zero3_init_flag")
    if flag is True or str(flag).lower() == "true":
        return
    yield finding("error", "METHOD-QLORA-ZERO3-INIT", ctx.acc_path, "deepspeed_config.zero3_init_flag",
                  f"QLoRA with DeepSpeed ZeRO-3 needs zero3_init_flag: true (peft's guide 'Use PEFT QLoRA and DeepSpeed "
                  f"with ZeRO3'); it is {flag!r}", fix="set deepspeed_config.zero3_init_flag: true", when="prepare")


@method_rule("METHOD-FSDP1-REENTRANT-CHECKPOINT",
             "adapters under FSDP1 with transformers 4.x's reentrant gradient checkpointing")
def fsdp1_reentrant_checkpoint(ctx: CheckContext, options) -> Iterable[Finding]:
    """transformers 4.x checkpoints the FSDP1 unit's __call__ reentrantly (use_reentrant=True unless
    gradient_checkpointing_kwargs says otherwise), and FSDP1's hook on each frozen layer unit's input keeps that
    input and its gradient until backward ends (memory.fsdp1_retained_checkpoint_bytes, MEASURED with
    bench/measure_fsdp_activations.py). Needs the TrainingArguments (--training-args) to know checkpointing is on."""
    if ctx.ta is None or not ctx.uses_fsdp or as_int(ctx.fsdp_options().get("version"), 1) != 1:
        return
    if not ctx.activation_checkpointing():
        return
    kwargs = ctx.ta_value("gradient_checkpointing_kwargs") or {}
    if isinstance(kwargs, dict) and kwargs.get("use_reentrant") is False:
        return
    from wizard.sizing.memory import checkpoint_reenters_call
    version = installed_version(ctx, "transformers")
    if not checkpoint_reenters_call(version):
        return
    yield finding(
        "warning", "METHOD-FSDP1-REENTRANT-CHECKPOINT", ctx.ta_path, "gradient_checkpointing_kwargs",
        f"{'QLoRA' if options.method == 'qlora' else 'LoRA'} under FSDP1 with transformers {version}'s "
        "reentrant gradient checkpointing: FSDP1's hook on each frozen layer unit keeps every layer's input and its "
        "gradient alive until backward ends, about hidden x (layers - 2) x 2 bytes more per token per GPU "
        "(Mistral-7B at 16k tokens per GPU: +3.8 GiB)",
        fix="gradient_checkpointing_kwargs={\"use_reentrant\": False}, or fsdp_version: 2", when="step 0")
