"""validate: the real accelerate / DeepSpeed / transformers accept the emitted files and report
their own errors on broken ones. Runs on the CPU; the libraries are imported once (~3 s)."""

from __future__ import annotations

import os
import re
import socket

import pytest
import yaml

from tests.plans import LLAMA2_7B, make_plan
from wizard.check.doctor import check_planned
from wizard.config import emit, validate
from wizard.config.vocab import REJECTED_BESIDE_DS_FILE

pytestmark = pytest.mark.timeout(120)

MODEL = LLAMA2_7B


@pytest.fixture(scope="module", autouse=True)
def libraries():
    validate.preload()


def emit_pair(tmp_path, answers, plan, yaml_edit=None, ds_edit=None, yaml_text=None, ds_text=None):
    """Emit the two files for (answers, plan), optionally broken by an edit; returns their paths."""
    yaml_path, ds_path = emit.output_paths(str(tmp_path))
    ds = emit.deepspeed_config(answers, plan, MODEL)
    doc = emit.accelerate_config(answers, plan, ds_path if ds is not None else None)
    if yaml_edit:
        yaml_edit(doc)
    if ds_edit:
        ds_edit(ds)
    (tmp_path / "default_config.yaml").write_text(yaml_text if yaml_text is not None else emit.render_yaml(doc))
    if ds is not None or ds_text is not None:
        (tmp_path / "ds_config.json").write_text(ds_text if ds_text is not None else emit.render_json(ds))
        return yaml_path, ds_path
    return yaml_path, None


def checked(yaml_path, ds_path, answers, plan, model=MODEL, displays=None):
    """The check before a write on these files: every rule once, the libraries judging them with the plan;
    no machine (the files are for the planned one)."""
    return check_planned(yaml_path, ds_path, answers=answers, plan=plan, model=model, displays=displays,
                         port_in_use=lambda port: False)


def run(tmp_path, answers, plan, **edits):
    yaml_path, ds_path = emit_pair(tmp_path, answers, plan, **edits)
    return checked(yaml_path, ds_path, answers, plan)


def rules(findings, severity="error"):
    return {f.rule for f in findings if f.severity == severity}


MULTINODE = {"num_machines": 2, "machine_rank": 0, "main_process_ip": "10.0.0.1", "main_process_port": 29500,
             "deepspeed_hostfile": "/job/hostfile"}
