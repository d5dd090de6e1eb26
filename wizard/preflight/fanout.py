"""The preflight of a config whose DeepSpeed launcher starts every node from the main one.

With `deepspeed_multinode_launcher` pdsh (accelerate's default), openmpi, mvapich or mpich, only the main node runs
`accelerate launch`: DeepSpeed's runner reaches the other hosts of the hostfile over ssh, in the hostfile's order
(its include/exclude filters applied), with the same Python and working directory. Nobody runs `wizard launch` or
`wizard preflight` on those hosts, so the main node starts `wizard preflight --machine-rank N` on each of them the
same way, over ssh, and they meet it at the main port as ever. A host that ssh cannot reach is a finding of its own,
named with ssh's words, and the main node stops waiting for it.

`standard` (torchrun on every node) and `nossh` (DeepSpeed's runner on every node, each with its machine_rank) are
started on each machine by hand: their preflight is the ordinary one. DeepSpeed's `slurm` launcher starts the nodes
with srun inside the allocation: `srun --ntasks-per-node=1 wizard preflight` is that route (wizard/preflight/run.py).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from wizard.preflight.checks import FAIL, Row
from wizard.preflight.secret import Secret
from wizard.units import printable

SSH_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "mpich")     # DeepSpeed's runners that reach each host over ssh
SSH_ENV = "WIZARD_SSH"              # the ssh command, split like a shell would ("ssh -p 2222 -i ~/.ssh/k")
SSH_DEFAULT = "ssh -o BatchMode=yes -o ConnectTimeout=10"   # no password prompt: pdsh runs ssh the same way
DEFAULT_LAUNCHER = "pdsh"           # accelerate's when the config names none (prepare_deepspeed_cmd_env)
_HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")             # DeepSpeed's hostfile line: "worker-0 slots=8"
# a host name or address as ssh takes it: never one that starts with "-" (ssh would read an option: -oProxyCommand=)
_HOST_NAME = re.compile(r"^[A-Za-z0-9_\[][A-Za-z0-9_.:%\-\[\]]*$")


class HostfileError(ValueError):
    pass


def _ds_section(accel: dict[str, Any]) -> dict[str, Any]:
    ds = accel.get("deepspeed_config")
    return ds if isinstance(ds, dict) else {}


def multinode_launcher(accel: dict[str, Any]) -> str | None:
    """The DeepSpeed runner's launcher of a config of several machines (accelerate's default pdsh when unset), or
    None where accelerate starts every machine itself (one machine, not DeepSpeed, or `standard`)."""
    try:
        machines = int(accel.get("num_machines") or 1)
    except (TypeError, ValueError):
        return None
    if machines <= 1 or str(accel.get("distributed_type") or "").upper() != "DEEPSPEED":
        return None
    ds = _ds_section(accel)
    launcher = str(ds.get("deepspeed_multinode_launcher") or DEFAULT_LAUNCHER)
    return None if launcher == "standard" else launcher


def main_starts_every_node(accel: dict[str, Any]) -> str | None:
    """The launcher, where the main node alone runs the launch and it reaches the other hosts itself (over ssh,
    or srun for `slurm`); None where each machine runs its own launch (`standard`, `nossh`, not DeepSpeed)."""
    launcher = multinode_launcher(accel)
    return launcher if launcher in (*SSH_LAUNCHERS, "slurm") else None


def hostfile_path(accel: dict[str, Any]) -> str:
    ds = _ds_section(accel)
    return str(ds.get("deepspeed_hostfile") or "/job/hostfile")       # DeepSpeed's default


def parse_hostfile(text: str) -> dict[str, int]:
    """Host -> slots, in the file's order, as DeepSpeed's runner reads it: `#` comments and blank lines skipped,
    any other line `HOST slots=N`; a repeated host or another line is an error, as it is for DeepSpeed."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _HOST_LINE.match(line)
        if not m:
            raise HostfileError(f"line {number} is {printable(line, 80)!r}, not `HOST slots=N`")
        if not _HOST_NAME.match(m.group(1)):
            raise HostfileError(f"line {number} names {printable(m.group(1), 60)!r}, which is not a host name or "
                                "address (letters, digits, '.', '-', '_', ':'; not starting with '-')")
        if m.group(1) in hosts:
            raise HostfileError(f"line {number} names {m.group(1)} a second time")
        hosts[m.group(1)] = int(m.group(2))
    if not hosts:
        raise HostfileError("it lists no host")
    return hosts


