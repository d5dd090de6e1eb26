"""default_config.yaml == what accelerate's own `accelerate config` writes for the same answers.

accelerate's REAL questionnaire (`accelerate.commands.config.cluster.get_cluster_input`) is run
with only its terminal I/O replaced: `input()` (behind `_ask_field`) and the arrow-key
`BulletMenu` (behind `_ask_options`) are fed by a scripted user who reads the wizard's answers.
accelerate's own converters, defaults and branching build the ClusterConfig, and its real
`to_yaml_file` writes the YAML. The device probes it consults (MPS/NPU/MLU/XPU/HPU/...) are pinned
to "absent", so it behaves as on an NVIDIA GPU machine wherever the test runs.

The scripted user knows nothing of wizard.config.emit: each prompt is answered from the answers dict
(or from the plan's backend for "which machine"/"use DeepSpeed/FSDP"), and every prompt must be
recognised, so a question accelerate adds in a later release fails this test instead of being
silently defaulted.
"""

from __future__ import annotations

import builtins

import pytest
import yaml

from tests.launch_support import child_pythonpath
from tests.plans import make_plan
from wizard.config import emit, vocab
from wizard.planning.plan import Plan

pytestmark = pytest.mark.timeout(120)

DS_PATH = "/abs/out/ds_config.json"


