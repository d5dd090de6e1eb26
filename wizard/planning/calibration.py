"""Measured-to-predicted ratios from `wizard tune`, kept per machine and used by later plans.

One file, <cache>/calibration.json ($WIZARD_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/wizard), keyed by
the machine (GPU model and how many of them the processes use, or "cpu" and the process count) and the
strategy class (the rung key and the fine-tuning method). Each entry holds the geometric mean of the trials'
ratios (measured tokens/s over predicted, measured peak memory over predicted), how many trials made it, when,
and the model the last one ran: a plan of another model applies the ratio as it is and says whose it is. The
ratios are always against the raw model, never against an already calibrated figure (tune predicts with Rung.uncalibrated()).

Only a plan for the machine the wizard runs on (a probe, not --assume or --hardware) is calibrated:
wizard.pipeline.plan_from_answers loads this machine's `Calibration` and gives it to make_plan, which applies
it where each rung's speed and per-GPU memory are computed, before fit and choice (plan._speed, plan._estimate),
so the choice, the tie rule, the batch split, the alternatives and what_would_fit all see calibrated figures.
Speed ratios apply both ways. A memory ratio applies only when it raises the estimate: a lower peak measured
at one micro-batch (on a CPU, the whole process's RSS) must never make a larger one "fit" and then run out of
memory. A trial that ran out of that memory leaves a floor on its rung's memory ratio (capacity / predicted:
the peak was at least the whole of it), kept as "memory_floor" so later, lower ratios never average it away.
A file that cannot be read, has another format, or an entry older than STALE_DAYS is ignored with a note.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.units import is_network_gbps

FORMAT = 1
STALE_DAYS = 90
FILE = "calibration.json"


def calibration_file() -> Path:
    if os.environ.get("WIZARD_CALIBRATION_FILE"):      # tests point it away from the user's measurements
        return Path(os.environ["WIZARD_CALIBRATION_FILE"]).expanduser()
    root = os.environ.get("WIZARD_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "wizard")
    return Path(root).expanduser() / FILE


def machine_key(hw, topology) -> str:
    """'2xNVIDIA H100 80GB HBM3' (the GPUs a plan uses on this machine, one per process) or 'cpu:2' (CPU
    processes). The count is the processes', not the machine's GPUs: a ratio measured on 2 of 8 GPUs (less
    communication, another per-GPU share) says nothing about a run on all 8. On the whole machine both agree."""
    gpus = list(getattr(hw, "gpus", None) or [])
    n = int(getattr(topology, "processes_per_machine", 1) or 1)
    if getattr(topology, "cpu", False) or not gpus:
        return f"cpu:{n}"
    names = sorted({str(getattr(g, "name", "gpu")) for g in gpus})
    return f"{n}x{'+'.join(names)}"


def strategy_key(rung_key: str, method: str = "full") -> str:
    return f"{rung_key}/{method or 'full'}"


def load(path: Path | None = None) -> tuple[dict[str, Any], str | None]:
    """(machines -> strategies -> entry, a note when the file was there but is not used)."""
    path = path or calibration_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"Calibration file {path} is unreadable ({exc.strerror or exc}); ignored."
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("machines"), dict):
            raise ValueError("not a calibration file of this wizard")
    except ValueError as exc:
        return {}, f"Calibration file {path} is unreadable ({exc}); ignored."
    return doc["machines"], None


# A clock a day ahead of the one that wrote the entry is still this machine's; a date further on is no date.
FUTURE_SLACK_S = 86400.0


def _parse(entry: Any, now: float) -> tuple[float | None, float | None, int, float] | None:
    """(speed ratio, memory ratio, trials, updated) of a file entry; None when it cannot be read: not an object,
    neither ratio a positive number, a ratio that is there but no number, a trial count or date that is none
    (a date past now, or not finite, has no calendar day and would make the entry fresh for ever)."""
    if not isinstance(entry, dict):
        return None
    speed, memory = _ratio(entry.get("speed_ratio")), _ratio(entry.get("memory_ratio"))
    if (speed is None and memory is None) or any(entry.get(k) is not None and r is None for k, r in
                                                 (("speed_ratio", speed), ("memory_ratio", memory))):
        return None
    try:
        updated, trials = float(entry.get("updated", 0)), int(entry.get("trials", 0))
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(updated) and 0 <= updated <= now + FUTURE_SLACK_S) or trials < 0:
        return None
    return speed, memory, trials, updated


def date_of(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


@dataclass(frozen=True)
class Ratios:
    """One strategy class's ratios on this machine: measured / predicted by the raw model (None: not measured)."""

    speed: float | None
    memory: float | None
    trials: int
    updated: float
    out_of_memory: bool = False            # the memory ratio is a trial's out-of-memory floor (capacity / predicted)
    model: str | None = None               # the model the last trial ran (a ratio is carried to other models)

    @property
    def measured_for(self) -> str:
        """"for sshleifer/tiny-gpt2 on 2026-12-05": what the ratio was measured on (an entry written before the
        model was recorded: the date alone)."""
        return (f"for {self.model} " if self.model else "") + f"on {date_of(self.updated)}"

    @property
    def memory_applied(self) -> float:
        """The factor the per-GPU estimate is multiplied by: the memory ratio only where it raises it."""
        return self.memory if self.memory is not None and self.memory > 1 else 1.0


