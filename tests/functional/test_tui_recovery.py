"""No dead end in the Textual wizard, driven by Pilot (helpers of test_tui_pilot.py): every value a screen demands can
be typed on a screen, no state traps the user, and the status line says a problem whole.

Issue 36, item 4: several machines.

Typing 2 into "Machines (nodes)" on the Details screen put 1 back, said "main-process-ip: a value is required",
hid the Precision section and showed no address field anywhere; back on the Plan screen the ladder was empty,
"Nothing fits", Next refused: only Ctrl+Q left. Planning needs no address (as `wizard plan`): two machines are
planned at once, the Details screen shows the address, rank and port fields and asks for the address before the
files, and an answer only the Details screen asks never leaves the user on a Plan screen that cannot go on.
"""

from __future__ import annotations

import pytest
import yaml
from textual.widgets import Static

from tests.functional.test_tui_pilot import (  # noqa: F401 - _isolated: the same HF_HOME / cache isolation
    _isolated,
    a100s,
    app_for,
    field,
    reach,
    screen_name,
    settle,
    text_of,
    type_into,
    wait_until,
)

pytestmark = pytest.mark.ui       # the screens: the oldest-libraries leg skips them (.ci/run)


async def _tab_after(pilot, qid: str, text: str) -> None:
    await type_into(pilot, qid, text)
    await pilot.press("tab")
    await settle(pilot)


def _status(app) -> str:
    return text_of(app.screen.query_one("#status", Static))


async def test_two_machines_typed_on_details_are_planned_and_their_address_asked_there(tmp_path):
    app = app_for(tmp_path, hw=a100s(), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DetailsScreen")
        await _tab_after(pilot, "num_machines", "2")
        assert field(app, "num_machines").control.value == "2"
        assert app.state.plan.topology.num_machines == 2 and app.state.plan.choice is not None
        for qid in ("main_process_ip", "machine_rank", "main_process_port", "mixed_precision"):
            assert field(app, qid).display, qid                  # every value the files need can be typed here
        assert "required" not in _status(app)                    # not an error before the user had a chance
        # Back to the plan: the ladder for 16 GPUs, and Next goes on again
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "PlanScreen" and app.state.plan.choice is not None
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "DetailsScreen")
        # Next without the address: asked on its field, here
        app.screen.action_next()
        await settle(pilot)
        assert screen_name(app) == "DetailsScreen"
        ip = field(app, "main_process_ip")
        assert "a value is required when num_machines > 1" in (ip.error or "") and app.focused is ip.control
        await _tab_after(pilot, "main_process_ip", "10.0.0.1")
        await reach(pilot, "DoneScreen")
    written = yaml.safe_load((tmp_path / "out" / "default_config.yaml").read_text())
    assert (written["num_machines"], written["main_process_ip"], written["num_processes"]) == (2, "10.0.0.1", 16)


async def test_an_answer_of_the_details_screen_that_does_not_plan_is_fixed_there_not_a_dead_end(tmp_path):
    """16 processes over 2 machines, then 3 machines: the processes no longer divide and there is no plan. The Plan
    screen says why and that Next goes to Details (Enter too, on its empty ladder), where the field shows it."""
    app = app_for(tmp_path, hw=a100s(), params="7B", num_machines=2, num_processes=16)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DetailsScreen")
        await _tab_after(pilot, "num_machines", "3")
        assert app.state.plan is None and app.state.error_field == "num_processes"
        assert field(app, "num_machines").control.value == "3"        # what was typed, not the last plan's 2
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "PlanScreen"
        assert "Nothing fits" not in _status(app) and "fix it on Details" in _status(app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "DetailsScreen")
        assert "do not divide evenly over 3 machines" in (field(app, "num_processes").error or "")
        await _tab_after(pilot, "num_processes", "24")
        assert app.state.plan is not None and app.state.plan.topology.world_size == 24
        await _tab_after(pilot, "main_process_ip", "10.0.0.1")
        assert app.state.files_problem() is None


async def test_the_status_line_says_a_problem_whole_at_80x24(tmp_path):
    """Issue 36, item 11: at 80x24 the Model screen's status line showed "✗ model: models/nope is not in the local
    Hugging Face cache…", cut mid-sentence. It says a complete part that fits, or points at the message under the
    field, which has the whole of it."""
    app = app_for(tmp_path, hw=a100s(), params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "model", str(tmp_path / "no-such-model-directory-anywhere"))
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        status = _status(app).strip()
        width = app.screen.query_one("#status", Static).size.width
        assert status.startswith("✗ ") and len(status) <= width and not status.endswith("…"), status
        assert "does not exist" in (field(app, "model").error or "")        # the whole message, under the field
        await type_into(pilot, "model", "")                                   # back to the parameter count
        await type_into(pilot, "micro_batch", "abc")
        await pilot.press("enter")
        await settle(pilot)
        assert _status(app).strip() == "✗ micro-batch: 'abc' is not a whole number"
