"""Load the written files with the real libraries, on a CPU, and report what they reject.

Four stages (shared/reference/accelerate.md §4.3, deepspeed.md §3.5):

a. accelerate: `load_config_from_file`, then the real `accelerate launch` argument parser,
   `_validate_launch_command` and the `prepare_*_env` of the launcher accelerate would pick; with
   that environment applied (restored afterwards) `DeepSpeedPlugin()` or
   `FullyShardedDataParallelPlugin()` is built, as inside the training script.
b. DeepSpeed: strict JSON (duplicate keys rejected, as DeepSpeed's own loader does).
c. The trainer's "auto" filling: transformers' `HfTrainerDeepSpeedConfig.trainer_config_process`
   + `trainer_config_finalize` with the planned TrainingArguments (trainer 'hf'), or accelerate's
   own `_prepare_deepspeed` filling (trainer 'accelerate'); any "auto" left over is an error.
d. `DeepSpeedConfig(filled)` seeing the planned world size, plus the checks pydantic misses.

What is bypassed, and why (nothing else is):
- `is_port_in_use` in accelerate's prepare_*_env is answered "no". Whether a port is busy is a
  property of the launch-time machine, not of the file; accelerate itself only warns on a single
  node. A busy port on this machine, now, is reported separately as a warning.
- For a GPU plan validated on a machine without one, accelerate's device question (whichever of
  `get_torch_accelerator_backend` / `is_cuda_available` the installed version asks) answers CUDA in the
  launch environment (CUDA_VISIBLE_DEVICES for `gpu_ids`) and in the FSDP plugin (`sync_module_states`),
  and `torch.cuda.current_device()` is 0: the planned machine has them. CPU plans are checked as they are.
- DeepSpeed's `dist` is replaced, during `DeepSpeedConfig(...)` only, by a stand-in reporting
  rank 0 of the planned world size, so the batch-size assertion uses the real world size.
- `is_fp8_available` in accelerate's prepare_*_env answers "yes": whether torchao or Transformer Engine is
  installed is, like a busy port, a property of the launch-time machine (`wizard check` says it for this
  one), and the rest of an fp8 config is then still checked. So is `is_transformer_engine_available`
  while TE's recipe is built from the launch environment (its values are checked, TE itself is never imported).
Each library error becomes a Finding carrying the library's own message.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from wizard.findings import Finding
from wizard.fsutil import read_yaml_mapping

AUTO = "auto"
# Validation swaps os.environ and a few library globals for its duration: one at a time (a front
# end may run it in a worker thread).
_LOCK = threading.RLock()
# TrainingArguments defaults, for the values the plan does not choose.
HF_DEFAULTS = {"learning_rate": 5e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
               "weight_decay": 0.0}


# --------------------------------------------------------------------------------------------
# What the files should describe
# --------------------------------------------------------------------------------------------

@dataclass
class Expect:
    world_size: int
    micro_batch: int
    grad_accum: int
    max_grad_norm: float
    precision: str              # bf16 | fp16 | fp32
    trainer: str                # hf | accelerate
    use_cpu: bool
    hidden_size: int | None
    zero_stage: int | None      # None: unknown (no plan)
    offload_optimizer: str | None
    offload_param: str | None
    backend: str | None
    cpu_adam: bool | None = None  # offload rung where DeepSpeedCPUAdam steps the states (emit.cpu_adam_runs)


def _get(answers: dict, key: str, default: Any) -> Any:
    value = answers.get(key)
    return default if value is None else value


def expectations(answers: dict | None, plan, model, yaml_doc: dict | None) -> Expect:
    answers = answers or {}
    rung = plan.choice if plan is not None else None
    use_cpu = bool(_get(answers, "use_cpu", plan.topology.cpu if plan is not None else False))
    if plan is not None:
        world = int(_get(answers, "num_processes", plan.topology.world_size))
    else:
        world = int((yaml_doc or {}).get("num_processes") or 1)
    if rung is not None and rung.backend == "single":
        world = 1
    mp = answers.get("mixed_precision")
    if use_cpu:
        precision = "fp32"
    elif mp is not None:
        precision = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}.get(str(mp).lower(), "fp32")
    elif plan is not None:
        precision = plan.precision if plan.precision in ("bf16", "fp16") else "fp32"
    else:
        precision = "fp32"
    return Expect(
        world_size=world,
        micro_batch=int(_get(answers, "micro_batch", 1)),
        grad_accum=int(_get(answers, "grad_accum", 1)),
        max_grad_norm=float(_get(answers, "gradient_clipping", 1.0)),
        precision=precision,
        trainer=str(_get(answers, "trainer", "hf")),
        use_cpu=use_cpu,
        hidden_size=getattr(model, "hidden_size", None),
        zero_stage=rung.zero_stage if rung is not None else None,
        offload_optimizer=rung.offload_optimizer if rung is not None else None,
        offload_param=rung.offload_param if rung is not None else None,
        backend=rung.backend if rung is not None else None,
        cpu_adam=_cpu_adam_expected(answers, rung),
    )


def _cpu_adam_expected(answers: dict, rung) -> bool | None:
    from wizard.config.emit import cpu_adam_runs
    from wizard.errors import InputError

    if rung is None:
        return None
    try:
        return cpu_adam_runs(answers, rung)
    except InputError:          # an unknown --optimizer is reported where it is asked, not here
        return None


# --------------------------------------------------------------------------------------------
# Library loading: once per process, quietly, on the CPU
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def environ_replaced(env: dict[str, str]):
    """Replace os.environ by `env` for the block; restore it exactly afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@functools.lru_cache(maxsize=1)
