"""What the plan depends on that no written file carries: the settings the training script itself makes
(TrainingArguments, the model it loads, its data), one list that every face prints (the CLI's text and --json,
--plain, the TUI's Done screen) and wizard_plan.json records for `wizard launch`.

The files carry what accelerate and DeepSpeed read: default_config.yaml the backend, the processes, the mixed
precision outside DeepSpeed and FSDP's own activation checkpointing; ds_config.json the ZeRO stage and offload, and
concretely what the chosen trainer does not fill. Everything the HF Trainer fills from TrainingArguments ("auto":
the micro-batch, the accumulation, the precision), and what only the script can do (gradient checkpointing outside
FSDP, the optimizer the Trainer builds, the attention implementation, the sequence length, the adapters), is the
script's: a plan that fits only with gradient checkpointing runs out of memory at step 0 when the script leaves it
off. Which is which mirrors wizard.config.emit (tests/unit/test_script_settings.py holds the two together).

Pure: no heavy imports (the installed transformers' spelling is read from package metadata).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any

HF_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "sgd": "sgd", "adafactor": "adafactor"}
LOOP_OPTIM = {"adamw": "torch.optim.AdamW", "adamw-8bit": "bitsandbytes.optim.AdamW8bit", "sgd": "torch.optim.SGD",
              "adafactor": "transformers.Adafactor"}
HF_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}
CHECKPOINTING_NAMES = ("gradient_checkpointing", "activation_checkpointing")   # TrainingArguments, either version


def checkpointing_argument() -> str:
    """TrainingArguments' name for gradient checkpointing in the installed transformers:
    `activation_checkpointing` where it exists (`gradient_checkpointing` is its deprecated alias
    there), else `gradient_checkpointing`. Reads the dataclass when transformers is already imported
    (validation did it), else the field in its training_args.py source, never importing it here: the
    major version does not tell (5.17 has only gradient_checkpointing, 5.25 both)."""
    module = sys.modules.get("transformers.training_args")
    if module is not None:
        fields = getattr(module.TrainingArguments, "__dataclass_fields__", {})
        return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return "activation_checkpointing" if _source_declares("activation_checkpointing") else "gradient_checkpointing"


def _source_declares(field_name: str) -> bool:
    """Whether the installed transformers' TrainingArguments declares `field_name` (a `name: type` line of
    training_args.py), found without importing transformers (find_spec of a top-level package imports nothing)."""
    import importlib.util
    import re
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("transformers")
        text = (Path(spec.origin).parent / "training_args.py").read_text(encoding="utf-8", errors="replace")
    except (ImportError, ValueError, AttributeError, TypeError, OSError):   # not installed, a namespace package
        return False
    return re.search(rf"^\s+{re.escape(field_name)}\s*:", text, re.M) is not None


@dataclass(frozen=True)
class ScriptSetting:
    """One thing the training script must do for the plan to hold."""

    key: str                          # gradient_checkpointing | micro_batch | grad_accum | precision | optimizer
                                      # | attention | seq_len | method
    value: Any                        # the plan's value
    text: str                         # what it is, in words: "gradient checkpointing on"
    hf: str                           # how an HF Trainer script does it: "TrainingArguments(...=True)"
    loop: str                         # how an own Accelerate loop does it
    fit: bool                         # the plan's memory depends on it (without it the chosen rung may not fit)
    why: str                          # what happens otherwise

    def how(self, trainer: str) -> str:
        return self.loop if trainer == "accelerate" else self.hf

    def line(self, trainer: str) -> str:
        """`text: how (why)`, one line for the text faces."""
        return f"{self.text}: {self.how(trainer)} ({self.why})"

    def to_json(self, trainer: str) -> dict[str, Any]:
        return {**asdict(self), "how": self.how(trainer)}


def precision_of(answers: dict[str, Any], plan) -> str:
    """bf16 | fp16 | fp32 | fp8: the precision the files and TrainingArguments train in (an answered
    --mixed-precision over the plan's)."""
    mp = str(answers.get("mixed_precision") or "").lower()
    if plan.topology.cpu:
        return "fp32"
    if mp in ("bf16", "fp16", "fp8"):
        return mp
    if mp == "no":
        return "fp32"
    return plan.precision if plan.precision in ("bf16", "fp16") else "fp32"


def optimizer_of(answers: dict[str, Any], rung) -> str:
    """The optimizer that runs on this rung (sizing.memory.optimizer_for_rung: 8-bit AdamW becomes AdamW under
    DeepSpeed's optimizer offload), as the plan counted its states."""
    from wizard.sizing.memory import optimizer_for_rung
    offloads = rung.backend == "deepspeed" and rung.offload_optimizer != "none"
    return optimizer_for_rung(str(answers.get("optimizer") or "adamw"), offloads)


def gradient_checkpointing_carried(answers: dict[str, Any], rung) -> bool:
    """FSDP's activation checkpointing is in default_config.yaml (emit._fsdp_section: fsdp_activation_checkpointing,
    the rung's unless answered); every other backend's is the script's."""
    return rung.backend == "fsdp" and bool(answers.get("fsdp_activation_checkpointing", rung.gradient_checkpointing))


def script_settings(answers: dict[str, Any], plan) -> list[ScriptSetting]:
    """The settings the plan depends on that the written files do not carry, the ones its fit depends on first."""
    rung = plan.choice
    if rung is None:
        return []
    trainer = str(answers.get("trainer") or "hf")
    hf = trainer != "accelerate"
    deepspeed = rung.backend == "deepspeed"
    out: list[ScriptSetting] = []
    if rung.gradient_checkpointing and not gradient_checkpointing_carried(answers, rung):
        name = checkpointing_argument()
        sized = (f"the plan sizes {rung.name} with it, as asked" if answers.get("gradient_checkpointing") == "on"
                 else f"{rung.name} fits only with it, and without it step 0 runs out of memory")
        out.append(ScriptSetting(
            "gradient_checkpointing", True, "gradient checkpointing on", f"TrainingArguments({name}=True)",
            "model.gradient_checkpointing_enable() before accelerator.prepare", True,
            f"{sized}; no written file can switch it on"))
    method = str(answers.get("method") or "full")
    if method in ("lora", "qlora"):
        adapters = "LoRA adapters on a 4-bit NF4 base" if method == "qlora" else "LoRA adapters"
        rank = answers.get("lora_rank") or 16
        base = "from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...)), then " \
            if method == "qlora" else ""
        peft = f"{base}get_peft_model(model, LoraConfig(r={rank}, ...))"
        out.append(ScriptSetting(
            "method", method, f"{adapters} (r={rank})", peft, f"{peft} before accelerator.prepare", True,
            "the plan sizes the adapters' gradients and optimizer states, not the whole model's"))
    micro = int(answers.get("micro_batch") or 1)
    out.append(ScriptSetting(
        "micro_batch", micro, f"micro-batch {micro} per process",
        f"TrainingArguments(per_device_train_batch_size={micro})", f"DataLoader(batch_size={micro})", True,
        "the activations are sized for it; a larger one needs more memory"))
    seq = int(answers.get("seq_len") or 2048)
    out.append(ScriptSetting(
        "seq_len", seq, f"sequences of at most {seq} tokens", f"tokenize with truncation=True, max_length={seq}",
        f"tokenize with truncation=True, max_length={seq}", True,
        "the activations and logits are sized for it; longer ones need more memory"))
    precision = precision_of(answers, plan)
    if deepspeed and hf and not plan.topology.cpu and precision in ("bf16", "fp16"):
        # ds_config.json says "auto": the Trainer fills bf16/fp16 from TrainingArguments, else trains in fp32
        out.append(ScriptSetting(
            "precision", precision, f"{precision} mixed precision", f"TrainingArguments({precision}=True)",
            f"TrainingArguments({precision}=True)", True,
            f"ds_config.json's {precision} is \"auto\": without it DeepSpeed trains in fp32, twice the memory"))
    optimizer = optimizer_of(answers, rung)
    from wizard.config.emit import cpu_adam_runs
    if not (deepspeed and hf and cpu_adam_runs(answers, rung)):     # else ds_config.json's "optimizer" block
        out.append(ScriptSetting(
            "optimizer", optimizer, f"optimizer {optimizer}", f"TrainingArguments(optim={HF_OPTIM[optimizer]!r})",
            LOOP_OPTIM[optimizer], True, "the optimizer states are sized for it"))
    attention = str(answers.get("attention") or "auto")
    if attention in HF_ATTENTION:
        impl = HF_ATTENTION[attention]
        out.append(ScriptSetting(
            "attention", attention, f"{attention} attention",
            f"from_pretrained(..., attn_implementation={impl!r})",
            f"from_pretrained(..., attn_implementation={impl!r})", True,
            "the activations are sized for it" + ("" if attention == "eager" else "; eager attention keeps the "
                                                   "sequence x sequence scores")))
    accum = int(answers.get("grad_accum") or 1)
    if not (deepspeed and not hf):                                  # else ds_config.json's concrete value
        out.append(ScriptSetting(
            "grad_accum", accum, f"gradient accumulation {accum}",
            f"TrainingArguments(gradient_accumulation_steps={accum})",
            f"Accelerator(gradient_accumulation_steps={accum})", False,
            "the global batch and the speed figures assume it"))
    return out


def settings_json(answers: dict[str, Any], plan) -> list[dict[str, Any]]:
    """--json's and wizard_plan.json's `script_settings`: each setting with `how` for this plan's trainer."""
    trainer = str(answers.get("trainer") or "hf")
    return [s.to_json(trainer) for s in script_settings(answers, plan)]


SETTINGS_TITLE = "Your script must set (no written file carries these; the plan depends on them):"
