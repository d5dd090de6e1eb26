"""Ground truth for the memory plan and the launcher on a real NVIDIA GPU (issue 6).

    python bench/gpu/measure.py [--out bench/results/gpu-<date>.md] [--quick] [--dry-run-cpu]
                                [--budget-s 450] [--case-timeout-s 90] [--assume SPEC]

1. Probe: `python -m wizard probe --json`, pynvml read directly (name, memory, compute capability,
   driver, clocks) and `nvidia-smi --query-gpu=...`; every field compared, mismatches flagged.
2. Memory: for each configuration (bench/gpu/cases.json: fixed coverage cases, plus the recommended
   configuration with the smallest headroom and one predicted not to fit, both picked from the
   planner's numbers for the GPU found) the wizard's prediction from the real pipeline
   (wizard.pipeline.build, answers forcing backend / stage / GC / sequence / micro-batch, hardware
   from the probe) and the measured peak of a few HF Trainer steps in a subprocess
   (bench/gpu/train_one.py: torch.cuda.max_memory_reserved + the non-torch memory NVML sees).
3. Launcher: `wizard launch --headless` on one configuration while `nvidia-smi -lms 1000` samples
   in parallel; metrics.jsonl (util, mem_used, power_w) compared with it, aligned by time.
4. Results: a markdown table (prediction, measurement, error %, fit decision right or wrong) plus
   a JSON twin, rewritten after every step so that a run cut short still leaves its results.

--dry-run-cpu does everything a CPU can: the probe (with WIZARD_FAKE_NVML=1xH200), predictions
and case selection for an assumed 1xH200, tiny versions of the trainings on the CPU (measured
peaks are null), and the launch + metrics comparison against the fake NVML instead of nvidia-smi.
--quick: 2 steps instead of 3, a shorter launch; in a dry run, one tiny training per backend.

Nothing is installed or downloaded; what is missing (torch, CUDA, DeepSpeed, nvidia-ml-py,
nvidia-smi) is detected and reported, and the parts that need it are skipped with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:        # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

MiB = 1024 ** 2
GiB = 1024 ** 3
MARKER = "GPU_BENCH_RESULT "
BACKENDS = ("single", "zero2", "zero3")
DRY_RUN_ASSUME = "1xH200,ram=128G,cpus=16"     # the device machine of the issue: one H200, 128 GiB, 16 cores
DRY_RUN_FAKE_NVML = "1xH200"
SMI_STATIC_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap", "clocks.max.sm")
SMI_SAMPLE_FIELDS = ("timestamp", "index", "utilization.gpu", "memory.used", "power.draw")
# Newer drivers also report both power readings; NVML's nvmlDeviceGetPowerUsage may be either.
SMI_OPTIONAL_SAMPLE_FIELDS = ("power.draw.instant", "power.draw.average")
# "Within a few percent" (issue 6), made concrete: mean absolute differences over aligned samples.
METRIC_THRESHOLDS = {"util_pp": 5.0, "mem_pct": 2.0, "power_pct": 5.0}
ERROR_TARGET_PCT = 10.0               # issue 6: predicted peak within +-10 % of the measured one


# ============================================================================ cases and predictions

@dataclass
class CaseSpec:
    model: str
    backend: str                      # single | zero2 | zero3 (one process each)
    seq_len: int
    micro_batch: int
    gc: bool
    role: str = "coverage"            # coverage | smallest-headroom | predicted-oom
    why: str = ""

    def key(self) -> tuple:
        return (self.model, self.backend, self.seq_len, self.micro_batch, self.gc)

    def label(self) -> str:
        return f"{self.model} {self.backend} s{self.seq_len} b{self.micro_batch} GC {'on' if self.gc else 'off'}"


@dataclass
class Prediction:
    rung: str
    fits: bool
    per_gpu_bytes: int
    usable_bytes: int
    capacity_bytes: int
    gc: bool
    breakdown: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    offload: bool = False

    @property
    def ratio(self) -> float:
        """Predicted peak / usable memory: above 1 it does not fit, near 1 the headroom is small."""
        return self.per_gpu_bytes / max(self.usable_bytes, 1)


def rung_key(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    return backend


def given_for(model_dir: str, backend: str | None, seq_len: int, micro_batch: int, gc: bool | None) -> dict:
    """The answers that force one configuration (None: let the wizard choose, as a user would)."""
    given: dict[str, Any] = {"model": model_dir, "seq_len": seq_len, "micro_batch": micro_batch,
                             "precision": "bf16", "attention": "sdpa", "num_processes": 1,
                             "gradient_checkpointing": "auto" if gc is None else ("on" if gc else "off")}
    if backend is None:
        given.update(backend="auto", zero_stage="auto", offload="auto")
    elif backend == "single":
        given["backend"] = "ddp"          # one process: the ladder's only rung is "single"
    else:
        given.update(backend="deepspeed", zero_stage=backend[-1], offload="none")
    return given


def prediction_from_rung(rung, plan) -> Prediction:
    return Prediction(rung=rung.key, fits=bool(rung.fits), per_gpu_bytes=int(rung.per_gpu_bytes),
                      usable_bytes=int(plan.usable_bytes), capacity_bytes=int(plan.gpu_capacity_bytes),
                      gc=bool(rung.gradient_checkpointing), breakdown=dict(rung.breakdown), reason=rung.reason,
                      offload=rung.offload_optimizer != "none" or rung.offload_param != "none")


class Planner:
    """The wizard's real pipeline, one model directory per shape, hardware fixed (probe or assumed)."""

    def __init__(self, hw, model_dirs: dict[str, str]):
        self.hw = hw
        self.model_dirs = model_dirs
        self._cache: dict[tuple, Any] = {}

    def build(self, model: str, backend: str | None, seq_len: int, micro_batch: int, gc: bool | None):
        from wizard import pipeline
        key = (model, backend, seq_len, micro_batch, gc)
        if key not in self._cache:
            given = given_for(self.model_dirs[model], backend, seq_len, micro_batch, gc)
            self._cache[key] = pipeline.build(pipeline.Request(given=given), hw=self.hw)
        return self._cache[key]

    def predict(self, spec: CaseSpec) -> Prediction:
        from wizard.plan import rung_by_key
        result = self.build(spec.model, spec.backend, spec.seq_len, spec.micro_batch, spec.gc)
        rung = rung_by_key(result.plan, rung_key(spec.backend))
        if rung is None:
            raise RuntimeError(f"the plan for {spec.label()} has no {spec.backend} rung")
        return prediction_from_rung(rung, result.plan)

    def recommend(self, model: str, seq_len: int, micro_batch: int) -> tuple[CaseSpec, Prediction] | None:
        """What the wizard chooses with everything on auto, as a forced CaseSpec; None if nothing fits."""
        result = self.build(model, None, seq_len, micro_batch, None)
        choice = result.plan.choice
        if choice is None:
            return None
        pred = prediction_from_rung(choice, result.plan)
        # Offload rungs keep their key (e.g. zero3-offload-opt); pick_smallest_headroom leaves them out.
        return CaseSpec(model, choice.key, seq_len, micro_batch, bool(choice.gradient_checkpointing)), pred

    def ds_config_text(self, spec: CaseSpec) -> str | None:
        """The ds_config.json the wizard writes for this rung (also for a rung it would not choose)."""
        if spec.backend == "single":
            return None
        from wizard import emit
        from wizard.plan import rung_by_key
        result = self.build(spec.model, spec.backend, spec.seq_len, spec.micro_batch, spec.gc)
        plan = dataclasses.replace(result.plan, choice=rung_by_key(result.plan, spec.backend))
        return emit.render_json(emit.deepspeed_config(result.answers, plan, result.model))

    def accelerate_yaml(self, spec: CaseSpec) -> str | None:
        return self.build(spec.model, spec.backend, spec.seq_len, spec.micro_batch, spec.gc).yaml_text

    def params(self, model: str) -> int:
        return int(self.build(model, "single", 512, 1, False).model.params)


