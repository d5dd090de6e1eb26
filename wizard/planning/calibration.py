"""Measured-to-predicted ratios from `wizard tune`, kept per machine and applied by later plans.

One file, <cache>/calibration.json ($WIZARD_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/wizard), keyed by
the machine (GPU model and count, or "cpu" and the process count) and the strategy class (the rung key and
the fine-tuning method). Each entry holds the geometric mean of the trials' ratios (measured tokens/s over
predicted, measured peak memory over predicted), how many trials made it and when.

Only a plan for the machine the wizard runs on (a probe, not --assume or --hardware) is calibrated.
`apply` is the one place a plan meets a calibration (wizard.pipeline.plan_from_answers calls it): it scales each
matching rung's speed (step time, tokens/s, MFU) and says so in a note. Memory ratios are recorded and shown
in the note, but the per-GPU estimate that decides what fits stays the model's: one trial's peak (which on
a CPU is the whole process's RSS) is not a reason to drop a rung. A file that cannot be read, has another
format, or is older than STALE_DAYS is ignored with a note.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

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
    """'2xNVIDIA H100 80GB HBM3' or 'cpu:2' (CPU processes)."""
    gpus = list(getattr(hw, "gpus", None) or [])
    if getattr(topology, "cpu", False) or not gpus:
        n = int(getattr(topology, "processes_per_machine", 1) or 1)
        return f"cpu:{n}"
    names = sorted({str(getattr(g, "name", "gpu")) for g in gpus})
    return f"{len(gpus)}x{'+'.join(names)}"


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


def _fresh(entry: dict[str, Any], now: float) -> bool:
    return now - float(entry.get("updated", 0)) <= STALE_DAYS * 86400


def _date(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def apply(plan, hw, method: str = "full", path: Path | None = None, now: float | None = None) -> None:
    """Scale the speed figures of every rung this machine has a calibration for; add the note."""
    machines, problem = load(path)
    if problem:
        plan.notes.append(problem)
        return
    entries = machines.get(machine_key(hw, plan.topology)) or {}
    now = time.time() if now is None else now
    used: list[tuple[str, dict[str, Any]]] = []
    stale = 0
    for rung in plan.rungs:
        entry = entries.get(strategy_key(rung.key, method))
        if not isinstance(entry, dict) or rung.speed is None:
            continue
        try:
            ratio = float(entry["speed_ratio"])
            if not (math.isfinite(ratio) and ratio > 0):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            continue
        if not _fresh(entry, now):
            stale += 1
            continue
        s = rung.speed
        rung.speed = replace(s, step_seconds=s.step_seconds / ratio, tokens_per_second=s.tokens_per_second * ratio,
                             tokens_per_second_per_gpu=s.tokens_per_second_per_gpu * ratio, mfu=s.mfu * ratio)
        used.append((rung.name, entry))
    if stale:
        plan.notes.append(f"{stale} calibration entr{'y' if stale == 1 else 'ies'} older than {STALE_DAYS} days "
                          "ignored (run `wizard tune` again).")
    if used:
        trials = sum(int(e.get("trials", 0)) for _, e in used)
        date = _date(max(float(e.get("updated", 0)) for _, e in used))
        parts = ", ".join(f"{name} speed x{e['speed_ratio']:.2f}"
                          + (f", memory x{e['memory_ratio']:.2f}" if e.get("memory_ratio") else "")
                          for name, e in used)
        plan.notes.append(f"Speeds calibrated by {trials} trial{'s' if trials != 1 else ''} on this machine on "
                          f"{date} ({parts}; `--no-calibration` shows the raw model).")


def record(hw, topology, method: str, measurements: list[dict[str, Any]], path: Path | None = None,
           now: float | None = None) -> Path:
    """Fold trials in: each {"rung": key, "speed_ratio": r, "memory_ratio": r or None}. Written atomically."""
    from wizard.fsutil import replace_file
    path = path or calibration_file()
    machines, _problem = load(path)         # an unreadable file is replaced
    now = time.time() if now is None else now
    entries = machines.setdefault(machine_key(hw, topology), {})
    for m in measurements:
        key = strategy_key(m["rung"], method)
        old = entries.get(key) if isinstance(entries.get(key), dict) and _fresh(entries[key], now) else None
        n_old = int(old.get("trials", 0)) if old else 0
        entry = {"trials": n_old + 1, "updated": now, "date": _date(now)}
        for name in ("speed_ratio", "memory_ratio"):
            new = m.get(name)
            prev = old.get(name) if old else None
            if new is None or not new > 0:
                entry[name] = prev
            elif prev:
                entry[name] = math.exp((math.log(prev) * n_old + math.log(new)) / (n_old + 1))
            else:
                entry[name] = new
        entries[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps({"format": FORMAT, "machines": machines}, indent=1, sort_keys=True) + "\n")
    return path