class ScriptedUser:
    """Answers accelerate's prompts the way a user holding the wizard's answers would."""

    def __init__(self, answers: dict, plan: Plan, ds_path: str | None):
        self.a = answers
        self.backend = plan.choice.backend
        self.ds_path = ds_path
        self.log: list[tuple[str, object]] = []

    def need(self, key: str):
        if key not in self.a:
            raise AssertionError(f"accelerate asked for {key!r}, which the answers do not contain")
        return self.a[key]

    @staticmethod
    def yes_no(value) -> str:
        return "yes" if value else "no"

    # ---- free-text fields (_ask_field -> input) -------------------------------------------
    def field(self, prompt: str) -> str:
        a, p = self.a, prompt
        table = [
            ("How many different machines", lambda: str(self.need("num_machines"))),
            ("What is the IP address", lambda: str(self.need("main_process_ip"))),
            ("What is the port you will use", lambda: str(self.need("main_process_port"))),
            ("Are all the machines on the same local network", lambda: self.yes_no(self.need("same_network"))),
            ("What rendezvous backend", lambda: str(self.need("rdzv_backend"))),
            ("Should distributed operations be checked", lambda: self.yes_no(self.need("debug"))),
            ("run your training on CPU only", lambda: self.yes_no(self.need("use_cpu"))),
            ("launch mpirun", lambda: "no"),
            ("optimize your script with torch dynamo", lambda: self.yes_no(a.get("use_dynamo"))),
            ("customize the defaults sent to torch.compile",
             lambda: self.yes_no(a.get("dynamo_mode") is not None)),
            ("fullgraph mode", lambda: self.yes_no(self.need("dynamo_use_fullgraph"))),
            ("dynamic shape tracing", lambda: self.yes_no(self.need("dynamo_use_dynamic"))),
            ("regional compilation", lambda: self.yes_no(self.need("dynamo_use_regional_compilation"))),
            ("Do you want to use DeepSpeed?", lambda: self.yes_no(self.backend == "deepspeed")),
            ("specify a json file to a DeepSpeed config", lambda: "yes"),
            ("path to the json DeepSpeed config file", lambda: self.ds_path),
            ("deepspeed.zero.Init", lambda: self.yes_no(self.need("zero3_init_flag"))),
            ("Mixture-of-Experts", lambda: self.yes_no(a.get("deepspeed_moe_layer_cls_names"))),
            ("MoE layer class names", lambda: str(a["deepspeed_moe_layer_cls_names"])),
            ("configures multi-node compute resources with hostfile",
             lambda: str(self.need("deepspeed_hostfile"))),
            ("exclusion filter string?", lambda: self.yes_no(a.get("deepspeed_exclusion_filter"))),
            ("DeepSpeed exclusion filter string", lambda: str(a["deepspeed_exclusion_filter"])),
            ("inclusion filter string?", lambda: self.yes_no(a.get("deepspeed_inclusion_filter"))),
            ("DeepSpeed inclusion filter string", lambda: str(a["deepspeed_inclusion_filter"])),
            ("Do you want to use FullyShardedDataParallel", lambda: self.yes_no(self.backend == "fsdp")),
            ("resharding after forward", lambda: self.yes_no(self.need("fsdp_reshard_after_forward"))),
            ("offload parameters and gradients to CPU", lambda: self.yes_no(self.need("fsdp_offload_params"))),
            ("_no_split_modules", lambda: self.yes_no(not a.get("fsdp_transformer_layer_cls_to_wrap"))),
            ("transformer layer class names", lambda: str(a["fsdp_transformer_layer_cls_to_wrap"])),
            ("minimum number of parameters", lambda: str(self.need("fsdp_min_num_params"))),
            ("forward prefetch policy", lambda: self.yes_no(self.need("fsdp_forward_prefetch"))),
            ("use_orig_params", lambda: self.yes_no(self.need("fsdp_use_orig_params"))),
            ("CPU RAM efficient model loading", lambda: self.yes_no(self.need("fsdp_cpu_ram_efficient_loading"))),
            ("broadcast module parameters from rank 0", lambda: self.yes_no(self.need("fsdp_sync_module_states"))),
            ("FSDP activation checkpointing", lambda: self.yes_no(self.need("fsdp_activation_checkpointing"))),
            ("Do you want to use the parallelism config", lambda: self.yes_no(a.get("use_parallelism_config"))),
            ("data parallelism replicate size", lambda: str(self.need("parallelism_config_dp_replicate_size"))),
            ("What is the FSDP shard size", lambda: str(self.need("parallelism_config_dp_shard_size"))),
            ("tensor parallelism size", lambda: str(self.need("parallelism_config_tp_size"))),
            ("context parallelism size", lambda: str(self.need("parallelism_config_cp_size"))),
            ("FP8 autocast during eval", lambda: self.yes_no(self.need("fp8_use_autocast_during_eval"))),
            ("margin should be used", lambda: str(self.need("fp8_margin"))),
            ("interval should be used", lambda: str(self.need("fp8_interval"))),
            ("length of history", lambda: str(self.need("fp8_amax_history_len"))),
            ("GEMMS in higher precision", lambda: self.yes_no(self.need("fp8_override_linear_precision"))),
            ("Should `fprop`", lambda: self.yes_no(self.need("fp8_override_fprop"))),
            ("Should `dgrad`", lambda: self.yes_no(self.need("fp8_override_dgrad"))),
            ("Should `wgrad`", lambda: self.yes_no(self.need("fp8_override_wgrad"))),
            ("FSDP2 float8 all gather", lambda: self.yes_no(self.need("fp8_enable_fsdp_float8_all_gather"))),
            ("pad the inner dimension", lambda: self.yes_no(self.need("fp8_pad_inner_dim"))),
            ("Megatron-LM", lambda: "no"),
            ("should be used for distributed training", lambda: str(self.need("num_processes"))),
            ("(by id) should be used for training", lambda: str(self.need("gpu_ids"))),
            ("numa efficiency", lambda: self.yes_no(self.need("enable_cpu_affinity"))),
        ]
        for needle, answer in table:
            if needle in p:
                value = answer()
                self.log.append((p, value))
                return value
        raise AssertionError(f"unrecognised accelerate prompt: {p!r}")

    # ---- menus (_ask_options -> BulletMenu.run, which returns an index) --------------------
    def option(self, prompt: str, choices: list) -> int:
        a, p = self.a, prompt
        names = [str(c) for c in choices]

        def index_of(value) -> int:
            return names.index(str(value))

        if "Which type of machine" in p:
            if self.backend == "single":
                value = 0                                  # No distributed training
            elif self.backend == "ddp" and a.get("use_cpu"):
                value = 1                                  # multi-CPU
            else:
                value = 4                                  # multi-GPU (DeepSpeed/FSDP are asked on top)
        elif "rank of this machine" in p:
            value = index_of(self.need("machine_rank"))
        elif "Which dynamo backend" in p:
            value = index_of(str(self.need("dynamo_backend")).lower())
        elif "Which mode do you want to use" in p:
            value = index_of(self.need("dynamo_mode"))
        elif "Type of launcher" in p:
            value = index_of(self.need("deepspeed_multinode_launcher"))
        elif "FSDP version" in p:
            value = index_of(self.need("fsdp_version"))
        elif "sharding strategy" in p:
            value = index_of(self.need("fsdp_reshard_after_forward"))
        elif "auto wrap policy" in p:
            value = index_of(self.need("fsdp_auto_wrap_policy"))
        elif "backward prefetch policy" in p:
            value = index_of(self.need("fsdp_backward_prefetch"))
        elif "state dict type" in p:
            value = index_of(self.need("fsdp_state_dict_type"))
        elif "mixed precision" in p:
            value = index_of(self.need("mixed_precision"))
        elif "parallelism communication strategy" in p:
            value = index_of(self.need("parallelism_config_cp_comm_strategy"))
        elif "Which FP8 backend" in p:
            value = index_of(self.need("fp8_backend"))
        elif "Which weight format" in p:
            value = index_of(self.need("fp8_format"))
        elif "algorithm should be used for the amax" in p:
            value = index_of(self.need("fp8_amax_compute_algo"))
        else:
            raise AssertionError(f"unrecognised accelerate menu: {p!r} {names}")
        self.log.append((p, names[value]))
        return value


