"""The plan against the measurements of one GPU session: every row of shared/gpu/2026-12-04 (issue 28).

The measurements (one H200, 16 CPU cores; bench/gpu/run_on_device.sh --quick and `wizard tune` with a user's
Trainer script) are copied, a few KB, into bench/results/gpu-2026-12-04.json (`--extract DIR` rebuilt it from
the shared folder), so this bench and tests/unit/test_gpu_rows.py do not depend on ../shared. For each row the
wizard plans the same model shape (bench/gpu/models.json), machine (the session's probe), sequence length,
micro-batch, checkpointing, method and rung with the raw model (no calibration), and compares:

- peak memory: the measured whole-process peak (torch's max_memory_reserved + what NVML shows for the process
  beyond torch's pool: CUDA context, NCCL, cuBLAS workspaces) against the per-GPU estimate (context and
  allocator margin included); beside it, torch's max_memory_allocated against the estimate's tensors (less
  context and margin), the part of the peak the model computes rather than allows for;
- step time: the median measured step (tune: the probe's steps after warm-up; bench rows: the second of two
  steps, the first being warm-up) against the plan's step_seconds for the same split.

Halves (fixed before any constant was changed, issue 28): the `wizard tune` trials are the 'fit' half (the CPU
step's per-thread bandwidth was chosen on the offload trial, the only one); the bench's memory cases are the
'held-out' half, which only measures the result. tests/unit/test_gpu_rows.py holds the held-out half to
+-10 % (memory) and +-15 % (step time).

Usage: python bench/bench_gpu_rows.py [--out-dir DIR] [--extract SHARED_SESSION_DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench" / "results" / "gpu-2026-12-04.json"
OUT_DIR = ROOT / "bench" / "results"
MODELS = ROOT / "bench" / "gpu" / "models.json"
GiB = 1024**3

MEMORY_BOUND_PCT = 10.0        # issue 28: peak memory within +-10 %
STEP_BOUND_PCT = 15.0          # ... and step time within +-15 %

# The trial directories' model paths (tune ran with the user's own paths) -> bench/gpu/models.json names.
TUNE_MODELS = {"models/q15": "qwen2.5-1.5b", "models/qwen2.5-1.5b": "qwen2.5-1.5b",
               "models/llama-3.1-8b": "llama-3.1-8b"}
TRIALS = {  # trial directory -> its tune run, in the session README's order
    "full-run2/01-single": "tune-full-run2", "full-run2/02-single-mb10x1": "tune-full-run2",
    "lora-run2/01-single": "tune-lora-run2", "lora-run2/02-zero2": "tune-lora-run2",
    "lora-run2/03-single-mb8x1-gc": "tune-lora-run2", "lora-run1/03-single-mb29x1-gc": "tune-lora-run1",
    "offload/01-zero2-offload-opt": "tune-offload",
}


# ============================================================================================
# extracting the few figures used from the session folder (run once; the result is committed)


def _probe_steps(path: Path) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "step" in r]


def extract(session: Path) -> dict[str, Any]:
    bench = json.loads((session / "bench.json").read_text())
    out: dict[str, Any] = {
        "about": ("Copied by bench/bench_gpu_rows.py --extract from shared/gpu/2026-12-04 (one H200, 16 CPU cores, "
                  "torch 2.11, transformers 5.17, accelerate 1.15, deepspeed 0.19.8; checkout e136bf6). 'bench' rows: "
                  "bench/gpu/run_on_device.sh --quick (bench.json); 'tune' rows: `wizard tune` trials (trials/*/probe). "
                  "predicted_at_measurement is what the wizard at e136bf6 predicted (bench.json's prediction; "
                  "the trial's wizard_plan.json)."),
        "hardware": bench["probe"]["hardware"],
        "rows": [],
    }
    for c in bench["cases"]:
        if c["status"] != "ok":
            out["rows"].append({"id": c["label"], "half": "held-out", "kind": "bench", "status": c["status"],
                                "why": c["run"].get("error", "")})
            continue
        ch = c["run"]["child"]
        spec = c["case"]
        out["rows"].append({
            "id": c["label"], "half": "held-out", "kind": "bench", "status": "ok",
            "model": spec["model"], "backend": spec["backend"], "seq_len": spec["seq_len"],
            "micro_batch": spec["micro_batch"], "gc": spec["gc"], "method": "full",
            "measured": {"whole_process_bytes": ch["measured_peak_bytes"],
                         "max_allocated_bytes": ch["max_memory_allocated"],
                         "max_reserved_bytes": ch["max_memory_reserved"],
                         "non_torch_bytes": ch["non_torch_bytes"],
                         "step_seconds": ch["step_times_s"][-1], "step_times_s": ch["step_times_s"]},
            "predicted_at_measurement": {"per_gpu_bytes": c["prediction"]["per_gpu_bytes"],
                                         "fits": c["prediction"]["fits"],
                                         "breakdown": c["prediction"]["breakdown"]},
        })
    from bench.gpu.launch_check import load_metrics_jsonl
    from bench.gpu.smi import parse_smi_samples
    fields = tuple(["timestamp", "index"] + bench["launch"]["reference_fields"][2:])
    out["launch"] = {
        "about": ("`wizard launch --headless` (qwen2.5-1.5b single s2048 b4) with `nvidia-smi -lms 1000` beside it: "
                  "the launcher's metrics.jsonl (NVML v1 memory info then) and nvidia-smi's samples, for GPU 0; "
                  "idle_nvml_used_bytes is NVML v1's 'used' on the idle GPU before the runs, where nvidia-smi shows 0."),
        "idle_nvml_used_bytes": bench["nvml"]["gpus"][0]["memory_used"],
        "metrics": load_metrics_jsonl(session / "launch-metrics.jsonl", 0),
        "nvidia_smi": parse_smi_samples((session / "launch-nvidia-smi.csv").read_text(), fields),
    }
    for trial, run in TRIALS.items():
        plan = json.loads((session / "trials" / f"{trial}-config" / "wizard_plan.json").read_text())
        steps = _probe_steps(session / "trials" / trial / "probe" / "rank-0.jsonl")
        measured = [s for s in steps if not s.get("warmup")]
        last = steps[-1]
        given = plan["given"]
        choice = plan["plan"]["choice"]
        rung = next(r for r in plan["plan"]["rungs"] if r["key"] == choice["key"])
        out["rows"].append({
            "id": f"{run}/{trial.split('/')[1]}", "half": "fit", "kind": "tune", "status": "ok",
            "model": TUNE_MODELS[given["model"]], "given": {k: v for k, v in given.items() if k != "model"},
            "rung": choice["key"], "seq_len": int(given["seq_len"]), "micro_batch": int(given["micro_batch"]),
            "gc": given.get("gradient_checkpointing") == "on", "method": given.get("method", "full"),
            "measured": {"whole_process_bytes": last["nvml_process_bytes"],
                         "max_allocated_bytes": last["cuda_max_allocated_bytes"],
                         "max_reserved_bytes": last["cuda_max_reserved_bytes"],
                         "non_torch_bytes": last["nvml_process_bytes"] - last["cuda_max_reserved_bytes"],
                         "step_seconds": statistics.median(s["seconds"] for s in measured),
                         "step_times_s": [round(s["seconds"], 4) for s in measured],
                         "optimizers": last.get("optimizers")},
            "predicted_at_measurement": {"per_gpu_bytes": rung["per_gpu_bytes"], "fits": rung["fits"],
                                         "breakdown": rung["breakdown"],
                                         "step_seconds": rung["speed"]["step_seconds"]},
        })
    return out


# ============================================================================================
# predictions with the checkout's model


@dataclass
class Result:
    id: str
    half: str
    kind: str
    rung: str
    measured_gib: float
    predicted_gib: float
    memory_error_pct: float
    allocated_gib: float            # torch max_memory_allocated
    tensors_gib: float              # the estimate less context and margin
    tensors_error_pct: float
    before_gib: float
    before_error_pct: float
    measured_step: float
    predicted_step: float | None
    step_error_pct: float | None
    before_step: float | None
    before_step_error_pct: float | None
    bound: str


def _pct(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100


def given_for_row(row: dict[str, Any], model_dir: str) -> dict[str, Any]:
    # every row was measured with the HF model's own loss (the full logits): --loss auto would count a fused one
    if row["kind"] == "tune":
        return {"loss": "full", **row["given"], "model": model_dir}
    from bench.gpu.cases import given_for
    return {"loss": "full", **given_for(model_dir, row["backend"], row["seq_len"], row["micro_batch"], row["gc"])}


def plan_row(row: dict[str, Any], hw, model_dirs: dict[str, str]):
    from wizard import pipeline
    from wizard.planning.plan import rung_by_key
    result = pipeline.build(pipeline.Request(given=given_for_row(row, model_dirs[row["model"]])), hw=hw)
    key = row.get("rung") or row["backend"]
    rung = rung_by_key(result.plan, key)
    if rung is None:
        raise RuntimeError(f"{row['id']}: the plan has no rung {key!r}")
    return rung


def evaluate(data: dict[str, Any] | None = None) -> list[Result]:
    from bench.gpu.cases import write_models
    from wizard.probe.hardware import from_json
    data = data or json.loads(DATA.read_text())
    hw = from_json(data["hardware"], source="probe")
    shapes = {k: v for k, v in json.loads(MODELS.read_text()).items() if not k.startswith("_")}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = write_models(shapes, Path(tmp))
        for row in data["rows"]:
            if row["status"] != "ok":
                continue
            rung = plan_row(row, hw, dirs)
            m = row["measured"]
            b = rung.breakdown
            tensors = rung.per_gpu_bytes - b.get("context", 0) - b.get("margin", 0)
            before = row["predicted_at_measurement"]
            step = rung.speed.step_seconds if rung.speed else None
            before_step = before.get("step_seconds")
            out.append(Result(
                id=row["id"], half=row["half"], kind=row["kind"], rung=rung.key,
                measured_gib=m["whole_process_bytes"] / GiB, predicted_gib=rung.per_gpu_bytes / GiB,
                memory_error_pct=_pct(rung.per_gpu_bytes, m["whole_process_bytes"]),
                allocated_gib=m["max_allocated_bytes"] / GiB, tensors_gib=tensors / GiB,
                tensors_error_pct=_pct(tensors, m["max_allocated_bytes"]),
                before_gib=before["per_gpu_bytes"] / GiB,
                before_error_pct=_pct(before["per_gpu_bytes"], m["whole_process_bytes"]),
                measured_step=m["step_seconds"], predicted_step=step,
                step_error_pct=_pct(step, m["step_seconds"]) if step else None,
                before_step=before_step,
                before_step_error_pct=_pct(before_step, m["step_seconds"]) if before_step else None,
                bound=rung.speed.bound if rung.speed else ""))
    return out


# ============================================================================================
# the launch view's memory against nvidia-smi


def launch_comparison(data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recorded metrics.jsonl against nvidia-smi (bench/gpu/launch_check): as recorded (NVML's v1 'used', the
    driver's reserve included) and as the sampler now reads it (v2's 'used', which NVML reports without the
    reserve: the recorded figure less the idle GPU's v1 reading, where nvidia-smi shows 0)."""
    from bench.gpu.launch_check import align, metric_diffs
    data = data or json.loads(DATA.read_text())
    launch = data["launch"]
    reserve_mib = launch["idle_nvml_used_bytes"] / 2**20
    v1 = launch["metrics"]
    v2 = [dict(m, mem_used_mib=None if m["mem_used_mib"] is None else m["mem_used_mib"] - reserve_mib) for m in v1]
    return {"reserve_mib": reserve_mib,
            "recorded": metric_diffs(align(launch["nvidia_smi"], v1)),
            "v2": metric_diffs(align(launch["nvidia_smi"], v2))}


