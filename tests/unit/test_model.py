"""Model sizing: meta-device counts proven equal to real models, published sizes, Hub cache, --params."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from wizard.errors import InputError
from wizard.sizing.model import (
    KNOWN_SHAPES,
    ModelShape,
    cached_model_ids,
    from_params,
    hub_cache_dir,
    llama_param_count,
    module_class_names,
    size_model,
    sizing_cache_dir,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
REPO = Path(__file__).resolve().parents[2]
TINY = ["llama-tiny", "llama-tiny-tied", "gpt2-tiny", "qwen2-tiny-tied", "mixtral-tiny", "llava-tiny"]


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path, monkeypatch):
    """Every test gets its own sizing cache and an empty HF cache, and may not open a socket."""
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path / "wizard-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "WIZARD_NO_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)

    def no_network(*args, **kwargs):
        raise AssertionError("model sizing tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)


def _real_model(name: str):
    """The same config instantiated for real on the CPU (random weights), the way training would."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(MODELS / name)
    cls = getattr(transformers, config.architectures[0])
    torch.manual_seed(0)
    return cls(config)


def _deepspeed_param_count(model) -> int:
    # deepspeed.runtime.zero: model_to_params, on real storage, where data_ptr identifies a tensor.
    return sum(dict((p.data_ptr(), p.numel()) for p in model.parameters()).values())


def _real_largest_layer(model) -> int:
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


# --------------------------------------------------------------------------------------------
# The meta-device path equals reality
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_meta_count_equals_real_instantiated_model(name):
    shape = size_model(str(MODELS / name))
    real = _real_model(name)
    assert real.device.type == "cpu"
    assert shape.params == _deepspeed_param_count(real)
    assert shape.largest_layer_params == _real_largest_layer(real)
    assert shape.exact is True
    assert shape.layer_class in {type(m).__name__ for m in real.modules()}


def test_llama_tiny_fields_and_hand_count():
    shape = size_model(str(MODELS / "llama-tiny"))
    assert (shape.hidden_size, shape.layers, shape.heads, shape.kv_heads, shape.vocab_size,
            shape.intermediate_size) == (64, 2, 4, 2, 1000, 172)
    assert shape.model_type == "llama"
    assert shape.layer_class == "LlamaDecoderLayer"
    assert shape.tied_embeddings is False
    # By hand: per layer q,o 64*64 each, k,v 64*32 each, MLP 3*64*172, two norms; embed + lm_head + final norm.
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172 + 2 * 64
    assert shape.params == 2 * per_layer + 2 * 1000 * 64 + 64 == 218_944
    assert shape.largest_layer_params == 1000 * 64
    assert shape.max_position_embeddings == 256


def test_tied_embeddings_are_counted_once():
    untied = size_model(str(MODELS / "llama-tiny"))
    tied = size_model(str(MODELS / "llama-tiny-tied"))
    assert tied.tied_embeddings is True and untied.tied_embeddings is False
    assert untied.params - tied.params == untied.vocab_size * untied.hidden_size
    # The shared matrix is still the largest layer of both.
    assert tied.largest_layer_params == untied.largest_layer_params == 64_000


def test_gpt2_style_attribute_names_and_default_mlp_width():
    shape = size_model(str(MODELS / "gpt2-tiny"))
    assert (shape.hidden_size, shape.layers, shape.heads, shape.kv_heads) == (64, 2, 4, 4)
    assert shape.intermediate_size == 4 * 64  # n_inner null means 4*h
    assert shape.tied_embeddings is True
    assert shape.layer_class == "GPT2Block"
    assert shape.max_position_embeddings == 128


def test_attention_dropout_is_read_from_the_config(tmp_path):
    # GPT2Config's attn_pdrop defaults to 0.1 (the fixture leaves it out); Llama's attention_dropout is 0.0;
    # BERT names it attention_probs_dropout_prob. Eager attention keeps a mask and a dropped copy of every
    # score when it is > 0 (memory.attention_score_bytes), which the plan counts.
    assert size_model(str(MODELS / "gpt2-tiny")).attention_dropout == 0.1
    assert size_model(str(MODELS / "llama-tiny")).attention_dropout == 0.0
    config = json.loads((MODELS / "llama-tiny" / "config.json").read_text())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.25}))
    assert size_model(str(tmp_path / "m"), use_cache=False).attention_dropout == 0.25


