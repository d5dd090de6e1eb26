"""Issue 29, the TUI as a new user meets it: the ladder after Measure's winner on CPU processes, Measure for an
assumed machine, the Measure results' wording, where the batch and training-length fields are, the Plan status
line at 80x24, LoRA in the Plan header and the exit text naming the measured script.

(The Measure modal with real trials, at 80x24 and 120x40, is in test_tmux.py.)
"""

from __future__ import annotations

import re

import pytest
from textual.widgets import Collapsible, Label

from tests.functional.test_tui_pilot import ROOT, a100s, app_for, field, reach, settle, text_of, type_into
from wizard.frontends.tui.screens.measure import candidate_cells, in_screen_words, visible_columns
from wizard.frontends.tui.widgets.rung_list import RungList
from wizard.probe import hardware
from wizard.tune import Candidate

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

NO_GPU = str(ROOT / "snapshots" / "hardware" / "no-gpu.json")
LLAMA_8B = str(ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b")


def rows_of(app) -> list:
    rungs = app.screen.query_one(RungList)
    return [rungs.get_option_at_index(i) for i in range(rungs.option_count)]


async def test_measures_winner_on_cpu_processes_keeps_the_ladder_the_cli_offers(tmp_path):
    """Measure's winner on 2 CPU processes: no DDP rung appears, none is called "The ladder's choice" but the
    plan's own, and every rung shown can be picked without emptying the ladder."""
    app = app_for(tmp_path, hardware.load_file(NO_GPU), params="125M")
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        plan_screen = app.screen
        before = [o.id for o in rows_of(app)]
        chosen = app.state.plan.choice.key
        assert "ddp" not in before
        other = next(k for k in before if k != chosen)
        # what the Plan screen does with the Measure modal's winner (PlanScreen.action_measure's callback)
        app.state.use_measured(Candidate(label=other, rung_key=other, overrides={}, predicted={}, order=1))
        plan_screen.sync()
        await settle(pilot)
        shown = rows_of(app)
        assert [o.id for o in shown] == before
        marked = [o.id for o in shown if o.prompt.ladder_choice]
        assert marked == [chosen], marked
        for key in before:                      # Enter on each rung: the ladder stays, the backend agrees
            app.state.pick_rung(key)
            app.refresh_state()
            await settle(pilot)
            assert app.state.error is None and [o.id for o in rows_of(app)] == before
            assert field(app, "backend").control.value == app.state.answers["backend"] == "deepspeed"


async def test_measure_is_not_offered_for_an_assumed_machine(tmp_path):
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        assert app.screen.check_action("measure", ()) is False
        assert "Measure" not in [k.description for k in app.screen.query("FooterKey")]
        await pilot.press("m")
        await settle(pilot)
        assert type(app.screen).__name__ == "PlanScreen"
        await pilot.press("f1")
        await settle(pilot)
        body = text_of(app.screen.query_one("#explain-body"))
        assert "Measure (m) is not offered" in body and "assumed machine (8xA100-80GB)" in body
        assert "--assume" not in body


async def test_measure_is_in_the_key_hints_on_this_machine_and_its_script_field_has_a_label(tmp_path):
    app = app_for(tmp_path, hardware.probe(), params="125M")
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        assert "Measure" in [k.description for k in app.screen.query("FooterKey")]
        await pilot.press("m")
        await settle(pilot)
        assert type(app.screen).__name__ == "MeasureModal"
        labels = [str(label.content) for label in app.screen.query(Label)]
        assert "Training script and its arguments" in labels


def test_the_measure_notes_name_no_tune_flags_and_say_what_to_do_here():
    """The texts wizard.tune writes for a variant that trains another global batch, as the TUI says them."""
    message = ("trains a global batch of 64 samples, not your 8: measured, not eligible to win "
               "(--allow-global-batch-change lets it)")
    note = ("DeepSpeed ZeRO-2 (micro-batch 32) measured 2.1x the winner's tokens/s, with a global batch of 64 "
            "instead of 8: to train that batch, tune again with --allow-global-batch-change, or plan with "
            "--global-batch 64.")
    for text in (message, note):
        said = in_screen_words(text)
        assert not re.search(r"--[a-z]", said), said
    assert in_screen_words(message).endswith("measured, not eligible to win (Measure keeps your global batch)")
    assert "set “Global batch” to 64 on the Model screen (Escape) and measure again" in in_screen_words(note)


def test_a_clause_naming_any_other_tune_flag_is_left_out():
    note = ("The largest micro-batch that fits (12470 without gradient checkpointing) is tried at 32 (8x the plan's "
            "on CPU processes; --max-micro-batch changes it).")
    assert in_screen_words(note) == ("The largest micro-batch that fits (12470 without gradient checkpointing) is "
                                     "tried at 32 (8x the plan's on CPU processes).")
    assert in_screen_words("Stopped early. Raise --budget to measure the rest.") == "Stopped early."


def test_the_result_table_keeps_the_columns_that_fit():
    # candidate, micro-batch x accum, result, peak, step time, tokens/s, MFU as wide as a CPU tune's table
    widths = [38, 19, 8, 29, 19, 23, 14]
    assert visible_columns(widths, 68) == [0, 2, 5]                # 80 columns: candidate, result, tokens/s
    assert visible_columns(widths, 112) == [0, 2, 3, 5]            # 120 columns: and the peak memory
    assert visible_columns(widths, 300) == list(range(7))
    # CI's tmux run at 120 columns: the peak fitted to the cell, so step time had no room; a cell wider, the other way
    measured = [47, 13, 8, 25, 13, 24, 11]
    assert visible_columns(measured, 112) == [0, 2, 3, 5]
    assert visible_columns([47, 13, 8, 26, 13, 24, 11], 112) == [0, 2, 4, 5]
    # a long candidate name is cut to what result and tokens/s leave of 80 columns (its whole name is under the table)
    assert candidate_cells(widths, [0, 2, 5], 74) == 74 - (8 + 2) - (23 + 2) - 2


async def test_global_batch_and_tokens_to_train_are_on_the_form_not_under_advanced(tmp_path):
    app = app_for(tmp_path, a100s(), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        advanced = app.screen.query_one("#advanced", Collapsible)
        for qid in ("global_batch", "train_tokens"):
            f = field(app, qid)
            assert f.display and advanced not in f.ancestors, qid
        assert "hidden_size" in [f.qid for f in advanced.query("QuestionField")]


async def test_the_plan_status_line_is_not_cut_at_80x24(tmp_path):
    app = app_for(tmp_path, a100s(), model=LLAMA_8B, train_tokens="1e9", micro_batch=8)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        await settle(pilot)
        status = app.screen.query_one("#status")
        shown = text_of(status).rstrip()
        assert "…" not in shown and len(shown) <= status.size.width, (shown, status.size.width)
        assert re.search(r"\d+[hm]", shown) and "≈" in shown, shown     # its speed and time to train


async def test_the_plan_header_says_lora(tmp_path):
    app = app_for(tmp_path, a100s(), model=LLAMA_8B, method="lora")
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        assert "LoRA r=16" in text_of(app.screen.query_one("#plan-summary"))
    app = app_for(tmp_path, a100s(), model=LLAMA_8B, method="qlora")
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        assert "QLoRA r=16 (4-bit base)" in text_of(app.screen.query_one("#plan-summary"))


async def test_the_exit_text_and_done_screen_name_the_script_given_in_measure(tmp_path):
    from tests.functional.test_tui_pilot import wait_until
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "PlanScreen")
        app.state.script = ["my_train.py", "--epochs", "1"]     # what MeasureModal._finish records
        await reach(pilot, "DoneScreen")
        assert "my_train.py --epochs 1" in text_of(app.screen.query_one("#done-commands"))
        assert app.screen.query_one("#launch-script").value == "my_train.py"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.return_value is not None)
    summary = "\n".join(app.return_value.summary)
    assert "-- my_train.py --epochs 1" in summary and "your_train.py" not in summary


