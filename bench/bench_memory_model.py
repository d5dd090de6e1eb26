"""Check the planner's memory model against published peak-memory measurements.

Reads bench/data/published_memory.json (every figure copied from a cited public source, the row quoted
verbatim; model shapes from bench/data/published_speed.json), plans each measured configuration exactly as
bench_speed_model.py does (same shape, GPUs, sequence length, micro-batch, checkpointing, method and rung),
and compares like with like:

- 'allocated' (torch.cuda.max_memory_allocated) against the plan's live tensors: its per-GPU figure less the
  CUDA context and the allocator margin;
- 'reserved' (torch.cuda.max_memory_reserved) against that plus the allocator margin;
- 'whole-process' (nvidia-smi / NVML used memory) against the whole per-GPU figure, CUDA context included.

Writes bench/results/memory-model.md (the table, the error of each half of the sources, the share within
+-15 %, the largest under-prediction of a reserved or whole-process figure, where the model is weakest) and
bench/results/memory-model.json.

Usage: python bench/bench_memory_model.py [--data FILE] [--out-dir DIR]
Fast (no torch import): the planner's core is pure Python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_speed_model as speed_bench  # noqa: E402  (same shapes, adapters and rung lookup)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "published_memory.json"
OUT_DIR = ROOT / "bench" / "results"
GiB = 1024**3

KINDS = ("allocated", "reserved", "whole-process")
WITHIN_PCT = 15.0            # issue 19: within +-15 % on at least 85 % of rows
UNDER_LIMIT_PCT = -10.0      # ... and no reserved / whole-process figure under-predicted by more than 10 %


def load(path: Path = DATA) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    data["models"] = speed_bench.load()["models"]
    return data


@dataclass
class Row:
    id: str
    source: str
    split: str
    kind: str
    method: str
    rung: str
    gpu: str
    gpus: int
    model: str
    seq_len: int
    micro_batch: int
    checkpointing: bool
    measured_gib: float
    predicted_gib: float
    error_pct: float                # (predicted - measured) / measured * 100
    fits: bool                      # the estimate fits the GPU with no headroom
    fits_default_headroom: bool     # ... and with the wizard's default headroom (StrategyOptions().headroom)
    breakdown_gib: dict[str, float]


@dataclass
class Unplanned:
    id: str
    source: str
    split: str
    rung: str
    method: str
    reason: str


def predicted_bytes(rung, kind: str) -> int:
    """The plan's figure comparable with a measurement of `kind`."""
    b = rung.breakdown
    if kind == "whole-process":
        return rung.per_gpu_bytes
    if kind == "reserved":
        return rung.per_gpu_bytes - b["context"]
    if kind == "allocated":
        return rung.per_gpu_bytes - b["context"] - b["margin"]
    raise ValueError(f"unknown kind {kind!r}")


def predict(entry: dict[str, Any], data: dict[str, Any]) -> Row | Unplanned:
    split = data["sources"][entry["source"]]["split"]
    rung, why = speed_bench.plan_rung(entry, data["models"][entry["model"]])
    if rung is None:
        return Unplanned(entry["id"], entry["source"], split, entry["rung"], entry.get("method", "full"), why)
    from wizard.planning.plan import StrategyOptions
    from wizard.probe.catalogue import by_name
    from wizard.sizing.memory import usable_bytes

    kind = entry["measured"]["kind"]
    pred = predicted_bytes(rung, kind)
    capacity = by_name(entry["gpu"]).memory
    meas = entry["bytes"]
    return Row(
        id=entry["id"], source=entry["source"], split=split, kind=kind, method=entry.get("method", "full"),
        rung=entry["rung"], gpu=entry["gpu"], gpus=entry["gpus_per_node"] * entry["nodes"], model=entry["model"],
        seq_len=entry["seq_len"], micro_batch=entry["micro_batch"],
        checkpointing=bool(entry["gradient_checkpointing"]),
        measured_gib=meas / GiB, predicted_gib=pred / GiB, error_pct=(pred - meas) / meas * 100,
        fits=rung.per_gpu_bytes <= capacity,
        fits_default_headroom=rung.per_gpu_bytes <= usable_bytes(capacity, StrategyOptions().headroom),
        breakdown_gib={k: round(v / GiB, 3) for k, v in rung.breakdown.items()},
    )


def predict_all(data: dict[str, Any]) -> tuple[list[Row], list[Unplanned]]:
    rows, unplanned = [], []
    for e in data["entries"]:
        r = predict(e, data)
        (rows if isinstance(r, Row) else unplanned).append(r)
    return rows, unplanned


