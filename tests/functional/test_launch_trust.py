"""Issue 11: a run's state is always the truth, foreground means foreground, `stop` never touches
another process, one run per directory, every option checked. Real processes, no mocks: a cheap
script (no torch) under the real `accelerate launch`, and fabricated run.json files only where the
point is what a client does with what it reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.launch_support import (
    SIGNAL_NOTER,
    alive,
    env,
    kill_verified,
    run_pids,
    run_processes,
    start_time,
    state,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]




def wizard_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "wizard", *args]


def wizard(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(wizard_argv(*args), capture_output=True, text=True, env=env(), cwd=cwd, timeout=timeout)


def single_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "single.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
                   "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\n")
    return cfg


def ddp_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "ddp2.yaml"
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
        "num_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\ngpu_ids: all\n"
        "main_process_port: 0\nrdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
    return cfg


TICKER = """import sys, time
print("ticking", flush=True)
for i in range(100000):
    print(f"tick {i}", flush=True)
    time.sleep(0.3)
"""

# a process of the run that ignores SIGTERM and sits in a session of its own (torchrun's ranks do
# both): only a SIGKILL from whoever tracked it ends it; its pid goes to a file
STUBBORN = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
print("spawned", child.pid, flush=True)
time.sleep(float(sys.argv[2]))
"""


