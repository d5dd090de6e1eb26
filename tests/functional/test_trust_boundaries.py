"""Issue 37: another user on the box must not be able to kill the user's processes, or write the user's files,
through the launch. Each finding reproduced as the issue did: a second uid simulated with `setpriv --reuid` (these
tests skip, saying so, where that is not possible: not root, or no setpriv), real processes, a real launch.

The processes a test wants left alone are its own decoys, and only its own processes are ever killed in cleanup
(tests/README.md: the decoy pattern)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.launch_support import SIGNAL_NOTER, env, kill_verified, run_processes, state, wait_for

NOBODY = 65534


def wizard(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, env=env(), cwd=cwd,
                          timeout=timeout)


def needs_a_second_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("simulating another user takes root (setpriv --reuid)")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    """Python code run as another user (uid 65534), with an interpreter that user may run."""
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not python:
            continue
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python]
        if subprocess.run([*argv, "-c", "pass"], capture_output=True).returncode == 0:
            return subprocess.run([*argv, "-c", code, *args], capture_output=True, text=True, timeout=60,
                                  env={"PATH": "/usr/bin:/bin"})
    pytest.skip("no Python interpreter uid 65534 may run")


class Decoy:
    """An unrelated process of the user's that says which signals reach it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SIGNAL_NOTER], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid
        self.ctime = psutil.Process(self.pid).create_time()

    def untouched(self) -> bool:
        """Alive, and no signal reached it."""
        ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
        return self.proc.poll() is None and not ready

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def decoy():
    d = Decoy()
    yield d
    d.close()


@pytest.fixture
def reachable():
    """A directory the other user can reach (pytest's tmp_path lies under a 0700 directory of root's)."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="wizard-trust-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def forged_run(run_dir: Path, decoy: Decoy, **over) -> dict:
    """run.json as a forger writes it: a dead supervisor, and the decoy's pid with its real start time among the
    run's processes."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st = {"id": run_dir.name, "status": "running", "supervisor_pid": dead.pid, "supervisor_create_time": 1.0,
          "attempt": 1, "max_restarts": 0, "pids": {"0": decoy.pid}, "tracked_pids": [decoy.pid],
          "seen_pids": [decoy.pid], "process_times": {str(decoy.pid): decoy.ctime}, "launcher_pid": None,
          "progress": {}, "grace_s": 1}
    st.update(over)
    return st


# ------------------------------------------------------------------ finding 1: the supervisor's socket

WAITER = """import os, sys, time
print("ready", flush=True)
deadline = time.time() + 90
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.1)
print("done", flush=True)
"""

