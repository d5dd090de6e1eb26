"""The run directory: the only interface between the supervisor and its clients (view, attach, stop).

Layout (a contract: launch/follow.py and `wizard attach`/`stop` read it):

    <runs root>/latest                     symlink to the newest run directory
    <runs root>/<id>/run.json              state; replaced atomically (temp + rename) on every change
    <runs root>/<id>/events.jsonl          one JSON object per line: {"t", "type", "attempt", ...}
    <runs root>/<id>/metrics.jsonl         GPU samples (launch.metrics.Sampler)
    <runs root>/<id>/supervisor.log        the supervisor's own output when it runs in the background
    <runs root>/<id>/logs/attempt-<n>/rank-<r>.log      what rank r wrote (stdout and stderr)
    <runs root>/<id>/logs/attempt-<n>/launcher.log      what `accelerate launch` itself wrote

run.json carries the fields of the view contract (id, command, script, script_args, config_file,
ds_config, cwd, run_dir, attempt, max_restarts, status, supervisor_pid, launcher_pid, pids {rank:
pid}, started_at, attempt_started_at, ended_at, exit_code, classification, detached, headless,
world_size, progress) plus: tracked_pids (processes of the run alive at the last scan), seen_pids
(every process the run ever had, for "nothing left" checks), supervisor_create_time (guards
against pid reuse), grace_s, stall_timeout_s, main_process_port (the port the current attempt's processes
meet on, None when they meet on none; a single-machine attempt whose configured port was busy gets a free one
and a `port` event says so); and once a run is `lost`: lost_at (when its supervisor
was found gone), lost_cause, lost_by (its reaper, or the client that found it), lost_cleaned (the
processes of the run that were ended).

Bounded size:
- a rank or launcher log passing LOG_CAP_BYTES (50 MB) is renamed to `<name>.1` (replacing an
  older `.1`) and a new file is started: at most 2 x 50 MB per rank and attempt;
- events.jsonl and metrics.jsonl passing JSONL_CAP_BYTES (10 MB) are rewritten keeping the newest
  half (whole lines), via a temp file and an atomic rename. A reader that follows one of these
  files by offset must reopen it when its size drops below the offset or its inode changes.

Default runs root: ./wizard-runs under the current directory.

Run directories are created 0700, and every file inside is opened without following symlinks (launch/trust.py);
clients act only on a run directory that is the user's own (trust.check_run_dir) and on a run.json that passes the
schema (launch/runschema.py).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable

from launch import runschema, trust
from launch.runschema import ACTIVE_STATUSES, STATUSES, TERMINAL_STATUSES, RunRecord  # noqa: F401 - re-exported
from wizard.fsutil import replace_file

RUNS_ROOT_NAME = "wizard-runs"
LATEST = "latest"
LOG_CAP_BYTES = 50 * 1024 * 1024
JSONL_CAP_BYTES = 10 * 1024 * 1024
RUN_JSON_MAX_BYTES = 64 << 20     # seen_pids of a long run with restarts stays far below
LOCK_FILE = "run.lock"
LOST_EXIT_CODE = 137

# Stall detection is on unless --stall-timeout 0: no output from any rank (and, where NVML exists, idle
# GPUs) for this long, counted from the attempt's start, so a hang before or in the first step is found
# exactly as a later one is. 40 minutes, because:
# - any phase where some ranks wait for others (a checkpoint save or evaluation on rank 0, a rank that
#   is behind) ends within the 30 minutes after which the libraries abort a collective themselves (the
#   HF Trainer's ddp_timeout and DeepSpeed's default process-group timeout are 1800 s; NCCL's own
#   default is 10 min), and their error (an NCCL watchdog abort) is the better report: the extra 10
#   minutes let it arrive and be classified first;
# - the phases where no rank waits print as they go (model shards, dataset maps and the training loop
#   draw tqdm bars; each bar redraw counts as output), except a cold JIT build of DeepSpeed's ops
#   (minutes; tens of seconds to ~2 min measured on this project's 2-core test box) and a first
#   torch.compile, well within 40 minutes.
DEFAULT_STALL_TIMEOUT_S = 2400.0


def default_runs_root(cwd: str | os.PathLike[str] | None = None) -> Path:
    return Path(cwd or os.getcwd()) / RUNS_ROOT_NAME


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def point_latest(root: Path, run_dir: Path) -> None:
    """Make <root>/latest point at run_dir (relative symlink, swapped atomically)."""
    link = root / LATEST
    tmp = root / f".{LATEST}.tmp{os.getpid()}"
    try:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        target = os.path.relpath(run_dir, root) if run_dir.parent == root else str(run_dir)
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except OSError:
        # filesystems without symlinks: a pointer file holding the path
        replace_file(link, str(run_dir) + "\n", fsync=False)


def try_lock(run_dir: Path) -> int | None:
    """An fd holding an exclusive flock on RUN_DIR/run.lock, or None when another process holds it.

    The lock lives as long as some process keeps the fd open: the supervisor holds it for the
    whole run (the fd is passed to it), so a second launch into the directory is refused and a
    client may only declare a run lost when the lock is free."""
    import fcntl
    fd = trust.open_private(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def lock_is_free(run_dir: Path) -> bool:
    """Whether nobody holds the run's lock (its supervisor holds it for the whole run), found without writing: no
    lock file means nobody can hold one; an existing one is tried with a shared lock and let go at once."""
    import fcntl
    try:
        fd = trust.open_private(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False            # not a plain file of ours: nothing to conclude from it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)            # closing lets the shared lock go


def create_run_dir(run_dir: str | os.PathLike[str] | None = None,
                   root: str | os.PathLike[str] | None = None) -> tuple[Path, int]:
    """A fresh run directory, locked: (path, fd of the held lock).

    run_dir if given (must be empty or absent, and not locked by another launch), else <root>/<new id>.
    The lock is taken before anything else is written, so two launches started together into one
    directory give one run and one exit 2. <parent>/latest is pointed at it either way, so
    attach/stop without arguments find it.
    """
    from wizard.errors import InputError
    if run_dir is not None:
        path = Path(run_dir).absolute()
        if path.exists() and not path.is_dir():
            raise InputError("--run-dir", f"{path} exists and is not a directory", "a new or empty directory")
    else:
        base = Path(root).absolute() if root else default_runs_root()
        path = base / new_run_id()
    try:
        if not path.parent.exists():        # a runs root of ours: nobody else lists the runs either
            path.parent.mkdir(parents=True, exist_ok=True, mode=trust.PRIVATE_DIR_MODE)
        path.mkdir(exist_ok=True, mode=trust.PRIVATE_DIR_MODE)
    except OSError as exc:
        raise InputError("--run-dir", f"cannot create {path}: {exc.strerror}", "a writable directory") from None
    try:
        st = os.stat(path)
        if st.st_uid != os.geteuid():       # never a directory someone else owns (and may write into)
            raise InputError("--run-dir", str(trust.dir_problem(st, str(path))), "a new or empty directory of your own")
        fd = try_lock(path)
    except OSError as exc:
        raise InputError("--run-dir", f"{path}: {exc}", "a new or empty directory of your own") from None
    if fd is None:
        raise InputError("--run-dir", f"{path} is in use by another launch", "a new or empty directory")
    if any(p.name != LOCK_FILE for p in path.iterdir()):
        os.close(fd)
        raise InputError("--run-dir", f"{path} exists and is not empty", "a new or empty directory")
    os.chmod(path, trust.PRIVATE_DIR_MODE)      # an empty directory given with --run-dir too: its logs are private
    (path / "logs").mkdir(exist_ok=True, mode=trust.PRIVATE_DIR_MODE)
    point_latest(path.parent, path)
    return path, fd


def resolve_run_dir(arg: str | os.PathLike[str] | None, root: str | os.PathLike[str] | None = None) -> Path:
    """RUN_DIR as given to attach/stop: a run directory, a runs root (its latest), a run id, or None."""
    from wizard.errors import InputError
    base = Path(root).absolute() if root else default_runs_root()
    candidates: list[Path] = []
    if arg is None:
        candidates.append(base / LATEST)
    else:
        p = Path(arg)
        candidates += [p, p / LATEST, base / str(arg)]
    for c in candidates:
        if c.is_file() and c.name == LATEST:       # pointer file fallback
            c = Path(c.read_text().strip())
        if (c / "run.json").is_file():
            return c.resolve()
    where = arg if arg is not None else f"{base}/{LATEST}"
    raise InputError("RUN_DIR", f"no run found at {where}", "a run directory holding run.json, or a runs root")


def attempt_dir(run_dir: Path, attempt: int) -> Path:
    return run_dir / "logs" / f"attempt-{attempt}"


def rank_log_path(run_dir: Path, attempt: int, rank: int | str) -> Path:
    return attempt_dir(run_dir, attempt) / f"rank-{rank}.log"


def launcher_log_path(run_dir: Path, attempt: int) -> Path:
    return attempt_dir(run_dir, attempt) / "launcher.log"


CONTROL_FILE = "control.json"     # a client's stop/kill/restart request (launch/follow.py send_control)


class RunState:
    """run.json: a dict kept in memory and replaced on disk atomically on every save()."""

    def __init__(self, run_dir: Path, initial: dict[str, Any]):
        self.path = run_dir / "run.json"
        self.data = dict(initial)
        self._lock = threading.Lock()

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.data.update(fields)
            self._save_locked()

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        # readers need whole files, not durability: run.json is rewritten on every change
        replace_file(self.path, json.dumps(self.data, indent=1, default=str) + "\n", fsync=False)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def read_state(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """run.json as a dict; None while there is none, or it is not a JSON object, not a plain file of this user's,
    or a symlink (read without following it). Its values are not checked: `load_record` / `state_problem` do."""
    try:
        body = json.loads(trust.read_private(Path(run_dir) / "run.json", RUN_JSON_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def attempts_allowed(st: dict[str, Any]) -> int:
    """How many attempts the run may have: 1 + --max-restarts + the restarts the user asked for
    (those do not spend --max-restarts, so `r r` with --max-restarts 0 is attempt 2/2, not 2/1)."""
    def count(v: Any) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
    return 1 + count(st.get("max_restarts")) + count(st.get("user_restarts"))


def state_problem(st: Any) -> str | None:
    """What is wrong with a run.json body (None when it is a run.json the supervisor could have written): the
    schema's one line. Clients act on these fields (signal pids, show a status), so they are checked first."""
    return runschema.problem(st)


