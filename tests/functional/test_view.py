"""The live view of a run, driven only by a run directory built here.

Synthetic run directories (run.json, events.jsonl, rank logs) plus metrics.jsonl written by the
real Sampler and MetricsWriter from the fake NVML with 8 GPUs (the only test double). Pilot tests
press the keys; control keys signal a real dummy supervisor process. SVG snapshots live under
snapshots/launch_view/test_view/ (accept changes with `pytest --snapshot-update` after looking at
snapshot_report.html).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_textual_snapshot

from launch.metrics import MetricsWriter, Sampler
from launch.follow import (
    CONTROL_FILE,
    DETACHED,
    LAUNCHER,
    QUIT,
    STOPPED,
    WIZARD,
    FileTail,
    JsonlTail,
    RunFollower,
    clean_line,
    send_control,
)
from launch.view import (
    FailurePanel,
    GpuPanel,
    Header,
    LogPane,
    Palette,
    QuitModal,
    TrainLine,
    bar,
    exit_code_for,
    gpu_line,
    includes_reserve,
    make_view_app,
    run_view,
    spark,
)
from wizard.probe.nvml import open_nvml

pytestmark = [pytest.mark.timeout(60), pytest.mark.ui]

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_DIR = ROOT / "snapshots" / "launch_view"
T0 = 1_767_225_600.0          # 2026-01-01 00:00 UTC: every time in the synthetic runs is fixed
NOW = T0 + 754.0              # the frozen clock: "elapsed 12:34"


class LaunchViewSVG(pytest_textual_snapshot.SVGImageExtension):
    """pytest-textual-snapshot's SVG extension, storing under snapshots/launch_view/<module>/."""

    @classmethod
    def dirname(cls, *, test_location) -> str:
        # syrupy relates a snapshot to its test module by the folder name (unused-snapshot check)
        return str(SNAPSHOT_DIR / test_location.basename)


@pytest.fixture(autouse=True)
def _snapshots_dir(monkeypatch):
    # snap_compare picks its extension class from the plugin module when the fixture is set up;
    # autouse fixtures are set up first, so this redirects where the SVGs are read and written.
    monkeypatch.setattr(pytest_textual_snapshot, "SVGImageExtension", LaunchViewSVG)


# ---------------------------------------------------------------- synthetic run directories

def write_metrics(run_dir: Path, spec: str, n: int = 70, monkeypatch=None) -> None:
    os.environ["WIZARD_FAKE_NVML"] = spec
    try:
        api = open_nvml()
    finally:
        del os.environ["WIZARD_FAKE_NVML"]
    clock = [T0]
    pids = {4100 + r: r for r in range(8)}
    sampler = Sampler(api, clock=lambda: clock[0], pid_to_rank=pids.get)
    writer = MetricsWriter(run_dir / "metrics.jsonl")
    for i in range(n):
        clock[0] = NOW - n + i
        writer(sampler.sample_once())
    api.close()


RUN_NAME = "run-20260101-000000-abc123"


