"""Running children: their own session, a timeout, SIGTERM then SIGKILL for the whole group, the
driver's own SIGTERM/SIGINT turned into Interrupted; the run's options and time budget."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.gpu.common import MARKER, REPO

_current: dict[str, Any] = {"proc": None, "group": []}


class Interrupted(BaseException):
    """SIGTERM/SIGINT (the outer timeout): stop, keep what was measured, write the report."""


def on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a child we started and everything beneath it (it leads its own session)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_current_child() -> None:
    """End the child running now, if any: on the way out the driver leaves no process behind."""
    proc = _current.get("proc")
    if proc is not None:
        kill_group(proc)
    for proc in list(_current.get("group") or []):
        kill_group(proc)


def run_child(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path | None = None,
              grace: float = 5.0) -> dict[str, Any]:
    """Run cmd in its own session with a timeout; returns returncode, stdout lines, timed_out, wall_s.
    On timeout the group gets SIGTERM, `grace` seconds, then SIGKILL."""
    t0 = time.monotonic()
    log = open(log_path, "w") if log_path else None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log or subprocess.STDOUT, text=True, env=env,
                                cwd=str(REPO), start_new_session=True)
        _current["proc"] = proc
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc, grace)
        except BaseException:          # Interrupted: the child must not outlive the measurement
            kill_group(proc, grace=2)
            raise
        finally:
            _current["proc"] = None
        reader.join(timeout=5)
        if proc.poll() is None:
            kill_group(proc)
        return {"returncode": proc.returncode, "timed_out": timed_out, "lines": lines,
                "wall_s": round(time.monotonic() - t0, 1)}
    finally:
        if log:
            log.close()


def run_children(jobs: list[tuple[list[str], dict[str, str], Path]], timeout: float,
                 grace: float = 5.0) -> list[dict[str, Any]]:
    """Several children at once (the ranks of one job), each in its own session, one deadline for all; on
    timeout or interruption every one that is left is ended. One dict per job, as run_child's."""
    t0 = time.monotonic()
    procs, logs, readers, lines = [], [], [], []
    try:
        for cmd, env, log_path in jobs:
            log = open(log_path, "w")
            logs.append(log)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=str(REPO),
                                    start_new_session=True)
            procs.append(proc)
            _current["group"] = list(procs)
            out: list[str] = []
            lines.append(out)
            reader = threading.Thread(target=lambda p=proc, o=out: o.extend(p.stdout), daemon=True)
            reader.start()
            readers.append(reader)
        timed_out = [False] * len(procs)
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(timeout - (time.monotonic() - t0), 1))
            except subprocess.TimeoutExpired:
                timed_out[i] = True
                kill_group(proc, grace)
        for reader in readers:
            reader.join(timeout=5)
        return [{"returncode": p.returncode, "timed_out": timed_out[i], "lines": lines[i],
                 "wall_s": round(time.monotonic() - t0, 1)} for i, p in enumerate(procs)]
    finally:
        for proc in procs:              # Interrupted, or a failed start: no rank outlives the measurement
            if proc.poll() is None:
                kill_group(proc, grace=2)
        _current["group"] = []
        for log in logs:
            log.close()


def parse_result_line(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


@dataclass
class Options:
    out_md: Path
    quick: bool
    dry_run: bool
    budget_s: float
    case_timeout_s: float
    launch_reserve_s: float
    min_case_s: float
    steps: int
    launch_seconds: float
    assume: str | None
    results_dir: Path = Path(".")
    min_tune_s: float = 60.0              # tune starts only with this much left before the launch reserve
    alst: bool = False                    # --alst: only cases.json's ALST series (no grid, premise, tune or launch)


class Budget:
    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.total = total_s

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.total - self.elapsed()


def keep_tail(src: Path, dst: Path, lines: int = 200) -> None:
    """The end of a child's stderr, beside the results (the work dir is deleted)."""
    try:
        text = src.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return
    dst.write_text("\n".join(line for line in text[-lines:]) + "\n")
