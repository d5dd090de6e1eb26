"""What the real-process launch tests share: the child environment, polling, and which of a run's pids live."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
NO_BITSANDBYTES = Path(__file__).resolve().parent / "no_bitsandbytes"   # its sitecustomize: why, there


# A process that says which signals reach it ("ready" first, then the name of each SIGTERM, SIGUSR1, SIGUSR2 or
# SIGINT it gets, on a line of its own): a test's decoy, a pid that must be left alone
SIGNAL_NOTER = r"""
import signal, sys, time
def note(n, f):
    print(signal.Signals(n).name, flush=True)
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
    signal.signal(s, note)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def env() -> dict[str, str]:
    """The environment for a launched run: one thread per rank on 2 cores, offline, this checkout first, and no
    bitsandbytes (nothing launched with it quantises; its import costs every rank a second)."""
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=child_pythonpath())
    return e


def child_pythonpath() -> str:
    """PYTHONPATH for a launched training that does not quantise: this checkout, then the folder whose
    sitecustomize hides bitsandbytes, then the caller's own."""
    return os.pathsep.join([str(REPO), str(NO_BITSANDBYTES), os.environ.get("PYTHONPATH", "")])


def wait_for(pred, timeout: float, every: float = 0.2):
    """pred()'s first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def alive(pids) -> list[int]:
    """The pids that still run (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def run_pids(st: dict) -> set[int]:
    """Every pid a run.json names: seen, tracked (with or without start times), per rank, the launcher."""
    pids = set(st.get("seen_pids") or []) | set(st.get("tracked_pids") or [])
    pids |= {int(p) for p in (st.get("process_times") or {})}
    pids |= {int(p) for p in (st.get("pids") or {}).values() if p}
    if st.get("launcher_pid"):
        pids.add(int(st["launcher_pid"]))
    return pids


def state(run_dir: Path) -> dict:
    """run.json of a run directory, or {} while it is missing or half-written."""
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def run_processes(st: dict) -> dict[int, float]:
    """Every process of a run with the start time the run recorded for it (the supervisor's too)."""
    from launch.rundir import recorded_processes
    out = recorded_processes(st)
    if st.get("supervisor_pid") and st.get("supervisor_create_time"):
        out[int(st["supervisor_pid"])] = float(st["supervisor_create_time"])
    return out


def start_time(pid: int | None) -> float | None:
    """pid's start time now (None when it is gone): record it while the process is surely the test's own."""
    try:
        return psutil.Process(int(pid)).create_time() if pid else None
    except (psutil.Error, ValueError):
        return None


def kill_verified(procs: dict[int, float | None]) -> None:
    """SIGKILL each pid that still has the start time recorded for it. A test's cleanup signals only
    processes it started: a pid freed since and reused by another process on the machine is never hit,
    nor is one whose start time was never known."""
    for pid, ctime in procs.items():
        if not pid or ctime is None:
            continue
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - ctime) <= 0.05:
                p.kill()
        except psutil.Error:
            pass


def wizard_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command that launches nothing, run in this interpreter (its imports are paid once): its exit code,
    stdout and stderr as subprocess.run gives them."""
    import contextlib
    import io

    from wizard.frontends.cli import main
    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["wizard", *args], code, out.getvalue(), err.getvalue())


def outputs_of(procs: list, timeout: float) -> list[str]:
    """Each process's whole output once all have ended (within `timeout` each); any still running then is killed."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
