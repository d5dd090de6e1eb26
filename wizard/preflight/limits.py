"""A node's limits against what the run needs: host RAM, pinned memory (ulimit -l), open files, processes, /dev/shm,
the checkpoint directory and the NVMe offload path. Facts in (node.py's "limits"), rows out; pure. Each finding
names its fix.
"""

from __future__ import annotations

import re
from typing import Any

from wizard.preflight.checks import FAIL, INFO, OK, WARN, Expectation, Row
from wizard.units import fmt_bytes

# /dev/shm: NCCL's intra-node transport maps its buffers there (and the DataLoader's workers hand their batches
# through it); containers default to 64 MiB, where NCCL fails with "Error while creating shared memory segment"
# (NCCL troubleshooting docs, "Docker": "--shm-size=1g").
SHM_FAIL_BYTES = 256 << 20
SHM_WARN_BYTES = 1 << 30
# Open files per process (RLIMIT_NOFILE): a torch process holds a few hundred (libraries, CUDA, its threads' pipes);
# the DataLoader's workers share batches as file descriptors (torch's default strategy on Linux) and gloo and NCCL
# keep a socket or more per peer. Below 1024 (distributions' default soft limit) "Too many open files" comes early;
# at scale each process needs a few more per rank of the world.
NOFILE_FLOOR = 1024
NOFILE_PER_RANK = 4
# Processes per user (RLIMIT_NPROC counts threads): each rank runs torch's intra-op pool, NCCL's proxy and watchdog
# threads, gloo's, and the DataLoader's workers.
THREADS_PER_RANK = 64


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def pins_by_default(deepspeed_version: str | None) -> bool:
    """The node's DeepSpeed defaults pin_memory to true (DeepSpeed 0.19.5 on, as check rule DS-PIN-MEMORY-MEMLOCK
    says): read from the node's version, as the node's DeepSpeed is not imported."""
    from wizard.check.rules.deepspeed_json import PIN_MEMORY_DEFAULT_TRUE_SINCE
    since = _version_tuple(PIN_MEMORY_DEFAULT_TRUE_SINCE)
    return bool(deepspeed_version) and _version_tuple(deepspeed_version) >= since


def pinned_bytes_per_process(params: int | None, processes: int, blocks: list[str]) -> int | None:
    """At least the host memory each process page-locks for these offload blocks: check rule DS-PIN-MEMORY-MEMLOCK's
    lower bound (4 B per parameter of fp32 gradient partition with optimizer offload, 2 B of 16-bit parameter
    partition with ZeRO-3 parameter offload, over the processes). None: the model is not known."""
    from wizard.check.rules.deepspeed_json import pinned_bytes_per_process as check_bound
    return check_bound(params, processes, blocks) if params and blocks else None


