"""config.script_settings: what the plan depends on that no written file carries, held against the files emit writes
for every rung of the table, every method its ladder holds and both trainers (issue 36: the CLI never said that a
full fine-tuning plan needs gradient checkpointing; a YAML and a ds_config.json cannot switch it on). A setting is
listed exactly when the files leave it to the script, and it says what the TrainingArguments snippet says."""

from __future__ import annotations

import ast
import re

import pytest

from tests.plans import LLAMA2_7B
from wizard.config import emit
from wizard.config.script_settings import checkpointing_argument, script_settings, settings_json
from wizard.frontends.snippets import training_arguments
from wizard.planning.plan import Plan, Rung, Topology
from wizard.planning.rungs import RUNGS

ANSWERS = {"main_process_ip": "10.0.0.1", "main_process_port": 29500, "nvme_path": "/tmp", "micro_batch": 4,
           "grad_accum": 8, "seq_len": 4096}
CASES = [(spec, method, trainer) for spec in RUNGS for method in spec.methods for trainer in ("hf", "accelerate")]


def one_rung_plan(spec, gc: bool = True, machines: int = 2) -> Plan:
    """The table entry `spec`, chosen, on 2 machines of 8 GPUs, with gradient checkpointing as the plan would run it."""
    rung = Rung(key=spec.key, name=spec.label, backend=spec.backend, zero_stage=spec.zero_stage,
                offload_optimizer=spec.offload_optimizer, offload_param=spec.offload_param,
                fsdp_reshard=spec.fsdp_reshard, gradient_checkpointing=gc, fits=True, cp_size=spec.cp_size)
    return Plan(rungs=[rung], choice=rung, gpu_capacity_bytes=80 << 30, usable_bytes=72 << 30, precision="bf16",
                topology=Topology(machines, 8))


def emitted(answers, plan):
    ds = emit.deepspeed_config(answers, plan, LLAMA2_7B)
    acc = emit.accelerate_config(answers, plan, "/out/ds_config.json" if ds is not None else None, LLAMA2_7B)
    return acc, ds


def training_arguments_of(setting) -> dict:
    """`TrainingArguments(name=value)` in a setting's HF form, as a dict ({} for another form)."""
    m = re.fullmatch(r"TrainingArguments\((\w+)=(.+)\)", setting.hf)
    return {m.group(1): ast.literal_eval(m.group(2))} if m else {}


@pytest.mark.parametrize("spec,method,trainer", CASES, ids=[f"{s.key}-{m}-{t}" for s, m, t in CASES])
def test_a_setting_is_listed_exactly_when_no_written_file_carries_it(spec, method, trainer):
    answers = {**ANSWERS, "method": method, "trainer": trainer}
    plan = one_rung_plan(spec)
    acc, ds = emitted(answers, plan)
    settings = {s.key: s for s in script_settings(answers, plan)}
    fsdp_checkpointing = (acc.get("fsdp_config") or {}).get("fsdp_activation_checkpointing") is True
    assert ("gradient_checkpointing" in settings) == (not fsdp_checkpointing)
    assert ds is None or "activation_checkpointing" not in ds      # DeepSpeed's own block checkpoints no HF model
    assert "micro_batch" in settings and settings["micro_batch"].value == 4
    assert ds is None or ds["train_micro_batch_size_per_gpu"] == "auto"          # never in a file
    assert "seq_len" in settings and settings["seq_len"].value == 4096
    assert ("precision" in settings) == (ds is not None and ds["bf16"]["enabled"] == "auto")
    assert ("grad_accum" in settings) == (ds is None or ds["gradient_accumulation_steps"] == "auto")
    assert ("optimizer" in settings) == (ds is None or "optimizer" not in ds)
    assert ("method" in settings) == (method != "full")
    fits_first = [s.fit for s in settings.values()]
    assert fits_first == sorted(fits_first, reverse=True) and list(settings)[0] in ("gradient_checkpointing",
                                                                                   "method", "micro_batch")
    if trainer == "hf":
        # the Done screen's TrainingArguments snippet says the same values
        snippet = training_arguments(answers, plan, "/out/ds_config.json" if ds is not None else None)
        for s in settings.values():
            for name, value in training_arguments_of(s).items():
                assert snippet[name] == value, (s.key, name)


@pytest.mark.parametrize("spec", [s for s in RUNGS if s.backend != "fsdp"], ids=lambda s: s.key)
def test_every_rung_outside_fsdp_needs_the_script_to_checkpoint_and_says_how(spec):
    plan = one_rung_plan(spec)
    hf = script_settings({**ANSWERS, "trainer": "hf"}, plan)[0]
    loop = script_settings({**ANSWERS, "trainer": "accelerate"}, plan)[0]
    assert hf.key == loop.key == "gradient_checkpointing" and hf.fit
    assert hf.hf == f"TrainingArguments({checkpointing_argument()}=True)"
    assert "gradient_checkpointing_enable()" in loop.how("accelerate")
    assert "step 0 runs out of memory" in hf.why and spec.label in hf.why
    assert script_settings({**ANSWERS, "gradient_checkpointing": "on"}, plan)[0].why.startswith(
        f"the plan sizes {spec.label} with it, as asked")
    without = script_settings(ANSWERS, one_rung_plan(spec, gc=False))
    assert "gradient_checkpointing" not in {s.key for s in without}


def test_fsdp_checkpointing_answered_off_leaves_it_to_the_script():
    spec = next(s for s in RUNGS if s.key == "fsdp-reshard")
    answers = {**ANSWERS, "fsdp_activation_checkpointing": False}
    acc, _ = emitted(answers, one_rung_plan(spec))
    assert acc["fsdp_config"]["fsdp_activation_checkpointing"] is False
    assert script_settings(answers, one_rung_plan(spec))[0].key == "gradient_checkpointing"


def test_the_json_names_how_for_the_plans_trainer():
    plan = one_rung_plan(next(s for s in RUNGS if s.key == "zero2"))
    doc = settings_json({**ANSWERS, "trainer": "accelerate", "optimizer": "adamw-8bit", "attention": "flash"}, plan)
    by_key = {d["key"]: d for d in doc}
    assert by_key["gradient_checkpointing"]["how"].startswith("model.gradient_checkpointing_enable()")
    assert by_key["optimizer"]["how"] == "bitsandbytes.optim.AdamW8bit"
    assert by_key["attention"]["how"] == "from_pretrained(..., attn_implementation='flash_attention_2')"
    assert "grad_accum" not in by_key          # an own loop under DeepSpeed: ds_config.json's concrete value
    assert script_settings(ANSWERS, Plan(rungs=[], choice=None, gpu_capacity_bytes=0, usable_bytes=0,
                                         precision="bf16", topology=Topology())) == []