def test_moe_largest_layer_is_the_expert_bank():
    shape = size_model(str(MODELS / "mixtral-tiny"))
    assert shape.num_experts == 4 and shape.experts_per_token == 2
    assert shape.layer_class == "MixtralDecoderLayer"
    # 4 experts x (gate+up 2*128*64 + down 128*64) outweighs the 1000*64 embedding.
    assert shape.largest_layer_params == 4 * 3 * 128 * 64


def test_multimodal_uses_text_config_for_the_shape_and_counts_everything():
    shape = size_model(str(MODELS / "llava-tiny"))
    assert shape.model_type == "llava"
    assert (shape.hidden_size, shape.layers, shape.heads, shape.vocab_size) == (64, 3, 4, 32064)
    assert shape.layer_class == "LlamaDecoderLayer"  # the text decoder's, not the vision tower's
    text_only = llama_param_count(64, 3, 4, 4, 172, 32064)
    assert shape.params > text_only  # vision tower and projector are counted too


def test_layer_class_comes_from_the_text_decoder_even_when_the_vision_tower_is_as_deep(tmp_path):
    config = json.loads((MODELS / "llava-tiny" / "config.json").read_text())
    config["vision_config"]["num_hidden_layers"] = config["text_config"]["num_hidden_layers"]
    (tmp_path / "llava").mkdir()
    (tmp_path / "llava" / "config.json").write_text(json.dumps(config))
    assert size_model(str(tmp_path / "llava")).layer_class == "LlamaDecoderLayer"


# --------------------------------------------------------------------------------------------
# Published sizes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, params, largest, layer_class, tied", [
    ("llama-3.1-8b", 8_030_261_248, 128256 * 4096, "LlamaDecoderLayer", False),
    ("llama-3-70b", 70_553_706_496, 128256 * 8192, "LlamaDecoderLayer", False),
    ("llama-3.1-405b", 405_853_388_800, 128256 * 16384, "LlamaDecoderLayer", False),
    ("qwen2.5-7b", 7_615_616_512, 152064 * 3584, "Qwen2DecoderLayer", False),
    ("qwen2-0.5b", 494_032_768, 151936 * 896, "Qwen2DecoderLayer", True),
    ("mixtral-8x7b", 46_702_792_704, 8 * 3 * 14336 * 4096, "MixtralDecoderLayer", False),
])
def test_published_model_sizes(name, params, largest, layer_class, tied):
    shape = size_model(str(MODELS / name))
    assert shape.params == params
    assert shape.largest_layer_params == largest
    assert shape.layer_class == layer_class
    assert shape.tied_embeddings is tied


def test_llama_70b_shape_fields():
    shape = size_model(str(MODELS / "llama-3-70b"))
    assert (shape.hidden_size, shape.layers, shape.heads, shape.kv_heads, shape.vocab_size,
            shape.intermediate_size) == (8192, 80, 64, 8, 128256, 28672)
    assert shape.params == llama_param_count(8192, 80, 64, 8, 28672, 128256)


def test_config_json_path_is_accepted():
    by_file = size_model(str(MODELS / "llama-tiny" / "config.json"))
    by_dir = size_model(str(MODELS / "llama-tiny"))
    assert by_file.params == by_dir.params
    assert by_file.source.endswith("config.json")


def test_json_shape_is_plain_data():
    data = size_model(str(MODELS / "llama-tiny")).to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["params"] == 218_944 and data["exact"] is True


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, words", [
    ("no-config", "has no config.json"),
    ("corrupt", "is not valid JSON"),
    ("corrupt/config.json", "is not valid JSON"),
    ("no-model-type", "has no model_type"),
    ("unknown-type", "'definitely_not_a_model'"),
    ("does-not-exist/config.json", "does not exist"),
])
def test_bad_model_input_is_a_one_line_input_error(target, words):
    with pytest.raises(InputError) as info:
        size_model(str(MODELS / target))
    assert info.value.field == "model"
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_empty_and_non_object_configs(tmp_path):
    with pytest.raises(InputError, match="empty"):
        size_model("  ")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        size_model(str(tmp_path / "list"))


