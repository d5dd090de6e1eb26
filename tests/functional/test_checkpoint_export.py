"""`wizard checkpoint --export` of a LoRA adapter (no training: a tiny random Llama saved with save_pretrained, an
adapter made by peft and saved as the Trainer saves one): copied as it is, or merged into its base by peft's
merge_and_unload; from_pretrained loads the result and its weights are peft's own merge of the same adapter."""

from __future__ import annotations

import json

import torch

from tests.launch_support import wizard_here


def test_a_lora_adapter_is_exported_as_it_is_or_merged_into_its_base(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    base.save_pretrained(tmp_path / "base")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    model.save_pretrained(tmp_path / "adapter")

    shown = wizard_here("checkpoint", str(tmp_path / "adapter"), "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    (ck,) = json.loads(shown.stdout)["checkpoints"]
    assert ck["kind"] == "adapter" and ck["engine"] == "LORA adapter r=4" and ck["complete"]

    as_is = wizard_here("checkpoint", str(tmp_path / "adapter"), "--export", str(tmp_path / "copy"), cwd=tmp_path)
    assert as_is.returncode == 0 and sorted(p.name for p in (tmp_path / "copy").iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors"], as_is.stderr

    merged = wizard_here("checkpoint", str(tmp_path / "adapter"), "--export", str(tmp_path / "merged"),
                         "--merge-adapter", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert "merged into its base model by peft's merge_and_unload" in merged.stdout
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                     tmp_path / "adapter").merge_and_unload().state_dict()
    assert set(loaded) == set(want) and all(torch.equal(loaded[k], want[k]) for k in want)
    # the merge moved the adapted weights away from the base's
    base_sd = AutoModelForCausalLM.from_pretrained(tmp_path / "base").state_dict()
    assert not torch.equal(loaded["model.layers.0.self_attn.q_proj.weight"],
                           base_sd["model.layers.0.self_attn.q_proj.weight"])
