"""Wizard speed, as figures (no assertions):

1. Start to first screen painted, in a real terminal: `wizard` in tmux at 80x24, polling
   capture-pane until the first screen's title ("1/6 Hardware") appears, against `accelerate config`
   reaching its first question ("In which compute environment are you running?") the same way, in
   the same run. Target: under 0.5 s and well below accelerate's.
2. Plan update after an input change: the micro-batch field's value changes (Input.Changed, as
   from a key) until the plan line under the fields holds the new plan (Textual repaints it on
   its next frame, at most 1/60 s later) (Pilot, headless); and the core re-plan alone
   (WizardState.replan: resolve + make_plan + details). Target: under 50 ms.

Run: python bench/bench_tui.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
POLL_S = 0.005


def time_to_text(command: list[str], text: str, env: dict[str, str], timeout: float = 60.0) -> float:
    """Seconds from starting `command` in a fresh tmux session until `text` is on its screen."""
    tmux = shutil.which("tmux")
    socket = f"wizard-bench-{uuid.uuid4().hex[:8]}"
    shell = " ".join(_quote(c) for c in command)
    exports = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
    try:
        start = time.perf_counter()
        subprocess.run([tmux, "-L", socket, "new-session", "-d", "-x", "80", "-y", "24",
                        f"env {exports} {shell}; sleep 60"], check=True)
        while True:
            shown = subprocess.run([tmux, "-L", socket, "capture-pane", "-p"], capture_output=True,
                                   text=True).stdout
            if text in shown:
                return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise RuntimeError(f"{text!r} never appeared for {command}:\n{shown}")
            time.sleep(POLL_S)
    finally:
        subprocess.run([tmux, "-L", socket, "kill-server"], capture_output=True)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def bench_first_paint(runs: int) -> None:
    if shutil.which("tmux") is None:
        print("first paint: skipped (tmux is not installed: apt-get install -y tmux)")
        return
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        env = {"HF_HOME": os.path.join(tmp, "hf"), "TERM": "xterm-256color", "PATH": os.environ.get("PATH", "")}
        wizard = [str(BIN / "wizard"), "--output-dir", os.path.join(tmp, "out")]
        accelerate = [str(BIN / "accelerate"), "config"]
        # One warm-up each: the first start after a while reads cold .pyc files from disk.
        time_to_text(wizard, "1/6", env)
        time_to_text(accelerate, "compute environment", env)
        ours, theirs = [], []
        for _ in range(runs):
            ours.append(time_to_text(wizard, "1/6", env))
            theirs.append(time_to_text(accelerate, "compute environment", env))
    print(f"first screen painted, tmux 80x24, median of {runs} (min-max):")
    print(f"  wizard                       {statistics.median(ours) * 1000:7.0f} ms "
          f"({min(ours) * 1000:.0f}-{max(ours) * 1000:.0f})")
    print(f"  accelerate config (1st Q)    {statistics.median(theirs) * 1000:7.0f} ms "
          f"({min(theirs) * 1000:.0f}-{max(theirs) * 1000:.0f})")
    print(f"  ratio                        {statistics.median(ours) / statistics.median(theirs):7.2f}  "
          "(target: first paint < 500 ms and well below accelerate)")


async def _plan_latency(samples: int) -> tuple[list[float], list[float]]:
    from textual.widgets import Input

    from wizard.frontends.tui.app import make_app
    from wizard.pipeline import Request
    from wizard.probe import hardware

    model = str(ROOT / "tests" / "fixtures" / "models" / "qwen2.5-7b")
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as tmp:
        os.environ["HF_HOME"] = os.path.join(tmp, "hf")
        app = make_app(Request(given={"model": model}, output_dir=os.path.join(tmp, "out")),
                       hardware=hardware.assume("8xA100-80GB"), preload=False)
        ui, core = [], []
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("enter")                       # Hardware -> Model and training
            await app.workers.wait_for_complete()
            await pilot.pause(0.2)
            field = app.screen.query_one("#q-micro_batch", Input)
            plan_line = app.screen.query_one("#plan-line")
            field.focus()
            await pilot.pause()
            for i in range(samples):
                # Setting the Input's value posts the same Input.Changed a key press does; timing
                # Pilot.press instead would add Pilot's own ~80 ms of waiting per key.
                text = "8" if i % 2 == 0 else "1"           # ZeRO-2 <-> ZeRO-2 + GC and back
                before = str(plan_line.content)
                start = time.perf_counter()
                field.value = text
                while str(plan_line.content) == before:
                    await asyncio.sleep(0)
                ui.append(time.perf_counter() - start)
                await pilot.pause()
                t = time.perf_counter()
                app.state.replan()
                core.append(time.perf_counter() - t)
        return ui, core


def bench_plan_update(samples: int) -> None:
    ui, core = asyncio.run(_plan_latency(samples))
    print(f"plan update after an input change, {samples} changes of micro-batch (qwen2.5-7b on 8 x A100-80GB):")
    print(f"  field changed -> plan line updated            median {statistics.median(ui) * 1000:6.1f} ms, "
          f"max {max(ui) * 1000:6.1f} ms")
    print(f"  WizardState.replan (resolve, plan, details) median {statistics.median(core) * 1000:6.2f} ms, "
          f"max {max(core) * 1000:6.2f} ms   (target < 50 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="terminal starts per program (default 5)")
    parser.add_argument("--samples", type=int, default=20, help="input changes timed (default 20)")
    args = parser.parse_args()
    bench_first_paint(args.runs)
    bench_plan_update(args.samples)


if __name__ == "__main__":
    main()