def run_accelerate_questionnaire(monkeypatch, tmp_path, answers: dict, plan: Plan, ds_path: str | None) -> str:
    """accelerate's real get_cluster_input + ClusterConfig.to_yaml_file; returns the YAML text."""
    from accelerate.commands.config import cluster, config_utils

    user = ScriptedUser(answers, plan, ds_path)

    class ScriptedMenu:
        def __init__(self, prompt, choices=()):
            self.prompt, self.choices = prompt, list(choices)

        def run(self, default_choice=0):
            return user.option(self.prompt, self.choices)

    monkeypatch.setattr(config_utils, "BulletMenu", ScriptedMenu)
    monkeypatch.setattr(builtins, "input", lambda prompt="": user.field(prompt))
    # The device probes the questionnaire consults: an NVIDIA machine has none of these. Which names it asks
    # depends on the version (1.16 asks get_torch_accelerator_backend where 1.15 asked each is_*_available).
    probes = [p for p in ("is_mps_available", "is_npu_available", "is_mlu_available", "is_sdaa_available",
                          "is_musa_available", "is_xpu_available", "is_hpu_available", "is_neuron_available")
              if hasattr(cluster, p)]
    for probe in probes:
        monkeypatch.setattr(cluster, probe, lambda *a, **k: False)
    if hasattr(cluster, "get_torch_accelerator_backend"):
        import torch
        monkeypatch.setattr(cluster, "get_torch_accelerator_backend", lambda *a, **k: ("cuda", torch.cuda))
    assert "is_mps_available" in probes, "accelerate's questionnaire no longer asks is_mps_available: update the probes"
    monkeypatch.setattr(cluster, "is_deepspeed_available", lambda: True)
    for name in ("is_fp8_available", "is_torchao_available", "is_transformer_engine_available"):
        monkeypatch.setattr(cluster, name, lambda: True)     # accelerate config refuses fp8 without a backend
    monkeypatch.setattr(cluster, "is_transformers_available", lambda: True)

    config = cluster.get_cluster_input()
    path = tmp_path / "accelerate_written.yaml"
    config.to_yaml_file(str(path))
    return path.read_text()


GPU_COMMON = {"debug": False, "use_cpu": False, "use_dynamo": False, "enable_cpu_affinity": False}
CP_COMM = "parallelism_config_cp_comm_strategy"


def PARALLELISM(replicate: int, shard: int, tp: int, cp: int) -> dict:
    return {"use_parallelism_config": True, "parallelism_config_dp_replicate_size": replicate,
            "parallelism_config_dp_shard_size": shard, "parallelism_config_tp_size": tp,
            "parallelism_config_cp_size": cp}