def make_run(tmp_path: Path, kind: str = "running", supervisor_pid: int | None = None,
             ranks: int = 8) -> Path:
    d = tmp_path / RUN_NAME
    (d / "logs" / "attempt-1").mkdir(parents=True)
    run = {
        "id": "20260101-000000-abc123", "command": ["accelerate", "launch", "--config_file",
                                                    "/cfg/default_config.yaml", "examples/train.py"],
        "script": "examples/train.py", "script_args": [], "config_file": "/cfg/default_config.yaml",
        "ds_config": "/cfg/ds_config.json", "cwd": str(tmp_path), "run_dir": str(d),
        "attempt": 1, "max_restarts": 2, "status": "running", "supervisor_pid": supervisor_pid,
        "launcher_pid": None, "pids": {str(r): 4100 + r for r in range(ranks)},
        "started_at": T0, "attempt_started_at": T0, "ended_at": None, "exit_code": None,
        "classification": None, "detached": False, "headless": False, "world_size": ranks,
        "progress": {"step": 120, "total": 500, "rate": 3.41, "eta_s": 111.4, "loss": 2.3141,
                     "learning_rate": 2e-5, "grad_norm": 1.2, "epoch": 0.24},
    }
    events = []
    for i in range(30):
        t = T0 + 20 * i
        events.append({"t": t, "type": "train_log", "attempt": 1, "rank": 0,
                       "loss": round(4.0 - i * 0.06 + (i % 3) * 0.05, 4), "learning_rate": 2e-5})
        events.append({"t": t, "type": "progress", "attempt": 1, "step": 4 * i, "total": 500,
                       "rate": round(3.0 + (i % 5) * 0.1, 2)})
    for r in range(ranks):
        with open(d / "logs" / "attempt-1" / f"rank-{r}.log", "w") as f:
            for i in range(6):
                f.write(f"step {i * 20} rank {r}: {{'loss': {3.0 - i * 0.1:.4f}, "
                        f"'learning_rate': 2e-05, 'epoch': {i * 0.04:.2f}}}\n")
    (d / "logs" / "attempt-1" / "launcher.log").write_text(
        "The following values were not passed to `accelerate launch` and had defaults used instead:\n")

    if kind == "failed":
        tail = ["Traceback (most recent call last):",
                '  File "examples/train.py", line 88, in <module>',
                "    trainer.train()",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
                "total capacity of 79.11 GiB of which 1.20 GiB is free."]
        with open(d / "logs" / "attempt-1" / "rank-3.log", "a") as f:
            f.write("\n".join(tail) + "\n")
        run.update(status="failed", ended_at=T0 + 700, exit_code=1, classification={
            "kind": "cuda_oom", "rank": 3, "exit_code": 1, "signal": None,
            "summary": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "hint": "activations and logits no longer fit at micro-batch 8; the plan's next rung does",
            "log_tail": tail, "next_rung": "ZeRO-3 (9.1 GiB of model states per GPU)",
            "suggested_command": "wizard --non-interactive --params 7B --backend deepspeed --zero-stage 3"})
        events.append({"t": T0 + 700, "type": "failure", "attempt": 1, "rank": 3, "kind": "cuda_oom",
                       "summary": "CUDA out of memory on rank 3"})
        events.append({"t": T0 + 701, "type": "exit", "attempt": 1, "exit_code": 1, "status": "failed"})

    if supervisor_pid is not None:        # what the supervisor records: its pid and its start time
        import psutil
        run["supervisor_create_time"] = psutil.Process(supervisor_pid).create_time()
    (d / "run.json").write_text(json.dumps(run, indent=1))
    with open(d / "events.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    write_metrics(d, "none" if kind == "nogpu" else "8xH100-80GB")
    return d


def update_run(run_dir: Path, **fields) -> None:
    run = json.loads((run_dir / "run.json").read_text())
    run.update(fields)
    tmp = run_dir / ".run.json.tmp"
    tmp.write_text(json.dumps(run))
    os.replace(tmp, run_dir / "run.json")


def frozen_app(run_dir: Path, owned: bool = True, follow_interval: float = 0.5):
    app = make_view_app(run_dir, owned=owned, follow_interval=follow_interval, clock=lambda: NOW)
    app.animation_level = "none"
    return app


# ---------------------------------------------------------------- a dummy supervisor

# A stand-in holds the run's lock as the supervisor does for the whole run: that is how a client tells the run's
# supervisor from a process whose pid and start time are in run.json (launch/trust.py)
HOLD_THE_LOCK = r"""
import fcntl, os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
"""
DUMMY_SUPERVISOR = HOLD_THE_LOCK + r"""
import signal, time
def note(n, f):
    print(signal.Signals(n).name, flush=True)
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, note)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def supervisor(tmp_path):
    """A live process standing in for the supervisor of make_run's run: it holds the run's lock and prints every
    control signal it gets."""
    proc = subprocess.Popen([sys.executable, "-c", DUMMY_SUPERVISOR, str(tmp_path / RUN_NAME / "run.lock")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def signals_received(proc: subprocess.Popen, wait: float = 3.0) -> list[str]:
    got, deadline = [], time.monotonic() + wait
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            got.append(proc.stdout.readline().strip())
            deadline = min(deadline, time.monotonic() + 0.3)   # collect a burst, then return
    return got


def control(run_dir: Path) -> dict:
    return json.loads((run_dir / CONTROL_FILE).read_text())


# ---------------------------------------------------------------- renderers

def test_bar_and_sparkline_shapes():
    pal = Palette(None)
    assert bar(0.5, 10, pal.ok, pal.muted).plain == "█████░░░░░"
    assert bar(None, 4, pal.ok, pal.muted).plain == "····"
    assert bar(1.7, 3, pal.ok, pal.muted).plain == "███"
    assert spark([0, 50, 100], 3, 0, 100) == "▁▅█"
    assert spark([None, 100], 2, 0, 100) == " █"
    assert len(spark(list(range(60)), 20, 0, 100)) == 20
    assert spark([], 10) == ""


def test_palette_from_an_app_without_theme_attributes_is_the_dark_default():
    from types import SimpleNamespace
    pal = Palette(SimpleNamespace())                # a Textual without theme_variables / current_theme
    assert pal.ranks == Palette.DARK_RANKS and pal.ok.color.name == "#8ad4a1"


def test_gpu_line_fits_and_shows_na():
    pal = Palette(None)
    g = {"index": 3, "util": None, "mem_used": 40 * 1024**3, "mem_total": 80 * 1024**3,
         "power_w": None, "power_limit_w": 700.0, "temp_c": None}
    for width in (60, 77, 117):
        line = gpu_line(g, [10, 20, None, 90], width, pal)
        assert line.cell_len <= width
        assert "N/A" in line.plain and "40.0/80.0*" in line.plain and "N/A/700W" in line.plain
    # With NVML's v2 memory info (mem_reserved known) the figure is nvidia-smi's: no mark.
    v2 = dict(g, mem_reserved=644939776)
    assert "40.0/80.0G" in gpu_line(v2, [], 117, pal).plain and includes_reserve(g) and not includes_reserve(v2)


# ---------------------------------------------------------------- following the run directory

def test_file_tail_reads_only_new_whole_lines(tmp_path):
    path = tmp_path / "rank-0.log"
    tail = FileTail(path)
    assert tail.read_lines() == []                 # not there yet
    path.write_text("one\ntw")
    assert tail.read_lines() == ["one"]
    with open(path, "a") as f:
        f.write("o\nthree\n")
    assert tail.read_lines() == ["two", "three"]
    assert tail.read_lines() == []


def test_file_tail_drains_a_rotated_log_before_the_new_one(tmp_path):
    path = tmp_path / "rank-0.log"
    path.write_text("a\n")
    tail = FileTail(path)
    assert tail.read_lines() == ["a"]
    with open(path, "a") as f:
        f.write("b\n")
    os.replace(path, tmp_path / "rank-0.log.1")     # the supervisor's rotation
    path.write_text("c\n")
    assert tail.read_lines() == ["b", "c"]


def test_file_tail_starts_near_the_end_of_a_big_file(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    lines = FileTail(path, window=4096).read_lines()
    assert lines[-1] == "line 99999"
    assert 300 < len(lines) < 600 and all(l.startswith("line ") for l in lines)


def test_jsonl_tail_after_rewrite_returns_nothing_twice(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, max_bytes=2000)
    tail = JsonlTail(path)
    seen = []
    for i in range(100):
        writer({"t": float(i), "available": False, "reason": "x", "gpus": []})
        if i % 7 == 0:
            seen += tail.read_objects()
    seen += tail.read_objects()
    assert writer.rotations > 3
    ts = [o["t"] for o in seen]
    assert ts == sorted(set(ts)) and ts[-1] == 99.0


def test_log_lines_are_cleaned_like_a_terminal_would_show_them(tmp_path):
    assert clean_line("\r 1%|#| 1/40\r 2%|#| 2/40 [00:01<00:10]") == " 2%|#| 2/40 [00:01<00:10]"
    assert clean_line("\r100%|##########| 40/40\r 99%") == " 99%|##########| 40/40"
    assert clean_line("\x1b[1;31mERROR\x1b[0m\tboom\x07") == "ERROR   boom"
    assert clean_line("\x1b]0;window title\x07ok") == "ok"
    d = make_run(tmp_path, ranks=1)
    f = RunFollower(d)
    f.poll()
    with open(d / "logs" / "attempt-1" / "rank-0.log", "a") as fh:
        fh.write("\r 10%|#| 4/40\r 12%|#| 5/40{'loss': 2.5}\n\x1b[33mwarning\x1b[0m\n")
    assert [l.text for l in f.poll().lines] == [" 12%|#| 5/40{'loss': 2.5}", "warning"]


def test_follower_switches_attempts_and_shows_events(tmp_path):
    d = make_run(tmp_path, ranks=2)
    f = RunFollower(d)
    u = f.poll()
    assert u.run_changed and f.run["status"] == "running"
    assert len(u.samples) == 70 and len(u.events) == 60
    assert [(l.rank, l.text) for l in u.lines[:3]] == [
        (0, "step 0 rank 0: {'loss': 3.0000, 'learning_rate': 2e-05, 'epoch': 0.00}"),
        (1, "step 0 rank 1: {'loss': 3.0000, 'learning_rate': 2e-05, 'epoch': 0.00}"),
        (LAUNCHER, "The following values were not passed to `accelerate launch` and had defaults used instead:")]
    assert not f.poll()                                       # nothing new
    with open(d / "logs" / "attempt-1" / "rank-1.log", "a") as fh:
        fh.write("last words of attempt 1\n")
    (d / "logs" / "attempt-2").mkdir()
    (d / "logs" / "attempt-2" / "rank-0.log").write_text("hello from attempt 2\n")
    with open(d / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"t": NOW, "type": "restart", "attempt": 2, "message": "stall: restarting"}) + "\n")
    update_run(d, attempt=2, status="running")
    u = f.poll()
    assert [(l.attempt, l.rank, l.text) for l in u.lines] == [
        (1, 1, "last words of attempt 1"), (2, WIZARD, "── attempt 2 ──"),
        (2, 0, "hello from attempt 2"), (2, WIZARD, "restart: stall: restarting")]
    f.close()


# ---------------------------------------------------------------- control requests

def test_send_control_writes_the_request_and_signals(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    r = send_control(d, "restart", now=lambda: NOW)
    assert r.written and r.signalled and "SIGUSR1" in r.message
    assert signals_received(supervisor) == ["SIGUSR1"]
    body = control(d)
    assert body["request"] == "restart" and body["t"] == NOW and body["from"] == "view"
    assert len(body["id"]) == 32 and body["pid"] == os.getpid()
    with pytest.raises(ValueError):
        send_control(d, "pause")


def test_send_control_leaves_a_finished_run_alone(tmp_path, supervisor):
    # a finished run's supervisor_pid may belong to another process by now
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    update_run(d, status="succeeded", exit_code=0)
    r = send_control(d, "stop")
    assert not r.written and not r.signalled and "succeeded" in r.message
    assert signals_received(supervisor, wait=0.5) == []
    assert not (d / CONTROL_FILE).exists()


def test_send_control_signals_no_process_that_is_not_the_runs_supervisor(tmp_path, decoy_of_the_user):
    """Issue 37 finding 3: a process of the user's whose pid and real start time were copied into run.json as the
    supervisor's is not signalled (it does not hold the run's lock); the request still goes to control.json."""
    d = make_run(tmp_path, supervisor_pid=decoy_of_the_user.pid)
    for request in ("stop", "kill", "restart"):
        r = send_control(d, request)
        assert r.written and not r.signalled, r.message
    assert signals_received(decoy_of_the_user, wait=0.5) == []


@pytest.fixture
def decoy_of_the_user():
    proc = subprocess.Popen([sys.executable, "-c", DUMMY_SUPERVISOR.replace(HOLD_THE_LOCK, "")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def test_send_control_checks_the_supervisor_is_the_same_process(tmp_path, supervisor):
    import psutil
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    started = psutil.Process(supervisor.pid).create_time()
    update_run(d, supervisor_create_time=started - 100)      # the pid now belongs to someone else
    r = send_control(d, "stop")
    assert r.written and not r.signalled
    assert signals_received(supervisor, wait=0.5) == []
    update_run(d, supervisor_create_time=started)
    assert send_control(d, "stop").signalled
    assert signals_received(supervisor) == ["SIGTERM"]


def test_exit_codes():
    running, failed = {"status": "running"}, {"status": "failed", "exit_code": 3}
    assert exit_code_for(DETACHED, running, True) == 0
    assert exit_code_for(QUIT, failed, True) == 3
    assert exit_code_for(QUIT, failed, False) == 0
    assert exit_code_for(QUIT, {"status": "failed"}, True) == 1
    assert exit_code_for(QUIT, {"status": "succeeded", "exit_code": 0}, True) == 0
    assert exit_code_for(STOPPED, running, True) == 130


def test_run_view_without_a_terminal_prints_the_status(tmp_path, capsys):
    d = make_run(tmp_path, "failed")
    assert run_view(d, owned=False) == 0          # pytest's stdout is not a TTY
    out = capsys.readouterr().out
    assert "failed" in out and "cuda_oom on rank 3" in out and "--zero-stage 3" in out
    assert run_view(tmp_path / "nowhere", owned=False) == 2


# ---------------------------------------------------------------- the app (Pilot)

async def test_running_run_shows_header_gpus_and_logs(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        header = app.query_one(Header).plain
        assert "RUNNING" in header and "attempt 1/3" in header and "elapsed 12:34" in header
        assert "step 120/500" in header and "24%" in header and "ETA 01:51" in header
        gpus = app.query_one(GpuPanel).plain.splitlines()
        assert gpus[0].startswith("8 × NVIDIA H100 80GB HBM3")
        assert len(gpus) == 9 and all("/79.6G" in g and "/700W" in g for g in gpus[1:])
        assert app.query_one(TrainLine).plain.startswith("loss ")
        pane = app.query_one(LogPane)
        assert len(pane.view) == 8 * 6 + 1 and pane.follow
        assert pane.scroll_y == pane.max_scroll_y > 0       # following: at the newest line
        assert app.query_one("#failure").display is False
        assert app.poll_errors == 0


async def test_new_lines_are_tailed_and_the_pane_is_bounded(tmp_path):
    d = make_run(tmp_path, ranks=2)
    app = frozen_app(d, follow_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(LogPane)
        with open(d / "logs" / "attempt-1" / "rank-1.log", "a") as f:
            f.writelines(f"burst {i}\n" for i in range(6000))
        await pilot.pause(0.5)                              # two or more follow ticks
        assert len(pane.entries) == 5000
        assert pane.entries[-1].text == "burst 5999" and pane.entries[-1].rank == 1
        await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y


async def test_digits_pick_a_rank_and_a_shows_all(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(LogPane)
        await pilot.press("3")
        assert pane.rank == 3 and len(pane.view) == 6
        assert {l.rank for l in pane.view} == {3}
        assert pane.border_title.startswith("rank 3")
        await pilot.press("a")
        assert pane.rank is None and len(pane.view) == 49


async def test_search_highlights_and_n_moves_between_matches(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("slash")
        box = app.query_one("#search")
        assert box.display and box.has_focus
        await pilot.press(*"step", "space", *"60", "enter")
        pane = app.query_one(LogPane)
        assert pane.pattern == "step 60" and len(pane.matches) == 8
        assert pane.current == 7 and not pane.follow and not box.display
        assert "/step 60/ 8/8 matches" in pane.border_title
        await pilot.press("n")
        assert pane.current == 0
        await pilot.pause()
        y = pane.matches[0]
        assert pane.scroll_y <= y < pane.scroll_y + pane.size.height
        strip = pane.render_line(y - pane.scroll_y)
        lit = [seg.text for seg in strip if seg.style and seg.style.bgcolor is not None
               and seg.style.bgcolor.name.lower() == "#ff8700"]
        assert "".join(lit).lower() == "step 60"
        await pilot.press("N")
        assert pane.current == 7
        await pilot.press("escape")                       # clears the search
        assert pane.pattern is None and pane.matches == []


async def test_follow_pause_and_resume(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d, follow_interval=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        pane = app.query_one(LogPane)
        await pilot.press("f")
        assert not pane.follow and "paused" in pane.border_title
        pane.scroll_to(y=0, animate=False, immediate=True)
        with open(d / "logs" / "attempt-1" / "rank-0.log", "a") as f:
            f.write("new line while paused\n")
        app.poll()
        await pilot.pause()
        assert pane.scroll_y == 0 and pane.view[-1].text == "new line while paused"
        await pilot.press("space")
        await pilot.pause()
        assert pane.follow and pane.scroll_y == pane.max_scroll_y


async def test_s_stops_with_a_countdown_and_a_second_s_kills(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("s")
        assert signals_received(supervisor) == ["SIGTERM"]
        assert control(d)["request"] == "stop"
        await pilot.pause()
        assert "stopping: kill in 30 s" in app.query_one(Header).plain
        await pilot.press("s")
        assert signals_received(supervisor) == ["SIGUSR2"]
        assert control(d)["request"] == "kill"


async def test_s_really_terminates_a_plain_process(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK + "import time\nprint('ready', flush=True)\n"
                                "time.sleep(60)", str(tmp_path / RUN_NAME / "run.lock")], stdout=subprocess.PIPE,
                               text=True)
    assert sleeper.stdout.readline().strip() == "ready"
    try:
        d = make_run(tmp_path, supervisor_pid=sleeper.pid)
        app = frozen_app(d)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("s")
        assert sleeper.wait(timeout=10) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_r_restarts_only_on_a_second_press(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("r")
        assert signals_received(supervisor, wait=0.5) == []
        assert "press r again" in app.query_one(Header).plain
        await pilot.press("r")
        assert signals_received(supervisor) == ["SIGUSR1"]
        assert control(d)["request"] == "restart"


async def test_q_on_an_owned_running_run_asks_first(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d, owned=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, QuitModal)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, QuitModal) and app.is_running
        await pilot.press("ctrl+q")                       # Textual's quit key asks too
        await pilot.pause()
        assert isinstance(app.screen, QuitModal)
        await pilot.press("s")                            # "Stop run"
        await pilot.pause()
    assert app.return_value == STOPPED
    assert signals_received(supervisor) == ["SIGTERM"]


async def test_q_then_leave_running_detaches(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d, owned=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
        await pilot.click("#detach")
        await pilot.pause()
    assert app.return_value == DETACHED


@pytest.mark.parametrize("owned,detached", [(False, False), (True, True)])
async def test_q_on_an_attached_or_detached_run_just_quits(tmp_path, owned, detached):
    d = make_run(tmp_path)
    update_run(d, detached=detached)
    app = frozen_app(d, owned=owned)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        await pilot.pause()
    assert app.return_value == QUIT


def ack_detach(run_dir: Path, within: float = 5.0) -> None:
    """What the supervisor does with a detach request: mark the run detached (a thread here)."""
    import threading

    def work():
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                if control(run_dir)["request"] == "detach":
                    update_run(run_dir, detached=True)
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
    threading.Thread(target=work, daemon=True).start()


async def test_d_detaches_and_leaves_the_run_alone(tmp_path, supervisor):
    """`d` on a run this view started: the supervisor is asked to detach (control.json, no
    signal) and the view leaves only once run.json says it has."""
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d, owned=True)
    async with app.run_test(size=(80, 24)) as pilot:
        ack_detach(d)
        await pilot.press("d")
        for _ in range(50):
            await pilot.pause(0.1)
            if app.return_value is not None:
                break
    assert app.return_value == DETACHED
    assert control(d)["request"] == "detach"
    assert exit_code_for(app.return_value, json.loads((d / "run.json").read_text()), True) == 0
    assert signals_received(supervisor, wait=0.5) == [] and supervisor.poll() is None


async def test_d_without_an_answer_stays_and_says_so(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d, owned=True)
    async with app.run_test(size=(80, 24)) as pilot:
        app._detach_deadline = None
        await pilot.press("d")
        app._detach_deadline = time.monotonic()          # no supervisor answers: give up at once
        await pilot.pause(0.4)
        assert app.return_value is None
        assert "detach not confirmed" in app.query_one(Header).plain


async def test_failed_run_shows_the_failure_panel(tmp_path, supervisor):
    d = make_run(tmp_path, "failed", supervisor_pid=supervisor.pid)
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.query_one("#failure").display
        text = app.query_one(FailurePanel).plain
        for expected in ("CUDA out of memory on rank 3", "exit code 1", "CUDA out of memory", "hint: activations",
                         "next rung: ZeRO-3", "try: wizard --non-interactive --params 7B --backend deepspeed",
                         "last 4 lines of rank 3", "trainer.train()"):
            assert expected in text
        header = app.query_one(Header).plain
        assert "FAILED" in header and "elapsed 11:40" in header and "ETA" not in header
        pane = app.query_one(LogPane)
        assert pane.rank == 3 and pane.view[-1].text.startswith("exit: ")
        assert any("torch.OutOfMemoryError" in l.text for l in pane.view)
        await pilot.press("s")                            # finished: nothing is signalled
        assert "already failed" in app.query_one(Header).plain
        assert signals_received(supervisor, wait=0.5) == []
        await pilot.press("q")                            # finished: no question asked
        await pilot.pause()
    assert app.return_value == QUIT
    assert exit_code_for(QUIT, json.loads((d / "run.json").read_text()), True) == 1


async def test_no_gpu_metrics_state(tmp_path):
    d = make_run(tmp_path, "nogpu")
    app = frozen_app(d)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = app.query_one(GpuPanel).plain
        assert text.startswith("No GPU metrics on this machine")
        assert "NVML Shared Library Not Found" in text
        assert "RUNNING" in app.query_one(Header).plain and len(app.query_one(LogPane).view) == 49


async def test_status_changes_are_followed(tmp_path):
    d = make_run(tmp_path)
    app = frozen_app(d, follow_interval=0.1)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        update_run(d, status="succeeded", ended_at=T0 + 900, exit_code=0,
                   progress={"step": 500, "total": 500, "rate": 3.5, "eta_s": 0, "loss": 1.2})
        await pilot.pause(0.4)
        header = app.query_one(Header).plain
        assert "SUCCEEDED" in header and "step 500/500" in header and "100%" in header
        assert "elapsed 15:00" in header


@pytest.mark.parametrize("imports,forbidden", [
    ("import launch.view, launch.metrics",
     ("torch", "transformers", "deepspeed", "accelerate")),
    # the follower, send_control and the sampler serve `wizard stop` and the supervisor: no UI
    ("import launch.follow, launch.metrics", ("textual", "torch")),
])
def test_import_hygiene(imports, forbidden):
    code = (f"import sys; {imports}; "
            f"bad = [m for m in {forbidden!r} if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- snapshots

async def _settle(pilot) -> None:
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("kind,size", [
    ("running", (80, 24)), ("running", (120, 40)), ("failed", (80, 24)), ("failed", (120, 40)),
    ("nogpu", (80, 24)),
], ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else v)
def test_snapshot(tmp_path, snap_compare, kind, size):
    app = frozen_app(make_run(tmp_path, kind))
    assert snap_compare(app, terminal_size=size, run_before=_settle)


def test_snapshot_light_theme(tmp_path, snap_compare):
    app = frozen_app(make_run(tmp_path))
    app.theme = "textual-light"
    assert snap_compare(app, terminal_size=(80, 24), run_before=_settle)


def test_snapshot_search_on_one_rank(tmp_path, snap_compare):
    app = frozen_app(make_run(tmp_path))
    assert snap_compare(app, terminal_size=(80, 24), run_before=_settle,
                        press=["2", "slash", *"loss", "enter"])


def test_snapshot_quit_question(tmp_path, snap_compare):
    app = frozen_app(make_run(tmp_path), owned=True)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_settle, press=["q"])


# ------------------------------------------------------------------ issue 11

async def test_a_supervisor_that_dies_shows_lost_within_5_s(tmp_path):
    """SIGKILL of the supervisor: the open view says LOST (and run.json, and an event) within 5 s,
    and what of the run was left (a tracked worker, verified by its start time) is ended."""
    import psutil
    sup = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                              env={**os.environ, "WIZARD_RUN_DIR": str(tmp_path / RUN_NAME)})    # the run's
    try:
        d = make_run(tmp_path, supervisor_pid=sup.pid)
        update_run(d, tracked_pids=[worker.pid],
                   process_times={str(worker.pid): psutil.Process(worker.pid).create_time()})
        app = make_view_app(d, owned=False, follow_interval=0.2, clock=lambda: NOW)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.5)
            assert "RUNNING" in app.query_one(Header).plain
            sup.kill()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5 and "LOST" not in app.query_one(Header).plain:
                await pilot.pause(0.1)
            header = app.query_one(Header).plain
            assert "LOST" in header and "supervisor" in header and "is gone" in header, header
            await pilot.press("s")
            await pilot.pause()
            assert "already lost" in app.query_one(Header).plain
        run = json.loads((d / "run.json").read_text())
        assert run["status"] == "lost" and run["lost_cleaned"] == [worker.pid]
        assert worker.wait(10) is not None
        assert any(json.loads(x)["type"] == "lost" for x in (d / "events.jsonl").read_text().splitlines())
    finally:
        for p in (sup, worker):
            p.kill()
            p.wait()


async def test_question_mark_shows_the_keys_and_ctrl_c_asks_like_q(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    app = frozen_app(d, owned=True)
    async with app.run_test(size=(160, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        header = app.query_one(Header).plain
        assert "s stop" in header and "d detach" in header and "q quit" in header, header
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert isinstance(app.screen, QuitModal)


def test_progress_curve_restarts_with_the_attempt():
    from launch.follow import Update, ViewState
    st = ViewState()
    st.apply(Update(events=[{"type": "train_log", "attempt": 1, "loss": 3.0}]), {"attempt": 1})
    assert list(st.loss) == [3.0]
    st.apply(Update(events=[{"type": "train_log", "attempt": 1, "loss": 2.9},
                            {"type": "train_log", "attempt": 2, "loss": 4.0}]), {"attempt": 2})
    assert list(st.loss) == [4.0]


async def test_a_user_restart_does_not_make_attempt_2_of_1(tmp_path, supervisor):
    d = make_run(tmp_path, supervisor_pid=supervisor.pid)
    update_run(d, attempt=2, max_restarts=0, user_restarts=1)
    app = frozen_app(d, owned=False)
    async with app.run_test(size=(100, 24)) as pilot:
        await pilot.pause()
        assert "attempt 2/2" in app.query_one(Header).plain
