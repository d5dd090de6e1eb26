"""What the preflight prints and writes: the findings ordered by cause, the verdict that names the cause, the screen
by exception (what is wrong, on which hosts, as a list SLURM's --exclude takes), and the full table for the file.
Pure: rows and figures in, lines out.

Order by cause: what stops the training before the symptom it causes. A node's own state (its versions, GPUs,
limits, interfaces, how it resolves the main host) comes first; then meeting (reaching the main port, joining);
then the collectives, which fail *because* of the first two. Among findings of one kind, the node order. Warnings
(what slows the run) after every finding that stops it, the slowest node first.

At 64 machines the full table is ~15 rows a node: it goes to a file. The screen shows each finding once with the
hosts it is on (a finding on 40 nodes is one entry), what was measured in a few lines, and the verdict.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from typing import Any

from wizard.preflight import measure
from wizard.preflight.checks import FAIL, INFO, OK, WARN, Row, version_table
from wizard.units import printable

# the checks about a node's own state: a finding here is the cause of what fails later
OWN_STATE = ("hostfile", "rank 0 host", "preflight secret", "node probe", "node facts", "limits", "versions", "driver",
             "GPUs", "same GPUs", "GPU health", "GPU XID", "GPU P2P", "host RAM", "ulimit -l", "open files", "processes",
             "checkpoint disk", "NVMe offload disk", "/dev/shm", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
             "GLOO_SOCKET_IFNAME", "resolve main host", "main port free", "data check")
MEETING = ("reach main port", "refused", "ssh", "preflight there", "joined", "main node")
# findings a node can be excluded for (the others are the config's, or every node's)
NODE_OWN = set(OWN_STATE) - {"hostfile", "rank 0 host", "preflight secret", "main port free"} | {
    "reach main port", "joined", "ssh", "preflight there", "slow node", "slow GPUs", "slow link"}
MARK = {OK: "ok", INFO: "--", WARN: "WARN", FAIL: "FAIL"}
SCREEN_GROUPS = 10            # finding entries on the screen; the rest are counted and in the file
WIDTH = 120


def tier(row: Row) -> int:
    if row.check in OWN_STATE:
        return 0
    if row.check in MEETING:
        return 1
    return 2                  # the collectives and what else is a symptom


def ordered(rows: list[Row]) -> list[Row]:
    """Findings that stop the run by cause, then warnings (in the order given within a kind: slow nodes come
    ranked), then the rest by node."""
    index = {id(r): i for i, r in enumerate(rows)}
    fails = sorted((r for r in rows if r.status == FAIL), key=lambda r: (tier(r), r.node, index[id(r)]))
    warns = sorted((r for r in rows if r.status == WARN), key=lambda r: (tier(r), index[id(r)]))
    rest = sorted((r for r in rows if r.status not in (FAIL, WARN)), key=lambda r: (r.node, index[id(r)]))
    return fails + warns + rest


def exit_code(rows: list[Row]) -> int:
    return 1 if any(r.status == FAIL for r in rows) else 0


def cause(rows: list[Row]) -> Row | None:
    """The finding the others follow from (the first by cause), or None when nothing stops the run."""
    fails = [r for r in ordered(rows) if r.status == FAIL]
    return fails[0] if fails else None


def verdict(rows: list[Row], nodes: int) -> str:
    fails = [r for r in rows if r.status == FAIL]
    warns = [r for r in rows if r.status == WARN]
    first = cause(rows)
    if first is not None:
        return (f"preflight: {len(fails)} finding{'s' if len(fails) != 1 else ''} that "
                f"stop{'s' if len(fails) == 1 else ''} the run "
                f"(first: node {first.node} {first.check}); fix {'it' if len(fails) == 1 else 'them'} before "
                "launching")
    tail = f", {len(warns)} warning{'s' if len(warns) != 1 else ''}" if warns else ""
    return f"preflight: all clear on {nodes} node{'s' if nodes != 1 else ''}{tail}"


# ----------------------------------------------------------------------------- hosts


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def hostlist(hosts: list[str]) -> str:
    """Host names as SLURM's hostlist expression (n[1-3,7],gpu-a), which --exclude, scontrol and sinfo take;
    names without a number, or with numbers of another width, stay as they are."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for h in dict.fromkeys(hosts):
        m = _NUMBERED.match(h)
        if m and not re.search(r"[\[\],]", h):
            digits = m.group(2)      # zero-padded numbers keep their width (n01); others merge (n1, n10)
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
            groups.setdefault((m.group(1), width), []).append(int(digits))
        else:
            plain.append(h)
    out = []
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        spans, start, prev = [], numbers[0], numbers[0]
        for n in numbers[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start:0{width}d}" + (f"-{prev:0{width}d}" if prev != start else ""))
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(out + plain)


