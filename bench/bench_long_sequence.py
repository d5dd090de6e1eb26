"""Check the long-sequence model (Ulysses rungs, the fused loss, ALST's code options) against published runs.

Reads bench/data/published_long_sequence.json (the ALST paper's tables, the Hugging Face blog's Qwen3-4B runs; every
row quoted) and plans each configuration with exactly its rung and options (wizard.planning.plan.rung_at: its ZeRO
stage and offload, its Ulysses size, its loss, its code options, gradient checkpointing), then compares:

- 'max_seq': the published longest sequence (a lower bound of the configuration's limit) against the longest the
  model says fits at micro-batch 1, at the plan's default headroom (10 %: what `wizard plan` says) and at none
  (the model's own limit: the like-with-like figure; the error is computed on it);
- 'step_time' / 'tokens_per_second': the iteration time (tokens per second) at the row's length;
- 'peak': peak GPU memory per rank (the blog does not say which measure) against the whole per-GPU estimate.

Writes bench/results/long-sequence.md and .json: every row, each half's median absolute error (fit: the ALST
ablation on one node; held out: the rest), and the issue's targets with the honest figure for each.

Usage: python bench/bench_long_sequence.py [--out-dir DIR]. Fast (no torch): the planner is pure Python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wizard.planning.plan import (  # noqa: E402
    CodeOptions, make_plan, rung_at, StrategyOptions, Topology, TrainingOptions,
)
from wizard.probe import hardware  # noqa: E402
from wizard.sizing.model import ModelShape  # noqa: E402

DATA = ROOT / "bench" / "data" / "published_long_sequence.json"
OUT_DIR = ROOT / "bench" / "results"


def model_shape(spec: dict) -> ModelShape:
    fields = {k: v for k, v in spec.items() if k in ModelShape.__dataclass_fields__}
    return ModelShape(**fields)


def rung_key(row: dict) -> str:
    base = "zero3" if row["zero_stage"] == 3 else "zero2"
    if row.get("offload_param"):
        key = "zero3-offload-all"
    elif row["offload"] == "cpu":
        key = f"{base}-offload-opt"
    else:
        key = base
    return key + (f"-sp{row['sp_size']}" if row["sp_size"] > 1 else "")


@dataclass
class Result:
    row: dict
    predicted: float
    predicted_default: float | None      # max_seq: at the plan's default headroom
    error_pct: float
    detail: str


def evaluate(row: dict, models: dict) -> Result:
    model = model_shape(models[row["model"]])
    hw = hardware.assume(row["assume"])
    per_machine = hw.num_gpus
    topology = Topology(row["machines"], per_machine)
    code = CodeOptions(checkpoint_offload=row["checkpoint_offload"], tiled_mlp=row["tiled_mlp"])
    training = TrainingOptions(seq_len=row["seq_len"], loss=row["loss"], gradient_checkpointing="on",
                               grad_accum=row.get("grad_accum", 1), allow_code_changes=code.any,
                               attention="flash")
    key = rung_key(row)

    def at(headroom: float):
        return rung_at(hw, model, training, StrategyOptions(headroom=headroom), topology, key, code)

    kind = row["kind"]
    if kind == "max_seq":
        raw, default = at(0.0).longest, at(0.10).longest
        return Result(row, raw, default, (raw - row["value"]) / row["value"] * 100,
                      f"{key}{' +ckpt' if code.checkpoint_offload else ''}{' +tiled' if code.tiled_mlp else ''}")
    r = at(0.10)
    if kind == "step_time":
        predicted = r.speed.step_seconds
    elif kind == "tokens_per_second":
        predicted = r.speed.tokens_per_second
    else:                                            # peak memory per rank, GB
        predicted = r.per_gpu_bytes / 1e9
    return Result(row, predicted, None, (predicted - row["value"]) / row["value"] * 100, key)


def targets() -> list[tuple[str, int, int, str]]:
    """The issue's done-when figures, from the plan as `wizard plan` makes it (default headroom, assumed RAM)."""
    models = json.loads(DATA.read_text())["models"]
    llama = model_shape(models["llama-3.1-8b"])
    out = []
    for label, assume, machines, code, need in (
            ("8xH100-80GB, --seq-len 1048576: fits on a Ulysses rung with the fused loss", "8xH100-80GB", 1, False,
             1_048_576),
            ("8xH100-80GB with code changes: the machine's longest", "8xH100-80GB", 1, True, 3_000_000),
            ("8xH100-80GB,nodes=4 with code changes: the machine's longest", "8xH100-80GB,nodes=4", 4, True,
             10_000_000)):
        hw = hardware.assume(assume)
        p = make_plan(hw, llama, TrainingOptions(seq_len=1_048_576 if not code else 2048,
                                                 allow_code_changes=code), StrategyOptions(),
                      Topology(machines, hw.num_gpus))
        got = p.longest.seq_len if p.longest else 0
        how = f"{p.longest.name}, {p.longest.how}" if p.longest else "none"
        out.append((label, need, got, how))
    return out