# ============================================================================================
# report

NARRATIVE = """
## What changed (issue 28), and why

**ZeRO-3 memory** (wizard/sizing/memory.py states_zero3, zero3_step_bytes, zero3_buffers). DeepSpeed's estimator,
which the plan copied, counts 18 B per parameter over N: 2 for the 16-bit weights and 16 for fp32 weights, gradients,
momentum and variance. stage3.py keeps the gradient partition in the model's dtype (grad_partitions_flat_buffer in
gradient_accumulation_dtype, bf16), and makes fp32 gradients one optimizer sub-group at a time, during the step
(_prepare_fp32_grad_for_sub_group / _release_sub_group), when activations and logits are gone: 16 B per parameter
through backward, plus the sub-group's flattened and cast gradients (6 B x min(sub_group_size, P/N)) at the step,
counted against the freed activations. With one process and the partitions on the GPU nothing is gathered either:
partition_parameters.py's all_gather_coalesced returns _no_gather_coalesced at partition world size 1 and
NoGatherHandle points the parameter at its partition, so the estimator's gathered largest layer and the live
parameters were double counts. Both one-process ZeRO-3 rows now sit within 4 % of the whole-process peak and
within 1 % of torch's max_memory_allocated. Llama-2-7B s512 x 7 is still planned as not fitting, now by 5.4 GiB
(131.8 GiB against 126.4 usable at the default 10 % headroom, where it was 21 GiB): it ran at 127.5 GiB, past that
budget too. On the
published multi-GPU ZeRO-3 rows (bench_memory_model) the gathered term is unchanged and the gradient term moves them
by -2 P/N: the gist's four rows +5.1/-13.9/-7.4/-43.3 % -> -2.6/-16.0/-11.4/-45.8 %, peft's two -6.1/-4.1 ->
-6.2/-4.4 %, ColossalAI's +51.7 -> +48.7 %. The gist's allocated peaks exceed any accounting of its stated
configuration (their caveat in memory-model.md); the model follows DeepSpeed's code.

**CPU optimizer offload speed** (wizard/planning/speed.py cpu_step_seconds). CPU_ADAM_PARAMS_PER_CORE = 2.8e6 had been
fitted on the chenyaofo gist, whose offload rows take 18-22 s per step more than their GPU work for a reason no
bandwidth explains; it predicted this H200's offload step at 34.8 s against 0.968 s. The host step now moves 42 B per
parameter (DeepSpeed 0.19.8: gradient clip 8, DeepSpeedCPUAdam 28, the 16-bit copy back 6) through
min(OpenMP threads x 6.7 GB/s, 0.18 x the host class's peak DRAM bandwidth / processes per machine), after the fp32
gradients went down the PCIe link (half hidden behind backward), and the 16-bit weights come back up. The per-thread
figure was chosen on this session's one offload trial (fit half), the host share on DeepSpeed's ZenFlow write-up;
DeepSpeed's core-binding blog (2x A100, Qwen2.5-1.5B and 3B; now in bench/data/published_speed.json, held out) is
predicted at +15 %, +7 % and +23 % (the last with OpenMP oversubscribed, 256 threads per rank, not modelled), where the
old rate was 3.2-3.7x too slow, and DeepSpeed issue #6834 (Qwen-72B on 4 x 8 A100, "~10s" per step) at 10.3 s. The
threads: with more than one process per machine torchrun sets OMP_NUM_THREADS=1 unless it is set (accelerate launch
runs DeepSpeed through torchrun), so the plan counts min(cores / processes, OMP_NUM_THREADS), the probe records
OMP_NUM_THREADS, and the plan's notes give the exact `export OMP_NUM_THREADS=N` and the step it buys; the offload
rung's reason says how many threads its step gets. On this one-process machine the ZeRO-2 offload rung now reads
"4.0x slower" (measured 3.9x), not "138.6x".

**LoRA step time** (speed.py ADAPTER_BYTES_PER_ELEMENT). The trials' excess over the matmuls was linear in the tokens
(16 us per token on one GPU at micro-batch 4, 8 and 29; 9 us under ZeRO-2): peft's adapter path (input cast,
dropout, lora_A/B, scale, add, and their backward) is memory-bound elementwise work the FLOP count did not see. It is
now 4.5 B per adapted input + output feature (trainable / rank) and token per forward pass, backward as two, chosen on
these four trials; held out, fms-acceleration's peft LoRA/QLoRA rows move closer in 9 of 10 (+11.7..+29.9 % ->
+7.4..+25.1 %). fp32 adapters (torch AMP) plausibly cost more than DeepSpeed's bf16 ones, but the one ZeRO-2 trial does
not separate them from noise, and a split would make ZeRO-2 win single-GPU LoRA by less than `wizard tune`'s own tie.

**The LoRA micro-batch 8 peak** (-10.8 % whole-process; -9.5 % in tune's own figure, torch's reserved pool) is the
caching allocator's: torch's max_memory_allocated was 43.2 GiB against the estimate's 43.1 GiB of tensors (-0.2 %);
the reserved pool held 9.2 GiB more (1.21x allocated; micro-batch 4: 1.16x, 29: 1.06x). The allocator returns cached
blocks and retries before it reports an out-of-memory, so the cache grows into free memory and shrinks near the limit:
micro-batch 29 ran at 123.3 GiB of the plan's 124.7 GiB. The margin (7 %, fitted on the published rows) was left as
it is; the row stays the one memory miss of this session, and not a fit error.

**The launch view's memory** (wizard/probe/nvml.py, launch/view.py). The sampler read NVML's v1 memory info, whose
"used" counts the driver's reserve: 615 MiB on the idle H200 where nvidia-smi shows 0. It now reads v2
(nvmlDeviceGetMemoryInfo(handle, nvmlMemory_v2)), whose "used" is nvidia-smi's, records the reserve apart
(mem_reserved), and falls back to v1 on a driver without v2; the view then marks the figure "*" and its title says
it includes the driver's reserve. A metric that fails still reads N/A.
"""

