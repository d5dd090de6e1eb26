"""The measured figures as rows: each node's collectives (collective.py's result), and the node or link that is
slow among many (the ring pass and the within-node figures compared across nodes). Pure.

A slow node is one whose best link runs far below the others' (a node slow in its NIC, its cable or its switch port
is slow on every link it has; its neighbours are slow only on the one they share with it, and fast on the others),
or whose GPUs reduce far slower among themselves than the other nodes' do. They are ranked, the slowest first: every
collective of the run goes at the pace of its slowest member, so each is worth excluding (SLURM's --exclude) until
it is fixed.
"""

from __future__ import annotations

import statistics
from typing import Any

from wizard.preflight import measure
from wizard.preflight.checks import FAIL, INFO, OK, WARN, Expectation, Row
from wizard.units import fmt_bytes

# A measured bus bandwidth below this share of what the plan assumed is worth a warning: the plan's step times
# (and its choice between rungs that trade compute for communication) assume the faster network.
BANDWIDTH_WARN_SHARE = 0.5
# A node whose figure is below this share of the median node's is named as slow (the spread of a healthy cluster's
# figures is far narrower; loopback under load here, ~20 %).
SLOW_SHARE = 0.5
SCOPE_WORDS = {"node": "within node", "across": "across nodes"}
STOP_CHECK = "collectives"


def collective_rows(node: int, host: str, exp: Expectation, result: dict[str, Any] | None,
                    backend: str) -> list[Row]:
    """What this node's collectives did: the all-reduce within the node (its own processes) and across the nodes
    (one process per node: the network between machines, what the plan's inter-node figure stands for), the other
    operations, and any data check that failed."""
    if result is None:
        return []
    if result.get("cancelled"):
        return [Row(node, host, STOP_CHECK, INFO, f"stopped: {result['cancelled']}")]
    if result.get("ended"):
        return [Row(node, host, STOP_CHECK, FAIL, "this node's preflight ended during the collectives (it was "
                    "stopped, or its connection to the main node broke)", "look at this node's own output, and start "
                    "it again")]
    if result.get("timeout"):
        return [Row(node, host, f"{STOP_CHECK} ({backend})", FAIL,
                    f"the {backend} collectives did not finish within {result['timeout']:g} s: a collective that "
                    "hangs here hangs training (the NCCL watchdog would abort it after 30 min)",
                    "look at the NCCL_SOCKET_IFNAME / firewall rows above; NCCL_DEBUG=INFO shows where it waits")]
    if result.get("error"):
        return [Row(node, host, f"{STOP_CHECK} ({backend})", FAIL, f"{backend} failed: {result['error']}",
                    "the NCCL_/GLOO_ interface rows and the reach row say why; NCCL_DEBUG=INFO says more")]
    rows = []
    nccl = result.get("nccl_log") or {}
    via = f" via {nccl['network']} ({nccl.get('socket') or nccl.get('ib') or '?'})" if nccl.get("network") else ""
    for scope, words in SCOPE_WORDS.items():
        s = (result.get("scopes") or {}).get(scope)
        if not s:
            continue
        if s.get("ranks", 0) < 2:
            rows.append(Row(node, host, f"all-reduce {words}", INFO, f"{s.get('ranks', 1)} process: nothing to "
                            "measure"))
            continue
        rows += scope_rows(node, host, exp, backend, scope, s, via if scope == "across" else "")
    for link in result.get("ring") or []:
        if link.get("check", "ok") != "ok":
            rows.append(Row(node, host, "data check", FAIL, f"what node {link['from']} sent in the ring pass arrived "
                            f"wrong: {link['check']}", "this node's network path corrupts data: exclude it and have "
                            "its NIC and driver checked"))
    for w in nccl.get("warnings") or []:
        rows.append(Row(node, host, "NCCL warning", WARN, w, "NCCL_DEBUG=INFO on this node shows the context"))
    return rows