def checked_record(run_dir: str | os.PathLike[str]) -> tuple[RunRecord | None, str]:
    """(run.json as a RunRecord, "") for a run directory of this user's whose run.json passes the schema, else
    (None, one line saying what is wrong: whose directory it is, a symlink, not JSON, which field)."""
    path = Path(run_dir) / "run.json"
    problem = trust.run_dir_problem(run_dir)
    if problem:
        return None, problem
    try:
        body = json.loads(trust.read_private(path, RUN_JSON_MAX_BYTES))
    except OSError as exc:             # Untrusted (someone else's file, a symlink) says it in its own words
        return None, f"{path}: {exc}" if isinstance(exc, trust.Untrusted) else \
            f"cannot read {path}: {exc.strerror or exc}"
    except (ValueError, RecursionError):
        return None, f"{path} is not JSON"
    try:
        return runschema.parse(body), ""
    except runschema.RunJsonError as exc:
        return None, f"{path}: {exc}"


def load_record(run_dir: str | os.PathLike[str]) -> RunRecord:
    """run.json of a run directory of this user's, checked against the schema: InputError (exit 2, one line) when
    the directory is someone else's or writable by others, or run.json is missing, a symlink, not JSON or not a
    valid run state. Nothing is ever written over a run.json that fails this."""
    from wizard.errors import InputError
    rec, problem = checked_record(run_dir)
    if rec is None:
        raise InputError("RUN_DIR", f"{problem}; not acted on", "a run directory of your own holding a run.json "
                         "written by wizard launch")
    return rec


