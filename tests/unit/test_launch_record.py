"""The supervisor's RunRecord (run.json + events.jsonl, one home for each key and event) and an attempt's
ProcessGroup (pid + create time, told to the supervisor the moment a process is found) (issue 15)."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from launch import record as record_mod
from launch.rundir import EventLog, RunState
from launch.processes import ProcessGroup
from launch.record import RunRecord
from launch.spec import LaunchSpec
from launch.supervisor import Supervisor


def make_record(tmp_path, **extra):
    state = RunState(tmp_path, {"status": "running", "pids": {}, "tracked_pids": [], "seen_pids": [],
                                "process_times": {}, "max_restarts": 0, "user_restarts": 0,
                                "progress": dict.fromkeys(("step", "total", "rate", "eta_s", "loss",
                                                           "learning_rate", "grad_norm", "epoch")), **extra})
    state.save()
    return RunRecord(state, EventLog(tmp_path / "events.jsonl"))


def on_disk(tmp_path):
    return json.loads((tmp_path / "run.json").read_text())


def events(tmp_path):
    path = tmp_path / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(record_mod.time, "monotonic", c)
    return c


def test_tracked_pids_are_the_living_ones_and_seen_pids_every_one_in_order(tmp_path):
    rec = make_record(tmp_path)
    rec.record_tracked([30, 10], [10, 30])
    rec.record_tracked([20, 30], [10, 30, 20])
    rec.flush(force=True)
    st = on_disk(tmp_path)
    assert st["tracked_pids"] == [20, 30]
    assert st["seen_pids"] == [10, 30, 20]
    rec.record_tracked([], [])           # the attempt is over: nothing runs, nothing is forgotten
    rec.flush(force=True)
    st = on_disk(tmp_path)
    assert st["tracked_pids"] == []
    assert st["seen_pids"] == [10, 30, 20]


def test_an_attempts_changes_reach_the_disk_at_most_every_flush_interval(tmp_path, clock):
    rec = make_record(tmp_path)
    rec.record_process(111, 5.5)
    assert on_disk(tmp_path)["process_times"] == {}          # batched, not saved yet
    rec.flush()
    assert on_disk(tmp_path)["process_times"] == {"111": 5.5}
    rec.record_rank(0, 111)
    clock.t += record_mod.STATE_FLUSH_EVERY_S / 2
    rec.flush()
    assert on_disk(tmp_path)["pids"] == {}                    # too soon after the last save
    clock.t += record_mod.STATE_FLUSH_EVERY_S / 2
    rec.flush()
    assert on_disk(tmp_path)["pids"] == {"0": 111}


def test_stopping_is_saved_at_once_and_emitted_with_the_grace(tmp_path):
    rec = make_record(tmp_path)
    rec.record_stopping(2, "stop requested", 7.5)
    assert on_disk(tmp_path)["status"] == "stopping"
    ev = events(tmp_path)
    assert [(e["type"], e["attempt"], e["reason"], e["grace_s"]) for e in ev] == [("stop", 2, "stop requested", 7.5)]


def test_progress_fills_in_the_eta_and_emits_at_most_one_event_a_second_but_always_the_last(tmp_path, clock):
    rec = make_record(tmp_path)
    rec.record_progress(1, 0, {"step": 3, "total": 10, "rate": 2.0, "eta_s": None})
    assert rec.progress()["eta_s"] == 3.5                     # (10 - 3) / 2 it/s
    clock.t += 0.5
    rec.record_progress(1, 0, {"step": 4, "total": 10, "rate": 2.0, "eta_s": None})
    clock.t += 0.1
    rec.record_progress(1, 0, {"step": 10, "total": 10, "rate": 2.0, "eta_s": None})
    steps = [e["step"] for e in events(tmp_path) if e["type"] == "progress"]
    assert steps == [3, 10]
    assert rec.progress()["step"] == 10


def test_train_log_keeps_the_loss_and_emits_it_with_the_current_step(tmp_path, clock):
    rec = make_record(tmp_path)
    rec.record_progress(1, 0, {"step": 5, "total": 10, "rate": None, "eta_s": None})
    rec.record_train_log(1, 0, {"loss": 0.75, "grad_norm": 2.0})
    ev = [e for e in events(tmp_path) if e["type"] == "train_log"]
    assert ev == [{"t": ev[0]["t"], "type": "train_log", "attempt": 1, "rank": 0, "step": 5,
                   "loss": 0.75, "grad_norm": 2.0}]
    assert rec.progress()["loss"] == 0.75


def test_status_line_shows_the_recorded_progress(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sup = Supervisor(LaunchSpec(script="t.py", run_dir=str(run_dir), config_file=None, max_restarts=1), out=None)
    sup.record.record_progress(1, 0, {"step": 3, "total": 10, "rate": 2.0, "eta_s": None})
    sup.record.record_train_log(1, 0, {"loss": 1.25})
    assert sup.status_line(1) == ("attempt 1/2 | starting | step 3/10 | loss 1.25 | 2.00 it/s | ETA 0:03 | "
                                  "no GPU metrics")


def test_supervisor_records_an_owned_process_and_its_rank(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sup = Supervisor(LaunchSpec(script="t.py", run_dir=str(run_dir), config_file=None), out=None)
    sup.own_process(4242, 12.25)
    sup.rank_connected(1, 4242)
    sup.record.flush(force=True)
    st = on_disk(run_dir)
    assert st["process_times"] == {"4242": 12.25}
    assert st["pids"] == {"1": 4242}
    assert sup.pid_rank == {4242: 1}
    sup.disown_process(4242)
    assert sup.pid_rank == {}


def test_process_group_reports_each_process_once_with_its_create_time_and_kills_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tracked: list[tuple[int, float]] = []
        forgotten: list[int] = []
        group = ProcessGroup(on_tracked=lambda pid, ct: tracked.append((pid, ct)), on_forgotten=forgotten.append)
        group.track(child.pid)
        group.track(child.pid)
        assert tracked == [(child.pid, psutil.Process(child.pid).create_time())]
        assert [p.pid for p in group.alive()] == [child.pid]
        group.kill_all()
        assert child.wait(timeout=10) == -9
        assert group.alive() == []
        group.forget_all()
        assert forgotten == [child.pid]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_process_group_ignores_a_pid_that_is_gone(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    tracked: list[tuple[int, float]] = []
    group = ProcessGroup(on_tracked=lambda pid, ct: tracked.append((pid, ct)), on_forgotten=lambda pid: None)
    group.track(child.pid)
    assert tracked == [] and group.tracked == {}


def test_gpus_last_busy_is_unknown_without_nvml_and_never_before_the_attempt(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sup = Supervisor(LaunchSpec(script="t.py", run_dir=str(run_dir), config_file=None), out=None)
    assert sup.gpus_last_busy(100.0) is None                  # no NVML: no evidence either way
    sup.nvml_available = True
    assert sup.gpus_last_busy(100.0) == 100.0                 # no busy sample yet: the attempt's start
    sup.gpu_active_at = 50.0
    assert sup.gpus_last_busy(100.0) == 100.0
    sup.gpu_active_at = 150.0
    assert sup.gpus_last_busy(100.0) == 150.0
