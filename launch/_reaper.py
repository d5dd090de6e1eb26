"""The reaper: kills a run's processes if the supervisor dies without cleaning up (SIGKILL, OOM).

The supervisor starts `python -m launch._reaper` in a session of its own (so a terminal's ^C or
hangup doesn't reach it), with a pipe on stdin. Over the pipe it sends one line per process it
tracks, "<pid> <create_time>", and "done" when it has torn everything down itself. On EOF without
"done" (the supervisor is gone: the kernel closed its end), the reaper kills every recorded
process that still exists with the same create time (so a recycled pid is never hit) and their
descendants: SIGTERM, up to GRACE_S seconds, then SIGKILL. The launcher also carries
PR_SET_PDEATHSIG, but the ranks are its grandchildren in sessions of their own; this is what
reaches them.
"""

from __future__ import annotations

import os
import signal
import sys
import time

GRACE_S = 3.0


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


def reap(tracked: dict[int, float], grace: float = GRACE_S) -> None:
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
    live = _alive(procs.values())
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


def main() -> int:
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
    if not done and tracked:
        reap(tracked)
    return 0


if __name__ == "__main__":
    os.environ.pop("WIZARD_LAUNCH_SOCKET", None)
    sys.exit(main())