def load_state(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """load_record's run.json as the dict it was read as (checked the same way)."""
    return load_record(run_dir).raw


def supervisor_alive(st: dict[str, Any], run_dir: str | os.PathLike[str] | None = None) -> bool:
    """The run's supervisor runs: its pid has the start time run.json recorded. Given the run directory, also that
    the process is this user's and holds the run's lock file open (the supervisor's, not a process whose pid and
    start time someone copied into run.json): only then may it be signalled."""
    if run_dir is None:
        return process_alive(st.get("supervisor_pid"), st.get("supervisor_create_time"))
    return supervisor_process(st, run_dir) is not None


def supervisor_process(st: dict[str, Any], run_dir: str | os.PathLike[str]):
    """The run's supervisor as a psutil.Process, verified (see supervisor_alive); None when it is not there."""
    try:
        rec = runschema.parse(st)
    except runschema.RunJsonError:
        return None
    return trust.process_of_run(rec.supervisor_pid, rec.supervisor_create_time, run_dir, supervisor=True,
                                lock_file=LOCK_FILE)


def recorded_processes(st: dict[str, Any]) -> dict[int, float]:
    """Every process of the run whose start time was recorded: only these may ever be signalled. Entries that are
    not a process id with a start time are left out."""
    out: dict[int, float] = {}
    times = st.get("process_times")
    for pid, ctime in times.items() if isinstance(times, dict) else ():
        try:
            out[runschema.pid_key(pid)] = runschema.epoch(ctime)
        except ValueError:
            continue
    return out


def end_recorded_processes(st: dict[str, Any], run_dir: str | os.PathLike[str], grace: float = 3.0) -> list[int]:
    """SIGTERM, then after `grace` s SIGKILL, every recorded process that is still the run's (pid and start time,
    this user's, WIZARD_RUN_DIR naming this run directory: trust.process_of_run); returns the pids it signalled. A
    pid that now belongs to another process, to another user, or to no process of this run is never signalled."""
    import psutil
    procs = [p for p in (trust.process_of_run(pid, ctime, run_dir) for pid, ctime in recorded_processes(st).items())
             if p is not None]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return sorted(p.pid for p in procs)


def mark_lost_if_dead(run_dir: str | os.PathLike[str], grace: float = 3.0, *, cause: str | None = None,
                      by: str = "client", lost_at: float | None = None,
                      ending: Callable[[dict[str, Any]], list[int]] | None = None) -> dict[str, Any] | None:
    """If run.json says active but its supervisor is gone (pid + start time, and the run's lock is
    free), end what is left of the run (verified pids only), write status "lost" and a "lost"
    event saying when, why (`cause`), who found it (`by`: the reaper, or a client such as attach)
    and what was cleaned. Returns the new state, or None when nothing changed (the supervisor
    lives, the run has ended, or run.json is not valid: never overwritten).

    `ending`: instead of ending the processes here, a function that names those its caller is
    ending (the reaper records `lost` first and ends them after, so the record does not wait for them)."""
    run_dir = Path(run_dir)
    if trust.run_dir_problem(run_dir):      # someone else's, or others may write it: never acted on
        return None
    st = read_state(run_dir)
    if st is None or state_problem(st) or st.get("status") not in ACTIVE_STATUSES or supervisor_alive(st, run_dir):
        return None
    try:
        fd = try_lock(run_dir)
    except OSError:
        return None
    if fd is None:          # the supervisor (a process we cannot see) or another client holds it
        return None
    try:
        st = read_state(run_dir)            # re-read under the lock: it may have just ended
        if st is None or state_problem(st) or st.get("status") not in ACTIVE_STATUSES or supervisor_alive(st, run_dir):
            return None
        cleaned = ending(st) if ending is not None else end_recorded_processes(st, run_dir, grace)
        now = time.time()
        cause = cause or (f"the supervisor (pid {st.get('supervisor_pid')}) is gone without recording an end")
        st.update(status="lost", ended_at=lost_at or now, exit_code=LOST_EXIT_CODE, tracked_pids=[],
                  launcher_pid=None, lost_at=lost_at or now, lost_recorded_at=now, lost_cause=cause,
                  lost_by=by, lost_cleaned=cleaned)
        # The event first: whoever reads `lost` in run.json (a script, a SLURM epilogue) finds the event too.
        EventLog(run_dir / "events.jsonl").emit(
            "lost", st.get("attempt"), status="lost", supervisor_pid=st.get("supervisor_pid"),
            cleaned=cleaned, cause=cause, by=by,
            message=(f"{cause}; {'ending' if ending is not None else 'ended'} {len(cleaned)} leftover processes"
                     if cleaned else f"{cause}; nothing of the run was left"))
        replace_file(run_dir / "run.json", json.dumps(st, indent=1, default=str) + "\n", fsync=False)
        return st
    finally:
        os.close(fd)


class BoundedJsonl:
    """Append-only JSON lines with a size cap: past the cap, keep the newest part (whole lines).

    The kept tail is copied to a temp file that atomically replaces the old one (readers that
    track offsets see the file shrink, or a new inode, and start over). Each object is one write()
    of one whole line, so a reader never sees half an object except at the very end of the file.
    """

    def __init__(self, path: str | os.PathLike[str], cap_bytes: int = JSONL_CAP_BYTES, keep_fraction: float = 0.5):
        self.path = Path(path)
        self.cap = int(cap_bytes)
        self.keep_bytes = max(1, int(self.cap * keep_fraction))
        self._lock = threading.Lock()
        self.rotations = 0
        try:
            self._size = self.path.stat().st_size
        except OSError:
            self._size = 0

    def append(self, obj: dict[str, Any]) -> None:
        line = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._size + len(line) > self.cap:
                self._keep_newest(self.keep_bytes - len(line))
            with trust.open_append(self.path) as f:     # never through a symlink planted in the run directory
                f.write(line)
            self._size += len(line)

    def _keep_newest(self, budget: int) -> None:
        budget = max(0, budget)
        try:
            with os.fdopen(trust.open_private(self.path, os.O_RDONLY), "rb") as f:
                f.seek(0, os.SEEK_END)
                start = max(0, f.tell() - budget - 1)
                f.seek(start)
                tail = f.read()
        except OSError:
            start, tail = 0, b""
        if start > 0:
            # one byte before the cut tells whether we landed on a line start; if not, drop
            # the partial line so the file starts on a whole object
            nl = tail.find(b"\n")
            tail = tail[nl + 1:] if nl >= 0 else b""
        replace_file(self.path, tail, fsync=False)
        self._size = len(tail)
        self.rotations += 1


class EventLog(BoundedJsonl):
    """events.jsonl: {"t", "type", "attempt", ...fields}."""

    def emit(self, type_: str, attempt: int | None = None, **fields: Any) -> dict[str, Any]:
        ev = {"t": round(time.time(), 3), "type": type_, "attempt": attempt}
        ev.update({k: v for k, v in fields.items() if v is not None})
        self.append(ev)
        return ev


def read_jsonl(path: str | os.PathLike[str], last: int | None = None) -> list[dict[str, Any]]:
    """Whole objects from a JSONL file (a torn last line is skipped); [] when it cannot be read."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    continue
    except OSError:
        return []
    return out[-last:] if last else out


class RotatingLog:
    """A binary append log with one backup: past `cap` bytes, <name> becomes <name>.1."""

    def __init__(self, path: Path, cap_bytes: int = LOG_CAP_BYTES):
        self.path = Path(path)
        self.cap = int(cap_bytes)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = trust.open_append(self.path)
        self._size = self._f.tell()
        self.rotations = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._size + len(data) > self.cap and self._size > 0:
            self._rotate()
        self._f.write(data)
        self._size += len(data)

    def _rotate(self) -> None:
        self._f.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._f = trust.open_append(self.path)
        self._size = 0
        self.rotations += 1

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass


def tail_lines(path: Path, n: int = 30, max_bytes: int = 256 * 1024) -> list[str]:
    """The last n lines of a text file (reads at most max_bytes from the end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]            # first one is probably cut
    return lines[-n:]


def process_alive(pid, create_time=None) -> bool:
    """pid runs (not a zombie) and, when run.json recorded its start time, is still that process
    rather than a reused pid."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    import psutil
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - float(create_time)) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):   # gone, not ours, or a create_time that is no number
        return False