TE_ANSWERS = {"fp8_backend": "te", "fp8_use_autocast_during_eval": False, "fp8_margin": 0, "fp8_interval": 1,
              "fp8_format": "HYBRID", "fp8_amax_history_len": 16, "fp8_amax_compute_algo": "max",
              "fp8_override_linear_precision": False}
FSDP2_ANSWERS = {"fsdp_version": 2, "fsdp_reshard_after_forward": True, "fsdp_offload_params": False,
                 "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                 "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                 "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
                 "fsdp_activation_checkpointing": False}

CASES = {
    "1gpu": (make_plan("single", world=1),
             {**GPU_COMMON, "num_machines": 1, "num_processes": 1, "gpu_ids": "all", "mixed_precision": "bf16"}),
    "1gpu-id1-affinity": (make_plan("single", world=1, precision="fp16"),
                          {**GPU_COMMON, "num_processes": 1, "gpu_ids": "1", "enable_cpu_affinity": True,
                           "mixed_precision": "fp16"}),
    "4gpu-ddp": (make_plan("ddp", world=4),
                 {**GPU_COMMON, "num_machines": 1, "num_processes": 4, "gpu_ids": "all", "mixed_precision": "bf16"}),
    "4gpu-ddp-ids-debug": (make_plan("ddp", world=3),
                           {**GPU_COMMON, "num_machines": 1, "num_processes": 3, "gpu_ids": "0,1,3", "debug": True,
                            "mixed_precision": "no"}),
    "zero2-json": (make_plan("deepspeed", world=4, stage=2),
                   {**GPU_COMMON, "num_machines": 1, "num_processes": 4, "zero3_init_flag": False}),
    # Answers accelerate does not ask on this branch (GPU ids, NUMA, mixed precision) must not leak in.
    "zero2-json-unasked-answers": (make_plan("deepspeed", world=4, stage=2),
                                   {**GPU_COMMON, "num_machines": 1, "num_processes": 4, "zero3_init_flag": False,
                                    "gpu_ids": "0,1,2,3", "enable_cpu_affinity": True, "mixed_precision": "bf16"}),
    "fsdp2-unasked-answers": (make_plan("fsdp", world=4, reshard=True),
                              {**GPU_COMMON, "num_machines": 1, "num_processes": 4, **FSDP2_ANSWERS,
                               "gpu_ids": "0,1,2,3", "enable_cpu_affinity": True, "mixed_precision": "bf16",
                               "zero3_init_flag": True, "fsdp_backward_prefetch": "BACKWARD_POST"}),
    "zero3-offload-json": (make_plan("deepspeed", world=8, stage=3, oo="cpu", op="cpu"),
                           {**GPU_COMMON, "num_machines": 1, "num_processes": 8, "zero3_init_flag": True,
                            "zero3_save_16bit_model": True}),
    "zero3-moe-1gpu": (make_plan("deepspeed", world=1, stage=3, oo="cpu", op="cpu"),
                       {**GPU_COMMON, "num_machines": 1, "num_processes": 1, "zero3_init_flag": True,
                        "deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock"}),
    "fsdp2": (make_plan("fsdp", world=4, reshard=True),
              {**GPU_COMMON, "num_machines": 1, "num_processes": 4, **FSDP2_ANSWERS, "mixed_precision": "bf16"}),
    "fsdp2-size-wrap-offload": (make_plan("fsdp", world=8, reshard=False),
                                {**GPU_COMMON, "num_machines": 1, "num_processes": 8, **FSDP2_ANSWERS,
                                 "fsdp_reshard_after_forward": False, "fsdp_offload_params": True,
                                 "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 50_000_000,
                                 "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": False,
                                 "fsdp_activation_checkpointing": True, "mixed_precision": "fp16"}),
    "fsdp2-no-split-modules": (make_plan("fsdp", world=2),
                               {**GPU_COMMON, "num_machines": 1, "num_processes": 2, **FSDP2_ANSWERS,
                                "fsdp_transformer_layer_cls_to_wrap": None, "mixed_precision": "bf16"}),
    "fsdp1": (make_plan("fsdp", world=4),
              {**GPU_COMMON, "num_machines": 1, "num_processes": 4, **FSDP2_ANSWERS, "fsdp_version": 1,
               "fsdp_reshard_after_forward": "FULL_SHARD", "fsdp_backward_prefetch": "BACKWARD_PRE",
               "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_forward_prefetch": False,
               "fsdp_use_orig_params": True, "mixed_precision": "bf16"}),
    "fsdp1-no-efficient-loading": (make_plan("fsdp", world=4),
                                   {**GPU_COMMON, "num_machines": 1, "num_processes": 4, **FSDP2_ANSWERS,
                                    "fsdp_version": 1, "fsdp_reshard_after_forward": "SHARD_GRAD_OP",
                                    "fsdp_backward_prefetch": "NO_PREFETCH",
                                    "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_forward_prefetch": True,
                                    "fsdp_use_orig_params": False, "fsdp_cpu_ram_efficient_loading": False,
                                    "fsdp_sync_module_states": False, "mixed_precision": "bf16"}),
    "2node-ddp": (make_plan("ddp", world=16, machines=2),
                  {**GPU_COMMON, "num_machines": 2, "machine_rank": 0, "main_process_ip": "10.0.0.1",
                   "main_process_port": 29500, "same_network": True, "num_processes": 16, "gpu_ids": "all",
                   "mixed_precision": "bf16"}),
    "2node-ddp-rank1-c10d": (make_plan("ddp", world=16, machines=2),
                             {**GPU_COMMON, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1",
                              "main_process_port": 29501, "same_network": False, "rdzv_backend": "c10d",
                              "num_processes": 16, "gpu_ids": "all", "mixed_precision": "bf16"}),
    "2node-zero3-pdsh": (make_plan("deepspeed", world=16, machines=2, stage=3),
                         {**GPU_COMMON, "num_machines": 2, "machine_rank": 0, "main_process_ip": "10.0.0.1",
                          "main_process_port": 29500, "same_network": True, "num_processes": 16,
                          "zero3_init_flag": True, "deepspeed_multinode_launcher": "pdsh",
                          "deepspeed_hostfile": "/job/hostfile"}),
    "2node-zero2-standard": (make_plan("deepspeed", world=16, machines=2, stage=2),
                             {**GPU_COMMON, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1",
                              "main_process_port": 29500, "same_network": True, "num_processes": 16,
                              "zero3_init_flag": False, "deepspeed_multinode_launcher": "standard"}),
    "dynamo-custom": (make_plan("ddp", world=2),
                      {**GPU_COMMON, "num_machines": 1, "num_processes": 2, "gpu_ids": "all", "use_dynamo": True,
                       "dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune", "dynamo_use_fullgraph": True,
                       "dynamo_use_dynamic": False, "dynamo_use_regional_compilation": True,
                       "mixed_precision": "bf16"}),
    "dynamo-backend-only": (make_plan("single", world=1),
                            {**GPU_COMMON, "num_processes": 1, "gpu_ids": "all", "use_dynamo": True,
                             "dynamo_backend": "aot_eager", "mixed_precision": "bf16"}),
    "cpu-single": (make_plan("single", world=1, cpu=True, precision="fp32"),
                   {**GPU_COMMON, "use_cpu": True, "num_processes": 1, "mixed_precision": "no"}),
    "cpu-multi": (make_plan("ddp", world=2, cpu=True, precision="fp32"),
                  {**GPU_COMMON, "use_cpu": True, "num_machines": 1, "num_processes": 2, "mixed_precision": "no"}),
    # FSDP2's parallelism config, and fp8 (accelerate 1.16)
    "fsdp2-parallelism-cp": (make_plan("fsdp", world=8, reshard=True),
                             {**GPU_COMMON, "num_machines": 1, "num_processes": 8, **FSDP2_ANSWERS,
                              "mixed_precision": "bf16", **PARALLELISM(1, 4, 1, 2), CP_COMM: "alltoall"}),
    "fsdp2-parallelism-hsdp-tp": (make_plan("fsdp", world=16, machines=2, reshard=True),
                                  {**GPU_COMMON, "num_machines": 2, "machine_rank": 0, "main_process_ip": "10.0.0.1",
                                   "main_process_port": 29500, "same_network": True, "num_processes": 16,
                                   **FSDP2_ANSWERS, "mixed_precision": "bf16", **PARALLELISM(2, 4, 2, 1)}),
    "fsdp2-parallelism-asked-off": (make_plan("fsdp", world=4, reshard=True),
                                    {**GPU_COMMON, "num_machines": 1, "num_processes": 4, **FSDP2_ANSWERS,
                                     "mixed_precision": "bf16", "use_parallelism_config": False}),
    "fp8-ao-fsdp2": (make_plan("fsdp", world=8, reshard=True),
                     {**GPU_COMMON, "num_machines": 1, "num_processes": 8, **FSDP2_ANSWERS,
                      "fsdp_cpu_ram_efficient_loading": False, "mixed_precision": "fp8", "fp8_backend": "ao",
                      "fp8_enable_fsdp_float8_all_gather": True, "fp8_pad_inner_dim": False}),
    "fp8-te-ddp": (make_plan("ddp", world=8),
                   {**GPU_COMMON, "num_machines": 1, "num_processes": 8, "gpu_ids": "all", "mixed_precision": "fp8",
                    **TE_ANSWERS}),
    "fp8-te-single-override": (make_plan("single", world=1),
                               {**GPU_COMMON, "num_processes": 1, "gpu_ids": "all", "mixed_precision": "fp8",
                                **TE_ANSWERS, "fp8_use_autocast_during_eval": True, "fp8_margin": 1,
                                "fp8_interval": 2, "fp8_format": "E4M3", "fp8_override_linear_precision": True,
                                "fp8_override_fprop": False, "fp8_override_dgrad": True, "fp8_override_wgrad": True}),
}
# accelerate config writes TE's history length and amax algorithm as amax_history_length / amax_compute_algorithm,
# which `accelerate launch` never reads (it reads fp8_amax_history_len / fp8_amax_compute_algo); the wizard writes
# the names launch reads. That rename is the only difference the comparison allows.
ACCELERATE_CONFIG_UNREAD_FP8_KEYS = {"amax_history_length": "amax_history_len",
                                     "amax_compute_algorithm": "amax_compute_algo"}