@dataclass
class Selection:
    cases: list[CaseSpec]
    headroom_candidates: list[tuple[CaseSpec, Prediction]]
    oom_candidates: list[tuple[CaseSpec, Prediction]]
    notes: list[str] = field(default_factory=list)


def pick_smallest_headroom(candidates: Iterable[tuple[CaseSpec, Prediction]]) -> tuple[CaseSpec, Prediction] | None:
    """The recommended configuration closest to the limit: fits, no offload, largest predicted/usable.

    Ties go to the smaller micro-batch x sequence (cheaper to run)."""
    fitting = [(s, p) for s, p in candidates if p.fits and not p.offload]
    if not fitting:
        return None
    return max(fitting, key=lambda sp: (round(sp[1].ratio, 6), -sp[0].seq_len * sp[0].micro_batch))


def pick_predicted_oom(candidates: Iterable[tuple[CaseSpec, Prediction]],
                       min_over_capacity: float) -> tuple[CaseSpec, Prediction] | None:
    """A forced configuration predicted not to fit, just far enough over the GPU's whole memory that
    a right model means a real out-of-memory: the smallest prediction >= min_over_capacity x capacity."""
    over = [(s, p) for s, p in candidates
            if not p.fits and p.per_gpu_bytes >= min_over_capacity * p.capacity_bytes]
    if not over:
        return None
    return min(over, key=lambda sp: (sp[1].per_gpu_bytes, sp[0].seq_len * sp[0].micro_batch))


def select_cases(cfg: dict, models: list[str],
                 predict: Callable[[CaseSpec], Prediction],
                 recommend: Callable[[str, int, int], tuple[CaseSpec, Prediction] | None]) -> Selection:
    """Coverage cases from cases.json, plus the smallest-headroom and the predicted-OOM case.

    Order: the two selected cases first (they matter most if time runs short), then the launch
    case, then the rest of the coverage. A selected case equal to a coverage case takes its place.
    """
    grid = cfg["grid"]
    notes: list[str] = []
    headroom_candidates = []
    for model in models:
        for seq in grid["seq_lens"]:
            for mb in grid["micro_batches"]:
                rec = recommend(model, seq, mb)
                if rec is not None:
                    headroom_candidates.append(rec)
    oom_candidates = []
    for model in models:
        for backend in grid["backends"]:
            for seq in grid["seq_lens"]:
                for mb in grid["micro_batches"]:
                    for gc in (False, True):
                        spec = CaseSpec(model, backend, seq, mb, gc, role="predicted-oom")
                        oom_candidates.append((spec, predict(spec)))

    selected: list[CaseSpec] = []
    headroom = pick_smallest_headroom(headroom_candidates)
    if headroom is None:
        notes.append("no recommended configuration of the grid fits without offload: no smallest-headroom case")
    else:
        spec, pred = headroom
        selected.append(dataclasses.replace(
            spec, role="smallest-headroom",
            why=f"recommended by the wizard (auto) with the smallest headroom of {len(headroom_candidates)} "
                f"grid points: predicted {pred.ratio * 100:.1f}% of usable"))
    factor = float(cfg.get("oom_min_over_capacity", 1.05))
    oom = pick_predicted_oom(oom_candidates, factor)
    if oom is None:
        notes.append(f"no configuration of the grid is predicted above {factor:g} x the GPU memory: no OOM case")
    else:
        spec, pred = oom
        selected.append(dataclasses.replace(
            spec, role="predicted-oom",
            why=f"smallest prediction >= {factor:g} x GPU memory: {pred.per_gpu_bytes / pred.capacity_bytes * 100:.1f}% "
                "of capacity, so it must fail with out-of-memory"))

    launch_key = _spec_from_json(cfg["launch"]).key() if cfg.get("launch") else None
    coverage = [_spec_from_json(c) for c in cfg["coverage"]]
    coverage.sort(key=lambda s: 0 if s.key() == launch_key else 1)
    chosen = {s.key() for s in selected}
    cases = list(selected)
    for spec in coverage:
        if spec.key() in chosen:
            notes.append(f"coverage case {spec.label()} is also the {next(s.role for s in selected if s.key() == spec.key())} case")
            continue
        cases.append(spec)
        chosen.add(spec.key())
    return Selection(cases, headroom_candidates, oom_candidates, notes)


def _spec_from_json(d: dict) -> CaseSpec:
    return CaseSpec(model=d["model"], backend=d["backend"], seq_len=int(d["seq_len"]),
                    micro_batch=int(d["micro_batch"]), gc=bool(d["gc"]), role=d.get("role", "coverage"),
                    why=d.get("why", ""))


# ============================================================================ verdicts

def error_pct(predicted: int | None, measured: int | None) -> float | None:
    """(predicted - measured) / measured in percent: positive means the wizard over-estimates."""
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured * 100.0


def decide(pred_fits: bool, status: str, measured: int | None, usable: int) -> tuple[str, str]:
    """(right | wrong | unknown, why) for the wizard's fit decision against what happened.

    A 'fits' is right when the run completes (and says so when the measured peak ate into the
    headroom). A 'does not fit' is right when the run runs out of memory, or when it completes but
    its measured peak exceeds the usable memory (the headroom the rule keeps would be gone);
    completing within the usable memory means the wizard was too cautious.
    """
    if status == "ok":
        if pred_fits:
            if measured is not None and measured > usable:
                return "right", "ran, but the measured peak is above the usable memory (headroom eaten)"
            return "right", "predicted to fit and ran"
        if measured is None:
            return "unknown", "predicted not to fit, ran, no measured peak"
        if measured > usable:
            return "right", "predicted not to fit; ran, but above the usable memory"
        return "wrong", "predicted not to fit but ran within the usable memory (too cautious)"
    if status == "oom":
        if pred_fits:
            return "wrong", "predicted to fit but ran out of memory"
        return "right", "predicted not to fit and ran out of memory"
    return "unknown", f"not measured ({status})"


# ============================================================================ probe comparison

def parse_smi_csv(text: str, fields: Iterable[str]) -> list[dict[str, str | None]]:
    """nvidia-smi --format=csv,noheader,nounits output -> one dict per line ('[N/A]' -> None)."""
    fields = list(fields)
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        rows.append({f: (None if p in ("[N/A]", "N/A", "[Not Supported]", "") else p) for f, p in zip(fields, parts)})
    return rows


