"""Issue 37, the preflight rendezvous in-process: the handshake (secret.py), bounds on what a peer can make the main
node hold (finding 7), and the schemas every message passes (messages.py, finding 5). Issue 41: 64 nodes arriving at
once all join, and a name that does not resolve or a network without a route is told apart from a firewall."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from wizard.errors import InputError
from wizard.preflight import checks, messages, rendezvous, report, secret
from wizard.preflight.secret import Secret
from wizard.probe.ports import free_port

SHARED = Secret(b"the-run-s-own-secret-0123456789", "test")


@pytest.fixture
def server():
    s = rendezvous.Server(free_port(), SHARED, machines=3, host="127.0.0.1")
    yield s
    s.close()


def _connect(server):
    sock, reader, outcome = rendezvous.probe_connect("127.0.0.1", server.port, time.monotonic() + 10)
    assert outcome["kind"] == "ok", outcome
    return sock, reader, outcome["token"]


def test_a_node_with_the_secret_joins_and_the_main_node_proves_it_back(server):
    sock, reader, token = _connect(server)
    assert rendezvous.join(sock, reader, token, 2, SHARED, time.monotonic() + 10) == (True, "")
    rendezvous.send(sock, {"facts": {"host": "n3"}, "reach": {"kind": "ok", "seconds": 0.1}})
    server.wait_for({2}, time.monotonic() + 10)
    assert server.joined()[2]["facts"] == {"host": "n3"} and server.refusals() == ([], 0)
    sock.close()


def test_a_main_node_without_the_secret_gets_no_facts():
    """The node checks the main node's proof before it sends anything of its own: a program posing as the main
    node (it speaks the protocol, welcomes anyone) learns nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def pose() -> None:
        conn, _ = listener.accept()
        rendezvous.send(conn, {"banner": rendezvous.BANNER, "token": "cd" * 16})
        reader = rendezvous.LineReader(conn)
        reader.read(time.monotonic() + 10)
        rendezvous.send(conn, {"welcome": "0" * 64})
        conn.settimeout(3)
        try:
            got.append(conn.recv(65536))
        except OSError:
            pass
        conn.close()
    t = threading.Thread(target=pose, daemon=True)
    t.start()
    sock, reader, outcome = rendezvous.probe_connect("127.0.0.1", listener.getsockname()[1], time.monotonic() + 10)
    ok, why = rendezvous.join(sock, reader, outcome["token"], 1, SHARED, time.monotonic() + 10)
    assert not ok and "did not prove the run's preflight secret" in why
    sock.close()
    t.join(10)
    listener.close()
    assert got == [b""]                                   # it closed; not one byte of facts went out


def test_a_main_node_with_another_secret_refuses_the_node():
    other = rendezvous.Server(free_port(), Secret(b"someone-else-s-secret-000000", "x"), 2, "127.0.0.1")
    try:
        sock, reader, token = _connect(other)
        ok, why = rendezvous.join(sock, reader, token, 1, SHARED, time.monotonic() + 10)
        assert not ok and "do not share one" in why
        sock.close()
    finally:
        other.close()


def test_a_proof_is_good_for_one_connection_only(server):
    """A proof recorded from one connection (a replay) does not open another: each side's nonce is in it."""
    sock, reader, token = _connect(server)
    nonce = "ab" * 16
    rendezvous.send(sock, {"rank": 1, "nonce": nonce, "proof": secret.proof(SHARED, "node", token, nonce, 1)})
    assert "welcome" in reader.read(time.monotonic() + 10)
    sock2, reader2, token2 = _connect(server)
    rendezvous.send(sock2, {"rank": 2, "nonce": nonce, "proof": secret.proof(SHARED, "node", token, nonce, 1)})
    assert "abort" in reader2.read(time.monotonic() + 10)
    for s in (sock, sock2):
        s.close()