def _node_specs(spec: str) -> dict[str, list[int]]:
    """DeepSpeed's filter syntax, NAME[:SLOT[,SLOT...]][@...]: host -> the slots named (none: the whole host)."""
    out: dict[str, list[int]] = {}
    for part in spec.split("@"):
        host, _, slots = part.partition(":")
        try:
            out.setdefault(host, []).extend(int(s) for s in slots.split(",") if s.strip())
        except ValueError:
            raise HostfileError(f"the filter {spec!r} names a slot that is not a number") from None
    return out


def active_hosts(hosts: dict[str, int], include: str | None = None, exclude: str | None = None) -> list[str]:
    """The hosts DeepSpeed's runner starts, in the hostfile's order: --include keeps the hosts it names, --exclude
    drops a host named whole or with every one of its slots (DeepSpeed's parse_inclusion_exclusion)."""
    if include and exclude:
        raise HostfileError("deepspeed_inclusion_filter and deepspeed_exclusion_filter cannot both be set")
    spec = _node_specs(include or exclude or "")
    for host, slots in spec.items():
        if host and host not in hosts:
            raise HostfileError(f"the {'inclusion' if include else 'exclusion'} filter names {host}, which the "
                                "hostfile does not list")
        bad = [s for s in slots if not 0 <= s < hosts.get(host, 0)]
        if bad:
            raise HostfileError(f"the filter names slot {bad[0]} of {host}, which has {hosts[host]} slots")
    if include:
        return [h for h in hosts if h in spec]
    if exclude:
        return [h for h in hosts if not (h in spec and (not spec[h] or set(range(hosts[h])) <= set(spec[h])))]
    return list(hosts)


def ssh_command(environ: dict[str, str] | None = None) -> list[str]:
    """$WIZARD_SSH, else ssh without a password prompt; with PDSH_SSH_ARGS_APPEND's options (a port, a key), as
    DeepSpeed's pdsh runner passes them."""
    env = os.environ if environ is None else environ
    cmd = shlex.split(env.get(SSH_ENV) or SSH_DEFAULT)
    return cmd + shlex.split(env.get("PDSH_SSH_ARGS_APPEND") or "")


def remote_preflight(host: str, rank: int, *, config_file: str, main_ip: str, main_port: int, join_timeout: float,
                     check_timeout: float, collective_timeout: float, nbytes: int | None, collective: bool,
                     python: str = sys.executable, cwd: str | None = None,
                     ssh: list[str] | None = None) -> list[str]:
    """The argv that runs `wizard preflight --machine-rank RANK` on `host`: over ssh, in this directory, with this
    Python (DeepSpeed's pdsh runner starts the training the same way: `cd CWD; PYTHON -u -m ...`)."""
    argv = [python, "-m", "wizard", "preflight", "--config-file", os.path.abspath(config_file),
            "--machine-rank", str(rank), "--main-process-ip", main_ip, "--main-process-port", str(main_port),
            "--join-timeout", f"{join_timeout:g}", "--check-timeout", f"{check_timeout:g}",
            "--collective-timeout", f"{collective_timeout:g}"]
    if nbytes:
        argv += ["--allreduce-mb", f"{nbytes / (1 << 20):g}"]
    if not collective:
        argv.append("--no-collective")
    argv.append("--secret-stdin")           # the run's secret comes over ssh's stdin (start_remotes), never argv
    remote = f"cd {shlex.quote(cwd or os.getcwd())} && exec {shlex.join(argv)}"
    # "--": whatever the hostfile says, the host is never read as one of ssh's options
    return [*(ssh if ssh is not None else ssh_command()), "--", host, remote]


@dataclass
class Remote:
    rank: int
    host: str
    proc: subprocess.Popen
    log: Any                          # the file its stdout and stderr go to

    def exited(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self) -> None:
        """SIGTERM first (ssh closes the remote session), then the session is killed and forgotten."""
        from wizard.preflight import children
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        children.end(self.proc)