LEFT = """
## Named misses, and what was ruled out

No constant was chosen for these: their mechanism is not established (below: what the code and the recorded data
rule out, and what a GPU session must measure). The figures were checked by `bench/bench_zero3_overhead.py` and by
reading DeepSpeed 0.19.8 (runtime/zero/stage3.py, partition_parameters.py, partitioned_param_coordinator.py).

**ZeRO-3 with one process** (held-out, -59.0 % and -54.4 %). The model's step is 0.489 and 0.519 s; the gaps, 0.704
s (Llama-2-7B: 32 layers, 291 parameter tensors, 3,584 tokens) and 0.619 s (Llama-3.2-3B: 28 layers, 254 tensors,
8,192 tokens), are 22.0 and 22.1 ms per decoder layer (2.42 and 2.44 ms per parameter tensor), but 196 against 76 us
per token and 0.10 against 0.19 ns per parameter: they follow the layer (or tensor) count, not the tokens, the width
or the bytes. Each is one step (the second of two), and nothing else in the session runs ZeRO-3. Their first steps
were only 0.17 and 0.03 s slower than the second, where every other row's first step was 0.46-2.1 s slower
(allocator growth, kernel loading): consistent with a step bound by host work that hides a first step's GPU warm-up,
not a proof of it. Ruled out, or too small:
- the gathers: at partition world size 1 all_gather_coalesced returns _no_gather_coalesced, NoGatherHandle points
  param.data at its partition (no copy), and its wait() synchronises the all-gather stream, which holds no work with
  one process (the coordinator waits inside `with stream(allgather_stream)`): nothing to block on;
- the sub-group optimizer step (step(): the norm 2 B, flattening and casting the bf16 gradient partition to fp32 10
  B, unscale_and_clip_grads 8 B, torch's fused AdamW 28 B, the copy back to bf16 6 B: ~54 B per parameter against
  the model's 30): +48 ms for the 7B, +23 ms for the 3B (7 % and 4 % of the gaps), and per parameter, not per layer;
- the gradient path (the bucket copy, reduce_scatter_coalesced's div_ and its NCCL call at world size 1,
  partition_grads' copy: 12-20 B per parameter, of which the model counts 4): about 25 ms for the 7B;
- allocator cache flushes (stage3.py warns on torch's num_alloc_retries; the bench did not record it): the 7B ran at
  127.5 of 140.4 GiB, but the 3B at 92.5 GiB, 48 GiB from the limit, with the same gap per layer;
- ZeRO-3's Python hooks alone (fetch_sub_module / release_sub_module per module in forward and backward, a gradient
  hook per tensor): `python bench/bench_zero3_overhead.py` measured their host time on this checkout's CPU
  (DeepSpeed 0.19.8's CPU accelerator over gloo, torch 2.13, a Llama of width 64 so that kernels cost nothing; 4 and
  32 layers, one thread, two runs of 10 steps, medians after 2 warm-up steps; CPU time of the main thread, since the
  machine's 2 cores were shared): 11.1-12.1 ms of host time per decoder layer and step under ZeRO-3, 2.1-2.4 ms
  under plain torch, 3.2-4.3 ms under ZeRO-2. ZeRO-3's hooks cost 8.9-9.7 ms per layer more than eager torch: about
  40 % of 22 ms even if the GPU waited for all of it, and a host-bound 7B step would take 32 x 12 ms plus its head
  and optimizer step, far under 1.19 s. The CUDA path adds stream, event and NCCL calls per tensor, and the H200's
  host is another CPU, so this bounds the hooks from below; it does not give the figure.
- Several processes: against their ZeRO-2 and FSDP siblings at the same tokens per step, the published ZeRO-3 rows
  (bench_speed_model) are 0-7 ms per layer and micro-step slower: the chenyaofo gist's (8 x A800, Llama-7B) ran
  12.93 against 12.01 s per step without checkpointing (4 micro-steps: 7.2 ms per layer), and no slower with it
  (14.38 against 15.27 s, 13.53 against 13.65 s); HF's granite-7B blog (4 x A100) 10.59 against FSDP's 10.37 s (6.9
  ms). A 22 ms per layer and micro-step term would move the five multi-GPU ZeRO-3 rows from +27..+55 % to +4..+31 %,
  but they are over-predicted as much as the gist's ZeRO-2 rows (+28..+43 %), which it leaves alone, so that is no
  evidence for it; and it would predict ZeRO-3 0.7 s per micro-step slower than ZeRO-2 where the gist measured them
  equal with checkpointing. On the other side, BELLE's issue #402 (github.com/LianjiaTech/BELLE/issues/402:
  BLOOM-560M and 1.1B, ZeRO-3 on 2 x TITAN RTX, DeepSpeed of 2023) ran the same 2.6 batches/s at sequence 512 and
  1024 where ZeRO-1 halved: a step of fixed cost, about 16 ms per layer. Either the cost is specific to one process
  or to the host, or it is not a per-layer constant with several processes; a constant chosen on these two held-out
  rows would be applied to every ZeRO-3 plan on that guess. SHARDED_LAYER_OVERHEAD_S['zero3'] stays the 1.5 ms
  GUESS.
- What a GPU session must measure: `bash bench/gpu/run_on_device.sh --diagnose` (under 5 minutes; it runs
  `bench/bench_zero3_overhead.py --preset gpu-misses --device cuda`): the 7B row's shape (width 4096, seq 512 x 7)
  at 4 and 12 layers under ZeRO-3 and plain torch, then ZeRO-2, then ZeRO-3 at seq 1024 (does the per-layer cost
  stay with twice the tokens?); for each, wall and host time per layer, num_alloc_retries, and one step under
  torch.profiler reduced to the GPU's busy time, the host's time inside CUDA synchronisation calls and their count.
  A ZeRO-3 step whose GPU idles while the host is not waiting is bound by the hooks: the term is then host time per
  layer (chosen there, checked on these two rows). One whose host waits in syncs between short kernels is
  serialised by them (partition_parameters.py's NoGatherHandle.wait synchronises the current stream; stage3.py
  synchronises the oldest of more than two reduce events), and the term is the GPU's time plus the host's. A GPU
  busy for most of the step puts the cost on the GPU, and the profile names its kernels. A two-process ZeRO-3 run on
  two GPUs (the script runs one process) says whether it applies with several processes.

**Qwen2.5-0.5B, s512 x 8** (held-out, -40.8 %): one 87 ms step (the second of two) against 51 ms predicted (37 ms of
matmuls and attention, 10 ms of fixed overhead, 4 ms of optimizer). Two candidates, which one step cannot tell
apart: (a) a host-bound step: plain eager torch's host time, 2.1-2.4 ms per decoder layer on this checkout's CPU
(above), is about 50-58 ms for 24 layers before the head, the loss and the optimizer, the order of the GPU's ~50 ms,
and the model adds the two only through its 0.25 ms per layer; (b) memory-bound elementwise work outside the matmuls
(norms, rotary, SiLU, residuals, the fp32 upcast of the 152k-vocabulary logits), which per FLOP is 1.7x the
Qwen2.5-1.5B's (roughly 30 h + 10 f element-passes per token and layer over its matmul FLOPs: ~8e-4 at width 896,
~5e-4 at 1536), where the width factor (HIDDEN_KNEE) charges 10 % between the two and the 1.5B rows at 8,192 tokens
are within -0.9 % and -2.4 %. A term for either would be fitted on this one row. GPU: the same `--diagnose` call
runs this row's shape at 6 and 24 layers under plain torch: a GPU idle for much of the step is (a), a GPU busy for
it with the profile's time in elementwise kernels is (b).

**ZeRO-2 at one process** over-counts torch's allocated peak (+24 % tensors, +4.9 % whole-process): its estimator's
fp32 gradient partition exists only in the step, as in ZeRO-3; within the bounds, so not changed here.

The bench rows' step times are one step after one warm-up step each; the tune trials' are medians of 3-6.


"""


