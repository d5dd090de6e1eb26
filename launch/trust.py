"""Whose run directory, whose files, whose processes: what every client of a run directory (`wizard stop`, `attach`,
`runs`, the launch view, the reaper) checks before it takes run.json as the truth or signals a pid it names.

A run directory is the user's own, written by the user's own supervisor. Someone else who can write into it (a
shared project directory, a group-writable wizard-runs/) could otherwise point its pids at any process of the user's
and have `wizard stop` end it, or plant symlinks that make an append land in the user's ~/.bashrc. So:
- a run directory is acted on only when it is owned by this user and writable by nobody else (`dir_problem`); run
  directories are created 0700 (their logs hold command lines and the ranks' output);
- files inside are opened without following symlinks, and one that is appended to must be a plain file of this
  user's with one link (`open_private`: a hard link to another file of the user's is refused too);
- a connection to the supervisor's socket speaks for a rank only when the kernel says (SO_PEERCRED) it comes from
  a process of this user's that descends from the attempt's launcher (`peer_problem`);
- a pid from run.json is signalled only when the process still has the recorded start time (pid reuse), belongs to
  this user, and is the run's: the supervisor holds the run's lock file open (`holds_open`), every process it
  started carries the run directory in its environment (`carries_run`: WIZARD_RUN_DIR, set for the launcher and
  inherited by every rank).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from pathlib import Path

RUN_DIR_ENV = "WIZARD_RUN_DIR"      # the supervisor sets it for the launcher; every rank inherits it
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class Untrusted(OSError):
    """A run directory or file this user must not act on; str() is one line saying why."""


def _who(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def dir_problem(st: os.stat_result, what: str) -> str | None:
    """Why a directory with this stat is not this user's own to act on (None: it is)."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{what} belongs to {_who(st.st_uid)}, not to you ({_who(os.geteuid())})"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("its group", 0o020), ("every user", 0o002)) if st.st_mode & bit)
        return (f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): anyone who can write there "
                f"could forge its run.json; `chmod go-w` it (run directories are created {PRIVATE_DIR_MODE:04o})")
    return None


def run_dir_problem(run_dir: str | os.PathLike[str]) -> str | None:
    """Why RUN_DIR is not to be read as the truth or acted on (None: it is this user's and nobody else writes it)."""
    try:
        st = os.stat(run_dir)
    except OSError as exc:
        return f"{run_dir}: {exc.strerror or exc}"
    return dir_problem(st, str(run_dir))


def check_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Untrusted (one line) unless RUN_DIR is this user's own."""
    problem = run_dir_problem(run_dir)
    if problem:
        raise Untrusted(problem)


def file_problem(st: os.stat_result, what: str, single_link: bool = False) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"{what} is not a plain file"
    if st.st_uid != os.geteuid():
        return f"{what} belongs to {_who(st.st_uid)}, not to you"
    if single_link and st.st_nlink != 1:
        return f"{what} has {st.st_nlink} hard links (a link to another file is never written through)"
    return None


def open_private(path: str | os.PathLike[str], flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """os.open for a file inside a run directory: never through a symlink (O_NOFOLLOW), and the file opened must be
    a plain file of this user's (with one link when it is opened for writing). Untrusted otherwise."""
    # O_NONBLOCK: a FIFO planted under the file's name must not block the open (regular files ignore the flag)
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        problem = file_problem(os.fstat(fd), str(path), single_link=bool(flags & (os.O_WRONLY | os.O_RDWR)))
    except OSError:
        os.close(fd)
        raise
    if problem:
        os.close(fd)
        raise Untrusted(problem)
    return fd


def open_append(path: str | os.PathLike[str], binary_buffering: int = 0):
    """A file object appending to PATH (created 0600), opened as open_private opens it."""
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "ab", buffering=binary_buffering)


def read_private(path: str | os.PathLike[str], limit: int) -> bytes:
    """The content of a plain file of this user's, read without following a symlink; Untrusted or OSError otherwise
    (EFBIG past `limit` bytes)."""
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


# ----------------------------------------------------------------------------- processes


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def owned_by_me(proc) -> bool:
    """The process runs as this user (its real and effective uid): never another user's, whatever run.json says."""
    import psutil
    try:
        uids = proc.uids()
    except psutil.Error:
        return False
    return uids.real == os.geteuid() and uids.effective == os.geteuid()


def carries_run(proc, run_dir: str | os.PathLike[str]) -> bool:
    """The process was started for this run: its environment names this run directory (the same directory, by
    device and inode) in WIZARD_RUN_DIR."""
    import psutil
    try:
        named = proc.environ().get(RUN_DIR_ENV)
        return bool(named) and _same_file(os.stat(named), os.stat(run_dir))
    except (psutil.Error, OSError):
        return False


def holds_open(pid: int, path: str | os.PathLike[str]) -> bool:
    """The process has PATH open (one of its descriptors is that file, by device and inode): how the run's
    supervisor, which holds the run's lock file for the whole run, is told from any other process."""
    try:
        target = os.stat(path, follow_symlinks=False)
        fds = os.listdir(f"/proc/{int(pid)}/fd")
    except (OSError, ValueError):
        return False
    for fd in fds:
        try:
            if _same_file(os.stat(f"/proc/{int(pid)}/fd/{fd}"), target):
                return True
        except OSError:
            continue
    return False


def process_of_run(pid: int, create_time: float, run_dir: str | os.PathLike[str], *, supervisor: bool = False,
                   lock_file: str = "run.lock"):
    """The psutil.Process for pid when it is this run's process: it runs, has the start time run.json recorded for
    it (a reused pid is another process), belongs to this user, and is the run's (the supervisor holds the run's
    lock file open; any other process carries the run directory in WIZARD_RUN_DIR). None otherwise."""
    import psutil
    try:
        proc = psutil.Process(int(pid))
        if abs(proc.create_time() - float(create_time)) > 0.05 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.Error, TypeError, ValueError, OverflowError):
        return None
    if int(pid) in (0, 1, os.getpid()) or not owned_by_me(proc):
        return None
    ours = holds_open(pid, Path(run_dir) / lock_file) if supervisor else carries_run(proc, run_dir)
    return proc if ours else None


# ----------------------------------------------------------------------------- the supervisor's socket


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket, as the kernel recorded it at connect()."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def descends_from(pid: int, ancestor: int) -> bool:
    """pid is ancestor's child, grandchild, ... (by the processes' parent links now)."""
    import psutil
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def peer_problem(conn: socket.socket, launcher_pid: int | None) -> tuple[int | None, str | None]:
    """(the peer's pid, why it may not speak for a rank of the attempt whose launcher is launcher_pid; None: it may).
    Only a process of this user's that descends from the launcher may: the kernel says who connected
    (SO_PEERCRED), whatever the peer then claims."""
    try:
        pid, uid, _gid = peer_credentials(conn)
    except OSError as exc:
        return None, f"its credentials cannot be read ({exc.strerror or exc})"
    if uid != os.geteuid():
        return pid, f"it runs as uid {uid}, not as this run's user (uid {os.geteuid()})"
    if launcher_pid is None or not descends_from(pid, launcher_pid):
        return pid, "it is not a process of this attempt (no descendant of its launcher)"
    return pid, None
