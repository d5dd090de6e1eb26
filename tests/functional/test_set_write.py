"""The YAML, the JSON and the plan are written as a set (issue 12): a real writer process is killed or
signalled between every two renames, and what is on disk is always either the old set or the new one,
loads with the real loaders and checks clean (`wizard check`'s rules, accelerate's loader)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ASSUME = "2xA100-80GB"
OLD = {"params": "125M", "backend": "deepspeed", "zero_stage": "2"}
NEW = {"params": "125M", "backend": "deepspeed", "zero_stage": "3"}
# the JSON under a new name is named by the YAML (1), ds_config.json (2), the YAML (3), the plan (4), then the
# .bak of each (5-7)
RENAMES = 7

# The production write path, in a process of its own, so that it can really be killed.
WRITER = """
import json, sys
from wizard.pipeline import Request, build, write
given = json.loads(sys.argv[2])
result = build(Request(given=given, assume=%r, output_dir=sys.argv[1]))
try:
    write(result, given)
except KeyboardInterrupt:
    sys.exit(130)
""" % ASSUME


def write_set(out: Path, given: dict, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITER, str(out), json.dumps(given)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def pair(out: Path) -> tuple[dict, dict]:
    """The YAML (its JSON path left out) and the JSON it names, as the loaders read them."""
    doc = yaml.safe_load((out / "default_config.yaml").read_text())
    ds_file = doc["deepspeed_config"].pop("deepspeed_config_file")
    assert os.path.isabs(ds_file) and os.path.dirname(ds_file) == str(out)
    return doc, json.loads(Path(ds_file).read_text())


def check_clean(out: Path) -> None:
    from wizard.check.doctor import run_check
    errors = [f for f in run_check(config_file=str(out / "default_config.yaml"), use_default_config=False)
              if f.severity == "error"]
    assert errors == [], errors


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The old and the new set, each written once without faults."""
    old, new = tmp_path_factory.mktemp("old"), tmp_path_factory.mktemp("new")
    assert write_set(old, OLD).returncode == 0
    assert write_set(new, NEW).returncode == 0
    return {"old": (snapshot(old), pair(old)), "new": pair(new), "old_dir": str(old)}


def start_from_old(out: Path, sets) -> None:
    out.mkdir()
    for name, data in sets["old"][0].items():
        text = data.decode().replace(sets["old_dir"], str(out)) if name.endswith(".yaml") else data.decode()
        (out / name).write_text(text)


@pytest.mark.parametrize("after", range(1, RENAMES + 1))
def test_a_writer_killed_after_any_rename_leaves_the_old_or_the_new_set(tmp_path, sets, after):
    out = tmp_path / "out"
    start_from_old(out, sets)
    killed = write_set(out, NEW, WIZARD_FAULT_AFTER=str(after))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    on_disk = pair(out)
    # The first rename is already the YAML naming the new JSON (under its staged name): the new set.
    assert on_disk == sets["new"], f"not the new set after rename {after}"
    assert on_disk != sets["old"][1]
    check_clean(out)
    # The next write finishes the job and leaves nothing of the killed one behind.
    assert write_set(out, NEW).returncode == 0
    assert pair(out) == sets["new"]
    assert not [n for n in os.listdir(out) if n.startswith((".", "ds_config.staged-"))]


@pytest.mark.parametrize("sig", ["TERM", "HUP", "INT"])
@pytest.mark.parametrize("after", range(1, RENAMES + 1))
def test_a_signal_between_renames_rolls_back_to_the_old_set_byte_for_byte(tmp_path, sets, sig, after):
    out = tmp_path / "out"
    start_from_old(out, sets)
    before = snapshot(out)
    stopped = write_set(out, NEW, WIZARD_FAULT_AFTER=str(after), WIZARD_FAULT_SIGNAL=sig)
    assert stopped.returncode == 130, stopped.stderr
    assert snapshot(out) == before           # no .bak, no temp, no lock file, no staged JSON


def test_sigterm_through_the_cli_exits_130_with_one_line_and_nothing_written(tmp_path, sets):
    out = tmp_path / "out"
    start_from_old(out, sets)
    before = snapshot(out)
    cli = subprocess.run([sys.executable, "-m", "wizard", "--non-interactive", "--params", "125M", "--assume", ASSUME,
                          "--backend", "deepspeed", "--zero-stage", "3", "--output-dir", str(out)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "WIZARD_FAULT_AFTER": "2", "WIZARD_FAULT_SIGNAL": "TERM"})
    assert cli.returncode == 130
    wizard_lines = [line for line in cli.stderr.splitlines() if line.startswith("wizard:")]
    assert wizard_lines == ["wizard: interrupted; nothing written"] and "Traceback" not in cli.stderr
    assert snapshot(out) == before


def test_two_writers_on_one_directory_end_with_one_whole_set(tmp_path, sets):
    out = tmp_path / "out"
    start_from_old(out, sets)
    for _ in range(2):
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(out), json.dumps(given)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for given in (OLD, NEW)]
        assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
        assert pair(out) in (sets["old"][1], sets["new"])
        assert not [n for n in os.listdir(out) if n.startswith((".", "ds_config.staged-"))]
    check_clean(out)


def test_an_unreplaceable_ds_config_leaves_the_old_set_exactly_as_it_was(tmp_path):
    """Issue 21 #10, as reported: ds_config.json immutable, the default plan written over a ZeRO-3 set."""
    import shutil

    out = tmp_path / "out"
    common = ["--non-interactive", "--assume", "8xH100-80GB", "--params", "7B", "--output-dir", str(out)]
    first = subprocess.run([sys.executable, "-m", "wizard", *common, "--backend", "deepspeed", "--zero-stage", "3"],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    chattr = shutil.which("chattr")
    if not chattr or subprocess.run([chattr, "+i", str(out / "ds_config.json")], capture_output=True).returncode:
        pytest.skip("chattr +i is refused here (not root, or a file system without the attribute)")
    try:
        before = {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(out.iterdir())}
        refused = subprocess.run([sys.executable, "-m", "wizard", *common], capture_output=True, text=True, timeout=300)
        after = {p.name: (p.read_bytes(), p.stat().st_mode) for p in sorted(out.iterdir())}
    finally:
        subprocess.run([chattr, "-i", str(out / "ds_config.json")], check=True)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [f'wizard: cannot use "{out / "ds_config.json"}": Operation not permitted']
    assert after == before            # the old YAML naming the old JSON; no temp, no staged JSON, no lock
