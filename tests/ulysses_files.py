"""The accelerate YAML and ds_config.json of a DeepSpeed run with Ulysses sequence parallelism (issue 38), as the
tests write them until the wizard emits them itself (`wizard --non-interactive ... --parallelism-config-sp-size N`):
then `sp_files` is the one place to switch over. bench/results/ulysses-cpu.md says where each key comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def sp_files(out_dir: Path, num_processes: int, sp_size: int, zero_stage: int = 2, dp_shard_size: int = 1,
             attn: str = "sdpa") -> Path:
    """Write `default_config.yaml` and `ds_config.json` into out_dir; return the YAML's path.

    ds_config.json is the wizard's own DeepSpeed file for ZeRO-`zero_stage` on a CPU (the trainer fills every
    "auto"; no `train_batch_size`: accelerate computes it, for SP as micro x accumulation x (dp_replicate x
    dp_shard)), and nothing in it is about SP: DeepSpeed learns the SP group from the `mpu` accelerate passes to
    `deepspeed.initialize`.

    The YAML is the wizard's DeepSpeed YAML (`distributed_type: DEEPSPEED`, `deepspeed_config_file`, no
    `mixed_precision`) and, for sp_size > 1, accelerate's `parallelism_config:` section with exactly these keys
    (accelerate 1.13-1.16: `accelerate launch` copies them onto `--parallelism_config_*` and exports
    ACCELERATE_USE_PARALLELISM_CONFIG=true and PARALLELISM_CONFIG_*; the section is the only way a launch turns
    SP on for a DeepSpeed config):

        parallelism_config:
          parallelism_config_dp_replicate_size: 1
          parallelism_config_dp_shard_size: <dp_shard_size>   # dp_replicate x dp_shard x sp = num_processes
          parallelism_config_sp_size: <sp_size>
          parallelism_config_sp_backend: deepspeed
          parallelism_config_sp_attn_implementation: sdpa     # = the model's attn_implementation
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    zero: dict = {"stage": zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                  "reduce_bucket_size": "auto"}
    if zero_stage == 3:
        zero.update({"sub_group_size": 1_000_000_000, "stage3_prefetch_bucket_size": "auto",
                     "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1_000_000_000,
                     "stage3_max_reuse_distance": 1_000_000_000, "stage3_gather_16bit_weights_on_model_save": True})
    else:
        zero.update({"allgather_partitions": True, "allgather_bucket_size": 200_000_000, "reduce_scatter": True})
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": False}, "fp16": {"enabled": False},
          "zero_optimization": zero}
    ds_path = out_dir / "ds_config.json"
    ds_path.write_text(json.dumps(ds, indent=2) + "\n")
    doc: dict = {
        "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": str(ds_path.resolve()), "zero3_init_flag": zero_stage == 3},
        "downcast_bf16": "no", "enable_cpu_affinity": False, "machine_rank": 0, "main_training_function": "main",
        "num_machines": 1, "num_processes": num_processes, "rdzv_backend": "static", "same_network": True,
        "tpu_env": [], "tpu_use_cluster": False, "tpu_use_sudo": False, "use_cpu": False,
    }
    if sp_size > 1:
        doc["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": dp_shard_size,
            "parallelism_config_sp_size": sp_size, "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_attn_implementation": attn,
        }
    yaml_path = out_dir / "default_config.yaml"
    yaml_path.write_text(yaml.safe_dump(doc, sort_keys=True))
    return yaml_path
