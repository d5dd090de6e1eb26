"""Where Hugging Face tools keep their files, computed from the environment at call time.

huggingface_hub and accelerate read these variables once, at import; tests and users change
HF_HOME afterwards, so the wizard computes the paths itself, the same way, every time it needs one.
"""

from __future__ import annotations

import os

ACCELERATE_CONFIG_FILE = "default_config.yaml"
PLAN_FILE = "wizard_plan.json"          # the plan the wizard writes beside the accelerate config


def hf_home() -> str:
    """$HF_HOME, else ${XDG_CACHE_HOME:-~/.cache}/huggingface (user-expanded)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return os.path.expanduser(home)


def accelerate_config_dir() -> str:
    """Where `accelerate config` writes and `accelerate launch` looks: <hf_home>/accelerate."""
    return os.path.join(hf_home(), "accelerate")


def accelerate_default_config_file() -> str:
    """The config `accelerate launch` uses silently when no --config_file is given."""
    return os.path.join(accelerate_config_dir(), ACCELERATE_CONFIG_FILE)


def plan_file_beside(config_file: str) -> str:
    """Where the wizard keeps the plan of the accelerate config at `config_file`: in the same directory."""
    return os.path.join(os.path.dirname(os.path.abspath(config_file)), PLAN_FILE)
