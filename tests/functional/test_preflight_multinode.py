"""`wizard preflight` for real, on the local 2-node SLURM of test_launch_multinode (slurmctld, `slurmd -N n1` and
`-N n2`, munge; both nodes are this machine at 127.0.0.1): every node runs it through `srun` as the emitted sbatch
script runs the launch, they meet at main_process_port, and a gloo all-reduce crosses the two nodes.

Planted failures, each to be named in one row with its fix, with nothing left running after:
- main_process_port held by another program (a listener this test starts; the two nodes share this host's
  network, so it stands where n2 connects and where n1 must bind);
- and, each named as the cause within 15 s (issue 41: fail fast; the collective is not run, or stopped), exit 1 on
  both nodes, with no row on the other node that is not true there:
  - n2 with another peft: n2's interpreter has a directory first on its PYTHONPATH holding a peft 0.0.1 (its
    package and its dist-info), which is what `import peft` there would load; the check reads the version the way
    that node would import it;
  - n2 with GLOO_SOCKET_IFNAME naming an interface it does not have;
  - a main_process_ip that does not resolve (on either node).
And `wizard launch` with a multi-machine config runs the preflight as its first phase: on a clear preflight
training follows; on a finding the launch stops before any rank starts. The cluster is started once for the module.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.functional.test_launch_multinode import LocalSlurm, ensure_slurm, free_port, run_sbatch
from tests.launch_support import env

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")

pytestmark = pytest.mark.slow
FAIL_FAST_S = 15


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory):
    """One local 2-node SLURM for the module's tests (each starts its own job steps)."""
    why = ensure_slurm()
    if why:
        pytest.skip(why)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cpu_config(tmp_path: Path, port: int, main_ip: str | None = None, name: str = "two-nodes.yaml") -> Path:
    """Two machines of one CPU process (DDP over gloo), the config's main address left to SLURM unless given."""
    cfg = tmp_path / name
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 2\n"
                   "num_processes: 2\nmachine_rank: 0\n" + (f"main_process_ip: {main_ip}\n" if main_ip else "") +
                   f"main_process_port: {port}\nmixed_precision: 'no'\nuse_cpu: true\n"
                   "rdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
    return cfg


def node_wrapper(tmp_path: Path, n2_pythonpath: str | None = None, n2_env: dict[str, str] | None = None) -> Path:
    """$WIZARD for the job: this checkout's wizard, with n2's own PYTHONPATH first where it has one (what a node
    with another environment would import), and n2's own environment variables."""
    w = tmp_path / "wizard-node.sh"
    extra = (f'if [ "${{SLURMD_NODENAME:-}}" = n2 ]; then export PYTHONPATH="{n2_pythonpath}:$PYTHONPATH"; fi\n'
             if n2_pythonpath else "")
    extra += "".join(f'if [ "${{SLURMD_NODENAME:-}}" = n2 ]; then export {k}="{v}"; fi\n'
                     for k, v in (n2_env or {}).items())
    w.write_text(f"#!/bin/bash\n{extra}exec {sys.executable} -m wizard \"$@\"\n")
    w.chmod(0o755)
    return w


def srun_preflight(cluster, tmp_path: Path, cfg: Path, wrapper: Path, *extra: str, timeout: float = 120,
                   extra_env: dict[str, str] | None = None):
    """`srun -N2 --ntasks-per-node=1 wizard preflight --json` from inside the allocation, each node's JSON in
    pf-NODE.json; (seconds, srun's exit code, node -> its JSON, srun's output)."""
    out = tmp_path / "pf"
    out.mkdir(exist_ok=True)
    per_node = (f'"$WIZARD" preflight --config-file {cfg} --json --join-timeout 20 {" ".join(extra)} '
                f'> {out}/pf-$SLURM_NODEID.json 2> {out}/pf-$SLURM_NODEID.err')
    job_env = {**env(), **cluster.env, "WIZARD": str(wrapper), **(extra_env or {})}
    start = time.monotonic()
    r = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "-t", "2", "bash", "-c",
                        per_node], capture_output=True, text=True, env=job_env, cwd=tmp_path, timeout=timeout)
    seconds = time.monotonic() - start
    docs = {}
    for node in (0, 1):
        f = out / f"pf-{node}.json"
        text = f.read_text() if f.exists() else ""
        docs[node] = json.loads(text) if text.strip() else {"stderr": (out / f"pf-{node}.err").read_text()
                                                            if (out / f"pf-{node}.err").exists() else ""}
    return seconds, r.returncode, docs, r.stdout + r.stderr