GOOD = {
    "single": ({}, make_plan("single", world=1)),
    "ddp": ({}, make_plan("ddp")),
    "ddp-ids": ({"gpu_ids": "0,1"}, make_plan("ddp", world=2)),
    "cpu-single": ({"use_cpu": True}, make_plan("single", world=1, cpu=True, precision="fp32")),
    "cpu-ddp": ({"use_cpu": True}, make_plan("ddp", world=2, cpu=True, precision="fp32")),
    "zero1": ({}, make_plan("deepspeed", stage=1)),
    "zero2": ({}, make_plan("deepspeed", stage=2)),
    "zero2-offload": ({}, make_plan("deepspeed", stage=2, oo="cpu")),
    "zero3": ({}, make_plan("deepspeed", world=8, stage=3)),
    "zero3-offload": ({"micro_batch": 4, "grad_accum": 8}, make_plan("deepspeed", world=8, stage=3, oo="cpu", op="cpu")),
    "zero3-nvme": ({"nvme_path": "/nvme"}, make_plan("deepspeed", world=8, stage=3, oo="nvme", op="nvme")),
    "zero3-fp16": ({}, make_plan("deepspeed", stage=3, precision="fp16")),
    "zero2-loop": ({"trainer": "accelerate", "micro_batch": 2, "grad_accum": 4}, make_plan("deepspeed", stage=2)),
    "zero3-loop-offload": ({"trainer": "accelerate", "gradient_clipping": 0.3},
                           make_plan("deepspeed", world=8, stage=3, oo="cpu", op="cpu")),
    "zero2-offload-8bit": ({"optimizer": "adamw-8bit"}, make_plan("deepspeed", stage=2, oo="cpu")),
    "zero3-offload-sgd": ({"optimizer": "sgd"}, make_plan("deepspeed", stage=3, oo="cpu", op="cpu")),
    "zero2-loop-offload-adafactor": ({"trainer": "accelerate", "optimizer": "adafactor"},
                                     make_plan("deepspeed", stage=2, oo="cpu")),
    "zero3-cpu": ({"use_cpu": True}, make_plan("deepspeed", world=2, stage=3, cpu=True, precision="fp32")),
    "zero3-cpu-loop": ({"use_cpu": True, "trainer": "accelerate"},
                       make_plan("deepspeed", world=2, stage=3, cpu=True, precision="fp32")),
    "zero3-2node": (MULTINODE, make_plan("deepspeed", world=16, machines=2, stage=3)),
    "ddp-2node": ({**MULTINODE, "same_network": False, "rdzv_backend": "c10d"},
                  make_plan("ddp", world=16, machines=2)),
    "fsdp2": ({"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}, make_plan("fsdp", reshard=True)),
    "fsdp2-offload": ({}, make_plan("fsdp", reshard=True, oo="cpu", op="cpu")),
    "fsdp1": ({"fsdp_version": 1}, make_plan("fsdp")),
    "dynamo": ({"use_dynamo": True, "dynamo_mode": "max-autotune"}, make_plan("ddp")),
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_emitted_files_pass_every_library(case, tmp_path):
    answers, plan = GOOD[case]
    findings = run(tmp_path, answers, plan)
    assert [f for f in findings if f.severity == "error"] == []
    # the 2-node DDP answers ask for rdzv_backend c10d, which only `wizard launch` passes on (check says so)
    assert rules(findings, "warning") <= ({"ACC-IGNORED-BY-LAUNCH"} if case == "ddp-2node" else set())


def test_validation_restores_the_environment(tmp_path):
    before = dict(os.environ)
    run(tmp_path, {}, make_plan("deepspeed", stage=3))
    run(tmp_path, {}, make_plan("fsdp"))
    assert dict(os.environ) == before
    assert "DS_ACCELERATOR" not in os.environ or before.get("DS_ACCELERATOR") == os.environ["DS_ACCELERATOR"]


def test_validation_leaves_no_transformers_global(tmp_path):
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    run(tmp_path, {}, make_plan("deepspeed", stage=3))
    assert not is_deepspeed_zero3_enabled()


# ---- accelerate ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["bf16", "no"])
def test_mixed_precision_beside_the_ds_file_is_accelerates_value_error(tmp_path, value):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   yaml_edit=lambda d: d.update(mixed_precision=value))
    # accelerate's ValueError ("When using `deepspeed_config_file`, the following accelerate config variables
    # will be ignored") is what the rule names; the plugin's own verdict is not reported twice
    assert rules(findings) == {"ACC-KEYS-BESIDE-DS-FILE"}
    assert "the following accelerate config variables will be ignored" in findings[0].message


@pytest.mark.parametrize("key", REJECTED_BESIDE_DS_FILE)
def test_every_rejected_key_is_rejected_by_accelerate(tmp_path, key):
    value = {"gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "zero_stage": 2,
             "zero3_save_16bit_model": True, "mixed_precision": "bf16"}.get(key, "none")
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   yaml_edit=lambda d: d["deepspeed_config"].update({key: value}))
    assert "ACC-KEYS-BESIDE-DS-FILE" in rules(findings)


def test_yaml_pointing_at_another_json_is_reported(tmp_path):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   yaml_edit=lambda d: d["deepspeed_config"].update(deepspeed_config_file="/elsewhere/ds.json"))
    assert "ACC-DS-PATH" in rules(findings)


def test_unquoted_no_is_reported(tmp_path):
    plan = make_plan("single", world=1)
    text = emit.render_yaml(emit.accelerate_config({"mixed_precision": "no"}, plan, None))
    findings = run(tmp_path, {}, plan, yaml_text=text.replace("'NO'", "NO").replace("'no'", "no"))
    assert "ACC-UNQUOTED-NO" in rules(findings)
    assert any("'bool' object has no attribute 'lower'" in f.message for f in findings)


def test_integer_gpu_ids_crash_launch(tmp_path):
    findings = run(tmp_path, {}, make_plan("ddp"), yaml_edit=lambda d: d.update(gpu_ids=1))
    assert any(f.rule == "ACC-GPU-IDS-NOT-STRING" for f in findings)


def test_unknown_top_level_key_is_the_loaders_error(tmp_path):
    findings = run(tmp_path, {}, make_plan("ddp"), yaml_edit=lambda d: d.update(foo_bar=1))
    # the loader raises "had unknown keys (['foo_bar'])"; check's rule names the key: one finding
    assert [(f.rule, f.key) for f in findings if f.severity == "error"] == [("ACC-UNKNOWN-KEY", "foo_bar")]


def test_bad_mixed_precision_is_launchs_error(tmp_path):
    findings = run(tmp_path, {}, make_plan("ddp"), yaml_edit=lambda d: d.update(mixed_precision="bf17"))
    assert any(f.rule == "ACC-LAUNCH-REJECTS" and "Unknown mixed_precision mode: bf17" in f.message for f in findings)


