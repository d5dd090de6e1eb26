"""`wizard tune`'s pure parts: the winner rule and the calibration file (written, read back, stale, unreadable)."""

from __future__ import annotations

import json

import pytest

from wizard import pipeline
from wizard.planning import calibration
from wizard.tune import Candidate, Trial, pick_winner

ANSWERS = {"params": "98K", "hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 128, "seq_len": 32,
           "micro_batch": 4, "num_processes": 2, "backend": "deepspeed"}


def trial(label, order, tps, noise=0.01, status="measured", peak=100):
    return Trial(Candidate(label, label, {}, {"tokens_per_second": 1000.0}, order), status=status,
                 tokens_per_second=tps, noise=noise, peak_bytes=peak)


def test_winner_follows_the_measurement_not_the_ladder_order():
    # zero2 is first on the ladder (the prediction's choice) but measured slower: e.g. it sleeps longer per step
    trials = [trial("zero2", 0, 500.0), trial("zero3", 1, 900.0)]
    assert pick_winner(trials, None).candidate.label == "zero3"


def test_a_difference_within_the_measured_noise_goes_to_the_simpler_rung():
    trials = [trial("zero2", 0, 1000.0, noise=0.08), trial("zero3", 1, 1060.0, noise=0.02)]
    assert pick_winner(trials, None).candidate.label == "zero2"
    trials = [trial("zero2", 0, 1000.0, noise=0.01), trial("zero3", 1, 1060.0, noise=0.01)]
    assert pick_winner(trials, None).candidate.label == "zero3"


def test_inside_the_measured_tie_a_trial_that_leaves_room_wins():
    """As the plan's tie: within the noise, a simpler rung whose measured peak is within 5 % of the limit loses to
    one with room (issue 29); with room on both, the simpler rung still wins."""
    trials = [trial("zero2", 0, 1000.0, peak=98), trial("zero3", 1, 1010.0, peak=60)]
    assert pick_winner(trials, limit_bytes=100).candidate.label == "zero3"
    trials = [trial("zero2", 0, 1000.0, peak=90), trial("zero3", 1, 1010.0, peak=60)]
    assert pick_winner(trials, limit_bytes=100).candidate.label == "zero2"


def test_oom_and_headroom_exclude_a_candidate():
    trials = [trial("zero2", 0, 2000.0, status="does not fit (measured)"), trial("zero3", 1, 900.0, peak=50),
              trial("offload", 2, 1500.0, peak=500)]
    assert pick_winner(trials, limit_bytes=100).candidate.label == "zero3"
    assert pick_winner([trial("a", 0, 1.0, status="timed out")], None) is None


def _plan(calibrate=True):
    from wizard.probe.hardware import probe
    hw = probe()
    return pipeline.plan_from_answers(hw, pipeline.size(ANSWERS), pipeline.resolve_pre_plan(hw, ANSWERS),
                              calibrate=calibrate), hw


def test_calibration_written_read_back_changes_the_plan_and_says_so(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    raw, hw = _plan()
    assert not any("calibrated" in n for n in raw.notes)
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 2.0, "memory_ratio": 0.8},
                                                  {"rung": "zero3", "speed_ratio": 0.5, "memory_ratio": None}])
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 8.0, "memory_ratio": 0.8}])
    entry = json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]
    assert entry["trials"] == 2 and entry["speed_ratio"] == pytest.approx(4.0)      # geometric mean
    cal, _ = _plan()
    by_key = {r.key: r for r in cal.rungs}
    raw_by_key = {r.key: r for r in raw.rungs}
    assert by_key["zero2"].tokens_per_second == pytest.approx(raw_by_key["zero2"].tokens_per_second * 4.0)
    assert by_key["zero3"].speed.step_seconds == pytest.approx(raw_by_key["zero3"].speed.step_seconds / 0.5)
    assert any("calibrated by 3 trials on this machine on" in n for n in cal.notes), cal.notes
    off, _ = _plan(calibrate=False)
    assert {r.key: r.tokens_per_second for r in off.rungs} == {r.key: r.tokens_per_second for r in raw.rungs}


def test_stale_or_unreadable_calibration_is_ignored_with_a_note(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    raw, hw = _plan()
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 2.0}],
                       now=0.0)            # 1970: long stale
    stale, _ = _plan()
    assert {r.key: r.tokens_per_second for r in stale.rungs} == {r.key: r.tokens_per_second for r in raw.rungs}
    assert any("older than" in n for n in stale.notes)
    path.write_text("{not json")
    broken, _ = _plan()
    assert any("unreadable" in n and "ignored" in n for n in broken.notes)
    assert {r.key: r.tokens_per_second for r in broken.rungs} == {r.key: r.tokens_per_second for r in raw.rungs}


