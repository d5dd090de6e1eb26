"""Issue 21, point 6: the wizard's forms as a keyboard user meets them.

Rung names keep their "+GC" (test_tui_widgets.py); no screen quotes a command-line flag; an empty field's grey
text is a hint, not a value; Enter on a select goes on (space opens it); the first Tab lands on the first field;
the focused field stands out after the downgrade to 256 colours.
"""

from __future__ import annotations

import math
import re

import pytest
from rich.color import Color, ColorSystem
from textual.widgets import Input, Select

from tests.functional.test_tui_pilot import ROOT, app_for, reach, screen_name, settle, text_of, wait_until
from wizard.frontends.tui.widgets.question_field import QuestionField
from wizard.frontends.tui.widgets.rung_list import RungList
from wizard.probe import hardware

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

NO_GPU = str(ROOT / "snapshots" / "hardware" / "no-gpu.json")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


def focused_id(app) -> str | None:
    return app.focused.id if app.focused is not None else None


async def test_enter_on_the_gpu_model_select_goes_on_and_space_opens_it(tmp_path):
    app = app_for(tmp_path, hardware.load_file(NO_GPU), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        target = app.screen.query_one("#q-target_machine", Select)
        target.focus()
        await pilot.press("space", "down", "enter")         # another machine from the catalogue
        await settle(pilot)
        assert app.state.target == "other" and not target.expanded
        gpu = app.screen.query_one("#q-target_gpu", Select)
        gpu.focus()
        await pilot.press("space")
        await settle(pilot)
        assert gpu.expanded                                  # space opens the list
        await pilot.press("down", "enter")                   # the next GPU in the catalogue
        await settle(pilot)
        assert not gpu.expanded and app.state.other_gpu != "H100-80GB"
        assert app.focused is gpu
        await pilot.press("enter")                           # Enter on the select: Next, as in every field
        await wait_until(pilot, lambda: screen_name(app) == "ModelScreen")


async def test_the_first_tab_lands_on_the_first_field(tmp_path):
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert focused_id(app) == "next"                     # Enter plans for this machine
        await pilot.press("tab")
        assert focused_id(app) == "q-target_machine"
        await reach(pilot, "DetailsScreen")
        fields = [f.control for f in app.screen.query(QuestionField) if f.display and f.control.focusable]
        assert app.focused is fields[0]                      # the first field, where Tab would have led
        await pilot.press("tab")
        assert app.focused is fields[1]
        await pilot.press("escape")                          # back to Plan, then Details again: Next has it
        await settle(pilot)
        await reach(pilot, "DetailsScreen")


async def test_empty_fields_show_a_hint_that_cannot_be_read_as_a_value(tmp_path):
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        for name in ("ModelScreen", "PlanScreen", "DetailsScreen"):
            await reach(pilot, name)
            inputs = [f.control for f in app.screen.query(QuestionField) if isinstance(f.control, Input)]
            empty = [i for i in inputs if not i.value]
            assert empty or name == "ModelScreen"
            for control in inputs:
                hint = str(control.placeholder)
                assert hint.startswith("(") and hint.endswith(")"), (control.id, hint)
        details = {f.qid: str(f.control.placeholder) for f in app.screen.query(QuestionField)
                   if isinstance(f.control, Input)}
        assert details["deepspeed_moe_layer_cls_names"] != "CLASS[,CLASS]"


def rgb_256(color) -> tuple[int, int, int]:
    downgraded = Color.parse(color.hex6).downgrade(ColorSystem.EIGHT_BIT)
    return tuple(downgraded.get_truecolor())


@pytest.mark.parametrize("theme", ["textual-dark", "textual-light"])
async def test_the_focused_field_stands_out_in_256_colours(tmp_path, theme):
    app = app_for(tmp_path, hardware.assume("8xA100-80GB"), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = theme
        await reach(pilot, "ModelScreen")
        for focused, other in (("#q-seq_len", "#q-micro_batch"), ("#q-method", "#q-optimizer")):
            app.screen.query_one(focused).focus()
            await settle(pilot)

            def background(selector):
                widget = app.screen.query_one(selector)
                if isinstance(widget, Select):
                    widget = widget.query_one("SelectCurrent")
                return rgb_256(widget.background_colors[1])

            assert math.dist(background(focused), background(other)) >= 60, (theme, focused)
            labels = {f.qid: f for f in app.screen.query(QuestionField)}
            assert labels[focused[3:]].has_class("-focused") and not labels[other[3:]].has_class("-focused")


async def test_no_screen_quotes_a_command_line_flag(tmp_path):
    # No NVMe path: the NVMe rung's reason names --nvme-path; a parameter count is named "--params 7B".
    app = app_for(tmp_path, hardware.assume("8xA100-80GB,ram=256G"), params="70B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        assert not FLAG.search(text_of(app.screen.query_one("#model-summary")))
        assert not FLAG.search(text_of(app.screen.query_one("#plan-line")))
        app.screen.query_one("#q-params").focus()            # its help: "Only needed when no --model is given."
        await settle(pilot)
        assert "Parameter count" in text_of(app.screen.query_one("#help"))
        assert not FLAG.search(text_of(app.screen.query_one("#help")))
        await reach(pilot, "PlanScreen")
        rows = app.screen.query_one(RungList)._options
        assert any("NVMe offload directory" in row.prompt.why().plain for row in rows)
        for row in rows:
            assert not FLAG.search(row.prompt.why().plain), row.prompt.why().plain
        assert not FLAG.search(text_of(app.screen.query_one("#plan-warning")))


async def test_nothing_fits_names_the_machines_ram_as_the_screen_does(tmp_path):
    """The planner's verified RAM cure reads "--assume ...,ram=NG" on the command line; on the Plan screen it
    names the field that sets it, and it is said once."""
    app = app_for(tmp_path, hardware.assume("2xA100-80GB,ram=256G"), params="70B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        warning = text_of(app.screen.query_one("#plan-warning"))
        assert "Nothing fits" in warning
        assert not FLAG.search(warning) and "--assume" not in warning, warning
        assert "“RAM in that machine” = " in warning
        assert len(re.findall(r"With [\d.]+ [GT]iB of (?:host )?RAM", warning)) == 1, warning
