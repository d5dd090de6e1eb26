"""Why an attempt ended: pure functions from exit codes, log evidence and flags to a Classification.

Evidence (launcher_tui.md §5.2, accelerate.md §5.5-5.6):
- Popen return codes: negative = killed by that signal; a shell's 128+n also means signal n.
- torchrun's ChildFailedError report (in the launcher's output) lists every failed local rank with
  its exit code and marks the "Root Cause (first observed failure)".
- accelerate's simple_launcher raises CalledProcessError "returned non-zero exit status N" or
  "died with <Signals.SIGKILL: 9>" for its single child (rank 0).
- -6/SIGABRT with NCCL text: the ProcessGroupNCCL watchdog aborted the rank.
- -9/SIGKILL nobody asked for: the kernel OOM killer only when the kernel log says so; a kernel log
  without an OOM kill means someone (a user, a job manager) sent it; an unreadable one leaves the
  cause unknown, and the report says exactly that.
- SIGABRT (134) after the training's last line (the Trainer's train_runtime summary): a crash in
  the interpreter's or a library's shutdown; the training itself finished, so it is not restarted.
- -15/SIGTERM (or SIGINT/SIGHUP) after another rank failed: collateral, torn down by the agent.
- "CUDA out of memory" / "OutOfMemoryError" in a rank's log: the plan's next rung is the fix.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import asdict, dataclass, field
from typing import Any

from wizard.planning import rungs as rung_table

KINDS = ("python_exception", "nccl_abort", "oom_killed", "cuda_oom", "collateral", "stall", "signal",
         "shutdown_crash", "unknown")
NOT_RESTARTED = ("shutdown_crash",)       # the training finished: another attempt would redo it all
COLLATERAL_SIGNALS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
TAIL_LINES = 30
# std::terminate's message for a joinable std::thread destroyed at exit (pytorch/pytorch#190489: gloo's workers
# when the process group was never destroyed).
THREADS_AT_EXIT = "terminate called without an active exception"


@dataclass
class RankOutcome:
    rank: int
    exit_code: int | None = None          # Popen style: negative = signal; None = not known
    ended_at: float | None = None         # when its output stream closed (epoch s)
    traceback_at: float | None = None
    cuda_oom_at: float | None = None
    nccl_at: float | None = None
    last_exception: str | None = None     # "ValueError: boom"
    last_output_at: float | None = None
    log_tail: list[str] = field(default_factory=list)
    pid: int | None = None
    stack: list[str] | None = None        # after a stall: its main thread's Python stack, innermost first


@dataclass
class AttemptOutcome:
    launcher_exit: int | None
    ranks: list[RankOutcome] = field(default_factory=list)
    stop_requested: bool = False
    stalled: bool = False
    stall_timeout_s: float | None = None
    stall_now: float | None = None        # when the stall was declared
    gpus_idle: bool | None = None         # None: no NVML
    launcher_tail: list[str] = field(default_factory=list)
    oom_killer_seen: bool | None = None   # dmesg: None when unreadable
    next_rung: str | None = None          # for CUDA OOM: the plan's next rung (name)
    suggested_command: str | None = None
    # ... and `wizard launch --resume` of this run on the new files, or "CANNOT: why" where its checkpoints cannot
    # be loaded there (launch/resume.py refusal_across)
    resume_command: str | None = None
    training_finished_at: float | None = None   # first sight of the Trainer's end-of-training summary


@dataclass
class Classification:
    kind: str
    rank: int | None
    exit_code: int | None
    signal: str | None
    summary: str
    hint: str
    log_tail: list[str] = field(default_factory=list)
    next_rung: str | None = None
    suggested_command: str | None = None
    resume_command: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ exit codes

def decode_exit(code: int | None) -> tuple[int | None, int | None]:
    """(exit status, signal number): -9 -> (None, 9); 137 -> (137, 9); 1 -> (1, None)."""
    if code is None:
        return None, None
    if code < 0:
        return None, -code
    if 128 < code <= 128 + 64:
        return code, code - 128
    return code, None


def signal_name(num: int | None) -> str | None:
    if num is None:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def shell_exit_code(code: int | None) -> int:
    """What `wizard launch` exits with for a rank's code: signals as 128+n, like a shell."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


