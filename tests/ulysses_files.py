"""The accelerate YAML and ds_config.json of a DeepSpeed run with Ulysses sequence parallelism (issue 38), written by
the wizard's own writer (wizard.config.emit, as `wizard --non-interactive ... --parallelism-config-sp-size N` writes
them) for a one-rung CPU plan: the slow launch test (tests/functional/test_ulysses_launch.py) thereby trains the
planner's files. bench/results/ulysses-cpu.md says where each key comes from.
"""

from __future__ import annotations

from pathlib import Path

from tests.plans import make_plan
from wizard.config import emit
from wizard.config.parallelism import PREFIX, SP_SIZE_ID


def sp_files(out_dir: Path, num_processes: int, sp_size: int, zero_stage: int = 2, dp_shard_size: int | None = None,
             attn: str = "sdpa") -> Path:
    """Write `default_config.yaml` and `ds_config.json` into out_dir; return the YAML's path.

    ds_config.json is the wizard's DeepSpeed file for ZeRO-`zero_stage` on a CPU (the trainer fills every "auto"; no
    `train_batch_size`: accelerate computes it, for SP as micro x accumulation x (dp_replicate x dp_shard)), and
    nothing in it is about SP: DeepSpeed learns the SP group from the `mpu` accelerate passes to
    `deepspeed.initialize`.

    The YAML is the wizard's DeepSpeed YAML (`distributed_type: DEEPSPEED`, `deepspeed_config_file`, no
    `mixed_precision`) and, for sp_size > 1, accelerate's `parallelism_config:` section as
    wizard.config.parallelism.sp_section writes it (accelerate 1.13-1.16: `accelerate launch` copies its keys onto
    `--parallelism_config_*` and exports ACCELERATE_USE_PARALLELISM_CONFIG=true and PARALLELISM_CONFIG_*; the
    section is the only way a launch turns SP on for a DeepSpeed config): dp_replicate 1, dp_shard = processes / sp,
    tp 1, cp 1, sp_size, sp_backend deepspeed, sp_seq_length_is_variable true, sp_attn_implementation = the model's.

    `dp_shard_size` given: written over the writer's, for the tests of sizes the wizard would not write.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan("deepspeed", world=num_processes, stage=zero_stage, cpu=True, precision="fp32")
    answers = {"use_cpu": True, "trainer": "hf", "num_processes": num_processes, SP_SIZE_ID: sp_size,
               "attention": attn}
    yaml_path, ds_path = emit.output_paths(str(out_dir))
    Path(ds_path).write_text(emit.render_json(emit.deepspeed_config(answers, plan, None)))
    doc = emit.accelerate_config(answers, plan, str(Path(ds_path).resolve()), None)
    if dp_shard_size is not None and "parallelism_config" in doc:
        doc["parallelism_config"][PREFIX + "dp_shard_size"] = dp_shard_size
    Path(yaml_path).write_text(emit.render_yaml(doc))
    return Path(yaml_path)
