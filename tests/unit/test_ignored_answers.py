"""A given answer whose question does not apply to the plan (one machine, a backend the plan did not choose) is
named in the plan's notes instead of vanishing; answers that do apply are not named."""

from __future__ import annotations

from wizard import pipeline
from wizard.pipeline import Request


def _build(given, assume="8xA100-80GB"):
    return pipeline.build(Request(assume=assume, output_dir="/tmp/unused", plan_only=True,
                                  given={"params": "7B", **given}))


def _notes(result):
    return [n for n in result.plan.notes if n.startswith("Given but not used")]


def test_a_multi_machine_flag_on_one_machine_is_named():
    notes = _notes(_build({"inter_node_gbps": 100}))
    assert len(notes) == 1 and "--inter-node-gbps" in notes[0]


def test_a_backend_detail_the_plan_did_not_choose_is_named():
    # backend auto: the plan chooses; an FSDP detail given for a plan that chose DeepSpeed or DDP does nothing.
    result = _build({"fsdp_reshard_after_forward": False})
    notes = _notes(result)
    assert result.plan.choice.backend != "fsdp"
    assert len(notes) == 1 and "--fsdp-reshard-after-forward" in notes[0]


def test_answers_that_apply_are_not_named():
    assert _notes(_build({"inter_node_gbps": 100}, assume="8xA100-80GB,nodes=2")) == []
    assert _notes(_build({"seq_len": 4096, "micro_batch": 2})) == []
