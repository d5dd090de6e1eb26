"""LoRA / QLoRA sizing (wizard/sizing/lora.py) against the real peft, transformers and (where installed)
bitsandbytes."""

from __future__ import annotations

import importlib.util
import json

import peft  # noqa: E402  hard dependencies (pyproject): a broken install fails here, never skips
import pytest
import torch  # noqa: E402
import transformers  # noqa: E402

from wizard.errors import InputError
from wizard.sizing.lora import (
    AdapterShape,
    adapter_model_states,
    check_qlora_strategy,
    all_linear_names,
    default_targets,
    lora_options,
    nf4_linear_bytes,
    qlora_requirements,
    quantized_module_names,
    size_adapters,
    size_llama_adapters,
)
from wizard.sizing.memory import states_zero2, states_zero3
from wizard.sizing.model import ModelShape, from_params

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None

_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1000)


def _tiny_configs():
    return {
        "llama": transformers.LlamaConfig(**_SMALL),
        "mistral": transformers.MistralConfig(**_SMALL),
        "qwen2": transformers.Qwen2Config(**_SMALL),
        "gemma2": transformers.Gemma2Config(**_SMALL, head_dim=16),
        "mixtral": transformers.MixtralConfig(**_SMALL, num_local_experts=4, num_experts_per_tok=2),
        "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, bos_token_id=0,
                                        eos_token_id=0),
    }


