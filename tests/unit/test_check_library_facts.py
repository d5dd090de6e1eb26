"""What the rules of `wizard check` claim about accelerate, DeepSpeed and transformers, shown on the installed
libraries with the rules' own fixtures: where a rule says a library rejects something, the library raises on
the trigger fixture (and not on the clean one); where it says a library silently ignores something, the library
accepts it and nothing changes.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
ROOT = Path(__file__).resolve().parent.parent.parent


def fixture(rule: str, kind: str, name: str) -> Path:
    return FIXTURES / rule / kind / name


@pytest.fixture(autouse=True)
def clean_accelerate_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key)


def launch(yaml_path: Path, tmp_path: Path, text: str | None = None):
    """accelerate launch up to the environment it would give the script: the real parser,
    _validate_launch_command and prepare_*_env, as launch_command calls them. Returns (args, env)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    path = yaml_path
    if text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(text)
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    elif args.use_fsdp or args.multi_gpu:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return args, env


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# ----------------------------------------------------------------------------- accelerate


def test_unquoted_no_crashes_launch(tmp_path):
    with pytest.raises(AttributeError, match="'bool' object has no attribute 'lower'"):
        launch(fixture("ACC-UNQUOTED-NO", "trigger", "default_config.yaml"), tmp_path)
    launch(fixture("ACC-UNQUOTED-NO", "clean", "default_config.yaml"), tmp_path)


def test_unquoted_distributed_type_no_without_num_processes_fails_launch(tmp_path):
    text = "compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: 'no'\n"
    with pytest.raises(ValueError, match="manually pass in `--num_processes`"):
        launch(Path(), tmp_path, text)
    launch(Path(), tmp_path, text.replace("NO\n", "'NO'\n", 1))


def test_gpu_ids_int_crashes_launch(tmp_path):
    with pytest.raises(AttributeError, match="'int' object has no attribute 'split'"):
        launch(fixture("ACC-GPU-IDS-NOT-STRING", "trigger", "default_config.yaml"), tmp_path)
    launch(fixture("ACC-GPU-IDS-NOT-STRING", "clean", "default_config.yaml"), tmp_path)


def test_loader_rejects_unknown_top_level_key():
    from accelerate.commands.config.config_args import load_config_from_file

    with pytest.raises(ValueError, match=r"unknown keys \(\['num_gpus'\]\)"):
        load_config_from_file(str(fixture("ACC-UNKNOWN-KEY", "trigger", "default_config.yaml")))
    load_config_from_file(str(fixture("ACC-UNKNOWN-KEY", "clean", "default_config.yaml")))


def test_loader_rejects_bad_distributed_type():
    from accelerate.commands.config.config_args import load_config_from_file

    with pytest.raises(ValueError, match="'MULTIGPU' is not a valid DistributedType"):
        load_config_from_file(str(fixture("ACC-LOADER-REJECTS", "trigger", "default_config.yaml")))


