"""Issue 38: the files of a DeepSpeed Ulysses (ALST) run, tests/ulysses_files.py's, through the libraries' own
classes: accelerate's launch (parser, `_validate_launch_command`, the DeepSpeed launcher's environment), the
`ParallelismConfig` and `DeepSpeedSequenceParallelConfig` the script's Accelerator builds from that environment, and
DeepSpeed's `DeepSpeedConfig` as `deepspeed.initialize` builds it under SP. Where the libraries accept what they
should not, or refuse silently, the test says so (bench/results/ulysses-cpu.md has the lines)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from tests.ulysses_files import sp_files
from wizard.config.validate import accelerate_launch, environ_replaced


def launched(tmp_path, **kw):
    out = accelerate_launch(str(sp_files(tmp_path, **kw)), planned_gpus=True)
    assert out.error is None, out.error
    return out


def parallelism_config_in(env: dict):
    """What the training script's Accelerator builds: ParallelismConfig() from the launch environment."""
    from accelerate.parallelism_config import ParallelismConfig
    with environ_replaced(env):
        return ParallelismConfig()


def test_the_sp_section_is_exported_by_a_deepspeed_launch_and_built_into_accelerates_config(tmp_path):
    out = launched(tmp_path, num_processes=2, sp_size=2)
    env = out.env
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert (env["PARALLELISM_CONFIG_SP_SIZE"], env["PARALLELISM_CONFIG_SP_BACKEND"],
            env["PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"]) == ("2", "deepspeed", "sdpa")
    pc = parallelism_config_in(env)
    assert (pc.sp_size, pc.sp_backend, pc.data_parallel_size, pc.total_size) == (2, "deepspeed", 1, 2)
    assert type(pc.sp_handler).__name__ == "DeepSpeedSequenceParallelConfig"
    assert pc.sp_handler.sp_attn_implementation == "sdpa" and pc.sp_handler.sp_seq_length_is_variable is True
    # accelerate builds no device mesh for DeepSpeed SP (DeepSpeed makes its own groups)
    assert pc.build_device_mesh("cpu") is None


def test_without_the_yaml_section_the_sp_size_flag_turns_nothing_on_and_the_use_flag_is_refused(tmp_path):
    """`accelerate launch --parallelism_config_sp_size 2` with a DeepSpeed YAML that has no parallelism_config:
    section is parsed and then never exported (launch sets use_parallelism_config from the section alone, and
    prepare_deepspeed_cmd_env exports PARALLELISM_CONFIG_* only with it): the run is plain data parallelism. And
    `--use_parallelism_config` itself is refused for anything but FSDP2. The section is the only way in."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    yaml_path = str(sp_files(tmp_path, num_processes=2, sp_size=1))
    parser = launch_command_parser()
    args, _, _ = _validate_launch_command(parser.parse_args(
        ["--config_file", yaml_path, "--parallelism_config_sp_size", "2", "train.py"]))
    assert args.use_deepspeed and args.parallelism_config_sp_size == 2 and not args.use_parallelism_config
    with pytest.raises(ValueError, match="You cannot use `--use_parallelism_config` without `--use_fsdp`"):
        _validate_launch_command(parser.parse_args(["--config_file", yaml_path, "--use_parallelism_config",
                                                    "train.py"]))


class _World:
    """deepspeed.comm as DeepSpeedConfig reads it (rank 0 of `world` processes), as wizard.config.validate does."""

    def __init__(self, world: int):
        self.world = world

    def get_rank(self, group=None):
        return 0

    def get_world_size(self, group=None):
        return self.world


def deepspeed_config_under_sp(tmp_path, monkeypatch, num_processes: int, sp_size: int, dp_shard_size: int):
    """DeepSpeed's own DeepSpeedConfig of the ds_config as accelerate hands it to deepspeed.initialize under SP:
    "auto" filled (micro-batch 1, 1 accumulation step, clipping 1.0) and train_batch_size = micro x accumulation
    x ParallelismConfig.data_parallel_size (accelerator.py, _prepare_deepspeed: "fix it at the last moment"), with
    the SP mpu (DeepSpeed's world is then the processes / sp_size, runtime/config.py)."""
    import deepspeed.runtime.config as ds_config

    yaml_path = sp_files(tmp_path, num_processes=num_processes, sp_size=sp_size, dp_shard_size=dp_shard_size)
    out = accelerate_launch(str(yaml_path), planned_gpus=True)
    assert out.error is None, out.error            # accelerate's launch checks accept either way
    pc = parallelism_config_in(out.env)
    cfg = json.loads((tmp_path / "ds_config.json").read_text())
    filled = copy.deepcopy(cfg)
    filled.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, gradient_clipping=1.0,
                  train_batch_size=1 * 1 * pc.data_parallel_size)
    filled["zero_optimization"]["reduce_bucket_size"] = 4096
    monkeypatch.setattr(ds_config, "dist", _World(num_processes))
    mpu = SimpleNamespace(get_sequence_parallel_world_size=lambda: sp_size)
    return ds_config.DeepSpeedConfig(filled, mpu=mpu)


def test_deepspeed_accepts_the_ds_config_under_sp_with_the_data_parallel_sizes_filling_the_processes(
        tmp_path, monkeypatch):
    two = deepspeed_config_under_sp(tmp_path / "a", monkeypatch, num_processes=2, sp_size=2, dp_shard_size=1)
    assert (two.world_size, two.train_batch_size) == (1, 1)
    four = deepspeed_config_under_sp(tmp_path / "b", monkeypatch, num_processes=4, sp_size=2, dp_shard_size=2)
    assert (four.world_size, four.train_batch_size) == (2, 2)


def test_sizes_that_leave_processes_out_pass_accelerate_and_fail_in_deepspeeds_batch_check(tmp_path, monkeypatch):
    """4 processes, sp 2 and dp_replicate x dp_shard = 1: accelerate's ParallelismConfig skips its size check for
    DeepSpeed SP (parallelism_config.py _validate_accelerator), so launch and the Accelerator accept it; accelerate
    then sets train_batch_size from data_parallel_size (1) while DeepSpeed's world is 4 / 2 = 2, and its config
    refuses the batch at deepspeed.initialize. dp_replicate x dp_shard x sp = processes is a rule the files must keep."""
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        deepspeed_config_under_sp(tmp_path, monkeypatch, num_processes=4, sp_size=2, dp_shard_size=1)


@pytest.mark.parametrize("attn, accepted", [("sdpa", True), ("flash_attention_2", True), ("eager", False),
                                            ("flex_attention", False)])
def test_accelerates_sp_config_takes_flash_attention_and_sdpa_only(attn, accepted):
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    if accepted:
        assert DeepSpeedSequenceParallelConfig(sp_attn_implementation=attn).sp_attn_implementation == attn
    else:
        with pytest.raises(ValueError, match="sp_attn_implementation"):
            DeepSpeedSequenceParallelConfig(sp_attn_implementation=attn)
