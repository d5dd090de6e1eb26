"""The LoRA / QLoRA setup the Done screen, --plain and --non-interactive print: every constructor in it is
built by the installed peft / transformers (BitsAndBytesConfig constructs without a GPU) with the values the
plan sized, for lora and qlora on a single GPU, ZeRO-2, ZeRO-3 (with and without CPU offload of the base) and
FSDP2 (with and without CPU offload); the LoRA snippet runs whole on a saved tiny
Llama and gives the trainable count the plan reported."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import pytest

from wizard import pipeline
from wizard.frontends.snippets import (
    adapter_snippet,
    bnb_config_kwargs,
    kbit_prepared,
    lora_config_kwargs,
    setup_snippet,
    training_arguments,
)
from wizard.pipeline import Request

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
LLAMA_TINY = str(ROOT / "tests" / "fixtures" / "models" / "llama-tiny")

# (GPUs, strategy flags, expected rung key). fp16: TrainingArguments refuses bf16 on this CPU box.
STRATEGIES = {
    "single": ("1xA100-80GB", {}, "single"),
    "zero2": ("2xA100-80GB", {"backend": "deepspeed", "zero_stage": "2"}, "zero2"),
    "zero3": ("2xA100-80GB", {"backend": "deepspeed", "zero_stage": "3"}, "zero3"),
    "zero3-offload-all": ("2xA100-80GB", {"backend": "deepspeed", "zero_stage": "3", "offload": "cpu"},
                          "zero3-offload-all"),
    "fsdp": ("2xA100-80GB", {"backend": "fsdp", "offload": "none"}, "fsdp-noreshard"),
    "fsdp-offload": ("2xA100-80GB", {"backend": "fsdp", "offload": "cpu"}, "fsdp-offload"),
}
# Rungs that shard the weights: the 4-bit codes must be stored in the compute dtype, and TRL skips
# prepare_model_for_kbit_training there.
SHARDED = ("zero3", "zero3-offload-all", "fsdp-noreshard", "fsdp-offload")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


def written(tmp_path: Path, assume: str, given: dict) -> pipeline.Result:
    result = pipeline.build(Request(assume=assume, output_dir=str(tmp_path / "out"), given=given))
    pipeline.write(result, given)
    return result


def snippet_calls(code: str) -> dict[str, ast.Call]:
    """The constructor calls of the printed snippet, by class name."""
    calls = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls[node.func.id] = node
    return calls


def build(call: ast.Call, namespace: dict):
    return eval(compile(ast.Expression(call), "<snippet>", "eval"), namespace)   # noqa: S307 - our own code


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_snippet_objects_build_with_the_installed_libraries(tmp_path, method, strategy):
    import torch
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments

    assume, flags, key = STRATEGIES[strategy]
    result = written(tmp_path, assume, {"model": LLAMA_TINY, "method": method, "precision": "fp16",
                                        "lora_rank": 8, "lora_targets": "q_proj,k_proj,v_proj", **flags})
    assert result.plan.choice.key == key
    ds = result.ds_path if result.ds_text is not None else None
    code = setup_snippet(result.answers, result.plan, result.model, ds)
    assert code == adapter_snippet(result.answers, result.plan, result.model, ds)
    calls = snippet_calls(code)
    namespace = {"LoraConfig": LoraConfig, "BitsAndBytesConfig": BitsAndBytesConfig,
                 "TrainingArguments": TrainingArguments, "torch": torch}

    lora = build(calls["LoraConfig"], namespace)
    assert lora.r == 8 and lora.lora_alpha == 16 and lora.lora_dropout == 0.05
    assert lora.target_modules == {"q_proj", "k_proj", "v_proj"}
    assert lora.task_type == "CAUSAL_LM" and lora.bias == "none"

    args = build(calls["TrainingArguments"], namespace)
    assert args.fp16 and args.per_device_train_batch_size == 1
    assert args.deepspeed == (result.ds_path if key.startswith("zero") else None)
    if key.startswith("fsdp"):
        assert "distributed_type: FSDP" in result.yaml_text and result.ds_text is None
    if key.startswith("zero3"):
        assert args.hf_deepspeed_config.is_zero3()

    if method == "lora":
        assert "BitsAndBytesConfig" not in calls and "quantization_config" not in code
        return
    bnb = build(calls["BitsAndBytesConfig"], namespace)
    assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4"
    assert bnb.bnb_4bit_use_double_quant is True             # what wizard.sizing.lora sized (LoraOptions.double_quant)
    assert bnb.bnb_4bit_compute_dtype == torch.float16
    # ZeRO-3 partitions the 4-bit weights only when stored in the compute dtype (lora.qlora_requirements).
    assert bnb.bnb_4bit_quant_storage == (torch.float16 if key in SHARDED else torch.uint8)
    assert ("prepare_model_for_kbit_training(" in code) == (key not in SHARDED) == kbit_prepared(result.plan)


def test_bf16_qlora_zero3_stores_the_4bit_weights_in_bf16(tmp_path):
    import torch
    from transformers import BitsAndBytesConfig

    result = written(tmp_path, "2xA100-80GB", {"model": LLAMA_TINY, "method": "qlora", "backend": "deepspeed",
                                               "zero_stage": "3"})
    assert result.plan.precision == "bf16"
    bnb = BitsAndBytesConfig(**bnb_config_kwargs(result.answers, result.plan))
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16 and bnb.bnb_4bit_quant_storage == torch.bfloat16
    assert "zero3_init_flag: true" in result.yaml_text


def test_default_targets_are_the_ones_sized(tmp_path):
    # No --lora-targets: the snippet names every Linear layer, the targets the plan sized.
    result = pipeline.build(Request(assume="1xA100-80GB", output_dir=str(tmp_path),
                                    given={"model": LLAMA_TINY, "method": "lora"}))
    adapters = pipeline.adapters_for(result.model, pipeline.answers_mod.training_options(result.answers))
    assert lora_config_kwargs(result.answers, result.model, result.plan)["target_modules"] == adapters.targets \
        == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    all_linear = dict(result.answers, lora_targets="all-linear")
    assert lora_config_kwargs(all_linear, result.model)["target_modules"] == "all-linear"


def test_lora_snippet_runs_on_a_saved_tiny_llama(tmp_path, monkeypatch):
    """The whole single-GPU LoRA snippet, executed: from_pretrained on real (random) weights and peft's
    get_peft_model give the trainable count the plan reported."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(LLAMA_TINY)
    saved = tmp_path / "tiny"
    LlamaForCausalLM(config).save_pretrained(saved)
    result = written(tmp_path, "1xA100-80GB", {"model": str(saved), "method": "lora", "precision": "fp16"})
    assert result.plan.choice.key == "single"
    code = setup_snippet(result.answers, result.plan, result.model, None)
    assert f"from_pretrained({str(saved)!r}" in code
    monkeypatch.chdir(tmp_path)                      # TrainingArguments(output_dir='out') stays in tmp
    namespace: dict = {}
    exec(compile(code, "<snippet>", "exec"), namespace)   # noqa: S102 - our own generated code
    trainable, _ = namespace["model"].get_nb_trainable_parameters()
    adapters = pipeline.adapters_for(result.model, pipeline.answers_mod.training_options(result.answers))
    assert trainable == adapters.trainable_params > 0


