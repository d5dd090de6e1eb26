"""The processes of a run as the supervisor owns them: each known by pid and start time (ProcessGroup), and the
parent-death signal that ends a foreground run with the `wizard launch` that started it. Split from
launch/supervisor.py.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable


def create_time(pid: int) -> float | None:
    import psutil
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


class ProcessGroup:
    """The processes one attempt owns, each known by pid *and* create time, so that a reused pid is
    never signalled. Every process is handed to `on_tracked` the moment it is found (the supervisor
    records it and tells the reaper) and to `on_forgotten` when the attempt is over."""

    def __init__(self, on_tracked: Callable[[int, float], None], on_forgotten: Callable[[int], None]):
        self.tracked: dict[int, Any] = {}          # pid -> psutil.Process
        self._on_tracked = on_tracked
        self._on_forgotten = on_forgotten

    def track(self, pid: int) -> None:
        if pid in self.tracked:
            return
        import psutil
        try:
            p = psutil.Process(pid)
            ctime = p.create_time()
            self.tracked[pid] = p
            self._on_tracked(pid, ctime)
        except psutil.Error:       # gone (or not ours) before we could look
            pass

    def track_descendants(self, roots: list[int]) -> None:
        import psutil
        for root in roots:
            try:
                for c in psutil.Process(root).children(recursive=True):
                    self.track(c.pid)
            except psutil.Error:
                continue

    def alive(self) -> list[Any]:
        """Tracked processes still running as themselves (psutil's is_running compares the start
        time recorded when we tracked the pid, so a reused pid is not one of them)."""
        import psutil
        out = []
        for p in self.tracked.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    @staticmethod
    def signal_verified(p: Any, sig: int) -> None:
        import psutil
        try:
            if p.is_running():         # same pid *and* the start time we recorded
                p.send_signal(sig)
        except psutil.Error:
            pass

    def terminate_all(self) -> None:
        for p in self.alive():
            self.signal_verified(p, signal.SIGTERM)

    def kill_all(self) -> None:
        for p in self.alive():
            self.signal_verified(p, signal.SIGKILL)

    def forget_all(self) -> None:
        for pid in list(self.tracked):
            self._on_forgotten(pid)


def set_parent_death_signal(sig: int) -> None:
    """PR_SET_PDEATHSIG: the kernel sends `sig` to us when our parent dies (0 clears it).

    A failure is not fatal (the reaper still ends the run's processes) but is written to stderr, which
    is the supervisor's log: without it a foreground run would outlive a killed `wizard launch`.
    """
    why = prctl_pdeathsig(sig)
    if why:
        print(f"wizard launch: PR_SET_PDEATHSIG({int(sig)}) failed: {why}; the run will not end with its "
              "parent, only the reaper or `wizard stop` ends it", file=sys.stderr, flush=True)


def prctl_pdeathsig(sig: int) -> str | None:
    """prctl(PR_SET_PDEATHSIG, sig); None when it took, else why not."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(sig), 0, 0, 0) != 0:        # 1 = PR_SET_PDEATHSIG; prctl sets errno
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:              # no libc to load, or no prctl (not Linux)
        return f"{type(exc).__name__}: {exc}"
    return None


PARENT_DEATH_OFFSET = 7     # SIGRTMIN + 7 (the ranks' stack dump is SIGRTMIN + 6)


def parent_death_signal() -> int:
    """The signal a foreground supervisor gets when the `wizard launch` that started it dies.

    Not SIGHUP: under nohup SIGHUP is ignored, the supervisor inherits that, and the kernel's
    parent-death SIGHUP would then be dropped. No one ignores a real-time signal nobody else uses,
    and the supervisor installs its handler itself (Supervisor._install_signals)."""
    return int(signal.SIGRTMIN) + PARENT_DEATH_OFFSET
