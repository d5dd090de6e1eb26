"""The Textual wizard driven by Pilot, through the same factory `wizard` uses (make_app).

Real components throughout: assumed hardware from the catalogue (or this machine's real probe),
fixture model configs sized by transformers on the meta device, the real planner, emitter,
validation by accelerate/DeepSpeed/transformers and atomic writes into a temporary directory.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml
from textual.widgets import Input, Select

from wizard import pipeline
from wizard.errors import EXIT_INTERRUPTED
from wizard.frontends.tui.app import make_app
from wizard.frontends.tui.widgets.question_field import QuestionField
from wizard.frontends.tui.widgets.rung_list import RungList
from wizard.pipeline import Request
from wizard.probe import hardware

pytestmark = [pytest.mark.timeout(180), pytest.mark.ui]

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
QWEN_7B = str(MODELS / "qwen2.5-7b")
LLAMA_8B = str(MODELS / "llama-3.1-8b")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path_factory):
    # The Hub cache and accelerate's config dir of the test, never the user's; the sizing cache is
    # shared by the session so that only the first sizing of a fixture imports transformers.
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")


def a100s() -> hardware.Hardware:
    return hardware.assume("8xA100-80GB")


def app_for(tmp_path: Path, hw=None, **given):
    request = Request(given=given, output_dir=str(tmp_path / "out"))
    return make_app(request, hardware=hw, preload=False)


def screen_name(app) -> str:
    return type(app.screen).__name__


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def wait_until(pilot, condition, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out on {screen_name(pilot.app)}")
        await pilot.pause(0.05)


def accepts_enter_now(screen) -> bool:
    """Whether an Enter typed now answers the screen (it has shown its result): the app drops one typed earlier,
    as it would a user's, so a test pressing it too soon would wait for a screen change that never comes."""
    accepts = getattr(screen, "accepts_enter_typed_at", None)
    return accepts is None or accepts(time.monotonic())


async def reach(pilot, name: str) -> None:
    """Press Enter until the screen `name` is shown (every recommendation accepted)."""
    for _ in range(8):
        await settle(pilot)
        if screen_name(pilot.app) == name:
            return
        await wait_until(pilot, lambda: accepts_enter_now(pilot.app.screen), timeout=120)   # the probe, sizing
        before = pilot.app.screen
        await pilot.press("enter")
        await wait_until(pilot, lambda: pilot.app.screen is not before or pilot.app.return_value is not None,
                         timeout=60 if name in ("ReviewScreen", "DoneScreen") else 20)
    raise AssertionError(f"never reached {name}")


async def enter_through(pilot) -> None:
    await reach(pilot, "DoneScreen")
    await pilot.press("enter")
    await wait_until(pilot, lambda: pilot.app.return_value is not None)


async def type_into(pilot, qid: str, text: str) -> None:
    """Replace the text of a question's Input as a user would: focus, clear, type."""
    field = pilot.app.screen.query_one(f"#field-{qid}", QuestionField)
    field.control.focus()
    await pilot.press("end", "ctrl+u")          # Input: delete everything left of the cursor
    if text:
        await pilot.press(*list(text))
    await settle(pilot)


def text_of(widget) -> str:
    """The text a Static shows (rich renderables included), as plain text."""
    import io

    from rich.console import Console
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


def field(app, qid: str) -> QuestionField:
    return app.screen.query_one(f"#field-{qid}", QuestionField)


def assert_files_valid(out: Path, expect_ds: bool, state) -> dict:
    """Validate the files on disk again (not the wizard's scratch copies) for the wizard's plan."""
    from wizard.check.doctor import check_planned
    yaml_path = out / "default_config.yaml"
    doc = yaml.safe_load(yaml_path.read_text())
    ds_path = out / "ds_config.json"
    assert ds_path.exists() == expect_ds
    findings = check_planned(str(yaml_path), str(ds_path) if expect_ds else None, answers=state.full_answers,
                             plan=state.plan, model=state.model, port_in_use=lambda port: False)
    assert [f for f in findings if f.severity == "error"] == []
    assert (out / "wizard_plan.json").exists()
    return doc


# ---------------------------------------------------------------- Enter through every screen

