"""One node's preflight from start to end (`preflight`): alone, or the nodes meet at the main port, decide and
measure: the main node's side and the others' (rendezvous.py carries the messages; run.py gathers the facts, runs
the children and turns facts into rows).

Fail fast on the cause. The main node judges each node's facts as it joins: a finding that stops the run (another
version, an interface that does not exist, a limit too low, a main host that does not resolve) is known within a
second of the node's arrival, and then the main node waits only `fatal_grace` more for the nodes still to come (so
they hear the cause from it), runs no collective (it would fail or hang for the same cause, and only the symptom
would be named), and sends every node its verdict with the rows about it and the cause. While the collectives run,
the first node whose collectives fail (or whose preflight ends) stops every other node's at once: the main node
says "stop" and each kills its collective child, instead of waiting out a collective timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

from wizard.preflight import checks, figures, report, run
from wizard.preflight.checks import FAIL, Expectation, Row
from wizard.preflight.expect import class_default_gbps, expectation

STOP_WAIT_S = 15.0          # after a stop, how long the main node waits for the others to say they stopped
VERDICT_WAIT_S = 30.0


def _not_resolving(exp: Expectation) -> dict[str, Any]:
    return {"kind": "skipped", "detail": f"{exp.main_ip} does not resolve on this node (the resolve row says why)"}


class FatalWatch:
    """While the main node waits for the others: each node's rows as it joins, and the first finding that stops
    the run (then the wait ends `grace` seconds later)."""

    def __init__(self, exp: Expectation, own: list[Row], main_facts: dict[str, Any], grace: float):
        self.exp, self.own, self.grace = exp, own, grace
        self.per_node: dict[int, dict[str, Any]] = {0: main_facts}
        self.rows: dict[int, list[Row]] = {}
        self.since: float | None = None
        self.what: str | None = None
        self.judged: frozenset[int] | None = None          # the nodes the last judgement saw

    def node_rows(self, rank: int, entry: dict[str, Any]) -> list[Row]:
        if rank not in self.rows:
            facts = entry.get("facts") or {}
            host = str(facts.get("host") or "?")
            self.per_node[rank] = facts
            self.rows[rank] = run.local_rows(rank, self.exp, facts) + [
                checks.reach_row(rank, host, self.exp.main_ip, self.exp.main_port, entry.get("reach") or {"kind": "ok"})]
        return self.rows[rank]

    def deadline(self, joined: dict[int, dict[str, Any]], base: float) -> float:
        if self.since is None and frozenset(joined) != self.judged:
            self.judged = frozenset(joined)
            rows = list(self.own)
            for rank, entry in joined.items():
                rows += self.node_rows(rank, entry)
            hosts = {n: str(f.get("host") or "?") for n, f in self.per_node.items()}
            rows += run.agreement_rows(self.exp, self.per_node, hosts)
            first = report.cause(rows)
            if first is not None:
                self.since = time.monotonic()
                self.what = f"node {first.node} {first.check}"
        return base if self.since is None else min(base, self.since + self.grace)


def main_node(opts, exp: Expectation, facts: dict[str, Any], progress: Callable[[str], None]) -> run.Result:
    from wizard.preflight import rendezvous
    host = str(facts.get("host") or "?")
    port = int(exp.main_port)
    backend = checks.backend_for(exp, {0: facts})
    own = run.local_rows(0, exp, facts)
    try:
        server = rendezvous.Server(port, opts.secret, exp.num_machines)
    except OSError as exc:
        holder = rendezvous.port_holder(port) or (exc.strerror or str(exc))
        return run.finish(0, True, own + [checks.port_free_row(0, host, port, holder)], exp, {0: facts}, {}, backend)
    try:
        own.append(checks.port_free_row(0, host, port, None))
        outcome = _not_resolving(exp)
        if run.resolves(facts):
            # the main node reaches itself at main_process_ip: the address is this machine's and accepts connections
            sock, _, outcome = rendezvous.probe_connect(exp.main_ip, port, time.monotonic() + 10, server.token)
            if sock:
                sock.close()
        own.append(checks.reach_row(0, host, exp.main_ip, port, outcome))
        progress(f"node 0 ({host}): waiting up to {opts.join_timeout:g} s for {exp.num_machines - 1} other node(s) "
                 f"at {exp.main_ip}:{port}")
        watch = FatalWatch(exp, own, facts, opts.fatal_grace)
        base = time.monotonic() + opts.join_timeout
        server.wait_for(set(range(1, exp.num_machines)), lambda: watch.deadline(server.joined(), base), opts.lost)
        joined = server.joined()
        rows = list(own)
        for r, entry in sorted(joined.items()):
            rows += watch.node_rows(r, entry)
        per_node = {0: facts, **{r: watch.per_node[r] for r in joined}}
        hosts = {r: str(f.get("host") or "?") for r, f in per_node.items()}
        rows += checks.joined_rows(exp.num_machines, hosts, sorted(set(server.duplicates)), opts.join_timeout, host,
                                   stopped_for=watch.what)
        refused, how_many = server.refusals()
        if how_many:
            rows.append(checks.refused_row(host, [(r.address, r.why) for r in refused], how_many,
                                           everyone=len(joined) == exp.num_machines - 1, source=opts.secret.source))
        rows += run.agreement_rows(exp, per_node, hosts)
        backend = checks.backend_for(exp, per_node)
        everyone = len(joined) == exp.num_machines - 1 and not server.duplicates
        blocking = report.cause(rows)
        collectives: dict[int, dict[str, Any]] = {}
        if everyone and blocking is None and opts.collective:
            collectives = _collectives(opts, exp, server, backend, sorted(joined), progress)
        else:
            why = (f"node {blocking.node} ({blocking.host}) {blocking.check}: a finding that stops the run"
                   if blocking else "not every node joined" if not everyone else "--no-collective")
            progress(f"node 0 ({host}): no collective ({why})")
            server.broadcast({"skip": why})
        for r in sorted(per_node):
            rows += run.collective_node_rows(r, exp, per_node[r], collectives.get(r), backend)
        rows += figures.slow_rows(collectives, hosts, backend)
        result = run.finish(0, True, rows, exp, per_node, collectives, backend)
        first = result.cause()
        server.finish(lambda r: {"verdict": result.verdict, "exit_code": result.exit_code,
                                 "rows": [row.to_json() for row in result.rows if row.node == r or row is first]},
                      time.monotonic() + 10)
        return result
    finally:
        server.close()


def _collectives(opts, exp: Expectation, server, backend: str, ranks: list[int],
                 progress: Callable[[str], None]) -> dict[int, dict[str, Any]]:
    """Every node's collectives at once; the first that fails stops the others (a "stop" to each node, and the
    main node's own child cancelled), and what fails after it is counted as its consequence."""
    from wizard.preflight import messages
    from wizard.probe.ports import free_port
    nbytes = run.default_nbytes(opts, backend)
    cport = free_port()
    server.broadcast({"go": {"port": cport, "backend": backend, "nbytes": nbytes}})
    progress(f"node 0: timed {backend} collectives across {exp.num_machines} nodes")
    cancel = threading.Event()

    def own() -> None:
        result = run.run_collective(opts, exp, 0, exp.main_ip, cport, backend, nbytes, cancel)
        server.inbox.put((0, {"collective": result}))
    mine = threading.Thread(target=own, daemon=True)
    mine.start()
    stop: dict[str, Any] = {}
    failures: list[int] = []
    deadline = [time.monotonic() + opts.collective_timeout + 45]

    def heard(rank: int, value: Any) -> None:
        if not (isinstance(value, dict) and (value.get("error") or value.get("timeout"))):
            return
        failures.append(rank)
        if not stop:
            stop.update(text=f"node {rank}'s collectives failed")
            progress(f"node 0: node {rank}'s collectives failed: stopping the others'")
            server.broadcast({"stop": stop["text"]})
            cancel.set()
            deadline[0] = min(deadline[0], time.monotonic() + STOP_WAIT_S)
    try:
        got = server.collect("collective", lambda: deadline[0], messages.Collective, heard, set(ranks) | {0})
    finally:
        cancel.set()
        mine.join(30)
    out = {rank: got.get(rank) or {"error": "the node sent no result"} for rank in [0, *ranks]}
    if failures:
        first = first_failure(failures, out)
        why = f"node {first}'s collectives failed first"
        for rank, value in out.items():
            if rank == first:
                continue
            if value.get("error") or value.get("timeout"):     # after the first: its consequence
                out[rank] = {"cancelled": f"{why}; then this node's: {value.get('error') or 'timed out'}"}
            elif value.get("cancelled"):
                out[rank] = {"cancelled": why}
    return out