def _libs() -> SimpleNamespace:
    """Import accelerate, DeepSpeed and transformers pieces once.

    DS_ACCELERATOR=cpu only while importing: DeepSpeed then picks its CPU accelerator without the
    "unable to detect" warning, and the variable does not leak into processes started later
    (a launch from this process must still find the GPUs).
    """
    from wizard.libraries import IMPORT_LOCK

    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    with IMPORT_LOCK, environ_replaced(env), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import accelerate.commands.launch as acc_launch
        import accelerate.utils.dataclasses as acc_dataclasses
        import accelerate.utils.launch as acc_utils_launch
        import deepspeed.runtime.config as ds_config
        import deepspeed.runtime.config_utils as ds_config_utils
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.commands.utils import CustomArgumentParser
        from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
        from deepspeed.accelerator import get_accelerator
        from transformers.integrations import deepspeed as hf_ds

        get_accelerator()  # resolve (and cache) the CPU accelerator while DS_ACCELERATOR is set
    for name in ("DeepSpeed", "deepspeed", "accelerate", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)

    parser = CustomArgumentParser("accelerate", allow_abbrev=False)
    subparsers = parser.add_subparsers()
    acc_launch.launch_command_parser(subparsers=subparsers)
    return SimpleNamespace(acc_launch=acc_launch, acc_utils_launch=acc_utils_launch,
                           acc_dataclasses=acc_dataclasses, load_config_from_file=load_config_from_file,
                           DeepSpeedPlugin=DeepSpeedPlugin, FSDPPlugin=FullyShardedDataParallelPlugin,
                           ds_config=ds_config, ds_config_utils=ds_config_utils, hf_ds=hf_ds, parser=parser)


def preload() -> None:
    """Import the libraries now (a front end can do it in the background while the user reads)."""
    _libs()


def _error(rule: str, file: str, key: str | None, exc_or_msg: Any, fix: str | None, when: str | None = None
           ) -> Finding:
    message = exc_or_msg if isinstance(exc_or_msg, str) else f"{type(exc_or_msg).__name__}: {exc_or_msg}"
    return Finding("error", rule, file, key, message.strip(), fix, when)


# --------------------------------------------------------------------------------------------
# a. accelerate
# --------------------------------------------------------------------------------------------

class BypassUnavailable(RuntimeError):
    """The installed accelerate asks for the machine's GPUs through no name this module knows."""


# How accelerate asks "is there a CUDA device?", newest first. 1.16 asks `get_torch_accelerator_backend()`
# (accelerate/utils/imports.py) where 1.15 and older asked `is_cuda_available()`; each module that decides
# something from the answer imports one of them into its own namespace, so that is where it is answered.
def _cuda_backend(check_available: bool = True):
    import torch
    return "cuda", torch.cuda


_DEVICE_QUESTIONS = {"get_torch_accelerator_backend": _cuda_backend, "is_cuda_available": lambda: True}


