"""The nodes meet at main_process_ip:main_process_port, where torch's store will listen: the main node serves there,
the others connect, and each connection proves what the real rendezvous needs (the port can be bound on the main
node; every node resolves and reaches it; what answers there is the main node, not another program) and that both
ends are the run's (they hold its secret: secret.py).

JSON lines over TCP, nothing imported beyond the standard library. The server speaks first (a banner with a fresh
nonce), so a client that reaches a program that accepts and stays silent, or says something else, knows within
BANNER_TIMEOUT_S that it is not the main node's rendezvous. Then:

    main -> node   {"banner": "wizard-preflight/2", "token": NONCE_MAIN}
    node -> main   {"rank": R, "nonce": NONCE_NODE, "proof": HMAC(secret, node|NONCE_MAIN|NONCE_NODE|R)}
    main -> node   {"welcome": HMAC(secret, main|NONCE_MAIN|NONCE_NODE|R)}   or {"abort": why}
    node -> main   {"facts": {...}, "reach": {...}}                        (only once the main node proved itself)

and the preflight's own messages (run.py). Nobody who lacks the secret joins, nor learns the facts; the secret never
crosses the wire. Everything read is bounded (MAX_LINE_BYTES a line, read in linear time; MAX_GREETING connections
being greeted at once, each within AUTH_TIMEOUT_S: past that the server stops accepting until one is done, the
kernel's backlog holding the others, so 64 nodes arriving at once all get in; MAX_GREETING_PER_ADDRESS from one
address, past which it refuses) and checked against messages.py before use. Once a node joined, one thread per
node reads what it sends into the server's inbox, so the main node hears a failure (or a node's end: EOF) the
moment it comes, whatever it waits for. Every wait has a deadline. At the end the clients close first (the server
waits for their EOF), so the connections' TIME_WAIT is on the clients' side and the main node's port is free for
torch's store the moment the launch starts it.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from wizard.preflight import messages
from wizard.preflight.secret import Secret, nonce, proof, verify

PROTOCOL = "wizard-preflight/"
BANNER = PROTOCOL + "3"           # 3: the main node stops a collective under way, and sends each node its rows
BANNER_TIMEOUT_S = 3.0
AUTH_TIMEOUT_S = 10.0           # a connection proves the secret within this, or is closed
JOIN_MESSAGE_TIMEOUT_S = 30.0   # a proven node sends its facts within this
RETRY_S = 0.5
MAX_LINE_BYTES = 1 << 20        # a node's facts are a few KiB; nothing the preflight sends comes near
MAX_GREETING = 32               # connections being greeted at once (each holds a thread and up to a line)...
MAX_GREETING_PER_ADDRESS = 4    # ...and from one address: a flood from one host cannot take every slot
BACKLOG = 1024                  # connections the kernel holds while MAX_GREETING are being greeted
MAX_REFUSALS_KEPT = 20


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall((json.dumps(msg, default=str) + "\n").encode())


class Inbox:
    """A node's side after it joined: what the main node sends, read by a thread into a queue and checked against
    messages.FromMain, so the node hears a stop while its collective runs."""

    def __init__(self, reader: "LineReader"):
        self.reader = reader
        self.queue: queue.Queue = queue.Queue()
        self.ended = False          # the main node's end closed (or the connection broke)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                raw = self.reader.read(time.monotonic() + 3600)
            except ValueError as exc:
                self.queue.put((None, f"the main node sent a message that is not valid ({exc})"))
                return
            if raw is None:
                if self.reader.eof:
                    self.ended = True
                    self.queue.put((None, None))
                    return
                continue
            msg, problem = messages.check(messages.FromMain, raw)
            self.queue.put((msg, f"the main node sent a message that is not valid ({problem})" if problem else None))
            if problem:
                return

    def next(self, deadline: float, wanted: Callable[[Any], bool] = lambda m: True) -> tuple[Any, str | None]:
        """The next message `wanted` takes, by the deadline: (it, None); (None, None) at EOF or the deadline; (None,
        what is wrong) for a message that is not valid."""
        while True:
            try:
                msg, bad = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None, None
            if bad or msg is None:
                self.queue.put((msg, bad))          # EOF and a bad message stay for the next reader
                return None, bad
            if wanted(msg):
                return msg, None


class LineReader:
    """JSON lines from a socket, at most MAX_LINE_BYTES each, in linear time (each byte is looked at once)."""

    def __init__(self, sock: socket.socket, limit: int = MAX_LINE_BYTES):
        self.sock = sock
        self.buf = bytearray()
        self.scanned = 0            # bytes of buf already known to hold no newline
        self.limit = limit
        self.eof = False            # the other end closed (or the connection broke): nothing more will come

    def read(self, deadline: float) -> dict[str, Any] | None:
        """The next JSON line before the (monotonic) deadline; None on EOF or timeout; ValueError on a line that
        is not a JSON object, or longer than the limit."""
        while True:
            nl = self.buf.find(b"\n", self.scanned)
            if nl >= 0:
                break
            self.scanned = len(self.buf)
            if len(self.buf) > self.limit:
                raise ValueError(f"a line longer than {self.limit} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                return None
            except OSError:
                self.eof = True
                return None
            if not chunk:
                self.eof = True
                return None
            self.buf += chunk
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        self.scanned = 0
        if nl > self.limit:
            raise ValueError(f"a line longer than {self.limit} bytes")
        try:
            msg = json.loads(line.decode("utf-8", "replace"))
        except RecursionError:
            raise ValueError("nested too deeply") from None
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


@dataclass
class Refusal:
    address: str
    why: str


class Server:
    """The main node's side. `Server(port, secret)` raises OSError (EADDRINUSE) when the port is taken. Only nodes
    that prove the secret join (machine ranks 1 to `machines` - 1); the others are refused and counted."""

    def __init__(self, port: int, secret: Secret, machines: int = messages.MAX_RANK, host: str = ""):
        self.token = nonce()
        self.secret = secret
        self.machines = machines
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # as torch's TCPStore does: a port in TIME_WAIT from an earlier run is free, a listener is not
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
            self.sock.listen(BACKLOG)
        except OSError:
            self.sock.close()
            raise
        self.port = port
        self.clients: dict[int, tuple[socket.socket, LineReader, dict[str, Any]]] = {}
        self.duplicates: list[int] = []
        self.refused: list[Refusal] = []
        self.refused_count = 0
        self.greeting: dict[str, int] = {}      # address -> connections being greeted from it
        self.lock = threading.Lock()
        self.slot = threading.Condition(self.lock)     # a greeting ended
        self.inbox: queue.Queue = queue.Queue()         # (rank, message or None at EOF) from joined nodes
        self.ended: set[int] = set()                    # joined nodes whose connection ended
        self.accepting = True                           # until finish(): the port is torch's from then on
        self.closed = False                             # until close(): the nodes' readers stop
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.5)
        while self.accepting:
            with self.slot:             # every greeting slot taken: the kernel's backlog holds the next ones
                while sum(self.greeting.values()) >= MAX_GREETING and self.accepting:
                    self.slot.wait(0.5)
            try:
                conn, addr = self.sock.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            where = str(addr[0]) if isinstance(addr, tuple) else "?"
            with self.lock:
                busy = self.greeting.get(where, 0) >= MAX_GREETING_PER_ADDRESS
                if not busy:
                    self.greeting[where] = self.greeting.get(where, 0) + 1
            if busy:                    # a flood from one host: each connection would hold a thread and a buffer
                self._refuse(addr, "too many connections at once")
                conn.close()
                continue
            threading.Thread(target=self._greet, args=(conn, where), daemon=True).start()

    def _refuse(self, addr: Any, why: str) -> None:
        with self.lock:
            self.refused_count += 1
            if len(self.refused) < MAX_REFUSALS_KEPT:
                self.refused.append(Refusal(str(addr[0]) if isinstance(addr, tuple) else str(addr), why))

    def _greet(self, conn: socket.socket, where: str) -> None:
        try:
            joined = self._handshake(conn, where)
        finally:
            with self.slot:
                self.greeting[where] -= 1
                self.slot.notify()
        if not joined:
            conn.close()
            return
        with self.lock:
            rank = next(r for r, (c, _, _) in self.clients.items() if c is conn)
            reader = self.clients[rank][1]
        self._read(rank, reader)

    def _read(self, rank: int, reader: "LineReader") -> None:
        """A joined node's messages into the inbox, to its EOF (then None), until the server closes."""
        while not self.closed:
            try:
                msg = reader.read(time.monotonic() + 1.0)
            except ValueError as exc:
                self.inbox.put((rank, {"invalid": str(exc)}))
                continue
            if msg is None:
                if reader.eof:
                    with self.lock:
                        self.ended.add(rank)
                    self.inbox.put((rank, None))
                    return
                continue
            self.inbox.put((rank, msg))

    def _handshake(self, conn: socket.socket, addr: str) -> bool:
        """The main node's half of the handshake (the module docstring); True when the node joined."""
        reader = LineReader(conn)
        try:
            send(conn, {"banner": BANNER, "token": self.token})
            raw = reader.read(time.monotonic() + AUTH_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            self._refuse(addr, f"its first message is not valid ({exc})")
            return False
        if raw is None:
            return False               # the main node's own reach test, or a port scan: nothing said, nothing to tell
        hello, problem = messages.check(messages.Hello, raw)
        if hello is None:
            self._refuse(addr, f"its first message is not a node's hello ({problem})")
            return False
        if not verify(self.secret, hello.proof, "node", self.token, hello.nonce, hello.rank):
            self._refuse(addr, f"it claimed machine_rank {hello.rank} without the run's preflight secret")
            self._tell(conn, {"abort": "the main node did not accept this node's proof of the preflight secret: "
                                       "the nodes do not share one"})
            return False
        with self.lock:
            if hello.rank == 0 or hello.rank in self.clients:       # the main node is 0
                self.duplicates.append(hello.rank)
                self._tell(conn, {"abort": f"another node already joined as machine_rank {hello.rank}"})
                return False
        if hello.rank >= self.machines:
            self._refuse(addr, f"machine_rank {hello.rank} is not one of 1-{self.machines - 1}")
            self._tell(conn, {"abort": f"machine_rank {hello.rank} is not one of 1-{self.machines - 1} in the main "
                                       "node's config: the same config on every node"})
            return False
        try:
            send(conn, {"welcome": proof(self.secret, "main", self.token, hello.nonce, hello.rank)})
            raw = reader.read(time.monotonic() + JOIN_MESSAGE_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            raw = {"invalid": str(exc)}
        if raw is None:
            return False
        joining, problem = messages.check(messages.Joining, raw)
        entry = ({"rank": hello.rank, **raw} if joining is not None else
                 {"rank": hello.rank, "reach": {"kind": "ok"}, "facts": {"host": "?", "failed": {"invalid": problem}}})
        with self.lock:
            if hello.rank in self.clients:
                self.duplicates.append(hello.rank)
                self._tell(conn, {"abort": f"another node already joined as machine_rank {hello.rank}"})
                return False
            self.clients[hello.rank] = (conn, reader, entry)
        return True

    @staticmethod
    def _tell(conn: socket.socket, msg: dict[str, Any]) -> None:
        try:
            send(conn, msg)
        except OSError:
            pass

    def wait_for(self, ranks: set[int], deadline: float | Callable[[], float],
                 lost: Callable[[], set[int]] | None = None) -> None:
        """Until every rank of `ranks` joined, or the deadline (a number, or a function of what is known so far: the
        main node shortens it on a finding that stops the run); or until those missing are all `lost()`."""
        while time.monotonic() < (deadline() if callable(deadline) else deadline):
            with self.lock:
                missing = ranks - set(self.clients)
            if not missing or (lost is not None and missing <= lost()):
                return
            time.sleep(0.05)

    def joined(self) -> dict[int, dict[str, Any]]:
        with self.lock:
            return {r: h for r, (_, _, h) in self.clients.items()}

    def refusals(self) -> tuple[list[Refusal], int]:
        with self.lock:
            return list(self.refused), self.refused_count

    def broadcast(self, msg: dict[str, Any]) -> None:
        with self.lock:
            conns = list(self.clients.items())
        for rank, (conn, _, _) in conns:
            try:
                send(conn, msg)
            except OSError:
                pass

    def next(self, deadline: float) -> tuple[int, dict[str, Any] | None] | None:
        """The next (rank, message) a joined node sent (message None: its connection ended), or None by the
        deadline."""
        try:
            return self.inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def collect(self, key: str, deadline: float | Callable[[], float], schema: type | None = None,
                on_value: Callable[[int, Any], None] | None = None, ranks: set[int] | None = None) -> dict[int, Any]:
        """Each node's next message's `key` (of `ranks`: default every joined node; the main node puts its own in the
        inbox as rank 0), by the deadline (a number, or a function: the main node shortens it once it stops the
        collectives); with a schema, a value that does not pass it is {"error": what is wrong with it}; a node whose
        connection ends first gets {"error": ...}. `on_value` hears each as it comes."""
        out: dict[int, Any] = {}
        with self.lock:
            waiting = set(self.clients) if ranks is None else set(ranks)
        while waiting:
            got = self.next(min(time.monotonic() + 0.5, deadline() if callable(deadline) else deadline))
            if got is None:
                if time.monotonic() >= (deadline() if callable(deadline) else deadline):
                    break
                continue
            rank, msg = got
            if rank not in waiting:
                continue
            if msg is None:
                value: Any = {"error": "the node's preflight ended (its connection closed) before it sent its result",
                              "ended": True}
            elif "invalid" in msg and key not in msg:
                value = {"error": f"its message is not valid ({msg['invalid']})"}
            elif key not in msg:
                continue
            else:
                value = msg[key]
                if schema is not None:
                    _, problem = messages.check(schema, value)
                    if problem:
                        value = {"error": f"its {key} result is not valid ({problem})"}
            out[rank] = value
            waiting.discard(rank)
            if on_value:
                on_value(rank, value)
        return out

    def send_to(self, rank: int, msg: dict[str, Any]) -> None:
        with self.lock:
            entry = self.clients.get(rank)
        if entry:
            self._tell(entry[0], msg)

    def finish(self, msg: dict[str, Any] | Callable[[int], dict[str, Any]], deadline: float) -> None:
        """Stop listening (the port is torch's from now on), send the verdict (one message for all, or each node's
        own: msg(rank)), and wait for each client to close."""
        self._stop_listening()
        with self.lock:
            ranks = list(self.clients)
        for rank in ranks:
            self.send_to(rank, msg(rank) if callable(msg) else msg)
        while True:
            with self.lock:
                if set(ranks) <= self.ended:
                    break
            if self.next(deadline) is None:     # EOFs arrive through the inbox (each node's reader)
                break
        with self.lock:
            conns = [c for c, _, _ in self.clients.values()]
        for conn in conns:
            conn.close()

    def _stop_listening(self) -> None:
        """Close the listening socket for good: shutdown wakes the accept thread (a plain close from another thread
        leaves the socket listening until its accept returns), and it is joined."""
        self.accepting = False
        with self.slot:
            self.slot.notify_all()
        for step in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                step()
            except OSError:
                pass
        if self.thread is not threading.current_thread():
            self.thread.join(5)

    def close(self) -> None:
        self._stop_listening()
        self.closed = True
        with self.lock:
            for conn, _, _ in self.clients.values():
                conn.close()


NAME_RETRY_S = 3.0      # a temporary DNS failure (EAI_AGAIN) is retried this long; a name that does not exist is not


def probe_connect(ip: str, port: int, deadline: float, expect_token: str | None = None, source: str | None = None
                  ) -> tuple[socket.socket | None, LineReader | None, dict[str, Any]]:
    """Connect to ip:port, retrying a refused connection or a host that does not answer until the deadline (the main
    node may start later), and read the banner. (socket, reader, outcome): outcome["kind"] is "ok" (outcome["token"]:
    the banner's nonce, for `join`), "refused", "timeout" (no answer at all: dropped on the way), "unreachable" (no
    route to that host: it is down, or a firewall rejects), "noroute" (no route to its network from this node: at
    once, retrying cannot help), "unresolved" (the name does not resolve: at once), "foreign" (something else
    answers), "version" (another wizard's preflight protocol) or "self" (the main node's own test reached another
    node's rendezvous). `source`: the local address to connect from."""
    start = time.monotonic()
    last: dict[str, Any] = {"kind": "timeout", "detail": "no answer"}
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            last["seconds"] = time.monotonic() - start
            return None, None, last
        try:
            sock = socket.create_connection((ip, port), timeout=min(left, 5.0),
                                            source_address=(source, 0) if source else None)
        except ConnectionRefusedError:
            last = {"kind": "refused", "detail": "connection refused"}
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        except (socket.timeout, TimeoutError):
            last = {"kind": "timeout", "detail": "every attempt timed out: the packets are dropped on the way"}
            continue
        except socket.gaierror as exc:
            last = {"kind": "unresolved", "detail": exc.strerror or str(exc)}
            if exc.errno != socket.EAI_AGAIN or time.monotonic() - start > NAME_RETRY_S:
                last["seconds"] = time.monotonic() - start
                return None, None, last
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        except OSError as exc:
            if exc.errno == errno.ENETUNREACH:
                return None, None, {"kind": "noroute", "detail": exc.strerror or str(exc),
                                    "seconds": time.monotonic() - start}
            kind = "unreachable" if exc.errno == errno.EHOSTUNREACH else "timeout"
            last = {"kind": kind, "detail": exc.strerror or str(exc)}
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        reader = LineReader(sock)
        try:
            banner = reader.read(time.monotonic() + BANNER_TIMEOUT_S)
        except (ValueError, UnicodeDecodeError):
            banner = {"garbage": True}
        said = banner.get("banner") if banner else None
        if isinstance(said, str) and said.startswith(PROTOCOL) and said != BANNER:
            sock.close()
            return None, None, {"kind": "version", "detail": f"it speaks {said[:40]}, this node {BANNER}",
                                "seconds": time.monotonic() - start}
        if not banner or said != BANNER or not isinstance(banner.get("token"), str):
            sock.close()
            what = ("it accepted the connection and said nothing for "
                    f"{BANNER_TIMEOUT_S:g} s" if not banner else "it answered with something else")
            return None, None, {"kind": "foreign", "detail": what, "seconds": time.monotonic() - start}
        if expect_token is not None and banner.get("token") != expect_token:
            sock.close()
            return None, None, {"kind": "self", "seconds": time.monotonic() - start}
        return sock, reader, {"kind": "ok", "seconds": time.monotonic() - start, "pid": os.getpid(),
                              "token": banner["token"]}


def join(sock: socket.socket, reader: LineReader, token: str, rank: int, secret: Secret,
         deadline: float) -> tuple[bool, str]:
    """A node's half of the handshake, after the banner (its `token`): prove the secret, and check that the main
    node proves it back. (True, "") when both did; else (False, why), and nothing of this node was sent."""
    mine = nonce()
    try:
        send(sock, {"rank": rank, "nonce": mine, "proof": proof(secret, "node", token, mine, rank)})
        raw = reader.read(deadline)
    except (OSError, ValueError) as exc:
        return False, f"the main node's answer is not valid ({exc})"
    if raw is None:
        return False, "the main node closed the connection without an answer"
    answer, problem = messages.check(messages.FromMain, raw)
    if answer is None:
        return False, f"the main node's answer is not valid ({problem})"
    if answer.abort:
        return False, answer.abort
    if not verify(secret, answer.welcome, "main", token, mine, rank):
        return False, ("what answers there did not prove the run's preflight secret (another run's preflight, or a "
                       "program posing as the main node): this node's facts were not sent")
    return True, ""