# ------------------------------------------------------------------ launcher output

_FAIL_HEADER = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")
_RANK_FIELD = re.compile(r"(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_FIELD = re.compile(r"(-?\d+)\s*\(pid:\s*(\d+)\)")
_SIMPLE_STATUS = re.compile(r"returned non-zero exit status (-?\d+)")
_SIMPLE_SIGNAL = re.compile(r"died with <Signals\.(\w+): (\d+)>")
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


def parse_torchrun_failures(lines: list[str]) -> list[dict[str, Any]]:
    """Failed ranks from torchrun's ChildFailedError report: [{rank, local_rank, exit_code, pid, root_cause}]."""
    out: list[dict[str, Any]] = []
    section = None
    cur: dict[str, Any] | None = None
    for line in lines:
        s = line.rstrip()
        if "Root Cause (first observed failure)" in s:
            section = "root"
            continue
        if s.strip().startswith("Failures:") or s.strip() == "Other Failures:":
            section = "other"
            continue
        if _FAIL_HEADER.match(s) and section:
            cur = {"rank": None, "local_rank": None, "exit_code": None, "pid": None,
                   "root_cause": section == "root"}
            out.append(cur)
            continue
        m = _FIELD.match(s)
        if m and cur is not None:
            key, val = m.group(1), m.group(2)
            if key == "rank":
                r = _RANK_FIELD.search(val)
                if r:
                    cur["rank"], cur["local_rank"] = int(r.group(1)), int(r.group(2))
            elif key == "exitcode":
                e = _EXIT_FIELD.search(val)
                if e:
                    cur["exit_code"], cur["pid"] = int(e.group(1)), int(e.group(2))
    if not out:       # the agent's own line, e.g. when the summary was cut off
        for line in lines:
            m = _AGENT_FAILED.search(line)
            if m:
                out.append({"rank": None, "local_rank": int(m.group(2)), "exit_code": int(m.group(1)),
                            "pid": int(m.group(3)), "root_cause": not out})
    return [f for f in out if f["rank"] is not None or f["local_rank"] is not None]


def parse_simple_launcher_exit(lines: list[str]) -> int | None:
    """The single child's exit code from accelerate's simple_launcher CalledProcessError."""
    for line in reversed(lines):
        m = _SIMPLE_SIGNAL.search(line)
        if m:
            return -int(m.group(2))
        m = _SIMPLE_STATUS.search(line)
        if m:
            return int(m.group(1))
    return None


def dmesg_oom_evidence(text: str | None, pids: list[int]) -> bool | None:
    """True if dmesg shows the OOM killer taking one of `pids`; None when dmesg wasn't readable."""
    if text is None:
        return None
    for line in text.splitlines():
        if "Out of memory" in line or "oom-kill" in line or "Killed process" in line:
            if not pids or any(re.search(rf"\b{p}\b", line) for p in pids):
                return True
    return False


_THREAD_HEAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):")
_FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)')
# where a rank waits for the others: a collective, or the backward pass (DDP's and ZeRO's gradient
# reductions wait inside autograd)
WAITING_PATHS = ("/torch/distributed/", "/deepspeed/comm/", "/torch/autograd/", "/torch/nn/parallel/distributed.py")