def _peft_counts(config, rank: int, targets):
    """peft's own get_nb_trainable_parameters() on a freshly meta-built model (computed, never pinned)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    # None: the wizard's default, peft's own all-linear module list by name (experts' fused parameters excluded).
    target_modules = all_linear_names(model) if targets is None else targets
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=target_modules,
                           task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora).get_nb_trainable_parameters()


# --- trainable counts equal peft's ----------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma2", "mixtral", "gpt2"])
@pytest.mark.parametrize("rank", [8, 64])
@pytest.mark.parametrize("targets", [None, "all-linear"])
def test_trainable_and_frozen_equal_peft(arch, rank, targets):
    config = _tiny_configs()[arch]
    options = lora_options("lora", rank=rank, targets=targets, dropout=0.0)
    shape = size_adapters(config, options)
    trainable, total = _peft_counts(config, rank, targets)
    assert shape.trainable_params == trainable
    assert shape.frozen_params == total - trainable
    assert shape.trainable_params > 0 and shape.adapted_modules > 0
    assert sum(shape.modules_per_target.values()) == shape.adapted_modules


def test_default_targets_are_every_linear_layer_for_lora_and_qlora_and_all_linear_skips_lm_head():
    """Issue 19: QLoRA's (and LoRA's) default was peft's per-architecture mapping, q_proj and v_proj for Llama; the
    QLoRA paper and the LLaMA-Factory / axolotl recipes adapt every Linear layer."""
    config = _tiny_configs()["llama"]
    linears = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    for method in ("lora", "qlora"):
        default = size_adapters(config, lora_options(method, rank=8))
        assert set(default.targets) == linears and default.modules_per_target == {t: 2 for t in linears}
    assert default_targets("llama") == ["q_proj", "v_proj"]          # peft's mapping, no longer the default
    every = size_adapters(config, lora_options("lora", rank=8, targets="all-linear"))
    assert "lm_head" not in every.modules_per_target
    assert set(every.modules_per_target) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    explicit = size_adapters(config, lora_options("lora", rank=8, targets="q_proj,k_proj"))
    assert explicit.modules_per_target == {"k_proj": 2, "q_proj": 2}


def test_the_default_targets_work_on_moe_with_dropout():
    """The default names Linear modules, so fused MoE experts (parameters, which peft wraps only without dropout)
    are left out and the default dropout works; their router and attention get adapters."""
    shape = size_adapters(_tiny_configs()["mixtral"], lora_options("lora", rank=8, dropout=0.05))
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= set(shape.targets)


def test_moe_experts_under_all_linear_need_dropout_zero():
    # peft's ParamWrapper (fused MoE experts in transformers v5) refuses lora_dropout != 0; so would training.
    with pytest.raises(InputError) as err:
        size_adapters(_tiny_configs()["mixtral"], lora_options("lora", rank=8, targets="all-linear", dropout=0.05))
    assert err.value.field == "lora_dropout"


def test_unknown_target_is_input_error():
    with pytest.raises(InputError) as err:
        size_adapters(_tiny_configs()["llama"], lora_options("lora", rank=8, targets="no_such_proj"))
    assert err.value.field == "lora_targets"


LLAMA2_7B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=11008,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)


def test_llama2_7b_pinned(tmp_path):
    # Every Linear of 32 layers at r=16: r (in + out) for q, k, v, o (4096 + 4096 each) and gate, up, down
    # (4096 + 11008 each) = 16 * (4 * 8192 + 3 * 15104) * 32 = 39,976,960, peft's well-known printout for
    # Llama-2-7B with all linear layers; frozen = Llama-2-7B's 6,738,415,616 parameters.
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    shape = size_adapters(str(tmp_path), lora_options("lora"))
    assert shape.trainable_params == 39_976_960
    qv = size_adapters(str(tmp_path), lora_options("lora", targets="q_proj,v_proj"))
    assert qv.trainable_params == 8_388_608          # 32 x 2 x 16 x 8192: the attention-only figure
    assert shape.frozen_params == 6_738_415_616
    assert shape.trainable_params == _peft_counts(transformers.LlamaConfig(**LLAMA2_7B), 16, None)[0]


@pytest.mark.parametrize("targets", [None, "all-linear", "q_proj,k_proj,o_proj"])
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_analytic_llama_equals_peft_on_real_config(tmp_path, targets, method):
    """The --params path (no build) against peft and the quantiser's rules on the same Llama config."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    options = lora_options(method, targets=targets)
    built = size_adapters(str(tmp_path), options)
    shape = ModelShape(params=0, largest_layer_params=0, hidden_size=4096, layers=32, heads=32, kv_heads=32,
                       vocab_size=32000, intermediate_size=11008, model_type="llama", source="--params 7B",
                       exact=False)
    analytic = size_llama_adapters(shape, options)
    for name in ("trainable_params", "frozen_params", "adapted_modules", "modules_per_target", "targets",
                 "quantized_modules", "quantized_params", "nf4_weight_bytes", "nf4_constant_bytes",
                 "nf4_constant_bytes_single", "nf4_constant_bytes_double", "unquantized_params"):
        assert getattr(analytic, name) == getattr(built, name), name
    assert analytic.exact is False


def test_params_shape_is_sized_without_torch_build():
    shape = size_adapters(from_params("8B"), lora_options("qlora", targets="all-linear"))
    assert shape.exact is False and shape.quantized_modules == 7 * shape.modules_per_target["q_proj"]


# --- QLoRA: which modules, and their NF4 bytes ----------------------------------------------------------

