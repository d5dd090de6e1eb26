"""A node's pieces of the preflight (meet.preflight runs them from start to end): its options and result, this
node's facts (a child, killed past its deadline), the collectives (a child), and, on the main node, every node's
facts turned into rows (checks, limits, health, figures) ordered by cause (report.py). No torch here: the children
import it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from wizard.preflight import checks, children, figures, health, limits, measure, report
from wizard.preflight.checks import FAIL, Expectation, Row
from wizard.preflight.secret import Secret

DEFAULT_JOIN_TIMEOUT_S = 60.0
DEFAULT_CHECK_TIMEOUT_S = 20.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
# After a finding that stops the run, the main node waits this long more for nodes still to join, so that they hear
# the cause from it (srun starts them within a second or two) rather than a refused port; not the join timeout.
FATAL_GRACE_S = 5.0

FactsSource = Callable[["Options", Expectation], dict]
CollectiveRunner = Callable[..., dict]


@dataclass
class Options:
    config_file: str | None
    machine_rank: int | None = None
    main_ip: str | None = None
    main_port: int | None = None
    join_timeout: float = DEFAULT_JOIN_TIMEOUT_S
    check_timeout: float = DEFAULT_CHECK_TIMEOUT_S
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    nbytes: int | None = None
    samples: int | None = None                 # timed samples per size (None: measure's default for the backend)
    collective: bool = True
    python: str = sys.executable
    # the ranks known to be gone before they joined (their ssh ended: fanout.py); the main node stops waiting
    lost: Callable[[], set[int]] | None = None
    # what the run's nodes prove to each other (secret.py); None: $WIZARD_PREFLIGHT_SECRET, else the key file
    secret: Secret | None = None
    # where the training saves its checkpoints (its output_dir), and how that was found; None: the working directory
    checkpoint_dir: str | None = None
    checkpoint_dir_from: str | None = None
    fatal_grace: float = FATAL_GRACE_S
    # the local address this node connects from (None: the kernel's choice); the N-agent test gives each its own
    source_address: str | None = None
    # stand-ins for the two children, for the N-agent test harness only (tests/preflight_agents.py)
    facts_source: FactsSource | None = None
    collective_runner: CollectiveRunner | None = None


@dataclass
class Result:
    rank: int
    main: bool                                 # this node printed the table for every node
    rows: list[Row]
    exit_code: int
    verdict: str
    expectation: Expectation
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)
    collectives: dict[int, dict[str, Any]] = field(default_factory=dict)
    across: dict[str, Any] | None = None       # the all-reduce between the nodes at its largest size (median, spread)
    backend: str = "gloo"
    reached_main: bool = False                 # a non-main node delivered its facts to the main node
    hosts: dict[int, str] = field(default_factory=dict)

    @property
    def across_gbps(self) -> float | None:
        return self.across["busbw_gbps"] if self.across else None

    def cause(self) -> Row | None:
        return report.cause(self.rows)

    def to_json(self) -> dict[str, Any]:
        first = self.cause()
        return {"machine_rank": self.rank, "main": self.main, "rows": [r.to_json() for r in self.rows],
                "verdict": self.verdict, "exit_code": self.exit_code, "backend": self.backend,
                "cause": first.to_json() if first else None, "across_gbps": self.across_gbps, "across": self.across,
                "exclude": report.to_exclude(self.rows, list(self.hosts.values())) if self.main else [],
                "expectation": self.expectation.to_json(),
                "versions": {str(n): (f.get("versions") or {}) for n, f in self.facts.items()},
                "collectives": {str(n): c for n, c in self.collectives.items()}}


# ----------------------------------------------------------------------------- the children


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def node_facts(opts: Options, exp: Expectation) -> dict[str, Any]:
    if opts.facts_source is not None:
        return opts.facts_source(opts, exp)
    argv = [opts.python, "-m", "wizard.preflight.node", "--timeout", f"{opts.check_timeout:g}"]
    if exp.main_ip:
        argv += ["--main-host", exp.main_ip]
    if exp.nvme_path:
        argv += ["--path", exp.nvme_path]
    if exp.checkpoint_dir:
        argv += ["--checkpoint-dir", exp.checkpoint_dir]
    lines, err, why = children.run(argv, opts.check_timeout + 15, child_env())
    if lines:
        return lines[-1]
    import socket
    what = {"timeout": opts.check_timeout + 15} if why == "timeout" else {"error": err.strip().splitlines()[-1:] or "?"}
    return {"host": socket.gethostname(), "failed": what}


def run_collective(opts: Options, exp: Expectation, rank: int, addr: str, port: int, backend: str, nbytes: int,
                   cancel: threading.Event | None = None) -> dict[str, Any]:
    """This node's collectives (collective.py as a child; the harness's runner in its place), killed past the
    deadline or when `cancel` is set (the main node stopped them: another node failed)."""
    if opts.collective_runner is not None:
        return opts.collective_runner(opts, exp, rank, addr, port, backend, nbytes, cancel)
    argv = [opts.python, "-m", "wizard.preflight.collective", "--addr", addr, "--port", str(port),
            "--nodes", str(exp.num_machines), "--node", str(rank), "--local", str(exp.processes_per_node),
            "--backend", backend, "--nbytes", str(nbytes), "--timeout", f"{opts.collective_timeout:g}"]
    if opts.samples:
        argv += ["--samples", str(opts.samples)]
    if exp.gpu_ids is not None:
        argv += ["--gpu-ids", ",".join(map(str, exp.gpu_ids))]
    env = child_env()
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    started: list[str] = []
    lines, err, why = children.run(argv, opts.collective_timeout + 30, env, cancel=cancel,
                                   on_line=lambda m: started.append(m["p2p_start"]) if "p2p_start" in m else None)
    result = next((m["result"] for m in reversed(lines) if "result" in m), None)
    if why == "cancelled":
        return {"cancelled": "stopped by the main node"}
    if result is None:
        result = ({"timeout": opts.collective_timeout + 30} if why == "timeout" else
                  {"error": (err.strip().splitlines() or ["it exited without a result"])[-1][:300]})
        if started and why == "timeout":
            result["p2p"] = {started[-1]: "hung"}
    if backend == "nccl":
        result["nccl_log"] = checks.parse_nccl_log(err)
    return result


def default_nbytes(opts: Options, backend: str) -> int:
    return opts.nbytes or (measure.GPU_BYTES if backend == "nccl" else measure.CPU_BYTES)


# ----------------------------------------------------------------------------- rows


def resolves(facts: dict[str, Any]) -> bool:
    """The node's facts say the main host resolves (or were not asked)."""
    r = facts.get("resolve") or {}
    return not (r.get("error") or r.get("timeout"))