def planned_gpu_patches(libs) -> list[tuple[Any, str, Any]]:
    """(module, name, stand-in) for every place the installed accelerate asks for a CUDA device when it
    builds the FSDP plugin (utils.dataclasses: sync_module_states) and the launch environment (utils.launch:
    CUDA_VISIBLE_DEVICES; up to 1.15 it exported that without asking, so there a module may ask nothing).
    Detected, not assumed: the plugin has always asked, so when utils.dataclasses asks through no known name
    BypassUnavailable is raised and a test fails, instead of a GPU plan being judged as a CPU one; the launch
    environment is pinned by a test of what it exports."""
    patches = []
    for module in (libs.acc_dataclasses, libs.acc_utils_launch):
        patches += [(module, name, stand_in) for name, stand_in in _DEVICE_QUESTIONS.items() if hasattr(module, name)]
    if not any(module is libs.acc_dataclasses for module, _, _ in patches):
        raise BypassUnavailable(f"accelerate.utils.dataclasses (accelerate {_version('accelerate')}) has none of "
                                f"{', '.join(_DEVICE_QUESTIONS)}: cannot validate a GPU plan on this machine")
    return patches


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


@contextlib.contextmanager
def _launch_time_bypasses(libs, planned_gpus: bool):
    """The bypasses listed in the module docstring, and nothing else; undone on exit."""
    import torch

    patches = [(libs.acc_utils_launch, "is_port_in_use", lambda port=None: False)]
    if planned_gpus:
        patches += planned_gpu_patches(libs)
        patches.append((torch.cuda, "current_device", lambda: 0))
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, stand_in in patches:
            setattr(module, name, stand_in)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


@dataclass
class LaunchOutcome:
    """What `accelerate launch` and the script's plugin make of an accelerate YAML."""
    env: dict[str, str] | None          # the environment launch exports to the script (None: launch failed)
    args: Any                           # launch's argparse namespace after _validate_launch_command
    error: str | None                   # the library's own message, "Type: text"
    stage: str | None                   # "launch" | "prepare": when the error happens
    plugin: Any = None                  # the DeepSpeedPlugin / FSDP plugin the script builds
    warnings: tuple[str, ...] = ()


def accelerate_launch(yaml_path: str, planned_gpus: bool) -> LaunchOutcome:
    """The real `accelerate launch` argument parser, `_validate_launch_command` and the `prepare_*_env` of
    the launcher accelerate would pick; then, in that environment, `DeepSpeedPlugin()` or
    `FullyShardedDataParallelPlugin()` as the training script builds them. Never raises."""
    libs = _libs()
    env: dict[str, str] | None = None
    args = None
    error = stage = None
    plugin = None
    with _LOCK, warnings.catch_warnings(record=True) as caught, _fp8_backend_bypass(libs), \
            _launch_time_bypasses(libs, planned_gpus=planned_gpus), environ_replaced(dict(os.environ)):
        warnings.simplefilter("always")
        try:
            args = libs.parser.parse_args(["launch", "--config_file", yaml_path, "train.py"])
            args, defaults, mp_from_config = libs.acc_launch._validate_launch_command(args)
            # The launcher choice of accelerate.commands.launch.launch_command, verbatim in effect.
            if args.use_deepspeed and not args.cpu:
                fields = list(defaults.deepspeed_config.keys()) if defaults else []
                if mp_from_config:
                    fields.append("mixed_precision")
                args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                _, env = libs.acc_utils_launch.prepare_deepspeed_cmd_env(args)
            elif (args.use_fsdp or args.multi_gpu) and not args.cpu:
                env = libs.acc_utils_launch.prepare_multi_gpu_env(args)
            else:
                _, env = libs.acc_utils_launch.prepare_simple_launcher_cmd_env(args)
        except (Exception, SystemExit) as exc:
            error, stage = _one_line(exc), "launch"
        if env is not None:
            with environ_replaced(env):
                try:
                    if args.use_deepspeed:
                        plugin = libs.DeepSpeedPlugin()
                    elif args.use_fsdp:
                        plugin = libs.FSDPPlugin()
                    accelerator_checks(libs, args, plugin)
                except Exception as exc:   # the plugin's verdict on the config, whatever it raises, is the finding
                    error, stage = _one_line(exc), "prepare"
    texts = tuple(str(w.message) for w in caught if "already in use" not in str(w.message))
    return LaunchOutcome(env, args, error, stage, plugin, texts)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def _fp8_backend_bypass(libs):
    """prepare_*_env's "FP8 is not available on this machine" answered "available" (module docstring)."""
    saved = libs.acc_utils_launch.is_fp8_available
    libs.acc_utils_launch.is_fp8_available = lambda: True
    try:
        yield
    finally:
        libs.acc_utils_launch.is_fp8_available = saved


