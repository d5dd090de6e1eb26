"""Rules at their edges (issue 22, mutants the fixtures alone did not notice): each test takes a rule's trigger
fixture, changes one value to just past or just inside the rule's boundary, and runs every rule on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.unit.test_check_rules import FIXTURES, check_case


def variant(rule: str, tmp_path: Path, **edits) -> tuple[Path, list]:
    """The trigger fixture of `rule` with `edits` (file name -> function changing its parsed content); its findings."""
    case = tmp_path / "variant"
    shutil.copytree(FIXTURES / rule / "trigger", case)
    for name, edit in edits.items():
        path = case / name.replace("__", ".")            # default_config__yaml -> default_config.yaml
        is_yaml = path.suffix == ".yaml"
        doc = yaml.safe_load(path.read_text()) if is_yaml else json.loads(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc) if is_yaml else json.dumps(doc, indent=1))
    _, findings = check_case(case, tmp_path / "run")
    return case, findings


def rules(findings) -> set[str]:
    return {f.rule for f in findings}


@pytest.mark.parametrize("ids, reported", [("0,4", True), ("0,3", False), ("3", False)])
def test_gpu_ids_must_name_gpus_below_the_count(tmp_path, ids, reported):
    """On a 4-GPU machine the GPUs are 0-3: gpu_ids naming GPU 4 is the off-by-one the rule exists for."""
    def edit(doc):
        doc["gpu_ids"] = ids
        doc["num_processes"] = len(ids.split(","))
    _, findings = variant("ACC-NUM-PROCESSES-EXCEEDS-GPUS", tmp_path, default_config__yaml=edit)
    got = [f for f in findings if f.rule == "ACC-NUM-PROCESSES-EXCEEDS-GPUS"]
    assert bool(got) == reported, [f.message for f in findings]
    if reported:
        assert got[0].key == "gpu_ids" and "names 4" in got[0].message


@pytest.mark.parametrize("processes, batch, reported", [(2, 3, True), (2, 4, False), (3, 4, True)])
def test_split_batches_must_divide_by_every_process_count(tmp_path, processes, batch, reported):
    def config(doc):
        doc["num_processes"] = processes

    def args(doc):
        doc["per_device_train_batch_size"] = batch
    _, findings = variant("TRN-SPLIT-BATCHES-INDIVISIBLE", tmp_path, default_config__yaml=config,
                          training_args__json=args)
    assert ("TRN-SPLIT-BATCHES-INDIVISIBLE" in rules(findings)) == reported


@pytest.mark.parametrize("path, reported", [("auto", True), ("none", True), ("", True), ("/local_nvme", False)])
def test_an_nvme_path_that_names_no_directory_is_reported(tmp_path, path, reported):
    """"auto" is not a path DeepSpeed fills: the swapper gets the literal string (cf. DeepSpeed #5124)."""
    def edit(doc):
        doc["zero_optimization"]["offload_param"]["nvme_path"] = path
    _, findings = variant("DS-NVME-NO-PATH", tmp_path, ds_config__json=edit)
    assert ("DS-NVME-NO-PATH" in rules(findings)) == reported


@pytest.mark.parametrize("key", ["stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                                 "stage3_gather_fp16_weights_on_model_save"])
@pytest.mark.parametrize("value, reported", [("true", False), ("True", False), (True, False), ("false", True),
                                             (False, True)])
def test_the_16bit_gather_given_as_a_string_counts_as_given(tmp_path, key, value, reported):
    """DeepSpeed's pydantic config reads the string "true" as True: the gather is on, nothing is missing."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=3, **{key: value}).gather_16bit_weights_on_model_save is (not reported)

    def edit(doc):
        doc["zero_optimization"][key] = value
    _, findings = variant("DS-ZERO3-NO-16BIT-SAVE", tmp_path, ds_config__json=edit)
    assert ("DS-ZERO3-NO-16BIT-SAVE" in rules(findings)) == reported


@pytest.mark.parametrize("key", ["stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                                 "stage3_gather_fp16_weights_on_model_save", "gather_fp16_weights_on_model_save"])
@pytest.mark.parametrize("value", [False, "false"])
def test_fix_never_turns_a_gather_you_set_false_into_true(tmp_path, key, value):
    """Issue 36, item 6: `--fix` turned an explicit `"stage3_gather_16bit_weights_on_model_save": false` into true.
    People set it false on purpose (the gather on rank 0 can exhaust host RAM for a very large model); README says
    --fix never overrides a value you set. The finding stays, as a note naming the key you set, and is not fixable."""
    from wizard.check.doctor import apply_fixes, build_context, run_rules
    from wizard.probe.hardware import assume

    def edit(doc):
        doc["zero_optimization"].pop("stage3_gather_16bit_weights_on_model_save", None)
        doc["zero_optimization"][key] = value
    case, _ = variant("DS-ZERO3-NO-16BIT-SAVE", tmp_path, ds_config__json=edit)
    before = (case / "ds_config.json").read_text()
    ctx = build_context(config_file=str(case / "default_config.yaml"), ds_config=str(case / "ds_config.json"),
                        training_args=str(case / "training_args.json"), hardware=assume("4xA100-80GB"),
                        versions={}, use_default_config=False, port_in_use=lambda port: False)
    findings = run_rules(ctx)
    [f] = [f for f in findings if f.rule == "DS-ZERO3-NO-16BIT-SAVE"]
    assert (f.severity, f.key, f.fixable) == ("info", f"zero_optimization.{key}", False)
    assert "zero_to_fp32.py" in f.fix
    fixed = apply_fixes(ctx, findings)
    assert fixed.written == [] and (case / "ds_config.json").read_text() == before


def test_fix_adds_the_gather_where_no_key_says_anything(tmp_path):
    """Without any gather key (DeepSpeed's default: off, and nobody chose it), --fix writes the one current key."""
    from wizard.check.doctor import apply_fixes, build_context, run_rules
    from wizard.probe.hardware import assume

    def edit(doc):
        doc["zero_optimization"].pop("stage3_gather_16bit_weights_on_model_save", None)
    case, _ = variant("DS-ZERO3-NO-16BIT-SAVE", tmp_path, ds_config__json=edit)
    ctx = build_context(config_file=str(case / "default_config.yaml"), ds_config=str(case / "ds_config.json"),
                        training_args=str(case / "training_args.json"), hardware=assume("4xA100-80GB"),
                        versions={}, use_default_config=False, port_in_use=lambda port: False)
    findings = run_rules(ctx)
    assert [(f.severity, f.fixable) for f in findings if f.rule == "DS-ZERO3-NO-16BIT-SAVE"] == [("warning", True)]
    assert apply_fixes(ctx, findings).written == [str(case / "ds_config.json")]
    zero = json.loads((case / "ds_config.json").read_text())["zero_optimization"]
    gather = {k: v for k, v in zero.items() if "gather" in k and "weights_on_model_save" in k}
    assert gather == {"stage3_gather_16bit_weights_on_model_save": True}
