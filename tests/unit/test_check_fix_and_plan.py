"""`--fix` for every fixable rule (the fixed files re-check clean for that rule, .bak kept) and the
PLAN-LOW-HEADROOM warning (its trigger is searched with the real plan, so it follows the plan's arithmetic)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from wizard.check.doctor import apply_fixes, build_context, check_texts, format_findings, run_rules
from wizard.check.rules import FIXERS, RULES
from wizard.probe.hardware import assume

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
FIXABLE = sorted(r.id for r in RULES if r.fixable)


def _ctx(d: Path):
    def p(name):
        return str(d / name) if (d / name).exists() else None
    return build_context(config_file=p("default_config.yaml"), ds_config=p("ds_config.json"),
                         training_args=p("training_args.json"), hardware=assume("4xA100-80GB"), versions={},
                         use_default_config=False)


def test_every_fixable_rule_has_a_fixer():
    assert set(FIXABLE) == set(FIXERS)


@pytest.mark.parametrize("rule_id", FIXABLE)
def test_fix_repairs_the_trigger_fixture(rule_id, tmp_path):
    work = tmp_path / "case"
    shutil.copytree(FIXTURES / rule_id / "trigger", work)
    originals = {f.name: f.read_text() for f in work.iterdir()}
    ctx = _ctx(work)
    findings = run_rules(ctx)
    assert rule_id in {f.rule for f in findings}
    result = apply_fixes(ctx, findings)
    assert result.changes and result.written
    for written in result.written:
        assert Path(written + ".bak").read_text() == originals[Path(written).name]
    again = run_rules(_ctx(work))
    assert rule_id not in {f.rule for f in again}, format_findings(again)
    assert not again, format_findings(again)          # nothing else broke either


def test_fix_leaves_a_file_with_duplicate_keys_alone(tmp_path):
    work = tmp_path / "case"
    shutil.copytree(FIXTURES / "DS-DUPLICATE-KEY" / "trigger", work)
    ds = work / "ds_config.json"
    ds.write_text(ds.read_text().replace(',\n    "stage3_gather_16bit_weights_on_model_save": true', ''))
    before = ds.read_text()
    ctx = _ctx(work)
    result = apply_fixes(ctx, run_rules(ctx))
    assert ds.read_text() == before and result.skipped and not (work / "ds_config.json.bak").exists()


def test_check_texts_runs_the_same_rules_in_memory():
    d = FIXTURES / "DS-AUTO-IN-SUBCONFIG" / "trigger"
    findings = check_texts((d / "default_config.yaml").read_text(), (d / "ds_config.json").read_text(),
                           hardware=assume("4xA100-80GB"), versions={})
    assert {f.rule for f in findings} == {"DS-AUTO-IN-SUBCONFIG"}


# ----------------------------------------------------------------------------- a precision the files disagree on


def _precision_case(tmp_path: Path, yaml_precision: str, ds_precision: dict) -> Path:
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2}, **ds_precision}
    (tmp_path / "ds_config.json").write_text(json.dumps(ds, indent=2))
    (tmp_path / "default_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndeepspeed_config:\n"
        f"  deepspeed_config_file: {tmp_path / 'ds_config.json'}\n  zero3_init_flag: false\n"
        "distributed_type: DEEPSPEED\nmachine_rank: 0\nmain_training_function: main\n"
        f"mixed_precision: {yaml_precision}\nnum_machines: 1\nnum_processes: 2\nuse_cpu: false\n")
    return tmp_path / "default_config.yaml"


def _precision_ctx(cfg: Path):
    return build_context(config_file=str(cfg), hardware=assume("2xA100-80GB"), versions={},
                         use_default_config=False, port_in_use=lambda port: False)


def test_fix_never_turns_the_users_fp16_into_the_json_s_bf16(tmp_path: Path):
    cfg = _precision_case(tmp_path, "fp16", {"bf16": {"enabled": True}})
    before = cfg.read_text()
    ctx = _precision_ctx(cfg)
    findings = run_rules(ctx)
    [f] = [f for f in findings if f.key == "mixed_precision"]
    assert f.severity == "error" and not f.fixable
    assert "fp16" in f.message and "bf16" in f.message and "fp16" in f.fix and "bf16" in f.fix
    result = apply_fixes(ctx, findings)
    assert cfg.read_text() == before and not result.written
    again = run_rules(_precision_ctx(cfg))
    assert [(g.rule, g.key) for g in again] == [(f.rule, "mixed_precision")]


def test_fix_still_drops_a_mixed_precision_the_json_agrees_with(tmp_path: Path):
    cfg = _precision_case(tmp_path, "bf16", {"bf16": {"enabled": True}})
    ctx = _precision_ctx(cfg)
    findings = run_rules(ctx)
    assert [(f.rule, f.fixable) for f in findings] == [("ACC-KEYS-BESIDE-DS-FILE", True)]
    apply_fixes(ctx, findings)
    assert "mixed_precision" not in cfg.read_text() and run_rules(_precision_ctx(cfg)) == []


def test_fix_drops_the_other_keys_and_keeps_the_conflicting_precision(tmp_path: Path):
    cfg = _precision_case(tmp_path, "fp16", {"bf16": {"enabled": True}})
    cfg.write_text(cfg.read_text().replace("  zero3_init_flag: false\n", "  zero3_init_flag: false\n  zero_stage: 2\n"))
    ctx = _precision_ctx(cfg)
    findings = run_rules(ctx)
    assert sorted((f.key, f.fixable) for f in findings) == [("deepspeed_config.zero_stage", True),
                                                            ("mixed_precision", False)]
    apply_fixes(ctx, findings)
    text = cfg.read_text()
    assert "zero_stage" not in text and "mixed_precision: fp16" in text
    assert [f.key for f in run_rules(_precision_ctx(cfg))] == ["mixed_precision"]


# ----------------------------------------------------------------------------- plan


def _plan_ctx(seq_len: int, model: str = "llama-7b", spec: str = "1xA100-80GB"):
    d = FIXTURES / "PLAN-EXCEEDS-GPU" / "clean"
    return build_context(config_file=str(d / "default_config.yaml"), training_args=str(d / "training_args.json"),
                         model=str(FIXTURES / "models" / model), hardware=assume(spec), seq_len=seq_len,
                         versions={}, use_default_config=False)


def test_low_headroom_warning_and_exceeds_error_follow_the_plan():
    """Search the sequence length where ZeRO-less single-GPU training of the tiny model fills 95-100 % of a GPU."""
    from wizard.check.rules.hardware_plan import plan_inputs
    from wizard.planning.plan import StrategyOptions, make_plan, rung_by_key

    ctx = _plan_ctx(2048, model="tiny-llama", spec="1xRTX4090")

    def fraction(seq: int) -> float:
        ctx.seq_len = seq
        training, topology, _ = plan_inputs(ctx)
        plan = make_plan(ctx.hardware, ctx.model, training, StrategyOptions(backend="ddp"), topology)
        return rung_by_key(plan, "single").per_gpu_bytes / plan.gpu_capacity_bytes

    low, high = 256, 256
    while fraction(high) < 1.0:
        low, high = high, high * 2
        assert high < 10_000_000
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fraction(mid) < 0.975 else (low, mid)
    if not 0.95 <= fraction(low) < 1.0:
        pytest.skip("the plan's estimate jumps over the 95-100 % window for this model")
    ctx.seq_len, ctx.cache = low, {}
    rules = {f.rule: f for f in run_rules(ctx)}
    assert set(rules) == {"PLAN-LOW-HEADROOM"} and rules["PLAN-LOW-HEADROOM"].severity == "warning"
    ctx.seq_len = 128
    assert not run_rules(ctx)
    ctx.seq_len = high * 2
    assert {f.rule for f in run_rules(ctx)} == {"PLAN-EXCEEDS-GPU"}


def test_exceeds_names_the_rung_that_fits():
    ctx = build_context(config_file=str(FIXTURES / "PLAN-EXCEEDS-GPU" / "trigger" / "default_config.yaml"),
                        model=str(FIXTURES / "models" / "llama-7b"), hardware=assume("1xA100-80GB"), versions={},
                        use_default_config=False)
    ctx.acc["num_processes"], ctx.acc["distributed_type"] = 1, "NO"
    findings = run_rules(ctx)
    assert [f.rule for f in findings] == ["PLAN-EXCEEDS-GPU"]
    assert "fits" in findings[0].fix or "No rung" in findings[0].fix


# ----------------------------------------------------------------------------- --fix never overrides a value you set


def _leaves(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _read(path: Path):
    import yaml
    return json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def _write(path: Path, data) -> None:
    import yaml
    path.write_text(json.dumps(data, indent=2) if path.suffix == ".json" else yaml.safe_dump(data))


def _at(data, dotted: str):
    for key in dotted.split("."):
        data = data[key]
    return data


def _put(data, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


# Issue 36, item 6: README says --fix never overrides a value you set. Every fixable rule is listed once: with the
# setting someone makes on purpose that its finding is about (file, key, value and any other key of the trigger that
# then says something else on purpose: the fix must leave them as written),
# or with why the value its trigger holds cannot run as written (the fix re-spells it or repairs what the library
# rejects, and test_fix_changes_only_the_keys_its_finding_names holds it to those keys).
CHOSEN = {
    "DS-ZERO3-NO-16BIT-SAVE": ("ds_config.json", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                               False, ()),
    "DS-OFFLOAD-CLIENT-OPTIMIZER": ("ds_config.json", "zero_force_ds_cpu_optimizer", True, ()),
    "ACC-KEYS-BESIDE-DS-FILE": ("default_config.yaml", "deepspeed_config.zero_stage", 2, ()),   # the JSON says 3
    "DS-AIO-IN-ZERO": ("ds_config.json", "aio", {"block_size": 262144, "queue_depth": 4},      # other values than
                       ("zero_optimization.aio",)),                                          # the nested block's
}
CANNOT_RUN_AS_WRITTEN = {
    "ACC-UNQUOTED-NO": "the word you wrote, quoted: unquoted, YAML read it as a boolean",
    "ACC-GPU-IDS-NOT-STRING": "the ids you listed, as the string accelerate splits (a list crashes launch)",
    "DS-FLOAT-BUCKET": "DeepSpeed's config rejects a fractional bucket size",
    "DS-ODD-ALLGATHER-BUCKET": "the ZeRO-1/2 optimizer asserts the all-gather bucket is even",
}


def test_every_fixer_is_held_to_leaving_your_values():
    assert not set(CHOSEN) & set(CANNOT_RUN_AS_WRITTEN)
    assert set(CHOSEN) | set(CANNOT_RUN_AS_WRITTEN) == set(FIXABLE)


@pytest.mark.parametrize("rule_id", sorted(CHOSEN))
def test_fix_leaves_a_value_you_set(rule_id, tmp_path):
    work = tmp_path / "case"
    shutil.copytree(FIXTURES / rule_id / "trigger", work)
    name, key, value, also = CHOSEN[rule_id]
    data = _read(work / name)
    _put(data, key, value)
    _write(work / name, data)
    before = _leaves(_read(work / name))
    ctx = _ctx(work)
    findings = run_rules(ctx)
    assert rule_id in {f.rule for f in findings}, format_findings(findings)
    # what the rule's findings leave to you (not fixable), and the value set here, stay as written
    kept = [key, *also] + [k.strip() for f in findings if f.rule == rule_id and not f.fixable for k in f.key.split(",")]
    apply_fixes(ctx, findings)
    after = _leaves(_read(work / name))
    assert _at(_read(work / name), key) == value
    for path, was in before.items():
        if any(path == k or path.startswith(k + ".") for k in kept):
            assert after.get(path, "<removed>") == was, f"{path}: {was!r} -> {after.get(path, '<removed>')!r}"


@pytest.mark.parametrize("rule_id", FIXABLE)
def test_fix_changes_only_the_keys_its_finding_names(rule_id, tmp_path):
    """On each trigger, a value that was there before the fix and differs (or is gone) after it sits at or under a
    key the rule's findings name: a fixer touches nothing else you wrote."""
    work = tmp_path / "case"
    shutil.copytree(FIXTURES / rule_id / "trigger", work)
    before = {p.name: _leaves(_read(p)) for p in work.iterdir() if p.suffix in (".json", ".yaml")}
    ctx = _ctx(work)
    findings = [f for f in run_rules(ctx) if f.rule == rule_id]
    named = [k.strip() for f in findings for k in (f.key or "").split(",") if k.strip()]
    apply_fixes(ctx, findings)
    for name, leaves in before.items():
        after = _leaves(_read(work / name))
        changed = [path for path, value in leaves.items() if path not in after or after[path] != value]
        stray = [p for p in changed if not any(p == k or p.startswith(k + ".") for k in named)]
        assert not stray, f"{rule_id}'s fix changed {stray} in {name}; its findings name {named}"