def with_launch_fp8_names(text: str) -> str:
    for theirs, read in ACCELERATE_CONFIG_UNREAD_FP8_KEYS.items():
        text = text.replace(f"  {theirs}: ", f"  {read}: ")
    return yaml.safe_dump(yaml.safe_load(text))


@pytest.mark.parametrize("case", sorted(CASES))
def test_yaml_equals_accelerate_questionnaire(case, monkeypatch, tmp_path):
    plan, answers = CASES[case]
    ds_path = DS_PATH if plan.choice.backend == "deepspeed" else None
    theirs_text = with_launch_fp8_names(run_accelerate_questionnaire(monkeypatch, tmp_path, answers, plan, ds_path))
    ours_doc = emit.accelerate_config(answers, plan, ds_path)
    ours_text = emit.render_yaml(ours_doc)
    assert yaml.safe_load(ours_text) == yaml.safe_load(theirs_text)
    assert ours_text == theirs_text


def test_deepspeed_yaml_has_no_rejected_keys_in_accelerate_output_either(monkeypatch, tmp_path):
    # The json-file branch of accelerate writes no mixed_precision and none of the rejected keys:
    # our document matching it (above) is what makes the file launchable.
    plan, answers = CASES["zero3-offload-json"]
    theirs = yaml.safe_load(run_accelerate_questionnaire(monkeypatch, tmp_path, answers, plan, DS_PATH))
    assert "mixed_precision" not in theirs
    assert set(theirs["deepspeed_config"]) == {"deepspeed_config_file", "zero3_init_flag"}
    assert theirs["deepspeed_config"]["deepspeed_config_file"] == DS_PATH


