"""`wizard preflight`: the command line of wizard/preflight (flags, the table, --json, --record), and the step
`wizard launch` runs before it starts training (`launch_preflight`, handed to launch as a callback: launch
itself imports nothing of the wizard's layers above probe)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from wizard.units import printable

DESCRIPTION = (
    "wizard preflight: prove the machines of a config can train together before the GPU hours start. Run it on "
    "every node the way the launch gets there: `srun --ntasks-per-node=1 wizard preflight --config-file C` inside "
    "the SLURM allocation (the machine rank and the main node's address come from SLURM), or `wizard preflight "
    "--machine-rank N` on each node by hand (accelerate's static rendezvous). With DeepSpeed's pdsh or MPI launchers, "
    "which start every node from the main one over ssh, run it on the main node: it starts the other hosts of the "
    "hostfile the same way. Each node checks that it resolves and "
    "reaches main_process_ip:main_process_port (and the main node that it can bind it), its library versions, GPUs "
    "(count, model, memory, gpu_ids; driver and CUDA shown), host RAM, ulimit -l against what the offload pins, free "
    "disk and /dev/shm, open files and processes, the NCCL_*/GLOO_* interface settings, GPU health and P2P; then all "
    "nodes time the collectives the run sends (all-reduce, all-gather, reduce-scatter, all-to-all; NCCL on GPUs, gloo "
    "on CPU processes) within and across nodes, with a data check, and a ring pass that names a slow node. A finding "
    "that stops the run stops every node within seconds. Every check has a deadline: one that hangs is a finding. "
    "The main node prints the findings by cause (the full table goes to a file), a verdict, and exits 0 (all clear) "
    "or 1 (a finding stops the run).")
REPORT_FILE = "wizard-preflight.txt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from wizard.preflight.run import DEFAULT_CHECK_TIMEOUT_S, DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_JOIN_TIMEOUT_S
    p.add_argument("--config-file", default=None, metavar="P",
                   help="accelerate config (default: accelerate's default_config.yaml, where the wizard writes it)")
    p.add_argument("--machine-rank", type=int, default=None, metavar="N",
                   help="this node's rank (default: $SLURM_NODEID in a SLURM step of several nodes, else the "
                        "config's machine_rank)")
    p.add_argument("--main-process-ip", default=None, metavar="ADDR",
                   help="override the config's main node address (default under SLURM: the allocation's first node)")
    p.add_argument("--main-process-port", type=int, default=None, metavar="PORT",
                   help="override the config's main port")
    p.add_argument("--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, metavar="S",
                   help="how long the nodes wait for each other at the main port")
    p.add_argument("--check-timeout", type=float, default=DEFAULT_CHECK_TIMEOUT_S, metavar="S",
                   help="deadline of each node check (a check past it is a finding)")
    p.add_argument("--collective-timeout", type=float, default=DEFAULT_COLLECTIVE_TIMEOUT_S, metavar="S",
                   help="deadline of the all-reduce (process-group start included)")
    p.add_argument("--allreduce-mb", type=float, default=None, metavar="MB",
                   help="the collectives' largest size (default: 256 MiB with NCCL, 16 MiB with gloo; each is also "
                        "timed at 1/16 and 1/256 of it)")
    p.add_argument("--no-collective", action="store_true", help="skip the collectives (checks only)")
    p.add_argument("--checkpoint-dir", default=None, metavar="D",
                   help="where the training saves its checkpoints, checked for the free space the plan's "
                        "checkpoints need (default: the training's --output_dir under `wizard launch`, else the "
                        "working directory of each node)")
    p.add_argument("--report", default=REPORT_FILE, metavar="FILE",
                   help="main node of several machines: the full table (every check of every node, the per-node "
                        "figures, every collective at every size) goes here; the screen shows the findings only. "
                        "'-' prints it on the screen instead")
    p.add_argument("--local-only", action="store_true",
                   help="with DeepSpeed's pdsh or MPI launchers, which start every node from the main one over ssh, "
                        "the main node starts the other hosts' preflight over ssh too ($WIZARD_SSH, else ssh "
                        "without a password prompt); this checks the main node only and waits for the others to "
                        "be started by hand")
    p.add_argument("--secret-stdin", action="store_true",
                   help="read the nodes' shared secret from one line of stdin (how the main node hands it to the "
                        "hosts it starts over ssh) instead of $WIZARD_PREFLIGHT_SECRET or the key file "
                        "~/.config/wizard/preflight.key; README's 'Security' says how nodes share it")
    p.add_argument("--record", action="store_true",
                   help="main node: record the measured bandwidth between the nodes in the calibration, so "
                        "`wizard plan` uses the measured network")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def build_parser(parser_class=argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = parser_class(prog="wizard preflight", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=cmd_preflight)
    return p


def options_from(ns: argparse.Namespace):
    from wizard.errors import InputError
    from wizard.preflight.run import Options, slurm_defaults
    for flag, value, low in (("--join-timeout", ns.join_timeout, 0), ("--check-timeout", ns.check_timeout, 0),
                             ("--collective-timeout", ns.collective_timeout, 0)):
        if not (value == value and low < value < 1e6):
            raise InputError(flag, f"{value}", "a finite number of seconds > 0")
    if ns.machine_rank is not None and ns.machine_rank < 0:
        raise InputError("--machine-rank", f"{ns.machine_rank}", "0 or more")
    if ns.main_process_port is not None and not 1 <= ns.main_process_port <= 65535:
        raise InputError("--main-process-port", f"{ns.main_process_port}", "a TCP port, 1-65535")
    if ns.allreduce_mb is not None and not (0 < ns.allreduce_mb <= 65536):
        raise InputError("--allreduce-mb", f"{ns.allreduce_mb}", "MB > 0, at most 65536")
    config = ns.config_file
    if config is None:
        from wizard.paths import accelerate_default_config_file
        config = accelerate_default_config_file()
    rank, addr = ns.machine_rank, ns.main_process_ip
    if rank is None or addr is None:
        s_rank, s_addr = slurm_defaults()
        rank = rank if rank is not None else s_rank
        addr = addr or s_addr
        if rank is None:
            from wizard.fsutil import read_yaml_mapping
            try:
                rank = int((read_yaml_mapping(config) or {}).get("machine_rank") or 0) if os.path.isfile(config) else 0
            except (TypeError, ValueError):
                rank = 0
    checkpoint_dir, checkpoint_from = getattr(ns, "checkpoint_dir", None), "--checkpoint-dir"
    if not checkpoint_dir:
        checkpoint_dir, checkpoint_from = training_output_dir(getattr(ns, "script_args", None))
    return Options(config_file=config, machine_rank=rank, main_ip=addr, main_port=ns.main_process_port,
                   join_timeout=ns.join_timeout, check_timeout=ns.check_timeout,
                   collective_timeout=ns.collective_timeout,
                   nbytes=int(ns.allreduce_mb * (1 << 20)) if ns.allreduce_mb else None,
                   collective=not ns.no_collective, checkpoint_dir=checkpoint_dir, checkpoint_dir_from=checkpoint_from,
                   secret=secret_from_stdin() if getattr(ns, "secret_stdin", False) else None)


def training_output_dir(script_args: list[str] | None) -> tuple[str | None, str | None]:
    """Where the training saves its checkpoints, from its own arguments: --output_dir / --output-dir, else the
    output_dir of a TrainingArguments file (JSON or YAML) it is given, as HfArgumentParser reads one; (None, None)
    when they say nothing (each node's working directory is then checked)."""
    from wizard.preflight.expect import output_dir
    found = output_dir(script_args)
    if found:
        return found, "the training's --output_dir"
    for arg in script_args or []:
        if arg.endswith((".json", ".yaml", ".yml")) and os.path.isfile(arg):
            from wizard.fsutil import read_json_object, read_yaml_mapping
            try:
                doc = read_json_object(arg) if arg.endswith(".json") else read_yaml_mapping(arg)
            except Exception:          # not the training's arguments, or unreadable: it says nothing here
                continue
            value = (doc or {}).get("output_dir")
            if isinstance(value, str) and value:
                return value, f"output_dir in {arg}"
    return None, None


def secret_from_stdin():
    """The secret the main node sent down ssh's stdin (one line)."""
    from wizard.preflight.secret import MAX_CHARS, from_text
    line = sys.stdin.buffer.readline(MAX_CHARS + 2).decode("utf-8", "surrogateescape")
    return from_text(line, "the main node's (over ssh)", "--secret-stdin")


def run_node(opts, progress, local_only: bool = False):
    """This node's preflight; on the main node of a config whose DeepSpeed launcher starts every node from it
    over ssh (pdsh, openmpi, mvapich, mpich), with the other hosts' started from here the same way."""
    from wizard.preflight.meet import preflight
    if not local_only and not opts.machine_rank and opts.config_file and os.path.isfile(opts.config_file):
        from wizard.fsutil import read_yaml_mapping
        from wizard.preflight.fanout import SSH_LAUNCHERS, fan_out, main_starts_every_node
        accel = read_yaml_mapping(opts.config_file) or {}
        launcher = main_starts_every_node(accel)
        if launcher in SSH_LAUNCHERS:
            return fan_out(opts, accel, launcher, preflight, progress)
    return preflight(opts, progress)


def print_result(result, out: TextIO = sys.stdout, report_file: str | None = None) -> None:
    """The main node of several machines: the findings by cause, with their hosts, what was measured and the
    verdict (the full table in `report_file`); one machine: the whole table; another node: its own findings and
    the cause, each line labelled with the node."""
    from wizard.preflight import figures, report
    if not result.main:
        host = str((result.facts.get(result.rank) or {}).get("host") or "?")
        lines = report.node_screen(result.rank, host, result.rows, result.verdict, result.reached_main)
    elif result.expectation.num_machines == 1 or report_file == "-":
        lines = report.render_table(result.rows)
        versions = report.render_versions(result.facts)
        lines += [""] + versions if versions else []
        if report_file == "-":
            lines += [""] + figures.node_table(result.collectives, result.hosts)
            lines += [""] + figures.sizes_table(result.collectives.get(0) or {})
        lines.append(result.verdict)
    else:
        lines = report.screen(result.rows, nodes=result.expectation.num_machines, hosts=result.hosts,
                              per_node=result.facts, collective=result.collectives.get(0), backend=result.backend,
                              verdict_line=result.verdict, table_file=report_file,
                              tag=report.label(0, result.hosts.get(0, "?")))
    for line in lines:
        print(line, file=out)


def write_report(result, path: str | None) -> str | None:
    """The full table in `path` (main node of several machines); the path written, or None (none asked, or it
    could not be written: said on stderr, the run's verdict stands)."""
    if not path or path == "-" or not result.main or result.expectation.num_machines == 1:
        return None
    from wizard.fsutil import replace_file
    from wizard.preflight import figures, report
    text = report.full_text(result.rows, per_node=result.facts,
                            figures=figures.node_table(result.collectives, result.hosts),
                            sizes=figures.sizes_table(result.collectives.get(0) or {}), verdict_line=result.verdict)
    try:
        replace_file(path, text, fsync=False)
    except OSError as exc:
        print(f"[preflight] the full table could not be written to {path}: {exc.strerror or exc}", file=sys.stderr)
        return None
    return path


def record_bandwidth(result) -> str | None:
    """Store the measured bandwidth between the nodes (the median of its samples, with their spread) in the
    calibration; the sentence to print (None: nothing measured, or the verdict is not clear: a measurement of a run
    that cannot start is not the network's)."""
    if not result.main or not result.across or result.exit_code:
        return None
    from wizard.planning import calibration
    from wizard.preflight.measure import Spread
    facts = result.facts.get(0) or {}
    names = [g["name"] for g in (facts.get("gpus") or {}).get("gpus") or []] if result.expectation.uses_gpus else []
    a = result.across
    spread = Spread(a["busbw_gbps"], a.get("low_gbps", a["busbw_gbps"]), a.get("high_gbps", a["busbw_gbps"]),
                    a.get("samples", 1))
    path, key = calibration.record_network(names, result.expectation.processes_per_node,
                                           not result.expectation.uses_gpus, spread.median,
                                           result.expectation.num_machines, result.backend,
                                           spread={"low": round(spread.low, 4), "high": round(spread.high, 4),
                                                   "samples": spread.samples, "bytes": a["bytes"]})
    return (f"recorded {spread.text()} between {result.expectation.num_machines} machines of {key} in {path}: "
            "`wizard plan` on this machine now uses the median for the network")


def cmd_preflight(ns: argparse.Namespace) -> int:
    from wizard.preflight import children
    opts = options_from(ns)
    quiet = bool(ns.json)
    try:
        result = run_node(opts, (lambda s: None) if quiet else
                          (lambda s: print(f"[preflight] {s}", file=sys.stderr, flush=True)),
                          local_only=bool(getattr(ns, "local_only", False)))
    finally:
        children.end_all()          # a stop (Ctrl-C, SIGTERM, SIGHUP: KeyboardInterrupt here) leaves no child
    report_file = write_report(result, getattr(ns, "report", REPORT_FILE))
    recorded = record_bandwidth(result) if ns.record else None
    if ns.json:
        doc = result.to_json()
        doc["recorded"] = recorded
        doc["report_file"] = report_file
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return result.exit_code
    print_result(result, report_file=report_file or ("-" if ns.report == "-" else None))
    if recorded:
        print(recorded)
    elif ns.record and result.main and result.exit_code:
        print("(nothing recorded: the verdict is not clear, and a network measured for a run that cannot start is not "
              "the figure to plan with)")
    elif result.main and result.across and not result.exit_code:
        print(f"(`wizard preflight --record` stores the measured {result.across_gbps:.2f} Gb/s between the "
              "machines, and the next `wizard plan` here uses it)")
    return result.exit_code


def launch_preflight(config_file: str | None, machine_rank: int | None, main_ip: str | None,
                     main_port: int | None, join_timeout: float = 60.0,
                     out: TextIO = sys.stdout, script_args: list[str] | None = None) -> tuple[int, str]:
    """What `wizard launch --preflight` runs on each node before training: the same checks, printed as the launch's
    first phase. (0: go on, 1: a finding stops the launch; the verdict without its "preflight: "). `script_args`:
    the training's own arguments (its --output_dir is where the checkpoints go)."""
    from wizard.preflight import children
    ns = argparse.Namespace(config_file=config_file, machine_rank=machine_rank, main_process_ip=main_ip,
                            main_process_port=main_port, join_timeout=join_timeout,
                            check_timeout=20.0, collective_timeout=120.0, allreduce_mb=None, no_collective=False,
                            json=False, record=False, local_only=False, checkpoint_dir=None,
                            script_args=script_args, report=REPORT_FILE)
    opts = options_from(ns)
    skipped = _skipped_for_slurm_launcher(opts.config_file, out)
    if skipped:
        return 0, skipped
    try:
        result = run_node(opts, lambda s: print(f"[preflight] {s}", file=out, flush=True))
    finally:
        children.end_all()
    print_result(result, out, report_file=write_report(result, REPORT_FILE))
    out.flush()
    return result.exit_code, result.verdict.removeprefix("preflight: ")


def _skipped_for_slurm_launcher(config_file: str | None, out: TextIO) -> str | None:
    """DeepSpeed's `slurm` launcher starts every node with srun from the main one: there is no `wizard launch` on
    the others to meet, and srun is the way there (the verdict to show, or None: this is not that launcher)."""
    from wizard.fsutil import read_yaml_mapping
    from wizard.preflight.fanout import main_starts_every_node
    accel = (read_yaml_mapping(config_file) or {}) if config_file and os.path.isfile(config_file) else {}
    if main_starts_every_node(accel) != "slurm":
        return None
    print("[preflight] skipped: DeepSpeed's slurm launcher starts every node with srun from here, so no other "
          "node runs `wizard launch`. Run the preflight the same way first, inside the allocation: "
          f"srun --ntasks-per-node=1 wizard preflight --config-file {config_file}", file=out, flush=True)
    return "skipped (DeepSpeed's slurm launcher: run it with srun inside the allocation)"
