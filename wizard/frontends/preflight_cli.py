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
    "disk and /dev/shm, the NCCL_*/GLOO_* interface settings and GPU P2P; then all nodes run a timed all-reduce "
    "(NCCL on GPUs, gloo on CPU processes) within and across nodes. Every check has a deadline: one that hangs is a "
    "finding. The main node prints one table, a verdict, and exits 0 (all clear) or 1 (a finding stops the run).")


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
                   help="all-reduce size (default: 256 MiB with NCCL, 16 MiB with gloo)")
    p.add_argument("--no-collective", action="store_true", help="skip the all-reduce (checks only)")
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
    return Options(config_file=config, machine_rank=rank, main_ip=addr, main_port=ns.main_process_port,
                   join_timeout=ns.join_timeout, check_timeout=ns.check_timeout,
                   collective_timeout=ns.collective_timeout,
                   nbytes=int(ns.allreduce_mb * (1 << 20)) if ns.allreduce_mb else None,
                   collective=not ns.no_collective,
                   secret=secret_from_stdin() if getattr(ns, "secret_stdin", False) else None)


def secret_from_stdin():
    """The secret the main node sent down ssh's stdin (one line)."""
    from wizard.preflight.secret import MAX_CHARS, from_text
    line = sys.stdin.buffer.readline(MAX_CHARS + 2).decode("utf-8", "surrogateescape")
    return from_text(line, "the main node's (over ssh)", "--secret-stdin")


def run_node(opts, progress, local_only: bool = False):
    """This node's preflight; on the main node of a config whose DeepSpeed launcher starts every node from it
    over ssh (pdsh, openmpi, mvapich, mpich), with the other hosts' started from here the same way."""
    from wizard.preflight.run import preflight
    if not local_only and not opts.machine_rank and opts.config_file and os.path.isfile(opts.config_file):
        from wizard.fsutil import read_yaml_mapping
        from wizard.preflight.fanout import SSH_LAUNCHERS, fan_out, main_starts_every_node
        accel = read_yaml_mapping(opts.config_file) or {}
        launcher = main_starts_every_node(accel)
        if launcher in SSH_LAUNCHERS:
            return fan_out(opts, accel, launcher, preflight, progress)
    return preflight(opts, progress)


def print_result(result, out: TextIO = sys.stdout) -> None:
    from wizard.preflight import checks
    if not result.main and result.reached_main:
        own = [r for r in result.rows if r.status in (checks.WARN, checks.FAIL)]
        print(f"node {result.rank}: checked and reported to the main node, which prints the table for every node",
              file=out)
        for line in checks.render_table(own) if own else []:
            print(line, file=out)
        print(printable(result.verdict, 400), file=out)          # the main node's words
        return
    for line in checks.render_table(result.rows):
        print(line, file=out)
    if result.main:
        versions = checks.render_versions(result.facts)
        if versions:
            print("", file=out)
            for line in versions:
                print(line, file=out)
    print(result.verdict, file=out)


def record_bandwidth(result) -> str | None:
    """Store the measured bandwidth between the nodes in the calibration; the sentence to print (None: nothing
    measured)."""
    if not result.main or not result.across_gbps:
        return None
    from wizard.planning import calibration
    facts = result.facts.get(0) or {}
    names = [g["name"] for g in (facts.get("gpus") or {}).get("gpus") or []] if result.expectation.uses_gpus else []
    path, key = calibration.record_network(names, result.expectation.processes_per_node,
                                           not result.expectation.uses_gpus, result.across_gbps,
                                           result.expectation.num_machines, result.backend)
    return (f"recorded {result.across_gbps:.2f} Gb/s between {result.expectation.num_machines} machines of {key} in "
            f"{path}: `wizard plan` on this machine now uses it for the network")


def cmd_preflight(ns: argparse.Namespace) -> int:
    opts = options_from(ns)
    quiet = bool(ns.json)
    result = run_node(opts, (lambda s: None) if quiet else
                      (lambda s: print(f"[preflight] {s}", file=sys.stderr, flush=True)),
                      local_only=bool(getattr(ns, "local_only", False)))
    recorded = record_bandwidth(result) if ns.record else None
    if ns.json:
        doc = result.to_json()
        doc["recorded"] = recorded
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print_result(result)
        if recorded:
            print(recorded)
        elif result.main and result.across_gbps:
            print(f"(`wizard preflight --record` stores the measured {result.across_gbps:.2f} Gb/s between the "
                  "machines, and the next `wizard plan` here uses it)")
    return result.exit_code


def launch_preflight(config_file: str | None, machine_rank: int | None, main_ip: str | None,
                     main_port: int | None, join_timeout: float = 60.0,
                     out: TextIO = sys.stdout) -> tuple[int, str]:
    """What `wizard launch --preflight` runs on each node before training: the same checks, printed as the launch's
    first phase. (0: go on, 1: a finding stops the launch; the verdict without its "preflight: ")."""
    ns = argparse.Namespace(config_file=config_file, machine_rank=machine_rank, main_process_ip=main_ip,
                            main_process_port=main_port, join_timeout=join_timeout,
                            check_timeout=20.0, collective_timeout=120.0, allreduce_mb=None, no_collective=False,
                            json=False, record=False, local_only=False)
    opts = options_from(ns)
    skipped = _skipped_for_slurm_launcher(opts.config_file, out)
    if skipped:
        return 0, skipped
    result = run_node(opts, lambda s: print(f"[preflight] {s}", file=out, flush=True))
    print_result(result, out)
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
