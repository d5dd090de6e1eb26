"""The rung table (wizard.planning.rungs) is the one home of a rung: the planner, the files written for a rung,
the check rule that maps files back to a rung, launch's OOM advice and the TUI's labels all agree with it."""

from __future__ import annotations

import ast
import pathlib

import pytest

from launch import classify
from tests.plans import LLAMA2_7B
from wizard.check.rules.common import CheckContext
from wizard.check.rules.hardware_plan import configured_rung_key
from wizard.config import emit
from wizard.frontends.session import strategy_for_rung
from wizard.frontends.tui.widgets.memory_bar import short_name
from wizard.planning import rungs
from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions, make_plan
from wizard.probe.hardware import GPU, Hardware
from wizard.units import GiB

ROOT = pathlib.Path(__file__).resolve().parents[2]


def hardware(n: int = 4) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name="GPU", memory_total=80 * GiB, bf16=True, compute_capability=(9, 0))
                          for i in range(n)], ram_total=2048 * GiB, ram_available=2048 * GiB, nvme_path="/nvme",
                    disk_free_nvme=10_000 * GiB, source="assume:test")


def plan_with(key: str, method: str = "full", world: int = 4):
    """A real plan whose ladder holds `key`, chosen by hand (as the TUI's pick does)."""
    spec = rungs.BY_KEY[key]
    flags = {k: v for k, v in spec.flags().items() if v is not None}
    strategy = StrategyOptions(backend=flags["backend"], zero_stage=flags.get("zero_stage", "auto"),
                               offload=flags.get("offload", "auto"), nvme_path="/nvme")
    plan = make_plan(hardware(world), LLAMA2_7B, TrainingOptions(method=method), strategy,
                     Topology(processes_per_machine=world))
    plan.choice = next(r for r in plan.rungs if r.key == key)
    return plan


def files_for(key: str, world: int = 4) -> tuple[dict, dict | None]:
    plan = plan_with(key, world=world)
    answers = {"nvme_path": "/nvme"}
    ds = emit.deepspeed_config(answers, plan, LLAMA2_7B)
    return emit.accelerate_config(answers, plan, "/cfg/ds_config.json" if ds else None, LLAMA2_7B), ds


ALL_KEYS = [r.key for r in rungs.RUNGS]


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_entry_is_selected_by_its_own_flags_and_named_by_its_label(key):
    world = 1 if key == "single" else 4
    plan = plan_with(key, world=world)
    rung = plan.choice
    spec = rungs.BY_KEY[key]
    assert (rung.backend, rung.zero_stage, rung.offload_optimizer, rung.offload_param, rung.fsdp_reshard) == \
        (spec.backend, spec.zero_stage, spec.offload_optimizer, spec.offload_param, spec.fsdp_reshard)
    assert rung.name == spec.label
    assert short_name(rung).startswith(spec.short)
    assert strategy_for_rung(key) == spec.flags()


@pytest.mark.parametrize("key", ALL_KEYS)
def test_the_files_written_for_a_rung_are_recognised_as_that_rung(key):
    """emit writes a rung; the check rule (through CheckContext) and launch (from the raw files) read it back."""
    world = 1 if key == "single" else 4
    acc, ds = files_for(key, world)
    assert classify.current_rung_key(acc, ds) == key
    ctx = CheckContext(acc=acc, ds=ds)
    found = configured_rung_key(ctx)
    assert found is not None and found[0] == key
    assert found[1] == rungs.BY_KEY[key].flags()["backend"]


def test_launch_names_and_commands_come_from_the_table():
    for spec in rungs.RUNGS:
        if spec.oom_next is None:
            continue
        acc, ds = files_for(spec.key, 1 if spec.key == "single" else 4)
        name, cmd = classify.suggest_for_cuda_oom(None, acc, ds)
        after = rungs.BY_KEY[spec.oom_next]
        assert name == after.label
        assert cmd == " ".join(["wizard", "--non-interactive"] + after.cli_flags())


def test_an_oom_goes_to_a_rung_with_more_memory_saved():
    """Without a saved plan launch follows oom_next: always more sharding or more offload, never a loop."""
    for spec in rungs.RUNGS:
        seen, key = set(), spec.key
        while key is not None:
            assert key not in seen
            seen.add(key)
            key = rungs.BY_KEY[key].oom_next


def test_every_entry_says_why_it_is_there():
    for spec in rungs.RUNGS:
        assert spec.why and spec.short and spec.label


# The compound keys: "zero2", "ddp" are also the words of other vocabularies (sizing strategies, backends).
RUNG_KEY_LITERALS = {k for k in ALL_KEYS if "-" in k}


def test_no_module_outside_the_table_spells_a_rung_key():
    """The copies that drifted (classify's "fsdp", memory_bar's short names, the check rule's key mapping) are gone:
    no source file but the table holds a rung key as a string literal."""
    offenders = []
    for path in list((ROOT / "wizard").rglob("*.py")) + list((ROOT / "launch").rglob("*.py")):
        if path.name == "rungs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in RUNG_KEY_LITERALS:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders
