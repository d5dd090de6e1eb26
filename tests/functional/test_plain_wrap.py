"""Issue 21, point 8: on a terminal the plain report wraps between words, to the terminal's width ("do" at the
end of one line and "es not fit" on the next was the terminal cutting an 150-column line at 80). To a pipe
the lines stay whole (one record a line, for grep)."""

from __future__ import annotations

import io

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from wizard import pipeline
from wizard.errors import EXIT_NOTHING_FITS
from wizard.frontends import report
from wizard.frontends.prompts import run_plain
from wizard.pipeline import Request
from wizard.probe import hardware

pytestmark = pytest.mark.timeout(180)

ENTER, DOWN = "\r", "\x1b[B"
NOTHING_FITS = "1xA100-80GB,ram=128G"       # full fine-tuning of 70B: nothing fits, long reasons


class Terminal(io.StringIO):
    """What the report is printed to: a terminal as far as the report can tell (its width comes from COLUMNS)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


def nothing_fits_result():
    hw = hardware.assume(NOTHING_FITS)
    answers = pipeline.resolve_pre_plan(hw, {"params": "70B"})
    model = pipeline.size(answers)
    plan = pipeline.plan_from_answers(hw, model, answers)
    assert plan.choice is None
    return pipeline.Result(hardware=hw, model=model, plan=plan, answers=answers, output_dir="", yaml_path="",
                           ds_path="")


def assert_wrapped_between_words(wrapped: str, whole: str, width: int) -> None:
    lines = wrapped.splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(line for line in lines if len(line) > width)
    assert wrapped.split() == whole.split()             # the same words, none of them cut


@pytest.mark.parametrize("columns", [80, 120])
def test_the_plan_report_wraps_between_words_to_the_terminals_width(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    result = nothing_fits_result()
    piped, terminal = io.StringIO(), Terminal()
    report.print_plan(result, file=piped)
    report.print_plan(result, file=terminal)
    whole = piped.getvalue()
    assert max(len(line) for line in whole.splitlines()) > columns        # a pipe gets the lines whole
    assert "does not fit" in whole
    assert_wrapped_between_words(terminal.getvalue(), whole, columns)
    # A continued line starts under the text it continues ("     Needs ..." -> "     ..."), not at column 0.
    lines = terminal.getvalue().splitlines()
    reason = next(i for i, line in enumerate(lines) if line.startswith("     Needs "))
    assert lines[reason + 1].startswith("     ") and not lines[reason + 1].startswith("      ")


def test_plain_wraps_what_it_says_on_an_80_column_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    request = Request(given={"params": "70B"}, assume=NOTHING_FITS, dry_run=True)
    out = Terminal()
    from wizard.frontends.session import WizardState
    state = WizardState(request)
    state.set_probed(state.load_hardware())
    state.replan()
    from wizard.config.questions import for_stage
    before_plan = sum(1 for stage in ("model", "training") for q in for_stage(stage)
                      if not q.advanced and state.asked(q.id))
    with create_pipe_input() as pipe:       # every default, then Next: Quit (nothing fits: no "Use")
        pipe.send_text(ENTER * before_plan + DOWN * 2 + ENTER)
        code = run_plain(request, input=pipe, output=DummyOutput(), out=out)
    assert code == EXIT_NOTHING_FITS
    text = out.getvalue()
    assert "wizard: Nothing fits." in text and "Hardware:" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "wizard: " + state.error.split()[0] in text
    assert " ".join(text.split()).count(" ".join(state.error.split())) == 1    # every word of it, whole
