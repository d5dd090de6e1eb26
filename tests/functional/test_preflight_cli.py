"""`wizard preflight` on one machine (fast): what it reads from a wizard-written config, how a node reads a version
(the module its interpreter would import), the rendezvous' stranger detection, the CLI's bad input, no torch in the
parent, and the measured network reaching `wizard plan` through the calibration."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.launch_support import env
from wizard.preflight import children, expect, rendezvous, run
from wizard.preflight.secret import Secret
from wizard.probe.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def wizard(*args, cwd=None, extra_env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, cwd=cwd,
                          env={**env(), **(extra_env or {})}, timeout=timeout)


@pytest.fixture
def offload_config(tmp_path):
    """A wizard-written 2-machine ZeRO-2 + CPU optimizer offload config for one (fake) A100 per machine."""
    r = wizard("--non-interactive", "--backend", "deepspeed", "--zero-stage", "2", "--offload", "cpu",
               "--num-processes", "2", "--num-machines", "2", "--main-process-ip", "127.0.0.1",
               "--main-process-port", "29555", "--params", "1M", "--hidden-size", "64", "--layers", "2",
               "--vocab-size", "128", "--output-dir", str(tmp_path / "out"), cwd=tmp_path,
               extra_env={"WIZARD_FAKE_NVML": "1xA100-80GB"})
    assert r.returncode == 0, r.stderr
    return tmp_path / "out" / "default_config.yaml"


def test_expectation_reads_the_config_its_deepspeed_file_and_the_plan(offload_config):
    e = expect.expectation(str(offload_config))
    assert (e.num_machines, e.processes_per_node, e.uses_gpus) == (2, 1, True)
    assert (e.main_ip, e.main_port) == ("127.0.0.1", 29555)
    assert e.pinned_blocks == ["optimizer"]          # the wizard writes pin_memory: true for CPU offload
    assert e.params == 1_000_000 and e.per_gpu_bytes and e.host_ram_bytes
    assert e.assumed_gbps == 200.0 and "A100" in e.assumed_source     # the plan's own network figure and its source


def test_a_node_reads_the_version_its_interpreter_would_import(tmp_path):
    shim = tmp_path / "site"
    (shim / "peft").mkdir(parents=True)
    (shim / "peft" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (shim / "peft-0.0.1.dist-info").mkdir()
    (shim / "peft-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: peft\nVersion: 0.0.1\n")
    code = "import json; from wizard.preflight.node import versions; print(json.dumps(versions()['peft']))"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60)
    shimmed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**env(), "PYTHONPATH": f"{shim}:{env()['PYTHONPATH']}"})
    from importlib.metadata import version
    assert json.loads(plain.stdout)["version"] == version("peft")
    assert json.loads(shimmed.stdout) == {"version": "0.0.1", "path": str(shim / "peft")}


def test_a_silent_listener_is_told_apart_from_the_main_node_within_seconds():
    port = free_port()
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", port))
    stranger.listen(4)
    try:
        start = time.monotonic()
        sock, _, outcome = rendezvous.probe_connect("127.0.0.1", port, time.monotonic() + 20)
        assert sock is None and outcome["kind"] == "foreign"
        assert time.monotonic() - start < rendezvous.BANNER_TIMEOUT_S + 2
    finally:
        stranger.close()


def test_the_main_nodes_rendezvous_answers_and_collects_a_node():
    port = free_port()
    shared = Secret(b"0123456789abcdef-the-run", "test")
    server = rendezvous.Server(port, shared, machines=2)
    try:
        sock, reader, outcome = rendezvous.probe_connect("127.0.0.1", port, time.monotonic() + 10)
        assert outcome["kind"] == "ok"
        assert rendezvous.join(sock, reader, outcome["token"], 1, shared, time.monotonic() + 10) == (True, "")
        rendezvous.send(sock, {"facts": {"host": "n2"}})
        server.wait_for({1}, time.monotonic() + 10)
        assert server.joined()[1]["facts"] == {"host": "n2"}
        done = threading.Thread(target=server.finish, args=({"exit_code": 0}, time.monotonic() + 10))
        done.start()
        assert reader.read(time.monotonic() + 10) == {"exit_code": 0}
        sock.close()
        done.join(10)
        assert not done.is_alive()
        with pytest.raises(OSError):          # the port is closed for good: torch's store can take it
            socket.create_connection(("127.0.0.1", port), timeout=2)
    finally:
        server.close()


def test_a_refused_port_is_retried_until_the_deadline():
    port = free_port()
    sock, _, outcome = rendezvous.probe_connect("127.0.0.1", port, time.monotonic() + 1.5)
    assert sock is None and outcome["kind"] == "refused" and outcome["seconds"] >= 1.4


@pytest.mark.parametrize("args, field", [
    (["--machine-rank", "-1"], "--machine-rank"),
    (["--join-timeout", "nan"], "--join-timeout"),
    (["--main-process-port", "70000"], "--main-process-port"),
    (["--config-file", "/nonexistent.yaml"], "--config-file"),
])
def test_bad_input_is_one_line_and_exit_2(args, field):
    r = wizard("preflight", *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and field in r.stderr and "Traceback" not in r.stderr


def test_machine_rank_beyond_the_config_is_bad_input(tmp_path, offload_config):
    r = wizard("preflight", "--config-file", str(offload_config), "--machine-rank", "2")
    assert r.returncode == 2 and "--machine-rank" in r.stderr and "0-1" in r.stderr


def test_one_machine_preflight_runs_without_torch_in_the_parent(tmp_path):
    cfg = tmp_path / "one.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
                   "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n")
    code = ("import sys, json; from wizard.frontends.cli import main; c = main(['preflight', '--config-file', "
            f"{str(cfg)!r}, '--json']); print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(c)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert doc["exit_code"] == 0 and doc["verdict"] == "preflight: all clear on 1 node"
    assert {row["check"] for row in doc["rows"]} >= {"GPUs", "host RAM", "ulimit -l", "/dev/shm", "checkpoint disk"}
    assert r.stdout.strip().endswith("NO-TORCH")


def test_a_recorded_network_is_what_the_next_plan_uses_and_says_so(tmp_path):
    from wizard.planning import calibration
    cal = tmp_path / "calibration.json"
    plan_args = ["plan", "--params", "1M", "--hidden-size", "64", "--layers", "2", "--vocab-size", "128",
                 "--num-machines", "2", "--num-processes", "2", "--main-process-ip", "127.0.0.1", "--json"]
    e = {"WIZARD_CALIBRATION_FILE": str(cal), "WIZARD_FAKE_NVML": "1xA100-80GB"}
    before = json.loads(wizard(*plan_args, extra_env=e).stdout)
    assert before["plan"]["inter_node_gbps"] == 200.0
    # the preflight's record for these machines (1 x A100 per machine), then a tune entry beside it survives
    path, key = calibration.record_network(["NVIDIA A100-SXM4-80GB"], 1, False, 37.5, 2, "nccl", path=cal)
    assert key == "1xNVIDIA A100-SXM4-80GB"
    calibration.record(type("H", (), {"gpus": []})(), type("T", (), {"processes_per_machine": 1, "cpu": True})(),
                       "full", [{"rung": "ddp", "speed_ratio": 0.9}], path=cal)
    assert json.loads(cal.read_text())["network"][key]["gbps"] == 37.5
    after = json.loads(wizard(*plan_args, extra_env=e).stdout)
    assert after["plan"]["inter_node_gbps"] == 37.5
    text = wizard(*plan_args[:-1], extra_env=e).stdout
    assert "Machines are joined by 37.5 Gb/s" in text and "measured by `wizard preflight` (nccl all-reduce" in text
    # a figure the user gives wins over the measurement, and --no-calibration shows the class default
    given = json.loads(wizard(*plan_args, "--inter-node-gbps", "400", extra_env=e).stdout)
    assert given["plan"]["inter_node_gbps"] == 400.0
    raw = json.loads(wizard(*plan_args, "--no-calibration", extra_env=e).stdout)
    assert raw["plan"]["inter_node_gbps"] == 200.0


def test_a_fact_that_hangs_is_recorded_as_a_timeout_not_waited_for():
    from wizard.preflight.node import with_timeout
    start = time.monotonic()
    assert with_timeout(lambda: time.sleep(30), 0.5) == {"timeout": 0.5}
    assert time.monotonic() - start < 2
    assert with_timeout(lambda: 1 / 0, 5)["error"].startswith("ZeroDivisionError")


def test_a_child_past_its_deadline_is_killed_with_what_it_started():
    import psutil
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            "print('{\"grandchild\": %d}' % p.pid, flush=True); time.sleep(60)")
    start = time.monotonic()
    lines, _, why = children.run([sys.executable, "-c", code], timeout=3)
    assert why == "timeout" and time.monotonic() - start < 10
    grandchild = lines[0]["grandchild"]
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_the_launch_views_log_pane_shows_the_preflight_phase():
    from launch.follow import event_line
    assert event_line({"type": "preflight", "message": "all clear on 2 nodes, 1 warning"}) == \
        "preflight: all clear on 2 nodes, 1 warning"


def test_a_node_that_joined_gets_the_main_nodes_verdict_when_another_never_came(tmp_path):
    """Three machines configured, two started: the main node names node 2, skips the collective, and node 1 exits
    with the main node's verdict (1), not with its own clear rows."""
    port = free_port()
    cfg = tmp_path / "three.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 3\n"
                   f"num_processes: 3\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\nmain_process_port: {port}\n"
                   "mixed_precision: 'no'\nuse_cpu: true\n")
    args = [sys.executable, "-m", "wizard", "preflight", "--config-file", str(cfg), "--join-timeout", "4", "--json"]
    other = subprocess.Popen(args + ["--machine-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env(), cwd=tmp_path)
    main = subprocess.run(args + ["--machine-rank", "0"], capture_output=True, text=True, env=env(), timeout=120,
                          cwd=tmp_path)
    out1 = other.communicate(timeout=60)[0]
    doc0, doc1 = json.loads(main.stdout), json.loads(out1)
    joined = [r for r in doc0["rows"] if r["check"] == "joined"]
    assert [(r["node"], r["status"]) for r in joined] == [(2, "fail")]
    assert not [r for r in doc0["rows"] if r["check"].startswith("all-reduce")]
    assert main.returncode == 1 and other.returncode == 1
    assert doc1["verdict"] == doc0["verdict"] and "node 2 joined" in doc1["verdict"]
