"""`wizard tune`: real 2-rank CPU trials (DeepSpeed's CPU accelerator over gloo) of the tiny example model.

One tune run serves several assertions (measured figures, the file written, calibration, the script's own
output dir untouched) to keep the suite's time down; the others each need their own run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.launch_support import REPO, alive, env, run_pids, state, wait_for

pytestmark = pytest.mark.slow

ANSWERS = str(REPO / "examples" / "train.answers.yaml")
EXAMPLE = str(REPO / "examples" / "train.py")


def wizard(args, cwd, extra_env=None, timeout=600):
    e = {**env(), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "wizard", *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


def tune_args(tmp_path, *more, script=EXAMPLE, script_args=("--steps", "40"), answers=True):
    """`answers=False`: as a user types it, `wizard tune -- examples/train.py`, the answers beside the script."""
    return (["tune"] + (["--answers", ANSWERS] if answers else []) + ["--steps", "2", "--warmup-steps", "1",
            "--output-dir", str(tmp_path / "out"), "--runs-root", str(tmp_path / "runs"), *more, "--", script,
            *script_args])


def test_tune_measures_zero2_and_zero3_writes_the_winner_and_calibrates(tmp_path):
    own = tmp_path / "script-output"
    cal = tmp_path / "calibration.json"
    r = wizard(tune_args(tmp_path, "--json", script_args=("--steps", "40", "--output-dir", str(own)), answers=False),
               tmp_path, {"WIZARD_CALIBRATION_FILE": str(cal)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "answers from " in r.stderr and "train.answers.yaml (beside the script)" in r.stderr
    doc = json.loads(r.stdout)
    rows = {c["rung"]: c for c in doc["candidates"] if c["variant"] is None}
    assert set(rows) == {"zero2", "zero3"}, doc
    # and the choice's micro-batch variant, capped on CPU processes at 8x the plan's micro-batch (4)
    assert [(c["rung"], c["micro_batch"], c["grad_accum"]) for c in doc["candidates"] if c["variant"]] == \
        [("zero2", 32, 1)], doc
    for row in rows.values():
        m = row["measured"]
        assert row["status"] == "measured", row
        assert m["steps"] == 2
        assert 0.001 < m["step_seconds"] < 30, m                 # a tiny model's step on a CPU
        assert 50 * 2**20 < m["peak_bytes"] < 8 * 2**30 and m["peak_kind"] == "rss", m
        assert m["tokens_per_second"] > 0 and m["optimizers"], m
        assert row["predicted"]["per_gpu_bytes"] > 0 and row["predicted"]["tokens_per_second"] > 0
        trial = Path(row["run_dir"])
        assert (trial / "run.json").is_file() and list((trial / "probe").glob("rank-*.jsonl")), trial
        assert state(trial)["status"] == "succeeded" and state(trial)["trial_done"] == {"steps": 3}
        assert sorted(p.name for p in (trial / "probe").glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    # the winner is the measured fastest (or the simpler rung within the noise) of those that train the user's
    # global batch (2 x 4 here): the micro-batch 32 variant is measured, shown, and not eligible by default
    (winner,) = [c for c in doc["candidates"] if c["label"] == doc["winner"]]
    (variant,) = [c for c in doc["candidates"] if c["variant"]]
    assert variant["status"] == "measured" and variant["global_batch_from"] == 4, variant
    assert "not eligible to win" in variant["message"] and winner["global_batch_from"] is None
    for other in doc["candidates"]:
        if other["status"] == "measured" and other["global_batch_from"] is None:
            assert winner["measured"]["tokens_per_second"] >= other["measured"]["tokens_per_second"] * 0.9
    assert json.loads((tmp_path / "out" / "wizard_plan.json").read_text())["given"]["micro_batch"] == \
        winner["micro_batch"]
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == (2 if winner["rung"] == "zero2" else 3)
    assert doc["files"]["accelerate_config"] == str(tmp_path / "out" / "default_config.yaml")
    # a trial never writes into the script's own output directory (the Trainer's output_dir went to the trial)
    assert not own.exists()
    assert (Path(rows["zero2"]["run_dir"]) / "probe" / "output_dir").is_dir()
    # calibration: written, read back by the next plan on this machine, which says so; --no-calibration is raw
    saved = json.loads(cal.read_text())
    (entries,) = saved["machines"].values()
    assert entries["zero2/full"]["trials"] == 1 and entries["zero2/full"]["speed_ratio"] > 0
    plan = wizard(["plan", "--answers", ANSWERS, "--json"], tmp_path, {"WIZARD_CALIBRATION_FILE": str(cal)})
    raw = wizard(["plan", "--answers", ANSWERS, "--json", "--no-calibration"], tmp_path,
                 {"WIZARD_CALIBRATION_FILE": str(cal)})
    text = wizard(["plan", "--answers", ANSWERS], tmp_path, {"WIZARD_CALIBRATION_FILE": str(cal)}).stdout
    speed = {r["key"]: r["speed"]["tokens_per_second"] for r in json.loads(plan.stdout)["plan"]["rungs"]}
    raw_speed = {r["key"]: r["speed"]["tokens_per_second"] for r in json.loads(raw.stdout)["plan"]["rungs"]}
    assert speed["zero2"] == pytest.approx(raw_speed["zero2"] * entries["zero2/full"]["speed_ratio"], rel=1e-3)
    assert speed["zero2"] != pytest.approx(raw_speed["zero2"], rel=1e-3)
    assert "calibrated by 2 trials of --params 98K on this machine on" in text, text
    assert "Measured on that model, not this one" not in text        # the same model: no caveat


def test_a_micro_batch_variant_runs_its_split_through_the_scripts_own_training_arguments(tmp_path):
    """examples/train.py sets per_device_train_batch_size from its --batch-size (4) and is not edited: the
    variant's trial still runs micro-batch 32 (the probe sets it in the script's TrainingArguments), as its
    probe's token counts show, and its predicted figures are the plan's at 32."""
    r = wizard(tune_args(tmp_path, "--json", "--candidates", "1", "--no-calibration"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    base, variant = doc["candidates"]
    assert base["variant"] is None and (base["micro_batch"], base["grad_accum"]) == (4, 1), base
    assert variant["variant"] == "largest micro-batch", variant
    assert (variant["micro_batch"], variant["grad_accum"], variant["gradient_checkpointing"]) == (32, 1, False)
    assert variant["label"] == "DeepSpeed ZeRO-2, micro-batch 32 x 1, GC off"
    assert variant["predicted"]["tokens_per_second"] != base["predicted"]["tokens_per_second"]
    assert variant["predicted"]["per_gpu_bytes"] > base["predicted"]["per_gpu_bytes"]
    for row, micro in ((base, 4), (variant, 32)):
        assert row["status"] == "measured", row
        ta = row["training_args"]
        assert ta["applied"] and ta["own"]["per_device_train_batch_size"] == 4, ta
        assert ta["now"]["per_device_train_batch_size"] == micro and ta["now"]["gradient_accumulation_steps"] == 1
        for rank in (0, 1):
            lines = (Path(row["run_dir"]) / "probe" / f"rank-{rank}.jsonl").read_text().splitlines()
            steps = [json.loads(x) for x in lines if '"step"' in x]
            assert len(steps) == 3, steps
            measured = [s for s in steps if not s["warmup"]]       # seq_len 32, accumulation 1
            assert measured and all(s["micro_batches"] == 1 and s["tokens"] == micro * 32 for s in measured), steps
        # tokens/s over the 2 ranks: the measured steps' tokens over their time
        m = row["measured"]
        assert m["tokens_per_second"] * m["step_seconds"] == pytest.approx(2 * micro * 32, rel=0.5)


OWN_LOOP = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(128, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (4, 32))
    for _ in range(200):
        model(ids).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    print("SCRIPT-END", flush=True)
''')


def test_a_script_without_training_arguments_runs_its_own_split_and_its_variants_are_not_applicable(tmp_path):
    """An own torch loop builds no TrainingArguments: its rung is measured as it runs (its own micro-batch),
    and the variant reads "not applicable", not measured as if the micro-batch had changed; it is not even run,
    since the first trial showed it."""
    from wizard.tune import NOT_APPLICABLE
    script = tmp_path / "own_loop.py"
    script.write_text(OWN_LOOP)
    r = wizard(tune_args(tmp_path, "--json", "--candidates", "1", "--no-calibration", script=str(script),
                         script_args=()), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    base, variant = json.loads(r.stdout)["candidates"]
    assert base["status"] == "measured" and base["training_args"] is None, base
    assert variant["variant"] and variant["status"] == NOT_APPLICABLE and variant["run_dir"] is None, variant
    assert "--batch-flag" in variant["message"]


OOM_UNDER_ZERO2 = textwrap.dedent('''
    import json, os, runpy, sys
    cfg = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if cfg and json.load(open(cfg))["zero_optimization"]["stage"] == 2:
        raise MemoryError("simulated: out of memory under ZeRO-2")
    sys.argv = [{example!r}] + sys.argv[1:]
    runpy.run_path({example!r}, run_name="__main__")
''')


def test_too_small_budget_stops_with_partial_results_said_plainly(tmp_path):
    r = wizard(tune_args(tmp_path, "--budget", "3"), tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the result is partial" in r.stdout and "not run (budget spent)" in r.stdout, r.stdout
    assert "nothing written" in r.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_trial_stopped_by_its_timeout_says_which_limit_stopped_it(tmp_path):
    """A row stopped by --trial-timeout and one stopped by what was left of --budget both read "timed out":
    the message names the limit (it said only "stopped after 1 s" under a budget of 5 s)."""
    r = wizard(tune_args(tmp_path, "--candidates", "1", "--variants", "0", "--trial-timeout", "2",
                         "--no-calibration"), tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DeepSpeed ZeRO-2: stopped after 2 s (--trial-timeout) with 0 of 2 measured steps" in r.stdout, r.stdout
    # and `wizard runs` says why the trial stopped: it read "stopped 130", the same as a Ctrl-C
    (trial,) = (tmp_path / "runs").glob("tune-*/01-*/run.json")
    assert json.loads(trial.read_text()).get("stop_reason") == \
        "wizard tune: the trial's time limit, 2 s (--trial-timeout)", trial.read_text()


def test_ctrl_c_mid_trial_writes_nothing_and_leaves_no_process(tmp_path):
    e = env()
    p = subprocess.Popen([sys.executable, "-m", "wizard", *tune_args(tmp_path, script_args=("--steps", "400",
                                                                                           "--sleep", "0.5"))],
                         cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def stepping():
            return [f for f in (tmp_path / "runs").glob("tune-*/01-*/probe/rank-*.jsonl")
                    if '"step"' in f.read_text()]
        assert wait_for(stepping, 300, every=0.5), "the first trial never reached an optimizer step"
        (trial,) = [d for d in (tmp_path / "runs").glob("tune-*/01-*") if (d / "run.json").exists()]
        pids = run_pids(state(trial))
        assert pids
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert "interrupted; nothing written" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    pids |= run_pids(state(trial))
    assert wait_for(lambda: not alive(pids), 10), alive(pids)
    assert state(trial)["status"] == "stopped"
    assert state(trial)["stop_reason"].startswith("wizard tune was interrupted"), state(trial)
    assert "1/3 DeepSpeed ZeRO-2: interrupted" in err and "budget spent" not in err, err[-2000:]
    assert not list((tmp_path / "runs").glob("tune-*/02-*"))     # the next candidate never started


def test_plain_measure_oom_row_and_the_measured_winner_is_written(tmp_path, monkeypatch, capsys):
    """--plain: "Measure ..." on the plan runs the same trials. The plan picks ZeRO-2, and under it the script
    runs out of memory: that row reads "does not fit (measured)", ZeRO-3 is still measured, becomes the choice
    and is written: the winner follows the measurement, not the prediction."""
    import yaml
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from wizard.config.questions import for_stage
    from wizard.frontends.prompts import run_plain
    from wizard.frontends.session import TARGET_CPU, WizardState
    from wizard.pipeline import Request
    monkeypatch.chdir(tmp_path)
    for k, v in env().items():
        monkeypatch.setenv(k, v)
    script = tmp_path / "oom_script.py"
    script.write_text(OOM_UNDER_ZERO2.format(example=EXAMPLE))
    given = yaml.safe_load(Path(ANSWERS).read_text())
    request = Request(given=given, output_dir=str(tmp_path / "out"))
    probe = WizardState(request)
    probe.set_probed(probe.load_hardware())
    probe.set_target(TARGET_CPU)
    probe.replan()
    before_plan = sum(1 for stage in ("model", "training") for q in for_stage(stage)
                      if not q.advanced and probe.asked(q.id))
    ENTER, DOWN = "\r", "\x1b[B"
    keys = (ENTER                                   # No GPU here: CPU processes on this machine
            + ENTER * before_plan                   # model and training as given
            + DOWN * 3 + ENTER                      # Next: Measure the best candidates
            + f"{script} --steps 40" + ENTER        # the training script and its arguments
            + ENTER                                 # Use <the measured winner>
            + ENTER * 40)                           # machines and details as planned
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        code = run_plain(request, input=pipe, output=DummyOutput(), yes=True)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "Measured (predicted / measured):" in out, out[-3000:]
    rows = {line.strip(" =>").split("  ")[0]: line for line in out.splitlines() if "DeepSpeed ZeRO-" in line
            and ("measured" in line or "does not fit" in line) and " / " in line}
    assert "does not fit (measured)" in rows["DeepSpeed ZeRO-2"], rows
    assert rows["DeepSpeed ZeRO-3"].startswith("=> ") and "  measured  " in rows["DeepSpeed ZeRO-3"], rows
    assert "Winner:   DeepSpeed ZeRO-3" in out
    assert json.loads((tmp_path / "out" / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    assert list((tmp_path / "wizard-runs").glob("tune-*/01-*/probe/rank-0.jsonl"))
    # ZeRO-2 ran out of the processes' RAM: this machine's calibration now sizes it above all of it
    machines = json.loads(Path(os.environ["WIZARD_CALIBRATION_FILE"]).read_text())["machines"]
    zero2 = machines["cpu:2"]["zero2/full"]
    assert zero2["speed_ratio"] is None and zero2["memory_ratio"] > 1, zero2


async def test_tui_measure_action_shows_progress_and_makes_the_winner_the_choice(tmp_path, monkeypatch):
    """The Plan screen's `m`: the script is typed, a progress bar per candidate fills, the table shows predicted
    against measured, and Enter makes the measured winner the picked rung, which the Review screen writes."""
    import yaml
    from textual.widgets import Input, ProgressBar

    from tests.functional.test_tui_pilot import accepts_enter_now
    from wizard.frontends.tui.app import make_app
    from wizard.pipeline import Request
    monkeypatch.chdir(tmp_path)
    for k, v in {**env(), "TEXTUAL_ANIMATIONS": "none"}.items():
        monkeypatch.setenv(k, v)
    given = yaml.safe_load(Path(ANSWERS).read_text())
    app = make_app(Request(given=given, output_dir=str(tmp_path / "out")), hardware=None, preload=False)
    async with app.run_test(size=(100, 30)) as pilot:
        async def until(cond, timeout):
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, type(app.screen).__name__
                await pilot.pause(0.2)
        for _ in range(6):
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            if type(app.screen).__name__ == "PlanScreen":
                break
            # an Enter typed before the screen shows its result (the probe starts after the first paint) is
            # dropped, as a user's would be: press it once the screen takes it (a busy CI box: up to 120 s)
            await until(lambda: accepts_enter_now(app.screen), 120)
            before = app.screen
            await pilot.press("enter")
            await until(lambda: app.screen is not before, 120)
        assert type(app.screen).__name__ == "PlanScreen"
        await pilot.press("m")
        await until(lambda: type(app.screen).__name__ == "MeasureModal", 10)
        modal = app.screen
        modal.query_one(Input).value = f"{EXAMPLE} --steps 40"
        await pilot.press("enter")
        await until(lambda: modal.result is not None or (not modal.running and modal.bars), 600)
        assert modal.result is not None and modal.result.winner is not None
        bars = modal.query(ProgressBar)
        # ZeRO-2, ZeRO-3 and ZeRO-2's micro-batch variant (32 x 1)
        assert len(bars) == len(modal.result.trials) == 3 and all(b.progress == b.total == 6 for b in bars)
        # the variant trains a global batch of 64, not 8: the modal says why it does not win, as the text does
        # (it showed the table alone: a row measured faster than the winner, and no reason)
        shown = str(modal.query_one("#measure-status").content)
        assert "global batch of 64 samples, not your 8: measured, not eligible to win" in shown, shown
        winner = modal.result.winner.candidate
        await pilot.press("enter")
        await until(lambda: type(app.screen).__name__ == "PlanScreen", 10)
        assert app.state.picked == winner.rung_key and app.state.plan.choice.key == winner.rung_key
        assert app.state.plan.choice.micro_batch == winner.micro_batch       # a variant's split comes with it


def test_the_text_result_names_the_measured_script_in_the_launch_command(tmp_path):
    """The winner's files are for the script just measured: the Next line launches it, with its arguments."""
    r = wizard(tune_args(tmp_path, "--candidates", "1", "--variants", "0", "--no-calibration"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Measured (predicted / measured):" in r.stdout and "Winner:   DeepSpeed ZeRO-2" in r.stdout, r.stdout
    yaml_path = tmp_path / "out" / "default_config.yaml"
    assert f"Next: wizard launch --config-file {yaml_path} -- {EXAMPLE} --steps 40" in r.stdout, r.stdout
