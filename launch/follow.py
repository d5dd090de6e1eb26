"""The live view of a run, without Textual: the run-directory follower, what the view draws, control requests.

The view is only a client of the run directory (run.json, events.jsonl, metrics.jsonl,
logs/attempt-<n>/rank-<r>.log), so `wizard launch` and `wizard attach` show exactly the same
thing and the view can come and go while the supervisor keeps the run. This module is plain
Python with no Textual import (the follower and `send_control` serve `wizard stop` and tests too);
the Textual app and its entry points (`make_view_app`, `run_view`) live in launch/view.py, which
imports this module and is never imported by it.

Control requests (the view never kills workers itself; the supervisor owns teardown):
  1. write RUN_DIR/control.json atomically:
       {"request": "stop" | "kill" | "restart", "t": epoch, "id": "<hex>", "from": "view", "pid": n}
  2. then, if run.json's status is active and supervisor_pid is alive, send the matching signal
     as a doorbell: SIGTERM = stop (graceful: SIGTERM to the group, grace period, SIGKILL),
     SIGUSR1 = restart (tear down, new attempt), SIGUSR2 = kill (skip the grace period).
  A pid is signalled only when run.json recorded its start time and the process with that pid
  still has it, and it is the run's supervisor (this user's, holding the run's lock file open:
  launch/trust.py): never a process that merely reuses the pid or whose pid and start time were
  copied into run.json, never one whose start is unknown.
  The supervisor handles each request id once (a signal whose control.json id it has already
  handled, or with no control.json, means the signal's own request), so a request is never acted
  on twice, and polling control.json alone is enough where a signal cannot be sent.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from launch.rundir import ACTIVE_STATUSES, CONTROL_FILE, TERMINAL_STATUSES, read_state, supervisor_process
from launch.trust import run_dir_problem
from wizard.fsutil import replace_file
from wizard.units import fmt_clock

CONTROL_SIGNALS = {"stop": signal.SIGTERM, "restart": signal.SIGUSR1, "kill": signal.SIGUSR2}
CONTROL_REQUESTS = (*CONTROL_SIGNALS, "detach")      # detach: control.json only (the supervisor polls it)
ACTIVE = frozenset(ACTIVE_STATUSES)
FINISHED = frozenset(TERMINAL_STATUSES)
DEFAULT_GRACE_S = 30.0
LOG_PANE_LINES = 5000
LAUNCHER = -1                     # the "rank" of launcher.log lines
WIZARD = -2                       # the "rank" of lines the view makes from events (restart, stall, ...)


# ---------------------------------------------------------------- incremental file reading

class FileTail:
    """New whole lines of a growing file, read from where the last call stopped (never the whole file).

    The file stays open between calls, so a log the supervisor rotates by renaming (rank-0.log ->
    rank-0.log.1, then a fresh rank-0.log) is drained to its end before the new file is read from
    its start: no line is lost or repeated. `follow_renames=False` is for files that are rewritten
    in place of the old one (events/metrics.jsonl keep their newest half): the new file is read
    from its last `window` bytes. The first read of a large file also starts `window` bytes before
    its end, and a reader that falls more than `window` behind skips ahead, so attaching to a long
    run, or a burst of output, costs a bounded amount of work and memory.
    """

    def __init__(self, path: str | os.PathLike[str], window: int = 1 << 20,
                 follow_renames: bool = True) -> None:
        self.path = os.fspath(path)
        self.window = window
        self.follow_renames = follow_renames
        self.inode: int | None = None
        self.rewrites = 0                 # times the file was replaced (follow_renames=False)
        self._f: Any = None
        self._partial = b""
        self._dropping = False            # inside a line cut by a skip: drop it up to its end

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _feed(self, data: bytes, out: list[str]) -> None:
        if self._dropping:
            nl = data.find(b"\n")
            if nl < 0:
                return
            data, self._dropping = data[nl + 1:], False
        *whole, self._partial = (self._partial + data).split(b"\n")
        out += [line.decode("utf-8", "replace") for line in whole]

    def _consume(self, out: list[str]) -> None:
        f = self._f
        end = os.fstat(f.fileno()).st_size
        pos = f.tell()
        if end < pos:                                 # truncated in place: start over
            f.seek(0)
            pos, self._partial, self._dropping = 0, b"", False
        if end - pos > self.window:                   # too far behind: keep the newest window
            f.seek(end - self.window)
            self._partial, self._dropping = b"", True
        self._feed(f.read(max(0, end - f.tell())), out)

    def read_lines(self) -> list[str]:
        out: list[str] = []
        try:
            if self._f is not None:
                self._consume(out)
            st = os.stat(self.path)
            if self._f is None or st.st_ino != self.inode:
                first = self._f is None
                self.close()
                self._f = open(self.path, "rb")
                self.inode = os.fstat(self._f.fileno()).st_ino
                if first or not self.follow_renames:
                    if not first:
                        self.rewrites += 1
                    self._partial, self._dropping = b"", False
                    size = os.fstat(self._f.fileno()).st_size
                    if size > self.window:
                        self._f.seek(size - self.window)
                        self._dropping = True
                self._consume(out)
        except OSError:
            pass
        return out


class JsonlTail(FileTail):
    """Objects from a JSONL file; after the file is rewritten (newest half kept), the objects
    already seen (by their "t") are not returned twice."""

    def __init__(self, path: str | os.PathLike[str], window: int = 1 << 20) -> None:
        super().__init__(path, window, follow_renames=False)
        self._last_t: float | None = None
        self._seen_at_last_t: list[dict[str, Any]] = []

    def read_objects(self) -> list[dict[str, Any]]:
        rewrites = self.rewrites
        lines = self.read_lines()
        replaced = self.rewrites != rewrites
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            t = as_number(obj.get("t"))
            if replaced and t is not None and self._last_t is not None:
                if t < self._last_t or (t == self._last_t and obj in self._seen_at_last_t):
                    continue
            if t is not None:
                if t != self._last_t:
                    self._last_t, self._seen_at_last_t = t, []
                self._seen_at_last_t.append(obj)
            out.append(obj)
        return out


# ---------------------------------------------------------------- the run directory

@dataclass
class LogLine:
    attempt: int
    rank: int                      # >= 0 a rank; LAUNCHER; WIZARD
    text: str


@dataclass
class Update:
    run_changed: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    lines: list[LogLine] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.run_changed or bool(self.events or self.samples or self.lines)


_RANK_LOG = re.compile(r"rank-(\d+)\.log$")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean_line(text: str) -> str:
    """A log line as a terminal would have left it: carriage returns overwrite (tqdm redraws its
    bar with \\r), escape sequences (colours, cursor moves) and other control characters removed,
    so nothing a rank prints can drive the view's own terminal."""
    text = _ANSI.sub("", text)
    if "\r" in text:
        shown = ""
        for segment in text.split("\r"):
            shown = segment + shown[len(segment):]
        text = shown
    return _CONTROL.sub("", text.expandtabs(8))