def test_quantized_modules_skip_lm_head_embeddings_and_norms():
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_tiny_configs()["llama"])
    names = quantized_module_names(model)
    assert len(names) == 14 and "lm_head" not in names
    assert not any("embed" in n or "norm" in n for n in names)


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes not installed")
@pytest.mark.parametrize("arch", ["llama", "gemma2", "mixtral", "gpt2"])
def test_quantized_modules_equal_transformers_bnb_replacement(arch):
    """Our module choice against transformers' own Bnb4BitHfQuantizer swapping in bnb Linear4bit (on meta)."""
    import bitsandbytes as bnb
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    config = _tiny_configs()[arch]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    ours = set(quantized_module_names(model))
    quantizer = Bnb4BitHfQuantizer(transformers.BitsAndBytesConfig(load_in_4bit=True), pre_quantized=False)
    quantizer._process_model_before_weight_loading(model, device_map=None)
    theirs = {n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert ours == theirs and ours


def test_nf4_formula_constants():
    # 4096 x 4096: 8 Mi codes in 8 MiB / 2; 262,144 blocks of 64; nested: 1,024 blocks of 256.
    n = 4096 * 4096
    single = nf4_linear_bytes(n, double_quant=False)
    double = nf4_linear_bytes(n, double_quant=True)
    assert single.weights == double.weights == n // 2
    assert single.constants == 262_144 * 4 + 64
    assert double.constants == 262_144 + 1_024 * 4 + 4 + 256 * 4 + 64   # codes, nested absmax, offset, maps
    assert nf4_linear_bytes(n, True, "bf16").weights == n // 2


def _quant_state_bytes(model):
    """Bytes of a really quantised model: Params4bit data + every distinct quant_state tensor, other params."""
    weights = constants = other = 0
    seen: set[int] = set()

    def tensor_bytes(t):
        if t is None or id(t) in seen:
            return 0
        seen.add(id(t))
        return t.numel() * t.element_size()

    for _, param in model.named_parameters():
        state = getattr(param, "quant_state", None)
        if state is None:
            other += param.numel()
            continue
        weights += param.numel() * param.element_size()
        constants += tensor_bytes(state.absmax) + tensor_bytes(state.code)
        if state.nested:
            constants += tensor_bytes(state.offset) + tensor_bytes(state.state2.absmax) \
                + tensor_bytes(state.state2.code)
    return weights, constants, other


@pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes not installed")
@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("storage", ["uint8", "bf16"])
def test_nf4_bytes_equal_a_model_quantised_by_bitsandbytes_on_cpu(tmp_path, double_quant, storage):
    """A small random Llama saved, then loaded by transformers with BitsAndBytesConfig(load_in_4bit) on the
    CPU backend: the bytes of its Params4bit and quant states equal our formula."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    dtype = torch.bfloat16
    bnb_config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=torch.uint8 if storage == "uint8" else dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=bnb_config, dtype=dtype,
                                                              device_map="cpu")
    weights, constants, other = _quant_state_bytes(model)
    shape = size_adapters(str(tmp_path), lora_options("qlora", rank=8, double_quant=double_quant,
                                                       quant_storage=storage))
    assert shape.nf4_weight_bytes == weights
    assert shape.nf4_constant_bytes == constants
    assert shape.unquantized_params == other
    assert shape.quantized_modules == 14


# --- options -----------------------------------------------------------------------------------------------

def test_options_defaults_and_validation():
    options = lora_options("lora")
    assert (options.rank, options.lora_alpha, options.dropout, options.targets) == (16, 32, 0.05, None)
    assert lora_options("qlora", rank=8, alpha=16).lora_alpha == 16
    assert lora_options("lora", targets="ALL-LINEAR").targets == "all-linear"
    assert lora_options("lora", targets=" q_proj , v_proj ").target_list == ["q_proj", "v_proj"]
    assert lora_options("qlora", quant_storage="bfloat16").quant_storage == "bf16"
    for kwargs, field_name in [(dict(method="dora"), "method"), (dict(rank=0), "lora_rank"),
                               (dict(rank="x"), "lora_rank"), (dict(alpha=-1), "lora_alpha"),
                               (dict(dropout=1.0), "lora_dropout"), (dict(dropout="a"), "lora_dropout"),
                               (dict(targets="q_proj;v_proj"), "lora_targets"),
                               (dict(quant_storage="int4"), "quant_storage")]:
        with pytest.raises(InputError) as err:
            lora_options(**{"method": "lora", **kwargs})
        assert err.value.field == field_name and err.value.allowed


# --- QLoRA strategy rule -------------------------------------------------------------------------------------

def test_qlora_requirements():
    assert qlora_requirements("deepspeed", 3, "bf16").quant_storage == "bf16"
    assert qlora_requirements("deepspeed", 3, "bf16").zero3_init_flag is True
    assert qlora_requirements("fsdp", None, "fp16").quant_storage == "fp16"
    assert qlora_requirements("deepspeed", 2, "bf16").quant_storage == "uint8"
    assert qlora_requirements("ddp", None, "bf16").quant_storage == "uint8"
    check_qlora_strategy(lora_options("qlora", quant_storage="bf16"), "deepspeed", 3, "bf16")
    with pytest.raises(InputError):
        check_qlora_strategy(lora_options("qlora"), "deepspeed", 3, "bf16")
    check_qlora_strategy(lora_options("qlora"), "deepspeed", 2, "bf16")


# --- model states per GPU ----------------------------------------------------------------------------------

def _shape(method="lora", trainable=10_000_000, frozen=7_000_000_000, **quant) -> AdapterShape:
    return AdapterShape(method=method, rank=16, trainable_params=trainable, frozen_params=frozen, adapted_modules=64,
                        modules_per_target={}, targets=[], **quant)


def test_states_single_lora():
    s = adapter_model_states(_shape(), "single", "bf16", "adamw")
    assert s.parameters == 2 * 7_000_000_000 + 4 * 10_000_000
    assert s.gradients == 4 * 10_000_000
    assert s.optimizer == 8 * 10_000_000
    assert s.cpu == 2 * 7_000_000_000


def test_states_zero2_replicates_frozen_and_partitions_adapters():
    t, f, n = 10_000_000, 7_000_000_000, 8
    s = adapter_model_states(_shape(trainable=t, frozen=f), "zero2", "bf16", "adamw", num_gpus_per_node=n)
    a = states_zero2(t, "bf16", "adamw", n, 1)
    assert s.parameters == 2 * f + a.parameters
    assert (s.gradients, s.optimizer) == (a.gradients, a.optimizer)
    # 18 bytes per trainable parameter over N on top of the 2-byte weights (DeepSpeed's estimator)
    assert a.parameters + a.gradients + a.optimizer == 2 * t + int(18 * t / n)
    off = adapter_model_states(_shape(trainable=t, frozen=f), "zero2", "bf16", "adamw", num_gpus_per_node=n,
                               offload_optimizer=True)
    assert off.optimizer == 0 and off.gradients == 0
    assert off.cpu == 2 * f * n + states_zero2(t, "bf16", "adamw", n, 1, offload_optimizer=True).cpu


def test_states_zero3_partitions_frozen_but_not_quant_constants():
    t, n = 10_000_000, 4
    q = _shape("qlora", trainable=t, frozen=7_000_000_000, nf4_weight_bytes=3_000_000_000,
               nf4_constant_bytes=100_000_000, unquantized_params=300_000_000)
    s = adapter_model_states(q, "zero3", "bf16", "adamw", num_gpus_per_node=n, largest_frozen_layer_params=131_072_000)
    a = states_zero3(t, 0, "bf16", "adamw", n, 1)
    frozen = int((3_000_000_000 + 2 * 300_000_000) / n) + 100_000_000 + 2 * 131_072_000
    assert s.parameters == frozen + a.parameters
    assert s.gpu == frozen + a.gpu
    assert s.cpu == 0


def test_states_qlora_single_counts_kbit_upcast():
    q = _shape("qlora", trainable=1_000, frozen=0, nf4_weight_bytes=500, nf4_constant_bytes=20, unquantized_params=100)
    assert adapter_model_states(q, "single", "bf16").parameters == 520 + 4 * 100 + 4 * 1_000
    assert adapter_model_states(q, "ddp", "bf16", kbit_prepared=False).parameters == 520 + 2 * 100 + 4 * 1_000


def test_lora_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, wizard.sizing.lora; assert 'torch' not in sys.modules and 'peft' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
