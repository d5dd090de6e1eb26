"""What the plan needs from the training script that no written file carries, said as a launch starts.

The wizard records it in wizard_plan.json beside the config (`script_settings`, from wizard.config.script_settings;
launch reads only that JSON). Gradient checkpointing is the one that decides whether step 0 runs out of memory: when
the plan needs it, the launch says so, and, where it can tell, whether the script turns it on. What it can tell is
little and said as such: a flag in the script's arguments that turns it on or off, or that neither the script nor a
file its arguments name mentions it at all. It never refuses a launch for it.
"""

from __future__ import annotations

import os
import re
from typing import Any

NAMES = ("gradient_checkpointing", "activation_checkpointing")     # TrainingArguments' (transformers 4 / 5) names
MENTIONS = re.compile(r"gradient_checkpointing|activation_checkpointing")   # also gradient_checkpointing_enable(
FALSE_WORDS = ("false", "0", "no", "off")
READ_LIMIT = 4 * 1024 * 1024          # a script or a config it reads; larger files are not searched


def needed_checkpointing(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """wizard_plan.json's gradient checkpointing setting, when the plan needs the script to turn it on."""
    for setting in (plan or {}).get("script_settings") or []:
        if isinstance(setting, dict) and setting.get("key") == "gradient_checkpointing" and setting.get("value"):
            return setting
    return None


def flag_in_args(args: list[str]) -> bool | None:
    """True/False where the script's arguments set gradient checkpointing (HfArgumentParser's `--gradient_checkpointing`
    alone is True; `--gradient_checkpointing False` or `=false` turns it off); None where they do not say."""
    found: bool | None = None
    for i, arg in enumerate(args):
        name, eq, value = arg.lstrip("-").replace("-", "_").partition("=")
        if not arg.startswith("--") or name not in NAMES:
            continue
        if not eq:
            following = args[i + 1] if i + 1 < len(args) else ""
            value = following if following and not following.startswith("-") else "true"
        found = value.strip().lower() not in FALSE_WORDS
    return found


def mentioned(script: str, args: list[str]) -> bool | None:
    """Whether the script, or a file its arguments name (a TrainingArguments JSON, a YAML recipe), mentions gradient
    checkpointing at all; None when the script cannot be read (then nothing can be told)."""
    paths = [script] + [a.partition("=")[2] or a for a in args]
    readable = False
    for i, path in enumerate(paths):
        if not path or not os.path.isfile(path):
            continue
        try:
            if os.path.getsize(path) > READ_LIMIT:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        readable = readable or i == 0
        if MENTIONS.search(text):
            return True
    return False if readable else None


def checkpointing_lines(plan: dict[str, Any] | None, script: str, args: list[str]) -> list[str]:
    """The lines a launch says at start about gradient checkpointing: none when the plan does not need it from the
    script; else what it needs and, where the arguments or the files tell, whether the script does it."""
    setting = needed_checkpointing(plan)
    if setting is None:
        return []
    how = setting.get("how") or "TrainingArguments(gradient_checkpointing=True)"
    lines = [f"the plan (wizard_plan.json) needs gradient checkpointing, which no written file can switch on; the "
             f"script turns it on with {how}; without it step 0 runs out of memory"]
    flag = flag_in_args(args)
    name = os.path.basename(script)
    if flag is False:
        lines.append(f"warning: {name}'s arguments turn gradient checkpointing off")
    elif flag is None and mentioned(script, args) is False:
        lines.append(f"warning: neither {name} nor a file its arguments name mentions gradient_checkpointing or "
                     "activation_checkpointing: unless it turns checkpointing on some other way, step 0 runs out "
                     "of memory")
    return lines
