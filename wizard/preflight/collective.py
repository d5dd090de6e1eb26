"""The collectives the training will send, timed and checked over the real process group:
`python -m wizard.preflight.collective ...` on each node, run by `wizard preflight` (which kills it, with every
process it started, past its deadline or when the preflight stops). The only part of preflight that imports torch.

The node starts its `--local` processes (global rank = node x local + local rank, as torchrun numbers them; local
rank 0 starts the others through children.spawn, so none outlives it), all
nodes' processes form one world at tcp://ADDR:PORT with the backend the training will use (NCCL on GPUs, gloo on
CPU processes), and in each scope:
- within the node: the node's own processes (NVLink / PCIe / shared memory between GPUs; loopback for gloo);
- across the nodes: one process per node (the network between machines, what the plan's inter-node figure is);
it times all-reduce, all-gather, reduce-scatter and all-to-all (measure.OPS) at several sizes, each size a warm-up
then measure.CPU_SAMPLES / GPU_SAMPLES timed samples, and checks the data of each once (nccl-tests' -c: values
that say which rank and which element they came from, compared with what the operation must give). Across the
nodes it also runs the ring pass: each node sends to the node `k` after it and receives from the node `k` before
it, all at once, for one or two offsets `k`: the figures outliers.py names a slow node or link from.
Every rank runs the same fixed number of iterations (a time budget that stops ranks at different counts would hang
the collective it was measuring). On GPUs, before the collectives, a direct copy between each pair of the node's
GPUs (the P2P test): a pair whose copy hangs is named by the last "p2p_start" line the parent read; and NVML's XID
events are watched from start to end. Local rank 0 prints JSON lines: progress ({"p2p_start": "0-1"}) and the
result ({"result": {...}}).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

from wizard.preflight import measure


def emit(msg: dict) -> None:
    print(json.dumps(msg), flush=True)


def p2p_copies(devices: list[int]) -> dict[str, str]:
    import torch
    out = {}
    for i in devices:
        for j in devices:
            if i >= j:
                continue
            pair = f"{i}-{j}"
            emit({"p2p_start": pair})
            try:
                x = torch.arange(1 << 20, dtype=torch.float32, device=f"cuda:{i}")
                y = x.to(f"cuda:{j}")
                z = y.to(f"cuda:{i}")
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)
                out[pair] = "ok" if torch.equal(x, z) else "mismatch"
            except Exception as exc:        # a CUDA error is the finding
                out[pair] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return out


# ----------------------------------------------------------------------------- the operations


def _op_call(dist, op: str):
    """The torch.distributed function for `op` (torch 2.13 renamed the tensor forms *_single; older releases
    only have *_into_tensor / *_tensor), or None."""
    names = {"all_reduce": ("all_reduce",), "all_gather": ("all_gather_single", "all_gather_into_tensor"),
             "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
             "all_to_all": ("all_to_all_single",)}[op]
    return next((getattr(dist, n) for n in names if hasattr(dist, n)), None)


def _buffers(torch, op: str, numel: int, ranks: int, me: int, device):
    """(input, output, expected output) for one call of `op`, filled so that a value says which rank and element
    it came from: a misplaced chunk or a missed rank shows as a mismatch, not only a wrong sum. fp32 holds every
    value exactly (all below 2**24 for up to 4096 ranks)."""
    chunk = numel // ranks
    i = torch.arange(numel, dtype=torch.float32, device=device)
    j = torch.arange(chunk, dtype=torch.float32, device=device)
    if op == "all_reduce":
        x = (me + 1) + torch.remainder(i, 7)
        return x, x, ranks * (ranks + 1) / 2 + ranks * torch.remainder(i, 7)
    if op == "all_gather":
        x = me * 1000.0 + torch.remainder(j, 997)
        want = torch.cat([r * 1000.0 + torch.remainder(j, 997) for r in range(ranks)])
        return x, torch.empty(numel, dtype=torch.float32, device=device), want
    if op == "reduce_scatter":
        x = (me + 1) + torch.remainder(i, 13)
        want = ranks * (ranks + 1) / 2 + ranks * torch.remainder(me * chunk + j, 13)
        return x, torch.empty(chunk, dtype=torch.float32, device=device), want
    # all_to_all: the chunk for rank t holds me*1000 + t; what arrives from rank s holds s*1000 + me
    which, within = torch.div(i, chunk, rounding_mode="floor"), torch.remainder(torch.remainder(i, chunk), 3) / 4
    x = me * 1000.0 + which + within
    want = which * 1000.0 + me + within
    return x, torch.empty(numel, dtype=torch.float32, device=device), want


def _call(dist, fn, op: str, x, out, group) -> None:
    if op == "all_reduce":
        fn(x, group=group)
    else:
        fn(out, x, group=group)


def time_op(dist, torch, op: str, group, ranks: int, me: int, nbytes: int, samples: int, device) -> dict:
    """One operation at one size: a warm-up, `samples` timed calls (each synchronised: a sample is one call), and
    the data check."""
    fn = _op_call(dist, op)
    if fn is None:
        return {"bytes": nbytes, "unsupported": f"this torch has no {op}"}
    numel = max(ranks, (nbytes // 4) // ranks * ranks)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    x, out, want = _buffers(torch, op, numel, ranks, me, device)
    try:
        _call(dist, fn, op, x, out, group)           # warm-up (connections, NCCL's channels), then the check
    except RuntimeError as exc:                      # the backend lacks it: said, never guessed
        return {"bytes": numel * 4, "unsupported": str(exc).splitlines()[0][:200]}
    sync()
    got = x if op == "all_reduce" else out
    check = "ok" if torch.equal(got, want) else _mismatch(torch, got, want)
    seconds = []
    for _ in range(samples):
        dist.barrier(group=group)
        start = time.perf_counter()
        _call(dist, fn, op, x, out, group)
        sync()
        seconds.append(time.perf_counter() - start)
    return {**measure.summary(op, numel * 4, seconds, ranks), "check": check}


def _mismatch(torch, got, want) -> str:
    bad = (got != want).nonzero()
    first = int(bad[0][0]) if len(bad) else -1
    return (f"mismatch: {len(bad)} of {got.numel()} values wrong, the first at element {first} "
            f"({float(got.flatten()[first]):g}, expected {float(want.flatten()[first]):g})")


def time_scope(dist, torch, group, ranks: int, me: int, largest: int, samples: int, device) -> dict:
    out: dict = {"ranks": ranks, "ops": {}}
    for op in measure.OPS:
        runs = [time_op(dist, torch, op, group, ranks, me, size, samples, device) for size in measure.sizes(largest)]
        out["ops"][op] = runs
    return out


def ring_offsets(nodes: int) -> list[int]:
    """The ring pass's offsets: the neighbour, and for four or more nodes the node half-way round too (two
    measurements per node, each through other links, so a node slow on both is told from its neighbours)."""
    if nodes < 2:
        return []
    return [1] if nodes < 4 else [1, nodes // 2]


def ring_pass(dist, torch, group, ranks_of_nodes: list[int], me: int, nbytes: int, samples: int,
              device) -> list[dict]:
    """Each node sends `nbytes` to node me+k and receives from node me-k, all nodes at once; the time until this
    node's receive completes is the figure of the link in (on NCCL, whose grouped calls complete together, of the
    slower of its two links). The median of `samples` passes per offset, and a check of what arrived."""
    nodes = len(ranks_of_nodes)
    numel = max(1, nbytes // 4)
    out = []
    for k in ring_offsets(nodes):
        to, frm = (me + k) % nodes, (me - k) % nodes
        x = torch.full((numel,), float(me * 1000 + k), dtype=torch.float32, device=device)
        y = torch.empty(numel, dtype=torch.float32, device=device)
        seconds = []
        for n in range(samples + 1):                 # the first is the warm-up
            dist.barrier(group=group)
            start = time.perf_counter()
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, ranks_of_nodes[to], group=group),
                                            dist.P2POp(dist.irecv, y, ranks_of_nodes[frm], group=group)])
            works[-1].wait()                         # the receive (gloo completes each on its own)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if n:
                seconds.append(time.perf_counter() - start)
            for w in works[:-1]:
                w.wait()
        ok = bool(torch.all(y == float(frm * 1000 + k)))
        bw = measure.spread([measure.link_gbps(numel * 4, s) for s in seconds])
        out.append({"k": k, "to": to, "from": frm, "bytes": numel * 4, "gbps": bw.median, "low_gbps": bw.low,
                    "high_gbps": bw.high, "samples": bw.samples,
                    "check": "ok" if ok else "mismatch: what arrived is not what the node sent"})
    return out


# ----------------------------------------------------------------------------- one rank


def worker(local: int, a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    nodes, per = a.nodes, a.local
    rank = a.node * per + local
    nccl = a.backend == "nccl"
    gpu_ids = [int(x) for x in a.gpu_ids.split(",")] if a.gpu_ids else list(range(per))
    device = torch.device(f"cuda:{gpu_ids[local]}") if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)
    result: dict = {"rank": rank}
    xids = _xid_watch() if nccl and local == 0 else None
    used = gpu_ids[:per]                      # the GPUs this node's ranks use: only their pairs talk P2P
    if nccl and local == 0 and len(used) > 1:
        result["p2p"] = p2p_copies(used)
    dist.init_process_group(a.backend, init_method=f"tcp://{a.addr}:{a.port}", rank=rank, world_size=nodes * per,
                            timeout=timedelta(seconds=a.timeout))
    # every rank creates every group, in the same order (torch.distributed's rule for new_group)
    node_groups = [dist.new_group(list(range(n * per, (n + 1) * per))) for n in range(nodes)]
    heads = [n * per for n in range(nodes)]
    across = dist.new_group(heads)
    samples = a.samples or (measure.GPU_SAMPLES if nccl else measure.CPU_SAMPLES)
    scopes = {}
    if per > 1:
        scopes["node"] = time_scope(dist, torch, node_groups[a.node], per, local, a.nbytes, samples, device)
    elif a.selftest and nodes == 1:
        # one process alone (the GPU bench on a machine of one GPU: NCCL takes one rank per GPU): every
        # operation's code path and data check on the device, no bandwidth to speak of
        scopes["node"] = {**time_scope(dist, torch, None, 1, 0, a.nbytes, samples, device), "ranks": 1}
    else:
        scopes["node"] = {"ranks": 1}
    if local == 0 and nodes > 1:
        scopes["across"] = time_scope(dist, torch, across, nodes, a.node, a.nbytes, samples, device)
    if nodes > 1 and local == 0:
        result["ring"] = ring_pass(dist, torch, across, heads, a.node, a.nbytes // measure.RING_BYTES_SHARE,
                                   max(3, samples // 2), device)
    dist.barrier()
    if nccl:
        try:
            result["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    result["scopes"] = scopes
    result["torch"] = torch.__version__
    result["what"] = (f"{a.backend} on {'GPUs' if nccl else 'CPU processes'}: {', '.join(measure.OPS)} at "
                      f"{', '.join(str(s) for s in measure.sizes(a.nbytes))} bytes, {samples} samples each")
    if xids is not None:
        result["xids"] = [list(e) for e in xids.poll()]
        xids.close()
    dist.destroy_process_group()
    if local == 0:
        emit({"result": result})


def _xid_watch():
    """NVML's XID events from now to the end of the collectives (a GPU that fails under load says so here)."""
    try:
        from wizard.probe.nvml import open_nvml
        return open_nvml().xid_watch()
    except Exception:               # no NVML: no watch, the rest of the preflight says why
        return None


