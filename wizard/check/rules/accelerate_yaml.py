"""Rules on accelerate's default_config.yaml: what its loader rejects, what `accelerate launch`
mishandles, and what both accept silently and then ignore.

Facts (accelerate 1.15, checked in tests/unit/test_check_library_facts.py):
- the loader (`ClusterConfig.from_yaml_file`) rejects unknown top-level keys and never looks inside
  `deepspeed_config` / `fsdp_config`; launch copies those nested keys onto its argparse namespace,
  where a key that no launch option reads has no effect;
- `DeepSpeedPlugin` raises when `deepspeed_config_file` is used together with any of eight
  `deepspeed_config` keys or a top-level `mixed_precision`;
- launch copies a top-level YAML value only when the CLI default is None, so `rdzv_backend`,
  `same_network` and `enable_cpu_affinity` from the YAML never take effect;
- `num_processes` is the total over machines (torchrun gets num_processes // num_machines per node).
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, fixer, rule
from wizard.check.rules.yaml_verdicts import launch_outcome, loader_error
from wizard.config.vocab import DS_KEY_OF_YAML_KEY, REJECTED_BESIDE_DS_FILE
from wizard.probe.ports import port_in_use     # the busy test `wizard launch` uses too

FAMILY = "accelerate"

# Keys whose value accelerate reads as a string: an unquoted NO/no/yes/on/off there becomes a bool.
STRING_KEYS: dict[tuple[str, ...], str] = {
    ("distributed_type",): "upper",
    ("mixed_precision",): "lower",
    ("compute_environment",): "upper",
    ("dynamo_backend",): "upper",            # legacy top-level form
    ("rdzv_backend",): "keep",
    ("dynamo_config", "dynamo_backend"): "upper",
    ("dynamo_config", "dynamo_mode"): "keep",
    ("deepspeed_config", "offload_optimizer_device"): "lower",
    ("deepspeed_config", "offload_param_device"): "lower",
    ("fp8_config", "backend"): "upper",
}


DEFAULT_PORT = 29500


# ----------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=1)
def launch_option_groups() -> dict[str, frozenset[str]]:
    """Option names per group of the real `accelerate launch` parser (what nested YAML keys can mean)."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    return {g.title: frozenset(a.dest for a in g._group_actions) for g in parser._action_groups}


def known_deepspeed_keys() -> frozenset[str]:
    return launch_option_groups().get("DeepSpeed Arguments", frozenset())


def known_fsdp_keys() -> frozenset[str]:
    return launch_option_groups().get("FSDP Arguments", frozenset())


@functools.lru_cache(maxsize=1)
def cluster_config_fields() -> frozenset[str]:
    from accelerate.commands.config.config_args import ClusterConfig

    return frozenset(ClusterConfig.__dataclass_fields__)


