"""`wizard tune`'s micro-batch variants: which are tried (no --batch-flag needed), their predicted figures (the
plan at the variant's split), the environment that makes the probe apply them, and the winner's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.tune import (NOT_APPLICABLE, Candidate, Trial, TuneOptions, TuneResult, _note_batch_changing_variants,
                         applies, ds_config_disagrees, pick_candidates, pick_winner, trial_settings,
                         variant_predicted, variant_request)

EXAMPLE_ANSWERS = Path(__file__).resolve().parents[2] / "examples" / "train.answers.yaml"
# A 1B model on one assumed A100-40GB: without gradient checkpointing micro-batch 2 fits, with it 5.
GPU = {"params": "1B", "seq_len": 2048}


def _gpu(tmp_path, **given):
    req = pipeline.Request(given={**GPU, **given}, assume="1xA100-40GB", output_dir=str(tmp_path / "out"),
                           calibrate=False)
    return req, pipeline.build(req)


def test_variants_are_tried_without_batch_flag_the_gc_one_included(tmp_path):
    _, base = _gpu(tmp_path, micro_batch=1, grad_accum=8)
    choice = base.plan.choice
    assert (choice.max_micro_batch, choice.max_micro_batch_gc) == (2, 5)       # what the cases below rely on
    cands, notes = pick_candidates(base.plan, 3)
    rung, *variants = cands
    assert rung.variant is None and (rung.micro_batch, rung.grad_accum, rung.gradient_checkpointing) == (1, 8, False)
    got = [(v.variant, v.micro_batch, v.grad_accum, v.gradient_checkpointing) for v in variants]
    # the largest without GC keeps the global batch (2 x 4 = 1 x 8) and is also the plan's fastest split: once
    assert got == [("largest micro-batch", 2, 4, False),
                   ("largest micro-batch with gradient checkpointing", 5, 2, True)], got
    assert variants[1].overrides == {**rung.overrides, "micro_batch": 5, "grad_accum": 2,
                                     "gradient_checkpointing": "on"}
    assert variants[1].label == f"{choice.name}, micro-batch 5 x 2, GC on" and variants[1].batch_text == "5 x 2, GC on"
    assert not any("--batch-flag" in n for n in notes), notes


def test_variants_equal_to_the_base_split_are_dropped_and_bounded_by_variants(tmp_path):
    _, base = _gpu(tmp_path, micro_batch=2, grad_accum=4)
    cands, _ = pick_candidates(base.plan, 1)
    # largest without GC (2 x 4) and the fastest split (2 x 4) are the base itself: only the GC variant is left
    assert [(c.micro_batch, c.grad_accum, c.gradient_checkpointing, c.variant is not None) for c in cands] == \
        [(2, 4, False, False), (5, 2, True, True)]
    _, base = _gpu(tmp_path, micro_batch=1, grad_accum=8)
    cands, notes = pick_candidates(base.plan, 1, variants=1)
    assert [c.micro_batch for c in cands] == [1, 2] and any("at most --variants 1" in n for n in notes), notes
    assert [c.variant for c in pick_candidates(base.plan, 1, variants=0)[0]] == [None]


def test_the_fastest_split_of_the_global_batch_is_a_variant(tmp_path):
    """--global-batch with the split left to the plan: the choice runs its fastest split; a given split that
    differs from the plan's fastest is the base and the fastest one a variant."""
    _, base = _gpu(tmp_path, micro_batch=1, global_batch=8)
    split = base.plan.batch
    cands, _ = pick_candidates(base.plan, 1, max_micro_batch=1)
    assert (split.micro_batch, split.grad_accum) != (1, 8)
    assert [(c.variant, c.micro_batch, c.grad_accum) for c in cands][-1] == \
        ("fastest split of the global batch", split.micro_batch, split.grad_accum)


def test_cpu_variants_are_capped_and_say_so():
    import yaml
    given = yaml.safe_load(EXAMPLE_ANSWERS.read_text())
    base = pipeline.build(pipeline.Request(given=given, plan_only=True, calibrate=False))
    assert base.plan.topology.cpu and base.plan.choice.max_micro_batch > 1000
    cands, notes = pick_candidates(base.plan, 1)
    assert [(c.micro_batch, c.grad_accum, c.gradient_checkpointing) for c in cands] == [(4, 1, False), (32, 1, False)]
    assert any("is tried at 32" in n and "--max-micro-batch" in n for n in notes), notes
    cands, _ = pick_candidates(base.plan, 1, max_micro_batch=8)
    assert [c.micro_batch for c in cands] == [4, 8]


