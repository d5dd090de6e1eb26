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

With --profile (on by default with --device cuda) one more step runs under torch.profiler (CUDA activity only, so
its own host cost stays small) and the trace is reduced to what decides the question: how long the GPU was busy
(the union of kernel, copy and set intervals), how long the host sat in CUDA synchronisation calls and how many
it made, and how many kernels it launched. A step whose GPU is busy for most of its wall time is bound by the GPU;
one whose GPU idles while the host is not waiting in a sync is bound by the host (hooks, dispatch, launches);
one whose host waits in syncs between short kernels is serialised by them.

--preset gpu-misses runs, in order of what they decide and within --budget-s, the measurements the named misses
of bench/results/gpu-2026-12-04.md need (about 3.5 minutes on an H100/H200; README of bench/gpu):
  1. the Llama-2-7B row's shape (width 4096, ffn 11008, 32 heads, vocab 32000, seq 512 x 7) at 4 and 12 layers,
     plain torch and ZeRO-3 (one process);
  2. the Qwen2.5-0.5B row's shape (width 896, ffn 4864, 14/2 heads, vocab 151936, seq 512 x 8) at 6 and 24
     layers, plain torch;
  3. the 7B shape under ZeRO-2, the ZeRO-3 sibling's one-process reference;
  4. the 7B shape under ZeRO-3 at seq 1024: does the per-layer cost stay with twice the tokens?

Usage: python bench/bench_zero3_overhead.py [--device cpu|cuda] [--layers 4,32] [--modes plain,zero2,zero3]
       [--width 64 --ffn 128 --heads 4 --kv-heads 4 --vocab 128] [--seq 32] [--micro-batch 2] [--steps 8]
       [--profile | --no-profile] [--json PATH] [--md PATH]
       python bench/bench_zero3_overhead.py --preset gpu-misses [--device cuda] [--budget-s 240] [--json] [--md]
Prints a table: per mode and layer count the median wall and host time per step (after two warm-up steps), and
the profiled step's GPU busy and sync-wait time; per mode the per-layer slopes. ZeRO-3's and ZeRO-2's host slopes
less plain torch's are their hooks' cost.
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

# The arguments that shape a run: forwarded to each child, recorded with its result, printed with a preset's group.
SHAPE_FLAGS = ("width", "ffn", "heads", "kv_heads", "vocab", "seq", "micro_batch", "steps")
LLAMA2_7B_ROW = {"width": 4096, "ffn": 11008, "heads": 32, "kv_heads": 32, "vocab": 32000, "seq": 512,
                 "micro_batch": 7}
QWEN25_05B_ROW = {"width": 896, "ffn": 4864, "heads": 14, "kv_heads": 2, "vocab": 151936, "seq": 512,
                  "micro_batch": 8}
# (title, shape, modes, layer counts, steps), most decisive first: a run cut short by the budget loses the least.
PRESETS = {
    "gpu-misses": (
        ("Llama-2-7B row's shape, one process: plain torch against ZeRO-3", LLAMA2_7B_ROW, ("zero3", "plain"),
         (4, 12), 6),
        ("Qwen2.5-0.5B row's shape, plain torch: host-bound or memory-bound?", QWEN25_05B_ROW, ("plain",), (6, 24),
         6),
        ("Llama-2-7B row's shape under ZeRO-2, one process", LLAMA2_7B_ROW, ("zero2",), (4, 12), 6),
        ("Llama-2-7B row's shape under ZeRO-3 at twice the tokens (seq 1024)", dict(LLAMA2_7B_ROW, seq=1024),
         ("zero3",), (4, 12), 6),
    ),
}


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
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="one more step under torch.profiler: GPU busy and sync-wait time (default: on with cuda)")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help="the named set of runs (module doc); --device still applies, the shapes are the preset's")
    p.add_argument("--budget-s", type=float, default=240.0, help="--preset: start no new run after this")
    p.add_argument("--json", default=None, help="write the per-step figures here")
    p.add_argument("--md", default=None, help="write the printed tables here too")
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
           "shape": {k: getattr(args, k) for k in SHAPE_FLAGS},
           "versions": {"torch": torch.__version__}}
    if profiling(args):
        out["profile"] = profiled_step(step, sync, cuda)
    if mode != "plain":
        out["versions"]["deepspeed"] = deepspeed.__version__
    if cuda:
        stats = torch.cuda.memory_stats()
        out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def profiling(args) -> bool:
    return args.profile if args.profile is not None else args.device == "cuda"