def rows_of(doc: dict, node: int | None = None, check: str | None = None) -> list[dict]:
    return [r for r in doc.get("rows", []) if (node is None or r["node"] == node) and (check is None or
                                                                                     r["check"] == check)]


def left_running(marker: str) -> list[str]:
    """Processes whose command line names this test's files (its preflight, collective and launch children)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if marker in cmd and p.pid != os.getpid() and "pytest" not in cmd:
            out.append(f"{p.pid} {cmd[:160]}")
    return out


def assert_nothing_left(marker: str) -> None:
    deadline = time.monotonic() + 10
    while left_running(marker) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left_running(marker) == []


@pytest.mark.timeout(300)
def test_two_node_preflight_through_srun_passes_with_a_measured_gloo_all_reduce(tmp_path, local_slurm):
    port = free_port()
    cfg = cpu_config(tmp_path, port)
    cal = {"WIZARD_CALIBRATION_FILE": str(tmp_path / "calibration.json")}
    seconds, code, docs, output = srun_preflight(local_slurm, tmp_path, cfg, node_wrapper(tmp_path), "--record",
                                                 extra_env=cal)
    main = docs[0]
    assert code == 0 and main.get("exit_code") == 0, (output, docs)
    assert main["main"] is True and docs[1]["main"] is False and docs[1]["exit_code"] == 0
    # SLURM gave the machine ranks and the main address (NodeAddr of n1), the config gave neither
    assert main["expectation"]["main_ip"] == "127.0.0.1" and main["expectation"]["main_port"] == port
    assert {r["node"] for r in main["rows"]} == {0, 1}
    for node in (0, 1):
        assert rows_of(main, node, "reach main port")[0]["status"] == "ok"
        assert rows_of(main, node, "versions")[0]["status"] == "ok"
        across = rows_of(main, node, "all-reduce across nodes")[0]
        assert "gloo, 2 ranks" in across["detail"] and "Gb/s" in across["detail"], across
    assert main["across_gbps"] > 0
    assert not [r for r in main["rows"] if r["status"] == "fail"]
    assert_nothing_left(str(cfg))
    # --record: the median of the samples with their spread; the next plan for these machines (CPU processes, one
    # per machine) uses the measured network
    assert main["recorded"] and docs[1]["recorded"] is None
    (entry,) = json.loads((tmp_path / "calibration.json").read_text())["network"].values()
    spread = entry["spread"]
    assert spread["samples"] >= 5 and spread["low"] <= entry["gbps"] <= spread["high"], entry
    assert entry["gbps"] == round(main["across"]["busbw_gbps"], 4)
    plan = subprocess.run([sys.executable, "-m", "wizard", "plan", "--params", "1M", "--hidden-size", "64", "--layers",
                           "2", "--vocab-size", "128", "--use-cpu", "yes", "--num-processes", "2", "--num-machines",
                           "2", "--main-process-ip", "127.0.0.1"], capture_output=True, text=True,
                          env={**env(), **cal}, cwd=tmp_path, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert f"Machines are joined by {round(main['across_gbps'], 4):g} Gb/s" in plan.stdout
    assert "measured by `wizard preflight` (gloo all-reduce across 2 machines)" in plan.stdout


@pytest.mark.timeout(300)
def test_a_listener_on_the_main_port_is_named_within_seconds(tmp_path, local_slurm):
    port = free_port()
    cfg = cpu_config(tmp_path, port)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen(8)          # accepts (the kernel completes the handshake) and never says a word
    try:
        seconds, code, docs, output = srun_preflight(local_slurm, tmp_path, cfg, node_wrapper(tmp_path))
    finally:
        squatter.close()
    assert code != 0, output
    assert seconds < 30, seconds      # ~4 s here: the finding comes from the silent banner (3 s), not a join timeout
    main_port = rows_of(docs[0], 0, "main port free")
    assert main_port and main_port[0]["status"] == "fail", docs[0]
    assert f"port {port} is taken on the main node" in main_port[0]["detail"] and main_port[0]["fix"]
    assert str(os.getpid()) in main_port[0]["detail"]             # who holds it: this test
    reach = rows_of(docs[1], 1, "reach main port")
    assert reach and reach[0]["status"] == "fail", docs[1]
    assert "held by another program" in reach[0]["detail"] and "main_process_port" in reach[0]["fix"]
    assert "said nothing for 3 s" in reach[0]["detail"]
    assert docs[0]["exit_code"] == 1 and docs[1]["exit_code"] == 1
    assert_nothing_left(str(cfg))


def only_true_findings(docs: dict, causes: set[tuple[int, str]]) -> None:
    """Every finding either node shows is one of the causes planted (no "main node sent no verdict", no collective
    that failed for the cause, no firewall blamed for DNS)."""
    for node, doc in docs.items():
        wrong = [(r["node"], r["check"], r["detail"][:100]) for r in doc.get("rows", []) if r["status"] == "fail"
                 and (r["node"], r["check"]) not in causes]
        assert not wrong, (node, wrong)


def planted(local_slurm, tmp_path: Path, wrapper: Path, *extra: str):
    port = free_port()
    cfg = cpu_config(tmp_path, port)
    seconds, code, docs, output = srun_preflight(local_slurm, tmp_path, cfg, wrapper, *extra)
    assert code != 0 and docs[0].get("exit_code") == 1 and docs[1].get("exit_code") == 1, (output, docs)
    assert seconds < FAIL_FAST_S, (seconds, output)
    assert_nothing_left(str(cfg))
    return docs


@pytest.mark.timeout(300)
def test_another_peft_on_the_second_node_is_named_as_the_cause_within_seconds(tmp_path, local_slurm):
    shim = tmp_path / "n2-site"
    (shim / "peft").mkdir(parents=True)
    (shim / "peft" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (shim / "peft-0.0.1.dist-info").mkdir()
    (shim / "peft-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: peft\nVersion: 0.0.1\n")
    docs = planted(local_slurm, tmp_path, node_wrapper(tmp_path, str(shim)))
    from importlib.metadata import version
    row = rows_of(docs[0], 1, "versions")[0]
    assert row["status"] == "fail", docs[0]
    assert f"peft 0.0.1 (node 0: {version('peft')})" in row["detail"] and str(shim / "peft") in row["detail"]
    assert f"peft=={version('peft')}" in row["fix"]
    assert rows_of(docs[0], 0, "versions")[0]["status"] == "info"          # the reference node
    assert docs[0]["versions"]["1"]["peft"]["version"] == "0.0.1"
    assert docs[0]["versions"]["0"]["peft"]["version"] == version("peft")
    for node in (0, 1):                                   # the cause, on both nodes; no collective ran for it
        assert (docs[node]["cause"]["node"], docs[node]["cause"]["check"]) == (1, "versions")
        assert not [r for r in docs[node]["rows"] if r["check"].startswith(("all-reduce", "collectives"))]
    only_true_findings(docs, {(1, "versions")})


@pytest.mark.timeout(300)
def test_a_gloo_interface_the_second_node_lacks_is_named_as_the_cause_within_seconds(tmp_path, local_slurm):
    docs = planted(local_slurm, tmp_path, node_wrapper(tmp_path, n2_env={"GLOO_SOCKET_IFNAME": "nosuch0"}))
    for node in (0, 1):
        cause = docs[node]["cause"]
        assert (cause["node"], cause["check"]) == (1, "GLOO_SOCKET_IFNAME"), docs[node]
        assert "nosuch0 is not an interface of this node" in cause["detail"]
    only_true_findings(docs, {(1, "GLOO_SOCKET_IFNAME")})


@pytest.mark.timeout(300)
def test_a_main_host_that_does_not_resolve_is_named_as_dns_within_seconds(tmp_path, local_slurm):
    docs = planted(local_slurm, tmp_path, node_wrapper(tmp_path), "--main-process-ip", "nosuch.invalid")
    for node in (0, 1):                                  # each node says it of itself, as DNS, not as a firewall
        cause = docs[node]["cause"]
        assert (cause["node"], cause["check"]) == (node, "resolve main host"), docs[node]
        assert "nosuch.invalid does not resolve here" in cause["detail"]
        assert not [r for r in docs[node]["rows"] if "firewall" in r["detail"] + (r["fix"] or "")]
    only_true_findings(docs, {(0, "resolve main host"), (1, "resolve main host")})


@pytest.mark.timeout(900)
def test_emitted_sbatch_runs_the_preflight_first_then_trains(tmp_path, local_slurm):
    """The launch's own way to the nodes: `wizard launch --emit-slurm 2` (preflight on by default for a
    multi-machine config), submitted; each node's launch prints the phase lines, node 0 the table."""
    port = free_port()
    cfg = cpu_config(tmp_path, port, main_ip="127.0.0.1")
    job_file = tmp_path / "job.sbatch"
    r = subprocess.run([sys.executable, "-m", "wizard", "launch", "--emit-slurm", "2", "--config-file", str(cfg),
                        "--slurm-gpus-per-node", "0", "--slurm-output", str(job_file), "--grace", "10", "--",
                        TRAIN, "--steps", "2"], capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    job, st, output = run_sbatch(local_slurm, job_file, tmp_path, 800)
    assert st == "COMPLETED", f"job {job} ended {st}\n{output[-6000:]}"
    assert output.count("[wizard] phase 1/2: preflight") == 2 and output.count("[wizard] phase 2/2: training") == 2
    assert "preflight: all clear on 2 nodes" in output and "measured across nodes (gloo, 2 ranks" in output
    assert output.index("phase 1/2: preflight") < output.index("phase 2/2: training")
    for node in (0, 1):
        run_dir = tmp_path / "wizard-runs" / f"slurm-{job}" / f"node-{node}"
        state = json.loads((run_dir / "run.json").read_text())
        assert state["status"] == "succeeded", state
        # the run's first event is the phase it passed: the live view and `wizard attach` show it
        first = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
        assert first["type"] == "preflight" and first["message"].startswith("all clear on 2 nodes"), first
    assert_nothing_left(str(cfg))


@pytest.mark.timeout(300)
def test_launch_stops_before_training_when_the_preflight_finds_a_blocked_port(tmp_path):
    """The machine_rank invocations of accelerate's static rendezvous, by hand (no SLURM): `wizard launch
    --machine-rank 0` and `1` with a listener on the main port: both stop at the preflight, exit 1, no rank run."""
    port = free_port()
    cfg = cpu_config(tmp_path, port, main_ip="127.0.0.1")
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen(8)
    e = env()
    procs = []
    start = time.monotonic()
    try:
        for node in (0, 1):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg),
                 "--machine-rank", str(node), "--preflight-timeout", "15", "--run-dir", str(tmp_path / f"node-{node}"),
                 "--", TRAIN,
                 "--steps", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e, cwd=tmp_path))
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        squatter.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
    # a bound against a hang, not a speed target: two wizard starts and the preflight's children take ~15 s here
    # alone and 80 s beside a loaded box's other tests; a hang is the 120 s communicate above
    assert time.monotonic() - start < 110
    assert [p.returncode for p in procs] == [1, 1], outs
    assert "phase 1/2: preflight" in outs[0] and "phase 2/2" not in outs[0] + outs[1]
    assert "main port free" in outs[0] and f"port {port} is taken on the main node" in outs[0]
    assert "held by another program" in outs[1]
    assert not (tmp_path / "node-0" / "run.json").exists() and not (tmp_path / "node-1").exists()
    assert_nothing_left(str(cfg))
