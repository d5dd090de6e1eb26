"""Which configurations are measured and what the wizard predicts for each: the coverage cases of
cases.json, the smallest-headroom and predicted-OOM cases picked from the planner's numbers, and the
model shapes of models.json written as config.json files."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

# The rungs the bench measures (wizard.planning.rungs keys), one process each. v1: single, zero2, zero3;
# v2 (issue 28) adds the offload rungs and FSDP2.
BACKENDS = ("single", "zero2", "zero3", "zero2-offload-opt", "zero3-offload-all", "fsdp-reshard")
METHODS = ("full", "lora", "qlora")
# The adapters of the LoRA / QLoRA cases: the tune rows' (shared/gpu/2026-12-04), the wizard's defaults but
# all-linear spelt out (peft's shorthand, what the user's train_real.py passed).
LORA_ANSWERS = {"lora_rank": "16", "lora_alpha": "32", "lora_targets": "all-linear"}


def is_deepspeed(backend: str) -> bool:
    return backend.startswith("zero")


def is_fsdp(backend: str) -> bool:
    return backend.startswith("fsdp")


@dataclass
class CaseSpec:
    model: str
    backend: str                      # a BACKENDS rung key (one process each)
    seq_len: int
    micro_batch: int
    gc: bool
    role: str = "coverage"            # coverage | v2 | smallest-headroom | predicted-oom | alst
    why: str = ""
    method: str = "full"              # full | lora | qlora
    alst: str = ""                    # ALST series (measure.py --alst): "none" or techniques joined by "+" (alst.py)

    def key(self) -> tuple:
        key = (self.model, self.backend, self.seq_len, self.micro_batch, self.gc, self.method)
        return key + (self.alst,) if self.alst else key

    def label(self) -> str:
        method = "" if self.method == "full" else f" {self.method}"
        alst = f" ALST {self.alst}" if self.alst else ""
        return (f"{self.model}{method} {self.backend} s{self.seq_len} b{self.micro_batch} "
                f"GC {'on' if self.gc else 'off'}{alst}")

    @property
    def kind(self) -> str:
        """What a --quick dry run trains once: the method, the rung and the ALST techniques (a tiny model behaves
        alike in each)."""
        kind = self.backend if self.method == "full" else f"{self.method} {self.backend}"
        return f"{kind} alst:{self.alst}" if self.alst else kind


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
    step_seconds: float | None = None     # the rung's predicted optimizer step (speed.step_seconds), raw model
    load_bytes: int = 0                   # per GPU while loading, where that is its own peak (QLoRA sharded)

    @property
    def ratio(self) -> float:
        """Predicted peak / usable memory: above 1 it does not fit, near 1 the headroom is small."""
        return self.per_gpu_bytes / max(self.usable_bytes, 1)


def rung_key(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    return backend


def given_for(model_dir: str, backend: str | None, seq_len: int, micro_batch: int, gc: bool | None,
              method: str = "full", num_processes: int = 1) -> dict:
    """The answers that force one configuration (None: let the wizard choose, as a user would). A rung's
    answers are the rung table's own flags (wizard.planning.rungs: --backend/--zero-stage/--offload)."""
    from wizard.planning.rungs import RUNGS
    if method not in METHODS:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    given: dict[str, Any] = {"model": model_dir, "seq_len": seq_len, "micro_batch": micro_batch,
                             "precision": "bf16", "attention": "sdpa", "num_processes": num_processes,
                             "gradient_checkpointing": "auto" if gc is None else ("on" if gc else "off")}
    if method != "full":
        given.update(method=method, **LORA_ANSWERS)
    if backend is None:
        given.update(backend="auto", zero_stage="auto", offload="auto")
        return given
    spec = next(r for r in RUNGS if r.key == rung_key(backend))
    given.update({k: v for k, v in spec.flags().items() if v is not None})
    if spec.backend == "fsdp":           # the rung's resharding, else the files keep the plan's own choice's
        given.update(fsdp_version="2", fsdp_reshard_after_forward="yes" if spec.fsdp_reshard else "no")
    return given


def prediction_from_rung(rung, plan) -> Prediction:
    return Prediction(rung=rung.key, fits=bool(rung.fits), per_gpu_bytes=int(rung.per_gpu_bytes),
                      usable_bytes=int(plan.usable_bytes), capacity_bytes=int(plan.gpu_capacity_bytes),
                      gc=bool(rung.gradient_checkpointing), breakdown=dict(rung.breakdown), reason=rung.reason,
                      offload=rung.offload_optimizer != "none" or rung.offload_param != "none",
                      step_seconds=float(rung.speed.step_seconds) if rung.speed else None,
                      load_bytes=int(rung.load_bytes or 0))