def who(rows: list[Row]) -> str:
    """The nodes of a finding: "node 3 (n4)", "12 nodes: n[1-12]" (by node number where their host names do not
    tell them apart: several nodes on one machine). Host names are another node's words: escaped."""
    nodes = sorted({(r.node, printable(r.host, 60)) for r in rows})
    if len(nodes) == 1:
        return f"node {nodes[0][0]} ({nodes[0][1]})"
    known = [h for _, h in nodes if h != "?"]
    if known and len(set(known)) == len(nodes):
        return f"{len(nodes)} nodes: {hostlist(known)}"
    return f"nodes {numbers([n for n, _ in nodes])}" + (f" ({hostlist(known)})" if known else "")


def numbers(values: list[int]) -> str:
    """0, 1, 2, 5 -> "0-2, 5"."""
    return hostlist([f"n{v}" for v in values]).removeprefix("n").strip("[]").replace(",", ", ")


def to_exclude(rows: list[Row], all_hosts: list[str]) -> list[str]:
    """The hosts whose own findings stop or slow the run, when they are some of the nodes, not all (a finding on
    every node is the config's or the cluster's, and excluding cannot fix it)."""
    bad = {r.host for r in rows if r.status in (FAIL, WARN) and r.check in NODE_OWN and r.host != "?"}
    return sorted(bad) if bad and len(bad) < len(set(all_hosts)) else []


# ----------------------------------------------------------------------------- the screen


@dataclass
class Group:
    status: str
    check: str
    fix: str | None
    rows: list[Row]


def groups(rows: list[Row]) -> list[Group]:
    """The findings, one entry per check, status and fix (a limit too low on 40 nodes is one entry), in cause
    order."""
    out: dict[tuple[str, str, str | None], Group] = {}
    for r in ordered(rows):
        if r.status not in (FAIL, WARN):
            continue
        key = (r.status, r.check, re.sub(r"\b(?:node \d+|--exclude=\S+|nodename=\S+)", "", r.fix or ""))
        out.setdefault(key, Group(r.status, r.check, r.fix, [])).rows.append(r)
    return list(out.values())


def _wrapped(head: str, text: str, indent: int, width: int = WIDTH) -> list[str]:
    """head + text wrapped at `width` columns, the lines after the first indented by `indent`."""
    return textwrap.wrap(head + text, width, subsequent_indent=" " * indent, break_on_hyphens=False) or [head]


def group_lines(g: Group, check_width: int = 22, width: int = WIDTH) -> list[str]:
    first = g.rows[0]
    many = len({r.node for r in g.rows}) > 1
    text = f"{who(g.rows)}: " + (f"(as on node {first.node}) " if many else "") + printable(first.detail, 600)
    head = f"{MARK[g.status]:<4}  {printable(g.check, 40):<{check_width}} "
    indent = len(head)
    out = _wrapped(head, text, indent, width)
    if g.fix:
        fix = printable(first.fix if not many else re.sub(r"--exclude=\S+", "--exclude=HOSTS", g.fix), 600)
        out += _wrapped(" " * indent, "fix: " + fix, indent, width)
    return out


def check_width(found: list[Group]) -> int:
    return max([len(g.check) for g in found[:SCREEN_GROUPS]] + [10]) + 1


