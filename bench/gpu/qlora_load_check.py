"""The QLoRA loading premise on a GPU (issue 28): does every rank hold the whole 4-bit model on its GPU while a
sharded QLoRA run loads, before FSDP shards it?

The plan says yes (wizard.sizing.lora.qlora_load_gpu_bytes: transformers builds quantised models outside FSDP's
RAM-efficient path, where only local rank 0 loads and the others stay on meta, and bitsandbytes quantises onto
the rank's own GPU), so "70B QLoRA on 2 x 24 GB does not fit while loading"; until now that rested on a CPU run
(bench/measure_qlora_loading.py). Here two processes share the one GPU, each a rank of a 2-process job under
accelerate's FSDP environment (ACCELERATE_USE_FSDP, FSDP_CPU_RAM_EFFICIENT_LOADING, FSDP_VERSION 2, a gloo
process group: NCCL refuses two ranks on one GPU, and loading exchanges nothing on it), and each runs
from_pretrained of the same saved checkpoint (random weights, bf16 safetensors) with the BitsAndBytesConfig the
wizard writes for FSDP QLoRA. Each reports, while both still hold their model: the bytes of its parameters and
buffers by device (cuda / cpu / meta), torch's allocated and reserved bytes and NVML's figure for its pid.

Prediction: the plan for the same model as QLoRA on FSDP2 with resharding, on two GPUs like the one found:
its rung's load_bytes (the whole NF4 model + the CUDA context) and, less the context, the 4-bit model itself.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.cases import Planner
from bench.gpu.common import HERE
from bench.gpu.memory_check import error_pct
from bench.gpu.runner import Options, child_env, free_port, keep_tail, parse_result_line, run_children

LOAD_RUNG = "fsdp-reshard"
# A rank 'holds the whole model on its device' when at least this share of its parameters' and buffers' bytes
# is there; 'holds none of it' below the other share (the RAM-efficient path's meta / CPU copies).
WHOLE_SHARE, NONE_SHARE = 0.9, 0.1
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true", "FSDP_VERSION": "2",
            "FSDP_SYNC_MODULE_STATES": "true"}


def two_gpu_hardware(hw, processes: int):
    """The machine found with `processes` GPUs like its first: what the premise is about (one rank per GPU)."""
    first = hw.gpus[0]
    gpus = [dataclasses.replace(first, index=i, nvml_index=None if first.nvml_index is None else first.nvml_index + i,
                                uuid=None, pci_bus_id=None) for i in range(processes)]
    return dataclasses.replace(hw, gpus=gpus)


def predict_loading(planner: Planner, model: str, processes: int, hw_many) -> dict[str, Any]:
    """The plan's per-GPU bytes while loading (rung.load_bytes) and the adapter setup the wizard writes for it."""
    from wizard.frontends import snippets
    from wizard.planning.plan import rung_by_key
    result = planner.build(model, LOAD_RUNG, 2048, 1, True, "qlora", num_processes=processes, hw=hw_many)
    rung = rung_by_key(result.plan, LOAD_RUNG)
    if rung is None:
        raise RuntimeError(f"the QLoRA plan for {processes} GPUs has no {LOAD_RUNG} rung")
    plan = dataclasses.replace(result.plan, choice=rung)
    context = int(rung.breakdown.get("context", 0))
    return {"rung": rung.key, "load_bytes": int(rung.load_bytes), "context_bytes": context,
            "nf4_model_bytes": int(rung.load_bytes) - context if rung.load_bytes else None,
            "per_gpu_bytes": int(rung.per_gpu_bytes), "fits": bool(rung.fits),
            "setup": {"lora": snippets.lora_config_kwargs(result.answers, result.model, plan),
                      "bnb": snippets.bnb_config_kwargs(result.answers, plan),
                      "kbit_prepared": bool(snippets.kbit_prepared(plan))}}


def device_share(held: dict[str, int] | None, device: str) -> float | None:
    """The share of a rank's parameter and buffer bytes that is on `device` (cuda on a GPU, cpu in a dry run)."""
    if not held:
        return None
    total = sum(held.values())
    return held.get(device, 0) / total if total else None