def test_a_variant_is_predicted_by_the_plan_at_its_split(tmp_path):
    req, base = _gpu(tmp_path, micro_batch=1, grad_accum=8)
    _, gc_variant = pick_candidates(base.plan, 1)[0][1:]
    predicted = variant_predicted(req, gc_variant, base.hardware)
    assert {"micro_batch": 5, "grad_accum": 2, "gradient_checkpointing": "on"}.items() <= gc_variant.overrides.items()
    again = pipeline.build(pipeline.Request(given={**GPU, **gc_variant.overrides}, assume="1xA100-40GB",
                                            calibrate=False, plan_only=True))
    assert again.plan.choice.gradient_checkpointing and again.plan.choice.micro_batch == 5
    assert predicted["per_gpu_bytes"] == again.plan.choice.per_gpu_bytes
    assert predicted["tokens_per_second"] == pytest.approx(again.plan.choice.tokens_per_second)
    assert predicted["per_gpu_bytes"] != base.plan.choice.per_gpu_bytes          # not the base rung's figures
    assert predicted["step_seconds"] != base.plan.choice.speed.step_seconds


def test_the_winners_files_snippet_and_the_trials_settings_agree(tmp_path):
    from wizard.config.script_settings import checkpointing_argument
    from wizard.frontends.snippets import training_arguments
    req, base = _gpu(tmp_path, micro_batch=1, grad_accum=8, backend="deepspeed", zero_stage="2")
    _, gc_variant = pick_candidates(base.plan, 1)[0][1:]
    mb, accum = gc_variant.micro_batch, gc_variant.grad_accum
    assert gc_variant.gradient_checkpointing and mb > 1
    final = pipeline.build(variant_request(req, gc_variant))
    assert final.plan.choice.key == "zero2" and final.plan.choice.gradient_checkpointing
    assert (final.answers["micro_batch"], final.answers["grad_accum"]) == (mb, accum)
    ds = json.loads(final.ds_text)
    assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["gradient_accumulation_steps"] == "auto"
    snippet = training_arguments(final.answers, final.plan, final.ds_path)
    assert snippet["per_device_train_batch_size"] == mb and snippet["gradient_accumulation_steps"] == accum
    assert snippet[checkpointing_argument()] is True
    settings = trial_settings(final)
    assert settings == {"WIZARD_TRIAL_MICRO_BATCH": str(mb), "WIZARD_TRIAL_GRAD_ACCUM": str(accum),
                        "WIZARD_TRIAL_GC": "1"}
    assert ds_config_disagrees(final.ds_text, settings) is None


def test_an_own_loop_config_gives_numbers_that_must_match_the_trial():
    settings = {"WIZARD_TRIAL_MICRO_BATCH": "5", "WIZARD_TRIAL_GRAD_ACCUM": "2", "WIZARD_TRIAL_GC": "0"}
    assert ds_config_disagrees(json.dumps({"train_micro_batch_size_per_gpu": "auto",
                                           "gradient_accumulation_steps": 2}), settings) is None
    assert "gradient_accumulation_steps=4" in ds_config_disagrees(json.dumps({"gradient_accumulation_steps": 4}),
                                                                  settings)


def test_fsdp_gc_stays_in_its_config_not_in_training_arguments(tmp_path):
    req = pipeline.Request(given={**GPU, "micro_batch": 1, "backend": "fsdp", "num_processes": 2,
                                  "gradient_checkpointing": "on"}, assume="2xA100-40GB", calibrate=False,
                           output_dir=str(tmp_path / "out"))
    result = pipeline.build(req)
    assert result.plan.choice.backend == "fsdp" and result.plan.choice.gradient_checkpointing
    assert trial_settings(result)["WIZARD_TRIAL_GC"] == "0"


def _trial(variant, flag_only=False, training_args=None):
    c = Candidate("x", "zero2", {}, {}, 0, micro_batch=8, grad_accum=1, gradient_checkpointing=False,
                  variant=variant, flag_only=flag_only)
    return Trial(c, training_args=training_args)


def test_a_variant_applies_only_where_the_script_takes_it():
    opts, flag = TuneOptions("s.py", []), TuneOptions("s.py", [], batch_flag="--batch-size")
    assert applies(_trial(None), opts, False)                                 # a rung: the script's own split
    assert applies(_trial("largest micro-batch"), opts, None)                 # not known yet: run it
    assert applies(_trial("largest micro-batch", training_args={"applied": True}), opts, True)
    assert not applies(_trial("largest micro-batch"), opts, False)
    assert applies(_trial("largest micro-batch", flag_only=True), flag, False)
    assert not applies(_trial("largest micro-batch with gradient checkpointing"), flag, False)
    assert NOT_APPLICABLE.startswith("not applicable: the script does not use the Trainer's TrainingArguments")


