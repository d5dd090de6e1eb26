"""Launch supervisor figures (issue 4 "Speed"): prints numbers, asserts nothing.

1. overhead: the same CPU example (examples/train.py, 2 ranks over gloo through torchrun) run by
   plain `accelerate launch` and by `wizard launch --headless`, alternating, median wall time.
   Target: <= 3 % (on a shared 2-core box the noise is larger than that; read the spread).
2. capture: lines/s through StreamCapture into a rotating rank log (in-process), and end to end
   (a rank printing N lines through the socket into rank-0.log, counted afterwards: no loss);
   peak memory of the in-process run (tracemalloc). Target: >= 100,000 lines/s, bounded memory.
3. stop: `wizard stop` to no process of the run left, for ranks that obey SIGTERM and for ranks
   that ignore it (then the grace period runs out and SIGKILL follows). Target: <= grace + 1 s.

    python bench/bench_launch.py [--repeats 3] [--steps 30] [--lines 1000000] [--skip-overhead]
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
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TRAIN = str(REPO / "examples" / "train.py")

DDP2 = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\nnum_processes: 2\n"
        "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\ngpu_ids: all\nmain_process_port: 0\n"
        "rdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
SINGLE = ("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
          "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\nmain_training_function: main\n")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""))
    return e


def timed(cmd: list[str], cwd: Path) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=cwd)
    return time.perf_counter() - t, r.returncode


def bench_overhead(tmp: Path, repeats: int, steps: int) -> None:
    cfg = tmp / "ddp2.yaml"
    cfg.write_text(DDP2)
    plain = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), TRAIN, "--steps", str(steps)]
    a, b = [], []
    for i in range(repeats):
        t, rc = timed(plain, tmp)
        a.append(t)
        run = [sys.executable, "-m", "launch.commands", "launch", "--headless", "--quiet-ranks", "--config-file",
               str(cfg), "--run-dir", str(tmp / f"ov-{i}"), "--", TRAIN, "--steps", str(steps)]
        t2, rc2 = timed(run, tmp)
        b.append(t2)
        print(f"  run {i + 1}: accelerate launch {t:6.2f} s (rc {rc})   wizard launch {t2:6.2f} s (rc {rc2})")
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"overhead: median {ma:.2f} s plain vs {mb:.2f} s supervised: {100 * (mb - ma) / ma:+.1f} % "
          f"(spread plain {min(a):.2f}-{max(a):.2f} s, supervised {min(b):.2f}-{max(b):.2f} s)")


def bench_capture_inprocess(tmp: Path, lines: int) -> None:
    from launch.logs import StreamCapture
    from launch.rundir import RotatingLog
    line = b"[rank0] step 12345 some typical log text of moderate length, loss went down a bit\n"
    chunk = line * (65536 // len(line))
    n_chunks = lines // (65536 // len(line))
    trains = []
    log = RotatingLog(tmp / "cap.log", cap_bytes=50 * 1024 * 1024)
    cap = StreamCapture(0, log, on_train_log=lambda r, d: trains.append(d))
    tracemalloc.start()
    t = time.perf_counter()
    for _ in range(n_chunks):
        cap.feed(chunk)
    cap.close()
    dt = time.perf_counter() - t
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    log.close()
    print(f"capture (in-process, plain lines): {cap.lines / dt:,.0f} lines/s, {cap.bytes_in / dt / 1e6:.0f} MB/s, "
          f"peak traced memory {peak / 1024:.0f} KiB, log rotations {log.rotations}")
    mixed = (b"\r 12%|#         | 12/100 [00:03<00:20,  4.20it/s]" * 5 +
             b"\r{'loss': '4.865', 'grad_norm': '2.022', 'learning_rate': '0.001', 'epoch': '0.0004'}\n" + line * 20)
    cap2 = StreamCapture(0, RotatingLog(tmp / "cap2.log"), on_train_log=lambda r, d: trains.append(d),
                         on_progress=lambda r, p: None)
    reps = max(1, lines // 21 // 4)
    t = time.perf_counter()
    for _ in range(reps):
        cap2.feed(mixed)
    cap2.close()
    dt = time.perf_counter() - t
    print(f"capture (in-process, with tqdm redraws and Trainer dicts every 21 lines): {cap2.lines / dt:,.0f} lines/s, "
          f"{len(trains):,} dicts parsed")


def bench_capture_end_to_end(tmp: Path, lines: int) -> None:
    cfg = tmp / "single.yaml"
    cfg.write_text(SINGLE)
    spew = tmp / "spew.py"
    spew.write_text(
        "import sys, time\nn = int(sys.argv[1])\nw = sys.stdout.buffer.write\nt = time.perf_counter()\n"
        "buf = []\nfor i in range(n):\n    buf.append(b'line %d of the capture benchmark, some words here\\n' % i)\n"
        "    if len(buf) == 1000:\n        w(b''.join(buf)); buf = []\nw(b''.join(buf)); sys.stdout.flush()\n"
        "print(f'spew done in {time.perf_counter() - t:.3f}', file=sys.stderr)\n")
    run_dir = tmp / "e2e"
    cmd = [sys.executable, "-m", "launch.commands", "launch", "--headless", "--quiet-ranks", "--config-file", str(cfg),
           "--run-dir", str(run_dir), "--", str(spew), str(lines)]
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=tmp)
    dt = time.perf_counter() - t
    log = run_dir / "logs" / "attempt-1" / "rank-0.log"
    rotated = log.with_name(log.name + ".1")      # the 50 MB cap rotates once for a million lines
    got = sum(1 for f in (rotated, log) if f.exists() for ln in f.read_bytes().splitlines() if ln.startswith(b"line "))
    text = log.read_text(errors="replace")
    spew_s = None
    for ln in text.splitlines():
        if ln.startswith("spew done in"):
            spew_s = float(ln.split()[-1])
    print(f"capture (end to end, 1 rank -> socket -> rank-0.log): {got:,}/{lines:,} lines kept (rc {r.returncode}); "
          f"whole launch {dt:.2f} s; the rank wrote them in {spew_s} s "
          f"(>= {lines / spew_s:,.0f} lines/s through the supervisor)" if spew_s else f"{got} lines, {dt:.2f} s")


def bench_stop(tmp: Path, grace: float) -> None:
    import psutil
    cfg = tmp / "ddp2.yaml"
    cfg.write_text(DDP2)
    stubborn = tmp / "stubborn.py"
    stubborn.write_text("import signal, sys, time\nif '--ignore-term' in sys.argv: signal.signal(signal.SIGTERM, "
                        "signal.SIG_IGN)\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    for label, script in (("ranks obey SIGTERM", [TRAIN, "--steps", "100000", "--sleep", "0.2"]),
                          ("ranks ignore SIGTERM", [str(stubborn), "--ignore-term"])):
        run_dir = tmp / f"stop-{label.split()[1]}"
        sup = subprocess.Popen([sys.executable, "-m", "launch.commands", "launch", "--headless", "--quiet-ranks",
                                "--config-file", str(cfg), "--run-dir", str(run_dir), "--grace", str(grace), "--",
                                *script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=tmp)
        deadline = time.monotonic() + 180
        st = {}
        while time.monotonic() < deadline:
            try:
                st = json.loads((run_dir / "run.json").read_text())
            except (OSError, ValueError):
                st = {}
            if len(st.get("pids") or {}) == 2 and (st.get("progress", {}).get("step") or "ignore" in label):
                break
            time.sleep(0.2)
        time.sleep(1.0)
        st = json.loads((run_dir / "run.json").read_text())
        pids = set(st.get("seen_pids") or []) | {int(p) for p in st["pids"].values()}
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "launch.commands", "stop", "--no-wait", str(run_dir)],
                       stdout=subprocess.DEVNULL, env=env(), cwd=tmp)

        def alive():
            n = 0
            for pid in pids:
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        n += 1
                except psutil.NoSuchProcess:
                    pass
            return n
        while alive() and time.perf_counter() - t < grace + 30:
            time.sleep(0.05)
        dt = time.perf_counter() - t
        sup.wait(30)
        print(f"stop ({label}, grace {grace:g} s): no process left after {dt:.2f} s "
              f"({len(pids)} processes; target <= {grace + 1:g} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-stop", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as d:
        tmp = Path(d)
        bench_capture_inprocess(tmp, a.lines)
        bench_capture_end_to_end(tmp, a.lines)
        if not a.skip_stop:
            bench_stop(tmp, a.grace)
        if not a.skip_overhead:
            bench_overhead(tmp, a.repeats, a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