async def test_enter_through_writes_validated_files_for_8_a100(tmp_path):
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(80, 24)) as pilot:
        await enter_through(pilot)
    outcome = app.return_value
    assert outcome.code == 0 and outcome.launch is None
    doc = assert_files_valid(tmp_path / "out", expect_ds=True, state=app.state)
    assert doc["distributed_type"] == "DEEPSPEED" and doc["num_processes"] == 8
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2       # the plan's choice for an 8B model on 8 x 80 GB
    assert doc["deepspeed_config"]["deepspeed_config_file"] == str(tmp_path / "out" / "ds_config.json")
    assert any("wizard launch --config-file" in line for line in outcome.summary)


async def test_enter_through_on_this_machines_real_probe(tmp_path):
    probed = hardware.probe()
    if probed.gpus:
        pytest.skip("this machine has GPUs; the no-GPU default is what is tested here")
    app = app_for(tmp_path)               # no hardware given: the app probes in a thread
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: "No NVIDIA GPU here" in text_of(app.screen.query_one("#hw-headline")))
        await enter_through(pilot)
    assert app.return_value.code == 0
    # The no-GPU default (DESIGN: 2 CPU processes, a 125M model), planned by the non-interactive pipeline
    # on the same probe: the TUI must write what `wizard --use-cpu --num-processes 2 --params 125M` writes.
    expected = pipeline.build(Request(given={"params": "125M", "use_cpu": True, "num_processes": 2},
                                      output_dir=str(tmp_path / "cli")), hw=probed)
    doc = assert_files_valid(tmp_path / "out", expect_ds=expected.ds_text is not None, state=app.state)
    assert doc == yaml.safe_load(expected.yaml_text.replace(str(tmp_path / "cli"), str(tmp_path / "out")))
    # Two CPU processes without mpirun only train together through DeepSpeed (pipeline.route_cpu_processes).
    assert doc["distributed_type"] == "DEEPSPEED" and doc["num_processes"] == 2


