"""Which configurations are measured and what the wizard predicts for each: the coverage cases of
cases.json, the smallest-headroom and predicted-OOM cases picked from the planner's numbers, and the
model shapes of models.json written as config.json files."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

BACKENDS = ("single", "zero2", "zero3")


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
        from wizard.planning.plan import rung_by_key
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
        from wizard.config import emit
        from wizard.planning.plan import rung_by_key
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

    launch_key = spec_from_json(cfg["launch"]).key() if cfg.get("launch") else None
    coverage = [spec_from_json(c) for c in cfg["coverage"]]
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


def spec_from_json(d: dict) -> CaseSpec:
    return CaseSpec(model=d["model"], backend=d["backend"], seq_len=int(d["seq_len"]),
                    micro_batch=int(d["micro_batch"]), gc=bool(d["gc"]), role=d.get("role", "coverage"),
                    why=d.get("why", ""))


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
