"""The preflight's report (issue 41): findings ordered by cause, the verdict naming the cause, the screen by
exception at 64 machines (one entry per finding with its hosts, one screen), SLURM's hostlist for --exclude, and a
node's own output labelled and naming the rows it is told about."""

from __future__ import annotations

from wizard.preflight import report
from wizard.preflight.checks import FAIL, INFO, OK, WARN, Row

SCREEN_LINES = 40


def test_the_cause_comes_before_the_symptom_whatever_the_node_order():
    rows = [Row(0, "n1", "collectives (gloo)", FAIL, "gloo failed: timed out", "the rows above say why"),
            Row(0, "n1", "versions", INFO, "the reference"),
            Row(1, "n2", "reach main port", FAIL, "refused", "start it"),
            Row(1, "n2", "versions", FAIL, "differs from node 0: torch 2.12.0", "pip install torch==2.13.0"),
            Row(2, "n3", "slow node", WARN, "#1 of 1", "exclude it")]
    ordered = report.ordered(rows)
    assert [(r.node, r.check) for r in ordered][:4] == [(1, "versions"), (1, "reach main port"),
                                                        (0, "collectives (gloo)"), (2, "slow node")]
    assert report.cause(rows).check == "versions"
    assert "(first: node 1 versions)" in report.verdict(rows, 3)
    assert report.cause([Row(0, "n1", "x", WARN, "y")]) is None


def test_hostlist_is_slurms_expression():
    assert report.hostlist(["n1", "n2", "n3", "n7", "n10", "gpu-a"]) == "n[1-3,7,10],gpu-a"
    assert report.hostlist(["gpu001", "gpu002", "gpu004"]) == "gpu[001-002,004]"
    assert report.hostlist(["a12", "a12"]) == "a12"
    assert report.numbers([0, 1, 2, 5]) == "0-2, 5"


def rows_at_scale(n: int = 64) -> tuple[list[Row], dict[int, str]]:
    """64 nodes of 12 rows each: the memlock limit too low on 40 of them, another torch on one, a slow node."""
    hosts = {i: f"gpu{i + 1:03d}" for i in range(n)}
    rows = []
    for i in range(n):
        for check in ("resolve main host", "GPUs", "GPU health", "host RAM", "open files", "processes",
                      "checkpoint disk", "/dev/shm", "reach main port", "versions", "all-reduce across nodes"):
            rows.append(Row(i, hosts[i], check, OK, "fine"))
        rows.append(Row(i, hosts[i], "ulimit -l", FAIL if i < 40 else OK, "64.0 KiB: CPU offload pins 1.9 GiB",
                        "`ulimit -l unlimited` before the launch"))
    rows.append(Row(17, hosts[17], "versions", FAIL, "differs from 63 of 64 nodes: torch 2.12.0",
                    "pip install torch==2.13.0"))
    rows.append(Row(50, hosts[50], "slow node", WARN, "#1 of 1: its best link runs at 3 Gb/s",
                    f"run without it (srun/sbatch --exclude={hosts[50]})"))
    return rows, hosts


def test_at_64_machines_the_screen_shows_each_finding_once_with_its_hosts_and_fits_one_screen():
    rows, hosts = rows_at_scale()
    lines = report.screen(rows, nodes=64, hosts=hosts, per_node={}, collective=None, backend="nccl",
                          verdict_line=report.verdict(rows, 64), table_file="wizard-preflight.txt")
    text = "\n".join(lines)
    assert len(lines) <= SCREEN_LINES, text
    assert sum(1 for line in lines if line.startswith("FAIL  ulimit -l ")) == 1 and "40 nodes: gpu[001-040]" in text
    assert "node 17 (gpu018)" in text and "node 50 (gpu051)" in text
    assert lines[-1] == report.verdict(rows, 64) and "41 findings" in lines[-1]
    # a finding on 40 of 64 nodes is the nodes' own: they are the ones to exclude (with the slow one)
    assert "--exclude=gpu[001-040,051]" in text


def test_a_finding_on_every_node_lists_no_node_to_exclude():
    rows = [Row(i, f"n{i}", "ulimit -l", FAIL, "64 KiB", "ulimit -l unlimited") for i in range(4)]
    assert report.to_exclude(rows, [f"n{i}" for i in range(4)]) == []
    rows.append(Row(0, "n0", "main port free", FAIL, "taken", "another port"))    # the config's, not the node's
    assert report.to_exclude(rows[-1:], [f"n{i}" for i in range(4)]) == []


def test_many_kinds_of_findings_are_counted_past_the_screen():
    rows = [Row(i, f"n{i}", f"check {i}", FAIL, "x", f"fix {i}") for i in range(30)]
    lines = report.screen(rows, nodes=30, hosts={i: f"n{i}" for i in range(30)}, per_node={}, collective=None,
                          backend="gloo", verdict_line="v", table_file="t.txt")
    assert len(lines) <= SCREEN_LINES and any(line.startswith("... and 20 more findings") for line in lines)


def test_another_nodes_output_is_labelled_and_shows_the_cause_it_is_told_of():
    cause = Row(1, "n2", "versions", FAIL, "differs from node 0: peft 0.0.1", "pip install peft==0.21.2")
    mine = [Row(0, "n1", "host RAM", OK, "fine"), cause]
    verdict = report.verdict(mine, 2)
    lines = report.node_screen(1, "n2", [cause, Row(1, "n2", "GPUs", OK, "8 x H100")], verdict, reached=True)
    assert all(line.startswith("[node 1 n2] ") for line in lines)
    text = "\n".join(lines)
    assert "versions" in text and "node 1 (n2): differs from node 0" in text and text.endswith(verdict)


def test_the_file_holds_every_row_by_node():
    rows, hosts = rows_at_scale()
    text = report.full_text(rows, per_node={}, figures=["per-node figures"], sizes=[], verdict_line="the verdict")
    table = text.splitlines()
    assert sum(1 for line in table if line.startswith("3 gpu004 ")) == 12      # every row of node 3 ...
    assert [line.split()[0] for line in table[1:769] if line[:1].isdigit()] == sorted(
        [line.split()[0] for line in table[1:769] if line[:1].isdigit()], key=int)   # ... by node
    assert table[-1] == "the verdict" and "per-node figures" in text
