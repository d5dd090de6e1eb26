"""launch._reaper: what it skips, what it ends, and the `lost` it records when the supervisor dies
(the end-to-end cases are in functional/test_launch_trust.py, marked slow).

Every process these tests could signal is one they started: a pid the reaper must leave alone is our
own decoy recorded with a deliberately wrong start time, never a stranger's pid (pid 1 in an older
version: a reaper that lost its start-time check then signalled every process on the machine)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from launch._reaper import reap

REPO = Path(__file__).resolve().parents[2]
IGNORES_SIGTERM = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
# a process with a child of its own, in a session of its own (as torchrun's ranks are); prints the child's pid
WITH_CHILD = ("import subprocess,sys,time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
              "start_new_session=True); print(c.pid, flush=True); time.sleep(60)")


def _kill(*procs) -> None:
    for p in procs:
        try:
            p.kill()
        except (OSError, psutil.Error):
            pass


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_reap_skips_odd_gone_and_reused_entries_and_still_kills_the_tracked_process():
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    # our own decoy, with a child, recorded with another start time: a "recycled pid" that must never be hit
    decoy = subprocess.Popen([sys.executable, "-c", WITH_CHILD], stdout=subprocess.PIPE)
    decoy_child = None
    try:
        stubborn.stdout.readline()                  # SIGTERM is ignored from here on
        decoy_child = psutil.Process(int(decoy.stdout.readline()))
        created = psutil.Process(stubborn.pid).create_time()
        # a pid no process can have (above the kernel's pid_max), rather than a dead child's pid that the
        # kernel may hand to a stranger meanwhile
        no_such = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
        started = time.monotonic()
        # a negative pid (psutil: ValueError), a pid that is gone (NoSuchProcess), a pid with another
        # create time (a recycled pid: never hit, nor its children), then the real one
        ended = reap({-5: 1.0, no_such: 1.0, decoy.pid: psutil.Process(decoy.pid).create_time() - 30,
                      stubborn.pid: created}, grace=0.5)
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.5    # SIGTERM first, SIGKILL after the grace
        assert ended == [stubborn.pid]
        assert decoy.poll() is None and decoy_child.is_running()
    finally:
        _kill(stubborn, decoy, decoy_child)


def test_reap_ends_the_descendants_of_a_tracked_process_it_was_never_told_about():
    parent = subprocess.Popen([sys.executable, "-c", WITH_CHILD], stdout=subprocess.PIPE)
    child = None
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        ended = reap({parent.pid: psutil.Process(parent.pid).create_time()}, grace=2)
        assert sorted(ended) == sorted([parent.pid, child.pid])
        parent.wait(5)
        assert _gone(child.pid), "the tracked process's child (in its own session) outlived the reap"
    finally:
        _kill(parent, child)


# A stand-in for the supervisor: writes run.json as the supervisor does (its own pid and start time),
# starts the reaper on a pipe exactly as Supervisor._start_reaper does, tells it about one worker
# (a child in a session of its own that ignores SIGTERM, as a rank may), then waits to be SIGKILLed.
FAKE_SUPERVISOR = r"""
import json, os, subprocess, sys, time
import psutil
run_dir, repo = sys.argv[1], sys.argv[2]
me = psutil.Process()
st = {"id": "r", "status": "running", "supervisor_pid": me.pid, "supervisor_create_time": me.create_time(),
      "attempt": 1, "max_restarts": 0, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
      "launcher_pid": None, "progress": {}}
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"], start_new_session=True)
ctime = psutil.Process(worker.pid).create_time()
st["process_times"][str(worker.pid)] = ctime
st["tracked_pids"] = [worker.pid]
open(os.path.join(run_dir, "run.json"), "w").write(json.dumps(st))
reaper = subprocess.Popen([sys.executable, "-m", "launch._reaper", run_dir], stdin=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=repo)
reaper.stdin.write(f"{worker.pid} {ctime}\n".encode())
reaper.stdin.flush()
print(worker.pid, reaper.pid, flush=True)
time.sleep(600)
"""


def test_the_reaper_records_lost_within_5_s_of_the_supervisors_sigkill_with_no_reader(tmp_path):
    from launch.rundir import read_jsonl, read_state
    sup = subprocess.Popen([sys.executable, "-c", FAKE_SUPERVISOR, str(tmp_path), str(REPO)],
                           stdout=subprocess.PIPE, text=True, cwd=REPO)
    worker = reaper = None
    try:
        wpid, rpid = map(int, sup.stdout.readline().split())
        worker, reaper = psutil.Process(wpid), psutil.Process(rpid)
        time.sleep(0.3)                        # the reaper has read the worker's line
        sup.kill()
        killed_at = time.time()
        t0 = time.monotonic()
        sup.wait(5)
        st = {}
        while time.monotonic() - t0 < 10:
            st = read_state(tmp_path) or {}
            if st.get("status") == "lost":
                break
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert st.get("status") == "lost" and took <= 5.0, (st, took)
        assert st["lost_by"] == "reaper" and st["exit_code"] == 137
        assert f"pid {sup.pid}" in st["lost_cause"] and "SIGKILL" in st["lost_cause"], st["lost_cause"]
        assert killed_at - 1 <= st["lost_at"] <= killed_at + 5 and st["ended_at"] == st["lost_at"]
        assert st["lost_cleaned"] == [wpid]
        ev = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["type"] == "lost"]
        assert len(ev) == 1 and ev[0]["by"] == "reaper" and ev[0]["cleaned"] == [wpid] and ev[0]["cause"]
        # the worker ignores SIGTERM: the reaper's SIGKILL after its grace ends it
        deadline = time.monotonic() + 10
        while not _gone(wpid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(wpid)
        reaper.wait(10)
        assert json.loads((tmp_path / "run.json").read_text())["status"] == "lost"
    finally:
        _kill(sup, worker, reaper)


def test_a_supervisor_that_ends_its_run_and_says_done_is_not_recorded_lost(tmp_path):
    """"done" on the pipe, then EOF: the reaper leaves run.json and the processes it was told about alone."""
    from launch.rundir import read_state
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        st = {"id": "r", "status": "running", "supervisor_pid": dead.pid, "supervisor_create_time": 1.0,
              "attempt": 1, "max_restarts": 0, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
              "launcher_pid": None, "progress": {}}
        (tmp_path / "run.json").write_text(json.dumps(st))
        line = f"{sleeper.pid} {psutil.Process(sleeper.pid).create_time()}\ndone\n"
        r = subprocess.run([sys.executable, "-m", "launch._reaper", str(tmp_path)], input=line.encode(),
                           cwd=REPO, timeout=30)
        assert r.returncode == 0
        assert read_state(tmp_path)["status"] == "running" and sleeper.poll() is None
    finally:
        _kill(sleeper)