# ============================================================================================
# summary


def within(rows: list[Row], pct: float = WITHIN_PCT) -> int:
    return sum(abs(r.error_pct) <= pct for r in rows)


def worst_under(rows: list[Row]) -> Row | None:
    """The most under-predicted reserved or whole-process row (the direction that turns 'fits' into an OOM)."""
    guarded = [r for r in rows if r.kind in ("reserved", "whole-process")]
    return min(guarded, key=lambda r: r.error_pct, default=None)


def half(rows: list[Row], split: str | None) -> dict[str, Any]:
    part = [r for r in rows if split is None or r.split == split]
    if not part:
        return {"entries": 0, "sources": 0}
    under = worst_under(part)
    return {"entries": len(part), "sources": len({r.source for r in part}),
            "median_abs_error_pct": round(statistics.median(abs(r.error_pct) for r in part), 1),
            "median_signed_error_pct": round(statistics.median(r.error_pct for r in part), 1),
            "within_15_pct": within(part), "within_15_share": round(within(part) / len(part), 3),
            "worst_guarded_under_pct": round(under.error_pct, 1) if under else None,
            "worst_guarded_under_id": under.id if under else None,
            "adapter_rows_planned_not_fitting": sorted(r.id for r in part if r.method != "full" and not r.fits),
            "adapter_rows_not_fitting_default_headroom": sorted(
                r.id for r in part if r.method != "full" and not r.fits_default_headroom)}


def by(rows: list[Row], key) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: {"n": len(v), "median_abs_error_pct": round(statistics.median(abs(r.error_pct) for r in v), 1),
                "median_signed_error_pct": round(statistics.median(r.error_pct for r in v), 1),
                "within_15_pct": within(v)}
            for k, v in sorted(groups.items())}


# What issue 19 changed in the memory model, with its evidence. Static text: each mechanism was found and measured
# on CPU (bench/measure_activations.py, bench/measure_fsdp_activations.py) or read from the libraries' code; the
# held-out rows' misses said where to look, and no constant was chosen on them.
INVESTIGATED = [
    "## Changed for issue 19: three mechanisms, measured, none fitted", "",
    "The held-out misses (22 of 29 within +-15 %, worst guarded -15.6 % before) pointed at where to look; each "
    "change below is a mechanism measured on CPU or read from the libraries' code, with no constant chosen on "
    "any row. Held-out after: 28 of 29, worst guarded -8.3 %; the fit half keeps 21 of 25 and median 5.5 %.", "",
    "- **Under gradient checkpointing the recomputed layer and the loss's peak do not coexist** "
    "(memory.peak_activation_bytes). The plan used to add the loss peak (12 B per logit) to the checkpoints plus "
    "one recomputed layer and its backward. MEASURED on CPU (bench/measure_activations.py, live-storage tracker, "
    "tiny Llama h256 L4 s256 b2 bf16 SDPA): V=32000 peaks at 198.8 MB against 197.7 MB for checkpoints + "
    "max(loss peak, recomputed layer) and 205.5 MB for the sum; V=2000 at 14.5 MB against 13.3 and 21.2. The "
    "loss's backward frees the logits' gradients before backward reaches the last layer. fms-acceleration's "
    "one-GPU LoRA slope agrees: 671 kB per token, exactly 2hL + 6h + 12V (checkpoints, final norm, loss peak), "
    "no recomputed layer.",
    "- **QLoRA under torch AMP after prepare_model_for_kbit_training runs an fp32 residual stream** "
    "(plan._activation_precision). peft casts every non-4-bit parameter (norms, embeddings) to fp32, RMSNorm "
    "returns weight * x in fp32 and bitsandbytes' Linear4bit returns its input's dtype, so every checkpointed layer "
    "input and the MLP's intermediates are fp32. MEASURED on CPU (bitsandbytes 0.50.2, peft 0.21.2, transformers "
    "5.24, bf16 autocast): every decoder layer's input is fp32. It applies where the snippet calls it (one GPU, "
    "DDP); ZeRO-1/2 cast the parameters back to bf16 and sharded QLoRA skips the call. litgpt's bf16-true QLoRA "
    "rows never call it (`lora.kbit_prepared: false` in the data).",
    "- **FSDP1 with adapters under transformers 4.x's reentrant checkpointing keeps every layer's input and its "
    "gradient until backward ends** (memory.fsdp1_retained_checkpoint_bytes): w * h * (L - 2) more per token. "
    "transformers 4.x checkpoints the FSDP wrapper's __call__, so FSDP1's _pre_forward runs again inside the "
    "recompute and registers a multi-grad hook on each frozen layer unit's detached input "
    "(_register_post_backward_reshard_only_hook); the hook owns the leaf until FSDP's final callback. MEASURED on "
    "CPU with the published runs' versions (bench/measure_fsdp_activations.py, bench/results/fsdp-activations.md: "
    "torch 2.4.1, transformers 4.45.2, peft 0.13.2, 2 ranks over gloo): exactly 2h(L-2) B per token in bf16 at "
    "every shape tried, none with the hook removed, non-reentrant checkpointing, FSDP2 or transformers 5. "
    "Extrapolated to Mistral-7B it predicts 834 kB per token per GPU against the published 844 (one GPU: 671). "
    "It applies when the files select FSDP1 (fsdp_version: 1) and the installed transformers is 4.x; the wizard "
    "writes FSDP2 by default.",
    "",
    "Still missed: **ColossalAI GPT2-XL ZeRO-3 micro-batch 40 (+52 %)**. The micro-batch is per process "
    "(checked); the run's loss is the benchmark's own fp16 cross-entropy without an fp32 upcast under DeepSpeed's "
    "fp16 engine, about 6 B per logit where the plan counts transformers' upcasting loss (12 B). The wizard plans "
    "transformers' loss, so the row stays counted as a miss.",
    "",
]


