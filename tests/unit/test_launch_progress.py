"""The supervisor's progress bookkeeping (issue 11): the progress line and the loss curve come from
one source (the lowest rank that reports progress), so they never show two different losses."""

from __future__ import annotations

import json

from launch.spec import LaunchSpec
from launch.supervisor import Supervisor, _Attempt


def test_loss_comes_from_the_rank_that_reports_progress(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sup = Supervisor(LaunchSpec(script="t.py", run_dir=str(run_dir), config_file=None), out=None)
    att = _Attempt(sup, 1, None)
    att.on_progress(0, {"step": 3, "total": 10, "rate": 2.0, "eta_s": None})
    att.on_train_log(1, {"loss": 9.5, "learning_rate": 0.1})       # another rank's own loss
    att.on_train_log(0, {"loss": 1.25, "learning_rate": 0.1})
    sup.record.flush(force=True)
    ev = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in ev if e["type"] == "train_log"]
    assert losses == [1.25]
    assert json.loads((run_dir / "run.json").read_text())["progress"]["loss"] == 1.25
