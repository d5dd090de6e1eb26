"""Answer resolution: precedence, answers files, converters and the argparse flags built from the table."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from wizard.config import answers
from wizard.config.questions import QUESTIONS, Context
from wizard.errors import InputError
from wizard.planning.plan import Plan, Rung, StrategyOptions, Topology, TrainingOptions
from wizard.probe.hardware import GPU, Hardware
from wizard.units import GiB

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "answers"
PRE_PLAN = ("model", "training", "strategy", "machines")


def gpus(n: int) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name="NVIDIA A100-SXM4-80GB", memory_total=80 * GiB,
                              compute_capability=(8, 0), bf16=True) for i in range(n)])


def plan(backend: str, zero_stage: int | None = None) -> Plan:
    rung = Rung(key=backend, name=backend, backend=backend, zero_stage=zero_stage, fits=True)
    return Plan(rungs=[rung], choice=rung, gpu_capacity_bytes=80 * GiB, usable_bytes=72 * GiB,
                precision="bf16", topology=Topology(1, 8))


def input_error(fn, *args, **kw) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return info.value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wizard", exit_on_error=False)
    for flag, kwargs in answers.cli_arguments():
        kwargs = dict(kwargs)
        kwargs.pop("group")
        p.add_argument(flag, default=argparse.SUPPRESS, **kwargs)
    return p


# ----------------------------------------------------------------------------- precedence

def test_flags_beat_the_file_which_beats_defaults():
    src: dict = {}
    given = answers.merge_given({"seq_len": "8192"}, {"seq_len": 4096, "micro_batch": 4}, source_of=src)
    assert given == {"seq_len": "8192", "micro_batch": 4}
    a = answers.resolve(PRE_PLAN, Context(hardware=gpus(8)), given, source_of=src)
    assert a["seq_len"] == 8192            # flag
    assert a["micro_batch"] == 4           # file
    assert a["grad_accum"] == 1            # default
    assert src["seq_len"] == "flag" and src["micro_batch"] == "file" and src["grad_accum"] == "default"


def test_none_means_not_given():
    given = answers.merge_given({"seq_len": None}, {"seq_len": 512, "micro_batch": None})
    assert given == {"seq_len": 512}


def test_end_to_end_flags_file_defaults_through_argparse():
    ns = parser().parse_args(["--seq-len", "1024", "--use-dynamo", "--backend", "DDP"])
    flags = answers.values_from_namespace(ns)
    assert flags == {"seq_len": "1024", "use_dynamo": "yes", "backend": "DDP"}
    file = answers.load_answers_file(str(FIX / "good.json"))
    given = answers.merge_given(flags, file)
    hw = gpus(8)
    a = answers.resolve(PRE_PLAN, Context(hardware=hw), given)
    assert a["seq_len"] == 1024 and a["backend"] == "ddp" and a["optimizer"] == "adamw-8bit"
    d = answers.resolve("details", Context(hardware=hw, plan=plan("ddp"), answers=a), given)
    assert d["use_dynamo"] is True and d["dynamo_backend"] == "INDUCTOR"
    # fsdp_* from the file are not asked for a DDP plan, so they are absent
    assert not any(k.startswith("fsdp_") for k in d)


def test_resolve_returns_only_the_stages_asked_and_leaves_other_given_keys_alone():
    given = {"seq_len": "4096", "zero3_init_flag": "maybe"}   # a details key, not looked at before the plan
    a = answers.resolve("training", Context(hardware=gpus(1)), given)
    assert set(a) == {"seq_len", "micro_batch", "grad_accum", "global_batch", "train_tokens", "dataset_tokens",
                      "method", "precision", "gradient_checkpointing", "optimizer", "attention", "trainer", "loss",
                      "allow_code_changes",
                      "save_total_limit"}


def test_given_but_not_asked_is_type_checked_and_reported():
    ignored: list = []
    a = answers.resolve(PRE_PLAN, Context(hardware=gpus(8)), {"machine_rank": "1"}, ignored=ignored)
    assert "machine_rank" not in a and ignored == ["machine_rank"]
    e = input_error(answers.resolve, PRE_PLAN, Context(hardware=gpus(8)), {"machine_rank": "first"})
    assert e.field == "machine-rank"


def test_unknown_given_key_is_refused():
    e = input_error(answers.resolve, PRE_PLAN, Context(hardware=gpus(1)), {"seqlen": 1})
    assert e.field == "answers" and "seqlen" in e.problem


def test_resolve_does_not_mutate_the_context():
    ctx = Context(hardware=gpus(8), answers={"seq_len": 1})
    answers.resolve(PRE_PLAN, ctx, {})
    assert ctx.answers == {"seq_len": 1} and ctx.given == {}


def test_a_file_entry_error_names_the_key_not_the_flag():
    src: dict = {}
    given = answers.merge_given({}, {"main_process_port": 70000, "num_machines": 2,
                                     "main_process_ip": "10.0.0.1"}, source_of=src)
    e = input_error(answers.resolve, PRE_PLAN, Context(hardware=gpus(8)), given, source_of=src)
    assert e.field == "main_process_port" and "answers file" in e.problem
    e = input_error(answers.resolve, PRE_PLAN, Context(hardware=gpus(8)), given)
    assert e.field == "main-process-port"


# ----------------------------------------------------------------------------- answers files

def test_load_yaml_answers_file_normalises_values():
    a = answers.load_answers_file(str(FIX / "good.yaml"))
    assert a["seq_len"] == 4096 and a["precision"] == "bf16" and a["gradient_checkpointing"] == "on"
    assert a["zero_stage"] == "3" and a["headroom"] == pytest.approx(0.15)
    assert a["cuda_context"] == int(1.5 * GiB) and a["gpu_ids"] == "0,1"
    assert a["use_cpu"] is False and a["mixed_precision"] == "no"
    resolved = answers.resolve(PRE_PLAN, Context(hardware=gpus(8)), a)
    assert resolved["num_processes"] == 2 and resolved["backend"] == "deepspeed"


def test_load_json_answers_file():
    a = answers.load_answers_file(str(FIX / "good.json"))
    assert a == {"seq_len": 1024, "optimizer": "adamw-8bit", "backend": "fsdp", "fsdp_version": 2,
                 "fsdp_activation_checkpointing": True, "main_process_port": 0}


def test_multinode_answers_file():
    a = answers.resolve(PRE_PLAN, Context(hardware=gpus(8)), answers.load_answers_file(str(FIX / "multinode.yaml")))
    assert a["machine_rank"] == 1 and a["rdzv_backend"] == "c10d" and a["num_processes"] == 16
    assert answers.topology(a, gpus(8)) == Topology(num_machines=2, processes_per_machine=8, cpu=False)


def test_empty_answers_file_is_no_answers():
    assert answers.load_answers_file(str(FIX / "empty.yaml")) == {}


def test_unknown_key_in_answers_file():
    e = input_error(answers.load_answers_file, str(FIX / "unknown-key.yaml"))
    assert e.field == "answers"
    assert "unknown key 'seqlen'" in e.problem and "seq_len" in e.problem   # the suggestion
    assert "seq_len" in e.allowed and "num_processes" in e.allowed


def test_wrong_type_in_answers_file_names_the_key():
    e = input_error(answers.load_answers_file, str(FIX / "wrong-type.yaml"))
    assert e.field == "micro_batch" and "'two'" in e.problem and "answers file" in e.problem
    e = input_error(answers.load_answers_file, str(FIX / "wrong-type-list.yaml"))
    assert e.field == "num_processes" and "list" in e.problem


@pytest.mark.parametrize("name,fragment", [
    ("not-mapping.yaml", "not a mapping"),
    ("corrupt.json", "not valid JSON"),
    ("does-not-exist.yaml", "cannot read"),
])
def test_unreadable_answers_files(name, fragment):
    e = input_error(answers.load_answers_file, str(FIX / name))
    assert e.field == "answers" and fragment in e.problem


def test_answers_file_that_is_a_directory(tmp_path):
    e = input_error(answers.load_answers_file, str(tmp_path))
    assert e.field == "answers" and "is a directory, not a regular file" in e.problem


def test_answers_file_that_is_a_fifo_or_too_big_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert "is a FIFO" in input_error(answers.load_answers_file, str(tmp_path / "fifo")).problem
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * answers.ANSWERS_MAX_BYTES)
    assert "larger than the 1 MiB limit" in input_error(answers.load_answers_file, str(big)).problem
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "nests deeper than 100 levels" in input_error(answers.load_answers_file, str(deep)).problem


def test_answers_file_with_bad_yaml(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("seq_len: [1,\n")
    e = input_error(answers.load_answers_file, str(f))
    assert e.field == "answers" and "not valid YAML" in e.problem


# ----------------------------------------------------------------------------- converters

def test_training_and_strategy_options():
    a = answers.resolve(PRE_PLAN, Context(hardware=gpus(8)),
                        {"seq_len": "4096", "optimizer": "SGD", "backend": "deepspeed", "zero_stage": "3",
                         "offload": "cpu", "headroom": "0.2", "cuda_context": "512M"})
    t = answers.training_options(a)
    assert t == TrainingOptions(seq_len=4096, optimizer="sgd")
    s = answers.strategy_options(a)
    assert s == StrategyOptions(backend="deepspeed", zero_stage="3", offload="cpu", nvme_path=None,
                                headroom=0.2, cuda_context_bytes=512 * 1024**2)


def test_topology():
    hw = gpus(8)
    assert answers.topology({"num_machines": 2, "num_processes": 16}, hw) == Topology(2, 8, False)
    assert answers.topology({}, hw) == Topology(1, 8, False)
    assert answers.topology({"use_cpu": True, "num_processes": 3}, hw) == Topology(1, 3, True)
    e = input_error(answers.topology, {"num_machines": 2, "num_processes": 15}, hw)
    assert e.field == "num-processes" and "evenly" in e.problem


@pytest.mark.parametrize("backend,a,expected", [
    ("single", {"num_processes": 1}, "NO"),
    ("ddp", {"num_processes": 8}, "MULTI_GPU"),
    ("ddp", {"num_processes": 2, "use_cpu": True}, "MULTI_CPU"),
    ("ddp", {"num_processes": 1}, "NO"),                      # accelerate refuses MULTI_GPU with 1 process
    ("ddp", {"num_processes": 2, "num_machines": 2}, "MULTI_GPU"),
    ("deepspeed", {"num_processes": 8}, "DEEPSPEED"),
    ("deepspeed", {"num_processes": 1}, "DEEPSPEED"),
    ("fsdp", {"num_processes": 8}, "FSDP"),
])
def test_distributed_type(backend, a, expected):
    assert answers.distributed_type(a, plan(backend)) == expected


def test_distributed_type_without_a_plan_uses_the_strategy_answer():
    assert answers.distributed_type({"backend": "deepspeed"}, None) == "DEEPSPEED"
    assert answers.distributed_type({"backend": "auto", "num_processes": 4}, None) == "MULTI_GPU"


# ----------------------------------------------------------------------------- argparse

def test_cli_arguments_cover_every_flagged_question():
    args = answers.cli_arguments()
    assert [f for f, _ in args] == [q.flag for q in QUESTIONS if q.flag]
    for flag, kwargs in args:
        assert kwargs["type"] is str and "default" not in kwargs and kwargs["group"]
    p = parser()
    assert "--seq-len" in p.format_help()  # help strings format (no stray %)


def test_values_from_namespace_only_passed_flags():
    p = parser()
    assert answers.values_from_namespace(p.parse_args([])) == {}
    ns = p.parse_args(["--use-cpu", "no", "--num-processes", "2", "--gpu-ids", "0,1"])
    assert answers.values_from_namespace(ns) == {"use_cpu": "no", "num_processes": "2", "gpu_ids": "0,1"}
    # with a None default (instead of SUPPRESS) unset flags are still absent
    q = argparse.ArgumentParser()
    for flag, kwargs in answers.cli_arguments():
        kwargs = dict(kwargs)
        kwargs.pop("group")
        q.add_argument(flag, default=None, **kwargs)
    assert answers.values_from_namespace(q.parse_args(["--seq-len", "64"])) == {"seq_len": "64"}


def test_flag_values_are_validated_by_the_table_not_argparse():
    flags = answers.values_from_namespace(parser().parse_args(["--precision", "bf17"]))
    e = input_error(answers.resolve, PRE_PLAN, Context(hardware=gpus(1)), flags)
    assert str(e) == "precision: 'bf17' is not one of the choices (allowed: auto, bf16, fp16, fp32)"


def test_fixture_dir_is_where_the_cli_tests_look():
    # tests/functional/test_cli.py points --answers at these two names
    assert os.path.exists(FIX / "unknown-key.yaml") and os.path.exists(FIX / "wrong-type.yaml")
