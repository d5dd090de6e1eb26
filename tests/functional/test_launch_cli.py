"""`wizard launch/attach/stop` CLI without training: bad input, sbatch emission, light imports, a
single-process (simple_launcher) run attributed to rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch_support import child_pythonpath

REPO = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=child_pythonpath())
    return e


def wizard(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, env=env(),
                          cwd=cwd, timeout=timeout)


@pytest.mark.timeout(120)
def test_bad_input_exits_2_with_the_field_named(tmp_path):
    r = wizard("launch", "--headless", "--", "missing_script.py", cwd=tmp_path)
    assert r.returncode == 2 and "SCRIPT" in r.stderr and "missing_script.py" in r.stderr
    r = wizard("launch", "--max-restarts", "-1", "--", "x", cwd=tmp_path)
    assert r.returncode == 2 and "--max-restarts" in r.stderr
    r = wizard("launch", "--config-file", str(tmp_path / "nope.yaml"), "--", "x", cwd=tmp_path)
    assert r.returncode == 2 and "--config-file" in r.stderr
    r = wizard("stop", cwd=tmp_path)
    assert r.returncode == 2 and "RUN_DIR" in r.stderr
    r = wizard("attach", str(tmp_path / "none"), cwd=tmp_path)
    assert r.returncode == 2 and "RUN_DIR" in r.stderr
    assert not (tmp_path / "wizard-runs").exists()       # nothing created on bad input


@pytest.mark.timeout(120)
def test_emit_slurm_writes_a_valid_sbatch_script(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 16\n")
    out = tmp_path / "job.sbatch"
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(cfg), "--max-restarts", "2",
               "--slurm-output", str(out), "--", "train.py", "--lr", "it's 1e-4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    # what each node needs: 8 GPUs (16 processes over 2 machines), CPUs for their ranks
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --cpus-per-task=32" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    assert '--machine-rank "$SLURM_NODEID"' in text and '--main-process-ip "$MAIN_ADDR"' in text
    assert "--headless" in text and f"--config-file {cfg}" in text and "--max-restarts 2" in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    argv, first = _per_node_argv(text, job_id="77")
    # no port in the config: derived from the job id (20000 + 77), not a fixed 29500
    assert first == "main node: node-a (node-a:20077), nodes: 2", first
    assert argv[:9] == ["launch", "--machine-rank", "1", "--main-process-ip", "node-a", "--main-process-port",
                        "20077", "--run-dir", "wizard-runs/slurm-77/node-1"], argv
    assert argv[-4:] == ["--", "train.py", "--lr", "it's 1e-4"]


def _per_node_argv(text: str, job_id: str) -> tuple[list[str], str]:
    """The per-node command line, as each task's bash would see it (srun and scontrol stubbed)."""
    import re
    fake = re.sub(r"srun [^']*bash -c", "bash -c", text).replace(
        'scontrol show hostnames "$SLURM_JOB_NODELIST"', "printf 'node-a\\nnode-b\\n'").replace(
        'scontrol show node "$MAIN_NODE"', "true").replace('exec $WIZARD launch', 'printf "%s\\n" launch')
    r = subprocess.run(["bash", "-c", fake], capture_output=True, text=True,
                       env={**env(), "SLURM_NODEID": "1", "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": "2",
                            "SLURM_JOB_NODELIST": "node-[a-b]"})
    lines = r.stdout.splitlines()
    assert lines, r.stderr
    return lines[1:], lines[0]


@pytest.mark.timeout(120)
def test_emit_slurm_takes_the_config_port_and_cpu_needs_and_refuses_a_node_mismatch(tmp_path):
    cfg = tmp_path / "cpu.yaml"
    cfg.write_text("distributed_type: MULTI_CPU\nuse_cpu: true\nnum_machines: 2\nnum_processes: 4\n"
                   "main_process_port: 29611\n")
    out = tmp_path / "job.sbatch"
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(cfg), "--slurm-output", str(out), "--",
               "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=2" in text
    argv, first = _per_node_argv(text, job_id="5")
    assert first.endswith(":29611), nodes: 2") and argv[6] == "29611"
    # a 1-machine config on 2 nodes would train two independent copies: refused
    one = tmp_path / "one.yaml"
    one.write_text("distributed_type: MULTI_GPU\nnum_machines: 1\nnum_processes: 8\n")
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(one), "--slurm-output", str(tmp_path / "x"),
               "--", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "--emit-slurm" in r.stderr and "num_machines is 1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.timeout(300)
