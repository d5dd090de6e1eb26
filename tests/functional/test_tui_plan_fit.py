"""Issue 21, point 5: no Plan screen walks the user past a plan that does not fit.

Nothing fits: Enter neither picks a rung nor goes on, and the screen lists what would fit (more GPUs, more
host RAM, LoRA / QLoRA) in the screens' words. A rung that does not fit is never picked, and a choice that
stopped fitting holds Next. A method change re-plans the strategy: a rung picked on the old ladder is dropped.
Real planner throughout (analytic --params shapes, so no thread sizes anything).
"""

from __future__ import annotations

import pytest
from textual.widgets import Select

from tests.functional.test_tui_pilot import app_for, reach, screen_name, settle, text_of, type_into, wait_until
from wizard.frontends.tui.widgets.rung_list import RungList
from wizard.probe import hardware

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

# Full fine-tuning of 70B on two 80 GB GPUs with 256 GiB of RAM: no rung fits; QLoRA does, so do 14 GPUs
# or more host RAM (each one verified by the planner itself below).
NOTHING_FITS = dict(hw="2xA100-80GB,ram=256G", params="70B")


async def choose_method(pilot, method: str) -> None:
    """The Model screen's method select, set as a user's pick in its menu sets it (Select.Changed)."""
    pilot.app.screen.query_one("#q-method", Select).value = method
    await settle(pilot)


def status(app) -> str:
    return text_of(app.screen.query_one("#status")).strip()


async def test_nothing_fits_enter_neither_picks_nor_goes_on_and_the_screen_says_what_would_fit(tmp_path):
    app = app_for(tmp_path, hardware.assume(NOTHING_FITS["hw"]), params=NOTHING_FITS["params"])
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        assert app.state.plan.choice is None
        for _ in range(2):
            await pilot.press("enter")
            await settle(pilot)
        assert screen_name(app) == "PlanScreen"
        assert app.state.picked is None and "backend" not in app.state.entered
        assert app.state.answers["backend"] == "auto"
        assert status(app).startswith("✗ Nothing fits")
        await pilot.press("down", "enter")                          # another rung: not picked either
        await settle(pilot)
        assert app.state.picked is None and screen_name(app) == "PlanScreen"
        warning = " ".join(text_of(app.screen.query_one("#plan-warning")).split())
        assert "What would fit: with 14 GPUs" in warning
        assert "of host RAM per machine" in warning and "QLoRA r=16: fits" in warning
        assert "--" not in warning, warning                          # the screen's words, not the CLI's flags
        assert "“Fine-tuning method”" in warning
        # LoRA instead (the user switches the method): the strategy is the new ladder's own, and Enter goes on.
        await pilot.press("escape")
        await wait_until(pilot, lambda: screen_name(app) == "ModelScreen")
        await choose_method(pilot, "qlora")
        assert app.state.plan.choice is not None and app.state.plan.choice.fits
        await reach(pilot, "DetailsScreen")
        assert "backend" not in app.state.entered


def test_the_more_ram_suggestion_is_what_the_planner_makes_fit():
    """The RAM the screen offers is checked by planning again on a machine with that much RAM."""
    from wizard import pipeline
    from wizard.planning.plan import host_ram_to_fit
    from wizard.units import GiB
    hw = hardware.assume(NOTHING_FITS["hw"])
    answers = pipeline.resolve_pre_plan(hw, {"params": NOTHING_FITS["params"]})
    model = pipeline.size(answers)
    plan = pipeline.plan_from_answers(hw, model, answers)
    assert plan.choice is None
    total = host_ram_to_fit(plan, hw)
    assert total is not None and total % (16 * GiB) == 0
    bigger = hardware.assume(f"{NOTHING_FITS['hw'].split(',')[0]},ram={total // GiB}G")
    fits = pipeline.plan_from_answers(bigger, model, answers)
    assert fits.choice is not None and fits.choice.fits and fits.choice.offloads
    smaller = hardware.assume(f"{NOTHING_FITS['hw'].split(',')[0]},ram={total // GiB - 16}G")
    assert pipeline.plan_from_answers(smaller, model, answers).choice is None     # the least RAM, in 16 GiB steps