def test_num_processes_must_be_the_planned_total(tmp_path):
    findings = run(tmp_path, MULTINODE, make_plan("ddp", world=16, machines=2),
                   yaml_edit=lambda d: d.update(num_processes=8))
    assert "ACC-NUM-PROCESSES" in rules(findings)


def test_zero3_init_flag_on_zero2_is_accelerates_warning(tmp_path):
    findings = run(tmp_path, {"zero3_init_flag": True}, make_plan("deepspeed", stage=2))
    assert any(f.rule == "ACC-WARNING" and "Zero3 Init flag" in f.message for f in findings)
    assert rules(findings) == set()


def test_fsdp1_device_lookup_is_real_for_cpu_plans(tmp_path):
    # For a GPU plan the device lookup is answered as the planned machine would; for a CPU plan
    # accelerate's own "no available devices" error must come through.
    gpu = run(tmp_path, {"fsdp_version": 1}, make_plan("fsdp", world=2))
    assert rules(gpu) == set()
    cpu = run(tmp_path, {"fsdp_version": 1, "use_cpu": True}, make_plan("fsdp", world=2, cpu=True, precision="fp32"))
    # accelerate <= 1.15: "no available devices found"; 1.16: "sync_module_states=True is not supported on cpu"
    assert any(f.rule == "ACC-LAUNCH-REJECTS" and re.search("no available devices|not supported on cpu", f.message)
               for f in cpu), [f.message for f in cpu]


def test_busy_port_is_a_warning_not_an_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # On a real rank-0 launch accelerate raises ConnectionError here; for the file it is a warning.
        findings = run(tmp_path, {**MULTINODE, "main_process_port": port}, make_plan("ddp", world=16, machines=2))
        # validation judges the files for the planned machine; this machine's port is check's rule, with the
        # machine as an input (the wizard's check before a write asks the live one)
        assert rules(findings) == set() and "ACC-PORT-IN-USE" not in rules(findings, "warning")
        from wizard.check.doctor import check_texts
        yaml_text = (tmp_path / "default_config.yaml").read_text()
        found = check_texts(yaml_text, None, port_in_use=lambda p: p == port)
    assert [(f.rule, f.severity) for f in found] == [("ACC-PORT-IN-USE", "warning")]


# ---- DeepSpeed + the trainers' "auto" filling -----------------------------------------------------

def test_stage_auto_left_over_is_reported(tmp_path):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d["zero_optimization"].update(stage="auto"))
    assert any(f.rule in ("DS-AUTO-UNFILLED", "DS-AUTO-IN-SUBCONFIG") and f.key == "zero_optimization.stage" for f in findings)


def test_stage3_keys_on_zero2_stay_auto_with_hf(tmp_path):
    # transformers fills the stage-3 hidden-size keys only for ZeRO-3
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d["zero_optimization"].update(stage3_prefetch_bucket_size="auto"))
    assert any(f.rule in ("DS-AUTO-UNFILLED", "DS-AUTO-IN-SUBCONFIG") and f.key == "zero_optimization.stage3_prefetch_bucket_size"
               for f in findings)


@pytest.mark.parametrize("trainer", ["hf", "accelerate"])
def test_float_bucket_is_deepspeeds_validation_error(tmp_path, trainer):
    findings = run(tmp_path, {"trainer": trainer}, make_plan("deepspeed", stage=3),
                   ds_edit=lambda d: d["zero_optimization"].update(stage3_prefetch_bucket_size=15099494.4))
    # DeepSpeed's own ValidationError names the same key: one problem, one finding (the rule's)
    assert rules(findings) == {"DS-FLOAT-BUCKET"}


def test_whole_float_bucket_is_fine_as_for_deepspeed(tmp_path):
    # pydantic turns 5e8 into 500000000: one verdict for the wizard and check, the library's
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d["zero_optimization"].update(allgather_bucket_size=5e8))
    assert rules(findings) == set()


def test_odd_allgather_bucket(tmp_path):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d["zero_optimization"].update(allgather_bucket_size=200_000_001))
    assert rules(findings) == {"DS-ODD-ALLGATHER-BUCKET"}


def test_nested_aio_is_rejected_by_deepspeed(tmp_path):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d["zero_optimization"].update(aio={"block_size": 1048576}))
    assert rules(findings) == {"DS-AIO-IN-ZERO"}     # DeepSpeed's extra_forbidden on the same key: one finding


