"""The TUI's Compare screen (issue 32), reached from the Plan screen with `c`: snapshots at 80x24 and 120x40 (the
table, the time and cost chart at typed prices), and choosing a row plans for that machine.

Its own module (so its SVGs live in snapshots/tui/test_tui_compare/ and `--snapshot-update` here touches only
them), with test_tui_snapshots' deterministic set-up: the same fixtures, app and settling.
"""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input

from tests.functional.test_tui_snapshots import SIZES, _deterministic, a100_app, go_to, settle  # noqa: F401
from wizard import compare as compare_mod

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

PRICES = "H100-80GB=2.5,8xA100-80GB=1.8,B200-180GB=4.5,H200-141GB=3.2"


async def open_compare(pilot) -> None:
    await pilot.press("c")
    await settle(pilot)
    assert type(pilot.app.screen).__name__ == "CompareScreen"


async def open_compare_with_prices(pilot) -> None:
    await open_compare(pilot)
    screen = pilot.app.screen
    screen.query_one("#compare-prices", Input).focus()
    await pilot.press(*PRICES, "enter")
    await settle(pilot)
    assert screen.comparison is not None and screen.comparison.cheapest is not None


@pytest.mark.parametrize("size", SIZES)
def test_compare_screen(snap_compare, size):
    assert snap_compare(a100_app(), terminal_size=SIZES[size], run_before=go_to("PlanScreen", open_compare_with_prices))


async def test_choosing_a_row_plans_for_that_machine():
    app = a100_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await go_to("PlanScreen", open_compare)(pilot)
        screen = app.screen
        table = screen.query_one(DataTable)
        rows = screen.comparison.rows
        assert len(rows) == len(compare_mod.default_machines()) == table.row_count
        # the row of 2 x 8 B200s: two machines of 8
        target = next(i for i, r in enumerate(rows) if r.machine.label == "2x8xB200-180GB")
        table.move_cursor(row=target)
        await pilot.press("enter")
        await settle(pilot)
        assert type(app.screen).__name__ == "PlanScreen"
        state = app.state
        assert state.hardware.source == "assume:8xB200-180GB"
        # two machines are planned at once (as `wizard plan` plans them without an address); the files need the
        # main machine's address, which the Details screen asks
        assert state.plan is not None and state.plan.topology.num_machines == 2
        assert "main-process-ip" in str(state.files_problem())
        app.answer("main_process_ip", "10.0.0.1")
        await settle(pilot)
        assert state.files_problem() is None
        assert state.plan.topology.world_size == 16
        assert state.plan.choice is not None and state.plan.choice.key == rows[target].rung_key
        # and back to one machine with another row
        await open_compare(pilot)
        screen = app.screen
        one = next(i for i, r in enumerate(screen.comparison.rows) if r.machine.label == "4xH100-80GB")
        screen.query_one(DataTable).move_cursor(row=one)
        await pilot.press("enter")
        await settle(pilot)
        assert app.state.hardware.source == "assume:4xH100-80GB"
        assert app.state.plan.topology.num_machines == 1 and app.state.plan.topology.world_size == 4


async def test_escape_leaves_the_plan_as_it_was():
    app = a100_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await go_to("PlanScreen")(pilot)
        before = (app.state.hardware.source, app.state.plan.choice.key)
        await open_compare(pilot)
        app.screen.query_one("#compare-prices", Input).focus()
        await pilot.press(*"H100=abc", "enter")
        await settle(pilot)
        status = str(app.screen.query_one("#compare-status").render())
        assert "price" in status and "abc" in status
        app.screen.query_one(DataTable).focus()
        await pilot.press("escape")
        await settle(pilot)
        assert type(app.screen).__name__ == "PlanScreen"
        assert (app.state.hardware.source, app.state.plan.choice.key) == before
