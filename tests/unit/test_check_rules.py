"""Every rule of `wizard check` on its fixtures: the trigger fixture reports exactly that rule, the clean one nothing.

Fixtures: tests/fixtures/check/<RULE>/{trigger,clean}/ (written by tests/fixtures/check/make_fixtures.py).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from wizard.check import build_context, run_rules
from wizard.check_rules import RULES
from wizard.hardware import Hardware, assume

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
MODELS = FIXTURES / "models"
CASE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/*/case.json"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def materialise(case_dir: Path, tmp: Path, port: int) -> Path:
    """Copy a fixture into tmp with <PORT> and <TMP> filled in."""
    work = tmp / "case"
    shutil.copytree(case_dir, work)
    scratch = tmp / "scratch"
    scratch.mkdir()
    for f in work.iterdir():
        if f.is_file():
            f.write_text(f.read_text().replace("<PORT>", str(port)).replace("<TMP>", str(scratch)))
    return work


def hardware_for(args: dict) -> Hardware:
    if args.get("hardware") == "probe-like":
        return Hardware(gpus=[], gpu_reason="test: this machine", source="probe", cpu_cores=2)
    return assume(args.get("assume", "4xA100-80GB"))


def check_case(case_dir: Path, tmp: Path):
    spec = json.loads((case_dir / "case.json").read_text())
    args = spec["args"]
    port = free_port()
    work = materialise(case_dir, tmp, port)

    def path(name: str) -> str | None:
        p = work / name
        return str(p) if p.exists() else None

    model = str(MODELS / args["model"]) if args.get("model") else None
    ctx = build_context(config_file=path("default_config.yaml"), ds_config=path("ds_config.json"),
                        training_args=path("training_args.json"), model=model, hardware=hardware_for(args),
                        trainer=args.get("trainer", "hf"), seq_len=args.get("seq_len", 2048),
                        versions=args.get("versions", {}), use_default_config=False,
                        # the live machine is an input: only the fixture's own <PORT> is busy, and only when
                        # the case says so (never whatever else runs on this box)
                        port_in_use=lambda p: bool(args.get("listen")) and p == port)
    if "aio_available" in args:
        ctx.aio_available = args["aio_available"]
    findings = run_rules(ctx)
    return spec, findings


@pytest.mark.parametrize("case_dir", CASE_DIRS, ids=[f"{p.parent.name}/{p.name}" for p in CASE_DIRS])
def test_fixture_reports_exactly_its_rule(case_dir: Path, tmp_path: Path):
    if case_dir.parent.name == "DS-NVME-NO-AIO" and case_dir.name == "trigger":
        from wizard.check_rules.deepspeed_json import aio_available
        if aio_available():
            pytest.skip("DeepSpeed's async_io op is available on this machine, so NVMe offload is fine here")
    spec, findings = check_case(case_dir, tmp_path)
    got = sorted({f.rule for f in findings})
    assert got == spec["expect"], "\n".join(f"{f.rule}: {f.message}" for f in findings)
    for f in findings:
        assert f.severity in ("error", "warning", "info")
        if f.severity != "info":    # a note says what it saw; it asks for nothing
            assert f.message and f.fix and f.when in ("launch", "prepare", "step 0", "save")


def test_every_rule_has_a_trigger_and_a_clean_fixture():
    ids = {r.id for r in RULES} | {"PLAN-LOW-HEADROOM"}
    with_fixture = {p.parent.name for p in CASE_DIRS if p.name == "trigger"}
    # PLAN-LOW-HEADROOM depends on the plan's arithmetic: test_check_plan.py searches for its trigger instead.
    assert ids - with_fixture == {"PLAN-LOW-HEADROOM"}
    for rule_id in with_fixture:
        assert (FIXTURES / rule_id / "clean" / "case.json").exists()


def test_fixtures_are_up_to_date(tmp_path: Path, monkeypatch):
    """The committed fixtures are what make_fixtures.py writes (edit the generator, not the files)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "HERE", tmp_path)
    gen.main()
    for case in CASE_DIRS:
        rel = case.relative_to(FIXTURES)
        for f in case.iterdir():
            assert (tmp_path / rel / f.name).read_text() == f.read_text(), f"{rel}/{f.name} is stale"
