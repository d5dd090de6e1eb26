"""The preflight of a DeepSpeed pdsh config, through the real CLI: the main node alone runs `wizard launch` (DeepSpeed's
runner reaches the other hosts of the hostfile over ssh), so the main node starts the other hosts' preflight over
ssh too, and they meet at the main port. There is no sshd on this box: the run that passes goes through
tests/local_ssh.py ($WIZARD_SSH), which runs the command here as sshd would; the one that fails uses the real ssh
client against a closed port."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import env
from wizard.probe.ports import free_port

REPO = Path(__file__).resolve().parents[2]
LOCAL_SSH = f"{sys.executable} {REPO / 'tests' / 'local_ssh.py'} -o BatchMode=yes"


def wizard(*args, cwd=None, extra_env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, cwd=cwd,
                          env={**env(), **(extra_env or {})}, timeout=timeout)


def write_config(where: Path, launcher: str) -> tuple[Path, str]:
    """What the wizard writes for 2 machines of 1 CPU process each, DeepSpeed ZeRO-2, `launcher`, a hostfile of
    this machine twice; and what it printed."""
    where.mkdir(parents=True, exist_ok=True)
    hostfile = where / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")
    r = wizard("--non-interactive", "--model", str(REPO / "tests" / "fixtures" / "models" / "gpt2-tiny"),
               "--use-cpu", "yes", "--num-processes", "2", "--num-machines", "2", "--main-process-ip", "127.0.0.1",
               "--backend", "deepspeed", "--zero-stage", "2", "--deepspeed-multinode-launcher", launcher,
               "--deepspeed-hostfile", str(hostfile), "--output-dir", str(where / "out"), cwd=where)
    assert r.returncode == 0, r.stderr
    return where / "out" / "default_config.yaml", r.stdout


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One pdsh and one nossh config, written once for the module (each test picks its own free port)."""
    base = tmp_path_factory.mktemp("fanout")
    return {launcher: write_config(base / launcher, launcher) for launcher in ("pdsh", "nossh")}


@pytest.fixture
def pdsh_config(written):
    return written["pdsh"][0]


def flat(text: str) -> str:
    """The output's words on one line, without the nodes' labels ("[node 0 host] ") at each line's start."""
    return " ".join(" ".join(re.sub(r"^\[node \d+ [^]]*\] ", "", line).split()) for line in text.splitlines())


def port() -> list[str]:
    return ["--main-process-port", str(free_port())]


def test_the_write_says_to_launch_on_the_main_machine_only(written):
    cfg, said = written["pdsh"]
    hostfile = cfg.parent.parent / "hostfile"
    assert (f"Next: on the main machine (127.0.0.1), the first host of {hostfile}: wizard launch --config-file {cfg} "
            "-- your_train.py [args]") in said, said
    assert "DeepSpeed's pdsh launcher starts the other machines of the hostfile from there over ssh: launch nothing " \
           "on them" in said and "--machine-rank" not in said, said
    cfg, said = written["nossh"]                 # DeepSpeed's runner on each machine, started by hand
    assert f"wizard launch --config-file {cfg} --machine-rank 1 -- your_train.py [args]" in said, said


def test_the_main_node_starts_the_other_hosts_preflight_and_both_meet(pdsh_config):
    r = wizard("preflight", "--config-file", str(pdsh_config), "--join-timeout", "120", *port(),
               cwd=pdsh_config.parent, extra_env={"WIZARD_SSH": LOCAL_SSH})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "starting their preflight over ssh (localhost)" in r.stderr, r.stderr
    assert "preflight: all clear on 2 nodes" in r.stdout, r.stdout
    table = (pdsh_config.parent / "wizard-preflight.txt").read_text().splitlines()     # the full table
    assert any(line.startswith("1 ") and "all-reduce across nodes" in line for line in table), table
    assert "FAIL" not in r.stdout, r.stdout


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client (apt-get install -y openssh-client)")
def test_a_host_ssh_cannot_reach_is_a_finding_named_in_ssh_s_words_without_waiting_out_the_join(pdsh_config):
    start = time.monotonic()
    r = wizard("preflight", "--config-file", str(pdsh_config), "--join-timeout", "120", *port(),
               cwd=pdsh_config.parent,
               extra_env={"WIZARD_SSH": "ssh -p 1 -o BatchMode=yes -o ConnectTimeout=5"})
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL ssh node 1 (localhost): ssh could not start the preflight there: ssh: connect to host localhost " \
           "port 1" in flat(r.stdout), r.stdout
    assert "passwordless ssh" in r.stdout and "joined" not in r.stdout, r.stdout   # one row for one cause
    assert "preflight: 1 finding that stops the run (first: node 1 ssh)" in r.stdout, r.stdout
    assert took < 100, took             # the main node stopped waiting when ssh ended: not the 120 s join


