"""Issue 37, the run directory's side (launch/trust.py, launch/rundir.py): run directories are private, files
inside are never opened through a symlink or a hard link, `wizard runs` writes nothing, and only a process that is
the run's own is ever signalled. A second user is simulated with setpriv where the test needs one (root only)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest

from launch import trust
from launch.rundir import (
    LOCK_FILE,
    EventLog,
    RotatingLog,
    create_run_dir,
    lock_is_free,
    try_lock,
)

NOBODY = 65534


def needs_a_second_user():
    if os.geteuid() != 0:
        pytest.skip("simulating another user takes root (setpriv --reuid)")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")


# ----------------------------------------------------------------------------- private directories and files


def test_run_directories_and_a_new_runs_root_are_created_0700(tmp_path):
    """Finding 8: they followed the umask (0755), so every user read each run's command line and rank logs."""
    old = os.umask(0o022)
    try:
        run_dir, fd = create_run_dir(root=tmp_path / "wizard-runs")
        os.close(fd)
        given, fd = create_run_dir(tmp_path / "given")
        os.close(fd)
    finally:
        os.umask(old)
    for d in (run_dir, run_dir.parent, run_dir / "logs", given):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert stat.S_IMODE(os.stat(run_dir / LOCK_FILE).st_mode) == 0o600


def test_a_given_run_dir_of_another_user_is_refused_and_an_empty_one_of_ours_made_private(tmp_path):
    from wizard.errors import InputError
    ours = tmp_path / "ours"
    ours.mkdir()
    os.chmod(ours, 0o775)
    run_dir, fd = create_run_dir(ours)
    os.close(fd)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, NOBODY, NOBODY)
        with pytest.raises(InputError, match=f"belongs to uid {NOBODY}"):
            create_run_dir(theirs)
        assert list(theirs.iterdir()) == []              # nothing written there, not even a lock


def test_appends_never_go_through_a_symlink_or_a_hard_link(tmp_path):
    """Finding 4: events.jsonl was opened for append following symlinks (`wizard attach` appended a JSON line to the
    linked ~/.bashrc). A link to another file of the user's is refused too, and nothing is written there."""
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("# mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").symlink_to(bashrc)
    with pytest.raises(OSError):
        EventLog(run / "events.jsonl").emit("lost", 1)
    (run / "events.jsonl").unlink()
    os.link(bashrc, run / "events.jsonl")
    with pytest.raises(trust.Untrusted, match="hard links"):
        EventLog(run / "events.jsonl").emit("lost", 1)
    (run / "rank-0.log").symlink_to(bashrc)
    with pytest.raises(OSError):
        RotatingLog(run / "rank-0.log")
    assert bashrc.read_text() == "# mine\n"


def test_the_lock_is_never_created_through_a_symlink_and_runs_creates_no_lock(tmp_path):
    """Finding 4 (run.lock opened with O_CREAT, following a symlink) and issue 42 #5 (`wizard runs` created an empty
    run.lock): the lock is taken without following links, and whether it is free is found without writing."""
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "created-elsewhere"
    (run / LOCK_FILE).symlink_to(target)
    with pytest.raises(OSError):
        try_lock(run)
    assert not target.exists() and not lock_is_free(run)        # a planted link proves nothing either way
    (run / LOCK_FILE).unlink()
    assert lock_is_free(run) and not (run / LOCK_FILE).exists()  # nothing written
    fd = try_lock(run)
    try:
        assert not lock_is_free(run)
    finally:
        os.close(fd)
    assert lock_is_free(run)


def test_a_fifo_in_place_of_run_json_does_not_hang_a_reader(tmp_path):
    from launch.rundir import read_state
    os.mkfifo(tmp_path / "run.json")
    start = time.monotonic()
    assert read_state(tmp_path) is None and time.monotonic() - start < 2


def test_a_directory_writable_by_others_or_owned_by_another_user_is_not_acted_on(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o775)
    assert "writable by its group" in trust.run_dir_problem(d)
    os.chmod(d, 0o757)
    assert "writable by every user" in trust.run_dir_problem(d)
    os.chmod(d, 0o755)
    assert trust.run_dir_problem(d) is None
    if os.geteuid() == 0:
        os.chown(d, NOBODY, NOBODY)
        assert f"belongs to uid {NOBODY}" in trust.run_dir_problem(d)


