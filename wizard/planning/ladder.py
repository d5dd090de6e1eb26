"""The ladder: which rung keys a plan evaluates, cheapest first, for the strategy options given.
"""

from __future__ import annotations

from wizard.errors import InputError
from wizard.planning import rungs as rung_table
from wizard.planning.rungs import BY_KEY
from wizard.planning.plan_types import BACKENDS, OFFLOADS, StrategyOptions, ZERO_STAGES


# --- The ladder ------------------------------------------------------------------------------------

# The rung table's entries by key (wizard.planning.rungs), under the name older callers import.
RUNG_SPECS = BY_KEY


def _check_choice(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise InputError(flag, f"{value!r} is not a valid choice", ", ".join(allowed))


def ladder_keys(strategy: StrategyOptions, world_size: int, cpu: bool = False, method: str = "full") -> list[str]:
    """The rung keys to evaluate, cheapest first, for these strategy options. InputError on bad combos."""
    backend, stage, offload = strategy.backend, str(strategy.zero_stage), strategy.offload
    if method != "full":
        return _adapter_ladder(strategy, world_size, cpu, method)
    _check_choice(backend, BACKENDS, "--backend")
    _check_choice(stage, ZERO_STAGES, "--zero-stage")
    _check_choice(offload, OFFLOADS, "--offload")
    if cpu and offload in ("cpu", "nvme"):
        raise InputError("--offload", f"{offload!r} needs GPUs; these are CPU processes", "auto, none")
    if backend == "ddp":
        if stage != "auto":
            raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not ddp", "auto")
        if offload in ("cpu", "nvme"):
            raise InputError("--offload", f"{offload!r} needs --backend deepspeed or fsdp, not ddp", "auto, none")
    if backend == "fsdp":
        if stage != "auto":
            raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not fsdp", "auto")
        if offload == "nvme":
            raise InputError("--offload", "FSDP has no NVMe offload", "auto, none, cpu")
    keys = rung_table.ladder(backend, stage, offload, method, world_size)
    if not keys:
        raise InputError("--offload", "NVMe offload is available only with ZeRO stage 3", "auto, none, cpu")
    if cpu:
        keys = [k for k in keys if not BY_KEY[k].offloads]
    return keys


def _steppable_by(optimizer: str, strategy: StrategyOptions, keys: list[str]) -> list[str]:
    """The rungs whose parameters `optimizer` can step. bitsandbytes' 8-bit AdamW cannot step FSDP2's sharded
    parameters (DTensor): with bitsandbytes 0.50.2 and torch 2.13 its first step fails with
    "optimizer_update_8bit_blockwise got mixed torch.Tensor and DTensor" (tests/functional/
    test_fsdp_8bit_optimizer.py runs it on 2 CPU ranks; bitsandbytes issue #1633 has it on GPUs). So the FSDP
    rungs leave the ladder for --optimizer adamw-8bit, and --backend fsdp with it is refused."""
    if optimizer != "adamw-8bit":
        return keys
    if strategy.backend == "fsdp":
        raise InputError("--optimizer", "'adamw-8bit' cannot step FSDP2's sharded (DTensor) parameters: "
                         "bitsandbytes' 8-bit update rejects them at the first step",
                         "adamw, sgd or adafactor with --backend fsdp; or --backend deepspeed / auto")
    return [k for k in keys if BY_KEY[k].backend != "fsdp"]


def _adapter_ladder(strategy: StrategyOptions, world_size: int, cpu: bool, method: str) -> list[str]:
    """LoRA / QLoRA: one GPU / DDP, ZeRO-2, ZeRO-3, FSDP2 (with and without resharding), then the rungs that
    move the frozen base to the CPU (ZeRO-3 parameter offload, FSDP2 CPU offload).

    No optimizer-only offload rung: the adapters' optimizer states are a few per mille of the model and the
    frozen base has none, so offloading them saves next to nothing. No NVMe rung."""
    _check_choice(strategy.backend, BACKENDS, "--backend")
    _check_choice(str(strategy.zero_stage), ZERO_STAGES, "--zero-stage")
    _check_choice(strategy.offload, OFFLOADS, "--offload")
    stage = str(strategy.zero_stage)
    if strategy.offload == "nvme":
        raise InputError("--offload", f"'nvme' with --method {method}: the adapters' states are tiny and the "
                         "frozen base has none to swap", "auto, none, cpu")
    if cpu and strategy.offload == "cpu":
        raise InputError("--offload", "'cpu' needs GPUs; these are CPU processes", "auto, none")
    if strategy.backend in ("ddp", "fsdp") and stage != "auto":
        raise InputError("--zero-stage", f"{stage!r} applies to --backend deepspeed, not {strategy.backend}", "auto")
    if strategy.backend == "ddp" and strategy.offload == "cpu":
        raise InputError("--offload", "'cpu' needs --backend deepspeed or fsdp, not ddp", "auto, none")
    keys = rung_table.ladder(strategy.backend, stage, strategy.offload, method, world_size)
    if not keys:
        raise InputError("--offload", f"'cpu' with --method {method} offloads the frozen base: ZeRO stage 3 or FSDP "
                         "(the adapters' optimizer states are too small to be worth offloading)", "auto, none")
    if cpu:
        keys = [k for k in keys if not BY_KEY[k].offloads]
    return keys
