"""Preflight's decisions: each node's facts (node.py) and the config's expectations in, rows out. Pure functions,
no I/O, so every decision (the NCCL and P2P ones included, which only a GPU machine can exercise for real) is
unit-tested on recorded facts.

A row is one check on one node: "ok", "info" (shown, not a finding: the driver, the measured bandwidth when
nothing was assumed), "warn" (the run starts but something is off: slower than planned, a limit that is tight)
or "fail" (the run will stop or hang: exit 1). Every row that is not ok names its fix.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from wizard.check.gpu_fit import gpu_fit
from wizard.units import fmt_bytes, printable

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

# The packages whose versions must agree across nodes (a rank built against another torch or NCCL fails at the
# first collective, or deadlocks in it); distribution name -> the module the training imports.
PACKAGES = {"torch": "torch", "accelerate": "accelerate", "deepspeed": "deepspeed", "transformers": "transformers",
            "peft": "peft"}
# /dev/shm: NCCL's intra-node transport and the DataLoader's workers map their buffers there; containers default
# to 64 MiB, where NCCL fails with "Error while creating shared memory segment" (NCCL troubleshooting docs,
# "Docker": "--shm-size=1g").
SHM_FAIL_BYTES = 256 << 20
SHM_WARN_BYTES = 1 << 30
# A measured bus bandwidth below this share of what the plan assumed is worth a warning: the plan's step times
# (and its choice between rungs that trade compute for communication) assume the faster network.
BANDWIDTH_WARN_SHARE = 0.5
# A full fine-tuning checkpoint: 16-bit weights + fp32 master, Adam's two moments (2 + 4 + 4 + 4 B per parameter),
# what a ZeRO checkpoint with optimizer states holds; each node is counted its share.
CHECKPOINT_BYTES_PER_PARAM = 14


@dataclass
class Row:
    node: int                    # machine rank
    host: str
    check: str
    status: str                  # ok | info | warn | fail
    detail: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Expectation:
    """What the config (and the plan the wizard saved beside it) expects of every node."""

    config_file: str | None
    num_machines: int
    processes_per_node: int
    uses_gpus: bool
    main_ip: str | None
    main_port: int | None
    gpu_ids: list[int] | None = None           # None: all
    per_gpu_bytes: int | None = None           # the plan's per-GPU estimate
    gpu_capacity_bytes: int | None = None      # the GPU memory the plan was made for
    host_ram_bytes: int | None = None          # the plan's host-RAM need on a node (cpu_bytes)
    pinned_blocks: list[str] = field(default_factory=list)   # "optimizer"/"param": CPU offload blocks that pin
    pin_default_blocks: list[str] = field(default_factory=list)  # of those, pinning by DeepSpeed's default
    params: int | None = None                  # the model's parameters (full fine-tuning), for pinned bytes
    nvme_path: str | None = None
    nvme_bytes: int | None = None              # the plan's NVMe need
    checkpoint_bytes: int | None = None        # per node
    assumed_gbps: float | None = None          # the network per machine the plan's speeds assume
    assumed_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- reachability


def resolution_row(node: int, host: str, main_ip: str, facts: dict[str, Any]) -> Row:
    """How this node resolves the main host: unresolvable, or IPv6 only (gloo, NCCL's bootstrap and torch's store
    then try an address family the other side may not listen on: a hang at init), is a finding."""
    r = facts.get("resolve") or {}
    if r.get("timeout"):
        return Row(node, host, "resolve main host", FAIL, f"resolving {main_ip} hung for {r['timeout']:g} s",
                   "fix this node's DNS (/etc/resolv.conf) or put the main node's IPv4 address in main_process_ip")
    if r.get("error"):
        return Row(node, host, "resolve main host", FAIL, f"{main_ip} does not resolve here: {r['error']}",
                   "use an address every node resolves (the main node's IPv4 address) as main_process_ip")
    addrs = r.get("addresses") or []
    v4 = [a for fam, a in addrs if fam == 4]
    v6 = [a for fam, a in addrs if fam == 6]
    if v6 and not v4:
        return Row(node, host, "resolve main host", FAIL,
                   f"{main_ip} resolves to IPv6 only ({', '.join(v6[:2])}): torch's store and NCCL's bootstrap "
                   "then depend on IPv6 working between every pair of nodes, and hang at init where it does not",
                   "give main_process_ip as the main node's IPv4 address (or an /etc/hosts entry with one)")
    shown = ", ".join((v4 + v6)[:3])
    return Row(node, host, "resolve main host", OK, f"{main_ip} -> {shown}" if shown != main_ip else main_ip)


def port_free_row(node: int, host: str, port: int, holder: str | None) -> Row:
    """The main node must be able to bind main_process_port (torch's TCPStore listens there)."""
    if holder is None:
        return Row(node, host, "main port free", OK, f"port {port} is free on the main node")
    return Row(node, host, "main port free", FAIL,
               f"port {port} is taken on the main node ({holder}): the rendezvous cannot listen there",
               f"stop what holds it, or pick another main_process_port (`wizard launch --main-process-port N`)")


def reach_row(node: int, host: str, ip: str, port: int, outcome: dict[str, Any]) -> Row:
    """From this node to main_process_ip:main_process_port. outcome["kind"]: "ok" (the main node's preflight
    answered), "refused" / "timeout" / "unreachable" (nothing reached within the deadline), "foreign" (something
    answers there that is not the main node's rendezvous: a rank would connect to it and hang)."""
    kind = outcome.get("kind")
    where = f"{ip}:{port}"
    seconds = outcome.get("seconds")
    waited = f" (tried for {seconds:.0f} s)" if isinstance(seconds, (int, float)) else ""
    if kind == "ok":
        return Row(node, host, "reach main port", OK, f"{where} answered as the main node's rendezvous")
    if kind == "foreign":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} is held by another program ({outcome.get('detail') or 'not the main node'}): this "
                   "node's ranks would connect to it instead of the main node's store and hang",
                   "stop the program listening on that port on the main node's address, or choose another "
                   "main_process_port for every node")
    if kind == "refused":
        return Row(node, host, "reach main port", FAIL, f"{where} refused the connection{waited}: the main node "
                   "is not listening there (not started, another address, or it could not bind the port)",
                   "start every node within the join timeout, and check main_process_ip is the main node's address")
    if kind == "version":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} answered with another wizard version's preflight ({outcome.get('detail')})",
                   "install the same wizard version on every node (one environment)")
    if kind == "self":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} is not this (main) node: its rendezvous answered with another node's token",
                   "main_process_ip must be an address of the machine with machine_rank 0")
    return Row(node, host, "reach main port", FAIL,
               f"{where} could not be reached{waited}: {outcome.get('detail') or 'no answer'} (a firewall, or an "
               "address this node has no route to)",
               f"open TCP port {port} (and the ephemeral ports the collectives use) between the nodes, or use an "
               "address of the main node this node can route to")