def start_ranks(argv: list[str], local: int) -> list:
    """The node's other local ranks, each `python -m wizard.preflight.collective ARGV --local-rank i` started
    through children.spawn: killed by the kernel the moment this process dies, from their first instruction (a
    rank that outlived a killed preflight would hold its GPU)."""
    from wizard.preflight import children
    return [children.spawn([sys.executable, "-m", "wizard.preflight.collective", *argv, "--local-rank", str(i)],
                           stdout=subprocess.DEVNULL) for i in range(1, local)]


def end_ranks(ranks: list, wait_s: float) -> None:
    """The other ranks end by themselves once the collectives are done; what is still running after `wait_s` (a
    rank stuck after an error) is killed."""
    from wizard.preflight import children
    deadline = time.monotonic() + wait_s
    for p in ranks:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        children.end(p)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m wizard.preflight.collective")
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--local", type=int, default=1)
    p.add_argument("--local-rank", type=int, default=0, help="(the node's other ranks, started by local rank 0)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nbytes", type=int, default=measure.CPU_BYTES)
    p.add_argument("--samples", type=int, default=0, help="timed samples per size (0: the backend's default)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--gpu-ids", default="")
    p.add_argument("--selftest", action="store_true",
                   help="with one process in all: run every operation and its data check anyway (the GPU bench)")
    a = p.parse_args(argv)
    ranks = start_ranks(argv, a.local) if a.local_rank == 0 and a.local > 1 else []
    code = 0
    try:
        worker(a.local_rank, a)
    except Exception as exc:
        code = 1
        if a.local_rank == 0:
            emit({"result": {"error": f"{type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0][:300] if str(exc) else ''}"}})
    finally:
        end_ranks(ranks, 30.0 if code == 0 else 0.0)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