def test_emit_slurm_asks_for_the_plans_host_ram_plus_the_processes_rss_and_says_how(tmp_path):
    """A 2-node ZeRO-3 + CPU offload config the wizard wrote: --mem is the plan's host-RAM need plus 10% plus
    the RSS of 8 GPU ranks and the launch processes, never the bare figure (a cgroup OOM kill waiting to happen)."""
    import math
    import re
    out_dir = tmp_path / "acc"
    w = wizard("--non-interactive", "--assume", "8xH100-80GB,ram=1024G", "--params", "13B", "--num-machines", "2",
               "--machine-rank", "0", "--main-process-ip", "10.0.0.1", "--backend", "deepspeed", "--zero-stage", "3",
               "--offload", "cpu", "--output-dir", str(out_dir), cwd=tmp_path, timeout=280)
    assert w.returncode == 0, w.stdout + w.stderr
    need_gib = json.loads((out_dir / "wizard_plan.json").read_text())["plan"]["choice"]["cpu_bytes"] / 2**30
    assert need_gib > 50
    out = tmp_path / "job.sbatch"
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(out_dir / "default_config.yaml"),
               "--slurm-output", str(out), "--", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    mem = int(re.search(r"^#SBATCH --mem=(\d+)G$", text, re.M).group(1))
    assert mem == math.ceil(need_gib * 1.10 + 8 * 3 + 1), (mem, need_gib)
    assert mem >= math.ceil(need_gib) + 25
    assert "#SBATCH --gpus-per-node=8" in text
    # the script says how: the plan's figure, the margin, the ranks' RSS, the total
    assert f"# --mem={mem}G per node, from the wizard's plan" in text
    assert f"{need_gib:7.1f} GiB  the plan's host-RAM need on a node" in text
    assert "8 GPU ranks x 3 GiB" in text and f"rounded up to {mem}G" in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0


@pytest.mark.timeout(300)
def test_emit_slurm_asks_no_gpu_for_a_config_the_wizard_wrote_for_cpu_processes(tmp_path):
    """The wizard's DeepSpeed CPU-accelerator config keeps `use_cpu: false` on purpose: the plan beside it
    (wizard_plan.json, cpu_only) is what tells the emitter that the job runs on CPU."""
    out_dir = tmp_path / "acc"
    w = wizard("--non-interactive", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "4",
               "--num-machines", "2", "--machine-rank", "0", "--main-process-ip", "10.0.0.1", "--params", "1M",
               "--hidden-size", "64", "--layers", "2", "--vocab-size", "128", "--output-dir", str(out_dir),
               cwd=tmp_path, timeout=280)
    assert w.returncode == 0, w.stdout + w.stderr
    cfg = out_dir / "default_config.yaml"
    assert "use_cpu: false" in cfg.read_text() and "DEEPSPEED" in cfg.read_text()
    out = tmp_path / "job.sbatch"
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(cfg), "--slurm-output", str(out), "--",
               "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=2" in text, text[:400]
    assert "2 CPU ranks x 1 GiB" in text and "#SBATCH --mem=" in text
    # the same YAML without the wizard's plan beside it is an ordinary GPU config
    (out_dir / "wizard_plan.json").unlink()
    r = wizard("launch", "--emit-slurm", "2", "--config-file", str(cfg), "--slurm-output", str(out), "--",
               "train.py", cwd=tmp_path)
    assert r.returncode == 0 and "#SBATCH --gpus-per-node=2" in out.read_text()


def _run_json(run_dir: Path, **over) -> None:
    run_dir.mkdir(parents=True)
    st = {"id": run_dir.name, "status": "running", "supervisor_pid": 1, "supervisor_create_time": 1.0,
          "attempt": 1, "max_restarts": 0, "pids": {}, "tracked_pids": [], "seen_pids": [], "process_times": {},
          "launcher_pid": None, "progress": {}, "started_at": 1000.0, "ended_at": None, "exit_code": None}
    st.update(over)
    (run_dir / "run.json").write_text(json.dumps(st))