@dataclass(frozen=True)
class Calibration:
    """This machine's entries, as make_plan takes them (wizard.planning.plan applies them)."""

    machine: str                                              # machine_key of the machine it was loaded for
    entries: dict[str, Ratios] = field(default_factory=dict)  # strategy_key -> fresh ratios
    stale: frozenset[str] = frozenset()                       # strategy keys older than STALE_DAYS
    problem: str | None = None                                # the file (or an entry of it) is unreadable: why
    network: "Network | None" = None                          # the network `wizard preflight --record` measured

    def ratios(self, rung_key: str, method: str = "full") -> Ratios | None:
        return self.entries.get(strategy_key(rung_key, method))

    def is_stale(self, rung_key: str, method: str = "full") -> bool:
        return strategy_key(rung_key, method) in self.stale


def _ratio(value: Any) -> float | None:
    try:
        r = float(value)
    except (TypeError, ValueError):
        return None
    return r if math.isfinite(r) and r > 0 else None


def for_machine(hw, topology, path: Path | None = None, now: float | None = None) -> Calibration:
    """The calibration file's entries for this machine (hw as probed, the plan's topology)."""
    key = machine_key(hw, topology)
    machines, problem = load(path)
    if problem:
        return Calibration(key, problem=problem)
    now = time.time() if now is None else now
    entries: dict[str, Ratios] = {}
    stale: set[str] = set()
    unreadable: list[str] = []
    raw = machines.get(key)
    if raw is not None and not isinstance(raw, dict):
        raw, unreadable = {}, [key]
    for name, entry in (raw or {}).items():
        parsed = _parse(entry, now)
        if parsed is None:
            unreadable.append(f"{key} {name}")
            continue
        speed, memory, trials, updated = parsed
        if now - updated > STALE_DAYS * 86400:
            stale.add(name)
            continue
        floor = _ratio(entry.get("memory_floor"))
        model = entry.get("model")
        entries[name] = Ratios(speed, memory, trials, updated,
                               out_of_memory=floor is not None and memory is not None and memory <= floor,
                               model=model if isinstance(model, str) and model else None)
    problem = None
    if unreadable:
        problem = (f"Calibration file {path or calibration_file()}: {len(unreadable)} unreadable "
                   f"entr{'y' if len(unreadable) == 1 else 'ies'} ({', '.join(sorted(unreadable))}) ignored; "
                   "the next `wizard tune` on this machine replaces "
                   f"{'it' if len(unreadable) == 1 else 'them'}.")
    return Calibration(key, entries, frozenset(stale), problem, network_for(key, path, now))