def test_an_assumed_machine_is_never_calibrated(tmp_path, monkeypatch):
    from wizard.probe.hardware import assume
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    hw = assume("2xH100-80GB")
    answers = {"params": "1B"}
    plan = pipeline.plan_from_answers(hw, pipeline.size(answers), pipeline.resolve_pre_plan(hw, answers))
    calibration.record(hw, plan.topology, "full", [{"rung": plan.choice.key, "speed_ratio": 3.0}])
    again = pipeline.plan_from_answers(hw, pipeline.size(answers), pipeline.resolve_pre_plan(hw, answers))
    assert again.choice.tokens_per_second == plan.choice.tokens_per_second


def test_candidates_are_the_choice_and_close_rungs():
    from wizard.tune import pick_candidates
    plan, _ = _plan(calibrate=False)
    cands, _ = pick_candidates(plan, 3, variants=0)
    assert [c.rung_key for c in cands] == ["zero2", "zero3"] and cands[0].overrides["zero_stage"] == "2"
    assert [c.rung_key for c in pick_candidates(plan, 1, variants=0)[0]] == ["zero2"]
    assert all(c.variant is None and (c.micro_batch, c.grad_accum) == (4, 1) for c in cands)


BAD_ENTRIES = {
    "a ratio that is no number": {"speed_ratio": "x", "memory_ratio": 2.0, "trials": 1},
    "a trial count that is no number": {"speed_ratio": 0.5, "trials": "a"},
    "a date that is no number": {"speed_ratio": 0.5, "trials": 1, "updated": "soon"},
    "a date past any calendar": {"speed_ratio": 0.5, "trials": 1, "updated": 1e300},
    "a date in the future": {"speed_ratio": 0.5, "trials": 1, "updated": "FUTURE"},
    "a negative ratio": {"speed_ratio": -1, "trials": 1},
    "not an object": [0.5],
}


@pytest.mark.parametrize("what", sorted(BAD_ENTRIES))
def test_an_unreadable_entry_is_ignored_with_a_note_and_tune_replaces_it(tmp_path, monkeypatch, what):
    # A file of the right format with one hand-edited or truncated entry: the plan used to crash (a date past
    # any calendar) or drop it silently, and tune's record() crashed after measuring every candidate.
    import time
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    raw, hw = _plan()
    entry = BAD_ENTRIES[what]
    if isinstance(entry, dict):
        entry = {"updated": time.time(), **entry}
        if entry["updated"] == "FUTURE":
            entry["updated"] = time.time() + 30 * 86400
    path.write_text(json.dumps({"format": 1, "machines": {"cpu:2": {"zero2/full": entry}}}))
    plan, _ = _plan()
    assert {r.key: r.tokens_per_second for r in plan.rungs} == {r.key: r.tokens_per_second for r in raw.rungs}
    assert any("1 unreadable entry (cpu:2 zero2/full) ignored" in n for n in plan.notes), plan.notes
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 2.0, "memory_ratio": 0.9}])
    again = json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]
    assert again["trials"] == 1 and again["speed_ratio"] == 2.0 and again["memory_ratio"] == 0.9
    fixed, _ = _plan()
    assert not any("unreadable" in n for n in fixed.notes)
    assert fixed.choice.tokens_per_second == pytest.approx(raw.choice.tokens_per_second * 2.0)


def test_a_machine_entry_that_is_no_object_is_ignored_with_a_note_and_replaced(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    raw, hw = _plan()
    path.write_text(json.dumps({"format": 1, "machines": {"cpu:2": [], "8xH100": {"zero2/full": {}}}}))
    plan, _ = _plan()
    assert any("1 unreadable entry (cpu:2) ignored" in n for n in plan.notes), plan.notes
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 2.0}])
    doc = json.loads(path.read_text())["machines"]
    assert doc["cpu:2"]["zero2/full"]["speed_ratio"] == 2.0 and doc["8xH100"] == {"zero2/full": {}}


