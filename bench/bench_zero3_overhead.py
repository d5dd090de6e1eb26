"""Host time per training step under DeepSpeed ZeRO-3, ZeRO-2 and plain torch, by decoder layer count (issue 28).

The two one-process ZeRO-3 rows of shared/gpu/2026-12-04 ran 22 ms per decoder layer per step slower than the
speed model (bench/results/gpu-2026-12-04.md, "Named misses"), where the one-process ZeRO-2 row and the
single-GPU rows agree with it. This separates the part of a step that is host work, per decoder layer:
each (mode, layers) trains a Llama of the given width for a few steps in a fresh process, and records every
step's wall time and the main thread's CPU time (time.thread_time: the Python hooks, the dispatcher, kernel
launches; autograd runs CPU tensors' backward on the calling thread). Two layer counts give per-layer slopes,
free of the embedding, head and per-step fixed costs.

- On a CPU (the default) the model is tiny (hidden 64): its kernels cost next to nothing, so the host CPU time is
  the framework's own per-layer work: eager dispatch for plain torch, plus DeepSpeed's hooks (DeepSpeed's CPU
  accelerator, gloo). It is a lower bound for the CUDA path, which adds stream, event and NCCL calls.
- On a GPU (--device cuda, e.g. --width 4096 --ffn 11008 --seq 512 --micro-batch 7 as the Llama-2-7B row), the
  wall time per layer against the host time per layer says whether ZeRO-3's step is bound by its hooks (wall
  slope ~ host slope) or by something on the GPU (wall slope >> host slope: then profile it); torch's
  num_alloc_retries rules out allocator cache flushes.

ZeRO runs as the wizard writes it for those rows, with HF's "auto" values resolved (reduce bucket h^2, prefetch
0.9 h^2, persistence 10 h), bf16, torch's AdamW (fused on CUDA) as the client optimizer, gradient clipping 1.0;
plain torch as the Trainer's single GPU: fp32 weights under bf16 autocast, AdamW, clipping 1.0.

Usage: python bench/bench_zero3_overhead.py [--device cpu|cuda] [--layers 4,32] [--modes plain,zero2,zero3]
       [--width 64 --ffn 128 --heads 4 --kv-heads 4 --vocab 128] [--seq 32] [--micro-batch 2] [--steps 8]
       [--json PATH]
Prints a table: per mode and layer count the median wall and host time per step (after two warm-up steps),
and per mode the per-layer slopes; ZeRO-3's and ZeRO-2's slopes less plain torch's are their hooks' cost.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

MARKER = "ZERO3_OVERHEAD_RESULT "
WARMUP_STEPS = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--layers", default="4,32", help="two or more decoder layer counts, comma-separated")
    p.add_argument("--modes", default="plain,zero2,zero3")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--timeout", type=float, default=900, help="seconds per (mode, layers) run")
    p.add_argument("--json", default=None, help="write the per-step figures here")
    p.add_argument("--child", nargs=2, metavar=("MODE", "LAYERS"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ============================================================================================
# one (mode, layers) run, in its own process


def ds_config(stage: int, width: int, micro_batch: int) -> dict:
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                                  "sub_group_size": 1_000_000_000, "reduce_bucket_size": width * width,
                                  "stage3_prefetch_bucket_size": int(0.9 * width * width),
                                  "stage3_param_persistence_threshold": 10 * width,
                                  "stage3_max_live_parameters": 1_000_000_000,
                                  "stage3_max_reuse_distance": 1_000_000_000}}


def child(args, mode: str, layers: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)            # one thread: the host time is the Python/dispatch path's
    cfg = LlamaConfig(hidden_size=args.width, intermediate_size=args.ffn, num_hidden_layers=layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      head_dim=args.width // args.heads, tie_word_embeddings=False, use_cache=False,
                      max_position_embeddings=max(args.seq, 128))
    cfg._attn_implementation = "sdpa"
    device = torch.device("cuda" if cuda else "cpu")
    ids = torch.randint(0, args.vocab, (args.micro_batch, args.seq), device=device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if mode == "plain":
        with device:
            model = LlamaForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda or None)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        import deepspeed
        if not cuda:
            # One process needs none of the CPU accelerator's shared-memory collectives; skipping that JIT-built op
            # keeps the run independent of ~/.cache/torch_extensions (where another DeepSpeed version's build of
            # it lacks the functions 0.19.8 calls).
            from deepspeed.accelerator import get_accelerator
            builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
            if builder is not None:
                deepspeed.ops.__compatible_ops__[builder.NAME] = False
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
        stage = 3 if mode == "zero3" else 2
        config = ds_config(stage, args.width, args.micro_batch)
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16):
                model = LlamaForCausalLM(cfg)
        else:
            with device:
                model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda or None)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

        def step():
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()

    walls, hosts = [], []
    for _ in range(args.steps):
        sync()
        t0, w0 = time.thread_time(), time.perf_counter()
        step()
        sync()
        hosts.append(time.thread_time() - t0)
        walls.append(time.perf_counter() - w0)
    out = {"mode": mode, "layers": layers, "device": args.device, "wall_s": walls, "host_s": hosts,
           "tensors": sum(1 for _ in model.parameters()), "modules": sum(1 for _ in model.modules()),
           "versions": {"torch": torch.__version__}}
    if mode != "plain":
        out["versions"]["deepspeed"] = deepspeed.__version__
    if cuda:
        stats = torch.cuda.memory_stats()
        out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


# ============================================================================================
# the runs and their summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(args, mode: str, layers: int) -> dict:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if args.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    forwarded = [a for a in sys.argv[1:] if a != "--child"]
    cmd = [sys.executable, os.path.abspath(__file__), *forwarded, "--child", mode, str(layers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    raise RuntimeError(f"{mode} with {layers} layers: exit {proc.returncode} without a result\n{tail}")


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[WARMUP_STEPS:] if len(values) > WARMUP_STEPS else values)


def summarise(results: list[dict]) -> list[str]:
    lines = ["| mode | layers | param tensors | wall ms/step | host ms/step |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['mode']} | {r['layers']} | {r['tensors']} | {1e3 * median_after_warmup(r['wall_s']):.1f} "
                     f"| {1e3 * median_after_warmup(r['host_s']):.1f} |")
    slopes = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["layers"])
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        n = hi["layers"] - lo["layers"]
        slopes[mode] = tuple(1e3 * (median_after_warmup(hi[k]) - median_after_warmup(lo[k])) / n
                             for k in ("wall_s", "host_s"))
    lines += ["", "| mode | wall ms per layer | host ms per layer | host ms per layer beyond plain torch |",
              "| --- | ---: | ---: | ---: |"]
    for mode, (wall, host) in slopes.items():
        extra = f"{host - slopes['plain'][1]:.2f}" if "plain" in slopes and mode != "plain" else "–"
        lines.append(f"| {mode} | {wall:.2f} | {host:.2f} | {extra} |")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(MARKER + json.dumps(child(args, args.child[0], int(args.child[1]))), flush=True)
        return 0
    layers = [int(x) for x in args.layers.split(",")]
    results = []
    for mode in args.modes.split(","):
        for n in layers:
            try:
                r = run_one(args, mode, n)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:   # e.g. out of memory: the others still run
                print(f"{mode:6s} {n:3d} layers: failed: {exc}", flush=True)
                continue
            print(f"{mode:6s} {n:3d} layers: wall {1e3 * median_after_warmup(r['wall_s']):8.1f} ms, "
                  f"host {1e3 * median_after_warmup(r['host_s']):8.1f} ms", flush=True)
            results.append(r)
    print()
    print("\n".join(summarise(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"}, "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