FORGE_RANK = """import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
try:
    s.sendall(("WIZARD-RANK 0 %s\\n" % sys.argv[2]).encode())
    s.sendall(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\\n")
except OSError:
    pass
print("sent", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_another_user_cannot_get_a_process_killed_or_a_run_failed_through_the_supervisor_socket(tmp_path, decoy):
    """Finding 1: a process of another uid that said `WIZARD-RANK 0 <an unrelated pid>` and a CUDA OOM line got
    that process killed when the run ended, turned a succeeded run into `failed (cuda_oom)` with exit 1, and wrote
    into rank 0's log. Now the kernel's credentials of the peer decide: refused, said once, nothing else changes."""
    needs_a_second_user()
    script, go = tmp_path / "wait.py", tmp_path / "go"
    script.write_text(WAITER)
    cfg = tmp_path / "single.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
                   "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\n")
    run_dir = tmp_path / "run"
    launch = subprocess.Popen([sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg),
                               "--run-dir", str(run_dir), "--", str(script), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=tmp_path)
    try:
        st = wait_for(lambda: (lambda s: s if s.get("status") == "running" and s.get("pids") else None)(state(run_dir)),
                      120)
        assert st, state(run_dir)
        socket_name = f"wizard-launch-{st['supervisor_pid']}-{run_dir.name}"[:100]
        forged = as_nobody(FORGE_RANK, socket_name, str(decoy.pid))
        assert "sent" in forged.stdout, forged.stderr
        time.sleep(1.0)
        go.write_text("")
        out, _ = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
        kill_verified(run_processes(state(run_dir)))
    final = state(run_dir)
    assert launch.returncode == 0 and final["status"] == "succeeded" and final["classification"] is None, out
    assert decoy.untouched(), "the decoy received a signal"
    assert str(decoy.pid) not in final["process_times"] and decoy.pid not in final["seen_pids"]
    assert "CUDA out of memory" not in (run_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    refused = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()
               if json.loads(x)["type"] == "refused"]
    assert len(refused) == 1 and f"runs as uid {NOBODY}" in refused[0]["message"], refused
    assert "refused a connection to the run's socket" in out


# ------------------------------------------------------------------ finding 3: a forged run.json


@pytest.mark.timeout(120)
def test_another_user_who_can_write_the_run_directory_cannot_get_stop_to_kill_a_process(tmp_path, reachable, decoy):
    """Finding 3: with write access to a run directory (a group-writable wizard-runs/), another user set the run's
    processes to a process of the user's, with its real start time, and `wizard stop` SIGTERMed it ("ended 1
    leftover processes"). A run directory others can write, or someone else's, is not acted on: exit 2, one line."""
    needs_a_second_user()
    shared = reachable / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                     # a directory every user may write, the user's own
    body = json.dumps(forged_run(shared, decoy))
    write = "import sys; open(sys.argv[1] + '/run.json', 'w').write(sys.argv[2])"
    assert as_nobody(write, str(shared), body).returncode == 0
    theirs = reachable / "theirs"               # a run directory of the other user's own, forged the same way
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    assert as_nobody(write, str(theirs), body).returncode == 0
    for run_dir, says in ((shared, "writable by its group and every user"), (theirs, f"belongs to uid {NOBODY}")):
        for args in (["stop", str(run_dir)], ["stop", "--kill", str(run_dir)], ["attach", "--no-follow", str(run_dir)]):
            r = wizard(*args, cwd=tmp_path)
            assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert json.loads((run_dir / "run.json").read_text())["status"] == "running"     # never written
    assert decoy.untouched()


@pytest.mark.timeout(120)
def test_stop_signals_only_the_runs_own_processes_whatever_run_json_names(tmp_path, decoy):
    """Finding 3, in a run directory of the user's own: pids and real start times copied into run.json (as a
    dead supervisor's processes, or as the supervisor itself) name a process that is not the run's. `stop` records
    the run lost and signals nothing: the run's processes carry its directory in WIZARD_RUN_DIR, its supervisor
    holds its lock."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(forged_run(run_dir, decoy)))
    r = wizard("stop", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0 and "ended 0 leftover processes; marked lost" in r.stdout, r.stdout + r.stderr
    as_supervisor = tmp_path / "run2"
    as_supervisor.mkdir()
    (as_supervisor / "run.json").write_text(json.dumps(forged_run(as_supervisor, decoy, supervisor_pid=decoy.pid,
                                                                  supervisor_create_time=decoy.ctime)))
    for args in (["stop", "--kill", "--timeout", "2", str(as_supervisor)], ["stop", str(as_supervisor)]):
        r = wizard(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    assert state(as_supervisor)["status"] == "lost" and state(as_supervisor)["lost_cleaned"] == []
    assert decoy.untouched()


# ------------------------------------------------------------------ finding 4: symlinks in a run directory


@pytest.mark.timeout(120)
def test_attach_writes_nothing_through_symlinks_planted_in_a_run_directory(tmp_path, decoy):
    """Finding 4: with events.jsonl and run.lock as symlinks, `wizard attach --no-follow` appended a JSON line to
    the linked ~/.bashrc and created the other target."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    st = forged_run(run_dir, decoy)
    st["process_times"] = {}
    (run_dir / "run.json").write_text(json.dumps(st))
    bashrc, elsewhere = tmp_path / "bashrc", tmp_path / "created-elsewhere"
    bashrc.write_text("# the user's own\n")
    (run_dir / "events.jsonl").symlink_to(bashrc)
    (run_dir / "run.lock").symlink_to(elsewhere)
    r = wizard("attach", "--no-follow", str(run_dir), cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert bashrc.read_text() == "# the user's own\n" and not elsewhere.exists()
    (run_dir / "run.lock").unlink()             # the lock free, only events.jsonl a link: still not written through
    r = wizard("attach", "--no-follow", str(run_dir), cwd=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert bashrc.read_text() == "# the user's own\n"