def test_non_interactive_prints_the_adapter_setup_and_full_does_not(tmp_path):
    from wizard.frontends.cli import main

    def run(*extra):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["--non-interactive", "--assume", "1xA100-80GB", "--model", LLAMA_TINY, "--precision", "fp16",
                         "--output-dir", str(tmp_path / "out"), *extra])
        assert code == 0, err.getvalue()
        return out.getvalue()

    text = run("--method", "qlora")
    assert "The same setup in Python" in text
    for piece in ("LoraConfig(", "BitsAndBytesConfig(", "TrainingArguments(", "get_peft_model(model, lora_config)"):
        assert piece in text
    assert "The same setup in Python" not in run("--method", "full")


def test_training_arguments_are_the_existing_snippets(tmp_path):
    # The adapter snippet carries the same TrainingArguments the full fine-tuning snippet would.
    result = written(tmp_path, "2xA100-80GB", {"model": LLAMA_TINY, "method": "lora", "backend": "deepspeed",
                                               "zero_stage": "2", "precision": "fp16"})
    kwargs = training_arguments(result.answers, result.plan, result.ds_path)
    calls = snippet_calls(adapter_snippet(result.answers, result.plan, result.model, result.ds_path))
    assert {k.arg: ast.literal_eval(k.value) for k in calls["TrainingArguments"].keywords} == kwargs


async def test_done_screen_shows_the_qlora_setup(tmp_path, monkeypatch):
    """The Textual Done screen: the section names peft and bitsandbytes, and the code carries LoraConfig,
    BitsAndBytesConfig (bf16 storage under ZeRO-3) and the TrainingArguments."""
    from tests.functional.test_tui_pilot import app_for, reach, text_of
    from wizard.probe import hardware

    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "none")
    app = app_for(tmp_path, hardware.assume("2xA100-80GB"), model=LLAMA_TINY, method="qlora",
                  backend="deepspeed", zero_stage="3")
    async with app.run_test(size=(100, 40)) as pilot:
        await reach(pilot, "DoneScreen")
        title = text_of(app.screen.query_one("#done-args-title"))
        assert "peft" in title and "bitsandbytes" in title
        code = text_of(app.screen.query_one("#done-args"))
        for piece in ("LoraConfig(", "BitsAndBytesConfig(", "bnb_4bit_quant_storage='bfloat16'", "TrainingArguments(",
                      "deepspeed="):
            assert piece in code, code