def _yaml_name(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _is_local_machine(ctx: CheckContext) -> bool:
    env = ctx.acc_get("compute_environment", default="LOCAL_MACHINE")
    return env == "LOCAL_MACHINE"


def _launches_torchrun(ctx: CheckContext) -> bool:
    """The launch paths that rendezvous on main_process_port (and check it): multi-GPU, FSDP, DeepSpeed."""
    if ctx.acc_get("use_cpu") is True:
        return False
    return ctx.distributed_type in ("MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM") or ctx.num_machines > 1


# ----------------------------------------------------------------------------- rules


@rule("ACC-UNQUOTED-NO", FAMILY, "unquoted NO/no (YAML boolean) where accelerate expects a string", fixable=True)
def unquoted_no(ctx: CheckContext) -> Iterable:
    for path, scalar in sorted(ctx.acc_plain.items()):
        if path not in STRING_KEYS or not scalar.tag.endswith(":bool"):
            continue
        name = _yaml_name(path)
        breaks = True
        consequence = "accelerate launch fails"
        if path == ("distributed_type",):
            if ctx.acc_get("num_processes") is None:
                consequence = ("the loader then cannot default num_processes to 1 and launch fails with "
                               "'You need to manually pass in `--num_processes`'")
            else:
                breaks = False
                consequence = ("launch still picks the single-process launcher only by accident (False is no "
                               "distributed type), and `accelerate env` / `config update` see a bool")
        elif path == ("mixed_precision",):
            consequence = "launch crashes with AttributeError: 'bool' object has no attribute 'lower'"
        yield finding(
            "error" if breaks else "warning", "ACC-UNQUOTED-NO", ctx.acc_path, name,
            f"line {scalar.line}: `{name}: {scalar.raw}` is unquoted, so YAML reads it as the boolean "
            f"{str(ctx.acc_get(*path))!s} instead of the string '{scalar.raw}'; {consequence}",
            fix=f"quote it: {name}: '{_fixed_scalar(path, scalar.raw)}'", when="launch", fixable=True)


def _fixed_scalar(path: tuple[str, ...], raw: str) -> str:
    how = STRING_KEYS.get(path, "keep")
    return raw.upper() if how == "upper" else raw.lower() if how == "lower" else raw


@fixer("ACC-UNQUOTED-NO")
def fix_unquoted_no(ctx: CheckContext, findings: list) -> list[str]:
    changed = []
    for path, scalar in ctx.acc_plain.items():
        if path in STRING_KEYS and scalar.tag.endswith(":bool"):
            node = ctx.acc
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = _fixed_scalar(path, scalar.raw)
            changed.append(f"{_yaml_name(path)}: {scalar.raw} -> '{_fixed_scalar(path, scalar.raw)}' (quoted string)")
    return changed


@rule("ACC-GPU-IDS-NOT-STRING", FAMILY, "gpu_ids is not a string", fixable=True)
def gpu_ids_not_string(ctx: CheckContext) -> Iterable:
    value = ctx.acc_get("gpu_ids")
    if value is None or isinstance(value, str):
        return
    yield finding(
        "error", "ACC-GPU-IDS-NOT-STRING", ctx.acc_path, "gpu_ids",
        f"gpu_ids is a {type(value).__name__} ({value!r}), not a string; accelerate launch calls "
        f"gpu_ids.split(',') and crashes with AttributeError",
        fix=f"write it as a string: gpu_ids: '{_gpu_ids_text(value)}'", when="launch", fixable=True)


def _gpu_ids_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


@fixer("ACC-GPU-IDS-NOT-STRING")
def fix_gpu_ids(ctx: CheckContext, findings: list) -> list[str]:
    value = ctx.acc.get("gpu_ids")
    if value is None or isinstance(value, str):
        return []
    ctx.acc["gpu_ids"] = _gpu_ids_text(value)
    return [f"gpu_ids: {value!r} -> '{ctx.acc['gpu_ids']}'"]


@rule("ACC-UNKNOWN-KEY", FAMILY, "top-level key accelerate's loader does not know")
def unknown_top_level(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or not _is_local_machine(ctx):
        return
    legacy = {"fp16", "dynamo_backend"}   # process_config converts these before the check
    for key in sorted(set(ctx.acc) - cluster_config_fields() - legacy, key=str):
        yield finding(
            "error", "ACC-UNKNOWN-KEY", ctx.acc_path, str(key),
            f"unknown top-level key '{key}': accelerate's loader raises 'had unknown keys' before anything runs",
            fix="remove it or fix its spelling (a DeepSpeed/FSDP setting belongs in deepspeed_config / "
                "fsdp_config or in ds_config.json)", when="launch")


# fp8_config keys that accelerate config itself writes (1.16: TE's history length and amax algorithm) or wrote
# (1.15: MS-AMP's opt_level) under names no launch option reads, and the name launch does read.
FP8_UNREAD_KEYS = {
    "amax_history_length": ("accelerate config writes this name, but launch reads amax_history_len: TE's recipe "
                            "keeps its default, 1024", "amax_history_len"),
    "amax_compute_algorithm": ("accelerate config writes this name, but launch reads amax_compute_algo: TE's recipe "
                               "keeps its default, most_recent", "amax_compute_algo"),
    "opt_level": ("MS-AMP's optimisation level; MS-AMP is gone in accelerate 1.16", None),
}


@rule("ACC-UNKNOWN-NESTED-KEY", FAMILY, "key inside deepspeed_config / fsdp_config / fp8_config / "
                                        "parallelism_config that launch never reads")
def unknown_nested(ctx: CheckContext) -> Iterable:
    groups = launch_option_groups()
    sections = (("deepspeed_config", known_deepspeed_keys(), ""), ("fsdp_config", known_fsdp_keys(), "fsdp_"),
                ("fp8_config", groups.get("FP8 Arguments", frozenset()), "fp8"),
                ("parallelism_config", groups.get("ParallelismConfig Arguments", frozenset()), ""))
    for section, known, prefix in sections:
        block = ctx.acc_get(section)
        if not isinstance(block, dict):
            continue
        for key in block:
            # launch adds the fsdp_ / fp8_ prefix itself when it is missing
            name = key if (not prefix or str(key).startswith(prefix)) else f"{prefix.rstrip('_')}_{key}"
            if name in known:
                continue
            hint = ""
            if section == "deepspeed_config":
                hint = " (DeepSpeed settings such as batch sizes go in ds_config.json)"
            elif section == "fp8_config" and key in FP8_UNREAD_KEYS:
                why, read = FP8_UNREAD_KEYS[key]
                yield finding(
                    "warning", "ACC-UNKNOWN-NESTED-KEY", ctx.acc_path, f"{section}.{key}",
                    f"'{key}' is not an fp8_config option launch reads ({why}), so the setting has no effect",
                    fix=f"rename it to {read}" if read else "remove it", when="launch")
                continue
            yield finding(
                "warning", "ACC-UNKNOWN-NESTED-KEY", ctx.acc_path, f"{section}.{key}",
                f"'{key}' is not an accelerate {section} option: the loader accepts it and launch silently "
                f"ignores it, so the setting has no effect{hint}",
                fix=f"remove it, or use one of: {', '.join(sorted(known))}", when="launch")


@rule("ACC-KEYS-BESIDE-DS-FILE", FAMILY, "mixed_precision or DeepSpeed keys beside deepspeed_config_file",
      fixable=True)
def keys_beside_ds_file(ctx: CheckContext) -> Iterable:
    if ctx.distributed_type != "DEEPSPEED" or not ctx.acc_get("deepspeed_config", "deepspeed_config_file"):
        return
    raises = ("DeepSpeedPlugin raises 'When using `deepspeed_config_file`, the following accelerate config variables "
              "will be ignored' when the script builds its Accelerator / TrainingArguments")
    conflict = _precision_conflict(ctx)
    if conflict is not None:
        # Removing the key (the fix below) would train in the JSON's precision instead of the one written
        # here: README promises --fix never overrides an explicit value, so the user chooses.
        mine, theirs, where = conflict
        yield finding(
            "error", "ACC-KEYS-BESIDE-DS-FILE", ctx.acc_path, "mixed_precision",
            f"mixed_precision: {mine} here, but deepspeed_config_file {ctx.ds_path} trains in {_words(theirs)} "
            f"({where}): {raises}, and dropping the key would silently train in {_words(theirs)}; --fix leaves "
            f"the choice to you", fix=f"choose one: for {_words(mine)}, {_keep(mine, ctx.ds_path)} and remove "
            f"mixed_precision from the YAML; for {_words(theirs)}, remove mixed_precision: {mine} from the YAML",
            when="launch")
    for key, mine, theirs in _ds_keys_contradicted(ctx):
        said = f"says {theirs!r}" if theirs is not None else "does not set it (DeepSpeed's default applies)"
        yield finding(
            "error", "ACC-KEYS-BESIDE-DS-FILE", ctx.acc_path, f"deepspeed_config.{key}",
            f"deepspeed_config.{key}: {mine!r} here, but {ctx.ds_path} {said} at {DS_KEY_OF_YAML_KEY[key]}: "
            f"{raises}, and dropping the key would silently train without your {mine!r}; --fix leaves the choice "
            f"to you", fix=f"choose one: put {mine!r} at {DS_KEY_OF_YAML_KEY[key]} in {ctx.ds_path}, or keep the "
            f"JSON's; then remove {key} from the YAML", when="launch")
    bad = _keys_beside_ds_file(ctx)
    if not bad:
        return
    yield finding(
        "error", "ACC-KEYS-BESIDE-DS-FILE", ctx.acc_path, ", ".join(bad),
        f"{', '.join(bad)} set beside deepspeed_config_file: {raises}",
        fix="remove them from the YAML and put precision, stage, offload, accumulation and clipping in "
            "ds_config.json (or \"auto\")", when="launch", fixable=True)


def _keys_beside_ds_file(ctx: CheckContext) -> list[str]:
    """The keys DeepSpeedPlugin rejects beside deepspeed_config_file that can go without changing the training
    (a top-level mixed_precision the DeepSpeed config contradicts is _precision_conflict's)."""
    block = ctx.acc_get("deepspeed_config") or {}
    contradicted = {key for key, _, _ in _ds_keys_contradicted(ctx)}
    bad = [f"deepspeed_config.{k}" for k in REJECTED_BESIDE_DS_FILE if k in block and k not in contradicted]
    # launch sets mp_from_config_flag for any non-None YAML mixed_precision, even 'no'
    if ctx.acc_get("mixed_precision") is not None and _precision_conflict(ctx) is None:
        bad.insert(0, "mixed_precision")
    return bad


def _ds_keys_contradicted(ctx: CheckContext) -> list[tuple[str, Any, Any]]:
    """(key, the YAML's value, the JSON's value or None when it has none) for each deepspeed_config key beside
    the file whose value the JSON does not carry as well: removing it would change the training. A JSON that
    leaves the key to the trainer ("auto") contradicts nothing: the YAML's value is never what fills it."""
    block = ctx.acc_get("deepspeed_config")
    if ctx.ds is None or not isinstance(block, dict):
        return []
    out = []
    for key, ds_key in DS_KEY_OF_YAML_KEY.items():
        if key not in block:
            continue
        missing = object()
        theirs = ctx.ds_get(ds_key, missing)
        if theirs == "auto" or (theirs is not missing and _same_setting(block[key], theirs)):
            continue
        out.append((key, block[key], None if theirs is missing else theirs))
    return out


def _same_setting(mine: Any, theirs: Any) -> bool:
    """Whether two spellings mean one value: 2 and 2.0, true and "true", "CPU" and "cpu"."""
    numbers = [_as_float(v) for v in (mine, theirs)]
    if None not in numbers:
        return numbers[0] == numbers[1]
    return str(mine).strip().lower() == str(theirs).strip().lower()


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _precision_conflict(ctx: CheckContext) -> tuple[str, str, str] | None:
    """(the YAML's mixed_precision, the precision the DeepSpeed config trains in, where that comes from) when
    they differ; None when they agree or the DeepSpeed side is not known here (\"auto\" filled by code this
    check cannot see)."""
    mine = ctx.acc_get("mixed_precision")
    if mine is None or ctx.ds is None:
        return None
    mine = str(mine).lower()
    theirs = _ds_precision(ctx)
    if theirs is None or theirs[0] == mine:
        return None
    return mine, theirs[0], theirs[1]


def _ds_precision(ctx: CheckContext) -> tuple[str, str] | None:
    """('fp16' | 'bf16' | 'no', why) the DeepSpeed config trains in, or None when it is not known here."""
    def enabled(block: str) -> bool | str:
        value = ctx.ds_get(f"{block}.enabled", False)
        return "auto" if value == "auto" else value is True or str(value).lower() == "true"

    fp16 = enabled("fp16")
    bf16 = enabled("bf16") or enabled("bfloat16")     # DeepSpeed reads either name
    if fp16 is True and bf16 is True:
        return None             # DeepSpeed itself rejects both (DS-LIBRARY-REJECTS)
    if "auto" in (fp16, bf16):
        # "auto" is filled by the HF Trainer from TrainingArguments' fp16 / bf16, known only with --training-args;
        # an own loop fills it from Accelerator(mixed_precision=...) in code
        if not ctx.hf_trainer or (ctx.ta is None and ctx.trainer != "trl"):
            return None
        if fp16 == "auto" and ctx.ta_value("fp16"):
            return "fp16", "\"auto\" filled from TrainingArguments fp16=True"
        if bf16 == "auto" and ctx.ta_value("bf16"):
            return "bf16", "\"auto\" filled from TrainingArguments bf16=True"
        if fp16 is not True and bf16 is not True:
            return "no", "\"auto\" filled from TrainingArguments without fp16 or bf16"
    if fp16 is True:
        return "fp16", "fp16.enabled: true"
    if bf16 is True:
        return "bf16", "bf16.enabled: true"
    return "no", "neither fp16 nor bf16 enabled"


def _words(precision: str) -> str:
    return {"no": "fp32", "fp8": "fp8"}.get(precision, precision)


def _keep(precision: str, ds_path: str | None) -> str:
    """How to keep the YAML's precision with a DeepSpeed config file."""
    if precision == "fp8":
        # the plugin rejects mixed_precision only when it comes from the YAML (ACCELERATE_CONFIG_DS_FIELDS)
        return "pass mixed_precision='fp8' to Accelerator in the script"
    setting = {"fp16": "fp16.enabled: true and bf16.enabled: false",
               "bf16": "bf16.enabled: true and fp16.enabled: false"}.get(precision,
                                                                        "fp16.enabled: false and bf16.enabled: false")
    return f"set {setting} in {ds_path}"


@fixer("ACC-KEYS-BESIDE-DS-FILE")
def fix_keys_beside_ds_file(ctx: CheckContext, findings: list) -> list[str]:
    changed = []
    for name in _keys_beside_ds_file(ctx):     # never a mixed_precision the DeepSpeed config contradicts
        path = name.split(".")
        node = ctx.acc
        for key in path[:-1]:
            node = node[key]
        value = node.pop(path[-1])
        changed.append(f"removed {name}: {value!r} (DeepSpeedPlugin rejects it beside deepspeed_config_file)")
    return changed


@rule("ACC-IGNORED-BY-LAUNCH", FAMILY, "rdzv_backend / same_network / enable_cpu_affinity set in YAML")
def ignored_by_launch(ctx: CheckContext) -> Iterable:
    checks = [
        ("rdzv_backend", lambda v: v is not None and str(v) != "static", "--rdzv_backend",
         "torchrun gets rdzv_backend='static'"),
        # same_network: true is ignored too (CLI default False), but harmlessly: launch then hands torchrun
        # rdzv_endpoint=main_process_ip:port with the static backend, which reaches the same main node on
        # one network as master_addr/master_port would. accelerate config writes it for every config, so
        # warning about it would flag every file accelerate itself writes.
        ("enable_cpu_affinity", lambda v: v is True, "--enable_cpu_affinity",
         "ACCELERATE_CPU_AFFINITY is never set"),
    ]
    for key, is_set, flag, effect in checks:
        value = ctx.acc_get(key)
        if is_set(value):
            yield finding(
                "warning", "ACC-IGNORED-BY-LAUNCH", ctx.acc_path, key,
                f"{key}: {value} has no effect: accelerate launch copies a YAML value only when the CLI default "
                f"is None, and this one's is not, so {effect}",
                fix=f"pass {flag} on the accelerate launch command line (wizard launch does), or drop the key",
                when="launch")


@rule("ACC-MAIN-PROCESS-UNSET", FAMILY, "several machines without the main machine's address (or port)")
def main_process_unset(ctx: CheckContext) -> Iterable:
    """The wizard refuses to write this (emit: main_process_ip/port are required with more than one machine);
    what accelerate does with it depends on the launcher it picks, so the launcher is taken from accelerate's
    own launch checks (the namespace of _validate_launch_command), not guessed from distributed_type."""
    if ctx.acc is None or ctx.num_machines <= 1:
        return
    args = getattr(launch_outcome(ctx), "args", None)
    if args is None:
        return              # the loader or launch's checks stop earlier: their own findings say why
    ip_missing = ctx.acc_get("main_process_ip") in (None, "")
    port_missing = ctx.acc_get("main_process_port") is None
    if args.use_deepspeed and not args.cpu:
        if str(getattr(args, "deepspeed_multinode_launcher", None) or "pdsh") != "standard":
            return          # DeepSpeed's runner (pdsh, mpi, slurm, nossh) asks the hostfile's first host
        simple = False      # "standard" is torchrun
    else:
        simple = not ((args.use_fsdp or getattr(args, "use_megatron_lm", False) or args.multi_gpu)
                      and not args.cpu) and not getattr(args, "tpu", False)
    n = ctx.num_machines
    fix_ip = ("main_process_ip: the rank-0 machine's address, the same in every machine's config (or "
              "`wizard launch --main-process-ip ADDR`)")
    if ip_missing and simple:
        yield finding(
            "error", "ACC-MAIN-PROCESS-UNSET", ctx.acc_path, "main_process_ip",
            f"num_machines: {n} without main_process_ip: accelerate launch asserts 'When using multiple machines, "
            f"you need to specify the main process IP.' before any process starts", fix=fix_ip, when="launch")
    elif ip_missing:
        port = as_int(ctx.acc_get("main_process_port"), None)
        port = DEFAULT_PORT if port is None else port
        yield finding(
            "error", "ACC-MAIN-PROCESS-UNSET", ctx.acc_path, "main_process_ip",
            f"num_machines: {n} without main_process_ip: accelerate launch gives torchrun the rendezvous "
            f"address None:{port}, a host that never resolves, so every machine retries and the start hangs "
            f"until torchrun's rendezvous timeout", fix=fix_ip, when="launch")
    if port_missing and simple:
        # the torchrun launchers default the port to 29500 (prepare_multi_gpu_env); this one asserts it next
        yield finding(
            "error", "ACC-MAIN-PROCESS-UNSET", ctx.acc_path, "main_process_port",
            f"num_machines: {n} without main_process_port: accelerate launch asserts 'When using multiple "
            f"machines, you need to specify the main process port.' before any process starts",
            fix=f"main_process_port: {DEFAULT_PORT} (free and open between the machines, the same on every one)",
            when="launch")


@rule("ACC-PORT-IN-USE", FAMILY, "main process port already in use")
def port_busy(ctx: CheckContext) -> Iterable:
    if ctx.acc is None or not _launches_torchrun(ctx):
        return
    port = as_int(ctx.acc_get("main_process_port"), None)
    port = DEFAULT_PORT if port is None else port
    if port == 0 or not 0 < port < 65536:
        return              # 0: accelerate picks a free port itself
    if ctx.num_machines > 1 and as_int(ctx.acc_get("machine_rank"), 0) != 0:
        return              # the port lives on the main machine, not here
    busy = ctx.port_in_use if ctx.port_in_use is not None else port_in_use
    if not busy(port):
        return
    # A warning, not an error: it is a fact about this machine now, not about the file, and the run may
    # start later or elsewhere.
    if ctx.num_machines > 1:
        yield finding(
            "warning", "ACC-PORT-IN-USE", ctx.acc_path, "main_process_port",
            f"port {port} is in use on this machine right now (rank 0 of {ctx.num_machines}): if it still is at "
            f"launch, accelerate launch raises ConnectionError 'Tried to launch distributed communication on port "
            f"{port}'; `wizard launch` keeps it, since every machine must agree on it",
            fix="pick a free port (the same on every machine), or stop the job holding it",
            when="launch")
    else:
        yield finding(
            "warning", "ACC-PORT-IN-USE", ctx.acc_path, "main_process_port",
            f"port {port} is in use on this machine right now (another job?): if it still is at launch, "
            f"`accelerate launch` warns and falls back to torchrun --standalone on a port of its own; `wizard "
            f"launch` checks the port as each attempt starts and, when it is busy, passes --main_process_port "
            f"with a free one and says so",
            fix="main_process_port: 0 (accelerate picks a free one), another free port, or start it with "
                "`wizard launch`", when="launch")


@rule("ACC-FSDP-WRAP-CLASS-MISSING", FAMILY, "FSDP wrap class not in the model (with --model)")
def fsdp_wrap_class_missing(ctx: CheckContext) -> Iterable:
    if not ctx.uses_fsdp or not ctx.module_classes:
        return
    opts = ctx.fsdp_options()
    policy = str(opts.get("auto_wrap_policy") or "")
    names = opts.get("transformer_layer_cls_to_wrap")
    if policy and policy != "TRANSFORMER_BASED_WRAP":
        return
    if not names:
        return              # accelerate falls back to the model's _no_split_modules
    wanted = [n.strip() for n in (names if isinstance(names, list) else str(names).split(",")) if n.strip()]
    missing = [n for n in wanted if n not in ctx.module_classes]
    if not missing:
        return
    suggestion = ctx.model.layer_class if ctx.model is not None and ctx.model.layer_class else None
    key = "fsdp_config.fsdp_transformer_layer_cls_to_wrap" if ctx.distributed_type == "FSDP" else \
        "fsdp_config.transformer_layer_cls_to_wrap"
    yield finding(
        "error", "ACC-FSDP-WRAP-CLASS-MISSING", ctx.acc_path if ctx.distributed_type == "FSDP" else ctx.ta_path, key,
        f"{', '.join(missing)} is not a module class of {ctx.model_id}: at prepare accelerate raises "
        f"'Could not find the transformer layer class to wrap in the model.' (class names are case-sensitive)",
        fix=f"use {suggestion}" if suggestion else "use the model's decoder layer class", when="prepare")


# ----------------------------------------------------------------------------- FSDP2

# FSDP1 YAML keys with no FSDP2 meaning, if accelerate's own converter (`accelerate to-fsdp2`) cannot be read
FSDP1_ONLY_FALLBACK = {"fsdp_sharding_strategy": "fsdp_reshard_after_forward", "fsdp_backward_prefetch": None,
                       "fsdp_forward_prefetch": None, "fsdp_use_orig_params": None, "fsdp_sync_module_states": None}
# What accelerate 1.16 does with each under fsdp_version 2 from the YAML: launch exports every FSDP_* variable and
# the script's FullyShardedDataParallelPlugin reads them (utils/dataclasses.py); quoted words are accelerate's own
# (its FSDP2 deprecation messages). tests/unit/test_check_library_facts.py builds the plugin for each, so a change
# in accelerate fails a test.
FSDP1_UNDER_FSDP2 = {
    "fsdp_sharding_strategy": "accelerate's FSDP2 plugin never reads it ('sharding_strategy is deprecated in favor "
                              "of reshard_after_forward'): FSDP2 reshards as fsdp_reshard_after_forward says",
    "fsdp_backward_prefetch": "accelerate's FSDP2 plugin reads it, logs 'backward_prefetch is not supported in "
                              "FSDP2. Setting backward prefetch to None.' and drops it; FSDP2 has no such setting",
    "fsdp_forward_prefetch": "accelerate's FSDP2 plugin never reads it from the launch ('forward_prefetch is not "
                             "yet implemented in FSDP2')",
    "fsdp_use_orig_params": "accelerate's FSDP2 plugin never reads it ('FSDP2 always uses the original "
                            "parameters')",
    "fsdp_sync_module_states": "accelerate's FSDP2 plugin never reads it ('sync_module_states is obsolete in "
                               "FSDP2, as it is not needed anymore')",
}


@functools.lru_cache(maxsize=1)
def fsdp1_only_keys() -> dict[str, str | None]:
    """FSDP1 YAML key -> its FSDP2 key (None: none), from accelerate's own FSDP1 -> FSDP2 converter: the keys it
    drops (removed, not yet implemented) or renames."""
    try:
        from accelerate.commands import to_fsdp2
    except ImportError:             # an accelerate before `accelerate to-fsdp2`
        return dict(FSDP1_ONLY_FALLBACK)
    out: dict[str, str | None] = {}
    for key, target in to_fsdp2.ARGUMENT_KEY_MAPPING.items():
        if isinstance(target, to_fsdp2.ConversionStatus):
            out[key] = None
        elif target != key:
            out[key] = target
    return out


def fsdp2_reshard_value(value: Any) -> bool | None:
    """The reshard_after_forward FSDP2 gets from this YAML value, as accelerate reads it (launch exports
    str(value).lower(), the plugin calls str_to_bool); None when accelerate raises on it."""
    from accelerate.utils import str_to_bool
    try:
        return bool(str_to_bool(str(value).lower(), to_bool=True))
    except ValueError:
        return None


def _fsdp2_equivalent(strategy: Any) -> bool | None:
    """FSDP2's reshard_after_forward for an FSDP1 sharding strategy name, as `accelerate to-fsdp2` maps it."""
    try:
        from accelerate.commands.to_fsdp2 import ARGUMENT_VALUE_MAPPING
    except ImportError:
        ARGUMENT_VALUE_MAPPING = {}
    mapping = ARGUMENT_VALUE_MAPPING.get("fsdp_sharding_strategy") or {
        "FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False,
        "NO_SHARD": False}
    value = mapping.get(str(strategy).upper())
    return value if isinstance(value, bool) else None


def _fsdp2_block(ctx: CheckContext) -> dict | None:
    """The YAML's fsdp_config when accelerate launch runs FSDP2 from it, with every key fsdp_-prefixed."""
    block = ctx.acc_get("fsdp_config")
    if ctx.distributed_type != "FSDP" or not isinstance(block, dict):
        return None
    if as_int(block.get("fsdp_version", block.get("version")), 1) != 2:
        return None
    return {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): v for k, v in block.items()}


@rule("ACC-FSDP1-KEY-UNDER-FSDP2", FAMILY, "an FSDP1-only fsdp_config key under fsdp_version: 2")
def fsdp1_key_under_fsdp2(ctx: CheckContext) -> Iterable:
    block = _fsdp2_block(ctx)
    if block is None:
        return
    raw = {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): k for k in ctx.acc_get("fsdp_config")}
    for key, target in fsdp1_only_keys().items():
        if key not in block:
            continue
        value = block[key]
        what = FSDP1_UNDER_FSDP2.get(key, "accelerate's FSDP1 -> FSDP2 converter (accelerate to-fsdp2) drops it")
        name = f"fsdp_config.{raw[key]}"
        fix = "remove it"
        if key == "fsdp_sharding_strategy" and target:
            now = fsdp2_reshard_value(block.get(target, "true"))      # launch's default is "true"
            wanted = _fsdp2_equivalent(value)
            if wanted is not None and now is not None:
                same = "which it already is" if wanted == now else \
                    f"but this config runs {target}: {str(now).lower()}"
                what += f" (FSDP2's equivalent of {value} is {target}: {str(wanted).lower()}, {same})"
                fix = "remove it" if wanted == now else f"{target}: {str(wanted).lower()}, and remove {key}"
        outcome_error = _launch_error(ctx) if key == "fsdp_sync_module_states" else None
        if outcome_error and "sync_module_states" in outcome_error:
            # launch checks it against fsdp_cpu_ram_efficient_loading whatever the version: one finding, here
            yield finding(
                "error", "ACC-FSDP1-KEY-UNDER-FSDP2", ctx.acc_path, name,
                f"{key}: {value} under fsdp_version: 2: {what}, but accelerate launch still checks it beside "
                f"fsdp_cpu_ram_efficient_loading and raises {outcome_error}",
                fix="remove it (launch then takes true)", when="launch")
            continue
        yield finding(
            "warning", "ACC-FSDP1-KEY-UNDER-FSDP2", ctx.acc_path, name,
            f"{key}: {value} has no effect under fsdp_version: 2: {what}", fix=fix, when="launch")


