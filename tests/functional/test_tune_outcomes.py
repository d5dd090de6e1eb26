"""How a `wizard tune` trial ends, as a user meets it (issue 29): a Ctrl-C reads as interrupted, not as a spent
budget; a failure in the script's own code stops tune after the first candidate and is shown once; a script that
runs too few optimizer steps is told how many it needs. Real 2-rank CPU trials of the tiny example model."""

from __future__ import annotations

import threading

import pytest

from tests.launch_support import REPO, env

pytestmark = pytest.mark.slow

ANSWERS = {"params": "98K", "hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 128, "seq_len": 32,
           "micro_batch": 4, "num_processes": 2, "backend": "deepspeed"}
EXAMPLE = str(REPO / "examples" / "train.py")


@pytest.fixture()
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for k, v in env().items():
        monkeypatch.setenv(k, v)
    return tmp_path


def _tune(tmp_path, script_args, events, **kw):
    from wizard import tune
    from wizard.pipeline import Request
    opts = tune.TuneOptions(script=EXAMPLE, script_args=list(script_args), runs_root=str(tmp_path / "runs"),
                            **{"warmup": 1, "steps": 2, "variants": 0, "calibrate": False, **kw})
    return tune.tune(Request(given=dict(ANSWERS), output_dir=str(tmp_path / "out"), dry_run=True), opts,
                     progress=events.append, write=False)


def test_an_interrupted_trial_reads_interrupted_not_budget_spent(here):
    """Ctrl-C 25 s into a budget of 1,800 s read "1/3 DeepSpeed ZeRO-2: not run (budget spent)"."""
    import io

    from wizard.frontends.report import tune_progress_printer
    stop = threading.Event()
    stop.set()                              # as the TUI's Escape (and Ctrl-C) stops the trial in progress
    events: list[dict] = []
    with pytest.raises(KeyboardInterrupt):
        _tune(here, ("--steps", "40"), events, candidates=2, cancel=stop)
    (end,) = [e for e in events if e["event"] == "end"]
    assert end["trial"]["status"] == "interrupted", end
    assert end["trial"]["message"] == "interrupted before its first measured step", end
    out = io.StringIO()
    printer = tune_progress_printer(out)
    for e in events:
        printer(e)
    assert "1/2 DeepSpeed ZeRO-2: interrupted" in out.getvalue() and "budget" not in out.getvalue(), out.getvalue()


def test_a_failure_in_the_scripts_own_code_stops_tune_and_is_shown_once(here):
    """A script that raises at step 2 ran once per candidate (three model loads for one bug)."""
    from wizard import tune
    from wizard.frontends.report import print_tune
    events: list[dict] = []
    result = _tune(here, ("--steps", "40", "--fail-on-rank", "0", "--fail-at-step", "1"), events, candidates=2)
    first, second = result.trials
    assert first.status == "failed" and first.user_code_error, first.to_json()
    assert first.user_code_error.startswith("train.py:") and "RuntimeError: deliberate failure" in \
        first.user_code_error, first.user_code_error
    assert "(in your code: train.py:" in first.message, first.message
    assert second.status == tune.NOT_RUN_SCRIPT_FAILED and second.run_dir is None, second.to_json()
    assert [e["index"] for e in events if e["event"] == "start"] == [0]      # the second never started
    assert any(n.startswith("Stopped after DeepSpeed ZeRO-2: its error is in your script's own code") for n in
               result.notes), result.notes
    import io
    out = io.StringIO()
    print_tune(result, file=out)
    assert out.getvalue().count("deliberate failure") == 1, out.getvalue()


def test_a_script_that_runs_too_few_steps_is_told_how_many_it_needs(here):
    """warmup 1 + steps 2 = 3 optimizer steps is one too few: the last measured step ends at the next one's start."""
    events: list[dict] = []
    result = _tune(here, ("--steps", "3"), events, candidates=1)
    (trial,) = result.trials
    assert trial.status == "incomplete", trial.to_json()
    assert trial.message == ("the script ended after 1 measured step without reaching 2: a trial needs the script to "
                             "run at least 4 optimizer steps (--warmup-steps 1 + --steps 2 + 1: a step is timed up to "
                             "the start of the next)"), trial.message