async def test_enter_on_a_rung_that_does_not_fit_does_not_pick_it(tmp_path):
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        assert app.state.plan.choice.key == "zero2"
        await pilot.press("up", "enter")                             # DDP: does not fit on 80 GB
        await settle(pilot)
        assert app.state.picked is None and app.state.plan.choice.key == "zero2"
        assert "backend" not in app.state.entered
        assert screen_name(app) == "PlanScreen" and "does not fit" in status(app)
        await pilot.press("down", "enter")                           # the marked rung: on to Details
        await wait_until(pilot, lambda: screen_name(app) == "DetailsScreen")


def micro_batch_where_zero3_stops_fitting() -> int:
    """The first micro-batch (from the planner) at which ZeRO-3 no longer fits but another rung does."""
    from wizard import pipeline
    hw = hardware.assume("8xA100-80GB")
    for mb in range(2, 129):
        answers = pipeline.resolve_pre_plan(hw, {"params": "7B", "micro_batch": mb})
        plan = pipeline.plan_from_answers(hw, pipeline.size(answers), answers)
        zero3 = next(r for r in plan.rungs if r.key == "zero3")
        if not zero3.fits and plan.choice is not None:
            return mb
    raise AssertionError("ZeRO-3 fits at every micro-batch")


async def test_a_picked_rung_that_stopped_fitting_holds_next(tmp_path):
    mb = micro_batch_where_zero3_stops_fitting()
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        await pilot.press("down", "enter")                           # ZeRO-3: fits, picked
        await settle(pilot)
        assert app.state.picked == "zero3"
        await pilot.press("escape")
        await wait_until(pilot, lambda: screen_name(app) == "ModelScreen")
        await type_into(pilot, "micro_batch", str(mb))
        await reach(pilot, "PlanScreen")
        assert app.state.plan.choice.key == "zero3" and not app.state.plan.choice.fits
        assert app.screen.query_one(RungList).highlighted_key == "zero3"
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "PlanScreen" and "does not fit" in status(app)
        assert "Next waits" in text_of(app.screen.query_one("#plan-warning"))


async def test_a_method_change_drops_a_rung_picked_on_the_old_ladder(tmp_path):
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        await pilot.press("down", "enter")                           # ZeRO-3 picked for full fine-tuning
        await settle(pilot)
        assert app.state.picked == "zero3" and app.state.entered["backend"] == "deepspeed"
        await pilot.press("escape")
        await wait_until(pilot, lambda: screen_name(app) == "ModelScreen")
        await choose_method(pilot, "lora")
        assert app.state.picked is None
        assert "backend" not in app.state.entered and "zero_stage" not in app.state.entered
        assert app.state.answers["backend"] == "auto"
        assert app.state.plan.choice.key == "ddp"                   # LoRA's own ladder: DDP fits


async def test_the_plan_screen_shows_the_longest_sequence_that_fits_near_the_limit(tmp_path):
    """Issue 30: 8B at 128k tokens on 8 x H100 plans a context-parallel rung; the Plan screen's explanation of the
    chosen rung gives the longest --seq-len that fits beside its largest micro-batch (shown within 2x of the
    limit: at 64k the plan now takes context parallel 8, far from its limit)."""
    app = app_for(tmp_path, hardware.assume("8xH100-80GB"), params="8B", hidden_size="4096", layers="32",
                  heads="32", vocab_size="128256", seq_len="131072")
    async with app.run_test(size=(100, 40)) as pilot:
        await reach(pilot, "PlanScreen")
        choice = app.state.plan.choice
        assert choice is not None and choice.cp_size > 1 and choice.max_seq_len >= 131072
        app.screen.query_one(RungList).focus()
        await settle(pilot)
        _, text = app.screen.explanation()
        assert f"longest sequence that fits: --seq-len {choice.max_seq_len}" in text