def first_failure(failures: list[int], results: dict[int, dict[str, Any]]) -> int:
    """The failure the others follow from: a node whose preflight ended (its connection closed) before one whose
    collective saw its peer go ("closed by peer", "reset"); else the first to arrive."""
    def symptom(rank: int) -> int:
        value = results[rank]
        if value.get("ended"):
            return 0
        text = str(value.get("error") or "").lower()
        return 2 if any(w in text for w in ("by peer", "connection closed", "connection reset", "broken pipe")) else 1
    return min(failures, key=lambda r: (symptom(r), failures.index(r)))


def other_node(opts, exp: Expectation, rank: int, facts: dict[str, Any],
               progress: Callable[[str], None]) -> run.Result:
    from wizard.preflight import rendezvous
    host = str(facts.get("host") or "?")
    port = int(exp.main_port)
    backend = checks.backend_for(exp, {rank: facts})
    own = run.local_rows(rank, exp, facts)
    if not run.resolves(facts):        # nothing to connect to: the resolve row is the cause, said at once
        rows = own + [checks.reach_row(rank, host, exp.main_ip, port, _not_resolving(exp))]
        return run.finish(rank, False, rows, exp, {rank: facts}, {}, backend)
    progress(f"node {rank} ({host}): connecting to the main node at {exp.main_ip}:{port} (up to "
             f"{opts.join_timeout:g} s)")
    sock, reader, outcome = rendezvous.probe_connect(exp.main_ip, port, time.monotonic() + opts.join_timeout,
                                                     source=opts.source_address)
    if sock is None or reader is None:
        rows = own + [checks.reach_row(rank, host, exp.main_ip, port, outcome)]
        return run.finish(rank, False, rows, exp, {rank: facts}, {}, backend)
    try:
        token = outcome.pop("token")            # the main node's nonce: no part of what this node reports
        ok, why = rendezvous.join(sock, reader, token, rank, opts.secret, time.monotonic() + rendezvous.AUTH_TIMEOUT_S)
        if not ok:
            rows = own + [checks.reach_row(rank, host, exp.main_ip, port, outcome),
                          checks.secret_row(rank, host, why, opts.secret.source)]
            return run.finish(rank, False, rows, exp, {rank: facts}, {}, backend)
        rendezvous.send(sock, {"facts": facts, "reach": outcome})
        inbox = rendezvous.Inbox(reader)
        msg, bad = inbox.next(time.monotonic() + opts.join_timeout + VERDICT_WAIT_S)
        collective = None
        if msg and msg.go:
            backend = msg.go.backend
            collective = _run_until_stopped(opts, exp, rank, msg.go, inbox, progress)
            try:
                rendezvous.send(sock, {"collective": collective})
            except OSError:                      # the main node is gone: the row below says so
                pass
            msg, bad = inbox.next(time.monotonic() + opts.collective_timeout + 45 + VERDICT_WAIT_S,
                                  lambda m: m.exit_code is not None or bool(m.abort))
        elif msg and msg.skip is not None:       # no collective (a finding, or a node missing): the verdict comes next
            progress(f"node {rank} ({host}): no collective: {msg.skip}")
            msg, bad = inbox.next(time.monotonic() + VERDICT_WAIT_S, lambda m: m.exit_code is not None or bool(m.abort))
        return _node_result(rank, host, exp, facts, collective, backend, msg, bad, own, outcome)
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)     # sends our end (the main node waits for it) and wakes the reader
        except OSError:
            pass
        sock.close()