def _launch_error(ctx: CheckContext) -> str | None:
    return getattr(launch_outcome(ctx), "error", None)


@rule("ACC-FSDP2-RESHARD-NOT-BOOL", FAMILY, "an FSDP1 strategy name as fsdp_reshard_after_forward under FSDP2")
def fsdp2_reshard_not_bool(ctx: CheckContext) -> Iterable:
    block = _fsdp2_block(ctx)
    if block is None or "fsdp_reshard_after_forward" not in block:
        return
    value = block["fsdp_reshard_after_forward"]
    if fsdp2_reshard_value(value) is not None:
        return
    wanted = _fsdp2_equivalent(value)
    fix = (f"fsdp_reshard_after_forward: {str(wanted).lower()} (FSDP2's equivalent of {value}, as `accelerate "
           f"to-fsdp2` converts it)" if wanted is not None else "fsdp_reshard_after_forward: true or false")
    name = "fsdp_config." + ("fsdp_reshard_after_forward" if "fsdp_reshard_after_forward" in ctx.acc_get("fsdp_config")
                             else "reshard_after_forward")
    what = "an FSDP1 sharding strategy" if wanted is not None else "neither true nor false"
    yield finding(
        "error", "ACC-FSDP2-RESHARD-NOT-BOOL", ctx.acc_path, name,
        f"fsdp_reshard_after_forward: {value} is {what}, but FSDP2 takes true or false here: the script's FSDP "
        f"plugin raises 'ValueError: invalid truth value {str(value).lower()}'", fix=fix, when="launch")