def measured(label: str, key: str, variant: str | None = None):
    """A trial as wizard.tune returns it (figures of a 2-process CPU trial of the example model)."""
    from wizard.tune import Trial
    c = Candidate(label=label, rung_key=key, overrides={}, order=1, micro_batch=32 if variant else 4, grad_accum=1,
                  gradient_checkpointing=False, variant=variant,
                  predicted={"per_gpu_bytes": 540_000_000, "step_seconds": 0.03, "tokens_per_second": 8640,
                             "mfu": 0.051})
    return Trial(candidate=c, status="measured", step_seconds=0.156, tokens_per_second=1270,
                 peak_bytes=468_000_000, peak_kind="rss", mfu=0.007)


async def test_the_result_table_follows_the_terminals_width(tmp_path):
    """The columns are chosen again when the terminal is resized (120x40 -> 80x24 -> 120x40), and ↑↓ shows the
    highlighted row's other figures under the table."""
    from textual.widgets import DataTable

    from wizard.frontends.tui.screens.measure import MeasureModal
    from wizard.tune import TuneResult
    app = app_for(tmp_path, hardware.load_file(NO_GPU), params="125M")
    async with app.run_test(size=(120, 40)) as pilot:
        await reach(pilot, "PlanScreen")
        modal = MeasureModal(app.state)
        app.push_screen(modal)
        await settle(pilot)
        trials = [measured("DeepSpeed ZeRO-2", "zero2"), measured("DeepSpeed ZeRO-3", "zero3"),
                  measured("DeepSpeed ZeRO-2, micro-batch 32 x 1, GC off", "zero2", variant="largest")]
        modal.command = ["train.py", "--steps", "40"]
        modal._done(TuneResult(trials=trials, winner=trials[0], run_dir=str(tmp_path), partial=False, notes=[],
                               cpu=True), None)
        await settle(pilot)
        table = modal.query_one(DataTable)

        def columns() -> list[str]:
            return [str(c.label) for c in table.columns.values()]

        assert columns() == ["candidate", "result", "step time", "tokens/s"]
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        await pilot.pause(0.2)
        assert columns() == ["candidate", "result", "tokens/s"]
        await pilot.press("down")
        detail = text_of(modal.query_one("#measure-detail"))
        assert detail.startswith("DeepSpeed ZeRO-3 (predicted / measured):") and "step time 30 ms / 156 ms" in detail
        await pilot.resize_terminal(120, 40)
        await settle(pilot)
        await pilot.pause(0.2)
        assert columns() == ["candidate", "result", "step time", "tokens/s"]
        await pilot.press("enter")                       # Enter uses the winner
        await settle(pilot)
        assert type(app.screen).__name__ == "PlanScreen" and app.state.script == ["train.py", "--steps", "40"]
