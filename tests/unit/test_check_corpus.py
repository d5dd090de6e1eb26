"""`wizard check` on 45 real config files from public repositories (tests/fixtures/check/realworld/, each with
its repository, path and commit in SOURCES.json): the findings are exactly the expected ones, none is a false
alarm, and every "rejects" verdict is shown here to be what the installed library itself does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wizard.check.doctor import build_context, run_check, run_rules

pytestmark = pytest.mark.timeout(300)

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "check" / "realworld"
SOURCES = json.loads((CORPUS / "SOURCES.json").read_text())
ROLE = {"config-file": "config_file", "ds-config": "ds_config", "training-args": "training_args"}


def check(rel: str, role: str, **extra):
    # the live machine is an input: no port is busy here
    return run_check(**{ROLE[role]: str(CORPUS / rel)}, use_default_config=False, hardware=None,
                     port_in_use=lambda port: False, **extra)


def test_corpus_is_large_and_sourced():
    assert len(SOURCES) >= 30
    assert len({m["repo"] for m in SOURCES.values()}) >= 8
    for rel, meta in SOURCES.items():
        assert (CORPUS / rel).is_file(), rel
        assert meta["repo"].count("/") == 1 and meta["path"] and len(meta["commit"]) == 40, rel


@pytest.mark.parametrize("rel", sorted(SOURCES))
def test_real_file_gives_exactly_the_expected_findings(rel):
    meta = SOURCES[rel]
    findings = check(rel, meta["as"])
    if meta.get("machine_dependent"):
        from accelerate.utils import is_fp8_available
        machine = [f for f in findings if "on the machine where check runs" in f.message]
        assert bool(machine) == (not is_fp8_available())
        assert all(f.severity == "warning" for f in machine)
        findings = [f for f in findings if f not in machine]
    got = sorted([f.severity, f.rule, f.key] for f in findings)
    assert got == meta["expect"], "\n".join(f"{f.rule} {f.key}: {f.message}" for f in findings)


def test_no_false_alarm_on_the_corpus():
    """Every error in the corpus is one the libraries raise (the tests below); warnings are consequences the
    libraries document; offload with DeepSpeedCPUAdam (LLaMA-Factory, transformers' tests) raises nothing."""
    errors = {(rel, rule) for rel, m in SOURCES.items() for sev, rule, _ in m["expect"] if sev == "error"}
    assert errors == {("axolotl/deepspeed_configs/zero1_torch_compile.json", "DS-LIBRARY-REJECTS"),
                      ("DeepSpeedExamples/training/autotuning/hf/bert-base/ds_config_tune.json",
                       "DS-NO-ZERO-OPTIMIZATION")}
    offload = [rel for rel in SOURCES if "offload" in rel]
    assert len(offload) >= 5
    for rel in offload:
        assert not [e for e in SOURCES[rel]["expect"] if e[1] == "DS-OFFLOAD-CLIENT-OPTIMIZER"], rel


# ----------------------------------------------------------------------------- the libraries' own verdicts


def test_deepspeed_itself_rejects_axolotls_compile_block():
    from deepspeed.runtime.config import DeepSpeedConfig

    from wizard.config.validate import preload

    preload()
    cfg = json.loads((CORPUS / "axolotl/deepspeed_configs/zero1_torch_compile.json").read_text())
    cfg.update(train_batch_size=8, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=1,
               gradient_clipping=1.0)
    with pytest.raises(Exception) as exc:
        DeepSpeedConfig(cfg)
    assert "Extra inputs are not permitted" in str(exc.value)
    assert {"backend", "disable"} <= {e["loc"][-1] for e in exc.value.errors()}


def test_accelerate_itself_rejects_a_config_without_zero_optimization(monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    cfg = json.loads((CORPUS / "DeepSpeedExamples/training/autotuning/hf/bert-base/ds_config_tune.json").read_text())
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    with pytest.raises(ValueError, match="Please specify the ZeRO optimization config"):
        DeepSpeedPlugin(hf_ds_config=cfg)


# ----------------------------------------------------------------------------- file sets as people use them


def test_llama_factory_training_yaml_finds_its_deepspeed_json_from_the_repo_root():
    ctx = build_context(training_args=str(CORPUS / "LLaMA-Factory/examples/train_lora/qwen3_lora_sft_ds3.yaml"),
                        use_default_config=False, port_in_use=lambda port: False)
    assert ctx.ds_path.endswith("LLaMA-Factory/examples/deepspeed/ds_z3_config.json")
    assert ctx.zero_stage() == 3
    assert "template" in ctx.ta_ignored and "gradient_accumulation_steps" in ctx.ta


def test_alignment_handbook_pair_is_consistent():
    findings = run_check(config_file=str(CORPUS / "alignment-handbook/recipes/accelerate_configs/zero3.yaml"),
                         training_args=str(CORPUS / "alignment-handbook/recipes/zephyr-7b-beta/sft/config_full.yaml"),
                         use_default_config=False, hardware=None, port_in_use=lambda port: False)
    assert {f.rule for f in findings} == {"TRN-IGNORED-KEYS"}


def test_inline_deepspeed_yaml_is_compared_as_transformers_compares_it(tmp_path):
    """peft's YAML says gradient_accumulation_steps 4 and bf16; TrainingArguments with 8 and no bf16 is what
    transformers raises on at train() ("ds gradient_accumulation_steps=4 vs hf 8")."""
    ta = tmp_path / "args.json"
    ta.write_text(json.dumps({"gradient_accumulation_steps": 8, "per_device_train_batch_size": 2}))
    findings = run_check(config_file=str(CORPUS / "peft/examples/sft/configs/deepspeed_config.yaml"),
                         training_args=str(ta), use_default_config=False, hardware=None,
                         port_in_use=lambda port: False)
    got = {(f.rule, f.key) for f in findings if f.severity == "error"}
    assert got == {("DS-TRAINER-MISMATCH", "deepspeed_config.gradient_accumulation_steps"),
                   ("DS-TRAINER-MISMATCH", "mixed_precision")}
    assert all(not f.fixable for f in findings)      # there is no JSON to rewrite
    ta.write_text(json.dumps({"gradient_accumulation_steps": 4, "bf16": True}))
    findings = run_check(config_file=str(CORPUS / "peft/examples/sft/configs/deepspeed_config.yaml"),
                         training_args=str(ta), use_default_config=False, hardware=None,
                         port_in_use=lambda port: False)
    assert [f for f in findings if f.severity == "error"] == []


def test_transformers_itself_raises_that_mismatch(monkeypatch):
    from types import MethodType, SimpleNamespace

    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    from wizard.check.rules.common import training_defaults

    args = SimpleNamespace(**{**training_defaults(), "gradient_accumulation_steps": 8, "world_size": 8})
    args.get_warmup_steps = MethodType(TrainingArguments.get_warmup_steps, args)
    hf = HfTrainerDeepSpeedConfig({"gradient_accumulation_steps": 4, "bf16": {"enabled": True},
                                   "zero_optimization": {"stage": 3}})
    try:
        with pytest.raises(ValueError, match=r"(?s)gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=8.*bf16.enabled=True vs hf"):
            hf.trainer_config_process(args)
            hf.trainer_config_finalize(args, SimpleNamespace(config=SimpleNamespace(hidden_size=8)), 10)
    finally:
        unset_hf_deepspeed_config()


def test_stage_rules_speak_with_a_ds_config_alone(tmp_path):
    cfg = json.loads((CORPUS / "LLaMA-Factory/examples/deepspeed/ds_z2_config.json").read_text())
    cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    findings = run_check(ds_config=str(path), use_default_config=False, hardware=None)
    assert [(f.rule, f.severity) for f in findings] == [("DS-OFFLOAD-PARAM-BELOW-ZERO3", "warning")]


def test_trl_trainer_uses_sft_config_defaults(tmp_path):
    """SFTConfig's bf16 defaults to True: a ds_config with bf16 disabled mismatches under --trainer trl."""
    cfg = json.loads((CORPUS / "LLaMA-Factory/examples/deepspeed/ds_z2_config.json").read_text())
    cfg["bf16"] = {"enabled": False}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    ta = tmp_path / "args.json"
    ta.write_text(json.dumps({"learning_rate": 2e-5}))
    hf = run_check(ds_config=str(path), training_args=str(ta), use_default_config=False, trainer="hf")
    trl = run_check(ds_config=str(path), training_args=str(ta), use_default_config=False, trainer="trl")
    assert not [f for f in hf if f.rule == "DS-TRAINER-MISMATCH"]
    assert [(f.rule, f.key) for f in trl if f.rule == "DS-TRAINER-MISMATCH"] == [("DS-TRAINER-MISMATCH",
                                                                                  "bf16.enabled")]


def test_all_rules_run_on_a_context_built_twice():
    ctx = build_context(ds_config=str(CORPUS / "axolotl/deepspeed_configs/zero1_torch_compile.json"),
                        use_default_config=False)
    assert run_rules(ctx) == run_rules(ctx)


@pytest.mark.parametrize("rel", sorted(SOURCES))
def test_the_cli_ends_every_real_file_with_a_verdict_not_a_traceback(rel, monkeypatch, tmp_path, capsys):
    """Issue 27: with accelerate 1.16, `wizard check` on TRL's, alignment-handbook's and peft's stock configs ended in
    an AttributeError traceback (exit 1). Through the CLI's own entry point, whatever the installed versions: exit 0
    or 1 with findings, and never a rule that could not run."""
    from wizard.frontends.cli import main

    monkeypatch.setenv("HF_HOME", str(tmp_path))            # no accelerate default config of this machine's
    code = main(["check", f"--{SOURCES[rel]['as']}", str(CORPUS / rel)])
    out = capsys.readouterr()
    assert code in (0, 1), out.err[-2000:]
    assert "Traceback" not in out.err and "CHECK-RULE-FAILED" not in out.out + out.err, out.out + out.err
