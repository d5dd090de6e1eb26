"""Stall detection is on by default (issue 21, point 3): `wizard launch` without --stall-timeout gives the
supervisor DEFAULT_STALL_TIMEOUT_S, and a rank that goes silent before its first step is a stall after
exactly that long, as a rank that goes silent at step 1000 is. The real-process hang is in
functional/test_launch_supervisor.py."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from launch.commands import make_spec, register
from launch.logs import StreamCapture
from launch.rundir import DEFAULT_STALL_TIMEOUT_S, read_jsonl
from launch.supervisor import Supervisor, _Attempt


def _parse(*argv: str):
    parser = argparse.ArgumentParser(prog="wizard")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["launch", *argv])


def test_a_default_launch_has_stall_detection_on_and_0_turns_it_off(tmp_path):
    spec = make_spec(_parse("--", "train"), tmp_path, headless=True)
    assert spec.stall_timeout == DEFAULT_STALL_TIMEOUT_S == 2400
    assert make_spec(_parse("--stall-timeout", "0", "--", "train"), tmp_path, headless=True).stall_timeout is None
    assert make_spec(_parse("--stall-timeout", "90", "--", "train"), tmp_path, headless=True).stall_timeout == 90


def test_the_help_says_the_default_and_how_to_turn_it_off():
    parser = argparse.ArgumentParser(prog="wizard")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    text = " ".join(sub.choices["launch"].format_help().split())
    assert "(default: 2400 s = 40 min," in text and "0 turns stall detection off" in text
    assert "first step" in text


def _attempt(tmp_path, silent_for: float, printed_after_start: float):
    """An attempt of a default launch whose one rank wrote its start-up lines `printed_after_start` s
    after the attempt began and has been silent for `silent_for` s since."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = make_spec(_parse("--", "train"), run_dir, headless=True)
    sup = Supervisor(spec, out=None)
    att = _Attempt(sup, 1, None)
    now = time.time()
    last = now - silent_for
    att.started_at = last - printed_after_start
    cap = StreamCapture(1, None, clock=lambda: last)
    cap.feed(b"[rank1] starting: world_size=2\n")          # start-up output, then nothing: no step ever began
    att.ranks[1] = cap
    att._check_stall(spec.stall_timeout)
    return att, run_dir


@pytest.mark.parametrize("printed_after_start", [0.0, 5.0, 3000.0], ids=["at-start", "first-step", "much-later"])
def test_a_rank_silent_for_the_default_timeout_is_a_stall_wherever_it_went_silent(tmp_path, printed_after_start):
    att, run_dir = _attempt(tmp_path, DEFAULT_STALL_TIMEOUT_S + 5, printed_after_start)
    assert att.stalled
    stall = [e for e in read_jsonl(run_dir / "events.jsonl") if e["type"] == "stall"]
    assert len(stall) == 1 and stall[0]["timeout_s"] == DEFAULT_STALL_TIMEOUT_S and "rank 1" in stall[0]["silent"]
    assert json.loads((run_dir / "run.json").read_text())["stall_timeout_s"] == DEFAULT_STALL_TIMEOUT_S


def test_a_rank_silent_for_less_than_the_default_is_not_a_stall(tmp_path):
    att, _ = _attempt(tmp_path, DEFAULT_STALL_TIMEOUT_S - 60, 5.0)
    assert not att.stalled
