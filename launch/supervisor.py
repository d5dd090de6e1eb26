"""The supervisor: runs `accelerate launch` attempts, captures every rank, and owns teardown.

Process picture (one attempt):

    supervisor (this) ──pipe──> reaper (own session; if we die: records `lost`, kills everything)
        │  Popen, own session, PR_SET_PDEATHSIG=SIGTERM
        └─ accelerate launch ... launch/_worker.py SCRIPT ARGS      (torchrun agent in-process)
               └─ rank processes (torchrun: each in its own session; PDEATHSIG=SIGKILL via _worker)
                      stdout+stderr ──abstract unix socket──> supervisor (one stream per rank)

- Every process under the launcher is tracked by pid (psutil, refreshed every 0.5 s, plus each
  rank's hello on the socket) and its (pid, create time) is sent to the reaper at once. A connection
  to the socket speaks for a rank only when the kernel's peer credentials say it is a process of
  this user's under the launcher, saying its own pid (launch/trust.py); others are refused and said.
- Stop = SIGTERM to the launcher and to every tracked process, `grace` seconds, SIGKILL to what is
  left. Used for `wizard stop`, ^C, a stall, and any process left behind after the launcher exits.
- Restarts (whole group, new attempt number) are ours: accelerate gets --max_restarts 0.
- State goes to the run directory (launch/rundir.py): run.json, events.jsonl, metrics.jsonl, logs.

Control (the view's protocol, launch/follow.py): RUN_DIR/control.json {"request": "stop"|"kill"|
"restart", "id"} plus a doorbell signal: SIGTERM = stop, SIGUSR1 = restart, SIGUSR2 = kill.
SIGINT is a stop too (a second one kills). SIGHUP is a stop in a foreground run, unless it was
ignored when we started (nohup); a detached supervisor has no terminal to hang up.
Foreground means foreground: the supervisor the view starts is its child with PR_SET_PDEATHSIG =
parent_death_signal() (a real-time signal of its own, whose handler it installs itself: an
inherited "ignore", such as nohup's for SIGHUP, cannot disable it), so the run ends (graceful stop,
then the grace) when the `wizard launch` the user started dies or its terminal takes it along. {"request": "detach"} (the view's `d`) clears that and marks the run
detached; `--detach` starts it detached.

Only processes whose (pid, start time) the supervisor recorded (run.json process_times) are ever
signalled, by it, by the reaper or by `wizard stop`: a reused pid is never hit. The run
directory's lock (run.lock, flock) is held for the whole run.

Exit code: 0 on success; after restarts are spent, the first failing rank's exit code (a signal n
as 128+n), else the launcher's; 124 for a stall; 130 when stopped on request.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from launch import classify as cls
from launch.accel_config import ds_config_path, world_size_of
from launch.logs import StreamCapture
from launch.processes import ProcessGroup, create_time, parent_death_signal, set_parent_death_signal
from launch.record import RunRecord
from launch.rundir import (
    CONTROL_FILE,
    EventLog,
    RotatingLog,
    RunState,
    attempt_dir,
    launcher_log_path,
    rank_log_path,
    tail_lines,
)
from launch.spec import LaunchSpec, build_command, free_port_instead, load_plan_near, rendezvous_port
from launch.trust import peer_problem
from wizard.fsutil import read_json_object, read_yaml_mapping
from wizard.paths import accelerate_default_config_file
from wizard.units import fmt_clock, printable

ENV_SOCKET = "WIZARD_LAUNCH_SOCKET"
SCAN_EVERY_S = 0.5
DRAIN_AFTER_EXIT_S = 2.0
STALL_EXIT_CODE = 124
STOPPED_EXIT_CODE = 130
MAX_REFUSALS_SHOWN = 5          # refused socket connections said per attempt (a flood must not flood the output)
MAX_RANK = 1 << 20
# who sent a control.json request (launch/follow.py send_control's `sender`), as run.json's stop_reason says it
CONTROL_SENDERS = {"cli": "`wizard stop`", "view": "the live view", "tune": "`wizard tune`"}
GPU_IDLE_UTIL = 5
STACK_WAIT_S = 2.0          # after a stall: time for the ranks' stack dumps to arrive before teardown
STACK_TAIL_LINES = 600

# Exec shim for the launcher: PR_SET_PDEATHSIG must be set in the child between fork and exec;
# preexec_fn is unsafe with the sampler thread running, so a tiny interpreter sets it and execs.
_SHIM = (
    "import ctypes,os,sys,signal\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(143)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def read_dmesg() -> str | None:
    try:
        r = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=3)
        if r.returncode == 0 and r.stdout:
            return r.stdout[-200_000:]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


class _NoNvml:
    available = False

    def __init__(self, reason: str):
        self.reason = reason

    def devices(self):
        return []

    def sample(self):
        return []

    def close(self):
        pass


def open_nvml_safely():
    try:
        from wizard.probe.nvml import open_nvml
        return open_nvml()
    except Exception as exc:  # start without metrics, never not at all: bad WIZARD_FAKE_NVML, a binding's surprise
        return _NoNvml(f"NVML unavailable: {type(exc).__name__}: {exc}".rstrip(": "))


# ------------------------------------------------------------------ the supervisor

class Supervisor:
    def __init__(self, spec: LaunchSpec, out: BinaryIO | None = None, lock_fd: int | None = None,
                 parent: int | None = None):
        self.spec = spec
        self.parent = parent              # foreground: the `wizard launch` whose death stops the run
        self.lock_fd = lock_fd            # held (never closed) while we run: one run per directory
        self.run_dir = Path(spec.run_dir)
        self.out = out if out is not None else sys.stdout.buffer
        self.config_file = spec.config_file
        if self.config_file is None and os.path.isfile(accelerate_default_config_file()):
            self.config_file = accelerate_default_config_file()
        self.accel = read_yaml_mapping(self.config_file) if self.config_file else None
        self.ds_config_file = ds_config_path(self.accel)
        events = EventLog(self.run_dir / "events.jsonl", spec.jsonl_cap_bytes)
        self.command = build_command(spec, self.accel, self.config_file)
        now = time.time()
        state = RunState(self.run_dir, {
            "id": self.run_dir.name, "command": self.command, "script": spec.script,
            "script_args": list(spec.script_args), "config_file": self.config_file,
            "ds_config": self.ds_config_file, "cwd": spec.cwd or os.getcwd(), "run_dir": str(self.run_dir),
            "attempt": 0, "max_restarts": spec.max_restarts, "status": "starting",
            "supervisor_pid": os.getpid(), "supervisor_create_time": create_time(os.getpid()),
            "launcher_pid": None, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
            "user_restarts": 0, "started_at": now,
            "attempt_started_at": None, "ended_at": None, "exit_code": None, "classification": None,
            "detached": spec.detached, "headless": spec.headless, "world_size": world_size_of(self.accel),
            "grace_s": spec.grace, "stall_timeout_s": spec.stall_timeout,
            "main_process_port": rendezvous_port(spec, self.accel), "resume": spec.resume,
            "progress": {"step": None, "total": None, "rate": None, "eta_s": None, "loss": None,
                         "learning_rate": None, "grad_norm": None, "epoch": None},
        })
        state.save()
        self.record = RunRecord(state, events)
        self.stop_requested = False
        self.kill_requested = False
        self.restart_requested = False
        self.stop_reason: str | None = None     # why it was stopped, for run.json and `wizard runs`
        self._sigint_count = 0
        self._handled_control: set[str] = set()
        self._control_mtime = 0.0
        self.reaper: subprocess.Popen | None = None
        self.sampler = None
        self.metrics_writer = None
        self.metrics_summary = None
        self.gpu_active_at: float | None = None
        self.nvml_available = False
        self.pid_rank: dict[int, int] = {}

    # ---------------------------------------------------------------- output

    def say(self, text: str) -> None:
        if not self.spec.headless:
            return
        try:
            self.out.write(("".join(f"[wizard] {ln}\n" for ln in text.splitlines())).encode())
            self.out.flush()
        except (OSError, ValueError):
            pass

    # ---------------------------------------------------------------- signals and control

    def _install_signals(self) -> None:
        def on_term(signum, frame):
            self._doorbell("stop", "SIGTERM")

        def on_int(signum, frame):
            self._sigint_count += 1
            self._doorbell("kill" if self._sigint_count > 1 else "stop", "SIGINT (Ctrl-C)")

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_int)
        signal.signal(signal.SIGUSR1, lambda s, f: self._doorbell("restart"))
        signal.signal(signal.SIGUSR2, lambda s, f: self._doorbell("kill"))
        if self.spec.detached or signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGHUP, lambda s, f: None if self.spec.detached else
                          self._doorbell("stop", "SIGHUP (its terminal closed)"))
        # installed here whatever the disposition we inherited: the parent's death always stops a foreground run
        signal.signal(parent_death_signal(), lambda s, f: None if self.spec.detached else
                      self._doorbell("stop", "the process that started it ended"))
        if self.parent is not None and not self.spec.detached and os.getppid() != self.parent:
            self._doorbell("stop", "the process that started it ended")   # before the handler above was in place

    def _doorbell(self, default: str, why: str | None = None) -> None:
        """A signal arrived: act on an unhandled control.json request, else on the signal's own meaning (`why`:
        the signal, kept as the stop's reason when no request gives one)."""
        req = self._read_control()
        if req is None and why and default in ("stop", "kill") and self.stop_reason is None:
            self.stop_reason = why
        self._apply_request(req or default)

    def _read_control(self) -> str | None:
        path = self.run_dir / CONTROL_FILE
        try:
            st = path.stat()
        except OSError:
            return None
        self._control_mtime = st.st_mtime
        body = read_json_object(path) or {}
        rid = body.get("id")
        if not rid or rid in self._handled_control:
            return None
        self._handled_control.add(rid)
        req = body.get("request")
        if req in ("stop", "kill") and self.stop_reason is None:
            # `wizard tune` says why it stops a trial (its time limit, an interruption); else who asked
            reason = body.get("reason")
            self.stop_reason = reason if isinstance(reason, str) and reason else \
                f"{req} requested ({CONTROL_SENDERS.get(body.get('from'), body.get('from') or 'control.json')})"
        return req if req in ("stop", "kill", "restart", "detach") else None

    def poll_control(self) -> None:
        """Act on a control.json request that came without a doorbell signal (the file is checked by mtime)."""
        try:
            m = (self.run_dir / CONTROL_FILE).stat().st_mtime
        except OSError:
            return
        if m != self._control_mtime:
            req = self._read_control()
            if req:
                self._apply_request(req)

    def _apply_request(self, req: str) -> None:
        if req == "stop":
            self.stop_requested = True
        elif req == "kill":
            self.stop_requested = True
            self.kill_requested = True
        elif req == "restart":
            self.restart_requested = True
        elif req == "detach":
            self.detach()

    def detach(self) -> None:
        """From now on the run outlives the process that started it and its terminal."""
        self.spec.detached = True
        set_parent_death_signal(0)
        try:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        except ValueError:         # not the main thread (tests): the flag above is checked too
            pass
        self.record.update(detached=True)
        self.record.emit("detached", self.record.get("attempt"))

    # ---------------------------------------------------------------- reaper and metrics

    def _start_reaper(self) -> None:
        env = dict(os.environ)
        env.pop(ENV_SOCKET, None)
        self.reaper = subprocess.Popen(
            [sys.executable, "-m", "launch._reaper", str(self.run_dir.absolute())], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env,
            cwd=str(Path(__file__).resolve().parent.parent))

    def _tell_reaper(self, line: str) -> None:
        if self.reaper and self.reaper.stdin:
            try:
                self.reaper.stdin.write((line + "\n").encode())
                self.reaper.stdin.flush()
            except (OSError, ValueError):
                pass

    def _stop_reaper(self) -> None:
        if not self.reaper:
            return
        self._tell_reaper("done")
        try:
            self.reaper.stdin.close()
            self.reaper.wait(timeout=5)
        except (OSError, ValueError, subprocess.TimeoutExpired):   # it exits by itself on EOF
            pass

    def _start_metrics(self) -> None:
        from launch.metrics import MetricsWriter, RunningSummary, Sampler

        api = open_nvml_safely()
        self.nvml_available = bool(getattr(api, "available", False))
        self.metrics_writer = MetricsWriter(self.run_dir / "metrics.jsonl", max_bytes=self.spec.jsonl_cap_bytes)
        self.metrics_summary = RunningSummary()

        def on_sample(sample: dict[str, Any]) -> None:
            self.metrics_writer.write(sample)
            self.metrics_summary.add(sample)
            if sample.get("available"):
                utils = [g.get("util") for g in sample.get("gpus") or [] if g.get("util") is not None]
                if not utils or max(utils) >= GPU_IDLE_UTIL:
                    self.gpu_active_at = sample.get("t") or time.time()

        self.sampler = Sampler(api, interval=self.spec.metrics_interval, on_sample=on_sample,
                               pid_to_rank=self.pid_rank.get)
        self.sampler.start()

    def _peak_gpu_text(self) -> str:
        if self.metrics_summary is None:
            return "no GPU metrics"
        try:
            from launch.metrics import format_summary
            return format_summary(self.metrics_summary.as_dict())
        except Exception:  # the supervisor must not die of its status line (the sampler thread adds to the summary)
            return "GPU metrics N/A"

    # ---------------------------------------------------------------- main

    def run(self) -> int:
        self._install_signals()
        self._start_reaper()
        self._start_metrics()
        self.record.emit("status", 0, status="starting", command=self.command)
        sock, address = self._listen()
        exit_code = 1
        final_status = "failed"
        attempt = 0
        restarts_used = 0
        try:
            while True:
                attempt += 1
                outcome, cl = self._run_attempt(attempt, sock, address)
                launcher_exit = outcome.launcher_exit
                if self.stop_requested:
                    final_status, exit_code = "stopped", STOPPED_EXIT_CODE
                    self.record.update(classification=cl.to_json() if cl else None,
                                       stop_reason=self.stop_reason or "stop requested")
                    break
                user_restart = self.restart_requested
                if not user_restart and cl is None and launcher_exit == 0:
                    final_status, exit_code = "succeeded", 0
                    break
                if cl is None:          # launcher non-zero but nothing to blame: still a failure
                    cl = cls.Classification("unknown", None, launcher_exit, None,
                                            f"accelerate launch exited with {launcher_exit}",
                                            "see launcher.log", outcome.launcher_tail[-cls.TAIL_LINES:])
                if not user_restart:
                    self.record.emit("failure", attempt, rank=cl.rank, kind=cl.kind, summary=cl.summary,
                                     exit_code=cl.exit_code, signal=cl.signal, hint=cl.hint)
                    self.record.update(classification=cl.to_json())
                    self._report_failure(attempt, cl)
                if user_restart or (restarts_used < self.spec.max_restarts and cl.kind not in cls.NOT_RESTARTED):
                    if not user_restart:
                        restarts_used += 1
                    else:           # a restart the user asked for does not spend --max-restarts
                        self.record.update(user_restarts=int(self.record.get("user_restarts") or 0) + 1)
                    self.restart_requested = False
                    why = "requested" if user_restart else f"{restarts_used}/{self.spec.max_restarts}"
                    self.record.emit("restart", attempt + 1, reason=why)
                    self.record.update(status="restarting")
                    self.say(f"restarting: attempt {attempt + 1} (restart {why})")
                    continue
                final_status = "failed"
                exit_code = self._failure_exit_code(cl, launcher_exit)
                break
        finally:
            try:
                sock.close()
            except OSError:
                pass
            if self.sampler is not None:
                self.sampler.stop()
            self.record.update(status=final_status, ended_at=time.time(), exit_code=exit_code,
                               launcher_pid=None, progress=self.record.get("progress"))
            if final_status == "succeeded":      # `wizard tune`: the probe ended the ranks after its steps
                from launch._probe import trial_done
                steps = trial_done()
                if steps is not None:
                    self.record.update(trial_done={"steps": steps})
                    self.say(f"trial done: the tune probe ended the ranks after {steps} optimizer steps")
            self.record.emit("exit", attempt, status=final_status, exit_code=exit_code)
            self._stop_reaper()
            self.say(f"{final_status} after {attempt} attempt{'s' if attempt != 1 else ''}; exit code {exit_code}; "
                     f"run directory {self.run_dir}")
        return exit_code

    @staticmethod
    def _failure_exit_code(cl: cls.Classification, launcher_exit: int | None) -> int:
        if cl.kind == "stall":
            return STALL_EXIT_CODE
        if cl.exit_code not in (None, 0):
            return cls.shell_exit_code(cl.exit_code)
        if launcher_exit not in (None, 0):
            return cls.shell_exit_code(launcher_exit)
        return 1

    def _report_failure(self, attempt: int, cl: cls.Classification) -> None:
        lines = [f"attempt {attempt} failed ({cl.kind}): {cl.summary}", f"hint: {cl.hint}"]
        if cl.suggested_command:
            lines.append(f"next rung: {cl.next_rung}: {cl.suggested_command}")
        if cl.resume_command:
            lines.append(f"then resume: {cl.resume_command}")
        if cl.log_tail:
            who = f"rank {cl.rank}" if cl.rank is not None else "the launcher"
            lines.append(f"last {len(cl.log_tail)} lines of {who}:")
            lines += [f"  | {ln}" for ln in cl.log_tail]
        self.say("\n".join(lines))

    def _listen(self) -> tuple[socket.socket, str]:
        name = f"wizard-launch-{os.getpid()}-{self.run_dir.name}"[:100]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("\0" + name)
        s.listen(256)
        s.setblocking(False)
        return s, "@" + name

    # ---------------------------------------------------------------- one attempt

    def _run_attempt(self, attempt: int, listener: socket.socket, address: str):
        adir = attempt_dir(self.run_dir, attempt)
        adir.mkdir(parents=True, exist_ok=True)
        echo = self.out if (self.spec.headless and self.spec.echo) else None
        att = _Attempt(self, attempt, echo)
        started = time.time()
        self.record.update(attempt=attempt, status="starting", attempt_started_at=started, pids={},
                           launcher_pid=None, classification=None, tracked_pids=[],
                           progress=dict.fromkeys(self.record.get("progress") or {}))   # a new attempt starts at zero
        self.record.emit("status", attempt, status="starting")
        self._choose_port(attempt)
        self.say(f"attempt {attempt}: {' '.join(self.command)}")
        env = dict(os.environ)
        env[ENV_SOCKET] = address
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.spec.env)
        env["WIZARD_RUN_DIR"] = str(self.run_dir)
        env["WIZARD_ATTEMPT"] = str(attempt)
        launcher_log = RotatingLog(launcher_log_path(self.run_dir, attempt), self.spec.log_cap_bytes)
        att.launcher_capture = StreamCapture(None, launcher_log, echo, on_train_log=att.on_train_log,
                                             on_progress=att.on_progress)
        proc = subprocess.Popen(
            [sys.executable, "-c", _SHIM, str(os.getpid()), *self.command],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, env=env, cwd=self.spec.cwd or None)
        att.proc = proc
        att.processes.track(proc.pid)
        self.record.update(launcher_pid=proc.pid, status="running")
        self.record.emit("status", attempt, status="running", launcher_pid=proc.pid)
        try:
            att.loop(listener)
        finally:
            att.close()
            launcher_log.close()
        return att.outcome()

    def _choose_port(self, attempt: int) -> None:
        """This attempt's command: a single-machine run whose port is busy now gets a free one (one line, one
        `port` event, run.json's command and main_process_port); otherwise the configured command."""
        moved = free_port_instead(self.spec, self.accel)
        port = moved[1] if moved else rendezvous_port(self.spec, self.accel)
        self.command = build_command(self.spec, self.accel, self.config_file,
                                     main_process_port=moved[1] if moved else None)
        self.record.update(command=self.command, main_process_port=port)
        if moved:
            text = (f"port {moved[0]} is in use on this machine: this single-machine run uses free port {moved[1]} "
                    f"instead (--main_process_port {moved[1]})")
            self.record.emit("port", attempt, busy=moved[0], port=moved[1], message=text)
            self.say(text)

    # ---------------------------------------------------------------- what an attempt tells and asks

    def own_process(self, pid: int, create_time: float) -> None:
        """A process of the run: recorded in run.json, and the reaper ends it if we die."""
        self.record.record_process(pid, create_time)
        self._tell_reaper(f"{pid} {create_time}")

    def disown_process(self, pid: int) -> None:
        """A process of an attempt that is over: the reaper and the sampler can let it go."""
        self._tell_reaper(f"forget {pid}")
        self.pid_rank.pop(pid, None)

    def rank_connected(self, rank: int, pid: int) -> None:
        self.pid_rank[pid] = rank          # the sampler attributes GPU memory by pid
        self.record.record_rank(rank, pid)

    def gpus_last_busy(self, since: float) -> float | None:
        """When the GPUs were last busy, counting from `since`; None without NVML (no evidence either way)."""
        if not self.nvml_available:
            return None
        return max(self.gpu_active_at or 0.0, since)

    def status_line(self, attempt: int) -> str:
        p = self.record.progress()
        step = f"step {p.get('step')}/{p.get('total')}" if p.get("total") else "step ?"
        loss = f"loss {p['loss']:.4g}" if isinstance(p.get("loss"), (int, float)) else "loss ?"
        rate = f"{p['rate']:.2f} it/s" if isinstance(p.get("rate"), (int, float)) else "? it/s"
        eta = f"ETA {fmt_clock(int(p['eta_s']), pad_minutes=False)}" if p.get("eta_s") is not None else "ETA ?"
        return (f"attempt {attempt}/{self.record.attempts_allowed()} | {self.record.get('status')} | "
                f"{step} | {loss} | {rate} | {eta} | {self._peak_gpu_text()}")


