"""emit: the keys each rung writes, the "auto" map per trainer, CPU mode, integers, determinism."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.plans import LLAMA2_7B, make_plan
from wizard.config import emit
from wizard.config.vocab import REJECTED_BESIDE_DS_FILE
from wizard.errors import InputError
from wizard.sizing.model import ModelShape

MODEL = LLAMA2_7B
H = MODEL.hidden_size
DS_PATH = "/out/ds_config.json"


def all_numbers(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from all_numbers(v, f"{prefix}{k}.")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix[:-1], node


def autos(node, prefix=""):
    if isinstance(node, dict):
        out = set()
        for k, v in node.items():
            out |= autos(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]} if node == "auto" else set()


# ---- default_config.yaml --------------------------------------------------------------------------

def test_single_gpu_document():
    doc = emit.accelerate_config({"gpu_ids": "all", "mixed_precision": "bf16"}, make_plan("single", world=1), None)
    assert doc["distributed_type"] == "NO" and doc["num_processes"] == 1 and doc["num_machines"] == 1
    assert doc["gpu_ids"] == "all" and doc["mixed_precision"] == "bf16" and doc["use_cpu"] is False
    assert "deepspeed_config" not in doc and "fsdp_config" not in doc and "main_process_ip" not in doc


def test_ddp_gpu_ids_are_a_string():
    doc = emit.accelerate_config({"gpu_ids": 1}, make_plan("single", world=1), None)
    assert doc["gpu_ids"] == "1"
    text = emit.render_yaml(emit.accelerate_config({"gpu_ids": "0,1"}, make_plan("ddp", world=2), None))
    assert yaml.safe_load(text)["gpu_ids"] == "0,1"


def test_render_yaml_quotes_no_like_accelerate():
    text = emit.render_yaml(emit.accelerate_config({"mixed_precision": "no"}, make_plan("single", world=1), None))
    assert "distributed_type: 'NO'\n" in text
    assert "mixed_precision: 'no'\n" in text and "downcast_bf16: 'no'\n" in text
    loaded = yaml.safe_load(text)
    assert loaded["distributed_type"] == "NO" and loaded["mixed_precision"] == "no"
    assert list(loaded) == sorted(loaded)


def test_mixed_precision_defaults_from_the_plan():
    assert emit.accelerate_config({}, make_plan("ddp", precision="fp16"), None)["mixed_precision"] == "fp16"
    assert emit.accelerate_config({}, make_plan("ddp", precision="fp32"), None)["mixed_precision"] == "no"


def test_cpu_ddp_is_multi_cpu_without_gpu_ids():
    doc = emit.accelerate_config({"use_cpu": True}, make_plan("ddp", world=2, cpu=True, precision="fp32"), None)
    assert doc["distributed_type"] == "MULTI_CPU" and doc["use_cpu"] is True
    assert "gpu_ids" not in doc and doc["mixed_precision"] == "no" and doc["enable_cpu_affinity"] is False


def test_deepspeed_document_has_only_keys_allowed_beside_the_file():
    answers = {"mixed_precision": "bf16", "zero3_save_16bit_model": True, "gradient_clipping": 0.5,
               "grad_accum": 8, "gpu_ids": "0,1,2,3", "deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock"}
    doc = emit.accelerate_config(answers, make_plan("deepspeed", stage=3, oo="cpu", op="cpu"), "rel/ds.json")
    assert doc["distributed_type"] == "DEEPSPEED"
    assert "mixed_precision" not in doc and "gpu_ids" not in doc
    section = doc["deepspeed_config"]
    assert not set(section) & set(REJECTED_BESIDE_DS_FILE)
    assert set(section) == {"deepspeed_config_file", "zero3_init_flag", "deepspeed_moe_layer_cls_names"}
    assert section["deepspeed_config_file"].startswith("/") and section["deepspeed_config_file"].endswith("rel/ds.json")
    assert section["zero3_init_flag"] is True   # default for ZeRO-3: zero.Init partitions at load


def test_deepspeed_on_cpu_keeps_use_cpu_false():
    doc = emit.accelerate_config({"use_cpu": True}, make_plan("deepspeed", world=2, stage=3, cpu=True,
                                                               precision="fp32"), DS_PATH)
    assert doc["use_cpu"] is False and doc["num_processes"] == 2 and "mixed_precision" not in doc


def test_deepspeed_needs_the_json_path():
    with pytest.raises(ValueError):
        emit.accelerate_config({}, make_plan("deepspeed", stage=2), None)


def test_two_nodes_total_processes_and_multinode_keys():
    answers = {"num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1", "main_process_port": "29500",
               "same_network": False, "rdzv_backend": "c10d", "deepspeed_hostfile": "/job/hostfile"}
    doc = emit.accelerate_config(answers, make_plan("deepspeed", world=16, machines=2, stage=3), DS_PATH)
    assert doc["num_processes"] == 16 and doc["num_machines"] == 2 and doc["machine_rank"] == 1
    assert doc["main_process_port"] == 29500 and doc["rdzv_backend"] == "c10d" and doc["same_network"] is False
    assert doc["deepspeed_config"]["deepspeed_multinode_launcher"] == "pdsh"
    assert doc["deepspeed_config"]["deepspeed_hostfile"] == "/job/hostfile"


def test_multinode_needs_ip_and_port():
    with pytest.raises(InputError) as err:
        emit.accelerate_config({"num_machines": 2}, make_plan("ddp", world=16, machines=2), None)
    assert err.value.field == "main_process_ip"


def test_multi_gpu_with_one_process_is_refused_like_accelerate():
    with pytest.raises(InputError):
        emit.accelerate_config({"num_processes": 1}, make_plan("ddp", world=2), None)


def test_fsdp2_defaults_follow_the_rung():
    doc = emit.accelerate_config({"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"},
                                 make_plan("fsdp", reshard=False, oo="cpu", op="cpu", gc=True), None)
    fsdp = doc["fsdp_config"]
    assert fsdp == {"fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": True,
                    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                    "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                    "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
                    "fsdp_activation_checkpointing": True}
    assert doc["distributed_type"] == "FSDP" and "gpu_ids" not in doc


def test_fsdp1_maps_resharding_to_a_strategy_and_syncs_module_states():
    doc = emit.accelerate_config({"fsdp_version": 1, "fsdp_reshard_after_forward": True},
                                 make_plan("fsdp"), None)
    fsdp = doc["fsdp_config"]
    assert fsdp["fsdp_reshard_after_forward"] == "FULL_SHARD" and fsdp["fsdp_sync_module_states"] is True
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT" and fsdp["fsdp_backward_prefetch"] == "BACKWARD_PRE"


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                      "HYBRID_SHARD_ZERO2"])
def test_fsdp1_writes_the_asked_sharding_strategy_as_a_string_and_fsdp2_a_bool(strategy):
    # The type trap: one key, fsdp_reshard_after_forward, holds a strategy name for FSDP1 and a bool for FSDP2
    # (FullyShardedDataParallelPlugin raises on the other type). The table asks FSDP1's as fsdp_sharding_strategy.
    plan = make_plan("fsdp", reshard=False)
    v1 = emit.accelerate_config({"fsdp_version": 1, "fsdp_sharding_strategy": strategy}, plan, None)["fsdp_config"]
    assert v1["fsdp_reshard_after_forward"] == strategy
    v2 = emit.accelerate_config({"fsdp_version": 2, "fsdp_reshard_after_forward": True,
                                 "fsdp_sharding_strategy": strategy}, plan, None)["fsdp_config"]
    assert v2["fsdp_reshard_after_forward"] is True
    text = emit.render_yaml(emit.accelerate_config({"fsdp_version": 1, "fsdp_sharding_strategy": strategy}, plan,
                                                   None))
    assert f"  fsdp_reshard_after_forward: {strategy}\n" in text


def test_fsdp1_strategy_from_the_question_table_reaches_the_file():
    from wizard import pipeline

    given = {"params": "7B", "backend": "fsdp", "fsdp_version": "1", "fsdp_sharding_strategy": "hybrid_shard"}
    result = pipeline.build(pipeline.Request(given=given, assume="8xA100-80GB", output_dir="/tmp/unused-wizard-out",
                                             calibrate=False))
    assert result.answers["fsdp_sharding_strategy"] == "HYBRID_SHARD"
    assert "fsdp_reshard_after_forward" not in result.answers
    assert result.accelerate_doc["fsdp_config"]["fsdp_reshard_after_forward"] == "HYBRID_SHARD"
    v2 = pipeline.build(pipeline.Request(given={"params": "7B", "backend": "fsdp"}, assume="8xA100-80GB",
                                         output_dir="/tmp/unused-wizard-out", calibrate=False))
    assert type(v2.accelerate_doc["fsdp_config"]["fsdp_reshard_after_forward"]) is bool


@pytest.mark.parametrize("key,value", [("fsdp_auto_wrap_policy", "EVERYTHING"), ("fsdp_version", 3),
                                       ("fsdp_state_dict_type", "LOCAL_STATE_DICT"), ("mixed_precision", "fp4"),
                                       ("fp8_backend", "msamp")])
def test_bad_choices_name_the_field(key, value):
    answers = {key: value, **({"mixed_precision": "fp8"} if key.startswith("fp8") else {})}
    with pytest.raises(InputError) as err:
        emit.accelerate_config(answers, make_plan("fsdp"), None)
    assert err.value.field == key


def test_dynamo_sections():
    plan = make_plan("ddp", world=2)
    assert "dynamo_config" not in emit.accelerate_config({"use_dynamo": False, "dynamo_backend": "inductor"}, plan,
                                                         None)
    short = emit.accelerate_config({"use_dynamo": True, "dynamo_backend": "inductor"}, plan, None)["dynamo_config"]
    assert short == {"dynamo_backend": "INDUCTOR"}
    full = emit.accelerate_config({"use_dynamo": True, "dynamo_mode": "reduce-overhead"}, plan, None)["dynamo_config"]
    assert full == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "reduce-overhead", "dynamo_use_fullgraph": False,
                    "dynamo_use_dynamic": False, "dynamo_use_regional_compilation": False}


# ---- ds_config.json -----------------------------------------------------------------------------

def test_no_deepspeed_json_for_other_backends():
    for backend in ("single", "ddp", "fsdp"):
        assert emit.deepspeed_config({}, make_plan(backend), MODEL) is None


def test_zero2_hf_auto_map():
    ds = emit.deepspeed_config({"trainer": "hf"}, make_plan("deepspeed", stage=2), MODEL)
    assert autos(ds) == {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                         "gradient_clipping", "bf16.enabled", "fp16.enabled", "zero_optimization.reduce_bucket_size"}
    zero = ds["zero_optimization"]
    assert zero["stage"] == 2 and not any(k.startswith("stage3_") for k in zero)
    assert "offload_optimizer" not in zero and "offload_param" not in zero
    assert "zero_force_ds_cpu_optimizer" not in ds and "aio" not in ds


def test_zero3_hf_auto_map_and_16bit_gather():
    ds = emit.deepspeed_config({}, make_plan("deepspeed", stage=3), MODEL)
    assert autos(ds) == {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                         "gradient_clipping", "bf16.enabled", "fp16.enabled", "zero_optimization.reduce_bucket_size",
                         "zero_optimization.stage3_prefetch_bucket_size",
                         "zero_optimization.stage3_param_persistence_threshold"}
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    off = emit.deepspeed_config({"zero3_save_16bit_model": False}, make_plan("deepspeed", stage=3), MODEL)
    assert off["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False


def test_accelerate_loop_writes_concrete_values():
    answers = {"trainer": "accelerate", "grad_accum": 4, "gradient_clipping": 0.5, "micro_batch": 2}
    ds = emit.deepspeed_config(answers, make_plan("deepspeed", stage=3), MODEL)
    # accelerate fills only the batch sizes (from the dataloader it is given)
    assert autos(ds) == {"train_batch_size", "train_micro_batch_size_per_gpu"}
    assert ds["gradient_accumulation_steps"] == 4 and ds["gradient_clipping"] == 0.5
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    zero = ds["zero_optimization"]
    assert zero["reduce_bucket_size"] == H * H
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * H * H)
    assert zero["stage3_param_persistence_threshold"] == 10 * H
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_accelerate_loop_zero2_fp16():
    ds = emit.deepspeed_config({"trainer": "accelerate"}, make_plan("deepspeed", stage=2, precision="fp16"), MODEL)
    assert ds["fp16"] == {"enabled": True} and ds["bf16"] == {"enabled": False}
    assert ds["zero_optimization"]["reduce_bucket_size"] == H * H


@pytest.mark.parametrize("trainer", ["hf", "accelerate"])
@pytest.mark.parametrize("stage,oo,op", [(1, "none", "none"), (2, "none", "none"), (2, "cpu", "none"),
                                         (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"),
                                         (3, "nvme", "nvme")])
def test_every_count_is_an_integer_and_allgather_is_even(trainer, stage, oo, op):
    ds = emit.deepspeed_config({"trainer": trainer, "nvme_path": "/nvme"}, make_plan("deepspeed", stage=stage,
                                                                                     oo=oo, op=op), MODEL)
    for key, value in all_numbers(ds):
        if key != "gradient_clipping":
            assert isinstance(value, int), (key, value)
    bucket = ds["zero_optimization"].get("allgather_bucket_size")
    assert bucket is None or bucket % 2 == 0
    assert json.loads(emit.render_json(ds)) == ds


def test_offload_blocks_only_on_offload_rungs():
    ds = emit.deepspeed_config({}, make_plan("deepspeed", stage=3, oo="cpu", op="cpu"), MODEL)
    zero = ds["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert "aio" not in ds
    opt_only = emit.deepspeed_config({}, make_plan("deepspeed", stage=2, oo="cpu"), MODEL)
    assert "offload_param" not in opt_only["zero_optimization"]


CPU_ADAM = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


@pytest.mark.parametrize("stage,oo,op", [(1, "cpu", "none"), (2, "cpu", "none"), (3, "cpu", "none"),
                                         (3, "cpu", "cpu"), (3, "nvme", "nvme")])
@pytest.mark.parametrize("optimizer", ["adamw", "adamw-8bit"])
def test_hf_offload_runs_deepspeed_cpu_adam_through_an_auto_optimizer_block(stage, oo, op, optimizer):
    plan = make_plan("deepspeed", stage=stage, oo=oo, op=op)
    ds = emit.deepspeed_config({"optimizer": optimizer, "nvme_path": "/nvme"}, plan, MODEL)
    # DeepSpeed builds type AdamW under offload as DeepSpeedCPUAdam(adamw_mode=True); the Trainer fills the autos
    assert ds["optimizer"] == CPU_ADAM
    assert "zero_force_ds_cpu_optimizer" not in ds and "scheduler" not in ds


@pytest.mark.parametrize("optimizer", ["adamw", "adamw-8bit"])
def test_accelerate_loop_offload_leaves_the_swap_to_accelerate(optimizer):
    # no block (accelerate would refuse the loop's torch optimizer beside one) and the force flag at its
    # default true: accelerate maps the loop's torch AdamW to DeepSpeedCPUAdam
    ds = emit.deepspeed_config({"trainer": "accelerate", "optimizer": optimizer},
                               make_plan("deepspeed", stage=2, oo="cpu"), MODEL)
    assert "optimizer" not in ds and "zero_force_ds_cpu_optimizer" not in ds
    text = " ".join(emit.notes({"trainer": "accelerate", "optimizer": optimizer},
                               make_plan("deepspeed", stage=2, oo="cpu")))
    assert "torch.optim.AdamW" in text and "DeepSpeedCPUAdam" in text


@pytest.mark.parametrize("trainer", ["hf", "accelerate"])
@pytest.mark.parametrize("optimizer", ["sgd", "adafactor"])
def test_sgd_and_adafactor_keep_their_torch_step_on_offload(trainer, optimizer):
    ds = emit.deepspeed_config({"trainer": trainer, "optimizer": optimizer},
                               make_plan("deepspeed", stage=3, oo="cpu", op="cpu"), MODEL)
    assert ds["zero_force_ds_cpu_optimizer"] is False and "optimizer" not in ds
    text = " ".join(emit.notes({"trainer": trainer, "optimizer": optimizer},
                               make_plan("deepspeed", stage=3, oo="cpu", op="cpu")))
    assert f"your {optimizer} steps the offloaded states in torch on the CPU" in text


def test_no_optimizer_keys_without_offload():
    for optimizer in ("adamw", "adamw-8bit", "sgd"):
        ds = emit.deepspeed_config({"optimizer": optimizer}, make_plan("deepspeed", stage=3), MODEL)
        assert "optimizer" not in ds and "zero_force_ds_cpu_optimizer" not in ds
        assert not [n for n in emit.notes({"optimizer": optimizer}, make_plan("deepspeed", stage=3))
                    if "optimizer" in n.lower()]


def test_8bit_with_offload_is_said_in_the_notes():
    text = " ".join(emit.notes({"optimizer": "adamw-8bit"}, make_plan("deepspeed", stage=2, oo="cpu")))
    assert "8-bit AdamW is not paired with CPU offload" in text and "DeepSpeedCPUAdam" in text
    assert "8-bit" not in " ".join(emit.notes({"optimizer": "adamw"}, make_plan("deepspeed", stage=2, oo="cpu")))


def test_unknown_optimizer_answer_names_the_field():
    with pytest.raises(InputError) as err:
        emit.deepspeed_config({"optimizer": "lamb"}, make_plan("deepspeed", stage=2, oo="cpu"), MODEL)
    assert err.value.field == "optimizer"


def test_moe_block_is_a_zero3_leaf_module_in_the_yaml():
    moe = ModelShape(**{**MODEL.__dict__, "num_experts": 8, "moe_block_class": "MixtralSparseMoeBlock"})
    z3 = emit.accelerate_config({}, make_plan("deepspeed", stage=3), DS_PATH, moe)["deepspeed_config"]
    assert z3["deepspeed_moe_layer_cls_names"] == "MixtralSparseMoeBlock"
    # only ZeRO-3 partitions parameters per module; dense models and other stages get no key
    z2 = emit.accelerate_config({}, make_plan("deepspeed", stage=2), DS_PATH, moe)["deepspeed_config"]
    dense = emit.accelerate_config({}, make_plan("deepspeed", stage=3), DS_PATH, MODEL)["deepspeed_config"]
    assert "deepspeed_moe_layer_cls_names" not in z2 and "deepspeed_moe_layer_cls_names" not in dense
    # the user's own answer wins
    own = emit.accelerate_config({"deepspeed_moe_layer_cls_names": "MyBlock"}, make_plan("deepspeed", stage=3),
                                 DS_PATH, moe)["deepspeed_config"]
    assert own["deepspeed_moe_layer_cls_names"] == "MyBlock"


def test_nvme_offload_has_path_buffers_and_top_level_aio():
    plan = make_plan("deepspeed", world=8, stage=3, oo="nvme", op="nvme")
    ds = emit.deepspeed_config({"nvme_path": "~/nvme"}, plan, MODEL)
    zero = ds["zero_optimization"]
    assert zero["offload_optimizer"]["nvme_path"].startswith("/")
    assert zero["offload_param"]["device"] == "nvme" and zero["offload_param"]["pin_memory"] is True
    assert zero["offload_param"]["buffer_size"] == 100_000_000
    assert "aio" in ds and "aio" not in zero
    big = ModelShape(**{**MODEL.__dict__, "largest_layer_params": 2_101_346_304})   # 405B-style embedding
    zero_big = emit.deepspeed_config({"nvme_path": "/nvme"}, plan, big)["zero_optimization"]
    assert zero_big["offload_param"]["buffer_size"] >= 2_101_346_304 / 8
    assert zero_big["offload_param"]["buffer_size"] % 1_000_000 == 0


def test_nvme_without_a_path_names_the_field():
    with pytest.raises(InputError) as err:
        emit.deepspeed_config({}, make_plan("deepspeed", stage=3, oo="nvme"), MODEL)
    assert err.value.field == "nvme_path"


def test_parameter_offload_below_zero3_is_a_bug():
    with pytest.raises(ValueError):
        emit.deepspeed_config({}, make_plan("deepspeed", stage=2, oo="cpu", op="cpu"), MODEL)


@pytest.mark.parametrize("trainer", ["hf", "accelerate"])
def test_cpu_mode_is_fp32_without_train_batch_size(trainer):
    plan = make_plan("deepspeed", world=2, stage=3, cpu=True, precision="fp32")
    ds = emit.deepspeed_config({"use_cpu": True, "trainer": trainer}, plan, MODEL)
    assert "train_batch_size" not in ds
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}
    notes = " ".join(emit.notes({"use_cpu": True}, plan))
    assert "fp32" in notes and "train_batch_size" in notes


def test_output_is_deterministic():
    plan = make_plan("deepspeed", stage=3, oo="cpu", op="cpu")
    first = emit.render_json(emit.deepspeed_config({}, plan, MODEL))
    second = emit.render_json(emit.deepspeed_config({}, plan, MODEL))
    assert first == second and first.endswith("}\n")
    assert list(json.loads(first)) == ["train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps", "gradient_clipping", "bf16", "fp16",
                                       "zero_optimization", "optimizer"]
    y1 = emit.render_yaml(emit.accelerate_config({}, plan, DS_PATH))
    assert y1 == emit.render_yaml(emit.accelerate_config({}, plan, DS_PATH))


def test_output_paths_are_absolute(tmp_path):
    yaml_path, ds_path = emit.output_paths(str(tmp_path))
    assert yaml_path == str(tmp_path / "default_config.yaml") and ds_path == str(tmp_path / "ds_config.json")


def test_emit_imports_nothing_heavy():
    import subprocess
    import sys

    code = ("import sys, wizard.config.emit, wizard.config.validate, wizard.fsutil; "
            "print([m for m in ('torch','accelerate','deepspeed','transformers','yaml') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