def accelerator_checks(libs, args, plugin) -> None:
    """In the launch environment (os.environ is it): what the script's `Accelerator(...)` builds from it
    beyond the plugin, raising what accelerate raises (1.16, accelerator.py `Accelerator.__init__`):
    - with ACCELERATE_USE_PARALLELISM_CONFIG, `ParallelismConfig()` and its `_validate_accelerator` against this
      launch (wizard.config.parallelism.verdict: the world size, the distributed type, the FSDP version);
    - with fp8, the backend enum of ACCELERATE_FP8_BACKEND (FP8BackendType: AO | TE; 1.15's MSAMP is gone) and
      the backend's recipe: TERecipeKwargs() (TE's availability answered "yes"), AORecipeKwargs() where torchao is
      installed, else its two flags read with accelerate's own parser."""
    env = os.environ
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true":
        from accelerate.parallelism_config import ParallelismConfig

        from wizard.config import parallelism
        dtype = "FSDP" if args.use_fsdp else "DEEPSPEED" if args.use_deepspeed else \
            "MULTI_GPU" if args.multi_gpu else "NO"
        parallelism.verdict(ParallelismConfig(), int(args.num_processes or 1), getattr(plugin, "fsdp_version", None),
                            dtype)
    if env.get("ACCELERATE_MIXED_PRECISION", "no").lower() != "fp8":
        return
    from accelerate.utils.environment import parse_choice_from_env, parse_flag_from_env

    dc = libs.acc_dataclasses
    raw = parse_choice_from_env("ACCELERATE_FP8_BACKEND", "NO")
    try:
        backend = dc.FP8BackendType(raw)
    except ValueError as exc:
        known = ", ".join(b.value for b in dc.FP8BackendType if b.value != "NO")
        raise ValueError(f"{exc} (fp8 backends of accelerate {_version('accelerate')}: {known}; MS-AMP was "
                         "removed in 1.16)") from exc
    if backend == dc.FP8BackendType.TE:
        saved = dc.is_transformer_engine_available
        dc.is_transformer_engine_available = lambda: True
        try:
            dc.TERecipeKwargs()
        finally:
            dc.is_transformer_engine_available = saved
    elif backend == dc.FP8BackendType.AO:
        if dc.is_torchao_available():
            dc.AORecipeKwargs()
        else:
            parse_flag_from_env("ACCELERATE_FP8_PAD_INNER_DIM", default=True)
            parse_flag_from_env("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", default=True)


def check_accelerate(yaml_path: str, exp: Expect, display: str | None = None,
                     ds_path: str | None = None, ds_display: str | None = None) -> list[Finding]:
    """Stage a: accelerate's loader, launch validation, launch environment and plugin; the YAML against the
    plan. Problems of the file itself that `wizard check` has a rule for (unquoted NO, a busy port, ...)
    are left to those rules (check/rules, run once with this file's verdicts): one problem, one id."""
    libs = _libs()
    shown = display or yaml_path
    findings: list[Finding] = []
    try:
        cfg = libs.load_config_from_file(yaml_path)
    except Exception:  # noqa: BLE001 - the loader's error is check's ACC-LOADER-REJECTS / ACC-UNKNOWN-KEY
        return []

    ds_file = (cfg.deepspeed_config or {}).get("deepspeed_config_file")
    if ds_path and ds_file and os.path.realpath(ds_file) != os.path.realpath(ds_path):
        findings.append(_error("ACC-DS-PATH", shown, "deepspeed_config.deepspeed_config_file",
                               f"points at {ds_file}, not at {ds_display or ds_path}",
                               f"set it to the absolute path {ds_display or ds_path}", "launch"))
    if ds_file and not os.path.isabs(ds_file):
        findings.append(Finding("warning", "ACC-DS-RELATIVE", shown, "deepspeed_config.deepspeed_config_file",
                                f"{ds_file} is relative: it is resolved against the directory you launch from",
                                "use an absolute path", "launch"))

    outcome = accelerate_launch(yaml_path, planned_gpus=not exp.use_cpu)
    if outcome.error is not None:
        findings.append(_error("ACC-LAUNCH-REJECTS", shown, None, outcome.error,
                               _plugin_fix(outcome.error) or "regenerate the file with the wizard", outcome.stage))
    for text in outcome.warnings:
        findings.append(Finding("warning", "ACC-WARNING", shown, None, text, None, "prepare"))
    if outcome.args is not None and cfg.num_processes not in (None, -1) and exp.backend is not None:
        if int(cfg.num_processes) != exp.world_size:
            findings.append(_error("ACC-NUM-PROCESSES", shown, "num_processes",
                                   f"{cfg.num_processes} processes, the plan is for {exp.world_size}",
                                   "num_processes is the total over all machines", "launch"))
    return findings