def _num(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _cc_text(cc: Any) -> str | None:
    if cc is None:
        return None
    if isinstance(cc, (list, tuple)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    return str(cc)


def _same(a: Any, b: Any, tolerance: float = 0.0) -> bool | None:
    """None when either side is missing (nothing to compare), else equal within tolerance."""
    if a is None or b is None:
        return None
    na, nb = _num(a), _num(b)
    if na is not None and nb is not None:
        return abs(na - nb) <= tolerance
    return str(a).strip() == str(b).strip()


def compare_probe(probe: dict | None, nvml: dict, smi_rows: list[dict]) -> list[dict]:
    """One row per GPU and field: the probe's value, pynvml's, nvidia-smi's, and whether they agree.

    GPUs are matched by UUID (else NVML index). Memory in MiB (1 MiB tolerance: nvidia-smi rounds
    down), compute capability as 'major.minor', the max SM clock in MHz (pynvml vs nvidia-smi only:
    the probe does not read clocks).
    """
    rows: list[dict] = []
    gpus = (probe or {}).get("gpus") or []
    nvml_gpus = nvml.get("gpus") or []
    targets = gpus or [{"nvml_index": g.get("index"), "uuid": g.get("uuid")} for g in nvml_gpus]
    for g in targets:
        idx = g.get("nvml_index", g.get("index"))
        uuid = g.get("uuid")
        n = next((x for x in nvml_gpus if uuid and x.get("uuid") == uuid), None) or \
            next((x for x in nvml_gpus if x.get("index") == idx), {})
        s = next((x for x in smi_rows if uuid and x.get("uuid") == uuid), None) or \
            next((x for x in smi_rows if _num(x.get("index")) == idx), {})
        mem = lambda b: None if b is None else int(b) // MiB  # noqa: E731
        fields = [
            ("name", g.get("name"), n.get("name"), s.get("name"), 0.0),
            ("memory.total MiB", mem(g.get("memory_total")), mem(n.get("memory_total")), s.get("memory.total"), 1.0),
            ("compute capability", _cc_text(g.get("compute_capability")), _cc_text(n.get("compute_capability")),
             s.get("compute_cap"), 0.0),
            ("driver", (probe or {}).get("driver_version") if gpus else None, nvml.get("driver_version"),
             s.get("driver_version"), 0.0),
            ("clocks.max.sm MHz", None, n.get("clocks_max_sm_mhz"), s.get("clocks.max.sm"), 0.0),
        ]
        for name, pv, nv, sv, tol in fields:
            present = [v for v in (pv, nv, sv) if v is not None]
            checks = [_same(a, b, tol) for a, b in ((pv, nv), (pv, sv), (nv, sv))]
            checks = [c for c in checks if c is not None]
            rows.append({"gpu": idx, "field": name, "probe": pv, "pynvml": nv, "nvidia_smi": sv,
                         "ok": (all(checks) if checks else None) if len(present) >= 2 else None})
    return rows


# ============================================================================ metrics comparison

def parse_smi_timestamp(text: str) -> float | None:
    """nvidia-smi's 'YYYY/MM/DD HH:MM:SS.fff' (local time) -> epoch seconds."""
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(text.strip(), fmt).timestamp()
        except ValueError:
            continue
    return None


def parse_smi_samples(text: str, fields: Iterable[str] = SMI_SAMPLE_FIELDS) -> list[dict]:
    """Lines of `nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw[,...]
    --format=csv,noheader,nounits -lms 1000` -> [{t, index, util, mem_used_mib, power_w, ...}]."""
    out = []
    for row in parse_smi_csv(text, fields):
        t = parse_smi_timestamp(row["timestamp"] or "")
        if t is None:
            continue
        sample = {"t": t, "index": int(_num(row["index"]) or 0), "util": _num(row["utilization.gpu"]),
                  "mem_used_mib": _num(row["memory.used"]), "power_w": _num(row["power.draw"])}
        for extra in SMI_OPTIONAL_SAMPLE_FIELDS:
            if extra in row:
                sample[extra.replace("power.draw.", "power_") + "_w"] = _num(row[extra])
        out.append(sample)
    return out


def load_metrics_jsonl(path: Path, index: int) -> list[dict]:
    """The launcher's metrics.jsonl for one NVML index, in the units nvidia-smi prints."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if not sample.get("available"):
            continue
        for g in sample.get("gpus") or []:
            if g.get("index") != index:
                continue
            mem = g.get("mem_used")
            out.append({"t": float(sample["t"]), "index": index, "util": g.get("util"),
                        "mem_used_mib": None if mem is None else mem / MiB, "power_w": g.get("power_w")})
    return out


def align(reference: list[dict], measured: list[dict], max_dt: float = 0.6) -> list[tuple[dict, dict, float]]:
    """Pairs (reference, nearest measured sample, |dt|) for each reference sample with a measured one
    within max_dt seconds; each measured sample used at most once."""
    pairs = []
    used: set[int] = set()
    ordered = sorted(range(len(measured)), key=lambda i: measured[i]["t"])
    for ref in sorted(reference, key=lambda r: r["t"]):
        best, best_dt = None, None
        for i in ordered:
            if i in used:
                continue
            d = abs(measured[i]["t"] - ref["t"])
            if best_dt is None or d < best_dt:
                best, best_dt = i, d
        if best is not None and best_dt <= max_dt:
            used.add(best)
            pairs.append((ref, measured[best], best_dt))
    return pairs


def metric_diffs(pairs: list[tuple[dict, dict, float]]) -> dict[str, Any]:
    """Mean absolute differences: util in percentage points, memory and power in units and in percent
    of nvidia-smi's value."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    util = [abs(m["util"] - r["util"]) for r, m, _ in pairs if r["util"] is not None and m["util"] is not None]
    mem = [(abs(m["mem_used_mib"] - r["mem_used_mib"]), r["mem_used_mib"]) for r, m, _ in pairs
           if r["mem_used_mib"] is not None and m["mem_used_mib"] is not None]
    power = [(abs(m["power_w"] - r["power_w"]), r["power_w"]) for r, m, _ in pairs
             if r["power_w"] is not None and m["power_w"] is not None]
    extra = {}
    for key in ("power_instant_w", "power_average_w"):
        # Which nvidia-smi power reading NVML's power_w matches (when the driver reports both).
        alt = [abs(m["power_w"] - r[key]) / r[key] * 100 for r, m, _ in pairs
               if r.get(key) and m["power_w"] is not None]
        if alt:
            extra[key.replace("_w", "_pct")] = mean(alt)
    return {
        **extra,
        "pairs": len(pairs),
        "mean_dt_s": mean([d for _, _, d in pairs]),
        "util_pp": mean(util),
        "mem_mib": mean([d for d, _ in mem]),
        "mem_pct": mean([d / ref * 100 for d, ref in mem if ref > 0]),
        "power_w": mean([d for d, _ in power]),
        "power_pct": mean([d / ref * 100 for d, ref in power if ref > 0]),
        "util_pairs": len(util), "mem_pairs": len(mem), "power_pairs": len(power),
    }


def metrics_verdict(diffs: dict[str, Any], thresholds: dict[str, float] = METRIC_THRESHOLDS) -> dict[str, Any]:
    out = {}
    for key, limit in thresholds.items():
        value = diffs.get(key)
        out[key] = None if value is None else bool(value <= limit)
    return out


# ============================================================================ environment

LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "nvidia-ml-py", "psutil", "PyYAML")
MODULES = {"torch": "torch", "transformers": "transformers", "accelerate": "accelerate", "deepspeed": "deepspeed",
           "nvidia-ml-py": "pynvml", "psutil": "psutil", "PyYAML": "yaml"}


def environment(dry_run: bool) -> dict[str, Any]:
    """What is installed, whether torch sees CUDA (asked in a subprocess: no CUDA context here)."""
    libs = {}
    for dist in LIBRARIES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        importable = importlib.util.find_spec(MODULES[dist]) is not None
        libs[dist] = {"version": version, "importable": importable}
    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "libraries": libs,
                            "nvidia_smi": shutil.which("nvidia-smi"), "host": socket.gethostname(),
                            "cpu_count": os.cpu_count(),
                            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    torch_cuda = None
    if libs["torch"]["importable"]:
        code = ("import json, torch\nok = torch.cuda.is_available()\n"
                "devs = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())] if ok else []\n"
                "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': ok, "
                "'count': len(devs), 'bf16': ok and torch.cuda.is_bf16_supported(), "
                "'devices': [{'name': d.name, 'total_memory': d.total_memory, 'capability': [d.major, d.minor]} "
                "for d in devs]}))")
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            torch_cuda = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else \
                {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            torch_cuda = {"error": f"{type(exc).__name__}: {exc}"}
    info["torch_cuda"] = torch_cuda
    missing = [d for d in ("torch", "transformers", "accelerate") if not libs[d]["importable"]]
    if not dry_run:
        missing += [d for d in ("deepspeed", "nvidia-ml-py") if not libs[d]["importable"]]
        if libs["torch"]["importable"] and not (torch_cuda or {}).get("available"):
            missing.append("CUDA for torch (torch.cuda.is_available() is False)")
        if not info["nvidia_smi"]:
            missing.append("nvidia-smi")
    info["missing"] = missing
    return info


def blocking(missing: list[str], what: str) -> list[str]:
    """Which of the missing things stop one measurement. Every training needs torch with CUDA,
    transformers and accelerate; ZeRO cases need DeepSpeed; the launch comparison needs nvidia-smi.
    Without nvidia-ml-py a case still runs (its peak then lacks the CUDA context, and says so)."""
    needed = [m for m in missing if m in ("torch", "transformers", "accelerate") or m.startswith("CUDA")]
    if what.startswith("zero"):
        needed += [m for m in missing if m == "deepspeed"]
    if what == "launch":
        needed += [m for m in missing if m == "nvidia-smi"]
    return needed


# ============================================================================ probe step

def run_probe(env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    try:
        r = subprocess.run([sys.executable, "-m", "wizard", "probe", "--json"], capture_output=True, text=True,
                           env=env, cwd=str(REPO), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"wizard probe --json took more than {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": f"wizard probe --json exited {r.returncode}: {r.stderr.strip()[-500:]}"}
    try:
        return {"hardware": json.loads(r.stdout)}
    except ValueError as exc:
        return {"error": f"wizard probe --json printed no JSON: {exc}"}


def nvml_direct() -> dict[str, Any]:
    """pynvml itself, independently of wizard/nvml.py: what the driver says, to compare with both."""
    out: dict[str, Any] = {"available": False, "reason": None, "gpus": []}
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:
        out["reason"] = f"{type(exc).__name__}: {exc}"
        return out

    def call(fn, *a):
        try:
            v = fn(*a)
            return v.decode() if isinstance(v, bytes) else v
        except Exception:
            return None

    try:
        out["available"] = True
        out["driver_version"] = call(pynvml.nvmlSystemGetDriverVersion)
        cuda = call(pynvml.nvmlSystemGetCudaDriverVersion)
        out["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = call(pynvml.nvmlDeviceGetMemoryInfo, h)
            cc = call(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            sm = getattr(pynvml, "NVML_CLOCK_SM", 1)
            memclk = getattr(pynvml, "NVML_CLOCK_MEM", 2)
            limit = call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
            out["gpus"].append({
                "index": i, "name": call(pynvml.nvmlDeviceGetName, h), "uuid": call(pynvml.nvmlDeviceGetUUID, h),
                "memory_total": int(mem.total) if mem is not None else None,
                "memory_used": int(mem.used) if mem is not None else None,
                "compute_capability": list(cc) if cc else None,
                "clocks_max_sm_mhz": call(pynvml.nvmlDeviceGetMaxClockInfo, h, sm),
                "clocks_max_mem_mhz": call(pynvml.nvmlDeviceGetMaxClockInfo, h, memclk),
                "clocks_sm_mhz": call(pynvml.nvmlDeviceGetClockInfo, h, sm),
                "power_limit_w": limit / 1000 if isinstance(limit, (int, float)) else None,
            })
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def smi_static() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"available": False, "reason": "nvidia-smi not found on PATH", "rows": []}
    for fields in (SMI_STATIC_FIELDS, tuple(f for f in SMI_STATIC_FIELDS if f != "compute_cap")):
        try:
            r = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return {"available": False, "reason": "nvidia-smi took more than 30 s", "rows": []}
        if r.returncode == 0:
            return {"available": True, "reason": None, "fields": list(fields), "rows": parse_smi_csv(r.stdout, fields),
                    "raw": r.stdout.strip()}
        last = (r.stdout + r.stderr).strip()
    return {"available": False, "reason": f"nvidia-smi failed: {last[-300:]}", "rows": []}


# ============================================================================ subprocesses

_current: dict[str, subprocess.Popen | None] = {"proc": None}


class Interrupted(BaseException):
    """SIGTERM/SIGINT (the outer timeout): stop, keep what was measured, write the report."""


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a child we started and everything beneath it (it leads its own session)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path | None = None,
              grace: float = 5.0) -> dict[str, Any]:
    """Run cmd in its own session with a timeout; returns returncode, stdout lines, timed_out, wall_s.
    On timeout the group gets SIGTERM, `grace` seconds, then SIGKILL."""
    t0 = time.monotonic()
    log = open(log_path, "w") if log_path else None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log or subprocess.STDOUT, text=True, env=env,
                                cwd=str(REPO), start_new_session=True)
        _current["proc"] = proc
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc, grace)
        except BaseException:          # Interrupted: the child must not outlive the measurement
            _kill_group(proc, grace=2)
            raise
        finally:
            _current["proc"] = None
        reader.join(timeout=5)
        if proc.poll() is None:
            _kill_group(proc)
        return {"returncode": proc.returncode, "timed_out": timed_out, "lines": lines,
                "wall_s": round(time.monotonic() - t0, 1)}
    finally:
        if log:
            log.close()


def parse_result_line(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


# ============================================================================ the run

@dataclass
class Options:
    out_md: Path
    quick: bool
    dry_run: bool
    budget_s: float
    case_timeout_s: float
    launch_reserve_s: float
    min_case_s: float
    steps: int
    launch_seconds: float
    assume: str | None
    results_dir: Path = Path(".")


class Budget:
    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.start = clock()
        self.total = total_s

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.total - self.elapsed()


def default_out(dry_run: bool) -> Path:
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    if dry_run:     # a dry run is not a result: keep it out of bench/results
        return Path(tempfile.gettempdir()) / "wizard-gpu-bench" / f"dryrun-cpu-{stamp}.md"
    return REPO / "bench" / "results" / f"gpu-{stamp}.md"


def write_models(shapes: dict[str, dict], root: Path) -> dict[str, str]:
    dirs = {}
    for name, cfg in shapes.items():
        if name.startswith("_"):
            continue
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        dirs[name] = str(d)
    return dirs


def gpus_from_smi(rows: list[dict]) -> list[dict]:
    """Probe-style GPU entries from nvidia-smi rows: the fallback when the probe sees no GPU
    (nvidia-ml-py missing on the machine) but nvidia-smi does."""
    out = []
    for i, r in enumerate(rows):
        mem = _num(r.get("memory.total"))
        if not r.get("name") or mem is None:
            continue
        cc = r.get("compute_cap")
        cc_pair = [int(x) for x in cc.split(".")] if cc and "." in cc else None
        out.append({"index": i, "name": r["name"], "memory_total": int(mem) * MiB, "compute_capability": cc_pair,
                    "uuid": r.get("uuid"), "nvml_index": int(_num(r.get("index")) or i)})
    return out


def gpus_from_torch(torch_cuda: dict | None) -> list[dict]:
    """Probe-style GPU entries from torch's device properties: the last fallback."""
    return [{"index": i, "name": d["name"], "memory_total": int(d["total_memory"]),
             "compute_capability": d.get("capability"), "nvml_index": i}
            for i, d in enumerate((torch_cuda or {}).get("devices") or [])]


def load_hardware(probe: dict, assume: str | None, smi_rows: list[dict] | None = None,
                  torch_cuda: dict | None = None):
    """(Hardware, where it came from): --assume, else the probe, else the probe's host with
    nvidia-smi's (or torch's) GPUs; (None, why) when there is nothing to plan for."""
    from wizard import hardware
    if assume:
        return hardware.assume(assume), f"assumed: {assume}"
    data = probe.get("hardware")
    if data and data.get("gpus"):
        return hardware.from_json(data, source="probe"), "probe"
    for name, fallback in (("nvidia-smi", gpus_from_smi(smi_rows or [])), ("torch", gpus_from_torch(torch_cuda))):
        if data and fallback:
            return (hardware.from_json({**data, "gpus": fallback}, source=f"probe+{name}"),
                    f"probe's host with {name}'s GPUs (the probe saw none: {data.get('gpu_reason')})")
    return None, probe.get("error") or (data or {}).get("gpu_reason") or "no probe"


def train_command(spec: CaseSpec, model_dir: str, steps: int, case_dir: Path, ds_config: Path | None,
                  dry_run: bool, nvml_index: int | None) -> list[str]:
    """bench/gpu/train_one.py for one case; a dry run trains a tiny model of the same kind on the CPU."""
    seq, mb = (32, min(spec.micro_batch, 2)) if dry_run else (spec.seq_len, spec.micro_batch)
    cmd = [sys.executable, str(HERE / "train_one.py"), "--model-dir", model_dir, "--seq-len", str(seq),
           "--micro-batch", str(mb), "--steps", str(steps), "--gc", "on" if spec.gc else "off",
           "--output-dir", str(case_dir / "out")]
    if ds_config is not None:
        cmd += ["--ds-config", str(ds_config)]
    if dry_run:
        cmd += ["--device", "cpu", "--tiny"]
    elif nvml_index is not None:
        cmd += ["--nvml-index", str(nvml_index)]
    return cmd


def run_case(spec: CaseSpec, number: int, planner: Planner, opts: Options, work: Path,
             nvml_index: int | None, timeout: float) -> dict[str, Any]:
    case_dir = work / f"case-{number}"
    case_dir.mkdir(parents=True, exist_ok=True)
    ds_text = planner.ds_config_text(spec)
    ds_path = None
    if ds_text:
        ds_path = case_dir / "ds_config.json"
        ds_path.write_text(ds_text)
    cmd = train_command(spec, planner.model_dirs[spec.model], opts.steps, case_dir, ds_path, opts.dry_run,
                        nvml_index)
    env = child_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "4"})
    child = run_child(cmd, env, timeout, log_path=case_dir / "stderr.log")
    keep_tail(case_dir / "stderr.log", opts.results_dir / f"case-{number}-stderr.log")
    result = parse_result_line(child["lines"])
    out: dict[str, Any] = {"wall_s": child["wall_s"], "returncode": child["returncode"]}
    if child["timed_out"] and result is None:
        out.update(status="timeout", error=f"no result within {timeout:.0f} s")
    elif result is None:
        tail = (case_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
        out.update(status="crash", error=f"exit {child['returncode']} without a result line", stderr_tail=tail)
    else:
        out.update(status=result.get("status", "error"), child=result)
        if result.get("status") == "error":
            out["error"] = result.get("error")
        if child["timed_out"]:
            out["note"] = f"the result came, then the process hung until the {timeout:.0f} s timeout"
    return out


def keep_tail(src: Path, dst: Path, lines: int = 200) -> None:
    """The end of a child's stderr, beside the results (the work dir is deleted)."""
    try:
        text = src.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return
    dst.write_text("\n".join(line for line in text[-lines:]) + "\n")


def case_record(spec: CaseSpec, pred: Prediction | None, run: dict | None, dry_run: bool) -> dict[str, Any]:
    child = (run or {}).get("child") or {}
    measured = child.get("measured_peak_bytes")
    status = (run or {}).get("status", "not run")
    rec: dict[str, Any] = {"case": dataclasses.asdict(spec), "label": spec.label()}
    if pred is not None:
        rec["prediction"] = dataclasses.asdict(pred)
        verdict, why = decide(pred.fits, status, measured, pred.usable_bytes)
        if dry_run and status in ("ok", "oom"):
            verdict, why = "unknown", "dry run: a tiny model on the CPU, nothing measured"
        rec.update(predicted_bytes=pred.per_gpu_bytes, predicted_fits=pred.fits,
                   error_pct=None if dry_run else error_pct(pred.per_gpu_bytes, measured if status == "ok" else None),
                   decision=verdict, decision_why=why)
    rec.update(status=status, measured_bytes=measured, run=run)
    return rec


def run_launch(spec: CaseSpec, planner: Planner, opts: Options, work: Path, results_dir: Path,
               nvml_index: int, timeout: float) -> dict[str, Any]:
    """`wizard launch --headless` on one case, nvidia-smi (or, in a dry run, the fake NVML) beside it."""
    run_dir = work / "launch-run"
    cfg = work / "launch_config.yaml"
    if opts.dry_run:
        cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\n"
                       "num_processes: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\n")
    else:
        cfg.write_text(planner.accelerate_yaml(spec) or "")
    script_args = ["--model-dir", planner.model_dirs[spec.model], "--steps", "100000",
                   "--max-seconds", str(opts.launch_seconds), "--gc", "on" if spec.gc else "off",
                   "--output-dir", str(work / "launch-out")]
    if opts.dry_run:
        script_args += ["--device", "cpu", "--tiny", "--seq-len", "32", "--micro-batch", "2"]
    else:
        script_args += ["--seq-len", str(spec.seq_len), "--micro-batch", str(spec.micro_batch),
                        "--nvml-index", str(nvml_index)]
    cmd = [sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg), "--run-dir",
           str(run_dir), "--metrics-interval", "1", "--grace", "5", "--status-interval", "10", "--",
           str(HERE / "train_one.py"), *script_args]
    extra = {"WIZARD_FAKE_NVML": DRY_RUN_FAKE_NVML} if opts.dry_run else {}
    env = child_env(extra)
    env.pop("RANK", None)
    ref_path = results_dir / "launch-nvidia-smi.csv"
    ref = ReferenceSampler(ref_path, fake=opts.dry_run, index=nvml_index)
    ref.start()
    try:
        # grace: the supervisor ends its workers on SIGTERM (its own --grace 5) before it exits
        child = run_child(cmd, env, timeout, log_path=results_dir / "launch-stderr.log", grace=15.0)
    finally:
        ref.stop()
    out: dict[str, Any] = {"case": spec.label(), "returncode": child["returncode"], "timed_out": child["timed_out"],
                           "wall_s": child["wall_s"], "reference": ref.description, "reference_error": ref.error,
                           "reference_fields": list(ref.fields),
                           "stdout_tail": [line.rstrip() for line in child["lines"][-15:]]}
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        shutil.copy(metrics, results_dir / "launch-metrics.jsonl")
    try:
        state = json.loads((run_dir / "run.json").read_text())
        out["run_status"] = state.get("status")
        out["run_exit_code"] = state.get("exit_code")
    except (OSError, ValueError):
        out["run_status"] = None
    result = parse_result_line(child["lines"])
    if result is None:
        log = run_dir / "logs" / "attempt-1" / "rank-0.log"
        if log.exists():
            result = parse_result_line(log.read_text(errors="replace").splitlines())
    out["train"] = result
    reference = parse_smi_samples(ref_path.read_text(), ref.fields) if ref_path.exists() else []
    measured = load_metrics_jsonl(metrics, nvml_index)
    pairs = align(reference, measured)
    diffs = metric_diffs(pairs)
    out.update(reference_samples=len(reference), metrics_samples=len(measured), diffs=diffs,
               verdict=metrics_verdict(diffs), thresholds=METRIC_THRESHOLDS)
    return out


