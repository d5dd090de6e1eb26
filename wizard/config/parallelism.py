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


def from_answers(answers: dict[str, Any]) -> dict[str, Any] | None:
    """The `parallelism_config:` section accelerate config writes for these answers, or None when not used."""
    if not answers.get("use_parallelism_config"):
        return None
    section = {key: 1 if answers.get(key) is None else int(answers[key]) for key in SIZE_IDS}
    if section[PREFIX + "cp_size"] > 1:
        section[CP_COMM_ID] = str(answers.get(CP_COMM_ID) or "allgather")
    return section
