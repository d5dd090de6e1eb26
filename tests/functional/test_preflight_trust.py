"""Issue 37, the preflight's side: the main node takes only the run's own nodes (they prove a secret they share,
secret.py), and a peer's malformed or escape-laden message is one clean finding. Real `wizard preflight`
processes on loopback (no collective: these are about who joins and what is printed, not the network)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import env
from wizard.preflight import rendezvous
from wizard.preflight.secret import Secret
from wizard.probe.ports import free_port

SHARED = "a-secret-every-node-of-this-run-holds"


def two_nodes(tmp_path: Path, port: int) -> Path:
    cfg = tmp_path / "two.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 2\n"
                   f"num_processes: 2\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\nmain_process_port: {port}\n"
                   "mixed_precision: 'no'\nuse_cpu: true\n")
    return cfg


def preflight(cfg: Path, rank: int, *extra: str, secret: str | None = None, json_out: bool = True) -> subprocess.Popen:
    e = env()
    if secret is not None:
        e["WIZARD_PREFLIGHT_SECRET"] = secret
    args = [sys.executable, "-m", "wizard", "preflight", "--config-file", str(cfg), "--machine-rank", str(rank),
            "--join-timeout", "8", "--no-collective", *(["--json"] if json_out else []), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                            cwd=cfg.parent)        # its report file goes beside the config, never into the checkout


def rows(doc: dict, check: str) -> list[dict]:
    return [r for r in doc["rows"] if r["check"] == check]


def connect(port: int):
    sock, reader, outcome = rendezvous.probe_connect("127.0.0.1", port, time.monotonic() + 20)
    assert outcome["kind"] == "ok", outcome
    return sock, reader, outcome["token"]


def as_node_until_the_verdict(sock, reader) -> dict | None:
    """Read what the main node sends until its verdict, then close (it waits for its nodes to close first)."""
    msg = None
    while True:
        msg = reader.read(time.monotonic() + 60)
        if msg is None or "exit_code" in msg:
            break
    sock.close()
    return msg


def real_facts() -> dict:
    out = subprocess.run([sys.executable, "-m", "wizard.preflight.node", "--main-host", "127.0.0.1", "--timeout", "10"],
                         capture_output=True, text=True, env=env(), timeout=60).stdout
    return json.loads(out)


@pytest.mark.timeout(120)
def test_a_stranger_that_claims_a_rank_with_copied_facts_is_refused_and_named(tmp_path):
    """Finding 2: the rendezvous handed its token to whoever connected, and took a stranger that claimed rank 1
    (with facts copied from a real node) for node 1: `preflight: all clear on 2 nodes`, exit 0, and `wizard launch`
    would have gone on. Now a node proves the secret first; the stranger gets no "go" and the main node says so."""
    port = free_port()
    main = preflight(two_nodes(tmp_path, port), 0)
    facts = real_facts()
    sock, reader, token = connect(port)
    rendezvous.send(sock, {"rank": 1, "facts": facts, "reach": {"kind": "ok"}})     # the issue's own message
    assert reader.read(time.monotonic() + 15) is None                                # closed: nothing for it
    sock.close()
    sock, reader, token = connect(port)                  # a proof made up without the secret
    mine = "0" * 32
    rendezvous.send(sock, {"rank": 1, "nonce": mine, "proof": "f" * 64})
    answer = reader.read(time.monotonic() + 15)
    assert answer and "abort" in answer and "welcome" not in answer and "go" not in answer, answer
    sock.close()
    out, err = main.communicate(timeout=90)
    doc = json.loads(out)
    assert main.returncode == 1 and "Traceback" not in err, err
    assert [(r["node"], r["status"]) for r in rows(doc, "joined")] == [(1, "fail")]
    refused = rows(doc, "refused")
    assert len(refused) == 1 and refused[0]["status"] == "fail" and "2 connections refused" in refused[0]["detail"]
    assert "without the run's preflight secret" in refused[0]["detail"]
    assert "WIZARD_PREFLIGHT_SECRET" in refused[0]["fix"]


@pytest.mark.timeout(180)
def test_nodes_by_hand_meet_with_one_secret_and_are_told_apart_with_two(tmp_path):
    """`--machine-rank N` by hand with the same $WIZARD_PREFLIGHT_SECRET on each node: all clear. With different
    secrets both sides name the secret, neither takes the other for the run's."""
    port = free_port()
    cfg = two_nodes(tmp_path, port)
    main, node = preflight(cfg, 0, secret=SHARED), preflight(cfg, 1, secret=SHARED)
    out0, err0 = main.communicate(timeout=120)
    out1, _ = node.communicate(timeout=60)
    assert main.returncode == 0 and node.returncode == 0, err0
    assert json.loads(out0)["verdict"] == "preflight: all clear on 2 nodes" and not rows(json.loads(out0), "refused")
    port = free_port()
    cfg = two_nodes(tmp_path, port)
    main, node = preflight(cfg, 0, secret=SHARED), preflight(cfg, 1, secret="another-secret-of-another-run")
    doc0, doc1 = json.loads(main.communicate(timeout=120)[0]), json.loads(node.communicate(timeout=60)[0])
    assert main.returncode == 1 and node.returncode == 1
    assert rows(doc0, "refused")[0]["status"] == "fail" and rows(doc0, "joined")[0]["node"] == 1
    mine = rows(doc1, "preflight secret")
    assert len(mine) == 1 and mine[0]["status"] == "fail" and "do not share one" in mine[0]["detail"]
    assert "$WIZARD_PREFLIGHT_SECRET" in mine[0]["detail"]            # which secret this node used


