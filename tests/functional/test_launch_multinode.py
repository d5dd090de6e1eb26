"""Multi-node for real (issue 11): the sbatch script `wizard launch --emit-slurm` writes, submitted
to a real SLURM (Debian's slurmctld + two slurmd nodes on this machine, munge for auth), runs a
2-node, 4-rank DeepSpeed ZeRO-3 world; and two `wizard launch --machine-rank 0/1` started by hand
on this machine form one world without SLURM.

The local cluster: one slurmctld and two `slurmd -N n1|n2`, each node with its own Port and
NodeAddr=127.0.0.1 (so nothing needs /etc/hosts), a private munged socket and key, spool and state
directories under a tmp dir, free ports picked at start. Every daemon runs in the foreground as
our child (-D / -F) and is killed at the end; every wait has a timeout. SLURM is installed with
apt-get when missing (CI runs as root with Debian's archive); where that is impossible the test
is skipped and says why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import env, outputs_of

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "sinfo")

pytestmark = pytest.mark.slow




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_slurm() -> str | None:
    """None when SLURM and munge are there (installed now if need be), else why they are not."""
    if all(shutil.which(b) for b in SLURM_BINARIES):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "slurmctld/slurmd/munge are missing and this is not a root Debian box to apt-get them"
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "slurmd", "slurmctld", "slurm-client", "munge"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=300)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    missing = [b for b in SLURM_BINARIES if not shutil.which(b)]
    return f"apt-get could not install SLURM ({missing} missing): {r.stderr[-300:]}" if missing else None


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool-n1", "spool-n2", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = r / "munge.sock"
        self._spawn(["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={r / 'munged.pid'}", f"--log-file={r / 'munged.log'}",
                     f"--seed-file={r / 'munge.seed'}"], "munged")
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        host = socket.gethostname().split(".")[0]
        ctld, n1, n2 = free_port(), free_port(), free_port()
        (r / "slurm.conf").write_text(f"""ClusterName=wizardtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
