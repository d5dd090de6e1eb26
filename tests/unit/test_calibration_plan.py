"""Calibration is an input of planning: `wizard tune`'s ratios change the figures the ladder fits and chooses with,
not only the figures shown after the choice (issue 20, point 4).

The machine is this one, probed (only a probed machine is calibrated): 2 CPU processes, the tiny test model, whose
raw plan chooses ZeRO-2 over ZeRO-3. Every ratio is derived from that raw plan, so no figure of the box matters.
The calibration file is the test's own (conftest points WIZARD_CALIBRATION_FILE at a temporary file).
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pytest

from wizard import pipeline
from wizard.planning import calibration
from wizard.planning.plan import make_plan, rung_by_key, what_would_fit

ANSWERS = {"params": "98K", "hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 128, "seq_len": 32,
           "micro_batch": 4, "num_processes": 2, "backend": "deepspeed"}
FLAGS = ["--params", "98K", "--hidden-size", "64", "--layers", "2", "--heads", "4", "--vocab-size", "128",
         "--seq-len", "32", "--micro-batch", "4", "--num-processes", "2", "--backend", "deepspeed"]


@pytest.fixture(scope="module")
def hw():
    from wizard.probe.hardware import probe
    return probe()


def _plan(hw, calibrate=True, answers=ANSWERS):
    return pipeline.plan_from_answers(hw, pipeline.size(answers), pipeline.resolve_pre_plan(hw, answers),
                                      calibrate=calibrate)


def _record(hw, plan, rows, method="full"):
    calibration.record(hw, plan.topology, method, rows)


def _note(plan) -> str:
    return next((n for n in plan.notes if "calibrated by" in n), "")


@pytest.fixture()
def raw(hw):
    plan = _plan(hw, calibrate=False)
    assert plan.choice.key == "zero2" and rung_by_key(plan, "zero3").fits, "the premise: ZeRO-2 chosen, ZeRO-3 fits"
    return plan


def _cli(args) -> tuple[int, str]:
    from wizard.frontends.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(args)
    return code, out.getvalue()


def test_a_measured_faster_second_rung_becomes_the_choice_and_the_note_says_so(hw, raw):
    z2, z3 = rung_by_key(raw, "zero2"), rung_by_key(raw, "zero3")
    ratio = z2.tokens_per_second / z3.tokens_per_second * 1.5       # ZeRO-3 measured 1.5x faster than ZeRO-2
    _record(hw, raw, [{"rung": "zero3", "speed_ratio": ratio, "memory_ratio": None}])
    plan = _plan(hw)
    assert plan.choice.key == "zero3"
    assert plan.choice.tokens_per_second == pytest.approx(z3.tokens_per_second * ratio)
    note = _note(plan)
    assert "Speeds calibrated by 1 trial on this machine on" in note and "`--no-calibration` shows the raw model" in note
    assert "Calibration changed the choice from DeepSpeed ZeRO-2 to DeepSpeed ZeRO-3." in note, note
    # ZeRO-2 never ran: its reason is the model's, and says that only the choice's speed is a measured one
    reason = rung_by_key(plan, "zero2").reason
    assert "as measured on this machine" not in reason, reason
    assert "(DeepSpeed ZeRO-3's speed scaled by a ratio `wizard tune` measured on 20" in reason, reason
    assert "this rung's is the model's)" in reason, reason
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["choice"]["key"] == "zero3" and doc["calibration"]["changed_choice_from"] == "zero2"
    assert doc["calibration"]["rungs"]["zero3"]["speed_ratio"] == pytest.approx(ratio)
    # the CLI: plan --json follows the calibration; --no-calibration is the raw model, without the note
    code, text = _cli(["plan", *FLAGS, "--json"])
    assert code == 0 and json.loads(text)["plan"]["choice"]["key"] == "zero3"
    code, text = _cli(["plan", *FLAGS, "--json", "--no-calibration"])
    doc = json.loads(text)["plan"]
    assert code == 0 and doc["choice"]["key"] == "zero2" and doc["calibration"] is None
    assert not any("calibrated" in n for n in doc["notes"])
    assert _plan(hw, calibrate=False).choice.key == "zero2"


def test_a_ratio_measured_on_another_model_says_which_model_and_date_it_came_from(hw, raw):
    """Only tiny-gpt2 was tuned; a plan of another model applies its ratios, and says whose they are: it called a
    ratio measured on another model, or for another rung, "as measured on this machine" (issue 29)."""
    z2, z3 = rung_by_key(raw, "zero2"), rung_by_key(raw, "zero3")
    calibration.record(hw, raw.topology, "full", [
        {"rung": "zero2", "speed_ratio": 2.0, "memory_ratio": None},
        {"rung": "zero3", "speed_ratio": 0.5, "memory_ratio": None}], model="sshleifer/tiny-gpt2")
    entry = json.loads(calibration.calibration_file().read_text())["machines"]["cpu:2"]["zero3/full"]
    assert entry["model"] == "sshleifer/tiny-gpt2"
    plan = _plan(hw)
    date = calibration.date_of(calibration.for_machine(hw, plan.topology).ratios("zero3").updated)
    reason = rung_by_key(plan, "zero3").reason
    assert "as measured on this machine" not in reason, reason
    assert f"its speed scaled by a ratio `wizard tune` measured for sshleifer/tiny-gpt2 on {date}, " \
        f"DeepSpeed ZeRO-2's by one measured for sshleifer/tiny-gpt2 on {date}" not in reason
    assert f"both speeds scaled by ratios `wizard tune` measured for sshleifer/tiny-gpt2 on {date}" in reason, reason
    note = _note(plan)
    assert "trials of sshleifer/tiny-gpt2 on this machine" in note, note
    assert "Measured on that model, not this one: applied here as they are" in note, note
    assert z2.tokens_per_second and z3.tokens_per_second


def test_the_tie_rule_sees_calibrated_speeds(hw, raw):
    """ZeRO-3 measured 1 % faster than ZeRO-2: within the 3 % tie, the earlier rung stays, and says why."""
    z2, z3 = rung_by_key(raw, "zero2"), rung_by_key(raw, "zero3")
    _record(hw, raw, [{"rung": "zero3", "speed_ratio": z2.tokens_per_second / z3.tokens_per_second * 1.01}])
    plan = _plan(hw)
    assert plan.choice.key == "zero2" and "within 3% of the fastest" in plan.choice.reason
    assert "changed the choice" not in _note(plan)


def test_a_memory_ratio_above_one_that_overflows_the_choice_moves_to_the_next_rung(hw, raw):
    z2 = rung_by_key(raw, "zero2")
    ratio = raw.usable_bytes / z2.per_gpu_bytes * 1.1
    _record(hw, raw, [{"rung": "zero2", "speed_ratio": 1.0, "memory_ratio": ratio}])
    plan = _plan(hw)
    cal = rung_by_key(plan, "zero2")
    # gradient checkpointing (auto) is tried too, and even with it the measured figure does not fit
    assert not cal.fits and cal.per_gpu_bytes > plan.usable_bytes and "even with gradient checkpointing" in cal.reason
    assert cal.per_gpu_bytes == pytest.approx(cal.uncalibrated().per_gpu_bytes * ratio, rel=1e-6)
    assert sum(cal.breakdown.values()) == cal.per_gpu_bytes       # the excess is shown (as margin)
    assert cal.max_micro_batch == 0 and cal.max_micro_batch_gc == 0   # the micro-batch search sees it too
    assert plan.choice.key == "zero3"
    note = _note(plan)
    assert note.startswith("Speeds and memory calibrated by 1 trial") and f"memory x{ratio:.2f}" in note
    assert "Calibration changed the choice from DeepSpeed ZeRO-2 to DeepSpeed ZeRO-3." in note
    assert json.loads(json.dumps(plan.to_json()))["choice"]["key"] == "zero3"


def test_a_modest_memory_ratio_raises_the_estimate_by_it_and_tune_still_predicts_with_the_raw_model(hw, raw):
    _record(hw, raw, [{"rung": "zero2", "speed_ratio": 2.0, "memory_ratio": 1.5}])
    plan = _plan(hw)
    z2, raw_z2 = rung_by_key(plan, "zero2"), rung_by_key(raw, "zero2")
    assert z2.fits and z2.gradient_checkpointing == raw_z2.gradient_checkpointing
    assert z2.per_gpu_bytes == pytest.approx(raw_z2.per_gpu_bytes * 1.5, abs=1)
    assert z2.tokens_per_second == pytest.approx(raw_z2.tokens_per_second * 2.0)
    assert z2.speed.step_seconds == pytest.approx(raw_z2.speed.step_seconds / 2.0)
    # tune compares its measurements with the raw model, never with a calibrated figure (no compounding)
    from wizard.tune import _predicted
    assert _predicted(z2) == pytest.approx(_predicted(raw_z2), abs=1)


def test_a_memory_ratio_below_one_never_lowers_the_estimate(hw, raw):
    _record(hw, raw, [{"rung": "zero2", "speed_ratio": 1.0, "memory_ratio": 0.5}])
    plan = _plan(hw)
    z2, raw_z2 = rung_by_key(plan, "zero2"), rung_by_key(raw, "zero2")
    assert z2.per_gpu_bytes == raw_z2.per_gpu_bytes and z2.max_micro_batch == raw_z2.max_micro_batch
    assert z2.breakdown == raw_z2.breakdown
    note = _note(plan)
    assert note.startswith("Speeds calibrated") and "memory x0.50 not applied" in note
    assert "never lowers the estimate" in note


def test_the_batch_split_and_what_would_fit_see_the_calibrated_memory(hw, raw):
    """--global-batch: each rung's fastest split is searched with the calibrated estimate; and a variant that
    what_would_fit proposes fits by the calibrated figures."""
    answers = {**ANSWERS, "micro_batch": None, "global_batch": 64}
    base = _plan(hw, calibrate=False, answers=answers)
    z2 = rung_by_key(base, "zero2")
    assert base.choice.key == "zero2" and base.batch.applied and base.batch.micro_batch == 32
    # a memory ratio under which micro-batch 32 no longer fits on ZeRO-2 (a smaller one still does)
    small = rung_by_key(_plan(hw, calibrate=False, answers={**ANSWERS, "micro_batch": 1}), "zero2").per_gpu_bytes
    ratio = (base.usable_bytes / z2.per_gpu_bytes + base.usable_bytes / small) / 2
    measured = calibration.Calibration(calibration.machine_key(hw, base.topology),
                                       {"zero2/full": calibration.Ratios(1.0, ratio, 1, 1e12),
                                        "zero3/full": calibration.Ratios(1.0, ratio, 1, 1e12)})
    from wizard.config import answers as answers_mod
    resolved = pipeline.resolve_pre_plan(hw, answers)
    training, strategy = answers_mod.training_options(resolved), answers_mod.strategy_options(resolved)
    topology = answers_mod.topology(resolved, hw)
    model = pipeline.size(answers)
    plan = make_plan(hw, model, training, strategy, topology, calibration=measured)
    assert plan.choice is not None and plan.batch.micro_batch < 32
    assert plan.choice.per_gpu_bytes <= plan.usable_bytes
    assert plan.choice.micro_batch == plan.batch.micro_batch
    # what_would_fit at the given micro-batch 32 (which does not fit calibrated): its variants are verified
    # with the calibration, so each one fits by the measured figures
    given = replace(training, micro_batch=32, grad_accum=1, global_batch=None, split="given")
    assert make_plan(hw, model, given, strategy, topology, calibration=measured).choice is None
    assert make_plan(hw, model, given, strategy, topology).choice is not None
    fixes = what_would_fit(hw, model, given, strategy, topology, calibration=measured)
    assert fixes
    for fix in fixes:
        again = make_plan(hw, model, fix.training, fix.strategy, fix.topology, calibration=measured)
        assert again.choice is not None and again.choice.fits, fix.text


def test_a_calibration_for_another_machine_is_not_applied(hw, raw):
    from wizard.config import answers as answers_mod
    resolved = pipeline.resolve_pre_plan(hw, ANSWERS)
    other = calibration.Calibration("cpu:64", {"zero3/full": calibration.Ratios(100.0, None, 1, 1e12)})
    plan = make_plan(hw, pipeline.size(ANSWERS), answers_mod.training_options(resolved),
                     answers_mod.strategy_options(resolved), answers_mod.topology(resolved, hw), calibration=other)
    assert plan.choice.key == "zero2" and all(r.calibration is None for r in plan.rungs)


def test_the_lora_and_qlora_alternatives_are_calibrated_with_the_plan_and_raw_without(monkeypatch):
    """A probed GPU machine (the fake NVML) where full fine-tuning of 2B does not fit one RTX 4090: the plan names
    LoRA and QLoRA, planned with this machine's LoRA / QLoRA ratios, and with none under --no-calibration."""
    from wizard.probe.nvml_api import FAKE_ENV
    monkeypatch.setenv(FAKE_ENV, "1xRTX4090,idle")
    given = {"params": "2B", "seq_len": 512}

    def build(calibrate):
        return pipeline.build(pipeline.Request(given=dict(given), plan_only=True, calibrate=calibrate))

    raw = build(False)
    assert raw.hardware.source == "probe" and raw.plan.choice is None
    lora, qlora = raw.plan.alternatives
    assert (lora.method, lora.choice.key, qlora.method, qlora.choice.key) == ("lora", "single", "qlora", "single")
    calibration.record(raw.hardware, raw.plan.topology, "lora", [{"rung": "single", "speed_ratio": 2.0}])
    too_big = raw.plan.usable_bytes / qlora.choice.per_gpu_bytes * 2
    calibration.record(raw.hardware, raw.plan.topology, "qlora",
                       [{"rung": "single", "speed_ratio": 1.0, "memory_ratio": too_big}])
    cal = build(True)
    lora_cal, qlora_cal = cal.plan.alternatives
    assert lora_cal.choice.tokens_per_second == pytest.approx(lora.choice.tokens_per_second * 2.0)
    # QLoRA's one-GPU rung, measured bigger than the GPU, is no longer its choice (the next rung, or none)
    assert qlora_cal.choice is None or qlora_cal.choice.key != "single"
    again = build(False)
    assert [a.text for a in again.plan.alternatives] == [lora.text, qlora.text]


