"""Issue 30: a real 2-process `accelerate launch` on this CPU box with the wizard's FSDP2 YAML carrying a
context-parallel `parallelism_config:`. What reaches the HF Trainer, and why the step cannot run here.

`accelerate launch` exports the section as ACCELERATE_USE_PARALLELISM_CONFIG / PARALLELISM_CONFIG_*; the Trainer's
Accelerator builds ParallelismConfig from them and validates it against its state. On a machine without GPUs
the state is MULTI_CPU (not FSDP), and accelerate refuses the config there: that refusal, verbatim, is what this
pins, with the exported sizes equal to the YAML's. On GPUs the same files run FSDP2 with cp (not checkable here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.launch_support import child_pythonpath

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "functional" / "parallelism_trainer_cpu.py"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_the_context_parallel_config_reaches_the_trainer_which_refuses_it_on_a_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=str(tmp_path / "hf_home"), WIZARD_CACHE_DIR=str(tmp_path / "wizard_cache"),
               OUT_DIR=str(tmp_path / "run"), PYTHONPATH=child_pythonpath())
    out = tmp_path / "accelerate"
    wizard = subprocess.run(
        [sys.executable, "-m", "wizard", "--non-interactive", "--assume", "2xH100-80GB", "--params", "1B",
         "--backend", "fsdp", "--use-parallelism-config", "yes", "--parallelism-config-cp-size", "2",
         "--parallelism-config-dp-shard-size", "1", "--main-process-port", "0", "--output-dir", str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert wizard.returncode == 0, wizard.stdout[-3000:] + wizard.stderr[-3000:]
    section = yaml.safe_load((out / "default_config.yaml").read_text())["parallelism_config"]
    assert section["parallelism_config_cp_size"] == 2
    run = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(out / "default_config.yaml"),
         "--main_process_port", str(_free_port()), str(SCRIPT)],
        capture_output=True, text=True, env=env, timeout=500, cwd=tmp_path)
    line = next((x for x in run.stdout.splitlines() if x.startswith("PARALLELISM_RESULT ")), None)
    assert line is not None, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(line.split(" ", 1)[1])
    # what accelerate launch exported from the YAML: the wizard's sizes, turned on
    assert result["env"]["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert result["env"]["FSDP_VERSION"] == "2"
    for key, value in section.items():
        assert result["env"][key.upper()] == str(value), key
    # the Trainer's Accelerator validated it against a CPU state and refused it: the step cannot run here
    assert result["stage"] == "trainer" and not result["stepped"]
    assert "ParallelismConfig is only compatible" in result["error"] and "MULTI_CPU" in result["error"]
