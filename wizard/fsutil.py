"""Safe file writes and bounded reads.

- `FileSet` / emit.write_files: the YAML, the JSON and the plan written as one set under a lock on the
  output dir, staged first, renamed in an order where every state in between is consistent, rolled back
  on any failure or signal; `.bak` only for what really changed, only once the set is in place.
- `replace_file` / `write_atomic`: one file, atomically (a temp file in the same directory, fsynced,
  renamed over the target); `write_atomic` keeps `<path>.bak` when the content differs and does not
  rewrite identical content (no backup, mtime kept).
- `read_bytes_limited` / `loads_limited`: user files with a size and a nesting limit, never blocking on
  a FIFO; every failure one InputError line. `read_json_object` / `read_yaml_mapping`: never-raising
  reads of optional side files.
- `yaml_load` / `yaml_parse`: the one YAML reader (yaml.SafeLoader, refusing alias bombs).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import signal
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from wizard.errors import InputError, note_stop, stop_signal

BACKUP_SUFFIX = ".bak"


@dataclass
class WriteResult:
    path: str
    backup_path: str | None       # where the previous content was kept; None when nothing was replaced
    changed: bool                 # the content on disk differs (or would differ, in a dry run) from before
    diff: str                     # unified diff old -> new; "" for a new file or no change
    created: bool = False         # there was no file before
    dry_run: bool = False         # nothing was written; the fields say what would happen
    note: str | None = None       # the previous file could not be shown (unreadable, not UTF-8, too big)


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


def yaml_load_errors() -> tuple[type[Exception], ...]:
    """What yaml.safe_load raises on bad text, beside ValueError (a bad date, an over-long integer) and
    RecursionError: yaml.YAMLError, and the plain AttributeError / KeyError / IndexError that PyYAML's
    constructors raise for a value an explicit tag can't take (`!!timestamp x`, `!!bool q`, `!!int ""`)."""
    import yaml

    return (yaml.YAMLError, AttributeError, LookupError)