def test_param_offload_below_zero3_and_nvme_without_path(tmp_path):
    def edit(d):
        d["zero_optimization"]["offload_param"] = {"device": "nvme"}

    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2), ds_edit=edit)
    assert {"DS-NVME-NO-PATH", "DS-PLAN-OFFLOAD"} <= rules(findings)
    assert "DS-OFFLOAD-PARAM-BELOW-ZERO3" in rules(findings, "warning")


def test_concrete_value_mismatching_training_arguments_is_transformers_error(tmp_path):
    findings = run(tmp_path, {"grad_accum": 1}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d.update(gradient_accumulation_steps=8))
    fill = [f for f in findings if f.rule == "DS-TRAINER-MISMATCH"]
    assert fill and "ds gradient_accumulation_steps=8 vs hf gradient_accumulation_steps=1" in fill[0].message


def test_auto_the_accelerate_loop_cannot_fill(tmp_path):
    findings = run(tmp_path, {"trainer": "accelerate"}, make_plan("deepspeed", stage=3),
                   ds_edit=lambda d: d["zero_optimization"].update(sub_group_size="auto"))
    fill = [f for f in findings if f.rule == "DS-TRAINER-MISMATCH"]
    assert fill and "`zero_optimization.sub_group_size` not found in kwargs" in fill[0].message


def test_auto_precision_with_the_accelerate_loop_would_train_fp32(tmp_path):
    # Own loop, no mixed_precision beside the DS file: accelerate fills bf16.enabled "auto" with
    # false, silently fp32 against a bf16 plan. The emitter writes it concretely; a hand edit is caught.
    findings = run(tmp_path, {"trainer": "accelerate"}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d.update(bf16={"enabled": "auto"}))
    assert any(f.rule == "DS-PLAN-PRECISION" and "trains in fp32" in f.message for f in findings)


def test_precision_contradicting_the_plan(tmp_path):
    findings = run(tmp_path, {"trainer": "accelerate"}, make_plan("deepspeed", stage=2, precision="bf16"),
                   ds_edit=lambda d: d.update(bf16={"enabled": False}, fp16={"enabled": True}))
    assert "DS-PLAN-PRECISION" in rules(findings)


def test_batch_assertion_sees_the_planned_world_size(tmp_path):
    def edit(d):
        d.update(train_batch_size=8)

    findings = run(tmp_path, {"trainer": "accelerate"}, make_plan("deepspeed", world=4, stage=2), ds_edit=edit)
    errors = [f for f in findings if f.rule == "DS-LIBRARY-REJECTS"]
    assert errors and "8 != 1 * 1 * 4" in errors[0].message


def test_fp16_and_bf16_together(tmp_path):
    findings = run(tmp_path, {"trainer": "accelerate"}, make_plan("deepspeed", stage=2),
                   ds_edit=lambda d: d.update(bf16={"enabled": True}, fp16={"enabled": True}))
    assert any("cannot be simultaneously enabled" in f.message for f in findings)


def test_cpu_train_batch_size_auto_is_caught(tmp_path):
    findings = run(tmp_path, {"use_cpu": True}, make_plan("deepspeed", world=2, stage=3, cpu=True, precision="fp32"),
                   ds_edit=lambda d: d.update(train_batch_size="auto"))
    assert "DS-CPU-TRAIN-BATCH" in rules(findings)


def test_zero3_without_16bit_gather_is_a_note_when_you_turned_it_off(tmp_path):
    # the answer writes the key false: a choice (DeepSpeed's default is off too), so a note, not a warning
    findings = run(tmp_path, {"zero3_save_16bit_model": False}, make_plan("deepspeed", stage=3))
    assert rules(findings) == set() and "DS-ZERO3-NO-16BIT-SAVE" in rules(findings, "info")


@pytest.mark.parametrize("trainer", ["hf", "accelerate"])
def test_offload_with_a_torch_adamw_step_on_the_cpu_warns(tmp_path, trainer):
    def torch_step(d):
        d.pop("optimizer", None)
        d["zero_force_ds_cpu_optimizer"] = False
    findings = run(tmp_path, {"trainer": trainer}, make_plan("deepspeed", stage=2, oo="cpu"), ds_edit=torch_step)
    warned = [f for f in findings if f.rule == "DS-OFFLOAD-TORCH-OPTIMIZER"]
    assert warned and "poor performance" in warned[0].message
    assert ('"optimizer"' in warned[0].fix) == (trainer == "hf")