def scope_rows(node: int, host: str, exp: Expectation, backend: str, scope: str, s: dict[str, Any],
               via: str) -> list[Row]:
    words = SCOPE_WORDS[scope]
    rows = []
    top = measure.headline({"scopes": {scope: s}}, scope)
    if top:
        bw = measure.Spread(top["busbw_gbps"], top.get("low_gbps", top["busbw_gbps"]),
                            top.get("high_gbps", top["busbw_gbps"]), top.get("samples", 1))
        text = (f"{backend}, {s['ranks']} ranks, {fmt_bytes(top['bytes'])}: {top['seconds'] * 1e3:.1f} ms, bus "
                f"bandwidth {bw.text()}{via}")
        if scope == "across" and exp.assumed_gbps:
            share = bw.median / exp.assumed_gbps
            text += f"; the plan assumed {exp.assumed_gbps:g} Gb/s ({exp.assumed_source})"
            if share < BANDWIDTH_WARN_SHARE:
                rows.append(Row(node, host, f"all-reduce {words}", WARN, text + f": {share:.0%} of it",
                                "the plan's step times are too fast for this network: `wizard preflight --record` "
                                "stores the measurement and the next `wizard plan` uses it (or --inter-node-gbps)"))
                top = None
        if top:
            rows.append(Row(node, host, f"all-reduce {words}", OK, text))
    others, unsupported = [], []
    for op in measure.OPS[1:]:
        best = measure.headline({"scopes": {scope: s}}, scope, op)
        if best:
            others.append(f"{measure.LABELS[op]} {best['busbw_gbps']:.2f} Gb/s")
        for run in (s.get("ops") or {}).get(op) or []:
            if run.get("unsupported") and measure.LABELS[op] not in unsupported:
                unsupported.append(measure.LABELS[op])
    if others or unsupported:
        rows.append(Row(node, host, f"collectives {words}", OK if others else INFO,
                        ", ".join(others) + (" (bus bandwidth at the largest size)" if others else "")
                        + (f"; {backend} cannot run {', '.join(unsupported)} here" if unsupported else "")))
    for op, runs in (s.get("ops") or {}).items():
        bad = [r for r in runs if r.get("check", "ok") != "ok" and not r.get("unsupported")]
        if bad:
            rows.append(Row(node, host, "data check", FAIL, f"{measure.LABELS.get(op, op)} {words} at "
                            f"{fmt_bytes(bad[0]['bytes'])} returned wrong data: {bad[0]['check']}",
                            "a node that corrupts a collective's data: exclude it and have its GPUs, NICs and "
                            "drivers checked (the same versions everywhere)"))
    return rows


# ----------------------------------------------------------------------------- the slow node


def links(results: dict[int, dict[str, Any]]) -> list[tuple[int, int, float]]:
    """(from, to, Gb/s) of every ring-pass measurement the nodes reported."""
    out = []
    for node, r in results.items():
        for link in (r or {}).get("ring") or []:
            if link.get("gbps") is not None:
                out.append((int(link["from"]), int(node), float(link["gbps"])))
    return out