def _run_until_stopped(opts, exp: Expectation, rank: int, go, inbox, progress) -> dict[str, Any]:
    """This node's collectives, stopped at once when the main node says another node's failed."""
    progress(f"node {rank}: timed {go.backend} collectives across {exp.num_machines} nodes")
    cancel = threading.Event()
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(result=run.run_collective(
        opts, exp, rank, exp.main_ip, go.port, go.backend, go.nbytes, cancel)), daemon=True)
    t.start()
    stopped = None
    try:
        while t.is_alive():
            msg, bad = inbox.next(time.monotonic() + 0.2, lambda m: bool(m.stop))
            why = msg.stop if msg is not None else bad or ("the main node's preflight ended (its connection closed)"
                                                             if inbox.ended else None)
            if why and stopped is None:
                stopped = why
                progress(f"node {rank}: the collectives stop: {why}")
                cancel.set()
            t.join(0.01 if why is None else 1.0)
    finally:
        cancel.set()
        t.join()
    result = box.get("result") or {"error": "the collective runner gave no result"}
    if stopped and result.get("cancelled"):
        result = {"cancelled": stopped}
    return result


def _node_result(rank: int, host: str, exp: Expectation, facts: dict[str, Any], collective: dict[str, Any] | None,
                 backend: str, msg, bad: str | None, own: list[Row], outcome: dict[str, Any]) -> run.Result:
    """A node's result: the rows the main node sent about it and the cause, the main node's verdict and exit code
    (one verdict for the run, the same on every node); its own rows where no verdict came."""
    if msg and msg.exit_code is not None and msg.rows:
        rows = [Row(r.node, r.host, r.check, r.status, r.detail, r.fix) for r in msg.rows]
        result = run.finish(rank, False, rows, exp, {rank: facts}, {rank: collective or {}}, backend, reached=True)
        result.exit_code = max(result.exit_code, msg.exit_code)
        result.verdict = msg.verdict or result.verdict
        return result
    rows = own + [checks.reach_row(rank, host, exp.main_ip, exp.main_port, outcome)]
    rows += run.collective_node_rows(rank, exp, facts, collective, backend)
    if msg and msg.abort:
        rows.append(Row(rank, host, "joined", FAIL, msg.abort, "give each node its own --machine-rank"))
    elif bad:
        rows.append(Row(rank, host, "main node", FAIL, bad, "the same wizard version on every node"))
    elif not msg:
        rows.append(Row(rank, host, "main node", FAIL, "the main node's preflight ended without a verdict (it was "
                        "stopped, or lost its connection to this node)", "look at the main node's output"))
    result = run.finish(rank, False, rows, exp, {rank: facts}, {rank: collective or {}}, backend, reached=True)
    if msg and msg.exit_code is not None:
        result.exit_code = max(result.exit_code, msg.exit_code)
        result.verdict = msg.verdict or result.verdict
    return result


