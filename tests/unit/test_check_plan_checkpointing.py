"""Issue 36 item 3: `wizard check`'s memory advice is the plan's cheapest change, gradient checkpointing first.

The files are the wizard's own for the issue's two plans, with training arguments that turn checkpointing off:
the 70B on two nodes of 8 x H100 (ZeRO-3 + CPU optimizer offload) once got "No rung of the ladder fits ... a
smaller micro-batch" at micro-batch 1, and the 8B at micro-batch 8 (ZeRO-2) "FSDP2 + context parallel 4 fits: use
it" for a 2,048-token sequence; both fit as configured with checkpointing on. Where checkpointing alone is not
enough, the advice is the plan's own choice with checkpointing left to it (auto), as `wizard plan` makes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.check.doctor import build_context, run_rules
from wizard.pipeline import Request
from wizard.probe.hardware import assume

pytestmark = pytest.mark.timeout(180)

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def written(tmp_path: Path, spec: str, **given) -> Path:
    result = pipeline.build(Request(assume=spec, output_dir=str(tmp_path), given=given))
    (tmp_path / "default_config.yaml").write_text(result.yaml_text)
    if result.ds_text is not None:
        (tmp_path / "ds_config.json").write_text(result.ds_text)
    return tmp_path


def plan_finding(d: Path, model: str, spec: str, training_args: dict):
    (d / "training_args.json").write_text(json.dumps(training_args))
    ds = d / "ds_config.json"
    ctx = build_context(config_file=str(d / "default_config.yaml"), ds_config=str(ds) if ds.exists() else None,
                        training_args=str(d / "training_args.json"), model=str(MODELS / model),
                        hardware=assume(spec), versions={}, use_default_config=False)
    found = [f for f in run_rules(ctx) if f.rule == "PLAN-EXCEEDS-GPU"]
    assert len(found) == 1, [(f.rule, f.message) for f in run_rules(ctx)]
    return found[0]


@pytest.mark.parametrize("model,spec,given,micro,rung", [
    ("llama-3-70b", "8xH100-80GB,nodes=2", {"main_process_ip": "10.0.0.1"}, 1, "ZeRO-3 + CPU optimizer offload"),
    # whole sequences on DeepSpeed: the 8B's plan is now FSDP2 + context parallel 2 (no recomputation, faster)
    ("llama-3.1-8b", "8xH100-80GB", {"micro_batch": 8, "backend": "deepspeed", "parallelism_config_sp_size": 1}, 8,
     "DeepSpeed ZeRO-2"),
], ids=["70b-two-nodes", "8b-micro-batch-8"])
def test_checkpointing_off_is_told_to_turn_it_on_first(tmp_path, model, spec, given, micro, rung):
    d = written(tmp_path, spec, model=str(MODELS / model), **given)
    f = plan_finding(d, model, spec, {"gradient_checkpointing": False, "bf16": True,
                                      "per_device_train_batch_size": micro})
    assert f.message.startswith(f"{rung} without gradient checkpointing needs about")
    assert f.fix.startswith("Turn gradient checkpointing on (gradient_checkpointing: true in the training "
                            f"arguments): {rung} then needs about"), f.fix
    assert f.fix.endswith("at the same micro-batch, and fits.")
    assert f.fix not in f.message and "context parallel" not in f.fix and "No rung" not in f.fix


def test_where_checkpointing_alone_is_not_enough_the_plans_choice_comes_with_it(tmp_path):
    d = written(tmp_path, "8xH100-80GB", params="1B", backend="ddp")      # a DDP config, used for the 8B
    f = plan_finding(d, "llama-3.1-8b", "8xH100-80GB", {"activation_checkpointing": False, "bf16": True,
                                                         "per_device_train_batch_size": 8})
    assert f.message.startswith("DDP (data parallel) without gradient checkpointing needs about")
    # the plan's choice (wizard plan --micro-batch 8): context parallel 2, which fits without checkpointing
    assert f.fix.startswith("FSDP2 + context parallel 2 fits"), f.fix
    assert f.fix.endswith("use it (wizard writes it).") and "checkpointing" not in f.fix