def profiled_step(step, sync, cuda: bool) -> dict:
    """One step under torch.profiler, reduced by trace_figures (the trace itself is large and not kept)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with tempfile.TemporaryDirectory() as tmp:
        sync()
        w0 = time.perf_counter()
        with profile(activities=activities) as prof:
            step()
            sync()
        wall = time.perf_counter() - w0
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    return dict(trace_figures(trace.get("traceEvents", [])), wall_s=wall)


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
              "cudaMemcpy", "cudaMemcpyAsync")
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel", "cudaGraphLaunch")


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by (start_us, end_us) intervals, overlaps counted once, in seconds."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e6


def trace_figures(events: list[dict]) -> dict:
    """A chrome trace's events (torch.profiler) reduced to: GPU busy seconds (union of kernels, copies, sets on
    any stream), its span from the first to the last GPU event, the host's seconds inside synchronising runtime
    calls (cudaMemcpy/Async included: a device-to-host copy waits for the stream), their count by name, and the
    kernels launched. Counts blocking-capable calls; whether each blocked is its duration's to say. The step's
    last cudaDeviceSynchronize is the bench's own (it waits for the queued work to time the step): it is reported
    apart, as final_sync_s, so that a GPU-bound step's tail is not read as the step's syncs."""
    gpu, syncs, kernels, launches = [], [], 0, 0
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name, ts, dur = e.get("cat"), str(e.get("name", "")), float(e.get("ts", 0)), float(e["dur"])
        if cat in GPU_CATEGORIES:
            gpu.append((ts, ts + dur))
            kernels += cat == "kernel"
        elif cat in ("cuda_runtime", "cuda_driver"):
            if name in SYNC_CALLS:
                syncs.append((ts, name, dur))
            elif name.startswith(LAUNCH_PREFIXES):
                launches += 1
    device_syncs = [x for x in syncs if x[1] == "cudaDeviceSynchronize"]
    final = max(device_syncs) if device_syncs else None
    if final is not None:
        syncs.remove(final)
    counts: dict[str, int] = {}
    for _, name, _ in syncs:
        counts[name] = counts.get(name, 0) + 1
    span = (max(b for _, b in gpu) - min(a for a, _ in gpu)) / 1e6 if gpu else None
    return {"gpu_busy_s": union_seconds(gpu) if gpu else None, "gpu_span_s": span,
            "sync_s": sum(d for *_, d in syncs) / 1e6, "sync_calls": counts,
            "final_sync_s": final[2] / 1e6 if final else 0.0, "kernels": kernels, "launches": launches}


# ============================================================================================
# the runs and their summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_command(args, mode: str, layers: int) -> list[str]:
    """The child's command line, from the parsed arguments (a preset's shape included), not from sys.argv."""
    cmd = [sys.executable, os.path.abspath(__file__), "--device", args.device]
    for name in SHAPE_FLAGS:
        cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    cmd.append("--profile" if profiling(args) else "--no-profile")
    return cmd + ["--child", mode, str(layers)]


def run_one(args, mode: str, layers: int) -> dict:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if args.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(child_command(args, mode, layers), env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    raise RuntimeError(f"{mode} with {layers} layers: exit {proc.returncode} without a result\n{tail}")


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[WARMUP_STEPS:] if len(values) > WARMUP_STEPS else values)


def ms(value) -> str:
    return "–" if value is None else f"{1e3 * value:.1f}"


def verdict(wall: float, profile: dict | None) -> str:
    """What bounds the step, from the profiled step: the GPU's busy share and the host's time waiting in syncs."""
    if not profile or profile.get("gpu_busy_s") is None:
        return "–"
    step = max(profile.get("wall_s") or wall, 1e-9)
    busy, waiting = profile["gpu_busy_s"] / step, profile.get("sync_s", 0.0) / step
    if busy >= 0.85:
        return f"GPU-bound (busy {busy:.0%})"
    if waiting >= 0.3:
        return f"GPU idles {1 - busy:.0%}; host waits in syncs {waiting:.0%}: serialised"
    return f"GPU idles {1 - busy:.0%}; host waits {waiting:.0%}: host-bound"


def summarise(results: list[dict]) -> list[str]:
    lines = ["| mode | layers | param tensors | wall ms/step | host ms/step | profiled wall ms | GPU busy ms "
             "| sync wait ms (calls) | kernels | bound |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        wall, prof = median_after_warmup(r["wall_s"]), r.get("profile")
        if prof:
            calls = sum((prof.get("sync_calls") or {}).values())
            cols = (f"{ms(prof.get('wall_s'))} | {ms(prof.get('gpu_busy_s'))} | {ms(prof.get('sync_s'))} ({calls}) "
                    f"| {prof.get('kernels', 0)}")
        else:
            cols = "– | – | – | –"
        lines.append(f"| {r['mode']} | {r['layers']} | {r['tensors']} | {1e3 * wall:.1f} "
                     f"| {1e3 * median_after_warmup(r['host_s']):.1f} | {cols} | {verdict(wall, prof)} |")
    slopes = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = sorted((r for r in results if r["mode"] == mode), key=lambda r: r["layers"])
        if len(rows) < 2:
            continue
        lo, hi = rows[0], rows[-1]
        n = hi["layers"] - lo["layers"]
        busy = [(r.get("profile") or {}).get("gpu_busy_s") for r in (lo, hi)]
        slopes[mode] = (*(1e3 * (median_after_warmup(hi[k]) - median_after_warmup(lo[k])) / n
                          for k in ("wall_s", "host_s")),
                        None if None in busy else 1e3 * (busy[1] - busy[0]) / n)
    lines += ["", "| mode | wall ms per layer | host ms per layer | host ms per layer beyond plain torch "
              "| GPU busy ms per layer |", "| --- | ---: | ---: | ---: | ---: |"]
    for mode, (wall, host, busy) in slopes.items():
        extra = f"{host - slopes['plain'][1]:.2f}" if "plain" in slopes and mode != "plain" else "–"
        lines.append(f"| {mode} | {wall:.2f} | {host:.2f} | {extra} | {'–' if busy is None else f'{busy:.2f}'} |")
    return lines


def groups(args) -> list[tuple[str, argparse.Namespace, tuple[str, ...], tuple[int, ...]]]:
    """(title, arguments, modes, layer counts) per group of runs: the preset's, or the command line's one."""
    if not args.preset:
        return [("", args, tuple(args.modes.split(",")), tuple(int(x) for x in args.layers.split(",")))]
    out = []
    for title, shape, modes, layers, steps in PRESETS[args.preset]:
        out.append((title, argparse.Namespace(**dict(vars(args), **shape, steps=steps)), modes, layers))
    return out


def render(done: list[tuple[str, argparse.Namespace, list[dict]]], skipped: list[str]) -> str:
    report = []
    for title, group_args, results in done:
        if title:
            report += [f"## {title}", "", ", ".join(f"{k} {getattr(group_args, k)}" for k in SHAPE_FLAGS), ""]
        report += summarise(results) + [""]
    if skipped:
        report += ["Not run: " + "; ".join(skipped), ""]
    return "\n".join(report)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(MARKER + json.dumps(child(args, args.child[0], int(args.child[1]))), flush=True)
        return 0
    started = time.monotonic()
    done: list[tuple[str, argparse.Namespace, list[dict]]] = []
    skipped: list[str] = []

    def save() -> str:
        """The files are rewritten after every run: a call cut short by its hard timeout keeps what it measured."""
        text = render(done, skipped)
        if args.md:
            with open(args.md, "w") as f:
                f.write(f"# bench_zero3_overhead ({args.preset or 'one set'}, device {args.device}, "
                        f"{time.monotonic() - started:.0f} s)\n\n{text}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": {k: v for k, v in vars(args).items() if k != "child"},
                           "results": [r for *_, rs in done for r in rs], "not_run": skipped}, f, indent=1)
        return text

    for title, group_args, modes, layers in groups(args):
        results: list[dict] = []
        done.append((title, group_args, results))
        for mode in modes:
            for n in layers:
                if args.preset and time.monotonic() - started > args.budget_s:
                    skipped.append(f"{title or mode}: {mode} with {n} layers (budget of {args.budget_s:.0f} s spent)")
                    continue
                run_args = group_args
                if args.preset:     # at most 3 minutes a run, and none outlives the budget by more than 50 s
                    left = args.budget_s + 50 - (time.monotonic() - started)
                    run_args = argparse.Namespace(**dict(vars(group_args), timeout=min(group_args.timeout, 180, left)))
                try:
                    r = run_one(run_args, mode, n)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:   # e.g. out of memory: the others still run
                    print(f"{mode:6s} {n:3d} layers: failed: {exc}", flush=True)
                    skipped.append(f"{title or mode}: {mode} with {n} layers failed: {str(exc).splitlines()[0]}")
                    continue
                print(f"{mode:6s} {n:3d} layers: wall {1e3 * median_after_warmup(r['wall_s']):8.1f} ms, "
                      f"host {1e3 * median_after_warmup(r['host_s']):8.1f} ms", flush=True)
                results.append(dict(r, group=title))
                save()
    print()
    print(save())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