def test_a_line_is_bounded_and_read_once():
    """Finding 7: the reader kept up to 64 MiB per line, rescanning it for every chunk (24.5 s of CPU for one
    63 MiB line). Now a line past MAX_LINE_BYTES is an error as soon as it is past, after reading little more."""
    a, b = socket.socketpair()
    try:
        sent = threading.Thread(target=lambda: _send_quietly(a, b"x" * (8 << 20)), daemon=True)
        sent.start()
        reader = rendezvous.LineReader(b)
        start = time.process_time()
        with pytest.raises(ValueError, match="longer than"):
            reader.read(time.monotonic() + 20)
        assert len(reader.buf) <= rendezvous.MAX_LINE_BYTES + 65536
        assert time.process_time() - start < 1.0
    finally:
        a.close()
        b.close()


def _send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_lines_split_across_reads_and_several_in_one_read():
    a, b = socket.socketpair()
    try:
        a.sendall(b'{"a": 1}\n{"b":')
        reader = rendezvous.LineReader(b)
        assert reader.read(time.monotonic() + 5) == {"a": 1}
        a.sendall(b' 2}\n')
        assert reader.read(time.monotonic() + 5) == {"b": 2}
        a.sendall(b"[1]\n")
        with pytest.raises(ValueError):
            reader.read(time.monotonic() + 5)
    finally:
        a.close()
        b.close()


def test_connections_from_one_address_are_bounded(server):
    """Finding 7: no limit on connections (8 at once held about 520 MB). Past MAX_GREETING_PER_ADDRESS being
    greeted from one address, a connection is closed at once, and counted."""
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(rendezvous.MAX_GREETING_PER_ADDRESS)]
    time.sleep(0.5)
    extra = socket.create_connection(("127.0.0.1", server.port))
    extra.settimeout(5)
    data = b""
    try:
        while True:
            chunk = extra.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    assert b"banner" not in data                          # closed before any greeting
    refused, count = server.refusals()
    assert count == 1 and "too many connections" in refused[0].why
    for s in (*held, extra):
        s.close()


