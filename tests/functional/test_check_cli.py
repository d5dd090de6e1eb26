"""`python -m wizard.frontends.check_cli` (what `wizard check` runs): exit codes 0/1/2, --json shape, --fix then a clean
re-check with the .bak kept, and accelerate's default config location."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "check"
pytestmark = pytest.mark.timeout(300)


def run_check(*args: str, env_extra: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "wizard.frontends.check_cli", *args], capture_output=True, text=True,
                          timeout=240, cwd=cwd or ROOT, env=env)


def case(tmp_path: Path, rule: str, kind: str) -> Path:
    work = tmp_path / f"{rule}-{kind}"
    shutil.copytree(FIXTURES / rule / kind, work)
    return work


def test_clean_config_exits_0(tmp_path):
    d = case(tmp_path, "DS-TRAINER-MISMATCH", "clean")
    r = run_check("--config-file", str(d / "default_config.yaml"), "--training-args", str(d / "training_args.json"),
                  "--assume", "4xA100-80GB", env_extra={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No problems found." in r.stdout


def test_errors_exit_1_and_json_lists_them_all_at_once(tmp_path):
    d = case(tmp_path, "DS-TRAINER-MISMATCH", "trigger")
    ds = json.loads((d / "ds_config.json").read_text())
    ds["gradient_accumulation_steps"] = 8
    (d / "ds_config.json").write_text(json.dumps(ds))
    r = run_check("--config-file", str(d / "default_config.yaml"), "--training-args", str(d / "training_args.json"),
                  "--assume", "4xA100-80GB", "--json", env_extra={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out, list)
    assert {tuple(sorted(f)) for f in out} == {("file", "fix", "fixable", "key", "message", "rule", "severity", "when")}
    mismatches = {f["key"]: f for f in out if f["rule"] == "DS-TRAINER-MISMATCH"}
    assert set(mismatches) == {"gradient_clipping", "gradient_accumulation_steps"}
    assert "0.5" in mismatches["gradient_clipping"]["message"] and "1.0" in mismatches["gradient_clipping"]["message"]


def test_warnings_only_exit_0(tmp_path):
    d = case(tmp_path, "DS-UNKNOWN-TOP-KEY", "trigger")
    r = run_check("--config-file", str(d / "default_config.yaml"), "--training-args", str(d / "training_args.json"),
                  "--assume", "4xA100-80GB", env_extra={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning DS-UNKNOWN-TOP-KEY" in " ".join(r.stdout.split())


@pytest.mark.parametrize("args,text", [
    (["--config-file", "/nonexistent/default_config.yaml"], "does not exist"),
    (["--ds-config", "BROKEN"], "not strict JSON"),
    (["--training-args", "UNKNOWN"], "no TrainingArguments field"),
    (["--assume", "banana"], ""),
    (["--config-file", "/dev/zero"], "is a device"),
    (["--config-file", "FIFO"], "is a FIFO"),
    (["--ds-config", "DEEP"], "nests too deeply"),
    (["--ds-config", "DIGITS"], "too long"),
])
def test_unreadable_input_exits_2_with_one_line(args, text, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": {"stage": 3,}}')
    unknown = tmp_path / "ta.json"
    unknown.write_text('{"per_device_batch": 4}')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                     # nobody writes to it: reading it would block forever
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    digits = tmp_path / "digits.json"
    digits.write_text('{"train_batch_size": ' + "9" * 5000 + "}")
    named = {"BROKEN": broken, "UNKNOWN": unknown, "FIFO": fifo, "DEEP": deep, "DIGITS": digits}
    args = [str(named[a]) if a in named else a for a in args]
    r = run_check(*args, env_extra={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("wizard check:")]
    assert len(lines) == 1 and text in lines[0], r.stderr


def test_no_config_anywhere_exits_2(tmp_path):
    r = run_check(env_extra={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 2 and "accelerate's default" in r.stderr


def test_default_config_file_and_the_ds_config_it_names(tmp_path):
    d = case(tmp_path, "DS-AUTO-IN-SUBCONFIG", "trigger")
    accel = tmp_path / "xdg" / "huggingface" / "accelerate"
    accel.mkdir(parents=True)
    text = (d / "default_config.yaml").read_text().replace("ds_config.json", str(d / "ds_config.json"))
    (accel / "default_config.yaml").write_text(text)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env_no_hf = {k: v for k, v in os.environ.items() if k != "HF_HOME"}
    r = subprocess.run([sys.executable, "-m", "wizard.frontends.check_cli", "--assume", "4xA100-80GB", "--json"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT, env={**env_no_hf, **env})
    assert r.returncode == 1, r.stderr
    assert [f["rule"] for f in json.loads(r.stdout)] == ["DS-AUTO-IN-SUBCONFIG"]


def test_fix_then_clean_recheck_with_backups(tmp_path):
    d = case(tmp_path, "ACC-UNQUOTED-NO", "trigger")
    yaml_path = d / "default_config.yaml"
    original = yaml_path.read_text()
    ds_case = case(tmp_path, "DS-FLOAT-BUCKET", "trigger")
    ds_path = ds_case / "ds_config.json"
    ds_original = ds_path.read_text()
    env = {"HF_HOME": str(tmp_path / "hf")}
    r = run_check("--config-file", str(yaml_path), "--assume", "1xA100-80GB", "--fix", env_extra=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--fix changed:" in r.stdout and "mixed_precision" in r.stdout and "No problems found." in r.stdout
    assert (d / "default_config.yaml.bak").read_text() == original
    assert "mixed_precision: 'no'" in yaml_path.read_text()
    r = run_check("--config-file", str(ds_case / "default_config.yaml"), "--training-args",
                  str(ds_case / "training_args.json"), "--assume", "4xA100-80GB", "--fix", env_extra=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert Path(str(ds_path) + ".bak").read_text() == ds_original
    assert json.loads(ds_path.read_text())["zero_optimization"]["stage3_prefetch_bucket_size"] == 15099494
    r = run_check("--config-file", str(ds_case / "default_config.yaml"), "--training-args",
                  str(ds_case / "training_args.json"), "--assume", "4xA100-80GB", env_extra=env)
    assert r.returncode == 0 and "No problems found." in r.stdout, r.stdout


def test_help_names_the_flags():
    r = run_check("--help")
    assert r.returncode == 0
    for flag in ("--config-file", "--ds-config", "--training-args", "--model", "--hardware", "--assume", "--json",
                 "--fix", "--trainer"):
        assert flag in r.stdout


def test_a_yaml_without_deepspeed_prints_no_deepspeed_log_line(tmp_path):
    """DeepSpeed logs "Setting accelerator to CPU" (on stdout in 0.19.0) when it is imported without DS_ACCELERATOR:
    a rule that imported it on its own put that line into `wizard check`'s output (and first in `wizard launch
    --detach`'s, where scripts read the run directory). Only the findings are printed."""
    (tmp_path / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: bf16\nnum_machines: 1\n"
        "num_processes: 1\nmachine_rank: 0\nmain_training_function: main\nuse_cpu: false\n")
    r = run_check("--config-file", str(tmp_path / "default_config.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[WARNING]" not in r.stdout + r.stderr and "accelerator" not in r.stdout + r.stderr, r.stdout + r.stderr
