"""The nodes meet at main_process_ip:main_process_port, where torch's store will listen: the main node serves there,
the others connect, and each connection proves what the real rendezvous needs (the port can be bound on the main
node; every node resolves and reaches it; what answers there is the main node, not another program).

JSON lines over TCP, nothing imported beyond the standard library. The server speaks first (a banner with its
token), so a client that reaches a program that accepts and stays silent, or says something else, knows within
BANNER_TIMEOUT_S that it is not the main node's rendezvous. Every wait has a deadline. At the end the clients close
first (the server waits for their EOF), so the connections' TIME_WAIT is on the clients' side and the main node's
port is free for torch's store the moment the launch starts it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable

BANNER = "wizard-preflight/1"
BANNER_TIMEOUT_S = 3.0
RETRY_S = 0.5


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall((json.dumps(msg, default=str) + "\n").encode())


class LineReader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next JSON line before the (monotonic) deadline; None on EOF or timeout; ValueError on a line that
        is not JSON."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                return None
            except OSError:
                return None
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > 64 << 20:
                raise ValueError("line too long")
        line, _, self.buf = self.buf.partition(b"\n")
        msg = json.loads(line.decode("utf-8", "replace"))
        if not isinstance(msg, dict):
            raise ValueError("not an object")
        return msg


def port_holder(port: int) -> str | None:
    """Who listens on the port on this machine, in words ("pid 123 python3"), when the OS tells us."""
    try:
        import psutil
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
                if c.pid:
                    try:
                        p = psutil.Process(c.pid)
                        return f"pid {c.pid} {' '.join(p.cmdline()[:3]) or p.name()}"[:120]
                    except psutil.Error:
                        return f"pid {c.pid}"
                return "a process of another user"
    except Exception:                # psutil may be refused the table: the port is taken all the same
        pass
    return None


class Server:
    """The main node's side. `Server(port)` raises OSError (EADDRINUSE) when the port is taken."""

    def __init__(self, port: int, host: str = ""):
        self.token = secrets.token_hex(8)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # as torch's TCPStore does: a port in TIME_WAIT from an earlier run is free, a listener is not
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(64)
        except OSError:
            self.sock.close()
            raise
        self.port = port
        self.clients: dict[int, tuple[socket.socket, LineReader, dict[str, Any]]] = {}
        self.duplicates: list[int] = []
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            threading.Thread(target=self._greet, args=(conn,), daemon=True).start()

    def _greet(self, conn: socket.socket) -> None:
        try:
            send(conn, {"banner": BANNER, "token": self.token})
            reader = LineReader(conn)
            hello = reader.read(time.monotonic() + 30)
        except (OSError, ValueError):
            hello = None
        if not hello or not isinstance(hello.get("rank"), int):
            conn.close()               # the main node's own reach test, or a stranger
            return
        with self.lock:
            if hello["rank"] in self.clients or hello["rank"] == 0:
                self.duplicates.append(hello["rank"])
                send(conn, {"abort": f"another node already joined as machine_rank {hello['rank']}"})
                conn.close()
                return
            self.clients[hello["rank"]] = (conn, reader, hello)

    def wait_for(self, ranks: set[int], deadline: float, lost: Callable[[], set[int]] | None = None) -> None:
        """Until every rank of `ranks` joined, or the deadline; or until those missing are all `lost()`."""
        while time.monotonic() < deadline:
            with self.lock:
                missing = ranks - set(self.clients)
            if not missing or (lost is not None and missing <= lost()):
                return
            time.sleep(0.05)

    def joined(self) -> dict[int, dict[str, Any]]:
        with self.lock:
            return {r: h for r, (_, _, h) in self.clients.items()}

    def broadcast(self, msg: dict[str, Any]) -> None:
        with self.lock:
            conns = list(self.clients.items())
        for rank, (conn, _, _) in conns:
            try:
                send(conn, msg)
            except OSError:
                pass

    def collect(self, key: str, deadline: float) -> dict[int, Any]:
        """Each client's next message's `key` (clients read in parallel, all by the same deadline)."""
        out: dict[int, Any] = {}
        with self.lock:
            conns = list(self.clients.items())

        def one(rank: int, reader: LineReader) -> None:
            try:
                msg = reader.read(deadline)
            except ValueError:
                msg = None
            if msg is not None and key in msg:
                out[rank] = msg[key]
        threads = [threading.Thread(target=one, args=(r, rd), daemon=True) for r, (_, rd, _) in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 1)
        return out

    def finish(self, msg: dict[str, Any], deadline: float) -> None:
        """Stop listening (the port is torch's from now on), send the verdict, and wait for each client to close."""
        self._stop_listening()
        self.broadcast(msg)
        with self.lock:
            conns = list(self.clients.values())
        for conn, reader, _ in conns:
            try:
                reader.read(deadline)           # EOF (None) once the client has closed
            except (ValueError, OSError):
                pass
            conn.close()

    def _stop_listening(self) -> None:
        """Close the listening socket for good: shutdown wakes the accept thread (a plain close from another thread
        leaves the socket listening until its accept returns), and it is joined."""
        self.closed = True
        for step in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                step()
            except OSError:
                pass
        if self.thread is not threading.current_thread():
            self.thread.join(5)

    def close(self) -> None:
        self._stop_listening()
        with self.lock:
            for conn, _, _ in self.clients.values():
                conn.close()


def probe_connect(ip: str, port: int, deadline: float, expect_token: str | None = None
                  ) -> tuple[socket.socket | None, LineReader | None, dict[str, Any]]:
    """Connect to ip:port, retrying a refused or unreachable connection until the deadline (the main node may
    start later), and read the banner. (socket, reader, outcome): outcome["kind"] is "ok", "refused", "timeout",
    "unreachable", "foreign" (something else answers) or "self" (the main node's own test reached another node's
    rendezvous)."""
    start = time.monotonic()
    last: dict[str, Any] = {"kind": "timeout", "detail": "no answer"}
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            last["seconds"] = time.monotonic() - start
            return None, None, last
        try:
            sock = socket.create_connection((ip, port), timeout=min(left, 5.0))
        except ConnectionRefusedError:
            last = {"kind": "refused", "detail": "connection refused"}
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        except (socket.timeout, TimeoutError):
            last = {"kind": "timeout", "detail": "the connection timed out (packets dropped: a firewall?)"}
            continue
        except OSError as exc:
            kind = "unreachable" if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else "timeout"
            last = {"kind": kind, "detail": exc.strerror or str(exc)}
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        reader = LineReader(sock)
        try:
            banner = reader.read(time.monotonic() + BANNER_TIMEOUT_S)
        except (ValueError, UnicodeDecodeError):
            banner = {"garbage": True}
        if not banner or banner.get("banner") != BANNER:
            sock.close()
            what = ("it accepted the connection and said nothing for "
                    f"{BANNER_TIMEOUT_S:g} s" if not banner else "it answered with something else")
            return None, None, {"kind": "foreign", "detail": what, "seconds": time.monotonic() - start}
        if expect_token is not None and banner.get("token") != expect_token:
            sock.close()
            return None, None, {"kind": "self", "seconds": time.monotonic() - start}
        return sock, reader, {"kind": "ok", "seconds": time.monotonic() - start, "pid": os.getpid()}