def test_invalid_config_values_are_input_errors(tmp_path):
    # transformers itself rejects this (hidden size not divisible by heads); we turn it into one line.
    bad = json.loads((MODELS / "llama-tiny" / "config.json").read_text())
    bad["num_attention_heads"] = 5
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps(bad))
    with pytest.raises(InputError) as info:
        size_model(str(tmp_path / "bad"))
    assert info.value.field == "model" and "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# Hub ids, from the local cache only
# --------------------------------------------------------------------------------------------

def _cache_model(hub: Path, repo_id: str, config_src: Path, commit: str, with_ref: bool = True) -> Path:
    """A real huggingface_hub cache layout: blobs/<sha>, snapshots/<commit>/config.json -> blob, refs/main."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    blob = repo / "blobs" / ("b" * 40)
    shutil.copyfile(config_src, blob)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(os.path.relpath(blob, snapshot))
    if with_ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def fake_hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf-home"
    hub = home / "hub"
    _cache_model(hub, "tiny-org/llama-tiny", MODELS / "llama-tiny" / "config.json", "a" * 40)
    _cache_model(hub, "gpt2-tiny", MODELS / "gpt2-tiny" / "config.json", "c" * 40)
    _cache_model(hub, "tiny-org/pinned", MODELS / "qwen2-tiny-tied" / "config.json", "d" * 40, with_ref=False)
    # Not models, or without a config: never offered.
    (hub / "models--tiny-org--weights-only" / "snapshots" / ("e" * 40)).mkdir(parents=True)
    (hub / "datasets--tiny-org--data" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    return hub


def test_hub_id_resolves_from_the_local_cache(fake_hf_home):
    assert hub_cache_dir() == fake_hf_home
    shape = size_model("tiny-org/llama-tiny")
    assert shape.params == 218_944
    assert shape.source == "tiny-org/llama-tiny"
    assert size_model("gpt2-tiny").params == size_model(str(MODELS / "gpt2-tiny")).params
    # HF_HUB_OFFLINE is forced only while sizing, then restored.
    assert "HF_HUB_OFFLINE" not in os.environ


def test_hub_id_with_revision_and_without_refs(fake_hf_home):
    assert size_model("tiny-org/llama-tiny@" + "a" * 40).params == 218_944
    # Downloaded by commit (no refs/main): the snapshot is still found.
    assert size_model("tiny-org/pinned").tied_embeddings is True


def test_hf_hub_cache_variable_wins_over_hf_home(fake_hf_home, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        size_model("tiny-org/llama-tiny")


def test_model_not_in_cache_says_so_and_suggests_params(fake_hf_home):
    with pytest.raises(InputError) as info:
        size_model("meta-llama/Llama-3.1-8B")
    message = str(info.value)
    assert info.value.field == "model"
    assert "meta-llama/Llama-3.1-8B is not in the local Hugging Face cache" in message
    assert str(fake_hf_home) in message and "--params 7B" in message
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        size_model("tiny-org/weights-only")  # cached, but without config.json
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        size_model("tiny-org/llama-tiny@" + "f" * 40)  # a revision that isn't there
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        size_model("tiny-org/llama--tiny")  # huggingface_hub rejects the id (HFValidationError)


def test_cached_model_ids_lists_models_with_a_config(fake_hf_home, monkeypatch):
    assert cached_model_ids() == ["gpt2-tiny", "tiny-org/llama-tiny", "tiny-org/pinned"]
    monkeypatch.setenv("HF_HOME", str(fake_hf_home / "nowhere"))
    assert cached_model_ids() == []


# --------------------------------------------------------------------------------------------
# Sizing cache, import hygiene, logging
# --------------------------------------------------------------------------------------------

def _run(code: str, env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_the_module_does_not_import_torch_or_transformers():
    out = _run("import sys, wizard.sizing.model; from wizard.sizing.model import from_params; from_params('7B');"
               "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))", {})
    assert out == "[]"


def test_second_sizing_comes_from_the_cache_without_torch(tmp_path):
    env = {"WIZARD_CACHE_DIR": str(tmp_path / "shared-cache")}
    code = ("import sys, json; from wizard.sizing.model import size_model;"
            f"s = size_model({str(MODELS / 'llama-3-70b')!r});"
            "print(json.dumps([s.params, s.layer_class, s.source, 'torch' in sys.modules]))")
    first = json.loads(_run(code, env))
    second = json.loads(_run(code, env))
    assert first == [70_553_706_496, "LlamaDecoderLayer", str(MODELS / "llama-3-70b"), True]
    assert second == [70_553_706_496, "LlamaDecoderLayer", str(MODELS / "llama-3-70b"), False]
    assert len(list((tmp_path / "shared-cache" / "sizing").glob("*.json"))) == 1


def test_cold_sizing_pauses_gc_for_the_imports_then_restores_it():
    """The first sizing freezes the objects the imports made (so neither later collections nor the
    final one at exit walk them) and leaves the GC as it found it; a second sizing freezes nothing."""
    code = ("import gc, json; from wizard.sizing.model import size_model;"
            f"a = size_model({str(MODELS / 'llama-3-70b')!r}, use_cache=False).params;"
            "frozen, enabled = gc.get_freeze_count(), gc.isenabled();"
            f"b = size_model({str(MODELS / 'llama-tiny')!r}, use_cache=False).params;"
            "print(json.dumps([a, b, frozen, enabled, gc.get_freeze_count() == frozen, gc.isenabled()]))")
    params, tiny, frozen, enabled, unchanged, still_enabled = json.loads(_run(code, {}))
    assert (params, tiny) == (70_553_706_496, 218_944)
    assert frozen > 100_000 and enabled and unchanged and still_enabled
    disabled = _run("import gc; gc.disable(); from wizard.sizing.model import size_model;"
                    f"size_model({str(MODELS / 'llama-tiny')!r}, use_cache=False); print(gc.isenabled())", {})
    assert disabled == "False"


def test_widened_transformers_scan_cache_gives_the_same_lazy_modules():
    """Sizing widens transformers' model-folder scan cache while it first imports transformers; the
    second pass is then served from that cache, and the lazy modules it builds are unchanged."""
    dump = ("import json, transformers, transformers.models as m;"
            "from transformers.utils import import_utils as iu;"
            "info = iu.create_import_structure_from_path.cache_info();"
            "print(json.dumps([sorted(m._class_to_module.items()), sorted(m._modules),"
            " sorted(transformers._class_to_module.items()), info.maxsize, info.hits]))")
    widened = json.loads(_run(f"from wizard.sizing.model import size_model; size_model({str(MODELS / 'llama-tiny')!r}, "
                              f"use_cache=False); {dump}", {}))
    plain = json.loads(_run(f"import transformers; transformers.LlamaForCausalLM; {dump}", {}))
    assert widened[:3] == plain[:3]
    assert len(widened[0]) > 1000
    assert widened[3] is None and widened[4] > 500   # the second pass over ~560 folders hit the cache


def test_cache_is_keyed_by_content_and_survives_garbage(tmp_path):
    target = tmp_path / "model"
    shutil.copytree(MODELS / "llama-tiny", target)
    assert size_model(str(target)).params == 218_944
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (target / "config.json").write_text(json.dumps(config))
    assert size_model(str(target)).layers == 3  # a changed config is a new key
    for entry in sizing_cache_dir().glob("*.json"):
        entry.write_text("{not json")
    assert size_model(str(target)).layers == 3  # garbage is rebuilt, not trusted


def test_cache_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("WIZARD_NO_CACHE", "1")
    size_model(str(MODELS / "llama-tiny"))
    assert not sizing_cache_dir().exists()
    monkeypatch.delenv("WIZARD_NO_CACHE")
    size_model(str(MODELS / "llama-tiny"), use_cache=False)
    assert not sizing_cache_dir().exists()


def test_transformers_verbosity_is_restored():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_info()
    try:
        size_model(str(MODELS / "qwen2-tiny-tied"), use_cache=False)
        assert hf_logging.get_verbosity() == hf_logging.INFO
    finally:
        hf_logging.set_verbosity_warning()


# --------------------------------------------------------------------------------------------
# --params
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("known", KNOWN_SHAPES, ids=lambda s: s.name)
def test_shape_formula_equals_transformers_llama(known):
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=known.hidden_size, num_hidden_layers=known.layers, num_attention_heads=known.heads,
        num_key_value_heads=known.kv_heads, intermediate_size=known.intermediate_size,
        vocab_size=known.vocab_size, tie_word_embeddings=known.tied)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    assert known.params == sum(p.numel() for p in model.parameters())


def test_from_params_picks_the_nearest_well_known_shape():
    seven = from_params(7_000_000_000)
    assert seven.params == 7_000_000_000  # exactly what the user said
    assert (seven.hidden_size, seven.layers, seven.heads, seven.kv_heads, seven.intermediate_size,
            seven.vocab_size) == (4096, 32, 32, 32, 11008, 32000)
    assert seven.largest_layer_params == 32000 * 4096
    assert seven.exact is False and seven.layer_class == "LlamaDecoderLayer" and seven.model_type == "llama"
    assert seven.source == "--params 7B"
    seventy = from_params("70B")
    assert (seventy.hidden_size, seventy.layers, seventy.kv_heads, seventy.vocab_size) == (8192, 80, 8, 128256)
    assert from_params("405B").hidden_size == 16384
    assert from_params("10B").hidden_size == 4096  # nearer 8B than 13B on a log scale
    assert from_params("1.5B").vocab_size == 151936


def test_from_params_outside_the_table_keeps_params_and_scales_the_shape():
    huge = from_params("2T")
    assert huge.params == 2 * 10**12 and huge.hidden_size == 16384 and huge.layers > 126
    assert 0.8 < llama_param_count(huge.hidden_size, huge.layers, huge.heads, huge.kv_heads,
                                   huge.intermediate_size, huge.vocab_size) / huge.params < 1.2
    small = from_params("50M")
    assert small.params == 50_000_000 and small.hidden_size < 576
    assert small.largest_layer_params <= small.params


def test_from_params_overrides():
    wide = from_params("7B", hidden_size=5120)
    assert wide.hidden_size == 5120 and wide.heads == 40
    assert wide.intermediate_size == 13824  # 8/3*h rounded up to 256
    estimate = llama_param_count(5120, wide.layers, wide.heads, wide.kv_heads, wide.intermediate_size, 32000)
    assert abs(estimate - 7e9) / 7e9 < 0.1  # layers derived so the shape still adds up
    deep = from_params("7B", layers=16)
    assert deep.layers == 16 and deep.hidden_size % 128 == 0 and deep.hidden_size > 4096
    exact_shape = from_params("7B", hidden_size=4096, layers=40, heads=16, vocab_size=50000)
    assert (exact_shape.hidden_size, exact_shape.layers, exact_shape.heads, exact_shape.vocab_size) == (
        4096, 40, 16, 50000)
    assert exact_shape.largest_layer_params == 50000 * 4096
    assert exact_shape.params == 7_000_000_000


@pytest.mark.parametrize("kwargs, field", [
    (dict(params=0), "params"),
    (dict(params=-7), "params"),
    (dict(params="abc"), "params"),
    (dict(params=True), "params"),
    (dict(params="7B", hidden_size=0), "hidden_size"),
    (dict(params="7B", layers=-1), "layers"),
    (dict(params="7B", heads=0), "heads"),
    (dict(params="7B", heads=30), "heads"),  # does not divide 4096
    (dict(params="7B", vocab_size=1.5), "vocab_size"),
    (dict(params="7B", hidden_size="wide"), "hidden_size"),
])
def test_from_params_rejects_bad_values(kwargs, field):
    with pytest.raises(InputError) as info:
        from_params(**kwargs)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_model_shape_contract_fields():
    shape = ModelShape(params=1, largest_layer_params=1, hidden_size=1, layers=1, heads=1, kv_heads=1,
                       vocab_size=1, intermediate_size=1)
    assert shape.exact is True and shape.tied_embeddings is False and shape.num_experts == 0


def test_module_class_names_come_from_the_same_meta_build_as_sizing():
    names = module_class_names(str(MODELS / "llama-tiny"))
    assert {"LlamaForCausalLM", "LlamaDecoderLayer", size_model(str(MODELS / "llama-tiny")).layer_class} <= names
    assert "LlavaForConditionalGeneration" in module_class_names(str(MODELS / "llava-tiny"))  # the checkpoint's class
    with pytest.raises(InputError, match="no config.json"):
        module_class_names(str(MODELS / "no-config"))


# --------------------------------------------------------------------------------------------
# Fields the memory model needs beyond a uniform decoder (issue 9)
# --------------------------------------------------------------------------------------------

def _size_dict(tmp_path, name: str, config: dict):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(config))
    return size_model(str(tmp_path / name), use_cache=False)


def test_t5_counts_encoder_and_decoder_layers(tmp_path):
    shape = _size_dict(tmp_path, "t5", dict(architectures=["T5ForConditionalGeneration"], model_type="t5",
                                            d_model=64, d_ff=128, d_kv=16, num_layers=3, num_decoder_layers=2,
                                            num_heads=4, vocab_size=500, decoder_start_token_id=0))
    assert (shape.encoder_layers, shape.decoder_layers, shape.layers) == (3, 2, 5)
    assert shape.is_encoder_decoder and shape.layer_class == "T5Block" and shape.gated_mlp is False


def test_moe_expert_widths_and_dense_layers_are_read(tmp_path):
    deepseek = _size_dict(tmp_path, "ds", dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=64, intermediate_size=160,
        moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=None,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=500))
    assert deepseek.intermediate_size == 160 and deepseek.moe_intermediate_size == 32
    assert deepseek.shared_expert_intermediate_size == 64          # 2 shared experts of 32
    assert deepseek.moe_layers == 2                                # first_k_dense_replace=1 keeps layer 0 dense
    assert (deepseek.head_dim, deepseek.v_head_dim, deepseek.kv_lora_rank) == (24, 16, 16)
    qwen = _size_dict(tmp_path, "qwen", dict(
        architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=64, intermediate_size=160,
        moe_intermediate_size=32, shared_expert_intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1], vocab_size=500))
    assert (qwen.moe_intermediate_size, qwen.shared_expert_intermediate_size, qwen.moe_layers) == (32, 96, 1)
    mixtral = size_model(str(MODELS / "mixtral-tiny"), use_cache=False)
    assert mixtral.moe_intermediate_size == 0 and mixtral.moe_layers == 2   # Mixtral's intermediate_size is the expert's


def test_attention_implementation_is_what_transformers_picks(tmp_path):
    gemma2 = _size_dict(tmp_path, "gemma2", dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                                                 hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                                 vocab_size=500))
    # What the installed transformers itself picks for a model built from this config (gemma2 went from eager to
    # sdpa between 5.17 and 5.25): the sizing must agree with it, whichever it is.
    assert gemma2.attn_implementation == _picked_by_transformers(tmp_path / "gemma2") and gemma2.head_dim == 32
    assert gemma2.attn_implementation in ("eager", "sdpa")
    llama = size_model(str(MODELS / "llama-tiny"), use_cache=False)
    assert llama.attn_implementation == _picked_by_transformers(MODELS / "llama-tiny") == "sdpa"


def _picked_by_transformers(directory) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(directory)))
    return model.config._attn_implementation


def test_mamba_is_sized_without_attention_heads(tmp_path):
    shape = _size_dict(tmp_path, "mamba", dict(architectures=["MambaForCausalLM"], model_type="mamba",
                                               hidden_size=64, num_hidden_layers=2, state_size=8, expand=2,
                                               vocab_size=500))
    assert shape.is_ssm and shape.heads == 0 and (shape.ssm_state_size, shape.ssm_inner_size) == (8, 128)
    assert shape.params > 0 and shape.layer_class == "MambaBlock"


def test_checkpoint_dtype_is_read_from_the_config():
    assert size_model(str(MODELS / "qwen2-0.5b"), use_cache=False).weights_dtype_bytes == 2     # bfloat16
    assert size_model(str(MODELS / "llama-tiny"), use_cache=False).weights_dtype_bytes == 4     # float32
