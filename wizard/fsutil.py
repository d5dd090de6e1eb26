"""Safe file writes (atomic replace, a `.bak` of what was there, the diff of the change) and
never-raising reads of optional JSON/YAML side files.

A config file is either the old one or the new one, never half of each: the new text goes to a
temporary file in the same directory (same filesystem, so the rename is atomic), is fsynced, and
only then renamed over the target. An existing file with different content is copied to
`<path>.bak` first; identical content is not rewritten at all (no backup, mtime kept).
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from wizard.errors import InputError

BACKUP_SUFFIX = ".bak"


@dataclass
class WriteResult:
    path: str
    backup_path: str | None       # where the previous content was kept; None when nothing was replaced
    changed: bool                 # the content on disk differs (or would differ, in a dry run) from before
    diff: str                     # unified diff old -> new; "" for a new file or no change
    created: bool = False         # there was no file before
    dry_run: bool = False         # nothing was written; the fields say what would happen


def _read_existing(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file is missing, unreadable, not JSON or not an object.

    For files that are optional or that another process rewrites (run.json, the control file, a
    saved plan): their absence or damage is a state to handle, not an error to report.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):       # ValueError covers JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The YAML mapping in `path` (yaml.safe_load, as accelerate reads it); None like read_json_object."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def unified_diff(old: str, new: str, path: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=path + BACKUP_SUFFIX, tofile=path)
    # A last line without newline would glue onto the next header line of the diff.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def plan_write(path: str, text: str) -> WriteResult:
    """What write_atomic would do, without touching the disk (for --dry-run)."""
    old = _read_existing(path)
    if old is None:
        return WriteResult(path, None, True, "", created=True, dry_run=True)
    if old == text:
        return WriteResult(path, None, False, "", dry_run=True)
    return WriteResult(path, None, True, unified_diff(old, text, path), dry_run=True)


def _fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows opening a dir.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def replace_file(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                 fsync: bool = True) -> None:
    """Put `data` at `path` atomically: a temp file in the same directory, then os.replace.

    A reader sees the old content or the new, never a mix. `mode` None keeps the mode of the file
    being replaced (the umask default for a new one). `fsync` also makes it durable across a crash
    (configs); files rewritten often that only need readers to see whole content (run.json) skip it.
    Raises OSError; never leaves the temp file behind.
    """
    path = os.fspath(path)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = _default_mode()
    raw = data.encode("utf-8") if isinstance(data, str) else data
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:
        _fsync_dir(directory)


def write_atomic(path: str, text: str) -> WriteResult:
    """Write `text` to `path` atomically; keep the previous content as `path.bak` when it differs."""
    old = _read_existing(path)
    if old is not None and old == text:
        return WriteResult(path, None, False, "")
    if old is None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        replace_file(path, text)
        return WriteResult(path, None, True, "", created=True)
    mode = os.stat(path).st_mode & 0o7777
    backup = path + BACKUP_SUFFIX
    # The backup is written atomically too: a crash must not leave a truncated .bak either.
    replace_file(backup, old, mode=mode)
    replace_file(path, text, mode=mode)
    return WriteResult(path, backup, True, unified_diff(old, text, path))


def restore(result: WriteResult) -> None:
    """Undo a write_atomic (used when the second file of a pair fails): back to the previous state."""
    if result.dry_run or not result.changed:
        return
    if result.created:
        try:
            os.unlink(result.path)
        except FileNotFoundError:
            pass
        return
    if result.backup_path:
        old = _read_existing(result.backup_path)
        if old is not None:
            replace_file(result.path, old, mode=os.stat(result.backup_path).st_mode & 0o7777)


def nearest_existing(path: str) -> str:
    """`path` or its closest existing parent (the directory a new file there would land in)."""
    current = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def check_writable_dir(path: str) -> None:
    """Raise InputError('output_dir', ...) unless `path` exists as a writable dir or could be created.

    Writes nothing (not even the directory): it runs before anything is written, so a bad
    --output-dir leaves the disk untouched.
    """
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise InputError("output_dir", f"{target} exists and is not a directory",
                             "a writable directory (created if missing)")
        if not os.access(target, os.W_OK | os.X_OK):
            raise InputError("output_dir", f"{target} is not writable", "a writable directory")
        return
    existing = nearest_existing(target)
    if not os.path.isdir(existing):
        raise InputError("output_dir", f"cannot create {target}: {existing} is not a directory",
                         "a writable directory (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError("output_dir", f"cannot create {target}: {existing} is not writable",
                         "a writable directory (created if missing)")


def check_writable_file(path: str) -> None:
    """The file's directory is writable and the path is not a directory (checked before writing)."""
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(target):
        raise InputError("output_dir", f"{target} is a directory, expected a file path", "a file path")
    check_writable_dir(os.path.dirname(target))