def test_nested_unknown_keys_are_accepted_and_ignored(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    trigger = fixture("ACC-UNKNOWN-NESTED-KEY", "trigger", "default_config.yaml")
    loaded = load_config_from_file(str(trigger))       # no error
    assert loaded.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    bogus = load_yaml(trigger)
    bogus["deepspeed_config"] = {"bogus": 7}
    path = tmp_path / "bogus.yaml"
    path.write_text(yaml.safe_dump(bogus))
    assert load_config_from_file(str(path)).deepspeed_config == {"bogus": 7}
    # and the launch environment carries nothing of it: the same as without the key
    clean_env = _ds_env(fixture("ACC-UNKNOWN-NESTED-KEY", "clean", "default_config.yaml"), tmp_path)
    trigger_env = _ds_env(trigger, tmp_path)
    assert {k: v for k, v in trigger_env.items() if k != "ACCELERATE_CONFIG_DS_FIELDS"} == \
        {k: v for k, v in clean_env.items() if k != "ACCELERATE_CONFIG_DS_FIELDS"}
    assert not any("MICRO" in k for k in trigger_env)


def _ds_env(path: Path, tmp_path: Path) -> dict:
    cwd = os.getcwd()
    os.chdir(path.parent)          # deepspeed_config_file is relative to the fixture
    try:
        _, env = launch(path, tmp_path)
    finally:
        os.chdir(cwd)
    return {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def _plugin_from_env(env: dict, cwd: Path, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    for k, v in env.items():
        if k.startswith("ACCELERATE_"):
            monkeypatch.setenv(k, v)
    monkeypatch.chdir(cwd)
    return DeepSpeedPlugin()


def test_keys_beside_ds_file_rejected_by_plugin(tmp_path, monkeypatch):
    trigger = fixture("ACC-KEYS-BESIDE-DS-FILE", "trigger", "default_config.yaml")
    env = _ds_env(trigger, tmp_path)
    with pytest.raises(ValueError, match="When using `deepspeed_config_file`, the following accelerate config"):
        _plugin_from_env(env, trigger.parent, monkeypatch)
    clean = fixture("ACC-KEYS-BESIDE-DS-FILE", "clean", "default_config.yaml")
    _plugin_from_env(_ds_env(clean, tmp_path), clean.parent, monkeypatch)


def test_the_rejected_keys_are_accelerates_own_list():
    """One list (config/vocab.py) for the emitter and the check, equal to the names accelerate's plugin refuses."""
    import inspect
    import re

    from accelerate.utils import DeepSpeedPlugin

    from wizard.config.vocab import REJECTED_BESIDE_DS_FILE

    source = inspect.getsource(DeepSpeedPlugin._deepspeed_config_checks)
    listed = re.search(r"env_variable_names_to_ignore = \[(.*?)\]", source, re.S).group(1)
    names = re.findall(r'"ACCELERATE_([A-Z0-9_]+)"', listed)
    theirs = {n.replace("DEEPSPEED_", "").lower() for n in names}
    assert theirs == set(REJECTED_BESIDE_DS_FILE)


def test_each_rejected_deepspeed_key_lands_where_the_check_compares_it_with_the_json():
    """DS_KEY_OF_YAML_KEY (the JSON key --fix compares a rejected YAML key with before dropping it) is where
    accelerate's DeepSpeedPlugin puts that key's value in the config it builds without a file."""
    from accelerate.utils import DeepSpeedPlugin

    from wizard.config.vocab import DS_KEY_OF_YAML_KEY, REJECTED_BESIDE_DS_FILE

    assert set(DS_KEY_OF_YAML_KEY) == set(REJECTED_BESIDE_DS_FILE) - {"mixed_precision"}
    values = {"gradient_accumulation_steps": 3, "gradient_clipping": 0.7, "zero_stage": 3,
              "offload_optimizer_device": "nvme", "offload_param_device": "nvme", "offload_optimizer_nvme_path": "/a",
              "offload_param_nvme_path": "/b", "zero3_save_16bit_model": True}
    built = DeepSpeedPlugin(**values).deepspeed_config
    for key, ds_key in DS_KEY_OF_YAML_KEY.items():
        node = built
        for part in ds_key.split("."):
            node = node[part]
        assert node == values[key], (key, ds_key, node)


@pytest.mark.parametrize("key", ["gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                                 "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                                 "offload_optimizer_nvme_path", "zero3_save_16bit_model", "mixed_precision"])
def test_each_rejected_key_is_really_rejected(key, tmp_path, monkeypatch):
    from wizard.config.vocab import REJECTED_BESIDE_DS_FILE

    assert key in REJECTED_BESIDE_DS_FILE
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", f"deepspeed_config_file,{key}")
    monkeypatch.chdir(fixture("ACC-KEYS-BESIDE-DS-FILE", "clean", "default_config.yaml").parent)
    from accelerate.utils import DeepSpeedPlugin

    with pytest.raises(ValueError, match="will be ignored"):
        DeepSpeedPlugin(hf_ds_config="ds_config.json")


def test_keys_allowed_beside_ds_file_are_allowed(monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag,deepspeed_hostfile,"
                       "deepspeed_multinode_launcher,deepspeed_moe_layer_cls_names")
    monkeypatch.chdir(fixture("ACC-KEYS-BESIDE-DS-FILE", "clean", "default_config.yaml").parent)
    DeepSpeedPlugin(hf_ds_config="ds_config.json")


def test_launch_ignores_yaml_rdzv_backend_and_cpu_affinity(tmp_path):
    args, env = launch(fixture("ACC-IGNORED-BY-LAUNCH", "trigger", "default_config.yaml"), tmp_path)
    assert load_yaml(fixture("ACC-IGNORED-BY-LAUNCH", "trigger", "default_config.yaml"))["rdzv_backend"] == "c10d"
    assert args.rdzv_backend == "static"
    text = fixture("ACC-IGNORED-BY-LAUNCH", "clean", "default_config.yaml").read_text().replace(
        "enable_cpu_affinity: false", "enable_cpu_affinity: true")
    _, env = launch(Path(), tmp_path, text)
    assert "ACCELERATE_CPU_AFFINITY" not in env


def test_num_processes_is_the_total_over_machines(tmp_path):
    args, _ = launch(fixture("ACC-NUM-PROCESSES-PER-NODE", "trigger", "default_config.yaml"), tmp_path)
    assert (args.num_processes, args.num_machines, args.nproc_per_node) == (3, 2, "1")
    args, _ = launch(fixture("ACC-NUM-PROCESSES-PER-NODE", "clean", "default_config.yaml"), tmp_path)
    assert args.nproc_per_node == "4"


def test_several_machines_without_the_main_address(tmp_path, monkeypatch):
    """ACC-MAIN-PROCESS-UNSET: torchrun's launchers meet at the host 'None' and default the port; the simple
    launcher asserts the address, then the port; DeepSpeed's pdsh runner needs neither."""
    import accelerate.utils.launch

    # whether 29500 is busy on this box is not the question here
    monkeypatch.setattr(accelerate.utils.launch, "is_port_in_use", lambda port=None: False)
    args, _ = launch(fixture("ACC-MAIN-PROCESS-UNSET", "trigger", "default_config.yaml"), tmp_path)
    assert args.rdzv_endpoint.startswith("None:")
    args, _ = launch(fixture("ACC-MAIN-PROCESS-UNSET", "clean", "default_config.yaml"), tmp_path)
    assert args.rdzv_endpoint.startswith("10.0.0.1:")
    cpu = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nuse_cpu: true\nmixed_precision: 'no'\n"
           "num_machines: 2\nnum_processes: 4\nmachine_rank: 0\n")
    with pytest.raises(AssertionError, match="specify the main process IP"):
        launch(Path(), tmp_path, cpu)
    with pytest.raises(AssertionError, match="specify the main process port"):
        launch(Path(), tmp_path, cpu + "main_process_ip: 10.0.0.1\n")
    gpu = cpu.replace("MULTI_CPU", "MULTI_GPU").replace("use_cpu: true", "use_cpu: false")
    args, _ = launch(Path(), tmp_path, gpu + "main_process_ip: 10.0.0.1\n")
    assert args.rdzv_endpoint == "10.0.0.1:29500"
    ds = gpu.replace("MULTI_GPU", "DEEPSPEED") + "deepspeed_config:\n  zero_stage: 2\n  deepspeed_hostfile: /h\n"
    args, _ = launch(Path(), tmp_path, ds)
    assert args.deepspeed_multinode_launcher == "pdsh" and not getattr(args, "rdzv_endpoint", None)


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        text = fixture("ACC-PORT-IN-USE", "trigger", "default_config.yaml").read_text().replace("<PORT>", str(port))
        with pytest.warns(UserWarning, match=f"Port `{port}` is already in use"):
            args, _ = launch(Path(), tmp_path, text)
        assert args.standalone is True
        multi = yaml.safe_load(text) | {"num_machines": 2, "num_processes": 8, "main_process_ip": "127.0.0.1",
                                        "same_network": False}
        with pytest.raises(ConnectionError, match=f"port `{port}`"):
            launch(Path(), tmp_path, yaml.safe_dump(multi))
        from wizard.check.rules.accelerate_yaml import port_in_use
        assert port_in_use(port)
    assert not port_in_use(port)


def test_fsdp_wrong_wrap_class_raises_at_prepare(monkeypatch):
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(FIXTURES / "models" / "tiny-llama"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LLamaDecoderLayer"])
    with pytest.raises(Exception, match="Could not find the transformer layer class"):
        plugin.set_auto_wrap_policy(model)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    plugin.set_auto_wrap_policy(model)


def _fsdp2_plugin(tmp_path, **fsdp):
    """The FSDP plugin the script builds in launch's environment, from the FSDP2 fixture with `fsdp` keys set."""
    from accelerate.utils import FullyShardedDataParallelPlugin, patch_environment

    doc = load_yaml(fixture("ACC-FSDP2-RESHARD-NOT-BOOL", "clean", "default_config.yaml"))
    doc["fsdp_config"].update(fsdp)
    _, env = launch(Path(), tmp_path, yaml.safe_dump(doc))
    with patch_environment(**{k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}):
        return FullyShardedDataParallelPlugin()


def test_the_fsdp1_only_keys_are_accelerates_own_and_each_is_described():
    """ACC-FSDP1-KEY-UNDER-FSDP2 takes its keys from `accelerate to-fsdp2`: a key accelerate adds there without a
    description in the rule, or one it stops dropping, fails here."""
    from wizard.check.rules.accelerate_yaml import FSDP1_ONLY_FALLBACK, FSDP1_UNDER_FSDP2, fsdp1_only_keys

    assert fsdp1_only_keys() == FSDP1_ONLY_FALLBACK
    assert set(FSDP1_UNDER_FSDP2) == set(fsdp1_only_keys())


def test_what_accelerate_does_with_each_fsdp1_key_under_fsdp2(tmp_path, caplog):
    import logging

    from accelerate.utils import FullyShardedDataParallelPlugin

    base = _fsdp2_plugin(tmp_path)
    assert base.fsdp_version == 2 and base.reshard_after_forward is True
    # sharding_strategy: never read; FSDP2 still reshards (ZeRO-3-like) under SHARD_GRAD_OP
    p = _fsdp2_plugin(tmp_path, fsdp_sharding_strategy="SHARD_GRAD_OP")
    assert (p.sharding_strategy, p.reshard_after_forward) == (None, True)
    # backward_prefetch: read, then dropped with accelerate's warning
    with caplog.at_level(logging.WARNING, logger="accelerate.utils.dataclasses"):
        p = _fsdp2_plugin(tmp_path, fsdp_backward_prefetch="BACKWARD_PRE")
    assert p.backward_prefetch is None
    assert "backward_prefetch is not supported in FSDP2. Setting backward prefetch to None." in caplog.text
    # forward_prefetch: never read from the launch; only in code does it raise
    assert _fsdp2_plugin(tmp_path, fsdp_forward_prefetch=True).forward_prefetch is None
    with pytest.raises(ValueError, match="forward_prefetch is not yet implemented in FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=2, forward_prefetch=True)
    # use_orig_params, sync_module_states: never read
    assert _fsdp2_plugin(tmp_path, fsdp_use_orig_params=False).use_orig_params is None
    assert _fsdp2_plugin(tmp_path, fsdp_sync_module_states=True).sync_module_states is None
    # ... but launch still checks sync_module_states beside cpu_ram_efficient_loading, whatever the version
    with pytest.raises(ValueError, match="set `--fsdp_sync_module_states` to `True`"):
        _fsdp2_plugin(tmp_path, fsdp_sync_module_states=False)


def test_an_fsdp1_strategy_as_fsdp2_reshard_after_forward_raises_and_to_fsdp2_maps_it(tmp_path):
    from accelerate.commands.to_fsdp2 import ARGUMENT_VALUE_MAPPING

    with pytest.raises(ValueError, match="invalid truth value full_shard"):
        _fsdp2_plugin(tmp_path, fsdp_reshard_after_forward="FULL_SHARD")
    assert _fsdp2_plugin(tmp_path, fsdp_reshard_after_forward="false").reshard_after_forward is False
    assert ARGUMENT_VALUE_MAPPING["fsdp_sharding_strategy"]["FULL_SHARD"] is True
    assert ARGUMENT_VALUE_MAPPING["fsdp_sharding_strategy"]["SHARD_GRAD_OP"] is False


def test_local_state_dict_is_rejected_by_the_fsdp2_plugin(tmp_path):
    with pytest.raises(ValueError, match="FSDP2 does not support LOCAL_STATE_DICT"):
        _fsdp2_plugin(tmp_path, fsdp_state_dict_type="LOCAL_STATE_DICT")
    assert _fsdp2_plugin(tmp_path, fsdp_state_dict_type="SHARDED_STATE_DICT").fsdp_version == 2


def test_fsdp_and_deepspeed_in_one_yaml_launch_ignores_fsdp(tmp_path):
    env = _ds_env(fixture("INT-FSDP-AND-DEEPSPEED", "trigger", "default_config.yaml"), tmp_path)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert "ACCELERATE_USE_FSDP" not in env


def test_split_batches_rejects_an_indivisible_batch():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    ta = json.loads(fixture("TRN-SPLIT-BATCHES-INDIVISIBLE", "trigger", "training_args.json").read_text())
    sampler = BatchSampler(SequentialSampler(range(64)), ta["per_device_train_batch_size"], drop_last=False)
    with pytest.raises(ValueError, match="needs to be a round multiple of the number of processes"):
        BatchSamplerShard(sampler, num_processes=4, process_index=0, split_batches=True)
    ta = json.loads(fixture("TRN-SPLIT-BATCHES-INDIVISIBLE", "clean", "training_args.json").read_text())
    BatchSamplerShard(BatchSampler(SequentialSampler(range(64)), ta["per_device_train_batch_size"], False),
                      num_processes=4, process_index=0, split_batches=True)


# ----------------------------------------------------------------------------- DeepSpeed


def ds(rule: str, kind: str = "trigger") -> dict:
    return json.loads(fixture(rule, kind, "ds_config.json").read_text())


def test_deepspeed_rejects_duplicate_keys_json_keeps_the_last():
    from deepspeed.runtime.config import DeepSpeedConfig

    path = fixture("DS-DUPLICATE-KEY", "trigger", "ds_config.json")
    with pytest.raises(ValueError, match="Duplicate keys in DeepSpeed config"):
        DeepSpeedConfig(str(path))
    assert json.loads(path.read_text())["gradient_clipping"] == 1.0     # json.load: silently the last one


def test_plugin_requires_zero_optimization():
    from accelerate.utils import DeepSpeedPlugin

    with pytest.raises(ValueError, match="Please specify the ZeRO optimization config"):
        DeepSpeedPlugin(hf_ds_config=ds("DS-NO-ZERO-OPTIMIZATION"))
    DeepSpeedPlugin(hf_ds_config=ds("DS-NO-ZERO-OPTIMIZATION", "clean"))


def test_auto_stage_is_silently_zero_in_deepspeed_and_two_in_accelerate():
    from accelerate.utils import DeepSpeedPlugin
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero = ds("DS-AUTO-IN-SUBCONFIG")["zero_optimization"]
    assert zero["stage"] == "auto"
    assert DeepSpeedZeroConfig(**zero).stage == 0
    assert DeepSpeedPlugin(hf_ds_config=ds("DS-AUTO-IN-SUBCONFIG")).deepspeed_config["zero_optimization"]["stage"] == 2


def test_unfilled_auto_raises_at_prepare_fill():
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=ds("DS-AUTO-UNFILLED"))
    kwargs = {"gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 2, "train_batch_size": 8,
              "gradient_accumulation_steps": 4, "zero_optimization.reduce_bucket_size": 64,
              "zero_optimization.stage3_prefetch_bucket_size": 57, "zero_optimization.stage3_param_persistence_threshold": 640,
              "zero_optimization.stage3_gather_16bit_weights_on_model_save": False, "fp16.enabled": False,
              "bf16.enabled": True}
    with pytest.raises(ValueError, match="`zero_optimization.sub_group_size` not found in kwargs"):
        plugin.deepspeed_config_process(must_match=False, **kwargs)
    DeepSpeedPlugin(hf_ds_config=ds("DS-AUTO-UNFILLED", "clean")).deepspeed_config_process(must_match=False, **kwargs)


def test_fractional_bucket_and_nested_aio_rejected():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="int_from_float"):
        DeepSpeedZeroConfig(**ds("DS-FLOAT-BUCKET")["zero_optimization"])
    DeepSpeedZeroConfig(**ds("DS-FLOAT-BUCKET", "clean")["zero_optimization"])
    with pytest.raises(ValidationError, match="extra_forbidden"):
        DeepSpeedZeroConfig(**ds("DS-AIO-IN-ZERO")["zero_optimization"])
    DeepSpeedZeroConfig(**ds("DS-AIO-IN-ZERO", "clean")["zero_optimization"])


def test_full_config_validation_on_clean_and_trigger():
    """DeepSpeedConfig (all sub-models, batch assertion), once "auto" is filled, accepts the clean fixture
    and rejects the trigger for the very reason the rule names (a fractional bucket size)."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    from wizard.check.doctor import build_context
    from wizard.check.rules.deepspeed_json import fill_analysis

    def filled(which: str) -> dict:
        d = fixture("DS-FLOAT-BUCKET", which, "default_config.yaml").parent
        ctx = build_context(config_file=str(d / "default_config.yaml"), training_args=str(d / "training_args.json"),
                            versions={}, use_default_config=False)
        config = fill_analysis(ctx).filled
        config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
        return config

    DeepSpeedConfig(filled("clean"))
    with pytest.raises(ValidationError, match="int_from_float"):
        DeepSpeedConfig(filled("trigger"))


def test_offload_param_below_zero3_is_accepted_and_never_read():
    import inspect

    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    zero = DeepSpeedZeroConfig(**ds("DS-OFFLOAD-PARAM-BELOW-ZERO3")["zero_optimization"])
    assert zero.stage == 2 and zero.offload_param.device == "cpu"
    assert not any("param" in p and "offload" in p for p in inspect.signature(DeepSpeedZeroOptimizer).parameters)
    assert "offload_param_config" in inspect.signature(DeepSpeedZeroOptimizer_Stage3).parameters


def test_unknown_top_level_key_silently_ignored():
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = ds("DS-UNKNOWN-TOP-KEY")
    cfg.update({"train_batch_size": 8, "gradient_accumulation_steps": 1, "train_micro_batch_size_per_gpu": 8,
                "gradient_clipping": 1.0, "bf16": {"enabled": True}, "fp16": {"enabled": False}})
    zero = cfg["zero_optimization"]
    for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        zero[k] = 1000
    config = DeepSpeedConfig(cfg)
    assert cfg["train_micro_batch_size"] == 4 and config.train_micro_batch_size_per_gpu == 8


def test_known_top_level_keys_read_from_deepspeed_agree_with_the_fallback_list():
    """The fallback is DeepSpeed 0.19.8's keys: read from 0.19.8 they are exactly it (plus accelerate's own), an
    older DeepSpeed reads a subset of them (0.19.0 lacks e.g. log_level, expert_parallel), a newer one a superset."""
    from importlib.metadata import version

    from wizard.check.rules.deepspeed_json import (EXTRA_TOP_LEVEL, FALLBACK_DEEPSPEED, FALLBACK_TOP_LEVEL,
                                                   known_top_level_keys)

    keys = known_top_level_keys()
    assert {"zero_optimization", "optimizer", "scheduler", "aio", "bf16"} <= keys
    installed = tuple(int(part) for part in version("deepspeed").split("+")[0].split(".")[:3])
    if installed == FALLBACK_DEEPSPEED:
        assert keys == FALLBACK_TOP_LEVEL | EXTRA_TOP_LEVEL
    elif installed < FALLBACK_DEEPSPEED:
        assert keys - EXTRA_TOP_LEVEL < FALLBACK_TOP_LEVEL
    else:
        assert FALLBACK_TOP_LEVEL < keys


def test_aio_detection_is_deepspeeds_answer():
    from deepspeed.ops.op_builder import AsyncIOBuilder

    from wizard.check.rules.deepspeed_json import aio_available

    assert aio_available() == bool(AsyncIOBuilder().is_compatible(verbose=False))


def test_transformers_reports_every_mismatch_at_once():
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    from wizard.check.rules.common import CheckContext
    from wizard.check.rules.deepspeed_json import _training_namespace

    cfg = ds("DS-TRAINER-MISMATCH")
    cfg["train_micro_batch_size_per_gpu"] = 3
    ta = json.loads(fixture("DS-TRAINER-MISMATCH", "trigger", "training_args.json").read_text())
    ns = _training_namespace(CheckContext(ta=ta))
    assert isinstance(ns.get_warmup_steps(100), int) and TrainingArguments.get_warmup_steps
    hf = HfTrainerDeepSpeedConfig(cfg)
    try:
        hf.trainer_config_process(ns)
        with pytest.raises(ValueError) as err:
            hf.trainer_config_finalize(ns, type("M", (), {"config": type("C", (), {"hidden_size": 64})()})(), 100)
    finally:
        unset_hf_deepspeed_config()
    assert "gradient_clipping=0.5 vs hf max_grad_norm=1.0" in str(err.value)
    assert "train_micro_batch_size_per_gpu=3 vs hf per_device_train_batch_size=2" in str(err.value)
