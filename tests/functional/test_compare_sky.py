"""Rent and run (issue 40): `wizard compare --write MACHINE -- SCRIPT` writes a relocatable config set and a SkyPilot
task that SkyPilot parses, whose machine is the plan's and whose `run` starts a supervised `wizard launch` with each
node's rank; the `run` itself trains two nodes on this machine with SkyPilot's variables set; `--prices skypilot`
prices rows from SkyPilot's catalogues and names the offer; every row trains one global batch; a row that does not
fit names the closest rung and measure exactly as `wizard plan` does, on every row of the issue's five jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.launch_support import env as launch_env
from tests.launch_support import outputs_of
from tests.skypilot import parse_tasks
from wizard import compare as compare_mod
from wizard.config import sky_task
from wizard.frontends.cli import main
from wizard.host_memory import memory_request
from wizard.probe import catalogue

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
SKY_FIXTURE = ROOT / "tests" / "fixtures" / "skypilot"
TRAIN = ROOT / "examples" / "train.py"

# The two machines: an 8B LoRA on one cheap card, a 70B full fine-tune on 2 x 8 H100.
WRITES = {
    "8b-lora-1xL4": (["--model", str(MODELS / "llama-3.1-8b"), "--method", "lora"], "1xL4-24GB"),
    "70b-full-2x8xH100": (["--model", str(MODELS / "llama-3-70b")], "2x8xH100-80GB"),
}


def run(args, cwd, extra_env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env={**os.environ, **(extra_env or {})})


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Each case's project directory after `wizard compare --write MACHINE --output-dir cfg -- train.py --steps 4`."""
    out = {}
    here = os.getcwd()
    for case, (flags, machine) in WRITES.items():
        proj = tmp_path_factory.mktemp(case)
        shutil.copy(TRAIN, proj / "train.py")
        os.chdir(proj)                     # in-process: the libraries validate every set once imported
        try:
            code = main(["compare", *flags, "--write", machine, "--output-dir", "cfg", "--", "train.py", "--steps", "4"])
        finally:
            os.chdir(here)
        assert code == 0 and (proj / "cfg" / "sky.yaml").is_file(), case
        out[case] = proj
    return out


