"""The real `wizard` CLI, end to end, in subprocesses: start-up hygiene, no-TTY behaviour, bad input, exit codes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
HEAVY = ("torch", "transformers", "deepspeed")


def run(args, *, env=None, cwd=None, timeout=300, stdin=subprocess.DEVNULL):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=timeout, stdin=stdin)


def imported_heavy(args) -> list[str]:
    code = ("import sys, runpy\nsys.argv = ['wizard'] + %r\n"
            "try:\n    runpy.run_module('wizard', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "sys.stdout.flush()\nsys.stderr.write('\\nHEAVY=' + ','.join(m for m in %r if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code % (list(args), HEAVY)], capture_output=True, text=True,
                         timeout=120)
    line = [x for x in out.stderr.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY="):].split(",") if m]


@pytest.mark.parametrize("args", [
    ["--help"],
    ["probe", "--json"],
    ["plan", "--params", "7B", "--assume", "8xA100-80GB", "--json"],
])
def test_light_commands_do_not_import_heavy_libraries(args):
    assert imported_heavy(args) == []


SIZING_LIBRARIES = ("torch", "transformers", "peft", "deepspeed", "bitsandbytes", "accelerate")


def _run_listing_modules(args, env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The CLI in a fresh process; also which of SIZING_LIBRARIES were in sys.modules when it ended."""
    code = ("import sys, runpy\nsys.argv = ['wizard'] + %r\n"
            "try:\n    runpy.run_module('wizard', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
            "else:\n    code = 0\n"
            "sys.stdout.flush()\nsys.stderr.write('\\nLOADED=' + ','.join(m for m in %r if m in sys.modules) + '\\n')\n"
            "sys.exit(code)\n")
    out = subprocess.run([sys.executable, "-c", code % (list(args), SIZING_LIBRARIES)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **env})
    line = [x for x in out.stderr.splitlines() if x.startswith("LOADED=")][-1]
    return out, [m for m in line[len("LOADED="):].split(",") if m]


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_a_warm_plan_imports_no_heavy_library_and_equals_the_cold_one(tmp_path, method):
    """The second plan of a model reads its sizing and its adapter counts (the method's, or for full fine-tuning
    the LoRA/QLoRA alternatives') from the cache: none of torch, transformers, peft, bitsandbytes, DeepSpeed or
    accelerate is imported, and its JSON is byte for byte the first plan's."""
    env = {"WIZARD_CACHE_DIR": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf_home"), "WIZARD_NO_CACHE": ""}
    args = ["plan", "--model", str(FIX / "models" / "llama-3.1-8b"), "--assume", "1xRTX4090", "--method", method,
            "--json"]
    cold, loaded_cold = _run_listing_modules(args, env)
    warm, loaded_warm = _run_listing_modules(args, env)
    assert cold.returncode in (0, 3), cold.stderr
    assert {"torch", "transformers"} <= set(loaded_cold)       # the first plan did size the model
    assert loaded_warm == [], warm.stderr
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
    plan = json.loads(warm.stdout)["plan"]
    if method == "full":     # 8B does not fit one 24 GB card: the plan names LoRA and QLoRA, sized with peft
        assert [a["method"] for a in plan["alternatives"]] == ["lora", "qlora"]
        assert all(a["trainable_params"] > 0 for a in plan["alternatives"])
    else:
        assert plan["choice"] is not None


def test_core_never_imports_a_ui_toolkit():
    """Every module of the core (all of wizard/ but wizard/frontends/) imports without a UI toolkit or a heavy
    library: walked, not listed, so a module added to the core is covered too."""
    code = ("import importlib, pkgutil, sys, wizard\n"
            "core = [m.name for m in pkgutil.walk_packages(wizard.__path__, 'wizard.')\n"
            "        if not m.name.startswith('wizard.frontends') and m.name != 'wizard.__main__']\n"
            "for name in core:\n    importlib.import_module(name)\n"
            "bad = [m for m in ('textual', 'questionary', 'prompt_toolkit', 'torch', 'transformers', 'deepspeed') "
            "if m in sys.modules]\nprint(len(core), bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, bad = out.stdout.split(" ", 1)
    assert int(count) >= 30 and bad.strip() == "[]", out.stdout


def test_probe_on_a_machine_without_gpu_is_clean():
    out = run(["probe", "--json"], env={"WIZARD_FAKE_NVML": ""})
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["gpus"] == [] and doc["gpu_reason"]
    text = run(["probe"], env={"WIZARD_FAKE_NVML": ""})
    assert text.returncode == 0 and "Traceback" not in text.stderr


def test_interactive_without_a_terminal_says_so_and_exits_2():
    out = run([])
    assert out.returncode == 2
    assert "--non-interactive" in out.stderr and "ssh -t" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "\x1b[" not in out.stdout + out.stderr  # no escape codes from a full-screen app


def test_plan_json_shape():
    out = run(["plan", "--params", "7B", "--assume", "8xA100-80GB", "--json"])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) >= {"hardware", "model", "plan", "files"}
    choice = doc["plan"]["choice"]
    assert set(choice) >= {"backend", "zero_stage", "offload_optimizer", "offload_param",
                           "gradient_checkpointing", "per_gpu_bytes", "cpu_bytes"}
    for rung in doc["plan"]["rungs"]:
        assert set(rung) >= {"name", "fits", "per_gpu_bytes", "cpu_bytes", "breakdown", "reason"}
    assert doc["files"] == {"accelerate_config": None, "deepspeed_config": None}


def test_nothing_fits_exits_3_and_says_what_would():
    out = run(["--non-interactive", "--params", "405B", "--assume", "1xRTX4090,ram=32G", "--dry-run"])
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    assert "GiB" in out.stderr


@pytest.mark.parametrize("mode", [["plan"], ["--non-interactive", "--dry-run"]])
def test_nothing_fits_prints_each_alternative_once(mode):
    """When nothing fits, the `Instead:` lines were printed twice: again inside the final error (issue 29)."""
    out = run([*mode, "--params", "13B", "--assume", "1xRTX4090,ram=32G"])
    assert out.returncode == 3, out.stderr
    fitting = "QLoRA r=16: fits with Single GPU with gradient checkpointing"
    assert f"Instead:  {fitting}" in out.stdout, out.stdout
    assert (out.stdout + out.stderr).count(fitting) == 1, out.stderr
    assert "Fine-tuning with adapters instead (--method): see the Instead: line above." in out.stderr, out.stderr
    # --json prints no Instead: lines: there the exit line still names the alternative
    j = run([*mode, "--params", "13B", "--assume", "1xRTX4090,ram=32G", "--json"])
    assert j.returncode == 3 and f"Fine-tuning with adapters instead (--method): {fitting}" in j.stderr, j.stderr


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


BAD_INPUTS = [
    (["--params", "abc"], "params"),
    (["--params", "-7B"], "params"),
    (["--params", "0"], "params"),
    (["--params", "7B", "--seq-len", "0"], "seq"),
    (["--params", "7B", "--micro-batch", "-1"], "micro"),
    (["--params", "7B", "--micro-batch", "two"], "micro"),
    (["--params", "7B", "--precision", "bf17"], "precision"),
    (["--params", "7B", "--backend", "megatron"], "backend"),
    (["--params", "7B", "--zero-stage", "4"], "zero"),
    (["--params", "7B", "--num-processes", "16"], "num"),
    (["--params", "7B", "--num-machines", "2", "--machine-rank", "2", "--main-process-ip", "10.0.0.1"], "rank"),
    (["--params", "7B", "--num-machines", "2", "--main-process-ip", "999.1.1.1"], "ip"),
    (["--params", "7B", "--num-machines", "2", "--main-process-ip", "10.0.0.1", "--main-process-port", "70000"],
     "port"),
    (["--params", "7B", "--offload", "nvme", "--nvme-path", "/does/not/exist"], "nvme"),
    (["--model", str(FIX / "models" / "no-config")], "model"),
    (["--model", str(FIX / "models" / "corrupt")], "model"),
    (["--model", "nobody/not-a-cached-model"], "model"),
    (["--assume", "8xH900-80GB", "--params", "7B"], "assume"),
    (["--assume", "0xA100-80GB", "--params", "7B"], "assume"),
    (["--answers", str(FIX / "answers" / "unknown-key.yaml")], "answers"),
    (["--answers", str(FIX / "answers" / "wrong-type.yaml")], "answers"),
]


@pytest.mark.parametrize("args,field", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, field, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "default_config.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\n")
    before = _digest(out_dir)
    argv = ["--non-interactive", *args, "--output-dir", str(out_dir)]
    if "--assume" not in args:
        argv += ["--assume", "8xA100-80GB"]
    out = run(argv)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert field in lines[0].lower()
    assert _digest(out_dir) == before


def test_unwritable_output_dir_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = run(["--non-interactive", "--params", "7B", "--assume", "8xA100-80GB", "--output-dir", str(blocker / "sub")])
    assert out.returncode == 2
    assert "output" in out.stderr.lower() and "Traceback" not in out.stderr


@pytest.mark.slow
def test_non_interactive_writes_validated_files_and_keeps_a_backup(tmp_path):
    out_dir = tmp_path / "out"
    args = ["--non-interactive", "--assume", "8xA100-80GB", "--params", "13B", "--output-dir", str(out_dir)]
    first = run(args)
    assert first.returncode == 0, first.stderr
    yaml_text = (out_dir / "default_config.yaml").read_text()
    assert "deepspeed_config_file: " + str(out_dir / "ds_config.json") in yaml_text
    second = run(args[:-2] + ["--grad-accum", "4", "--trainer", "accelerate", "--output-dir", str(out_dir)])
    assert second.returncode == 0, second.stderr
    assert (out_dir / "ds_config.json.bak").exists()
    assert "Wrote" in second.stdout
    dry = run(args + ["--dry-run", "--micro-batch", "2"])
    assert dry.returncode == 0
    assert "nothing written" in dry.stdout.lower()


def test_cpu_processes_route_through_deepspeed_and_refuse_plain_ddp(tmp_path):
    """accelerate starts one MULTI_CPU process (no mpirun), and torchrun-launched CPU DDP ranks never form
    a group: N CPU processes must go through DeepSpeed's CPU accelerator."""
    base = ["--non-interactive", "--hardware", str(FIX / "hardware" / "cpu-box.json"),
            "--model", str(FIX / "models" / "llama-tiny"), "--num-processes", "2", "--dry-run", "--json"]
    auto = run(base + ["--output-dir", str(tmp_path)])
    assert auto.returncode == 0, auto.stderr
    choice = json.loads(auto.stdout)["plan"]["choice"]
    assert choice["backend"] == "deepspeed"
    ddp = run(base + ["--backend", "ddp", "--output-dir", str(tmp_path)])
    assert ddp.returncode == 2
    assert "backend" in ddp.stderr and "deepspeed" in ddp.stderr and "Traceback" not in ddp.stderr
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- issue 12: one line, exit 2

def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("extra, words", [
    (["--assume", ""], "assume: is empty"),
    (["--assume", "8xA100-80GB", "--answers", ""], "answers: is empty"),
    (["--assume", "8xA100-80GB", "--answers", "FIFO"], "is a FIFO"),
    (["--hardware", "FIFO"], "is a FIFO"),
    (["--assume", "8xA100-80GB", "--vocab-size", "9" * 5000], "more than 18 digits"),
    (["--assume", "8xA100-80GB", "--backend", "ddp", "--zero-stage", "3"], "conflicts with --backend ddp"),
    (["--assume", "8xA100-80GB", "--backend", "fsdp", "--zero-stage", "3"], "conflicts with --backend fsdp"),
    (["--assume", "8xA100-80GB", "--precision", "bf16", "--mixed-precision", "fp16"], "conflicts with --precision"),
    (["--assume", "8xA100-80GB", "--use-mpirun"], "mpirun_config"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, extra, words):
    extra = [_fifo(tmp_path) if a == "FIFO" else a for a in extra]
    out = run(["plan", "--params", "1B", *extra], timeout=60)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and words in out.stderr, out.stderr


def test_a_full_stdout_is_one_line_and_exit_2():
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "wizard", "plan", "--params", "1B", "--assume", "8xA100-80GB"],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.splitlines() == ["wizard: writing the output failed: No space left on device"]


def test_a_corrupt_existing_config_in_a_non_ascii_dir_is_regenerated(tmp_path):
    out_dir = tmp_path / "out_ü"
    out_dir.mkdir()
    (out_dir / "default_config.yaml").write_text("a: [1,\n")
    (out_dir / "ds_config.json").write_bytes(b"\xff\xfe{")
    out = run(["--non-interactive", "--params", "125M", "--assume", "2xA100-80GB", "--backend", "deepspeed",
               "--output-dir", str(out_dir)])
    assert out.returncode == 0, out.stderr
    assert "replacing an unreadable ds_config.json (not UTF-8 text); kept as ds_config.json.bak" in out.stdout
    assert (out_dir / "default_config.yaml.bak").read_text() == "a: [1,\n"
    assert (out_dir / "ds_config.json.bak").read_bytes() == b"\xff\xfe{"
    check = run(["check", "--config-file", str(out_dir / "default_config.yaml")])
    assert check.returncode == 0, check.stdout + check.stderr


# ---------------------------------------------------------------- accelerate's dialect and the help

def test_underscore_flags_plan_like_the_dashed_ones():
    """`accelerate launch` takes --num_processes as well as --num-processes; so does the wizard."""
    common = ["plan", "--assume", "8xA100-80GB", "--params", "7B", "--json"]
    dashed = run([*common, "--num-processes", "4", "--zero-stage", "3", "--mixed-precision", "bf16"])
    under = run([*common, "--num_processes", "4", "--zero_stage", "3", "--mixed_precision=bf16"])
    assert under.returncode == 0, under.stderr
    assert json.loads(under.stdout) == json.loads(dashed.stdout)
    choice = json.loads(under.stdout)["plan"]["choice"]
    assert choice["backend"] == "deepspeed" and choice["zero_stage"] == 3


def test_underscores_are_renamed_only_before_the_training_scripts_own_arguments():
    from wizard.frontends.cli import build_subparser, dashed_spelling
    options = build_subparser("launch")._option_string_actions
    args = ["--config_file", "c.yaml", "--max_restarts=2", "--", "train.py", "--learning_rate", "1"]
    assert dashed_spelling(args, options) == ["--config-file", "c.yaml", "--max-restarts=2", "--", "train.py",
                                              "--learning_rate", "1"]
    # without `--`, the script's arguments start at the first positional
    assert dashed_spelling(["--detach", "train.py", "--config_file", "x"], options) == [
        "--detach", "train.py", "--config_file", "x"]
    ns = build_subparser("launch").parse_args(["--config_file", "c.yaml", "--", "train.py", "--max_restarts", "3"])
    assert ns.config_file == "c.yaml" and ns.max_restarts == 0 and ns.command[-2:] == ["--max_restarts", "3"]


def test_help_shows_every_default():
    text = run(["--help"], env={"COLUMNS": "200"}).stdout
    for flag, default in (("--seq-len", "2048"), ("--micro-batch", "1; with --global-batch, its fastest split"),
                          ("--headroom", "0.1"),
                          ("--backend", "auto"), ("--optimizer", "adamw"), ("--cuda-context", "1343MiB"),
                          ("--num-processes", "from the hardware and the plan"), ("--model", "unset")):
        lines = text.splitlines()
        at = next(i for i, x in enumerate(lines) if x.strip().startswith(flag + " "))
        entry = " ".join(lines[at:at + 2])          # long choice lists put the help on the next line
        assert f"(default: {default})" in entry, entry
    launch = run(["launch", "--help"], env={"COLUMNS": "200"}).stdout
    assert "(default: 0, no restart)" in launch and "(default: 2400 s = 40 min," in launch
    assert "underscore spelling" in text


def test_non_interactive_help_says_what_is_required_and_what_is_defaulted():
    plain = run(["--help"]).stdout
    text = run(["--non-interactive", "--help"]).stdout
    assert text != plain
    assert text.startswith("usage: wizard --non-interactive")
    assert "required: a model, --model ID_OR_PATH" in " ".join(text.split())
    assert "defaulted: everything else" in " ".join(text.split())


LLAMA_70B = str(FIX / "models" / "llama-3-70b")


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("mode", ["plan", "--non-interactive"])
def test_adapter_plan_with_nothing_fitting_exits_3_with_the_arithmetic(method, mode, tmp_path):
    """An adapter plan where no rung fits re-plans its variants with the adapters it was sized with (it used
    to raise 'make_plan needs the AdapterShape' from what_would_fit: a traceback, exit 1)."""
    args = [mode, "--model", LLAMA_70B, "--assume", "2xRTX4090", "--method", method]
    if mode != "plan":
        args += ["--dry-run", "--output-dir", str(tmp_path)]
    out = run(args, env={"WIZARD_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr and "AdapterShape" not in out.stderr
    assert "Nothing fits. The closest rung" in out.stderr
    assert list(tmp_path.glob("*.yaml")) == []


def test_plan_json_has_the_method_as_fields():
    """DESIGN.md's plan.method: name, rank, alpha, targets, trainable_params, adapter_bytes (peft saves fp32)."""
    out = run(["plan", "--params", "7B", "--assume", "1xA100-80GB", "--method", "qlora", "--lora-rank", "8",
               "--lora-alpha", "8", "--lora-targets", "q_proj,k_proj", "--json"])
    assert out.returncode == 0, out.stderr
    method = json.loads(out.stdout)["plan"]["method"]
    # Llama 7B shape of --params: h 4096, 32 layers; q_proj 4096x4096, k_proj 4096x4096 (no GQA): r (in + out) each
    trainable = 32 * 8 * (2 * 4096 + 2 * 4096)
    assert method == {"name": "qlora", "rank": 8, "alpha": 8, "targets": ["k_proj", "q_proj"],
                      "trainable_params": trainable, "adapter_bytes": 4 * trainable}
    full = json.loads(run(["plan", "--params", "7B", "--assume", "8xA100-80GB", "--json"]).stdout)
    assert full["plan"]["method"]["name"] == "full"
    assert full["plan"]["method"]["trainable_params"] == full["model"]["params"]


def test_plan_for_two_machines_needs_no_address_but_writing_does(tmp_path):
    """Planning two nodes is arithmetic; only accelerate's YAML needs the main machine's address."""
    out = run(["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--json"])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["plan"]["num_machines"] == 2 and doc["plan"]["world_size"] == 16 and doc["plan"]["choice"]
    text = run(["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2"])
    assert text.returncode == 0 and "on 2 machines" in text.stdout, text.stderr
    files = run(["--non-interactive", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--dry-run",
                 "--output-dir", str(tmp_path)])
    assert files.returncode == 2 and "main-process-ip" in files.stderr


def test_the_network_between_machines_comes_from_the_flag_the_answers_file_or_assume(tmp_path):
    base = ["plan", "--params", "70B", "--assume", "8xH100-80GB,nodes=2", "--json"]
    default = json.loads(run(base).stdout)["plan"]
    assert default["inter_node_gbps"] == 3200
    flag = json.loads(run(base + ["--inter-node-gbps", "400"]).stdout)["plan"]
    answers = tmp_path / "answers.yaml"
    answers.write_text("inter_node_gbps: 400\n")
    from_file = json.loads(run(base + ["--answers", str(answers)]).stdout)["plan"]
    assumed = json.loads(run(["plan", "--params", "70B", "--assume", "8xH100-80GB,nodes=2,net=400G",
                              "--json"]).stdout)["plan"]
    for plan in (flag, from_file, assumed):
        assert plan["inter_node_gbps"] == 400
        assert plan["choice"]["speed"]["tokens_per_second"] < default["choice"]["speed"]["tokens_per_second"]
    text = run(["plan", "--params", "70B", "--assume", "8xH100-80GB,nodes=2", "--inter-node-gbps", "800"])
    assert "800 Gb/s (100 GB/s) of network per machine (--inter-node-gbps" in text.stdout, text.stderr
    bad = run(base + ["--inter-node-gbps", "0"])
    assert bad.returncode == 2 and "inter-node-gbps" in bad.stderr and "Traceback" not in bad.stderr


LLAMA_8B = str(FIX / "models" / "llama-3.1-8b")


def test_a_global_batch_drives_every_figure_the_answers_and_the_files(tmp_path):
    """--global-batch 64 on 8 x A100 (issue 19): the fastest split becomes the plan's micro-batch and accumulation;
    step time, tokens/s and the time to train are for it (they were for micro-batch 1 x 1, a batch of 8)."""
    base = ["--model", LLAMA_8B, "--assume", "8xA100-80GB", "--global-batch", "64", "--train-tokens", "1e9"]
    doc = json.loads(run(["plan", *base, "--json"]).stdout)
    plan, choice = doc["plan"], doc["plan"]["choice"]
    batch = plan["batch"]
    assert batch["applied"] and batch["global_batch"] == 64
    assert (choice["micro_batch"], choice["grad_accum"]) == (batch["micro_batch"], batch["grad_accum"])
    assert choice["micro_batch"] * choice["grad_accum"] * 8 == 64 and choice["micro_batch"] > 1
    speed = choice["speed"]
    # the choice's speed is its rung's, with the time to train (the split's has no --train-tokens to know)
    assert {k: v for k, v in speed.items() if k != "train_seconds"} == batch["speed"]
    assert speed["tokens_per_second"] == pytest.approx(64 * 2048 / speed["step_seconds"], rel=1e-4)
    rung = next(r for r in plan["rungs"] if r["key"] == choice["key"])
    assert rung["speed"]["train_seconds"] == pytest.approx(1e9 / speed["tokens_per_second"], rel=1e-3)
    assert speed["train_seconds"] == rung["speed"]["train_seconds"]
    assert (doc["answers"]["micro_batch"], doc["answers"]["grad_accum"]) == (choice["micro_batch"],
                                                                              choice["grad_accum"])
    text = run(["plan", *base]).stdout
    from wizard.units import fmt_duration
    assert f"Time to train 1B tokens: {fmt_duration(1e9 / speed['tokens_per_second'])}" in text
    assert (f"Batch: micro-batch {choice['micro_batch']} x accumulation {choice['grad_accum']} x 8 processes = the "
            "global batch of 64") in text
    # The files: an own Accelerate loop gets the accumulation written out; HF Trainer's TrainingArguments carry it.
    out = run(["--non-interactive", *base, "--trainer", "accelerate", "--output-dir", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert ds["gradient_accumulation_steps"] == choice["grad_accum"]
    assert ds["train_micro_batch_size_per_gpu"] == "auto"        # accelerate fills it from the dataloader


def test_explicit_micro_batch_and_accumulation_win_over_the_global_batch():
    base = ["plan", "--model", LLAMA_8B, "--assume", "8xA100-80GB", "--global-batch", "64", "--json"]
    both = json.loads(run(base + ["--micro-batch", "1", "--grad-accum", "1"]).stdout)
    assert not both["plan"]["batch"]["applied"] and both["plan"]["batch"]["global_batch"] == 8
    assert (both["plan"]["choice"]["micro_batch"], both["plan"]["choice"]["grad_accum"]) == (1, 1)
    assert any("they win" in n and "--global-batch of 64" in n for n in both["plan"]["notes"])
    micro = json.loads(run(base + ["--micro-batch", "4"]).stdout)
    assert (micro["answers"]["micro_batch"], micro["answers"]["grad_accum"]) == (4, 2)
    assert (micro["plan"]["choice"]["micro_batch"], micro["plan"]["choice"]["grad_accum"]) == (4, 2)
    bad = run(base + ["--micro-batch", "3"])
    assert bad.returncode == 2 and "micro-batch" in bad.stderr and "divisor of 8" in bad.stderr


def test_when_host_ram_is_what_does_not_fit_the_message_says_so_and_how_much_would():
    """7B full fine-tuning on one A100-80GB: the offload rungs fit on the GPU, DeepSpeed's host-RAM need does not
    fit the assumed RAM. The message said only 'with 2 GPUs (2 machines x 1)'."""
    out = run(["plan", "--params", "7B", "--assume", "1xA100-80GB"])
    assert out.returncode == 3, out.stderr
    msg = out.stderr
    assert "Host RAM is what stops ZeRO-2 + CPU optimizer offload: it fits on the GPU (" in msg
    assert "of host RAM per machine, and the machine has 144.0 GiB available (160.0 GiB in all)" in msg
    import re
    ram = re.search(r"With (\d+)\.0 GiB of RAM \(--assume \.\.\.,ram=(\d+)G\)", msg)
    assert ram and ram.group(1) == ram.group(2), msg
    fits = run(["plan", "--params", "7B", "--assume", f"1xA100-80GB,ram={ram.group(2)}G", "--json"])
    assert fits.returncode == 0 and json.loads(fits.stdout)["plan"]["choice"]["key"] == "zero2-offload-opt"
    assert msg.index("Host RAM") < msg.index("with 2 GPUs")


WRITES_THAT_RUN_EVERY_RULE = {
    "zero2": ["--params", "8B", "--backend", "deepspeed", "--zero-stage", "2"],
    "zero3-offload": ["--params", "70B", "--backend", "deepspeed", "--zero-stage", "3", "--offload", "cpu"],
    "fsdp2-lora": ["--params", "8B", "--backend", "fsdp", "--method", "lora"],
}


@pytest.mark.parametrize("case", sorted(WRITES_THAT_RUN_EVERY_RULE))
def test_a_write_runs_every_rule_with_the_installed_libraries(case, tmp_path):
    """Issue 27: with accelerate 1.16 every write said "rule ACC-LAUNCH-REJECTS could not run ... report this as a
    wizard bug". Whatever versions are installed, the check before a write runs every rule, and says nothing of it."""
    out = run(["--non-interactive", *WRITES_THAT_RUN_EVERY_RULE[case], "--assume", "8xH100-80GB,ram=2048G",
               "--output-dir", str(tmp_path / "out")])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Validated with accelerate, DeepSpeed and transformers: OK" in out.stdout
    for text in (out.stdout, out.stderr):
        assert "CHECK-RULE-FAILED" not in text and "could not run" not in text and "Traceback" not in text, text[-2000:]


def test_plan_wording_for_one_cpu_process_and_more_machines_of_them():
    """"1 CPU processes", and "more GPUs up to 128 machines" said of CPU processes (issue 29)."""
    out = run(["plan", "--params", "405B", "--use-cpu", "yes", "--num-processes", "1", "--hardware",
               str(FIX / "hardware" / "cpu-box.json")])
    assert out.returncode == 3, out.stderr
    assert "; 1 CPU process on 1 machine; precision" in out.stdout, out.stdout
    assert "Note:     This is 1 CPU process (DeepSpeed's CPU accelerator over gloo)" in out.stdout, out.stdout
    assert "more machines of 1 CPU process, up to 128;" in out.stderr and "more GPUs" not in out.stderr, out.stderr


def test_a_machine_count_in_assume_points_at_nodes():
    """`--assume 2x8xH100` read "unknown GPU '8xH100'", with no hint that nodes=2 is the syntax (issue 29)."""
    out = run(["plan", "--params", "7B", "--assume", "2x8xH100,ram=1T"])
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "machines are given as nodes=N" in out.stderr and "8xH100,ram=1T,nodes=2" in out.stderr, out.stderr


def test_the_next_line_of_a_two_machine_config_names_the_second_machines_rank(tmp_path):
    """The 2-node Next line said nothing of --machine-rank 1 on the second machine (issue 29)."""
    out = run(["--non-interactive", "--params", "7B", "--assume", "8xH100,nodes=2", "--main-process-ip", "10.0.0.1",
               "--output-dir", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    cfg = tmp_path / "default_config.yaml"
    assert f"Next: on the main machine (10.0.0.1): wizard launch --config-file {cfg} -- your_train.py" in out.stdout
    assert (f"on the second machine, with the same files: wizard launch --config-file {cfg} --machine-rank 1 -- "
            "your_train.py [args]") in out.stdout, out.stdout


NOISE_SCRIPT = '''
import logging, sys
logging.getLogger("kernels._internals.hf_hub").warning(
    "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in "
    "offline mode.")
logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
    "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure", "offline")
logging.getLogger("kernels._internals.hf_hub").warning("a kernels warning of another kind")
logging.getLogger("mine").warning("the user's own warning")
print("the user's own line", file=sys.stderr)
'''


def test_library_noise_nobody_caused_is_dropped_in_every_rank_and_nothing_else(tmp_path):
    """kernels' "Skipping publisher trust check for 'kernels-community/...'" (and bitsandbytes' CPU kernel
    fallback after it) printed in every rank of `wizard launch` and `tune` (issue 29). launch/_worker.py drops those
    two records at their loggers before the user's script runs; the script's own output and the libraries' other
    messages stay."""
    script = tmp_path / "noisy.py"
    script.write_text(NOISE_SCRIPT)
    bare = run_python([str(script)], tmp_path)
    assert "Skipping publisher trust check" in bare.stderr, bare.stderr         # the premise: Python prints it
    ranked = run_python([str(ROOT / "launch" / "_worker.py"), str(script)], tmp_path)
    assert ranked.returncode == 0, ranked.stderr
    assert "Skipping publisher trust check" not in ranked.stderr and "gemm_4bit_forward" not in ranked.stderr
    for kept in ("a kernels warning of another kind", "the user's own warning", "the user's own line"):
        assert kept in ranked.stderr, ranked.stderr


def test_the_wizards_own_process_drops_the_kernels_offline_notice(tmp_path):
    """`wizard check` (as `launch` runs it) printed the notice before its output: the wizard sizes models with
    HF_HUB_OFFLINE=1, and peft imports bitsandbytes, whose CPU backend looks its kernel up on the Hub."""
    code = ("import logging\nfrom wizard.frontends.cli import _quiet_optional_libraries\n_quiet_optional_libraries()\n"
            + NOISE_SCRIPT)
    r = run_python(["-c", code], tmp_path)
    assert "Skipping publisher trust check" not in r.stderr and "the user's own warning" in r.stderr, r.stderr
    cfg = tmp_path / "out"
    w = run(["--non-interactive", "--params", "98K", "--hidden-size", "64", "--layers", "2", "--heads", "4",
             "--vocab-size", "128", "--use-cpu", "yes", "--num-processes", "2", "--backend", "deepspeed",
             "--output-dir", str(cfg)], cwd=tmp_path)
    assert w.returncode == 0, w.stderr
    c = run(["check", "--config-file", str(cfg / "default_config.yaml"), "--method", "lora"], cwd=tmp_path,
            env={"HF_HUB_OFFLINE": "1"})
    assert "Skipping publisher trust check" not in c.stdout + c.stderr, c.stdout + c.stderr


def run_python(args, cwd):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
