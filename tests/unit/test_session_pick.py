"""Issue 29: a picked rung (the Plan screen's Enter, or Measure's winner) keeps the ladder the plan walked.

After a pick the screen still shows every rung of the ladder, walked with the strategy from before the pick. That
strategy must be resolved as the plan resolved it: on 2 CPU processes `backend: auto` is routed to DeepSpeed
(pipeline.route_cpu_processes), so DDP is never on that ladder. Walking it with the raw `auto` put DDP back, marked
it "The ladder's choice", and picking it emptied the ladder ("ddp cannot run 2 CPU processes").
"""

from __future__ import annotations

from pathlib import Path

from wizard import pipeline
from wizard.frontends.session import TARGET_CPU, WizardState
from wizard.probe import hardware
from wizard.tune import Candidate

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = str(ROOT / "snapshots" / "hardware" / "no-gpu.json")


def cpu_state(**given) -> WizardState:
    state = WizardState(pipeline.Request(given={"params": "125M", **given}, calibrate=False, output_dir="/tmp/unused"),
                        hardware.load_file(NO_GPU))
    state.set_target(TARGET_CPU)            # 2 CPU processes, the no-GPU default
    state.replan()
    return state


def test_the_ladder_after_a_pick_is_the_ladder_before_it_on_cpu_processes():
    state = cpu_state()
    before = [r.key for r in state.plan.rungs]
    chosen = state.plan.choice.key
    assert "ddp" not in before and state.answers["backend"] == "deepspeed"
    other = next(k for k in before if k != chosen)
    state.pick_rung(other)
    assert state.error is None and state.plan.choice.key == other
    assert [r.key for r in state.plan.rungs] == before
    assert state.ladder_choice == chosen


def test_measures_winner_on_cpu_processes_leaves_no_ddp_rung_to_pick():
    """Measure's winner is picked like a rung (WizardState.use_measured); the ladder's choice is the plan's own."""
    state = cpu_state()
    chosen = state.plan.choice.key
    other = next(r.key for r in state.plan.rungs if r.key != chosen)
    state.use_measured(Candidate(label=other, rung_key=other, overrides={}, predicted={}, order=1))
    assert all(r.backend != "ddp" for r in state.plan.rungs)
    assert state.ladder_choice == chosen
    for rung in state.plan.rungs:                    # every rung shown can be picked and plans
        state.pick_rung(rung.key)
        assert state.error is None and state.plan is not None and state.plan.choice.key == rung.key
        assert state.answers["backend"] == "deepspeed"


def test_without_a_pick_the_ladder_choice_is_the_plans_choice():
    state = cpu_state()
    assert state.ladder_choice == state.plan.choice.key
