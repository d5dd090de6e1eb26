"""accelerate's own vocabularies, in one place (accelerate.utils.constants and
commands/config/config_utils, 1.16). tests/functional/test_accelerate_differential.py compares each
with the installed accelerate, so a drift is caught without importing accelerate here (start-up).

The question table offers a subset where accelerate's menu lists what cannot run on NVIDIA GPUs;
the emitter accepts the whole vocabulary, as accelerate's loader does.
"""

from __future__ import annotations

DYNAMO_BACKENDS = ("EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI",
                   "FX2TRT", "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM")
# Left out of the menu: the nvFuser backends torch removed, OFI and FX2TRT (no longer in torch._dynamo's
# list), and the XLA-only ones (one of them misspelt in accelerate itself).
DYNAMO_BACKENDS_NOT_OFFERED = frozenset({"AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "OFI", "FX2TRT",
                                         "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE"})
DYNAMO_BACKENDS_OFFERED = tuple(b for b in DYNAMO_BACKENDS if b not in DYNAMO_BACKENDS_NOT_OFFERED)
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
DEEPSPEED_MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm")
FSDP_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
FSDP1_STATE_DICT_TYPES = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
FSDP2_STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")   # PrecisionType; the table offers fp8 only where it can run
# fp8's backends (accelerate 1.16: `accelerate launch --fp8_backend {ao,te}`, FP8BackendType AO/TE; MS-AMP, 1.15's
# third, is gone) as the question table spells them; the YAML's fp8_config.backend is the upper-case enum value.
FP8_BACKENDS = ("ao", "te")
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")              # TE's recipe formats (TERecipeKwargs.fp8_format)
FP8_AMAX_COMPUTE_ALGOS = ("max", "most_recent")       # TERecipeKwargs.amax_compute_algo
PARALLELISM_CP_COMM_STRATEGIES = ("allgather", "alltoall")   # TorchContextParallelConfig.cp_comm_strategy

# The YAML keys accelerate refuses beside `deepspeed_config_file`: DeepSpeedPlugin._deepspeed_config_checks
# raises when any of them is among the deepspeed_config block's keys (launch passes those keys on), and a
# top-level `mixed_precision` is passed on as one of them too. The emitter writes none; the check reports each.
REJECTED_BESIDE_DS_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                           "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                           "offload_optimizer_nvme_path", "zero3_save_16bit_model", "mixed_precision")
# Where the DeepSpeed config accelerate builds from an inline `deepspeed_config` block puts each of those keys
# (DeepSpeedPlugin.__post_init__; tests/unit/test_check_library_facts.py builds the plugin to hold it to that):
# the JSON key that says the same thing when a deepspeed_config_file is used instead.
DS_KEY_OF_YAML_KEY = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
