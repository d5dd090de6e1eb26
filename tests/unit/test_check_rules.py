"""Every rule of `wizard check` on its fixtures: the trigger fixture reports exactly that rule, the clean one nothing.

Fixtures: tests/fixtures/check/<RULE>/{trigger,clean}/ (written by tests/fixtures/check/make_fixtures.py).
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from wizard.check.doctor import build_context, run_rules
from wizard.check.rules import RULES
from wizard.probe.hardware import Hardware, assume

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
ROOT = Path(__file__).resolve().parents[2]
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
    if args.get("hardware") == "probe-gpus":       # this machine, with GPUs
        import dataclasses
        return dataclasses.replace(assume(args.get("assume", "4xA100-80GB")), source="probe")
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
                        # the case says so (never whatever else runs on this box); ulimit -l as the case says
                        port_in_use=lambda p: bool(args.get("listen")) and p == port,
                        memlock_limit=lambda: args.get("memlock_limit"))
    if "aio_available" in args:
        ctx.aio_available = args["aio_available"]
    # the fp8 backends installed here are an input too: no fixture depends on this machine having torchao
    ctx.fp8_backends = tuple(args.get("fp8_backends", ("ao", "te")))
    if args.get("deepspeed_lacks"):
        from tests.ds_simulation import deepspeed_lacking
        with deepspeed_lacking(*args["deepspeed_lacks"], version=args["deepspeed_version"]):
            return spec, run_rules(ctx)
    findings = run_rules(ctx)
    return spec, findings


@pytest.mark.parametrize("case_dir", CASE_DIRS, ids=[f"{p.parent.name}/{p.name}" for p in CASE_DIRS])
def test_fixture_reports_exactly_its_rule(case_dir: Path, tmp_path: Path):
    if case_dir.parent.name == "DS-NVME-NO-AIO" and case_dir.name == "trigger":
        from wizard.check.rules.deepspeed_json import aio_available
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
    # The method family judges installed versions against --method, not files: test_check_methods.py drives
    # each of its rules with stated versions.
    method_ids = {r.id for r in RULES if r.family == "method"}
    method_tests = (Path(__file__).parent / "test_check_methods.py").read_text()
    assert method_ids and all(rule_id in method_tests for rule_id in method_ids)
    # The plan family judges files against the plan they were written for: test_validate.py drives it.
    # The task family judges a SkyPilot task file beside the config: test_sky_task.py drives each of its rules.
    task_ids = {r.id for r in RULES if r.family == "task"}
    task_tests = (Path(__file__).parent / "test_sky_task.py").read_text()
    assert task_ids and all(rule_id in task_tests for rule_id in task_ids)
    ids = {r.id for r in RULES if r.family not in ("method", "plan", "task")} | {"PLAN-LOW-HEADROOM"}
    with_fixture = {p.parent.name for p in CASE_DIRS if p.name == "trigger"}
    # PLAN-LOW-HEADROOM depends on the plan's arithmetic: test_check_plan.py searches for its trigger instead.
    assert ids - with_fixture == {"PLAN-LOW-HEADROOM"}
    for rule_id in with_fixture:
        assert (FIXTURES / rule_id / "clean" / "case.json").exists()


def test_every_reported_id_has_one_home_in_the_registry():
    """Every finding id written anywhere in the wizard is a registered rule's, one the "plan" rule reports for
    the libraries' verdicts, the runner's own, or PLAN-EXCEEDS-GPU's milder twin: no id lives outside it."""
    import re

    from wizard.check.rules.planned import PLAN_FILE_IDS

    source = "\n".join(p.read_text() for p in (ROOT / "wizard").rglob("*.py"))
    written = set(re.findall(r'"((?:ACC|DS|TRN|INT|PLAN|VER|METHOD|CHECK|SKY)-[A-Z0-9-]+)"', source))
    known = {r.id for r in RULES} | set(PLAN_FILE_IDS) | {"CHECK-RULE-FAILED", "PLAN-LOW-HEADROOM"}
    assert written - known == set()
    assert not set(PLAN_FILE_IDS) & {r.id for r in RULES}


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