def _plugin_fix(exc: Exception | str) -> str | None:
    text = str(exc)
    if "will be ignored" in text:
        return "with deepspeed_config_file, keep these settings in ds_config.json only and drop them from the YAML"
    if "ZeRO optimization" in text:
        return "add a zero_optimization block to ds_config.json"
    return None


# --------------------------------------------------------------------------------------------
# b-d. DeepSpeed JSON
# --------------------------------------------------------------------------------------------

def load_ds_json(path: str) -> dict:
    """Strict JSON with DeepSpeed's duplicate-key rule (HF reads the file with plain json.load)."""
    libs = _libs()
    with open(path, encoding="utf-8") as f:
        return json.load(f, object_pairs_hook=libs.ds_config_utils.dict_raise_error_on_duplicate_keys)


def static_ds_checks(cfg: dict, file: str, exp: Expect | None = None) -> list[Finding]:
    """The ds_config against the plan. What is wrong with the file on its own (odd all-gather bucket, aio
    nested, float counts, offload_param below ZeRO-3, NVMe without a path, ZeRO-3 without 16-bit save, the
    offload optimizer) is `wizard check`'s rules' (check/rules, run once with this file's verdicts): one problem, one id."""
    out: list[Finding] = []
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict) or exp is None or exp.zero_stage is None or exp.backend != "deepspeed":
        return out
    stage = zero.get("stage", 0)
    if stage != exp.zero_stage:
        out.append(_error("DS-PLAN-STAGE", file, "zero_optimization.stage",
                          f"stage {stage!r}, the plan chose ZeRO-{exp.zero_stage}",
                          f"set it to {exp.zero_stage}", "prepare"))
    for name, planned in (("offload_optimizer", exp.offload_optimizer), ("offload_param", exp.offload_param)):
        device = (zero.get(name) or {}).get("device", "none")
        if device != planned:
            out.append(_error("DS-PLAN-OFFLOAD", file, f"zero_optimization.{name}.device",
                              f"{device!r}, the plan chose {planned!r}", f"set it to {planned!r}", "prepare"))
    offloads = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    torch_step = cfg.get("zero_force_ds_cpu_optimizer", True) in (False, "false") and "optimizer" not in cfg
    if offloads and exp.cpu_adam is False and not torch_step and "optimizer" not in cfg:
        out.append(Finding("warning", "DS-OFFLOAD-CLIENT-OPTIMIZER", file, "zero_force_ds_cpu_optimizer",
                           "optimizer offload with SGD/Adafactor built in code: accelerate swaps it for "
                           "DeepSpeedCPUAdam (Adam at your learning rate), or DeepSpeed refuses it",
                           "set zero_force_ds_cpu_optimizer to false", "prepare"))
    if exp.use_cpu and cfg.get("train_batch_size") == AUTO:
        out.append(_error("DS-CPU-TRAIN-BATCH", file, "train_batch_size",
                          "on CPU accelerate counts 1 process, so \"auto\" becomes micro*gas*1 and DeepSpeed's "
                          f"batch assertion fails with {exp.world_size} ranks", "remove train_batch_size",
                          "prepare"))
    return out


