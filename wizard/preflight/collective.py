"""A real timed all-reduce over the real process group: `python -m wizard.preflight.collective ...` on each node,
run by `wizard preflight` (which kills it past its deadline). The only part of preflight that imports torch.

The node starts its `--local` processes (global rank = node x local + local rank, as torchrun numbers them), all
nodes' processes form one world at tcp://ADDR:PORT with the backend the training will use (NCCL on GPUs, gloo on
CPU processes), and each measures an all-reduce of --nbytes:
- within the node: the node's own processes (NVLink / PCIe / shared memory between GPUs; loopback for gloo);
- across the nodes: one process per node (the network between machines, what the plan's inter-node figure is).
Every rank runs the same fixed number of iterations (a time budget that stops ranks at different counts would
hang the collective it was measuring). On GPUs, before the collectives, a direct copy between each pair of the
node's GPUs (the P2P test): a pair whose copy hangs is named by the last "p2p_start" line the parent read.
Local rank 0 prints JSON lines: progress ({"p2p_start": "0-1"}) and the result ({"result": {...}}).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta


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


def timed_allreduce(dist, torch, group, ranks: int, nbytes: int, iterations: int, device) -> dict:
    t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    dist.all_reduce(t, group=group)                 # warm-up: connections, NCCL's channels
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(t, group=group)
    sync()
    seconds = (time.perf_counter() - start) / iterations
    size = t.numel() * 4
    from wizard.preflight.checks import busbw_gbps
    return {"ranks": ranks, "bytes": size, "iterations": iterations, "seconds": seconds,
            "busbw_gbps": busbw_gbps(size, seconds, ranks)}


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
    used = gpu_ids[:per]                      # the GPUs this node's ranks use: only their pairs talk P2P
    if nccl and local == 0 and len(used) > 1:
        result["p2p"] = p2p_copies(used)
    dist.init_process_group(a.backend, init_method=f"tcp://{a.addr}:{a.port}", rank=rank, world_size=nodes * per,
                            timeout=timedelta(seconds=a.timeout))
    # every rank creates every group, in the same order (torch.distributed's rule for new_group)
    node_groups = [dist.new_group(list(range(n * per, (n + 1) * per))) for n in range(nodes)]
    across = dist.new_group([n * per for n in range(nodes)])
    scopes = {}
    if per > 1:
        scopes["node"] = timed_allreduce(dist, torch, node_groups[a.node], per, a.nbytes, a.iterations, device)
    else:
        scopes["node"] = {"ranks": 1}
    if local == 0 and nodes > 1:
        scopes["across"] = timed_allreduce(dist, torch, across, nodes, a.nbytes, a.iterations, device)
    dist.barrier()
    if nccl:
        try:
            result["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    result["scopes"] = scopes
    result["torch"] = torch.__version__
    dist.destroy_process_group()
    if local == 0:
        emit({"result": result})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m wizard.preflight.collective")
    p.add_argument("--addr", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--local", type=int, default=1)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nbytes", type=int, default=8 << 20)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--gpu-ids", default="")
    a = p.parse_args(argv)
    try:
        if a.local > 1:
            import torch.multiprocessing as mp
            mp.spawn(worker, args=(a,), nprocs=a.local, join=True)
        else:
            worker(0, a)
    except Exception as exc:
        emit({"result": {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}})
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