# ----------------------------------------------------------------------------- fp8 (accelerate 1.16: ao | te)


def _fp8_backend(ctx: CheckContext) -> str | None:
    """ao | te for a YAML training in fp8 (None: no fp8, or a backend only ACC-LAUNCH-REJECTS can name).
    Without a backend accelerate's Accelerator takes torchao, else Transformer Engine, whichever is installed."""
    if str(ctx.acc_get("mixed_precision") or "").lower() != "fp8" or ctx.distributed_type == "DEEPSPEED":
        return None
    backend = ctx.acc_get("fp8_config", "backend")
    if backend is None:
        return "auto"
    backend = str(backend).lower()
    return backend if backend in ("ao", "te") else None


def fp8_backends_here(ctx: CheckContext) -> tuple[str, ...]:
    if ctx.fp8_backends is not None:
        return tuple(ctx.fp8_backends)
    from wizard.config.fp8 import installed_fp8_backends
    return installed_fp8_backends()


@rule("ACC-FP8-UNSUPPORTED-GPU", FAMILY, "fp8 on GPUs below compute capability 8.9")
def fp8_unsupported_gpu(ctx: CheckContext) -> Iterable:
    from wizard.config.fp8 import gpu_problem

    hw = ctx.hardware
    if _fp8_backend(ctx) is None or hw is None or not hw.gpus or ctx.acc_get("use_cpu") is True:
        return
    problem = gpu_problem(hw)
    if problem is None:
        return
    yield finding(
        "error", "ACC-FP8-UNSUPPORTED-GPU", ctx.acc_path, "mixed_precision",
        f"mixed_precision: fp8, but {problem}: accelerate launches it, and the first fp8 matmul "
        f"(torch._scaled_mm, which torchao and Transformer Engine both call) fails there",
        fix="mixed_precision: bf16 (and remove fp8_config)", when="step 0")