def joined_rows(expected: int, joined: dict[int, str], duplicates: list[int], waited: float,
                main_host: str) -> list[Row]:
    """On the main node: which machine ranks met it at the port (every one of 1..N-1 must)."""
    rows = []
    for rank in duplicates:
        rows.append(Row(rank, joined.get(rank, "?"), "joined", FAIL,
                        f"two nodes say they are machine_rank {rank}",
                        "give each node its own --machine-rank (under SLURM: $SLURM_NODEID)"))
    for rank in range(1, expected):
        if rank not in joined:
            rows.append(Row(rank, "?", "joined", FAIL,
                            f"node {rank} did not reach the main node ({main_host}) within {waited:g} s",
                            f"start `wizard preflight --machine-rank {rank}` on that node within --join-timeout, "
                            "and look at its own table: it names what it could not reach"))
    return rows


SECRET_FIX = ("give every node the same preflight secret: the same $WIZARD_PREFLIGHT_SECRET (of 16 or more "
              "characters) in each node's environment, or the same key file (~/.config/wizard/preflight.key: a "
              "shared home has one for all; else copy it to each node). The sbatch script of `wizard launch "
              "--emit-slurm` and the ssh fan-out hand one to every node themselves")


def secret_row(node: int, host: str, why: str, source: str) -> Row:
    """On a node: the handshake with the main node failed (either side could not prove the run's secret)."""
    return Row(node, host, "preflight secret", FAIL, f"{why} (this node's secret: {source})", SECRET_FIX)


def refused_row(main_host: str, refused: list[tuple[str, str]], count: int, everyone: bool, source: str) -> Row:
    """On the main node: the connections refused at the rendezvous (no proof of the run's secret, a message that is
    not the preflight's, too many at once). With every node joined it is a warning (someone else reached the port);
    with a node missing it is likely that node, with another secret."""
    shown = "; ".join(f"from {addr}: {why}" for addr, why in refused[:3])
    more = f" (+{count - 3} more)" if count > 3 else ""
    detail = (f"{count} connection{'s' if count != 1 else ''} refused, never taken for a node: {shown}{more}; the main "
              f"node's secret: {source}")
    if everyone:
        return Row(0, main_host, "refused", WARN, detail,
                   "every node joined: these came from elsewhere (anyone who reaches the port can connect; they were "
                   "refused). Keep main_process_port behind a firewall to the cluster's own network")
    return Row(0, main_host, "refused", FAIL, detail, "if one is a node of this run: " + SECRET_FIX)


