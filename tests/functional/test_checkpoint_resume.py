"""Checkpoints carried across a kill, a world-size change and a rung change, with real trainings on this CPU (issue
39's evidence). Nothing is faked: `wizard launch` starts accelerate, torchrun and DeepSpeed over gloo; the
checkpoints are the Trainer's and accelerate's own; the conversions are DeepSpeed's and accelerate's.

DeepSpeed (examples/train.py, the HF Trainer, the configs the wizard writes; one module fixture, two launches):
- R: 2 ranks, ZeRO-2, 8 steps, a checkpoint every 2, killed (SIGKILL, every rank) in the middle of the save of step 6;
- A: `wizard launch --resume R` on 3 ranks (uneven partitions): checkpoint-6 is named partial and set aside, checkpoint-4 converted to
  DeepSpeed's universal format and loaded with checkpoint.load_universal; it trains steps 5-8, and its last
  checkpoint (3 ranks) is the one exported.
- B, the reverse (fewer ranks): `wizard launch --resume out/checkpoint-6` (A's, 3 ranks) on 2 ranks, into its own
  output directory: the 3-rank optimizer partitions merged by the universal conversion into 2; it trains steps 7-8,
  which must equal A's. Three ranks rather than the issue's four: the uneven split is the harder merge, and a fourth
  process on CI's two cores costs more than it proves.
Every rank of these runs trains the same batches (the Trainer on DeepSpeed's CPU accelerator sees one process per
rank, so its data are not split), and a step's gradient is the mean of identical per-rank gradients on any world size:
a resumed step's loss equals the uninterrupted run's. Measured: bit-identical on 0.19.0 and 0.19.8; the tolerance,
LOSS_RTOL = 1e-6, allows fp32's rounding of that mean (g+g+g+g in another order: a few ulps, 1.2e-7 each), nothing
that a wrong optimizer state, learning rate or data position would stay inside (those move the loss by 1e-3 and more).

ZeRO-2 -> ZeRO-3 is not something DeepSpeed can load (its universal loader looks for the new stage's model-states
file names): the wizard refuses in one line before launching, and DeepSpeed's own refusal is shown by a one-process
engine load of the same conversion.

FSDP2 (tests/functional/fsdp_resume_cpu.py, a plain accelerate loop; the Trainer cannot run FSDP on a CPU): 2 ranks
save torch.distributed.checkpoint shards, `wizard launch --resume` continues on 3; DCP reshards as accelerate loads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import env, wizard_here

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
FSDP_LOOP = str(REPO / "tests" / "functional" / "fsdp_resume_cpu.py")
UNIVERSAL_LOAD = str(REPO / "tests" / "functional" / "deepspeed_universal_load.py")
LOSS_RTOL = 1e-6
TINY = ["--params", "1M", "--hidden-size", "64", "--layers", "2", "--vocab-size", "128"]

pytestmark = pytest.mark.slow


TIMES: list[tuple[str, float]] = []


def wizard(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, env=env(),
                       cwd=cwd, timeout=timeout)
    TIMES.append((" ".join(a for a in args[:1] + tuple(x for x in args if x.startswith("--resume") or
                                                            x.endswith(".yaml"))), time.monotonic() - t0))
    return r


def write_config(out: Path, *flags: str) -> Path:
    """The wizard's own files, written in-process (one interpreter for all of them)."""
    from wizard.frontends.cli import main
    assert main(["--non-interactive", *TINY, "--output-dir", str(out), *flags]) == 0
    return out / "default_config.yaml"


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss as rank 0 printed it at full precision (examples/train.py, fsdp_resume_cpu.py)."""
    text = (run_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step=(\d+) loss=([-\d.e]+)", text)}


def same_losses(got: dict[int, float], want: dict[int, float], steps) -> None:
    for s in steps:
        assert s in got and s in want, (s, got, want)
        assert abs(got[s] - want[s]) <= LOSS_RTOL * abs(want[s]), (s, got[s], want[s])


class Runs:
    pass


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """R, A and B above, launched once for the module."""
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("ds-resume")
    r = Runs()
    r.root = root
    r.z2n2 = write_config(root / "z2n2", "--backend", "deepspeed", "--zero-stage", "2", "--num-processes", "2")
    r.z2n3 = write_config(root / "z2n3", "--backend", "deepspeed", "--zero-stage", "2", "--num-processes", "3")
    r.z3n4 = write_config(root / "z3n4", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "4")
    r.out = root / "out"
    args = ["--steps", "8", "--save-steps", "2", "--output-dir", str(r.out)]
    r.R = wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(r.z2n2), "--run-dir",
                 str(root / "runs" / "R"), "--grace", "5", "--", TRAIN, *args, "--die-in-save", "6", cwd=root)
    r.R_dir = root / "runs" / "R"
    r.checkpoint_view = wizard_here("checkpoint", str(r.out), cwd=root)     # before the resume sets anything aside
    r.runs_view = wizard_here("runs", str(root / "runs"), "--json", cwd=root)
    r.refused = wizard_here("launch", "--headless", "--config-file", str(r.z3n4), "--run-dir",
                            str(root / "runs" / "Z3"), "--resume", str(r.R_dir), "--", TRAIN, *args, cwd=root)
    r.A = wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(r.z2n3), "--run-dir",
                 str(root / "runs" / "A"), "--resume", str(r.R_dir), "--", TRAIN, *args, cwd=root)
    r.A_dir = root / "runs" / "A"
    r.B = wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(r.z2n2), "--run-dir",
                 str(root / "runs" / "B"), "--resume", str(r.out / "checkpoint-6"), "--", TRAIN, "--steps", "8",
                 "--output-dir", str(root / "out-b"), cwd=root)
    r.B_dir = root / "runs" / "B"
    r.seconds = time.monotonic() - t0
    print(f"\n[ds fixture] three launches and the checks between them: {r.seconds:.0f} s; "
          + ", ".join(f"{what} {sec:.0f} s" for what, sec in TIMES))
    return r


def test_a_run_killed_in_a_save_names_the_partial_checkpoint_and_the_resume_takes_the_one_before(ds):
    assert ds.R.returncode != 0, ds.R.stdout[-3000:]
    assert "dying in the save of step 6" in (ds.R_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    view = ds.checkpoint_view
    assert view.returncode == 0, view.stderr
    rows = {ln.split()[0]: ln for ln in view.stdout.splitlines() if ln.startswith("checkpoint-")}
    assert rows["checkpoint-6"].endswith("PARTIAL") and rows["checkpoint-4"].endswith("complete"), view.stdout
    assert "DeepSpeed ZeRO-2, 2 ranks" in rows["checkpoint-4"]
    assert "partial: no trainer_state.json, which the Trainer writes last" in view.stdout
    assert "last complete: checkpoint-4; partial after it: checkpoint-6" in view.stdout
    (run,) = json.loads(ds.runs_view.stdout)
    assert run["last_checkpoint"] == str(ds.out / "checkpoint-4") and run["state"] == "failed", run
    assert run["partial_checkpoints"] == [str(ds.out / "checkpoint-6")]
    # the resume names it, sets it aside whole (nothing lost) and takes checkpoint-4
    assert ds.A.returncode == 0, ds.A.stdout[-4000:] + ds.A.stderr[-2000:]
    said = [ln for ln in ds.A.stdout.splitlines() if ln.startswith("[wizard] resume:")]
    assert any("checkpoint-6 is partial" in ln and "set aside as partial-checkpoint-6" in ln for ln in said), said
    assert any(f"last complete checkpoint: {ds.out / 'checkpoint-4'} (step 4" in ln for ln in said), said
    aside = ds.out / "partial-checkpoint-6"
    assert (aside / "global_step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()
    assert not (aside / "trainer_state.json").exists()
    record = json.loads((ds.A_dir / "run.json").read_text())["resume"]
    assert record["checkpoint"] == str(ds.out / "checkpoint-4") and record["universal"] is True
    assert record["set_aside"] == [str(ds.out / "checkpoint-6")]


def test_zero2_on_two_ranks_continues_on_three_through_deepspeeds_universal_checkpoint(ds):
    assert ds.A.returncode == 0, ds.A.stdout[-4000:]
    assert "wrote DeepSpeed's universal checkpoint global_step4_universal" in ds.A.stdout
    assert (ds.out / "checkpoint-4" / "latest_universal").read_text().strip() == "global_step4_universal"
    log = (ds.A_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    assert f"resuming the Trainer from {ds.out / 'checkpoint-4'} (DeepSpeed universal checkpoint" in log
    assert "engine=deepspeed zero_stage=2 partitioned=False numel=8192 world_size=3" in log
    uninterrupted, resumed = losses(ds.R_dir), losses(ds.A_dir)
    assert sorted(resumed) == [5, 6, 7, 8] and sorted(uninterrupted) == [1, 2, 3, 4, 5, 6], (resumed, uninterrupted)
    same_losses(resumed, uninterrupted, (5, 6))
    from wizard.checkpoint import layout
    found = layout.find(ds.out)
    assert [(c.name, c.complete, c.world_size) for c in found.checkpoints] == [
        ("checkpoint-2", True, 2), ("checkpoint-4", True, 2), ("checkpoint-6", True, 3),
        ("partial-checkpoint-6", False, 2), ("checkpoint-8", True, 3)]
    assert found.last_complete.name == "checkpoint-8" and found.partial == []


def test_zero2_on_three_ranks_continues_on_two_the_reverse_merge(ds):
    """B: A's checkpoint-6 (3 ranks, complete) resumed on 2 ranks; steps 7 and 8 equal A's own."""
    assert ds.B.returncode == 0, ds.B.stdout[-4000:] + ds.B.stderr[-2000:]
    assert "wrote DeepSpeed's universal checkpoint global_step6_universal" in ds.B.stdout
    log = (ds.B_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    assert f"resuming the Trainer from {ds.out / 'checkpoint-6'} (DeepSpeed universal checkpoint" in log
    assert "engine=deepspeed zero_stage=2 partitioned=False numel=8192 world_size=2" in log
    three, two = losses(ds.A_dir), losses(ds.B_dir)
    assert sorted(two) == [7, 8], two
    same_losses(two, three, (7, 8))


def test_zero2_into_zero3_is_refused_in_one_line_as_deepspeed_itself_refuses_it(ds):
    """DeepSpeed (0.19.0 and 0.19.8) cannot load a ZeRO-1/2 universal conversion into ZeRO-3. The wizard says so in
    one line and launches nothing; DeepSpeed's own load of the same conversion (its engine, one process) stops with
    the AssertionError of state_dict_factory. If a DeepSpeed ever loads it, this test fails: lift the refusal
    (wizard/checkpoint/convert.py ZERO_FAMILIES)."""
    r = ds.refused
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout[-2000:] + r.stderr
    assert "DeepSpeed cannot load checkpoint-4 (ZeRO-2) into ZeRO-3" in r.stderr
    assert not (ds.root / "runs" / "Z3").exists()
    lib = subprocess.run([sys.executable, UNIVERSAL_LOAD, str(ds.out / "checkpoint-4"), "3"], capture_output=True,
                         text=True, env=env(), cwd=ds.root, timeout=300)
    (line,) = [ln for ln in lib.stdout.splitlines() if ln.startswith("LOAD_RESULT ")]
    result = json.loads(line[len("LOAD_RESULT "):])
    assert result["loaded"] is False and result["error"] == "AssertionError", result
    assert result["where"] == "state_dict_factory.py:check_ckpt_list", result


def test_the_export_loads_with_from_pretrained_and_its_weights_are_the_trained_models(ds, tmp_path):
    """A's last checkpoint (ZeRO-2, 3 ranks) exported by DeepSpeed's zero_to_fp32: from_pretrained loads it and every
    weight equals the trained model the Trainer saved in that checkpoint (model.safetensors, the engine's module)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    r = wizard_here("checkpoint", str(ds.out), "--export", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "checkpoint-8: exported to" in r.stdout and "zero_to_fp32" in r.stdout
    model = AutoModelForCausalLM.from_pretrained(out)
    trained = load_file(ds.out / "checkpoint-8" / "model.safetensors")
    mine = model.state_dict()
    assert set(trained) <= set(mine)
    for name, tensor in trained.items():
        assert torch.equal(mine[name], tensor), name
    # bad input: one line, exit 2, nothing written
    again = wizard_here("checkpoint", str(ds.out), "--export", str(out), cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "is not an empty directory" in again.stderr
    partial = wizard_here("checkpoint", str(ds.out / "partial-checkpoint-6"), "--export", str(tmp_path / "x"),
                          cwd=tmp_path)
    assert partial.returncode == 2 and "is partial" in partial.stderr and not (tmp_path / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]       # no temporary directory left


def test_the_plans_checkpoint_size_is_what_the_run_wrote(ds):
    """plan.checkpoint for the same model (its config.json, saved in the checkpoint) and rung, against checkpoint-2's
    files (R: ZeRO-2, 2 ranks, fp32)."""
    from wizard.checkpoint import layout
    plan = json.loads(wizard_here("plan", "--model", str(ds.out / "checkpoint-2"), "--seq-len", "32", "--backend",
                                  "deepspeed", "--zero-stage", "2", "--num-processes", "2", "--json",
                                  cwd=ds.root).stdout)["plan"]["checkpoint"]
    real = layout.inspect(ds.out / "checkpoint-2")
    assert plan["parts"]["optimizer"] == pytest.approx(real.parts["optimizer"], rel=0.02), (plan, real.parts)
    assert plan["parts"]["weights"] == pytest.approx(real.parts["weights"], rel=0.02), (plan, real.parts)
    assert plan["bytes"] == pytest.approx(real.bytes, rel=0.10)


# ----------------------------------------------------------------------------- FSDP2


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("fsdp-resume")
    r = Runs()
    r.root = root
    flags = ["--backend", "fsdp", "--offload", "none", "--precision", "fp32", "--seq-len", "32"]
    r.n2 = write_config(root / "n2", "--assume", "2xA100-80GB", *flags)
    r.n3 = write_config(root / "n3", "--assume", "3xA100-80GB", *flags)
    r.out = root / "out"
    r.R = wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(r.n2), "--run-dir",
                 str(root / "runs" / "R"), "--", FSDP_LOOP, "--steps", "6", "--output-dir", str(r.out), cwd=root)
    r.R_dir = root / "runs" / "R"
    r.A = wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(r.n3), "--run-dir",
                 str(root / "runs" / "A"), "--resume", str(r.out / "checkpoint_4"), "--", FSDP_LOOP, "--steps", "6",
                 "--output-dir", str(root / "out-a"), cwd=root)
    r.A_dir = root / "runs" / "A"
    r.seconds = time.monotonic() - t0
    print(f"\n[fsdp fixture] two launches: {r.seconds:.0f} s; " + ", ".join(f"{w} {t:.0f} s" for w, t in TIMES))
    return r