@rule("ACC-FP8-BACKEND-MISSING", FAMILY, "fp8 with its backend not installed on this machine")
def fp8_backend_missing(ctx: CheckContext) -> Iterable:
    from wizard.config.fp8 import NAMES, PACKAGES

    backend = _fp8_backend(ctx)
    if backend is None or (ctx.hardware is not None and getattr(ctx.hardware, "source", "probe") != "probe"):
        return              # no fp8, or checked for another machine (--assume / --hardware): its software is not here
    here = fp8_backends_here(ctx)
    if (backend == "auto" and here) or backend in here:
        return
    wanted = ("torchao or Transformer Engine (accelerate picks whichever is installed)" if backend == "auto"
              else NAMES[backend])
    key = "fp8_config.backend" if backend != "auto" else "mixed_precision"
    yield finding(
        "warning", "ACC-FP8-BACKEND-MISSING", ctx.acc_path, key,
        f"fp8 through {wanted}, which is not installed on the machine where check runs: `accelerate launch` "
        f"raises 'FP8 is not available on this machine' here, and the script's Accelerator cannot build the recipe",
        fix=f"pip install {PACKAGES.get(backend, 'torchao')} on the machines that train", when="launch")


@rule("ACC-FP8-AO-RAM-EFFICIENT-LOADING", FAMILY, "torchao fp8 with FSDP's CPU-RAM-efficient loading")
def fp8_ao_ram_efficient_loading(ctx: CheckContext) -> Iterable:
    if _fp8_backend(ctx) != "ao" or ctx.distributed_type != "FSDP":
        return
    outcome = launch_outcome(ctx)
    plugin = getattr(outcome, "plugin", None)
    if plugin is None or not getattr(plugin, "cpu_ram_efficient_loading", False):
        return              # launch's own verdict (ACC-LAUNCH-REJECTS), or loading as accelerate allows it
    yield finding(
        "error", "ACC-FP8-AO-RAM-EFFICIENT-LOADING", ctx.acc_path, "fsdp_config.fsdp_cpu_ram_efficient_loading",
        "fp8 through torchao with FSDP and CPU-RAM-efficient loading: the launch passes, then the script's "
        "Accelerator raises 'torchao with FSDP2 and cpu_ram_efficient_loading is not supported'",
        fix="fsdp_cpu_ram_efficient_loading: false (or fp8_config.backend: TE)", when="prepare")


@rule("ACC-LOADER-REJECTS", FAMILY, "accelerate's own loader rejects the file")
def loader_rejects(ctx: CheckContext) -> Iterable:
    error = loader_error(ctx)
    if error is None or "unknown keys" in error:
        return              # unknown keys: ACC-UNKNOWN-KEY says which
    yield finding("error", "ACC-LOADER-REJECTS", ctx.acc_path, None,
                  f"accelerate's config loader raises: {error}",
                  fix="regenerate with `wizard` or `accelerate config`, or fix the value named above",
                  when="launch")


@rule("ACC-DS-CONFIG-FILE-MISSING", FAMILY, "deepspeed_config_file points at a missing file")
def ds_file_missing(ctx: CheckContext) -> Iterable:
    if ctx.ds_missing_ref:
        yield finding(
            "error", "ACC-DS-CONFIG-FILE-MISSING", ctx.acc_path, "deepspeed_config.deepspeed_config_file",
            f"{ctx.ds_missing_ref} does not exist: the script fails when it builds its DeepSpeed config",
            fix="point it at ds_config.json by absolute path", when="launch")
