"""The Done screen's TrainingArguments(...) snippet and launch commands: the snippet is real Python
that transformers' TrainingArguments accepts for the plan it describes (where this CPU box can
build one), and the commands quote paths for the shell."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.config.script_settings import checkpointing_argument
from wizard.frontends.snippets import (
    launch_commands,
    training_arguments,
    training_arguments_code,
    wizard_launch_argv,
)
from wizard.pipeline import Request

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = str(ROOT / "snapshots" / "hardware" / "no-gpu.json")
QWEN_7B = str(ROOT / "tests" / "fixtures" / "models" / "qwen2.5-7b")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def written(tmp_path: Path, **request) -> pipeline.Result:
    result = pipeline.build(Request(output_dir=str(tmp_path / "out"), **request))
    pipeline.write(result, request.get("given", {}))
    return result


def construct(result: pipeline.Result):
    """Evaluate the snippet with the real TrainingArguments."""
    from transformers import TrainingArguments
    ds = result.ds_path if result.ds_text is not None else None
    code = training_arguments_code(result.answers, result.plan, ds)
    return eval(code, {"TrainingArguments": TrainingArguments})     # noqa: S307 - our own generated code


def test_cpu_deepspeed_snippet_builds_training_arguments(tmp_path):
    result = written(tmp_path, hardware_file=NO_GPU, given={"use_cpu": True, "num_processes": 2, "params": "125M"})
    args = construct(result)
    # use_cpu=True would silently turn DeepSpeed off (accelerate picks MULTI_CPU): it must not be there.
    assert not args.use_cpu and args.deepspeed == result.ds_path
    assert args.hf_deepspeed_config is not None and args.hf_deepspeed_config.is_zero3() == (
        result.plan.choice.zero_stage == 3)
    assert args.per_device_train_batch_size == 1 and args.gradient_accumulation_steps == 1
    assert args.gradient_checkpointing == result.plan.choice.gradient_checkpointing
    assert getattr(args, checkpointing_argument()) == result.plan.choice.gradient_checkpointing   # 5.25's new name


def test_fsdp_snippet_builds_training_arguments(tmp_path):
    # V100s: fp16, which TrainingArguments accepts on this CPU box (bf16 it would refuse here).
    result = written(tmp_path, assume="8xV100-32GB", given={"model": QWEN_7B, "backend": "fsdp"})
    assert result.plan.choice.backend == "fsdp"
    kwargs = training_arguments(result.answers, result.plan, None)
    assert kwargs["fsdp"] is True and kwargs["fp16"] is True
    assert kwargs[checkpointing_argument()] is False      # FSDP checkpoints through fsdp_config
    assert kwargs["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["Qwen2DecoderLayer"]
    args = construct(result)
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Qwen2DecoderLayer"]
    assert args.fsdp_config["version"] == 2


def test_deepspeed_and_ddp_snippets_name_the_right_arguments(tmp_path):
    ds = written(tmp_path / "ds", assume="8xA100-80GB", given={"model": QWEN_7B})
    kwargs = training_arguments(ds.answers, ds.plan, ds.ds_path)
    assert kwargs["deepspeed"] == ds.ds_path and kwargs["bf16"] is True and kwargs["optim"] == "adamw_torch"
    ddp = pipeline.build(Request(assume="8xA100-80GB", given={"params": "350M"}, output_dir=str(tmp_path / "ddp")))
    assert ddp.plan.choice.backend == "ddp"
    kwargs = training_arguments(ddp.answers, ddp.plan, None)
    assert kwargs["ddp_backend"] == "nccl" and kwargs["ddp_find_unused_parameters"] is False
    assert "deepspeed" not in kwargs and "fsdp" not in kwargs


def test_launch_commands_quote_paths():
    accel, wiz = launch_commands("/a dir/default_config.yaml", "train.py", ["--name", "a b"])
    assert shlex.split(accel) == ["accelerate", "launch", "--config_file", "/a dir/default_config.yaml",
                                  "train.py", "--name", "a b"]
    assert shlex.split(wiz) == ["wizard", "launch", "--config-file", "/a dir/default_config.yaml", "--",
                                "train.py", "--name", "a b"]
    assert wizard_launch_argv("/py", "/c.yaml", "t.py", ["-x"]) == [
        "/py", "-m", "wizard", "launch", "--config-file", "/c.yaml", "--", "t.py", "-x"]


def _ds(launcher):
    return {"distributed_type": "DEEPSPEED", "num_machines": 2,
            "deepspeed_config": {"deepspeed_multinode_launcher": launcher, "deepspeed_hostfile": "/job/my hosts"}}


def test_the_done_screen_says_where_each_machine_launches():
    """On several machines the Done screen said only the main machine's commands: a second machine running them as
    they stand would be a second rank 0; with DeepSpeed's pdsh launcher, any launch there a second world."""
    from types import SimpleNamespace

    from wizard.frontends.tui.screens.done import commands_text

    def result(doc, machines=2):
        return SimpleNamespace(yaml_path="/a dir/c.yaml", accelerate_doc=doc,
                               answers={"num_machines": machines, "main_process_ip": "10.0.0.1"})
    accel, wiz = launch_commands("/a dir/c.yaml", "t.py", ["-x"])
    assert commands_text(result({}, machines=1), ["t.py", "-x"]) == f"{accel}\n{wiz}"
    assert commands_text(result({"distributed_type": "MULTI_GPU", "num_machines": 2}), ["t.py", "-x"]) == "\n".join([
        "# on the main machine (10.0.0.1):", accel, wiz, "# on the second machine, with the same files:",
        "wizard launch --config-file '/a dir/c.yaml' --machine-rank 1 -- t.py -x"])
    assert commands_text(result(_ds("nossh")), ["t.py"]).count("--machine-rank 1") == 1
    pdsh = commands_text(result(_ds("pdsh")), ["t.py", "-x"]).splitlines()
    assert pdsh[:3] == ["# on the main machine (10.0.0.1), the first host of '/job/my hosts':", accel, wiz], pdsh
    assert pdsh[3].startswith("# DeepSpeed's pdsh launcher starts the other machines of the hostfile from there over "
                              "ssh: launch nothing on them") and len(pdsh) == 4 and "machine-rank" not in pdsh[3]
    slurm = commands_text(result(_ds("slurm")), ["t.py", "-x"]).splitlines()
    assert slurm[0] == "# inside the SLURM allocation, on its first node:" and "srun" in slurm[3], slurm


def test_checkpointing_argument_without_importing_transformers_matches_its_class(monkeypatch):
    """Read from the installed training_args.py, never the major version (5.17 has only gradient_checkpointing,
    5.25 both): the same answer as the dataclass itself, at both ends of the library range."""
    import sys

    from transformers.training_args import TrainingArguments

    truth = ("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
             else "gradient_checkpointing")
    monkeypatch.delitem(sys.modules, "transformers.training_args", raising=False)   # read the source, not the class
    assert checkpointing_argument() == truth


def test_checkpointing_argument_is_the_old_name_where_transformers_cannot_be_found(monkeypatch):
    import importlib.util
    import sys

    monkeypatch.delitem(sys.modules, "transformers.training_args", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert checkpointing_argument() == "gradient_checkpointing"
