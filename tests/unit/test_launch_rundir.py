"""The run directory contract (launch/rundir.py): creation, latest, atomic state, bounded files."""

import json
import os
import subprocess
import sys

import pytest

from launch.rundir import (
    BoundedJsonl,
    EventLog,
    RotatingLog,
    RunState,
    create_run_dir,
    process_alive,
    rank_log_path,
    read_jsonl,
    read_state,
    resolve_run_dir,
    tail_lines,
)
from wizard.errors import InputError


def test_create_points_latest_and_resolves(tmp_path):
    root = tmp_path / "runs"
    a, fa = create_run_dir(root=root)
    b, fb = create_run_dir(root=root)
    os.close(fa), os.close(fb)
    assert a != b and a.parent == root
    (b / "run.json").write_text("{}")
    assert (root / "latest").resolve() == b
    assert resolve_run_dir(None, root) == b
    assert resolve_run_dir(str(root)) == b              # a runs root means its latest
    assert resolve_run_dir(b.name, root) == b           # a run id under the root
    (a / "run.json").write_text("{}")
    assert resolve_run_dir(str(a)) == a


def test_explicit_run_dir_must_be_new_or_empty(tmp_path):
    d, fd = create_run_dir(tmp_path / "deep" / "r1")
    os.close(fd)
    assert d.is_dir() and (tmp_path / "deep" / "latest").resolve() == d
    (d / "x").write_text("x")
    with pytest.raises(InputError):
        create_run_dir(d)


def test_resolve_missing_run_is_input_error(tmp_path):
    with pytest.raises(InputError) as e:
        resolve_run_dir(None, tmp_path)
    assert "RUN_DIR" in str(e.value)


def test_run_state_replaced_atomically(tmp_path):
    st = RunState(tmp_path, {"id": "x", "status": "starting"})
    st.save()
    st.update(status="running", pids={"0": 123})
    assert read_state(tmp_path) == {"id": "x", "status": "running", "pids": {"0": 123}}
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_jsonl_keeps_newest_whole_lines_under_cap(tmp_path):
    path = tmp_path / "events.jsonl"
    ev = EventLog(path, cap_bytes=4000)
    for i in range(500):
        ev.emit("train_log", 1, loss=float(i), step=i)
    assert path.stat().st_size <= 4000
    rows = read_jsonl(path)
    assert rows and rows[-1]["step"] == 499
    steps = [r["step"] for r in rows]
    assert steps == list(range(steps[0], 500))          # contiguous newest, no torn lines
    assert ev.rotations > 0


def test_bounded_jsonl_keeps_exactly_the_newest_part_when_the_cut_falls_on_a_line_start(tmp_path):
    path = tmp_path / "m.jsonl"
    j = BoundedJsonl(path, cap_bytes=110)            # 10 lines of 11 bytes fill it
    for i in range(11):
        j.append({"n": f"{i:02d}"})                  # '{"n":"07"}\n': 11 bytes
    # the newest half (55 bytes) is five whole lines, the last one the line that did not fit
    assert [r["n"] for r in read_jsonl(path)] == ["06", "07", "08", "09", "10"]
    assert path.stat().st_size == 55 and j.rotations == 1


def test_bounded_jsonl_appends_whole_objects(tmp_path):
    j = BoundedJsonl(tmp_path / "m.jsonl", cap_bytes=10_000)
    j.append({"a": 1})
    j.append({"b": [1, 2]})
    assert [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()] == [{"a": 1}, {"b": [1, 2]}]


def test_rotating_log_keeps_one_backup(tmp_path):
    path = rank_log_path(tmp_path, 1, 0)
    log = RotatingLog(path, cap_bytes=1000)
    for i in range(100):
        log.write(b"%05d........................\n" % i)
    log.close()
    backup = path.with_name(path.name + ".1")
    assert path.stat().st_size <= 1000 and backup.stat().st_size <= 1000
    assert path.read_bytes().splitlines()[-1].startswith(b"00099")
    assert log.rotations >= 2


def test_tail_lines(tmp_path):
    p = tmp_path / "f.log"
    p.write_text("".join(f"l{i}\n" for i in range(100)))
    assert tail_lines(p, 3) == ["l97", "l98", "l99"]
    assert tail_lines(tmp_path / "missing", 3) == []


def test_process_alive_checks_the_recorded_start_time_and_never_raises(tmp_path):
    import psutil
    me = psutil.Process(os.getpid())
    assert process_alive(os.getpid()) and process_alive(str(os.getpid()), me.create_time())
    assert not process_alive(os.getpid(), me.create_time() - 100)      # same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert not process_alive(child.pid)
    for pid, create_time in [(None, None), ("x", None), (0, None), (os.getpid(), "not a time")]:
        assert not process_alive(pid, create_time)