def find_autos(node: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is still "auto"."""
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out += find_autos(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += find_autos(value, f"{prefix}{i}.")
    elif node == AUTO:
        out.append(prefix[:-1])
    return out


def hf_training_args(exp: Expect, answers: dict | None = None) -> SimpleNamespace:
    """The planned TrainingArguments, as far as transformers' DeepSpeed filling reads them."""
    answers = answers or {}
    # On CPU HF/accelerate count 1 process (deepspeed.md §4.3); train_batch_size is then omitted.
    world = 1 if exp.use_cpu else exp.world_size
    values = {k: float(_get(answers, k, v)) for k, v in HF_DEFAULTS.items()}
    return SimpleNamespace(
        world_size=world, per_device_train_batch_size=exp.micro_batch,
        gradient_accumulation_steps=exp.grad_accum, max_grad_norm=exp.max_grad_norm,
        save_on_each_node=False, fp16=exp.precision == "fp16", fp16_full_eval=False,
        bf16=exp.precision == "bf16", bf16_full_eval=False,
        get_warmup_steps=lambda n: 0, **values)


def fill_like_hf_trainer(cfg: dict, exp: Expect, answers: dict | None = None, num_training_steps: int = 1000
                         ) -> dict:
    """transformers' two-stage "auto" filling (TrainingArguments, then deepspeed_init). Raises ValueError."""
    libs = _libs()
    hf = libs.hf_ds.HfTrainerDeepSpeedConfig(copy.deepcopy(cfg))
    try:
        args = hf_training_args(exp, answers)
        hf.trainer_config_process(args)
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=exp.hidden_size)
                                if exp.hidden_size else SimpleNamespace())
        hf.trainer_config_finalize(args, model, num_training_steps)
        return hf.config
    finally:
        libs.hf_ds.unset_hf_deepspeed_config()


def fill_like_accelerate(cfg: dict, exp: Expect) -> dict:
    """accelerate's filling for an own loop: DeepSpeedPlugin, set_mixed_precision and the
    `_prepare_deepspeed` step for prepare(model, optimizer, dataloader) with a torch optimizer.
    Raises ValueError ("`key` not found in kwargs ...") for an "auto" accelerate cannot fill.
    """
    libs = _libs()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    # What `accelerate launch` exports for a YAML with deepspeed_config_file and no mixed_precision.
    env.update({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_MIXED_PRECISION": "no",
                "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero3_init_flag"})
    with environ_replaced(env), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plugin = libs.DeepSpeedPlugin(hf_ds_config=copy.deepcopy(cfg))
        plugin.set_mixed_precision("no")
        plugin.fill_match("gradient_accumulation_steps", must_match=False,
                          gradient_accumulation_steps=exp.grad_accum)
        gas = plugin.get_value("gradient_accumulation_steps")
        micro = exp.micro_batch if plugin.is_auto("train_micro_batch_size_per_gpu") \
            else plugin.get_value("train_micro_batch_size_per_gpu")
        num_processes = 1 if exp.use_cpu else exp.world_size
        kwargs: dict[str, Any] = {
            "gradient_clipping": 1.0,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
            "train_micro_batch_size_per_gpu": micro,
            "train_batch_size": micro * gas * num_processes,
        }
        h = exp.hidden_size
        if h:
            kwargs.update({"zero_optimization.reduce_bucket_size": h * h,
                           "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * h * h),
                           "zero_optimization.stage3_param_persistence_threshold": 10 * h})
        plugin.deepspeed_config["zero_allow_untested_optimizer"] = True   # a torch optimizer was passed
        plugin.deepspeed_config_process(must_match=False, **kwargs)
        filled = plugin.deepspeed_config
    filled.pop("steps_per_print", None)   # accelerate's float("inf") is not JSON; irrelevant here
    return filled


def _filled_precision_check(filled: dict, exp: Expect, file: str, filler: str) -> list[Finding]:
    """The dtype DeepSpeed will train in, after filling, is the one the memory plan assumed."""
    if exp.backend != "deepspeed":
        return []

    def enabled(block: str) -> bool:
        return str((filled.get(block) or {}).get("enabled", False)).lower() == "true"

    actual = "bf16" if enabled("bf16") else "fp16" if enabled("fp16") else "fp32"
    if actual == exp.precision:
        return []
    return [_error("DS-PLAN-PRECISION", file, f"{exp.precision if exp.precision != 'fp32' else actual}.enabled",
                   f"after {filler}'s filling DeepSpeed trains in {actual}, the plan is for {exp.precision}",
                   f"set {exp.precision}.enabled to true" if exp.precision != "fp32" else
                   f"set {actual}.enabled to false", "prepare")]