class RunFollower:
    """Polls a run directory and returns what is new since the last poll."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run: dict[str, Any] = {}
        self._run_stamp: tuple[int, int] | None = None
        self.events = JsonlTail(self.run_dir / "events.jsonl")
        self.metrics = JsonlTail(self.run_dir / "metrics.jsonl", window=256 * 1024)
        self.attempt: int | None = None
        self._logs: dict[Path, tuple[int, FileTail]] = {}

    def close(self) -> None:
        for tail in [self.events, self.metrics] + [t for _r, t in self._logs.values()]:
            tail.close()

    def _poll_run(self) -> bool:
        path = self.run_dir / "run.json"
        try:
            st = os.stat(path)
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._run_stamp:
            return False
        data = read_state(self.run_dir)
        if data is None:                      # mid-write by a non-atomic writer: try next tick
            return False
        self._run_stamp = stamp
        changed = data != self.run
        self.run = data
        return changed

    def _log_files(self, attempt: int) -> list[tuple[int, Path]]:
        d = self.run_dir / "logs" / f"attempt-{attempt}"
        found = []
        try:
            for entry in os.scandir(d):
                m = _RANK_LOG.match(entry.name)
                if m:
                    found.append((int(m.group(1)), Path(entry.path)))
                elif entry.name == "launcher.log":
                    found.append((LAUNCHER, Path(entry.path)))
        except OSError:
            return []
        return sorted(found, key=lambda rp: (rp[0] == LAUNCHER, rp[0]))

    def _poll_logs(self) -> list[LogLine]:
        attempt = _as_int(self.run.get("attempt"))
        if attempt is None:
            attempt = self._latest_attempt_on_disk()
        if attempt is None:
            return []
        out: list[LogLine] = []
        if self.attempt is not None and attempt != self.attempt:
            # drain the old attempt's files, then start on the new one
            out += self._read_logs(self.attempt)
            for _rank, tail in self._logs.values():
                tail.close()
            self._logs.clear()
            out.append(LogLine(attempt, WIZARD, f"── attempt {attempt} ──"))
        self.attempt = attempt
        for rank, path in self._log_files(attempt):
            if path not in self._logs:
                self._logs[path] = (rank, FileTail(path))
        out += self._read_logs(attempt)
        return out

    def _read_logs(self, attempt: int) -> list[LogLine]:
        # Rank logs carry no timestamps; ranks of a data-parallel job move in step, so taking
        # the new lines of each rank in turn is the closest honest interleaving.
        batches = [[LogLine(attempt, rank, clean_line(text)) for text in tail.read_lines()]
                   for rank, tail in self._logs.values()]
        out: list[LogLine] = []
        for i in range(max((len(b) for b in batches), default=0)):
            out += [b[i] for b in batches if i < len(b)]
        return out

    def _latest_attempt_on_disk(self) -> int | None:
        try:
            nums = [int(p.name.split("-", 1)[1]) for p in (self.run_dir / "logs").iterdir()
                    if p.name.startswith("attempt-") and p.name.split("-", 1)[1].isdigit()]
        except OSError:
            return None
        return max(nums) if nums else None

    def poll(self) -> Update:
        u = Update(run_changed=self._poll_run())
        u.events = self.events.read_objects()
        u.samples = self.metrics.read_objects()
        u.lines = self._poll_logs()
        for ev in u.events:
            line = event_line(ev)
            if line is not None:
                u.lines.append(LogLine(_as_int(ev.get("attempt")) or self.attempt or 0, WIZARD, line))
        return u


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def as_number(v: Any) -> float | None:
    """A JSON value that is already a number (never a bool, never text parsed): float, else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def event_line(ev: dict[str, Any]) -> str | None:
    """The supervisor's notable events as lines in the log pane (train logs and progress are not)."""
    kind = ev.get("type")
    if kind not in ("plan", "check", "preflight", "failure", "restart", "stall", "stop", "exit", "lost", "port",
                    "refused"):
        return None
    text = ev.get("message") or ev.get("summary") or ev.get("reason")
    rank = f" rank {ev['rank']}" if ev.get("rank") is not None else ""
    extra = []
    for key in ("kind", "exit_code", "signal", "status"):
        if ev.get(key) is not None:
            extra.append(f"{key}={ev[key]}")
    return f"{kind}{rank}: " + (str(text) if text else " ".join(extra) or "(no details)")


