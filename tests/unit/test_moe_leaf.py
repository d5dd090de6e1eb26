"""MoE under ZeRO-3: the sparse block class comes from the model (built on meta) and lands in
accelerate's `deepspeed_moe_layer_cls_names`, which accelerate 1.15 accepts beside `deepspeed_config_file`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plans import make_plan
from wizard.config import emit
from wizard.sizing.model import size_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
TINY_MOE = {
    # model_type: (extra config keys, the class that holds the experts in transformers 5.24)
    "qwen2_moe": ({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64}, "Qwen2MoeSparseMoeBlock"),
    "deepseek_v2": ({"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                     "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
                     "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
                     "topk_group": 1}, "DeepseekV2Moe"),
}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path / "wizard-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))


def _tiny(tmp_path: Path, model_type: str, extra: dict) -> str:
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": model_type, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256,
        **extra}))
    return str(d)


def test_mixtral_block_class_found_on_meta():
    shape = size_model(str(FIXTURES / "mixtral-tiny"))
    assert shape.moe_block_class == "MixtralSparseMoeBlock" and shape.num_experts == 4


@pytest.mark.parametrize("model_type", sorted(TINY_MOE))
def test_other_moe_block_classes_found_on_meta(tmp_path, model_type):
    extra, expected = TINY_MOE[model_type]
    assert size_model(_tiny(tmp_path, model_type, extra)).moe_block_class == expected


def test_dense_model_has_no_moe_block():
    assert size_model(str(FIXTURES / "llama-tiny")).moe_block_class is None


def test_zero3_mixtral_yaml_names_the_leaf_and_accelerate_accepts_it(tmp_path, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    shape = size_model(str(FIXTURES / "mixtral-tiny"))
    plan = make_plan("deepspeed", world=2, stage=3)
    ds_path = tmp_path / "ds_config.json"
    ds_path.write_text(emit.render_json(emit.deepspeed_config({}, plan, shape)))
    doc = emit.accelerate_config({}, plan, str(ds_path), shape)
    assert doc["deepspeed_config"]["deepspeed_moe_layer_cls_names"] == "MixtralSparseMoeBlock"
    yaml_path = tmp_path / "default_config.yaml"
    yaml_path.write_text(emit.render_yaml(doc))
    cfg = load_config_from_file(str(yaml_path))       # accelerate's loader: the key is a known field
    assert cfg.deepspeed_config["deepspeed_moe_layer_cls_names"] == "MixtralSparseMoeBlock"
    # `accelerate launch` exports the key; the plugin built beside the config file (as the Trainer and
    # an own loop build it) then marks every block of the real model as a ZeRO-3 leaf
    import torch
    from deepspeed.utils import z3_leaf_module
    from transformers import AutoConfig, AutoModelForCausalLM

    names = doc["deepspeed_config"]["deepspeed_moe_layer_cls_names"]
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", names)
    plugin = DeepSpeedPlugin(hf_ds_config=str(ds_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(FIXTURES / "mixtral-tiny")))
    blocks = [m for m in model.modules() if type(m).__name__ == "MixtralSparseMoeBlock"]
    assert len(blocks) == 2 and not any(z3_leaf_module(b) for b in blocks)
    plugin.set_moe_leaf_modules(model)
    assert all(z3_leaf_module(b) for b in blocks)