def _probe_files(probe_dir, tokens_per_rank, steps=3):
    probe_dir.mkdir(parents=True)
    for rank in (0, 1):
        lines = [json.dumps({"step": s, "rank": rank, "warmup": s == 1, "seconds": 0.01, "micro_batches": 1,
                             "tokens": tokens_per_rank, "optimizers": ["AdamW"], "rss_peak_bytes": 300 << 20})
                 for s in range(1, steps + 1)] + [json.dumps({"done": True, "rank": rank})]
        (probe_dir / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_a_rung_that_ran_the_scripts_own_batch_says_so_and_does_not_calibrate(tmp_path, monkeypatch):
    """A script without TrainingArguments runs its own batch (here 16 per process where the row says 4): its
    measured tokens/s and peak were compared with the prediction at the plan's 4 as if the same work, and
    recorded as calibration (speed x34 for the tiny example against an own loop), skewing every later plan."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    settings = {"WIZARD_TRIAL_MICRO_BATCH": "4", "WIZARD_TRIAL_GRAD_ACCUM": "1"}
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    own = Trial(cand, status="measured")
    _probe_files(tmp_path / "own", 16 * 32)
    tune.measure(own, tmp_path / "own", 2)
    assert own.steps == 2 and own.tokens_per_step == 2 * 16 * 32
    tune._check_workload(own, settings, 2, 32)
    assert own.other_workload and own.status == "measured"
    assert "measured 1,024 tokens per optimizer step, not the 256 of its row (4 x 1 x 2 processes x 32 tokens)" \
        in own.message and "not used to calibrate" in own.message, own.message
    tune._record_calibration(base, [own])
    assert not path.exists()
    longer = Trial(cand, status="measured", training_args={"applied": True})   # the Trainer at --seq-len 64
    _probe_files(tmp_path / "longer", 4 * 64)
    tune.measure(longer, tmp_path / "longer", 2)
    tune._check_workload(longer, settings, 2, 32)
    assert longer.other_workload and "measured 512 tokens per optimizer step, not the 256" in longer.message
    assert "the script's sequences are not --seq-len 32 tokens" in longer.message, longer.message
    tune._record_calibration(base, [own, longer])
    assert not path.exists()
    same = Trial(cand, status="measured")                   # the row's batch: compared and recorded
    _probe_files(tmp_path / "same", 4 * 32)
    tune.measure(same, tmp_path / "same", 2)
    tune._check_workload(same, settings, 2, 32)
    assert not same.other_workload and same.message == ""
    tune._record_calibration(base, [own, same])
    assert json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]["trials"] == 1


def test_a_calibrated_plans_candidates_say_their_predictions_are_the_raw_models(tmp_path, monkeypatch):
    """After one tune, `wizard plan` shows ZeRO-2 at the calibrated speed while the next tune's table showed the
    raw model's under "predicted", with nothing saying the two differ on purpose."""
    from wizard.tune import pick_candidates
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(tmp_path / "calibration.json"))
    raw, hw = _plan()
    cands, notes = pick_candidates(raw, 3, variants=0)
    assert not any("raw model" in n for n in notes), notes
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 1.5}])
    cal, _ = _plan()
    cands, notes = pick_candidates(cal, 3, variants=0)
    assert cands[0].predicted["tokens_per_second"] == pytest.approx(raw.choice.tokens_per_second)
    assert cal.choice.tokens_per_second == pytest.approx(raw.choice.tokens_per_second * 1.5)
    assert any(n.startswith("Predicted figures are the raw model's") for n in notes), notes


def test_a_tune_on_some_of_the_gpus_calibrates_only_plans_for_that_many(tmp_path, monkeypatch):
    """The key counted the machine's GPUs, not the plan's processes: ratios measured with 2 of 8 H100s (less
    all-reduce, another per-GPU share) calibrated a plan for all 8."""
    from wizard.probe.hardware import probe
    monkeypatch.setenv("WIZARD_FAKE_NVML", "8xH100-80GB")
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(tmp_path / "calibration.json"))
    hw = probe()
    assert hw.source == "probe" and len(hw.gpus) == 8

    def plan(n):
        a = {"params": "1B", "num_processes": n}
        return pipeline.plan_from_answers(hw, pipeline.size(a), pipeline.resolve_pre_plan(hw, a))
    two, eight = plan(2), plan(8)
    key = two.choice.key

    def speed(p):
        return next(r.tokens_per_second for r in p.rungs if r.key == key)
    calibration.record(hw, two.topology, "full", [{"rung": key, "speed_ratio": 0.5}])
    assert speed(plan(2)) == pytest.approx(speed(two) * 0.5)
    assert speed(plan(8)) == pytest.approx(speed(eight))
    calibration.record(hw, eight.topology, "full", [{"rung": key, "speed_ratio": 0.8}])
    assert speed(plan(8)) == pytest.approx(speed(eight) * 0.8)
    assert set(json.loads((tmp_path / "calibration.json").read_text())["machines"]) == \
        {"2xNVIDIA H100 80GB HBM3", "8xNVIDIA H100 80GB HBM3"}