@pytest.mark.timeout(120)
@pytest.mark.parametrize("message, says", [
    ({"facts": "x"}, "facts: 'x' is not an object"),
    ({"facts": {"host": "n2", "gpus": "zz"}}, "facts.gpus: 'zz' is not an object"),
], ids=["facts-not-an-object", "gpus-not-an-object"])
def test_a_nodes_malformed_facts_are_one_finding_not_a_traceback(tmp_path, message, says):
    """Finding 5: `{"rank": 1, "facts": "x"}` raised AttributeError in run.py, `"gpus": "zz"` in checks.py."""
    port = free_port()
    main = preflight(two_nodes(tmp_path, port), 0, secret=SHARED)
    sock, reader, token = connect(port)
    ok, why = rendezvous.join(sock, reader, token, 1, Secret(SHARED.encode(), "test"), time.monotonic() + 15)
    assert ok, why
    rendezvous.send(sock, message)
    verdict = as_node_until_the_verdict(sock, reader)
    out, err = main.communicate(timeout=90)
    assert verdict and verdict["exit_code"] == 1
    doc = json.loads(out)
    assert main.returncode == 1 and "Traceback" not in err, err
    found = rows(doc, "node facts")
    assert len(found) == 1 and found[0]["node"] == 1 and found[0]["status"] == "fail" and says in found[0]["detail"]


@pytest.mark.timeout(120)
def test_strings_from_another_node_are_printed_escaped(tmp_path):
    """Finding 5: a host name with terminal escapes and a newline put escape sequences and a forged `FAKE LINE ...
    ok` row into the table. Every cell is escaped: no control character reaches the terminal, no line is forged."""
    port = free_port()
    main = preflight(two_nodes(tmp_path, port), 0, secret=SHARED, json_out=False)
    facts = real_facts()
    facts["host"] = "n2\x1b[2J\x1b]0;owned\x07\nFAKE LINE  versions  ok  all good"
    facts["versions"]["peft"]["version"] = "0.0.1\x1b[31m\r\nFAKE"
    sock, reader, token = connect(port)
    ok, why = rendezvous.join(sock, reader, token, 1, Secret(SHARED.encode(), "test"), time.monotonic() + 15)
    assert ok, why
    rendezvous.send(sock, {"facts": facts, "reach": {"kind": "ok"}})
    as_node_until_the_verdict(sock, reader)
    out, err = main.communicate(timeout=90)
    assert "Traceback" not in err, err
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert not [line for line in out.splitlines() if line.startswith("FAKE")], out
    assert "n2\\x1b[2J" in out and "\\x0aFAKE LINE" in out          # shown, as text