async def test_enter_typed_before_the_probe_is_shown_does_not_skip_the_hardware_screen(tmp_path, monkeypatch):
    from wizard.frontends.session import WizardState
    probe_may_finish = threading.Event()
    real_load = WizardState.load_hardware

    def load_when_allowed(self):            # the real probe, held until the test has typed
        probe_may_finish.wait(30)
        return real_load(self)

    monkeypatch.setattr(WizardState, "load_hardware", load_when_allowed)
    app = app_for(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("enter", "enter")  # typed while the probe runs
        probe_may_finish.set()
        await settle(pilot)
        assert screen_name(app) == "HardwareScreen"
        assert app.state.probed is not None
        await pilot.press("enter")          # typed after the probe's result was shown
        await wait_until(pilot, lambda: screen_name(app) == "ModelScreen")


async def test_enters_typed_ahead_on_the_plan_screen_stop_at_the_next_screen(tmp_path):
    """Four Enters typed at once on the Plan screen: the first goes on, the others were typed before the
    Details screen was shown and are dropped; nothing is written."""
    from textual import events
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        typed = [events.Key("enter", "\r") for _ in range(4)]    # their time: now, all four
        for key in typed:
            app.post_message(key)
            await pilot.pause(0.3)
        await settle(pilot)
        assert screen_name(app) == "DetailsScreen"
        # the three others reached the shown Details screen and were dropped there, and it said so
        assert app.screen.shown_at is not None
        assert "Enter typed before this screen was shown: ignored" in text_of(app.screen.query_one("#status"))
        assert not (tmp_path / "out").exists()
        typed = [events.Key("enter", "\r") for _ in range(4)]    # after Details was shown
        for key in typed:
            app.post_message(key)
        await wait_until(pilot, lambda: screen_name(app) == "ReviewScreen")
        await settle(pilot)
        await pilot.pause(1.0)
        assert screen_name(app) == "ReviewScreen"       # the other three were typed before Review was shown
        assert not (tmp_path / "out" / "default_config.yaml").exists()
        await pilot.press("enter")          # seen, validated: Write
        await wait_until(pilot, lambda: screen_name(app) == "DoneScreen")
        assert (tmp_path / "out" / "default_config.yaml").exists()


async def test_an_enter_reaching_a_screen_before_it_is_composed_is_dropped_without_error(tmp_path):
    """CI caught this one: Enter typed all the time reached the Review screen after it was pushed and
    before its widgets were composed; saying "ignored" on its status line raised NoMatches and the wizard
    stopped. The screen is pushed here and the key delivered in the same cycle, before compose."""
    from textual import events

    from wizard.frontends.tui.screens.review import ReviewScreen
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DetailsScreen")
        app.push_screen(ReviewScreen())
        assert not app.screen.query("#status"), "the screen was composed already: this tests nothing"
        await app.on_event(events.Key("enter", "\r"))
        await settle(pilot)
        assert screen_name(app) == "ReviewScreen"
        assert app.screen.shown_at is not None and app.return_code is None
        assert not (tmp_path / "out" / "default_config.yaml").exists()


async def test_write_button_keeps_its_whole_label_in_80_columns_while_validating(tmp_path):
    """CI caught this one: in 80 columns the spinner's "Validating with accelerate, DeepSpeed and
    transformers ..." took 60 cells and pushed the Write button off the edge, so the terminal showed
    " Write" without its arrow. The buttons get their width first; the spinner is cut instead."""
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ReviewScreen")
        screen = app.screen
        screen.spinner().start("Validating with accelerate, DeepSpeed and transformers ...")
        await pilot.pause()
        width = app.size.width
        for button_id, label in (("#back", "◀ Back"), ("#next", "Write ▶")):
            region = screen.query_one(button_id).region
            assert region.right <= width - 1 and region.width >= len(label) + 2, (button_id, region)
        spinner = screen.query_one("#spinner").region
        assert spinner.width > 0 and spinner.right <= screen.query_one("#back").region.x


# ---------------------------------------------------------------- going back keeps answers

async def test_escape_goes_back_and_keeps_answers(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "seq_len", "4096")
        await reach(pilot, "PlanScreen")
        assert app.state.answers["seq_len"] == 4096
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        assert field(app, "seq_len").control.value == "4096"
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "HardwareScreen"
        await reach(pilot, "DetailsScreen")        # forward again: new screens read the same state
        await pilot.press("escape")
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        assert field(app, "seq_len").control.value == "4096"


async def test_a_picked_rung_survives_going_back_and_forth(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        rungs = app.screen.query_one(RungList)
        assert rungs.highlighted_key == "zero2"
        await pilot.press("down", "enter")          # ZeRO-3: picked, not yet accepted
        await settle(pilot)
        assert screen_name(app) == "PlanScreen" and app.state.plan.choice.key == "zero3"
        await reach(pilot, "DetailsScreen")
        await pilot.press("escape", "escape")
        await settle(pilot)
        await reach(pilot, "PlanScreen")
        assert app.state.plan.choice.key == "zero3"
        assert app.screen.query_one(RungList).highlighted_key == "zero3"
        await enter_through(pilot)
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3


# ---------------------------------------------------------------- the plan follows the inputs

def first_value_that_moves_the_plan(qid: str, values) -> tuple[int, str]:
    """The first value (from the core planner itself) whose chosen rung differs from the default's.

    The memory model gets refined; the test pins the wiring (the screen shows the core's plan for
    what was typed, and it moves), not today's thresholds.
    """
    from wizard.pipeline import plan_from_answers, resolve_pre_plan
    from wizard.sizing import model as model_mod
    hw = a100s()
    shape = model_mod.size_model(QWEN_7B)
    default = plan_from_answers(hw, shape, resolve_pre_plan(hw, {"model": QWEN_7B})).choice.key
    for value in values:
        plan = plan_from_answers(hw, shape, resolve_pre_plan(hw, {"model": QWEN_7B, qid: value}))
        if plan.choice is not None and plan.choice.key != default:
            return value, plan.choice.key
    raise AssertionError(f"no {qid} in {values} moves the plan off {default}")


@pytest.mark.parametrize("qid,values,back", [
    ("micro_batch", range(2, 65), 1),
    ("seq_len", (4096, 8192, 12288, 16384, 24576, 32768, 65536), 2048),
])
async def test_training_inputs_move_the_plan_to_another_rung(tmp_path, qid, values, back):
    value, rung = first_value_that_moves_the_plan(qid, values)
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        default = app.state.plan.choice.key
        assert default == "zero2"        # an 8B-class model on 8 x 80 GB: ZeRO-2, DDP does not fit
        await type_into(pilot, qid, str(value))
        assert app.state.plan.choice.key == rung != default
        assert app.state.plan.choice.name in text_of(app.screen.query_one("#plan-line"))
        await reach(pilot, "PlanScreen")
        rungs = app.screen.query_one(RungList)
        assert rungs.highlighted_key == rung
        marked = [o.id for o in rungs._options if o.prompt.chosen]
        assert marked == [rung]
        await pilot.press("escape")
        await settle(pilot)
        await type_into(pilot, qid, str(back))
        assert app.state.plan.choice.key == default


async def test_backend_choice_replans_with_fsdp(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        select = app.screen.query_one("#q-backend", Select)
        select.focus()
        await pilot.press("space")                  # open the menu
        await pilot.press("down", "down", "down", "enter")   # auto, ddp, deepspeed, fsdp
        await settle(pilot)
        assert app.state.answers["backend"] == "fsdp"
        assert {r.backend for r in app.state.plan.rungs} == {"fsdp"}
        assert app.state.plan.choice.key.startswith("fsdp")
        assert not app.screen.query_one("#field-zero_stage").display   # not asked for FSDP
        await pilot.press("shift+tab")               # from the backend menu up to the rung list
        await settle(pilot)
        assert app.focused is app.screen.query_one(RungList)
        await enter_through(pilot)
    doc = yaml.safe_load((tmp_path / "out" / "default_config.yaml").read_text())
    assert doc["distributed_type"] == "FSDP"
    assert doc["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"


async def test_a_backend_that_does_not_fit_is_said_and_auto_gives_the_ladder_back(tmp_path):
    """DDP chosen in the backend menu (a rung that does not fit cannot be picked in the ladder: see
    test_tui_plan_fit.py): nothing fits, the screen says so and holds Next; auto gives the ladder's choice back."""
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        select = app.screen.query_one("#q-backend", Select)
        select.focus()
        await pilot.press("space", "down", "enter")   # auto -> ddp: 160 GiB per GPU on 80 GB GPUs
        await settle(pilot)
        assert app.state.answers["backend"] == "ddp" and app.state.plan.choice is None
        warning = text_of(app.screen.query_one("#plan-warning"))
        assert "Nothing fits" in warning and "What would fit" in warning
        await pilot.press("enter")                    # Enter on the select: Next, refused
        await settle(pilot)
        assert screen_name(app) == "PlanScreen"
        assert text_of(app.screen.query_one("#status")).strip().startswith("✗ Nothing fits")
        await pilot.press("space", "up", "enter")     # back to auto: the ladder's own choice again
        await settle(pilot)
        assert app.state.plan.choice.key == "zero2" and app.state.picked is None


# ---------------------------------------------------------------- invalid entries

async def test_letters_in_a_number_field_show_the_error_and_block_next(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "micro_batch", "abc")
        f = field(app, "micro_batch")
        assert f.error is not None and "micro-batch: 'abc' is not a whole number" in f.error
        assert "is not a whole number" in text_of(f.query_one(".q-error"))
        assert app.state.answers["micro_batch"] == 1        # the last valid value still plans
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        assert "not a whole number" in text_of(app.screen.query_one("#status"))
        await type_into(pilot, "micro_batch", "0")
        assert "at least 1" in field(app, "micro_batch").error
        await type_into(pilot, "micro_batch", "2")
        assert field(app, "micro_batch").error is None
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "PlanScreen"


async def test_a_path_without_config_json_is_refused_inline(tmp_path):
    app = app_for(tmp_path, a100s())
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "model", str(MODELS / "no-config"))
        await wait_until(pilot, lambda: app.state.sizing is None and app.state.error is not None)
        await settle(pilot)
        f = field(app, "model")
        assert f.error is not None and "config.json" in f.error
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        await type_into(pilot, "model", LLAMA_8B)
        await wait_until(pilot, lambda: app.state.sizing is None)
        await settle(pilot)
        assert field(app, "model").error is None and app.state.model.params == 8_030_261_248
        assert not field(app, "params").display          # a model replaces the parameter count


async def test_model_field_completes_hub_ids_from_the_local_cache(tmp_path, monkeypatch):
    # A Hub cache laid out as huggingface_hub leaves it, holding only a config.json.
    hub = tmp_path / "hub"
    snapshot = hub / "models--acme--Llama-3.1-8B" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((MODELS / "llama-3.1-8b" / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    app = app_for(tmp_path, a100s())
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        model_input = app.screen.query_one("#q-model", Input)
        model_input.focus()
        await pilot.press(*"acme/ll")
        await settle(pilot)
        assert model_input._suggestion == "acme/Llama-3.1-8B"
        await pilot.press("right")                       # accept the completion
        await wait_until(pilot, lambda: app.state.sizing is None and app.state.model is not None
                         and app.state.model.source == "acme/Llama-3.1-8B")
        assert app.state.model.params == 8_030_261_248
        await settle(pilot)
        assert "acme/Llama-3.1-8B" in text_of(app.screen.query_one("#model-summary"))


async def test_another_machines_ram_cpus_and_disk_are_fields_that_replan(tmp_path):
    """Issue 13: RAM decides the offload rungs, so "another machine" asks it (and CPU cores, free disk),
    pre-filled with the catalogue's default; no markup leaks into the description."""
    from wizard.units import GiB
    app = app_for(tmp_path, hardware.load_file(str(ROOT / "snapshots" / "hardware" / "no-gpu.json")),
                  params="7B")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        app.screen.query_one("#q-target_machine", Select).focus()
        await pilot.press("space", "down", "enter")        # another machine from the catalogue
        await settle(pilot)
        await type_into(pilot, "target_count", "4")
        app.screen.query_one("#q-target_gpu", Select).value = "RTX4090-24GB"
        await settle(pilot)
        default_ram = hardware.assume("4xRTX4090-24GB").ram_total
        assert field(app, "target_ram").control.value == f"{default_ram // GiB}GiB"   # the catalogue's default
        assert field(app, "target_cpus").control.value == str(hardware.assume("4xRTX4090-24GB").cpu_cores)
        assert field(app, "target_disk").control.value == ""                         # not checked
        before = app.state.plan.choice
        await type_into(pilot, "target_ram", "32G")
        assert app.state.hardware.ram_total == 32 * GiB and app.state.other_spec() == "4xRTX4090-24GB,ram=32GiB"
        after = app.state.plan.choice
        assert before is not None and after is None     # 32 GiB cannot hold the offloaded optimizer states
        await type_into(pilot, "target_cpus", "24")
        await type_into(pilot, "target_disk", "2T")
        assert app.state.hardware.cpu_cores == 24 and app.state.hardware.disk_free_nvme == 2 * 1024 ** 4
        described = text_of(app.screen.query_one("#hw-describe"))
        assert described.startswith("Target machine (4xRTX4090-24GB,ram=32GiB,cpus=24,disk=2048GiB):")
        assert "[b]" not in described


async def test_an_assumed_machine_is_not_called_this_machine(tmp_path):
    app = app_for(tmp_path, a100s())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        select = app.screen.query_one("#q-target_machine", Select)
        labels = [str(prompt) for prompt, _ in select._options]
        assert any(label.startswith("the assumed machine (8 x") for label in labels), labels
        assert not any("this machine" in label for label in labels)
        assert text_of(app.screen.query_one("#status")).strip() == "Planning for the assumed machine."


async def test_zero_gpus_for_the_target_machine_is_refused(tmp_path):
    app = app_for(tmp_path, hardware.load_file(str(ROOT / "snapshots" / "hardware" / "no-gpu.json")))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        select = app.screen.query_one("#q-target_machine", Select)
        select.focus()
        await pilot.press("space", "down", "enter")        # another machine from the catalogue
        await settle(pilot)
        assert app.state.target == "other" and app.state.hardware.num_gpus == 8
        await type_into(pilot, "target_count", "0")
        assert "at least one" in field(app, "target_count").error
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "HardwareScreen"
        await type_into(pilot, "target_count", "4")
        assert app.state.hardware.num_gpus == 4
        await reach(pilot, "PlanScreen")
        assert app.state.plan.topology.world_size == 4 and not app.state.plan.topology.cpu


async def test_zero_cpu_processes_is_refused(tmp_path):
    app = app_for(tmp_path, hardware.load_file(str(ROOT / "snapshots" / "hardware" / "no-gpu.json")))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await type_into(pilot, "num_processes", "0")
        assert "at least 1" in field(app, "num_processes").error
        await pilot.press("enter")
        await settle(pilot)
        assert screen_name(app) == "HardwareScreen"


# ---------------------------------------------------------------- help and quitting

async def test_f1_explains_the_focused_question_and_its_default(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        field(app, "seq_len").control.focus()
        await settle(pilot)
        assert "Activation memory grows" in text_of(app.screen.query_one("#help"))
        await pilot.press("f1")
        await settle(pilot)
        body = text_of(app.screen.query_one("#explain-body"))
        assert "Recommended: 2048" in body and "common fine-tuning context" in body and "--seq-len" in body
        await pilot.press("escape")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen"
        app.screen.query_one(Select).focus()                # `?` works where it is not typed text
        await pilot.press("question_mark")
        await settle(pilot)
        assert screen_name(app) == "ExplainModal"


async def test_question_mark_is_text_in_a_field_and_arrows_move_between_fields(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        assert app.focused.id == "q-model"
        await pilot.press("down")
        assert app.focused.id == "q-seq_len"
        await pilot.press("down", "down", "up")
        assert app.focused.id == "q-micro_batch"
        await pilot.press("end", "question_mark")
        await settle(pilot)
        assert screen_name(app) == "ModelScreen" and app.focused.value == "1?"
        assert "not a whole number" in field(app, "micro_batch").error


async def test_ctrl_q_without_changes_quits_at_once(tmp_path):
    """Issue 36, item 11: Ctrl+Q exited 130, an interrupt's code. Quitting is the user's choice: exit 0, and the
    line says nothing was written (Ctrl+C, the terminal's interrupt, keeps 130)."""
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: app.return_value is not None)
    assert app.return_value.code == 0 and app.return_value.summary == ["Quit; nothing written."]
    assert not (tmp_path / "out").exists()


async def test_ctrl_q_asks_when_something_changed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "default_config.yaml").write_text("compute_environment: LOCAL_MACHINE\n")
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "grad_accum", "4")
        await pilot.press("ctrl+q")
        await settle(pilot)
        assert screen_name(app) == "QuitModal"
        await pilot.press("escape")                         # keep going
        await settle(pilot)
        assert screen_name(app) == "ModelScreen" and app.return_value is None
        assert field(app, "grad_accum").control.value == "4"
        await pilot.press("ctrl+c")                         # ctrl+c asks the same question
        await settle(pilot)
        assert screen_name(app) == "QuitModal"
        await pilot.press("q")
        await wait_until(pilot, lambda: app.return_value is not None)
    assert app.return_value.code == EXIT_INTERRUPTED
    assert (out / "default_config.yaml").read_text() == "compute_environment: LOCAL_MACHINE\n"
    assert sorted(p.name for p in out.iterdir()) == ["default_config.yaml"]


async def test_review_diffs_against_existing_files_and_write_keeps_a_backup(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    old = "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n"
    (out / "default_config.yaml").write_text(old)
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "ReviewScreen")
        await wait_until(pilot, lambda: app.screen.findings is not None)
        diff = text_of(app.screen.query_one("#diff-text"))
        assert "replaces the file there" in diff and "new file" in diff
        assert "-distributed_type: 'NO'" in diff and "+distributed_type: DEEPSPEED" in diff
        assert "accept both files" in text_of(app.screen.query_one("#validation-text"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "DoneScreen")
        done = text_of(app.screen.query_one("#done-files"))
        assert "previous kept as default_config.yaml.bak" in done
        args = text_of(app.screen.query_one("#done-args"))
        assert "deepspeed=" in args and "per_device_train_batch_size=1" in args and "bf16=True" in args
        assert "_checkpointing=False" in args
    assert (out / "default_config.yaml.bak").read_text() == old


async def test_launch_now_exits_with_the_wizard_launch_command(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DoneScreen")
        assert app.focused.id == "next"
        await pilot.press("l")                  # from Finish straight to the script field
        assert app.focused.id == "launch-script"
        await pilot.press(*"local/missing.py", "enter")     # in the field, `l` is typed
        await settle(pilot)
        assert app.screen.query_one("#launch-script", Input).value == "local/missing.py"
        assert "is not a file" in text_of(app.screen.query_one("#launch-error"))
        app.screen.query_one("#launch-script", Input).value = str(script)
        app.screen.query_one("#launch-args", Input).value = "--epochs 1 --name 'a b'"
        app.screen.query_one("#launch-now").focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.return_value is not None)
    argv = app.return_value.launch
    yaml_path = str(tmp_path / "out" / "default_config.yaml")
    assert argv[1:] == ["-m", "wizard", "launch", "--config-file", yaml_path, "--", str(script),
                        "--epochs", "1", "--name", "a b"]
    assert os.path.exists(yaml_path)
    summary = "\n".join(app.return_value.summary)
    assert "Wrote" in summary and "Next:" not in summary     # `wizard launch` reports the run itself


async def test_a_path_typed_right_after_l_lands_in_the_script_field(tmp_path):
    """`l` and the keys after it queued together, as a terminal delivers a fast typist's (or tmux's) keys: the
    focus moves before the next key is handled (Widget.focus() deferred it behind them, and they were lost)."""
    from textual import events
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DoneScreen")
        for ch in "lrun.py":
            app.post_message(events.Key(ch, ch))
        await settle(pilot)
        assert app.focused.id == "launch-script"
        assert app.screen.query_one("#launch-script", Input).value == "run.py"


async def test_done_screen_placeholders_read_as_hints_not_values(tmp_path):
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "DoneScreen")
        script = app.screen.query_one("#launch-script", Input).placeholder
        args = app.screen.query_one("#launch-args", Input).placeholder
        assert script.startswith("(") and "examples/train.py" in script and "--epochs" not in args
        assert os.path.isfile(ROOT / "examples" / "train.py")


async def test_back_from_done_shows_the_written_files_as_unchanged_and_keys_move_on(tmp_path):
    """After Back from Done the Changes tab describes the files now on disk; ←/→ switch the Review
    tabs from the Write button; Back into Details and Enter goes on (no select opens)."""
    from textual.widgets import TabbedContent
    app = app_for(tmp_path, a100s(), model=QWEN_7B)
    async with app.run_test(size=(100, 30)) as pilot:
        await reach(pilot, "ReviewScreen")
        tabs = app.screen.query_one(TabbedContent)
        assert tabs.active == "tab-yaml"
        await pilot.press("right")
        assert tabs.active == "tab-ds"
        await pilot.press("right", "right")
        assert tabs.active == "tab-validation"
        await pilot.press("right")
        assert tabs.active == "tab-yaml"
        await pilot.press("left")
        assert tabs.active == "tab-validation"
        app.screen.next_button().focus()
        await wait_until(pilot, lambda: app.screen.findings is not None)
        assert "new file" in text_of(app.screen.query_one("#diff-text"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "DoneScreen")
        await pilot.press("escape")
        await wait_until(pilot, lambda: screen_name(app) == "ReviewScreen")
        await settle(pilot)
        diff = text_of(app.screen.query_one("#diff-text"))
        assert "new file" not in diff and "unchanged" in diff
        await pilot.press("escape")
        await wait_until(pilot, lambda: screen_name(app) == "DetailsScreen")
        await settle(pilot)
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "ReviewScreen")


@pytest.mark.parametrize("opened_by, answer, code", [("ctrl+c", "ctrl+c", EXIT_INTERRUPTED), ("ctrl+q", "q", 0)])
async def test_the_quit_dialog_ends_with_the_code_of_the_key_that_opened_it(tmp_path, opened_by, answer, code):
    """A second Ctrl+C quits from the dialog (an interrupt: 130); Quit by Ctrl+Q is a choice: 0 (issue 36)."""
    app = app_for(tmp_path, a100s())
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        await type_into(pilot, "seq_len", "4096")
        await pilot.press(opened_by)
        await settle(pilot)
        assert screen_name(app) == "QuitModal"
        await pilot.press(answer)
        await wait_until(pilot, lambda: app.return_value is not None)
    assert app.return_value.code == code and not (tmp_path / "out").exists()


async def test_below_80x24_the_screen_says_it_is_too_small(tmp_path):
    app = app_for(tmp_path, a100s())
    async with app.run_test(size=(60, 20)) as pilot:
        await settle(pilot)
        message = app.screen.query_one("#too-small")
        assert message.display and "at least 80×24" in text_of(message) and "60×20" in text_of(message)
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        assert not app.screen.query_one("#too-small").display


async def test_nothing_fits_status_stays_on_one_80_column_line(tmp_path):
    app = app_for(tmp_path, hardware.assume("1xRTX4090-24GB"), params="70B")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "ModelScreen")
        status = text_of(app.screen.query_one("#status")).strip()
        assert status.startswith("✗ Nothing fits") and len(status) <= 60, status
        assert "closest" in text_of(app.screen.query_one("#plan-line")).lower() or len(
            text_of(app.screen.query_one("#plan-line"))) > len(status)
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen_name(app) == "PlanScreen")
        await settle(pilot)
        assert len(text_of(app.screen.query_one("#status")).strip()) <= 60


async def test_dry_run_writes_nothing(tmp_path):
    request = Request(given={"model": QWEN_7B}, output_dir=str(tmp_path / "out"), dry_run=True)
    app = make_app(request, hardware=a100s(), preload=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await enter_through(pilot)
    assert app.return_value.code == 0
    assert not (tmp_path / "out").exists()


async def test_f1_on_the_micro_batch_names_the_plans_largest_and_fastest_split(tmp_path):
    """Issue 13: "Recommended: 1" with 29 GiB to spare; with a plan, F1 says how far the chosen rung goes."""
    from wizard.frontends.tui.screens.modals import ExplainModal
    app = app_for(tmp_path, a100s(), model=LLAMA_8B)
    async with app.run_test(size=(100, 40)) as pilot:
        await reach(pilot, "ModelScreen")
        await wait_until(pilot, lambda: app.state.plan is not None and app.state.plan.choice is not None)
        choice, split = app.state.plan.choice, app.state.plan.batch
        field(app, "micro_batch").control.focus()
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, ExplainModal))
        body = " ".join(text_of(app.screen.query_one("#explain-body")).split())
        assert f"on {choice.name} up to {choice.max_micro_batch} fits" in body
        assert f"micro-batch {split.micro_batch} x accumulation {split.grad_accum}" in body


async def test_a_global_batch_reaches_the_plan_screen_and_the_done_screens_training_arguments(tmp_path):
    """Issue 19: with a global batch of 64 on 8 x A100 the Done screen said micro-batch 1 and accumulation 1 (a batch
    of 8); the Plan screen now shows the split and the time to train, and Done's TrainingArguments carry the split."""
    app = app_for(tmp_path, a100s(), model=LLAMA_8B, global_batch="64", train_tokens="1e9")
    async with app.run_test(size=(80, 24)) as pilot:
        await reach(pilot, "PlanScreen")
        await wait_until(pilot, lambda: app.state.plan is not None and app.state.plan.choice is not None)
        c, b = app.state.plan.choice, app.state.plan.batch
        assert b.applied and (c.micro_batch, c.grad_accum) == (b.micro_batch, b.grad_accum) and c.micro_batch > 1
        status = app.screen.status_text()
        # the split and the time to train, on one 80-column line ("to train" is left out where it would not fit)
        from wizard.units import fmt_duration
        assert f"batch {c.micro_batch}x{c.grad_accum}" in status and fmt_duration(c.train_seconds) in status
        await reach(pilot, "DoneScreen")
        args = text_of(app.screen.query_one("#done-args"))
        assert f"per_device_train_batch_size={b.micro_batch}," in args
        assert f"gradient_accumulation_steps={b.grad_accum}," in args