def test_the_set_is_relocatable_and_the_task_is_the_plans_machine(written, capsys, monkeypatch):
    for case, proj in written.items():
        machine = compare_mod.machine(WRITES[case][1])
        cfg = proj / "cfg"
        assert sorted(p.name for p in cfg.iterdir()) == sorted(
            ["default_config.yaml", "wizard_plan.json", "sky.yaml"] + (["ds_config.json"] if
                                                                      (cfg / "ds_config.json").exists() else []))
        # nothing in the config set names a path of this machine
        for name in ("default_config.yaml", "ds_config.json"):
            if (cfg / name).exists():
                assert str(proj) not in (cfg / name).read_text() and "/tmp" not in (cfg / name).read_text(), name
        acc = yaml.safe_load((cfg / "default_config.yaml").read_text())
        plan = json.loads((cfg / "wizard_plan.json").read_text())
        if acc["distributed_type"] == "DEEPSPEED":
            assert acc["deepspeed_config"]["deepspeed_config_file"] == "cfg/ds_config.json"
            if acc["num_machines"] > 1:
                assert acc["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
        task = yaml.safe_load((cfg / "sky.yaml").read_text())
        assert (cfg / "sky.yaml").stat().st_mode & 0o077 == 0          # it holds the nodes' secret
        per_node = acc["num_processes"] // acc["num_machines"]
        assert task["num_nodes"] == acc["num_machines"] == plan["plan"]["num_machines"] == machine.nodes
        assert per_node * task["num_nodes"] == plan["plan"]["world_size"] == machine.gpus
        names = catalogue.skypilot_names(catalogue.by_name(machine.gpu_names[0]))
        accel = task["resources"]["accelerators"]
        assert (accel == f"{names[0]}:{per_node}" if len(names) == 1 else accel == {n: per_node for n in names})
        need = memory_request(plan, per_node, True)
        assert task["resources"]["memory"] == f"{need.gib}+" and need.plan_gib * 2**30 >= plan["plan"]["choice"][
            "cpu_bytes"] - 1
        assert task["resources"]["disk_size"] == sky_task.disk_request(plan).gib
        assert task["workdir"] == str(proj)
        words = sky_task.launch_words(task["run"])
        assert words[words.index("--config-file") + 1] == "cfg/default_config.yaml"
        assert words[words.index("--machine-rank") + 1] == "$SKYPILOT_NODE_RANK"
        assert ("--preflight" in words) == (machine.nodes > 1) == (sky_task.SECRET_ENV in (task.get("secrets") or {}))
        assert words[-3:] == ["train.py", "--steps", "4"]
        assert re.search(r"accelerate==\d", task["setup"]) and re.search(r"torch==\d", task["setup"])
        # `wizard check` judges the task against the config (and the set, from another directory)
        monkeypatch.chdir("/")
        capsys.readouterr()
        code = main(["check", "--config-file", str(cfg / "default_config.yaml"), "--sky-task", str(cfg / "sky.yaml"),
                     "--assume", machine.assume.split(",")[0], "--json"])
        out = capsys.readouterr().out
        found = json.loads(out)
        assert code == 0 and not [f for f in found if f["severity"] == "error"], out


def test_skypilot_parses_the_written_tasks(written, tmp_path):
    tasks = {case: proj / "cfg" / "sky.yaml" for case, proj in written.items()}
    parsed = parse_tasks(list(tasks.values()), tmp_path / "home")
    for case, path in tasks.items():
        t = parsed[str(path)]
        machine = compare_mod.machine(WRITES[case][1])
        assert t["num_nodes"] == machine.nodes
        counts = {n for r in t["resources"] for n in r["accelerators"].values()}
        assert counts == {machine.gpus // machine.nodes}
        assert {name for r in t["resources"] for name in r["accelerators"]} == set(
            catalogue.skypilot_names(catalogue.by_name(machine.gpu_names[0])))
        assert t["workdir"] == str(written[case]) and "-m wizard launch" in t["run"]


def test_write_refuses_a_task_it_cannot_carry(tmp_path):
    proj = tmp_path / "p"
    proj.mkdir()
    shutil.copy(TRAIN, proj / "train.py")
    base = ["compare", "--params", "1M", "--hidden-size", "64", "--layers", "2", "--vocab-size", "128"]
    for extra, field in ((["--write", "1xL4", "--output-dir", str(tmp_path / "out"), "--", "train.py"], "output-dir"),
                         (["--write", "1xL4", "--", "missing.py"], "write"),
                         (["--write", "8xH800-80GB", "--", "train.py"], "write"),
                         (["--write", "2x8xH100-80GB", "--deepspeed-multinode-launcher", "pdsh", "--", "train.py"],
                          "deepspeed-multinode-launcher"),
                         (["--", "train.py"], "write"),
                         (["--write", "1xL4", "--sky-task", "sky.yaml"], "sky-task")):
        r = run([*base, *extra], proj)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and field in lines[0], (extra, r.stderr)
    assert sorted(p.name for p in proj.iterdir()) == ["train.py"] and not (tmp_path / "out").exists()


def test_prices_from_skypilots_catalogues_name_the_cheapest_offer(tmp_path):
    machines = "1xL4-24GB,1xA10G-24GB,1xRTX4090-24GB,1xL40S-48GB,4xL4-24GB"
    flags = ["compare", "--model", str(MODELS / "llama-3.1-8b"), "--method", "lora", "--machines", machines,
             "--prices", "skypilot", "--sort", "cost"]
    r = run([*flags, "--json"], tmp_path, {"SKY_RUNTIME_DIR": str(SKY_FIXTURE)})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {x["machine"]: x for x in doc["rows"]}
    expected = {"1xL4-24GB": ("runpod", 0.43), "1xA10G-24GB": ("aws", 1.006), "1xRTX4090-24GB": ("runpod", 0.69),
                "1xL40S-48GB": ("runpod", 0.86)}
    for label, (cloud, price) in expected.items():
        row = rows[label]
        if not row["fits"]:
            continue
        assert row["offer"]["cloud"] == cloud and row["offer"]["price_per_hour"] == price, label
        assert row["price_per_gpu_hour"] == pytest.approx(price) and row["price_source"] == "skypilot"
    assert rows["4xL4-24GB"]["offer"] is None and "no price for 4xL4-24GB in SkyPilot's catalogues" in r.stderr
    cheapest = rows[doc["cheapest"]]
    assert cheapest["cost"] == min(x["cost"] for x in doc["rows"] if x["cost"] is not None)
    assert doc["price_date"] and doc["prices"].startswith("Prices: SkyPilot's catalogues (on-demand")
    text = run(flags, tmp_path, {"SKY_RUNTIME_DIR": str(SKY_FIXTURE)})
    offer = cheapest["offer"]
    assert f"{doc['cheapest']}: {offer['cloud']} {offer['instance_type']} in " in text.stdout
    mine = run(["compare", "--params", "7B", "--machines", "1xH100-80GB", "--price", "H100=2"], tmp_path)
    assert "Prices: yours (--price)." in mine.stdout and "priced H100-80GB only" in mine.stderr


def test_costs_of_a_hundred_or_more_sort_by_their_value():
    """8xV100 at 219.02 sorted among rows shown as "219": by value, not by what the table prints."""
    rows = [compare_mod.Row(machine=compare_mod.machine(m), fits=True, train_seconds=t, cost=c, rung="ZeRO-2",
                            micro_batch=1, grad_accum=1, tokens_per_second=1e4, step_seconds=1.0)
            for m, t, c in (("8xA100-80GB", 100.0, 219.31), ("8xV100-32GB", 300.0, 219.02),
                            ("4xH100-80GB", 200.0, 219.4), ("1xH100-80GB", 900.0, 99.99))]
    ordered = compare_mod.sorted_rows(rows, "cost")
    assert [r.machine.label for r in ordered] == ["1xH100-80GB", "8xV100-32GB", "8xA100-80GB", "4xH100-80GB"]
    # and the table shows them so: to the cent (whole units read "219, 219, 219", the cheapest seemingly last)
    from wizard.frontends.compare_cli import row_cells
    shown = [row_cells(r, "USD")[-1] for r in ordered]
    assert shown == ["99.99 USD", "219.02 USD", "219.31 USD", "219.40 USD"]
    assert compare_mod.fmt_cost(1234.5) == "$1,234.50"
    compare_mod.mark_best(rows)
    assert [r.machine.label for r in rows if r.cheapest] == ["1xH100-80GB"]


def test_each_row_shows_its_memory_per_gpu_and_the_host_ram_it_assumed(capsys):
    """ram= sets a machine's host RAM; the row (table and JSON) says what it assumed, beside the GPU memory."""
    flags = ["--params", "1B", "--hidden-size", "2048", "--layers", "16", "--vocab-size", "32000"]
    assert main(["compare", *flags, "--machines", "1xL4-24GB,ram=96G,1xL4-24GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ram = [r["host_ram_bytes"] for r in doc["rows"]]
    assert sorted(ram) == sorted([96 * 2**30, compare_mod.hardware_mod.assume("1xL4-24GB").ram_total])
    assert all(0 < r["per_gpu_bytes"] <= r["gpu_memory_bytes"] for r in doc["rows"])
    assert main(["compare", *flags, "--machines", "1xL4-24GB,ram=96G"]) == 0
    table = capsys.readouterr().out
    assert "GPU mem" in table and "host RAM" in table and "96.0 GiB" in table and "/22 GiB" in table


def test_the_default_machines_include_the_cards_people_rent():
    labels = {m.label for m in compare_mod.default_machines()}
    for card in ("L40S-48GB", "RTX4090-24GB", "L4-24GB", "A10G-24GB", "H100-PCIe-80GB"):
        assert {f"{n}x{card}" for n in (1, 2, 4, 8)} <= labels, card


# The jobs (a 7B QLoRA on Qwen2.5-7B: the fixtures have no Mistral-7B), each over the default machines.
JOBS = {
    "7b-qlora": ["--model", str(MODELS / "qwen2.5-7b"), "--method", "qlora"],
    "8b-full-8k": ["--model", str(MODELS / "llama-3.1-8b"), "--seq-len", "8192"],
    "70b-lora": ["--model", str(MODELS / "llama-3-70b"), "--method", "lora"],
    "mixtral-lora": ["--model", str(MODELS / "mixtral-8x7b"), "--method", "lora"],
    "mixtral-full": ["--model", str(MODELS / "mixtral-8x7b")],
}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_miss_names_the_closest_rung_and_measure_as_plan_does(job, capsys):
    flags = JOBS[job]
    machines = ",".join(m.label for m in compare_mod.default_machines()) + ",2x8xH100-80GB,4x8xH100-80GB"
    assert main(["compare", *flags, "--machines", machines, "--json"]) in (0, 3)
    doc = json.loads(capsys.readouterr().out)
    assert len({r["global_batch"] for r in doc["rows"] if r["fits"]}) == 1
    misses = [r for r in doc["rows"] if not r["fits"] and not r["error"]]
    if job == "7b-qlora":               # about 6 GiB a GPU: every machine of the set fits it, the 1xL4 included
        assert not misses and len(doc["rows"]) >= 50 and all(r["fits"] for r in doc["rows"])
        return
    assert misses and all(r["shortfall_rung"] for r in misses)
    for row in misses:
        code = main(["plan", *flags, "--assume", row["assume"], "--global-batch", str(doc["global_batch"])])
        text = " ".join(capsys.readouterr().err.split())
        assert code == 3, row["machine"]
        phrase = row["shortfall"][len(row["shortfall_rung"]) + 1:]
        assert f"The closest rung, {row['shortfall_rung']}, {' '.join(phrase.split())}." in text, (row["machine"], text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_line(node_home: Path) -> dict[str, str]:
    for log in (node_home / "sky_workdir" / "wizard-runs").glob("*/logs/attempt-1/rank-*.log"):
        m = re.search(r"\[rank(\d+)\] (engine=.*)", log.read_text(errors="replace"))
        if m:
            return {"rank": m.group(1), **dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)}
    return {}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tasks_run_trains_two_nodes_here_with_skypilots_variables(tmp_path):
    """The `run` section of a written 2-node task, as SkyPilot runs it: on each node in ~/sky_workdir (the workdir's
    copy), the file_mounts at their destinations, the task's secrets exported, SKYPILOT_NODE_RANK 0 and 1 and
    SKYPILOT_NODE_IPS listing the head node first. Both nodes pass the preflight and train one world of 2."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(TRAIN, proj / "train.py")
    port = free_port()
    w = run(["compare", "--params", "1M", "--hidden-size", "64", "--layers", "2", "--vocab-size", "128",
             "--precision", "fp32", "--machines", "2x1xL4-24GB", "--main-process-port", str(port),
             "--write", "2x1xL4-24GB", "--output-dir", "cfg", "--", "train.py", "--steps", "3"], proj)
    assert w.returncode == 0, w.stderr[-3000:]
    task = yaml.safe_load((proj / "cfg" / "sky.yaml").read_text())
    procs, started = [], time.monotonic()
    for rank in (0, 1):
        home = tmp_path / f"node{rank}"
        shutil.copytree(task["workdir"], home / "sky_workdir")
        for dest, src in task["file_mounts"].items():
            shutil.copytree(src, home / dest.removeprefix("~/"), ignore=shutil.ignore_patterns("__pycache__"))
        e = launch_env()
        e.pop("PYTHONPATH", None)          # the run's own PYTHONPATH: the carried packages
        e.update({k: str(v) for k, v in (task.get("envs") or {}).items()})
        e.update({k: str(v) for k, v in (task.get("secrets") or {}).items()})
        e.update(HOME=str(home), SKYPILOT_NODE_RANK=str(rank), SKYPILOT_NODE_IPS="127.0.0.1\n127.0.0.1",
                 SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE="1",
                 PATH=f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}")
        procs.append(subprocess.Popen(["bash", "-c", task["run"]], cwd=home / "sky_workdir", env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = outputs_of(procs, 800)
    print(f"two-node run: {time.monotonic() - started:.1f} s")
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outs)
    assert "phase 1/2: preflight" in outs[0] and "phase 2/2: training" in outs[0]
    for rank in (0, 1):
        line = engine_line(tmp_path / f"node{rank}")
        assert line.get("rank") == str(rank) and line.get("world_size") == "2", (rank, line, outs[rank][-3000:])
