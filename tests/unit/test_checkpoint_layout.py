"""wizard/checkpoint/layout.py: what a checkpoint directory holds and whether it is complete, on directories in the
libraries' own file formats (torch.save's zip, safetensors, torch.distributed.checkpoint's names; the slow tests of
tests/functional/test_checkpoint_resume.py read the checkpoints real trainings write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from wizard.checkpoint import layout


def deepspeed_checkpoint(root: Path, step: int = 4, stage: int = 2, world: int = 2, trainer_state: bool = True) -> Path:
    """A Trainer checkpoint of a DeepSpeed run as the engine and the Trainer lay it out."""
    ck = root / f"checkpoint-{step}"
    tag = ck / f"global_step{step}"
    tag.mkdir(parents=True)
    states = {"ds_config": {"zero_optimization": {"stage": stage}}, "dp_world_size": world, "global_steps": step,
              "ds_version": "0.19.0", "module": None if stage == 3 else {"w": torch.zeros(8)}}
    if stage == 3:
        for r in range(world):
            torch.save(states, tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
    else:
        torch.save(states, tag / "mp_rank_00_model_states.pt")
    for r in range(world):
        torch.save({"optimizer_state_dict": {"zero_stage": stage}}, tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    (ck / "latest").write_text(f"global_step{step}")
    save_file({"w": torch.zeros(8)}, ck / "model.safetensors")
    (ck / "config.json").write_text("{}")
    torch.save({"rng": 1}, ck / "rng_state.pth")
    torch.save({"output_dir": "out"}, ck / "training_args.bin")
    if trainer_state:
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ck


def test_a_complete_deepspeed_checkpoint_says_its_stage_world_step_and_dtype(tmp_path):
    ck = layout.inspect(deepspeed_checkpoint(tmp_path))
    assert (ck.kind, ck.zero_stage, ck.world_size, ck.step, ck.complete, ck.trainer, ck.resumable) == \
        ("deepspeed", 2, 2, 4, True, True, True), ck
    assert ck.engine == "DeepSpeed ZeRO-2, 2 ranks" and ck.dtype == "float32" and ck.ds_version == "0.19.0"
    assert ck.parts["optimizer"] > 0 and ck.parts["weights"] > 0 and ck.bytes == sum(ck.parts.values())


def test_zero3_is_told_by_its_file_names_without_loading_anything(tmp_path):
    ck = layout.inspect(deepspeed_checkpoint(tmp_path, stage=3, world=4), deep=False)
    assert (ck.zero_stage, ck.world_size, ck.complete) == (3, 4, True)


@pytest.mark.parametrize("cut, said", [
    ("trainer_state", "no trainer_state.json, which the Trainer writes last: the save was cut short"),
    ("latest", "no `latest` file naming the DeepSpeed tag"),
    ("rank1", "optimizer partition of rank 1 missing in global_step4/"),
    ("truncated", "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt is not a whole torch file"),
    ("safetensors", "model.safetensors is cut short"),
])
def test_a_save_cut_short_is_partial_and_says_why(tmp_path, cut, said):
    ck_dir = deepspeed_checkpoint(tmp_path)
    tag = ck_dir / "global_step4"
    if cut == "trainer_state":
        (ck_dir / "trainer_state.json").unlink()
    elif cut == "latest":
        (ck_dir / "latest").unlink()
    elif cut == "rank1":
        (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    elif cut == "truncated":
        f = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        f.write_bytes(f.read_bytes()[:-40])
    else:
        f = ck_dir / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-4])
    ck = layout.inspect(ck_dir)
    assert not ck.complete and any(said in p for p in ck.problems), ck.problems


def test_the_last_complete_checkpoint_is_found_and_the_partial_one_after_it_named(tmp_path):
    deepspeed_checkpoint(tmp_path, step=2)
    deepspeed_checkpoint(tmp_path, step=4)
    deepspeed_checkpoint(tmp_path, step=6, trainer_state=False)
    (tmp_path / "runs").mkdir()
    found = layout.find(tmp_path)
    assert [c.name for c in found.checkpoints] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert found.last_complete.name == "checkpoint-4" and [c.name for c in found.partial] == ["checkpoint-6"]
    # set aside by a resume: still listed, still partial, never "after" the last complete one again
    (tmp_path / "checkpoint-6").rename(tmp_path / "partial-checkpoint-6")
    found = layout.find(tmp_path)
    aside = [c for c in found.checkpoints if c.name == "partial-checkpoint-6"]
    assert aside and not aside[0].complete and aside[0].step == 6 and found.partial == []


def test_fsdp_sharded_checkpoints_count_their_ranks_and_need_dcps_metadata(tmp_path):
    ck_dir = tmp_path / "checkpoint_4"
    for d in ("pytorch_model_fsdp_0", "optimizer_0"):
        (ck_dir / d).mkdir(parents=True)
        for r in range(3):
            (ck_dir / d / f"__{r}_0.distcp").write_bytes(b"shard")
        (ck_dir / d / ".metadata").write_bytes(b"meta")
    ck = layout.inspect(ck_dir)
    assert (ck.kind, ck.fsdp, ck.world_size, ck.step, ck.complete, ck.resumable) == \
        ("fsdp", "sharded", 3, 4, True, True)
    assert ck.engine == "FSDP sharded (torch.distributed.checkpoint), 3 ranks"
    (ck_dir / "optimizer_0" / ".metadata").unlink()
    ck = layout.inspect(ck_dir)
    assert not ck.complete and "optimizer_0/.metadata is missing" in ck.problems[0]


def test_an_adapter_and_a_plain_model_are_told_apart(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8,
                                                             "base_model_name_or_path": "tiny"}))
    save_file({"a": torch.zeros(2, dtype=torch.bfloat16)}, adapter / "adapter_model.safetensors")
    ck = layout.inspect(adapter)
    assert (ck.kind, ck.engine, ck.dtype, ck.complete, ck.resumable) == ("adapter", "LORA adapter r=8", "bfloat16",
                                                                          True, False)
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.zeros(2)}, model / "model.safetensors")
    (model / "config.json").write_text("{}")
    ck = layout.inspect(model)
    assert (ck.kind, ck.engine, ck.model_weights, ck.model_config) == \
        ("model", "model weights (no optimizer state)", True, True)


def test_a_directory_with_no_checkpoint_is_said_so(tmp_path):
    ck = layout.inspect(tmp_path)
    assert ck.kind == "unknown" and not ck.complete and "holds no checkpoint" in ck.problems[0]
    assert layout.find(tmp_path).checkpoints == []


def test_an_output_directory_with_its_final_model_lists_its_checkpoints_not_itself(tmp_path):
    deepspeed_checkpoint(tmp_path, step=2)
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")     # the Trainer's final save_model
    (tmp_path / "config.json").write_text("{}")
    assert [c.name for c in layout.find(tmp_path).checkpoints] == ["checkpoint-2"]
    (tmp_path / "checkpoint-2").rename(tmp_path / "elsewhere")
    assert [c.kind for c in layout.find(tmp_path).checkpoints] == ["model"]
