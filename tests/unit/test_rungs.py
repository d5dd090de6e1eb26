"""The rung table (wizard.planning.rungs) is the one home of a rung: the planner, the files written for a rung,
the check rule that maps files back to a rung, launch's OOM advice and the TUI's labels all agree with it."""

from __future__ import annotations

import ast
import pathlib
from dataclasses import replace

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
    # A context- or sequence-parallel rung is the ladder when its size is given (StrategyOptions.cp_size / sp_size),
    # within a machine; Ulysses over 64 GPUs needs 64 heads.
    strategy = StrategyOptions(backend=flags["backend"], zero_stage=flags.get("zero_stage", "auto"),
                               offload=flags.get("offload", "auto"), nvme_path="/nvme",
                               cp_size=spec.cp_size if spec.cp_size > 1 else None,
                               sp_size=spec.sp_size if spec.sp_size > 1 else None)
    seq = 131072 if spec.splits_sequence else TrainingOptions().seq_len
    world = max(world, spec.seq_shards)
    model = replace(LLAMA2_7B, heads=64, kv_heads=64) if spec.sp_size > 32 else LLAMA2_7B
    # HSDP is on the ladder with two machines or more
    plan = make_plan(hardware(world), model, TrainingOptions(method=method, seq_len=seq), strategy,
                     Topology(num_machines=2 if spec.replicate else 1, processes_per_machine=world))
    plan.choice = next(r for r in plan.rungs if r.key == key)
    return plan


def files_for(key: str, world: int = 4) -> tuple[dict, dict | None]:
    plan = plan_with(key, world=world)
    answers = {"nvme_path": "/nvme", "main_process_ip": "10.0.0.1", "main_process_port": 29500}
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


# --- Every rung says why it is there; one GPU; like with like (issue 19) ----------------------------------

def _cli_plan(*args: str) -> dict:
    import contextlib
    import io
    import json

    from wizard.frontends.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["plan", *args, "--json"])
    return json.loads(out.getvalue())["plan"]


def _keys(plan: dict) -> list[str]:
    return [r["key"] for r in plan["rungs"]]


def test_one_gpu_walks_only_rungs_that_hold_something_off_the_gpu():
    """On one GPU ZeRO-3, FSDP and ZeRO-3 + optimizer offload partition nothing: the walk leaves them out. ZeRO-2
    stays for LoRA / QLoRA, whose entry says why; explicit choices are kept."""
    full = _cli_plan("--params", "7B", "--assume", "1xA100-40GB,ram=256G")
    assert _keys(full) == ["single", "zero2-offload-opt", "zero3-offload-all", "zero3-nvme"]
    qlora = _cli_plan("--params", "8B", "--assume", "1xRTX4090,ram=128G", "--method", "qlora")
    assert _keys(qlora) == ["single", "zero2", "zero3-offload-all", "fsdp-offload"]
    eight = _cli_plan("--params", "7B", "--assume", "8xA100-40GB,ram=256G")
    assert "zero3" in _keys(eight) and "zero3-offload-opt" in _keys(eight)
    asked = _cli_plan("--params", "7B", "--assume", "1xA100-40GB,ram=256G", "--backend", "deepspeed",
                      "--zero-stage", "3")
    assert _keys(asked) == ["zero3", "zero3-offload-opt", "zero3-offload-all", "zero3-nvme"]
    assert _keys(_cli_plan("--params", "7B", "--assume", "1xA100-40GB,ram=256G", "--backend", "fsdp")) == \
        ["fsdp-noreshard", "fsdp-reshard", "fsdp-offload"]
    for plan in (full, qlora, eight, asked):
        assert all(r["why"] for r in plan["rungs"])
    by_key = {r["key"]: r for r in qlora["rungs"]}
    assert by_key["zero2"]["why"].startswith("one GPU: nothing to partition")
    assert {r["key"]: r for r in eight["rungs"]}["zero2"]["why"] == rungs.BY_KEY["zero2"].why


def test_the_one_gpu_reasons_are_true():
    """ZeRO-2 on one GPU holds less than one GPU without DeepSpeed for QLoRA (its stated why) and not for full
    fine-tuning (why the walk leaves it out there); ZeRO-3 + optimizer offload holds no less than ZeRO-2's."""
    def per_gpu(plan: dict, key: str) -> int:
        return next(r["per_gpu_bytes"] for r in plan["rungs"] if r["key"] == key)

    qlora = _cli_plan("--params", "8B", "--assume", "1xRTX4090,ram=128G", "--method", "qlora",
                      "--gradient-checkpointing", "on")
    assert per_gpu(qlora, "zero2") < per_gpu(qlora, "single")
    one = ["--params", "7B", "--assume", "1xA100-40GB,ram=256G", "--gradient-checkpointing", "on"]
    single = _cli_plan(*one)
    stage2 = _cli_plan(*one, "--backend", "deepspeed", "--zero-stage", "2")
    stage3 = _cli_plan(*one, "--backend", "deepspeed", "--zero-stage", "3")
    assert per_gpu(stage2, "zero2") >= per_gpu(single, "single")
    assert per_gpu(stage3, "zero3") >= per_gpu(single, "single")
    assert per_gpu(stage3, "zero3-offload-opt") >= per_gpu(stage2, "zero2-offload-opt")


def test_a_ladder_that_mixes_gc_settings_shows_every_rung_with_gc_too():
    """70B on 8xH100 at seq 1920: ZeRO-3 + optimizer offload needs GC, the parameter-offload rung fits without it
    and so reads as needing more memory. Each rung without GC carries its figure with GC, and at like settings
    more offload never needs more memory."""
    import contextlib
    import io

    from wizard.frontends.cli import main

    args = ["--params", "70B", "--assume", "8xH100-80GB,ram=4T", "--seq-len", "1920"]
    plan = _cli_plan(*args)
    by_key = {r["key"]: r for r in plan["rungs"]}
    opt, everything = by_key["zero3-offload-opt"], by_key["zero3-offload-all"]
    assert opt["gradient_checkpointing"] and not everything["gradient_checkpointing"]
    assert everything["per_gpu_bytes"] > opt["per_gpu_bytes"]              # the mismatch the issue saw
    assert everything["per_gpu_bytes_gc"] < opt["per_gpu_bytes"]            # like with like: less
    with_gc = [r["per_gpu_bytes"] if r["gradient_checkpointing"] else r["per_gpu_bytes_gc"]
               for r in plan["rungs"] if r["key"] in ("zero3", "zero3-offload-opt", "zero3-offload-all")]
    assert with_gc == sorted(with_gc, reverse=True)
    assert all(r["per_gpu_bytes_gc"] is None for r in plan["rungs"] if r["gradient_checkpointing"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["plan", *args])
    from wizard.units import fmt_bytes
    assert f"with gradient checkpointing: {fmt_bytes(everything['per_gpu_bytes_gc'])} per GPU" in out.getvalue()
    # with GC forced either way there is nothing to compare
    forced = _cli_plan(*args, "--gradient-checkpointing", "off")
    assert all(r["per_gpu_bytes_gc"] is None for r in forced["rungs"])
