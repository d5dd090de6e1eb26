"""SVG snapshots of every wizard screen at 80x24 and 120x40, plus light theme, a pick that does not
fit, an inline error and the two modals.

Deterministic inputs: assumed hardware (or the saved no-GPU probe in snapshots/hardware/), fixture
model configs, a fixed output directory emptied before each test, animations off, no cursor blink.
The SVGs live in snapshots/tui/test_tui_snapshots/; after an intended change run the whole module,
`python -m pytest tests/functional/test_tui_snapshots.py --snapshot-update`, and look at the report
(snapshot_report.html) before committing them. Never update with -k or a single test id: syrupy
then deletes every other SVG of the module as unused.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from pathlib import Path

import pytest
import pytest_textual_snapshot
from textual.widgets import Input

from wizard.frontends.tui.app import make_app
from wizard.pipeline import Request
from wizard.probe import hardware

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_DIR = ROOT / "snapshots" / "tui"
# Relative to ROOT (the tests chdir there): the screens show these paths, and CI clones elsewhere.
MODELS = Path("tests") / "fixtures" / "models"
NO_GPU_PROBE = Path("snapshots") / "hardware" / "no-gpu.json"
# Shown on the Review and Done screens, so it is part of the SVGs and must be the same path in every run
# (a tmp_path would change the pictures). Two runs at once (two checkouts, two CI jobs on one box) take
# turns through OUTPUT_LOCK instead of emptying each other's files.
OUTPUT_DIR = Path("/tmp/wizard-tui-snapshots/out")
OUTPUT_LOCK = Path("/tmp/wizard-tui-snapshots.lock")
SCREENS = ("HardwareScreen", "ModelScreen", "PlanScreen", "DetailsScreen", "ReviewScreen", "DoneScreen")
SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


class TuiSVG(pytest_textual_snapshot.SVGImageExtension):
    """pytest-textual-snapshot's SVG extension, storing under snapshots/tui/<module>/."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        return str(SNAPSHOT_DIR / test_location.basename)


@pytest.fixture(autouse=True)
def _deterministic(monkeypatch, tmp_path_factory):
    # snap_compare reads the extension class from the plugin module when it is set up; autouse
    # fixtures come first (the launch view's tests do the same for snapshots/launch_view/).
    monkeypatch.setattr(pytest_textual_snapshot, "SVGImageExtension", TuiSVG)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))
    # A steady cursor: the blink timer would otherwise decide what the SVG shows.
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None, raising=False)
    # The Done screen's TrainingArguments name gradient checkpointing as the installed transformers does (5.25:
    # activation_checkpointing, 5.17: gradient_checkpointing; test_tui_snippets pins that): the SVGs show 5.25's,
    # so that one suite's snapshots hold at both ends of the supported range.
    from wizard.config import script_settings
    monkeypatch.setattr(script_settings, "checkpointing_argument", lambda: "activation_checkpointing")
    with open(OUTPUT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # released when the file closes, also if the run dies
        shutil.rmtree(OUTPUT_DIR, ignore_errors=True)
        yield
        shutil.rmtree(OUTPUT_DIR, ignore_errors=True)


def a100_app(**given):
    given.setdefault("model", str(MODELS / "qwen2.5-7b"))
    return make_app(Request(given=given, output_dir=str(OUTPUT_DIR)), hardware=hardware.assume("8xA100-80GB"),
                    preload=False)


def no_gpu_app():
    hw = hardware.load_file(str(NO_GPU_PROBE))
    return make_app(Request(output_dir=str(OUTPUT_DIR)), hardware=hw, preload=False)


async def settle(pilot) -> None:
    app = pilot.app
    await app.workers.wait_for_complete()
    deadline = time.monotonic() + 90
    while type(app.screen).__name__ == "ReviewScreen" and app.screen.findings is None \
            and app.screen.validation_error is None:
        if time.monotonic() > deadline:
            raise AssertionError("validation did not finish")
        await pilot.pause(0.05)
    await app.workers.wait_for_complete()
    # Fields mounted after the hardware is known, and their first sync, take a few more cycles.
    while not getattr(app.screen, "_built", True) or app.state.plan is None and app.state.error is None:
        if time.monotonic() > deadline:
            raise AssertionError("the screen did not settle")
        await pilot.pause(0.05)
    for _ in range(3):
        await pilot.pause(0.05)
    for widget in app.screen.query(Input):
        widget.cursor_blink = False


def go_to(screen: str, then=None):
    """run_before: Enter through the screens until `screen` shows, then `then(pilot)` if given."""
    async def run_before(pilot) -> None:
        app = pilot.app
        for _ in range(len(SCREENS)):
            await settle(pilot)
            if type(app.screen).__name__ == screen:
                break
            await pilot.press("enter")
        assert type(app.screen).__name__ == screen
        if then is not None:
            await then(pilot)
        await settle(pilot)
    return run_before


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("screen", SCREENS)
def test_screen(snap_compare, screen, size):
    assert snap_compare(a100_app(), terminal_size=SIZES[size], run_before=go_to(screen))


@pytest.mark.parametrize("size", SIZES)
def test_hardware_without_gpu(snap_compare, size):
    assert snap_compare(no_gpu_app(), terminal_size=SIZES[size], run_before=go_to("HardwareScreen"))


def test_plan_without_gpu(snap_compare):
    assert snap_compare(no_gpu_app(), terminal_size=(80, 24), run_before=go_to("PlanScreen"))


def test_plan_light_theme(snap_compare):
    app = a100_app()

    async def light(pilot):
        pilot.app.theme = "textual-light"

    assert snap_compare(app, terminal_size=(80, 24), run_before=go_to("PlanScreen", light))


def test_plan_enter_on_a_rung_that_does_not_fit(snap_compare):
    """Issue 21: DDP does not fit; Enter on it says so and picks nothing (the ladder's choice stays marked)."""
    async def enter_on_ddp(pilot):
        await pilot.press("up", "enter")

    assert snap_compare(a100_app(), terminal_size=(80, 24), run_before=go_to("PlanScreen", enter_on_ddp))


def test_plan_nothing_fits(snap_compare):
    """Issue 21: nothing fits; the screen says what would (more GPUs, more host RAM, QLoRA), in its own words."""
    app = make_app(Request(given={"params": "70B"}, output_dir=str(OUTPUT_DIR)),
                   hardware=hardware.assume("2xA100-80GB,ram=256G"), preload=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=go_to("PlanScreen"))


def test_model_inline_error(snap_compare):
    async def letters(pilot):
        pilot.app.screen.query_one("#q-seq_len", Input).focus()
        await pilot.press("end", "ctrl+u", *"lots", "enter")

    assert snap_compare(a100_app(), terminal_size=(80, 24), run_before=go_to("ModelScreen", letters))


def test_explain_modal(snap_compare):
    async def explain(pilot):
        pilot.app.screen.query_one("#q-micro_batch", Input).focus()
        await pilot.press("f1")

    assert snap_compare(a100_app(), terminal_size=(80, 24), run_before=go_to("ModelScreen", explain))


def test_quit_question(snap_compare):
    async def change_then_quit(pilot):
        pilot.app.screen.query_one("#q-grad_accum", Input).focus()
        await pilot.press("end", "ctrl+u", "8", "ctrl+q")

    assert snap_compare(a100_app(), terminal_size=(80, 24), run_before=go_to("ModelScreen", change_then_quit))


def test_plan_in_a_terminal_below_80x24(snap_compare):
    """Issue 13: at 60x20 the screen says it is too small instead of laying the selects out vertically."""
    assert snap_compare(a100_app(), terminal_size=(60, 20), run_before=go_to("PlanScreen"))


def test_hardware_another_machine_with_its_ram(snap_compare):
    """Issue 13: another machine asks its GPUs, RAM, CPU cores and free disk (catalogue defaults shown)."""
    async def other_machine(pilot):
        from textual.widgets import Select
        pilot.app.screen.query_one("#q-target_machine", Select).value = "other"
        await settle(pilot)
        pilot.app.screen.query_one("#q-target_ram", Input).focus()
        await pilot.press("end", "ctrl+u", *"512G")

    assert snap_compare(a100_app(), terminal_size=(80, 24), run_before=go_to("HardwareScreen", other_machine))


def test_details_fsdp2_parallelism_config_and_fp8(snap_compare):
    """accelerate 1.16's questions on the Details screen: FSDP2's parallelism config (context parallelism 2 leaves a
    shard size of 4) and fp8 with its torchao settings, offered on H100s planned from here (either backend may be
    installed there). The machines and FSDP groups are folded so both groups show."""
    app = make_app(Request(given={"model": str(MODELS / "llama-3.1-8b"), "backend": "fsdp",
                                  "parallelism_config_cp_size": "2", "mixed_precision": "fp8"},
                           output_dir=str(OUTPUT_DIR)),
                   hardware=hardware.assume("8xH100-80GB"), preload=False)

    async def fold(pilot):
        from textual.widgets import Collapsible
        for group in ("machines", "fsdp"):
            pilot.app.screen.query_one(f"#group-{group}", Collapsible).collapsed = True
        await settle(pilot)

    assert snap_compare(app, terminal_size=(120, 40), run_before=go_to("DetailsScreen", fold))