def test_the_wizard_takes_a_measured_variant_with_its_split():
    """The TUI's and --plain's Measure: a variant that wins becomes the choice with its micro-batch, accumulation
    and gradient checkpointing (what the Review screen then writes), not only its rung."""
    import yaml

    from wizard.frontends.session import TARGET_CPU, WizardState
    given = yaml.safe_load(EXAMPLE_ANSWERS.read_text())
    state = WizardState(pipeline.Request(given=given, calibrate=False))
    state.set_probed(state.load_hardware())
    state.set_target(TARGET_CPU)
    state.replan()
    cands, _ = pick_candidates(state.plan, 3)
    variant = cands[-1]
    assert variant.variant and variant.micro_batch == 32
    state.use_measured(variant)
    assert state.picked == variant.rung_key and state.plan.choice.key == variant.rung_key
    assert (state.answers["micro_batch"], state.answers["grad_accum"]) == (32, 1)
    assert state.plan.choice.micro_batch == 32 and not state.plan.choice.gradient_checkpointing
    assert state.result().answers["micro_batch"] == 32


def test_only_variants_that_change_the_global_batch_are_marked(tmp_path):
    _, base = _gpu(tmp_path, micro_batch=1, grad_accum=8)
    keeps, changes = pick_candidates(base.plan, 1)[0][1:]
    assert (keeps.micro_batch * keeps.grad_accum, keeps.global_batch_from) == (8, None)        # 2 x 4
    assert (changes.micro_batch * changes.grad_accum, changes.global_batch_from) == (10, 8)     # 5 x 2


def _measured(label, order, tps, global_batch_from=None, micro_batch=4):
    c = Candidate(label, "zero2", {}, {}, order, micro_batch=micro_batch, grad_accum=1, gradient_checkpointing=False,
                  variant=None if global_batch_from is None else "largest micro-batch",
                  global_batch_from=global_batch_from)
    return Trial(c, status="measured", tokens_per_second=tps, noise=0.01)


def test_a_variant_that_changes_the_global_batch_wins_only_when_allowed():
    """A faster variant with another global batch changes the training, not only its speed: it is measured and
    shown, and the user's batch wins unless --allow-global-batch-change; the note says what it would give."""
    rung = _measured("ZeRO-2", 0, 1000.0)
    bigger = _measured("ZeRO-2, micro-batch 32 x 1", 0, 7000.0, global_batch_from=4, micro_batch=32)
    trials = [rung, bigger]
    assert pick_winner(trials, None) is rung
    assert pick_winner(trials, None, allow_batch_change=True) is bigger
    out = TuneResult(trials, rung, "/runs/x", False, [])
    _note_batch_changing_variants(out, 2, allowed=False)
    assert "global batch of 64 samples, not your 8" in bigger.message and not rung.message
    assert any("7.0x the winner's" in n and "--allow-global-batch-change" in n and "--global-batch 64" in n
               for n in out.notes), out.notes
    allowed = TuneResult(trials, bigger, "/runs/x", False, [])
    bigger.message = ""
    _note_batch_changing_variants(allowed, 2, allowed=True)
    assert not allowed.notes and not bigger.message


def test_the_cap_note_names_only_the_capped_variants_that_are_tried():
    """The CPU cap's note said the largest micro-batch with gradient checkpointing "is tried at 32" when no GC
    variant is tried (at the same micro-batch it is only slower), and under --variants 0 it said "is tried"
    next to "is not tried: at most --variants 0"."""
    import yaml
    given = yaml.safe_load(EXAMPLE_ANSWERS.read_text())
    base = pipeline.build(pipeline.Request(given=given, plan_only=True, calibrate=False))
    choice = base.plan.choice
    cands, notes = pick_candidates(base.plan, 1)
    assert [c.gradient_checkpointing for c in cands if c.variant] == [False]
    cap_notes = [n for n in notes if "is tried at 32" in n]
    assert cap_notes == [f"The largest micro-batch that fits ({choice.max_micro_batch} without gradient "
                         "checkpointing) is tried at 32 (8x the plan's on CPU processes; --max-micro-batch "
                         "changes it)."], notes
    cands, notes = pick_candidates(base.plan, 1, variants=0)
    assert [c.variant for c in cands] == [None] and notes == [], notes


