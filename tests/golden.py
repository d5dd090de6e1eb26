"""Running a golden case and normalising its output (shared by the test and the regenerator)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from tests.golden_cases import CASES

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = ROOT / "snapshots" / "golden"
FILES = ("default_config.yaml", "ds_config.json")


def case_args(name: str, out: Path, nvme: Path) -> list[str]:
    args = [a.replace("<FIX>", str(FIXTURES)).replace("<NVME>", str(nvme)) for a in CASES[name]]
    return ["--non-interactive", *args, "--output-dir", str(out)]


def run_case(name: str, workdir: Path) -> tuple[int, dict[str, str], str]:
    """Run the real CLI entry point in-process; return exit code, normalised files and what it printed
    (stderr, then stdout: the check findings of a write, warnings included, go to stdout)."""
    from wizard.frontends.cli import main

    out, nvme = workdir / "out", workdir / "nvme"
    nvme.mkdir(parents=True, exist_ok=True)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(case_args(name, out, nvme))
    files = {}
    for f in FILES:
        p = out / f
        if p.exists():
            files[f] = p.read_text().replace(str(out), "<OUTPUT_DIR>").replace(str(nvme), "<NVME>")
    return code, files, stderr.getvalue() + stdout.getvalue()


def stored(name: str) -> dict[str, str]:
    d = GOLDEN / name
    return {f: (d / f).read_text() for f in FILES if (d / f).exists()}


def store(name: str, files: dict[str, str]) -> None:
    d = GOLDEN / name
    d.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        (d / f).unlink(missing_ok=True)
    for f, text in files.items():
        (d / f).write_text(text)
    (d / "args.json").write_text(json.dumps(CASES[name], indent=1) + "\n")