def start_remotes(argvs: dict[int, tuple[str, list[str]]], secret: Secret) -> list[Remote]:
    """Start each host's preflight; the run's secret goes down ssh's stdin (one line, then EOF): ssh carries it
    encrypted, and no command line (which `ps` shows every user, here and there) ever holds it."""
    from wizard.preflight import children
    remotes = []
    for rank, (host, argv) in sorted(argvs.items()):
        log = tempfile.TemporaryFile()
        proc = children.spawn(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert proc.stdin is not None
            proc.stdin.write(secret.key + b"\n")
            proc.stdin.close()
        except OSError:                # ssh ended at once (a host it cannot reach): its row says why
            pass
        remotes.append(Remote(rank, host, proc, log))
    return remotes


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def failed_lines(text: str, most: int = 3) -> list[str]:
    """The FAIL rows of a preflight table (its first line of each), as a node printed it."""
    return [" ".join(line.split()) for line in text.splitlines() if re.search(r"\sFAIL\s", line)][:most]


def ssh_rows(remotes: list[Remote], joined: set[int], launcher: str) -> list[Row]:
    """A row for each host whose ssh ended before its node met the main node: what ssh said (its own failures exit
    255), or what the preflight it started found there."""
    rows = []
    for r in remotes:
        code = r.exited()
        if r.rank in joined or code is None or code == 0:
            continue
        said = r.output()
        if code == 255:
            rows.append(Row(r.rank, r.host, "ssh", FAIL, f"ssh could not start the preflight there: {last_line(said)}",
                            f"DeepSpeed's {launcher} launcher reaches this host the same way: passwordless ssh from "
                            f"the main node (`ssh {r.host} true` from here), and the same Python environment and "
                            "files at the same paths there"))
        else:
            found = failed_lines(said) or [last_line(said)]
            rows.append(Row(r.rank, r.host, "preflight there", FAIL,
                            f"started over ssh, it ended (exit {code}) without meeting the main node: "
                            + "; ".join(found),
                            "what it names, on that host (its whole output is above the table)"))
    return rows


def plan_hosts(accel: dict[str, Any], config_file: str) -> tuple[list[str] | None, Row | None]:
    """The hosts the launch starts, in rank order; or a row saying why they cannot be known (the hostfile is
    missing, malformed, or lists another number of hosts than num_machines)."""
    path = hostfile_path(accel)
    here = socket.gethostname()
    ds = _ds_section(accel)
    fix = (f"`deepspeed_hostfile` in {config_file}: a file of `HOST slots=N` lines, one per machine, the main "
           "machine first")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
        hosts = active_hosts(parse_hostfile(text), ds.get("deepspeed_inclusion_filter"),
                             ds.get("deepspeed_exclusion_filter"))
    except OSError as exc:
        return None, Row(0, here, "hostfile", FAIL, f"{path}: {exc.strerror or exc}", fix)
    except (HostfileError, ValueError) as exc:
        return None, Row(0, here, "hostfile", FAIL, f"{path}: {exc}", fix)
    try:
        machines = int(accel.get("num_machines") or 1)
    except (TypeError, ValueError):
        machines = 1
    if len(hosts) != machines:
        return None, Row(0, here, "hostfile", FAIL,
                         f"{path} gives DeepSpeed {len(hosts)} host{'s' if len(hosts) != 1 else ''} "
                         f"({', '.join(hosts)}) and it starts a node on each, but num_machines is {machines}",
                         f"one host per machine in {path} (or its filters), or num_machines: {len(hosts)}")
    return hosts, None


def is_this_machine(host: str) -> bool | None:
    """Whether `host` names this machine: one of its addresses can be bound here (None: it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def rank0_row(hosts: list[str], main_ip: str | None, config_file: str) -> Row | None:
    """DeepSpeed's runner makes the hostfile's first host rank 0, which listens at main_process_ip: this machine
    (where the launch runs its rank 0 preflight) must be that host, and main_process_ip must name it too, else the
    others wait at an address where nobody listens."""
    here = socket.gethostname()
    first = hosts[0]
    if is_this_machine(first) is False:
        return Row(0, here, "rank 0 host", FAIL,
                   f"this machine is not {first}, the hostfile's first host, which DeepSpeed's runner makes rank 0",
                   f"run the launch (and `wizard preflight`) on {first}, or put this machine first in the hostfile")
    if main_ip and is_this_machine(main_ip) is False:
        return Row(0, here, "rank 0 host", FAIL,
                   f"main_process_ip {main_ip} is not {first}, the hostfile's first host: DeepSpeed's runner makes "
                   f"{first} rank 0, which listens for the others at main_process_ip, so they would wait at "
                   f"{main_ip} for nobody", f"main_process_ip: {first}'s address in {config_file}")
    return None


def fan_out(opts, accel: dict[str, Any], launcher: str, run: Callable, progress: Callable[[str], None]):
    """The main node's preflight for a launcher that starts every node from here: each other host of the hostfile
    runs its own over ssh while this one runs `run(opts)` (wizard.preflight.meet.preflight) as rank 0."""
    from wizard.preflight import report
    from wizard.preflight.expect import expectation
    hosts, problem = plan_hosts(accel, opts.config_file)
    if problem is None:
        problem = rank0_row(hosts, opts.main_ip or str(accel.get("main_process_ip") or "") or None,
                            opts.config_file)
    if problem is not None:
        exp = expectation(opts.config_file, opts.main_ip, opts.main_port)
        from wizard.preflight.run import finish
        here = {"host": socket.gethostname()}
        return finish(0, True, [problem], exp, {0: here}, {}, "gloo")
    main_ip = opts.main_ip or str(accel.get("main_process_ip") or "") or hosts[0]
    try:
        port = opts.main_port or int(accel.get("main_process_port") or 29500)
    except (TypeError, ValueError):
        port = 29500                    # accelerate's default; the preflight's own port row judges the config
    from wizard.preflight.secret import resolve
    opts.secret = opts.secret or resolve()
    ssh = ssh_command()
    argvs = {rank: (host, remote_preflight(host, rank, config_file=opts.config_file, main_ip=main_ip, main_port=port,
                                           join_timeout=opts.join_timeout + 15, check_timeout=opts.check_timeout,
                                           collective_timeout=opts.collective_timeout, nbytes=opts.nbytes,
                                           collective=opts.collective, python=opts.python, ssh=ssh))
             for rank, host in enumerate(hosts) if rank > 0}
    progress(f"node 0: DeepSpeed's {launcher} launcher starts the other hosts from here; starting their preflight "
             f"over ssh ({', '.join(h for h, _ in argvs.values())})")
    remotes = start_remotes(argvs, opts.secret)
    opts.main_ip, opts.main_port = main_ip, port
    opts.lost = lambda: {r.rank for r in remotes if r.exited() not in (None, 0)}
    try:
        result = run(opts, progress)
        deadline = time.monotonic() + 20          # their verdict is sent; give ssh the moment to end
        while time.monotonic() < deadline and any(r.exited() is None for r in remotes):
            time.sleep(0.1)
    finally:
        for r in remotes:
            r.stop()
    joined = set(result.facts) - {0}
    for r in remotes:
        if r.rank not in joined:
            progress(f"node {r.rank} ({r.host}), started over ssh, said:")
            for line in r.output().splitlines()[-40:]:
                progress(f"  {printable(line, 400)}")
    extra = ssh_rows(remotes, joined, launcher)
    explained = {row.node for row in extra}
    hosts_of = {r.rank: r.host for r in remotes}
    kept = []
    for row in result.rows:             # nobody is to start these by hand: say where they were started
        if row.check == "joined" and row.status == FAIL and row.node in hosts_of and row.host == "?":
            if row.node in explained:
                continue                # its ssh row says why, in ssh's or its own words
            row.host = hosts_of[row.node]
            row.fix = (f"it was started over ssh from here and ran without reaching the main node at "
                       f"{main_ip}:{port}: what it said is above the table")
        kept.append(row)
    result.rows = report.ordered(kept + extra)
    result.exit_code = report.exit_code(result.rows)
    result.verdict = report.verdict(result.rows, result.expectation.num_machines)
    for r in remotes:
        r.log.close()
    return result
