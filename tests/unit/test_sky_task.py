"""The SkyPilot task (issue 40) as SkyPilot reads it, what it asks for per node, and `wizard check --sky-task`'s
rules (SKY-NODES, SKY-GPUS, SKY-LAUNCH: each one's trigger and a clean task). Plus the relocatable config set at
accelerate's end: a relative deepspeed_config_file is opened against the launch's directory (each rank's cwd),
whatever the version (CI runs this at both ends of the tested range)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.skypilot import parse_tasks
from wizard.config import sky_task

GiB = 2**30
PLAN = {"plan": {"choice": {"key": "zero3_offload", "cpu_bytes": 600 * GiB, "per_gpu_bytes": 60 * GiB,
                            "offload_optimizer": "cpu", "offload_param": "none"},
                 "rungs": [{"key": "zero3_offload", "nvme_bytes": 0}],
                 "checkpoint": {"bytes": 900 * GiB, "per_node_bytes": 450 * GiB, "keep": 2, "total_bytes": 1800 * GiB,
                                "per_node_total_bytes": 900 * GiB, "parts": 16}},
        "model": {"params": 70 * 10**9, "weights_dtype_bytes": 2}}


def inputs(tmp_path: Path, **kw) -> sky_task.TaskInputs:
    base = dict(machine="2x8xH100-80GB", accelerators=("H100", "H100-SXM"), gpus_per_node=8, nodes=2,
                workdir=str(tmp_path), config_ref="cfg/default_config.yaml", script="train.py",
                script_args=["--steps", "4", "it's"], plan=PLAN, pins=["accelerate==1.16.0", "torch==2.13.0"],
                sources={"wizard": str(tmp_path)}, secret="ab" * 32)
    base.update(kw)
    return sky_task.TaskInputs(**base)


def test_disk_holds_the_plans_checkpoints_the_weights_and_the_environment():
    disk = sky_task.disk_request(PLAN)
    expected = 900 + 70e9 * 2 / GiB + sky_task.ENVIRONMENT_GIB
    assert disk.gib == int(expected) + 1
    assert any("checkpoints on this node" in line for line in disk.lines)
    small = {"plan": {"choice": {}}, "model": {"params": 10**6}}
    assert sky_task.disk_request(small).gib == sky_task.SKY_DEFAULT_DISK_GIB
    assert any("not sized" in line for line in sky_task.disk_request(small).lines)


def test_skypilot_parses_the_task_and_reads_the_plans_machine(tmp_path):
    one = tmp_path / "one.yaml"
    one.write_text(sky_task.render(inputs(tmp_path, machine="1xL4-24GB", accelerators=("L4",), gpus_per_node=1,
                                          nodes=1, secret=None, plan={"plan": {"choice": {"cpu_bytes": 4 * GiB}},
                                                                      "model": {"params": 8 * 10**9}})))
    two = tmp_path / "two.yaml"
    two.write_text(sky_task.render(inputs(tmp_path)))
    parsed = parse_tasks([one, two], tmp_path / "home")
    a, b = parsed[str(one)], parsed[str(two)]
    assert a["num_nodes"] == 1 and [r["accelerators"] for r in a["resources"]] == [{"L4": 1}]
    assert a["secrets"] == [] and "--preflight" not in a["run"] and "SKYPILOT_NODE_IPS" not in a["run"]
    assert b["num_nodes"] == 2
    assert sorted(json.dumps(r["accelerators"]) for r in b["resources"]) == ['{"H100": 8}', '{"H100-SXM": 8}']
    from wizard.host_memory import memory_request
    assert {r["memory"] for r in b["resources"]} == {f"{memory_request(PLAN, 8, True).gib}+"}
    assert {r["disk_size"] for r in b["resources"]} == {sky_task.disk_request(PLAN).gib}
    assert b["secrets"] == [sky_task.SECRET_ENV] and b["workdir"] == str(tmp_path)
    words = sky_task.launch_words(b["run"])
    assert words[:4] == ["python3", "-m", "wizard", "launch"] and "--preflight" in words
    assert words[words.index("--machine-rank") + 1] == "$SKYPILOT_NODE_RANK"
    assert words[words.index("--main-process-ip") + 1] == "$MAIN_ADDR" and sky_task.MAIN_ADDR_LINE in b["run"]
    assert words[words.index("--") + 1:] == ["train.py", "--steps", "4", "it's"]
    assert "accelerate==1.16.0" in b["setup"]


def _check(tmp_path: Path, task_text: str, acc: dict) -> list:
    from wizard.check.doctor import build_context, run_rules
    cfg = tmp_path / "cfg"
    cfg.mkdir(exist_ok=True)
    (cfg / "default_config.yaml").write_text(json.dumps(acc))
    path = tmp_path / "sky.yaml"
    path.write_text(task_text)
    ctx = build_context(config_file=str(cfg / "default_config.yaml"), sky_task=str(path), versions={})
    return [f for f in run_rules(ctx, only={"SKY-NODES", "SKY-GPUS", "SKY-LAUNCH"})]


ACC = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_machines": 2,
       "num_processes": 16, "machine_rank": 0, "main_process_ip": "127.0.0.1", "main_process_port": 29500,
       "mixed_precision": "bf16", "use_cpu": False, "gpu_ids": "all", "rdzv_backend": "static", "same_network": True}


def test_check_finds_a_clean_task_clean_and_names_each_defect(tmp_path):
    clean = sky_task.render(inputs(tmp_path))
    assert _check(tmp_path, clean, ACC) == []
    nodes = _check(tmp_path, clean.replace("num_nodes: 2", "num_nodes: 1"), ACC)
    assert [f.rule for f in nodes] == ["SKY-NODES"] and nodes[0].severity == "error"
    gpus = _check(tmp_path, clean.replace("H100-SXM: 8", "H100-SXM: 4"), ACC)
    assert [f.rule for f in gpus] == ["SKY-GPUS"] and "H100-SXM:4" in gpus[0].message
    assert [f.rule for f in _check(tmp_path, clean.replace("  accelerators:\n    H100: 8\n    H100-SXM: 8\n", ""),
                                   ACC)] == ["SKY-GPUS"]
    rank = _check(tmp_path, clean.replace(sky_task.RANK_FLAG, "--machine-rank 0"), ACC)
    assert [f.rule for f in rank] == ["SKY-LAUNCH"] and "SKYPILOT_NODE_RANK" in rank[0].message
    other = _check(tmp_path, clean.replace("cfg/default_config.yaml", "other/default_config.yaml"), ACC)
    assert [f.rule for f in other] == ["SKY-LAUNCH"] and "other/default_config.yaml" in other[0].message
    none = _check(tmp_path, clean.replace("python3 -m wizard launch", "accelerate launch"), ACC)
    assert [f.rule for f in none] == ["SKY-LAUNCH"] and "no `wizard launch`" in none[0].message
    # one node, no address needed; a CPU config asks for no GPU
    one = sky_task.render(inputs(tmp_path, nodes=1, gpus_per_node=16, accelerators=("H100",), secret=None))
    assert _check(tmp_path, one, {**ACC, "num_machines": 1}) == []
    cpu = sky_task.render(inputs(tmp_path, nodes=2, gpus_per_node=1, accelerators=("L4",)))
    assert _check(tmp_path, cpu, {**ACC, "distributed_type": "MULTI_CPU", "use_cpu": True}) == []


def test_a_task_that_is_not_a_mapping_is_bad_input(tmp_path):
    from wizard.errors import InputError
    with pytest.raises(InputError) as exc:
        _check(tmp_path, "- just\n- a list\n", ACC)
    assert exc.value.field == "sky-task"


def test_accelerate_opens_a_relative_deepspeed_config_against_the_launch_directory(tmp_path, monkeypatch):
    """The relocatable set's premise, at the installed accelerate: `accelerate launch` exports the YAML's
    deepspeed_config_file as it is (ACCELERATE_DEEPSPEED_CONFIG_FILE) and each rank's DeepSpeedPlugin opens it with
    os.path.exists/open, so a path relative to the workdir works from the workdir (DeepSpeed itself is given the
    dict) and from nowhere else."""
    from accelerate.utils import DeepSpeedPlugin
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                                                    "gradient_accumulation_steps": 1,
                                                    "zero_optimization": {"stage": 2}}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", os.path.join("cfg", "ds_config.json"))
    monkeypatch.chdir(tmp_path)
    assert DeepSpeedPlugin().hf_ds_config.config["zero_optimization"]["stage"] == 2
    monkeypatch.chdir(cfg)
    with pytest.raises(ValueError, match="existing deepspeed config"):
        DeepSpeedPlugin()


def test_setup_pins_the_libraries_installed_here(monkeypatch):
    from importlib import metadata

    from wizard.frontends import sky_write
    pins = sky_write.pins(None, None)
    assert f"accelerate=={metadata.version('accelerate')}" in pins
    assert f"torch=={metadata.version('torch').split('+')[0]}" in pins and not any("+" in p for p in pins)
    assert not any(p.startswith("bitsandbytes") for p in pins)
    assert any(p.startswith("bitsandbytes") for p in sky_write.pins("qlora", None))

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(sky_write.metadata, "requires", not_installed)
    assert f"deepspeed=={metadata.version('deepspeed')}" in sky_write.pins(None, None)