class Planner:
    """The wizard's real pipeline, one model directory per shape, hardware fixed (probe or assumed)."""

    def __init__(self, hw, model_dirs: dict[str, str]):
        self.hw = hw
        self.model_dirs = model_dirs
        self._cache: dict[tuple, Any] = {}

    def build(self, model: str, backend: str | None, seq_len: int, micro_batch: int, gc: bool | None,
              method: str = "full", num_processes: int = 1, hw=None):
        from wizard import pipeline
        key = (model, backend, seq_len, micro_batch, gc, method, num_processes, id(hw))
        if key not in self._cache:
            given = given_for(self.model_dirs[model], backend, seq_len, micro_batch, gc, method, num_processes)
            self._cache[key] = pipeline.build(pipeline.Request(given=given), hw=hw or self.hw)
        return self._cache[key]

    def _build_spec(self, spec: CaseSpec):
        return self.build(spec.model, spec.backend, spec.seq_len, spec.micro_batch, spec.gc, spec.method)

    def predict(self, spec: CaseSpec) -> Prediction:
        from wizard.planning.plan import rung_by_key
        result = self._build_spec(spec)
        rung = rung_by_key(result.plan, rung_key(spec.backend))
        if rung is None:
            raise RuntimeError(f"the plan for {spec.label()} has no {spec.backend} rung")
        return prediction_from_rung(rung, result.plan)

    def forced_plan(self, spec: CaseSpec):
        """(result, plan with the case's rung as its choice): what the files for that rung are written from."""
        from wizard.planning.plan import rung_by_key
        result = self._build_spec(spec)
        return result, dataclasses.replace(result.plan, choice=rung_by_key(result.plan, rung_key(spec.backend)))

    def adapter_setup(self, spec: CaseSpec) -> dict | None:
        """What the wizard tells a LoRA / QLoRA user to pass for this rung (wizard.frontends.snippets): peft's
        LoraConfig, transformers' BitsAndBytesConfig (dtypes by name) and whether to call peft's
        prepare_model_for_kbit_training; train_one.py runs exactly that. None for a full fine-tune."""
        if spec.method == "full":
            return None
        from wizard.frontends import snippets
        result, plan = self.forced_plan(spec)
        return {"lora": snippets.lora_config_kwargs(result.answers, result.model, plan),
                "bnb": snippets.bnb_config_kwargs(result.answers, plan) if spec.method == "qlora" else None,
                "kbit_prepared": bool(snippets.kbit_prepared(plan)) if spec.method == "qlora" else False}

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
        if not is_deepspeed(spec.backend):
            return None
        from wizard.config import emit
        result, plan = self.forced_plan(spec)
        return emit.render_json(emit.deepspeed_config(result.answers, plan, result.model))

    def accelerate_yaml(self, spec: CaseSpec) -> str:
        """The default_config.yaml the wizard writes for this rung (DeepSpeed's JSON beside it as ds_path)."""
        from wizard.config import emit
        result, plan = self.forced_plan(spec)
        ds_path = result.ds_path if is_deepspeed(spec.backend) else None
        return emit.render_yaml(emit.accelerate_config(result.answers, plan, ds_path, result.model))

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
    """The v2 cases and the coverage cases from cases.json, plus the smallest-headroom and the predicted-OOM case.

    Order (what runs if time runs short): the v2 cases first (the rungs no GPU has measured yet), then the two
    selected cases, then the launch case, then the rest of the coverage (measured on 2026-12-04). A selected
    case equal to a coverage case takes its place.
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

    launch_key = spec_from_json(cfg["launch"]).key() if cfg.get("launch") else None
    coverage = [spec_from_json(c) for c in cfg["coverage"]]
    coverage.sort(key=lambda s: 0 if s.key() == launch_key else 1)
    v2 = [dataclasses.replace(spec_from_json(c), role="v2") for c in cfg.get("v2", [])]
    chosen = {s.key() for s in selected}
    cases = [s for s in v2 if s.key() not in chosen] + list(selected)
    chosen |= {s.key() for s in v2}
    for spec in coverage:
        if spec.key() in chosen:
            notes.append(f"coverage case {spec.label()} is also the {next(s.role for s in selected if s.key() == spec.key())} case")
            continue
        cases.append(spec)
        chosen.add(spec.key())
    return Selection(cases, headroom_candidates, oom_candidates, notes)


def spec_from_json(d: dict) -> CaseSpec:
    return CaseSpec(model=d["model"], backend=rung_key(d["backend"]), seq_len=int(d["seq_len"]),
                    micro_batch=int(d["micro_batch"]), gc=bool(d["gc"]), role=d.get("role", "coverage"),
                    why=d.get("why", ""), method=d.get("method", "full"), alst=d.get("alst", ""))


def alst_cases(cfg: dict) -> list[CaseSpec]:
    """cases.json's ALST series (measure.py --alst), in order: the baseline first, then one technique added at a time.
    Each is predicted by its rung as the plan sizes it today (full logits, untiled MLP, checkpoints on the GPU)."""
    from bench.gpu import alst
    cases = [dataclasses.replace(spec_from_json(c), role="alst") for c in cfg.get("alst", [])]
    for spec in cases:
        alst.parse("" if spec.alst == "none" else spec.alst)      # a typo in cases.json fails here, not on the GPU
        if not spec.alst:
            raise ValueError(f"ALST case {spec.label()}: 'alst' is 'none' or techniques joined by '+'")
    return cases


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