PlugStackConfig=/dev/null
KillWait=5
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname={host} Port={n1} CPUs=2 RealMemory=6144 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname={host} Port={n2} CPUs=2 RealMemory=6144 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=60 State=UP OverSubscribe=YES
""")
        self._spawn(["slurmctld", "-D", "-i"], "slurmctld")
        time.sleep(1.0)
        self._spawn(["slurmd", "-D", "-N", "n1"], "slurmd-n1")
        self._spawn(["slurmd", "-D", "-N", "n2"], "slurmd-n2")
        deadline = time.monotonic() + 60
        out = ""
        while time.monotonic() < deadline:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
            if sorted(out.split()) == ["idle", "idle", "n1", "n2"]:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the local SLURM did not come up: sinfo says {out!r}; {self.logs()}")

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=30, **kw)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")) + sorted(self.root.glob("*.out")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def stop(self) -> None:
        try:
            self.run(["scancel", "--full", "--user", "root"])
        except (OSError, subprocess.SubprocessError):
            pass
        for p in reversed(self.procs):        # slurmds, slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture
def local_slurm(tmp_path):
    why = ensure_slurm()
    if why:
        pytest.skip(why)
    cluster = LocalSlurm(tmp_path / "slurm")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def zero3_config(tmp_path: Path, machines: int, processes: int, port: int) -> Path:
    out = tmp_path / "accelerate"
    w = subprocess.run([sys.executable, "-m", "wizard", "--non-interactive", "--backend", "deepspeed",
                        "--zero-stage", "3", "--num-processes", str(processes), "--num-machines", str(machines),
                        "--main-process-ip", "127.0.0.1", "--main-process-port", str(port), "--params", "1M",
                        "--hidden-size", "64", "--layers", "2", "--vocab-size", "128", "--output-dir", str(out)],
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert w.returncode == 0, w.stdout + w.stderr
    return out / "default_config.yaml"


def engine_lines(run_dir: Path) -> dict[int, dict[str, str]]:
    """rank -> the fields of its `[engine]` line (examples/train.py describes what DeepSpeed built)."""
    found = {}
    for log in (run_dir / "logs" / "attempt-1").glob("rank-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            m = re.search(r"\[rank(\d+)\] (engine=.*)", line)      # tqdm may share the line
            if m:
                found[int(m.group(1))] = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
                break
    return found


def job_state(cluster: LocalSlurm, job: str) -> str:
    out = cluster.run(["scontrol", "show", "job", job]).stdout
    m = re.search(r"JobState=(\w+)", out)
    return m.group(1) if m else "GONE"


def run_sbatch(cluster: LocalSlurm, job_file: Path, workdir: Path, deadline_s: float) -> tuple[str, str, str]:
    """Submit the emitted job script to the local cluster and wait for it to end: (job id, final state, output)."""
    job_env = {**env(), **cluster.env, "WIZARD": f"{sys.executable} -m wizard"}
    sub = subprocess.run(["sbatch", "--parsable", "--chdir", str(workdir), str(job_file)], capture_output=True,
                         text=True, env=job_env, timeout=30)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + deadline_s
    st = job_state(cluster, job)
    while st in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(2)
        st = job_state(cluster, job)
    out_file = workdir / f"wizard-train-{job}.out"
    return job, st, out_file.read_text(errors="replace") if out_file.exists() else "(no job output)"


@pytest.mark.timeout(1200)
def test_sbatch_script_runs_a_two_node_four_rank_zero3_world_under_real_slurm(tmp_path, local_slurm):
    port = free_port()
    cfg = zero3_config(tmp_path, machines=2, processes=4, port=port)
    job_file = tmp_path / "job.sbatch"
    r = subprocess.run([sys.executable, "-m", "wizard", "launch", "--emit-slurm", "2", "--config-file", str(cfg),
                        "--slurm-gpus-per-node", "0", "--slurm-output", str(job_file), "--grace", "10", "--",
                        TRAIN, "--steps", "4"], capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    text = job_file.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --cpus-per-task=2" in text and "--gpus-per-node" not in text
    assert "#SBATCH --mem=5G" in text        # the plan's CPU ranks, their RSS and the launch's: the nodes have 6144M
    job, st, output = run_sbatch(local_slurm, job_file, tmp_path, 900)
    assert st == "COMPLETED", f"job {job} ended {st}\n{output[-6000:]}\n{local_slurm.logs()}"
    assert f"main node: n1 (127.0.0.1:{port}), nodes: 2" in output
    ranks: dict[int, dict[str, str]] = {}
    for node in (0, 1):
        run_dir = tmp_path / "wizard-runs" / f"slurm-{job}" / f"node-{node}"
        state = json.loads((run_dir / "run.json").read_text())
        assert state["status"] == "succeeded" and state["exit_code"] == 0, state
        lines = engine_lines(run_dir)
        assert sorted(lines) == [2 * node, 2 * node + 1], lines        # node 1 runs global ranks 2 and 3
        ranks.update(lines)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, f in ranks.items():
        # one ZeRO-3 world of 4: each rank holds a quarter of the parameter
        assert f["engine"] == "deepspeed" and f["zero_stage"] == "3" and f["world_size"] == "4", f
        assert int(f["local_numel"]) * 4 == int(f["ds_numel"]), f


@pytest.mark.timeout(900)
def test_two_machine_ranks_on_this_machine_form_one_world_without_slurm(tmp_path):
    """`wizard launch --machine-rank 0` and `--machine-rank 1`, each a node of 1 process (DDP over
    gloo), rendezvous at one port and train one world of 2."""
    port = free_port()
    cfg = tmp_path / "two-nodes.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\n"
                   "num_processes: 2\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\n"
                   f"main_process_port: {port}\nmixed_precision: 'no'\nuse_cpu: false\ngpu_ids: all\n"
                   "rdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
    procs = []
    for node in (0, 1):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg),
             "--machine-rank", str(node), "--run-dir", str(tmp_path / f"node-{node}"), "--grace", "10",
             "--", TRAIN, "--steps", "4"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=tmp_path))
    outs = outputs_of(procs, 800)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    for node in (0, 1):
        lines = engine_lines(tmp_path / f"node-{node}")
        assert list(lines) == [node], lines
        f = lines[node]
        assert f["engine"] == "ddp" and f["world_size"] == "2", f
