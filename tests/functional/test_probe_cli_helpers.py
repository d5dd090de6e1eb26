"""`wizard probe` end to end with the fake NVML, saved probes and --assume: output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "hardware"


def wizard(args, **env):
    clean = {k: v for k, v in os.environ.items()
             if not (k.startswith("SLURM_") or k in ("CUDA_VISIBLE_DEVICES", "WIZARD_FAKE_NVML"))}
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def test_probe_json_with_the_fake_8xh100():
    out = wizard(["probe", "--json"], WIZARD_FAKE_NVML="8xH100-80GB,idle", CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["gpus"]) == 4 and doc["nvlink"] is True and doc["gpus"][0]["bf16"] is True
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and doc["cuda_version"] == "12.4"


def test_probe_text_replays_a_saved_probe():
    out = wizard(["probe", "--hardware", str(SNAPSHOTS / "2xRTX4090-driver535.json")])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Source: saved probe (")
    assert "NCCL_P2P_DISABLE" in out.stdout and "Traceback" not in out.stderr


def test_probe_assume_says_what_it_assumed():
    out = wizard(["probe", "--assume", "8xA100"])
    assert out.returncode == 0, out.stderr
    assert "8 x NVIDIA A100-SXM4-80GB" in out.stdout and "Note: 'A100' comes in several memory sizes" in out.stdout


@pytest.mark.parametrize("args, env, words", [
    (["probe", "--assume", "8xH100,ram=lots"], {}, "assume: ram='lots'"),
    (["probe", "--assume", "99xH100"], {}, "assume: GPU count 99 is out of range"),
    (["probe", "--assume", "4xZ9000"], {}, "assume: unknown GPU 'Z9000'"),
    (["probe", "--hardware", "/nonexistent/probe.json"], {}, "hardware: cannot read"),
    (["probe"], {"WIZARD_FAKE_NVML": "3xNOPE"}, "WIZARD_FAKE_NVML: unknown GPU 'NOPE'"),
])
def test_probe_bad_input_exits_2_with_one_line(args, env, words):
    out = wizard(args, **env)
    assert out.returncode == 2
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stdout == ""
