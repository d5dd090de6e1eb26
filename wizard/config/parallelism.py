"""FSDP2's parallelism config (`parallelism_config:` in accelerate's YAML) and accelerate's own verdict on it.

`accelerate config` (1.16, commands/config/cluster.py) asks it only for FSDP version 2: "Do you want to use the
parallelism config?", then the data-parallel replicate size, the FSDP shard size, the tensor-parallel size and the
context-parallel size (each [1]), and with cp > 1 the context-parallel communication strategy (allgather |
alltoall). It writes them as `parallelism_config_<name>` under `parallelism_config:`; `accelerate launch` copies
them onto its `--parallelism_config_*` options and exports PARALLELISM_CONFIG_* with
ACCELERATE_USE_PARALLELISM_CONFIG=true, and the script's Accelerator builds `ParallelismConfig()` from those and
calls `ParallelismConfig._validate_accelerator(accelerator)`: the sizes must multiply to the world size, FSDP
needs a dimension to shard across, only FSDP2 (or multi-GPU / DeepSpeed) takes a config, and so on.

`verdict` makes that same call, on the real class, with a stand-in for the Accelerator that reports what the
launched one would (its distributed type, FSDP version and process count): nothing here re-implements a rule.
accelerate (and torch) are imported on first use only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")
PREFIX = "parallelism_config_"
SIZE_IDS = tuple(PREFIX + name for name in SIZES)
CP_COMM_ID = PREFIX + "cp_comm_strategy"
# DeepSpeed's Ulysses (ALST), in the same section: accelerate 1.13-1.16's launch reads parallelism_config_sp_size,
# _sp_backend, _sp_seq_length, _sp_seq_length_is_variable and _sp_attn_implementation (commands/launch.py) and
# exports them as PARALLELISM_CONFIG_SP_*; `accelerate config` asks none of them.
SP_SIZE_ID = PREFIX + "sp_size"
# The attention implementation the Ulysses wrapper replaces: it must be the model's own (register_with_transformers
# refuses a mismatch), so the files name what --attention selects (auto: transformers' default, SDPA).
SP_ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "flash": "flash_attention_2"}


def _accelerate():
    from wizard.libraries import IMPORT_LOCK

    with IMPORT_LOCK:
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils.dataclasses import DistributedType, TorchContextParallelConfig
    return ParallelismConfig, DistributedType, TorchContextParallelConfig


def accelerator_stand_in(num_processes: int, fsdp_version: int | None, distributed_type: str = "FSDP") -> Any:
    """What `ParallelismConfig._validate_accelerator` reads of the launched Accelerator: for an FSDP launch the
    distributed type is FSDP (so not `multi_device`), `is_fsdp2` says the plugin's version, `num_processes` is
    the world size (the YAML's num_processes: the total over machines)."""
    _, DistributedType, _ = _accelerate()
    dtype = DistributedType(distributed_type)
    multi = dtype.value.startswith("MULTI_") and num_processes > 1
    return SimpleNamespace(distributed_type=dtype, multi_device=multi, num_processes=int(num_processes),
                           is_fsdp2=dtype == DistributedType.FSDP and fsdp_version == 2, is_main_process=False)


def verdict(config: Any, num_processes: int, fsdp_version: int | None, distributed_type: str = "FSDP") -> None:
    """accelerate's own check of a built ParallelismConfig for this launch; raises what it raises."""
    config._validate_accelerator(accelerator_stand_in(num_processes, fsdp_version, distributed_type))


def problem(sizes: dict[str, int], num_processes: int, fsdp_version: int | None = 2,
            cp_comm_strategy: str | None = None) -> str | None:
    """accelerate's verdict on these sizes (keys of SIZES) for an FSDP launch of `num_processes`: None when it
    accepts them, else its message ("ValueError: ParallelismConfig total_size (6) does not match
    num_processes (8) ...")."""
    ParallelismConfig, _, TorchContextParallelConfig = _accelerate()
    values = {name: 1 if sizes.get(name) is None else int(sizes[name]) for name in SIZES}
    try:
        handler = TorchContextParallelConfig(cp_comm_strategy=cp_comm_strategy or "allgather") \
            if values["cp_size"] > 1 else None
        # every field given: nothing is read from this process's PARALLELISM_CONFIG_* environment
        config = ParallelismConfig(**values, cp_backend="torch", sp_size=1, sp_backend="deepspeed",
                                   cp_handler=handler)
        verdict(config, num_processes, fsdp_version)
    except (ValueError, TypeError, AssertionError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def sp_section(sp: int, num_processes: int, attention: str = "auto") -> dict[str, Any]:
    """`parallelism_config:` for DeepSpeed's Ulysses over `sp` GPUs: the rest data parallel (dp_shard_size =
    processes / sp: the HF Trainer and accelerate size DeepSpeed's train_batch_size with replicate x shard, so the
    product must be the data-parallel world, as the HF blog's "dp_replicate x dp_shard x sp = num_processes"),
    sequences of variable length (sp_seq_length_is_variable: true, accelerate's default), and the attention the
    model runs (SP_ATTENTION)."""
    return {PREFIX + "dp_replicate_size": 1, PREFIX + "dp_shard_size": max(1, num_processes // max(sp, 1)),
            PREFIX + "tp_size": 1, PREFIX + "cp_size": 1, SP_SIZE_ID: int(sp), PREFIX + "sp_backend": "deepspeed",
            PREFIX + "sp_seq_length_is_variable": True,
            PREFIX + "sp_attn_implementation": SP_ATTENTION.get(attention, "sdpa")}


def sp_problem(section: dict[str, Any], num_processes: int) -> str | None:
    """accelerate's own verdict on a DeepSpeed sequence-parallel section for a launch of `num_processes`: the
    real ParallelismConfig and DeepSpeedSequenceParallelConfig built from it and checked against a DeepSpeed
    launch; None when accepted, else its message."""
    ParallelismConfig, _, _ = _accelerate()
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig

    try:
        handler = DeepSpeedSequenceParallelConfig(
            sp_seq_length=section.get(PREFIX + "sp_seq_length"),
            sp_seq_length_is_variable=bool(section.get(PREFIX + "sp_seq_length_is_variable", True)),
            sp_attn_implementation=section.get(PREFIX + "sp_attn_implementation"))
        config = ParallelismConfig(**{name: int(section.get(PREFIX + name) or 1) for name in SIZES},
                                   cp_backend="torch", sp_size=int(section[SP_SIZE_ID]),
                                   sp_backend=str(section.get(PREFIX + "sp_backend", "deepspeed")), sp_handler=handler)
        verdict(config, num_processes, None, "DEEPSPEED")
    except (ValueError, TypeError, AssertionError, KeyError) as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def from_answers(answers: dict[str, Any]) -> dict[str, Any] | None:
    """The `parallelism_config:` section accelerate config writes for these answers, or None when not used."""
    if not answers.get("use_parallelism_config"):
        return None
    section = {key: 1 if answers.get(key) is None else int(answers[key]) for key in SIZE_IDS}
    if section[PREFIX + "cp_size"] > 1:
        section[CP_COMM_ID] = str(answers.get(CP_COMM_ID) or "allgather")
    return section