class _Attempt:
    """One `accelerate launch` run: its streams, teardown and outcome. Its processes are a
    ProcessGroup; what it learns goes to the run's RunRecord; of the supervisor it uses only the
    public methods (own_process, rank_connected, poll_control, say, ...) and reads its requests."""

    def __init__(self, sup: Supervisor, number: int, echo: BinaryIO | None):
        self.sup = sup
        self.spec = sup.spec
        self.record = sup.record
        self.number = number
        self.echo = echo
        self.proc: subprocess.Popen | None = None
        self.launcher_capture: StreamCapture | None = None
        self.ranks: dict[int, StreamCapture] = {}
        self.processes = ProcessGroup(on_tracked=sup.own_process, on_forgotten=sup.disown_process)
        self.started_at = time.time()
        self.launcher_exit: int | None = None
        self.launcher_exited_at: float | None = None
        self.teardown_at: float | None = None
        self.killed = False
        self.stalled = False
        self.stall_dump_at: float | None = None
        self.silent_at: dict[int, float | None] = {}      # each rank's last output when the stall was declared
        self.stall_now: float | None = None
        self.gpus_idle: bool | None = None
        self._last_scan = 0.0
        self._last_status = time.monotonic()
        self._pending: dict[socket.socket, bytes] = {}
        self._peer_pid: dict[socket.socket, int | None] = {}
        self._conn_rank: dict[socket.socket, int] = {}
        self.refused = 0
        self.sel = selectors.DefaultSelector()
        self.progress_rank: int | None = None

    # ---------------------------------------------------------------- processes

    def scan(self) -> None:
        """Add every descendant of the launcher (and of known ranks: a re-parented one too)."""
        roots = [self.proc.pid] if self.proc else []
        roots += [c.pid for c in self.ranks.values() if c.pid]
        self.processes.track_descendants(roots)
        self.record.record_tracked([p.pid for p in self.processes.alive()], list(self.processes.tracked))

    def begin_teardown(self, why: str) -> None:
        if self.teardown_at is not None:
            return
        self.teardown_at = time.monotonic()
        self.scan()
        self.record.record_stopping(self.number, why, self.spec.grace)
        self.sup.say(f"stopping ({why}): SIGTERM to {len(self.processes.alive())} processes, "
                     f"SIGKILL after {self.spec.grace:g} s")
        self.processes.terminate_all()
        if self.sup.kill_requested:
            self.kill_all()

    def kill_all(self) -> None:
        self.killed = True
        self.scan()
        self.processes.kill_all()

    # ---------------------------------------------------------------- streams

    def on_train_log(self, rank: int | None, d: dict[str, Any]) -> None:
        if "loss" not in d:
            return
        if self.progress_rank is not None and rank is not None and rank > self.progress_rank:
            return          # one source: the progress line and the loss curve show the same rank's loss
        self.record.record_train_log(self.number, rank, d)

    def on_progress(self, rank: int | None, p: dict[str, Any]) -> None:
        if self.progress_rank is not None and rank is not None and rank > self.progress_rank:
            return
        if rank is not None:
            self.progress_rank = rank if self.progress_rank is None else min(rank, self.progress_rank)
        self.record.record_progress(self.number, rank, p)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            # the abstract socket's name is visible to every user (/proc/net/unix) and it has no permissions of
            # its own: the kernel's word on who connected decides, never what the peer says
            pid, why = peer_problem(conn, self.proc.pid if self.proc else None)
            if why:
                self._refuse(conn, pid, why)
                continue
            conn.setblocking(False)
            self._pending[conn] = b""
            self._peer_pid[conn] = pid
            self.sel.register(conn, selectors.EVENT_READ, "rank")

    def _refuse(self, conn: socket.socket, pid: int | None, why: str) -> None:
        """Close a connection that may not speak for a rank; say so (the first few per attempt: a flood of them
        must not flood the run's output and events)."""
        try:
            conn.close()
        except OSError:
            pass
        self.refused += 1
        if self.refused <= MAX_REFUSALS_SHOWN:
            text = f"refused a connection to the run's socket from pid {pid if pid is not None else '?'}: {why}"
            self.record.emit("refused", self.number, pid=pid, message=text)
            self.sup.say(text)

    def _rank_capture(self, rank: int, pid: int) -> StreamCapture:
        cap = self.ranks.get(rank)
        if cap is None:
            log = RotatingLog(rank_log_path(self.sup.run_dir, self.number, rank), self.spec.log_cap_bytes)
            cap = StreamCapture(rank, log, self.echo, on_train_log=self.on_train_log, on_progress=self.on_progress)
            self.ranks[rank] = cap
        cap.pid = pid
        cap.closed_at = None
        self.sup.rank_connected(rank, pid)
        self.processes.track(pid)
        return cap

    def _read_conn(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if conn in self._pending:
            if not data:
                self._drop(conn)
                return
            buf = self._pending[conn] + data
            nl = buf.find(b"\n")
            if nl < 0:
                self._pending[conn] = buf[-4096:]
                return
            del self._pending[conn]
            head = buf[:nl].decode(errors="replace").split()
            rank, pid = 0, 0
            if len(head) == 3 and head[0] == "WIZARD-RANK":
                try:
                    rank, pid = int(head[1]), int(head[2])
                except ValueError:
                    pass
            peer = self._peer_pid.pop(conn, None)
            if pid != peer or not 0 <= rank < MAX_RANK:
                self._drop(conn)
                self._refuse(conn, peer, f"it said {printable(buf[:nl].decode(errors='replace'), 80)!r}, not "
                                         f"WIZARD-RANK <rank> {peer} (its own pid)")
                return
            self._conn_rank[conn] = rank
            cap = self._rank_capture(rank, pid)
            cap.feed(buf[nl + 1:])
            return
        cap = self.ranks[self._conn_rank[conn]]
        if data:
            cap.feed(data)
        else:
            cap.close()
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        self._pending.pop(conn, None)
        self._peer_pid.pop(conn, None)
        self._conn_rank.pop(conn, None)
        conn.close()

    def _read_launcher(self, f) -> bool:
        try:
            data = os.read(f.fileno(), 1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if data:
            self.launcher_capture.feed(data)
            return True
        self.launcher_capture.close()
        self.sel.unregister(f)
        return False

    # ---------------------------------------------------------------- loop

    def loop(self, listener: socket.socket) -> None:
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.sel.register(listener, selectors.EVENT_READ, "listen")
        self.sel.register(self.proc.stdout, selectors.EVENT_READ, "launcher")
        launcher_open = True
        spec = self.spec
        while True:
            for key, _ in self.sel.select(timeout=0.2):
                if key.data == "listen":
                    self._accept(listener)
                elif key.data == "launcher":
                    launcher_open = self._read_launcher(key.fileobj)
                else:
                    self._read_conn(key.fileobj)
            now_m = time.monotonic()
            if now_m - self._last_scan >= SCAN_EVERY_S:
                self._last_scan = now_m
                self.scan()
            self.sup.poll_control()
            if (self.sup.stop_requested or self.sup.restart_requested) and self.teardown_at is None:
                self.begin_teardown("restart requested" if not self.sup.stop_requested else "stop requested")
            if self.sup.kill_requested and not self.killed:
                self.kill_all()
            if self.teardown_at is None and spec.stall_timeout and self.launcher_exit is None and not self.stalled:
                self._check_stall(spec.stall_timeout)
            if self.stalled and self.teardown_at is None and now_m - (self.stall_dump_at or 0) >= STACK_WAIT_S:
                self.begin_teardown(f"stall: no output for {spec.stall_timeout:g} s")
            if self.teardown_at is not None and not self.killed and now_m - self.teardown_at >= spec.grace:
                self.sup.say(f"grace period over: SIGKILL to {len(self.processes.alive())} processes")
                self.kill_all()
            if self.launcher_exit is None and self.proc.poll() is not None:
                self.launcher_exit = self.proc.returncode
                self.launcher_exited_at = now_m
                self.record.record_launcher_exit(self.number, self.launcher_exit)
            if spec.headless and now_m - self._last_status >= spec.status_interval:
                self._last_status = now_m
                self.sup.say(self.sup.status_line(self.number))
            self.record.flush()
            if self.launcher_exit is not None:
                streams_open = launcher_open or bool(self._conn_rank) or bool(self._pending)
                leftovers = self.processes.alive()
                if leftovers and self.teardown_at is None:
                    # the launcher is gone but something of the run is not: no orphans
                    self.begin_teardown(f"{len(leftovers)} processes left after the launcher exited")
                drained = not streams_open or now_m - self.launcher_exited_at >= DRAIN_AFTER_EXIT_S
                if drained and not leftovers:
                    break
        self.record.record_tracked([], [])        # nothing of this attempt runs any more
        self.record.flush(force=True)

    def _check_stall(self, timeout: float) -> None:
        now = time.time()
        outs = [c.last_output_at for c in self.ranks.values() if c.last_output_at]
        if not self.ranks and self.launcher_capture.last_output_at:
            outs.append(self.launcher_capture.last_output_at)
        last = max(outs + [self.started_at])
        if now - last < timeout:
            return
        idle = None
        gpus_busy_at = self.sup.gpus_last_busy(self.started_at)
        if gpus_busy_at is not None:
            if now - gpus_busy_at < timeout:
                return
            idle = True
        self.stalled = True
        self.stall_now = now
        self.gpus_idle = idle
        silent = ", ".join(f"rank {r} {now - (c.last_output_at or self.started_at):.0f} s"
                           for r, c in sorted(self.ranks.items()))
        self.record.record_stall(self.number, timeout, silent or "no rank connected", idle)
        self.silent_at = {r: c.last_output_at for r, c in self.ranks.items()}
        self._request_stacks()
        self.stall_dump_at = time.monotonic()      # teardown follows once the dumps had STACK_WAIT_S

    def _request_stacks(self) -> None:
        """Ask every connected rank (our _worker registered the signal with faulthandler) for its stacks."""
        from launch._worker import stack_dump_signal
        for cap in self.ranks.values():
            p = self.processes.tracked.get(cap.pid) if cap.pid else None
            if p is not None and cap.closed_at is None:
                self.processes.signal_verified(p, stack_dump_signal())

    def close(self) -> None:
        for conn in list(self._pending) + list(self._conn_rank):
            self._drop(conn)
        for cap in self.ranks.values():
            if cap.closed_at is None:
                cap.close()
            if cap.log is not None:
                cap.log.close()
        try:
            self.proc.stdout.close()
        except OSError:
            pass
        self.sel.close()
        self.processes.forget_all()

    # ---------------------------------------------------------------- outcome

    def outcome(self) -> tuple[cls.AttemptOutcome, cls.Classification | None]:
        sup = self.sup
        launcher_tail = tail_lines(launcher_log_path(sup.run_dir, self.number), 200)
        failures = cls.parse_torchrun_failures(launcher_tail)
        by_rank: dict[int, dict[str, Any]] = {}
        for f in failures:
            r = f["rank"] if f["rank"] is not None else f["local_rank"]
            by_rank[r] = f
        simple_exit = cls.parse_simple_launcher_exit(launcher_tail)
        ranks: list[cls.RankOutcome] = []
        for r, cap in sorted(self.ranks.items()):
            code = None
            if r in by_rank:
                code = by_rank[r]["exit_code"]
            elif not failures and len(self.ranks) == 1 and simple_exit is not None:
                code = simple_exit
            elif self.launcher_exit == 0:
                code = 0
            m = cap.markers
            ranks.append(cls.RankOutcome(
                rank=r, exit_code=code, ended_at=cap.closed_at, traceback_at=m.traceback_at,
                cuda_oom_at=m.cuda_oom_at, nccl_at=m.nccl_at, last_exception=m.last_exception,
                last_output_at=self.silent_at.get(r, cap.last_output_at) if self.stalled else cap.last_output_at,
                pid=cap.pid,
                stack=cls.main_thread_stack(tail_lines(rank_log_path(sup.run_dir, self.number, r), STACK_TAIL_LINES))
                if self.stalled else None,
                log_tail=tail_lines(rank_log_path(sup.run_dir, self.number, r), cls.TAIL_LINES)))
        # roots the launcher reported that never connected (died before the wrapper ran)
        for r, f in by_rank.items():
            if r not in self.ranks:
                ranks.append(cls.RankOutcome(rank=r, exit_code=f["exit_code"], pid=f["pid"]))
        oom_seen = None
        if any(cls.decode_exit(r.exit_code)[1] == signal.SIGKILL for r in ranks) and not sup.stop_requested:
            oom_seen = cls.dmesg_oom_evidence(read_dmesg(), [r.pid for r in ranks if r.pid])
        next_rung = cmd = resume = None
        if any(r.cuda_oom_at for r in ranks):
            ds = read_json_object(Path(sup.ds_config_file)) if sup.ds_config_file else None
            next_rung, cmd = cls.suggest_for_cuda_oom(load_plan_near(sup.config_file), sup.accel, ds)
            if cmd is not None:
                cmd, resume = self._with_resume(cmd, ds)
        done = [c.markers.train_done_at for c in list(self.ranks.values()) + [self.launcher_capture]
                if c is not None and c.markers.train_done_at is not None]
        o = cls.AttemptOutcome(
            training_finished_at=min(done) if done else None,
            launcher_exit=self.launcher_exit, ranks=ranks,
            stop_requested=sup.stop_requested or sup.restart_requested, stalled=self.stalled,
            stall_timeout_s=self.spec.stall_timeout, stall_now=self.stall_now, gpus_idle=self.gpus_idle,
            launcher_tail=launcher_tail, oom_killer_seen=oom_seen, next_rung=next_rung, suggested_command=cmd,
            resume_command=resume)
        return o, cls.classify(o)

    def _with_resume(self, cmd: str, ds: dict[str, Any] | None) -> tuple[str, str | None]:
        """The next rung's command writing over this run's config (its directory, unless that is accelerate's
        default, where the command writes anyway), and the `--resume` of this run on it (None where the libraries
        cannot load this run's checkpoints on that rung: launch/resume.py says why)."""
        import shlex

        from launch.resume import refusal_across
        sup = self.sup
        doc = load_plan_near(sup.config_file) or {}
        rung = cls.next_rung_after(cls.current_rung_key(sup.accel, ds), doc.get("plan", doc))
        refused = refusal_across(sup.accel, ds, rung) if rung is not None else None
        if refused:
            return cmd, "CANNOT: " + refused
        config = sup.config_file
        if config and os.path.abspath(config) != os.path.abspath(accelerate_default_config_file()):
            cmd += " --output-dir " + shlex.quote(os.path.dirname(os.path.abspath(config)))
        else:
            config = None
        return cmd, cls.resume_command_for(str(sup.run_dir), config, self.spec.script, list(self.spec.script_args))


# ------------------------------------------------------------------ background entry point

def run_from_spec_file(run_dir: str, daemon: bool, parent: int | None = None, lock_fd: int | None = None) -> int:
    spec = LaunchSpec.from_json(json.loads((Path(run_dir) / "spec.json").read_text()))
    if daemon and os.fork() > 0:      # second fork: not a session leader, can never regain a terminal
        os._exit(0)
    if parent is not None:
        # foreground: when the `wizard launch` the user started dies (or its terminal closes and
        # takes it along), parent_death_signal() reaches us and stops the run. Until the supervisor
        # installs its handler, a handler that does nothing keeps the signal's default action
        # (termination, with nothing cleaned up) away; the supervisor then checks our parent itself.
        signal.signal(parent_death_signal(), lambda s, f: None)
        set_parent_death_signal(parent_death_signal())
        if os.getppid() != parent:    # it died before the line above
            return STOPPED_EXIT_CODE
    if spec.cwd:
        os.chdir(spec.cwd)
    sup = Supervisor(spec, lock_fd=lock_fd, parent=parent)
    return sup.run()


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m launch.supervisor")
    p.add_argument("run_dir")
    p.add_argument("--daemon", action="store_true")
    p.add_argument("--parent", type=int, default=None, help="foreground: end the run when this process dies")
    p.add_argument("--lock-fd", type=int, default=None, help="the run directory's lock, inherited")
    a = p.parse_args(argv)
    return run_from_spec_file(a.run_dir, a.daemon, a.parent, a.lock_fd)


if __name__ == "__main__":
    sys.exit(main())
