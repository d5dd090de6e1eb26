"""A real single-machine `wizard launch` whose config names a port that is busy (a socket this test holds):
the run uses another port, says so in one line, and records it (issue 27). Nothing depends on what else
listens on this machine: the busy port is the test's own."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch_support import env

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_a_busy_config_port_is_replaced_by_a_free_one_and_recorded(tmp_path: Path):
    script = tmp_path / "port.py"
    script.write_text("import os\nprint('MASTER_PORT=' + os.environ.get('MASTER_PORT', ''), flush=True)\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        busy = held.getsockname()[1]
        cfg = tmp_path / "ddp2.yaml"
        cfg.write_text(
            "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
            f"num_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\ngpu_ids: all\n"
            f"main_process_port: {busy}\nrdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
        run_dir = tmp_path / "run"
        r = subprocess.run([sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg),
                            "--run-dir", str(run_dir), "--", str(script)], capture_output=True, text=True,
                           env=env(), cwd=tmp_path, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads((run_dir / "run.json").read_text())
    used = st["main_process_port"]
    assert isinstance(used, int) and used != busy
    cmd = st["command"]
    assert cmd[cmd.index("--main_process_port") + 1] == str(used)
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("[wizard] port ")]
    assert len(said) == 1 and str(busy) in said[0] and str(used) in said[0], r.stdout
    assert "already in use" not in r.stdout + r.stderr          # accelerate's own fallback never ran
    assert r.stdout.count(f"MASTER_PORT={used}") == 2, r.stdout
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["busy"], e["port"]) for e in events if e["type"] == "port"] == [(busy, used)]