def events(run_dir: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    except OSError:
        return []








def cleanup(run_dir: Path, extra: dict[int, float | None] | None = None) -> None:
    """SIGKILL what is left of the run (pids verified by their recorded start times) and the test's own
    `extra` processes ({pid: start time}), never a pid that another process may have been given since."""
    kill_verified({**run_processes(state(run_dir)), **(extra or {})})


def running_with_ranks(run_dir: Path, n: int):
    st = state(run_dir)
    return st if st.get("status") == "running" and len(st.get("pids") or {}) >= n else None


def sleeper(**kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **kw)


def fabricated_run(run_dir: Path, **over) -> dict:
    """A run.json as the supervisor writes it, for a supervisor that is gone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir.mkdir(parents=True, exist_ok=True)
    st = {"id": run_dir.name, "status": "running", "supervisor_pid": dead.pid, "supervisor_create_time": 1.0,
          "attempt": 1, "max_restarts": 0, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
          "launcher_pid": None, "progress": {}, "grace_s": 2}
    st.update(over)
    (run_dir / "run.json").write_text(json.dumps(st))
    return st


# ------------------------------------------------------------------ no input is trusted blindly

@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags,field", [
    (["--stall-timeout", "nan"], "--stall-timeout"), (["--grace", "nan"], "--grace"),
    (["--grace", "inf"], "--grace"), (["--metrics-interval", "-1"], "--metrics-interval"),
    (["--main-process-port", "99999"], "--main-process-port"), (["--status-interval", "0"], "--status-interval"),
    (["--log-cap-mb", "nan"], "--log-cap-mb"), (["--emit-slurm", "0"], "--emit-slurm"),
])
def test_every_numeric_option_is_finite_and_in_range(tmp_path, flags, field):
    r = wizard("launch", "--headless", *flags, "--", "x.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"wizard: {field}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "wizard-runs").exists()


@pytest.mark.timeout(300)
def test_a_run_dir_that_is_a_file_and_a_broken_config_are_exit_2_before_accelerate(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    f = tmp_path / "afile"
    f.write_text("x")
    r = wizard("launch", "--headless", "--run-dir", str(f), "--", str(script), cwd=tmp_path)
    assert r.returncode == 2 and "--run-dir" in r.stderr and "not a directory" in r.stderr
    assert "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: [MULTI_GPU\nnum_processes: 2\n")
    r = wizard("launch", "--headless", "--config-file", str(bad), "--run-dir", str(tmp_path / "run"), "--",
               str(script), cwd=tmp_path)
    assert r.returncode == 2 and "not valid YAML" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "run").exists()           # accelerate never started; nothing written
    # a readable config `wizard check` finds an error in: its one-line finding
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
                     "num_processes: 2\ngpu_ids: all\nno_such_key: 1\n")
    r = wizard("launch", "--headless", "--config-file", str(wrong), "--", str(script), cwd=tmp_path)
    assert r.returncode == 2 and "ACC-UNKNOWN-KEY" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("body", ["{not json", '{"status": "running", "supervisor_pid": 1}',
                                  "TRACKED_ABC", '{"status": null}'])
def test_garbage_run_json_is_exit_2_and_never_overwritten(tmp_path, body):
    d = tmp_path / "run"
    if body == "TRACKED_ABC":
        fabricated_run(d, tracked_pids=["abc"])
    else:
        d.mkdir()
        (d / "run.json").write_text(body)
    before = (d / "run.json").read_text()
    for args in (["attach", str(d)], ["attach", "--no-follow", str(d)], ["stop", str(d)],
                 ["stop", "--no-wait", str(d)], ["stop", "--kill", str(d)]):
        r = wizard(*args, cwd=tmp_path)
        assert r.returncode == 2 and "RUN_DIR" in r.stderr and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and "status None" not in r.stdout
    assert (d / "run.json").read_text() == before


# ------------------------------------------------------------------ stop never signals a foreign pid

DUMMY = SIGNAL_NOTER


@pytest.mark.timeout(120)
def test_stop_signals_no_foreign_pid_when_pids_were_reused(tmp_path):
    """The run's pids now belong to unrelated processes (same pid, another start time): `stop`
    declares the run lost and signals none of them; `stop --kill` with the supervisor's pid reused
    sends it nothing either."""
    foreign = subprocess.Popen([sys.executable, "-c", DUMMY], stdout=subprocess.PIPE, text=True)
    try:
        assert foreign.stdout.readline().strip() == "ready"
        ctime = psutil.Process(foreign.pid).create_time()
        d = tmp_path / "run"
        fabricated_run(d, tracked_pids=[foreign.pid], pids={"0": foreign.pid}, launcher_pid=foreign.pid,
                       seen_pids=[foreign.pid], process_times={str(foreign.pid): ctime - 30})
        r = wizard("stop", str(d), cwd=tmp_path)
        assert r.returncode == 0 and "marked lost" in r.stdout and "ended 0 leftover" in r.stdout, r.stdout + r.stderr
        assert state(d)["status"] == "lost" and state(d)["lost_cleaned"] == []
        # supervisor_pid is now an unrelated live process (the recorded start time is another's)
        d2 = tmp_path / "run2"
        fabricated_run(d2, supervisor_pid=foreign.pid, supervisor_create_time=ctime - 30)
        r = wizard("stop", "--kill", "--timeout", "2", str(d2), cwd=tmp_path)
        assert r.returncode == 0 and "lost" in r.stdout, r.stdout + r.stderr
        time.sleep(0.5)
        import select
        ready, _, _ = select.select([foreign.stdout], [], [], 0.5)
        assert not ready, foreign.stdout.readline()          # it received no signal at all
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()


# ------------------------------------------------------------------ one run per directory

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_launches_into_one_dir_give_one_run_and_one_exit_2(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import time\nprint('only once', flush=True)\ntime.sleep(2)\n")
    run_dir = tmp_path / "shared"
    argv = wizard_argv("launch", "--headless", "--config-file", str(single_config(tmp_path)),
                       "--run-dir", str(run_dir), "--", str(script))
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                              cwd=tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = outs[[p.returncode for p in procs].index(2)]
    assert "--run-dir" in loser[1] and len(loser[1].splitlines()) == 1, loser
    assert (run_dir / "logs" / "attempt-1" / "rank-0.log").read_text().count("only once") == 1
    running = [e for e in events(run_dir) if e["type"] == "status" and e.get("status") == "running"]
    assert len(running) == 1


# ------------------------------------------------------------------ LOST, foreground, reaper, leftovers

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_supervisor_sigkill_shows_lost_in_attach_within_5_s(tmp_path):
    script = tmp_path / "tick.py"
    script.write_text(TICKER)
    run_dir = tmp_path / "run"
    r = wizard("launch", "--detach", "--config-file", str(single_config(tmp_path)), "--run-dir", str(run_dir),
               "--", str(script), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    st = wait_for(lambda: running_with_ranks(run_dir, 1), 120)
    attach = None
    try:
        assert st, state(run_dir)
        attach = subprocess.Popen(wizard_argv("attach", "--status-interval", "1", str(run_dir)),
                                  stdout=subprocess.PIPE, text=True, env=env(), cwd=tmp_path)
        assert "status running" in attach.stdout.readline()
        time.sleep(1.0)
        pids = run_pids(state(run_dir))
        kill_verified({st["supervisor_pid"]: st["supervisor_create_time"]})
        t0 = time.monotonic()
        seen = ""
        while "status lost" not in seen and time.monotonic() - t0 < 15:
            seen = attach.stdout.readline()
        took = time.monotonic() - t0
        assert "status lost" in seen and took <= 5.0, (seen, took)
        assert attach.wait(10) == 0
        final = state(run_dir)
        assert final["status"] == "lost" and final["exit_code"] == 137
        lost = [e for e in events(run_dir) if e["type"] == "lost"]
        assert len(lost) == 1 and lost[0]["supervisor_pid"] == st["supervisor_pid"] and "cleaned" in lost[0]
        assert wait_for(lambda: not alive(pids), 10), alive(pids)
        s = wizard("stop", str(run_dir), cwd=tmp_path)
        assert s.returncode == 0 and "already lost" in s.stdout
    finally:
        if attach and attach.poll() is None:
            attach.kill()
        cleanup(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_supervisor_sigkill_is_recorded_lost_within_5_s_with_no_reader(tmp_path):
    """No attach, no stop, no view: only what survives the supervisor (its reaper) can write `lost`.
    run.json is read here as a script or a SLURM epilogue would, by opening the file."""
    script = tmp_path / "tick.py"
    script.write_text(TICKER)
    run_dir = tmp_path / "run"
    r = wizard("launch", "--detach", "--config-file", str(single_config(tmp_path)), "--run-dir", str(run_dir),
               "--", str(script), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    st = wait_for(lambda: running_with_ranks(run_dir, 1), 120)
    try:
        assert st, state(run_dir)
        time.sleep(1.0)
        pids = run_pids(state(run_dir))
        kill_verified({st["supervisor_pid"]: st["supervisor_create_time"]})
        killed_at = time.time()
        t0 = time.monotonic()
        final = wait_for(lambda: (lambda s: s if s.get("status") == "lost" else None)(state(run_dir)), 15, every=0.05)
        took = time.monotonic() - t0
        assert final and took <= 5.0, (took, state(run_dir))
        assert final["lost_by"] == "reaper" and "SIGKILL" in final["lost_cause"] and final["exit_code"] == 137
        assert killed_at - 1 <= final["lost_at"] <= killed_at + 5
        lost = [e for e in events(run_dir) if e["type"] == "lost"]
        assert len(lost) == 1 and lost[0]["by"] == "reaper" and lost[0]["cause"] == final["lost_cause"]
        assert set(final["lost_cleaned"]) & pids
        assert wait_for(lambda: not alive(pids), 10), alive(pids)
        # `wizard runs` shows it, and `stop` finds nothing left to do
        runs = wizard("runs", str(tmp_path), cwd=tmp_path)
        assert runs.returncode == 0 and "lost" in runs.stdout.splitlines()[1], runs.stdout
        s = wizard("stop", str(run_dir), cwd=tmp_path)
        assert s.returncode == 0 and "already lost" in s.stdout
    finally:
        cleanup(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sighup_of_a_foreground_run_ends_it_with_nothing_left(tmp_path):
    script = tmp_path / "tick.py"
    script.write_text(TICKER)
    run_dir = tmp_path / "run"
    # the terminal: `wizard launch` in a session of its own, hung up the way a closed terminal does
    p = subprocess.Popen(wizard_argv("launch", "--headless", "--quiet-ranks", "--grace", "5", "--config-file",
                                     str(ddp_config(tmp_path)), "--run-dir", str(run_dir), "--", str(script)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=tmp_path,
                         start_new_session=True)
    try:
        st = wait_for(lambda: running_with_ranks(run_dir, 2), 180)
        assert st, state(run_dir)
        time.sleep(1.0)
        pids = run_pids(state(run_dir))
        assert len(alive(pids)) >= 3
        os.killpg(p.pid, signal.SIGHUP)
        assert p.wait(60) == 130
        assert state(run_dir)["status"] == "stopped"
        assert not alive(pids | run_pids(state(run_dir)))
    finally:
        if p.poll() is None:
            p.kill()
        cleanup(run_dir)


FOREGROUND_PARENT = """import sys, time
from pathlib import Path
from launch.commands import _wait_started, spawn_foreground
from launch.rundir import create_run_dir
from launch.spec import LaunchSpec
run_dir, fd = create_run_dir(sys.argv[1])
spec = LaunchSpec(script=sys.argv[2], config_file=sys.argv[3], run_dir=str(run_dir), grace=3, headless=False)
spawn_foreground(spec, fd)
_wait_started(run_dir)
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("under_nohup", [False, True], ids=["sighup-default", "sighup-ignored-nohup"])
def test_killing_the_launch_the_user_started_ends_a_foreground_run(tmp_path, under_nohup):
    """The view's process (here a stand-in that starts the supervisor exactly as `wizard launch`
    does without --detach) is SIGKILLed: the run stops, nothing of it is left. Under nohup too,
    where SIGHUP is ignored from the start and the supervisor inherits that."""
    script = tmp_path / "tick.py"
    script.write_text(TICKER)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-c", FOREGROUND_PARENT, str(run_dir), str(script), str(single_config(tmp_path))]
    parent = subprocess.Popen((["nohup"] if under_nohup else []) + argv, stdout=subprocess.PIPE, text=True,
                              env=env(), cwd=tmp_path)
    st = {}
    try:
        assert parent.stdout.readline().strip() == "started"
        st = wait_for(lambda: running_with_ranks(run_dir, 1), 120)
        assert st and st["detached"] is False, state(run_dir)
        ignored = _sighup_ignored(st["supervisor_pid"])
        assert ignored is under_nohup          # the supervisor really inherited nohup's "ignore"
        time.sleep(1.0)
        pids = run_pids(state(run_dir)) | {st["supervisor_pid"]}
        parent.kill()
        parent.wait(10)
        final = wait_for(lambda: (lambda s: s if s.get("status") == "stopped" else None)(state(run_dir)), 30)
        assert final and final["exit_code"] == 130, state(run_dir)
        assert any(e["type"] == "stop" for e in events(run_dir))
        assert wait_for(lambda: not alive(pids), 15), alive(pids)
    finally:
        if parent.poll() is None:
            parent.kill()
        cleanup(run_dir)


def _sighup_ignored(pid: int) -> bool:
    """Whether SIGHUP is ignored in process pid (SigIgn of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)
    raise AssertionError("no SigIgn line")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_reaper_alone_ends_a_worker_that_ignores_sigterm_in_its_own_session(tmp_path):
    """Supervisor and `accelerate launch` both SIGKILLed (the OOM killer's way); the worker is in a session of
    its own, ignores SIGTERM and has no parent-death signal (it is not a rank): only the reaper's SIGKILL after
    its grace ends it. No client looks at the run, so nobody else could. The launcher dies first, with the
    supervisor frozen (SIGSTOP) so that neither its leftover teardown nor accelerate's own process-tree cleanup
    (accelerate >= 1.16 ends its tree on SIGTERM, the launcher's parent-death signal) can do the reaper's work."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pidfile = tmp_path / "child.pid"
    run_dir = tmp_path / "run"
    sup = subprocess.Popen(wizard_argv("launch", "--headless", "--quiet-ranks", "--config-file",
                                       str(single_config(tmp_path)), "--run-dir", str(run_dir), "--", str(script),
                                       str(pidfile), "600"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=tmp_path)
    child = child_started = None
    try:
        child = wait_for(lambda: pidfile.exists() and pidfile.read_text() and int(pidfile.read_text()), 120)
        assert child
        child_started = start_time(child)             # the run's own child: it ignores SIGTERM and sleeps
        assert wait_for(lambda: str(child) in (state(run_dir).get("process_times") or {}), 10)
        time.sleep(0.5)
        launcher = state(run_dir).get("launcher_pid")
        assert launcher and alive([launcher])
        sup.send_signal(signal.SIGSTOP)
        kill_verified({launcher: run_processes(state(run_dir)).get(launcher) or start_time(launcher)})
        assert wait_for(lambda: not alive([launcher]), 10)
        assert alive([child]), "nothing but the reaper may end the worker in this test"
        sup.kill()
        sup.wait(10)
        assert wait_for(lambda: not alive([child]), 15), "the stubborn worker outlived the supervisor"
    finally:
        if sup.poll() is None:
            sup.kill()
        cleanup(run_dir, {child: child_started} if child else None)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_leftovers_after_the_launcher_exits_are_ended_with_sigkill(tmp_path):
    """The script exits 0 but leaves a SIGTERM-ignoring process behind: the supervisor's teardown
    of leftovers ends it (SIGTERM, then SIGKILL after --grace) before it reports the run."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pidfile = tmp_path / "child.pid"
    run_dir = tmp_path / "run"
    r = wizard("launch", "--headless", "--grace", "1", "--config-file", str(single_config(tmp_path)),
               "--run-dir", str(run_dir), "--", str(script), str(pidfile), "2", cwd=tmp_path, timeout=200)
    child = int(pidfile.read_text())
    try:
        assert r.returncode == 0, r.stdout[-3000:]
        assert not alive([child])        # gone: nothing to clean up, and its pid may be another's by now
        stops = [e for e in events(run_dir) if e["type"] == "stop"]
        assert stops and "left after the launcher exited" in stops[0]["reason"]
        assert "grace period over: SIGKILL" in r.stdout
    finally:
        cleanup(run_dir)
