"""`wizard launch` with real processes on this CPU box (issue 4, tests 1-5).

Ranks are real: `accelerate launch` -> torchrun -> 2 Python processes over gloo, training
examples/train.py (a tiny Llama under the HF Trainer). Tests 2-5 use a plain 2-process torchrun
config (distributed_type MULTI_GPU; the script picks gloo on CPU); test 1 uses the DeepSpeed ZeRO-3
config the wizard itself writes. Nothing is faked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.launch_support import alive as still_alive
from tests.launch_support import env, kill_verified, run_pids, run_processes, state, wait_for

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")

pytestmark = pytest.mark.slow




def wizard(*args: str) -> list[str]:
    return [sys.executable, "-m", "wizard", *args]


def ddp_config(tmp_path: Path) -> Path:
    """2 local processes through torchrun (accelerate's multi_gpu_launcher); gloo on CPU."""
    cfg = tmp_path / "ddp2.yaml"
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
        "num_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\ngpu_ids: all\n"
        "main_process_port: 0\nrdzv_backend: static\nsame_network: true\nmain_training_function: main\n")
    return cfg


def events(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        out.append(json.loads(line))
    return out








def kill_everything(st: dict) -> None:
    """SIGKILL what is left of a run: only pids that still have the start time the run recorded (the
    supervisor's included), so a pid reused by another process on the machine is never hit."""
    kill_verified(run_processes(st))


# ------------------------------------------------------------------ 1. DeepSpeed ZeRO-3, 2 ranks

@pytest.mark.timeout(900)
def test_deepspeed_zero3_two_ranks_trains_and_proves_partitioning(tmp_path):
    out_dir = tmp_path / "accelerate"
    w = subprocess.run(wizard("--non-interactive", "--backend", "deepspeed", "--zero-stage", "3",
                              "--num-processes", "2", "--params", "1M", "--hidden-size", "64", "--layers", "2",
                              "--vocab-size", "128", "--output-dir", str(out_dir)),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert w.returncode == 0, w.stdout + w.stderr
    cfg = out_dir / "default_config.yaml"
    assert "DEEPSPEED" in cfg.read_text()
    run_dir = tmp_path / "run"
    r = subprocess.run(wizard("launch", "--headless", "--config-file", str(cfg), "--run-dir", str(run_dir),
                              "--status-interval", "5", "--grace", "10", "--", TRAIN, "--steps", "6"),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=840)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    st = state(run_dir)
    assert st["status"] == "succeeded" and st["exit_code"] == 0
    assert st["ds_config"] == str(out_dir / "ds_config.json")
    for rank in (0, 1):
        log = (run_dir / "logs" / "attempt-1" / f"rank-{rank}.log").read_text()
        engine = [ln for ln in log.splitlines() if "engine=" in ln]
        assert engine, log[-3000:]
        line = engine[0]
        # the full parameter has ds_numel elements, this rank holds half: ZeRO-3 partitioning
        assert f"[rank{rank}]" in line and "engine=deepspeed zero_stage=3 partitioned=True" in line, line
        fields = dict(kv.split("=") for kv in line.split() if "=" in kv)
        assert int(fields["local_numel"]) * 2 == int(fields["ds_numel"]) and fields["world_size"] == "2"
    losses = [e["loss"] for e in events(run_dir) if e["type"] == "train_log"]
    assert len(losses) >= 6 and all(isinstance(x, float) for x in losses)
    assert "[rank0]" in r.stdout and "[rank1]" in r.stdout and "[wizard] attempt 1/1" in r.stdout
    assert not still_alive(run_pids(st))


# ------------------------------------------------------------------ 2. a rank raises

def wizard_deepspeed_config(tmp_path: Path, stage: str = "3") -> Path:
    """The 2-process DeepSpeed config the wizard itself writes on this GPU-less box (CPU accelerator, gloo)."""
    out_dir = tmp_path / "accelerate"
    w = subprocess.run(wizard("--non-interactive", "--backend", "deepspeed", "--zero-stage", stage,
                              "--num-processes", "2", "--params", "1M", "--hidden-size", "64", "--layers", "2",
                              "--vocab-size", "128", "--output-dir", str(out_dir)),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert w.returncode == 0, w.stdout + w.stderr
    return out_dir / "default_config.yaml"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["ddp", "deepspeed"])
def test_exception_on_rank1_is_classified_and_nothing_is_left(tmp_path, backend):
    """Under torchrun's DDP and under the wizard's own DeepSpeed CPU config (where the rank's traceback
    starts on the line of its last progress bar)."""
    run_dir = tmp_path / "run"
    cfg = ddp_config(tmp_path) if backend == "ddp" else wizard_deepspeed_config(tmp_path)
    r = subprocess.run(wizard("launch", "--headless", "--config-file", str(cfg),
                              "--run-dir", str(run_dir), "--grace", "10", "--",
                              TRAIN, "--steps", "50", "--fail-on-rank", "1", "--fail-at-step", "2"),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=800)
    st = state(run_dir)
    # The failing rank's own exit code: 1 from the uncaught exception, or 134 when torch's gloo threads
    # abort the interpreter on the way out after it ("terminate called without an active exception"),
    # which happens on some runs of the same script.
    assert r.returncode in (1, 134), r.stdout[-4000:]
    assert st["status"] == "failed" and st["exit_code"] == r.returncode
    c = st["classification"]
    assert c["kind"] == "python_exception" and c["rank"] == 1, c
    assert "RuntimeError" in c["summary"] and "deliberate failure on rank 1" in c["summary"]
    assert any("deliberate failure on rank 1" in ln for ln in c["log_tail"]) and len(c["log_tail"]) <= 30
    assert any("Traceback" in ln or "File " in ln for ln in c["log_tail"])
    # the failure report on stdout carries the traceback tail
    assert "attempt 1 failed (python_exception)" in r.stdout and "last 30 lines of rank 1" in r.stdout
    failure = [e for e in events(run_dir) if e["type"] == "failure"]
    assert failure and failure[0]["rank"] == 1
    pids = run_pids(st)
    assert len(pids) >= 3            # launcher + 2 ranks at least
    assert not still_alive(pids), still_alive(pids)


# ------------------------------------------------------------------ 3. supervisor SIGKILLed

@pytest.mark.timeout(300)
def test_sigkill_to_supervisor_leaves_no_worker(tmp_path):
    run_dir = tmp_path / "run"
    sup = subprocess.Popen(wizard("launch", "--headless", "--quiet-ranks", "--config-file", str(ddp_config(tmp_path)),
                                  "--run-dir", str(run_dir), "--", TRAIN, "--steps", "100000", "--sleep", "0.2"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=tmp_path)
    st = {}
    try:
        st = wait_for(lambda: (lambda s: s if len(s.get("pids") or {}) == 2 and (s.get("progress") or {}).get("step")
                               else None)(state(run_dir)), 180)
        assert st, f"ranks never started: {state(run_dir)}"
        time.sleep(1.0)                       # one more scan: every descendant recorded
        st = state(run_dir)
        pids = run_pids(st)
        assert len(still_alive(pids)) >= 3
        sup.kill()
        sup.wait(10)
        t0 = time.monotonic()
        left = wait_for(lambda: not still_alive(pids), 10, every=0.2)
        assert left, f"still alive {time.monotonic() - t0:.1f} s after SIGKILL: {still_alive(pids)}"
    finally:
        if sup.poll() is None:
            sup.kill()
        kill_everything(st or state(run_dir))


# ------------------------------------------------------------------ 4. a rank hangs

@pytest.mark.timeout(400)
def test_stall_detected_torn_down_and_restarted(tmp_path):
    """Rank 1 hangs at step 3 in the first attempt only (a transient hang): the stall is declared, the
    attempt torn down and blamed on rank 1, and the restart trains to the end."""
    run_dir = tmp_path / "run"
    r = subprocess.run(wizard("launch", "--headless", "--config-file", str(ddp_config(tmp_path)),
                              "--run-dir", str(run_dir), "--stall-timeout", "30", "--max-restarts", "1",
                              "--grace", "5", "--", TRAIN, "--steps", "6", "--hang-on-rank", "1",
                              "--hang-at-step", "3", "--hang-attempts", "1"),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=380)
    st = state(run_dir)
    ev = events(run_dir)
    assert r.returncode == 0, r.stdout[-4000:]
    stalls = [e for e in ev if e["type"] == "stall"]
    assert [e["attempt"] for e in stalls] == [1], stalls
    assert any(e["type"] == "restart" and e["attempt"] == 2 for e in ev)
    # the stall came after the hang, not from a slow start
    assert "hanging at step 3" in (run_dir / "logs" / "attempt-1" / "rank-1.log").read_text()
    assert "hanging" not in (run_dir / "logs" / "attempt-2" / "rank-1.log").read_text()
    assert st["attempt"] == 2 and st["status"] == "succeeded", st
    # the stall is rank 1's (it hangs in a callback) although rank 0 went quiet first: the ranks'
    # stacks (faulthandler, asked for on the stall) show rank 0 waiting for it
    first = [e for e in ev if e["type"] == "failure" and e["attempt"] == 1][0]
    assert first["kind"] == "stall" and first["rank"] == 1, first
    assert "rank 1 stalled at on_step_begin" in first["summary"], first
    assert "(most recent call first)" in (run_dir / "logs" / "attempt-1" / "rank-0.log").read_text()
    assert not still_alive(run_pids(st))


@pytest.mark.timeout(400)
def test_a_hang_in_the_first_step_is_found_and_blamed_as_a_later_one(tmp_path):
    """Rank 1 hangs before its first step ends (global step 0): the silence is counted from the attempt's
    start, the stall is declared, the stacks taken and rank 1 blamed, exactly as for a hang at step 3."""
    run_dir = tmp_path / "run"
    r = subprocess.run(wizard("launch", "--headless", "--config-file", str(ddp_config(tmp_path)),
                              "--run-dir", str(run_dir), "--stall-timeout", "30", "--grace", "5", "--",
                              TRAIN, "--steps", "100000", "--hang-on-rank", "1", "--hang-at-step", "0"),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=380)
    st = state(run_dir)
    assert r.returncode == 124, r.stdout[-4000:]
    assert "hanging at step 0" in (run_dir / "logs" / "attempt-1" / "rank-1.log").read_text()
    assert (st.get("progress") or {}).get("step") in (None, 0)          # no step ever completed
    c = st["classification"]
    assert c["kind"] == "stall" and c["rank"] == 1 and "rank 1 stalled at on_step_begin" in c["summary"], c
    assert "silent" in c["hint"] and "py-spy" in c["hint"], c
    assert not still_alive(run_pids(st))


# ------------------------------------------------------------------ 5. detach, SIGHUP, attach, stop

@pytest.mark.timeout(400)
def test_detached_run_survives_hangup_then_attach_and_stop(tmp_path):
    run_dir = tmp_path / "run"
    cmd = " ".join(wizard("launch", "--detach", "--config-file", str(ddp_config(tmp_path)), "--run-dir",
                          str(run_dir), "--grace", "10", "--", TRAIN, "--steps", "100000", "--sleep", "0.3"))
    # the "terminal": a shell in its own session that launches, then waits like an interactive login
    shell = subprocess.Popen(["bash", "-c", f"{cmd}; echo launched; sleep 600"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env(), cwd=tmp_path, start_new_session=True)
    st = {}
    try:
        first = shell.stdout.readline().strip()
        assert first == str(run_dir)
        assert shell.stdout.readline().strip() == "launched"        # launch returned (exit 0 path)
        os.killpg(shell.pid, signal.SIGHUP)                         # the SSH connection drops
        shell.wait(10)
        assert shell.returncode == -signal.SIGHUP
        # the run goes on: training keeps making steps after the hangup
        st = wait_for(lambda: (lambda s: s if (s.get("progress") or {}).get("step") else None)(state(run_dir)), 180)
        assert st and st["status"] == "running" and st["detached"] is True, state(run_dir)
        step0 = st["progress"]["step"]
        assert wait_for(lambda: (state(run_dir).get("progress") or {}).get("step", 0) > step0 + 2, 60)
        assert psutil.pid_exists(st["supervisor_pid"])
        # attach (headless: no TTY here) shows the run
        a = subprocess.run(wizard("attach", "--no-follow", str(run_dir)), capture_output=True, text=True,
                           env=env(), cwd=tmp_path, timeout=60)
        assert a.returncode == 0 and "status running" in a.stdout and "[rank0]" in a.stdout, a.stdout
        # stop from another shell: graceful, and then nothing is left
        st = state(run_dir)
        pids = run_pids(st)
        s = subprocess.run(wizard("stop", str(run_dir)), capture_output=True, text=True, env=env(),
                           cwd=tmp_path, timeout=120)
        assert s.returncode == 0, s.stdout + s.stderr
        assert "stopped" in s.stdout
        st = state(run_dir)
        assert st["status"] == "stopped" and st["exit_code"] == 130
        assert st["stop_reason"] == "stop requested (`wizard stop`)", st       # `wizard runs` shows it
        assert any(e["type"] == "stop" for e in events(run_dir))
        assert not still_alive(pids | run_pids(st)), still_alive(pids)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        kill_everything(state(run_dir))       # the supervisor too, when it is still the run's
