"""One node's preflight, start to end: read what the config expects, gather this node's facts (a child, killed
past its deadline), meet the other nodes at main_process_ip:main_process_port, run the collective child, and, on
the main node, turn every node's facts into the table (checks.py). No torch here: the children import it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from wizard.check.gpu_fit import uses_gpus as config_uses_gpus
from wizard.paths import plan_file_beside
from wizard.preflight import checks
from wizard.preflight.checks import FAIL, Expectation, Row
from wizard.preflight.secret import Secret

DEFAULT_JOIN_TIMEOUT_S = 60.0
DEFAULT_CHECK_TIMEOUT_S = 20.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0
CPU_ALLREDUCE_BYTES = 16 << 20          # gloo over TCP: enough to be bandwidth- rather than latency-bound
GPU_ALLREDUCE_BYTES = 256 << 20         # nccl-tests reach their plateau bus bandwidth from ~128-256 MiB


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
    collective: bool = True
    python: str = sys.executable
    # the ranks known to be gone before they joined (their ssh ended: fanout.py); the main node stops waiting
    lost: Callable[[], set[int]] | None = None
    # what the run's nodes prove to each other (secret.py); None: $WIZARD_PREFLIGHT_SECRET, else the key file
    secret: Secret | None = None


@dataclass
class Result:
    rank: int
    main: bool                                 # this node printed the table for every node
    rows: list[Row]
    exit_code: int
    verdict: str
    expectation: Expectation
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)
    across_gbps: float | None = None           # the measured bus bandwidth between the nodes
    backend: str = "gloo"
    reached_main: bool = False                 # a non-main node delivered its facts to the main node

    def to_json(self) -> dict[str, Any]:
        return {"machine_rank": self.rank, "main": self.main, "rows": [r.to_json() for r in self.rows],
                "verdict": self.verdict, "exit_code": self.exit_code, "backend": self.backend,
                "across_gbps": self.across_gbps, "expectation": self.expectation.to_json(),
                "versions": {str(n): (f.get("versions") or {}) for n, f in self.facts.items()}}


# ----------------------------------------------------------------------------- what the config expects


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def read_plan(config_file: str | None) -> dict[str, Any] | None:
    from wizard.fsutil import read_json_object
    if not config_file:
        return None
    try:
        return read_json_object(plan_file_beside(config_file))
    except Exception:            # a plan that cannot be read leaves the expectations to the config alone
        return None


def _ds_config(accel: dict[str, Any], config_file: str) -> dict[str, Any]:
    from wizard.fsutil import read_json_object
    ds = accel.get("deepspeed_config") or {}
    path = ds.get("deepspeed_config_file") if isinstance(ds, dict) else None
    if path:
        path = path if os.path.isabs(path) else os.path.join(os.path.dirname(config_file), path)
        try:
            return read_json_object(path) or {}
        except Exception:
            return {}
    if isinstance(ds, dict) and ds:        # the YAML's own DeepSpeed keys
        out: dict[str, Any] = {"zero_optimization": {"stage": ds.get("zero_stage")}}
        for which in ("optimizer", "param"):
            dev = ds.get(f"offload_{which}_device")
            if dev and dev != "none":
                out["zero_optimization"][f"offload_{which}"] = {"device": dev,
                                                                "nvme_path": ds.get(f"offload_{which}_nvme_path")}
        return out
    return {}


def _gpu_ids(value: Any) -> list[int] | None:
    text = str(value if value is not None else "all").strip().lower()
    if text in ("all", "", "none"):
        return None
    return [int(x) for x in re.findall(r"\d+", text)]


def _assumed_source(plan: dict[str, Any]) -> str:
    for note in (plan.get("plan") or {}).get("notes") or []:
        m = re.search(r"Machines are joined by .*? per machine \((.*?);", str(note))
        if m:
            return m.group(1)
    return "the plan's figure"


def expectation(config_file: str | None, main_ip: str | None = None, main_port: int | None = None) -> Expectation:
    """What every node must have, from the accelerate config, its DeepSpeed config and the plan the wizard saved
    beside it (wizard_plan.json; without it, the config's own figures only)."""
    from wizard.errors import InputError
    from wizard.fsutil import read_yaml_mapping
    if not config_file or not os.path.isfile(config_file):
        raise InputError("--config-file", f"{config_file or 'no config'} does not exist",
                         "an accelerate config YAML (the wizard writes default_config.yaml)")
    accel = read_yaml_mapping(config_file) or {}
    machines = _int(accel.get("num_machines")) or 1
    total = _int(accel.get("num_processes")) or 1
    per_node = max(1, total // machines)
    plan = read_plan(config_file)
    p = (plan or {}).get("plan") or {}
    uses_gpus = config_uses_gpus(accel, plan)
    choice = p.get("choice") or {}
    ds = _ds_config(accel, config_file)
    zero = ds.get("zero_optimization") or {}
    pinned, by_default = [], []
    nvme_path = None
    for which in ("optimizer", "param"):
        block = zero.get(f"offload_{which}") or {}
        device = str(block.get("device", "none")).lower()
        if device == "nvme":
            nvme_path = block.get("nvme_path") or nvme_path
        if device != "cpu":
            continue
        pin = block.get("pin_memory")
        if pin is True or str(pin).lower() == "true":
            pinned.append(which)
        elif pin is None or pin == "auto":
            by_default.append(which)
    method = ((p.get("method") or {}).get("name")) or "full"
    params = _int(((plan or {}).get("model") or {}).get("params")) if method == "full" else None
    rung = next((r for r in p.get("rungs") or [] if r.get("key") == choice.get("key")), {})
    nvme_bytes = _int(choice.get("nvme_bytes") or rung.get("nvme_bytes")) or None
    ckpt = (params * checks.CHECKPOINT_BYTES_PER_PARAM // machines) if params else None
    cpu_bytes = _int(choice.get("cpu_bytes"))
    if not uses_gpus and _int(choice.get("per_gpu_bytes")):
        cpu_bytes = (cpu_bytes or 0) + _int(choice.get("per_gpu_bytes")) * per_node   # a CPU "device" is host RAM
    ip = main_ip or accel.get("main_process_ip") or None
    port = main_port or _int(accel.get("main_process_port")) or None
    return Expectation(
        config_file=os.path.abspath(config_file), num_machines=machines, processes_per_node=per_node,
        uses_gpus=uses_gpus, main_ip=str(ip) if ip else None, main_port=port, gpu_ids=_gpu_ids(accel.get("gpu_ids")),
        per_gpu_bytes=_int(choice.get("per_gpu_bytes")) if uses_gpus else None,
        gpu_capacity_bytes=_int(p.get("gpu_capacity_bytes")) if uses_gpus else None,
        host_ram_bytes=cpu_bytes or None, pinned_blocks=pinned, pin_default_blocks=by_default, params=params,
        nvme_path=nvme_path, nvme_bytes=nvme_bytes, checkpoint_bytes=ckpt,
        assumed_gbps=float(p["inter_node_gbps"]) if p.get("inter_node_gbps") else None,
        assumed_source=_assumed_source(plan or {}) if p.get("inter_node_gbps") else "")


def class_default_gbps(exp: Expectation, facts: dict[str, Any]) -> tuple[float | None, str]:
    """Without a plan: the network the planner assumes for machines like this one (speed.inter_node_gbps)."""
    from wizard.planning.speed import inter_node_gbps
    from wizard.probe.hardware import GPU, Hardware
    gpus = (facts.get("gpus") or {}).get("gpus") or []
    hw = Hardware(gpus=[GPU(index=g["index"], name=g["name"], memory_total=g["memory_total"]) for g in gpus]
                  if exp.uses_gpus else [], source="probe")
    return inter_node_gbps(hw)


# ----------------------------------------------------------------------------- the children


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None,
               on_line: Callable[[dict[str, Any]], None] | None = None) -> tuple[list[dict[str, Any]], str, bool]:
    """Run a child in its own session; (its JSON lines, its stderr's tail, timed out). Past the deadline the whole
    session is killed: nothing it started outlives it."""
    import signal
    import tempfile
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                             env=env or _child_env(), start_new_session=True)
        lines: list[dict[str, Any]] = []
        import threading

        def pump() -> None:
            assert p.stdout is not None
            for raw in p.stdout:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    lines.append(msg)
                    if on_line:
                        on_line(msg)
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        timed_out = False
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)        # the child's own children (spawned ranks) too
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
        t.join(2)
        err.seek(0, 2)
        size = err.tell()
        err.seek(max(0, size - 200_000))
        tail = err.read().decode("utf-8", "replace")
    return lines, tail, timed_out


