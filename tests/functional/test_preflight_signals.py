"""No leftovers, ever (issue 41): a preflight stopped by a signal, at each of its phases, leaves no process behind,
on the node signalled and on the others.

The phases: gathering the node's facts (the node child; held there by a fake NVML file that is a FIFO nobody
writes, as a wedged driver holds NVML), waiting at the main port for the others (no child, the rendezvous' threads),
the collectives (the collective child and the ranks it spawns: grandchildren of the preflight, in a session of their
own). SIGTERM, SIGINT and SIGHUP end the wizard as Ctrl-C does (exit 130) and its children with it; SIGKILL cannot be
caught, and the kernel ends the children (PR_SET_PDEATHSIG, wizard/preflight/children.py). Every process the test
starts carries a marker in its environment, and "nothing left" is: no process with the marker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.launch_support import env
from wizard.probe.ports import free_port

MARKER = "WIZARD_TEST_PREFLIGHT_MARKER"


def marked(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER) == tag:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


def wait_for(pred, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    value = pred()
    while not value and time.monotonic() < deadline:
        time.sleep(every)
        value = pred()
    return value


def nothing_left(tag: str, timeout: float = 10.0) -> list[str]:
    """The marked processes still running after `timeout` (none, or the test fails naming them)."""
    left = alive(marked(tag))
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = alive(marked(tag))
    for p in marked(tag):               # never leave them to the next test, whatever the outcome
        try:
            p.kill()
        except psutil.Error:
            pass
    return left


def config(tmp: Path, machines: int, processes: int, port: int) -> Path:
    cfg = tmp / f"c{machines}x{processes}.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                   f"num_machines: {machines}\nnum_processes: {machines * processes}\nmachine_rank: 0\n"
                   f"main_process_ip: 127.0.0.1\nmain_process_port: {port}\nmixed_precision: 'no'\nuse_cpu: true\n")
    return cfg


def start(tmp: Path, cfg: Path, tag: str, *args: str, extra: dict[str, str] | None = None) -> subprocess.Popen:
    e = {**env(), MARKER: tag, "WIZARD_PREFLIGHT_SECRET": "the-signal-tests-shared-secret", **(extra or {})}
    return subprocess.Popen([sys.executable, "-m", "wizard", "preflight", "--config-file", str(cfg), "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=tmp,
                            start_new_session=True)


def with_cmdline(tag: str, words: str) -> list[psutil.Process]:
    out = []
    for p in marked(tag):
        try:
            if words in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def ended(proc: subprocess.Popen, sig: int) -> int:
    os.kill(proc.pid, sig)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the preflight did not end within 30 s of signal {sig}")
    return proc.returncode


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"])
def test_a_signal_while_the_node_gathers_its_facts_ends_the_facts_child(tmp_path, sig):
    fifo = tmp_path / "nvml.json"
    os.mkfifo(fifo)                  # opened by the fake NVML, never written: the node child waits there
    tag = uuid.uuid4().hex
    proc = start(tmp_path, config(tmp_path, 1, 1, free_port()), tag, "--check-timeout", "60",
                 extra={"WIZARD_FAKE_NVML": str(fifo)})
    try:
        assert wait_for(lambda: with_cmdline(tag, "wizard.preflight.node"), 60), "the facts child never started"
        code = ended(proc, sig)
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    finally:
        left = nothing_left(tag)
    assert left == []


@pytest.mark.timeout(120)
def test_a_signal_while_the_main_node_waits_for_the_others_ends_it_and_frees_the_port(tmp_path):
    tag = uuid.uuid4().hex
    port = free_port()
    proc = start(tmp_path, config(tmp_path, 2, 1, port), tag, "--machine-rank", "0", "--join-timeout", "60")
    try:
        def listening():
            return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                       for c in psutil.net_connections("tcp"))
        assert wait_for(listening, 60), "the main node never listened"
        assert ended(proc, signal.SIGHUP) == 130
    finally:
        left = nothing_left(tag)
    assert left == [] and not listening()


@pytest.mark.timeout(180)
def test_sigkill_during_the_collectives_ends_the_collective_and_the_ranks_it_spawned(tmp_path):
    tag = uuid.uuid4().hex
    proc = start(tmp_path, config(tmp_path, 1, 2, free_port()), tag, "--collective-timeout", "120",
                 "--allreduce-mb", "64")
    try:
        def ranks():                  # the collective child's other rank: the preflight's grandchild
            return [c for p in with_cmdline(tag, "wizard.preflight.collective") for c in p.children()]
        assert wait_for(lambda: len(ranks()) >= 1, 120), "the collective never started its other rank"
        assert ended(proc, signal.SIGKILL) == -signal.SIGKILL
    finally:
        left = nothing_left(tag)
    assert left == []


@pytest.mark.timeout(240)
def test_sigterm_to_one_node_during_the_collectives_stops_every_node_within_seconds(tmp_path):
    """Node 1 stopped by SIGTERM mid-collective: it ends with its child (exit 130); the main node hears its end at
    once, stops its own collective and names node 1 as the cause, without waiting out the collective timeout."""
    tag = uuid.uuid4().hex
    cfg = config(tmp_path, 2, 1, free_port())
    args = ("--join-timeout", "60", "--collective-timeout", "150", "--allreduce-mb", "64")
    main = start(tmp_path, cfg, tag, "--machine-rank", "0", *args)
    other = start(tmp_path, cfg, tag, "--machine-rank", "1", *args)
    try:
        def collective_of(proc):
            return [p for p in with_cmdline(tag, "wizard.preflight.collective")
                    if any(a.pid == proc.pid for a in p.parents())]
        assert wait_for(lambda: collective_of(main) and collective_of(other), 120), "no collective started"
        time.sleep(1.0)               # both in the collective
        assert ended(other, signal.SIGTERM) == 130
        start_ = time.monotonic()
        out, err = main.communicate(timeout=60)
        seconds = time.monotonic() - start_
    finally:
        left = nothing_left(tag)
    assert left == []
    import json
    doc = json.loads(out)
    assert main.returncode == 1 and seconds < 30, (seconds, err[-2000:])
    cause = doc["cause"]
    assert cause["node"] == 1 and "ended" in cause["detail"], doc["rows"]
