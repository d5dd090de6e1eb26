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
    checkpoint_bytes: int | None = None        # what one node must have free for the checkpoints the run keeps
    checkpoint_dir: str | None = None          # where the Trainer saves them (None: the working directory)
    checkpoint_dir_from: str = "the working directory"
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
    """From this node to main_process_ip:main_process_port. outcome["kind"] (rendezvous.probe_connect): "ok" (the
    main node's preflight answered); "unresolved" (DNS), "noroute" (no route to that network), "unreachable" (the
    host does not answer on its network), "refused" (nothing listens), "timeout" (the packets are dropped: a
    firewall), each told apart with its own fix; "foreign" (something answers there that is not the main node's
    rendezvous: a rank would connect to it and hang); "version", "self"."""
    kind = outcome.get("kind")
    where = f"{ip}:{port}"
    seconds = outcome.get("seconds")
    waited = f" (tried for {seconds:.0f} s)" if isinstance(seconds, (int, float)) else ""
    detail = outcome.get("detail")
    if kind == "ok":
        return Row(node, host, "reach main port", OK, f"{where} answered as the main node's rendezvous")
    if kind == "skipped":
        return Row(node, host, "reach main port", INFO, f"{where} not tried: {detail}")
    if kind == "foreign":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} is held by another program ({detail or 'not the main node'}): this "
                   "node's ranks would connect to it instead of the main node's store and hang",
                   "stop the program listening on that port on the main node's address, or choose another "
                   "main_process_port for every node")
    if kind == "refused":
        return Row(node, host, "reach main port", FAIL, f"{where} refused the connection{waited}: the main node "
                   "is not listening there (not started, another address, or it stopped on a finding of its own)",
                   "start every node within the join timeout, check main_process_ip is the main node's address, "
                   "and look at the main node's output")
    if kind == "version":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} answered with another wizard version's preflight ({detail})",
                   "install the same wizard version on every node (one environment)")
    if kind == "self":
        return Row(node, host, "reach main port", FAIL,
                   f"{where} is not this (main) node: its rendezvous answered with another node's token",
                   "main_process_ip must be an address of the machine with machine_rank 0")
    if kind == "unresolved":
        return Row(node, host, "reach main port", FAIL, f"{ip} does not resolve on this node (DNS: {detail})",
                   "use the main node's IP address as main_process_ip, or make this node resolve the name "
                   "(/etc/hosts, its DNS search domain)")
    if kind == "noroute":
        return Row(node, host, "reach main port", FAIL,
                   f"this node has no route to {ip}'s network ({detail}): no firewall is involved, the address is "
                   "on a network this node is not on", f"main_process_ip must be an address of the main node on a "
                   f"network every node is on (`ip route get {ip}` on this node shows there is none; with several "
                   "networks, the cluster's internal address)")
    if kind == "unreachable":
        return Row(node, host, "reach main port", FAIL,
                   f"{where}: no route to the host{waited} ({detail}): nothing answers at {ip} on its network (the "
                   "main node is down, or at another address), or a firewall rejects with host-prohibited",
                   f"check the main node is up at {ip} (ping it from here), or open TCP port {port} in its firewall")
    return Row(node, host, "reach main port", FAIL,
               f"{where} could not be reached{waited}: {detail or 'no answer'}: the packets are dropped on the way "
               "(a firewall that drops them), or nothing is at that address",
               f"open TCP port {port} (and the ephemeral ports the collectives use) between the nodes, or use an "
               "address of the main node this node can reach")


def joined_rows(expected: int, joined: dict[int, str], duplicates: list[int], waited: float,
                main_host: str, stopped_for: str | None = None) -> list[Row]:
    """On the main node: which machine ranks met it at the port (every one of 1..N-1 must). `stopped_for`: the
    finding for which the main node stopped waiting early; a node missing then is its consequence, not a finding."""
    rows = []
    for rank in duplicates:
        rows.append(Row(rank, joined.get(rank, "?"), "joined", FAIL,
                        f"two nodes say they are machine_rank {rank}",
                        "give each node its own --machine-rank (under SLURM: $SLURM_NODEID)"))
    for rank in range(1, expected):
        if rank in joined:
            continue
        if stopped_for:
            rows.append(Row(rank, "?", "joined", INFO, f"node {rank} had not reached the main node when it stopped "
                            f"waiting on a finding that stops the run ({stopped_for}); its own output says what it "
                            "found"))
            continue
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


def _reference(table: dict[int, dict[str, str]], differ: set[str]) -> tuple[dict[str, str], list[int]]:
    """The versions most nodes have (node 0's on a tie) and the nodes that have them: at 64 nodes the one that
    differs is named, not the 63 that differ from it."""
    from collections import Counter
    keys = {n: tuple(row[p] for p in sorted(differ)) for n, row in table.items()}
    counts = Counter(keys.values())
    best = max(counts.values())
    ref_node = min(n for n, k in keys.items() if counts[k] == best)
    return table[ref_node], sorted(n for n, k in keys.items() if k == keys[ref_node])


def version_rows(per_node: dict[int, dict[str, Any]], hosts: dict[int, str], expected: int | None = None
                 ) -> list[Row]:
    """One row per node that reported: the versions most nodes have, or which packages differ from them and where
    the node's own interpreter imports them from. `expected`: how many nodes the run has (a node that did not report
    is not counted as "the same")."""
    names, table, differ = version_table(per_node)
    rows = []
    missing = (expected or len(table)) - len(table)
    ref, ref_nodes = _reference(table, differ) if differ else ({}, sorted(table))
    label = f"node {ref_nodes[0]}" if len(ref_nodes) == 1 else f"{len(ref_nodes)} of {len(table)} nodes"
    for node in sorted(table):
        mine = table[node]
        if not differ:
            every = ("same on every node" if not missing else
                     f"same on the {len(table)} node{'s' if len(table) != 1 else ''} that reported; {missing} did not")
            rows.append(Row(node, hosts.get(node, "?"), "versions", OK,
                            f"python {mine['python']}, torch {mine['torch']}, deepspeed {mine['deepspeed']}, "
                            f"accelerate {mine['accelerate']}, transformers {mine['transformers']}, peft {mine['peft']}"
                            f" ({every})"))
            continue
        diff = [n for n in names if n in differ and mine[n] != ref[n]]
        if not diff:
            others = [n for n in sorted(table) if n not in ref_nodes]
            text = (f"the reference: node{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
                    f"differ{'s' if len(others) == 1 else ''} (versions below)")
            rows.append(Row(node, hosts.get(node, "?"), "versions", INFO if node == ref_nodes[0] else OK,
                            text if node == ref_nodes[0] else f"same as {label}"))
            continue
        where = ((per_node[node].get("versions") or {}).get(diff[0]) or {}).get("path")
        rows.append(Row(node, hosts.get(node, "?"), "versions", FAIL,
                        f"differs from {label}: " + ", ".join(f"{n} {mine[n]} ({label}: {ref[n]})" for n in diff)
                        + (f"; imported from {where}" if where else ""),
                        "install the same versions on every node (one image or one environment): " +
                        " ".join(f"{n}=={ref[n]}" for n in diff if n in PACKAGES and ref[n] != "not installed")))
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
