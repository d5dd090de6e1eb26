"""Shared by every test: nothing the machine happens to be doing decides a result.

- No test reads the calibration `wizard tune` left on this machine.
- Port 29500 (accelerate's default, in most configs the tests write) counts as free: on a busy CI box, or with
  pytest-xdist, another job's or another worker's launch may hold it, and the ACC-PORT-IN-USE warning would
  then appear in snapshots, goldens and finding lists. Every other port is probed for real, so the tests of the
  rule bind a port of their own (or pass `port_in_use`).
- This machine's memlock limit (`ulimit -l`) reads as unlimited: DS-PIN-MEMORY-MEMLOCK would otherwise warn on
  every pinned CPU-offload config on a box with the usual 8 MiB; its tests pass `memlock_limit`.
- DeepSpeed's JIT-built ops go to a folder of this environment's own (TORCH_EXTENSIONS_DIR under sys.prefix, unless
  set): ~/.cache/torch_extensions is shared by every venv on the machine, and a suite with another DeepSpeed
  (CI's oldest-versions run, a second checkout) rebuilding an op there under a running launch made it fail
  ("deepspeed_shm_comm has no attribute 'vector_kernel_level'"). Set at import, before any test, so the
  processes the tests launch inherit it.
- The files are collected longest first (tests/file_order.py), for the order pytest-xdist hands them out in.
"""

from __future__ import annotations

import os

import pytest

from tests.build_ops import EXTENSIONS_DIR   # the folder `python -m tests.build_ops` fills before the suite
from tests.file_order import longest_files_first

os.environ.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS_DIR)

DEFAULT_PORT = 29500


def pytest_collection_modifyitems(config, items):
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[n] for n in longest_files_first(list(by_id))]


CPU_LOG = os.environ.get("WIZARD_TEST_CPU_LOG")


def _cpu_seconds() -> float:
    """This worker's CPU time and that of the children it has reaped (a launch's whole tree: each waits for its own)."""
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if CPU_LOG:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """WIZARD_TEST_CPU_LOG=FILE: a JSON line per test with its wall and CPU seconds (setup, call and teardown).
        CPU time barely moves with the box's load, so a run on a busy box still says where the suite's time goes
        (`python -m tests.file_order --cpu FILE` sums it per file)."""
        import json
        import time
        start, cpu = time.monotonic(), _cpu_seconds()
        yield
        with open(CPU_LOG, "a") as f:
            f.write(json.dumps({"id": item.nodeid, "wall": round(time.monotonic() - start, 2),
                                "cpu": round(_cpu_seconds() - cpu, 2)}) + "\n")


@pytest.fixture(autouse=True)
def _no_user_calibration(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(tmp_path_factory.mktemp("calibration") / "calibration.json"))


@pytest.fixture(autouse=True)
def _no_user_preflight_key(tmp_path_factory, monkeypatch):
    """The preflight's key file in a place of the test's own (the nodes a test starts on this box share it, as a
    shared home's nodes do), never the user's ~/.config/wizard/preflight.key; no secret from the environment."""
    monkeypatch.setenv("WIZARD_PREFLIGHT_KEY_FILE", str(tmp_path_factory.mktemp("preflight-key") / "preflight.key"))
    monkeypatch.delenv("WIZARD_PREFLIGHT_SECRET", raising=False)


@pytest.fixture(autouse=True)
def _default_port_is_free(monkeypatch):
    from wizard.check.rules import accelerate_yaml

    real = accelerate_yaml.port_in_use
    monkeypatch.setattr(accelerate_yaml, "port_in_use", lambda port: port != DEFAULT_PORT and real(port))


@pytest.fixture(autouse=True)
def _memlock_is_unlimited(monkeypatch):
    from wizard.check.rules import deepspeed_json

    monkeypatch.setattr(deepspeed_json, "memlock_limit", lambda: None)
