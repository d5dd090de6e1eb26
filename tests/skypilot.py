"""SkyPilot itself, for the tests that judge what the wizard writes for it: its task parser (sky.Task.from_yaml) and
its catalogue reader, run in the Python that has SkyPilot 0.14.1 (SKYPILOT_VERSION).

SkyPilot lives in an environment of its own: it pins click below what huggingface-hub needs, so installing it beside
the wizard's libraries would change the tested set. `$WIZARD_SKYPILOT_PYTHON` names that environment's python (CI
makes it: .ci/run, from .ci/skypilot-requirements.txt); this venv's own python is used when it has SkyPilot. Without
either, the tests that need it skip and say why (never pass silently).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKYPILOT_VERSION = "0.14.1"
REQUIREMENTS = Path(__file__).resolve().parents[1] / ".ci" / "skypilot-requirements.txt"


def sky_python() -> str | None:
    """A python with SkyPilot SKYPILOT_VERSION importable, or None."""
    for candidate in (os.environ.get("WIZARD_SKYPILOT_PYTHON"), sys.executable):
        if not candidate:
            continue
        try:
            out = subprocess.run([candidate, "-c", "from importlib.metadata import version; print(version('skypilot'))"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == SKYPILOT_VERSION:
            return candidate
    return None


def need_sky() -> str:
    python = sky_python()
    if python is None:
        pytest.skip(f"SkyPilot {SKYPILOT_VERSION} is not installed: set WIZARD_SKYPILOT_PYTHON to the python of a venv "
                    f"made with `pip install -r {REQUIREMENTS.relative_to(REQUIREMENTS.parents[1])}` (CI does)")
    return python


PARSE = r"""
import json, sys
import sky
out = {}
for path in sys.argv[1:]:
    t = sky.Task.from_yaml(path)
    out[path] = {"num_nodes": t.num_nodes, "workdir": t.workdir, "file_mounts": t.file_mounts, "run": t.run,
                 "setup": t.setup, "envs": t.envs, "secrets": sorted((t.secrets or {}).keys()),
                 "resources": [{"accelerators": r.accelerators, "memory": r.memory, "disk_size": r.disk_size}
                               for r in t.resources]}
print(json.dumps(out))
"""


def _run(python: str, code: str, args: list[str], home: Path) -> str:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), SKY_RUNTIME_DIR=str(home))     # SkyPilot keeps its state there, not in ours
    out = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def parse_tasks(paths: list[Path], home: Path) -> dict[str, dict]:
    """{path: what sky.Task.from_yaml made of it}: SkyPilot's own parser and schema (it raises on a bad key)."""
    return json.loads(_run(need_sky(), PARSE, [str(p) for p in paths], home))


CHEAPEST = r"""
import json, sys
import pandas as pd
from sky.catalog import common
out = {}
for cloud, path in zip(sys.argv[1::2], sys.argv[2::2]):
    df = pd.read_csv(path)
    found = common.list_accelerators_impl(cloud, df, gpus_only=True, name_filter=None, region_filter=None,
                                          quantity_filter=None, all_regions=True)
    for name, infos in found.items():
        for i in infos:
            if i.instance_type is None or i.instance_type != i.instance_type:
                continue
            key = f"{name}:{int(i.accelerator_count)}"
            price = float(i.price)
            if price == price and (key not in out or price < out[key][0]):
                out[key] = [price, cloud, i.instance_type, i.region]
print(json.dumps(out))
"""


def skypilot_cheapest(files: dict[str, Path], home: Path) -> dict[str, list]:
    """{"NAME:COUNT": [price, cloud, instance, region]}: the cheapest on-demand offer per accelerator and count as
    SkyPilot's own catalogue code lists them (list_accelerators_impl over each cloud's CSV)."""
    args: list[str] = []
    for cloud, path in files.items():
        args += [cloud, str(path)]
    return json.loads(_run(need_sky(), CHEAPEST, args, home))
