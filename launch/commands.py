"""CLI entry points: `wizard launch`, `wizard attach`, `wizard stop`, `wizard runs`.

`register(subparsers)` adds the four subcommands (each sets `func=<callable(args) -> int>`);
`python -m launch.commands launch|attach|stop|runs ...` runs them without wizard/frontends/cli.py.
Importing this module is light: no torch, accelerate or textual (the supervisor imports psutil
and yaml lazily; the view is imported only when shown).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from launch.rundir import DEFAULT_STALL_TIMEOUT_S, TERMINAL_STATUSES
from launch.runschema import RunRecord
from wizard.units import printable

DEFAULT_PREFLIGHT_JOIN_S = 60.0     # nodes of one job start within seconds of each other; a minute is generous

# ------------------------------------------------------------------ parsers

def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", default=None,
                   help="accelerate config (default: accelerate's default_config.yaml, where the wizard writes it)")
    p.add_argument("--run-dir", default=None, help="the run directory (default: ./wizard-runs/<id>)")
    p.add_argument("--runs-root", default=None, help="where new run directories go (default: ./wizard-runs)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="restart the whole group up to N times (default: 0, no restart)")
    p.add_argument("--stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S, metavar="S",
                   help="no output from any rank (and idle GPUs, where NVML exists) for S seconds, counted from "
                        "the attempt's start (a hang in the first step counts as any other), is a stall: the ranks' "
                        "stacks are taken, the run is stopped (and restarted under --max-restarts), exit 124; "
                        f"0 turns stall detection off (default: {DEFAULT_STALL_TIMEOUT_S:g} s = 40 min, longer than "
                        "the 30 min after which torch, DeepSpeed and the Trainer abort a collective that waits for "
                        "a slow save or evaluation, and than a cold build of DeepSpeed's ops)")
    p.add_argument("--grace", type=float, default=30.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL when stopping (default 30)")
    p.add_argument("--detach", action="store_true",
                   help="run the supervisor in its own session, print the run directory and return")
    p.add_argument("--headless", action="store_true",
                   help="plain output: [rankN] lines and a status line (automatic without a TTY)")
    p.add_argument("--status-interval", type=float, default=30.0, metavar="S",
                   help="headless status line period (default 30 s)")
    p.add_argument("--quiet-ranks", action="store_true", help="headless: don't echo the ranks' output")
    p.add_argument("--machine-rank", type=int, default=None, help="this node's rank (multi-node)")
    p.add_argument("--main-process-ip", default=None, help="override the config's main node address")
    p.add_argument("--main-process-port", type=int, default=None, help="override the config's main port")
    p.add_argument("--emit-slurm", type=int, default=None, metavar="NODES",
                   help="write an sbatch script running `wizard launch --headless` on NODES nodes, don't launch")
    p.add_argument("--slurm-output", default="wizard-launch.sbatch", help="where --emit-slurm writes")
    p.add_argument("--slurm-gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs each node asks for (default: the config's processes per node, 0 for a CPU config)")
    p.add_argument("--metrics-interval", type=float, default=1.0, help="GPU sampling period (default 1 s)")
    p.add_argument("--log-cap-mb", type=float, default=50.0, help="per-rank log size before rotation (default 50)")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="FROM",
                   help="continue a run from its last complete checkpoint, also on another rung or process count: "
                        "FROM is a run directory, the training's output directory or a checkpoint (default: the "
                        "latest run); a checkpoint cut short by a kill is set aside, a DeepSpeed one converted to "
                        "DeepSpeed's universal format where the new layout needs it, and the Trainer resumes from "
                        "it (a plain accelerate loop finds the path in $WIZARD_RESUME_FROM)")
    p.add_argument("--accelerate-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `accelerate launch` (repeatable)")
    pre = p.add_mutually_exclusive_group()
    pre.add_argument("--preflight", dest="preflight", action="store_true", default=None,
                     help="run `wizard preflight` on this node first (every node meets at the main port, checks, "
                          "and runs a timed all-reduce); a finding that stops the run stops the launch, exit 1 "
                          "(default: on for a multi-machine config)")
    pre.add_argument("--no-preflight", dest="preflight", action="store_false",
                     help="launch without the preflight, also on several machines")
    p.add_argument("--preflight-timeout", type=float, default=DEFAULT_PREFLIGHT_JOIN_S, metavar="S",
                   help="how long the preflight waits for the other nodes at the main port")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")


def add_attach_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", default=None, help="run directory (default: the latest)")
    p.add_argument("--headless", action="store_true", help="print the run's output instead of the live view")
    p.add_argument("--no-follow", action="store_true", help="print the current state and the last lines, then exit")
    p.add_argument("--lines", type=int, default=20, help="lines of each rank's log to show first (default 20)")
    p.add_argument("--status-interval", type=float, default=30.0, metavar="S")


def add_stop_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", default=None, help="run directory (default: the latest)")
    p.add_argument("--kill", action="store_true", help="skip the grace period (SIGKILL at once)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="how long to wait for the run to end (default: its grace period + 15 s)")
    p.add_argument("--no-wait", action="store_true", help="send the request and return")


def add_runs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=None, metavar="DIR",
                   help="a runs root, or a directory above run directories (default: ./wizard-runs)")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per run")


def register(subparsers, config_findings: Callable[..., list] | None = None,
             preflight: Callable[..., int] | None = None) -> None:
    """`config_findings(path, here=True)`: the front end's check of an accelerate config (the wizard passes `wizard
    check`, against this machine's probe when `here`), run before accelerate starts: its errors stop the launch,
    whatever else it returns is shown; launch itself knows no rules. `preflight(config_file, machine_rank, main_ip,
    main_port, join_timeout, script_args=)`: the front end's `wizard preflight` for this node (the training's
    arguments say where it saves checkpoints), (0 to go on, its verdict) (the wizard passes
    frontends.preflight_cli.launch_preflight)."""
    p = subparsers.add_parser("launch", help="run accelerate launch under a supervisor (restarts, stalls, live view)",
                              description="wizard launch [OPTIONS] -- SCRIPT [ARGS...]")
    add_launch_arguments(p)
    p.set_defaults(func=cmd_launch, config_findings=config_findings, preflight_runner=preflight)
    p = subparsers.add_parser("attach", help="reopen the live view of a running or finished run")
    add_attach_arguments(p)
    p.set_defaults(func=cmd_attach)
    p = subparsers.add_parser("stop", help="stop a run gracefully, from any shell")
    add_stop_arguments(p)
    p.set_defaults(func=cmd_stop)
    p = subparsers.add_parser(
        "runs", help="the runs under a directory with their true state (running, succeeded, failed, stopped, lost)",
        description="wizard runs [DIR]: every run directory under DIR (default ./wizard-runs, searched "
                    f"{RUNS_DEPTH} levels deep, so a SLURM job's node-N runs are found too), newest first, with its "
                    "true state: a run whose run.json says running but whose supervisor is gone shows as lost. "
                    "CHECKPOINT: the last complete checkpoint where its training saved (+N partial: saves cut short "
                    "after it); `wizard launch --resume RUN_DIR` continues from it. "
                    "Reads only; `wizard stop RUN_DIR` ends what is left of a lost run.")
    add_runs_arguments(p)
    p.set_defaults(func=cmd_runs)


# ------------------------------------------------------------------ launch

def _script_and_args(command: list[str], must_exist: bool = True) -> tuple[str, list[str]]:
    from wizard.errors import InputError
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise InputError("SCRIPT", "no training script given", "wizard launch [OPTIONS] -- SCRIPT [ARGS...]")
    script = cmd[0]
    if must_exist and script.endswith(".py") and not Path(script).is_file():
        raise InputError("SCRIPT", f"{script} does not exist", "a Python training script")
    return script, cmd[1:]


def _finite(v: float) -> bool:
    import math
    return math.isfinite(v)


def _validate(args) -> None:
    """Every numeric option finite and in range (nan and inf compare False with everything, so
    they are refused first); exit 2 with one line otherwise."""
    from wizard.errors import InputError

    def seconds(flag: str, v: float | None, minimum: float, strict: bool) -> None:
        if v is None:
            return
        if not _finite(v) or (v <= minimum if strict else v < minimum):
            raise InputError(flag, f"{v}", f"a finite number of seconds {'>' if strict else '>='} {minimum:g}")

    if args.max_restarts < 0:
        raise InputError("--max-restarts", f"{args.max_restarts}", "0 or more")
    seconds("--stall-timeout", args.stall_timeout, 0, False)         # 0: off
    seconds("--grace", args.grace, 0, False)
    seconds("--status-interval", args.status_interval, 0, True)
    seconds("--metrics-interval", args.metrics_interval, 0, True)
    seconds("--preflight-timeout", getattr(args, "preflight_timeout", DEFAULT_PREFLIGHT_JOIN_S), 0, True)
    if not _finite(args.log_cap_mb) or args.log_cap_mb <= 0:
        raise InputError("--log-cap-mb", f"{args.log_cap_mb}", "a finite number of MB > 0")
    if args.machine_rank is not None and args.machine_rank < 0:
        raise InputError("--machine-rank", f"{args.machine_rank}", "0 or more")
    if args.main_process_port is not None and not 1 <= args.main_process_port <= 65535:
        raise InputError("--main-process-port", f"{args.main_process_port}", "a TCP port, 1-65535")
    if args.slurm_gpus_per_node is not None and args.slurm_gpus_per_node < 0:
        raise InputError("--slurm-gpus-per-node", f"{args.slurm_gpus_per_node}", "0 or more")
    if args.emit_slurm is not None and args.emit_slurm < 1:
        raise InputError("--emit-slurm", f"{args.emit_slurm} nodes", "a positive number of nodes")
    if args.config_file is not None and not Path(args.config_file).is_file():
        raise InputError("--config-file", f"{args.config_file} does not exist", "an accelerate config YAML")
    if args.run_dir is not None and Path(args.run_dir).exists() and not Path(args.run_dir).is_dir():
        raise InputError("--run-dir", f"{args.run_dir} exists and is not a directory", "a new or empty directory")


def resolve_config_file(config_file: str | None) -> str | None:
    """The accelerate config the launch will use: the given one, else accelerate's default if it exists."""
    if config_file:
        return str(Path(config_file).absolute())
    from wizard.paths import accelerate_default_config_file
    default = accelerate_default_config_file()
    return default if os.path.isfile(default) else None


def check_config(config_file: str | None, main_process_ip: str | None = None,
                 config_findings: Callable[..., list] | None = None, here: bool = True,
                 notes: list[str] | None = None) -> dict[str, Any] | None:
    """Load and check the config before accelerate starts: a config `config_findings` (the wizard's: `wizard
    check`) finds an error in (or cannot read) is exit 2 with that one-line finding, not an accelerate traceback
    in a log. The other findings it returns (a GPU config on a machine without GPUs) are printed on stderr and
    added to `notes`, for the run's events.

    `main_process_ip`: the address this launch passes to accelerate (--main-process-ip, or the first node's,
    which an emitted SLURM script finds at run time); the config is checked as launched with it, so a
    multi-machine config that leaves the address to the launch is not refused for lacking it. `here`: the config
    runs on this machine (not for an sbatch script written for other nodes), so it is checked against it."""
    if config_file is None:
        return None
    from wizard.errors import InputError
    with _as_launched(config_file, main_process_ip) as checked:
        findings = config_findings(checked, here=here) if config_findings else []   # InputError if unreadable
    for f in findings:
        if f.file != config_file and f.file and os.path.basename(f.file) == os.path.basename(checked):
            f.file = config_file
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        f = errors[0]
        where = f"{f.file}: {f.rule}" + (f" {f.key}" if f.key else "")
        more = f" (+{len(errors) - 1} more: wizard check --config-file {config_file})" if len(errors) > 1 else ""
        fix = f" (fix: {f.fix})" if f.fix else ""
        raise InputError("--config-file", f"{where}: {f.message}{fix}{more}", "a config `wizard check` passes")
    for f in findings:
        line = f"{f.severity} {f.rule}" + (f" {f.key}" if f.key else "") + f": {f.message}" + \
            (f" (fix: {f.fix})" if f.fix else "")
        print(f"[wizard] {line}", file=sys.stderr, flush=True)
        if notes is not None:
            notes.append(line)
    from wizard.fsutil import read_yaml_mapping
    return read_yaml_mapping(config_file)


@contextlib.contextmanager
def _as_launched(config_file: str, main_process_ip: str | None):
    """The config file as this launch runs it: itself, or a scratch copy with main_process_ip filled in
    when a multi-machine config leaves it to the launch."""
    from wizard.fsutil import read_yaml_mapping
    doc = read_yaml_mapping(config_file) if main_process_ip else None
    if not doc or int(doc.get("num_machines") or 1) <= 1 or doc.get("main_process_ip"):
        yield config_file
        return
    import tempfile

    import yaml
    with tempfile.TemporaryDirectory(prefix="wizard-launch-check-") as tmp:
        copy = os.path.join(tmp, os.path.basename(config_file))
        with open(copy, "w", encoding="utf-8") as f:
            yaml.safe_dump({**doc, "main_process_ip": main_process_ip}, f, sort_keys=False)
        yield copy


def make_spec(args, run_dir: Path, headless: bool) -> "Any":
    from launch.spec import LaunchSpec
    script, script_args = _script_and_args(args.command)
    return LaunchSpec(
        script=script, script_args=script_args,
        config_file=str(Path(args.config_file).absolute()) if args.config_file else None,
        run_dir=str(run_dir), max_restarts=args.max_restarts, stall_timeout=args.stall_timeout or None,
        grace=args.grace, headless=headless, detached=bool(args.detach), echo=not args.quiet_ranks,
        status_interval=args.status_interval, machine_rank=args.machine_rank,
        main_process_ip=args.main_process_ip, main_process_port=args.main_process_port,
        metrics_interval=args.metrics_interval, log_cap_bytes=int(args.log_cap_mb * 1024 * 1024),
        accelerate_args=list(args.accelerate_arg), cwd=os.getcwd())


def prepare_resume(args, accel: dict[str, Any] | None) -> "Any":
    """--resume: the checkpoint found, made loadable by this config's layout, and said (None without --resume)."""
    if getattr(args, "resume", None) is None:
        return None
    from launch.resume import prepare
    from launch.rundir import default_runs_root
    runs_root = Path(args.runs_root).absolute() if args.runs_root else default_runs_root()
    resume = prepare(args.resume or None, runs_root, accel)
    for line in resume.lines:
        print(f"[wizard] resume: {line}", flush=True)
    return resume


def cmd_launch(args) -> int:
    _validate(args)
    config_file = resolve_config_file(args.config_file)
    # An emitted SLURM script passes the first node's address at run time; 127.0.0.1 stands in for it here.
    launched_ip = args.main_process_ip or ("127.0.0.1" if args.emit_slurm is not None else None)
    notes: list[str] = []
    accel = check_config(config_file, launched_ip, getattr(args, "config_findings", None),
                         here=args.emit_slurm is None, notes=notes)
    if args.emit_slurm is not None:      # the script lives where the job runs, maybe not here
        script, script_args = _script_and_args(args.command, must_exist=False)
        return emit_slurm(args, script, script_args, config_file, accel)
    script, script_args = _script_and_args(args.command)
    plan_lines = script_plan_lines(config_file, script, script_args)
    for line in plan_lines:
        print(f"[wizard] {line}", file=sys.stderr, flush=True)
    code, preflight_verdict = run_preflight(args, config_file, accel)
    if code:
        return code
    resume = prepare_resume(args, accel)
    from launch.rundir import create_run_dir
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    headless = bool(args.headless) or not interactive
    use_view = not headless and not args.detach
    run_dir, lock_fd = create_run_dir(args.run_dir, args.runs_root)     # locked before anything is written
    if preflight_verdict or plan_lines or notes:   # the run's first events: the live view and `attach` show them
        from launch.rundir import EventLog
        events = EventLog(run_dir / "events.jsonl")
        for line in plan_lines:
            events.emit("plan", None, message=line)
        for note in notes:
            events.emit("check", None, message=note)
        if preflight_verdict:
            events.emit("preflight", None, message=preflight_verdict)
    spec = make_spec(args, run_dir, headless=headless if not (args.detach or use_view) else False)
    if resume is not None:
        spec.env.update(resume.env())
        spec.resume = resume.to_json()
    if args.detach:
        spec.headless = True              # its output goes to supervisor.log: plain lines
        spawn_background(spec, lock_fd)
        state = _wait_started(run_dir)
        print(str(run_dir))
        pid = (state or {}).get("supervisor_pid")
        print(f"detached: supervisor pid {pid}; follow with `wizard attach {run_dir}`, "
              f"stop with `wizard stop {run_dir}`", file=sys.stderr)
        return 0
    if use_view:
        # foreground: the supervisor is our child and ends the run when we die or the terminal
        # goes (PR_SET_PDEATHSIG); `d` in the view asks it to detach first
        child = spawn_foreground(spec, lock_fd)
        _wait_started(run_dir, child=child)
        from launch.view import run_view
        return run_view(run_dir, owned=True)
    from launch.supervisor import Supervisor
    return Supervisor(spec, lock_fd=lock_fd).run()


def script_plan_lines(config_file: str | None, script: str, script_args: list[str]) -> list[str]:
    """What the plan beside the config (wizard_plan.json) needs from the script that no written file carries, and
    whether the script visibly does it (launch.script_check: gradient checkpointing)."""
    from launch.script_check import checkpointing_lines
    from launch.spec import load_plan_near
    return checkpointing_lines(load_plan_near(config_file), script, script_args)


def wants_preflight(args, accel: dict[str, Any] | None) -> bool:
    """--preflight / --no-preflight, else on for a config of several machines (where a port, a version or an
    interface that differs shows up minutes into the job as a hang)."""
    if getattr(args, "preflight", None) is not None:
        return bool(args.preflight)
    try:
        return int((accel or {}).get("num_machines") or 1) > 1
    except (TypeError, ValueError):
        return False


def run_preflight(args, config_file: str | None, accel: dict[str, Any] | None) -> tuple[int, str | None]:
    """The launch's first phase: the front end's preflight on this node; (its exit code (0: go on), its verdict
    (None: none ran))."""
    if not wants_preflight(args, accel):
        return 0, None
    runner = getattr(args, "preflight_runner", None)
    if runner is None:           # `python -m launch.commands` without the wizard's front end
        print("[wizard] phase 1/2: preflight skipped (run through `wizard launch` to have it)", flush=True)
        return 0, None
    print("[wizard] phase 1/2: preflight (--no-preflight skips it)", flush=True)
    code, verdict = runner(config_file, args.machine_rank, args.main_process_ip, args.main_process_port,
                           getattr(args, "preflight_timeout", DEFAULT_PREFLIGHT_JOIN_S),
                           script_args=list(getattr(args, "command", None) or []))
    if code:
        print("[wizard] preflight: a finding stops the run (table above); not launching. Fix it, or launch with "
              "--no-preflight", file=sys.stderr, flush=True)
        return int(code), verdict
    print("[wizard] phase 2/2: training", flush=True)
    return 0, verdict


def _supervisor_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_supervisor(spec, lock_fd: int, *mode: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """The supervisor process for `spec`, in a session of its own, logging to supervisor.log; `mode` is
    "--daemon" or "--parent PID". The run directory's lock goes with it (the fd is inherited); ours is closed."""
    run_dir = Path(spec.run_dir)
    (run_dir / "spec.json").write_text(json.dumps(spec.to_json(), indent=1))
    from launch.trust import open_append
    log = open_append(run_dir / "supervisor.log")
    try:
        return subprocess.Popen([sys.executable, "-m", "launch.supervisor", str(run_dir), *mode,
                                 "--lock-fd", str(lock_fd)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(lock_fd,),
                                start_new_session=True, close_fds=True, env={**_supervisor_env(), **(extra_env or {})},
                                cwd=spec.cwd or None)
    finally:
        log.close()
        os.close(lock_fd)


def spawn_background(spec, lock_fd: int) -> None:
    """Start the supervisor detached (it forks once more and this first child exits at once)."""
    start_supervisor(spec, lock_fd, "--daemon").wait()


def spawn_foreground(spec, lock_fd: int) -> subprocess.Popen:
    """Start the supervisor as our child, in its own session (the view owns the terminal's keys),
    told to end the run when we die (--parent: it sets PR_SET_PDEATHSIG and checks our pid)."""
    import threading
    p = start_supervisor(spec, lock_fd, "--parent", str(os.getpid()))
    # reap it when it ends, so a finished supervisor is not left a zombie while the view is open
    threading.Thread(target=p.wait, daemon=True).start()
    return p


def _wait_started(run_dir: Path, timeout: float = 30.0, child: subprocess.Popen | None = None) -> dict[str, Any] | None:
    from launch.rundir import read_state
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = read_state(run_dir)
        if state and state.get("supervisor_pid") and state.get("launcher_pid") or \
                (state and state.get("status") in TERMINAL_STATUSES):
            return state
        if child is not None and child.poll() is not None:
            return state
        time.sleep(0.1)
    return state


def emit_slurm(args, script: str, script_args: list[str], config_file: str | None,
               accel: dict[str, Any] | None) -> int:
    from launch.slurm import node_resources, render_sbatch, write_sbatch
    from launch.spec import load_plan_near
    flags: list[str] = []
    if args.max_restarts:
        flags += ["--max-restarts", str(args.max_restarts)]
    if args.stall_timeout != DEFAULT_STALL_TIMEOUT_S:
        flags += ["--stall-timeout", f"{args.stall_timeout:g}"]
    if args.grace != 30.0:
        flags += ["--grace", f"{args.grace:g}"]
    if args.status_interval != 30.0:
        flags += ["--status-interval", f"{args.status_interval:g}"]
    if getattr(args, "preflight", None) is not None:       # else each node's launch decides (on: several machines)
        flags += ["--preflight" if args.preflight else "--no-preflight"]
    join = getattr(args, "preflight_timeout", DEFAULT_PREFLIGHT_JOIN_S)
    if join != DEFAULT_PREFLIGHT_JOIN_S:
        flags += ["--preflight-timeout", f"{join:g}"]
    res = node_resources(args.emit_slurm, accel, load_plan_near(config_file), args.main_process_port,
                         gpus_per_node=args.slurm_gpus_per_node)
    text = render_sbatch(args.emit_slurm, script, script_args, config_file=config_file, launch_flags=flags,
                         resources=res)
    path = write_sbatch(args.slurm_output, text)
    print(f"wrote {path}: submit with `sbatch {path}`")
    return 0


# ------------------------------------------------------------------ stop

def cmd_stop(args) -> int:
    from launch.rundir import load_record, mark_lost_if_dead, resolve_run_dir, supervisor_alive
    run_dir = resolve_run_dir(args.run_dir)
    rec = load_record(run_dir)             # someone else's, or garbage: exit 2, and run.json is left as it is
    if rec.status in TERMINAL_STATUSES:
        print(f"{run_dir}: already {rec.status} (exit code {rec.exit_code})")
        return 0
    if not supervisor_alive(rec.raw, run_dir):
        lost = mark_lost_if_dead(run_dir, by="wizard stop")
        if lost is None:
            rec = load_record(run_dir)
            if rec.active:
                # the run's lock is held, but not by the process run.json names (not yours, or another process
                # now): nothing is signalled on the word of run.json alone
                print(f"{run_dir}: the run's lock is held, but process {rec.supervisor_pid} is not its supervisor "
                      "(not yours, or not holding the lock): nothing signalled", file=sys.stderr)
                return 1
            print(f"{run_dir}: supervisor not running; run is {rec.status}")
            return 0
        n = len(lost.get("lost_cleaned") or [])
        print(f"{run_dir}: supervisor not running; ended {n} leftover processes; marked lost")
        return 0
    req = "kill" if args.kill else "stop"
    from launch.follow import send_control
    sent = send_control(run_dir, req, run=rec.raw, sender="cli")
    grace = rec.grace_s if rec.grace_s is not None else 30.0
    print(f"{run_dir}: {sent.message} (grace {grace:g} s)")
    if args.no_wait:
        return 0
    timeout = args.timeout if args.timeout is not None else grace + 15.0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = load_record(run_dir)
        if rec.status in TERMINAL_STATUSES and not supervisor_alive(rec.raw, run_dir):
            print(f"{run_dir}: {rec.status} (exit code {rec.exit_code})")
            return 0
        if rec.status not in TERMINAL_STATUSES and mark_lost_if_dead(run_dir, by="wizard stop") is not None:
            print(f"{run_dir}: lost (the supervisor died while stopping)")
            return 0
        time.sleep(0.2)
    print(f"{run_dir}: still {rec.status} after {timeout:g} s; try `wizard stop --kill {run_dir}`",
          file=sys.stderr)
    return 1


# ------------------------------------------------------------------ attach

def cmd_attach(args) -> int:
    from launch.rundir import load_record, resolve_run_dir
    from wizard.errors import InputError
    if args.lines < 0:
        raise InputError("--lines", f"{args.lines}", "0 or more")
    if not _finite(args.status_interval) or args.status_interval <= 0:
        raise InputError("--status-interval", f"{args.status_interval}", "a finite number of seconds > 0")
    run_dir = resolve_run_dir(args.run_dir)
    load_record(run_dir)                   # someone else's, or garbage: exit 2 with one line
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    if interactive and not args.headless and not args.no_follow:
        from launch.view import run_view
        return run_view(run_dir, owned=False)
    return follow_run(run_dir, sys.stdout, follow=not args.no_follow, lines=args.lines,
                      status_interval=args.status_interval)


def _status_text(rec: "RunRecord") -> str:
    p = rec.progress
    bits = [f"status {rec.status}", f"attempt {rec.attempt}/{rec.attempts_allowed()}"]
    if p.total:
        bits.append(f"step {p.step}/{p.total}")
    if p.loss is not None:
        bits.append(f"loss {p.loss:.4g}")
    if p.rate is not None:
        bits.append(f"{p.rate:.2f} it/s")
    if rec.status in TERMINAL_STATUSES:
        bits.append(f"exit code {rec.exit_code}")
    if rec.status == "lost":
        bits.append(f"supervisor {rec.supervisor_pid} gone; ended {len(rec.lost_cleaned)} leftover processes")
        if rec.lost_by:
            bits.append(f"recorded by {printable(rec.lost_by)} at {_clock(rec.lost_at, '%H:%M:%S')}")
    return " | ".join(bits)


def _failure_text(rec: "RunRecord", lost: bool = True) -> list[str]:
    c = rec.classification
    if lost and rec.status == "lost" and rec.lost_cause:
        return [f"lost: {printable(rec.lost_cause, 400)}"] + (_failure_text(rec, lost=False) if c else [])
    if not c:
        return []
    out = [f"failure ({printable(c.kind)}): {printable(c.summary, 400)}", f"hint: {printable(c.hint, 400)}"]
    if c.suggested_command:
        out.append(f"next rung: {printable(c.next_rung)}: {printable(c.suggested_command, 400)}")
    if c.resume_command:
        out.append(f"then resume: {printable(c.resume_command, 400)}")
    for ln in c.log_tail:
        out.append(f"  | {printable(ln, 400)}")
    return out


def _record_now(run_dir: Path, last: "RunRecord | None") -> "RunRecord | None":
    """run.json as it is now, checked; the last good one while it is torn or not valid."""
    from launch.rundir import read_state
    from launch.runschema import RunJsonError, parse
    try:
        return parse(read_state(run_dir))
    except RunJsonError:
        return last


class _Tail:
    def __init__(self, path: Path, prefix: str):
        self.path = path
        self.prefix = prefix
        self.pos = 0
        self.buf = b""

    def start_at_last(self, n: int) -> list[str]:
        from launch.rundir import tail_lines
        try:
            self.pos = self.path.stat().st_size
        except OSError:
            self.pos = 0
        return [self.prefix + ln for ln in tail_lines(self.path, n)] if n > 0 else []

    def read(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.pos:          # rotated: start over
            self.pos = 0
        if size == self.pos:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read(4 << 20)
        self.pos += len(data)
        data = self.buf + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self.buf = data
            return []
        self.buf = data[cut + 1:]
        return [self.prefix + ln for ln in data[:cut].decode("utf-8", "replace").split("\n")]


def follow_run(run_dir: Path, out: TextIO, follow: bool = True, lines: int = 20,
               status_interval: float = 30.0, poll: float = 0.3) -> int:
    """Headless attach: the last lines of every rank, then new lines and status lines until the end."""
    from launch.rundir import attempt_dir, load_record, mark_lost_if_dead
    rec = load_record(run_dir)

    def w(text: str) -> None:
        try:
            out.write(text + "\n")
            out.flush()
        except (OSError, ValueError):
            pass

    w(f"[wizard] run {run_dir}: {_status_text(rec)}")
    tails: dict[Path, _Tail] = {}
    attempt = None
    last_status = time.monotonic()
    last_seen_status = rec.status
    first = True
    try:
        while True:
            # a supervisor that died without an end is found here, not left "running" forever
            mark_lost_if_dead(run_dir, by="wizard attach")
            rec = _record_now(run_dir, rec)
            if rec.attempt != attempt and rec.attempt:
                attempt = rec.attempt
                tails = {}
                if not first:
                    w(f"[wizard] attempt {attempt}")
            adir = attempt_dir(run_dir, attempt or 1)
            for path in sorted(adir.glob("*.log")):
                if path not in tails:
                    name = path.stem
                    prefix = f"[{name.replace('rank-', 'rank')}] "
                    tails[path] = _Tail(path, prefix)
                    if first:
                        for ln in tails[path].start_at_last(lines):
                            w(ln)
            for t in tails.values():
                for ln in t.read():
                    w(ln)
            first = False
            if rec.status != last_seen_status or time.monotonic() - last_status >= status_interval:
                last_seen_status = rec.status
                last_status = time.monotonic()
                w(f"[wizard] {_status_text(rec)}")
            if rec.status in TERMINAL_STATUSES or not follow:
                for ln in _failure_text(rec):
                    w(f"[wizard] {ln}")
                w(f"[wizard] {_status_text(rec)}")
                return 0
            time.sleep(poll)
    except KeyboardInterrupt:
        w("[wizard] detached from the view; the run goes on")
        return 0


# ------------------------------------------------------------------ runs

RUNS_DEPTH = 3      # DIR/<id>, DIR/slurm-<job>/node-<n>, and one more level


def find_run_dirs(root: Path, depth: int = RUNS_DEPTH) -> list[Path]:
    """Directories holding a run.json at most `depth` levels under root (root itself included);
    `latest` links and the runs' own logs/ are not descended into."""
    found: list[Path] = []
    if (root / "run.json").is_file():
        found.append(root)
    if depth <= 0:
        return found
    try:
        children = sorted(root.iterdir())
    except OSError:
        return found
    for c in children:
        if c.name in ("latest", "logs") or c.is_symlink() or not c.is_dir():
            continue
        found += find_run_dirs(c, depth - 1)
    return found


def true_state(run_dir: Path) -> dict[str, Any]:
    """What a run really is, without changing anything (nothing is written, not even a lock file): run.json's
    status, except that an active run whose supervisor is gone (pid and start time) and whose lock is free is
    `lost`. A run directory that is not this user's, or whose run.json does not pass the schema, is one entry
    saying what is wrong with it (state "unreadable")."""
    from launch.rundir import checked_record, lock_is_free, supervisor_alive
    rec, problem = checked_record(run_dir)
    if rec is None:
        return {"run_dir": str(run_dir), "id": run_dir.name, "state": "unreadable", "status": None, "attempt": None,
                "exit_code": None, "started_at": None, "ended_at": None, "script": None,
                "detail": printable(problem, 300)}
    state, detail = rec.status, ""
    if rec.active:
        state = "running"
        if not supervisor_alive(rec.raw) and lock_is_free(run_dir):
            state = "lost"
            detail = (f"supervisor {rec.supervisor_pid} is gone and nothing recorded it; "
                      f"`wizard stop {run_dir}` ends what is left")
        elif rec.status != "running":
            detail = rec.status
        if state == "running":
            p = rec.progress
            bits = [detail] if detail else []
            if p.total:
                bits.append(f"step {p.step}/{p.total}")
            if p.loss is not None:
                bits.append(f"loss {p.loss:.4g}")
            bits.append(f"supervisor pid {rec.supervisor_pid}")
            detail = ", ".join(bits)
    elif rec.status == "lost":
        detail = rec.lost_cause or f"supervisor {rec.supervisor_pid} is gone"
        if rec.lost_by:
            detail += f" (recorded by {rec.lost_by})"
    elif rec.status == "failed":
        c = rec.classification
        detail = (f"{c.kind}: {c.summary}" if c.summary else c.kind) if c else ""
    elif rec.status == "stopped":
        # a trial `wizard tune` stopped at its time limit and a Ctrl-C both exit 130: the reason tells them apart
        detail = rec.stop_reason or "stopped on request (no reason recorded)"
    elif rec.status == "succeeded":
        detail = _succeeded_detail(rec)
    from launch.resume import last_checkpoint
    return {"run_dir": str(run_dir), "id": rec.id, "state": state, "status": rec.status, "attempt": rec.attempt,
            "exit_code": rec.exit_code, "started_at": rec.started_at, "ended_at": rec.ended_at, "script": rec.script,
            "detail": printable(detail, 300), **last_checkpoint(run_dir)}


def _succeeded_detail(rec: RunRecord) -> str:
    """What a run that ended well did: a `wizard tune` trial's steps, else its last progress (step, loss) and its
    attempts (DETAIL was empty for every succeeded run)."""
    if rec.trial_done is not None:
        return f"tune trial: the probe ended it after {rec.trial_done.steps} optimizer steps (warm-up + measured)"
    p = rec.progress
    bits = []
    if p.step is not None:
        bits.append(f"step {p.step}" + (f"/{p.total}" if p.total is not None else ""))
    if p.loss is not None:
        bits.append(f"loss {p.loss:.4g}")
    if rec.attempt > 1:
        bits.append(f"after {rec.attempt} attempts")
    return ", ".join(["finished"] + bits) if bits else "finished (exit 0)"


def _clock(t: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time the schema checked (finite, before the year 10000), or '-'."""
    return time.strftime(fmt, time.localtime(t)) if t is not None else "-"


def _duration(a: float | None, b: float | None) -> str:
    if a is None:
        return "-"
    s = int(max(0, (b if b is not None else time.time()) - a))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"


def cmd_runs(args) -> int:
    from launch.rundir import default_runs_root
    from wizard.errors import InputError
    root = Path(args.dir).absolute() if args.dir else default_runs_root()
    if not root.is_dir():
        raise InputError("DIR", f"{root} is not a directory", "a runs root such as ./wizard-runs")
    runs = [true_state(d) for d in find_run_dirs(root)]
    runs.sort(key=lambda r: r["started_at"] or 0.0, reverse=True)     # the schema made every start a float or None
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    if not runs:
        print(f"no runs under {root}")
        return 0
    rows = [("RUN", "STATE", "ATTEMPT", "EXIT", "STARTED", "DURATION", "CHECKPOINT", "DETAIL")]
    for r in runs:
        rel = os.path.relpath(r["run_dir"], root) if r["run_dir"] != str(root) else "."
        rows.append((printable(rel), r["state"], str(r.get("attempt") if r.get("attempt") is not None else "-"),
                     str(r.get("exit_code") if r.get("exit_code") is not None else "-"),
                     _clock(r.get("started_at")),
                     _duration(r.get("started_at"), r.get("ended_at")) if r["state"] != "lost" or r.get("ended_at")
                     else "-",
                     _checkpoint_cell(r), r.get("detail") or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(7)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:7], widths)) + "  " + row[7])
    return 0


def _checkpoint_cell(r: dict[str, Any]) -> str:
    """The run's last complete checkpoint (its directory name), "+N partial" after it; "-" when none is known."""
    last = r.get("last_checkpoint")
    cell = printable(os.path.basename(last)) if last else "-"
    partial = len(r.get("partial_checkpoints") or [])
    return cell + (f"(+{partial}-partial)" if partial else "")


# ------------------------------------------------------------------ module entry point

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.commands")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    register(sub)
    args = parser.parse_args(argv)
    from wizard.errors import WizardError
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except WizardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