def test_a_zombie_is_not_alive_even_with_its_own_start_time():
    """A process that exited but was not reaped yet (a supervisor whose parent has not waited) is dead."""
    import time

    import psutil
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        ctime = psutil.Process(child.pid).create_time()
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert not process_alive(child.pid, ctime) and not process_alive(child.pid)
    finally:
        child.wait()


def test_read_state_ignores_a_run_json_that_is_not_an_object(tmp_path):
    (tmp_path / "run.json").write_text("[1, 2]")
    assert read_state(tmp_path) is None


# ------------------------------------------------------------------ issue 11: lock, validation, lost

from launch.rundir import (  # noqa: E402
    LOCK_FILE,
    attempts_allowed,
    end_recorded_processes,
    load_state,
    mark_lost_if_dead,
    state_problem,
    try_lock,
)


def test_a_locked_run_dir_refuses_a_second_launch_and_a_file_is_input_error(tmp_path):
    d, fd = create_run_dir(tmp_path / "r")
    try:
        with pytest.raises(InputError) as e:          # still empty but for the lock: the lock decides
            create_run_dir(tmp_path / "r")
        assert "in use by another launch" in str(e.value)
    finally:
        os.close(fd)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError) as e:
        create_run_dir(f)
    assert "--run-dir" in str(e.value) and "not a directory" in str(e.value)


def test_two_processes_creating_one_run_dir_together_get_one_lock(tmp_path):
    """Started together (a barrier file), two creators: exactly one holds the directory."""
    code = ("import sys,time,os; from pathlib import Path\n"
            "from launch.rundir import create_run_dir\n"
            "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
            "try:\n  d, fd = create_run_dir(sys.argv[1]); print('ok', flush=True); time.sleep(1.5)\n"
            "except Exception as e:\n  print('refused', e, flush=True); sys.exit(2)\n")
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "same"), str(go)],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    import time
    time.sleep(1.0)
    go.write_text("")
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert sorted(p.returncode for p in procs) == [0, 2], outs
    assert sum(o.startswith("ok") for o in outs) == 1


def _valid_state(**over):
    import psutil
    me = psutil.Process(os.getpid())
    st = {"id": "x", "status": "running", "supervisor_pid": os.getpid(), "supervisor_create_time": me.create_time(),
          "attempt": 1, "max_restarts": 0, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
          "progress": {}}
    st.update(over)
    return st


@pytest.mark.parametrize("body,needle", [
    ("not json", "is not JSON"), ("[1]", "not a JSON object"),
    (json.dumps(_valid_state(status="weird")), "status: 'weird'"),
    (json.dumps(_valid_state(tracked_pids=["abc"])), "tracked_pids"),
    (json.dumps(_valid_state(supervisor_create_time=None)), "supervisor_create_time"),
    (json.dumps(_valid_state(supervisor_pid="12")), "supervisor_pid"),
    (json.dumps(_valid_state(process_times={"12": "soon"})), "process_times"),
    # pid 0 is no process: os.kill(0, sig) would signal the caller's whole process group
    (json.dumps(_valid_state(supervisor_pid=0)), "supervisor_pid"),
    (json.dumps(_valid_state(pids={"0": 0})), "pids['0']: 0 is not a process id"),
    (json.dumps(_valid_state(tracked_pids=[0])), "tracked_pids"),
], ids=["not-json", "not-object", "status", "tracked-not-int", "no-create-time", "pid-as-text", "process-times",
        "supervisor-pid-0", "rank-pid-0", "tracked-pid-0"])    # ids without this process's pid (pytest-xdist)
def test_load_state_refuses_garbage_with_one_line(tmp_path, body, needle):
    (tmp_path / "run.json").write_text(body)
    with pytest.raises(InputError) as e:
        load_state(tmp_path)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "run.json").read_text() == body


def test_load_state_accepts_what_the_supervisor_writes(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(_valid_state()))
    assert load_state(tmp_path)["status"] == "running" and state_problem(_valid_state()) is None


def test_attempts_allowed_counts_user_restarts():
    assert attempts_allowed({"max_restarts": 0}) == 1
    assert attempts_allowed({"max_restarts": 0, "user_restarts": 1}) == 2
    assert attempts_allowed({"max_restarts": 2, "user_restarts": 0}) == 3


def _sleeper(session=False, run_dir=None):
    """A process; with run_dir, one of that run's (the supervisor sets WIZARD_RUN_DIR for the launcher and every
    rank inherits it)."""
    env = dict(os.environ, WIZARD_RUN_DIR=str(run_dir)) if run_dir else None
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=session,
                            env=env)