# ---------------------------------------------------------------- state the view shows

@dataclass
class ViewState:
    """Everything the view draws, built only from the run directory."""
    run: dict[str, Any] = field(default_factory=dict)
    samples: deque = field(default_factory=lambda: deque(maxlen=240))
    loss: deque = field(default_factory=lambda: deque(maxlen=240))        # (t or step, loss)
    rate: deque = field(default_factory=lambda: deque(maxlen=240))        # (t or step, it/s)

    def apply(self, u: Update, run: dict[str, Any]) -> None:
        if run.get("attempt") != self.run.get("attempt") and self.run:
            # a new attempt starts from zero: the previous one's curve is not this one's
            self.loss.clear()
            self.rate.clear()
        self.run = run
        self.samples.extend(u.samples)
        attempt = _as_int(run.get("attempt"))
        for ev in u.events:
            if attempt is not None and _as_int(ev.get("attempt")) not in (None, attempt):
                continue               # an earlier attempt's point, read in the same poll
            loss = as_number(ev.get("loss"))
            if loss is not None and ev.get("type") in ("train_log", "progress", None):
                self.loss.append(loss)
            rate = as_number(ev.get("rate"))
            if rate is not None and ev.get("type") in ("progress", "train_log", None):
                self.rate.append(rate)

    @property
    def status(self) -> str:
        return str(self.run.get("status") or "unknown")

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def latest_sample(self) -> dict[str, Any] | None:
        return self.samples[-1] if self.samples else None

    def util_history(self, gpu_index: int, seconds: float = 60.0) -> list[float | None]:
        """The GPU's utilisation over the last `seconds` of samples (oldest first)."""
        if not self.samples:
            return []
        t_end = as_number(self.samples[-1].get("t")) or 0.0
        out: list[float | None] = []
        for s in self.samples:
            t = as_number(s.get("t"))
            if t is None or t < t_end - seconds or not s.get("available"):
                continue
            util = None
            for g in s.get("gpus") or []:
                if g.get("index") == gpu_index:
                    util = as_number(g.get("util"))
                    break
            out.append(util)
        return out