def node_facts(opts: Options, exp: Expectation) -> dict[str, Any]:
    argv = [opts.python, "-m", "wizard.preflight.node", "--timeout", f"{opts.check_timeout:g}"]
    if exp.main_ip:
        argv += ["--main-host", exp.main_ip]
    if exp.nvme_path:
        argv += ["--path", exp.nvme_path]
    lines, err, timed_out = _run_child(argv, opts.check_timeout + 15)
    if lines:
        return lines[-1]
    import socket
    what = {"timeout": opts.check_timeout + 15} if timed_out else {"error": err.strip().splitlines()[-1:] or "?"}
    return {"host": socket.gethostname(), "failed": what}


def run_collective(opts: Options, exp: Expectation, rank: int, addr: str, port: int, backend: str,
                   nbytes: int) -> dict[str, Any]:
    argv = [opts.python, "-m", "wizard.preflight.collective", "--addr", addr, "--port", str(port),
            "--nodes", str(exp.num_machines), "--node", str(rank), "--local", str(exp.processes_per_node),
            "--backend", backend, "--nbytes", str(nbytes), "--timeout", f"{opts.collective_timeout:g}"]
    if exp.gpu_ids is not None:
        argv += ["--gpu-ids", ",".join(map(str, exp.gpu_ids))]
    env = _child_env()
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    started: list[str] = []
    lines, err, timed_out = _run_child(argv, opts.collective_timeout + 30, env,
                                       on_line=lambda m: started.append(m["p2p_start"]) if "p2p_start" in m else None)
    result = next((m["result"] for m in reversed(lines) if "result" in m), None)
    if result is None:
        result = ({"timeout": opts.collective_timeout + 30} if timed_out else
                  {"error": (err.strip().splitlines() or ["it exited without a result"])[-1][:300]})
        if started and timed_out:
            result["p2p"] = {started[-1]: "hung"}
    if backend == "nccl":
        result["nccl_log"] = checks.parse_nccl_log(err)
    return result