def test_scripted_user_rejects_unknown_prompts():
    # The differential test is only as strict as its user: an unknown question must fail it.
    user = ScriptedUser({}, make_plan("single", world=1), None)
    with pytest.raises(AssertionError):
        user.field("Do you want to enable quantum sharding? [yes/NO]: ")
    with pytest.raises(AssertionError):
        user.option("Which quantum backend?", ["a", "b"])


def test_accelerate_vocabularies_match_the_installed_accelerate():
    from accelerate.commands.config.config_utils import DYNAMO_BACKENDS
    from accelerate.utils import PrecisionType, constants

    assert tuple(DYNAMO_BACKENDS) == vocab.DYNAMO_BACKENDS
    assert tuple(constants.TORCH_DYNAMO_MODES) == vocab.DYNAMO_MODES
    assert tuple(constants.DEEPSPEED_MULTINODE_LAUNCHERS) == vocab.DEEPSPEED_MULTINODE_LAUNCHERS
    assert tuple(constants.FSDP_SHARDING_STRATEGY) == vocab.FSDP_SHARDING_STRATEGIES
    assert tuple(constants.FSDP_AUTO_WRAP_POLICY) == vocab.FSDP_AUTO_WRAP_POLICIES
    assert tuple(constants.FSDP_BACKWARD_PREFETCH) == vocab.FSDP_BACKWARD_PREFETCH
    assert tuple(constants.FSDP_STATE_DICT_TYPE) == vocab.FSDP1_STATE_DICT_TYPES
    assert tuple(constants.FSDP2_STATE_DICT_TYPE) == vocab.FSDP2_STATE_DICT_TYPES
    assert set(vocab.MIXED_PRECISIONS) == {p.value for p in PrecisionType}
    from accelerate.utils.dataclasses import FP8BackendType, TorchContextParallelConfig

    # MS-AMP is the one backend accelerate has that the wizard does not offer: deprecated, and removed in 1.16,
    # whose FP8BackendType and launch choices are exactly the wizard's; 1.13 (the oldest supported) still has it.
    removed_in_1_16 = {"MSAMP"} if "MSAMP" in FP8BackendType.__members__ else set()
    assert {b.upper() for b in vocab.FP8_BACKENDS} == {b.value for b in FP8BackendType} - {"NO"} - removed_in_1_16
    groups = {g.title: {a.dest: a for a in g._group_actions} for g in launch_parser()._action_groups}
    fp8_args = groups["FP8 Arguments"]
    assert tuple(c for c in fp8_args["fp8_backend"].choices
                 if c.upper() not in removed_in_1_16) == vocab.FP8_BACKENDS
    assert len(fp8_args["fp8_backend"].choices) == len(vocab.FP8_BACKENDS) + len(removed_in_1_16)
    assert tuple(fp8_args["fp8_format"].choices) == vocab.FP8_FORMATS
    assert tuple(fp8_args["fp8_amax_compute_algo"].choices) == vocab.FP8_AMAX_COMPUTE_ALGOS
    for strategy in vocab.PARALLELISM_CP_COMM_STRATEGIES:
        TorchContextParallelConfig(cp_comm_strategy=strategy)
    with pytest.raises(ValueError):
        TorchContextParallelConfig(cp_comm_strategy="ring")