def main_thread_stack(lines: list[str]) -> list[str] | None:
    """From a faulthandler dump in a rank's log (the last one), the main thread's frames as
    "func (file:line)", innermost first: the thread whose stack reaches launch/_worker.py."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in lines:
        if _THREAD_HEAD.match(line.strip()):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m.group(1), int(m.group(2)), m.group(3)))
    # the dump lists every thread once: take the last dump's threads (the newest run of heads)
    for frames in reversed(threads):
        if any(f.endswith("_worker.py") for f, _l, _fn in frames):
            return [f"{fn} ({f}:{ln})" for f, ln, fn in frames]
    return None


def waiting_for_others(stack: list[str] | None) -> bool | None:
    if not stack:
        return None
    return any(p in frame for frame in stack for p in WAITING_PATHS)


# ------------------------------------------------------------------ next rung for CUDA OOM

# The rungs (labels, flags, where an OOM goes next without a saved plan) are wizard.planning.rungs' table: pure
# data, cheap to import.


def wizard_command_for(rung: dict[str, Any]) -> str:
    """`wizard --non-interactive ...` flags that select this rung (keep your model/training flags)."""
    parts = ["wizard", "--non-interactive"] + _spec_of(rung).cli_flags()
    if rung.get("gradient_checkpointing"):
        parts += ["--gradient-checkpointing", "on"]
    return " ".join(parts)


def _spec_of(rung: dict[str, Any]) -> rung_table.RungSpec:
    """The table's entry for a rung of the plan's JSON: by key, else by its flags."""
    spec = rung_table.BY_KEY.get(rung.get("key") or "")
    if spec is not None:
        return spec
    strategy = rung_table.Strategy(rung.get("backend") or "single", rung.get("zero_stage"),
                              rung.get("offload_optimizer") or "none", rung.get("offload_param") or "none",
                              rung.get("fsdp_reshard"), offload_fsdp=(rung.get("offload_param") or "none") != "none")
    return rung_table.BY_KEY[rung_table.key_for(strategy, exact=False) or "single"]


def _rung_from_key(key: str) -> dict[str, Any]:
    spec = rung_table.BY_KEY[key]
    return {"key": key, "name": spec.label, "backend": spec.backend, "zero_stage": spec.zero_stage,
            "offload_optimizer": spec.offload_optimizer, "offload_param": spec.offload_param,
            "fsdp_reshard": spec.fsdp_reshard}


def current_rung_key(accel_config: dict[str, Any] | None, ds_config: dict[str, Any] | None) -> str | None:
    """Which ladder rung the running config is, from the YAML and the DeepSpeed JSON."""
    strategy = rung_table.strategy_from_files(accel_config, ds_config)
    return None if strategy is None else rung_table.key_for(strategy, exact=False)


def _plan_next(rungs: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The plan's next rung (planning's rule, rungs.next_after) on the plan's JSON form."""
    return rung_table.next_after(rungs, key, lambda r: r.get("key"), lambda r: bool(r.get("fits")))


