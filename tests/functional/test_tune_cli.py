"""`wizard tune`'s refusals: one line, exit 2, nothing run or written (no trial starts)."""

from __future__ import annotations

import subprocess
import sys

from tests.launch_support import REPO, env

ANSWERS = str(REPO / "examples" / "train.answers.yaml")
EXAMPLE = str(REPO / "examples" / "train.py")


def tune(args, cwd):
    return subprocess.run([sys.executable, "-m", "wizard", "tune", *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=300)


def test_multi_machine_config_is_refused_with_one_line(tmp_path):
    r = tune(["--answers", ANSWERS, "--num-machines", "2", "--main-process-ip", "10.0.0.1", "--output-dir",
              str(tmp_path / "out"), "--", EXAMPLE], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "tune measures one machine" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "wizard-runs").exists()


def test_missing_script_and_bad_numbers_are_refused(tmp_path):
    r = tune(["--answers", ANSWERS, "--", str(tmp_path / "nope.py")], tmp_path)
    assert r.returncode == 2 and "nope.py does not exist" in r.stderr, r.stderr
    r = tune(["--answers", ANSWERS, "--steps", "0", "--", EXAMPLE], tmp_path)
    assert r.returncode == 2 and "--steps" in r.stderr, r.stderr
    r = tune(["--answers", ANSWERS, "--variants", "-1", "--", EXAMPLE], tmp_path)
    assert r.returncode == 2 and "--variants" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = tune(["--answers", ANSWERS, "--max-micro-batch", "0", "--", EXAMPLE], tmp_path)
    assert r.returncode == 2 and "--max-micro-batch" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = tune(["--answers", ANSWERS, "--budget", "nan", "--", EXAMPLE], tmp_path)
    assert r.returncode == 2 and "--budget" in r.stderr, r.stderr
    r = tune(["--answers", ANSWERS], tmp_path)
    assert r.returncode == 2 and "SCRIPT" in r.stderr, r.stderr
    assert not (tmp_path / "wizard-runs").exists()


def test_batch_flag_takes_the_scripts_flag_as_the_readme_writes_it():
    """`--batch-flag --batch-size` (README's example) ended in "argument --batch-flag: expected one argument":
    argparse took the script's flag for one of ours."""
    from wizard.frontends.cli import build_subparser
    for spelling in ("--batch-flag", "--batch_flag"):
        ns = build_subparser("tune").parse_args([spelling, "--batch-size", "--steps", "3", "--", "t.py", "--lr", "1"])
        assert (ns.batch_flag, ns.steps, ns.command) == ("--batch-size", 3, ["--", "t.py", "--lr", "1"]), ns
    ns = build_subparser("tune").parse_args(["--batch-flag=--bs", "--", "t.py"])
    assert ns.batch_flag == "--bs" and ns.command == ["--", "t.py"]


def test_an_assumed_or_saved_machine_is_refused(tmp_path):
    """The trials run on this machine: `tune --assume 2xH100-80GB` ran them on this CPU box with a config for two
    H100s (each trial failed in DeepSpeed's batch check) and would record their ratios under the H100 key."""
    hw = tmp_path / "hw.json"
    hw.write_text("{}")
    for flag, value in (("--assume", "2xH100-80GB"), ("--hardware", str(hw))):
        r = tune(["--answers", ANSWERS, flag, value, "--output-dir", str(tmp_path / "out"), "--", EXAMPLE], tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "tune measures the machine it runs on" in r.stderr and flag in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "wizard-runs").exists()


def test_tune_help_says_no_calibration_also_records_nothing():
    """`wizard tune --no-calibration` also keeps the trials out of the calibration file; its help said only
    "show the raw model", as `plan`'s does."""
    import io
    from contextlib import redirect_stdout

    from wizard.frontends.cli import build_subparser
    out = io.StringIO()
    with redirect_stdout(out):
        build_subparser("tune").print_help()
    text = " ".join(out.getvalue().split())
    assert "--no-calibration pick the candidates by the raw model" in text and "record none from these trials" in text


def test_tune_without_gpus_names_cpu_processes_not_hardware_or_assume(tmp_path):
    """No GPU here and no CPU flag: it said "--hardware: no GPUs found ... (allowed: a machine with GPUs, --assume
    SPEC, or CPU processes)", though --hardware was not given and tune refuses --assume (issue 29)."""
    r = subprocess.run([sys.executable, "-m", "wizard", "tune", "--params", "98K", "--output-dir", str(tmp_path / "out"),
                        "--", EXAMPLE], cwd=tmp_path, env={**env(), "WIZARD_FAKE_NVML": "none"}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--use-cpu yes --num-processes N" in r.stderr and "no GPUs found on this machine" in r.stderr, r.stderr
    assert "--hardware" not in r.stderr and "--assume" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "wizard-runs").exists()


def test_plan_without_gpus_names_the_flag_given_and_cpu_processes(tmp_path):
    """`wizard plan` on this machine without GPUs names --use-cpu, not a --hardware that was not given."""
    r = subprocess.run([sys.executable, "-m", "wizard", "plan", "--params", "98K"], cwd=tmp_path,
                       env={**env(), "WIZARD_FAKE_NVML": "none"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("wizard: --use-cpu: no GPUs found on this machine") and "--hardware" not in r.stderr
    assert "--use-cpu yes --num-processes N" in r.stderr, r.stderr


def test_tune_help_says_how_many_optimizer_steps_the_script_must_run():
    """A script that ran exactly warmup + steps optimizer steps read "ended after 5 measured steps without
    reaching 6" on every row: a step is timed up to the start of the next, so tune needs one more (issue 29)."""
    import io
    from contextlib import redirect_stdout

    from wizard.frontends.cli import build_subparser
    out = io.StringIO()
    with redirect_stdout(out):
        build_subparser("tune").print_help()
    text = " ".join(out.getvalue().split())
    assert "the script must run at least --warmup-steps + --steps + 1 optimizer steps" in text, text