class _WorldStandIn:
    """deepspeed.comm as DeepSpeedConfig sees it: rank 0 of the planned world."""

    def __init__(self, world_size: int):
        self._world = world_size

    def get_rank(self, group=None) -> int:
        return 0

    def get_world_size(self, group=None) -> int:
        return self._world


def deepspeed_config_check(filled: dict, world_size: int) -> None:
    """Build DeepSpeed's own DeepSpeedConfig from the filled dict at the planned world size. Raises."""
    libs = _libs()
    module = libs.ds_config
    saved = module.dist
    module.dist = _WorldStandIn(world_size)
    try:
        module.DeepSpeedConfig(copy.deepcopy(filled))
    finally:
        module.dist = saved


def check_deepspeed(ds_path: str, exp: Expect, answers: dict | None = None, display: str | None = None
                    ) -> list[Finding]:
    """Stages b-d for ds_config.json."""
    shown = display or ds_path
    try:
        cfg = load_ds_json(ds_path)
    except FileNotFoundError:
        return [_error("ACC-DS-CONFIG-FILE-MISSING", shown, None, f"{shown} does not exist",
                       "write it (the YAML points at it)", "launch")]
    except ValueError as exc:   # json.JSONDecodeError and the duplicate-key rule
        return [_error("DS-JSON", shown, None, exc, "write strict JSON: no comments, no duplicate keys", "launch")]
    if not isinstance(cfg, dict):
        return [_error("DS-JSON", shown, None, "the top level is not an object", None, "launch")]

    findings = static_ds_checks(cfg, shown, exp)
    try:
        if exp.trainer == "accelerate":
            filled = fill_like_accelerate(cfg, exp)
            filler = "accelerate"
        else:
            filled = fill_like_hf_trainer(cfg, exp, answers)
            filler = "transformers"
    except Exception as exc:    # transformers' / accelerate's filling on the user's values: whatever it raises
        findings.append(_error("DS-TRAINER-MISMATCH", shown, None, exc,
                               "set these values to \"auto\" or to the planned values", "prepare"))
        return findings
    leftovers = find_autos(filled)
    for key in leftovers:
        findings.append(_error("DS-AUTO-UNFILLED", shown, key,
                               f"\"auto\" is left after {filler}'s filling: DeepSpeed would silently use its default "
                               "there (or crash, at the top level)", "write a concrete value", "prepare"))
    if leftovers:
        return findings
    findings += _filled_precision_check(filled, exp, shown, filler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            deepspeed_config_check(filled, exp.world_size)
    except Exception as exc:   # DeepSpeed's verdict: ValidationError, AssertionError, TypeError, AttributeError, ...
        findings.append(_error("DS-LIBRARY-REJECTS", shown, None, exc, "see DeepSpeed's message", "prepare"))
    return findings


# --------------------------------------------------------------------------------------------
# Entry point (the check layer's "plan" rule calls it: check/rules/planned.py)
# --------------------------------------------------------------------------------------------

def library_findings(yaml_path: str, ds_path: str | None, answers: dict | None, plan, model, *,
                     yaml_display: str | None = None, ds_display: str | None = None) -> list[Finding]:
    """accelerate, DeepSpeed and transformers on the pair of files, judged against the plan they were written
    for; [] means the libraries accept them as planned.

    `ds_path` None: the DeepSpeed file is the one the YAML names (if any). The *_display names are
    what findings report as `file` (the final paths, when the files are validated from a scratch dir).
    """
    with _LOCK:
        yaml_doc = read_yaml_mapping(yaml_path)
        exp = expectations(answers, plan, model, yaml_doc)
        findings = check_accelerate(yaml_path, exp, display=yaml_display, ds_path=ds_path, ds_display=ds_display)
        if ds_path is None and yaml_doc and isinstance(yaml_doc.get("deepspeed_config"), dict):
            ds_path = yaml_doc["deepspeed_config"].get("deepspeed_config_file")
            ds_display = ds_display or ds_path
        if ds_path:
            findings += check_deepspeed(ds_path, exp, answers, display=ds_display)
        return findings