def launch_parser():
    from accelerate.commands.launch import launch_command_parser
    return launch_command_parser()


def test_every_fp8_and_parallelism_key_the_wizard_writes_is_a_launch_option():
    """launch copies fp8_config.<key> onto args.fp8_<key> and parallelism_config.<key> onto args.<key>: each key the
    wizard writes must name an option of the real parser (else it is silently unread, as accelerate config's own
    amax_history_length is)."""
    groups = {g.title: {a.dest for a in g._group_actions} for g in launch_parser()._action_groups}
    for case in ("fp8-te-single-override", "fp8-ao-fsdp2", "fsdp2-parallelism-cp"):
        plan, answers = CASES[case]
        doc = emit.accelerate_config(answers, plan, None)
        for key in doc.get("fp8_config", {}):
            assert (key if key.startswith("fp8") else "fp8_" + key) in groups["FP8 Arguments"], key
        for key in doc.get("parallelism_config", {}):
            assert key in groups["ParallelismConfig Arguments"], key
    assert "fp8_amax_history_length" not in groups["FP8 Arguments"]
    assert "fp8_amax_compute_algorithm" not in groups["FP8 Arguments"]


def test_the_question_table_offers_accelerates_words_and_no_others():
    """Every choice a question offers for an accelerate key is a word of accelerate's vocabulary; the dynamo
    menu leaves out only backends the installed torch does not register (ONNXRT and TENSORRT stay: torch
    registers them once onnxruntime / torch_tensorrt are installed)."""
    import torch._dynamo
    from accelerate.commands.config.config_utils import DYNAMO_BACKENDS

    from wizard.config.questions import QUESTIONS

    by_id = {q.id: q for q in QUESTIONS}
    offered = by_id["dynamo_backend"].choices
    assert set(offered) == set(DYNAMO_BACKENDS) - vocab.DYNAMO_BACKENDS_NOT_OFFERED
    torch_backends = {b.upper() for b in torch._dynamo.list_backends(exclude_tags=())}
    assert not vocab.DYNAMO_BACKENDS_NOT_OFFERED & torch_backends
    assert set(offered) - torch_backends == {"ONNXRT", "TENSORRT"}
    for qid, words in (("dynamo_mode", vocab.DYNAMO_MODES), ("fsdp_sharding_strategy", vocab.FSDP_SHARDING_STRATEGIES),
                       ("fsdp_auto_wrap_policy", vocab.FSDP_AUTO_WRAP_POLICIES),
                       ("fsdp_backward_prefetch", vocab.FSDP_BACKWARD_PREFETCH),
                       ("deepspeed_multinode_launcher", vocab.DEEPSPEED_MULTINODE_LAUNCHERS),
                       ("mixed_precision", vocab.MIXED_PRECISIONS), ("fp8_backend", vocab.FP8_BACKENDS),
                       ("fp8_format", vocab.FP8_FORMATS), ("fp8_amax_compute_algo", vocab.FP8_AMAX_COMPUTE_ALGOS),
                       ("parallelism_config_cp_comm_strategy", vocab.PARALLELISM_CP_COMM_STRATEGIES)):
        assert set(by_id[qid].choices) <= set(words), qid