def test_a_calibration_file_that_cannot_be_written_is_a_note_not_a_crash(tmp_path, monkeypatch):
    """A cache that cannot be written (here the file's path is a directory; a read-only or full cache alike): tune
    crashed after measuring every candidate (exit 2), before writing the winner's files."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    path.mkdir()
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    measured = Trial(cand, status="measured", tokens_per_second=4000.0, peak_bytes=400 << 20)
    (note,) = tune._record_calibration(base, [measured])
    assert note.startswith("Calibration not recorded: ") and "Is a directory" in note, note
    assert path.is_dir() and list(path.iterdir()) == [] and list(tmp_path.iterdir()) == [path]
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(tmp_path / "ok.json"))
    (recorded,) = tune._record_calibration(base, [measured])
    assert recorded.startswith("Calibration recorded in ") and (tmp_path / "ok.json").is_file()


def test_a_rung_measured_over_the_headroom_is_recorded(tmp_path, monkeypatch):
    """A rung whose measured peak passed the headroom ("too much memory") is a full measurement: its memory
    ratio was dropped (only "measured" rows were recorded), so the next plan chose the same rung again."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    over = Trial(cand, status="too much memory", tokens_per_second=4000.0,
                 peak_bytes=3 * cand.predicted["per_gpu_bytes"])
    assert [n[:21] for n in tune._record_calibration(base, [over])] == ["Calibration recorded "]
    entry = json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]
    assert entry["memory_ratio"] == pytest.approx(3.0) and entry["trials"] == 1
    failed = Trial(cand, status="failed")
    path.unlink()
    assert tune._record_calibration(base, [failed, Trial(cand, status=tune.OOM)]) == []
    assert not path.exists()


def test_tune_says_when_its_record_replaces_an_unreadable_file(tmp_path, monkeypatch):
    """record() starts a new file over one it cannot read (earlier trials in it are gone): tune did so silently."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    path.write_text("{truncated")
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    measured = Trial(cand, status="measured", tokens_per_second=4000.0, peak_bytes=400 << 20)
    recorded, note = tune._record_calibration(base, [measured])
    assert note == (f"Calibration file {path} is unreadable (Expecting property name enclosed in double quotes: "
                    f"line 1 column 2 (char 1)); ignored. These trials' ratios replace it ({path})."), note
    assert json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]["trials"] == 1
    (recorded,) = tune._record_calibration(base, [measured])     # readable now: folded in, no unreadable note
    assert recorded.startswith("Calibration recorded in ")


def test_the_first_tune_says_it_recorded_calibration_and_for_which_model(tmp_path, monkeypatch):
    """Later tunes showed a calibration note (the plan's); the first recorded the ratios silently (issue 29)."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    measured = Trial(cand, status="measured", tokens_per_second=4000.0, peak_bytes=400 << 20)
    assert not path.exists()
    (note,) = tune._record_calibration(base, [measured])
    assert note == (f"Calibration recorded in {path}: DeepSpeed ZeRO-2 measured against the model for --params 98K "
                    "on this machine (cpu:2); later `wizard plan` and `wizard tune` runs for this machine apply these "
                    "ratios and say so (`--no-calibration` shows the raw model)."), note
    assert json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]["model"] == "--params 98K"