def limit_rows(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> list[Row]:
    lim = facts.get("limits") or {}
    if lim.get("timeout"):
        return [Row(node, host, "limits", FAIL, f"reading the limits hung for {lim['timeout']:g} s (a stuck mount?)",
                    "check the disks (df) on this node")]
    rows = [ram_row(node, host, exp, lim), memlock_row(node, host, exp, facts), nofile_row(node, host, exp, lim),
            nproc_row(node, host, exp, lim), checkpoint_row(node, host, exp, lim), nvme_row(node, host, exp, lim),
            shm_row(node, host, exp, lim)]
    return [r for r in rows if r is not None]


def ram_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row | None:
    ram_total, ram_avail = lim.get("ram_total"), lim.get("ram_available")
    if ram_avail is None:
        return None
    need = exp.host_ram_bytes
    if need and need > ram_avail:
        return Row(node, host, "host RAM", FAIL, f"the plan keeps {fmt_bytes(need)} in host RAM on a node; "
                   f"{fmt_bytes(ram_avail)} available of {fmt_bytes(ram_total)}",
                   "free host memory, ask SLURM for more (--mem), or plan a rung that offloads less")
    if need:
        return Row(node, host, "host RAM", OK, f"{fmt_bytes(ram_avail)} available, the plan keeps {fmt_bytes(need)} "
                   "there")
    return Row(node, host, "host RAM", OK, f"{fmt_bytes(ram_avail)} available of {fmt_bytes(ram_total)}")


def memlock_row(node: int, host: str, exp: Expectation, facts: dict[str, Any]) -> Row:
    """ulimit -l against what the offload pins: only GPU processes page-lock host memory (DeepSpeed's CPU
    accelerator's pin_memory does nothing)."""
    lim = facts.get("limits") or {}
    limit = lim.get("memlock")            # bytes; None: unlimited
    shown = "unlimited" if limit is None else fmt_bytes(limit)
    ds = ((facts.get("versions") or {}).get("deepspeed") or {}).get("version")
    blocks = list(exp.pinned_blocks)
    blocks += [b for b in exp.pin_default_blocks if pins_by_default(ds) and b not in blocks]
    if not blocks or not exp.uses_gpus:
        return Row(node, host, "ulimit -l", OK, f"{shown} (nothing pinned by the config)")
    need = pinned_bytes_per_process(exp.params, exp.processes_per_node * exp.num_machines, blocks)
    from wizard.check.rules.deepspeed_json import MEMLOCK_FLOOR
    if limit is None or (need is not None and limit >= need) or (need is None and limit >= MEMLOCK_FLOOR):
        return Row(node, host, "ulimit -l", OK, f"{shown}" + (f", each process pins at least {fmt_bytes(need)}"
                                                            if need else ""))
    why = f"each process pins at least {fmt_bytes(need)}" if need else f"below {fmt_bytes(MEMLOCK_FLOOR)}"
    return Row(node, host, "ulimit -l", FAIL,
               f"{shown}: CPU offload ({', '.join('offload_' + b for b in blocks)}) pins its host buffers "
               f"(DeepSpeed {ds or '?'}), and {why}",
               "`ulimit -l unlimited` before the launch (SLURM: PropagateResourceLimits, or the node's "
               "limits.conf `* - memlock unlimited`), or \"pin_memory\": false in the offload block")


def _limit_text(pair: list | None) -> str:
    soft, hard = (pair or [None, None])[:2]
    return f"{'unlimited' if soft is None else soft} (hard {'unlimited' if hard is None else hard})"


def nofile_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row | None:
    pair = lim.get("nofile")
    if not pair:
        return None
    soft, hard = pair[:2]
    need = max(NOFILE_FLOOR, NOFILE_PER_RANK * exp.processes_per_node * exp.num_machines)
    if soft is None or soft >= need:
        return Row(node, host, "open files", OK, f"ulimit -n {_limit_text(pair)}; a rank needs at least {need}")
    raise_to = "unlimited" if hard is None else hard
    fix = (f"`ulimit -n {raise_to}` before the launch (the hard limit allows it)" if hard is None or hard >= need else
           f"raise the hard limit to {need} or more (limits.conf `* - nofile 1048576`; SLURM: PropagateResourceLimits"
           ", or the slurmd's LimitNOFILE), then `ulimit -n` it")
    return Row(node, host, "open files", FAIL, f"ulimit -n {_limit_text(pair)}: each rank needs at least {need} "
               "(torch's DataLoader workers pass batches as file descriptors, gloo and NCCL keep sockets per peer): "
               "the run fails with \"Too many open files\"", fix)


def nproc_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row | None:
    """RLIMIT_NPROC (per user, threads counted; root is not held to it) and the cgroup's pids.max, against the
    threads already running plus what the node's ranks start."""
    pair, threads, pids = lim.get("nproc"), lim.get("user_threads"), lim.get("pids")
    start = THREADS_PER_RANK * exp.processes_per_node
    if pids:
        limit, current = pids[:2]
        if limit - current < start:
            return Row(node, host, "processes", FAIL, f"the cgroup allows {limit} tasks and {current} run: the "
                       f"{exp.processes_per_node} rank(s) start about {start} threads (torch, NCCL, DataLoader "
                       "workers) and fail with \"Resource temporarily unavailable\"",
                       "a larger pids limit for the job (docker --pids-limit, Kubernetes' podPidsLimit, the "
                       "cgroup's pids.max)")
    if not pair:
        return None
    soft = pair[0]
    if soft is None or lim.get("root"):
        return Row(node, host, "processes", OK, f"ulimit -u {_limit_text(pair)}"
                   + ("; root is not held to it" if lim.get("root") and soft is not None else ""))
    need = (threads or 0) + start
    if soft < need:
        return Row(node, host, "processes", FAIL, f"ulimit -u {_limit_text(pair)}: this user runs {threads} threads "
                   f"and the {exp.processes_per_node} rank(s) start about {start} more: thread creation fails "
                   "(\"Resource temporarily unavailable\")",
                   "`ulimit -u unlimited` (or the hard limit) before the launch; limits.conf `* - nproc unlimited`")
    return Row(node, host, "processes", OK, f"ulimit -u {_limit_text(pair)}; {threads} threads running")


def checkpoint_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row | None:
    """The directory the Trainer saves into (its output_dir, else the working directory) against the plan's
    plan.checkpoint.per_node_total_bytes: what one machine must have free for the checkpoints the run keeps."""
    c = lim.get("checkpoint")
    if not isinstance(c, dict):
        return None
    where = c.get("path") or "?"
    if c.get("error"):
        return Row(node, host, "checkpoint disk", WARN, f"{where}: cannot read its free space ({c['error']})",
                   "create the directory on this node, or point output_dir at one that exists on every node")
    free = c.get("free") or 0
    at = f" (it does not exist yet: judged at {c['at']})" if c.get("at") and c.get("at") != where else ""
    if c.get("writable") is False:
        return Row(node, host, "checkpoint disk", FAIL, f"{where}{at} cannot be written ({c.get('write_error')}): "
                   "the Trainer's first save fails", "a writable output_dir on every node (a shared file system, "
                   "or a local disk per node)")
    need = exp.checkpoint_bytes
    if need is None:
        return Row(node, host, "checkpoint disk", INFO, f"{fmt_bytes(free)} free at {where}{at} ({exp.checkpoint_dir_from})"
                   "; the plan gives no checkpoint size (plan.checkpoint.per_node_total_bytes), so it is not checked")
    if free < need:
        return Row(node, host, "checkpoint disk", FAIL, f"{fmt_bytes(free)} free at {where}{at}; the checkpoints the "
                   f"run keeps take {fmt_bytes(need)} on this node (the plan's per_node_total_bytes): a save fails "
                   "part-way, leaving a checkpoint that cannot be resumed",
                   "free space there, point output_dir at a larger disk, or keep fewer checkpoints "
                   "(save_total_limit)")
    return Row(node, host, "checkpoint disk", OK, f"{fmt_bytes(free)} free at {where}{at}; the kept checkpoints take "
               f"{fmt_bytes(need)}")


def nvme_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row | None:
    if not exp.nvme_path:
        return None
    free = (lim.get("disk") or {}).get(exp.nvme_path)
    if free is None:
        return Row(node, host, "NVMe offload disk", FAIL, f"{exp.nvme_path}: cannot read its free space (missing?)",
                   "create the directory on this node (a local path exists per node)")
    if exp.nvme_bytes and free < exp.nvme_bytes:
        return Row(node, host, "NVMe offload disk", FAIL, f"{fmt_bytes(free)} free at {exp.nvme_path}; the plan "
                   f"needs {fmt_bytes(exp.nvme_bytes)}", "free space there, or point the NVMe path at a larger disk")
    return Row(node, host, "NVMe offload disk", OK, f"{fmt_bytes(free)} free at {exp.nvme_path}"
               + (f" (needs {fmt_bytes(exp.nvme_bytes)})" if exp.nvme_bytes else ""))


def shm_row(node: int, host: str, exp: Expectation, lim: dict[str, Any]) -> Row:
    """/dev/shm must exist, take a new file and have room: its free space (not its size: another job's or a crashed
    run's segments fill it) against what NCCL between this node's GPUs needs, and the DataLoader's workers."""
    shm = lim.get("shm") if isinstance(lim.get("shm"), dict) else {"total": lim.get("shm_total")}
    several = exp.uses_gpus and exp.processes_per_node > 1
    nccl_fix = ("docker --shm-size=8g (or --ipc=host); in Kubernetes an emptyDir with medium: Memory at /dev/shm; "
                "remove stale segments (ls -la /dev/shm) of runs that crashed")
    if shm.get("total") is None and shm.get("error") is None:
        return Row(node, host, "/dev/shm", WARN, "no /dev/shm here", "mount a tmpfs at /dev/shm (docker: --shm-size=8g)")
    if shm.get("error"):
        return Row(node, host, "/dev/shm", FAIL if several else WARN, f"cannot read it: {shm['error']}", nccl_fix)
    total, free = shm.get("total") or 0, shm.get("free")
    free = total if free is None else free
    text = f"{fmt_bytes(free)} free of {fmt_bytes(total)}"
    if shm.get("writable") is False:
        return Row(node, host, "/dev/shm", FAIL if several else WARN,
                   f"{text}, and a file cannot be created there ({shm.get('write_error')}): "
                   + ("NCCL's shared-memory transport between this node's GPUs fails to create its segments" if several
                      else "DataLoader workers fail to hand over their batches (\"Bus error\")"), nccl_fix)
    if several and free < SHM_FAIL_BYTES:
        return Row(node, host, "/dev/shm", FAIL, f"{text}: NCCL's shared-memory transport between this node's GPUs "
                   f"needs {fmt_bytes(SHM_FAIL_BYTES)} or more to create its segments", nccl_fix)
    if free < SHM_WARN_BYTES:
        return Row(node, host, "/dev/shm", WARN, f"{text}: DataLoader workers (and NCCL between GPUs) run short "
                   f"below {fmt_bytes(SHM_WARN_BYTES)}", "--shm-size=8g (docker), remove stale segments in /dev/shm, "
                   "or fewer dataloader_num_workers")
    return Row(node, host, "/dev/shm", OK, text)
