"""`wizard check` v2: bounded input, severities that match reality, near misses that must not fire, and the
live machine as an input."""

from __future__ import annotations

import json
import os

import pytest

from wizard.check.doctor import MAX_INPUT_BYTES, MAX_NESTING, build_context, check_texts, run_rules
from wizard.check.rules.common import trainer_defaults
from wizard.errors import InputError

pytestmark = pytest.mark.timeout(300)

DS2 = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
       "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
       "zero_optimization": {"stage": 2, "allgather_bucket_size": 500000000, "reduce_bucket_size": "auto"}}
DDP = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_machines: 1\n"
       "num_processes: 4\nmachine_rank: 0\nmain_process_port: 29500\nuse_cpu: false\n")


def rules(findings, severity=None):
    return {f.rule for f in findings if severity is None or f.severity == severity}


# ----------------------------------------------------------------------------- bounded input


@pytest.mark.parametrize("flag", ["config_file", "ds_config", "training_args"])
def test_fifo_and_devices_are_refused_at_once(tmp_path, flag):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        build_context(**{flag: str(fifo)}, use_default_config=False)
    with pytest.raises(InputError, match="is a device"):
        build_context(**{flag: "/dev/zero"}, use_default_config=False)


def test_size_limit(tmp_path):
    big = tmp_path / "ds.json"
    big.write_text('{"a": "' + "x" * MAX_INPUT_BYTES + '"}')
    with pytest.raises(InputError, match="larger than the 4 MiB limit"):
        build_context(ds_config=str(big), use_default_config=False)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({**DS2, "_comment": "x" * 1000}))
    build_context(ds_config=str(ok), use_default_config=False)


def test_nesting_and_huge_integers_are_bad_input_not_tracebacks(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nests too deeply"):
        build_context(ds_config=str(deep), use_default_config=False)
    nested = tmp_path / "nested.json"
    nested.write_text('{"a": ' * (MAX_NESTING + 1) + "1" + "}" * (MAX_NESTING + 1))
    with pytest.raises(InputError, match=f"deeper than {MAX_NESTING}"):
        build_context(ds_config=str(nested), use_default_config=False)
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps({**DS2, "x": json.loads('{"a": ' * (MAX_NESTING - 2) + "1" + "}" * (MAX_NESTING - 2))}))
    build_context(ds_config=str(fine), use_default_config=False)
    digits = tmp_path / "digits.json"
    digits.write_text('{"train_batch_size": ' + "9" * 5000 + "}")
    with pytest.raises(InputError, match="too long"):
        build_context(ds_config=str(digits), use_default_config=False)
    forty = tmp_path / "forty.yaml"
    forty.write_text("num_processes: " + "9" * 41 + "\n")
    with pytest.raises(InputError, match="more than 40 digits"):
        build_context(config_file=str(forty), use_default_config=False)


# ----------------------------------------------------------------------------- the live machine is an input


def test_port_rule_reads_the_machine_it_is_given():
    busy = check_texts(DDP, port_in_use=lambda port: port == 29500)
    assert [(f.rule, f.severity) for f in busy] == [("ACC-PORT-IN-USE", "warning")]
    assert "wizard launch" in busy[0].message
    assert check_texts(DDP, port_in_use=lambda port: False) == []
    multi = DDP.replace("num_machines: 1", "num_machines: 2\nmain_process_ip: 10.0.0.1").replace(
        "num_processes: 4", "num_processes: 8")
    found = check_texts(multi, port_in_use=lambda port: True)
    assert [(f.rule, f.severity) for f in found] == [("ACC-PORT-IN-USE", "warning")]   # never an error


# ----------------------------------------------------------------------------- severities and near misses


def test_comment_keys_are_notes_and_typos_are_warnings():
    found = check_texts(None, {**DS2, "_comment": "ZeRO-2", "train_micro_batch_size": 4})
    assert {(f.rule, f.key, f.severity) for f in found} == {("DS-UNKNOWN-TOP-KEY", "_comment", "info"),
                                                            ("DS-UNKNOWN-TOP-KEY", "train_micro_batch_size",
                                                             "warning")}


def test_gather_auto_is_a_save_warning_and_stage_auto_an_error():
    z3 = {**DS2, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}}
    assert [(f.rule, f.severity) for f in check_texts(None, z3)] == [("DS-AUTO-IN-SUBCONFIG", "warning")]
    z_auto = {**DS2, "zero_optimization": {"stage": "auto"}}
    assert ("DS-AUTO-IN-SUBCONFIG", "error") in {(f.rule, f.severity) for f in check_texts(None, z_auto)}


def test_distributed_type_contradiction_is_an_error_and_its_near_misses_are_quiet():
    no = DDP.replace("distributed_type: MULTI_GPU", "distributed_type: 'NO'")
    assert rules(check_texts(no, port_in_use=lambda p: False), "error") == {"ACC-DISTRIBUTED-TYPE-CONTRADICTS"}
    one = no.replace("num_processes: 4", "num_processes: 1")
    assert check_texts(one, port_in_use=lambda p: False) == []
    with_ds = one + "deepspeed_config:\n  zero_stage: 2\n"
    found = check_texts(with_ds, port_in_use=lambda p: False)
    assert rules(found, "error") == {"ACC-DISTRIBUTED-TYPE-CONTRADICTS"}
    assert "silently ignored" in found[0].message
    assert check_texts(one + "deepspeed_config: {}\nfsdp_config: {}\n", port_in_use=lambda p: False) == []