def local_rows(rank: int, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
    """What this node's own facts say, before meeting anyone."""
    host = str(facts.get("host") or "?")
    if facts.get("failed"):
        f = facts["failed"]
        if "invalid" in f:          # set by the main node (rendezvous.Server) for a node's message it cannot use
            return [Row(rank, host, "node facts", FAIL, f"node {rank} sent facts the main node cannot use: "
                        f"{f['invalid']}", "run the same wizard version on every node (one environment)")]
        return [Row(rank, host, "node probe", FAIL, f"the node's probe {'hung' if 'timeout' in f else 'failed'}: "
                    f"{f.get('timeout') or f.get('error')}", "run `python -m wizard.preflight.node` on the node")]
    rows = []
    if exp.main_ip:
        rows.append(checks.resolution_row(rank, host, exp.main_ip, facts))
    rows += checks.gpu_rows(rank, host, exp, facts)
    if exp.uses_gpus:
        row = health.health_row(rank, host, facts)
        if row:
            rows.append(row)
    rows += limits.limit_rows(rank, host, exp, facts)
    rows += checks.nccl_env_rows(rank, host, exp, facts)
    return rows


def collective_node_rows(rank: int, exp: Expectation, facts: dict[str, Any], collective: dict[str, Any] | None,
                         backend: str) -> list[Row]:
    """The rows of what this node's collectives did (P2P, XIDs during them, their figures)."""
    host = str(facts.get("host") or "?")
    rows = []
    if backend == "nccl" and not facts.get("failed"):
        env = (facts.get("net") or {}).get("env") or {}
        row = checks.p2p_row(rank, host, facts, (collective or {}).get("p2p"), env)
        if row:
            rows.append(row)
    row = health.xid_row(rank, host, (collective or {}).get("xids"))
    if row:
        rows.append(row)
    return rows + figures.collective_rows(rank, host, exp, collective, backend)


def agreement_rows(exp: Expectation, per_node: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[Row]:
    """What the nodes' facts say side by side: versions, GPU models, drivers."""
    return (checks.version_rows(per_node, hosts, exp.num_machines) + checks.gpus_agree_rows(per_node, hosts, exp)
            + (health.driver_rows(per_node, hosts) if exp.uses_gpus else []))


def finish(rank: int, main: bool, rows: list[Row], exp: Expectation, facts: dict[int, dict[str, Any]],
           collectives: dict[int, dict[str, Any]], backend: str, reached: bool = False) -> Result:
    rows = report.ordered(rows)
    across = measure.headline(collectives.get(0) or {}, "across")
    hosts = {n: str(f.get("host") or "?") for n, f in facts.items()}
    return Result(rank, main, rows, report.exit_code(rows), report.verdict(rows, exp.num_machines), exp, facts,
                  collectives, across, backend, reached, hosts)


# ----------------------------------------------------------------------------- SLURM


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def slurm_defaults(environ: dict[str, str] | None = None) -> tuple[int | None, str | None]:
    """(machine rank, the main node's address) inside a SLURM step of several nodes (srun): $SLURM_NODEID, and the
    NodeAddr of the allocation's first host, as the emitted sbatch script finds it (launch/slurm.py)."""
    env = os.environ if environ is None else environ
    nodes = _int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES"))
    if not nodes or nodes < 2 or env.get("SLURM_NODEID") is None:
        return None, None
    rank = _int(env.get("SLURM_NODEID"))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    addr = None
    if nodelist:
        try:
            first = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                   timeout=10).stdout.split()[:1]
            if first:
                out = subprocess.run(["scontrol", "show", "node", first[0]], capture_output=True, text=True,
                                     timeout=10).stdout
                m = re.search(r"NodeAddr=(\S+)", out)
                addr = m.group(1) if m else first[0]
        except (OSError, subprocess.SubprocessError):
            addr = None
    return rank, addr