# ----------------------------------------------------------------------------- whose process


def _process(env_run_dir=None, user=None):
    env = dict(os.environ)
    env.pop(trust.RUN_DIR_ENV, None)
    if env_run_dir is not None:
        env[trust.RUN_DIR_ENV] = str(env_run_dir)
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    python = sys.executable if user is None else _python_for(user)
    return subprocess.Popen([*prefix, python, "-c", "import time; time.sleep(60)"], env=env)



def _python_for(uid):
    """An interpreter another user may run (this one may live under /root)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                         candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    pytest.skip(f"no Python interpreter uid {uid} may run")


def test_a_process_is_the_runs_only_with_its_start_time_its_owner_and_the_run_dir_in_its_environment(tmp_path):
    import psutil
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    procs = {"ours": _process(run), "unrelated": _process(), "elsewhere": _process(other)}
    try:
        time.sleep(0.3)
        ctime = {k: psutil.Process(p.pid).create_time() for k, p in procs.items()}
        assert trust.process_of_run(procs["ours"].pid, ctime["ours"], run) is not None
        assert trust.process_of_run(procs["ours"].pid, ctime["ours"] - 5, run) is None      # a reused pid
        assert trust.process_of_run(procs["unrelated"].pid, ctime["unrelated"], run) is None
        assert trust.process_of_run(procs["elsewhere"].pid, ctime["elsewhere"], run) is None
        # the supervisor is the process that holds the run's lock open
        assert trust.process_of_run(os.getpid(), psutil.Process().create_time(), run, supervisor=True) is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_another_users_process_is_never_the_runs(tmp_path):
    needs_a_second_user()
    import psutil
    run = tmp_path / "run"
    run.mkdir()
    theirs = _process(run, user=NOBODY)
    try:
        time.sleep(0.3)
        assert psutil.Process(theirs.pid).uids().real == NOBODY
        assert trust.process_of_run(theirs.pid, psutil.Process(theirs.pid).create_time(), run) is None
    finally:
        theirs.kill()
        theirs.wait()


CONNECT = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); "
           "s.connect(sys.argv[1].replace('@', chr(0), 1)); time.sleep(3)")


@pytest.fixture
def listener():
    """An abstract unix socket, as the supervisor's: (the socket, its address)."""
    name = f"wizard-test-{os.getpid()}-{time.monotonic_ns()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    s.listen(4)
    s.settimeout(10)
    yield s, "@" + name
    s.close()


def _connect_from(listener, user=None):
    """(the accepted connection, the connecting process)."""
    s, address = listener
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    python = sys.executable if user is None else _python_for(user)
    proc = subprocess.Popen([*prefix, python, "-c", CONNECT, address])
    return s.accept()[0], proc


def test_the_supervisor_socket_takes_only_descendants_of_the_launcher(listener):
    """Finding 1's check on a real socket: the kernel's credentials of the peer decide, not what it says. A process of
    the user's that is not under this attempt's launcher (here: the launcher is another process) is refused."""
    conn, child = _connect_from(listener)
    other = _process()
    try:
        pid, why = trust.peer_problem(conn, os.getpid())         # our child: under "the launcher" (this process)
        assert pid == child.pid and why is None
        pid, why = trust.peer_problem(conn, other.pid)
        assert pid == child.pid and "not a process of this attempt" in why
    finally:
        conn.close()
        for p in (child, other):
            p.kill()
            p.wait()


def test_the_supervisor_socket_refuses_another_user(listener):
    needs_a_second_user()
    conn, theirs = _connect_from(listener, NOBODY)
    try:
        pid, why = trust.peer_problem(conn, os.getpid())
        assert pid == theirs.pid and f"runs as uid {NOBODY}" in why
    finally:
        conn.close()
        theirs.kill()
        theirs.wait()


def test_reading_run_json_refuses_a_symlink_and_another_users_file(tmp_path):
    from launch.rundir import load_record
    from wizard.errors import InputError
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"status": "running", "supervisor_pid": 4321, "supervisor_create_time": 1.0}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").symlink_to(real)
    with pytest.raises(InputError, match="RUN_DIR"):
        load_record(run)