def test_end_recorded_processes_never_signals_a_reused_pid(tmp_path):
    """A pid recorded with another start time is some other process now: it must survive."""
    import psutil
    ours, foreign = _sleeper(run_dir=tmp_path), _sleeper(run_dir=tmp_path)
    try:
        st = {"process_times": {str(ours.pid): psutil.Process(ours.pid).create_time(),
                                str(foreign.pid): psutil.Process(foreign.pid).create_time() - 50}}
        assert end_recorded_processes(st, tmp_path, grace=5) == [ours.pid]
        ours.wait(10)                 # ended (psutil reaped it, so its code is not ours to see)
        assert foreign.poll() is None
    finally:
        for p in (ours, foreign):
            p.kill()
            p.wait()


def test_end_recorded_processes_signals_only_the_runs_own_processes(tmp_path):
    """Issue 37: a pid and its real start time copied into run.json name a process of the user's that is not the
    run's (it does not carry this run directory in WIZARD_RUN_DIR, or carries another run's): never signalled."""
    import psutil
    other_run = tmp_path / "other"
    other_run.mkdir()
    ours, unrelated, elsewhere = _sleeper(run_dir=tmp_path), _sleeper(), _sleeper(run_dir=other_run)
    try:
        st = {"process_times": {str(p.pid): psutil.Process(p.pid).create_time() for p in (ours, unrelated, elsewhere)}}
        assert end_recorded_processes(st, tmp_path, grace=5) == [ours.pid]
        ours.wait(10)
        assert unrelated.poll() is None and elsewhere.poll() is None
    finally:
        for p in (ours, unrelated, elsewhere):
            p.kill()
            p.wait()


def test_end_recorded_processes_sigkills_what_ignores_sigterm_after_the_grace(tmp_path):
    import time

    import psutil
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE,
                                env=dict(os.environ, WIZARD_RUN_DIR=str(tmp_path)))
    try:
        stubborn.stdout.readline()
        st = {"process_times": {str(stubborn.pid): psutil.Process(stubborn.pid).create_time()}}
        t0 = time.monotonic()
        assert end_recorded_processes(st, tmp_path, grace=0.5) == [stubborn.pid]
        assert time.monotonic() - t0 >= 0.5
        assert stubborn.wait(timeout=5) == -9
    finally:
        stubborn.kill()
        stubborn.wait()


def test_mark_lost_ends_leftovers_writes_lost_and_an_event(tmp_path):
    import psutil
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours, foreign = _sleeper(session=True, run_dir=tmp_path), _sleeper(run_dir=tmp_path)
    try:
        st = _valid_state(supervisor_pid=dead.pid, supervisor_create_time=1.0,
                          tracked_pids=[ours.pid, foreign.pid],
                          process_times={str(ours.pid): psutil.Process(ours.pid).create_time(),
                                         str(foreign.pid): 2.0})
        (tmp_path / "run.json").write_text(json.dumps(st))
        new = mark_lost_if_dead(tmp_path, grace=5)
        assert new and new["status"] == "lost" and new["lost_cleaned"] == [ours.pid]
        assert read_state(tmp_path)["status"] == "lost" and read_state(tmp_path)["exit_code"] == 137
        ev = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert ev[-1]["type"] == "lost" and ev[-1]["cleaned"] == [ours.pid] and ev[-1]["t"] > 0
        ours.wait(10)
        assert foreign.poll() is None
        assert mark_lost_if_dead(tmp_path) is None            # once
    finally:
        for p in (ours, foreign):
            p.kill()
            p.wait()


def test_mark_lost_leaves_a_live_or_locked_or_garbage_run_alone(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(_valid_state()))        # we are the live supervisor: we hold
    fd = try_lock(tmp_path)                                               # the run's lock, as one does
    try:
        assert mark_lost_if_dead(tmp_path) is None and read_state(tmp_path)["status"] == "running"
    finally:
        os.close(fd)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.json").write_text(json.dumps(_valid_state(supervisor_pid=dead.pid)))
    fd = try_lock(tmp_path)                                               # someone holds the run's lock
    try:
        assert mark_lost_if_dead(tmp_path) is None and read_state(tmp_path)["status"] == "running"
    finally:
        os.close(fd)
    assert (tmp_path / LOCK_FILE).exists()
    (tmp_path / "run.json").write_text('{"status": "running", "supervisor_pid": null}')
    assert mark_lost_if_dead(tmp_path) is None
    assert (tmp_path / "run.json").read_text() == '{"status": "running", "supervisor_pid": null}'


def test_a_failed_parent_death_signal_is_logged_not_ignored(capsys):
    from launch.processes import prctl_pdeathsig, set_parent_death_signal
    set_parent_death_signal(999)               # no such signal: the kernel refuses with EINVAL
    assert "PR_SET_PDEATHSIG(999) failed: Invalid argument" in capsys.readouterr().err
    assert prctl_pdeathsig(0) is None          # and a valid one (0 clears it) takes, silently
    set_parent_death_signal(0)
    assert capsys.readouterr().err == ""
