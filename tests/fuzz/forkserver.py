"""Run many `wizard` commands cheaply, each in a process of its own with bounded memory and CPU.

One server process imports the wizard and the libraries its commands load (accelerate, DeepSpeed, transformers)
once; each case is then a fork of it that runs `cli.main(argv)` as `wizard ARGV` would, under an address-space
cap and a CPU-time cap, with its stdout and stderr in files. A fork costs milliseconds where a fresh interpreter
costs seconds of imports, so a minute holds a hundred cases or more.

CPU time, not wall time, bounds a case: the suite may run on a loaded box, and a case that is slow only because
the box is busy must not fail. A wall limit far above the CPU limit still ends a case that blocks (a FIFO, a lock).

Protocol (one JSON object per line): the client writes {"argv", "cwd", "out", "err", "cpu_s", "mem_bytes",
"wall_s"}; the server answers {"code", "signal", "cpu_s", "wall_s"} (code None when a signal ended the case).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# One command of each family, run once in the server before any case: what they import (about 1,900 modules for
# a DeepSpeed check: 4.5 s of CPU) is then shared by every fork instead of loaded again in each.
WARM_UP = (
    ["check", "--ds-config", "snapshots/golden/2node-8xh100-70b/ds_config.json",
     "--config-file", "snapshots/golden/2node-8xh100-70b/default_config.yaml"],
    ["check", "--training-args", "tests/fuzz/warm_up_args.json"],
    ["plan", "--model", "tests/fixtures/models/llama-tiny", "--assume", "1xH100-80GB"],
    ["plan", "--model", "tests/fixtures/models/mixtral-tiny", "--assume", "1xH100-80GB", "--method", "lora"],
    ["compare", "--params", "125M", "--machines", "1xH100-80GB"],
    ["runs", "tests/fuzz"],
)


def _preload() -> None:
    from wizard.frontends import cli
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        for argv in WARM_UP:
            try:
                cli.main(list(argv))
            except BaseException:          # noqa: BLE001 - a warm-up only loads modules; the cases judge
                pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(case: dict) -> None:
    """In the fork: caps, files, `wizard ARGV`, then _exit with its code (never back into the server's loop)."""
    code = 70
    try:
        os.setpgid(0, 0)
        os.chdir(case["cwd"])
        for fd, path in ((1, case["out"]), (2, case["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        cap = _vm_size() + case["mem_bytes"]          # what the case may add to what the server already maps
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        cpu = int(case["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        # sys.stdout was made before the fork over fd 1: a fresh one, as a new interpreter would have
        sys.stdout = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = open(0, "r", closefd=False)
        from wizard.frontends import cli
        code = cli.main(case["argv"])
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as e:                           # argparse: --help, a usage error
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException:                             # noqa: BLE001 - a traceback is the finding
        import traceback
        traceback.print_exc()
        code = 71
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:                         # noqa: BLE001
            pass
        os._exit(code if isinstance(code, int) else 72)


def _run_one(case: dict) -> dict:
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case)
    deadline = start + float(case["wall_s"])
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            done, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    return {"code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.monotonic() - start}


def serve() -> None:
    # The replies go to the pipe that was stdout; what the libraries print while they load goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.chdir(REPO)
    _preload()
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(_run_one(json.loads(line))), file=replies, flush=True)


@dataclass
class Outcome:
    code: int | None
    signal: int | None
    cpu_s: float
    wall_s: float
    stdout: str
    stderr: str


class ForkServer:
    """The client: start the server once, then `run(argv, cwd)` per case."""

    def __init__(self, env: dict[str, str], scratch: Path):
        self.scratch = scratch
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.forkserver"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the fuzz fork server did not start")
        self.count = 0

    def run(self, argv: list[str], cwd: Path, cpu_s: int = 20, mem_bytes: int = 2 << 30,
            wall_s: float = 240) -> Outcome:
        self.count += 1
        out, err = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.err"
        case = {"argv": argv, "cwd": str(cwd), "out": str(out), "err": str(err), "cpu_s": cpu_s,
                "mem_bytes": mem_bytes, "wall_s": wall_s}
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""  # noqa: E731
        return Outcome(reply["code"], reply["signal"], reply["cpu_s"], reply["wall_s"], read(out), read(err))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    serve()