def test_when_the_measured_memory_leaves_nothing_fitting_the_exit_3_message_says_so(hw, raw):
    ratio = raw.usable_bytes / rung_by_key(raw, "zero2").per_gpu_bytes * 1.1
    _record(hw, raw, [{"rung": k, "speed_ratio": 1.0, "memory_ratio": ratio} for k in ("zero2", "zero3")])
    plan = _plan(hw)
    assert plan.choice is None and plan.calibrated_from == "zero2"
    assert "Calibration changed the choice from DeepSpeed ZeRO-2 to none (nothing fits)." in _note(plan)
    from wizard.frontends.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["plan", *FLAGS])
    assert code == 3
    assert "The raw model would choose DeepSpeed ZeRO-2: the memory `wizard tune` measured" in err.getvalue()
    assert _cli(["plan", *FLAGS, "--no-calibration"])[0] == 0


def test_the_omp_threads_note_gives_step_times_that_can_be_read():
    """It said "takes ≈0s per step instead of ≈0s" for a 125M model (a planned duration's format, whole seconds,
    for step times well under one)."""
    from wizard.probe.hardware import assume
    hw = assume("2xA100-80GB")
    answers = {"params": "125M", "backend": "deepspeed", "zero_stage": "3", "offload": "cpu"}
    plan = pipeline.plan_from_answers(hw, pipeline.size(answers), pipeline.resolve_pre_plan(hw, answers))
    note = next(n for n in plan.notes if n.startswith("CPU offload: the host optimizer step"))
    import re
    after, before = (float(x) for x in re.search(r"≈([\d.e+-]+) s per optimizer step instead of ≈([\d.e+-]+) s",
                                                  note).groups())
    assert 0 < after < before, note
