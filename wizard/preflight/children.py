"""The preflight's child processes (the node's facts, the collective and the ranks it spawns, the ssh of the
fan-out), and the promise that none outlives the preflight, however it ends:

- past its deadline, or when the preflight stops it (cancel), a child is killed with its whole session (each
  starts in a session of its own, so whatever it started goes with it);
- when the preflight ends early (an exception, Ctrl-C, or SIGTERM / SIGHUP, which the CLI turns into
  KeyboardInterrupt), the `finally` of the call that waits for the child kills it the same way;
- when the preflight is killed outright (SIGKILL, the OOM killer), the kernel does it: every child starts through
  a tiny shim that sets PR_SET_PDEATHSIG (SIGKILL when the thread that started it dies) before it execs; the
  collective starts the node's other ranks the same way (collective.start_ranks), so the chain holds to them.

No torch here; the standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable

# prctl(PR_SET_PDEATHSIG = 1, SIGKILL = 9), set between fork and exec by a separate interpreter, not preexec_fn
# (unsafe with the preflight's threads). A parent gone before the prctl took is caught by the ppid check.
SHIM = ("import ctypes,os,sys\n"
        "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
        "if os.getppid() != int(sys.argv[1]): os._exit(137)\n"
        "os.execvp(sys.argv[2], sys.argv[2:])\n")

_live: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()


def spawn(argv: list[str], **popen: Any) -> subprocess.Popen:
    """Start argv in a session of its own, killed by the kernel if this thread dies; tracked until end()."""
    shimmed = [sys.executable, "-S", "-c", SHIM, str(os.getpid()), *argv]
    p = subprocess.Popen(shimmed, start_new_session=True, **popen)
    with _lock:
        _live[p.pid] = p
    return p


def end(p: subprocess.Popen) -> None:
    """Kill p's whole session (whatever it started too) and reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:       # in uninterruptible sleep (a hung driver): the kernel ends it later
        pass
    with _lock:
        _live.pop(p.pid, None)


def end_all() -> None:
    """Every child still running (the CLI's last word on a stop)."""
    with _lock:
        live = list(_live.values())
    for p in live:
        end(p)


def live() -> list[int]:
    with _lock:
        return sorted(_live)


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
        on_line: Callable[[dict[str, Any]], None] | None = None,
        cancel: threading.Event | None = None) -> tuple[list[dict[str, Any]], str, str | None]:
    """Run a child to its end, its deadline, or `cancel`: (its JSON lines, its stderr's tail, None | "timeout" |
    "cancelled"). Whatever way this call ends, the child's session is killed before it returns or raises."""
    import time
    with tempfile.TemporaryFile() as err:
        p = spawn(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
        lines: list[dict[str, Any]] = []

        def pump() -> None:
            assert p.stdout is not None
            for raw in p.stdout:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    lines.append(msg)
                    if on_line:
                        on_line(msg)
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        why = None
        deadline = time.monotonic() + timeout
        try:
            while p.poll() is None:
                if cancel is not None and cancel.is_set():
                    why = "cancelled"
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    why = "timeout"
                    break
                try:
                    p.wait(min(left, 0.1))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            end(p)              # the child's own children (spawned ranks) too
        t.join(2)
        err.seek(0, 2)
        size = err.tell()
        err.seek(max(0, size - 200_000))
        tail = err.read().decode("utf-8", "replace")
    return lines, tail, why