def test_offload_sgd_without_force_flag_warns(tmp_path):
    findings = run(tmp_path, {"optimizer": "sgd"}, make_plan("deepspeed", stage=2, oo="cpu"),
                   ds_edit=lambda d: d.pop("zero_force_ds_cpu_optimizer"))
    assert "DS-OFFLOAD-CLIENT-OPTIMIZER" in rules(findings, "warning")


def test_duplicate_keys_and_bad_json(tmp_path):
    dup = '{"zero_optimization": {"stage": 2}, "zero_optimization": {"stage": 3}}'
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2), ds_text=dup)
    assert any(f.rule == "DS-JSON" and "Duplicate keys" in f.message for f in findings)
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2), ds_text='{"a": 1,}')
    assert "DS-JSON" in rules(findings)


def test_missing_zero_section(tmp_path):
    findings = run(tmp_path, {}, make_plan("deepspeed", stage=2), ds_text='{"train_micro_batch_size_per_gpu": 1}')
    assert "DS-NO-ZERO-OPTIMIZATION" in rules(findings)
    assert "ACC-LAUNCH-REJECTS" not in rules(findings)   # one problem, one finding
    assert any("Please specify the ZeRO optimization config" in f.message for f in findings)


def test_ds_file_found_through_the_yaml_when_not_given(tmp_path):
    answers, plan = {}, make_plan("deepspeed", stage=2)
    yaml_path, _ = emit_pair(tmp_path, answers, plan, ds_edit=lambda d: d.update(gradient_accumulation_steps=8))
    findings = checked(yaml_path, None, answers, plan)
    assert "DS-TRAINER-MISMATCH" in rules(findings)


def test_display_names_are_reported(tmp_path):
    answers, plan = {}, make_plan("deepspeed", stage=2)
    yaml_path, ds_path = emit_pair(tmp_path, answers, plan, ds_edit=lambda d: d.update(gradient_accumulation_steps=8),
                                   yaml_edit=lambda d: d.update(mixed_precision="bf16"))
    findings = checked(yaml_path, ds_path, answers, plan, displays={yaml_path: "/final/default_config.yaml",
                                                                    ds_path: "/final/ds_config.json"})
    assert {f.file for f in findings} == {"/final/default_config.yaml", "/final/ds_config.json"}


def test_check_without_a_plan_uses_the_yaml(tmp_path):
    # `wizard check` may have files but no plan: world size comes from the YAML.
    answers, plan = {}, make_plan("deepspeed", world=4, stage=3)
    yaml_path, ds_path = emit_pair(tmp_path, answers, plan)
    assert validate.expectations(None, None, MODEL, yaml.safe_load(open(yaml_path))).world_size == 4
    assert rules(checked(yaml_path, ds_path, None, None)) == set()


# ---- the planned-GPU bypass follows the installed accelerate (issue 27) ---------------------------------

def test_the_planned_gpu_bypass_finds_where_the_installed_accelerate_asks_for_a_gpu():
    """The FSDP plugin decides from "is there a CUDA device?" and asks through a name the bypass knows (accelerate
    1.16 renamed it); this fails on the next rename, instead of every write warning "rule could not run"."""
    libs = validate._libs()
    assert any(module is libs.acc_dataclasses for module, _, _ in validate.planned_gpu_patches(libs))


def test_a_plugin_that_asks_through_an_unknown_name_is_reported_not_skipped():
    from types import ModuleType, SimpleNamespace
    libs = SimpleNamespace(acc_dataclasses=ModuleType("dataclasses"), acc_utils_launch=ModuleType("launch"))
    libs.acc_utils_launch.is_cuda_available = lambda: False
    with pytest.raises(validate.BypassUnavailable, match="accelerate.utils.dataclasses"):
        validate.planned_gpu_patches(libs)


def test_gpu_ids_reach_the_launch_environment_of_a_gpu_plan(tmp_path):
    """accelerate 1.16 exports CUDA_VISIBLE_DEVICES only when it finds a CUDA device: the planned machine has one,
    so the environment the script would see names the planned GPUs, and nothing is left patched afterwards."""
    yaml_path, _ = emit_pair(tmp_path, {"gpu_ids": "0,1"}, make_plan("ddp", world=2))
    libs = validate._libs()
    before = [(m, n, getattr(m, n)) for m, n, _ in validate.planned_gpu_patches(libs)]
    outcome = validate.accelerate_launch(yaml_path, planned_gpus=True)
    assert outcome.error is None, outcome.error
    assert outcome.env.get("CUDA_VISIBLE_DEVICES") == "0,1"
    assert all(getattr(m, n) is v for m, n, v in before)