def test_offload_with_deepspeed_cpu_adam_is_never_flagged_and_explicit_false_is_a_note():
    offload = {**DS2, "zero_optimization": {**DS2["zero_optimization"], "offload_optimizer": {"device": "cpu"}}}
    assert check_texts(None, offload) == []          # accelerate swaps AdamW for DeepSpeedCPUAdam
    forced = {**offload, "zero_force_ds_cpu_optimizer": False}
    found = check_texts(None, forced)
    assert [(f.rule, f.severity, f.fixable) for f in found] == [("DS-OFFLOAD-TORCH-OPTIMIZER", "info", False)]


def test_fix_never_flips_an_explicit_true(tmp_path):
    from wizard.check.doctor import apply_fixes

    offload = {**DS2, "zero_force_ds_cpu_optimizer": True,
               "zero_optimization": {**DS2["zero_optimization"], "offload_optimizer": {"device": "cpu"}}}
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(offload))
    ta = tmp_path / "ta.json"
    ta.write_text(json.dumps({"optim": "sgd", "max_steps": 10}))
    ctx = build_context(ds_config=str(ds), training_args=str(ta), use_default_config=False)
    findings = run_rules(ctx)
    client = [f for f in findings if f.rule == "DS-OFFLOAD-CLIENT-OPTIMIZER"]
    assert client and client[0].severity == "error" and not client[0].fixable
    result = apply_fixes(ctx, findings)
    assert json.loads(ds.read_text())["zero_force_ds_cpu_optimizer"] is True and not result.written


def test_stage_conflict_is_a_warning_and_zero3_init_on_stage3_is_quiet(tmp_path):
    yaml_text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 4\n"
                 "main_process_port: 0\ndeepspeed_config:\n  deepspeed_config_file: {ds}\n  zero3_init_flag: true\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS2))
    found = check_texts(yaml_text.format(ds=ds), DS2, ds_path=str(ds))
    assert [(f.rule, f.severity) for f in found] == [("INT-STAGE-CONFLICT", "warning")]
    z3 = {**DS2, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
    ds.write_text(json.dumps(z3))
    assert check_texts(yaml_text.format(ds=ds), z3, ds_path=str(ds)) == []


def test_library_verdicts_and_their_near_misses():
    bad = {**DS2, "zero_optimization": {**DS2["zero_optimization"], "reduce_bucket_size": "lots"}}
    found = check_texts(None, bad)
    assert [(f.rule, f.key, f.severity, f.when) for f in found] == [
        ("DS-LIBRARY-REJECTS", "zero_optimization.reduce_bucket_size", "error", "prepare")]
    assert "after the model is loaded" in found[0].message and "lots" in found[0].message
    whole = {**DS2, "zero_optimization": {**DS2["zero_optimization"], "reduce_bucket_size": 5e8}}
    assert check_texts(None, whole) == []            # pydantic takes a whole float: so does check
    # A block DeepSpeed removed (its config reader lists removed keys since a 0.19.x after 0.19.0, the oldest
    # supported, where sparse attention still existed) is rejected where the installed DeepSpeed rejects it.
    import deepspeed.runtime.config as ds_config

    removed_here = "sparse_attention" in getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    removed = {**DS2, "sparse_attention": {"mode": "fixed"}}
    assert [(f.rule, f.key) for f in check_texts(None, removed)] == (
        [("DS-LIBRARY-REJECTS", None)] if removed_here else [])


def test_training_arguments_verdicts(tmp_path):
    both = check_texts(DDP, training_args={"fp16": True, "bf16": True}, port_in_use=lambda p: False)
    assert [(f.rule, f.severity) for f in both] == [("TRN-LIBRARY-REJECTS", "error")]
    assert "At most one of fp16 and bf16" in both[0].message
    # bf16 on this CPU box: the config is for the GPUs it names (DS-BF16-UNSUPPORTED judges those)
    assert check_texts(DDP, training_args={"bf16": True}, port_in_use=lambda p: False) == []
    x = check_texts(DDP, training_args={"per_device_train_batch_size": "x"}, port_in_use=lambda p: False)
    assert [(f.rule, f.key, f.severity) for f in x] == [("TRN-VALUE-TYPE", "per_device_train_batch_size", "error")]
    fine = check_texts(DDP, training_args={"learning_rate": "2e-5", "bf16": "auto"}, port_in_use=lambda p: False)
    assert fine == []                                 # converted by trl's parser / axolotl's schema


def test_training_yaml_keys_are_taken_and_the_rest_listed_once(tmp_path):
    ta = tmp_path / "sft.yaml"
    ta.write_text("model_name_or_path: org/m\ntemplate: llama3\nlearning_rate: 1.0e-5\nbf16: true\n")
    ctx = build_context(training_args=str(ta), use_default_config=False)
    assert ctx.ta == {"learning_rate": 1.0e-5, "bf16": True}
    notes = [f for f in run_rules(ctx) if f.severity == "info"]
    assert [(f.rule, f.key) for f in notes] == [("TRN-IGNORED-KEYS", None)]
    assert "model_name_or_path, template" in notes[0].message
    only_other = tmp_path / "data.yaml"
    only_other.write_text("dataset: x\n")
    with pytest.raises(InputError, match="no TrainingArguments field"):
        build_context(training_args=str(only_other), use_default_config=False)


def test_trl_defaults_are_sft_configs():
    defaults = trainer_defaults("trl")
    assert defaults["learning_rate"] == 2e-5 and defaults["bf16"] is True
    assert trainer_defaults("trl", {"fp16": True})["bf16"] is False
    assert trainer_defaults("hf")["learning_rate"] == 5e-5 and trainer_defaults("hf")["bf16"] is False