def test_a_ds_config_value_the_training_arguments_contradict_is_yours_to_settle(tmp_path):
    """DS-TRAINER-MISMATCH: --fix turned the JSON's explicit value into "auto", so the TrainingArguments' value (even
    a default nobody wrote) replaced the one written in ds_config.json. Both sides are someone's value: the finding
    names both, and --fix leaves them."""
    work = tmp_path / "case"
    shutil.copytree(FIXTURES / "DS-TRAINER-MISMATCH" / "trigger", work)
    before = (work / "ds_config.json").read_text()
    ctx = _ctx(work)
    findings = run_rules(ctx)
    [f] = [f for f in findings if f.rule == "DS-TRAINER-MISMATCH"]
    assert not f.fixable and "--fix leaves the choice to you" in f.fix
    apply_fixes(ctx, findings)
    assert (work / "ds_config.json").read_text() == before


def test_a_deepspeed_key_beside_the_file_that_the_json_contradicts_is_kept(tmp_path: Path):
    """The same as mixed_precision above for the other keys DeepSpeedPlugin rejects beside deepspeed_config_file:
    zero_stage 3 in the YAML with stage 2 in the JSON is one finding naming both, and --fix keeps it."""
    cfg = _precision_case(tmp_path, "bf16", {"bf16": {"enabled": True}})
    cfg.write_text(cfg.read_text().replace("  zero3_init_flag: false\n", "  zero3_init_flag: false\n  zero_stage: 3\n"
                                           "  gradient_clipping: 1.0\n"))
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    (tmp_path / "ds_config.json").write_text(json.dumps({**ds, "gradient_clipping": 1}))
    ctx = _precision_ctx(cfg)
    findings = run_rules(ctx)
    assert sorted((f.key, f.fixable) for f in findings) == [
        ("deepspeed_config.zero_stage", False), ("mixed_precision, deepspeed_config.gradient_clipping", True)]
    [conflict] = [f for f in findings if not f.fixable]
    assert "3" in conflict.message and "2" in conflict.message and "zero_optimization.stage" in conflict.fix
    apply_fixes(ctx, findings)
    text = cfg.read_text()
    assert "zero_stage: 3" in text and "gradient_clipping" not in text and "mixed_precision" not in text
