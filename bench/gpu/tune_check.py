"""`wizard tune` of a real-size model with a user's Trainer script (issue 28): the command a user runs, end to end
on the GPU, with steps and a budget such that every trial completes (the 2026-12-04 session's first full tune
stopped one step short of its script: the script's own --steps must exceed tune's warm-up + steps).

    wizard tune --model <dir> --backend ddp --seq-len S --micro-batch B --gradient-checkpointing on|off --precision bf16
                --attention sdpa --candidates N --variants V --steps K --warmup-steps W --budget T
                --trial-timeout T1 --headless --json --no-calibration -- bench/gpu/train_real.py --config <dir> ...

The raw model is what is compared (--no-calibration; WIZARD_CALIBRATION_FILE points into the work dir, so the
machine's calibration is neither read nor written). Each trial's predicted and measured peak and step time come
from tune's own JSON. A dry run tunes a tiny model of the same kind on the CPU (--use-cpu yes, a few steps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.common import HERE
from bench.gpu.memory_check import error_pct
from bench.gpu.runner import Options, child_env, keep_tail, run_child

# A dry run: a toy sequence and one trial (a CPU plan has one rung; no micro-batch variant), to keep CI's slow
# tier short; the GPU run tries the plan's candidates and a variant.
DRY_RUN_TUNE = {"seq_len": 64, "micro_batch": 2, "variants": 0, "steps": 2, "warmup": 1, "script_steps": 8,
                "budget_s": 150, "trial_timeout_s": 75}


def tune_settings(cfg: dict, dry_run: bool, quick: bool) -> dict[str, Any]:
    """The tune section of cases.json, shortened for a dry run (tiny model on the CPU) and for --quick."""
    out = dict(cfg)
    if dry_run:
        out.update(DRY_RUN_TUNE)
    elif quick:
        out.update(steps=min(int(cfg["steps"]), 4), warmup=min(int(cfg["warmup"]), 1))
    if int(out["script_steps"]) <= int(out["steps"]) + int(out["warmup"]):
        raise ValueError(f"tune: script_steps {out['script_steps']} must exceed warm-up + steps "
                         f"({out['warmup']} + {out['steps']}), or the last trial stops short")
    return out


def tiny_model_dir(model_dir: str, root: Path) -> str:
    """The model's config.json shrunk to train_one.py's toy shape (a dry run's tune trains it on the CPU)."""
    from bench.gpu.train_one import TINY
    data = json.loads((Path(model_dir) / "config.json").read_text())
    data.update(TINY)
    out = root / (Path(model_dir).name + "-tiny")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(data, indent=1))
    return str(out)


def tune_command(s: dict, model_dir: str, out_dir: Path, runs_root: Path, dry_run: bool) -> list[str]:
    gc = "on" if s.get("gc") else "off"
    cmd = [sys.executable, "-m", "wizard", "tune", "--model", model_dir, "--seq-len", str(s["seq_len"]),
           "--micro-batch", str(s["micro_batch"]), "--gradient-checkpointing", gc, "--attention", "sdpa",
           "--num-processes", "1", "--candidates", str(s["candidates"]), "--variants", str(s.get("variants", 1)),
           "--steps", str(s["steps"]), "--warmup-steps", str(s["warmup"]), "--budget", str(s["budget_s"]),
           "--trial-timeout", str(s["trial_timeout_s"]), "--output-dir", str(out_dir), "--runs-root", str(runs_root),
           "--headless", "--json", "--no-calibration"]
    if s.get("backend"):               # as the 2026-12-04 tune rows (single GPU and its micro-batch variant)
        cmd += ["--backend", str(s["backend"])]
    cmd += ["--use-cpu", "yes"] if dry_run else ["--precision", "bf16"]
    cmd += ["--", str(HERE / "train_real.py"), "--config", model_dir, "--seq-len", str(s["seq_len"]),
            "--batch-size", str(s["micro_batch"]), "--gc", gc, "--steps", str(s["script_steps"])]
    return cmd


def parse_tune_json(lines: list[str]) -> dict | None:
    """tune --json prints one JSON document on stdout."""
    text = "".join(lines)
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def trial_rows(doc: dict, dry_run: bool) -> list[dict[str, Any]]:
    rows = []
    for t in doc.get("candidates") or []:
        p, m = t.get("predicted") or {}, t.get("measured") or {}
        ok = t.get("status") == "measured" and not dry_run
        rows.append({"label": t.get("label"), "rung": t.get("rung"), "batch": t.get("batch"), "status": t.get("status"),
                     "predicted_bytes": p.get("per_gpu_bytes"), "measured_bytes": m.get("peak_bytes"),
                     "peak_kind": m.get("peak_kind"), "predicted_step_s": p.get("step_seconds"),
                     "measured_step_s": m.get("step_seconds"), "steps": m.get("steps"),
                     "error_pct": error_pct(p.get("per_gpu_bytes"), m.get("peak_bytes")) if ok else None,
                     "step_error_pct": error_pct(p.get("step_seconds"), m.get("step_seconds")) if ok else None,
                     "message": t.get("message"), "wall_s": t.get("wall_seconds")})
    return rows


def tune_verdict(rows: list[dict], returncode: int | None) -> tuple[str, str]:
    """Whether every trial completed (tune's status 'measured'): what this case is for."""
    if not rows:
        return "unknown", f"no trials (exit {returncode})"
    done = sum(r["status"] == "measured" for r in rows)
    if done == len(rows):
        return "complete", f"every trial completed ({done} of {len(rows)})"
    others = ", ".join(f"{r['label']}: {r['status']}" for r in rows if r["status"] != "measured")
    return "incomplete", f"{done} of {len(rows)} trials completed ({others})"


def run_tune(cfg: dict, model_dirs: dict[str, str], opts: Options, work: Path, results_dir: Path,
             timeout: float) -> dict[str, Any]:
    s = tune_settings(cfg, opts.dry_run, opts.quick)
    # tune's own budget ends before ours, so that it stops its last trial and reports rather than being killed
    s["budget_s"] = int(min(float(s["budget_s"]), max(timeout - 20.0, 30.0)))
    tune_dir = work / "tune"
    tune_dir.mkdir(parents=True, exist_ok=True)
    model_dir = tiny_model_dir(model_dirs[s["model"]], tune_dir) if opts.dry_run else model_dirs[s["model"]]
    cmd = tune_command(s, model_dir, tune_dir / "out", tune_dir / "runs", opts.dry_run)
    env = child_env({"WIZARD_CALIBRATION_FILE": str(tune_dir / "calibration.json")})
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(key, None)
    child = run_child(cmd, env, timeout, log_path=tune_dir / "stderr.log", grace=15.0)
    keep_tail(tune_dir / "stderr.log", results_dir / "tune-stderr.log")
    doc = parse_tune_json(child["lines"])
    rows = trial_rows(doc or {}, opts.dry_run)
    verdict, why = tune_verdict(rows, child["returncode"])
    if child["timed_out"]:
        why += f"; tune itself ran past {timeout:.0f} s"
    return {"model": s["model"], "settings": s, "command": cmd[2:], "returncode": child["returncode"],
            "timed_out": child["timed_out"], "wall_s": child["wall_s"], "winner": (doc or {}).get("winner"),
            "partial": (doc or {}).get("partial"), "notes": (doc or {}).get("notes"), "trials": rows,
            "verdict": verdict, "verdict_why": why}
