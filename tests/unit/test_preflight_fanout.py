"""wizard/preflight/fanout.py's pure parts: which configs the main node starts every node of, the hostfile as
DeepSpeed's runner reads it (checked against DeepSpeed's own parser), and the command each host runs."""

from __future__ import annotations

import shlex
from importlib.metadata import version as _version

import pytest

from wizard.preflight import fanout
from wizard.preflight.fanout import HostfileError, active_hosts, parse_hostfile
from wizard.preflight.secret import Secret


def _accel(launcher=None, machines=2, kind="DEEPSPEED", **ds):
    doc = {"distributed_type": kind, "num_machines": machines, "deepspeed_config": dict(ds)}
    if launcher is not None:
        doc["deepspeed_config"]["deepspeed_multinode_launcher"] = launcher
    return doc


@pytest.mark.parametrize("doc, launcher, from_main", [
    (_accel(), "pdsh", "pdsh"),                         # accelerate's default when the config names none
    (_accel("openmpi"), "openmpi", "openmpi"),
    (_accel("mvapich"), "mvapich", "mvapich"),
    (_accel("mpich"), "mpich", "mpich"),
    (_accel("slurm"), "slurm", "slurm"),
    (_accel("nossh"), "nossh", None),                   # DeepSpeed's runner on every node, each with its rank
    (_accel("standard"), None, None),                   # torchrun on every node
    (_accel("pdsh", machines=1), None, None),
    (_accel("pdsh", kind="MULTI_GPU"), None, None),
    (_accel("pdsh", machines="two"), None, None),
])
def test_which_launchers_start_every_node_from_the_main_one(doc, launcher, from_main):
    assert fanout.multinode_launcher(doc) == launcher
    assert fanout.main_starts_every_node(doc) == from_main


def test_the_hostfile_as_deepspeed_reads_it():
    text = "# the cluster\n\nnode-a slots=8\n  node-b slots=8  \n#node-c slots=8\n"
    assert parse_hostfile(text) == {"node-a": 8, "node-b": 8}
    for bad, said in (("node-a\n", "line 1"), ("a slots=2\na slots=2\n", "a second time"), ("# none\n", "no host"),
                      ("a slots=x\n", "line 1")):
        with pytest.raises(HostfileError, match=said):
            parse_hostfile(bad)


CASES = [
    ("", ""), ("a@c", ""), ("c", ""), ("b:0,1", ""), ("", "b"), ("", "b:0"), ("", "b:0,1"), ("", "a@c:0,1,2,3"),
]


@pytest.mark.parametrize("include, exclude", CASES)
def test_the_hosts_started_are_deepspeeds_own(include, exclude):
    """The same hosts, in the same order, as DeepSpeed's runner (fetch_hostfile, parse_inclusion_exclusion)."""
    runner = pytest.importorskip("deepspeed.launcher.runner")
    for name in ("_parse_hostfile", "parse_inclusion_exclusion"):
        assert hasattr(runner, name), f"deepspeed.launcher.runner has no {name}: compare with what it has now"
    text = "a slots=4\nb slots=2\nc slots=4\n"
    pool = runner._parse_hostfile(text.splitlines())
    bare = include and any(":" not in part for part in include.split("@"))
    if bare and not runner.parse_inclusion_exclusion({"x": 1}, "x", ""):
        pytest.skip(f"deepspeed {_version('deepspeed')} keeps no slot of a host --include names bare (a bug its "
                    "later releases fixed); the fan-out starts the host, as those do")
    theirs = list(runner.parse_inclusion_exclusion(pool, include, exclude))
    assert active_hosts(parse_hostfile(text), include or None, exclude or None) == theirs


def test_a_filter_naming_what_the_hostfile_lacks_is_an_error():
    hosts = parse_hostfile("a slots=2\nb slots=2\n")
    with pytest.raises(HostfileError, match="names z"):
        active_hosts(hosts, "z")
    with pytest.raises(HostfileError, match="slot 5 of b"):
        active_hosts(hosts, None, "b:5")
    with pytest.raises(HostfileError, match="both"):
        active_hosts(hosts, "a", "b")