def test_the_next_line_is_a_shell_command_for_a_config_dir_with_a_space(tmp_path):
    """`Next: wizard launch --config-file DIR WITH SPACE/default_config.yaml -- 'my train.py'` quoted the script
    but not the config's path: pasted into a shell it passed `DIR` as the config."""
    import io
    import shlex

    from wizard.frontends import report
    req = pipeline.Request(given={**GPU, "micro_batch": 1}, assume="1xA100-40GB", calibrate=False,
                           output_dir=str(tmp_path / "my configs"))
    result = pipeline.build(req)
    pipeline.validate(result)
    pipeline.write(result, req.given)
    out = io.StringIO()
    report.print_written(result, dry_run=False, file=out, script=["my train.py", "--steps", "4"])
    line = next(x for x in out.getvalue().splitlines() if x.startswith("Next: "))
    assert shlex.split(line[len("Next: "):]) == ["wizard", "launch", "--config-file", result.yaml_path, "--",
                                                  "my train.py", "--steps", "4"], line


def test_a_winner_whose_split_the_trial_set_says_what_the_script_must_set():
    """The winner's config leaves the batch to the script ("auto"), and its trial ran the split the probe set in
    the script's TrainingArguments: the result said only `Next: wizard launch ... -- train.py`, which trains the
    script's own 4 x 1, not the 32 x 1 measured (nothing said so). With --batch-flag the Next line now passes it."""
    from wizard.tune import _note_script_split
    won = _measured("ZeRO-2, micro-batch 32 x 1", 0, 7000.0, global_batch_from=4, micro_batch=32)
    won.training_args = {"applied": True,
                         "own": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                                 "gradient_checkpointing": None},
                         "set": {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
                                 "gradient_checkpointing": False}}
    out = TuneResult([won], won, "/runs/x", False, [])
    _note_script_split(out, TuneOptions("train.py", ["--steps", "40"]))
    assert out.notes == ["Your script's TrainingArguments ask for per_device_train_batch_size=4; the winner ran "
                         "per_device_train_batch_size=32 (the trial set it): set it in your TrainingArguments "
                         "(the config leaves them to it), or `wizard launch` with these files trains your script's "
                         "own micro-batch."], out.notes
    assert out.script_args is None
    won.training_args["own"]["per_device_train_batch_size"] = 32          # the script asks for what won: no note
    same = TuneResult([won], won, "/runs/x", False, [])
    _note_script_split(same, TuneOptions("train.py", []))
    assert same.notes == []
    won.training_args = None                                             # an own loop given --batch-flag
    flag = TuneResult([won], won, "/runs/x", False, [])
    _note_script_split(flag, TuneOptions("own.py", ["--lr", "1"], batch_flag="--batch-size"))
    assert flag.script_args == ["--lr", "1", "--batch-size", "32"] and flag.to_json()["script_args"] == flag.script_args


def test_the_wizards_measure_keeps_its_dry_run_so_the_trials_record_no_calibration(tmp_path):
    """`wizard --plain --dry-run` (or the TUI) → Measure: the request given to tune dropped --dry-run, so the
    trials wrote the calibration file that `wizard tune --dry-run` leaves alone (tune records only when the
    request is not a dry run)."""
    import yaml

    from wizard.frontends.session import WizardState
    given = yaml.safe_load(EXAMPLE_ANSWERS.read_text())
    for dry in (True, False):
        state = WizardState(pipeline.Request(given=given, dry_run=dry, calibrate=True, output_dir=str(tmp_path)))
        req = state.measure_request()
        assert (req.dry_run, req.calibrate, req.output_dir, req.given) == (dry, True, str(tmp_path), state.given())


def test_a_candidate_whose_preparation_fails_ends_its_progress_row(tmp_path, monkeypatch):
    """The TUI draws a bar per candidate from the start/end events: a candidate that fails before running
    (here the plan does not select its rung with its answers) still ends, with its reason, and nothing ran."""
    import yaml

    from wizard import tune as tune_mod
    given = yaml.safe_load(EXAMPLE_ANSWERS.read_text())
    request = pipeline.Request(given=given, output_dir=str(tmp_path / "out"), calibrate=False, dry_run=True)
    bogus = Candidate("ZeRO-3 with ZeRO-2's answers", "zero3", {"backend": "deepspeed", "zero_stage": "2"}, {}, 0,
                      micro_batch=4, grad_accum=1, gradient_checkpointing=False)
    monkeypatch.setattr(tune_mod, "pick_candidates", lambda *a, **k: ([bogus], []))
    events: list[dict] = []
    out = tune_mod.tune(request, TuneOptions(str(Path(__file__)), [], runs_root=str(tmp_path / "runs"),
                                             calibrate=False), progress=events.append, write=False)
    kinds = [(e["event"], e.get("index")) for e in events]
    assert ("start", 0) in kinds and ("end", 0) in kinds, kinds
    (end,) = [e for e in events if e["event"] == "end"]
    assert end["trial"]["status"] == "failed" and "does not select this rung" in end["trial"]["message"]
    assert out.winner is None and out.trials[0].run_dir is None