def loading_verdict(ranks: list[dict | None], device: str) -> tuple[str, str]:
    """(holds | does not hold | unknown, why) for 'every rank holds the whole quantised model on its device'."""
    if not ranks or any(r is None or r.get("status") != "ok" for r in ranks):
        bad = [f"rank {i}: {(r or {}).get('status', 'no result')}" for i, r in enumerate(ranks) if
               r is None or r.get("status") != "ok"]
        return "unknown", "not every rank loaded (" + ", ".join(bad or ["no ranks"]) + ")"
    shares = [device_share(r.get("held_bytes"), device) for r in ranks]
    if any(s is None for s in shares):
        return "unknown", "a rank reported no bytes"
    text = ", ".join(f"rank {i} {s * 100:.0f}%" for i, s in enumerate(shares))
    if all(s >= WHOLE_SHARE for s in shares):
        return "holds", f"every rank holds the whole model on {device} ({text})"
    if any(s <= NONE_SHARE for s in shares[1:]):
        return "does not hold", f"a rank other than local rank 0 holds (next to) none of it on {device} ({text})"
    return "unknown", f"neither whole nor none on {device} ({text})"


def rank_summary(result: dict | None, predicted_nf4: int | None, dry_run: bool) -> dict[str, Any]:
    r = result or {}
    held = r.get("held_bytes") or {}
    allocated = r.get("memory_allocated_after_load")
    return {"status": r.get("status", "no result"), "error": r.get("error"), "rank": r.get("rank"),
            "local_rank": r.get("local_rank"), "fsdp_enabled": r.get("fsdp_enabled"), "load_s": r.get("load_s"),
            "held_bytes": held, "memory_allocated_after_load": allocated,
            "max_memory_reserved": r.get("max_memory_reserved"),
            "process_used_after_load": r.get("process_used_after_load"), "pid_match": r.get("pid_match"),
            "error_pct": None if dry_run else error_pct(predicted_nf4, allocated)}


def load_command(model_dir: str, checkpoint: str, setup_path: Path, dry_run: bool,
                 nvml_index: int | None) -> list[str]:
    cmd = [sys.executable, str(HERE / "train_one.py"), "--model-dir", model_dir, "--load-only",
           "--checkpoint", checkpoint, "--adapter-json", str(setup_path)]
    if dry_run:
        cmd += ["--device", "cpu", "--tiny"]
    elif nvml_index is not None:
        cmd += ["--nvml-index", str(nvml_index)]
    return cmd


def run_qlora_load(cfg: dict, planner: Planner, opts: Options, work: Path, results_dir: Path, checkpoint: str,
                   nvml_index: int | None, timeout: float) -> dict[str, Any]:
    model, processes = cfg["model"], int(cfg.get("processes", 2))
    hw_many = two_gpu_hardware(planner.hw, processes)
    pred = predict_loading(planner, model, processes, hw_many)
    run_dir = work / "qlora-load"
    run_dir.mkdir(parents=True, exist_ok=True)
    setup_path = run_dir / "adapters.json"
    setup_path.write_text(json.dumps(pred["setup"]))
    port = free_port()
    jobs = []
    for rank in range(processes):
        env = child_env({**FSDP_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes),
                         "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                         "OMP_NUM_THREADS": "4"})
        jobs.append((load_command(planner.model_dirs[model], checkpoint, setup_path, opts.dry_run, nvml_index),
                     env, run_dir / f"rank-{rank}.log"))
    children = run_children(jobs, timeout)
    ranks = []
    for rank, child in enumerate(children):
        keep_tail(run_dir / f"rank-{rank}.log", results_dir / f"qlora-load-rank-{rank}-stderr.log")
        result = parse_result_line(child["lines"])
        if result is None:
            result = {"status": "timeout" if child["timed_out"] else "crash",
                      "error": f"exit {child['returncode']} without a result line"}
        ranks.append(result)
    device = "cpu" if opts.dry_run else "cuda"
    verdict, why = loading_verdict(ranks, device)
    if opts.dry_run and verdict != "unknown":
        why = f"dry run (tiny model on the CPU, nothing measured): the code path ran; {why}"
        verdict = "unknown"
    return {"model": model, "processes": processes, "checkpoint": checkpoint,
            "prediction": {k: v for k, v in pred.items() if k != "setup"}, "setup": pred["setup"],
            "wall_s": max((c["wall_s"] for c in children), default=None),
            "ranks": [rank_summary(r, pred["nf4_model_bytes"], opts.dry_run) for r in ranks],
            "verdict": verdict, "verdict_why": why}
