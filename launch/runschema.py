"""run.json's schema: the one definition of what a run directory's state may hold, shared by everything that reads
it to show it or act on it (`wizard runs`, `attach`, `stop`, the launch view, the reaper and whoever records a run
`lost`). Pure: a dict in, a `RunRecord` (typed, every value checked) or a `RunJsonError` naming the field out.

A run directory is input like any other: its run.json may be torn, edited by hand, written by another version, or
written by someone else (launch/trust.py decides whose files are read at all). So every field a client shows or acts
on is checked here once, and the clients use the typed record, never the raw values: a pid is a positive int below
the kernel's limit (never 0 or -1, which `kill` would take as a process group or every process), a time is a finite
number of seconds a clock can print, a text is a string. Fields this schema does not know are kept in `raw` and
ignored, so a newer supervisor's additions do not make a run unreadable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wizard.schema import (
    SchemaError,
    any_number,
    build,
    digits,
    flag,
    integer,
    list_of,
    map_of,
    number,
    one_of,
    record,
    spec,
    text,
)

ACTIVE_STATUSES = ("starting", "running", "stopping", "restarting")
# "lost": the supervisor died without writing an end (SIGKILL, OOM); its reaper (or else a client) recorded it
TERMINAL_STATUSES = ("succeeded", "failed", "stopped", "lost")
STATUSES = ACTIVE_STATUSES + TERMINAL_STATUSES

PID_MAX = 1 << 22             # PID_MAX_LIMIT of 64-bit Linux: no process has a larger pid
EPOCH_MAX = 253402300799.0    # 9999-12-31 23:59:59 UTC: the last second a clock (and time.localtime) prints
COUNT_MAX = 1 << 31
SECONDS_MAX = 1e9             # ~31 years: any grace or timeout the launch accepts is far below

RunJsonError = SchemaError

# a process id that names one process: 0 and negative numbers are process groups to kill(2). 1 is one (a launch
# that is a container's first process has it), though nothing ever signals it (trust.process_of_run)
pid = integer(1, PID_MAX, f"a process id (1-{PID_MAX})")
epoch = number(0.0, EPOCH_MAX, "a time (seconds since 1970, finite, before the year 10000)")
count = integer(0, COUNT_MAX, f"a count (0-{COUNT_MAX})")
exit_code = integer(-COUNT_MAX, COUNT_MAX, "an exit code (an integer)")
seconds = number(0.0, SECONDS_MAX, f"a number of seconds (0-{SECONDS_MAX:g})")
port = integer(0, 65535, "a TCP port (0-65535)")
status = one_of(*STATUSES)
measure = any_number           # a training figure (loss, learning rate): a diverged loss is NaN or infinite


def pid_key(k: Any) -> int:
    return pid(digits(k))


# ----------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Classification:
    """Why an attempt failed (launch/classify.py Classification.to_json)."""
    kind: str = spec(text, required=True)
    summary: str | None = spec(text)
    hint: str | None = spec(text)
    rank: int | None = spec(count)
    exit_code: int | None = spec(exit_code)
    signal: str | None = spec(text)
    next_rung: str | None = spec(text)
    suggested_command: str | None = spec(text)
    log_tail: tuple[str, ...] = spec(list_of(text, "lines"), factory=tuple)


@dataclass(frozen=True)
class Progress:
    step: int | None = spec(count)
    total: int | None = spec(count)
    rate: float | None = spec(measure)
    eta_s: float | None = spec(measure)
    loss: float | None = spec(measure)
    learning_rate: float | None = spec(measure)
    grad_norm: float | None = spec(measure)
    epoch: float | None = spec(measure)


@dataclass(frozen=True)
class TrialDone:
    steps: int = spec(count, required=True)


@dataclass(frozen=True)
class RunRecord:
    """run.json, checked. `raw` is the body as read (fields this schema does not know included)."""
    status: str = spec(status, required=True)
    supervisor_pid: int = spec(pid, required=True)
    supervisor_create_time: float = spec(epoch, required=True)
    id: str | None = spec(text)
    run_dir: str | None = spec(text)
    cwd: str | None = spec(text)
    script: str | None = spec(text)
    script_args: tuple[str, ...] = spec(list_of(text, "arguments"), factory=tuple)
    command: tuple[str, ...] = spec(list_of(text, "arguments"), factory=tuple)
    config_file: str | None = spec(text)
    ds_config: str | None = spec(text)
    launcher_pid: int | None = spec(pid)
    pids: dict[int, int] = spec(map_of(digits, pid, "ranks to process ids"), factory=dict)
    tracked_pids: tuple[int, ...] = spec(list_of(pid, "process ids"), factory=tuple)
    seen_pids: tuple[int, ...] = spec(list_of(pid, "process ids"), factory=tuple)
    process_times: dict[int, float] = spec(map_of(pid_key, epoch, "process ids to start times"), factory=dict)
    attempt: int = spec(count, 0)
    max_restarts: int = spec(count, 0)
    user_restarts: int = spec(count, 0)
    started_at: float | None = spec(epoch)
    attempt_started_at: float | None = spec(epoch)
    ended_at: float | None = spec(epoch)
    exit_code: int | None = spec(exit_code)
    classification: Classification | None = spec(record(Classification))
    stop_reason: str | None = spec(text)
    detached: bool = spec(flag, False)
    headless: bool = spec(flag, False)
    world_size: int | None = spec(count)
    grace_s: float | None = spec(seconds)
    stall_timeout_s: float | None = spec(seconds)
    main_process_port: int | None = spec(port)
    progress: Progress = spec(record(Progress), factory=Progress)
    trial_done: TrialDone | None = spec(record(TrialDone))
    lost_at: float | None = spec(epoch)
    lost_recorded_at: float | None = spec(epoch)
    lost_cause: str | None = spec(text)
    lost_by: str | None = spec(text)
    lost_cleaned: tuple[int, ...] = spec(list_of(pid, "process ids"), factory=tuple)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    def attempts_allowed(self) -> int:
        """1 + --max-restarts + the restarts the user asked for (those do not spend --max-restarts)."""
        return 1 + self.max_restarts + self.user_restarts


def parse(body: Any) -> RunRecord:
    """run.json's body as a RunRecord; RunJsonError (one line naming the field) when it is not one the supervisor
    could have written."""
    return build(RunRecord, body, raw=body if isinstance(body, dict) else {})


def problem(body: Any) -> str | None:
    """What is wrong with a run.json body, in one line; None when it passes the schema."""
    try:
        parse(body)
    except RunJsonError as exc:
        return str(exc)
    return None
