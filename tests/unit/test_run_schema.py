"""run.json's one schema (launch/runschema.py), shared by `wizard runs`, `attach`, `stop`, the view and the reaper
(issue 42 #4): every value a client shows or acts on is checked once; what the supervisor writes passes."""

from __future__ import annotations

import json
import math

import pytest

from launch import classify as cls
from launch.runschema import RunJsonError, parse, problem
from wizard.schema import SchemaError, build


def _body(**over):
    st = {"id": "r", "status": "running", "supervisor_pid": 4321, "supervisor_create_time": 1.7e9, "attempt": 1,
          "max_restarts": 0, "pids": {"0": 4400}, "tracked_pids": [4400], "seen_pids": [4400],
          "process_times": {"4400": 1.7e9 + 3}, "started_at": 1.7e9, "progress": {}}
    st.update(over)
    return st


def test_what_the_supervisor_writes_passes(tmp_path):
    """The supervisor's own run.json (its first save, then a failure and a lost record as they are written)."""
    from launch.spec import LaunchSpec
    from launch.supervisor import Supervisor
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Supervisor(LaunchSpec(script="t.py", run_dir=str(run_dir), config_file=None), out=None)
    written = json.loads((run_dir / "run.json").read_text())
    assert problem(written) is None, problem(written)
    failure = cls.Classification("cuda_oom", 1, 1, None, "rank 1: CUDA out of memory", "use the next rung",
                                 ["line 1", "line 2"], "zero3", "wizard --zero-stage 3").to_json()
    ended = {**written, "status": "failed", "ended_at": written["started_at"] + 5, "exit_code": 1,
             "classification": failure, "progress": {**written["progress"], "step": 3, "total": 10,
                                                     "loss": math.nan, "rate": 1.5}}
    rec = parse(json.loads(json.dumps(ended)))          # NaN goes through JSON as the supervisor writes it
    assert rec.classification.kind == "cuda_oom" and rec.classification.log_tail == ("line 1", "line 2")
    assert math.isnan(rec.progress.loss) and rec.progress.step == 3
    lost = {**written, "status": "lost", "lost_at": 1.8e9, "lost_recorded_at": 1.8e9, "lost_cause": "gone",
            "lost_by": "reaper", "lost_cleaned": [4400], "exit_code": 137, "trial_done": {"steps": 7},
            "stop_reason": "SIGINT (Ctrl-C)", "user_restarts": 1, "some_newer_field": {"x": 1}}
    rec = parse(lost)
    assert rec.lost_cleaned == (4400,) and rec.trial_done.steps == 7 and rec.attempts_allowed() == 2
    assert rec.raw["some_newer_field"] == {"x": 1}             # kept, not checked


@pytest.mark.parametrize("over, field", [
    # issue 42 #4: each of these crashed `wizard runs` (TypeError in the sort, OverflowError / ValueError in the
    # clock, AttributeError on the classification, TypeError on the lost cause and the stop reason)
    ({"started_at": "2026-12-06"}, "started_at"),
    ({"started_at": 1e308}, "started_at"),
    ({"ended_at": math.inf}, "ended_at"),
    ({"started_at": math.nan}, "started_at"),
    ({"classification": "x"}, "classification"),
    ({"classification": {"kind": 5}}, "classification.kind"),
    ({"lost_cause": 1e308}, "lost_cause"),
    ({"stop_reason": math.nan}, "stop_reason"),
    ({"lost_at": 1e308}, "lost_at"),
    ({"progress": "fast"}, "progress"),
    ({"progress": {"step": "3"}}, "progress.step"),
    ({"trial_done": {"steps": -1}}, "trial_done.steps"),
    # what a client acts on: pids (0 and -1 are process groups to kill(2)) and their start times
    ({"supervisor_pid": 0}, "supervisor_pid"),
    ({"supervisor_pid": -1}, "supervisor_pid"),
    ({"supervisor_pid": True}, "supervisor_pid"),
    ({"supervisor_pid": 1 << 40}, "supervisor_pid"),
    ({"tracked_pids": [4400, "abc"]}, "tracked_pids[1]"),
    ({"process_times": {"-1": 1.0}}, "process_times['-1']"),
    ({"process_times": {"4400": "soon"}}, "process_times['4400']"),
    ({"grace_s": math.inf}, "grace_s"),
    ({"status": "weird"}, "status"),
    ({"status": None}, "status"),
])
def test_a_field_that_is_not_what_it_holds_is_one_line_naming_it(over, field):
    with pytest.raises(RunJsonError) as e:
        parse(_body(**over))
    assert e.value.field == field and str(e.value).startswith(field + ":") and "\n" not in str(e.value)


def test_a_body_that_is_no_object_and_a_missing_field_are_named():
    assert problem([1]) == "[1] is not a JSON object"
    body = _body()
    del body["supervisor_create_time"]
    assert problem(body) == "supervisor_create_time: missing"


def test_a_value_is_shown_escaped_and_short():
    text = str(pytest.raises(RunJsonError, parse, _body(status="x\x1b[31m\nFAKE" + "y" * 500)).value)
    assert "\x1b" not in text and "\n" not in text and len(text) < 300


def test_the_schema_checks_are_shared_not_copied():
    """The preflight's messages use the same checks (one home: wizard/schema.py)."""
    from dataclasses import dataclass

    from wizard.schema import integer, spec

    @dataclass(frozen=True)
    class One:
        n: int = spec(integer(0, 3, "0-3"), required=True)

    assert build(One, {"n": 2}).n == 2
    with pytest.raises(SchemaError, match=r"^n: 7 is not 0-3$"):
        build(One, {"n": 7})