def node_scores(results: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Each node's best ring link (in or out): a node slow itself is slow on all of them."""
    best: dict[int, float] = {}
    for frm, to, gbps in links(results):
        for n in (frm, to):
            best[n] = max(best.get(n, 0.0), gbps)
    return best


def within_scores(results: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Each node's all-reduce among its own processes (its GPUs' links), where it has several."""
    out = {}
    for node, r in results.items():
        top = measure.headline(r or {}, "node")
        if top:
            out[node] = top["busbw_gbps"]
    return out


def ranked_slow(scores: dict[int, float], share: float = SLOW_SHARE) -> list[tuple[int, float, float]]:
    """(node, its figure, the median node's) for each node below `share` of the median, the slowest first; none
    with fewer than 3 nodes (two nodes share one pair of links: which end is slow cannot be told)."""
    if len(scores) < 3:
        return []
    median = statistics.median(scores.values())
    slow = [(n, v, median) for n, v in scores.items() if median > 0 and v < share * median]
    return sorted(slow, key=lambda t: t[1] / t[2])


def slow_rows(results: dict[int, dict[str, Any]], hosts: dict[int, str], backend: str) -> list[Row]:
    """The slow nodes (ring pass; within-node figures) and the slow links that no slow node explains, ranked."""
    rows = []
    slow = ranked_slow(node_scores(results))
    for rank_, (node, value, median) in enumerate(slow, 1):
        host = hosts.get(node, "?")
        rows.append(Row(node, host, "slow node", WARN,
                        f"#{rank_} of {len(slow)}: its best link runs at {value:.2f} Gb/s, the median node's at "
                        f"{median:.2f} Gb/s ({value / median:.0%}; {backend} ring pass): every collective of the run "
                        "goes at its pace",
                        f"run without it (srun/sbatch --exclude={host}) and have its network looked at (NIC, cable, "
                        "switch port; `ethtool` and the NIC's error counters)"))
    named = {n for n, _, _ in slow}
    all_links = links(results)
    if len(all_links) >= 3:
        median = statistics.median(g for _, _, g in all_links)
        for frm, to, gbps in sorted(all_links, key=lambda t: t[2]):
            if median > 0 and gbps < SLOW_SHARE * median and frm not in named and to not in named:
                rows.append(Row(to, hosts.get(to, "?"), "slow link", WARN,
                                f"from node {frm} ({hosts.get(frm, '?')}) at {gbps:.2f} Gb/s, the median link at "
                                f"{median:.2f} Gb/s ({gbps / median:.0%}), while both nodes are fast on their other "
                                "links", "the path between these two nodes (a switch port, an uplink, a route)"))
    within = ranked_slow(within_scores(results))
    for node, value, median in within:
        host = hosts.get(node, "?")
        rows.append(Row(node, host, "slow GPUs", WARN,
                        f"its processes' all-reduce runs at {value:.2f} Gb/s, the median node's at {median:.2f} Gb/s "
                        f"({value / median:.0%}): a link between its GPUs is degraded (an NVLink down, a PCIe slot "
                        "at a lower width) or a GPU is slowed", f"exclude it (--exclude={host}); `nvidia-smi topo -m` "
                        "and `nvidia-smi nvlink -s` on it"))
    return rows


def node_table(results: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[str]:
    """The per-node figures for the full table: each node's ring links in and out and its within-node all-reduce."""
    scores, within = node_scores(results), within_scores(results)
    incoming: dict[int, list[str]] = {}
    for frm, to, gbps in links(results):
        incoming.setdefault(to, []).append(f"{frm}->{to} {gbps:.2f}")
    if not scores and not within:
        return []
    out = ["per-node figures (Gb/s; ring pass: each node's links in; within: its processes' all-reduce):",
           f"  {'node':<6}{'host':<24}{'best link':>10}  {'within':>8}  links in"]
    for node in sorted(set(scores) | set(within)):
        out.append(f"  {node:<6}{hosts.get(node, '?')[:23]:<24}{scores.get(node, 0):>10.2f}  "
                   f"{within[node] if node in within else float('nan'):>8.2f}  {', '.join(incoming.get(node, []))}")
    return out


def sizes_table(result: dict[str, Any]) -> list[str]:
    """Every operation at every size, in each scope of one node's result (the main node's: what the run sends)."""
    out = []
    for scope, words in SCOPE_WORDS.items():
        s = ((result or {}).get("scopes") or {}).get(scope) or {}
        if s.get("ranks", 0) < 2:
            continue
        out.append(f"collectives {words} ({s['ranks']} ranks; bus bandwidth, Gb/s: median (lowest-highest of the "
                   "samples), data check):")
        for op, runs in (s.get("ops") or {}).items():
            for r in runs:
                if r.get("unsupported"):
                    out.append(f"  {measure.LABELS.get(op, op):<15}{fmt_bytes(r['bytes']):>10}  not run: "
                               f"{r['unsupported']}")
                    continue
                out.append(f"  {measure.LABELS.get(op, op):<15}{fmt_bytes(r['bytes']):>10}  {r['busbw_gbps']:9.2f} "
                           f"({r.get('low_gbps', 0):.2f}-{r.get('high_gbps', 0):.2f}, {r.get('samples', 0)} samples)"
                           f"  {r.get('check', '?')}")
    return out