def test_sixty_four_nodes_arriving_at_once_all_join():
    """At 64 machines more than MAX_GREETING nodes are being greeted at the same moment (here each takes half a
    second to answer the banner, as a loaded node might): past the bound the server stops accepting (the kernel's
    backlog holds them) instead of refusing them, and every one joins."""
    n = 64
    server = rendezvous.Server(free_port(), SHARED, machines=n + 1, host="127.0.0.1")
    joined, errors = [], []

    def node(rank: int) -> None:
        sock, reader, outcome = rendezvous.probe_connect("127.0.0.1", server.port, time.monotonic() + 30,
                                                         source=f"127.0.0.{10 + rank}")
        if sock is None:
            errors.append((rank, outcome))
            return
        time.sleep(0.5)
        ok, why = rendezvous.join(sock, reader, outcome["token"], rank, SHARED, time.monotonic() + 30)
        if ok:
            rendezvous.send(sock, {"facts": {"host": f"n{rank}"}, "reach": {"kind": "ok"}})
            joined.append(rank)
        else:
            errors.append((rank, why))
    try:
        threads = [threading.Thread(target=node, args=(r,)) for r in range(1, n + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        server.wait_for(set(range(1, n + 1)), time.monotonic() + 20)
        assert errors == [] and sorted(server.joined()) == list(range(1, n + 1))
        assert server.refusals() == ([], 0)
    finally:
        server.close()


def test_a_name_that_does_not_resolve_is_said_at_once_not_retried_until_the_deadline():
    start = time.monotonic()
    sock, _, outcome = rendezvous.probe_connect("nosuch.invalid", 29500, time.monotonic() + 30)
    assert sock is None and outcome["kind"] == "unresolved" and time.monotonic() - start < 15
    row = checks.reach_row(1, "n2", "nosuch.invalid", 29500, outcome)
    assert "does not resolve on this node (DNS" in row.detail and "firewall" not in row.detail + row.fix


def test_no_route_to_the_network_is_told_apart_from_a_firewall(tmp_path):
    """In a network namespace of its own (no route at all), connecting fails with ENETUNREACH: said at once, as
    no route, with no port to open."""
    import shutil
    import subprocess
    import sys
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a network namespace of its own takes root and unshare")
    code = ("import json, time; from wizard.preflight import rendezvous; "
            "print(json.dumps(rendezvous.probe_connect('10.255.1.2', 29500, time.monotonic() + 20)[2]))")
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"unshare -n refused here: {r.stderr.strip()[-200:]}")
    outcome = json.loads(r.stdout)
    assert outcome["kind"] == "noroute" and outcome["seconds"] < 5, outcome
    row = checks.reach_row(1, "n2", "10.255.1.2", 29500, outcome)
    assert "no route to 10.255.1.2's network" in row.detail and "ip route get 10.255.1.2" in row.fix
    assert "open TCP port" not in row.fix


def test_a_stranger_s_garbage_is_refused_and_counted(server):
    sock, reader, token = _connect(server)
    rendezvous.send(sock, {"rank": 1, "facts": {"host": "copied"}})       # the old protocol: no proof
    assert reader.read(time.monotonic() + 10) is None
    sock.close()
    deadline = time.monotonic() + 5
    while not server.refusals()[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    refused, count = server.refusals()
    assert count == 1 and "not a node's hello" in refused[0].why and not server.joined()


@pytest.mark.parametrize("gpus", [None, "8xH100-80GB"])
def test_the_facts_schema_follows_what_a_node_sends(monkeypatch, gpus):
    import json

    from wizard.preflight.node import gather
    versions = {f.name for f in fields(messages.Versions)}
    assert set(checks.PACKAGES) <= versions                  # every package the checks compare
    if gpus:
        monkeypatch.setenv("WIZARD_FAKE_NVML", gpus)
    facts = json.loads(json.dumps(gather("127.0.0.1", [], 10), default=str))
    assert messages.check(messages.Facts, facts)[1] is None
    assert not gpus or len(facts["gpus"]["gpus"]) == 8
    facts["limits"]["disk"]["/x"] = "lots"
    assert messages.check(messages.Facts, facts)[1] == "limits.disk['/x']: 'lots' is not a number of bytes"
    assert messages.check(messages.Facts, {"host": "h", "gpus": {"timeout": 5}})[1] is None   # a fact that hung


def test_a_collective_result_is_checked_before_its_figures_are_read():
    run = {"bytes": 16 << 20, "samples": 7, "seconds": 0.01, "busbw_gbps": 13.4, "low_gbps": 12.0,
           "high_gbps": 14.0, "check": "ok"}
    ok = {"scopes": {"node": {"ranks": 1}, "across": {"ranks": 2, "ops": {"all_reduce": [run]}}},
          "ring": [{"k": 1, "to": 1, "from": 1, "bytes": 4 << 20, "gbps": 9.5}], "xids": [[0, 79]]}
    assert messages.check(messages.Collective, ok)[1] is None
    assert messages.check(messages.Collective, {"scopes": {"across": {"ranks": 2, "ops": {"all_reduce": [{}]}}}})[1] \
        == "scopes['across'].ops['all_reduce'][0].bytes: missing"
    assert messages.check(messages.Collective, {"ring": [{"k": 1, "to": 1, "from": -1, "bytes": 1, "gbps": 1}]})[1] \
        == "ring[0].from: -1 is not a machine rank (0-65536)"
    assert "xids[0]" in messages.check(messages.Collective, {"xids": [[0]]})[1]


def test_the_table_escapes_what_a_node_said():
    row = checks.Row(1, "n2\x1b[2J\nFAKE  versions  ok", "versions", checks.FAIL, "x\ry\x9b", "fix\x1b")
    lines = report.render_table([row])
    assert len(lines) == 3 and not any(c in "".join(lines) for c in "\x1b\r\n\x9b")


def test_the_key_file_is_made_private_once_and_refused_when_others_can_read_it(tmp_path):
    path = tmp_path / "cfg" / "wizard" / "preflight.key"
    env = {secret.KEY_FILE_ENV: str(path)}
    first = secret.resolve(env)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and secret.resolve(env) == first
    os.chmod(path, 0o644)
    with pytest.raises(InputError, match="chmod 600"):
        secret.resolve(env)
    with pytest.raises(InputError, match="WIZARD_PREFLIGHT_SECRET"):
        secret.resolve({secret.SECRET_ENV: "short"})
    assert secret.resolve({secret.SECRET_ENV: "x" * 16, **env}).source == "$WIZARD_PREFLIGHT_SECRET"
    assert "x" * 16 not in repr(secret.resolve({secret.SECRET_ENV: "x" * 16}))
