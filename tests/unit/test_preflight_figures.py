"""The measured figures (issue 41): the operations' sizes and bus bandwidths, a median with its spread, the data
each operation must return (checked against the operation done by hand on every rank's buffer), and the slow node
or link found and ranked from the ring pass and the within-node figures."""

from __future__ import annotations

import pytest

from wizard.preflight import collective, figures, measure
from wizard.preflight.checks import FAIL, INFO, WARN, Expectation


def exp(**kw) -> Expectation:
    base = dict(config_file="c.yaml", num_machines=16, processes_per_node=1, uses_gpus=False, main_ip="10.0.0.1",
                main_port=29500)
    base.update(kw)
    return Expectation(**base)


def test_several_sizes_and_a_median_with_its_spread():
    assert measure.sizes(16 << 20) == [64 << 10, 1 << 20, 16 << 20]
    assert measure.sizes(256 << 20) == [1 << 20, 16 << 20, 256 << 20]
    s = measure.summary("all_reduce", 1 << 30, [1.0, 2.0, 0.5, 1.0, 1.0], 2)
    gbps = (1 << 30) * 8 / 1e9
    assert s["busbw_gbps"] == pytest.approx(gbps) and s["low_gbps"] == pytest.approx(gbps / 2)
    assert s["high_gbps"] == pytest.approx(gbps * 2) and s["samples"] == 5 and s["seconds"] == 1.0
    assert measure.spread([3.0, 1.0, 2.0]).text() == "2.00 Gb/s (median of 3: 1.00-3.00)"


@pytest.mark.parametrize("op", measure.OPS)
def test_each_operations_expected_data_is_what_the_operation_gives(op):
    """The check's expected output, against the operation done by hand over every rank's input: a wrong formula
    would fail every real run's data check (or pass a wrong result)."""
    import torch
    ranks, numel = 4, 4 * 1000
    device = torch.device("cpu")
    inputs = [collective._buffers(torch, op, numel, ranks, me, device)[0] for me in range(ranks)]
    chunk = numel // ranks
    for me in range(ranks):
        _, _, want = collective._buffers(torch, op, numel, ranks, me, device)
        if op == "all_reduce":
            got = sum(inputs)
        elif op == "all_gather":
            got = torch.cat(inputs)
        elif op == "reduce_scatter":
            got = sum(inputs)[me * chunk:(me + 1) * chunk]
        else:
            got = torch.cat([x[me * chunk:(me + 1) * chunk] for x in inputs])
        assert torch.equal(got, want), (op, me)
    wrong = want.clone()
    wrong[7] += 1
    assert collective._mismatch(torch, wrong, want).startswith("mismatch: 1 of")


def ring(n: int, slow: set[int] = frozenset(), slow_link: tuple[int, int] | None = None, fast=10.0, slow_gbps=1.0):
    """Each node's ring-pass result, as collective.ring_pass reports it: links in from me-k for each offset."""
    out = {}
    for me in range(n):
        links = []
        for k in collective.ring_offsets(n):
            frm = (me - k) % n
            g = slow_gbps if (frm in slow or me in slow or (frm, me) == slow_link) else fast + (me % 3) * 0.1
            links.append({"k": k, "to": (me + k) % n, "from": frm, "bytes": 1 << 22, "gbps": g, "check": "ok"})
        out[me] = {"ring": links, "scopes": {"node": {"ranks": 1}}}
    return out


def test_the_slow_node_is_named_and_ranked_not_its_neighbours():
    hosts = {i: f"n{i:02d}" for i in range(16)}
    rows = figures.slow_rows(ring(16, slow={5, 11}, slow_gbps=2.0) | {11: ring(16, slow={11}, slow_gbps=1.0)[11]},
                             hosts, "gloo")
    slow = [r for r in rows if r.check == "slow node"]
    assert [r.node for r in slow] == [11, 5] or [r.node for r in slow] == [5, 11]
    assert all(r.status == WARN and f"--exclude={hosts[r.node]}" in r.fix for r in slow)
    assert slow[0].detail.startswith("#1 of 2")
    assert not [r for r in rows if r.check == "slow link"]      # the slow nodes explain their slow links