# ----------------------------------------------------------------------------- the entry
# Here, not in run.py: the entry picks the main node's side or another's, and run.py's pieces must not import them.


def preflight(opts: run.Options, progress: Callable[[str], None] = lambda s: None) -> run.Result:
    from wizard.errors import InputError
    exp = expectation(opts.config_file, opts.main_ip, opts.main_port, opts.checkpoint_dir, opts.checkpoint_dir_from)
    rank = opts.machine_rank or 0
    if rank >= exp.num_machines:
        raise InputError("--machine-rank", f"{rank}, but the config has num_machines {exp.num_machines}",
                         f"0-{exp.num_machines - 1}")
    if exp.num_machines > 1 and not exp.main_ip:
        raise InputError("--main-process-ip", "the config leaves the main node's address to the launch",
                         "--main-process-ip ADDRESS (under SLURM it is found from the allocation)")
    if exp.main_port is None:
        exp.main_port = 29500                          # accelerate's default when the config leaves it
    if exp.num_machines > 1 and opts.secret is None:
        from wizard.preflight.secret import resolve
        opts.secret = resolve()                        # before any work: a missing or unsafe one is exit 2
    progress(f"node {rank}: gathering this node's facts")
    facts = run.node_facts(opts, exp)
    backend = checks.backend_for(exp, {rank: facts})        # the main node decides for all, from every node's
    if exp.assumed_gbps is None and exp.num_machines > 1:
        exp.assumed_gbps, exp.assumed_source = class_default_gbps(exp, facts)
    if exp.num_machines == 1:
        return single(opts, exp, facts, backend, progress)
    if rank == 0:
        return main_node(opts, exp, facts, progress)
    return other_node(opts, exp, rank, facts, progress)


def single(opts: run.Options, exp: Expectation, facts: dict[str, Any], backend: str, progress) -> run.Result:
    rows = run.local_rows(0, exp, facts)
    collective = None
    if opts.collective and exp.processes_per_node > 1 and not facts.get("failed"):
        if any(r.status == FAIL for r in rows):          # it would fail for the same cause, or hang on it
            collective = None
        else:
            from wizard.probe.ports import free_port
            progress(f"node 0 ({facts.get('host')}): timed {backend} collectives within the node")
            collective = run.run_collective(opts, exp, 0, "127.0.0.1", free_port(), backend,
                                            run.default_nbytes(opts, backend))
    rows += run.collective_node_rows(0, exp, facts, collective, backend)
    return run.finish(0, True, rows, exp, {0: facts}, {0: collective or {}}, backend)