# ----------------------------------------------------------------------------- rows


def local_rows(rank: int, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
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
    rows += checks.limit_rows(rank, host, exp, facts)
    rows += checks.nccl_env_rows(rank, host, exp, facts)
    return rows


def node_rows(rank: int, exp: Expectation, facts: dict[str, Any], collective: dict[str, Any] | None,
              backend: str) -> list[Row]:
    host = str(facts.get("host") or "?")
    rows = local_rows(rank, exp, facts)
    if backend == "nccl" and not facts.get("failed"):
        env = (facts.get("net") or {}).get("env") or {}
        row = checks.p2p_row(rank, host, facts, (collective or {}).get("p2p"), env)
        if row:
            rows.append(row)
    rows += checks.collective_rows(rank, host, exp, collective, backend)
    return rows


def _finish(rank: int, main: bool, rows: list[Row], exp: Expectation, facts: dict[int, dict[str, Any]],
            collectives: dict[int, dict[str, Any]], backend: str, reached: bool = False) -> Result:
    rows = sorted(rows, key=lambda r: r.node)           # stable: each node's rows in check order
    across = (collectives.get(0) or {}).get("scopes", {}).get("across", {}).get("busbw_gbps")
    return Result(rank, main, rows, checks.exit_code(rows), checks.verdict(rows, exp.num_machines), exp, facts,
                  across, backend, reached)


def preflight(opts: Options, progress: Callable[[str], None] = lambda s: None) -> Result:
    from wizard.errors import InputError
    exp = expectation(opts.config_file, opts.main_ip, opts.main_port)
    rank = opts.machine_rank or 0
    if rank >= exp.num_machines:
        raise InputError("--machine-rank", f"{rank}, but the config has num_machines {exp.num_machines}",
                         f"0-{exp.num_machines - 1}")
    if exp.num_machines > 1 and not exp.main_ip:
        raise InputError("--main-process-ip", "the config leaves the main node's address to the launch",
                         "--main-process-ip ADDRESS (under SLURM it is found from the allocation)")
    if exp.main_port is None:
        exp.main_port = 29500                          # accelerate's default when the config leaves it
    if exp.num_machines > 1 and opts.secret is None:
        from wizard.preflight.secret import resolve
        opts.secret = resolve()                        # before any work: a missing or unsafe one is exit 2
    progress(f"node {rank}: gathering this node's facts")
    facts = node_facts(opts, exp)
    backend = checks.backend_for(exp, {rank: facts})        # the main node decides for all, from every node's
    nbytes = opts.nbytes or (GPU_ALLREDUCE_BYTES if backend == "nccl" else CPU_ALLREDUCE_BYTES)
    if exp.assumed_gbps is None and exp.num_machines > 1:
        exp.assumed_gbps, exp.assumed_source = class_default_gbps(exp, facts)
    if exp.num_machines == 1:
        return _single(opts, exp, facts, backend, nbytes, progress)
    if rank == 0:
        return _main_node(opts, exp, facts, backend, nbytes, progress)
    return _other_node(opts, exp, rank, facts, backend, nbytes, progress)


def _single(opts, exp, facts, backend, nbytes, progress) -> Result:
    collective = None
    if opts.collective and exp.processes_per_node > 1 and not facts.get("failed"):
        from wizard.probe.ports import free_port
        progress("node 0: timed all-reduce within the node")
        collective = run_collective(opts, exp, 0, "127.0.0.1", free_port(), backend, nbytes)
    rows = node_rows(0, exp, facts, collective, backend)
    return _finish(0, True, rows, exp, {0: facts}, {0: collective or {}}, backend)


def _main_node(opts, exp, facts, backend, nbytes, progress) -> Result:
    from wizard.preflight import messages, rendezvous
    host = str(facts.get("host") or "?")
    port = int(exp.main_port)
    rows: list[Row] = []
    try:
        server = rendezvous.Server(port, opts.secret, exp.num_machines)
    except OSError as exc:
        holder = rendezvous.port_holder(port) or (exc.strerror or str(exc))
        rows = local_rows(0, exp, facts) + [checks.port_free_row(0, host, port, holder)]
        return _finish(0, True, rows, exp, {0: facts}, {}, backend)
    try:
        rows.append(checks.port_free_row(0, host, port, None))
        # the main node reaches itself at main_process_ip: the address is this machine's and accepts connections
        sock, _, outcome = rendezvous.probe_connect(exp.main_ip, port, time.monotonic() + 10, server.token)
        if sock:
            sock.close()
        rows.append(checks.reach_row(0, host, exp.main_ip, port, outcome))
        progress(f"node 0: waiting up to {opts.join_timeout:g} s for {exp.num_machines - 1} other node(s) at "
                 f"{exp.main_ip}:{port}")
        server.wait_for(set(range(1, exp.num_machines)), time.monotonic() + opts.join_timeout, opts.lost)
        joined = server.joined()
        hosts = {0: host, **{r: str((h.get("facts") or {}).get("host") or "?") for r, h in joined.items()}}
        per_node = {0: facts, **{r: h.get("facts") or {} for r, h in joined.items()}}
        rows += checks.joined_rows(exp.num_machines, hosts, sorted(set(server.duplicates)), opts.join_timeout, host)
        refused, how_many = server.refusals()
        if how_many:
            rows.append(checks.refused_row(host, [(r.address, r.why) for r in refused], how_many,
                                           everyone=len(joined) == exp.num_machines - 1, source=opts.secret.source))
        for r, h in sorted(joined.items()):
            rows.append(checks.reach_row(r, hosts[r], exp.main_ip, port, h.get("reach") or {"kind": "ok"}))
        everyone = len(joined) == exp.num_machines - 1 and not server.duplicates
        backend = checks.backend_for(exp, per_node)
        nbytes = opts.nbytes or (GPU_ALLREDUCE_BYTES if backend == "nccl" else CPU_ALLREDUCE_BYTES)
        collectives: dict[int, dict[str, Any]] = {}
        healthy = everyone and not any(f.get("failed") for f in per_node.values())
        if healthy and opts.collective:
            from wizard.probe.ports import free_port
            cport = free_port()
            server.broadcast({"go": {"port": cport, "backend": backend, "nbytes": nbytes}})
            progress(f"node 0: timed {backend} all-reduce across {exp.num_machines} nodes")
            collectives[0] = run_collective(opts, exp, 0, exp.main_ip, cport, backend, nbytes)
            got = server.collect("collective", time.monotonic() + opts.collective_timeout + 45, messages.Collective)
            for r in joined:
                collectives[r] = got.get(r) or {"error": "node sent no result"}
        else:
            server.broadcast({"skip": "not every node joined" if not everyone else "a node's probe failed"})
        for r in sorted(per_node):
            rows += node_rows(r, exp, per_node[r], collectives.get(r), backend)
        rows += checks.version_rows(per_node, hosts)
        rows += checks.gpus_agree_rows(per_node, hosts, exp)
        result = _finish(0, True, rows, exp, per_node, collectives, backend)
        server.finish({"verdict": result.verdict, "exit_code": result.exit_code}, time.monotonic() + 10)
        return result
    finally:
        server.close()


def _other_node(opts, exp, rank, facts, backend, nbytes, progress) -> Result:
    from wizard.preflight import rendezvous
    host = str(facts.get("host") or "?")
    port = int(exp.main_port)
    progress(f"node {rank}: connecting to the main node at {exp.main_ip}:{port} (up to {opts.join_timeout:g} s)")
    sock, reader, outcome = rendezvous.probe_connect(exp.main_ip, port, time.monotonic() + opts.join_timeout)
    own = local_rows(rank, exp, facts)
    if sock is None or reader is None:
        rows = own + [checks.reach_row(rank, host, exp.main_ip, port, outcome)]
        return _finish(rank, False, rows, exp, {rank: facts}, {}, backend)
    try:
        token = outcome.pop("token")            # the main node's nonce: no part of what this node reports
        ok, why = rendezvous.join(sock, reader, token, rank, opts.secret, time.monotonic() + rendezvous.AUTH_TIMEOUT_S)
        if not ok:
            rows = own + [checks.reach_row(rank, host, exp.main_ip, port, outcome),
                          checks.secret_row(rank, host, why, opts.secret.source)]
            return _finish(rank, False, rows, exp, {rank: facts}, {}, backend)
        rendezvous.send(sock, {"facts": facts, "reach": outcome})
        msg, bad = _from_main(reader, time.monotonic() + opts.join_timeout + 30)
        collective = None
        if msg and msg.go:
            go = msg.go
            backend = go.backend
            progress(f"node {rank}: timed {go.backend} all-reduce across {exp.num_machines} nodes")
            collective = run_collective(opts, exp, rank, exp.main_ip, go.port, go.backend, go.nbytes)
            rendezvous.send(sock, {"collective": collective})
            msg, bad = _from_main(reader, time.monotonic() + 30)
        elif msg and msg.skip is not None:       # no collective (a node missing or failing): the verdict comes next
            msg, bad = _from_main(reader, time.monotonic() + 30)
        rows = node_rows(rank, exp, facts, collective, backend)
        if msg and msg.abort:
            rows.append(Row(rank, host, "joined", FAIL, msg.abort, "give each node its own --machine-rank"))
        if bad:
            rows.append(Row(rank, host, "main node", FAIL, bad, "the same wizard version on every node"))
        result = _finish(rank, False, rows, exp, {rank: facts}, {rank: collective or {}}, backend, reached=True)
        if msg and msg.exit_code is not None:    # the main node's verdict over every node decides
            result.exit_code = max(result.exit_code, msg.exit_code)
            result.verdict = msg.verdict or result.verdict
        elif not msg and not bad:
            result.rows.append(Row(rank, host, "verdict", FAIL, "the main node sent no verdict",
                                   "look at the main node's output"))
            result.exit_code = 1
        return result
    finally:
        sock.close()


def _from_main(reader, deadline: float):
    """The main node's next message, checked (messages.FromMain): (it, None), (None, None) on EOF or timeout, or
    (None, what is wrong with it)."""
    from wizard.preflight import messages
    try:
        raw = reader.read(deadline)
    except ValueError as exc:
        return None, f"the main node sent a message that is not valid ({exc})"
    if raw is None:
        return None, None
    msg, problem = messages.check(messages.FromMain, raw)
    return msg, (f"the main node sent a message that is not valid ({problem})" if problem else None)


# ----------------------------------------------------------------------------- SLURM


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
