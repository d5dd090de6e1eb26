"""N preflight node agents on this machine over loopback (issue 41): the real rendezvous, handshake, fail-fast
judgement, aggregation, ranking and report of `wizard preflight`, at a scale no test box has machines for.

Each agent is a thread running `wizard.preflight.meet.preflight` as machine rank r of an N-machine config, connecting
from its own loopback address (127.0.0.10 + r: as N hosts would, and so the main node's per-address bound sees N
addresses). Two parts are stood in for, through the Options the harness alone sets:
- the facts: this machine's real facts, gathered once by the real node child, handed to every agent as its own with
  its host name (agent-NN), and where asked with one planted difference (another peft on one agent: a version skew);
- the collectives: N torch processes on 2 cores would take minutes, so each agent runs a ring pass over TCP sockets
  in its thread instead (the same offsets as collective.ring_pass, each link timed at its receiver, the median of a
  few passes), reporting it in the collective child's result format. A "throttled" agent really sends and receives
  slowly (it sleeps between chunks, like a NIC at a fraction of its rate): the slowness is measured, not declared.
Everything after that is the product's own code, unchanged.
"""

from __future__ import annotations

import copy
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.preflight import collective, expect, measure, meet, run
from wizard.preflight.secret import Secret
from wizard.probe.ports import free_port

CHUNK = 256 << 10
LINK_BYTES = 1 << 20
PASSES = 3
THROTTLED_BYTES_PER_S = 4 << 20       # a slow NIC: ~34 Mb/s, where loopback in Python moves GB/s


@dataclass
class Agents:
    n: int
    results: dict[int, run.Result] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    progress: dict[int, list[str]] = field(default_factory=dict)
    seconds: float = 0.0              # from the agents' start to the main node's verdict

    @property
    def main(self) -> run.Result:
        return self.results[0]


def address(rank: int) -> str:
    return f"127.0.0.{10 + rank}"


def config(tmp: Path, n: int, port: int) -> Path:
    cfg = tmp / f"agents-{n}.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                   f"num_machines: {n}\nnum_processes: {n}\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\n"
                   f"main_process_port: {port}\nmixed_precision: 'no'\nuse_cpu: true\n")
    return cfg


class Ring:
    """The agents' ring pass over sockets: each agent listens at its own address; for each offset k, after a
    barrier, it sends LINK_BYTES to agent r+k while it receives from agent r-k."""

    def __init__(self, n: int, throttled: set[int]):
        self.n, self.throttled = n, throttled
        self.barrier = threading.Barrier(n, timeout=60)
        self.listeners = {}
        for r in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address(r), 0))
            s.listen(8)
            self.listeners[r] = s
        self.payload = bytes(range(256)) * (LINK_BYTES // 256)

    def close(self) -> None:
        for s in self.listeners.values():
            s.close()

    def _send(self, me: int, to: int, k: int) -> None:
        with socket.create_connection(self.listeners[to].getsockname(), timeout=60,
                                      source_address=(address(me), 0)) as s:
            s.sendall(bytes([me % 256, k % 256]))
            view = memoryview(self.payload)
            for i in range(0, len(view), CHUNK):
                s.sendall(view[i:i + CHUNK])
                if me in self.throttled:
                    time.sleep(CHUNK / THROTTLED_BYTES_PER_S)

    def _receive(self, me: int, frm: int, k: int) -> tuple[float, bool]:
        conn, _ = self.listeners[me].accept()
        with conn:
            conn.settimeout(60)
            head = conn.recv(2, socket.MSG_WAITALL)
            got, buf = 0, bytearray(CHUNK)
            ok = head == bytes([frm % 256, k % 256])
            while got < LINK_BYTES:
                n = conn.recv_into(buf, min(CHUNK, LINK_BYTES - got))
                if not n:
                    return 0.0, False
                ok = ok and buf[:n] == self.payload[got:got + n]
                got += n
                if me in self.throttled:
                    time.sleep(n / THROTTLED_BYTES_PER_S)
        return time.perf_counter(), ok

    def run(self, me: int, cancel: threading.Event | None) -> list[dict[str, Any]]:
        out = []
        for k in collective.ring_offsets(self.n):
            to, frm = (me + k) % self.n, (me - k) % self.n
            seconds, ok = [], True
            for _ in range(PASSES):
                if cancel is not None and cancel.is_set():
                    raise InterruptedError("cancelled")
                self.barrier.wait()
                start = time.perf_counter()
                sender = threading.Thread(target=self._send, args=(me, to, k), daemon=True)
                sender.start()
                done, good = self._receive(me, frm, k)
                sender.join(60)
                seconds.append(done - start)
                ok = ok and good
            bw = measure.spread([measure.link_gbps(LINK_BYTES, s) for s in seconds])
            out.append({"k": k, "to": to, "from": frm, "bytes": LINK_BYTES, "gbps": bw.median, "low_gbps": bw.low,
                        "high_gbps": bw.high, "samples": bw.samples, "check": "ok" if ok else "mismatch"})
        return out


def run_agents(tmp: Path, n: int, *, throttled: set[int] = frozenset(), skew: int | None = None,
               join_timeout: float = 60.0) -> Agents:
    """N agents through one preflight; the main node's result, every agent's, and the seconds to the verdict."""
    port = free_port()
    cfg = config(tmp, n, port)
    base = run.node_facts(run.Options(config_file=str(cfg)), expect.expectation(str(cfg)))   # the real child, once
    secret = Secret(b"the-agents-shared-preflight-secret", "the harness's")
    ring = Ring(n, set(throttled))
    out = Agents(n)

    def facts_of(rank: int):
        def source(opts, exp) -> dict:
            f = copy.deepcopy(base)
            f["host"] = f"agent-{rank:02d}"
            if rank == skew:
                f["versions"]["peft"] = {"version": "0.0.1", "path": "/agents/skew/peft"}
            return f
        return source

    def runner(opts, exp, rank, addr, port_, backend, nbytes, cancel):
        try:
            links = ring.run(rank, cancel)
        except (InterruptedError, threading.BrokenBarrierError):
            return {"cancelled": "stopped by the main node"}
        return {"rank": rank, "scopes": {"node": {"ranks": 1}}, "ring": links,
                "what": "the harness's socket ring pass over loopback (no torch)"}

    def agent(rank: int) -> None:
        opts = run.Options(config_file=str(cfg), machine_rank=rank, join_timeout=join_timeout, secret=secret,
                           source_address=address(rank) if rank else None, facts_source=facts_of(rank),
                           collective_runner=runner)
        out.progress[rank] = []
        try:
            out.results[rank] = meet.preflight(opts, out.progress[rank].append)
        except BaseException as exc:      # reported by the test, with the agent's progress
            out.errors[rank] = exc
            ring.barrier.abort()
    threads = [threading.Thread(target=agent, args=(r,), daemon=True) for r in range(n)]
    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        threads[0].join(join_timeout + 120)
        out.seconds = time.monotonic() - start
        for t in threads[1:]:
            t.join(60)
    finally:
        ring.close()
    return out


def median_link(result: run.Result) -> float:
    from wizard.preflight.figures import links
    return statistics.median(g for _, _, g in links(result.collectives))
