"""Issue 36 item 11: a Ctrl-C handled inside an object's __del__ (where Python prints "Exception ignored" and drops
what is raised) is raised in the frame the finaliser interrupted, at its next line, or in that frame's caller
when the finaliser ran on its last line; the thread's own trace function is put back."""

from __future__ import annotations

import sys

import pytest

from wizard.frontends.cli import frame_outside_finalisers, raise_when_it_goes_on

seen: list = []


class Finalised:
    def __del__(self):
        frame = sys._getframe()
        seen.append(frame_outside_finalisers(frame))
        raise_when_it_goes_on(seen[-1], KeyboardInterrupt("signal 2"))


def finaliser_mid_function(steps: list) -> None:
    Finalised()
    steps.append("went on")              # never runs: the interrupt comes first


def finaliser_on_the_last_line(steps: list) -> bool:
    return Finalised() is None           # returns before a next line: the caller's next line raises


def test_raised_at_the_interrupted_frames_next_line():
    steps: list = []
    unraisable: list = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(KeyboardInterrupt):
            finaliser_mid_function(steps)
    finally:
        sys.unraisablehook = hook
    assert steps == [] and unraisable == []
    assert seen[-1].f_code.co_name == "finaliser_mid_function"


def test_raised_in_the_caller_when_the_finaliser_ran_on_the_last_line():
    steps: list = []
    trace = sys.gettrace()
    with pytest.raises(KeyboardInterrupt):
        finaliser_on_the_last_line(steps)
        steps.append("went on")
    assert steps == [] and sys.gettrace() is trace


def test_outside_a_finaliser_the_frame_is_itself():
    frame = sys._getframe()
    assert frame_outside_finalisers(frame) is frame