class ReferenceSampler:
    """nvidia-smi -lms 1000 in the background (its CSV straight to a file). In a dry run there is no
    nvidia-smi: a thread writes the same CSV from the fake NVML, so the parsing and alignment are
    exercised, and the report says the reference was fake."""

    def __init__(self, path: Path, fake: bool, index: int):
        self.path = path
        self.fake = fake
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.file = None
        self.fields: tuple[str, ...] = SMI_SAMPLE_FIELDS
        self.description = "fake NVML sampled by the driver (dry run: no nvidia-smi)" if fake else None

    def _accepted_fields(self, exe: str) -> tuple[str, ...]:
        """The sample fields plus the optional power readings when this nvidia-smi knows them."""
        wanted = SMI_SAMPLE_FIELDS + SMI_OPTIONAL_SAMPLE_FIELDS
        try:
            r = subprocess.run([exe, f"--query-gpu={','.join(wanted)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and parse_smi_csv(r.stdout, wanted):
                return wanted
        except subprocess.TimeoutExpired:
            pass
        return SMI_SAMPLE_FIELDS

    def start(self) -> None:
        self.file = open(self.path, "w")
        if self.fake:
            self.thread = threading.Thread(target=self._fake_loop, daemon=True)
            self.thread.start()
            return
        exe = shutil.which("nvidia-smi")
        if not exe:
            self.error = "nvidia-smi not found"
            self.description = "none"
            return
        self.fields = self._accepted_fields(exe)
        cmd = [exe, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits", "-lms", "1000"]
        self.description = " ".join(cmd[1:])
        stdbuf = shutil.which("stdbuf")      # line-buffered into the file, so a stop loses no sample
        self.proc = subprocess.Popen(([stdbuf, "-oL"] if stdbuf else []) + cmd, stdout=self.file,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def _fake_loop(self) -> None:
        from wizard.fake_nvml import fake_from_spec
        api = fake_from_spec(DRY_RUN_FAKE_NVML)
        while not self.stop_event.is_set():
            now = dt.datetime.now()
            for s in api.sample():
                stamp = now.strftime("%Y/%m/%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"
                self.file.write(f"{stamp}, {s.index}, {s.util}, {s.mem_used // MiB}, {s.power_w:.2f}\n")
                self.file.flush()
            self.stop_event.wait(1.0)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(timeout=3)
        if self.proc:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)     # nvidia-smi's own clean stop (flushes)
                self.proc.wait(timeout=3)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
            _kill_group(self.proc, grace=2)
        if self.file:
            self.file.close()


# ============================================================================ report

def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GiB:.1f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def summarize(cases: list[dict]) -> dict[str, Any]:
    decided = [c for c in cases if c.get("decision") in ("right", "wrong")]
    fitting = [c for c in cases if c.get("predicted_fits") and c.get("error_pct") is not None]
    within = [c for c in fitting if abs(c["error_pct"]) <= ERROR_TARGET_PCT]
    measured = sum(1 for c in cases if c.get("status") == "oom" or
                   (c.get("status") == "ok" and c.get("measured_bytes") is not None))
    return {"cases": len(cases), "measured": measured,
            "decisions_right": sum(1 for c in decided if c["decision"] == "right"),
            "decisions_wrong": sum(1 for c in decided if c["decision"] == "wrong"),
            "fitting_with_error": len(fitting), "within_target": len(within),
            "max_abs_error_pct": max((abs(c["error_pct"]) for c in fitting), default=None)}


CASE_COLUMNS = ("#", "role", "configuration", "predicted GiB", "wizard: fits?", "% of usable", "measured GiB",
                "error %", "outcome", "fit decision", "non-torch GiB", "NVML process peak GiB", "note")


def render_markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [f"# GPU ground truth ({meta['mode']}), {meta['date']}", ""]
    lines.append(f"Machine: {meta.get('gpu') or 'no GPU'}; host {meta['host']}; "
                 f"budget {meta['budget_s']:.0f} s, used {meta.get('elapsed_s', 0):.0f} s; "
                 f"planned against: {meta.get('hardware_source')}.")
    env = report.get("environment") or {}
    libs = env.get("libraries") or {}
    lines.append("Libraries: " + ", ".join(f"{k} {v.get('version') or 'MISSING'}" for k, v in libs.items()) + ".")
    if env.get("missing"):
        lines.append(f"**Missing: {', '.join(env['missing'])}** (the parts that need them were skipped).")
    lines += ["", "## Memory: prediction vs measurement", ""]
    lines.append("Predicted = the wizard's per-GPU estimate for the forced rung (pipeline.build). Measured = "
                 "torch.cuda.max_memory_reserved + the memory NVML shows for the process beyond torch's "
                 "reserved pool (CUDA context, NCCL buffers), taken at the end of the run. NVML process peak = "
                 "the highest per-process memory NVML showed, sampled every 20 ms (a cross-check). "
                 "Error = (predicted - measured) / measured. "
                 f"Target: every fit decision right, |error| <= {ERROR_TARGET_PCT:g}% where it fits.")
    lines += ["", "| " + " | ".join(CASE_COLUMNS) + " |", "|" + "---|" * len(CASE_COLUMNS)]
    for i, c in enumerate(report.get("cases") or [], 1):
        p = c.get("prediction") or {}
        run = c.get("run") or {}
        child = run.get("child") or {}
        ratio = p["per_gpu_bytes"] / p["usable_bytes"] * 100 if p.get("usable_bytes") else None
        note = run.get("error") or c["case"].get("why") or ""
        cells = [str(i), c["case"]["role"], c["label"], _gib(p.get("per_gpu_bytes")),
                 "—" if not p else ("yes" if p.get("fits") else "no"), "—" if ratio is None else f"{ratio:.1f}",
                 _gib(c.get("measured_bytes")), _pct(c.get("error_pct")), c.get("status", "—"),
                 f"{c.get('decision', '—')}", _gib(child.get("non_torch_bytes")), _gib(child.get("max_process_used")),
                 note.replace("|", "/")[:160]]
        lines.append("| " + " | ".join(cells) + " |")
    s = report.get("summary") or {}
    if s:
        worst = "—" if s["max_abs_error_pct"] is None else f"{s['max_abs_error_pct']:.1f}%"
        lines += ["", f"Summary: {s['measured']}/{s['cases']} measured; fit decisions right {s['decisions_right']}, "
                      f"wrong {s['decisions_wrong']}; within ±{ERROR_TARGET_PCT:g}%: {s['within_target']}/"
                      f"{s['fitting_with_error']} fitting cases (max |error| {worst})."]
    for note in report.get("selection_notes") or []:
        lines.append(f"- {note}")
    for note in report.get("skipped") or []:
        lines.append(f"- skipped: {note}")

    lines += ["", "## Probe vs pynvml vs nvidia-smi", ""]
    probe = report.get("probe") or {}
    if probe.get("error"):
        lines.append(f"wizard probe: **{probe['error']}**")
    nv = report.get("nvml") or {}
    if not nv.get("available"):
        lines.append(f"pynvml: not available ({nv.get('reason')})")
    else:
        lines.append(f"pynvml: driver {nv.get('driver_version')}, CUDA driver API {nv.get('cuda_driver_version')}.")
        for g in nv.get("gpus") or []:
            lines.append(f"- GPU {g['index']} {g.get('name')}: {_gib(g.get('memory_total'))} GiB "
                         f"({_gib(g.get('memory_used'))} GiB used before the runs), compute capability "
                         f"{_cc_text(g.get('compute_capability'))}, SM clock {g.get('clocks_sm_mhz')} MHz now / "
                         f"{g.get('clocks_max_sm_mhz')} max, memory clock max {g.get('clocks_max_mem_mhz')} MHz, "
                         f"power limit {g.get('power_limit_w')} W")
    smi = report.get("nvidia_smi") or {}
    if not smi.get("available"):
        lines.append(f"nvidia-smi: not available ({smi.get('reason')})")
    rows = report.get("probe_comparison") or []
    if rows:
        lines += ["", "| GPU | field | wizard probe | pynvml | nvidia-smi | agree |", "|---|---|---|---|---|---|"]
        for r in rows:
            ok = {True: "yes", False: "**MISMATCH**", None: "—"}[r["ok"]]
            cells = ["—" if r[k] is None else str(r[k]) for k in ("probe", "pynvml", "nvidia_smi")]
            lines.append(f"| {r['gpu']} | {r['field']} | " + " | ".join(cells) + f" | {ok} |")

    lines += ["", "## Launch: metrics.jsonl vs nvidia-smi", ""]
    la = report.get("launch")
    if not la:
        lines.append("not run" + (f": {report.get('launch_skipped')}" if report.get("launch_skipped") else ""))
    else:
        d = la.get("diffs") or {}
        v = la.get("verdict") or {}
        t = la.get("thresholds") or {}

        def cell(key, unit):
            value = d.get(key)
            return "—" if value is None else f"{value:.2f}{unit}"

        def ok(key):
            return {True: "yes", False: "**NO**", None: "—"}[v.get(key)]
        lines.append(f"`wizard launch --headless` on {la['case']}: exit {la.get('returncode')}, run status "
                     f"{la.get('run_status')}, {la.get('wall_s')} s; reference: {la.get('reference')}"
                     + (f" ({la['reference_error']})" if la.get("reference_error") else "") + ".")
        lines.append(f"Samples: {la.get('reference_samples')} reference, {la.get('metrics_samples')} in metrics.jsonl, "
                     f"{d.get('pairs', 0)} aligned (mean |dt| {cell('mean_dt_s', ' s')}).")
        lines += ["", "| metric | mean abs difference | threshold | within |", "|---|---|---|---|",
                  f"| utilisation | {cell('util_pp', ' pp')} | {t.get('util_pp')} pp | {ok('util_pp')} |",
                  f"| memory used | {cell('mem_mib', ' MiB')} ({cell('mem_pct', '%')}) | {t.get('mem_pct')}% | {ok('mem_pct')} |",
                  f"| power | {cell('power_w', ' W')} ({cell('power_pct', '%')}) | {t.get('power_pct')}% | {ok('power_pct')} |"]
        for key, name in (("power_instant_pct", "power.draw.instant"), ("power_average_pct", "power.draw.average")):
            if d.get(key) is not None:
                lines.append(f"| power vs {name} | ({cell(key, '%')}) | for information | — |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, md_path: Path) -> None:
    md_path.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((md_path, render_markdown(report)),
                       (md_path.with_suffix(".json"), json.dumps(report, indent=1, default=str) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


# ============================================================================ main

def parse_args(argv=None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="markdown output (JSON twin beside it); default "
                   "bench/results/gpu-<date>.md, or a temp file for --dry-run-cpu")
    p.add_argument("--quick", action="store_true", help="2 steps, a shorter launch; dry run: one training per backend")
    p.add_argument("--dry-run-cpu", action="store_true", help="everything a CPU can do (see the module doc)")
    p.add_argument("--budget-s", type=float, default=450.0, help="stop starting new work after this (default 450)")
    p.add_argument("--case-timeout-s", type=float, default=None, help="per configuration (default 120; 60 dry run)")
    p.add_argument("--assume", default=None, help=f"plan for this hardware instead of the probe's "
                   f"(dry run default: {DRY_RUN_ASSUME})")
    a = p.parse_args(argv)
    dry = bool(a.dry_run_cpu)
    return Options(
        out_md=Path(a.out) if a.out else default_out(dry), quick=bool(a.quick), dry_run=dry,
        budget_s=float(a.budget_s),
        case_timeout_s=float(a.case_timeout_s or (60.0 if dry else 120.0)),
        launch_reserve_s=50.0 if a.quick else 75.0, min_case_s=20.0 if dry else 30.0,
        steps=2 if a.quick else 3, launch_seconds=(6.0 if dry else 12.0) if a.quick else 25.0,
        assume=a.assume or (DRY_RUN_ASSUME if dry else None))


def main(argv=None) -> int:
    opts = parse_args(argv)
    budget = Budget(opts.budget_s)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    results_dir = opts.out_md.parent / (opts.out_md.stem + "-files")
    results_dir.mkdir(parents=True, exist_ok=True)
    opts.results_dir = results_dir
    report: dict[str, Any] = {"meta": {"mode": "dry run on the CPU" if opts.dry_run else "GPU",
                                       "date": dt.datetime.now().isoformat(timespec="seconds"),
                                       "host": socket.gethostname(), "budget_s": opts.budget_s, "quick": opts.quick,
                                       "steps": opts.steps, "argv": sys.argv[1:]},
                              "cases": [], "skipped": []}

    def save() -> None:
        report["meta"]["elapsed_s"] = round(budget.elapsed(), 1)
        report["summary"] = summarize(report["cases"])
        write_report(report, opts.out_md)

    code = 0
    work = Path(tempfile.mkdtemp(prefix="wizard-gpu-bench-"))
    try:
        report["environment"] = environment(opts.dry_run)
        print(f"[measure] environment: missing {report['environment']['missing'] or 'nothing'}", flush=True)
        save()
        # 1. probe
        probe_env = child_env({"WIZARD_FAKE_NVML": DRY_RUN_FAKE_NVML} if opts.dry_run else {})
        report["probe"] = run_probe(probe_env)
        report["nvml"] = nvml_direct()
        report["nvidia_smi"] = smi_static()
        report["probe_comparison"] = compare_probe((report["probe"] or {}).get("hardware"), report["nvml"],
                                                   report["nvidia_smi"]["rows"])
        gpus = ((report["probe"] or {}).get("hardware") or {}).get("gpus") or \
            gpus_from_smi(report["nvidia_smi"]["rows"])
        report["meta"]["gpu"] = ", ".join(f"{g['name']} {g['memory_total'] / GiB:.1f} GiB" for g in gpus) or None
        mismatches = [r for r in report["probe_comparison"] if r["ok"] is False]
        print(f"[measure] probe: {report['meta']['gpu']}; {len(mismatches)} mismatch(es)", flush=True)
        save()

        # 2. plan and select
        libs = report["environment"]["libraries"]
        if not (libs["torch"]["importable"] and libs["transformers"]["importable"]):
            report["skipped"].append("memory cases and launch: torch/transformers missing (the model is sized "
                                     "with them and trained with them)")
            save()
            return 2
        hw, source = load_hardware(report["probe"], opts.assume, report["nvidia_smi"]["rows"],
                                   report["environment"].get("torch_cuda"))
        report["meta"]["hardware_source"] = source if hw is not None else "nothing"
        if hw is None or not hw.gpus:
            report["skipped"].append(f"memory cases and launch: no GPU to plan for ({source}; "
                                     f"{(hw.gpu_reason if hw else '')})")
            save()
            return 2
        if not opts.dry_run and report["environment"]["missing"]:
            report["skipped"].append("measurements: missing " + ", ".join(report["environment"]["missing"]))
        cfg = json.loads((HERE / "cases.json").read_text())
        shapes = json.loads((HERE / "models.json").read_text())
        model_dirs = write_models(shapes, work / "models")
        planner = Planner(hw, model_dirs)
        t0 = time.monotonic()
        selection = select_cases(cfg, list(model_dirs), planner.predict, planner.recommend)
        report["selection_notes"] = selection.notes
        report["meta"]["selection_s"] = round(time.monotonic() - t0, 1)
        report["meta"]["params"] = {m: planner.params(m) for m in model_dirs}
        torch_mod = sys.modules.get("torch")
        # Sizing builds models on the meta device: this process must hold no CUDA context.
        report["meta"]["driver_cuda_initialized"] = bool(torch_mod and torch_mod.cuda.is_initialized())
        preds = {s.key(): planner.predict(s) for s in selection.cases}
        report["cases"] = [case_record(s, preds[s.key()], None, opts.dry_run) for s in selection.cases]
        print(f"[measure] {len(selection.cases)} cases selected in {report['meta']['selection_s']} s", flush=True)
        save()

        missing = report["environment"]["missing"]
        nvml_index = next((g.get("nvml_index") for g in gpus if g.get("nvml_index") is not None), 0)
        launch_spec = _spec_from_json(cfg["launch"])
        trained_backends: set[str] = set()
        for i, spec in enumerate(selection.cases):
            left = budget.left() - opts.launch_reserve_s
            why_skip = None
            blockers = [] if opts.dry_run else blocking(missing, spec.backend)
            if blockers:
                why_skip = "missing " + ", ".join(blockers)
            elif opts.dry_run and opts.quick and spec.backend in trained_backends:
                why_skip = "--quick dry run: one tiny training per backend"
            elif left < opts.min_case_s:
                why_skip = f"time budget: {max(left, 0):.0f} s left before the launch reserve"
            if why_skip:
                report["cases"][i]["status"] = "skipped"
                report["cases"][i]["run"] = {"status": "skipped", "error": why_skip}
                report["cases"][i].update(decision="unknown", decision_why=why_skip)
                save()
                continue
            timeout = min(opts.case_timeout_s, left)
            print(f"[measure] case {i + 1}/{len(selection.cases)} {spec.role}: {spec.label()} "
                  f"(timeout {timeout:.0f} s)", flush=True)
            run = run_case(spec, i + 1, planner, opts, work, nvml_index, timeout)
            trained_backends.add(spec.backend)
            report["cases"][i] = case_record(spec, preds[spec.key()], run, opts.dry_run)
            c = report["cases"][i]
            print(f"[measure]   -> {c['status']} measured {_gib(c['measured_bytes'])} GiB predicted "
                  f"{_gib(c.get('predicted_bytes'))} GiB decision {c.get('decision')} ({run['wall_s']} s)", flush=True)
            save()

        # 3. launch
        left = budget.left()
        blockers = [] if opts.dry_run else blocking(missing, "launch")
        if blockers:
            report["launch_skipped"] = "missing " + ", ".join(blockers)
        elif left < 25:
            report["launch_skipped"] = f"time budget: {left:.0f} s left"
        else:
            print(f"[measure] launch: {launch_spec.label()}", flush=True)
            report["launch"] = run_launch(launch_spec, planner, opts, work, results_dir, nvml_index,
                                          timeout=max(20.0, min(left - 5, opts.launch_seconds + 90)))
        save()
    except Interrupted as exc:
        report["skipped"].append(f"interrupted by {exc} after {budget.elapsed():.0f} s: the rest was not run")
        for c in report["cases"]:
            if c.get("status") == "not run":
                c.update(status="skipped", decision="unknown", decision_why="interrupted",
                         run={"status": "skipped", "error": f"interrupted by {exc}"})
        code = 124
    except Exception as exc:    # a bug must not cost the figures already measured: they are saved below
        report["skipped"].append(f"measure.py failed after {budget.elapsed():.0f} s: {type(exc).__name__}: {exc}")
        report["traceback"] = traceback.format_exc().splitlines()[-20:]
        print("".join(traceback.format_exc()), file=sys.stderr, flush=True)
        code = 1
    finally:
        proc = _current.get("proc")
        if proc is not None:
            _kill_group(proc)
        save()
        shutil.rmtree(work, ignore_errors=True)
        print(f"[measure] wrote {opts.out_md} and {opts.out_md.with_suffix('.json')}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
