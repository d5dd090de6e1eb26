"""Rank entry point: `accelerate launch ... launch/_worker.py SCRIPT ARGS` runs SCRIPT in this process.

Why a wrapper: torchrun and accelerate mix every rank's output on one console (or tee it to files
torchrun names and never bounds). Here each rank, before running the user's script, connects to
the supervisor's socket (WIZARD_LAUNCH_SOCKET, an abstract unix socket), says who it is
("WIZARD-RANK <rank> <pid>\\n") and puts the socket on its stdout and stderr. The supervisor thus
gets one stream per rank with the rank known for sure: RANK from torchrun (multi-GPU, DeepSpeed,
FSDP) or 0 for accelerate's simple_launcher (one process). If the socket is not there (another
node of a DeepSpeed pdsh launch, a supervisor gone), the script runs with the output it inherited.

It also asks the kernel to SIGKILL this rank if its parent (torchrun's agent, or the simple
launcher) dies: torchrun itself does not, and orphaned ranks keep GPUs busy.

Before the script, two helpers hook the libraries when the script imports them (launch/_hooks.py): the tune
probe (launch/_probe.py, only in a `wizard tune` trial) and launch/_checkpoints.py (rank 0 records where the
training saves its checkpoints; `wizard launch --resume` resumes from the checkpoint it found).

The script then runs exactly as `python SCRIPT ARGS` would run it (runpy, __main__, sys.argv,
sys.path[0] = the script's directory).
"""

from __future__ import annotations

import os
import sys

ENV_SOCKET = "WIZARD_LAUNCH_SOCKET"
PR_SET_PDEATHSIG = 1
STACK_DUMP_OFFSET = 6          # SIGRTMIN + 6: the supervisor asks for this rank's Python stacks


def stack_dump_signal() -> int:
    import signal
    return int(signal.SIGRTMIN) + STACK_DUMP_OFFSET


def _dump_stacks_on_signal() -> None:
    """On a stall the supervisor sends stack_dump_signal(): faulthandler writes every thread's
    Python stack to stderr (the rank's stream), so the report can say which rank is not where the
    others wait (py-spy's answer, without ptrace rights or an extra package)."""
    try:
        import faulthandler
        faulthandler.register(stack_dump_signal(), all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass


def _set_parent_death_signal(sig: int) -> None:
    """A failure goes to stderr, still the launcher's here (the run's launcher.log; the rank's socket comes
    next): the rank then outlives its launcher until the reaper ends it."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        why = os.strerror(ctypes.get_errno()) if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 else None
    except (OSError, AttributeError) as exc:    # no libc to load, or no prctl (not Linux)
        why = f"{type(exc).__name__}: {exc}"
    if why:
        print(f"wizard launch worker: PR_SET_PDEATHSIG failed: {why}", file=sys.stderr, flush=True)


def _connect_output(address: str, rank: int) -> bool:
    import socket
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address.replace("@", "\0", 1) if address.startswith("@") else address)
        s.sendall(f"WIZARD-RANK {rank} {os.getpid()}\n".encode())
    except OSError:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(s.fileno(), 1)
    os.dup2(s.fileno(), 2)
    s.close()
    # line-buffer Python's streams on the socket (PYTHONUNBUFFERED is set too, but be sure)
    try:
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass
    return True


def main() -> None:
    import signal
    if len(sys.argv) < 2:
        print("usage: _worker.py SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    _set_parent_death_signal(signal.SIGKILL)
    rank = int(os.environ.get("RANK", "0"))
    address = os.environ.get(ENV_SOCKET)
    if address and _connect_output(address, rank):
        _dump_stacks_on_signal()
    import _quiet                         # beside this file: library noise the user did not cause (launch/_quiet.py)
    _quiet.quiet_library_noise()
    if os.environ.get("WIZARD_PROBE"):    # a `wizard tune` trial: measure the steps (launch/_probe.py)
        import _probe                     # beside this file: sys.path[0] is still launch/ here
        _probe.install()
    import _checkpoints                   # where checkpoints go (run dir), and `wizard launch --resume`
    _checkpoints.install()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    import runpy
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