def next_rung_after(key: str | None, plan: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The rung after `key`: the plan's own choice of next rung when it has one, else DESIGN.md's ladder."""
    if plan:
        rungs = plan.get("rungs") or []
        k = (plan.get("choice") or {}).get("key") or key
        if k in [r.get("key") for r in rungs]:
            found = _plan_next(rungs, k)
            if found is not None:
                return found
        key = key or k
    if key is None or key not in rung_table.BY_KEY:
        return None
    following = rung_table.BY_KEY[key].oom_next
    return _rung_from_key(following) if following else None


def resume_command_for(run_dir: str, config_file: str | None, script: str, script_args: list[str]) -> str:
    """`wizard launch --resume RUN_DIR ... -- SCRIPT ARGS`: this run continued on the files the next rung's command
    writes (the same config path, so the wizard command is given that directory)."""
    import shlex
    parts = ["wizard", "launch", "--resume", run_dir]
    if config_file:
        parts += ["--config-file", config_file]
    return shlex.join(parts + ["--", script, *script_args])


def suggest_for_cuda_oom(plan: dict[str, Any] | None, accel_config: dict[str, Any] | None,
                         ds_config: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(next rung's name, the wizard command producing it) for a CUDA out-of-memory."""
    plan = (plan or {}).get("plan", plan)        # wizard_plan.json nests the plan under "plan"
    rung = next_rung_after(current_rung_key(accel_config, ds_config), plan)
    if rung is None:
        return None, None
    return rung.get("name") or rung.get("key"), wizard_command_for(rung)


# ------------------------------------------------------------------ classification

def _rank_kind(r: RankOutcome, stop_requested: bool, oom_killer_seen: bool | None = None,
               training_finished_at: float | None = None) -> str | None:
    """What happened to one rank, or None if it shows no sign of failure."""
    _status, sig = decode_exit(r.exit_code)
    if (sig == _signal.SIGABRT and training_finished_at is not None and r.cuda_oom_at is None
            and (r.ended_at is None or r.ended_at >= training_finished_at)):
        return "shutdown_crash"
    if r.cuda_oom_at is not None:
        return "cuda_oom"
    if r.nccl_at is not None and (sig == _signal.SIGABRT or r.exit_code not in (None, 0)):
        return "nccl_abort"
    if sig == _signal.SIGABRT and r.nccl_at is not None:
        return "nccl_abort"
    if sig == _signal.SIGKILL:
        if stop_requested:
            return "collateral"
        return "oom_killed" if oom_killer_seen else "signal"     # only the kernel log makes it an OOM kill
    if sig in COLLATERAL_SIGNALS:
        return "collateral"
    if r.traceback_at is not None and r.exit_code not in (0,):
        return "python_exception"
    if sig is not None:
        return "signal"
    if r.exit_code not in (None, 0):
        return "unknown"
    return None


def _failure_time(r: RankOutcome) -> float:
    times = [t for t in (r.cuda_oom_at, r.nccl_at, r.traceback_at, r.ended_at) if t is not None]
    return min(times) if times else float("inf")


HINTS = {
    "python_exception": "rank {rank} raised {exc}; fix the error in the traceback below (the other ranks were stopped as collateral)",
    "cuda_oom": "rank {rank} ran out of GPU memory",
    "nccl_abort": ("rank {rank} was aborted by the NCCL watchdog: a collective timed out, usually because one rank "
                   "is stuck or took a different code path; rerun with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                   "TORCH_NCCL_DUMP_ON_TIMEOUT=1 for a Flight Recorder dump"),
    "oom_killed": ("rank {rank} was SIGKILLed by the kernel OOM killer (host RAM; the kernel log confirms); "
                   "lower CPU offload, dataloader workers or per-process RAM"),
    "shutdown_crash": ("rank {rank} aborted ({sig}) after the training's last line: the training finished and "
                       "something crashed while the process shut down (often a library's threads at exit); "
                       "the results are there, the run is not restarted"),
    "collateral": "rank {rank} was terminated by the launcher after another failure (not the cause)",
    "signal": "rank {rank} died of {sig}{native}{cause}",
    "unknown": "rank {rank} exited with code {code}; see the log tail",
}


def classify(o: AttemptOutcome) -> Classification | None:
    """The attempt's failure, or None for a clean exit (or a stop nobody needs explained)."""
    if o.stalled:
        return _classify_stall(o)
    failing = []
    for r in o.ranks:
        kind = _rank_kind(r, o.stop_requested, o.oom_killer_seen, o.training_finished_at)
        if kind is not None:
            failing.append((kind, r))
    if o.stop_requested and all(k == "collateral" for k, _ in failing):
        return None
    if not failing:
        if o.launcher_exit in (0, None):
            return None
        status, sig = decode_exit(o.launcher_exit)
        return Classification(
            kind="signal" if sig else "unknown", rank=None, exit_code=o.launcher_exit, signal=signal_name(sig),
            summary=f"accelerate launch exited with {o.launcher_exit} and no rank reported a failure",
            hint="the launcher failed before or around the ranks: see launcher.log",
            log_tail=o.launcher_tail[-TAIL_LINES:])
    causes = [(k, r) for k, r in failing if k != "collateral"] or failing
    kind, first = min(causes, key=lambda kr: (_failure_time(kr[1]), kr[1].rank))
    _status, sig = decode_exit(first.exit_code)
    exc = first.last_exception or "an exception"
    fmt = {"rank": first.rank, "exc": exc, "sig": signal_name(sig) or "a signal", "code": first.exit_code,
           "cause": ("" if sig != _signal.SIGKILL else
                     {False: "; the kernel log shows no OOM kill: it was sent by a user or another program",
                      None: " (cause unknown: the kernel log is not readable here)"}.get(o.oom_killer_seen, "")),
           "native": " (a native crash; SIGBUS often means /dev/shm is too small)"
           if sig in (_signal.SIGSEGV, _signal.SIGBUS) else ""}
    hint = HINTS[kind].format(**fmt)
    next_rung = cmd = None
    if kind == "shutdown_crash" and any(THREADS_AT_EXIT in line for line in first.log_tail):
        hint += ("; here a C++ thread was still running at exit, as gloo's are when the script never calls "
                 "torch.distributed.destroy_process_group(): call it at the end of the script")
    resume = None
    if kind == "cuda_oom":
        next_rung, cmd, resume = o.next_rung, o.suggested_command, o.resume_command
        hint += (f": the plan's next rung is {next_rung}: `{cmd}` (same model and training flags)"
                 if next_rung else ": lower --micro-batch or turn on --gradient-checkpointing")
        if resume and resume.startswith("CANNOT: "):
            hint += f"; this run's checkpoints cannot continue there: {resume[len('CANNOT: '):]}"
            resume = None
        elif resume:
            hint += f"; then `{resume}` continues from this run's last complete checkpoint"
    others = sorted(r.rank for k, r in failing if r is not first)
    summary = {
        "python_exception": f"rank {first.rank} failed: {exc}",
        "cuda_oom": f"rank {first.rank}: CUDA out of memory",
        "nccl_abort": f"rank {first.rank}: NCCL watchdog abort",
        "oom_killed": f"rank {first.rank} killed (SIGKILL) by the kernel OOM killer",
        "shutdown_crash": f"rank {first.rank} crashed during shutdown after training finished ({signal_name(sig)})",
        "collateral": f"rank {first.rank} terminated ({signal_name(sig)})",
        "signal": (f"rank {first.rank} killed by signal {sig} (cause unknown)"
                   if sig == _signal.SIGKILL and o.oom_killer_seen is None else
                   f"rank {first.rank} killed by signal {sig} ({signal_name(sig)}), not the OOM killer"
                   if sig == _signal.SIGKILL else f"rank {first.rank} died of {signal_name(sig)}"),
        "unknown": f"rank {first.rank} exited with code {first.exit_code}",
    }[kind]
    if others:
        summary += f"; then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} stopped"
    return Classification(kind=kind, rank=first.rank, exit_code=first.exit_code, signal=signal_name(sig),
                          summary=summary, hint=hint, log_tail=first.log_tail[-TAIL_LINES:],
                          next_rung=next_rung, suggested_command=cmd, resume_command=resume)


def _classify_stall(o: AttemptOutcome) -> Classification:
    now = o.stall_now or 0.0
    silent = []
    for r in sorted(o.ranks, key=lambda r: (r.last_output_at or 0.0, r.rank)):
        age = now - r.last_output_at if r.last_output_at else None
        silent.append(f"rank {r.rank}: " + (f"silent {age:.0f} s" if age is not None else "never wrote"))
    first = min(o.ranks, key=lambda r: (r.last_output_at or 0.0, r.rank)) if o.ranks else None
    gpu = {True: " and every GPU idle", False: "", None: " (no GPU metrics: log silence only)"}[o.gpus_idle]
    summary = f"stall: no output from any rank for {o.stall_timeout_s:g} s{gpu}"
    waiting = [r for r in o.ranks if waiting_for_others(r.stack) is True]
    elsewhere = [r for r in o.ranks if waiting_for_others(r.stack) is False]
    if waiting and elsewhere:
        # the others wait in a collective (or backward) for it: the rank that is somewhere else
        # stopped first, whatever its last line's time says
        first = min(elsewhere, key=lambda r: r.rank)
        where = first.stack[0] if first.stack else "?"
        summary += f"; rank {first.rank} stalled at {where}"
        hint = (f"rank {first.rank} is not where the others are: its main thread is at {where}; "
                f"rank{'s' if len(waiting) > 1 else ''} {', '.join(str(r.rank) for r in sorted(waiting, key=lambda r: r.rank))} "
                f"wait{'' if len(waiting) > 1 else 's'} for it in a collective. " + "; ".join(silent) +
                ". Stacks from faulthandler are in each rank's log (py-spy dump --pid PID gives native frames too)")
    else:
        hint = ("; ".join(silent) + ". The rank silent longest is the first suspect; the ranks' Python stacks "
                "(faulthandler) are at the end of their logs where they could be taken; py-spy dump --pid PID "
                "gives native frames too")
    return Classification(kind="stall", rank=first.rank if first else None, exit_code=None, signal=None,
                          summary=summary, hint=hint, log_tail=(first.log_tail if first else [])[-TAIL_LINES:])
