"""wizard.planning.fit.largest_fitting, the search behind the largest micro-batch and the longest sequence: on
slack functions of every shape a memory model can take, its answer is the brute-force edge of fitting, and it gets
there in few evaluations where the slack is smooth, never more than a bisection's order where it is not."""

from __future__ import annotations

import math

import pytest

from wizard.planning.fit import largest_fitting


def brute(slack, top: int) -> int:
    return max((k for k in range(1, top + 1) if slack(k) >= 0), default=0)


def counted(slack):
    calls = []

    def f(k):
        assert isinstance(k, int) and k >= 1, k
        calls.append(k)
        return slack(k)
    return f, calls


SHAPES = {
    "linear": lambda k: 1_000_003 - 997 * k,
    "quadratic (eager scores)": lambda k: 80_000_000 - 3_000 * k - 7 * k * k,
    "steps (whole layers)": lambda k: 5_000 - 300 * ((k + 4) // 5),
    "flat then cliff": lambda k: 10 if k <= 777 else -1,
    "fixed part then linear": lambda k: 2_000_000 - (1_500_000 + 13 * k),
    "fits nothing": lambda k: -5 - k,
    "fits exactly one": lambda k: 1 - k,
    "fits everything": lambda k: 100,
    "zero slack at the edge": lambda k: 4_096 - 16 * k,
    "concave": lambda k: 1_000_000 - int(5_000 * math.sqrt(k)),
}


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("top", [1, 2, 1000, 40_000])
def test_the_answer_is_the_brute_force_edge(name, top):
    f, calls = counted(SHAPES[name])
    assert largest_fitting(f, top) == brute(SHAPES[name], top)
    assert all(1 <= k <= top for k in calls)


@pytest.mark.parametrize("name", ["linear", "quadratic (eager scores)", "fixed part then linear",
                                  "zero slack at the edge"])
def test_a_smooth_slack_takes_a_handful_of_evaluations(name):
    f, calls = counted(SHAPES[name])
    largest_fitting(f, 1 << 27)
    assert len(calls) <= 8, calls


@pytest.mark.parametrize("edge", [1, 2, 3, 1000, 123_457, (1 << 27) - 1, 1 << 27])
def test_a_cliff_anywhere_is_found_within_a_bisections_order(edge):
    """No slope to follow (the slack says nothing until it falls off): doubling, then bisection with secant
    steps that cannot mislead it by more than a factor."""
    top = 1 << 27
    f, calls = counted(lambda k: 1 if k <= edge else -1)
    assert largest_fitting(f, top) == edge
    assert len(calls) <= 3 * (math.ceil(math.log2(top)) + 1), len(calls)


def test_nothing_fits_costs_one_evaluation():
    f, calls = counted(lambda k: -1)
    assert largest_fitting(f, 1 << 20) == 0 and calls == [1]
