"""The run's record as the supervisor keeps it: run.json and events.jsonl behind one writer (RunRecord).
Split from launch/supervisor.py.
"""

from __future__ import annotations

import time
from typing import Any

from launch.rundir import EventLog, RunState, attempts_allowed

STATE_FLUSH_EVERY_S = 0.5


class RunRecord:
    """run.json (RunState) and events.jsonl (EventLog): what clients (the view, attach, stop) know of
    the run. The supervisor and its attempts write them only through these methods, so each key and
    each event has one home.

    Run-level changes (update) are saved at once; an attempt's frequent ones (processes, progress)
    mark the state dirty and reach the disk with the loop's flush(), at most every STATE_FLUSH_EVERY_S.
    """

    def __init__(self, state: RunState, events: EventLog):
        self._state = state
        self._events = events
        self._dirty = False
        self._last_flush = 0.0
        self._last_progress_event = 0.0

    # ---------------------------------------------------------------- run level (saved at once)

    def get(self, key: str, default: Any = None) -> Any:
        return self._state.get(key, default)

    def update(self, **fields: Any) -> None:
        self._state.update(**fields)

    def emit(self, type_: str, attempt: int | None, **fields: Any) -> None:
        self._events.emit(type_, attempt, **fields)

    def attempts_allowed(self) -> int:
        return attempts_allowed(self._state.data)

    # ---------------------------------------------------------------- an attempt's processes

    def record_process(self, pid: int, create_time: float) -> None:
        """A process of the run: from now on (pid, create time) is what may be signalled."""
        self._state.data.setdefault("process_times", {})[str(pid)] = create_time
        self._dirty = True

    def record_rank(self, rank: int, pid: int) -> None:
        self._state.data["pids"][str(rank)] = pid
        self._dirty = True

    def record_tracked(self, alive_pids: list[int], tracked_pids: list[int]) -> None:
        """The attempt's processes still running (tracked_pids) and every one it ever had (seen_pids)."""
        self._state.data["tracked_pids"] = sorted(alive_pids)
        seen = self._state.data.setdefault("seen_pids", [])
        seen.extend(pid for pid in tracked_pids if pid not in seen)
        self._dirty = True

    def record_stopping(self, attempt: int, why: str, grace_s: float) -> None:
        if self._state.get("status") not in ("stopping",):
            self._state.update(status="stopping")
        self._events.emit("stop", attempt, reason=why, grace_s=grace_s)

    def record_launcher_exit(self, attempt: int, exit_code: int) -> None:
        self._events.emit("status", attempt, status="launcher_exited", exit_code=exit_code)

    def record_stall(self, attempt: int, timeout_s: float, silent: str, gpus_idle: bool | None) -> None:
        self._events.emit("stall", attempt, timeout_s=timeout_s, silent=silent, gpus_idle=gpus_idle)

    # ---------------------------------------------------------------- training progress

    def progress(self) -> dict[str, Any]:
        return dict(self._state.data["progress"])

    def record_train_log(self, attempt: int, rank: int | None, d: dict[str, Any]) -> None:
        prog = self._state.data["progress"]
        for k in ("loss", "learning_rate", "grad_norm", "epoch"):
            if k in d:
                prog[k] = d[k]
        self._dirty = True
        self._events.emit("train_log", attempt, rank=rank, step=prog.get("step"),
                          **{k: d.get(k) for k in ("loss", "learning_rate", "grad_norm", "epoch")})

    def record_progress(self, attempt: int, rank: int | None, p: dict[str, Any]) -> None:
        prog = self._state.data["progress"]
        changed = prog.get("step") != p["step"] or prog.get("total") != p["total"]
        rate = p.get("rate")
        eta = p.get("eta_s")
        if eta is None and rate and p["total"]:
            eta = (p["total"] - p["step"]) / rate
        prog.update(step=p["step"], total=p["total"], rate=rate, eta_s=eta)
        self._dirty = True
        now = time.monotonic()
        final = p["total"] and p["step"] >= p["total"]
        # events.jsonl gets at most one progress event a second (and always the last step)
        if changed and (now - self._last_progress_event >= 1.0 or final):
            self._last_progress_event = now
            self._events.emit("progress", attempt, rank=rank, step=p["step"], total=p["total"],
                              rate=rate, eta_s=eta)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._dirty and (force or now - self._last_flush >= STATE_FLUSH_EVERY_S):
            self._state.save()
            self._dirty = False
            self._last_flush = now