# ----------------------------------------------------------------------------- versions


def version_table(per_node: dict[int, dict[str, Any]]) -> tuple[list[str], dict[int, dict[str, str]], set[str]]:
    """(the packages, node -> package -> version text, the packages whose versions differ between nodes)."""
    names = ["python", *PACKAGES, "torch CUDA", "NCCL"]
    table: dict[int, dict[str, str]] = {}
    for node, facts in per_node.items():
        v = facts.get("versions") or {}
        row = {"python": str(v.get("python") or "?")}
        for dist in PACKAGES:
            row[dist] = str((v.get(dist) or {}).get("version") or "not installed")
        row["torch CUDA"] = str(v.get("torch_cuda") or "none (CPU build)")
        row["NCCL"] = str(v.get("nccl") or "none")
        table[node] = row
    differ = {n for n in names if len({r[n] for r in table.values()}) > 1}
    return names, table, differ


def version_rows(per_node: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[Row]:
    """One row per node: the same versions as the main node, or which packages differ from it and where the
    node's own interpreter imports them from."""
    names, table, differ = version_table(per_node)
    base = min(table) if table else 0
    rows = []
    for node in sorted(table):
        mine = table[node]
        if not differ:
            rows.append(Row(node, hosts.get(node, "?"), "versions", OK,
                            f"python {mine['python']}, torch {mine['torch']}, deepspeed {mine['deepspeed']}, "
                            f"accelerate {mine['accelerate']}, transformers {mine['transformers']}, peft {mine['peft']}"
                            " (same on every node)"))
            continue
        diff = [n for n in names if n in differ and mine[n] != table[base][n]]
        where = ((per_node[node].get("versions") or {}).get(diff[0]) or {}).get("path") if diff else None
        if not diff:
            others = [n for n in sorted(table) if n != base and any(table[n][p] != mine[p] for p in differ)]
            reference = (f"the reference: node{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
                         f"differ{'s' if len(others) == 1 else ''} (versions table below)")
            rows.append(Row(node, hosts.get(node, "?"), "versions", INFO if node == base else OK,
                            reference if node == base else "same as node 0"))
            continue
        rows.append(Row(node, hosts.get(node, "?"), "versions", FAIL,
                        "differs from node 0: " + ", ".join(f"{n} {mine[n]} (node 0: {table[base][n]})" for n in diff)
                        + (f"; imported from {where}" if where else ""),
                        "install the same versions on every node (one image or one environment): " +
                        " ".join(f"{n}=={table[base][n]}" for n in diff if n in PACKAGES
                                 and table[base][n] != "not installed")))
    return rows


# ----------------------------------------------------------------------------- GPUs


def gpu_rows(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
    g = facts.get("gpus") or {}
    if g.get("timeout"):
        return [Row(node, host, "GPUs", FAIL, f"NVML did not answer within {g['timeout']:g} s (a hung driver)",
                    "check the GPUs with nvidia-smi; a driver that hangs NVML hangs training too")]
    gpus = g.get("gpus") or []
    # the one decision of `wizard check` and `wizard launch` too (check/gpu_fit.py)
    ids = [str(i) for i in exp.gpu_ids] if exp.gpu_ids is not None else None
    fit = gpu_fit(exp.processes_per_node, exp.num_machines, exp.uses_gpus, len(gpus), ids, place="node")
    if fit.verdict == "cpu":
        return [Row(node, host, "GPUs", INFO, f"CPU processes: none needed ({len(gpus)} present)")]
    driver = f"driver {g.get('driver') or '?'}, CUDA {g.get('cuda') or '?'} (driver's)"
    if fit.verdict == "no-gpu":
        # the run starts, far slower than planned: a warning. Nodes that differ (some with GPUs) fail in
        # gpus_agree_rows.
        return [Row(node, host, "GPUs", WARN, f"no GPU: {g.get('reason') or 'NVML found none'}; {fit.problem}",
                    fit.fix)]
    if fit.verdict == "bad-ids":
        return [Row(node, host, "GPUs", FAIL, f"{fit.problem}; {driver}", fit.fix)]
    used = [gpus[int(i)] for i in ids] if ids is not None else gpus
    names = sorted({u["name"] for u in used})
    smallest = min(u["memory_total"] for u in used)
    text = f"{len(used)} x {' + '.join(names)} ({fmt_bytes(smallest)}); {driver}"
    if fit.verdict == "too-few":
        return [Row(node, host, "GPUs", FAIL, f"{text}: {fit.problem}", fit.fix)]
    if exp.per_gpu_bytes and smallest < exp.per_gpu_bytes:
        return [Row(node, host, "GPUs", FAIL, f"{text}: the plan needs {fmt_bytes(exp.per_gpu_bytes)} per GPU",
                    "plan for these GPUs (`wizard` on this node) or run on the GPUs the plan was made for")]
    if exp.gpu_capacity_bytes and smallest < exp.gpu_capacity_bytes * 0.98:
        return [Row(node, host, "GPUs", WARN, f"{text}: smaller than the {fmt_bytes(exp.gpu_capacity_bytes)} the "
                    "plan was made for", "plan again on this node's hardware")]
    busy = [u for u in used if u.get("memory_free") is not None and u["memory_free"] < 0.9 * u["memory_total"]]
    if busy:
        return [Row(node, host, "GPUs", WARN, f"{text}; GPU {busy[0]['index']} has only "
                    f"{fmt_bytes(busy[0]['memory_free'])} free: another process holds memory",
                    "end the other processes on these GPUs (nvidia-smi shows them)")]
    return [Row(node, host, "GPUs", OK, text)]


def _gpu_count(facts: dict[str, Any]) -> int:
    return len((facts.get("gpus") or {}).get("gpus") or [])


def backend_for(exp: Expectation, per_node: dict[int, dict[str, Any]]) -> str:
    """The collective's backend, as the training's would be: NCCL where the config runs GPU processes and every node
    has a GPU, else gloo (accelerate's processes fall back to the CPU where torch finds no CUDA device)."""
    return "nccl" if exp.uses_gpus and per_node and all(_gpu_count(f) for f in per_node.values()) else "gloo"


def gpus_agree_rows(per_node: dict[int, dict[str, Any]], hosts: dict[int, str], exp: Expectation) -> list[Row]:
    """Every node the same GPU model: ranks on a slower model set every step's pace; a node without GPUs beside
    nodes with them cannot join their NCCL group at all."""
    if not exp.uses_gpus:
        return []
    models = {}
    for node, facts in per_node.items():
        gpus = (facts.get("gpus") or {}).get("gpus") or []
        models[node] = " + ".join(sorted({g["name"] for g in gpus})) or "none"
    if len(set(models.values())) <= 1:
        return []
    if "none" in models.values():
        return [Row(node, hosts.get(node, "?"), "same GPUs", FAIL, f"no GPU here, while node "
                    f"{next(n for n, m in sorted(models.items()) if m != 'none')} has "
                    f"{next(m for m in models.values() if m != 'none')}: its ranks cannot join the others' NCCL group",
                    "run every node on GPU nodes (SLURM: --gpus-per-node on the job)")
                for node in sorted(models) if models[node] == "none"]
    return [Row(node, hosts.get(node, "?"), "same GPUs", WARN, f"{models[node]} (node 0: {models[min(models)]})",
                "every rank runs at the pace of the slowest GPU: plan for the smallest, or use matching nodes")
            for node in sorted(models) if models[node] != models[min(models)]]


def p2p_row(node: int, host: str, facts: dict[str, Any], copies: dict[str, str] | None,
            env: dict[str, str]) -> Row | None:
    """Peer-to-peer between this node's GPUs. NVML's P2P matrix says what the driver allows; `copies` is what a real
    copy between each pair did in the collective child ("ok", "mismatch" (the data arrived wrong), "hung", an
    error). P2P over PCIe on consumer GPUs without NVLink is where NCCL hangs or corrupts; NCCL_P2P_DISABLE=1 is
    suggested only where a copy failed, since it costs every other machine its fastest path."""
    g = facts.get("gpus") or {}
    gpus = g.get("gpus") or []
    if len(gpus) < 2:
        return None
    disabled = str(env.get("NCCL_P2P_DISABLE", "")).strip() in ("1", "true", "yes")
    bad = {pair: what for pair, what in (copies or {}).items() if what != "ok"}
    if bad:
        pair, what = sorted(bad.items())[0]
        if disabled:
            return Row(node, host, "GPU P2P", WARN, f"a P2P copy {pair} failed ({what}); NCCL_P2P_DISABLE=1 is set, "
                       "so NCCL will not use it", None)
        return Row(node, host, "GPU P2P", FAIL,
                   f"a direct copy between GPUs {pair} {'hung' if what == 'hung' else 'failed: ' + what}"
                   + (f" (+{len(bad) - 1} more pairs)" if len(bad) > 1 else "")
                   + ": NCCL's P2P transport would hang or corrupt the collectives",
                   "export NCCL_P2P_DISABLE=1 on this node (NCCL then goes through host memory), or fix the "
                   "platform (IOMMU/ACS off for P2P, a driver that supports P2P on these GPUs)")
    matrix = g.get("p2p")
    nvlink = g.get("nvlink")
    if copies is None:
        consumer = bool(g.get("consumer"))
        if consumer and not nvlink and matrix and any(c == "OK" for i, r in enumerate(matrix)
                                                      for j, c in enumerate(r) if i != j):
            return Row(node, host, "GPU P2P", WARN, "consumer GPUs without NVLink report P2P as supported, and the "
                       "copy test did not run here", "run the preflight with the GPUs free; if training hangs at "
                       "the first collective, export NCCL_P2P_DISABLE=1")
        return Row(node, host, "GPU P2P", INFO, "not tested (no copy test ran)")
    link = "NVLink" if nvlink else "PCIe"
    if disabled and nvlink:
        return Row(node, host, "GPU P2P", WARN, f"every copy worked over {link}, but NCCL_P2P_DISABLE=1 is set: NCCL "
                   "goes through host memory, far slower than NVLink", "unset NCCL_P2P_DISABLE on this node")
    return Row(node, host, "GPU P2P", OK, f"{len(copies)} pair{'s' if len(copies) != 1 else ''} copied over {link}")


# ----------------------------------------------------------------------------- limits


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def pins_by_default(deepspeed_version: str | None) -> bool:
    """The node's DeepSpeed defaults pin_memory to true (DeepSpeed 0.19.5 on, as check rule DS-PIN-MEMORY-MEMLOCK
    says): read from the node's version, as the node's DeepSpeed is not imported."""
    from wizard.check.rules.deepspeed_json import PIN_MEMORY_DEFAULT_TRUE_SINCE
    since = _version_tuple(PIN_MEMORY_DEFAULT_TRUE_SINCE)
    return bool(deepspeed_version) and _version_tuple(deepspeed_version) >= since


def pinned_bytes_per_process(params: int | None, processes: int, blocks: list[str]) -> int | None:
    """At least the host memory each process page-locks for these offload blocks: check rule DS-PIN-MEMORY-MEMLOCK's
    lower bound (4 B per parameter of fp32 gradient partition with optimizer offload, 2 B of 16-bit parameter
    partition with ZeRO-3 parameter offload, over the processes). None: the model is not known."""
    from wizard.check.rules.deepspeed_json import pinned_bytes_per_process as check_bound
    return check_bound(params, processes, blocks) if params and blocks else None


def limit_rows(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
    lim = facts.get("limits") or {}
    rows: list[Row] = []
    if lim.get("timeout"):
        return [Row(node, host, "limits", FAIL, f"reading the limits hung for {lim['timeout']:g} s (a stuck mount?)",
                    "check the disks (df) on this node")]
    ram_total, ram_avail = lim.get("ram_total"), lim.get("ram_available")
    if exp.host_ram_bytes and ram_avail is not None:
        need = exp.host_ram_bytes
        if need > ram_avail:
            rows.append(Row(node, host, "host RAM", FAIL, f"the plan keeps {fmt_bytes(need)} in host RAM on a node; "
                            f"{fmt_bytes(ram_avail)} available of {fmt_bytes(ram_total)}",
                            "free host memory, ask SLURM for more (--mem), or plan a rung that offloads less"))
        else:
            rows.append(Row(node, host, "host RAM", OK, f"{fmt_bytes(ram_avail)} available, the plan keeps "
                            f"{fmt_bytes(need)} there"))
    elif ram_avail is not None:
        rows.append(Row(node, host, "host RAM", OK, f"{fmt_bytes(ram_avail)} available of {fmt_bytes(ram_total)}"))
    rows.append(memlock_row(node, host, exp, facts))
    rows.extend(disk_rows(node, host, exp, lim))
    rows.append(shm_row(node, host, exp, lim))
    return [r for r in rows if r is not None]


def memlock_row(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> Row | None:
    """ulimit -l against what the offload pins: only GPU processes page-lock host memory (DeepSpeed's CPU
    accelerator's pin_memory does nothing)."""
    lim = facts.get("limits") or {}
    limit = lim.get("memlock")            # bytes; None: unlimited
    shown = "unlimited" if limit is None else fmt_bytes(limit)
    ds = ((facts.get("versions") or {}).get("deepspeed") or {}).get("version")
    blocks = [b for b in exp.pinned_blocks]
    blocks += [b for b in exp.pin_default_blocks if pins_by_default(ds) and b not in blocks]
    if not blocks or not exp.uses_gpus:
        return Row(node, host, "ulimit -l", OK, f"{shown} (nothing pinned by the config)")
    need = pinned_bytes_per_process(exp.params, exp.processes_per_node * exp.num_machines, blocks)
    from wizard.check.rules.deepspeed_json import MEMLOCK_FLOOR
    if limit is None or (need is not None and limit >= need) or (need is None and limit >= MEMLOCK_FLOOR):
        return Row(node, host, "ulimit -l", OK, f"{shown}" + (f", each process pins at least {fmt_bytes(need)}"
                                                            if need else ""))
    why = f"each process pins at least {fmt_bytes(need)}" if need else f"below {fmt_bytes(MEMLOCK_FLOOR)}"
    return Row(node, host, "ulimit -l", FAIL,
               f"{shown}: CPU offload ({', '.join('offload_' + b for b in blocks)}) pins its host buffers "
               f"(DeepSpeed {ds or '?'}), and {why}",
               "`ulimit -l unlimited` before the launch (SLURM: PropagateResourceLimits, or the node's "
               "limits.conf `* - memlock unlimited`), or \"pin_memory\": false in the offload block")


def disk_rows(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> list[Row]:
    rows = []
    disks = lim.get("disk") or {}
    for label, path, need in (("checkpoint disk", lim.get("cwd"), exp.checkpoint_bytes),
                              ("NVMe offload disk", exp.nvme_path, exp.nvme_bytes)):
        if not path:
            continue
        free = disks.get(path)
        if free is None:
            rows.append(Row(node, host, label, FAIL if label.startswith("NVMe") else WARN,
                            f"{path}: cannot read its free space (missing?)",
                            "create the directory on this node (a local path exists per node)"))
            continue
        if need and free < need:
            what = "the plan needs" if label.startswith("NVMe") else "a checkpoint with optimizer states takes"
            rows.append(Row(node, host, label, FAIL if label.startswith("NVMe") else WARN,
                            f"{fmt_bytes(free)} free at {path}; {what} {fmt_bytes(need)}",
                            "free space there, or point the output/NVMe path at a larger disk"))
        else:
            rows.append(Row(node, host, label, OK, f"{fmt_bytes(free)} free at {path}"
                            + (f" (needs {fmt_bytes(need)})" if need else "")))
    return rows


def shm_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row:
    shm = lim.get("shm_total")
    if shm is None:
        return Row(node, host, "/dev/shm", WARN, "no /dev/shm here",
                   "mount a tmpfs at /dev/shm (docker: --shm-size=8g)")
    text = f"{fmt_bytes(shm)}"
    several = exp.uses_gpus and exp.processes_per_node > 1
    if several and shm < SHM_FAIL_BYTES:
        return Row(node, host, "/dev/shm", FAIL, f"{text}: NCCL's shared-memory transport between this node's "
                   "GPUs fails to create its segments", "docker --shm-size=8g (or --ipc=host); in Kubernetes an "
                   "emptyDir with medium: Memory at /dev/shm")
    if shm < SHM_WARN_BYTES:
        return Row(node, host, "/dev/shm", WARN, f"{text}: DataLoader workers (and NCCL between GPUs) run short",
                   "--shm-size=8g (docker), or fewer dataloader_num_workers")
    return Row(node, host, "/dev/shm", OK, text)


# ----------------------------------------------------------------------------- NCCL / gloo environment


def parse_if_filter(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL's interface list syntax (NCCL_SOCKET_IFNAME, NCCL_IB_HCA): (exclude, exact, names). "^" first:
    exclude the listed ones; "=" (after "^" if any): exact names instead of prefixes; entries separated by
    commas; an IB entry may carry ":port"."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v[1:] if exclude else v
    exact = v.startswith("=")
    v = v[1:] if exact else v
    return exclude, exact, [e.strip() for e in v.split(",") if e.strip()]


def matching(names: list[str], value: str) -> list[str]:
    """The names NCCL would select from `names` under the filter `value`."""
    exclude, exact, entries = parse_if_filter(value)
    entries = [e.split(":")[0] for e in entries]

    def hit(name: str) -> bool:
        return any(name == e if exact else name.startswith(e) for e in entries)
    return [n for n in names if not hit(n)] if exclude else [n for n in names if hit(n)]


def nccl_env_rows(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
    """NCCL_SOCKET_IFNAME, NCCL_IB_HCA and GLOO_SOCKET_IFNAME against this node's interfaces: a value that names
    no interface here fails at init or hangs (NVIDIA/nccl#1837: a missing NCCL_SOCKET_IFNAME interface crashes
    with 'ncclSocketInit: connecting to address with family ...')."""
    net = facts.get("net") or {}
    env = net.get("env") or {}
    ifaces = [i for i in net.get("interfaces") or []]
    hcas = net.get("ib_devices") or []
    rows = []
    value = env.get("NCCL_SOCKET_IFNAME")
    if value:
        chosen = matching(ifaces, value)
        if not chosen:
            rows.append(Row(node, host, "NCCL_SOCKET_IFNAME", FAIL if exp.uses_gpus else WARN,
                            f"{value!r} names no interface on this node (it has {', '.join(ifaces) or 'none'})",
                            "set it to this node's interface toward the others (e.g. "
                            f"{next((i for i in ifaces if i != 'lo'), 'eth0')}), or unset it"))
        elif chosen == ["lo"] and exp.num_machines > 1:
            rows.append(Row(node, host, "NCCL_SOCKET_IFNAME", FAIL, f"{value!r} selects only lo (loopback): no other "
                            "node can be reached through it", "name the interface toward the other nodes"))
        else:
            rows.append(Row(node, host, "NCCL_SOCKET_IFNAME", OK, f"{value!r} -> {', '.join(chosen)}"))
    value = env.get("NCCL_IB_HCA")
    if value and env.get("NCCL_IB_DISABLE", "0") not in ("1",):
        exclude, _, _ = parse_if_filter(value)
        chosen = matching(hcas, value)
        if not chosen and not exclude:
            rows.append(Row(node, host, "NCCL_IB_HCA", FAIL if hcas else WARN,
                            f"{value!r} names no InfiniBand device on this node (it has {', '.join(hcas) or 'none'})",
                            f"set it to {', '.join(hcas)}" if hcas else "unset it (or NCCL_IB_DISABLE=1): "
                            "this node has no IB device, NCCL will use sockets"))
        else:
            rows.append(Row(node, host, "NCCL_IB_HCA", OK, f"{value!r} -> {', '.join(chosen) or 'none'}"))
    value = env.get("GLOO_SOCKET_IFNAME")
    if value:
        missing = [n for n in value.split(",") if n.strip() and n.strip() not in ifaces]
        if missing:
            rows.append(Row(node, host, "GLOO_SOCKET_IFNAME", FAIL, f"{', '.join(missing)} is not an interface of "
                            f"this node (it has {', '.join(ifaces) or 'none'})",
                            "name an interface of this node, or unset it"))
        else:
            rows.append(Row(node, host, "GLOO_SOCKET_IFNAME", OK, value))
    return rows


NCCL_LOG_PATTERNS = {
    "version": re.compile(r"NCCL version (\S+)"),
    "network": re.compile(r"NCCL INFO Using network (\S+)"),
    "socket": re.compile(r"NCCL INFO NET/Socket : Using (.+)"),
    "ib": re.compile(r"NCCL INFO NET/IB : Using (.+?)(?: ; OOB .*)?$"),
    "bootstrap": re.compile(r"NCCL INFO Bootstrap : Using (.+)"),
    "warn": re.compile(r"NCCL WARN (.+)"),
}


def parse_nccl_log(text: str) -> dict[str, Any]:
    """What NCCL_DEBUG=INFO says it chose: its version, the network (IB / Socket), the interfaces, and its WARN
    lines (the first few)."""
    out: dict[str, Any] = {"warnings": []}
    for line in text.splitlines():
        for key, pat in NCCL_LOG_PATTERNS.items():
            m = pat.search(line)
            if not m:
                continue
            if key == "warn":
                if len(out["warnings"]) < 5 and m.group(1).strip() not in out["warnings"]:
                    out["warnings"].append(m.group(1).strip())
            else:
                out.setdefault(key, m.group(1).strip())
    return out


# ----------------------------------------------------------------------------- collectives


def busbw_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """An all-reduce's bus bandwidth in Gb/s (nccl-tests' definition: algbw x 2(n-1)/n), comparable with a link's
    line rate whatever the number of ranks."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return nbytes / seconds * 2 * (ranks - 1) / ranks * 8 / 1e9


def collective_rows(node: int, host: str, exp: Expectation, result: dict[str, Any] | None,
                    backend: str) -> list[Row]:
    """The all-reduce rows this node ran: within the node (its own processes) and across the nodes (one process
    per node: the network between machines, what the plan's inter-node figure stands for)."""
    if result is None:
        return []
    if result.get("timeout"):
        return [Row(node, host, f"all-reduce ({backend})", FAIL,
                    f"the {backend} all-reduce did not finish within {result['timeout']:g} s: a collective that hangs "
                    "here hangs training (the NCCL watchdog would abort it after 30 min)",
                    "look at the NCCL_SOCKET_IFNAME / firewall rows above; NCCL_DEBUG=INFO shows where it waits")]
    if result.get("error"):
        return [Row(node, host, f"all-reduce ({backend})", FAIL, f"{backend} failed: {result['error']}",
                    "the NCCL_/GLOO_ interface rows and the reach row say why; NCCL_DEBUG=INFO says more")]
    rows = []
    nccl = result.get("nccl_log") or {}
    via = f" via {nccl['network']} ({nccl.get('socket') or nccl.get('ib') or '?'})" if nccl.get("network") else ""
    for scope in ("node", "across"):
        s = (result.get("scopes") or {}).get(scope)
        if not s:
            continue
        label = f"all-reduce {'within node' if scope == 'node' else 'across nodes'}"
        if s.get("ranks", 0) < 2:
            rows.append(Row(node, host, label, INFO, f"{s.get('ranks', 1)} process: nothing to measure"))
            continue
        gbps = s["busbw_gbps"]
        text = (f"{backend}, {s['ranks']} ranks, {fmt_bytes(s['bytes'])} x {s['iterations']}: {s['seconds'] * 1e3:.1f} "
                f"ms each, bus bandwidth {gbps:.2f} Gb/s ({gbps / 8:.2f} GB/s){via if scope == 'across' else ''}")
        if scope == "across" and exp.assumed_gbps:
            share = gbps / exp.assumed_gbps
            text += f"; the plan assumed {exp.assumed_gbps:g} Gb/s ({exp.assumed_source})"
            if share < BANDWIDTH_WARN_SHARE:
                rows.append(Row(node, host, label, WARN, text + f": {share:.0%} of it",
                                "the plan's step times are too fast for this network: `wizard preflight --record` "
                                "stores the measurement and the next `wizard plan` uses it (or --inter-node-gbps)"))
                continue
        rows.append(Row(node, host, label, OK, text))
    for w in nccl.get("warnings") or []:
        rows.append(Row(node, host, "NCCL warning", WARN, w, "NCCL_DEBUG=INFO on this node shows the context"))
    return rows


# ----------------------------------------------------------------------------- verdict and table


def exit_code(rows: list[Row]) -> int:
    return 1 if any(r.status == FAIL for r in rows) else 0


def verdict(rows: list[Row], nodes: int) -> str:
    fails = [r for r in rows if r.status == FAIL]
    warns = [r for r in rows if r.status == WARN]
    if fails:
        first = fails[0]
        return (f"preflight: {len(fails)} finding{'s' if len(fails) != 1 else ''} that "
                f"stop{'s' if len(fails) == 1 else ''} the run "
                f"(first: node {first.node} {first.check}); fix {'it' if len(fails) == 1 else 'them'} before "
                "launching")
    tail = f", {len(warns)} warning{'s' if len(warns) != 1 else ''}" if warns else ""
    return f"preflight: all clear on {nodes} node{'s' if nodes != 1 else ''}{tail}"


MARK = {OK: "ok", INFO: "--", WARN: "WARN", FAIL: "FAIL"}


def render_table(rows: list[Row], width: int = 120) -> list[str]:
    """One row per check per node: node, check, status, what was found; the fix on the line below a finding."""
    import textwrap
    # every cell may hold what another node sent (its host name, versions, paths, NCCL's words): escaped, so no
    # control character or newline from the network reaches the terminal or starts a line of its own
    cells = [(printable(f"{r.node} {r.host}", 80), printable(r.check, 60), r.status, printable(r.detail, 2000),
              printable(r.fix, 2000) if r.fix else None) for r in rows]
    head = ("node", "check", "", "result")
    cw = [max([len(head[0])] + [len(c[0]) for c in cells]), max([len(head[1])] + [len(c[1]) for c in cells]), 4]
    indent = cw[0] + cw[1] + cw[2] + 6
    wrap = max(40, width - indent)
    out = [f"{head[0]:<{cw[0]}}  {head[1]:<{cw[1]}}  {head[2]:<{cw[2]}}  {head[3]}"]
    for who, check, status, detail, fix in cells:
        lines = textwrap.wrap(detail, wrap) or [""]
        out.append(f"{who:<{cw[0]}}  {check:<{cw[1]}}  {MARK[status]:<{cw[2]}}  {lines[0]}")
        out += [" " * indent + line for line in lines[1:]]
        if fix and status in (WARN, FAIL):
            out += [" " * indent + line for line in textwrap.wrap("fix: " + fix, wrap)]
    return out


def render_versions(per_node: dict[int, dict[str, Any]]) -> list[str]:
    """The versions table, only when nodes differ: package x node, the differing rows marked."""
    names, table, differ = version_table(per_node)
    if not differ:
        return []
    table = {n: {p: printable(v, 60) for p, v in row.items()} for n, row in table.items()}    # another node's words
    nodes = sorted(table)
    w = max(len(n) for n in names) + 2
    cols = [max(len(f"node {n}"), *(len(table[n][p]) for p in names)) + 2 for n in nodes]
    out = ["versions (differing rows marked *):",
           (" " * (w + 2) + "".join(f"{'node ' + str(n):<{c}}" for n, c in zip(nodes, cols))).rstrip()]
    for p in names:
        out.append((f"{'*' if p in differ else ' '} {p:<{w}}" +
                    "".join(f"{table[n][p]:<{c}}" for n, c in zip(nodes, cols))).rstrip())
    return out
