"""`wizard env` through the real CLI (what users paste into bug reports) with the fake NVML, and the out-of-range
note of `--non-interactive` and `wizard check`: once per run for a version outside the tested range, never in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.functional.test_cli import imported_heavy, run
from wizard import versions
from wizard.frontends import cli

ROOT = Path(__file__).resolve().parents[2]
CHECK_CASE = ROOT / "tests" / "fixtures" / "check" / "DS-TRAINER-MISMATCH" / "clean"
NO_FAKE = {"WIZARD_FAKE_NVML": "", "CUDA_VISIBLE_DEVICES": ""}


def env_run(args, **env):
    clean = {k: v for k, v in os.environ.items()
             if not (k.startswith("SLURM_") or k in ("CUDA_VISIBLE_DEVICES", "WIZARD_FAKE_NVML"))}
    return subprocess.run([sys.executable, "-m", "wizard", "env", *args], capture_output=True, text=True,
                          timeout=120, env={**clean, **env})


def test_env_json_with_fake_gpus():
    out = env_run(["--json"], WIZARD_FAKE_NVML="2xH100-80GB,driver=550.54.15,cuda=12.4", CUDA_VISIBLE_DEVICES="1")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"wizard", "python", "python_executable", "platform", "libraries", "driver_version",
                        "cuda_version", "gpus", "gpu_reason", "env"}
    assert (doc["driver_version"], doc["cuda_version"], doc["gpu_reason"]) == ("550.54.15", "12.4", None)
    assert [(g["index"], g["name"], g["compute_capability"]) for g in doc["gpus"]] == \
           [(0, "NVIDIA H100 80GB HBM3", [9, 0]), (1, "NVIDIA H100 80GB HBM3", [9, 0])]
    assert doc["env"] == {"CUDA_VISIBLE_DEVICES": "1"}
    assert set(doc["libraries"]) == {e.name for e in versions.TESTED}
    for name, lib in doc["libraries"].items():
        entry = versions.by_name(name)
        assert lib["tested"] == [entry.oldest, entry.newest]
        assert lib["installed"] == versions.installed_version(name)
        assert lib["status"] == versions.status(lib["installed"], entry)


def test_env_text_with_fake_gpus():
    out = env_run([], WIZARD_FAKE_NVML="1xA100-40GB,driver=535.104.05,cuda=12.2")
    assert out.returncode == 0, out.stderr
    assert "- wizard version: 0.1.0" in out.stdout and "- Python: " in out.stdout and "- Platform: " in out.stdout
    assert "- NVIDIA driver: 535.104.05, CUDA (driver): 12.2" in out.stdout
    assert "GPU 0: NVIDIA A100-SXM4-40GB" in out.stdout and "cc 8.0" in out.stdout
    accelerate = next(line for line in out.stdout.splitlines() if line.strip().startswith("accelerate "))
    assert "1.13.0–1.16.0" in accelerate and versions.installed_version("accelerate") in accelerate


@pytest.mark.parametrize("fake", ["none", ""])       # "none": the fake's box without a driver; "": the real NVML
def test_env_without_a_gpu_says_so(fake):
    out = env_run([], **{"WIZARD_FAKE_NVML": fake})
    assert out.returncode == 0, out.stderr
    if fake == "none" or "- GPUs: none (" in out.stdout:   # a real GPU here is reported, not "none"
        assert "- GPUs: none (" in out.stdout
    doc = json.loads(env_run(["--json"], **{"WIZARD_FAKE_NVML": fake}).stdout)
    assert doc["gpus"] or doc["gpu_reason"]
    assert "Traceback" not in out.stderr


def test_env_bad_input_is_one_line_exit_2():
    out = env_run(["--jsn"])
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    bad_fake = env_run([], WIZARD_FAKE_NVML="3xNOPE")
    assert bad_fake.returncode == 2, bad_fake.stderr
    assert "WIZARD_FAKE_NVML" in bad_fake.stderr and len(bad_fake.stderr.strip().splitlines()) == 1


def test_env_is_in_the_help_and_the_cli_runner():
    assert run(["env", "--json"], env=NO_FAKE).returncode == 0
    assert "env" in run(["--help"]).stdout.split("subcommands:", 1)[1]


@pytest.mark.parametrize("args", [["env"], ["env", "--json"]])
def test_env_imports_no_heavy_library(args):
    assert imported_heavy(args) == []


def test_env_runs_in_under_a_second():
    """The command itself, in a fresh process (the interpreter's own start-up is not the wizard's)."""
    code = ("import time, sys, io, contextlib\nt = time.perf_counter()\nfrom wizard.frontends.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['env', '--json'])\n"
            "print(rc, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "WIZARD_FAKE_NVML": "8xH100-80GB"}, cwd=ROOT)
    rc, seconds = out.stdout.split()
    assert rc == "0" and float(seconds) < 1.0, out.stdout + out.stderr


# ----------------------------------------------------------------------------- the out-of-range note


def _versions(**changed):
    """A version lookup: every tested library at its newest, except `changed`."""
    def lookup(name):
        return changed.get(name, versions.by_name(name).newest if name in {e.name for e in versions.TESTED} else None)
    return lookup


CHECK = ["check", "--config-file", str(CHECK_CASE / "default_config.yaml"),
         "--training-args", str(CHECK_CASE / "training_args.json"), "--assume", "4xA100-80GB"]
WRITE = ["--non-interactive", "--params", "125M", "--assume", "2xA100-80GB", "--backend", "deepspeed", "--dry-run"]


@pytest.mark.parametrize("args", [CHECK, WRITE], ids=["check", "non-interactive"])
def test_the_out_of_range_note_comes_once_and_only_out_of_range(args, monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(versions, "installed_version", _versions(accelerate="1.17.0"))
    assert cli.main(args) in (0, 1)         # the libraries' verdict, whatever it is (1: findings), comes with the note
    err = capfd.readouterr().err
    note = ("note: accelerate 1.17.0 is newer than the tested range 1.13.0–1.16.0; "
            "if something breaks, include `wizard env` in the report")
    assert [line for line in err.splitlines() if line.startswith("note: ")] == [note], err
    monkeypatch.setattr(versions, "installed_version", _versions())
    assert cli.main(args) in (0, 1)
    assert "note: " not in capfd.readouterr().err


def test_the_note_is_said_once_per_run(capsys):
    from wizard.frontends import env

    env.forget_note()
    lookup = _versions(peft="0.20.0")
    assert env.note_untested_versions(lookup=lookup).startswith("note: peft 0.20.0 is older")
    assert env.note_untested_versions(lookup=lookup) is None            # the same run: said already
    env.forget_note()                                                    # what cli.main does for a new run
    assert env.note_untested_versions(lookup=lookup) is not None
    assert capsys.readouterr().err.count("note: ") == 2


def test_an_nvml_that_fails_midway_is_a_reason_not_a_crash():
    from wizard.frontends import env

    class Broken:
        available, reason = True, None

        def devices(self):
            raise RuntimeError("lost the GPU")

        def close(self):
            pass

    assert env.gpu_section(Broken) == (None, None, [], "GPU probe failed: RuntimeError: lost the GPU")
