"""The files the wizard writes: accelerate's `default_config.yaml` and DeepSpeed's `ds_config.json`.

`accelerate_config` returns exactly the document accelerate's own `accelerate config` writes for
the same answers (tests/functional/test_accelerate_differential.py drives accelerate's real
questionnaire to prove it). `deepspeed_config` returns the DeepSpeed JSON for the plan's rung, with
`"auto"` exactly where the chosen trainer fills it in (shared/reference/deepspeed.md §3.4).

Pure: no torch/accelerate/deepspeed imports (the validation in validate.py loads these documents
with the real libraries). Answers are the normalised dict of questions.py, keyed by question id.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from wizard.config.vocab import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    FSDP1_STATE_DICT_TYPES,
    FSDP2_STATE_DICT_TYPES,
    FSDP_AUTO_WRAP_POLICIES,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGIES,
    FP8_AMAX_COMPUTE_ALGOS,
    FP8_BACKENDS,
    FP8_FORMATS,
    MIXED_PRECISIONS,
)
from wizard.errors import InputError
from wizard.sizing.memory import OPTIMIZER_STATE_BYTES, optimizer_for_rung

YAML_NAME = "default_config.yaml"
DS_NAME = "ds_config.json"


# DeepSpeed knobs, in elements. Integers always: pydantic rejects a float with a fraction
# (DeepSpeed #6525) and the ZeRO-1/2 runtime asserts an even allgather bucket.
ALLGATHER_BUCKET_SIZE = 200_000_000        # HF's ZeRO-2 example (2e8); DeepSpeed's default is 5e8
REDUCE_BUCKET_SIZE_NO_MODEL = 200_000_000  # only when no hidden size is known (accelerate loop)
SUB_GROUP_SIZE = 1_000_000_000             # DeepSpeed default
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
OFFLOAD_PARAM_BUFFER_SIZE = 100_000_000    # DeepSpeed default for NVMe parameter swap buffers
AIO = {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False, "overlap_events": True}

AUTO = "auto"


def distributed_type(plan, use_cpu: bool) -> str:
    """accelerate's distributed_type for the plan's chosen rung (the rung table's emit part)."""
    from wizard.planning.rungs import distributed_type as of_backend

    return of_backend(_choice(plan).backend, use_cpu)


def _choice(plan):
    if plan is None or plan.choice is None:
        raise ValueError("no rung was chosen: nothing to emit")
    return plan.choice


def _use_cpu(answers: dict, plan) -> bool:
    value = answers.get("use_cpu")
    return bool(plan.topology.cpu if value is None else value)


def _get(answers: dict, key: str, default: Any) -> Any:
    value = answers.get(key)
    return default if value is None else value


def _one_of(field: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise InputError(field, f"{value!r} is not allowed", ", ".join(str(a) for a in allowed))
    return value


def _mixed_precision(answers: dict, plan, use_cpu: bool) -> str:
    value = answers.get("mixed_precision")
    if value is None:
        value = "no" if use_cpu else {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no")
    return _one_of("mixed_precision", str(value).lower(), MIXED_PRECISIONS)


def _ds_precision(answers: dict, plan, use_cpu: bool) -> str:
    """bf16 | fp16 | fp32 for the DeepSpeed JSON (its mixed precision lives there, not in the YAML)."""
    if use_cpu:
        return "fp32"
    mp = answers.get("mixed_precision")
    if mp is not None:
        deepspeed_precisions = ("no", "fp16", "bf16")     # fp8 would need TE's recipe beside DeepSpeed: not written
        return {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}[_one_of("mixed_precision", str(mp).lower(),
                                                                       deepspeed_precisions)]
    return plan.precision if plan.precision in ("bf16", "fp16") else "fp32"


# --------------------------------------------------------------------------------------------
# default_config.yaml
# --------------------------------------------------------------------------------------------

def accelerate_config(answers: dict, plan, ds_config_path: str | None, model=None) -> dict:
    """The document `accelerate config` writes for these answers (None values and empty dicts dropped).

    It follows accelerate's questionnaire (accelerate/commands/config/cluster.py) branch by
    branch: which keys exist depends on what accelerate would have asked. DeepSpeed always goes
    through `deepspeed_config_file` (absolute path), so none of REJECTED_BESIDE_DS_FILE appear.
    """
    use_cpu = _use_cpu(answers, plan)
    dtype = distributed_type(plan, use_cpu)
    multi = dtype != "NO"   # DEEPSPEED/FSDP are reached through accelerate's multi-GPU branch

    num_machines = int(_get(answers, "num_machines", plan.topology.num_machines)) if multi else 1
    machine_rank, main_ip, main_port = 0, None, None
    rdzv_backend, same_network = "static", True
    if num_machines > 1:
        machine_rank = int(_get(answers, "machine_rank", 0))
        main_ip = answers.get("main_process_ip")
        main_port = answers.get("main_process_port")
        if main_ip is None or main_port is None:
            missing = "main_process_ip" if main_ip is None else "main_process_port"
            raise InputError(missing, "required with more than one machine", "an IP address / a port number")
        main_port = int(main_port)
        same_network = bool(_get(answers, "same_network", True))
        if not same_network:
            rdzv_backend = str(_get(answers, "rdzv_backend", "static"))

    if dtype == "NO":
        num_processes = 1
    else:
        num_processes = int(_get(answers, "num_processes", plan.topology.world_size))
    if dtype == "MULTI_GPU" and num_machines == 1 and num_processes == 1:
        # accelerate's questionnaire refuses this combination outright
        raise InputError("num_processes", "multi-GPU with 1 process on 1 machine", "2 or more, or a single-GPU plan")

    doc: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": bool(_get(answers, "debug", False)) if multi else False,
        "distributed_type": dtype,
        "downcast_bf16": "no",
        # accelerate writes use_cpu only as asked (NO) or forced (MULTI_CPU). For DeepSpeed on CPU
        # it must stay false: `use_cpu: true` makes `accelerate launch` skip the DeepSpeed launcher,
        # while DeepSpeed picks its CPU accelerator by itself when there is no GPU.
        "use_cpu": use_cpu if dtype in ("NO", "MULTI_CPU") else False,
        "machine_rank": machine_rank,
        "main_training_function": "main",
        "num_machines": num_machines,
        "num_processes": num_processes,
        "rdzv_backend": rdzv_backend,
        "same_network": same_network,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if num_machines > 1:
        doc["main_process_ip"] = str(main_ip)
        doc["main_process_port"] = main_port
    elif multi and answers.get("main_process_port") is not None:
        # One machine: `accelerate config` does not ask the port, but `accelerate launch` passes the config's to
        # torchrun as master_port here too (questions._port_asked); only a port the user gave is written.
        doc["main_process_port"] = int(answers["main_process_port"])

    gpu_ids_asked = dtype in ("NO", "MULTI_GPU") and not use_cpu
    if gpu_ids_asked:
        doc["gpu_ids"] = str(_get(answers, "gpu_ids", "all"))
    doc["enable_cpu_affinity"] = bool(_get(answers, "enable_cpu_affinity", False)) if gpu_ids_asked else False

    dynamo = _dynamo_config(answers)
    if dynamo:
        doc["dynamo_config"] = dynamo

    if dtype == "DEEPSPEED":
        doc["deepspeed_config"] = _deepspeed_section(answers, plan, ds_config_path, num_machines, model)
        sp = sequence_parallel_size(answers, plan)
        if sp > 1:
            from wizard.config.parallelism import sp_section
            doc["parallelism_config"] = sp_section(sp, num_processes, str(answers.get("attention") or "auto"))
    else:
        doc["mixed_precision"] = _mixed_precision(answers, plan, use_cpu)
        if doc["mixed_precision"] == "fp8":
            doc["fp8_config"] = _fp8_section(answers)
    if dtype == "FSDP":
        doc["fsdp_config"] = _fsdp_section(answers, plan)
        doc["parallelism_config"] = _parallelism_section(answers, doc["fsdp_config"]["fsdp_version"], plan)
    elif answers.get("use_parallelism_config"):
        raise InputError("use_parallelism_config", "a parallelism config is written for FSDP2 only (accelerate "
                                                   "config asks it there, accelerate launch refuses it elsewhere)",
                         "no, or --backend fsdp")
    return _drop_empty(doc)


def sequence_parallel_size(answers: dict, plan) -> int:
    """The Ulysses size the files carry: the answer (--parallelism-config-sp-size), else the chosen rung's."""
    from wizard.config.parallelism import SP_SIZE_ID

    given = answers.get(SP_SIZE_ID)
    if given is not None:
        return int(given)
    choice = plan.choice if plan is not None else None
    return int(getattr(choice, "sp_size", 1) or 1) if choice is not None else 1


def _fp8_section(answers: dict) -> dict:
    """`fp8_config:` as accelerate config 1.16 asks it (commands/config/cluster.py), under the names `accelerate
    launch` reads: it prefixes each key with fp8_ and exports ACCELERATE_FP8_<KEY>, which AORecipeKwargs /
    TERecipeKwargs read. Two of TE's keys differ from accelerate config's: it writes amax_history_length and
    amax_compute_algorithm, which map to no launch option and are never read (its files run with 1024 and
    most_recent whatever was answered); the wizard writes amax_history_len and amax_compute_algo, which are."""
    backend = _one_of("fp8_backend", str(_get(answers, "fp8_backend", "ao")).lower(), FP8_BACKENDS)
    section: dict[str, Any] = {"backend": backend.upper()}       # FP8BackendType's value: AO | TE
    if backend == "te":
        section["use_autocast_during_eval"] = bool(_get(answers, "fp8_use_autocast_during_eval", False))
        section["margin"] = int(_get(answers, "fp8_margin", 0))
        section["interval"] = int(_get(answers, "fp8_interval", 1))
        section["fp8_format"] = _one_of("fp8_format", str(_get(answers, "fp8_format", "HYBRID")).upper(), FP8_FORMATS)
        section["amax_history_len"] = int(_get(answers, "fp8_amax_history_len", 1024))
        section["amax_compute_algo"] = _one_of("fp8_amax_compute_algo",
                                               str(_get(answers, "fp8_amax_compute_algo", "most_recent")).lower(),
                                               FP8_AMAX_COMPUTE_ALGOS)
        override = bool(answers.get("fp8_override_linear_precision"))
        # accelerate config stores the three answers as a tuple, which yaml.safe_dump writes as this list
        section["override_linear_precision"] = [override and bool(answers.get(f"fp8_override_{gemm}"))
                                                for gemm in ("fprop", "dgrad", "wgrad")]
    else:
        section["enable_fsdp_float8_all_gather"] = bool(_get(answers, "fp8_enable_fsdp_float8_all_gather", True))
        section["pad_inner_dim"] = bool(_get(answers, "fp8_pad_inner_dim", True))
    return section


def _parallelism_section(answers: dict, fsdp_version: int, plan=None) -> dict:
    """`parallelism_config:` as accelerate config writes it (parallelism_config_<size> keys), FSDP2 only. Answers
    that do not say (no use_parallelism_config) take the plan's rung: a context-parallel one writes its cp size and
    shards over the rest of the processes."""
    from wizard.config.parallelism import CP_COMM_ID, SIZE_IDS, from_answers

    from wizard.planning.rungs import BY_KEY

    choice = plan.choice if plan is not None else None
    cp = int(getattr(choice, "cp_size", 1) or 1) if choice is not None else 1
    spec = BY_KEY.get(choice.key) if choice is not None else None
    replicate = plan.topology.num_machines if spec is not None and spec.replicate else 1
    if "use_parallelism_config" not in answers and (cp > 1 or replicate > 1):
        answers = {**answers, "use_parallelism_config": True, SIZE_IDS[0]: replicate, SIZE_IDS[3]: cp,
                   SIZE_IDS[1]: max(1, plan.topology.world_size // (cp * replicate))}
        if cp > 1:
            answers[CP_COMM_ID] = "allgather"
    section = from_answers(answers) or {}
    if section and fsdp_version != 2:
        raise InputError("use_parallelism_config", "a parallelism config needs FSDP version 2 (accelerate launch: "
                                                   "'You cannot use `--use_parallelism_config` without `--use_fsdp` "
                                                   "and `--fsdp_version=2`')", "no, or --fsdp-version 2")
    return section


def _drop_empty(doc: dict) -> dict:
    # BaseConfig.to_dict: a key whose value is None or an empty dict is not written.
    return {k: v for k, v in doc.items() if v is not None and not (isinstance(v, dict) and not v)}


def _dynamo_config(answers: dict) -> dict:
    if not answers.get("use_dynamo"):
        return {}
    backend = _one_of("dynamo_backend", str(_get(answers, "dynamo_backend", "inductor")).upper(), DYNAMO_BACKENDS)
    section: dict[str, Any] = {"dynamo_backend": backend}
    custom_keys = ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")
    # accelerate asks these four only after "customize the defaults sent to torch.compile? yes";
    # an answer to any of them is that yes.
    if any(answers.get(k) is not None for k in custom_keys):
        section["dynamo_mode"] = _one_of("dynamo_mode", _get(answers, "dynamo_mode", "default"), DYNAMO_MODES)
        section["dynamo_use_fullgraph"] = bool(_get(answers, "dynamo_use_fullgraph", False))
        section["dynamo_use_dynamic"] = bool(_get(answers, "dynamo_use_dynamic", False))
        section["dynamo_use_regional_compilation"] = bool(_get(answers, "dynamo_use_regional_compilation", False))
    return section


def _deepspeed_section(answers: dict, plan, ds_config_path: str | None, num_machines: int, model=None) -> dict:
    if not ds_config_path:
        raise ValueError("a DeepSpeed plan needs the path of ds_config.json")
    stage = _choice(plan).zero_stage
    section: dict[str, Any] = {
        "deepspeed_config_file": os.path.abspath(os.path.expanduser(ds_config_path)),
        "zero3_init_flag": bool(_get(answers, "zero3_init_flag", stage == 3)),
    }
    if answers.get("method") == "qlora" and stage == 3 and not section["zero3_init_flag"]:
        # wizard.sizing.lora.qlora_requirements: peft's QLoRA + ZeRO-3 recipe needs zero.Init.
        raise InputError("zero3_init_flag", "QLoRA with ZeRO-3 needs zero3_init_flag: true (peft's DeepSpeed guide)",
                         "yes")
    moe = answers.get("deepspeed_moe_layer_cls_names") or moe_leaf_classes(stage, model)
    if moe:
        section["deepspeed_moe_layer_cls_names"] = str(moe)
    if num_machines > 1:
        launcher = _one_of("deepspeed_multinode_launcher", _get(answers, "deepspeed_multinode_launcher", "pdsh"),
                           DEEPSPEED_MULTINODE_LAUNCHERS)
        section["deepspeed_multinode_launcher"] = launcher
        if launcher != "standard":
            # accelerate's prompt has no default: an empty answer is stored as "".
            section["deepspeed_hostfile"] = str(_get(answers, "deepspeed_hostfile", ""))
            for key in ("deepspeed_exclusion_filter", "deepspeed_inclusion_filter"):
                if answers.get(key):
                    section[key] = str(answers[key])
    return section


def moe_leaf_classes(zero_stage: int | None, model) -> str | None:
    """The MoE block class ZeRO-3 must treat as a leaf module, for accelerate's `deepspeed_moe_layer_cls_names`.

    Why: under ZeRO-3 each rank fetches the parameters of the modules it runs; with sparse routing
    ranks run different experts, so the fetches differ and the collective can hang. accelerate
    (utils/dataclasses.py `DeepSpeedPlugin.set_moe_leaf_modules`, called from
    `Accelerator._prepare_deepspeed` for the HF Trainer and an own loop alike) reads this key
    (exported by `accelerate launch` as ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES, allowed beside
    `deepspeed_config_file`) and calls deepspeed.utils.set_z3_leaf_modules, so the whole block is
    fetched at once. transformers 5.24 sets no leaf modules itself; DeepSpeed 0.19.8's own
    `zero_optimization.leaf_module` default covers only the Mixtral/Qwen2-MoE/Qwen3-MoE blocks, so
    the class comes from the model (ModelShape.moe_block_class) for every MoE model.
    """
    block = getattr(model, "moe_block_class", None)
    return block if zero_stage == 3 and block else None


def _fsdp_section(answers: dict, plan) -> dict:
    rung = _choice(plan)
    version = int(_get(answers, "fsdp_version", 2))
    _one_of("fsdp_version", version, (1, 2))
    reshard = answers.get("fsdp_reshard_after_forward")
    if reshard is None:
        reshard = True if rung.fsdp_reshard is None else bool(rung.fsdp_reshard)
    section: dict[str, Any] = {"fsdp_version": version}
    if version == 1:
        # FSDP1 stores a sharding strategy under the same key (accelerate config's "What should be your sharding
        # strategy?"; the plugin raises on a bool there): the table asks it as fsdp_sharding_strategy, and a bare
        # resharding answer maps to FULL_SHARD (≈ZeRO-3) / SHARD_GRAD_OP (≈ZeRO-2).
        strategy = answers.get("fsdp_sharding_strategy")
        if strategy is None:
            strategy = reshard
        if isinstance(strategy, bool):
            strategy = "FULL_SHARD" if strategy else "SHARD_GRAD_OP"
        field = "fsdp_sharding_strategy" if answers.get("fsdp_sharding_strategy") is not None \
            else "fsdp_reshard_after_forward"
        section["fsdp_reshard_after_forward"] = _one_of(field, str(strategy).upper(), FSDP_SHARDING_STRATEGIES)
    else:
        if not isinstance(reshard, bool):
            raise InputError("fsdp_reshard_after_forward", f"{reshard!r} is not a yes/no answer for FSDP2",
                             "true, false")
        section["fsdp_reshard_after_forward"] = reshard
    offload_default = rung.offload_param != "none" or rung.offload_optimizer != "none"
    section["fsdp_offload_params"] = bool(_get(answers, "fsdp_offload_params", offload_default))
    policy = _one_of("fsdp_auto_wrap_policy", _get(answers, "fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
                     FSDP_AUTO_WRAP_POLICIES)
    section["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        # No class names = accelerate's "use the model's _no_split_modules" answer: the key is omitted.
        cls = answers.get("fsdp_transformer_layer_cls_to_wrap")
        if cls:
            section["fsdp_transformer_layer_cls_to_wrap"] = str(cls)
    elif policy == "SIZE_BASED_WRAP":
        section["fsdp_min_num_params"] = int(_get(answers, "fsdp_min_num_params", 100_000_000))
    if version == 1:
        section["fsdp_backward_prefetch"] = _one_of(
            "fsdp_backward_prefetch", _get(answers, "fsdp_backward_prefetch", "BACKWARD_PRE"), FSDP_BACKWARD_PREFETCH)
    state_types = FSDP1_STATE_DICT_TYPES if version == 1 else FSDP2_STATE_DICT_TYPES
    section["fsdp_state_dict_type"] = _one_of("fsdp_state_dict_type",
                                              _get(answers, "fsdp_state_dict_type", state_types[0]), state_types)
    if version == 1:
        section["fsdp_forward_prefetch"] = bool(_get(answers, "fsdp_forward_prefetch", False))
        section["fsdp_use_orig_params"] = bool(_get(answers, "fsdp_use_orig_params", True))
    efficient = bool(_get(answers, "fsdp_cpu_ram_efficient_loading", True))
    section["fsdp_cpu_ram_efficient_loading"] = efficient
    if version == 1:
        # accelerate forces sync_module_states with RAM-efficient loading (launch rejects the other way)
        section["fsdp_sync_module_states"] = True if efficient else bool(_get(answers, "fsdp_sync_module_states",
                                                                              True))
    section["fsdp_activation_checkpointing"] = bool(_get(answers, "fsdp_activation_checkpointing",
                                                         rung.gradient_checkpointing))
    return section


def render_yaml(doc: dict) -> str:
    """Serialise exactly as ClusterConfig.to_yaml_file: yaml.safe_dump, keys sorted, 'NO'/'no' quoted."""
    import yaml  # pyyaml is light; imported here only to keep `import wizard.config.emit` free of it

    return yaml.safe_dump(doc)


# --------------------------------------------------------------------------------------------
# ds_config.json
# --------------------------------------------------------------------------------------------

def deepspeed_config(answers: dict, plan, model) -> dict | None:
    """The DeepSpeed JSON for the chosen rung, or None when the plan does not use DeepSpeed.

    trainer 'hf' (HF Trainer): "auto" for micro batch, train batch, accumulation, clipping,
    fp16/bf16 and the hidden-size buckets: transformers fills each from TrainingArguments and the
    model. trainer 'accelerate' (own loop): accelerate fills only the batch sizes (from the
    dataloader) and would set clipping to 1.0, 16-bit save to false, precision from
    --mixed_precision (absent beside a config file, so "no"): those are written concretely.
    """
    rung = _choice(plan)
    if rung.backend != "deepspeed":
        return None
    stage = rung.zero_stage
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"DeepSpeed rung without a ZeRO stage: {stage!r}")
    trainer = _one_of("trainer", _get(answers, "trainer", "hf"), ("hf", "accelerate"))
    hf = trainer == "hf"
    use_cpu = _use_cpu(answers, plan)
    precision = _ds_precision(answers, plan, use_cpu)
    hidden = getattr(model, "hidden_size", None)

    doc: dict[str, Any] = {}
    if not use_cpu:
        # On CPU accelerate counts 1 process while DeepSpeed forms the real N-rank group, so an
        # "auto" train_batch_size is mis-filled (micro*gas*1) and DeepSpeed's batch assertion
        # fails; omitted, DeepSpeed derives it from micro*gas*world itself (deepspeed.md §4.3).
        doc["train_batch_size"] = AUTO
    doc["train_micro_batch_size_per_gpu"] = AUTO
    doc["gradient_accumulation_steps"] = AUTO if hf else int(_get(answers, "grad_accum", 1))
    doc["gradient_clipping"] = AUTO if hf else float(_get(answers, "gradient_clipping", 1.0))
    if hf and not use_cpu:
        doc["bf16"] = {"enabled": AUTO}
        doc["fp16"] = {"enabled": AUTO}
    else:
        doc["bf16"] = {"enabled": precision == "bf16"}
        doc["fp16"] = {"enabled": precision == "fp16"}
    doc["zero_optimization"] = _zero_section(answers, rung, model, hf, hidden, plan.topology.world_size)
    if rung.offload_optimizer != "none":
        if not cpu_adam_runs(answers, rung):
            doc["zero_force_ds_cpu_optimizer"] = False   # keep SGD / Adafactor: see OFFLOAD OPTIMIZER RULE
        elif hf:
            doc["optimizer"] = {"type": "AdamW", "params": dict(CPU_ADAM_AUTO_PARAMS)}
        # own loop + DeepSpeedCPUAdam: neither key; accelerate maps the loop's torch AdamW itself
    if "nvme" in (rung.offload_optimizer, rung.offload_param):
        doc["aio"] = dict(AIO)   # top level: inside zero_optimization DeepSpeed rejects it
    return doc


# OFFLOAD OPTIMIZER RULE: on a rung with optimizer offload, DeepSpeedCPUAdam steps the CPU states,
# never a torch optimizer (DeepSpeedEngine._configure_basic_optimizer: a client optimizer under
# offload "in most cases will yield poor performance"). What each trainer does with the file
# (transformers 5.24, accelerate 1.15, DeepSpeed 0.19.8):
# - hf: transformers/integrations/deepspeed.py `deepspeed_optim_sched` turns an "optimizer" block
#   into DummyOptim, `HfTrainerDeepSpeedConfig.trainer_config_process` fills its "auto" lr, betas,
#   eps and weight_decay from TrainingArguments, and deepspeed/runtime/engine.py
#   `_configure_basic_optimizer` -> `get_optimizer_configuration` builds type "AdamW" under offload
#   as DeepSpeedCPUAdam(adamw_mode=True, fp32 states). The Trainer's own scheduler is kept
#   (DummyScheduler with its callable). So: the block, and no zero_force_ds_cpu_optimizer.
# - accelerate (own loop): with a block, accelerator.py `_prepare_deepspeed` refuses the loop's
#   torch optimizer ("You cannot specify an optimizer in the config file and in the code") unless
#   the loop builds DummyOptim. Without a block and with zero_force_ds_cpu_optimizer at its default
#   (true), `_prepare_deepspeed` maps the loop's torch optimizer with utils/deepspeed.py
#   `map_pytorch_optim_to_deepspeed` to DeepSpeedCPUAdam (adamw_mode=True for torch.optim.AdamW; lr
#   and weight_decay kept, betas/eps at DeepSpeedCPUAdam's defaults = torch's). So: neither key.
# - sgd / adafactor: DeepSpeed has CPU optimizer ops only for Adam/AdamW/Adagrad/Lion, and the
#   mapping above would silently make them Adam at their learning rate. They are kept as asked with
#   "zero_force_ds_cpu_optimizer": false (the torch step on the CPU, said in notes()).
# - adamw-8bit: never paired with CPU offload; memory.optimizer_for_rung makes it AdamW, for the
#   memory plan and here alike.
CPU_ADAM_AUTO_PARAMS = {"lr": AUTO, "betas": AUTO, "eps": AUTO, "weight_decay": AUTO}


def asked_optimizer(answers: dict) -> str:
    return _one_of("optimizer", str(_get(answers, "optimizer", "adamw")), tuple(OPTIMIZER_STATE_BYTES))


def cpu_adam_runs(answers: dict, rung) -> bool:
    """True when DeepSpeedCPUAdam steps this rung's offloaded optimizer states (OFFLOAD OPTIMIZER RULE)."""
    offloads = rung.backend == "deepspeed" and rung.offload_optimizer != "none"
    return offloads and optimizer_for_rung(asked_optimizer(answers), offloads) == "adamw"


def _nvme_path(answers: dict) -> str:
    path = answers.get("nvme_path")
    if not path:
        raise InputError("nvme_path", "NVMe offload needs a directory on the NVMe drive", "--nvme-path DIR")
    return os.path.abspath(os.path.expanduser(str(path)))


def _offload_block(answers: dict, device: str) -> dict:
    block: dict[str, Any] = {"device": device}
    if device == "nvme":
        block["nvme_path"] = _nvme_path(answers)
    block["pin_memory"] = True
    return block


def _zero_section(answers: dict, rung, model, hf: bool, hidden: int | None, world_size: int) -> dict:
    stage = rung.zero_stage

    def h_value(concrete: int) -> Any:
        return AUTO if hf else concrete

    def reduce_bucket() -> Any:
        if hf:
            return AUTO
        return hidden * hidden if hidden else REDUCE_BUCKET_SIZE_NO_MODEL

    zero: dict[str, Any] = {"stage": stage}
    if stage in (1, 2):
        zero.update({
            "allgather_partitions": True,
            "allgather_bucket_size": ALLGATHER_BUCKET_SIZE,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": reduce_bucket(),
            "contiguous_gradients": True,
        })
    if rung.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(answers, rung.offload_optimizer)
    if stage == 3:
        if rung.offload_param != "none":
            block = _offload_block(answers, rung.offload_param)
            if rung.offload_param == "nvme":
                # Each swap buffer must hold the largest parameter partition (DeepSpeed asserts
                # "More elements ... than buffer size" otherwise).
                largest = int(getattr(model, "largest_layer_params", 0) or 0)
                needed = math.ceil(largest / max(1, world_size))
                block["buffer_size"] = max(OFFLOAD_PARAM_BUFFER_SIZE, int(math.ceil(needed / 1_000_000) * 1_000_000))
            zero["offload_param"] = block
        if hidden:
            prefetch, persistence = int(0.9 * hidden * hidden), 10 * hidden
        else:
            prefetch, persistence = 50_000_000, 100_000   # DeepSpeed's defaults
        zero.update({
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": SUB_GROUP_SIZE,
            "reduce_bucket_size": reduce_bucket(),
            "stage3_prefetch_bucket_size": h_value(prefetch),
            "stage3_param_persistence_threshold": h_value(persistence),
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE,
            # Without it save_model writes placeholder weights under ZeRO-3 (DeepSpeed #3841).
            "stage3_gather_16bit_weights_on_model_save": bool(_get(answers, "zero3_save_16bit_model", True)),
        })
    elif rung.offload_param != "none":
        raise ValueError(f"parameter offload needs ZeRO-3, rung {rung.key!r} has stage {stage}")
    return zero


def render_json(doc: dict) -> str:
    """Strict JSON (HF reads it with json.load), keys in the order built above: stable for golden files."""
    return json.dumps(doc, indent=2) + "\n"


def notes(answers: dict, plan) -> list[str]:
    """What the user should know about the files beyond their content (shown with the result)."""
    out: list[str] = []
    rung = _choice(plan)
    use_cpu = _use_cpu(answers, plan)
    if use_cpu:
        out.append("CPU-only: no GPU here, so the files train in fp32 on CPU processes "
                   "(DeepSpeed's CPU accelerator over gloo); bf16/fp16 are off.")
        if rung.backend == "deepspeed":
            out.append("use_cpu is false in default_config.yaml on purpose: accelerate's use_cpu would skip "
                       "the DeepSpeed launcher; DeepSpeed selects its CPU accelerator by itself.")
            out.append("train_batch_size is left out of ds_config.json: accelerate counts 1 process without "
                       "a GPU, so an \"auto\" value would be filled wrongly; DeepSpeed derives it.")
    out.extend(_offload_optimizer_notes(answers, rung))
    out.extend(_fp8_and_parallelism_notes(answers, rung, plan.topology.world_size))
    if answers.get("main_process_port") is not None and distributed_type(plan, use_cpu) == "NO":
        out.append(f"--main-process-port {answers['main_process_port']} is not written: a single process "
                   "(distributed_type NO) meets no other on any port.")
    return out


def _fp8_and_parallelism_notes(answers: dict, rung, world_size: int) -> list[str]:
    out = []
    if rung.backend != "deepspeed" and str(answers.get("mixed_precision") or "").lower() == "fp8":
        from wizard.config import fp8
        backend = str(_get(answers, "fp8_backend", "ao")).lower()
        out.append(f"fp8 through {fp8.NAMES.get(backend, backend)}: the training machine needs it installed "
                   f"(pip install {fp8.PACKAGES.get(backend, backend)}); the plan's memory and speed figures are "
                   "bf16's (the weights stay bf16, only the matmul inputs go to fp8).")
    section = _parallelism_section(answers, 2) if rung.backend == "fsdp" else {}
    sizes = {k[len("parallelism_config_"):]: v for k, v in section.items() if k.endswith("_size")}
    from wizard.planning.rungs import BY_KEY

    spec = BY_KEY.get(rung.key)
    machines = max(1, world_size // max(1, sizes.get("dp_shard_size", 1) * sizes.get("cp_size", 1))) if sizes else 1
    replicas = machines if spec is not None and spec.replicate else 1
    # the rung's own context parallelism or HSDP replicas are what the plan sized
    modelled = (replicas, 1, int(getattr(rung, "cp_size", 1) or 1))
    if sizes and (sizes["dp_replicate_size"], sizes["tp_size"], sizes["cp_size"]) == modelled and replicas > 1:
        out.append(f"HSDP: a replica of the model on each of the {replicas} machines, sharded over its "
                   f"{sizes['dp_shard_size']} GPUs; only the gradients' all-reduce crosses the network, as the plan "
                   "sized it.")
    elif sizes and (sizes["dp_replicate_size"], sizes["tp_size"], sizes["cp_size"]) == modelled and modelled[2] > 1:
        out.append(f"context parallel {modelled[2]}: each sequence is split over {modelled[2]} GPUs, so a step takes "
                   f"micro-batch x accumulation x {world_size // modelled[2]} sequences (the {world_size} processes "
                   f"/ cp {modelled[2]}); the script must train through the HF Trainer (it splits input_ids, labels "
                   "and position_ids in accelerator.maybe_context_parallel) with SDPA attention and causal masks, "
                   "and the sequence a multiple of 2 x cp.")
    elif sizes and (sizes["dp_replicate_size"], sizes["tp_size"], sizes["cp_size"]) != (1, 1, 1):
        out.append(f"parallelism config: the plan's memory and speed figures are for FSDP2 over all {world_size} "
                   f"processes; replicate {sizes['dp_replicate_size']} x shard {sizes['dp_shard_size']} x tp "
                   f"{sizes['tp_size']} x cp {sizes['cp_size']} changes them (replicas hold more of the sharded "
                   "states per GPU, tensor and context parallelism split the weights and the activations further), "
                   "which the plan does not model.")
    return out


def _offload_optimizer_notes(answers: dict, rung) -> list[str]:
    if rung.backend != "deepspeed" or rung.offload_optimizer == "none":
        return []
    asked = asked_optimizer(answers)
    if not cpu_adam_runs(answers, rung):
        return [f"zero_force_ds_cpu_optimizer is false: your {asked} steps the offloaded states in torch on the "
                f"CPU (DeepSpeed has CPU kernels only for Adam/AdamW/Adagrad/Lion, and accelerate would otherwise "
                f"swap it for Adam silently); --optimizer adamw runs the vectorised, multi-threaded "
                f"DeepSpeedCPUAdam instead."]
    out = []
    if asked == "adamw-8bit":
        out.append("8-bit AdamW is not paired with CPU offload: DeepSpeedCPUAdam (AdamW, fp32 states) steps the "
                   "offloaded states instead, and the memory plan counts its 8 bytes per parameter.")
    if _get(answers, "trainer", "hf") == "hf":
        out.append("ds_config.json has an \"optimizer\" block (AdamW, \"auto\" values the Trainer fills from "
                   "TrainingArguments): DeepSpeed runs DeepSpeedCPUAdam on the offloaded states, not the Trainer's "
                   "torch optimizer (its --optim is not used; its learning-rate scheduler is).")
    else:
        out.append("Build torch.optim.AdamW in your loop (not an 8-bit one): accelerator.prepare replaces it with "
                   "DeepSpeedCPUAdam on the offloaded states (AdamW mode, your lr and weight_decay; betas and eps at "
                   "the defaults 0.9, 0.999, 1e-8).")
    return out


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def output_paths(output_dir: str) -> tuple[str, str]:
    """(default_config.yaml, ds_config.json) inside output_dir, absolute."""
    base = os.path.abspath(os.path.expanduser(output_dir))
    return os.path.join(base, YAML_NAME), os.path.join(base, DS_NAME)


STAGED_DS_PREFIX = "ds_config.staged-"   # the JSON's name while a YAML and a JSON change over together


def write_files(yaml_text: str, ds_text: str | None, output_dir: str, dry_run: bool = False, *,
                extra: tuple[tuple[str, str], ...] = ()) -> list:
    """Write default_config.yaml, ds_config.json (if any) and `extra` (name, text) files as one set.

    Returns the WriteResults of the JSON (if any) and the YAML, in that order. Under the output
    dir's lock, everything is staged first; then, when both the YAML and the JSON change, the renames
    go: the new JSON under a fresh name (ds_config.staged-*.json), the new YAML naming it, the new
    JSON as ds_config.json, the new YAML naming that, then `extra`. Every state in between is an old
    or a new YAML beside the very JSON it names, so a kill at any point leaves a set that loads and
    agrees; any failure rolls back through the same states (fsutil.FileSet).
    """
    from wizard import fsutil

    yaml_path, ds_path = output_paths(output_dir)
    directory = os.path.dirname(yaml_path)
    fsutil.check_writable_dir(directory)
    names = [YAML_NAME] + ([DS_NAME] if ds_text is not None else []) + [name for name, _ in extra]
    for name in names:
        fsutil.check_replaceable(os.path.join(directory, name))
        fsutil.check_replaceable(os.path.join(directory, name + fsutil.BACKUP_SUFFIX))
    pairs = ([(ds_path, ds_text)] if ds_text is not None else []) + [(yaml_path, yaml_text)]
    if dry_run:
        return [fsutil.plan_write(p, t) for p, t in pairs]
    with fsutil.FileSet(directory) as files:
        results = [files.stage(p, t) for p, t in pairs]
        extras = [(os.path.join(directory, name), text) for name, text in extra]
        for path, text in extras:
            files.stage(path, text)
        if ds_text is not None and files.changed(ds_path) and files.changed(yaml_path):
            staged = files.stage_extra(STAGED_DS_PREFIX, ".json", ds_text)
            files.commit(yaml_path, yaml_naming(yaml_text, staged))
            files.commit(ds_path)
            files.commit(yaml_path)
        else:
            for path, _ in pairs:
                if files.changed(path):
                    files.commit(path)
        for path, _ in extras:
            if files.changed(path):
                files.commit(path)
        files.finish()
        # Still under the lock: what a killed write left behind can't be another writer's.
        fsutil.remove_stale_temps(directory, tuple(names))
        _remove_staged_json(directory)
    return results


def yaml_naming(yaml_text: str, ds_path: str) -> str:
    """The same YAML with deepspeed_config_file pointing at `ds_path` (render_yaml is yaml.safe_dump)."""
    from wizard.fsutil import yaml_load

    doc = yaml_load(yaml_text)
    doc["deepspeed_config"]["deepspeed_config_file"] = ds_path
    return render_yaml(doc)


def _remove_staged_json(directory: str) -> None:
    """ds_config.staged-*.json left by a killed write, once default_config.yaml no longer names one."""
    from wizard.fsutil import read_yaml_mapping

    named = ((read_yaml_mapping(os.path.join(directory, YAML_NAME)) or {}).get("deepspeed_config") or {})
    in_use = named.get("deepspeed_config_file") if isinstance(named, dict) else None
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if entry.startswith(STAGED_DS_PREFIX) and entry.endswith(".json") and path != in_use:
            try:
                os.unlink(path)
            except OSError:
                pass