@pytest.mark.slow
@pytest.mark.timeout(900)
def test_emitted_cpu_zero3_offload_config_trains_under_accelerate_launch(tmp_path):
    """The emitted pair, unchanged, runs a real 2-rank ZeRO-3 + CPU offload job through
    `accelerate launch` on this CPU box (DeepSpeed's CPU accelerator over gloo, fp32)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from wizard.sizing.model import ModelShape

    repo = Path(__file__).resolve().parents[2]
    model = ModelShape(params=41_000, largest_layer_params=8192, hidden_size=64, layers=2, heads=4, kv_heads=4,
                       vocab_size=128, intermediate_size=128, layer_class="LlamaDecoderLayer")
    plan = make_plan("deepspeed", world=2, stage=3, oo="cpu", op="cpu", cpu=True, precision="fp32")
    answers = {"use_cpu": True, "num_processes": 2, "micro_batch": 4, "zero3_init_flag": True}
    yaml_path, ds_path = emit.output_paths(str(tmp_path))
    ds = emit.deepspeed_config(answers, plan, model)
    emit.write_files(emit.render_yaml(emit.accelerate_config(answers, plan, ds_path)), emit.render_json(ds),
                     str(tmp_path))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": child_pythonpath()}
    env.pop("DS_ACCELERATOR", None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", yaml_path,
           str(repo / "examples" / "train.py"), "--steps", "2", "--output-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("accelerate launch timed out:\n" + out[-4000:])
    assert proc.returncode == 0, out[-4000:]
    engines = [line for line in out.splitlines() if "engine=deepspeed zero_stage=3 partitioned=True" in line]
    assert len(engines) == 2, out[-4000:]
    assert all("world_size=2" in line for line in engines)
