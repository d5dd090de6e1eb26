"""Issue 29: a field keeps what is typed into it, at any typing speed, and is normalised when the focus leaves.

Each field that normalises its text (counts, whole numbers, fractions, sizes, free text) is typed into twice:
slowly (every key's re-plan has come back before the next key, as at one key every 1.2 s) and in a burst
(every key is queued before the first one's re-plan is shown, as a fast typist or tmux's send-keys does).
After every key the field must hold exactly what was typed so far; only when the focus leaves (Tab) does it
show the normal form ("1.5e9" -> "1.5B"). Before the fix the re-plan of each key wrote the resolved value back
into the field under the cursor: "1.5e9" typed slowly became "2B", "2e10" became "200", and a burst of
BSpace 7 BSpace 8 after "16" left "16".
"""

from __future__ import annotations

import pytest
from textual import events
from textual.widgets import Collapsible, Select

from tests.functional.test_tui_pilot import a100s, app_for, field, reach, settle
from wizard.probe import hardware

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

BSPACE = "backspace"
SLOW_PAUSE_S = 0.3     # long enough for the key's re-plan (well under 50 ms) and the screen's sync to be shown


def key_event(key: str) -> events.Key:
    return events.Key(key, None if len(key) > 1 else key)


async def clear(pilot, qid: str) -> None:
    control = field(pilot.app, qid).control
    control.focus()
    await pilot.press("end", "ctrl+u")
    await settle(pilot)


async def type_slowly(pilot, qid: str, keys: list[str]) -> list[str]:
    """One key at a time, each key's re-plan and sync done before the next: the text after every key."""
    seen = []
    for key in keys:
        await pilot.press(key)
        await settle(pilot)
        await pilot.pause(SLOW_PAUSE_S)
        seen.append(field(pilot.app, qid).control.value)
    return seen


async def type_in_a_burst(pilot, keys: list[str]) -> None:
    """Every key queued at once (Pilot's press would wait for each to be handled): the re-plans of the first keys
    reach the screen while the later keys are being typed."""
    driver = pilot.app._driver
    for key in keys:
        event = key_event(key)
        event.set_sender(pilot.app)
        driver.send_message(event)
    await settle(pilot)
    await pilot.pause(SLOW_PAUSE_S)
    await settle(pilot)


def prefixes(text: str) -> list[str]:
    return [text[:i] for i in range(1, len(text) + 1)]


# (screen, qid, typed, shown once the focus left, the state's value): every text field kind that normalises.
FIELDS = [
    ("ModelScreen", "train_tokens", "1.5e9", "1.5B", 1_500_000_000),
    ("ModelScreen", "train_tokens", "2e10", "20B", 20_000_000_000),
    ("ModelScreen", "params", "1.5e9", "1.5B", None),
    ("ModelScreen", "micro_batch", "16", "16", 16),
    ("ModelScreen", "grad_accum", "04", "4", 4),
    ("ModelScreen", "global_batch", "0128", "128", 128),
    ("ModelScreen", "seq_len", "4096", "4096", 4096),
    ("ModelScreen", "dataset_tokens", "2.5e9", "2.5B", 2_500_000_000),
    ("ModelScreen", "hidden_size", "05120", "5120", 5120),
    ("HardwareScreen", "target_ram", "0.5TiB", "512GiB", 512 * 2**30),
    ("HardwareScreen", "target_count", "04", "4", 4),
]


async def open_field(pilot, screen: str, qid: str) -> None:
    app = pilot.app
    if screen == "HardwareScreen":
        await settle(pilot)
        app.screen.query_one("#q-target_machine", Select).focus()
        await pilot.press("space", "down", "enter")        # another machine from the catalogue
        await settle(pilot)
    else:
        await reach(pilot, screen)
        for box in app.screen.query(Collapsible):
            box.collapsed = False                           # shape overrides, dataset size: opened
        await settle(pilot)
    assert field(app, qid).display, qid
    await clear(pilot, qid)


def app_for_field(tmp_path, screen: str):
    if screen == "HardwareScreen":
        from tests.functional.test_tui_pilot import ROOT
        return app_for(tmp_path, hardware.load_file(str(ROOT / "snapshots" / "hardware" / "no-gpu.json")),
                       params="7B")
    return app_for(tmp_path, a100s(), params="7B")


def entered(app, qid: str):
    """What the state holds for the field: the answer, or for another machine's fields its spec."""
    if qid == "target_ram":
        return app.state.hardware.ram_total
    if qid == "target_count":
        return app.state.other_count
    return app.state.entered.get(qid)


@pytest.mark.parametrize("screen,qid,typed,normal,value", FIELDS, ids=[f"{f[1]}={f[2]}" for f in FIELDS])
async def test_typed_slowly_a_field_keeps_every_key_and_is_normalised_when_the_focus_leaves(
        tmp_path, screen, qid, typed, normal, value):
    app = app_for_field(tmp_path, screen)
    async with app.run_test(size=(100, 40)) as pilot:
        await open_field(pilot, screen, qid)
        seen = await type_slowly(pilot, qid, list(typed))
        assert seen == prefixes(typed)
        await pilot.press("tab")
        await settle(pilot)
        assert field(app, qid).control.value == normal
        if value is not None:
            assert entered(app, qid) == value


@pytest.mark.parametrize("screen,qid,typed,normal,value", FIELDS, ids=[f"{f[1]}={f[2]}" for f in FIELDS])
async def test_typed_in_a_burst_a_field_keeps_every_key_and_is_normalised_when_the_focus_leaves(
        tmp_path, screen, qid, typed, normal, value):
    app = app_for_field(tmp_path, screen)
    async with app.run_test(size=(100, 40)) as pilot:
        await open_field(pilot, screen, qid)
        await type_in_a_burst(pilot, list(typed))
        assert field(app, qid).control.value == typed
        await type_in_a_burst(pilot, ["tab"])
        assert field(app, qid).control.value == normal
        if value is not None:
            assert entered(app, qid) == value


@pytest.mark.parametrize("speed", ["slow", "burst"])
async def test_micro_batch_16_then_bspace_7_bspace_8_is_18(tmp_path, speed):
    app = app_for(tmp_path, a100s(), params="7B")
    async with app.run_test(size=(100, 40)) as pilot:
        await open_field(pilot, "ModelScreen", "micro_batch")
        await type_slowly(pilot, "micro_batch", ["1", "6"])
        keys = [BSPACE, "7", BSPACE, "8"]
        if speed == "slow":
            assert await type_slowly(pilot, "micro_batch", keys) == ["1", "17", "1", "18"]
        else:
            await type_in_a_burst(pilot, keys)
        assert field(app, "micro_batch").control.value == "18"
        await pilot.press("tab")
        await settle(pilot)
        assert field(app, "micro_batch").control.value == "18" and entered(app, "micro_batch") == 18
        assert app.state.answers["micro_batch"] == 18


async def test_enter_normalises_the_field_it_is_pressed_in(tmp_path):
    """Enter (Next) normalises too: the field shows what the plan goes on with as the next screen opens."""
    app = app_for(tmp_path, a100s(), params="7B")
    async with app.run_test(size=(100, 40)) as pilot:
        await open_field(pilot, "ModelScreen", "train_tokens")
        await type_in_a_burst(pilot, list("1.5e9"))
        model_screen = app.screen
        await pilot.press("enter")
        await settle(pilot)
        assert model_screen.query_one("#field-train_tokens").control.value == "1.5B"
