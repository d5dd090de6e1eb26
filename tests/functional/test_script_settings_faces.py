"""Issue 36 item 1: every face says what the plan needs from the training script that no written file carries,
from the one list in wizard.config.script_settings: `wizard plan`, `wizard --non-interactive` (text and --json),
`wizard compare --write`, `--plain`, the TUI's Done screen, wizard_plan.json and `wizard launch`.

The cases are the issue's: the 70B on two nodes of 8 x H100 (ZeRO-3 + CPU optimizer offload, which fits only with
gradient checkpointing: 84.6 GiB per GPU without it) and the 8B at micro-batch 8 on 8 x H100 (ZeRO-2, 165.9 GiB
without it). Before, the CLI printed neither the setting nor any TrainingArguments for full fine-tuning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.config.script_settings import SETTINGS_TITLE
from wizard.frontends.cli import main
from wizard.frontends.report import script_settings_lines
from wizard.pipeline import Request

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
CASES = {
    "70b-two-nodes": (["--model", str(MODELS / "llama-3-70b"), "--main-process-ip", "10.0.0.1"],
                      "8xH100-80GB,nodes=2", "zero3-offload-opt"),
    # whole sequences on DeepSpeed: left to choose, the 8B at micro-batch 8 takes FSDP2 + context parallel 2 (faster,
    # and it fits without recomputation)
    "8b-micro-batch-8": (["--model", str(MODELS / "llama-3.1-8b"), "--micro-batch", "8", "--backend", "deepspeed",
                          "--parallelism-config-sp-size", "1"], "8xH100-80GB", "zero2"),
}
DS_WHOLE = {"backend": "deepspeed", "parallelism_config_sp_size": 1}
GC_LINE = "  - gradient checkpointing on: TrainingArguments("


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


def expected(flags: list[str], assume: str, tmp_path: Path):
    given = {}
    it = iter(flags)
    for flag in it:
        given[flag.lstrip("-").replace("-", "_")] = next(it)
    return pipeline.build(Request(given=given, assume=assume, output_dir=str(tmp_path / "expected")))


@pytest.mark.parametrize("case", CASES)
def test_the_cli_says_what_the_script_must_set_in_text_json_and_the_plan_on_disk(case, tmp_path, capsys):
    flags, assume, key = CASES[case]
    result = expected(flags, assume, tmp_path)
    assert result.plan.choice.key == key and result.plan.choice.gradient_checkpointing
    lines = script_settings_lines(result)
    assert lines[0] == SETTINGS_TITLE and lines[1].startswith(GC_LINE)

    assert main(["plan", *flags, "--assume", assume]) == 0
    assert "\n".join(lines) in capsys.readouterr().out
    assert main(["plan", *flags, "--assume", assume, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["script_settings"]
    assert planned[0]["key"] == "gradient_checkpointing" and planned[0]["fit"] is True

    out = tmp_path / "out"
    assert main(["--non-interactive", *flags, "--assume", assume, "--output-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "\n".join(lines) in text and text.index(SETTINGS_TITLE) < text.index("Next: ")
    on_disk = json.loads((out / "wizard_plan.json").read_text())["script_settings"]
    assert main(["--non-interactive", *flags, "--assume", assume, "--json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["script_settings"] == on_disk == planned


def test_compare_write_says_it_too(tmp_path, capsys):
    flags, assume, _ = CASES["8b-micro-batch-8"]
    assert main(["compare", *flags, "--machines", assume, "--write", assume, "--output-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert SETTINGS_TITLE in text and GC_LINE in text


def test_plain_says_it_before_the_next_line(tmp_path, capsys):
    from tests.functional.test_prompts import ENTER, plain
    flags, assume, _ = CASES["8b-micro-batch-8"]
    result = expected(flags, assume, tmp_path)
    request = Request(given={"model": flags[1], "micro_batch": 8, **DS_WHOLE}, assume=assume,
                      output_dir=str(tmp_path / "o"))
    assert plain(request, ENTER * 80) == 0
    printed = capsys.readouterr().out
    assert "\n".join(script_settings_lines(result)) in printed
    assert printed.index(SETTINGS_TITLE) < printed.index("Next: ")


async def test_the_done_screen_says_it(tmp_path, monkeypatch):
    from tests.functional.test_tui_pilot import app_for, reach, text_of
    from wizard.probe import hardware

    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    flags, assume, _ = CASES["8b-micro-batch-8"]
    app = app_for(tmp_path, hardware.assume(assume), model=flags[1], micro_batch=8, **DS_WHOLE)
    async with app.run_test(size=(120, 40)) as pilot:
        await reach(pilot, "DoneScreen")
        title = text_of(app.screen.query_one("#done-settings-title"))
        shown = " ".join(text_of(app.screen.query_one("#done-settings")).split())
        result = app.written_result
        assert "Your script must set" in title
        for line in script_settings_lines(result)[1:]:
            assert " ".join(line.split()) in shown, shown
        assert shown.startswith("- gradient checkpointing on: TrainingArguments(")
    summary = "\n".join(app.summary_lines())
    assert SETTINGS_TITLE in summary and GC_LINE in summary


@pytest.mark.slow
def test_launch_says_it_at_start_and_whether_the_script_mentions_it(tmp_path):
    """A CPU configuration that plans gradient checkpointing (a single process; no file carries it), launched for
    real on a script that ends at once and never mentions it: the launch says what the plan needs and warns, on
    stderr and as the run's first events (the live view shows them). tests/unit/test_script_check.py covers what
    it tells from the script and its arguments."""
    out = tmp_path / "cfg"
    assert main(["--non-interactive", "--model", str(MODELS / "llama-tiny"), "--use-cpu", "--num-processes", "1",
                 "--gradient-checkpointing", "on", "--output-dir", str(out)]) == 0
    plan = json.loads((out / "wizard_plan.json").read_text())
    assert plan["script_settings"][0]["key"] == "gradient_checkpointing"
    silent = tmp_path / "silent.py"
    silent.write_text("print('trained')\n")
    launched = subprocess.run([sys.executable, "-m", "wizard", "launch", "--config-file",
                               str(out / "default_config.yaml"), "--run-dir", str(tmp_path / "run"), "--headless",
                               "--", str(silent)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert "[wizard] the plan (wizard_plan.json) needs gradient checkpointing" in launched.stderr
    assert "[wizard] warning: neither silent.py nor a file its arguments name mentions" in launched.stderr
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events[:2]] == ["plan", "plan"]
    assert "needs gradient checkpointing" in events[0]["message"] and "warning" in events[1]["message"]
