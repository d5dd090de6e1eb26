"""launch.script_check: what a launch says at start about the plan's gradient checkpointing (wizard_plan.json's
script_settings), and what it can honestly tell from the script and its arguments: a flag that turns it on or off,
or no mention anywhere. Never more: a script that mentions it is not claimed to turn it on."""

from __future__ import annotations

import json

import pytest

from launch.script_check import checkpointing_lines, flag_in_args, mentioned, needed_checkpointing
from launch.spec import load_plan_near

NEEDS = {"script_settings": [{"key": "gradient_checkpointing", "value": True,
                              "how": "TrainingArguments(activation_checkpointing=True)"},
                             {"key": "micro_batch", "value": 8, "how": "TrainingArguments(per_device_train_batch_size=8)"}]}


@pytest.mark.parametrize("args,expected", [
    ([], None), (["--gradient_checkpointing"], True), (["--gradient-checkpointing", "--lr", "1"], True),
    (["--gradient_checkpointing", "False"], False), (["--activation_checkpointing=false"], False),
    (["--gradient_checkpointing", "true"], True), (["--gradient_checkpointing_kwargs", "{}"], None),
    (["gradient_checkpointing"], None)])
def test_a_flag_in_the_scripts_arguments(args, expected):
    assert flag_in_args(args) is expected


def test_a_mention_in_the_script_or_a_file_its_arguments_name(tmp_path):
    script, config = tmp_path / "train.py", tmp_path / "args.json"
    script.write_text("print('no word of it')\n")
    config.write_text(json.dumps({"gradient_checkpointing": True}))
    assert mentioned(str(script), []) is False
    assert mentioned(str(script), [str(config)]) is True
    assert mentioned(str(script), [f"--config={config}"]) is True
    script.write_text("model.gradient_checkpointing_enable()\n")
    assert mentioned(str(script), []) is True
    assert mentioned(str(tmp_path / "missing.py"), []) is None      # nothing to read: nothing told


def test_the_lines_a_launch_says(tmp_path):
    silent, told = tmp_path / "silent.py", tmp_path / "told.py"
    silent.write_text("print(1)\n")
    told.write_text("args = TrainingArguments(activation_checkpointing=True)\n")
    first, warning = checkpointing_lines(NEEDS, str(silent), [])
    assert "needs gradient checkpointing" in first and "TrainingArguments(activation_checkpointing=True)" in first
    assert warning.startswith("warning: neither silent.py nor a file its arguments name mentions")
    assert checkpointing_lines(NEEDS, str(told), []) == [first]
    off = checkpointing_lines(NEEDS, str(told), ["--gradient_checkpointing", "False"])
    assert off[1] == "warning: told.py's arguments turn gradient checkpointing off"
    assert checkpointing_lines(NEEDS, str(silent), ["--gradient_checkpointing"]) == [first]
    assert checkpointing_lines({"script_settings": NEEDS["script_settings"][1:]}, str(silent), []) == []
    assert checkpointing_lines(None, str(silent), []) == [] and needed_checkpointing({"plan": {}}) is None


def test_the_plan_is_read_from_wizard_plan_json_beside_the_config(tmp_path):
    (tmp_path / "default_config.yaml").write_text("distributed_type: MULTI_GPU\n")
    (tmp_path / "wizard_plan.json").write_text(json.dumps(NEEDS))
    plan = load_plan_near(str(tmp_path / "default_config.yaml"))
    assert needed_checkpointing(plan)["how"] == "TrainingArguments(activation_checkpointing=True)"
