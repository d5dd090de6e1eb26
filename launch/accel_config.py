"""What a parsed accelerate config (default_config.yaml as a dict) says about the launch, for the supervisor and
the resume that both read it."""

from __future__ import annotations

from typing import Any


def ds_config_path(accel: dict[str, Any] | None) -> str | None:
    return ((accel or {}).get("deepspeed_config") or {}).get("deepspeed_config_file") or None


def world_size_of(accel: dict[str, Any] | None) -> int | None:
    try:
        return int((accel or {}).get("num_processes")) if accel and accel.get("num_processes") else None
    except (TypeError, ValueError):
        return None
