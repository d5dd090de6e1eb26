"""Issue 36, items 2 and 8: the processes, machines and GPUs a config asks for.

Item 2: `num_processes: 0` (also -2, and `num_machines: 0`) passed `wizard check` with "No problems found", and
`wizard launch` then showed torchrun's AssertionError. accelerate's loader and launch checks let these numbers
through (its own verdict on -1 stays its own, ACC-LAUNCH-REJECTS); ACC-COUNT-OUT-OF-RANGE names the key and the
values allowed.

Item 8: a config for 8 GPUs checked (or launched) on a machine without any said nothing. The probe of this machine
against the config is the decision `wizard preflight` makes for each node (wizard/check/gpu_fit.py): a warning for
a GPU config where there is no GPU (the config may be right for the machines it is for: check often runs on a
login node), an error for fewer GPUs than processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from wizard.check.doctor import build_context, run_rules
from wizard.probe.hardware import Hardware, assume

DDP = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "gpu_ids": "all", "machine_rank": 0,
       "main_process_ip": "10.0.0.1", "main_process_port": 29555, "main_training_function": "main",
       "mixed_precision": "no", "num_machines": 1, "num_processes": 2, "use_cpu": False}
NO_GPU_HERE = Hardware(gpus=[], gpu_reason="test: no driver", source="probe", cpu_cores=2)


def findings(tmp_path: Path, hardware=None, plan: dict | None = None, **changes) -> list:
    cfg = tmp_path / "default_config.yaml"
    cfg.write_text(yaml.safe_dump({**DDP, **changes}))
    if plan is not None:
        (tmp_path / "wizard_plan.json").write_text(json.dumps(plan))
    ctx = build_context(config_file=str(cfg), hardware=hardware, versions={}, use_default_config=False,
                        port_in_use=lambda port: False)
    return run_rules(ctx)


def of(found: list, rule: str) -> list:
    return [f for f in found if f.rule == rule]


@pytest.mark.parametrize("changes, key, allowed", [
    ({"num_processes": 0}, "num_processes", "1 or more"),
    ({"num_processes": -2}, "num_processes", "1 or more"),
    ({"num_machines": 0}, "num_machines", "1 or more"),
    ({"num_machines": 2, "num_processes": 4, "machine_rank": 2}, "machine_rank", "0 to 1"),
    ({"num_machines": 2, "num_processes": 4, "machine_rank": -1}, "machine_rank", "0 to 1"),
    ({"main_process_port": 70000}, "main_process_port", "1 to 65535"),
    ({"main_process_port": -5}, "main_process_port", "1 to 65535"),
])
def test_a_count_accelerate_lets_through_but_torchrun_cannot_use_is_an_error_naming_key_and_values(
        tmp_path, changes, key, allowed):
    found = findings(tmp_path, **changes)
    [f] = of(found, "ACC-COUNT-OUT-OF-RANGE")
    assert (f.severity, f.key) == ("error", key) and allowed in f.fix and f.fix.startswith(f"{key}: ")


@pytest.mark.parametrize("changes", [{}, {"num_machines": 2, "num_processes": 4, "machine_rank": 1},
                                     {"main_process_port": 0}, {"main_process_port": 65535}])
def test_counts_in_range_are_fine(tmp_path, changes):
    assert not of(findings(tmp_path, **changes), "ACC-COUNT-OUT-OF-RANGE")


def test_minus_one_process_is_accelerates_own_verdict(tmp_path):
    found = findings(tmp_path, num_processes=-1)
    assert not of(found, "ACC-COUNT-OUT-OF-RANGE")
    assert any("--num_processes" in f.message for f in of(found, "ACC-LAUNCH-REJECTS"))


def test_a_gpu_config_on_this_machine_without_gpus_is_a_warning_that_says_where_it_would_run(tmp_path):
    found = findings(tmp_path, hardware=NO_GPU_HERE, num_processes=8)
    [f] = of(found, "ACC-NUM-PROCESSES-EXCEEDS-GPUS")
    assert f.severity == "warning" and f.key == "num_processes"
    assert "no GPU" in f.message and "8 ranks on 2 CPU cores" in f.message and "on the CPU over gloo" in f.message
    assert "login node" in f.message and "--assume" in f.message          # how to check it for the GPU machines
    assert [g.severity for g in found if g.severity == "error"] == []       # exit 0: fine to run on a login node


@pytest.mark.parametrize("case", ["use_cpu", "multi_cpu", "plan_cpu_only", "assumed", "files_alone", "plain_single"])
def test_no_gpu_warning_only_for_a_gpu_config_on_this_machine(tmp_path, case):
    """CPU processes legitimately run without GPUs (use_cpu, MULTI_CPU, and the wizard's DeepSpeed CPU config,
    which keeps use_cpu: false and says cpu_only in the plan beside it); a check for another machine (--assume) or
    of the files alone knows nothing of this one; accelerate's plain one-process config runs anywhere."""
    args: dict = {"hardware": NO_GPU_HERE}
    if case == "use_cpu":
        args.update(use_cpu=True, distributed_type="MULTI_CPU")
    elif case == "multi_cpu":
        args.update(distributed_type="MULTI_CPU")
    elif case == "plan_cpu_only":
        args.update(distributed_type="DEEPSPEED", plan={"plan": {"cpu_only": True}})
    elif case == "assumed":
        args.update(hardware=assume("2xA100-80GB"))
    elif case == "files_alone":
        args.update(hardware=None)
    else:
        args.update(distributed_type="NO", num_processes=1)
    assert not of(findings(tmp_path, **args), "ACC-NUM-PROCESSES-EXCEEDS-GPUS")


def test_gpu_ids_listing_fewer_gpus_than_processes_is_an_error_on_any_machine(tmp_path):
    """The file contradicts itself: 4 processes on the 2 GPUs gpu_ids leaves visible, whatever the machine."""
    [f] = of(findings(tmp_path, gpu_ids="0,1", num_processes=4), "ACC-NUM-PROCESSES-EXCEEDS-GPUS")
    assert f.severity == "error" and "gpu_ids lists 2" in f.message


def test_fewer_gpus_here_than_processes_is_an_error(tmp_path):
    import dataclasses
    here = dataclasses.replace(assume("4xA100-80GB"), source="probe")
    [f] = of(findings(tmp_path, hardware=here, num_processes=8), "ACC-NUM-PROCESSES-EXCEEDS-GPUS")
    assert f.severity == "error" and "8 processes per machine" in f.message and "num_processes 4" in f.fix


def test_preflight_and_check_share_the_gpu_decision():
    """One decision (check/gpu_fit.py): preflight's GPUs row says what check's finding says, in a node's words."""
    from wizard.check.gpu_fit import gpu_fit
    from wizard.preflight import checks

    exp = checks.Expectation(config_file=None, num_machines=1, processes_per_node=8, uses_gpus=True, main_ip=None,
                             main_port=None)
    (row,) = checks.gpu_rows(0, "n1", exp, {"gpus": {"gpus": [], "reason": "no driver"}})
    assert row.status == checks.WARN and gpu_fit(8, 1, True, 0, None, place="node").problem in row.detail