def test_the_command_each_host_runs(tmp_path):
    cfg = tmp_path / "my run" / "default_config.yaml"
    argv = fanout.remote_preflight("node-b", 1, config_file=str(cfg), main_ip="10.0.0.1", main_port=29600,
                                   join_timeout=75, check_timeout=20, collective_timeout=120, nbytes=None,
                                   collective=True, python="/opt/py env/bin/python", cwd="/work/a dir",
                                   ssh=["ssh", "-o", "BatchMode=yes"])
    # "--": a host is never one of ssh's options (issue 37: a hostfile host "-oProxyCommand=...")
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "--", "node-b"] and len(argv) == 6
    remote = shlex.split(argv[5])          # the remote shell's words
    assert remote[:4] == ["cd", "/work/a dir", "&&", "exec"]
    assert remote[4:8] == ["/opt/py env/bin/python", "-m", "wizard", "preflight"]
    words = remote[8:]
    assert words[words.index("--config-file") + 1] == str(cfg)
    assert words[words.index("--machine-rank") + 1] == "1"
    assert words[words.index("--main-process-ip") + 1] == "10.0.0.1"
    assert words[words.index("--main-process-port") + 1] == "29600"
    assert "--no-collective" not in words and "--allreduce-mb" not in words
    assert words[-1] == "--secret-stdin"   # the secret itself goes down ssh's stdin, never on a command line
    quiet = fanout.remote_preflight("n", 2, config_file="c.yaml", main_ip="h", main_port=1, join_timeout=1,
                                    check_timeout=1, collective_timeout=1, nbytes=8 << 20, collective=False,
                                    ssh=["ssh"])
    assert "--no-collective" in quiet[-1] and "--allreduce-mb 8" in quiet[-1]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch${IFS}/tmp/x", "-F/tmp/evil", "a;b", "a b\x1b[31m"])
def test_a_hostfile_host_that_ssh_would_read_as_an_option_is_a_finding_before_any_ssh(tmp_path, host):
    """Issue 37: a host name starting with "-" reached ssh in option position. It is refused with the hostfile's
    other errors (one row, nothing started), and ssh's argv puts "--" before the host anyway."""
    with pytest.raises(HostfileError, match="line 2"):
        parse_hostfile(f"node-a slots=1\n{host} slots=1\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"node-a slots=1\n{host} slots=1\n")
    hosts, row = fanout.plan_hosts(_accel(deepspeed_hostfile=str(hostfile)), "cfg.yaml")
    assert hosts is None and row.check == "hostfile" and "\x1b" not in row.detail and "\n" not in row.detail
    assert parse_hostfile("node-1 slots=8\n10.0.0.2 slots=8\nfe80::1%eth0 slots=8\n") == \
        {"node-1": 8, "10.0.0.2": 8, "fe80::1%eth0": 8}


def test_the_ssh_command_is_wizard_ssh_with_pdshs_options():
    assert fanout.ssh_command({}) == shlex.split(fanout.SSH_DEFAULT)
    assert fanout.ssh_command({"WIZARD_SSH": "ssh -p 2222", "PDSH_SSH_ARGS_APPEND": "-i /k/id"}) == \
        ["ssh", "-p", "2222", "-i", "/k/id"]


def test_the_hostfile_must_give_one_host_per_machine(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=1\nb slots=1\nc slots=1\n")
    hosts, row = fanout.plan_hosts(_accel(deepspeed_hostfile=str(hostfile)), "cfg.yaml")
    assert hosts is None and row.status == "fail" and "3 hosts (a, b, c)" in row.detail and "num_machines is 2" in \
        row.detail
    hosts, row = fanout.plan_hosts(_accel(deepspeed_hostfile=str(hostfile), deepspeed_exclusion_filter="b"), "c")
    assert hosts == ["a", "c"] and row is None
    hosts, row = fanout.plan_hosts(_accel(deepspeed_hostfile=str(tmp_path / "none")), "cfg.yaml")
    assert hosts is None and "No such file" in row.detail and "deepspeed_hostfile" in row.fix


def test_a_host_ssh_could_not_reach_is_named_with_ssh_s_words():
    import sys
    refused = ("import sys; print('ssh: connect to host node-b port 22: Connection refused', file=sys.stderr); "
               "sys.exit(255)")
    found = ("print('1 node-c  GPUs  FAIL  2 GPUs, the plan needs 8'); print('preflight: 1 finding'); "
             "raise SystemExit(1)")
    remotes = fanout.start_remotes({1: ("node-b", [sys.executable, "-c", refused]),
                                    2: ("node-c", [sys.executable, "-c", found])}, Secret(b"s" * 16, "test"))
    for r in remotes:
        r.proc.wait(30)
    rows = fanout.ssh_rows(remotes, joined=set(), launcher="pdsh")
    assert [(r.node, r.check) for r in rows] == [(1, "ssh"), (2, "preflight there")]
    assert "Connection refused" in rows[0].detail and "passwordless ssh" in rows[0].fix
    assert "exit 1" in rows[1].detail and "GPUs FAIL 2 GPUs, the plan needs 8" in rows[1].detail
    assert fanout.ssh_rows(remotes, joined={1, 2}, launcher="pdsh") == []       # they met the main node: its rows
    for r in remotes:
        r.log.close()


def test_rank_0_is_the_hostfiles_first_host_and_main_process_ip_names_it():
    """DeepSpeed's runner makes the first host rank 0, listening at main_process_ip: a launch from another machine
    (a login node), or a main_process_ip elsewhere, leaves the others waiting for nobody. 192.0.2.1 is TEST-NET-1:
    never this machine."""
    assert fanout.rank0_row(["127.0.0.1", "b"], "127.0.0.1", "c.yaml") is None
    assert fanout.rank0_row(["localhost", "b"], None, "c.yaml") is None
    row = fanout.rank0_row(["192.0.2.1", "localhost"], "192.0.2.1", "c.yaml")
    assert row.status == "fail" and "this machine is not 192.0.2.1, the hostfile's first host" in row.detail
    row = fanout.rank0_row(["127.0.0.1", "b"], "192.0.2.1", "c.yaml")
    assert row.status == "fail" and "main_process_ip 192.0.2.1 is not 127.0.0.1" in row.detail and \
        "main_process_ip: 127.0.0.1's address in c.yaml" == row.fix
    assert fanout.rank0_row(["bad..name", "b"], None, "c.yaml") is None    # does not resolve (no DNS asked): not judged
