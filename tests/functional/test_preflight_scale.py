"""The preflight at scale without a cluster (issue 41): N node agents on this machine over loopback
(tests/preflight_agents.py: the product's rendezvous, judgement, aggregation, ranking and report, with the facts
and the collectives stood in for), N = 16 here, 32 with WIZARD_PREFLIGHT_AGENTS=32.

- one agent throttled (it really sends and receives at ~134 Mb/s): the ring pass names it as the slow node, first,
  and it is the one host listed for --exclude; the main node's screen fits on one screen;
- one agent with another peft: named as the cause, before any collective, on the main node and on the agent
  itself (every agent gets the verdict), within seconds of the last agent joining.
The 2-node local SLURM (test_preflight_multinode.py) stays the test with the real engines.
"""

from __future__ import annotations

import os

import pytest

from tests.preflight_agents import run_agents
from wizard.preflight import report
from wizard.preflight.checks import FAIL, WARN

N = int(os.environ.get("WIZARD_PREFLIGHT_AGENTS", "16"))
SCREEN_LINES = 40        # what one terminal screen shows


def _agents_ok(agents) -> None:
    assert not agents.errors, {r: (repr(e), agents.progress.get(r)) for r, e in agents.errors.items()}
    assert sorted(agents.results) == list(range(agents.n)), agents.progress


@pytest.mark.timeout(300)
def test_one_throttled_agent_among_many_is_named_ranked_and_listed_for_exclude(tmp_path):
    slow = N // 2 + 1
    agents = run_agents(tmp_path, N, throttled={slow})
    _agents_ok(agents)
    main = agents.main
    findings = [r for r in main.rows if r.status in (WARN, FAIL)]
    assert [(r.node, r.check) for r in findings] == [(slow, "slow node")], findings
    assert findings[0].detail.startswith("#1 of 1: its best link runs at")
    assert report.to_exclude(main.rows, list(main.hosts.values())) == [f"agent-{slow:02d}"]
    lines = report.screen(main.rows, nodes=N, hosts=main.hosts, per_node=main.facts, collective=main.collectives[0],
                          backend=main.backend, verdict_line=main.verdict, table_file="wizard-preflight.txt")
    print("\n".join(lines), f"\n(verdict after {agents.seconds:.1f} s)")
    assert len(lines) <= SCREEN_LINES, lines
    screen = "\n".join(lines)
    assert f"--exclude=agent-{slow:02d} " in screen and "slow node" in screen
    assert main.exit_code == 0 and main.verdict == f"preflight: all clear on {N} nodes, 1 warning"
    # every agent measured its links, and the figures of the throttled one's are the lowest
    assert all(len(main.collectives[r].get("ring") or []) >= 1 for r in range(N))
    for r in range(1, N):
        assert agents.results[r].verdict == main.verdict and agents.results[r].exit_code == 0


@pytest.mark.timeout(300)
def test_a_version_skew_on_one_agent_is_the_cause_everywhere_before_any_collective(tmp_path):
    skew = N - 3
    agents = run_agents(tmp_path, N, skew=skew)
    _agents_ok(agents)
    main = agents.main
    cause = main.cause()
    assert (cause.node, cause.check) == (skew, "versions") and "peft 0.0.1" in cause.detail
    assert not main.collectives or all(not c for c in main.collectives.values())       # no collective ran
    assert [r.node for r in main.rows if r.status == FAIL] == [skew]                     # the others are not blamed
    assert f"(first: node {skew} versions)" in main.verdict and main.exit_code == 1
    print(f"verdict after {agents.seconds:.1f} s")
    assert agents.seconds < 30
    for r in range(1, N):
        mine = agents.results[r]
        assert mine.exit_code == 1 and mine.verdict == main.verdict
        # each agent shows the cause it is told of, even where it is another node's
        assert any(row.node == skew and row.check == "versions" for row in mine.rows), mine.rows
        assert not [row for row in mine.rows if row.status == FAIL and row.node != skew]