def test_two_nodes_share_their_links_so_no_node_is_named():
    assert figures.slow_rows(ring(2, slow={1}), {0: "a", 1: "b"}, "gloo") == []


def test_a_slow_link_between_two_fast_nodes_is_named_as_a_link():
    rows = figures.slow_rows(ring(8, slow_link=(2, 3)), {i: f"n{i}" for i in range(8)}, "nccl")
    (link,) = rows
    assert link.check == "slow link" and link.node == 3 and "from node 2 (n2)" in link.detail


def test_a_node_whose_gpus_reduce_slowly_among_themselves_is_named():
    results = {i: {"scopes": {"node": {"ranks": 8, "ops": {"all_reduce": [
        {"bytes": 256 << 20, "busbw_gbps": 40.0 if i == 6 else 1500.0 + i}]}}}} for i in range(8)}
    (row,) = figures.slow_rows(results, {i: f"n{i}" for i in range(8)}, "nccl")
    assert row.check == "slow GPUs" and row.node == 6 and "NVLink" in row.detail


def scope(check="ok", unsupported=None):
    runs = {op: [{"bytes": 16 << 20, "samples": 7, "seconds": 0.02, "busbw_gbps": 8.0, "low_gbps": 7.0,
                  "high_gbps": 9.0, "check": check}] for op in measure.OPS}
    if unsupported:
        runs[unsupported] = [{"bytes": 16 << 20, "unsupported": "gloo does not support it"}]
    return {"ranks": 2, "ops": runs}


def test_a_data_check_that_failed_is_a_finding_and_an_unsupported_op_is_said():
    rows = figures.collective_rows(1, "n2", exp(), {"scopes": {"across": scope(check="mismatch: 3 of 9 wrong")}},
                                   "gloo")
    bad = [r for r in rows if r.check == "data check"]
    assert len(bad) == 4 and all(r.status == FAIL for r in bad) and "mismatch: 3 of 9 wrong" in bad[0].detail
    rows = figures.collective_rows(1, "n2", exp(), {"scopes": {"across": scope(unsupported="all_to_all")}}, "gloo")
    other = next(r for r in rows if r.check == "collectives across nodes")
    assert "gloo cannot run all-to-all here" in other.detail and "all-gather 8.00 Gb/s" in other.detail
    top = next(r for r in rows if r.check == "all-reduce across nodes")
    assert "8.00 Gb/s (median of 7: 7.00-9.00)" in top.detail


def test_a_stopped_collective_is_its_causes_consequence_and_an_ended_node_is_the_cause():
    (stopped,) = figures.collective_rows(0, "n1", exp(), {"cancelled": "node 3's collectives failed first"}, "gloo")
    assert stopped.status == INFO and stopped.detail == "stopped: node 3's collectives failed first"
    (ended,) = figures.collective_rows(3, "n4", exp(), {"error": "closed", "ended": True}, "gloo")
    assert ended.status == FAIL and "ended during the collectives" in ended.detail


def test_record_keeps_the_median_with_its_spread_and_nothing_under_a_failing_verdict(tmp_path, monkeypatch):
    import json

    from wizard.frontends.preflight_cli import record_bandwidth
    from wizard.preflight import run
    from wizard.preflight.checks import Row
    cal = tmp_path / "calibration.json"
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(cal))
    e = exp(num_machines=2)
    collectives = {0: {"scopes": {"across": scope()}}, 1: {"scopes": {"across": scope()}}}
    facts = {0: {"host": "n1"}, 1: {"host": "n2"}}
    clear = run.finish(0, True, [Row(0, "n1", "versions", "ok", "same")], e, facts, collectives, "gloo")
    said = record_bandwidth(clear)
    assert said.startswith("recorded 8.00 Gb/s (median of 7: 7.00-9.00) between 2 machines of")
    (entry,) = json.loads(cal.read_text())["network"].values()
    assert entry["gbps"] == 8.0 and entry["spread"] == {"low": 7.0, "high": 9.0, "samples": 7, "bytes": 16 << 20}
    cal.unlink()
    failing = run.finish(0, True, [Row(1, "n2", "versions", "fail", "differs", "pin")], e, facts, collectives, "gloo")
    assert record_bandwidth(failing) is None and not cal.exists()
