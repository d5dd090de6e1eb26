"""The preflight's shared secret: how the main node tells the run's own nodes from anyone else who reaches its port.

The main node listens on main_process_port, on every interface: whoever can reach the port can connect. A node proves
it holds the run's secret without sending it (HMAC-SHA256 over both sides' fresh nonces and its machine rank), and the
main node proves it back before a node sends its facts; a connection that cannot is refused (rendezvous.py). The
secret comes, first found first:

1. `$WIZARD_PREFLIGHT_SECRET` (at least 16 characters): what a job passes to every node. The sbatch script of
   `wizard launch --emit-slurm` makes a fresh one per job and srun hands it to every node's task in the environment
   (/proc/PID/environ is readable by the job's user and root only); set it yourself for `--machine-rank` by hand;
2. over ssh's stdin (`--secret-stdin`): how the main node gives it to the hosts it starts itself (DeepSpeed's pdsh /
   MPI launchers, fanout.py), never on a command line (`ps` shows those to everyone);
3. the key file `${XDG_CONFIG_HOME:-~/.config}/wizard/preflight.key` (or `$WIZARD_PREFLIGHT_KEY_FILE`): 32 random
   bytes, created 0600 on first use. Where the home directory is shared between the nodes (NFS, the usual cluster)
   every node of the user's finds the same one with nothing to set up; elsewhere copy it to each node (`scp`), or
   use 1.

A key file that others can read, or that is not the user's, is refused (exit 2): its secret would prove nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from wizard.errors import InputError

SECRET_ENV = "WIZARD_PREFLIGHT_SECRET"
KEY_FILE_ENV = "WIZARD_PREFLIGHT_KEY_FILE"
MIN_CHARS = 16
MAX_CHARS = 4096
PROTOCOL = b"wizard-preflight/2"


@dataclass(frozen=True)
class Secret:
    key: bytes
    source: str                 # where it came from, in words for a finding ("$WIZARD_PREFLIGHT_SECRET")

    def __repr__(self) -> str:  # never in a traceback or a log
        return f"Secret(from {self.source})"


def key_file(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(KEY_FILE_ENV):
        return Path(env[KEY_FILE_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "wizard" / "preflight.key"


def from_text(text: str, source: str, field: str) -> Secret:
    value = text.strip()
    if not MIN_CHARS <= len(value) <= MAX_CHARS:
        raise InputError(field, f"{len(value)} characters", f"a secret of {MIN_CHARS}-{MAX_CHARS} characters, the "
                         "same on every node (e.g. `openssl rand -hex 32`)")
    return Secret(value.encode("utf-8", "surrogateescape"), source)


def _read_key_file(path: Path) -> Secret:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(KEY_FILE_ENV, f"cannot read {path}: {exc.strerror or exc}",
                         "a file of your own holding the preflight's secret") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise InputError(KEY_FILE_ENV, f"{path} is not a plain file of yours",
                             "a file of your own holding the preflight's secret")
        if st.st_mode & 0o077:
            raise InputError(KEY_FILE_ENV, f"{path} can be read by others (mode {stat.S_IMODE(st.st_mode):04o}), so "
                             "its secret proves nothing", f"`chmod 600 {path}`")
        text = f.read(MAX_CHARS + 1).decode("utf-8", "surrogateescape")
    return from_text(text, f"the key file {path}", KEY_FILE_ENV)


def _create_key_file(path: Path) -> None:
    """A new key file, 0600, appearing whole (written aside, then linked into place: a node reading it at the same
    moment on a shared home sees all of it or none), never replacing one that another node made first."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass                      # another node (or process) made it first: that one is the secret
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def resolve(environ: dict[str, str] | None = None, create: bool = True) -> Secret:
    """This node's secret: $WIZARD_PREFLIGHT_SECRET, else the key file (made on first use when `create`).
    InputError (exit 2) when it is too short or the key file is unsafe."""
    env = os.environ if environ is None else environ
    if env.get(SECRET_ENV):
        return from_text(env[SECRET_ENV], f"${SECRET_ENV}", SECRET_ENV)
    path = key_file(env)
    if create and not os.path.lexists(path):
        try:
            _create_key_file(path)
        except OSError as exc:
            raise InputError(KEY_FILE_ENV, f"cannot create {path}: {exc.strerror or exc}",
                             f"a writable place for the key file, or ${SECRET_ENV}") from None
    return _read_key_file(path)


def proof(secret: Secret, role: str, *parts: object) -> str:
    """HMAC-SHA256 of the protocol, the role ("node" or "main") and the parts: what proves the secret without
    sending it. A fresh nonce from each side among the parts makes every proof good for one connection only."""
    msg = b"|".join([PROTOCOL, role.encode(), *(str(p).encode() for p in parts)])
    return hmac.new(secret.key, msg, hashlib.sha256).hexdigest()


def verify(secret: Secret, given: object, role: str, *parts: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode("ascii", "replace"),
                                                          proof(secret, role, *parts).encode())


def nonce() -> str:
    return secrets.token_hex(16)
