"""bench/gpu (measure.py and the modules it imports) on the CPU: the pure parts (case selection,
verdict arithmetic, probe and metrics comparison, the report) and the --dry-run-cpu mode end to end.
No GPU here: the GPU figures come only from a run on a GPU machine (bench/gpu/README.md)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from bench.gpu.cases import (
    CaseSpec,
    Planner,
    Prediction,
    given_for,
    pick_predicted_oom,
    pick_smallest_headroom,
    rung_key,
    select_cases,
    spec_from_json,
    write_models,
)
from bench.gpu.launch_check import align, load_metrics_jsonl, metric_diffs, metrics_verdict
from bench.gpu.memory_check import case_record, decide, error_pct, train_command
from bench.gpu.probe_compare import compare_probe, load_hardware
from bench.gpu.report import CASE_COLUMNS, render_markdown, summarize
from bench.gpu.smi import (
    SMI_OPTIONAL_SAMPLE_FIELDS,
    SMI_SAMPLE_FIELDS,
    SMI_STATIC_FIELDS,
    parse_smi_csv,
    parse_smi_samples,
)

pytestmark = pytest.mark.bench    # the GPU bench's own harness: CI runs it with the newest libraries only (.ci/run)

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "bench" / "gpu"
GiB = 1024 ** 3
MiB = 1024 ** 2


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


train_one = _load("gpu_bench_train_one", GPU_DIR / "train_one.py")


def pred(per_gpu_gib: float, fits: bool, usable_gib: float = 100.0, capacity_gib: float = 110.0,
         offload: bool = False):
    return Prediction(rung="single", fits=fits, per_gpu_bytes=int(per_gpu_gib * GiB),
                      usable_bytes=int(usable_gib * GiB), capacity_bytes=int(capacity_gib * GiB),
                      gc=False, offload=offload)


def spec(model="m", backend="single", seq=512, mb=1, gc=False):
    return CaseSpec(model, backend, seq, mb, gc)


# ----------------------------------------------------------------------------- arithmetic

def test_error_pct_is_relative_to_the_measurement():
    assert error_pct(110, 100) == pytest.approx(10.0)
    assert error_pct(90, 100) == pytest.approx(-10.0)
    assert error_pct(100, None) is None
    assert error_pct(None, 100) is None
    assert error_pct(100, 0) is None


@pytest.mark.parametrize("fits,status,measured,expected", [
    (True, "ok", 80, "right"),            # fits and ran
    (True, "ok", 105, "right"),           # ran, headroom eaten (noted)
    (True, "oom", None, "wrong"),         # said fits, ran out of memory
    (False, "oom", 90, "right"),          # said no, ran out of memory
    (False, "ok", 105, "right"),          # said no, ran above the usable memory
    (False, "ok", 95, "wrong"),           # said no, ran within the usable memory: too cautious
    (False, "ok", None, "unknown"),
    (True, "timeout", None, "unknown"),
    (True, "skipped", None, "unknown"),
    (False, "crash", None, "unknown"),
])
def test_fit_decision(fits, status, measured, expected):
    verdict, why = decide(fits, status, measured, usable=100)
    assert verdict == expected, why
    if fits and status == "ok" and measured and measured > 100:
        assert "headroom" in why
    if expected == "wrong" and status == "ok":
        assert "cautious" in why


def test_summary_counts_decisions_and_the_10_percent_target():
    cases = [
        {"status": "ok", "decision": "right", "predicted_fits": True, "error_pct": 4.0, "measured_bytes": 1},
        {"status": "ok", "decision": "right", "predicted_fits": True, "error_pct": -12.5, "measured_bytes": 1},
        {"status": "oom", "decision": "wrong", "predicted_fits": True, "error_pct": None},
        {"status": "oom", "decision": "right", "predicted_fits": False, "error_pct": None},
        {"status": "skipped", "decision": "unknown", "predicted_fits": True, "error_pct": None},
        {"status": "ok", "decision": "unknown", "predicted_fits": True, "error_pct": None,
         "measured_bytes": None},                                   # a dry run's tiny CPU training
    ]
    s = summarize(cases)
    assert (s["cases"], s["measured"], s["decisions_right"], s["decisions_wrong"]) == (6, 4, 3, 1)
    assert (s["fitting_with_error"], s["within_target"], s["max_abs_error_pct"]) == (2, 1, 12.5)


# ----------------------------------------------------------------------------- selection (pure)

def test_smallest_headroom_is_the_largest_fitting_ratio_without_offload():
    candidates = [
        (spec(seq=512), pred(80, True)),
        (spec(seq=1024), pred(97, True)),
        (spec(seq=2048), pred(99, True, offload=True)),     # offload rungs are not measured
        (spec(seq=4096), pred(101, False)),                 # does not fit
        (spec(seq=1024, mb=2), pred(92, True)),
    ]
    chosen, p = pick_smallest_headroom(candidates)
    assert (chosen.seq_len, chosen.micro_batch) == (1024, 1)
    assert p.per_gpu_bytes == int(97 * GiB)
    assert pick_smallest_headroom([(spec(), pred(50, False))]) is None


def test_predicted_oom_is_the_smallest_prediction_over_the_factor():
    candidates = [
        (spec(seq=512), pred(112, False)),        # over usable, under 1.05 x capacity (115.5)
        (spec(seq=1024), pred(140, False)),
        (spec(seq=2048), pred(120, False)),       # the one
        (spec(seq=4096), pred(200, False)),
        (spec(seq=4096, mb=2), pred(130, True)),  # "fits" is never an OOM case
    ]
    chosen, p = pick_predicted_oom(candidates, 1.05)
    assert chosen.seq_len == 2048 and not p.fits
    assert pick_predicted_oom(candidates[:1], 1.05) is None


def test_select_cases_orders_selected_first_and_merges_duplicates():
    cfg = {"grid": {"seq_lens": [512, 1024], "micro_batches": [1, 2, 3], "backends": ["single"]},
           "oom_min_over_capacity": 1.05,
           "coverage": [{"model": "a", "backend": "single", "seq_len": 512, "micro_batch": 1, "gc": False},
                        {"model": "a", "backend": "single", "seq_len": 1024, "micro_batch": 2, "gc": False}],
           "launch": {"model": "a", "backend": "single", "seq_len": 1024, "micro_batch": 2, "gc": False}}

    def fake_predict(s):
        # a synthetic planner: memory grows with tokens; GC halves it
        gib = s.seq_len * s.micro_batch / 10 / (2 if s.gc else 1)
        return pred(gib, gib <= 100)

    def fake_recommend(model, seq, mb):
        s = spec(model, "single", seq, mb, False)
        p = fake_predict(s)
        return (s, p) if p.fits else None

    sel = select_cases(cfg, ["a"], fake_predict, fake_recommend)
    roles = [c.role for c in sel.cases]
    assert roles[:2] == ["smallest-headroom", "predicted-oom"]
    # smallest headroom: 512 x 1 = 51.2 GiB is the largest that fits (1024 x 1 = 102.4 does not)
    assert sel.cases[0].key() == ("a", "single", 512, 1, False, "full")
    # the coverage case equal to it was merged, the launch case comes right after the selected ones
    assert [c.key() for c in sel.cases[2:]] == [("a", "single", 1024, 2, False, "full")]
    assert any("also the smallest-headroom" in n for n in sel.notes)
    # predicted OOM: the smallest prediction >= 1.05 x 110 GiB is 512 x 3 without GC (153.6 GiB)
    assert sel.cases[1].key() == ("a", "single", 512, 3, False, "full")


# ----------------------------------------------------------------------------- selection (real planner)

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    shapes = json.loads((GPU_DIR / "models.json").read_text())
    return write_models(shapes, tmp_path_factory.mktemp("shapes"))


@pytest.fixture(scope="module")
def cases_cfg():
    return json.loads((GPU_DIR / "cases.json").read_text())


@pytest.mark.parametrize("assume", ["1xH200,ram=128G,cpus=16", "1xH100-80GB,ram=128G,cpus=16"])
def test_selection_from_the_planner_adapts_to_the_gpu(assume, model_dirs, cases_cfg):
    from wizard.probe import hardware
    planner = Planner(hardware.assume(assume), model_dirs)
    sel = select_cases(cases_cfg, list(model_dirs), planner.predict, planner.recommend)
    assert len(sel.cases) >= 6
    assert len({c.key() for c in sel.cases}) == len(sel.cases)
    roles = [c.role for c in sel.cases]
    assert roles.count("smallest-headroom") == 1 and roles.count("predicted-oom") == 1
    assert {c.backend for c in sel.cases} >= {"single", "zero2", "zero3"}
    assert {c.gc for c in sel.cases} == {True, False}

    head = next(c for c in sel.cases if c.role == "smallest-headroom")
    forced = planner.predict(head)          # what is measured is the forced twin of the recommendation
    assert forced.fits and not forced.offload
    fitting = [p for _, p in sel.headroom_candidates if p.fits and not p.offload]
    assert forced.ratio == pytest.approx(max(p.ratio for p in fitting))
    assert forced.ratio > 0.9               # the grid is dense enough to get close to the limit

    oom = next(c for c in sel.cases if c.role == "predicted-oom")
    p = planner.predict(oom)
    assert not p.fits and p.per_gpu_bytes >= 1.05 * p.capacity_bytes
    smaller = [q for _, q in sel.oom_candidates
               if not q.fits and 1.05 * q.capacity_bytes <= q.per_gpu_bytes < p.per_gpu_bytes]
    assert not smaller

    from wizard.planning.rungs import RUNGS
    for c in sel.cases:                     # every ZeRO case gets the wizard's own DeepSpeed config
        text = planner.ds_config_text(c)
        rung = next(r for r in RUNGS if r.key == c.backend)
        if rung.backend != "deepspeed":
            assert text is None
        else:
            zero = json.loads(text)["zero_optimization"]
            assert zero["stage"] == rung.zero_stage
            assert zero.get("offload_optimizer", {}).get("device", "none") == rung.offload_optimizer
            assert zero.get("offload_param", {}).get("device", "none") == rung.offload_param


def test_given_for_forces_the_rung():
    assert given_for("/m", "single", 512, 2, True)["backend"] == "ddp"
    g = given_for("/m", "zero3", 512, 2, False)
    assert (g["backend"], g["zero_stage"], g["offload"], g["gradient_checkpointing"]) == \
        ("deepspeed", "3", "none", "off")
    auto = given_for("/m", None, 512, 2, None)
    assert (auto["backend"], auto["zero_stage"], auto["gradient_checkpointing"]) == ("auto", "auto", "auto")
    with pytest.raises(ValueError):
        rung_key("fsdp")


# ----------------------------------------------------------------------------- probe comparison

SMI_TEXT = ("0, GPU-aaaa, NVIDIA H200, 143771, 550.54.15, 9.0, 1980\n"
            "garbage line\n"
            "1, GPU-bbbb, NVIDIA H200, [N/A], 550.54.15, 9.0, [N/A]\n")


def test_parse_smi_csv_handles_na_and_skips_malformed_lines():
    rows = parse_smi_csv(SMI_TEXT, SMI_STATIC_FIELDS)
    assert len(rows) == 2
    assert rows[0]["memory.total"] == "143771" and rows[0]["clocks.max.sm"] == "1980"
    assert rows[1]["memory.total"] is None and rows[1]["clocks.max.sm"] is None


def test_compare_probe_flags_mismatches_and_leaves_missing_values_undecided():
    rows = parse_smi_csv(SMI_TEXT, SMI_STATIC_FIELDS)[:1]
    probe = {"driver_version": "550.54.15",
             "gpus": [{"index": 0, "nvml_index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200",
                       "memory_total": 143771 * MiB, "compute_capability": [9, 0]}]}
    nvml = {"available": True, "driver_version": "550.54.15",
            "gpus": [{"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200", "memory_total": 140000 * MiB,
                      "compute_capability": [9, 0], "clocks_max_sm_mhz": 1980}]}
    by_field = {r["field"]: r for r in compare_probe(probe, nvml, rows)}
    assert by_field["name"]["ok"] is True
    assert by_field["memory.total MiB"]["ok"] is False          # pynvml disagrees with both
    assert by_field["compute capability"]["ok"] is True
    assert by_field["driver"]["ok"] is True
    assert by_field["clocks.max.sm MHz"]["ok"] is True and by_field["clocks.max.sm MHz"]["probe"] is None
    # only one source: nothing to compare
    alone = compare_probe(probe, {"available": False, "gpus": []}, [])
    assert all(r["ok"] is None for r in alone)


def test_hardware_falls_back_to_nvidia_smi_gpus_when_the_probe_sees_none():
    probe = {"hardware": {"gpus": [], "gpu_reason": "nvidia-ml-py is not installed", "ram_total": 128 * GiB,
                          "ram_available": 120 * GiB, "cpu_cores": 16}}
    rows = parse_smi_csv(SMI_TEXT, SMI_STATIC_FIELDS)[:1]
    hw, source = load_hardware(probe, None, rows)
    assert hw.num_gpus == 1 and hw.gpus[0].memory_total == 143771 * MiB and hw.gpus[0].bf16
    assert "nvidia-smi" in source
    torch_cuda = {"devices": [{"name": "NVIDIA H200", "total_memory": 150 * GiB, "capability": [9, 0]}]}
    hw, source = load_hardware(probe, None, [], torch_cuda)
    assert hw.gpus[0].memory_total == 150 * GiB and "torch" in source
    hw, why = load_hardware(probe, None, [], None)
    assert hw is None and "nvidia-ml-py" in why


# ----------------------------------------------------------------------------- metrics comparison

def _stamp(t: float) -> str:
    d = dt.datetime.fromtimestamp(t)
    return d.strftime("%Y/%m/%d %H:%M:%S.") + f"{d.microsecond // 1000:03d}"


def test_metrics_align_by_time_and_report_mean_absolute_differences(tmp_path):
    t0 = 1_800_000_000.0
    smi = "".join(f"{_stamp(t0 + i)}, 0, {50 + i}, {1000 + 10 * i}, {200.0 + i:.2f}\n" for i in range(5))
    reference = parse_smi_samples(smi)
    assert len(reference) == 5 and reference[0]["t"] == pytest.approx(t0, abs=1e-3)
    lines = []
    for i in range(5):
        gpus = [{"index": 0, "util": 50 + i + (2 if i % 2 else 0), "mem_used": (1000 + 10 * i + 20) * MiB,
                 "power_w": (200.0 + i) * 1.04}]
        lines.append(json.dumps({"t": t0 + i + 0.3, "available": True, "gpus": gpus}))
    lines.insert(2, json.dumps({"t": t0 + 1.5, "available": False, "reason": "x", "gpus": []}))
    lines.append(json.dumps({"t": t0 + 30, "available": True, "gpus": gpus}))   # no partner: not paired
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\nnot json\n")
    measured = load_metrics_jsonl(tmp_path / "metrics.jsonl", 0)
    assert len(measured) == 6
    pairs = align(reference, measured)
    assert len(pairs) == 5 and all(d == pytest.approx(0.3, abs=1e-3) for _, _, d in pairs)
    d = metric_diffs(pairs)
    assert d["util_pp"] == pytest.approx(4 / 5)                # +2 pp on samples 1 and 3
    assert d["mem_mib"] == pytest.approx(20)
    assert d["power_pct"] == pytest.approx(4.0)
    v = metrics_verdict(d)
    assert v == {"util_pp": True, "mem_pct": True, "power_pct": True}
    assert metrics_verdict({"util_pp": 9.0, "mem_pct": None, "power_pct": 6.0}) == \
        {"util_pp": False, "mem_pct": None, "power_pct": False}
    # samples further apart than max_dt are not paired
    assert align(reference, [dict(m, t=m["t"] + 5) for m in measured[:5]]) == []


def test_optional_power_readings_are_compared_for_information():
    t0 = 1_800_000_000.0
    fields = SMI_SAMPLE_FIELDS + SMI_OPTIONAL_SAMPLE_FIELDS
    smi = f"{_stamp(t0)}, 0, 50, 1000, 300.00, 400.00, 300.00\n"
    reference = parse_smi_samples(smi, fields)
    assert reference[0]["power_instant_w"] == 400.0 and reference[0]["power_average_w"] == 300.0
    pairs = align(reference, [{"t": t0, "index": 0, "util": 50, "mem_used_mib": 1000, "power_w": 300.0}])
    d = metric_diffs(pairs)
    assert d["power_average_pct"] == 0 and d["power_instant_pct"] == pytest.approx(25.0)


# ----------------------------------------------------------------------------- train_one helpers

def test_out_of_memory_is_recognised_through_wrappers():
    assert train_one.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    try:
        try:
            raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")
        except RuntimeError as inner:
            raise ValueError("engine init failed") from inner
    except ValueError as outer:
        assert train_one.is_oom(outer)
    assert not train_one.is_oom(ValueError("shape mismatch"))


def test_train_command_shrinks_only_in_a_dry_run(tmp_path):
    s = CaseSpec("m", "zero3", 4096, 8, True)
    cmd = train_command(s, "/models/m", 3, tmp_path, tmp_path / "ds.json", False, 0)
    joined = " ".join(cmd)
    assert "--seq-len 4096 --micro-batch 8" in joined and "--gc on" in joined and "--nvml-index 0" in joined
    assert "--tiny" not in cmd and f"--ds-config {tmp_path / 'ds.json'}" in joined
    dry = train_command(s, "/models/m", 2, tmp_path, None, True, 0)
    assert "--tiny" in dry and "--device" in dry and "--seq-len 32 --micro-batch 2" in " ".join(dry)


# ----------------------------------------------------------------------------- report

def test_markdown_table_has_one_row_per_case_and_a_cell_per_column():
    cases = [case_record(spec("m", "single", 512, 2), pred(50, True),
                         {"status": "ok", "wall_s": 1, "child": {"measured_peak_bytes": 48 * GiB,
                                                                 "non_torch_bytes": GiB // 2}}, False),
             case_record(spec("m", "zero3", 4096, 8), pred(130, False),
                         {"status": "oom", "wall_s": 1, "child": {"measured_peak_bytes": 100 * GiB}}, False),
             case_record(spec("m", "zero2", 1024, 1), pred(60, True),
                         {"status": "skipped", "error": "time budget: 3 s left"}, False)]
    assert cases[0]["error_pct"] == pytest.approx((50 - 48) / 48 * 100)
    assert cases[1]["error_pct"] is None and cases[1]["decision"] == "right"
    report = {"meta": {"mode": "GPU", "date": "d", "host": "h", "budget_s": 420, "elapsed_s": 1},
              "environment": {"libraries": {}, "missing": []}, "cases": cases,
              "summary": summarize(cases), "probe_comparison": [], "nvml": {"available": True},
              "nvidia_smi": {"available": True}}
    md = render_markdown(report)
    table = [line for line in md.splitlines() if line.startswith("| ") and "configuration" not in line
             and "---" not in line and "field" not in line]
    assert len(table) == 3
    for line in table:
        assert line.count("|") == len(CASE_COLUMNS) + 1
    assert "+4.2" in table[0] and "time budget" in table[2]


# ----------------------------------------------------------------------------- v2 (issue 28)

from bench.gpu.cases import BACKENDS, is_deepspeed  # noqa: E402
from bench.gpu.environment import blocking  # noqa: E402
from bench.gpu.memory_check import OFFLOAD_TIMEOUT_S, case_timeout, measured_step_seconds  # noqa: E402
from bench.gpu.qlora_load_check import (  # noqa: E402
    device_share,
    loading_verdict,
    predict_loading,
    two_gpu_hardware,
)
from bench.gpu.tune_check import parse_tune_json, trial_rows, tune_command, tune_settings, tune_verdict  # noqa: E402


@pytest.mark.parametrize("backend,expected", [
    ("zero2-offload-opt", {"backend": "deepspeed", "zero_stage": "2", "offload": "cpu"}),
    ("zero3-offload-all", {"backend": "deepspeed", "zero_stage": "3", "offload": "cpu"}),
    ("fsdp-reshard", {"backend": "fsdp", "fsdp_version": "2", "fsdp_reshard_after_forward": "yes"}),
])
def test_given_for_forces_the_v2_rungs(backend, expected):
    g = given_for("/m", backend, 2048, 4, False)
    assert {k: g.get(k) for k in expected} == expected


def test_given_for_adapters_names_the_method_and_the_tune_rows_adapters():
    g = given_for("/m", "single", 2048, 4, True, method="qlora")
    assert (g["method"], g["lora_rank"], g["lora_alpha"], g["lora_targets"], g["backend"]) == \
        ("qlora", "16", "32", "all-linear", "ddp")
    assert "method" not in given_for("/m", "single", 2048, 4, True)
    with pytest.raises(ValueError):
        given_for("/m", "single", 2048, 4, True, method="dora")


def test_v2_cases_run_first_and_say_what_they_are():
    cfg = {"grid": {"seq_lens": [512], "micro_batches": [1, 2], "backends": ["single"]},
           "oom_min_over_capacity": 1.05, "coverage": [], "launch": None,
           "v2": [{"model": "a", "method": "qlora", "backend": "single", "seq_len": 512, "micro_batch": 1, "gc": True},
                  {"model": "a", "backend": "fsdp-reshard", "seq_len": 512, "micro_batch": 1, "gc": False}]}
    sel = select_cases(cfg, ["a"], lambda s: pred(s.micro_batch * 60, s.micro_batch == 1),
                       lambda m, seq, mb: (spec(m, "single", seq, mb), pred(mb * 60, mb == 1)) if mb == 1 else None)
    assert [c.role for c in sel.cases][:2] == ["v2", "v2"]
    assert sel.cases[0].label() == "a qlora single s512 b1 GC on"
    assert sel.cases[0].kind == "qlora single" and sel.cases[1].kind == "fsdp-reshard"
    assert {c.role for c in sel.cases[2:]} == {"smallest-headroom", "predicted-oom"}


def test_every_v2_case_is_predicted_by_its_own_rung_with_a_step_time(model_dirs, cases_cfg):
    from wizard.probe import hardware
    planner = Planner(hardware.assume("1xH200,ram=128G,cpus=16"), model_dirs)
    cases = [spec_from_json(c) for c in cases_cfg["v2"]]
    assert {c.backend for c in cases} == set(BACKENDS) - {"single", "zero2", "zero3"} | {"single"}
    assert {c.method for c in cases} == {"full", "lora", "qlora"}
    for c in cases:
        p = planner.predict(c)
        assert p.rung == c.backend and p.fits and p.step_seconds and p.step_seconds > 0, c.label()
        if c.backend.endswith(("offload-opt", "offload-all")):
            assert p.offload and p.breakdown
    fsdp = next(c for c in cases if c.backend == "fsdp-reshard")
    yaml_text = planner.accelerate_yaml(fsdp)
    assert "distributed_type: FSDP" in yaml_text and "fsdp_version: 2" in yaml_text
    assert "fsdp_reshard_after_forward: true" in yaml_text      # the forced rung's, not the plan's own choice's
    assert planner.ds_config_text(fsdp) is None and is_deepspeed("zero3-offload-all")
    qlora = next(c for c in cases if c.method == "qlora")
    setup = planner.adapter_setup(qlora)        # what the wizard's snippet tells a single-GPU QLoRA user
    assert setup["bnb"]["bnb_4bit_quant_type"] == "nf4" and setup["bnb"]["bnb_4bit_quant_storage"] == "uint8"
    assert setup["kbit_prepared"] is True and setup["lora"]["r"] == 16
    lora = next(c for c in cases if c.method == "lora")
    assert planner.adapter_setup(lora)["bnb"] is None
    assert planner.adapter_setup(fsdp) is None


def test_the_loading_premise_is_predicted_for_two_gpus_like_the_one_found(model_dirs):
    from wizard.probe import hardware
    planner = Planner(hardware.assume("1xH200,ram=128G,cpus=16"), model_dirs)
    hw2 = two_gpu_hardware(planner.hw, 2)
    assert [g.index for g in hw2.gpus] == [0, 1] and hw2.gpus[1].name == planner.hw.gpus[0].name
    p = predict_loading(planner, "llama-3.1-8b", 2, hw2)
    assert p["rung"] == "fsdp-reshard" and p["load_bytes"] > p["nf4_model_bytes"] > 0
    # NF4 packs two weights a byte: an 8B model's 4-bit weights plus its unquantised embeddings and head
    assert 4 * GiB < p["nf4_model_bytes"] < 7 * GiB
    # sharded QLoRA stores the 4-bit codes in the compute dtype and skips prepare_model_for_kbit_training
    assert p["setup"]["bnb"]["bnb_4bit_quant_storage"] == "bfloat16" and p["setup"]["kbit_prepared"] is False


def test_measured_step_is_the_median_after_the_warm_up_step():
    assert measured_step_seconds([2.7, 0.58]) == pytest.approx(0.58)
    assert measured_step_seconds([2.7, 0.6, 0.5, 0.7]) == pytest.approx(0.6)
    assert measured_step_seconds([2.7]) is None and measured_step_seconds(None) is None


def test_case_record_compares_step_times_and_the_summary_counts_them():
    p = dataclasses.replace(pred(50, True), step_seconds=1.0)
    rec = case_record(spec(), p, {"status": "ok", "wall_s": 1, "child": {"measured_peak_bytes": 50 * GiB,
                                                                        "step_times_s": [3.0, 1.2, 1.25]}}, False)
    assert rec["predicted_step_s"] == 1.0 and rec["measured_step_s"] == pytest.approx(1.225)
    assert rec["step_error_pct"] == pytest.approx((1.0 - 1.225) / 1.225 * 100)
    dry = case_record(spec(), p, {"status": "ok", "wall_s": 1, "child": {"step_times_s": [3.0, 1.2]}}, True)
    assert dry["measured_step_s"] is None and dry["step_error_pct"] is None
    s = summarize([rec, {**rec, "step_error_pct": 5.0}])
    assert (s["timed"], s["step_within_target"]) == (2, 1)
    assert s["max_abs_step_error_pct"] == pytest.approx(abs(rec["step_error_pct"]))


def test_offload_cases_get_time_for_the_cpu_adam_build_within_the_budget():
    off = spec(backend="zero2-offload-opt")
    assert case_timeout(off, 120, False, 1000) == OFFLOAD_TIMEOUT_S["gpu"]
    assert case_timeout(off, 60, True, 1000) == OFFLOAD_TIMEOUT_S["dry_run"]
    assert case_timeout(off, 60, True, 90) == 90
    assert case_timeout(spec(backend="zero2"), 120, False, 1000) == 120


def test_what_each_v2_case_needs_installed():
    missing = ["deepspeed", "peft", "bitsandbytes"]
    assert blocking(missing, "single", "qlora") == ["peft", "bitsandbytes"]
    assert blocking(missing, "single", "lora") == ["peft"]
    assert blocking(missing, "zero3-offload-all") == ["deepspeed"]
    assert blocking(missing, "qlora-load") == ["bitsandbytes"]
    assert blocking(missing, "fsdp-reshard") == [] and blocking(missing, "tune") == []


def test_v2_train_commands(tmp_path):
    fsdp = train_command(spec(backend="fsdp-reshard"), "/m", 3, tmp_path, None, False, 0,
                         accelerate_yaml=tmp_path / "c.yaml", port=1234)
    assert fsdp[1:8] == ["-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "c.yaml"),
                         "--num_processes", "1", "--main_process_port"]
    assert "--expect-fsdp" in fsdp
    q = train_command(CaseSpec("m", "single", 512, 1, True, method="qlora"), "/m", 3, tmp_path, None, False, 0,
                      adapter_json=tmp_path / "a.json", checkpoint="/ck")
    joined = " ".join(q)
    assert "--method qlora" in joined and f"--adapter-json {tmp_path / 'a.json'}" in joined
    assert "--checkpoint /ck" in joined and "accelerate" not in joined
    lora = train_command(CaseSpec("m", "single", 512, 1, True, method="lora"), "/m", 3, tmp_path, None, False, 0,
                         adapter_json=tmp_path / "a.json")
    assert "--checkpoint" not in lora and "--method" in lora


@pytest.mark.parametrize("held,expected", [
    ([{"cuda": 100}, {"cuda": 100}], "holds"),                       # every rank quantised onto its GPU
    ([{"cuda": 100}, {"meta": 95, "cuda": 5}], "does not hold"),     # rank 1 stayed on meta
    ([{"cuda": 100}, {"cuda": 50, "cpu": 50}], "unknown"),
])
def test_loading_verdict(held, expected):
    ranks = [{"status": "ok", "held_bytes": h} for h in held]
    verdict, why = loading_verdict(ranks, "cuda")
    assert verdict == expected, why
    assert loading_verdict([ranks[0], {"status": "oom"}], "cuda")[0] == "unknown"
    assert loading_verdict([ranks[0], None], "cuda")[0] == "unknown"
    assert device_share({}, "cuda") is None and device_share({"cpu": 3, "cuda": 1}, "cuda") == 0.25


def test_tune_settings_keep_every_trial_complete():
    cfg = json.loads((GPU_DIR / "cases.json").read_text())["tune"]
    gpu = tune_settings(cfg, dry_run=False, quick=False)
    assert gpu["script_steps"] > gpu["steps"] + gpu["warmup"]
    quick = tune_settings(cfg, dry_run=False, quick=True)
    assert quick["steps"] <= gpu["steps"] and quick["script_steps"] > quick["steps"] + quick["warmup"]
    dry = tune_settings(cfg, dry_run=True, quick=True)
    assert dry["seq_len"] < 128 and dry["variants"] == 0
    with pytest.raises(ValueError, match="script_steps"):
        tune_settings({**cfg, "script_steps": cfg["steps"] + cfg["warmup"]}, False, False)
    cmd = tune_command(gpu, "/m", Path("/o"), Path("/r"), dry_run=False)
    assert cmd[1:4] == ["-m", "wizard", "tune"] and "--no-calibration" in cmd and "--json" in cmd
    assert cmd[cmd.index("--backend") + 1] == "ddp"
    script = cmd[cmd.index("--") + 1:]
    assert script[0].endswith("bench/gpu/train_real.py") and script[-2:] == ["--steps", str(gpu["script_steps"])]
    assert "--use-cpu" in tune_command(dry, "/m", Path("/o"), Path("/r"), dry_run=True)


def test_tune_rows_and_verdict():
    doc = parse_tune_json(["[tune] noise\n", '{"candidates": [\n',
                           '{"label": "Single GPU", "rung": "single", "batch": "4 x 1, GC off", "status": "measured",'
                           ' "predicted": {"per_gpu_bytes": 110, "step_seconds": 0.9},'
                           ' "measured": {"peak_bytes": 100, "step_seconds": 1.0, "steps": 6}},\n',
                           '{"label": "mb10", "rung": "single", "batch": "10 x 1", "status": "incomplete",'
                           ' "predicted": {}, "measured": {}}], "winner": "Single GPU"}\n'])
    rows = trial_rows(doc, dry_run=False)
    assert rows[0]["error_pct"] == pytest.approx(10.0) and rows[0]["step_error_pct"] == pytest.approx(-10.0)
    assert rows[1]["error_pct"] is None
    assert tune_verdict(rows, 0)[0] == "incomplete" and "mb10: incomplete" in tune_verdict(rows, 0)[1]
    assert tune_verdict(rows[:1], 0) == ("complete", "every trial completed (1 of 1)")
    assert tune_verdict([], 2)[0] == "unknown" and parse_tune_json(["no json"]) is None
    assert trial_rows(doc, dry_run=True)[0]["error_pct"] is None


def test_the_report_has_the_loading_premise_and_tune_sections():
    report = {"meta": {"mode": "GPU", "date": "d", "host": "h", "budget_s": 410, "elapsed_s": 1},
              "environment": {"libraries": {}, "missing": []}, "cases": [], "summary": summarize([]),
              "probe_comparison": [], "nvml": {"available": True}, "nvidia_smi": {"available": True},
              "qlora_load": {"model": "llama-3.1-8b", "processes": 2, "verdict": "holds", "verdict_why": "w",
                             "prediction": {"rung": "fsdp-reshard", "load_bytes": 6 * GiB, "nf4_model_bytes": 5 * GiB},
                             "setup": {"bnb": {"bnb_4bit_quant_storage": "bfloat16"}},
                             "ranks": [{"status": "ok", "held_bytes": {"cuda": 5 * GiB}, "error_pct": 2.0}] * 2},
              "tune_skipped": "time budget: 12 s left before the launch reserve"}
    md = render_markdown(report)
    assert "**Premise: holds**" in md and "| 1 | ok | None | None | 5.0 |" in md
    assert "## wizard tune with a Trainer script" in md and "not run: time budget" in md


def test_a_killed_jit_build_leaves_no_lock_behind(tmp_path):
    from bench.gpu.memory_check import remove_stale_build_locks
    old = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    old.parent.mkdir(parents=True)
    old.write_text("")
    os.utime(old, (1000, 1000))             # a lock older than the case: someone else's build, kept
    new = tmp_path / "cpu_adam" / "lock"    # TORCH_EXTENSIONS_DIR layout: no version folder
    new.parent.mkdir()
    new.write_text("")
    assert remove_stale_build_locks(2000, tmp_path) == [str(new)]
    assert old.exists() and not new.exists()


def test_the_preflights_health_fields_are_read_from_nvidia_smi_as_the_wizard_holds_them():
    from bench.gpu.preflight_check import compare_health, smi_value
    assert smi_value("ecc_enabled", "Enabled") is True and smi_value("ecc_uncorrected_volatile", "[N/A]") is None
    assert smi_value("remap_pending", "No") is False and smi_value("ecc_corrected_volatile", "12") == 12
    assert smi_value("clock_events", "0x0000000000000041") == ("gpu_idle", "hw_thermal_slowdown")
    rows = compare_health([{"index": 0, "ecc_enabled": True, "ecc_corrected_volatile": 3, "clock_events": []}],
                          {"ecc_enabled": [True], "ecc_corrected_volatile": [4], "clock_events": [()]})
    by = {r["field"]: r["ok"] for r in rows}
    assert by["ecc_enabled"] is True and by["ecc_corrected_volatile"] is False and by["clock_events"] is True
    assert by["remap_pending"] is None                          # neither side said