def read_yaml_mapping(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The YAML mapping in `path` (yaml.safe_load, as accelerate reads it); None like read_json_object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml_load(f.read())
    except (OSError, ValueError, RecursionError, *yaml_load_errors()):
        return None
    return data if isinstance(data, dict) else None


# ============================================================================================
# The one YAML reader. PyYAML shares an aliased node instead of copying it, so nine levels of
# anchors, each used nine times by the next, parse in a millisecond into 9**9 values that every walk
# over the result (the nesting check, the rules, json.dumps) then visits one by one: hours. Every
# YAML the wizard reads (answers, accelerate configs, training args, its own files) goes through
# yaml_load / yaml_parse, which count what the aliases expand to before anything is built.

MAX_YAML_VALUES = 100_000           # values after alias expansion; real configs hold a few hundred
MAX_YAML_CHARS = 16 * 1024 * 1024   # scalar characters after alias expansion (4x the largest file read)


class YamlExpansionError(ValueError):
    """A YAML document whose aliases expand past the limits, or refer to the node that contains them."""


def _yaml_children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def yaml_expansion(node) -> tuple[int, int]:
    """(values, scalar characters) of the document under `node` with every alias expanded.

    Computed once per node (aliases share nodes), without recursion; raises YamlExpansionError as soon
    as a limit is passed or a node contains itself (`&a [*a]`), so a bomb costs what its text costs.
    """
    import yaml

    sizes: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()          # the ancestors of the node being visited
    stack = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        key = id(current)
        if children_done:
            open_nodes.discard(key)
            values, chars = 1, len(current.value) if isinstance(current, yaml.ScalarNode) else 0
            for child in _yaml_children(current):
                child_values, child_chars = sizes[id(child)]
                values += child_values
                chars += child_chars
            if values > MAX_YAML_VALUES:
                raise YamlExpansionError(f"its aliases expand it to more than {MAX_YAML_VALUES} values")
            if chars > MAX_YAML_CHARS:
                raise YamlExpansionError(f"its aliases expand it to more than {fmt_limit(MAX_YAML_CHARS)} of text")
            sizes[key] = (values, chars)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise YamlExpansionError("an alias refers to the node that contains it")
        open_nodes.add(key)
        stack.append((current, True))
        stack.extend((child, False) for child in _yaml_children(current) if id(child) not in sizes)
    return sizes[id(node)]


_LOADER: list = []


def _bounded_loader() -> type:
    """yaml.SafeLoader (what accelerate and transformers read with), checking each document's expansion
    between composing it (cheap: aliases are shared) and constructing Python objects from it."""
    if not _LOADER:
        import yaml

        class BoundedSafeLoader(yaml.SafeLoader):
            def compose_document(self):
                node = super().compose_document()
                if node is not None:
                    yaml_expansion(node)
                return node

        _LOADER.append(BoundedSafeLoader)
    return _LOADER[0]


def yaml_parse(text: str) -> tuple[Any, Any]:
    """(yaml.safe_load(text), the composed node or None), refusing alias bombs with YamlExpansionError.

    Raises what yaml.safe_load raises otherwise (yaml_load_errors(), ValueError, RecursionError).
    """
    loader = _bounded_loader()(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return data, node


def yaml_load(text: str) -> Any:
    """yaml.safe_load(text), refusing alias bombs (YamlExpansionError, a ValueError)."""
    return yaml_parse(text)[0]


def unified_diff(old: str, new: str, path: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=path + BACKUP_SUFFIX, tofile=path)
    # A last line without newline would glue onto the next header line of the diff.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def plan_write(path: str, text: str) -> WriteResult:
    """What a set write would do to `path`, without touching the disk (for --dry-run and the review screen)."""
    check_replaceable(path)
    result = describe_replacement(path, text.encode("utf-8"))
    result.dry_run = True
    return result


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
        note_written([path])
        return WriteResult(path, None, True, "", created=True)
    mode = os.stat(path).st_mode & 0o7777
    backup = path + BACKUP_SUFFIX
    # The backup is written atomically too: a crash must not leave a truncated .bak either.
    replace_file(backup, old, mode=mode)
    replace_file(path, text, mode=mode)
    note_written([path])
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


# ============================================================================================
# Bounded reads: every file the wizard reads from the user has a size limit, a depth limit, and
# never blocks (a FIFO or a device where a file should be is refused, not read).

MAX_NESTING = 100                 # JSON/YAML nesting; real configs are under 10 levels deep
KiB_, MiB_ = 1024, 1024 * 1024


def quote_path(path: str | os.PathLike[str]) -> str:
    """A path inside a one-line message: quoted, any newline or control character escaped."""
    return json.dumps(os.fspath(path), ensure_ascii=False)


def one_line(text: str) -> str:
    """A message that stays on one line whatever it quotes (a path with a newline, an error's text)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def file_kind(path: str | os.PathLike[str]) -> str:
    """'missing', 'file' (a regular file, or a link to one), 'directory', 'FIFO', 'socket', 'device', 'link to nothing'."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "link to nothing" if os.path.islink(path) else "missing"
    except NotADirectoryError:
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def read_bytes_limited(path: str | os.PathLike[str], limit: int, field: str, allowed: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; InputError(field, ...) otherwise.

    Opened non-blocking, so a FIFO is refused instead of waiting forever for a writer.
    """
    shown = quote_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(field, f"cannot read {shown}: {exc.strerror or exc}", allowed) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device")
            raise InputError(field, f"{shown} is {kind}, not a regular file", allowed)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 * MiB_, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputError(field, f"{shown} is larger than the {fmt_limit(limit)} limit", allowed)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(field, f"cannot read {shown}: {exc.strerror or exc}", allowed) from None
    finally:
        os.close(fd)


def read_text_limited(path: str | os.PathLike[str], limit: int, field: str, allowed: str) -> str:
    raw = read_bytes_limited(path, limit, field, allowed)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(field, f"{quote_path(path)} is not UTF-8 text (byte {exc.start})", allowed) from None


def fmt_limit(limit: int) -> str:
    return f"{limit // MiB_} MiB" if limit >= MiB_ and limit % MiB_ == 0 else f"{limit} bytes"


def nesting_depth(data: Any) -> int:
    """How deep lists/dicts nest in parsed JSON/YAML, without recursion (a deep document can't overflow it)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            items = list(item.values())
        elif isinstance(item, list):
            items = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            return depth
        stack.extend((child, depth + 1) for child in items)
    return deepest


def loads_limited(text: str, parser: str, field: str, what: str, allowed: str) -> Any:
    """json.loads / yaml.safe_load with a nesting limit; every failure is one InputError line.

    Both parsers recurse per nesting level (RecursionError on 100k brackets), and Python refuses to
    parse an integer of more than 4300 digits (ValueError): both are bad input, not crashes.
    """
    if parser == "json":
        parse, syntax_error = json.loads, json.JSONDecodeError
    else:
        parse, syntax_error = yaml_load, yaml_load_errors()
    try:
        data = parse(text)
    except RecursionError:
        raise InputError(field, f"{what} nests deeper than {MAX_NESTING} levels", allowed) from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise InputError(field, f"{what} is not valid JSON ({exc.msg} at line {exc.lineno})", allowed) from None
        raise InputError(field, f"{what}: {one_line(str(exc))}", allowed) from None
    except syntax_error as exc:  # YAML's (JSON's is a ValueError, above): yaml.YAMLError's first line says where
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(field, f"{what} is not valid {parser.upper()}: {first}", allowed) from None
    if nesting_depth(data) > MAX_NESTING:
        raise InputError(field, f"{what} nests deeper than {MAX_NESTING} levels", allowed)
    return data


# ============================================================================================
# Writing a set of files (default_config.yaml + ds_config.json + wizard_plan.json) as a set.
#
# The output directory is locked (flock on .wizard.lock) for the whole write, so two wizards never
# interleave. Every new file is staged first (a temp file in the target directory, fsynced); then
# the files are renamed into place one by one, in an order the caller chooses so that every state
# in between is itself consistent (emit.write_files: the YAML first names a JSON under a new name).
# Before each rename the file being replaced is kept (a hard link, else a copy), so a failure, a
# signal or an exception rolls back through the same consistent states in reverse. `.bak` files
# appear only after the whole set is in place, and only for files whose content really changed.

LOCK_NAME = ".wizard.lock"
LOCK_TIMEOUT_S = 30.0
STAGE_MARK = ".wset-"            # in every temp name of a set write, so leftovers of a killed one are ours
READ_EXISTING_LIMIT = 4 * MiB_   # larger existing files are replaced (and kept as .bak) without a diff
# Test hook (tests/functional/test_set_write.py): after the Nth rename of a set write (or, with "unlocked",
# right after a complete write released its lock) the process sends itself WIZARD_FAULT_SIGNAL (default
# KILL), so a real writer dies or is interrupted between two renames, or just after the last.
FAULT_ENV, FAULT_SIGNAL_ENV = "WIZARD_FAULT_AFTER", "WIZARD_FAULT_SIGNAL"
_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def dir_lock(directory: str, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive flock on `directory`/.wizard.lock, removed again on release.

    Removing it is safe because a holder checks, after locking, that the file it locked is still
    the one at the path (a waiter that locked an unlinked file retries on the new one).
    """
    path = os.path.join(directory, LOCK_NAME)
    deadline = time.monotonic() + timeout_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise InputError("output_dir", f"another wizard has been writing {quote_path(directory)} "
                                                       f"for {timeout_s:.0f} s (it holds {LOCK_NAME})",
                                         "wait for it to finish, or another --output-dir") from None
                    time.sleep(0.05)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


class _SignalGate:
    """SIGINT/SIGTERM/SIGHUP are held while files are being renamed and acted on between renames.

    A signal in the middle of a rename (or of a rollback) would leave a half-done step; held here, it
    turns into KeyboardInterrupt at the next step boundary, after which the set is rolled back.
    Only the main thread can install handlers; elsewhere (a TUI worker thread) signals stay as they are.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_SignalGate":
        if threading.current_thread() is threading.main_thread():
            for sig in _DEFERRED:
                self._previous[sig] = signal.signal(sig, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        note_stop(signum)
        self.pending = signum

    def check(self) -> None:
        if self.pending is not None:
            raise KeyboardInterrupt(signal.Signals(self.pending).name)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class InterruptedAfterWrite(KeyboardInterrupt):
    """A signal came after the whole set was in place: exit 130, but the files are written."""


class RollbackFailed(OSError):
    """A set write failed and so did putting a file back: the files named hold the new content.

    The disk is still consistent (the rollback stopped at one of the states the write passes through,
    each a YAML beside the JSON it names); the previous content of each named file is kept beside it.
    """

    def __init__(self, undone: list["_Undo"], cause: OSError) -> None:
        originals = _originals_of(undone)
        self.new_files = list(originals)
        self.kept = [p for p in originals.values() if p]
        names = ", ".join(os.path.basename(p) for p in self.new_files)
        kept = ", ".join(os.path.basename(p) for p in self.kept)
        super().__init__(cause.errno, f"the write failed and putting the previous files back failed too "
                                      f"({cause.strerror or cause}): {names} "
                                      f"{'holds' if len(self.new_files) == 1 else 'hold'} the new content"
                                      + (f"; the previous content is kept in {kept}" if kept else ""))


def _originals_of(undone: list["_Undo"]) -> dict[str, str | None]:
    """target -> the temp holding what it was before the write (its first undo; later ones hold in-between states)."""
    originals: dict[str, str | None] = {}
    for undo in undone:
        originals.setdefault(undo.target, undo.previous)
    return originals


# What this process has written through a set write or write_atomic: the CLI reads it to say, whatever
# ends the command (an error, a signal, a full stdout), whether the files on disk are new.
_WRITTEN: list[str] = []


def note_written(paths: list[str]) -> None:
    _WRITTEN.extend(paths)


def written_files() -> list[str]:
    return list(_WRITTEN)


def forget_written() -> None:
    _WRITTEN.clear()


@contextlib.contextmanager
def scratch_writes():
    """Set writes into a scratch directory (`wizard tune`'s trial configs): not the user's files, so they stay out
    of what the CLI reports as written."""
    before = list(_WRITTEN)
    try:
        yield
    finally:
        _WRITTEN[:] = before


def _fault_point(point: int | str) -> None:
    """`point`: the number of renames done, or "unlocked" (the set is written, the lock gone, handlers back)."""
    if os.environ.get(FAULT_ENV) == str(point):
        name = os.environ.get(FAULT_SIGNAL_ENV, "KILL").upper().removeprefix("SIG")
        os.kill(os.getpid(), getattr(signal, "SIG" + name))


@dataclass
class _Undo:
    target: str
    previous: str | None     # a temp holding what `target` was before the rename; None: it did not exist


@dataclass
class FileSet:
    """A set write into one directory: stage(), then commit() in a safe order, then finish().

    Use as a context manager (it takes the lock, holds signals, and rolls back on any exception).
    """
    directory: str
    results: dict[str, WriteResult] = field(default_factory=dict)
    _staged: dict[str, str] = field(default_factory=dict)        # target -> staged temp with the new bytes
    _originals: dict[str, str] = field(default_factory=dict)     # target -> temp holding the original file
    _undo: list[_Undo] = field(default_factory=list)
    _scratch: list[str] = field(default_factory=list)            # every temp we made (removed at the end)
    _created_dirs: list[str] = field(default_factory=list)
    _extras: list[str] = field(default_factory=list)              # stage_extra's files (a YAML may name one)
    _renames: int = 0
    _gate: _SignalGate | None = None
    _stack: contextlib.ExitStack | None = None
    _done: bool = False

    def __enter__(self) -> "FileSet":
        self.directory = os.path.abspath(self.directory)
        self._stack = contextlib.ExitStack()
        try:
            self._gate = self._stack.enter_context(_SignalGate())
            if stop_signal() is not None:      # a stop a library swallowed (cli.py): write nothing after it
                raise KeyboardInterrupt(signal.Signals(stop_signal()).name)
            self._make_directory()
            self._stack.enter_context(dir_lock(self.directory))
        except BaseException:
            self._stack.close()
            self._remove_created_dirs()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None or not self._done:
                self._rollback()
            else:
                # Recorded while signals are still held: a signal from here on finds the set written.
                note_written(sorted(p for p, r in self.results.items() if r.changed))
        finally:
            assert self._stack is not None
            self._stack.close()        # releases the lock, then restores the signal handlers
            if exc_type is not None or not self._done:
                self._remove_created_dirs()
            else:
                _fault_point("unlocked")
        if exc_type is None and self._gate is not None and self._gate.pending is not None:
            raise InterruptedAfterWrite(signal.Signals(self._gate.pending).name)

    # ---- set-up

    def _make_directory(self) -> None:
        missing = []
        current = self.directory
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for path in reversed(missing):
            os.mkdir(path)
            self._created_dirs.append(path)

    def _remove_created_dirs(self) -> None:
        for path in reversed(self._created_dirs):
            try:
                os.rmdir(path)
            except OSError:
                break

    def _temp(self, name: str, data: bytes | None = None, mode: int | None = None) -> str:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}{STAGE_MARK}", suffix=".tmp")
        self._scratch.append(tmp)
        with os.fdopen(fd, "wb") as f:
            if data is not None:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        return tmp

    def _keep(self, target: str) -> str:
        """A temp holding `target` as it is now: a hard link (no read needed, bytes and mode exact), else a copy."""
        name = os.path.basename(target)
        tmp = self._temp(name)
        os.unlink(tmp)
        try:
            os.link(target, tmp, follow_symlinks=False)
        except OSError:
            with open(target, "rb") as f:
                data = f.read()
            replace_file(tmp, data, mode=os.stat(target).st_mode & 0o7777)
        return tmp

    # ---- the write

    def stage(self, path: str, text: str) -> WriteResult:
        """Check the target, read what is there for the diff, and stage the new content (nothing replaced yet)."""
        self._gate and self._gate.check()
        path = os.path.join(self.directory, os.path.basename(path))
        check_replaceable(path)
        check_replaceable(path + BACKUP_SUFFIX)
        new = text.encode("utf-8")
        result = describe_replacement(path, new)
        self.results[path] = result
        if result.changed:
            mode = _default_mode() if result.created else os.stat(path).st_mode & 0o7777
            self._staged[path] = self._temp(os.path.basename(path), new, mode)
            if not result.created:
                self._originals[path] = self._keep(path)
                result.backup_path = path + BACKUP_SUFFIX
        return result

    def stage_extra(self, name_prefix: str, suffix: str, text: str) -> str:
        """A new file under a fresh visible name (the JSON a YAML names while the set changes over)."""
        fd, path = tempfile.mkstemp(dir=self.directory, prefix=name_prefix, suffix=suffix)
        self._scratch.append(path)
        self._extras.append(path)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(path, _default_mode())
        return path

    def changed(self, path: str) -> bool:
        return path in self._staged

    def commit(self, target: str, text: str | None = None) -> None:
        """Rename the staged content (or `text`, staged now) over `target`; undoable until finish()."""
        self._gate and self._gate.check()
        if text is not None:
            mode = os.stat(target).st_mode & 0o7777 if os.path.exists(target) else _default_mode()
            source = self._temp(os.path.basename(target), text.encode("utf-8"), mode)
        else:
            source = self._staged.pop(target)
        self._place(source, target)
        self._gate and self._gate.check()

    def _place(self, source: str, target: str) -> None:
        """Rename `source` over `target`, keeping what `target` was so that the rollback can put it back.

        The undo is recorded only once the rename has happened: a refused rename (an immutable file,
        a mount point) changed nothing, and undoing it would try the same refused rename again.
        """
        previous = None
        if os.path.lexists(target):
            previous = self._originals.get(target) if not any(u.target == target for u in self._undo) else None
            if previous is None:
                previous = self._keep(target)
        try:
            os.replace(source, target)
        except OSError as exc:      # named after the file the user knows, not our temp
            raise OSError(exc.errno, exc.strerror or str(exc), target) from exc
        self._undo.append(_Undo(target, previous))
        self._scratch.remove(source)
        _fsync_dir(self.directory)
        self._renames += 1
        _fault_point(self._renames)

    def finish(self) -> None:
        """The new set is in place: originals become .bak, temps go, stale temps of killed writes too.

        A .bak is one more undoable rename (of a second link to the original, which the rollback of the
        config itself still needs), so a failure here too gives back the old set and the old .bak files.
        """
        self._gate and self._gate.check()
        for target, original in self._originals.items():
            self._place(self._keep(original), target + BACKUP_SUFFIX)
            self._gate and self._gate.check()
        self._done = True
        self._discard_scratch()
        _fsync_dir(self.directory)

    def _rollback(self) -> None:
        """Back through the same states, newest rename first. A step that fails stops it there (every state
        on the way is consistent; skipping one would not be) and raises RollbackFailed naming what is new."""
        while self._undo:
            undo = self._undo[-1]
            try:
                if undo.previous is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(undo.target)
                else:
                    _put_back(undo.previous, undo.target)
            except OSError as exc:
                self._keep_what_disk_needs()
                raise RollbackFailed(self._undo, exc) from exc
            self._undo.pop()
            if undo.previous is not None:
                self._scratch.remove(undo.previous)
        for result in self.results.values():
            result.backup_path = None
            result.changed = False
        self._discard_scratch()
        _fsync_dir(self.directory)

    def _keep_what_disk_needs(self) -> None:
        """After a failed rollback: the temps that still hold a previous content, and a JSON a YAML on disk may
        name, stay; the rest of the scratch goes."""
        needed = {p for p in _originals_of(self._undo).values() if p} | set(self._extras)
        self._scratch = [tmp for tmp in self._scratch if tmp not in needed]
        self._discard_scratch()

    def _discard_scratch(self) -> None:
        for tmp in self._scratch:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._scratch.clear()


def _put_back(previous: str, target: str) -> None:
    """rename(previous, target), also when the failed rename left `target` as the very inode `previous` links to
    (rename between two links of one file does nothing and would leave `previous` behind)."""
    try:
        a, b = os.lstat(previous), os.lstat(target)
        same = (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)
    except FileNotFoundError:
        same = False
    if same:
        os.unlink(previous)
    else:
        os.replace(previous, target)


def remove_stale_temps(directory: str, names: tuple[str, ...], keep: tuple[str, ...] = ()) -> None:
    """Temps a killed set write left behind (only ours: they carry STAGE_MARK), except those in `keep`."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        path = os.path.join(directory, entry)
        if path in keep:
            continue
        if any(entry.startswith(f".{n}{STAGE_MARK}") for n in names):
            with contextlib.suppress(OSError):
                os.unlink(path)


def check_replaceable(path: str) -> None:
    """A config may replace a missing file or a regular one; a directory, FIFO or device there is exit 2."""
    kind = file_kind(path)
    if kind in ("missing", "file", "link to nothing"):
        return
    raise InputError("output_dir", f"{quote_path(path)} is a {kind}, not a file; move it away to write "
                                   f"{os.path.basename(path)}", "a directory whose config files are regular files")


def describe_replacement(path: str, new: bytes) -> WriteResult:
    """What replacing `path` with `new` changes; the existing file is only read for the diff, never trusted.

    An unreadable, non-UTF-8 or huge existing file is still replaced (and kept as .bak): the note says so.
    """
    name = os.path.basename(path)
    if not os.path.lexists(path):
        return WriteResult(path, None, True, "", created=True)
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            old = f.read(READ_EXISTING_LIMIT + 1)
    except OSError as exc:
        return WriteResult(path, None, True, "", note=f"replacing an unreadable {name} "
                                                       f"({exc.strerror or exc}); kept as {name}{BACKUP_SUFFIX}")
    if old == new:
        return WriteResult(path, None, False, "")
    if len(old) > READ_EXISTING_LIMIT:
        return WriteResult(path, None, True, "", note=f"replacing a {name} larger than "
                                                       f"{fmt_limit(READ_EXISTING_LIMIT)} (no diff shown); "
                                                       f"kept as {name}{BACKUP_SUFFIX}")
    try:
        old_text = old.decode("utf-8")
    except UnicodeDecodeError:
        return WriteResult(path, None, True, "", note=f"replacing an unreadable {name} (not UTF-8 text); "
                                                       f"kept as {name}{BACKUP_SUFFIX}")
    return WriteResult(path, None, True, unified_diff(old_text, new.decode("utf-8"), path))
