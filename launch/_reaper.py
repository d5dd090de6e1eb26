"""The reaper: ends a run's processes and records the run `lost` if the supervisor dies without
cleaning up (SIGKILL, OOM).

The supervisor starts `python -m launch._reaper RUN_DIR` in a session of its own (so a terminal's ^C
or hangup doesn't reach it), with a pipe on stdin. Over the pipe it sends one line per process it
tracks, "<pid> <create_time>", and "done" when it has torn everything down itself. On EOF without
"done" (the supervisor is gone: the kernel closed its end), the reaper
- finds every recorded process that still exists with the same create time (so a recycled pid is
  never hit) and their descendants;
- records the run `lost` in RUN_DIR/run.json and events.jsonl at once (when, why, and the processes
  it is ending), before ending them, so the run directory tells the truth within seconds with no
  client running;
- ends those processes: SIGTERM, up to GRACE_S seconds, then SIGKILL.
The launcher also carries PR_SET_PDEATHSIG, but the ranks are its grandchildren in sessions of their
own; this is what reaches them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 3.0
RECORD_FOR_S = 3.0       # how long to keep trying to record `lost` (the supervisor may still be exiting)


# What a psutil call on someone else's process raises: NoSuchProcess (it is gone: the goal), AccessDenied
# (not ours to end), both psutil.Error. Nothing to report: the reaper's output goes to /dev/null, and a
# process it cannot end is one the supervisor could not end either.
def _psutil_errors() -> tuple[type[Exception], ...]:
    import psutil
    return (psutil.Error, OSError)


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != "zombie":
                out.append(p)
        except _psutil_errors():
            pass
    return out


def verified(tracked: dict[int, float]) -> dict[int, object]:
    """The tracked processes that still run as themselves (pid and start time), and their descendants."""
    import psutil
    procs = {}
    for pid, ctime in tracked.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - ctime) > 0.05:
                continue
            procs[pid] = p
            for c in p.children(recursive=True):
                procs.setdefault(c.pid, c)
        except (*_psutil_errors(), ValueError):   # ValueError: a negative pid off the pipe
            continue
    return procs


def end(procs, grace: float = GRACE_S) -> None:
    """SIGTERM to every process of `procs` still running, then SIGKILL to those left after `grace` s."""
    live = _alive(procs)
    for p in live:
        try:
            p.send_signal(signal.SIGTERM)
        except _psutil_errors():
            pass
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = _alive(live)
    for p in live:
        try:
            p.kill()
        except _psutil_errors():
            pass


def reap(tracked: dict[int, float], grace: float = GRACE_S) -> list[int]:
    """End every verified tracked process and its descendants; the pids it went after."""
    procs = verified(tracked)
    end(procs.values(), grace)
    return sorted(procs)


def _oom_killed(pid: int | None) -> bool | None:
    """Whether the kernel log shows the OOM killer taking pid; None when it cannot be read."""
    if not pid:
        return None
    try:
        r = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=1)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout:
        return None
    from launch.classify import dmesg_oom_evidence
    return bool(dmesg_oom_evidence(r.stdout[-200_000:], [pid]))


def cause_of_death(supervisor_pid: int | None) -> str:
    """Why the supervisor ended without recording an end, as far as anyone can tell afterwards."""
    oom = _oom_killed(supervisor_pid)
    if oom:
        return f"the supervisor (pid {supervisor_pid}) was killed by the kernel OOM killer"
    what = (f"the supervisor (pid {supervisor_pid}) ended without recording an end: killed by a signal it "
            "cannot handle (SIGKILL), the OOM killer or a crash")
    return what + ("; the kernel log shows no OOM kill" if oom is False else
                   " (the kernel log is not readable here)")


def record_lost(run_dir: str, ending: list[int], gone_at: float, until: float) -> dict | None:
    """run.json and events.jsonl say `lost`, with when and why, naming the processes being ended.
    Retried until `until` (monotonic): the supervisor may not be reaped as dead yet. None when
    nothing was written (the run had ended, run.json is not valid, or a client recorded it first)."""
    from launch.rundir import checked_record, mark_lost_if_dead
    cause = None
    while True:
        rec, _problem = checked_record(run_dir)     # run.json's one schema, in a run directory of ours alone
        if rec is None or not rec.active:
            return None
        cause = cause or cause_of_death(rec.supervisor_pid)
        lost = mark_lost_if_dead(run_dir, cause=cause, by="reaper", lost_at=gone_at,
                                 ending=lambda _st: list(ending))
        if lost is not None or time.monotonic() >= until:
            return lost
        time.sleep(0.05)


def on_supervisor_gone(tracked: dict[int, float], run_dir: str | None, grace: float = GRACE_S) -> None:
    gone_at = time.time()
    procs = verified(tracked)
    if run_dir:
        try:
            record_lost(run_dir, sorted(procs), gone_at, time.monotonic() + RECORD_FOR_S)
        except Exception:  # noqa: BLE001  a run directory we cannot write must not keep the processes alive
            pass
    end(procs.values(), grace)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = argv[0] if argv else None
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    tracked: dict[int, float] = {}
    done = False
    stream = sys.stdin.buffer
    for raw in stream:
        line = raw.decode(errors="replace").strip()
        if line == "done":
            done = True
            continue
        if line.startswith("forget "):
            try:
                tracked.pop(int(line.split()[1]), None)
            except (ValueError, IndexError):
                pass
            continue
        parts = line.split()
        if len(parts) == 2:
            try:
                tracked[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    if not done:
        on_supervisor_gone(tracked, run_dir)
    return 0


if __name__ == "__main__":
    os.environ.pop("WIZARD_LAUNCH_SOCKET", None)
    sys.exit(main())
