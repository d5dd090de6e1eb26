"""Fuzz (issue 12): random values for every question's flag and random answers/hardware/config files, through
the real CLI entry point. Every case ends with exit 0, 2 or 3, at most one `wizard:` line on stderr and no
traceback, and the output dir is byte-identical unless the exit is 0. Bounded and seeded: the same cases
every run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wizard.config.questions import QUESTIONS
from wizard.frontends import cli

SEED = 12
CASES = 300                 # `wizard plan`: seconds for all of them
WRITING_CASES = 30          # `wizard --non-interactive`: a case that gets to exit 0 validates with the real
                            # libraries (seconds each), so these few run as a slow test
SUBPROCESS_CASES = 6

WEIRD_TEXT = ["", " ", "\n", "a\nb", "ü", "-1", "0", "1e999", "nan", "9" * 5000, "1" * 19, "auto", "yes",
              "[1, 2]", "{a: 1}", "/dev/null", "/nonexistent/x", "..", "7B", "80G", "0.5", "%", "\x00"]


def random_value(rng: random.Random, q) -> str:
    choice = rng.random()
    if q.choices and choice < 0.5:
        return str(rng.choice(q.choices))
    if q.kind == "bool" and choice < 0.6:
        return rng.choice(["yes", "no", "true", "0"])
    if q.kind in ("int", "count") and choice < 0.6:
        return str(rng.choice([1, 2, 3, 8, 1024, 2048, 10**6, 10**12, -5]))
    if q.kind == "float" and choice < 0.6:
        return str(rng.choice([0.0, 0.1, 0.5, 1.0, 2.5, -1.0]))
    return rng.choice(WEIRD_TEXT)


def random_file(rng: random.Random, directory: Path, name: str) -> str:
    path = directory / name
    kind = rng.randrange(6)
    if kind == 0:
        path.write_bytes(rng.randbytes(rng.randrange(200)))
    elif kind == 1:
        q = rng.choice(QUESTIONS)
        path.write_text(json.dumps({q.id: random_value(rng, q)}))
    elif kind == 2:
        path.write_text("[" * 5000 + "]" * 5000)
    elif kind == 3:
        path.write_text(json.dumps({"model_type": "llama", "hidden_size": rng.choice([64, 10**9]),
                                    "num_hidden_layers": rng.choice([2, 10**7]), "num_attention_heads": 4,
                                    "vocab_size": rng.choice([1000, -1, "x"]), "intermediate_size": 128}))
    elif kind == 4:
        os.mkfifo(path)
    else:
        path.mkdir()
    return str(path)


def random_case(rng: random.Random, tmp: Path, out: Path, writing: bool = False) -> list[str]:
    args = ["--non-interactive", "--output-dir", str(out)] if writing else ["plan"]
    model = rng.random()
    if model < 0.15:
        args += ["--model", random_file(rng, tmp, "config.json")]
    elif model < 0.9:
        args += ["--params", rng.choice(["125M", "1B", "7B"])]
    if rng.random() < 0.15:
        args += ["--hardware", random_file(rng, tmp, "hw.json")]
    else:
        args += ["--assume", rng.choice(["2xA100-80GB", "8xH100-80GB", "1xRTX4090", "", "0xA100", "zzz"])]
    if rng.random() < 0.15:
        args += ["--answers", random_file(rng, tmp, rng.choice(["a.yaml", "a.json"]))]
    for q in rng.sample([q for q in QUESTIONS if q.flag and q.id not in ("model", "params")], rng.randrange(4)):
        args += [q.flag, random_value(rng, q)]
    return args


def old_set(out: Path) -> dict[str, bytes]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "default_config.yaml").write_text("distributed_type: 'NO'\nnum_processes: 1\n")
    (out / "ds_config.json").write_text('{"zero_optimization": {"stage": 2}}\n')
    return {p.name: p.read_bytes() for p in out.iterdir()}


def run_cases(tmp_path, capsys, rng: random.Random, cases: int, writing: bool) -> set[int]:
    seen = set()
    for i in range(cases):
        case_dir = tmp_path / f"case{i}"
        case_dir.mkdir()
        out = case_dir / "out"
        before = old_set(out)
        args = random_case(rng, case_dir, out, writing)
        code = cli.main(args)
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.startswith("wizard:")]
        assert code in (0, 2, 3), (args, code, captured.err[-2000:])
        assert len(lines) <= 1 and "Traceback" not in captured.err, (args, captured.err[-2000:])
        if code == 2:
            assert len(lines) == 1, (args, captured.err[-2000:])
        if code != 0 or args[0] == "plan":
            after = {p.name: p.read_bytes() for p in out.iterdir()}
            assert after == before, (args, code)
        seen.add(code)
    return seen


def test_random_answers_to_plan_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WIZARD_FAKE_NVML", "")
    assert run_cases(tmp_path, capsys, random.Random(SEED), CASES, writing=False) == {0, 2, 3}


@pytest.mark.slow
def test_random_answers_to_the_writing_wizard_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WIZARD_FAKE_NVML", "")
    assert run_cases(tmp_path, capsys, random.Random(SEED + 2), WRITING_CASES, writing=True) >= {0, 2}


def test_random_answers_through_a_real_process(tmp_path):
    rng = random.Random(SEED + 1)
    for i in range(SUBPROCESS_CASES):
        case_dir = tmp_path / f"case{i}"
        case_dir.mkdir()
        out = case_dir / "out"
        before = old_set(out)
        args = random_case(rng, case_dir, out)
        proc = subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "WIZARD_FAKE_NVML": ""})
        assert proc.returncode in (0, 2, 3), (args, proc.stderr[-2000:])
        assert len(proc.stderr.splitlines()) <= 1 and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Nine levels of anchors, each used nine times by the next: 9**9 values once expanded, 600 bytes of text."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("entry", [
    ["plan", "--params", "7B", "--assume", "8xH100-80GB", "--answers", "{bomb}"],
    ["--non-interactive", "--params", "7B", "--assume", "8xH100-80GB", "--answers", "{bomb}", "--output-dir", "{out}"],
    ["check", "--config-file", "{bomb}"],
    ["check", "--training-args", "{bomb}"],
    ["check", "--ds-config", "{ds}", "--training-args", "{bomb}"],
], ids=["plan-answers", "write-answers", "check-config-file", "check-training-args", "check-training-args-with-ds"])
def test_a_yaml_alias_bomb_is_refused_at_once_in_every_yaml_reader(tmp_path, entry):
    """Every YAML the wizard reads goes through one loader that counts what aliases expand to (issue 21 #9)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}}\n')
    out = tmp_path / "out"
    before = old_set(out)
    args = [a.format(bomb=bomb, out=out, ds=ds) for a in entry]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WIZARD_FAKE_NVML": ""})
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1 and "aliases expand it to more than" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # The whole process, interpreter start and the CLI's imports included; the refusal itself takes milliseconds.
    assert elapsed < 15, elapsed