def notes(used: list[tuple[str, Ratios]], stale: int, changed: tuple[str, str] | None,
          model: str | None = None) -> list[str]:
    """What a plan says about the calibration it used: `used` (rung name, its ratios) in ladder order, how many
    of its rungs' entries were stale, (raw choice, calibrated choice) when the calibration changed it, and the
    plan's model (model_label), to say when the ratios were measured on another."""
    out = []
    if stale:
        out.append(f"{stale} calibration entr{'y' if stale == 1 else 'ies'} older than {STALE_DAYS} days "
                   "ignored (run `wizard tune` again).")
    if not used:
        return out
    trials = sum(r.trials for _, r in used)
    date = date_of(max(r.updated for _, r in used))
    models = sorted({r.model for _, r in used if r.model})
    memory_applied = any(r.memory_applied > 1 for _, r in used)
    lower = any(r.memory is not None and r.memory <= 1 for _, r in used)
    parts = []
    for name, r in used:
        figures = [f"speed x{r.speed:.2f}"] if r.speed is not None else []
        if r.memory is not None:
            figures.append(f"memory x{r.memory:.2f}" + ("" if r.memory_applied > 1 else " not applied")
                           + (" at least: it ran out of memory in a trial" if r.out_of_memory else ""))
        parts.append(f"{name}: {', '.join(figures)}")
    applied = [w for w, on in (("speeds", any(r.speed for _, r in used)), ("memory", memory_applied)) if on]
    what = " and ".join(applied).capitalize() + " calibrated" if applied else "Nothing calibrated"
    of = f" of {', '.join(models)}" if models else ""
    text = (f"{what} by {trials} trial{'s' if trials != 1 else ''}{of} on this machine on {date} "
            f"({'; '.join(parts)}; `--no-calibration` shows the raw model).")
    if models and models != [model]:
        text += (f" Measured on {'that model' if len(models) == 1 else 'those models'}, not this one: applied "
                 "here as they are (`wizard tune` with this model measures its own).")
    if lower:
        text += (" A measured peak below the model's never lowers the estimate: it was measured at one micro-batch, "
                 "and a lower figure must not make a larger one fit and then run out of memory.")
    if changed:
        text += f" Calibration changed the choice from {changed[0]} to {changed[1]}."
    out.append(text)
    return out


def model_label(model) -> str | None:
    """What a calibration entry calls the model a trial ran: its hub id or path, or "--params 98K"."""
    return (getattr(model, "source", None) or getattr(model, "model_type", None) or None) if model else None


def record(hw, topology, method: str, measurements: list[dict[str, Any]], path: Path | None = None,
           now: float | None = None, model: str | None = None) -> Path:
    """Fold trials in: each {"rung": key, "speed_ratio": r, "memory_ratio": r or None} and, for a trial that ran out
    of memory, "memory_floor": capacity / predicted (the ratio was at least that: the entry's memory ratio is
    raised to it, never averaged below it). Written atomically."""
    path = path or calibration_file()
    machines, _problem = load(path)         # an unreadable file is replaced
    now = time.time() if now is None else now
    key = machine_key(hw, topology)
    if not isinstance(machines.get(key), dict):
        machines[key] = {}                  # an unreadable machine entry too
    entries = machines[key]
    for m in measurements:
        key = strategy_key(m["rung"], method)
        parsed = _parse(entries.get(key), now)
        # a stale or unreadable entry is replaced, never folded in
        old = parsed if parsed is not None and now - parsed[3] <= STALE_DAYS * 86400 else None
        n_old = old[2] if old else 0
        entry = {"trials": n_old + 1, "updated": now, "date": date_of(now)}
        if model:
            entry["model"] = model          # what the trial ran: plans of other models say whose ratio they use
        for i, name in enumerate(("speed_ratio", "memory_ratio")):
            new = m.get(name)
            prev = old[i] if old else None
            if new is None or not new > 0:
                entry[name] = prev
            elif prev:
                entry[name] = math.exp((math.log(prev) * n_old + math.log(new)) / (n_old + 1))
            else:
                entry[name] = new
        # an out-of-memory floor stays: a later measured ratio (at a smaller micro-batch) must not average it away
        old_floor = _ratio(entries[key].get("memory_floor")) if old else None
        floor = max(_ratio(m.get("memory_floor")) or 0, old_floor or 0)
        if floor:
            entry["memory_floor"] = floor
            entry["memory_ratio"] = max(entry["memory_ratio"] or 0, floor)
        entries[key] = entry
    _write(path, machines=machines)
    return path