def test_fsdp2_on_two_ranks_continues_on_three_resharded_by_torch_distributed_checkpoint(fsdp):
    assert fsdp.R.returncode == 0, fsdp.R.stdout[-4000:]
    assert fsdp.A.returncode == 0, fsdp.A.stdout[-4000:] + fsdp.A.stderr[-2000:]
    assert "torch.distributed.checkpoint reshards it as accelerate loads it" in fsdp.A.stdout
    log = (fsdp.A_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    assert f"resumed from {fsdp.out / 'checkpoint_4'} at step 4 on 3 ranks" in log
    same_losses(losses(fsdp.A_dir), losses(fsdp.R_dir), (5, 6))
    from wizard.checkpoint import layout
    ck = layout.inspect(fsdp.out / "checkpoint_4")
    assert (ck.kind, ck.fsdp, ck.world_size, ck.complete, ck.resumable) == ("fsdp", "sharded", 2, True, True)


def test_an_fsdp_sharded_checkpoint_exports_to_a_model_from_pretrained_loads(fsdp, tmp_path):
    """accelerate's merge_fsdp_weights on the 2-rank run's last checkpoint: from_pretrained (with the model's
    config.json, which a sharded save lacks) loads it, and every weight equals the trained model's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    no_config = wizard_here("checkpoint", str(fsdp.out / "checkpoint_6"), "--export", str(tmp_path / "x"),
                            cwd=tmp_path)
    assert no_config.returncode == 2 and "wizard: --config: no config.json in" in no_config.stderr
    assert no_config.stderr.count("\n") == 1 and not (tmp_path / "x").exists()
    r = wizard_here("checkpoint", str(fsdp.out / "checkpoint_6"), "--export", str(tmp_path / "export"), "--config",
                    str(fsdp.out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "FSDP shards of 2 ranks merged by accelerate's merge_fsdp_weights" in r.stdout
    mine = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    trained = load_file(fsdp.out / "trained.safetensors")
    assert set(trained) <= set(mine)
    for name, tensor in trained.items():
        assert torch.equal(mine[name], tensor), name
