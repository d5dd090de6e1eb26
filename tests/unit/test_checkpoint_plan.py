"""What a resume on another layout needs (wizard/checkpoint/convert.resume_plan), the disk a checkpoint takes
(wizard/sizing/checkpoint, plan.checkpoint in the plan's JSON: the interface `wizard preflight` and SkyPilot read),
and `wizard checkpoint`'s bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.launch_support import REPO, env
from wizard.checkpoint.convert import ConversionError, Target, resume_plan, to_universal
from wizard.checkpoint.layout import Checkpoint
from wizard.sizing.checkpoint import checkpoint_size


def ds(stage=2, world=2) -> Checkpoint:
    return Checkpoint("/x/checkpoint-4", "deepspeed", step=4, zero_stage=stage, world_size=world, ds_tag="global_step4",
                      resumable=True, trainer=True)


@pytest.mark.parametrize("ck, target, universal, said", [
    (ds(2, 2), Target("deepspeed", 2, 2), False, "loads as it is: same layout"),
    (ds(2, 2), Target("deepspeed", 2, 4), True, "2 ranks -> 4 ranks: DeepSpeed's universal checkpoint"),
    (ds(1, 2), Target("deepspeed", 2, 2), True, "ZeRO-1 -> ZeRO-2: DeepSpeed's universal checkpoint"),
    (ds(3, 4), Target("deepspeed", 3, 2), True, "4 ranks -> 2 ranks"),
    (Checkpoint("/x/c", "fsdp", fsdp="sharded", world_size=2, resumable=True), Target("fsdp", None, 4), False,
     "torch.distributed.checkpoint reshards it as accelerate loads it"),
    (Checkpoint("/x/c", "model", world_size=2, resumable=True), Target("ddp", None, 8), False, "loads as it is"),
])
def test_what_a_resume_needs(ck, target, universal, said):
    plan = resume_plan(ck, target)
    assert plan.refused is None and plan.universal is universal and said in plan.said[0], plan


@pytest.mark.parametrize("ck, target, refused", [
    (ds(2, 2), Target("deepspeed", 3, 4), "DeepSpeed cannot load checkpoint-4 (ZeRO-2) into ZeRO-3"),
    (ds(3, 2), Target("deepspeed", 2, 2), "DeepSpeed cannot load checkpoint-4 (ZeRO-3) into ZeRO-2"),
    (ds(2, 2), Target("fsdp", None, 2), "only DeepSpeed reads ZeRO partitions"),
    (Checkpoint("/x/c", "fsdp", fsdp="per-rank", world_size=2, resumable=True), Target("fsdp", None, 4),
     "they load only on 2 ranks"),
    (Checkpoint("/x/c", "model", resumable=False), Target("ddp", None, 2), "holds no optimizer state"),
])
def test_what_a_resume_cannot_do_is_one_line(ck, target, refused):
    plan = resume_plan(ck, target)
    assert plan.refused and refused in plan.refused and "\n" not in plan.refused


def test_only_a_complete_deepspeed_checkpoint_is_converted():
    with pytest.raises(ConversionError, match="not a DeepSpeed checkpoint"):
        to_universal(Checkpoint("/x/c", "fsdp", fsdp="sharded"))
    with pytest.raises(ConversionError, match="is partial"):
        to_universal(Checkpoint("/x/c", "deepspeed", ds_tag="global_step4", complete=False, problems=["no latest"]))


# ----------------------------------------------------------------------------- sizing


def size(**kw):
    base = dict(backend="deepspeed", zero_stage=2, offload_optimizer="none", params=1_000_000,
                trainable_params=1_000_000, adapters=False, precision="bf16", optimizer="adamw", num_machines=1,
                processes_per_machine=8)
    return checkpoint_size(**{**base, **kw})


def test_a_zero_checkpoint_holds_the_fp32_master_and_moments_and_two_16bit_copies_of_the_weights():
    c = size()
    assert c.parts["optimizer"] == 12_000_000 and c.parts["weights"] == 4_000_000
    assert c.keep == 2 and c.assumptions and c.total_bytes == c.bytes * 2 + c.export_bytes
    limited = size(save_total_limit=3)
    assert limited.keep == 4 and not any("save_total_limit" in a for a in limited.assumptions)


def test_per_node_is_the_most_one_machine_writes():
    two = size(num_machines=2)
    # each machine writes its 8 ranks' optimizer partitions; machine 0 also the weights
    assert two.per_node_bytes < two.bytes and two.per_node_bytes >= two.parts["weights"] + two.parts["optimizer"] // 2
    fsdp = size(backend="fsdp", zero_stage=None, num_machines=2)
    assert fsdp.per_node_bytes < fsdp.bytes / 2 + 200_000
    ddp = size(backend="ddp", zero_stage=None, num_machines=2)
    assert ddp.per_node_bytes >= ddp.parts["weights"] + ddp.parts["optimizer"]


def test_adapters_save_only_what_is_trained():
    lora = size(trainable_params=10_000, adapters=True)
    full = size()
    assert lora.parts["optimizer"] == 10_000 * 12
    assert lora.parts["weights"] + lora.parts["optimizer"] < (full.parts["weights"] + full.parts["optimizer"]) / 50


def test_the_plan_json_carries_the_checkpoint_interface(tmp_path):
    """plan.checkpoint's keys, as issue 41 (preflight's disk check) and issue 40 (SkyPilot) read them."""
    r = subprocess.run([sys.executable, "-m", "wizard", "plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2",
                        "--num-machines", "2", "--main-process-ip", "10.0.0.1", "--save-total-limit", "2", "--json"],
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["plan"]["checkpoint"]
    for key in ("bytes", "per_node_bytes", "keep", "total_bytes", "per_node_total_bytes"):
        assert isinstance(c[key], int) and c[key] > 0, (key, c)
    assert c["keep"] == 3 and c["total_bytes"] == c["bytes"] * 3 + c["export_bytes"]
    assert c["per_node_bytes"] < c["bytes"] and set(c["parts"]) >= {"weights", "optimizer"}
    assert all(isinstance(v, int) for v in c["parts"].values())


# ----------------------------------------------------------------------------- wizard checkpoint


@pytest.mark.parametrize("args, said", [
    (["nope"], "wizard: DIR: nope is not a directory"),
    (["."], "holds no checkpoint this wizard knows"),
    ([".", "--merge-adapter"], "wizard: --merge-adapter: only applies with --export OUT"),
])
def test_wizard_checkpoint_bad_input_is_one_line_and_exit_2(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-m", "wizard", "checkpoint", *args], capture_output=True, text=True,
                       env=env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_rank_zero_records_where_the_trainer_saves_and_the_resume_reaches_trainer_train(tmp_path):
    """launch/_checkpoints.py in a fresh interpreter, as a rank runs it before the script: TrainingArguments records
    its output_dir in the run directory and gets resume_from_checkpoint; Trainer.train() resumes from the wizard's
    checkpoint whatever the script passed (here: a directory that is none, so the Trainer says which it tried)."""
    script = r'''
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "launch"))
import _checkpoints
_checkpoints.install()
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
args = TrainingArguments(output_dir=os.path.join(sys.argv[2], "out"), max_steps=1, save_steps=5,
                         save_total_limit=2, report_to="none", use_cpu=True)
print("RESUME_FIELD", args.resume_from_checkpoint, os.environ.get("WIZARD_RESUME_FROM"))
model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
try:
    Trainer(model=model, args=args, train_dataset=[{"input_ids": [1, 2], "labels": [1, 2]}]).train()
except Exception as exc:
    print("TRAIN_ERROR", type(exc).__name__, exc)
'''
    run_dir, wanted = tmp_path / "run", tmp_path / "checkpoint-7"
    run_dir.mkdir(mode=0o700)
    e = {**env(), "WIZARD_RUN_DIR": str(run_dir), "RANK": "0",
         "WIZARD_RESUME": json.dumps({"checkpoint": str(wanted), "universal": False})}
    r = subprocess.run([sys.executable, "-c", script, str(REPO), str(tmp_path)], capture_output=True, text=True,
                       env=e, cwd=tmp_path, timeout=300)
    assert f"RESUME_FIELD {wanted} {wanted}" in r.stdout, r.stdout + r.stderr[-3000:]
    assert f"[wizard] resuming the Trainer from {wanted}" in r.stdout
    assert "TRAIN_ERROR" in r.stdout and str(wanted) in r.stdout.split("TRAIN_ERROR", 1)[1]
    record = json.loads((run_dir / "checkpoints.json").read_text())
    assert record == {"kind": "trainer", "output_dir": str(tmp_path / "out"), "save_strategy": "steps",
                      "save_steps": 5, "save_total_limit": 2, "save_only_model": False,
                      "load_best_model_at_end": False}


def test_the_printed_training_arguments_keep_the_checkpoints_the_plan_sized():
    from wizard.frontends.snippets import training_arguments
    from wizard.planning.plan_types import Plan, Rung, Topology
    plan = Plan(rungs=[], choice=Rung("ddp", "DDP", "ddp"), gpu_capacity_bytes=1, usable_bytes=1, precision="bf16",
                topology=Topology(1, 2))
    assert training_arguments({"save_total_limit": 3}, plan, None)["save_total_limit"] == 3
    assert "save_total_limit" not in training_arguments({}, plan, None)


def test_the_details_answered_after_the_plan_refine_its_checkpoint_size():
    """FSDP's state-dict type is a detail question (answered after the plan): FULL_STATE_DICT puts everything on
    rank 0, so the pipeline sizes the checkpoint again with it."""
    from wizard import pipeline

    def sized(**given):
        return pipeline.build(pipeline.Request(assume="2xA100-80GB", plan_only=True,
                                               given={"params": "1B", "backend": "fsdp", **given})).plan.checkpoint
    sharded, full = sized(), sized(fsdp_state_dict_type="FULL_STATE_DICT")
    assert sharded.layout.startswith("FSDP sharded") and full.layout.startswith("FSDP full")
    assert full.parts["weights"] > sharded.parts["weights"]


def test_a_runs_checkpoints_record_is_read_through_its_schema(tmp_path):
    """checkpoints.json is the run's data like run.json: one that does not pass launch.runschema.SavesRecord is no
    record (wizard runs shows '-', --resume says the run recorded none), never a crash or a path from a wrong type."""
    from launch._checkpoints import RECORD_FILE
    from launch.resume import last_checkpoint, recorded_output
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    good = {"kind": "trainer", "output_dir": str(tmp_path / "out"), "save_steps": 5, "save_total_limit": 2}
    for body, ok in ((good, True), ({**good, "output_dir": 7}, False), ({**good, "save_total_limit": -1}, False),
                     ({**good, "kind": "other"}, False), ([good], False)):
        (run / RECORD_FILE).write_text(json.dumps(body))
        assert (recorded_output(run) is not None) == ok, body
    (run / RECORD_FILE).write_text(json.dumps({**good, "output_dir": 7}))
    assert last_checkpoint(run) == {"checkpoint_dir": None, "last_checkpoint": None, "partial_checkpoints": []}