def report(results: list[Result], data: dict) -> tuple[str, dict]:
    halves = {}
    for half in ("fit", "holdout"):
        errs = [abs(r.error_pct) for r in results if data["sources"][r.row["source"]]["split"] == half]
        halves[half] = {"rows": len(errs), "median_abs_error_pct": round(statistics.median(errs), 1) if errs else None}
    by_kind = {}
    for kind in sorted({r.row["kind"] for r in results}):
        errs = [abs(r.error_pct) for r in results if r.row["kind"] == kind]
        by_kind[kind] = round(statistics.median(errs), 1)
    lines = ["# Long sequences against published runs", "",
             "Generated by `python bench/bench_long_sequence.py` from `bench/data/published_long_sequence.json`; do "
             "not edit by hand. Each row plans the published configuration with exactly its rung and options "
             "(`wizard.planning.plan.rung_at`). `max_seq` rows: the published length is the longest the authors "
             "trained (a lower bound of the true limit); 'predicted' is the model's own limit (no headroom), "
             "'plan' what `wizard plan` says with its default 10 % headroom. No constant of the long-sequence model "
             "was fitted: its terms are measured on the CPU (bench/measure_sequence_memory.py) or read from "
             "DeepSpeed's and Liger's code, so the two halves only measure it.", "",
             "| half | rows | median abs error % |", "| --- | ---: | ---: |"]
    for half, h in halves.items():
        lines.append(f"| {half} | {h['rows']} | {h['median_abs_error_pct']} |")
    lines += ["", "| kind | median abs error % |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in by_kind.items()]
    lines += ["", "| row | half | kind | configuration | published | predicted | plan (10 % headroom) | error % |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in results:
        half = data["sources"][r.row["source"]]["split"]
        fmt = (lambda v: f"{v:,.0f}") if r.row["kind"] in ("max_seq", "tokens_per_second", "step_time") else \
            (lambda v: f"{v:.1f}")
        default = "" if r.predicted_default is None else fmt(r.predicted_default)
        lines.append(f"| {r.row['id']} | {half} | {r.row['kind']} | {r.detail} | {fmt(r.row['value'])} | "
                     f"{fmt(r.predicted)} | {default} | {r.error_pct:+.1f} |")
    lines += ["", "## The issue's targets (Llama-3-8B, as `wizard plan` plans it: default headroom, assumed RAM)", "",
              "| target | needs | the plan says | on |", "| --- | ---: | ---: | --- |"]
    target_rows = targets()
    for label, need, got, how in target_rows:
        lines.append(f"| {label} | {need:,} | {got:,} | {how} |")
    doc = {"halves": halves, "by_kind": by_kind, "targets": [dict(zip(("target", "needs", "plan", "on"), t))
                                                           for t in target_rows],
           "rows": [{"id": r.row["id"], "kind": r.row["kind"], "published": r.row["value"], "predicted": r.predicted,
                     "plan_default_headroom": r.predicted_default, "error_pct": round(r.error_pct, 1)}
                    for r in results]}
    return "\n".join(lines) + "\n", doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(OUT_DIR))
    args = parser.parse_args(argv)
    data = json.loads(DATA.read_text())
    results = [evaluate(row, data["models"]) for row in data["entries"]]
    text, doc = report(results, data)
    out = Path(args.out_dir)
    (out / "long-sequence.md").write_text(text)
    (out / "long-sequence.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