def test_a_hostfile_of_another_size_stops_it_before_any_ssh(pdsh_config, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=1\nb slots=1\nc slots=1\n")
    cfg = tmp_path / "openmpi.yaml"             # the pdsh config with openmpi, another MPI launcher, and 3 hosts
    cfg.write_text(pdsh_config.read_text().replace(str(pdsh_config.parent.parent / "hostfile"), str(hostfile))
                   .replace("deepspeed_multinode_launcher: pdsh", "deepspeed_multinode_launcher: openmpi"))
    r = wizard("preflight", "--config-file", str(cfg), cwd=tmp_path, extra_env={"WIZARD_SSH": "false"})
    assert r.returncode == 1, r.stdout + r.stderr
    text = flat(r.stdout)
    assert f"{hostfile} gives DeepSpeed 3 hosts (a, b, c) and it starts a node on each, but num_machines is 2" in \
        text, r.stdout
    assert "over ssh" not in r.stderr, r.stderr


def test_launch_runs_the_fan_out_as_its_first_phase_and_a_finding_stops_it(pdsh_config):
    r = wizard("launch", "--headless", "--config-file", str(pdsh_config), "--preflight-timeout", "60", *port(), "--",
               str(REPO / "examples" / "train.py"), "--steps", "2", cwd=pdsh_config.parent,
               extra_env={"WIZARD_SSH": "false"}, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "starting their preflight over ssh (localhost)" in out, out
    # `false` exits 1: the command it was given ended, not ssh
    assert "FAIL preflight there node 1 (localhost): started over ssh, it ended (exit 1) without meeting the main " \
           "node" in flat(out), out
    assert "not launching" in out and "phase 2/2" not in out, out


def test_a_nossh_config_keeps_the_preflight_of_each_machine_by_hand(written, tmp_path):
    """nossh: DeepSpeed's runner on every machine, each with its machine_rank; nothing is started over ssh."""
    cfg = written["nossh"][0]
    r = wizard("preflight", "--config-file", str(cfg), "--join-timeout", "2", "--no-collective", *port(),
               cwd=tmp_path, extra_env={"WIZARD_SSH": "false"})
    assert r.returncode == 1 and "over ssh" not in r.stderr, r.stderr
    assert "start `wizard preflight --machine-rank 1` on that node" in flat(r.stdout), r.stdout


def test_with_deepspeeds_slurm_launcher_the_launch_says_to_run_it_with_srun(pdsh_config, tmp_path):
    """DeepSpeed's slurm launcher starts every node with srun from the main one: no other node runs `wizard launch`
    to meet, so the launch does not wait for one; it says how the preflight runs there."""
    import io

    from wizard.frontends.preflight_cli import launch_preflight
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text(pdsh_config.read_text().replace("deepspeed_multinode_launcher: pdsh",
                                                   "deepspeed_multinode_launcher: slurm"))
    out = io.StringIO()
    start = time.monotonic()
    code, verdict = launch_preflight(str(cfg), None, None, free_port(), join_timeout=60, out=out)
    assert (code, verdict) == (0, "skipped (DeepSpeed's slurm launcher: run it with srun inside the allocation)")
    assert f"srun --ntasks-per-node=1 wizard preflight --config-file {cfg}" in out.getvalue(), out.getvalue()
    assert time.monotonic() - start < 10