def _write(path: Path, **parts: Any) -> None:
    """Write the file with `parts` (machines, network) replaced and every other part kept as it was."""
    from wizard.fsutil import replace_file
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc = doc if isinstance(doc, dict) and doc.get("format") == FORMAT else {}
    except (OSError, ValueError):
        doc = {}
    doc.update(parts, format=FORMAT)
    doc.setdefault("machines", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


# --- The network between machines, as `wizard preflight --record` measured it ----------------------------------
# Kept under "network", keyed by machine_key (the same key as the ratios: what each machine runs), apart from the
# ratios: it is a figure in Gb/s per machine that replaces the class default (speed.inter_node_gbps), not a ratio
# to the model. The latest measurement wins (a network changes with the cluster, not by averaging).


@dataclass(frozen=True)
class Network:
    gbps: float                 # the all-reduce's bus bandwidth between the machines, Gb/s (one process per machine)
    machines: int               # how many machines took part
    backend: str                # gloo | nccl
    updated: float

    @property
    def source(self) -> str:
        """How the plan names the figure's origin."""
        return (f"measured by `wizard preflight` ({self.backend} all-reduce across {self.machines} machines) on "
                f"{date_of(self.updated)}")


def network_key(gpu_names: list[str], processes_per_machine: int, cpu: bool) -> str:
    """machine_key of a machine described by its GPU names (what preflight's node facts hold)."""
    from types import SimpleNamespace
    hw = SimpleNamespace(gpus=[SimpleNamespace(name=n) for n in gpu_names])
    return machine_key(hw, SimpleNamespace(processes_per_machine=processes_per_machine, cpu=cpu or not gpu_names))


def network_for(key: str, path: Path | None = None, now: float | None = None) -> Network | None:
    """The recorded network for machines of `key`; None when none, unreadable, or older than STALE_DAYS."""
    path = path or calibration_file()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = ((doc.get("network") or {}) if isinstance(doc, dict) else {}).get(key)
    if not isinstance(entry, dict):
        return None
    gbps = _ratio(entry.get("gbps"))
    if not is_network_gbps(gbps):   # a hand-edited or corrupt file: the class default, not a zero speed
        return None
    now = time.time() if now is None else now
    try:
        updated, machines = float(entry.get("updated", 0)), int(entry.get("machines", 0))
    except (TypeError, ValueError, OverflowError):
        return None
    if gbps is None or machines < 2 or not (math.isfinite(updated) and 0 <= updated <= now + FUTURE_SLACK_S) \
            or now - updated > STALE_DAYS * 86400:
        return None
    return Network(gbps, machines, str(entry.get("backend") or "?"), updated)


def record_network(gpu_names: list[str], processes_per_machine: int, cpu: bool, gbps: float, machines: int,
                   backend: str, path: Path | None = None, now: float | None = None,
                   spread: dict[str, Any] | None = None) -> tuple[Path, str]:
    """Store a measured network (replacing the earlier one for these machines); (the file, the machine key).
    `gbps` is the median of the preflight's samples; `spread` says how they ranged (low, high, samples, bytes)."""
    path = path or calibration_file()
    now = time.time() if now is None else now
    key = network_key(gpu_names, processes_per_machine, cpu)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        network = doc.get("network") if isinstance(doc, dict) and isinstance(doc.get("network"), dict) else {}
    except (OSError, ValueError):
        network = {}
    network[key] = {"gbps": round(float(gbps), 4), "machines": int(machines), "backend": backend, "updated": now,
                    "date": date_of(now)}
    if spread:
        network[key]["spread"] = spread
    _write(path, network=network)
    return path, key