# How bad each rule's trigger is, as the doctor must say it: an error is what a library rejects or what
# silently changes the training; a warning is legal but probably not meant; info asks for nothing.
# (Written out here so that turning a warning into an error, or the reverse, fails a test.)
SEVERITY = {
    "ACC-COUNT-NOT-INTEGER": "error", "ACC-DISTRIBUTED-TYPE-CONTRADICTS": "error",
    "ACC-DS-CONFIG-FILE-MISSING": "error", "ACC-FSDP-WRAP-CLASS-MISSING": "error",
    "ACC-GPU-IDS-NOT-STRING": "error", "ACC-IGNORED-BY-LAUNCH": "warning", "ACC-KEYS-BESIDE-DS-FILE": "error",
    "ACC-LAUNCH-REJECTS": "error", "ACC-COUNT-OUT-OF-RANGE": "error", "ACC-LOADER-REJECTS": "error", "ACC-NUM-PROCESSES-EXCEEDS-GPUS": "error",
    "ACC-MAIN-PROCESS-UNSET": "error", "ACC-FSDP1-KEY-UNDER-FSDP2": "warning", "ACC-FSDP2-RESHARD-NOT-BOOL": "error",
    "ACC-NUM-PROCESSES-PER-NODE": "error", "ACC-PORT-IN-USE": "warning", "ACC-UNKNOWN-KEY": "error",
    "ACC-UNKNOWN-NESTED-KEY": "warning", "ACC-UNQUOTED-NO": "error", "DS-AIO-IN-ZERO": "error",
    "ACC-FP8-UNSUPPORTED-GPU": "error", "ACC-FP8-BACKEND-MISSING": "warning",
    "ACC-SP-NEEDS-DEEPSPEED": "error", "ACC-SP-PROCESSES": "error", "ACC-SP-HEADS": "error",
    "ACC-SP-ZERO12-GRADIENTS": "error",
    "ACC-FP8-AO-RAM-EFFICIENT-LOADING": "error", "TRN-PRECISION-OVERRIDES-FP8": "warning",
    "DS-AUTO-IN-SUBCONFIG": "error", "DS-AUTO-UNFILLED": "error", "DS-BF16-UNSUPPORTED": "error",
    "DS-DUPLICATE-KEY": "error", "DS-FLOAT-BUCKET": "error", "DS-LIBRARY-REJECTS": "error",
    "DS-KEY-NEEDS-NEWER-DEEPSPEED": "error", "DS-PIN-MEMORY-MEMLOCK": "warning",
    "DS-NO-ZERO-OPTIMIZATION": "error", "DS-NVME-BELOW-ZERO3": "warning", "DS-NVME-NO-AIO": "error",
    "DS-NVME-NO-PATH": "error", "DS-NVME-PATH-UNUSABLE": "error", "DS-ODD-ALLGATHER-BUCKET": "error",
    "DS-OFFLOAD-CLIENT-OPTIMIZER": "error", "DS-OFFLOAD-PARAM-BELOW-ZERO3": "warning",
    "DS-OFFLOAD-TORCH-OPTIMIZER": "info", "DS-TRAINER-MISMATCH": "error", "DS-UNKNOWN-TOP-KEY": "warning",
    "DS-ZERO3-NO-16BIT-SAVE": "warning", "INT-FSDP-AND-DEEPSPEED": "error", "INT-STAGE-CONFLICT": "warning",
    "PLAN-EXCEEDS-GPU": "error", "TRN-AUTO-BATCH-ZERO3": "error", "TRN-FSDP-AC-WITH-GC": "error",
    "TRN-IGNORED-KEYS": "info", "TRN-LIBRARY-REJECTS": "error", "TRN-NON-BLOCKING-NO-PIN": "warning",
    "TRN-SAVE-ONLY-MODEL-BEST": "error", "TRN-SAVE-ONLY-MODEL-SHARDED": "error",
    "TRN-FSDP2-8BIT-OPTIMIZER": "error",
    "TRN-SPLIT-BATCHES-INDIVISIBLE": "error", "TRN-VALUE-TYPE": "error", "VER-ACCELERATE-COMPILE": "warning",
    "VER-ACCELERATE-OLD": "error", "VER-DEEPSPEED-OLD": "error",
}


@pytest.mark.parametrize("case_dir", [p for p in CASE_DIRS if p.name == "trigger"],
                         ids=[p.parent.name for p in CASE_DIRS if p.name == "trigger"])
def test_each_rule_reports_its_trigger_with_its_own_severity(case_dir: Path, tmp_path: Path):
    rule = case_dir.parent.name
    if rule == "DS-NVME-NO-AIO":
        from wizard.check.rules.deepspeed_json import aio_available
        if aio_available():
            pytest.skip("DeepSpeed's async_io op is available on this machine")
    _, findings = check_case(case_dir, tmp_path)
    assert {f.severity for f in findings if f.rule == rule} == {SEVERITY[rule]}


def near_miss(rule: str, tmp_path: Path, edit) -> list[str]:
    """The rule's trigger fixture with one edit to its ds_config.json; the rules that then fire."""
    case = tmp_path / "near-miss"
    shutil.copytree(FIXTURES / rule / "trigger", case)
    ds = json.loads((case / "ds_config.json").read_text())
    edit(ds)
    (case / "ds_config.json").write_text(json.dumps(ds))
    _, findings = check_case(case, tmp_path / "run")
    return sorted({f.rule for f in findings})


def test_an_odd_allgather_bucket_is_fine_under_zero3_which_never_reads_it(tmp_path: Path):
    # stage3.py takes no allgather_bucket_size; only the ZeRO-1/2 optimizer asserts it is even.
    def to_stage3(ds):
        ds["zero_optimization"]["stage"] = 3
    assert "DS-ODD-ALLGATHER-BUCKET" not in near_miss("DS-ODD-ALLGATHER-BUCKET", tmp_path, to_stage3)


@pytest.mark.parametrize("value", [5e8, 15099494.0, 2e8])
def test_a_whole_float_bucket_is_accepted_as_deepspeed_accepts_it(tmp_path: Path, value: float):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    DeepSpeedZeroConfig(stage3_prefetch_bucket_size=value)       # pydantic takes a float with no fraction

    def whole(ds):
        ds["zero_optimization"]["stage3_prefetch_bucket_size"] = value
    assert "DS-FLOAT-BUCKET" not in near_miss("DS-FLOAT-BUCKET", tmp_path, whole)


def test_a_finding_line_ends_its_message_with_one_full_stop():
    """A library's own message (accelerate's "Choose between [...].") already ends with a full stop; every
    front end's line (check's columns, the plain report, the TUI's Review screen) reads the same words."""
    from wizard.check.rules.common import finding
    from wizard.findings import finding_column_line, finding_line
    quoted = finding("error", "ACC-LAUNCH-REJECTS", "a.yaml", None,
                     "ValueError: Unknown mixed_precision mode: bf17. Choose between ['no', 'bf16'].", fix="fix it")
    ours = finding("warning", "X", "a.yaml", "k", "our own sentence", fix="fix it")
    assert "['no', 'bf16'].  fix: fix it" in finding_column_line(quoted)
    assert "our own sentence.  fix: fix it" in finding_column_line(ours)
    assert finding_line(quoted).endswith("['no', 'bf16']. Fix: fix it")
    assert finding_line(ours) == "warning: [X] a.yaml:k: our own sentence. Fix: fix it"