GROUPINGS = (
    ("split", lambda r: r.split),
    ("kind", lambda r: r.kind),
    ("source", lambda r: r.source),
    ("method", lambda r: r.method),
    ("rung", lambda r: r.rung),
)


def summary(rows: list[Row]) -> dict[str, Any]:
    return {"all": half(rows, None), "fit": half(rows, "fit"), "holdout": half(rows, "holdout"),
            "by": {name: by(rows, key) for name, key in GROUPINGS}}


def render_markdown(data: dict[str, Any], rows: list[Row], summ: dict[str, Any], unplanned: list[Unplanned]) -> str:
    from wizard.planning.plan import StrategyOptions

    a, fit, hold = summ["all"], summ["fit"], summ["holdout"]

    def line(name, h):
        return (f"| {name} | {h['entries']} | {h['sources']} | {h['median_abs_error_pct']:.1f} | "
                f"{h['median_signed_error_pct']:+.1f} | {h['within_15_pct']} ({h['within_15_share']:.0%}) | "
                f"{h['worst_guarded_under_pct']:+.1f} (`{h['worst_guarded_under_id']}`) |"
                if h["entries"] else f"| {name} | 0 | 0 | | | | |")

    out = ["# Memory model against published measurements", "",
           "Generated by `python bench/bench_memory_model.py` from `bench/data/published_memory.json`; do not edit by "
           "hand. Each row is one published peak-memory figure: the wizard plans the same model shape, GPUs, sequence "
           "length, micro-batch, checkpointing, method and rung, and its per-GPU estimate is compared like with like: "
           "an **allocated** peak (torch.cuda.max_memory_allocated) with the plan's tensors (per-GPU figure less the CUDA "
           "context and the allocator margin), a **reserved** peak with that plus the margin, a **whole-process** figure "
           "(nvidia-smi / NVML) with the whole per-GPU figure, CUDA context included. Error = (predicted - measured) / "
           "measured.", "",
           "The sources are split in two halves, once, in the data file (`sources.*.split`); constants may be chosen on "
           "the fit half only. " + data.get("split_rule", ""), "",
           "| half | rows | sources | median abs error % | median signed error % | within +-15 % | worst under-prediction "
           "of a reserved / whole-process figure % |",
           "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
           line("fit", fit), line("**held-out**", hold), line("all", a), "",
           "Targets (issue 19): within +-15 % on at least 85 % of rows; no reserved or whole-process figure "
           "under-predicted by more than 10 %.", ""]
    if a.get("adapter_rows_planned_not_fitting"):
        out += ["LoRA / QLoRA rows whose estimate exceeds the GPU they were measured on: "
                + ", ".join(f"`{i}`" for i in a["adapter_rows_planned_not_fitting"]) + ".", ""]
    else:
        out += ["Every LoRA / QLoRA row's estimate (CUDA context and allocator margin included) fits the GPU it was "
                "published on."]
    tight = a.get("adapter_rows_not_fitting_default_headroom")
    if tight:
        out += [f"With the default headroom ({StrategyOptions().headroom:.0%} of the GPU kept free on top of the "
                "estimate) these do not: " + ", ".join(f"`{i}`" for i in tight) + ". Their estimates are within a "
                "few per cent of the measured peaks (table): the published runs use more of the card than the default "
                "headroom leaves free.", ""]
    else:
        out.append("")
    out += ["| entry | half | kind | method | GPUs | rung | seq | mb | ckpt | measured GiB | predicted GiB | error % | "
            "fits (0 / default headroom) | states | activations | logits | context |",
            "| --- | --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        b = r.breakdown_gib
        states = b["parameters"] + b["gradients"] + b["optimizer"]
        out.append(f"| {r.id} | {r.split} | {r.kind} | {r.method} | {r.gpus}x{r.gpu} | {r.rung} | {r.seq_len} | "
                   f"{r.micro_batch} | {str(r.checkpointing).lower()} | {r.measured_gib:.2f} | {r.predicted_gib:.2f} | "
                   f"{r.error_pct:+.1f} | {'yes' if r.fits else 'no'} / {'yes' if r.fits_default_headroom else 'no'} | "
                   f"{states:.2f} | {b['activations']:.2f} | "
                   f"{b['logits']:.2f} | {b['context']:.2f} |")
    if unplanned:
        out += ["", f"**{len(unplanned)} rows the wizard cannot plan today** (kept in the data, not in any figure):", ""]
        out += [f"- `{u.id}` ({u.split}, {u.method}, rung {u.rung}): {u.reason}" for u in unplanned]
    out += ["", "## Error by group", ""]
    for name, _ in GROUPINGS:
        out += [f"**{name}**", "", "| group | n | median abs error % | median signed error % | within +-15 % |",
                "| --- | ---: | ---: | ---: | ---: |"]
        for k, g in summ["by"][name].items():
            out.append(f"| {k} | {g['n']} | {g['median_abs_error_pct']:.1f} | {g['median_signed_error_pct']:+.1f} | "
                       f"{g['within_15_pct']} |")
        out.append("")
    worst = sorted(rows, key=lambda r: -abs(r.error_pct))[:5]
    out += ["## Largest errors", ""]
    out += [f"- `{r.id}` ({r.kind}, {r.error_pct:+.0f} %): measured {r.measured_gib:.2f} GiB, predicted "
            f"{r.predicted_gib:.2f} GiB ({', '.join(f'{k} {v:.2f}' for k, v in r.breakdown_gib.items() if v)})."
            for r in worst]
    out += ["", "Caveats: the gist's 'GPU Mem.' peaks are not all physically consistent: ZeRO-2 with checkpointing at "
            "micro-batch 1 reports 23.5, what its model states alone take (16-bit weights 12.55 GiB, fp32 master and "
            "Adam partition 9.41, 16-bit gradient partition 1.57), with no room for activations or logits; the same "
            "ZeRO-3 run reports 39.1 with one accumulation step and 63.9 with two; parameter offload reports 7.9, "
            "less than its checkpointed activations and fp32 logits. They are kept and counted as published. litgpt "
            "runs its own GPT implementation (one dropout for the fused qkv adapter, bf16 adapters under bf16-true) "
            "where the plan counts peft's. fms-acceleration's LoRA runs load the model in bf16 without mixed "
            "precision.", ""]
    out += INVESTIGATED
    out += ["## Sources", ""]
    for key, s in data["sources"].items():
        out.append(f"- **{key}** ({s.get('split', '?')}): {s['title']}. {s['url']}. {s['setup']}")
        if "memory_note" in s:
            out.append(f"  Memory figure: {s['memory_note']}")
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)

    data = load(args.data)
    rows, unplanned = predict_all(data)
    summ = summary(rows)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "memory-model.md").write_text(render_markdown(data, rows, summ, unplanned))
    (args.out_dir / "memory-model.json").write_text(
        json.dumps({"summary": summ, "rows": [asdict(r) for r in rows],
                    "unplanned": [asdict(u) for u in unplanned]}, indent=1) + "\n")
    for name in ("fit", "holdout", "all"):
        h = summ[name]
        print(f"{name}: {h['entries']} rows, median |error| {h.get('median_abs_error_pct')}%, within 15%: "
              f"{h.get('within_15_pct')} ({h.get('within_15_share')}), worst guarded under-prediction "
              f"{h.get('worst_guarded_under_pct')}%")
    print(f"{len(unplanned)} not plannable; wrote {args.out_dir / 'memory-model.md'} and memory-model.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