@pytest.mark.timeout(120)
def test_wizard_runs_lists_every_run_with_its_true_state(tmp_path):
    """`wizard runs DIR`: each run under DIR (a SLURM job's node runs too), newest first, with the state that
    is true now: a run.json that says running for a supervisor that is gone is `lost`; nothing is written."""
    import psutil
    root = tmp_path / "wizard-runs"
    me = psutil.Process()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _run_json(root / "a-ok", status="succeeded", exit_code=0, started_at=1000.0, ended_at=1060.0)
    _run_json(root / "b-failed", status="failed", exit_code=1, started_at=2000.0, ended_at=2010.0,
              classification={"kind": "python_exception", "summary": "rank 1 failed: RuntimeError: boom"})
    _run_json(root / "c-live", status="running", supervisor_pid=me.pid, supervisor_create_time=me.create_time(),
              started_at=3000.0, progress={"step": 5, "total": 10, "loss": 1.5})
    _run_json(root / "d-dead", status="running", supervisor_pid=gone.pid, supervisor_create_time=1.0, started_at=4000.0)
    _run_json(root / "e-lost", status="lost", exit_code=137, started_at=5000.0, ended_at=5001.0, lost_by="reaper",
              lost_cause="the supervisor (pid 7) ended without recording an end")
    _run_json(root / "slurm-9" / "node-1", status="stopped", exit_code=130, started_at=6000.0, ended_at=6002.0)
    (root / "latest").symlink_to("a-ok")
    before = {p: p.read_text() for p in root.rglob("run.json")}
    r = wizard("runs", str(root), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "ATTEMPT", "EXIT", "STARTED", "DURATION", "CHECKPOINT", "DETAIL"]
    rows = {ln.split()[0]: ln.split()[1] for ln in lines[1:]}
    assert rows == {"slurm-9/node-1": "stopped", "e-lost": "lost", "d-dead": "lost", "c-live": "running",
                    "b-failed": "failed", "a-ok": "succeeded"}, r.stdout
    assert [ln.split()[0] for ln in lines[1:]] == ["slurm-9/node-1", "e-lost", "d-dead", "c-live", "b-failed", "a-ok"]
    text = r.stdout
    assert "python_exception: rank 1 failed: RuntimeError: boom" in text and "recorded by reaper" in text
    assert "step 5/10" in text and "0:01:00" in text
    assert {p: p.read_text() for p in root.rglob("run.json")} == before        # reads only
    j = wizard("runs", "--json", str(root), cwd=tmp_path)
    assert {x["id"]: x["state"] for x in json.loads(j.stdout)}["d-dead"] == "lost"
    # the default DIR is ./wizard-runs; a DIR that is not a directory is exit 2, one line
    assert [ln.split()[:2] for ln in wizard("runs", cwd=tmp_path).stdout.splitlines()] == \
        [ln.split()[:2] for ln in lines]
    bad = wizard("runs", str(tmp_path / "nope"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("wizard: DIR") and len(bad.stderr.splitlines()) == 1
    assert "runs" in wizard("--help", cwd=tmp_path).stdout


@pytest.mark.timeout(120)
def test_wizard_runs_says_what_a_succeeded_run_did_and_why_a_run_stopped(tmp_path):
    """DETAIL was empty for every succeeded run, and a trial `wizard tune` stopped at its time limit read
    `stopped 130` with nothing else, the same as a Ctrl-C (issue 29)."""
    root = tmp_path / "wizard-runs"
    _run_json(root / "a-trial", status="succeeded", exit_code=0, ended_at=1010.0, trial_done={"steps": 7})
    _run_json(root / "b-train", status="succeeded", exit_code=0, ended_at=1010.0, attempt=2,
              progress={"step": 40, "total": 40, "loss": 2.5})
    _run_json(root / "c-budget", status="stopped", exit_code=130, ended_at=1010.0,
              stop_reason="wizard tune: the trial's time limit, 42 s (what was left of --budget)")
    _run_json(root / "d-ctrl-c", status="stopped", exit_code=130, ended_at=1010.0, stop_reason="SIGINT (Ctrl-C)")
    _run_json(root / "e-old", status="stopped", exit_code=130, ended_at=1010.0)
    r = wizard("runs", str(root), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    detail = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert detail["a-trial"].endswith("tune trial: the probe ended it after 7 optimizer steps (warm-up + measured)")
    assert detail["b-train"].endswith("finished, step 40/40, loss 2.5, after 2 attempts"), r.stdout
    assert detail["c-budget"].endswith("wizard tune: the trial's time limit, 42 s (what was left of --budget)")
    assert detail["d-ctrl-c"].endswith("SIGINT (Ctrl-C)") and detail["e-old"].endswith("no reason recorded)")


@pytest.mark.timeout(120)
def test_wizard_runs_lists_a_bad_run_directory_as_one_row_and_goes_on_writing_nothing(tmp_path):
    """Issue 42 #4: run.json fields `runs` did not validate crashed it (TypeError in the sort of a mixed-type
    started_at, OverflowError / ValueError on 1e308, Infinity and NaN, AttributeError on a classification that is
    no object, TypeError on lost_cause 1e308 and stop_reason NaN), and one bad run.json stopped the whole listing.
    #5: `runs` created an empty run.lock in an active run whose supervisor is gone. Now a bad run directory is one
    row saying what is wrong, the listing goes on, and nothing under DIR changes."""
    root = tmp_path / "wizard-runs"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _run_json(root / "a-good", status="succeeded", exit_code=0, started_at=1000.0, ended_at=1060.0)
    _run_json(root / "b-dead", status="running", supervisor_pid=gone.pid, started_at=3000.0)
    bad = {"c-mixed": ({"started_at": "2026-12-06"}, "started_at"), "d-huge": ({"started_at": 1e308}, "started_at"),
           "e-inf": ({"ended_at": float("inf")}, "ended_at"), "f-nan": ({"started_at": float("nan")}, "started_at"),
           "g-class": ({"status": "failed", "classification": "x"}, "classification"),
           "h-cause": ({"status": "lost", "lost_cause": 1e308}, "lost_cause"),
           "i-reason": ({"status": "stopped", "stop_reason": float("nan")}, "stop_reason"),
           "j-pid": ({"supervisor_pid": -1}, "supervisor_pid")}
    for name, (over, _field) in bad.items():
        _run_json(root / name, **over)
    (root / "k-garbage").mkdir()
    (root / "k-garbage" / "run.json").write_text("{not json")
    if os.geteuid() == 0:
        _run_json(root / "l-theirs")
        os.chown(root / "l-theirs", 65534, 65534)
    def snapshot() -> dict:
        return {p: (p.read_bytes() if p.is_file() else None, os.stat(p).st_mtime_ns) for p in root.rglob("*")}
    before = snapshot()
    r = wizard("runs", str(root), cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert rows["a-good"].split()[1] == "succeeded" and rows["b-dead"].split()[1] == "lost"
    for name, (_over, field) in bad.items():
        assert rows[name].split()[1] == "unreadable" and f"{field}:" in rows[name], rows[name]
    assert rows["k-garbage"].split()[1] == "unreadable" and "not JSON" in rows["k-garbage"]
    if os.geteuid() == 0:
        assert rows["l-theirs"].split()[1] == "unreadable" and "belongs to uid 65534" in rows["l-theirs"]
    assert snapshot() == before
    assert not (root / "b-dead" / "run.lock").exists()                    # no lock file made to find it free
    j = wizard("runs", "--json", str(root), cwd=tmp_path)
    listed = {x["id"]: x for x in json.loads(j.stdout)}
    assert j.returncode == 0 and listed["d-huge"]["state"] == "unreadable" and listed["a-good"]["state"] == "succeeded"


def test_import_is_light():
    code = ("import sys, launch.commands, launch.supervisor, launch.classify, launch.logs, launch.rundir\n"
            "bad = [m for m in ('torch', 'transformers', 'deepspeed', 'accelerate', 'textual') if m in sys.modules]\n"
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env())
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_command_carries_yaml_only_flags():
    from launch.spec import LaunchSpec, build_command
    spec = LaunchSpec(script="t.py", script_args=["--x"], machine_rank=1, main_process_ip="10.0.0.1",
                      main_process_port=1234)
    accel = {"rdzv_backend": "c10d", "same_network": True, "enable_cpu_affinity": True}
    cmd = build_command(spec, accel, "/c.yaml")
    s = " ".join(cmd)
    assert "--config_file /c.yaml --max_restarts 0" in s
    assert "--rdzv_backend c10d" in s and "--same_network" in s and "--enable_cpu_affinity" in s
    assert "--machine_rank 1 --main_process_ip 10.0.0.1 --main_process_port 1234" in s
    assert cmd[-3:] == [cmd[-3], "t.py", "--x"] and cmd[-3].endswith("_worker.py")
    assert "--rdzv_backend" not in " ".join(build_command(spec, {"rdzv_backend": "static"}, None))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_single_process_simple_launcher_is_rank0_and_exit_code_passes_through(tmp_path):
    cfg = tmp_path / "single.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_machines: 1\nnum_processes: 1\n"
                   "machine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\ngpu_ids: all\n")
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('hello from the only rank', flush=True)\n"
                      "print(\"{'loss': '2.5', 'learning_rate': '0.1', 'epoch': '1.0'}\", flush=True)\nsys.exit(3)\n")
    run_dir = tmp_path / "run"
    r = wizard("launch", "--headless", "--config-file", str(cfg), "--run-dir", str(run_dir), "--", str(script),
               cwd=tmp_path, timeout=280)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "[rank0] hello from the only rank" in r.stdout
    st = json.loads((run_dir / "run.json").read_text())
    assert st["status"] == "failed" and st["exit_code"] == 3
    assert st["classification"]["rank"] == 0 and st["classification"]["exit_code"] == 3
    ev = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["loss"] for e in ev if e["type"] == "train_log"] == [2.5]
    assert (run_dir / "logs" / "attempt-1" / "rank-0.log").read_text().startswith("hello from the only rank")


def _ddp_config(path: Path, processes: int) -> Path:
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 1\n"
                    f"num_processes: {processes}\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n"
                    "gpu_ids: all\nmain_process_port: 0\n")
    return path


