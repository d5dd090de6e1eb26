"""The published peak-memory measurements (bench/data/published_memory.json) and the memory model against them.

Data integrity: every entry complete, cited, its figure in its quote, its bytes the figure in its unit, its kind
one of allocated / reserved / whole-process, its source in one half (the same half as in the speed data).
Then the plan against the data: the held-out half stays within the bounds below, LoRA runs published on 24-40 GB
cards are planned as fitting there, and what LoRA's adapters and frozen base save for backward is what PyTorch
and peft really save (measured on CPU with saved_tensors_hooks).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
from pathlib import Path

import pytest

from wizard.planning.plan import RUNG_SPECS
from wizard.probe.catalogue import by_name
from wizard.probe.catalogue import names as gpu_names
from wizard.sizing import memory as mem

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


bench = _load("bench_memory_model")
DATA = bench.load()
SPEED_SOURCES = bench.speed_bench.load()["sources"]

UNITS = {"MiB": 2**20, "bytes": 1, "GB (10^9)": 1e9, "GB (10^9 assumed)": 1e9, "GB (2^30 assumed)": 2**30}

# Achieved (bench/results/memory-model.md): held-out 28 of 29 rows within +-15 % (97 %; issue 19 asks 85 %),
# worst reserved / whole-process under-prediction -8.3 % held out, -8.7 % fit (the target: no worse than -10 %);
# fit median 5.5 %.
HELDOUT_WITHIN_15_SHARE = 0.85     # issue 19's target
GUARDED_UNDER_LIMIT_PCT = -10.0
FIT_MEDIAN_BOUND_PCT = 8.0


def entry_problems(entry: dict, data: dict) -> list[str]:
    problems = []
    for field in ("id", "source", "where", "quote", "model", "gpu", "rung", "precision", "measured", "bytes"):
        if field not in entry:
            problems.append(f"missing {field}")
    if problems:
        return problems
    if entry["source"] not in data["sources"]:
        problems.append(f"unknown source {entry['source']}")
    if entry["model"] not in data["models"]:
        problems.append(f"unknown model {entry['model']}")
    if entry["gpu"] not in gpu_names():
        problems.append(f"gpu {entry['gpu']} not in the catalogue")
    if entry["rung"] not in RUNG_SPECS:
        problems.append(f"unknown rung {entry['rung']}")
    measured = entry["measured"]
    if measured.get("kind") not in bench.KINDS:
        problems.append(f"kind {measured.get('kind')!r}")
    if measured.get("unit") not in UNITS:
        problems.append(f"unit {measured.get('unit')!r}")
    else:
        value = measured["value"]
        texts = {str(value), f"{value:g}"} | ({str(int(value))} if float(value).is_integer() else set())
        if not any(t in entry["quote"] for t in texts):
            problems.append(f"measured value {value} is not in the quote")
        if not math.isclose(entry["bytes"], value * UNITS[measured["unit"]], rel_tol=1e-9, abs_tol=1):
            problems.append(f"bytes {entry['bytes']} != {value} {measured['unit']}")
    if entry.get("method", "full") != "full" and not isinstance(entry.get("lora", {}).get("rank"), int):
        problems.append("an adapter entry needs lora.rank")
    return problems


def test_enough_rows_sources_and_kinds():
    entries = DATA["entries"]
    assert len(entries) >= 25
    assert len({e["source"] for e in entries}) >= 5
    assert len({e["id"] for e in entries}) == len(entries)
    assert {e["measured"]["kind"] for e in entries} >= {"allocated", "whole-process"}
    assert {e.get("method", "full") for e in entries} == {"full", "lora", "qlora"}


def test_sources_are_cited_and_split_like_the_speed_data():
    for key, source in DATA["sources"].items():
        assert source["url"].startswith("https://") and source["title"] and source["setup"], key
        if "repo" in source:
            assert len(source["commit"]) == 40 and source["commit"] in source["url"], key
        assert source["split"] in ("fit", "holdout"), key
        if key in SPEED_SOURCES:
            assert SPEED_SOURCES[key]["split"] == source["split"], key
    halves = {s["split"] for s in DATA["sources"].values()}
    assert halves == {"fit", "holdout"}


@pytest.mark.parametrize("entry", DATA["entries"], ids=lambda e: e["id"])
def test_entry_is_complete_and_consistent(entry):
    assert entry_problems(entry, DATA) == []


@pytest.mark.parametrize("mutate", [
    lambda e: e.update(quote="| something else |"),
    lambda e: e.update(bytes=e["bytes"] + 10**6),
    lambda e: e["measured"].update(kind="peak"),
    lambda e: e["measured"].update(unit="GB"),
    lambda e: e.update(gpu="A100-90GB"),
], ids=["quote", "bytes", "kind", "unit", "gpu"])
def test_malformed_entry_fails(mutate):
    entry = copy.deepcopy(DATA["entries"][0])
    mutate(entry)
    assert entry_problems(entry, DATA)


@pytest.fixture(scope="module")
def predicted():
    return bench.predict_all(DATA)


def test_held_out_memory_error_is_bounded(predicted):
    rows, unplanned = predicted
    held_out = [r for r in rows if r.split == "holdout"]
    fit = [r for r in rows if r.split == "fit"]
    assert len(held_out) >= 15 and len(fit) >= 20
    assert bench.within(held_out) / len(held_out) >= HELDOUT_WITHIN_15_SHARE
    worst = bench.worst_under(fit)
    assert worst.error_pct >= GUARDED_UNDER_LIMIT_PCT, (worst.id, worst.error_pct)
    assert bench.half(fit, None)["median_abs_error_pct"] <= FIT_MEDIAN_BOUND_PCT
    assert all(u.method != "full" and u.rung.startswith("fsdp") for u in unplanned), unplanned


def test_no_held_out_reserved_or_whole_process_figure_is_under_predicted_beyond_10_percent(predicted):
    rows, _ = predicted
    worst = bench.worst_under([r for r in rows if r.split == "holdout"])
    assert worst.error_pct >= GUARDED_UNDER_LIMIT_PCT, (worst.id, worst.error_pct)


def test_lora_runs_published_on_24_to_40_gb_cards_fit_there(predicted):
    """litgpt's LoRA runs on one A10G (24 GB) and one A100 40GB: each estimate, CUDA context and allocator
    margin included, fits the card. Before the frozen base was counted, Mistral-7B on the A10G and Llama-2-13B
    on the A100 40GB were planned as not fitting."""
    rows, _ = predicted
    lora = [r for r in rows if r.method == "lora" and r.gpus == 1 and by_name(r.gpu).memory <= 48 * 2**30]
    assert len(lora) >= 5
    assert all(r.fits for r in lora), [r.id for r in lora if not r.fits]
    assert all(abs(r.error_pct) <= 5 for r in lora if r.source.startswith("litgpt")), \
        [(r.id, round(r.error_pct, 1)) for r in lora]


def test_whole_process_figures_count_the_measured_cuda_context():
    # hf-perf-train-gpu-one: "GPU memory occupied: 1343 MB" after torch.ones((1, 1)).to("cuda")
    assert mem.CUDA_CONTEXT_BYTES == 1343 * 2**20


# --- what LoRA saves for backward, measured -----------------------------------------------------------------

def test_frozen_base_saves_less_exactly_as_measured():
    """MEASURED with bench/measure_activations.py on a transformers Llama (h=256, f=704, bf16, CPU): a layer
    saves 11800 B/token trained and 8344 frozen (SDPA), 17928 and 13960 with eager attention."""
    assert mem.frozen_base_unsaved_bytes_per_token(256, 704, True, "bf16", mem.GATED_PROFILE) == 11800 - 8344
    assert mem.frozen_base_unsaved_bytes_per_token(256, 704, False, "bf16", mem.GATED_PROFILE) == 17928 - 13960


def test_lora_layer_saves_what_the_plan_counts():
    """A real peft LoRA (q_proj, v_proj, r=8, dropout 0.05) on a tiny transformers Llama, measured with
    saved_tensors_hooks: the second layer saves the frozen layer's tensors plus, per adapter, an fp32 dropped
    copy of its input, the dropout mask and lora_A's fp32 output. The CPU keeps the mask in the adapter's
    dtype (4 B) where CUDA's fused dropout keeps 1 B: the only difference from the plan's GPU count."""
    pytest.importorskip("peft")
    measure = _load("measure_activations")
    from peft import LoraConfig, get_peft_model

    shape = measure.Shape(hidden=256, heads=4, layers=2, seq=128, batch=2, dtype="bf16", attn="sdpa")
    model = measure.build_model(shape)
    for p in model.parameters():
        p.requires_grad_(False)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]))
    model.train()
    saved = measure.measure_model(model, shape).saved_layers()[1] / (shape.seq * shape.batch)
    full = mem.activation_bytes_per_layer(1, 1, 256, 4, shape.ffn, True, "bf16", mem.GATED_PROFILE)
    frozen = full - mem.frozen_base_unsaved_bytes_per_token(256, shape.ffn, True, "bf16", mem.GATED_PROFILE)
    cpu_mask, adapter_dtype = 4, 4
    adapters = 2 * ((adapter_dtype + cpu_mask) * 256 + adapter_dtype * 8)
    # The per-token fp32 statistics (norms' rstd, flash's logsumexp: 24 B here) are left out of the plan (< 1 %).
    assert saved - 24 == frozen + adapters


def test_attention_dropout_is_counted_with_eager_attention():
    """BERT trains with dropout 0.1 on the attention probabilities: eager attention then keeps the mask and
    the dropped copy of every score. hf-perf-train-gpu-one's bert-large at micro-batch 4 (fit half) was 17 %
    under-predicted whole-process before the plan passed the config's dropout on."""
    from dataclasses import replace

    from wizard.planning.plan import activation_estimate

    entry = next(e for e in bench.speed_bench.load()["entries"] if e["id"] == "hfdoc-bert-large-fp32-mb4-1xV100-16GB")
    shape = bench.speed_bench._shape(entry, DATA["models"]["bert-large"])
    assert shape.attention_dropout == 0.1
    with_dropout = activation_estimate(shape, 512, 4, "fp32", attention="eager")
    without = activation_estimate(replace(shape, attention_dropout=0.0), 512, 4, "fp32", attention="eager")
    scores = 16 * 512 * 512 * 4 * 24
    assert with_dropout - without == scores * (1 + 4)          # mask (1 B) + dropped fp32 copy (4 B) per score
    assert activation_estimate(shape, 512, 4, "bf16", attention="sdpa") == \
        activation_estimate(replace(shape, attention_dropout=0.0), 512, 4, "bf16", attention="sdpa")