def _f(v: float | None, fmt: str = "{:+.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def _table(results: list[Result]) -> list[str]:
    lines = [
        "| row | half | rung | measured GiB | before GiB | err % | now GiB | err % | allocated GiB | tensors GiB | "
        "err % | measured step s | before s | err % | now s | err % | bound |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.id} | {r.half} | {r.rung} | {r.measured_gib:.1f} | {r.before_gib:.1f} | {r.before_error_pct:+.1f} "
            f"| {r.predicted_gib:.1f} | {r.memory_error_pct:+.1f} | {r.allocated_gib:.1f} | {r.tensors_gib:.1f} "
            f"| {r.tensors_error_pct:+.1f} | {r.measured_step:.3f} | {_f(r.before_step, '{:.3f}')} "
            f"| {_f(r.before_step_error_pct)} | {_f(r.predicted_step, '{:.3f}')} | {_f(r.step_error_pct)} "
            f"| {r.bound} |")
    return lines


def _halves(results: list[Result]) -> list[str]:
    lines = ["| half | rows | max abs memory error % (before -> now) | within +-10 % | "
             "max abs step error % (before -> now) | within +-15 % |", "| --- | ---: | --- | ---: | --- | ---: |"]
    for half in ("fit", "held-out"):
        part = [r for r in results if r.half == half]
        mem_b = max(abs(r.before_error_pct) for r in part)
        mem_n = max(abs(r.memory_error_pct) for r in part)
        mem_ok = sum(abs(r.memory_error_pct) <= MEMORY_BOUND_PCT for r in part)
        steps_b = [abs(r.before_step_error_pct) for r in part if r.before_step_error_pct is not None]
        steps_n = [abs(r.step_error_pct) for r in part if r.step_error_pct is not None]
        step_ok = sum(v <= STEP_BOUND_PCT for v in steps_n)
        step_text = (f"{max(steps_b):.1f} -> " if steps_b else "- (not predicted then) -> ") + f"{max(steps_n):.1f}"
        lines.append(f"| {half} | {len(part)} | {mem_b:.1f} -> {mem_n:.1f} | {mem_ok} of {len(part)} | {step_text} "
                     f"| {step_ok} of {len(steps_n)} |")
    return lines


def _launch(cmp: dict[str, Any]) -> list[str]:
    rec, v2 = cmp["recorded"], cmp["v2"]
    def f(v, fmt="{:.2f}"):
        return "–" if v is None else fmt.format(v)
    return [
        f"`wizard launch`'s metrics.jsonl against `nvidia-smi -lms 1000` ({rec['pairs']} pairs, mean |dt| "
        f"{f(rec['mean_dt_s'])} s). 'now' is the recorded v1 figure less the idle GPU's {cmp['reserve_mib']:.0f} MiB, "
        "the reserve NVML's v2 reports apart.",
        "",
        "| metric | as recorded (NVML v1) | as the sampler reads it now (v2) |",
        "| --- | ---: | ---: |",
        f"| memory used, mean abs difference | {f(rec['mem_mib'])} MiB | {f(v2['mem_mib'])} MiB |",
        f"| memory used, % where nvidia-smi shows >= 1 GiB | {f(rec['mem_pct_busy'], '{:.3f}')} % | "
        f"{f(v2['mem_pct_busy'], '{:.4f}')} % |",
        f"| utilisation, all pairs | {f(rec['util_pp'])} pp | {f(v2['util_pp'])} pp |",
        f"| utilisation, steady pairs ({rec['util_pairs_steady']}) | {f(rec['util_pp_steady'])} pp | "
        f"{f(v2['util_pp_steady'])} pp |",
        f"| power (nvidia-smi power.draw) | {f(rec['power_pct'])} % | {f(v2['power_pct'])} % |",
        "",
        "Utilisation: the pairs are 70 ms apart, not misaligned; NVML's utilisation is a mean over the driver's last "
        "sample period, and two of the 30 pairs straddle the run's start and end (nvidia-smi 29 % against 1 %, 0 % "
        "against 77 %), which carry most of the 5.5 pp. Over the steady pairs the difference is the figure above: "
        "the launcher mostly reads lower while busy, by up to 10 points late in the run (90 % against 100 %). "
        "Informational; the bench's threshold is unchanged.",
    ]


def report(results: list[Result], launch: dict[str, Any]) -> str:
    lines = [
        "# The plan against one GPU session (shared/gpu/2026-12-04)",
        "",
        "Generated by `python bench/bench_gpu_rows.py` from `bench/results/gpu-2026-12-04.json` (the figures copied "
        "from the session folder by `--extract`); do not edit by hand. One H200 (140.4 GiB), 16 CPU cores, "
        "torch 2.11, transformers 5.17, accelerate 1.15, deepspeed 0.19.8. The raw model (no calibration). "
        "Error = (predicted - measured) / measured. 'before' is what the wizard at e136bf6 predicted when the "
        "session ran (the bench rows' step time was not predicted then).",
        "",
        "Memory: the whole-process peak (torch max_memory_reserved + NVML's process memory beyond torch's pool) "
        "against the per-GPU estimate; 'tensors' compares torch's max_memory_allocated with the estimate less the "
        "CUDA context and the allocator margin. Step time: the median measured step after warm-up (bench rows: the "
        "second of their two steps) against the plan's step time for the same split.",
        "",
        f"Targets (issue 28): every row within +-{MEMORY_BOUND_PCT:.0f} % (memory) and +-{STEP_BOUND_PCT:.0f} % "
        "(step time). Halves, fixed before any constant was changed: the `wizard tune` trials are the fit half "
        "(the CPU step's per-thread bandwidth and the LoRA adapter bytes were chosen on them), the bench's memory "
        "cases the held-out half (tests/unit/test_gpu_rows.py holds it to the targets, less the misses named below).",
        "",
        *_table(results),
        "",
        *_halves(results),
        "",
        "## The launch view's memory against nvidia-smi",
        "",
        *_launch(launch),
        NARRATIVE,
        "## Published runs, before and after (bench_memory_model.py, bench_speed_model.py)",
        "",
        "| bench | half | before | after |",
        "| --- | --- | --- | --- |",
        "| memory | fit (25 rows) | median 5.5 %, 21 within +-15 %, worst guarded -8.7 % | median 5.5 %, 20 within "
        "+-15 % (gist ZeRO-3 nockpt -13.9 -> -16.0 %), worst guarded -8.7 % |",
        "| memory | held-out (29 rows) | median 3.1 %, 28 within +-15 %, worst guarded -8.3 % | the same |",
        "| memory | all (54) | median 4.7 %, 49 within | median 4.4 %, 48 within |",
        "| speed | fit (43 rows) | median 10.5 %, 33 within +-25 % | median 12.7 %, 30 within (the gist's three "
        "offload rows +4..+18 % -> +90..+115 %; the other 40 rows: 11.1 % -> 11.1 %) |",
        "| speed | held-out, the same 21 rows | median 12.0 %, 13 within +-25 % | median 8.9 %, 16 within (fms-acceleration "
        "LoRA/QLoRA) |",
        "| speed | held-out with DeepSpeed's core-binding blog (25) | – | median 11.0 %, 19 within |",
        LEFT,
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--extract", type=Path, default=None,
                        help="rebuild bench/results/gpu-2026-12-04.json from this session folder first")
    args = parser.parse_args(argv)
    if args.extract is not None:
        DATA.write_text(json.dumps(extract(args.extract), indent=1) + "\n")
        print(f"wrote {DATA}")
    results = evaluate()
    for r in results:
        print(f"{r.id:45s} {r.half:8s} mem {r.before_error_pct:+6.1f} -> {r.memory_error_pct:+6.1f} %  "
              f"tensors {r.tensors_error_pct:+6.1f} %  step {_f(r.before_step_error_pct):>6} -> "
              f"{_f(r.step_error_pct):>6} %")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "gpu-2026-12-04.md"
    out.write_text(report(results, launch_comparison()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