def versions_lines(per_node: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[str]:
    """The packages whose versions differ, each with who has which (the table by node is in the file)."""
    names, table, differ = version_table(per_node)
    out = []
    for p in names:
        if p not in differ:
            continue
        by: dict[str, list[int]] = {}
        for node, row in table.items():
            by.setdefault(row[p], []).append(node)
        parts = [f"{printable(v, 60)} on " + (f"node {ns[0]} ({printable(hosts.get(ns[0], '?'), 60)})" if len(ns) == 1 else
                                              f"{len(ns)} nodes")
                 for v, ns in sorted(by.items(), key=lambda kv: -len(kv[1]))]
        out.append(f"  {p}: " + "; ".join(parts))
    return ["versions that differ between nodes:"] + out if out else []


def measured_lines(result: dict[str, Any] | None, backend: str, width: int = WIDTH) -> list[str]:
    """What was measured, in a line per scope: every operation at its largest size, all-reduce with its spread."""
    out = []
    for scope, words in (("across", "across nodes"), ("node", "within node 0")):
        s = ((result or {}).get("scopes") or {}).get(scope) or {}
        if s.get("ranks", 0) < 2:
            continue
        parts = []
        for op in measure.OPS:
            top = measure.headline(result, scope, op)
            if not top:
                continue
            bw = measure.Spread(top["busbw_gbps"], top.get("low_gbps", 0), top.get("high_gbps", 0),
                                top.get("samples", 1))
            parts.append(f"{measure.LABELS[op]} {bw.text() if op == 'all_reduce' else f'{bw.median:.2f} Gb/s'}")
        if parts:
            top = measure.headline(result, scope)
            size = f", {top['bytes'] >> 20} MiB" if top and top["bytes"] >= 1 << 20 else ""
            out += _wrapped(f"measured {words} ({backend}, {s['ranks']} ranks{size}, bus bandwidth): ", "; ".join(parts),
                            4, width)
    return out


def screen(rows: list[Row], *, nodes: int, hosts: dict[int, str], per_node: dict[int, dict[str, Any]],
           collective: dict[str, Any] | None, backend: str, verdict_line: str, table_file: str | None,
           tag: str = "") -> list[str]:
    """The main node's screen: each finding once, by cause, with its hosts and fix; the versions that differ; what
    was measured; who to exclude; the verdict. At most SCREEN_GROUPS findings: the rest are counted (the file has
    everything). `tag` starts every line (the node's label: srun and an sbatch log mix the nodes' lines)."""
    width = WIDTH - len(tag)
    out = [f"preflight: {nodes} node{'s' if nodes != 1 else ''}, {backend}; findings first"
           + (f", the full table in {table_file}" if table_file else "")]
    found = groups(rows)
    for g in found[:SCREEN_GROUPS]:
        out += group_lines(g, check_width(found), width)
    if len(found) > SCREEN_GROUPS:
        rest = found[SCREEN_GROUPS:]
        out.append(f"... and {len(rest)} more finding{'s' if len(rest) != 1 else ''} "
                   f"({', '.join(sorted({g.check for g in rest}))})" + (f": {table_file}" if table_file else ""))
    if not found:
        out.append("no finding: every check passed on every node")
    out += versions_lines(per_node, hosts)
    out += measured_lines(collective, backend, width)
    excluded = to_exclude(rows, [h for h in hosts.values()])
    if excluded:
        names = hostlist([printable(h, 60) for h in excluded])
        out += _wrapped("", f"to run without the nodes named above: --exclude={names} (srun, sbatch), or drain "
                        f"them: scontrol update nodename={names} state=drain reason=\"wizard preflight\"", 2, width)
    out.append(verdict_line)
    return [tag + line for line in out]


def label(rank: int, host: str) -> str:
    """What starts each line a node prints at the end (srun and an sbatch log mix the nodes' lines)."""
    return f"[node {rank} {printable(host, 40)}] "


def node_screen(rank: int, host: str, rows: list[Row], verdict_line: str, reached: bool) -> list[str]:
    """A node other than the main one: its own findings and the cause (the main node sent both), the verdict, every
    line labelled with the node (srun and the sbatch log mix the nodes' lines)."""
    tag = label(rank, host)
    out = [f"preflight on node {rank} ({printable(host, 60)}): " + ("checked and reported to the main node, which prints the table "
                                                    "for every node" if reached else
                                                    "the main node was not reached; this node's own findings")]
    found = groups(rows)
    for g in found:
        out += group_lines(g, check_width(found), WIDTH - len(tag))
    out.append(printable(verdict_line, 400))
    return [tag + line for line in out]


# ----------------------------------------------------------------------------- the full table (the file)


def render_table(rows: list[Row], width: int = WIDTH) -> list[str]:
    """One row per check per node: node, check, status, what was found; the fix on the line below a finding."""
    # every cell may hold what another node sent (its host name, versions, paths, NCCL's words): escaped, so no
    # control character or newline from the network reaches the terminal or starts a line of its own
    cells = [(printable(f"{r.node} {r.host}", 80), printable(r.check, 60), r.status, printable(r.detail, 2000),
              printable(r.fix, 2000) if r.fix else None) for r in rows]
    head = ("node", "check", "", "result")
    cw = [max([len(head[0])] + [len(c[0]) for c in cells]), max([len(head[1])] + [len(c[1]) for c in cells]), 4]
    indent = cw[0] + cw[1] + cw[2] + 6
    wrap = max(40, width - indent)
    out = [f"{head[0]:<{cw[0]}}  {head[1]:<{cw[1]}}  {head[2]:<{cw[2]}}  {head[3]}"]
    for who_, check, status, detail, fix in cells:
        lines = textwrap.wrap(detail, wrap) or [""]
        out.append(f"{who_:<{cw[0]}}  {check:<{cw[1]}}  {MARK[status]:<{cw[2]}}  {lines[0]}")
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


def full_text(rows: list[Row], *, per_node: dict[int, dict[str, Any]], figures: list[str], sizes: list[str],
              verdict_line: str) -> str:
    """The whole report for the file: every row of every node (by node), the versions, the per-node figures,
    every operation at every size, the verdict."""
    by_node = sorted(rows, key=lambda r: r.node)
    parts = [render_table(by_node), render_versions(per_node), figures, sizes, [verdict_line]]
    return "\n\n".join("\n".join(p) for p in parts if p) + "\n"


def counts(rows: list[Row]) -> Counter:
    return Counter(r.status for r in rows)