def elapsed_s(run: dict[str, Any], now: float) -> float | None:
    start = as_number(run.get("started_at"))
    if start is None:
        return None
    end = as_number(run.get("ended_at")) if run.get("status") in FINISHED else None
    return max(0.0, (end if end is not None else now) - start)


def status_text(run: dict[str, Any], now: float | None = None) -> str:
    """A plain one-paragraph status of the run (for attach without a terminal)."""
    now = time.time() if now is None else now
    p = run.get("progress") or {}
    parts = [f"run {run.get('id', '?')}: {run.get('status', 'unknown')}",
             f"attempt {run.get('attempt', '?')}", f"elapsed {fmt_clock(elapsed_s(run, now))}"]
    if p.get("step") is not None:
        parts.append(f"step {p['step']}/{p.get('total') or '?'}")
    if as_number(p.get("loss")) is not None:
        parts.append(f"loss {p['loss']:.4g}")
    if as_number(p.get("eta_s")) is not None:
        parts.append(f"ETA {fmt_clock(p['eta_s'])}")
    lines = ["  ".join(parts)]
    c = run.get("classification")
    if c:
        lines.append(f"failure: {c.get('kind')} on rank {c.get('rank')}: {c.get('summary') or ''}".rstrip())
        if c.get("hint"):
            lines.append(f"hint: {c['hint']}")
        if c.get("suggested_command"):
            lines.append(f"try: {c['suggested_command']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- control requests

@dataclass
class ControlResult:
    request: str
    written: bool
    signalled: bool
    message: str


def send_control(run_dir: str | os.PathLike[str], request: str,
                 run: dict[str, Any] | None = None, now: Callable[[], float] = time.time,
                 sender: str = "view", reason: str | None = None) -> ControlResult:
    """Ask the supervisor to stop / kill / restart the run (see the module docstring). `reason`: why, for a stop
    (run.json's stop_reason, which `wizard runs` shows: a trial that `wizard tune` stopped at its time limit
    read "stopped 130" like a Ctrl-C)."""
    if request not in CONTROL_REQUESTS:
        raise ValueError(f"control request must be one of {sorted(CONTROL_REQUESTS)}, not {request!r}")
    run_dir = Path(run_dir)
    untrusted = run_dir_problem(run_dir)
    if untrusted:              # someone else's, or writable by others: neither written nor signalled
        return ControlResult(request, False, False, f"could not send {request}: {untrusted}")
    run = read_state(run_dir) if run is None else run
    if run is None:
        return ControlResult(request, False, False, f"no run.json in {run_dir}")
    status = run.get("status")
    if status not in ACTIVE:
        return ControlResult(request, False, False, f"the run has already {status or 'ended'}")
    body = {"request": request, "t": now(), "id": uuid.uuid4().hex, "from": sender, "pid": os.getpid()}
    if reason:
        body["reason"] = reason
    written = False
    try:
        replace_file(run_dir / CONTROL_FILE, json.dumps(body) + "\n", fsync=False)
        written = True
    except OSError:
        pass
    pid = _as_int(run.get("supervisor_pid"))
    signalled = False
    # only the run's own supervisor: its recorded pid and start time, this user's, holding the run's lock
    supervisor = supervisor_process(run, run_dir) if request in CONTROL_SIGNALS else None
    if supervisor is not None:
        import psutil
        try:
            supervisor.send_signal(CONTROL_SIGNALS[request])      # psutil checks the start time again first
            signalled = True
        except psutil.Error:
            pass
    if signalled:
        msg = f"{request} requested ({signal.Signals(CONTROL_SIGNALS[request]).name} to supervisor {pid})"
    elif written and request not in CONTROL_SIGNALS:
        msg = f"{request} requested (control.json)"
    elif written:
        msg = f"{request} requested (control.json; supervisor {pid or '?'} not reachable by signal)"
    else:
        msg = f"could not send {request}: run directory not writable and supervisor not reachable"
    return ControlResult(request, written, signalled, msg)


# what the App returns when it exits
DETACHED, QUIT, STOPPED = "detached", "quit", "stopped"