@pytest.mark.timeout(240)
def test_a_process_count_torchrun_cannot_use_stops_the_launch_with_exit_2_and_the_finding(tmp_path):
    """Issue 36, item 2: `num_processes: 0` passed check and the launch showed torchrun's AssertionError traceback.
    Launch's own check stops it first, as README promises: exit 2, the finding on one line, no run directory."""
    processes = 0                                   # -2 and the other counts: tests/unit/test_check_machines.py
    cfg = _ddp_config(tmp_path / "c.yaml", processes)
    (tmp_path / "s.py").write_text("print('never')\n")
    r = wizard("launch", "--headless", "--config-file", str(cfg), "--", "s.py", cwd=tmp_path, timeout=220)
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = [x for x in r.stderr.splitlines() if "ACC-COUNT-OUT-OF-RANGE num_processes" in x]
    assert f"num_processes: {processes}" in line and "1 or more" in line
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "wizard-runs").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gpu_config_launched_on_a_machine_without_gpus_says_so_before_it_starts(tmp_path):
    """Issue 36, item 8: a config for GPUs launched where there is none started its ranks on the CPU with no word.
    Launch checks the config against this machine (preflight's GPU decision): the run still starts (the suite's
    own trainings run such configs on CPU processes over gloo), with a warning on stderr and in the run's events,
    which the live view and `attach` show."""
    cfg = _ddp_config(tmp_path / "c.yaml", 2)
    (tmp_path / "s.py").write_text("print('ran', flush=True)\n")
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "wizard", "launch", "--headless", "--config-file", str(cfg),
                        "--run-dir", str(run_dir), "--", "s.py"], capture_output=True, text=True, cwd=tmp_path,
                       env={**env(), "WIZARD_FAKE_NVML": "none"}, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    [line] = [x for x in r.stderr.splitlines() if "ACC-NUM-PROCESSES-EXCEEDS-GPUS" in x]
    assert line.startswith("[wizard] warning") and "no GPU" in line and "on the CPU over gloo" in line
    assert "[rank0] ran" in r.stdout and "[rank1] ran" in r.stdout
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["message"] for e in events if e["type"] == "check"] == [line.removeprefix("[wizard] ")]
