"""This machine's TCP ports, as a launch will meet them: one busy test for `wizard check` (ACC-PORT-IN-USE) and
`wizard launch` (which moves a single-machine run off a busy port), so the two never disagree."""

from __future__ import annotations

import errno
import socket


def port_in_use(port: int) -> bool:
    """True when something listens on the port now: accelerate's own test (connect to localhost), then
    a bind like torchrun's store does (SO_REUSEADDR, so sockets in TIME_WAIT don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return True
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def free_port() -> int:
    """A port nothing listens on now, chosen by the kernel (as accelerate's own get_free_port does for
    main_process_port: 0); it can be taken again before it is used, as theirs can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