def test_a_rung_that_ran_out_of_memory_is_no_longer_a_fit_on_this_machine(tmp_path, monkeypatch):
    """A trial that ran out of the memory the plan sizes (here CPU processes: their RAM) needed more than all of
    it. Before, nothing was recorded and the next plan chose the same rung again; now its memory ratio is raised
    to at least capacity / predicted, never averaged below it, and the trial says so."""
    from wizard import tune
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    base = pipeline.build(pipeline.Request(given=ANSWERS, plan_only=True, calibrate=False))
    (cand,), _ = tune.pick_candidates(base.plan, 1, variants=0)
    capacity, predicted = base.plan.gpu_capacity_bytes, cand.predicted["per_gpu_bytes"]
    other = Trial(cand, status=tune.OOM, out_of="gpu")          # not the memory a CPU process plan sizes
    tune._record_calibration(base, [other])
    assert not path.exists()
    calibration.record(base.hardware, base.plan.topology, "full",
                       [{"rung": cand.rung_key, "speed_ratio": 1.0, "memory_ratio": 0.9}])   # an earlier fit
    oom = Trial(cand, status=tune.OOM, out_of="host", message="out of memory")
    assert [n[:21] for n in tune._record_calibration(base, [oom])] == ["Calibration recorded "]
    entry = json.loads(path.read_text())["machines"]["cpu:2"][f"{cand.rung_key}/full"]
    assert entry["trials"] == 2 and entry["speed_ratio"] == 1.0
    assert entry["memory_ratio"] == pytest.approx(capacity / predicted)      # the floor, not a mean with 0.9
    assert f"at least x{capacity / predicted:.2f} (the whole process's RAM)" in oom.message
    after, _ = _plan()
    rung = {r.key: r for r in after.rungs}[cand.rung_key]
    assert not rung.fits and after.choice is not None and after.choice.key != cand.rung_key
    assert any("memory x" in n for n in after.notes)


def test_which_memory_a_trial_ran_out_of():
    from wizard.tune import _out_of_memory
    assert _out_of_memory({"kind": "cuda_oom"}, "") == "gpu"
    assert _out_of_memory({}, "torch.OutOfMemoryError: CUDA out of memory") == "gpu"
    assert _out_of_memory({"kind": "oom_killed"}, "") == "host"
    assert _out_of_memory({"summary": "MemoryError on rank 0"}, "") == "host"
    assert _out_of_memory({"kind": "exception"}, "ValueError") is None


def test_an_out_of_memory_floor_is_not_averaged_away_by_a_later_lower_ratio(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(path))
    raw, hw = _plan()
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": None, "memory_ratio": None,
                                                   "memory_floor": 1.2}])
    calibration.record(hw, raw.topology, "full", [{"rung": "zero2", "speed_ratio": 1.0, "memory_ratio": 0.8}])
    entry = json.loads(path.read_text())["machines"]["cpu:2"]["zero2/full"]
    assert entry["memory_ratio"] == 1.2 and entry["memory_floor"] == 1.2 and entry["trials"] == 2
    cal, _ = _plan()
    assert any("memory x1.20 at least: it ran out of memory in a trial" in n for n in cal.notes), cal.notes


def test_a_failure_is_the_users_code_only_when_the_innermost_frame_is_theirs(tmp_path):
    """tune stops after a trial that failed in the script's own code (every candidate runs it), not after an error
    raised inside a library (another candidate's config may not meet it), nor out of memory (issue 29)."""
    from wizard import tune
    user = tmp_path / "train.py"
    lib = "/usr/lib/python3/site-packages/transformers/trainer.py"
    tail = ['[rank0]: Traceback (most recent call last):',
            f'[rank0]:   File "{user}", line 183, in main',
            '[rank0]:     trainer.train()',
            f'[rank0]:   File "{lib}", line 1591, in train',
            '[rank0]:     return inner_training_loop(',
            f'[rank0]:   File "{user}", line 169, in on_step_begin',
            '[rank0]:     raise RuntimeError("boom")',
            '[rank0]: RuntimeError: boom at step 1',
            '  2%|▎         | 1/40 [00:00<00:29,  1.33it/s]']
    cl = {"kind": "python_exception", "log_tail": tail}
    assert tune.user_code_error(cl) == "train.py:169: RuntimeError: boom at step 1"
    assert tune.user_code_error({**cl, "log_tail": tail[:5] + ["[rank0]: ValueError: bad config"]}) is None
    assert tune.user_code_error({**cl, "kind": "cuda_oom"}) is None
    worker = f'[rank0]:   File "{tune.__file__.replace("wizard/tune.py", "launch/_probe.py")}", line 9, in hook'
    assert tune.user_code_error({**cl, "log_tail": tail[:7] + [worker, "[rank0]: KeyError: 'x'"]}) is None


def test_the_table_labels_cpu_processes_memory_per_process_not_per_gpu():
    """Trials of CPU processes read "peak per GPU" (issue 29)."""
    from wizard.frontends.report import tune_rows
    from wizard.tune import TuneResult
    rows = [trial("zero2", 0, 1000.0)]
    assert tune_rows(TuneResult(rows, None, "", False, [], cpu=True))[0][3] == "peak per process"
    assert tune_rows(TuneResult(rows, None, "", False, []))[0][3] == "peak per GPU"
