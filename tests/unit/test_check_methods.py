"""`wizard check --method lora|qlora`: peft / bitsandbytes / transformers versions for what is planned, QLoRA's
zero3_init_flag, and the memory rule sized with the adapters instead of full fine-tuning."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.check.doctor import check_texts
from wizard.check.rules import methods
from wizard.pipeline import Request
from wizard.sizing.lora import lora_options

ROOT = Path(__file__).resolve().parents[2]
LLAMA_TINY = str(ROOT / "tests" / "fixtures" / "models" / "llama-tiny")
LLAMA_8B = str(ROOT / "tests" / "fixtures" / "models" / "llama-3.1-8b")
INSTALLED = {"accelerate": "1.15.0", "deepspeed": "0.19.8", "transformers": "5.24.0", "torch": "2.13.0",
             "peft": "0.21.2", "bitsandbytes": "0.50.2"}


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


@pytest.fixture(scope="module")
def zero3():
    return pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused", given={
        "model": LLAMA_TINY, "method": "qlora", "backend": "deepspeed", "zero_stage": "3"}))


@pytest.fixture(scope="module")
def zero2():
    return pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused", given={
        "model": LLAMA_TINY, "method": "qlora", "backend": "deepspeed", "zero_stage": "2"}))


def method_findings(result, options, yaml_text=None, **versions):
    found = check_texts(yaml_text or result.yaml_text, result.ds_text, versions={**INSTALLED, **versions},
                        method=options)
    return {f.rule: f for f in found if f.rule.startswith("METHOD-")}


def test_installed_libraries_support_every_plan(zero3, zero2):
    for result in (zero3, zero2):
        for method in ("lora", "qlora"):
            assert method_findings(result, lora_options(method, targets="all-linear")) == {}


def test_full_fine_tuning_runs_no_method_rule(zero3):
    assert method_findings(zero3, None, peft=None, bitsandbytes=None) == {}
    assert methods.method_options("full") is None


def test_peft_missing_and_all_linear_needs_peft_0_8(zero2):
    assert "METHOD-PEFT-MISSING" in method_findings(zero2, lora_options("lora"), peft=None)
    old = method_findings(zero2, lora_options("lora", targets="all-linear"), peft="0.7.1")
    assert old["METHOD-PEFT-OLD"].severity == "error" and "0.8.0" in old["METHOD-PEFT-OLD"].fix
    assert method_findings(zero2, lora_options("lora", targets="all-linear"), peft="0.8.0") == {}
    # Named targets work with any peft: no version finding.
    assert method_findings(zero2, lora_options("lora", targets="q_proj,v_proj"), peft="0.7.1") == {}


def test_sharded_qlora_needs_peft_0_10_bnb_0_43_transformers_4_39(zero3, zero2):
    qlora = lora_options("qlora")
    found = method_findings(zero3, qlora, peft="0.9.0", bitsandbytes="0.42.0", transformers="4.38.2")
    assert "0.10.0" in found["METHOD-PEFT-OLD"].fix
    assert "bitsandbytes>=" in found["METHOD-BNB-OLD"].fix
    assert "0.43.0" in found["METHOD-BNB-OLD"].message
    assert "4.39.0" in found["METHOD-TRANSFORMERS-QUANT-STORAGE"].fix
    # ZeRO-2 partitions no parameter: peft 0.9 and transformers 4.38 are fine there.
    found2 = method_findings(zero2, qlora, peft="0.9.0", transformers="4.38.2")
    assert "METHOD-PEFT-OLD" not in found2 and "METHOD-TRANSFORMERS-QUANT-STORAGE" not in found2


def test_qlora_needs_the_bitsandbytes_the_installed_transformers_demands(zero2):
    from transformers.utils.import_utils import BITSANDBYTES_MIN_VERSION

    assert methods.transformers_bnb_minimum() == BITSANDBYTES_MIN_VERSION
    assert "METHOD-BNB-MISSING" in method_findings(zero2, lora_options("qlora"), bitsandbytes=None)
    just_below = method_findings(zero2, lora_options("qlora"), bitsandbytes="0.43.0")
    assert f"bitsandbytes>={BITSANDBYTES_MIN_VERSION}" in just_below["METHOD-BNB-OLD"].fix
    assert method_findings(zero2, lora_options("qlora"), bitsandbytes=BITSANDBYTES_MIN_VERSION) == {}
    # LoRA never needs bitsandbytes.
    assert method_findings(zero2, lora_options("lora"), bitsandbytes=None) == {}


def test_qlora_zero3_needs_zero3_init_flag(zero3):
    assert "zero3_init_flag: true" in zero3.yaml_text
    off = zero3.yaml_text.replace("zero3_init_flag: true", "zero3_init_flag: false")
    found = method_findings(zero3, lora_options("qlora"), yaml_text=off)
    assert found["METHOD-QLORA-ZERO3-INIT"].key == "deepspeed_config.zero3_init_flag"
    assert "METHOD-QLORA-ZERO3-INIT" not in method_findings(zero3, lora_options("lora"), yaml_text=off)


def test_memory_rule_sizes_the_adapters_with_method():
    """QLoRA on ZeRO-3 for 8B on 2 x A100-40GB fits (about 11 GiB per GPU); the same files read as full
    fine-tuning need about 86 GiB per GPU: without --method the memory rule says so, with it it is quiet.
    (On 2 x A100-80GB full fine-tuning now fits too, with gradient checkpointing: ZeRO-3 keeps its gradient
    partition in bf16, 7da1a76, so that machine no longer tells the two readings apart.)"""
    from wizard.probe import hardware
    from wizard.sizing.model import size_model

    result = pipeline.build(Request(assume="2xA100-40GB", output_dir="/tmp/unused", given={
        "model": LLAMA_8B, "method": "qlora", "backend": "deepspeed", "zero_stage": "3"}))
    assert result.plan.choice.key == "zero3"
    common = dict(model_shape=size_model(LLAMA_8B), hardware=hardware.assume("2xA100-40GB"), versions=INSTALLED)
    as_full = {f.rule for f in check_texts(result.yaml_text, result.ds_text, **common)}
    assert "PLAN-EXCEEDS-GPU" in as_full
    with_method = {f.rule for f in check_texts(result.yaml_text, result.ds_text, method=lora_options("qlora"),
                                               **common)}
    assert "PLAN-EXCEEDS-GPU" not in with_method and "PLAN-LOW-HEADROOM" not in with_method


def test_cli_method_flags(tmp_path):
    from wizard.frontends.check_cli import main

    result = pipeline.build(Request(assume="2xA100-80GB", output_dir=str(tmp_path), given={
        "model": LLAMA_TINY, "method": "qlora", "backend": "deepspeed", "zero_stage": "3"}))
    pipeline.write(result, {})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--config-file", result.yaml_path, "--method", "sometimes", "--assume", "2xA100-80GB"]) == 2
    assert "method" in err.getvalue() and "full|lora|qlora" in err.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["--config-file", result.yaml_path, "--method", "qlora", "--lora-targets", "all-linear",
                     "--assume", "2xA100-80GB", "--json"])
    assert code == 0, out.getvalue()
    assert "METHOD-" not in out.getvalue()


def test_the_wizard_writes_qlora_files_without_bitsandbytes_here(monkeypatch, tmp_path):
    """Sizing never needs bitsandbytes, so its absence where the wizard runs is a warning before writing
    (the files may be for another machine), while `wizard check --method qlora` keeps it an error."""
    real = methods.installed_version
    monkeypatch.setattr(methods, "installed_version",
                        lambda ctx, name: None if name == "bitsandbytes" else real(ctx, name))
    result = pipeline.build(Request(assume="1xA100-80GB", output_dir=str(tmp_path),
                                    given={"model": LLAMA_TINY, "method": "qlora"}))
    pipeline.validate(result)
    assert not result.errors, [f.message for f in result.errors]
    assert [f.severity for f in result.findings if f.rule == "METHOD-BNB-MISSING"] == ["warning"]
    direct = check_texts(result.yaml_text, result.ds_text, method=lora_options("qlora"))
    assert [f.severity for f in direct if f.rule == "METHOD-BNB-MISSING"] == ["error"]


def test_memory_rule_counts_qlora_loading_the_whole_4bit_model_onto_every_gpu():
    """An FSDP-QLoRA file (CPU offload) for 70B, checked for 2 x RTX 4090: training needs about 15 GiB per GPU,
    but every rank first quantises the whole 4-bit model onto its own GPU (about 38 GiB), which the plan says
    does not fit. The memory rule read only the training figure and found nothing."""
    from wizard.probe import hardware
    from wizard.sizing.model import size_model

    model = str(ROOT / "tests" / "fixtures" / "models" / "llama-3-70b")
    result = pipeline.build(Request(assume="2xRTX6000Ada-48GB,ram=256G", output_dir="/tmp/unused", given={
        "model": model, "method": "qlora", "backend": "fsdp", "offload": "cpu"}))
    assert result.plan.choice.key == "fsdp-offload"
    common = dict(model_shape=size_model(model), hardware=hardware.assume("2xRTX4090,ram=128G"), versions=INSTALLED,
                  method=lora_options("qlora"))
    found = {f.rule: f for f in check_texts(result.yaml_text, result.ds_text, **common)}
    assert "PLAN-EXCEEDS-GPU" in found, sorted(found)
    assert "while loading" in found["PLAN-EXCEEDS-GPU"].message, found["PLAN-EXCEEDS-GPU"].message
    # Where it loads, it is quiet (2 x 48 GB: the plan's own choice for these files).
    roomy = dict(common, hardware=hardware.assume("2xRTX6000Ada-48GB,ram=256G"))
    assert not {"PLAN-EXCEEDS-GPU", "PLAN-LOW-HEADROOM"} & {f.rule for f in check_texts(
        result.yaml_text, result.ds_text, **roomy)}


@pytest.fixture(scope="module")
def fsdp1():
    return pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused", given={
        "model": LLAMA_TINY, "method": "lora", "backend": "fsdp", "fsdp_version": 1}))


def test_fsdp1_adapters_under_transformers_4_reentrant_checkpointing_are_flagged(fsdp1):
    """FSDP1 + LoRA + transformers 4.x's default reentrant checkpointing keeps every layer's input and gradient to
    the end of backward (bench/results/fsdp-activations.md); non-reentrant, FSDP2 or transformers 5 do not."""
    assert "fsdp_version: 1" in fsdp1.yaml_text

    def found(yaml_text=fsdp1.yaml_text, ta=None, transformers="4.45.2", method="lora"):
        out = check_texts(yaml_text, None, versions={**INSTALLED, "transformers": transformers},
                          method=lora_options(method), training_args=ta)
        return {f.rule: f for f in out}.get("METHOD-FSDP1-REENTRANT-CHECKPOINT")

    gc = {"gradient_checkpointing": True}
    hit = found(ta=gc)
    assert hit is not None and hit.severity == "warning" and "use_reentrant" in hit.fix
    assert found(ta=gc, method="qlora") is not None
    assert found(ta={**gc, "gradient_checkpointing_kwargs": {"use_reentrant": False}}) is None
    assert found(ta=gc, transformers="5.24.0") is None
    assert found(ta={"gradient_checkpointing": False}) is None
    assert found(ta=None) is None
    assert found(yaml_text=fsdp1.yaml_text.replace("fsdp_version: 1", "fsdp_version: 2"), ta=gc) is None


def test_the_wizard_writes_zero2_ulysses_files_with_an_old_transformers_here(monkeypatch, tmp_path):
    """The transformers where the wizard runs may not be the training machine's: ACC-SP-ZERO12-GRADIENTS is a
    warning before writing (the plan's note says it too) and an error from `wizard check` on that machine."""
    from wizard.check import doctor
    real = doctor.library_versions
    monkeypatch.setattr(doctor, "library_versions", lambda: {**real(), "transformers": "5.17.0"})
    result = pipeline.build(Request(assume="8xH100-80GB", output_dir=str(tmp_path),
                                    given={"model": LLAMA_TINY, "seq_len": 4096, "backend": "deepspeed",
                                           "zero_stage": "2", "parallelism_config_sp_size": 2}))
    pipeline.validate(result)
    assert not result.errors, [f.message for f in result.errors]
    assert [f.severity for f in result.findings if f.rule == "ACC-SP-ZERO12-GRADIENTS"] == ["warning"]
    direct = check_texts(result.yaml_text, result.ds_text, versions={"transformers": "5.17.0"})
    assert [f.severity for f in direct if f.rule == "ACC-SP-ZERO12-GRADIENTS"] == ["error"]
