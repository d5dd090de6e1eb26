"""Check the planner's speed model against published training-speed measurements.

Reads bench/data/published_speed.json (every figure copied from a cited public source, the row
quoted verbatim), builds the hardware, model shape and options of each measured configuration
(precision, optimizer, method; LoRA / QLoRA adapters counted analytically on the Llama-like shape),
runs `make_plan`, takes the rung the configuration corresponds to, and compares the rung's
predicted tokens/s per GPU with the measured figure. Each source is in the 'fit' or the 'holdout'
half (sources.*.split): constants may be chosen on the fit half only, and both halves' errors are
reported. Entries the wizard cannot plan yet (no such rung) are listed apart, in no error figure.
Writes bench/results/speed-model.md (the table, both halves' median absolute errors, the error per
source, backend and regime, and where the model is weakest) and bench/results/speed-model.json.

Usage: python bench/bench_speed_model.py [--data FILE] [--out-dir DIR]
Fast (well under a second of planning; no torch import): the planner's core is pure Python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "published_speed.json"
OUT_DIR = ROOT / "bench" / "results"


# ============================================================================================
# model arithmetic (also used by tests/unit/test_speed_published.py to check the data file)


def param_count(model: dict[str, Any], seq_len: int) -> int:
    """Exact parameter count of the architecture in `model` (tied embeddings counted once).

    MPT (llm-foundry): biased Linear layers and LayerNorms, a learned position embedding of
    max_seq_len rows, LM head tied to the token embedding. Llama: no biases, RMSNorm, rotary
    positions, grouped-query attention, an untied LM head.
    """
    d, layers, ff, vocab = model["hidden_size"], model["layers"], model["intermediate_size"], model["vocab_size"]
    kv_dim = d * model["kv_heads"] // model["heads"]
    attention = d * d + 2 * d * kv_dim + d * d                 # q, k, v, out
    if model["family"] == "mpt":
        mlp = 2 * d * ff                                       # up, down
        biases = (d + 2 * kv_dim) + d + ff + d                 # Wqkv, out_proj, up_proj, down_proj
        norms = 2 * 2 * d                                      # two LayerNorms, weight and bias
        final_norm = 2 * d
    elif model["family"] == "bert":
        # BertForSequenceClassification: biased Linears, two LayerNorms per layer, learned positions and token
        # types, a pooler and the classifier; no LM head.
        ff, pos = model["intermediate_size"], model["max_position_embeddings"]
        per_layer = 4 * (d * d + d) + 2 * 2 * d + (d * ff + ff) + (ff * d + d)
        embeddings = (vocab + pos + 2) * d + 2 * d
        head = (d * d + d) + (d * model["num_labels"] + model["num_labels"])
        return layers * per_layer + embeddings + head
    elif model["family"] == "gpt2":
        # GPT-2: Conv1D c_attn (d x 3d), c_proj, c_fc (d x 4d), c_proj, all biased; two LayerNorms per layer and a
        # final one; learned positions of n_positions rows; LM head tied to the token embedding.
        per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d
        return layers * per_layer + 2 * d + vocab * d + model["max_position_embeddings"] * d
    elif model["family"] in ("llama", "qwen2"):
        mlp = 3 * d * ff                                       # gate, up, down
        biases = (d + 2 * kv_dim) if model["family"] == "qwen2" else 0   # Qwen2: q, k and v are biased
        norms = 2 * d                                          # two RMSNorms
        final_norm = d
    else:
        raise ValueError(f"unknown model family {model['family']!r}")
    per_layer = attention + mlp + biases + norms
    embeddings = vocab * d * (1 if model["tied_embeddings"] else 2)
    positions = seq_len * d if model["learned_positions"] else 0
    return layers * per_layer + final_norm + embeddings + positions


def largest_layer_params(model: dict[str, Any]) -> int:
    """DeepSpeed's 'largest layer': the most parameters one module owns directly.

    The token embedding (vocab x hidden) or the widest MLP projection, whichever is larger.
    """
    d, ff = model["hidden_size"], model["intermediate_size"]
    bias = ff if model["biases"] else 0
    return max(model["vocab_size"] * d, d * ff + bias)


def model_flops_per_token(params: int, model: dict[str, Any], seq_len: int) -> int:
    """Training FLOPs per token without recomputation: 6N plus the attention score and value
    matmuls, 12 * layers * hidden * seq_len (PaLM appendix B; llm-foundry's MFU)."""
    return 6 * params + 12 * model["layers"] * model["hidden_size"] * seq_len


def converted_tokens_per_second_per_gpu(entry: dict[str, Any]) -> float:
    """The measured figure of `entry`, converted to tokens/s per GPU by the rule its unit implies."""
    measured = entry["measured"]
    unit = measured["unit"]
    gpus = entry["gpus_per_node"] * entry["nodes"]
    if unit == "tokens/s/GPU":
        return float(measured["value"])
    if unit.startswith("samples/s, whole job"):  # also "(one GPU)": the job is the GPU
        return measured["value"] * entry["seq_len"] / gpus
    if unit == "ms/step":                        # the global batch's tokens per step, over the GPUs
        return entry["global_batch"] * entry["seq_len"] / (measured["value"] / 1000) / gpus
    raise ValueError(f"{entry['id']}: no conversion for unit {unit!r}")


def load(path: Path = DATA) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


# ============================================================================================
# predictions


@dataclass
class Row:
    id: str
    source: str
    split: str                      # fit | holdout: the source's half (data file, sources.*.split)
    backend: str
    rung: str
    method: str                     # full | lora | qlora
    precision: str
    gpu: str
    gpus: int
    model: str
    seq_len: int
    micro_batch: int
    checkpointing: str
    measured: float                 # tokens/s/GPU
    predicted: float                # tokens/s/GPU
    error_pct: float                # (predicted - measured) / measured * 100
    predicted_mfu: float
    measured_mfu: float             # measured tokens/s/GPU at the model's FLOPs over the GPU's peak as the wizard sees it
    bound: str
    step_seconds: float             # predicted
    measured_step_seconds: float    # global batch tokens / (GPUs x measured tokens/s/GPU)
    offload_seconds: float          # the predicted step's exposed offload traffic


@dataclass
class Unplanned:
    """An entry the wizard cannot plan today (no rung for it): listed, never counted in the errors."""

    id: str
    source: str
    split: str
    rung: str
    method: str
    reason: str


def model_type(model: dict[str, Any]) -> str:
    return model.get("model_type", model["family"])


def _shape(entry: dict[str, Any], model: dict[str, Any]):
    from wizard.sizing.model import ModelShape

    return ModelShape(
        params=param_count(model, entry["seq_len"]),
        largest_layer_params=largest_layer_params(model),
        hidden_size=model["hidden_size"], layers=model["layers"], heads=model["heads"],
        kv_heads=model["kv_heads"], vocab_size=model["vocab_size"],
        intermediate_size=model["intermediate_size"], model_type=model_type(model),
        tied_embeddings=model["tied_embeddings"], source=entry["model"],
        attention_dropout=model.get("attention_dropout", 0.0),
    )


def _options(entry: dict[str, Any]):
    from wizard.planning.plan import RUNG_SPECS, StrategyOptions, TrainingOptions

    # Selective (per-op) checkpointing keeps the matmul outputs: its recompute cost is near zero,
    # so it is closer to "off" than to the full recompute that "on" models.
    checkpointing = "on" if entry["gradient_checkpointing"] is True else "off"
    lora = entry.get("lora", {})
    training = TrainingOptions(seq_len=entry["seq_len"], micro_batch=entry["micro_batch"],
                               grad_accum=entry["grad_accum"], precision=entry["precision"],
                               gradient_checkpointing=checkpointing, attention=entry["attention"],
                               optimizer=entry.get("optimizer", "adamw"), method=entry.get("method", "full"),
                               lora_rank=lora.get("rank", 16), lora_alpha=lora.get("alpha"),
                               lora_targets=lora.get("targets"), lora_dropout=lora.get("dropout", 0.05),
                               reentrant_checkpoint_call=int(str(entry.get("transformers", "5")).split(".")[0]) < 5)
    spec = RUNG_SPECS[entry["rung"]]
    if spec.backend == "deepspeed":
        strategy = StrategyOptions(backend="deepspeed", zero_stage=str(spec.zero_stage), offload="auto", headroom=0.0)
    elif spec.backend == "single":
        strategy = StrategyOptions(backend="auto", headroom=0.0)
    else:
        # a published context-parallel run names its size: the plan's ladder for that size (a compact plan shows
        # only the smallest split that fits)
        strategy = StrategyOptions(backend=spec.backend, headroom=0.0, fsdp_version=entry.get("fsdp_version", 2),
                                   cp_size=spec.cp_size if spec.cp_size > 1 else None)
    return training, strategy, checkpointing


def adapters_for(entry: dict[str, Any], shape):
    """The entry's LoRA / QLoRA adapters, counted analytically on its Llama-like shape; None for full fine-tuning."""
    if entry.get("method", "full") == "full":
        return None
    from wizard.sizing import lora

    cfg = entry["lora"]
    options = lora.lora_options(entry["method"], cfg["rank"], cfg.get("alpha"), cfg.get("dropout", 0.05),
                                cfg.get("targets"), double_quant=cfg.get("double_quant", True),
                                quant_storage=cfg.get("quant_storage", "uint8"))
    adapters = lora.size_llama_adapters(shape, options)
    if entry["method"] == "qlora" and not cfg.get("kbit_prepared", True):
        import dataclasses
        adapters = dataclasses.replace(adapters, kbit_prepared=False)
    return adapters


def host_of(entry: dict[str, Any], hw):
    """The assumed machine with the host the entry describes (its optional "host": logical CPUs, physical cores,
    the OpenMP threads per process the launch gave, as OMP_NUM_THREADS in the machine's environment)."""
    import dataclasses
    host = entry.get("host")
    if not host:
        return hw
    env = dict(hw.env or {})
    if host.get("omp_threads"):
        env["OMP_NUM_THREADS"] = str(host["omp_threads"])
    return dataclasses.replace(hw, cpu_cores=host.get("cpus", hw.cpu_cores),
                               cpu_physical_cores=host.get("physical_cores", hw.cpu_physical_cores), env=env)


def plan_rung(entry: dict[str, Any], model: dict[str, Any]):
    """(the plan's rung for `entry`, None) or (None, why the wizard cannot plan it)."""
    from wizard.errors import InputError
    from wizard.planning.plan import Topology, make_plan, rung_by_key
    from wizard.probe.hardware import assume

    hw = host_of(entry, assume(f"{entry['gpus_per_node']}x{entry['gpu']},nodes={entry['nodes']}"))
    training, strategy, _ = _options(entry)
    topology = Topology(num_machines=entry["nodes"], processes_per_machine=entry["gpus_per_node"])
    shape = _shape(entry, model)
    try:
        plan = make_plan(hw, shape, training, strategy, topology, adapters=adapters_for(entry, shape))
    except InputError as exc:
        return None, str(exc)
    rung = rung_by_key(plan, entry["rung"])
    if rung is None:
        return None, f"the plan has no rung {entry['rung']!r} (rungs: {', '.join(r.key for r in plan.rungs)})"
    return rung, None


def split_of(entry: dict[str, Any], data: dict[str, Any]) -> str:
    return data["sources"][entry["source"]]["split"]


def predict(entry: dict[str, Any], model: dict[str, Any], split: str = "fit") -> Row | Unplanned:
    rung, why = plan_rung(entry, model)
    if rung is None:
        return Unplanned(entry["id"], entry["source"], split, entry["rung"], entry.get("method", "full"), why)
    speed = rung.speed
    measured = converted_tokens_per_second_per_gpu(entry)
    predicted = float(speed.tokens_per_second_per_gpu)
    gpus = entry["gpus_per_node"] * entry["nodes"]
    # The measured MFU under the wizard's own peak: same FLOPs definition as speed.mfu, so
    # predicted_mfu / measured_mfu == predicted / measured.
    measured_mfu = speed.mfu * measured / predicted if predicted else 0.0
    return Row(
        id=entry["id"], source=entry["source"], split=split, backend=entry["backend"], rung=entry["rung"],
        method=entry.get("method", "full"), precision=entry["precision"],
        gpu=entry["gpu"], gpus=gpus, model=entry["model"],
        seq_len=entry["seq_len"], micro_batch=entry["micro_batch"],
        checkpointing=str(entry["gradient_checkpointing"]).lower() if entry["gradient_checkpointing"] != "selective"
        else "selective",
        measured=measured, predicted=predicted, error_pct=(predicted - measured) / measured * 100,
        predicted_mfu=float(speed.mfu), measured_mfu=measured_mfu, bound=str(speed.bound),
        step_seconds=float(speed.step_seconds),
        measured_step_seconds=entry["global_batch"] * entry["seq_len"] / (gpus * measured),
        offload_seconds=float(getattr(speed, "offload_seconds", 0.0)),
    )


def predict_all(data: dict[str, Any]) -> tuple[list[Row], list[Unplanned]]:
    rows, unplanned = [], []
    for e in data["entries"]:
        r = predict(e, data["models"][e["model"]], split_of(e, data))
        (rows if isinstance(r, Row) else unplanned).append(r)
    return rows, unplanned


# ============================================================================================
# summary


def median_abs(rows: list[Row]) -> float:
    return statistics.median(abs(r.error_pct) for r in rows)


def median_signed(rows: list[Row]) -> float:
    return statistics.median(r.error_pct for r in rows)


def groups(rows: list[Row], key) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


def regime(r: Row) -> str:
    if "offload" in r.rung:
        return "CPU optimizer offload"
    if r.seq_len >= 16384:
        return "long sequence (>= 16k)"
    if r.gpus > 8:
        return "multi-node"
    return "one node, no offload, seq < 16k"


GROUPINGS = (
    ("split", lambda r: r.split),
    ("source", lambda r: r.source),
    ("method", lambda r: r.method),
    ("precision", lambda r: r.precision),
    ("backend / rung", lambda r: f"{r.backend} / {r.rung}"),
    ("GPU", lambda r: r.gpu),
    ("gradient checkpointing", lambda r: r.checkpointing),
    ("regime", regime),
)


def half(rows: list[Row], split: str) -> dict[str, Any]:
    part = [r for r in rows if r.split == split]
    if not part:
        return {"entries": 0, "sources": 0}
    return {"entries": len(part), "sources": len({r.source for r in part}),
            "median_abs_error_pct": round(median_abs(part), 1),
            "median_signed_error_pct": round(median_signed(part), 1),
            "within_25_pct": sum(abs(r.error_pct) <= 25 for r in part)}


def summary(rows: list[Row]) -> dict[str, Any]:
    by = {}
    for name, key in GROUPINGS:
        by[name] = {k: {"n": len(v), "median_abs_error_pct": round(median_abs(v), 1),
                        "median_signed_error_pct": round(median_signed(v), 1)}
                    for k, v in groups(rows, key).items()}
    return {"entries": len(rows), "sources": len({r.source for r in rows}),
            "median_abs_error_pct": round(median_abs(rows), 1),
            "median_signed_error_pct": round(median_signed(rows), 1),
            "within_25_pct": sum(abs(r.error_pct) <= 25 for r in rows),
            "within_50_pct": sum(abs(r.error_pct) <= 50 for r in rows),
            "fit": half(rows, "fit"), "holdout": half(rows, "holdout"),
            "by": by}


def weakest(rows: list[Row], summ: dict[str, Any]) -> list[str]:
    """Sentences on where the model is weakest, derived from the numbers (not written by hand)."""
    lines = []
    overall = summ["median_abs_error_pct"]
    worst_groups = []
    for name, _ in GROUPINGS:
        for k, g in summ["by"][name].items():
            if g["n"] >= 2 and g["median_abs_error_pct"] > overall:
                worst_groups.append((g["median_abs_error_pct"], name, k, g))
    worst_groups.sort(reverse=True)
    for err, name, k, g in worst_groups[:6]:
        direction = "over-predicts" if g["median_signed_error_pct"] > 0 else "under-predicts"
        lines.append(f"- {name} = **{k}** ({g['n']} entries): median |error| {err:.0f}% against {overall:.0f}% overall; "
                     f"the model {direction} (median signed error {g['median_signed_error_pct']:+.0f}%).")
    worst = sorted(rows, key=lambda r: -abs(r.error_pct))[:3]
    lines.append("- The three largest single errors:")
    for r in worst:
        lines.append(f"  - `{r.id}` ({r.error_pct:+.0f}%): predicted step {r.step_seconds:.1f} s, {r.bound}-bound, "
                     f"of which {r.offload_seconds:.2f} s exposed offload traffic; measured step "
                     f"{r.measured_step_seconds:.1f} s.")
    by_backend = groups(rows, lambda r: r.backend)
    signs = ", ".join(f"{b} {median_signed(v):+.0f}% (n={len(v)})" for b, v in by_backend.items())
    lines.append(f"- Median signed error by backend: {signs}.")
    for b, v in by_backend.items():
        sources = {r.source for r in v}
        if len(sources) == 1:
            lines.append(f"- Every {b} entry comes from one source ({sources.pop()}): for {b}, the backend's error "
                         "and that source's setup cannot be told apart.")
    over = sum(r.error_pct > 0 for r in rows)
    lines.append(f"- Direction: {over} of {len(rows)} predictions are above the measurement, {len(rows) - over} below.")
    return lines


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def render_markdown(data: dict[str, Any], rows: list[Row], summ: dict[str, Any],
                    unplanned: list[Unplanned] = ()) -> str:
    src = data["sources"]
    fit, hold = summ["fit"], summ["holdout"]
    out = ["# Speed model against published measurements", "",
           "Generated by `python bench/bench_speed_model.py` from `bench/data/published_speed.json`; do not edit by hand.",
           "Each row is one published configuration: the wizard plans the same model shape, GPUs, nodes, sequence length, "
           "micro-batch, checkpointing and backend, and the predicted tokens/s per GPU of the matching rung is compared "
           "with the measured figure. Error = (predicted - measured) / measured.", "",
           f"**{summ['entries']} configurations from {summ['sources']} sources. Median absolute error: "
           f"{summ['median_abs_error_pct']:.1f}%** (median signed error {summ['median_signed_error_pct']:+.1f}%; "
           f"{summ['within_25_pct']} within 25%, {summ['within_50_pct']} within 50%).", "",
           "The sources are split in two halves, once, in the data file (`sources.*.split`); constants may be chosen "
           "on the fit half only, the held-out half only measures them. " + data.get("split_rule", ""), "",
           "| half | configurations | sources | median abs error % | median signed error % | within 25% |",
           "| --- | ---: | ---: | ---: | ---: | ---: |",
           f"| fit | {fit['entries']} | {fit['sources']} | {fit.get('median_abs_error_pct', 0):.1f} | "
           f"{fit.get('median_signed_error_pct', 0):+.1f} | {fit.get('within_25_pct', 0)} |",
           f"| **held-out** | {hold['entries']} | {hold['sources']} | **{hold.get('median_abs_error_pct', 0):.1f}** | "
           f"{hold.get('median_signed_error_pct', 0):+.1f} | {hold.get('within_25_pct', 0)} |", "",
           "| entry | half | source | GPUs | method | prec | seq | mb | ckpt | rung | measured tok/s/GPU | predicted | error % | measured MFU | predicted MFU | bound |",
           "| --- | --- | --- | ---: | --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r.id} | {r.split} | {r.source} | {r.gpus}x{r.gpu} | {r.method} | {r.precision} | {r.seq_len} | "
                   f"{r.micro_batch} | {r.checkpointing} | "
                   f"{r.rung} | {fmt_int(r.measured)} | {fmt_int(r.predicted)} | {r.error_pct:+.1f} | "
                   f"{r.measured_mfu:.1%} | {r.predicted_mfu:.1%} | {r.bound} |")
    if unplanned:
        out += ["", f"**{len(unplanned)} entries the wizard cannot plan today** (kept in the data, not in any error "
                "figure):", ""]
        out += [f"- `{u.id}` ({u.split}, {u.method}, rung {u.rung}): {u.reason}" for u in unplanned]
    out += ["", "## Error by group", ""]
    for name, _ in GROUPINGS:
        out += [f"**{name}**", "", "| group | n | median abs error % | median signed error % |", "| --- | ---: | ---: | ---: |"]
        for k, g in summ["by"][name].items():
            out.append(f"| {k} | {g['n']} | {g['median_abs_error_pct']:.1f} | {g['median_signed_error_pct']:+.1f} |")
        out.append("")
    out += ["## Where the model is weakest", ""] + weakest(rows, summ) + [""]
    out += ["## Sources", ""]
    for key, s in src.items():
        out.append(f"- **{key}** ({s.get('split', '?')}): {s['title']}. {s['url']}. {s['setup']}")
        if "unit_note" in s:
            out.append(f"  Unit: {s['unit_note']}")
    out += ["", "Caveats: measured MFU uses the wizard's own FLOPs definition and peak, so it can differ from the "
            "MFU a source publishes (llm-foundry's H100 peak is 989.5 TFLOPs). The torchtitan H100s are 96 GB parts at "
            "500 W; the gist's throughput unit is inferred (see above). Selective checkpointing is predicted as off. "
            "torchtune's RTX 4090 rows ran with torch.compile, which the wizard does not model, and its LoRA figure "
            "(3083 tok/s with recomputation) would be 93 % of the card's 165 TFLOPs bf16 peak: those rows were not "
            "fitted (speed.py says why). hf-perf-train-gpu-one measures the same things issue 19's held-out set "
            "describes (a 12.5 % micro-batch 1 penalty, fp16 2.1x fp32 on a V100): it may overlap that set, and it is "
            "the only fp32 evidence, so it sits in the fit half. CPU optimizer offload (issue 28): the host step is "
            "modelled on memory bandwidth (42 B per parameter, 6.7 GB/s per OpenMP thread, 0.18 of the host class's "
            "peak DRAM bandwidth), chosen on the H200 session (bench/results/gpu-2026-12-04.md) and DeepSpeed's ZenFlow "
            "write-up; DeepSpeed's core-binding blog is held out. The gist's three offload rows, which the old CPU "
            "Adam rate (2.8e6 parameters/s per core) was fitted on, take 18-22 s per step more than their GPU work: "
            "no bandwidth explains it (one thread per process would take 5 s), so they are now about 2x too fast; "
            "the gist states neither its launcher nor its thread count.", ""]
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
    (args.out_dir / "speed-model.md").write_text(render_markdown(data, rows, summ, unplanned))
    (args.out_dir / "speed-model.json").write_text(
        json.dumps({"summary": summ, "rows": [asdict(r) for r in rows],
                    "unplanned": [asdict(u) for u in unplanned]}, indent=1) + "\n")
    print(f"{summ['entries']} configurations, {summ['sources']} sources: median |error| "
          f"{summ['median_abs_error_pct']:.1f}%, signed {summ['median_signed_error_pct']:+.1f}%; "
          f"fit {summ['fit'].get('median_abs_error_pct')}% (n={summ['fit']['entries']}), "
          f"held-out {summ['holdout'].get('median_abs_error_pct')}% (n={summ['holdout']['entries']}); "
          f"{len(unplanned)} not plannable")
    for name, _ in GROUPINGS[:4]:
        for k, g in summ["by"][name].items():
            print(f"  {name} {k}: n={g['n']} median |error| {g['median_abs_error_pct']:.1f}%")
    print(f"wrote {args.out_dir / 'speed-model.md'} and speed-model.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
