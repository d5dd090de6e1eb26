"""Rules on the DeepSpeed JSON, including what transformers' and accelerate's `"auto"` filling does to it.

Facts (DeepSpeed 0.19.8, transformers 5.24, accelerate 1.15; checked in tests/unit/test_check_library_facts.py):
- `DeepSpeedConfig` on a path rejects duplicate keys; transformers and accelerate read the file
  with plain `json.load`, which keeps the last value silently;
- the sub-configs are pydantic models: unknown keys (`aio` inside `zero_optimization`) and fractional
  floats for integer fields raise, `"auto"` is dropped to the default (`"stage": "auto"` -> 0);
  unknown top-level keys are ignored;
- through accelerate, `DeepSpeedPlugin` replaces `"auto"` in the stage / offload / save-16bit keys with
  its own defaults (stage 2, "none", False), and at `prepare` any `"auto"` nobody filled raises
  "`<key>` not found in kwargs";
- ZeRO-1/2 assert an even `allgather_bucket_size` and never read `offload_param`;
- ZeRO-Offload with an optimizer built in code: `deepspeed.initialize` raises ZeRORuntimeException unless
  `zero_force_ds_cpu_optimizer` is false, and accelerate avoids that by swapping the optimizer for
  DeepSpeedCPUAdam (keeping only lr and weight_decay); with false, the torch optimizer steps the offloaded
  states on the CPU, which DeepSpeed calls slow. An "optimizer" block makes DeepSpeed build DeepSpeedCPUAdam.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from wizard.check.rules.common import (MAX_FINDINGS_PER_RULE, CheckContext, as_int, finding, fixer, more_like_these,
                                       older, rule, walk)

FAMILY = "deepspeed"

# Keys DeepSpeedPlugin.__post_init__ fills from ACCELERATE_* variables or its own defaults when they are "auto".
PLUGIN_DEFAULTED = (
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
)

# Offload with these optimizer names (HF `optim`) keeps the same algorithm when accelerate swaps in DeepSpeedCPUAdam.
ADAM_LIKE = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw", "adam", "adamw_apex_fused")

# Keys accelerate adds to the config itself (not read by DeepSpeedConfig).
EXTRA_TOP_LEVEL = frozenset({"msamp"})

# Known top-level keys of DeepSpeed 0.19.8 (used only if reading them from the installed library fails).
FALLBACK_DEEPSPEED = (0, 19, 8)
FALLBACK_TOP_LEVEL = frozenset("""
activation_checkpointing aio amp autotuning bf16 bfloat16 checkpoint comet comms_logger communication_data_type
compile compression_training csv_monitor curriculum_learning data_efficiency data_types dataloader_drop_last
datastates_ckpt disable_allgather disable_python_gc dump_state eigenvalue elasticity expert_parallel flops_profiler
fp16 gradient_accumulation_steps gradient_allreduce_op gradient_clipping gradient_predivide_factor graph_harvesting
hybrid_engine log_level managed_gradient_accumulation memory_breakdown nebula optimizer pipeline prescale_gradients
progressive_layer_drop quantize_training scheduler seq_parallel_communication_data_type sparse_attention
sparse_gradients steps_per_print tensor_parallel tensorboard timers torch_autocast train_batch_size
train_micro_batch_size_per_gpu use_data_before_expert_parallelism vocabulary_size wall_clock_breakdown wandb
weight_quantization zero_allow_untested_optimizer zero_force_ds_cpu_optimizer zero_optimization
""".split())


def _file(ctx: CheckContext) -> str | None:
    return ctx.ds_path


def _applies(ctx: CheckContext) -> bool:
    return ctx.ds is not None


# ----------------------------------------------------------------------------- library knowledge


@functools.lru_cache(maxsize=1)
def known_top_level_keys() -> frozenset[str]:
    """Every top-level key the installed DeepSpeedConfig reads, recorded while it parses a minimal config."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except Exception:  # noqa: BLE001 - DeepSpeed missing or broken: use the list for 0.19.8
        return FALLBACK_TOP_LEVEL | EXTRA_TOP_LEVEL
    seen: set[str] = set()

    class _Keys:
        def __init__(self, d: dict) -> None:
            self._d = d

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return key in self._d

        def __iter__(self) -> Iterator:
            return iter(self._d)

        def __len__(self) -> int:
            return len(self._d)

    class _Recording(dict):
        def get(self, key, default=None):  # type: ignore[override]
            seen.add(str(key))
            return super().get(key, default)

        def __getitem__(self, key):
            seen.add(str(key))
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

        def keys(self):  # type: ignore[override]
            return _Keys(dict(self))

    try:
        with _quiet_deepspeed():
            DeepSpeedConfig(_Recording({"train_batch_size": 1}))
    except Exception:  # noqa: BLE001 - a DeepSpeed version that reads the dict otherwise: use the list
        return FALLBACK_TOP_LEVEL | EXTRA_TOP_LEVEL
    return frozenset(seen) | EXTRA_TOP_LEVEL


# Key path -> the first DeepSpeed release whose config models read it, found by reading each release's sdist
# (the release before it lacks the field: 0.12.2 / 0.17.6 / 0.17.4 have no such field, 0.16.3 no top-level
# `tensor_parallel`, 0.16.5 no top-level `compile`). Only a finding's words use it: whether a key is known
# comes from the installed DeepSpeed's models (ds_schema), so a DeepSpeed that adds a key is followed
# without an edit here.
KEY_INTRODUCED = {
    "zero_optimization.offload_optimizer.ratio": "0.12.3",
    "zero_optimization.offload_optimizer.super_offload": "0.18.0",
    "zero_optimization.zenflow": "0.17.5",
    "tensor_parallel.autotp_size": "0.16.4",
    "compile.deepcompile": "0.16.6",
}

_PROBE = "__wizard_probe__"


@dataclass(frozen=True, eq=False)     # hashed by identity: the per-schema indexes below are cached on it
class DsSchema:
    """What the installed DeepSpeed's config models accept, read from the models themselves.

    sections: dotted path -> the pydantic model that validates the dict at that path (zero_optimization ->
    DeepSpeedZeroConfig, zero_optimization.offload_optimizer -> DeepSpeedZeroOffloadOptimizerConfig, ...).
    A top-level section without a model is read key by key, and DeepSpeed ignores what it does not read.
    prefixes: model name (a ValidationError's title) -> where the model's own fields sit ("" for the top level).
    """
    version: str
    top_level: frozenset[str]
    sections: dict[str, Any]
    prefixes: dict[str, str]


@dataclass(frozen=True)
class KeyStatus:
    known: bool
    missing: str | None = None     # the first part of the path DeepSpeed does not know
    model: str | None = None       # the model that lacks it; None: the top level (read key by key)
    rejects: bool = False          # the model forbids unknown keys (raises); False: silently dropped


@functools.lru_cache(maxsize=1)
def ds_schema() -> DsSchema | None:
    """The installed DeepSpeed's config models: which model validates which section, found by handing
    DeepSpeedConfig each top-level section with one key no model has, and reading which model rejects it
    (a section whose model forbids extras raises; one read key by key ignores it). None without DeepSpeed."""
    try:
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig
        from pydantic import BaseModel
    except Exception:  # noqa: BLE001 - DeepSpeed missing or broken
        return None
    models = {cls.__name__: cls for cls in _subclasses(BaseModel)}
    sections: dict[str, Any] = {}
    prefixes: dict[str, str] = {}
    top = known_top_level_keys()
    for key in sorted(top):
        try:
            with _quiet_deepspeed(), contextlib.redirect_stdout(None):
                DeepSpeedConfig({"train_batch_size": 1, key: {_PROBE: 0}})
        except Exception as exc:  # noqa: BLE001 - a section that is no dict raises something else: no model
            errors, title = getattr(exc, "errors", None), getattr(exc, "title", None)
            if not callable(errors) or title not in models:
                continue
            for e in errors():
                loc = tuple(str(p) for p in e.get("loc", ()))
                if e.get("type") != "extra_forbidden" or not loc or loc[-1] != _PROBE:
                    continue
                model = _follow(models[title], loc[:-1])
                if model is not None:
                    sections[key] = model
                    inner = ".".join(loc[:-1])   # DeepSpeedMonitorConfig validates the top level: ("wandb", probe)
                    prefixes.setdefault(title, "" if inner == key else key)
    for path, model in list(sections.items()):
        _nested(path, model, sections, depth=0)
    return DsSchema(str(getattr(deepspeed, "__version__", "") or "").strip(), top, sections, prefixes)


def _subclasses(cls) -> list:
    out, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            out.append(sub)
            stack.append(sub)
    return out


def _model_in(annotation: Any):
    """The pydantic model an annotation holds (Optional[Model], Model, Union[..., Model]), else None."""
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def field_keys(model) -> dict[str, str]:
    """JSON key -> field name of a model: each field's name and its alias (populate_by_name takes both)."""
    out = {}
    for name, info in model.model_fields.items():
        out[name] = name
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                out[alias] = name
    return out


def _follow(model, loc: tuple[str, ...]):
    for part in loc:
        name = field_keys(model).get(part)
        if name is None:
            return None
        model = _model_in(model.model_fields[name].annotation)
        if model is None:
            return None
    return model


def _nested(path: str, model, sections: dict[str, Any], depth: int) -> None:
    if depth > 8:
        return
    for key, name in field_keys(model).items():
        sub = _model_in(model.model_fields[name].annotation)
        if sub is not None and f"{path}.{key}" not in sections:
            sections[f"{path}.{key}"] = sub
            _nested(f"{path}.{key}", sub, sections, depth + 1)


def forbids_extra(model) -> bool:
    return (getattr(model, "model_config", None) or {}).get("extra") == "forbid"


def key_status(dotted: str, schema: DsSchema | None = None) -> KeyStatus:
    """Whether the installed DeepSpeed reads `dotted`, and if not, where it stops and what it does then."""
    schema = schema or ds_schema()
    parts = dotted.split(".")
    if schema is None:
        return KeyStatus(True)
    if parts[0] not in schema.top_level:
        return KeyStatus(False, parts[0], None, rejects=False)
    for i in range(1, len(parts)):
        model = schema.sections.get(".".join(parts[:i]))
        if model is None:
            return KeyStatus(True)      # a section read key by key, or a free-form dict: not judged here
        if parts[i] not in field_keys(model):
            return KeyStatus(False, ".".join(parts[:i + 1]), model.__name__, rejects=forbids_extra(model))
    return KeyStatus(True)


def where_it_belongs(dotted: str, schema: DsSchema | None = None) -> list[str]:
    """For a key DeepSpeed does not know at `dotted`: the paths where a key of that name is read (a key put
    in the wrong block), else the close spellings beside it (a typo)."""
    import difflib

    schema = schema or ds_schema()
    if schema is None:
        return []
    parent, _, leaf = dotted.rpartition(".")
    elsewhere = [p for p in _paths_by_leaf(schema).get(leaf, ()) if p != dotted]
    if elsewhere:
        return elsewhere if len(elsewhere) <= 3 else []     # "enabled" is read in a dozen blocks: no hint
    model = schema.sections.get(parent) if parent else None
    names = list(field_keys(model)) if model is not None else (sorted(schema.top_level) if not parent else [])
    close = difflib.get_close_matches(leaf, [n for n in names if n != leaf], n=2, cutoff=0.75)
    return [f"{parent}.{c}" if parent else c for c in close]


@functools.lru_cache(maxsize=4)
def _paths_by_leaf(schema: DsSchema) -> dict[str, list[str]]:
    """Every key path the schema reads, by its last part (sorted): built once, so judging N unknown keys costs
    N lookups, not N walks of every model (a file of 200,000 unknown keys took minutes)."""
    paths = set(schema.top_level)
    for path, model in schema.sections.items():
        paths.update(f"{path}.{key}" for key in field_keys(model))
    out: dict[str, list[str]] = {}
    for path in sorted(paths):
        out.setdefault(path.rpartition(".")[2], []).append(path)
    return out


@functools.lru_cache(maxsize=1)
def zero_int_fields() -> dict[str, str]:
    """JSON key (alias and name) -> field name, for every integer field of DeepSpeedZeroConfig."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    out = {}
    for name, info in DeepSpeedZeroConfig.model_fields.items():
        if info.annotation is int:
            out[name] = name
            if info.alias:
                out[info.alias] = name
    return out


@contextlib.contextmanager
def _quiet_deepspeed() -> Iterator[None]:
    import logging

    loggers = [logging.getLogger(n) for n in ("DeepSpeed", "deepspeed")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def aio_available() -> bool:
    """DeepSpeed's async I/O op (NVMe offload) can be built or is installed here."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder
        with _quiet_deepspeed(), contextlib.redirect_stdout(None):
            return bool(AsyncIOBuilder().is_compatible(verbose=False))
    except Exception:  # noqa: BLE001 - the op builder imports torch's cpp_extension and probes a compiler
        return False


# ----------------------------------------------------------------------------- "auto" filling


@dataclass
class Mismatch:
    ds_key: str
    ds_value: Any
    hf_key: str
    hf_value: Any


@dataclass
class FillResult:
    filled: dict[str, Any]
    mismatches: list[Mismatch] = field(default_factory=list)
    plugin_defaults: dict[str, Any] = field(default_factory=dict)   # "auto" -> accelerate's fixed default
    unfilled: list[str] = field(default_factory=list)                # "auto" nobody fills: error at prepare
    plugin_error: str | None = None                                  # DeepSpeedPlugin itself raised


@contextlib.contextmanager
def _clean_accelerate_env() -> Iterator[None]:
    """DeepSpeedPlugin reads ACCELERATE_* variables; run it as a fresh script would see them."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
    for k in saved:
        del os.environ[k]
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("ACCELERATE_")]:
            del os.environ[k]
        os.environ.update(saved)


def _training_namespace(ctx: CheckContext) -> types.SimpleNamespace:
    """TrainingArguments as the fill reads them: the user's values over the dataclass defaults."""
    from transformers import TrainingArguments

    from wizard.check.rules.common import trainer_defaults

    values = dict(trainer_defaults(ctx.trainer, ctx.ta))
    if ctx.ta is None:
        # TrainingArguments not given: assume the script passes what the ds_config states (the comparison
        # needs --training-args), so the batch arithmetic is the one the config means
        values.update(_implied_training_args(ctx))
    values.update(ctx.ta or {})
    if values.get("activation_checkpointing") is None:
        values["activation_checkpointing"] = bool(values.get("gradient_checkpointing"))
    ns = types.SimpleNamespace(**values)
    ns.world_size = ctx.num_processes
    ns.get_warmup_steps = types.MethodType(TrainingArguments.get_warmup_steps, ns)
    return ns


# ds_config key -> the TrainingArguments field transformers compares it with
IMPLIED_TA = {"gradient_accumulation_steps": "gradient_accumulation_steps",
              "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
              "gradient_clipping": "max_grad_norm"}


def _implied_training_args(ctx: CheckContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ds_key, ta_key in IMPLIED_TA.items():
        value = ctx.ds_get(ds_key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[ta_key] = value
    for block in ("bf16", "fp16"):
        if ctx.ds_get(f"{block}.enabled") is True:
            out[block] = True
    return out


def _autos(cfg: dict[str, Any]) -> set[str]:
    return {path for path, value in walk(cfg) if value == "auto"}


def fill_analysis(ctx: CheckContext) -> FillResult | None:
    """Run the real "auto" filling of the chosen trainer over a copy of the ds config.

    hf: transformers' HfTrainerDeepSpeedConfig.trainer_config_process + trainer_config_finalize, then
    accelerate's DeepSpeedPlugin and its prepare-time fill. accelerate: the last two only. The
    prepare-time kwargs are the ones Accelerator._prepare_deepspeed builds for a model with
    config.hidden_size, a DataLoader with a batch size, DummyOptim/DummyScheduler(total_num_steps=...)
    when the config has an optimizer/scheduler, and a torch optimizer otherwise.
    """
    if ctx.ds is None:
        return None
    if "fill" in ctx.cache:
        return ctx.cache["fill"]
    result = _fill(ctx)
    ctx.cache["fill"] = result
    return result


def _fill(ctx: CheckContext) -> FillResult:
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    cfg = copy.deepcopy(ctx.ds)
    result = FillResult(filled=cfg)
    hidden = ctx.model.hidden_size if ctx.model is not None else 1024   # placeholder: "auto" is filled either way

    class Recording(HfTrainerDeepSpeedConfig):
        """The real class; fill_match also records each mismatch with both values."""

        unknown: set[str] = set()

        def fill_match(self, ds_key_long, hf_val, hf_key=None, must_match=True):
            if ds_key_long in self.unknown:
                must_match = False     # the TrainingArguments side is not known before the run
            config, ds_key = self.find_config_node(ds_key_long)
            before = config.get(ds_key) if config is not None else None
            count = len(self.mismatches)
            super().fill_match(ds_key_long, hf_val, hf_key, must_match)
            if len(self.mismatches) > count:
                result.mismatches.append(Mismatch(ds_key_long, before, hf_key or ds_key_long, hf_val))

    with _clean_accelerate_env(), _quiet_deepspeed():
        if ctx.hf_trainer:
            args = _training_namespace(ctx)
            unknown: set[str] = set()
            steps = as_int(getattr(args, "max_steps", -1), -1) or -1
            if steps <= 0:
                unknown.add("scheduler.params.total_num_steps")
                if 0 < float(args.warmup_steps or 0) < 1:
                    unknown.add("scheduler.params.warmup_num_steps")
                explicit = ctx.ds_get("scheduler.params.total_num_steps")
                steps = explicit if isinstance(explicit, int) and explicit > 0 else 1000
            if ctx.acc is None:
                unknown.add("train_batch_size")   # world size unknown without the accelerate config
            Recording.unknown = unknown
            hf = Recording(cfg)
            try:
                hf.trainer_config_process(args, auto_find_batch_size=bool(getattr(args, "auto_find_batch_size", False)))
                hf.trainer_config_finalize(args, types.SimpleNamespace(
                    config=types.SimpleNamespace(hidden_size=hidden)), steps)
            except ValueError:
                pass                   # the mismatch list, already recorded one by one
            finally:
                unset_hf_deepspeed_config()
            cfg = hf.config
        before = _autos(cfg)
        try:
            plugin = DeepSpeedPlugin(hf_ds_config=cfg)
        except Exception as exc:  # noqa: BLE001 - whatever accelerate raises on the user's config is the finding
            result.plugin_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            result.filled = cfg
            return result
        finally:
            unset_hf_deepspeed_config()
        cfg = plugin.deepspeed_config
        for path in sorted(before - _autos(cfg)):
            if path in PLUGIN_DEFAULTED:
                result.plugin_defaults[path] = _get(cfg, path)
        precision = "no"
        if ctx.hf_trainer and (ctx.ta is not None or ctx.trainer == "trl"):
            precision = "bf16" if ctx.ta_value("bf16") else "fp16" if ctx.ta_value("fp16") else "no"
        with contextlib.suppress(ValueError):
            plugin.set_mixed_precision(precision)
        if ctx.trainer == "accelerate":
            for key in ("fp16.enabled", "bf16.enabled"):
                # own loop: precision comes from --mixed_precision / Accelerator(mixed_precision=...)
                node, leaf = plugin.hf_ds_config.find_config_node(key)
                if node is not None and node.get(leaf) == "auto":
                    node[leaf] = False
        kwargs = _prepare_kwargs(plugin, hidden, ctx.num_processes)
        for _ in range(200):
            try:
                plugin.deepspeed_config_process(must_match=False, **kwargs)
                break
            except ValueError as exc:
                key = _not_found_key(str(exc))
                if key is None:
                    break
                result.unfilled.append(key)
                node, leaf = plugin.hf_ds_config.find_config_node(key)
                node[leaf] = None      # what is left after the error: move on to the next one
        result.filled = plugin.deepspeed_config
    return result


def _prepare_kwargs(plugin, hidden: int, num_processes: int = 1) -> dict[str, Any]:
    """The kwargs Accelerator._prepare_deepspeed passes to deepspeed_config_process (accelerate 1.15)."""
    gas = plugin.get_value("gradient_accumulation_steps")
    gas = gas if isinstance(gas, int) else 1
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=gas)
    micro = plugin.get_value("train_micro_batch_size_per_gpu")
    micro = micro if isinstance(micro, int) else 1          # from the DataLoader's batch size
    kwargs: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * gas * num_processes,     # batch_size_per_device * gas * num_processes
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
    }
    config = plugin.deepspeed_config
    if "optimizer" in config:                                # DummyOptim
        kwargs.update({"optimizer.params.lr": 1e-3, "optimizer.params.weight_decay": 0.0})
    if "scheduler" in config:                                # DummyScheduler(total_num_steps=...)
        kwargs.update({"scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": 1e-3,
                       "scheduler.params.warmup_num_steps": 1, "scheduler.params.total_num_steps": 1000})
    return kwargs


def _not_found_key(message: str) -> str | None:
    # "`zero_optimization.sub_group_size` not found in kwargs. ..."
    if "not found in kwargs" not in message or not message.startswith("`"):
        return None
    return message[1:].split("`", 1)[0]


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


# ----------------------------------------------------------------------------- rules


@rule("DS-DUPLICATE-KEY", FAMILY, "duplicate keys in the JSON")
def duplicate_keys(ctx: CheckContext) -> Iterable:
    for parent, key in ctx.ds_duplicates:
        name = f"{parent}.{key}" if parent else key
        yield finding(
            "error", "DS-DUPLICATE-KEY", _file(ctx), name,
            f"'{name}' appears more than once: DeepSpeed's own loader raises 'Duplicate keys in DeepSpeed config', "
            f"while transformers and accelerate read the file with json.load and silently keep the last value",
            fix="keep one entry", when="launch")


@rule("DS-NO-ZERO-OPTIMIZATION", FAMILY, "no zero_optimization section (accelerate requires one)")
def no_zero_section(ctx: CheckContext) -> Iterable:
    if not _applies(ctx) or "zero_optimization" in ctx.ds:
        return
    yield finding(
        "error", "DS-NO-ZERO-OPTIMIZATION", _file(ctx), "zero_optimization",
        "no zero_optimization section: accelerate's DeepSpeedPlugin raises 'Please specify the ZeRO optimization "
        "config in the DeepSpeed config.' when the script builds its Accelerator / TrainingArguments",
        fix='add "zero_optimization": {"stage": N}', when="launch")


@rule("DS-AUTO-IN-SUBCONFIG", FAMILY, "\"auto\" in a sub-config that becomes a fixed default, not your value")
def auto_in_subconfig(ctx: CheckContext) -> Iterable:
    fill = fill_analysis(ctx) if _applies(ctx) else None
    if fill is None:
        return
    for key, value in fill.plugin_defaults.items():
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "stage":
            what = (f'DeepSpeed alone silently drops it to stage 0 (no sharding at all) and accelerate\'s '
                    f'DeepSpeedPlugin replaces it with ACCELERATE_DEEPSPEED_ZERO_STAGE or {value}: neither comes '
                    f'from your memory needs')
            fix = 'write the stage the plan needs: "stage": 2 or 3'
        elif leaf == "stage3_gather_16bit_weights_on_model_save":
            what = (f"accelerate fills it with {value}: under ZeRO-3 the saved model is then unusable without "
                    f"zero_to_fp32.py")
            fix = "write true (ZeRO-3) or false"
        else:
            what = f"nothing fills it from your setup: accelerate's DeepSpeedPlugin silently writes {value!r}"
            fix = "write the value you mean"
        # the save-time gather only decides what a save writes (as DS-ZERO3-NO-16BIT-SAVE, a warning)
        yield finding("warning" if leaf.startswith("stage3_gather") else "error", "DS-AUTO-IN-SUBCONFIG",
                      _file(ctx), key,
                      f'"{key}": "auto" is not a value anyone fills; {what}', fix=fix,
                      when="save" if leaf.startswith("stage3_gather") else "launch")


@rule("DS-AUTO-UNFILLED", FAMILY, "\"auto\" the chosen trainer will not fill")
def auto_unfilled(ctx: CheckContext) -> Iterable:
    fill = fill_analysis(ctx) if _applies(ctx) else None
    if fill is None or fill.plugin_error:
        return
    trainer = "HF Trainer" if ctx.hf_trainer else "an own Accelerate loop (accelerator.prepare)"
    for key in fill.unfilled:
        own = _auto_is_the_default(key)
        yield finding(
            "error", "DS-AUTO-UNFILLED", _file(ctx), key,
            f'"{key}": "auto" is filled by neither transformers nor accelerate with {trainer}: at prepare '
            f"accelerate raises '`{key}` not found in kwargs' (DeepSpeed alone would crash or silently use its "
            f"default)" + (f'; "auto" is a value of DeepSpeed\'s own here ({own}\'s default), which accelerate '
                           f'takes for its placeholder' if own else ""),
            fix='remove the key: DeepSpeed\'s default is "auto" already' if own else "write a concrete value",
            when="prepare")


def _auto_is_the_default(dotted: str) -> str | None:
    """The model whose field at `dotted` defaults to the string "auto" (ZenFlowConfig.select_strategy), else None."""
    schema = ds_schema()
    parent, _, leaf = dotted.rpartition(".")
    model = schema.sections.get(parent) if schema is not None and parent else None
    name = field_keys(model).get(leaf) if model is not None else None
    if name is None:
        return None
    return model.__name__ if model.model_fields[name].default == "auto" else None


# Not fixable: each side is a value someone set (the TrainingArguments' one, or their default, against a ds_config
# number), and README promises --fix never overrides a value you set: the finding names both, the user chooses.
@rule("DS-TRAINER-MISMATCH", FAMILY, "explicit ds_config values that disagree with TrainingArguments")
def trainer_mismatch(ctx: CheckContext) -> Iterable:
    if not _applies(ctx) or ctx.ta is None or not ctx.hf_trainer:
        return
    fill = fill_analysis(ctx)
    for m in fill.mismatches:
        when = "step 0" if m.ds_key.startswith("scheduler.params.total") or m.ds_key.endswith("warmup_num_steps") \
            else "launch"
        yield finding(
            "error", "DS-TRAINER-MISMATCH", _file(ctx), m.ds_key,
            f"ds {m.ds_key}={m.ds_value!r} but TrainingArguments {m.hf_key}={m.hf_value!r}: transformers raises "
            f"'Please correct the following DeepSpeed config values that mismatch TrainingArguments values' "
            f"(all mismatches are listed here at once)",
            fix=f'choose one: set "{m.ds_key}": "auto" (the Trainer then uses {m.hf_value!r}), or '
                f'{m.hf_key}={m.ds_value!r} in the TrainingArguments (--fix leaves the choice to you)', when=when)


@rule("DS-FLOAT-BUCKET", FAMILY, "fractional float for an integer bucket/threshold", fixable=True)
def float_bucket(ctx: CheckContext) -> Iterable:
    for key, value in _float_ints(ctx):
        yield finding(
            "error", "DS-FLOAT-BUCKET", _file(ctx), f"zero_optimization.{key}",
            f"{key}={value!r} is not an integer: DeepSpeedZeroConfig raises 'Input should be a valid integer, got "
            f"a number with a fractional part' when deepspeed.initialize builds the config",
            fix=f"{key}: {int(value)}", when="prepare", fixable=True)


def _float_ints(ctx: CheckContext) -> list[tuple[str, float]]:
    zero = ctx.ds_get("zero_optimization") if _applies(ctx) else None
    if not isinstance(zero, dict):
        return []
    ints = zero_int_fields()
    return [(k, v) for k, v in zero.items()
            if k in ints and isinstance(v, float) and math.isfinite(v) and not v.is_integer()]


@fixer("DS-FLOAT-BUCKET")
def fix_float_bucket(ctx: CheckContext, findings: list) -> list[str]:
    changed = []
    for key, value in _float_ints(ctx):
        ctx.ds["zero_optimization"][key] = int(value)
        changed.append(f"zero_optimization.{key}: {value!r} -> {int(value)}")
    return changed


@rule("DS-ODD-ALLGATHER-BUCKET", FAMILY, "odd allgather_bucket_size with ZeRO-1/2", fixable=True)
def odd_allgather(ctx: CheckContext) -> Iterable:
    value = _odd_allgather(ctx)
    if value is not None:
        yield finding(
            "error", "DS-ODD-ALLGATHER-BUCKET", _file(ctx), "zero_optimization.allgather_bucket_size",
            f"allgather_bucket_size={value} is odd: the ZeRO-1/2 optimizer asserts 'allgather_bucket_size must be "
            f"a multiple of nccl_start_alignment_factor, 2' at prepare",
            fix=f"allgather_bucket_size: {value + 1}", when="prepare", fixable=True)


def _odd_allgather(ctx: CheckContext) -> int | None:
    if not _applies(ctx) or ctx.zero_stage() not in (1, 2):
        return None
    value = ctx.ds_get("zero_optimization.allgather_bucket_size")
    value = as_int(value, None)
    return value if value is not None and value % 2 else None


@fixer("DS-ODD-ALLGATHER-BUCKET")
def fix_odd_allgather(ctx: CheckContext, findings: list) -> list[str]:
    value = _odd_allgather(ctx)
    if value is None:
        return []
    ctx.ds["zero_optimization"]["allgather_bucket_size"] = value + 1
    return [f"zero_optimization.allgather_bucket_size: {value} -> {value + 1}"]


@rule("DS-AIO-IN-ZERO", FAMILY, "aio nested inside zero_optimization", fixable=True)
def aio_in_zero(ctx: CheckContext) -> Iterable:
    if _applies(ctx) and isinstance(ctx.ds_get("zero_optimization"), dict) and "aio" in ctx.ds["zero_optimization"]:
        two = _aio_blocks_differ(ctx)     # moving one over the other would drop settings you wrote
        yield finding(
            "error", "DS-AIO-IN-ZERO", _file(ctx), "zero_optimization.aio",
            "aio is inside zero_optimization (as in an old HF docs example): DeepSpeedZeroConfig raises "
            "'Extra inputs are not permitted' at prepare" + (", and a top-level aio block with other values is "
                                                            "there too; --fix leaves the choice to you" if two else ""),
            fix="keep one aio block, at the top level" if two else "move the aio block to the top level",
            when="prepare", fixable=not two)


def _aio_blocks_differ(ctx: CheckContext) -> bool:
    return "aio" in ctx.ds and ctx.ds["aio"] != ctx.ds["zero_optimization"]["aio"]


@fixer("DS-AIO-IN-ZERO")
def fix_aio_in_zero(ctx: CheckContext, findings: list) -> list[str]:
    if _aio_blocks_differ(ctx):
        return []
    block = ctx.ds["zero_optimization"].pop("aio")
    if "aio" in ctx.ds:
        return ["removed zero_optimization.aio (the same block is at the top level)"]
    ctx.ds["aio"] = block
    return ["moved zero_optimization.aio to the top level"]


@rule("DS-OFFLOAD-PARAM-BELOW-ZERO3", FAMILY, "offload_param with ZeRO stage below 3")
def offload_param_below_3(ctx: CheckContext) -> Iterable:
    stage = ctx.zero_stage()
    if not _applies(ctx) or stage is None or stage >= 3 or ctx.offload_device("param") == "none":
        return
    yield finding(
        "warning", "DS-OFFLOAD-PARAM-BELOW-ZERO3", _file(ctx), "zero_optimization.offload_param",
        f"offload_param.device={ctx.offload_device('param')} with ZeRO stage {stage}: DeepSpeed accepts it and "
        f"silently ignores it (only ZeRO-3 offloads parameters), so the parameters stay on the GPU",
        fix='use "stage": 3, or remove offload_param', when="prepare")


def _nvme_blocks(ctx: CheckContext) -> list[tuple[str, Any]]:
    out = []
    for which in ("optimizer", "param"):
        if ctx.offload_device(which) == "nvme":
            out.append((f"zero_optimization.offload_{which}", ctx.ds_get(f"zero_optimization.offload_{which}.nvme_path")))
    return out


def _on_this_machine(ctx: CheckContext) -> bool:
    hw = ctx.hardware
    return hw is None or str(getattr(hw, "source", "probe")) == "probe"


@rule("DS-NVME-BELOW-ZERO3", FAMILY, "NVMe offload with ZeRO stage 1 or 2")
def nvme_below_zero3(ctx: CheckContext) -> Iterable:
    stage = ctx.zero_stage()
    if not _applies(ctx) or stage not in (1, 2) or ctx.offload_device("optimizer") != "nvme":
        return
    yield finding(
        "warning", "DS-NVME-BELOW-ZERO3", _file(ctx), "zero_optimization.offload_optimizer.device",
        f"offload_optimizer.device=nvme with ZeRO stage {stage}: the ZeRO-1/2 optimizer only asks whether the device "
        f"is 'none' (stage_1_and_2.py: cpu_offload), so the optimizer states go to CPU RAM, not to NVMe; NVMe "
        f"offload (ZeRO-Infinity) needs stage 3", fix='"stage": 3 for NVMe, or "device": "cpu"', when="prepare")


@rule("DS-NVME-NO-PATH", FAMILY, "NVMe offload without nvme_path")
def nvme_no_path(ctx: CheckContext) -> Iterable:
    if not _applies(ctx):
        return
    for block, path in _nvme_blocks(ctx):
        if not path or path == "auto" or str(path).lower() == "none":
            yield finding(
                "error", "DS-NVME-NO-PATH", _file(ctx), f"{block}.nvme_path",
                f"{block}.device is nvme but nvme_path is {path!r}: DeepSpeed's config accepts that, but the NVMe "
                f"swapper has no directory for its swap files and fails at prepare (cf. DeepSpeed #5124)",
                fix=f'set "{block}.nvme_path" to a directory on a local NVMe drive', when="prepare")


@rule("DS-NVME-PATH-UNUSABLE", FAMILY, "nvme_path missing or not writable on this machine")
def nvme_path_unusable(ctx: CheckContext) -> Iterable:
    if not _applies(ctx) or not _on_this_machine(ctx):
        return
    for block, path in _nvme_blocks(ctx):
        if not path or path == "auto" or str(path).lower() == "none":
            continue
        if not os.path.isdir(path):
            problem = "does not exist (or is not a directory)"
        elif not os.access(path, os.W_OK | os.X_OK):
            problem = "is not writable by this user"
        else:
            continue
        yield finding(
            "error", "DS-NVME-PATH-UNUSABLE", _file(ctx), f"{block}.nvme_path",
            f"nvme_path {path} {problem} on this machine: the NVMe swapper fails when it creates its swap files "
            f"at prepare", fix="create the directory on the NVMe drive and make it writable", when="prepare")


@rule("DS-NVME-NO-AIO", FAMILY, "NVMe offload without DeepSpeed's async_io op")
def nvme_no_aio(ctx: CheckContext) -> Iterable:
    if not _applies(ctx) or not _nvme_blocks(ctx) or not _on_this_machine(ctx):
        return
    available = ctx.aio_available
    if available is None:
        available = ctx.aio_available = aio_available()
    if available:
        return
    yield finding(
        "error", "DS-NVME-NO-AIO", _file(ctx), _nvme_blocks(ctx)[0][0] + ".device",
        "NVMe offload needs DeepSpeed's async_io op, which is not compatible here (ds_report shows "
        "async_io ... [NO]): building it fails at prepare", fix="install libaio-dev (>= 0.3.112) and reinstall "
        "DeepSpeed (DS_BUILD_AIO=1), or offload to cpu", when="prepare")


@rule("DS-ZERO3-NO-16BIT-SAVE", FAMILY, "ZeRO-3 without 16-bit gather on save", fixable=True)
def zero3_no_16bit_save(ctx: CheckContext) -> Iterable:
    if not _zero3_missing_gather(ctx):
        return
    consequence = ("save_model writes placeholder weights (transformers warns and saves a DeepSpeed checkpoint; "
                   "accelerate's get_state_dict raises), so the saved model is unusable until zero_to_fp32.py is run")
    if _gather_set_off(ctx):
        # DeepSpeed's default is off too, so a key that says false is a choice: for a very large model the gather
        # on rank 0 can exhaust host RAM. A note, and --fix leaves it (README: it never overrides a value you set).
        yield finding(
            "info", "DS-ZERO3-NO-16BIT-SAVE", _file(ctx), _gather_key_set(ctx),
            f"ZeRO-3 with the 16-bit gather on save turned off here: {consequence}",
            fix="after training, run zero_to_fp32.py in the checkpoint directory (or set it true where rank 0's "
                "host RAM holds the 16-bit model; --fix leaves your false alone)", when="save")
        return
    yield finding(
        "warning", "DS-ZERO3-NO-16BIT-SAVE", _file(ctx), "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        f"ZeRO-3 without stage3_gather_16bit_weights_on_model_save: {consequence}",
        fix='"stage3_gather_16bit_weights_on_model_save": true (costs time and host RAM at each save)',
        when="save", fixable=True)


_GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                "stage3_gather_fp16_weights_on_model_save", "gather_fp16_weights_on_model_save")


def _gather_values(ctx: CheckContext) -> list[Any]:
    """The 16-bit gather on save as the config writes it, under each of its names that is there."""
    zero = ctx.ds_get("zero_optimization")
    return [zero[k] for k in _GATHER_KEYS if k in zero] if isinstance(zero, dict) else []


def _zero3_missing_gather(ctx: CheckContext) -> bool:
    if not _applies(ctx) or ctx.zero_stage() != 3:
        return False
    values = _gather_values(ctx)
    if any(v == "auto" for v in values):
        return False            # DS-AUTO-IN-SUBCONFIG reports it
    return not any(v is True or str(v).lower() == "true" for v in values)


def _gather_set_off(ctx: CheckContext) -> bool:
    """The gather is off because the config says so (a key is there), not by DeepSpeed's default."""
    return bool(_gather_values(ctx))


def _gather_key_set(ctx: CheckContext) -> str:
    zero = ctx.ds_get("zero_optimization") or {}
    return "zero_optimization." + next(k for k in _GATHER_KEYS if k in zero)


@fixer("DS-ZERO3-NO-16BIT-SAVE")
def fix_zero3_gather(ctx: CheckContext, findings: list) -> list[str]:
    if not _zero3_missing_gather(ctx) or _gather_set_off(ctx):
        return []              # a false you wrote is yours: never turned into true
    ctx.ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    return ["zero_optimization.stage3_gather_16bit_weights_on_model_save -> true"]


# DeepSpeed's optimizer block for DeepSpeedCPUAdam; the HF Trainer fills the "auto" values from
# TrainingArguments (wizard/config/emit.py, OFFLOAD OPTIMIZER RULE).
CPU_ADAM_BLOCK = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
# TrainingArguments defaults that accelerate's swap to DeepSpeedCPUAdam does not carry (its own equal them).
ADAM_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}


def _optim(ctx: CheckContext) -> str:
    """The HF `optim` from --training-args, lower case; "" when unknown (own loop, no training args)."""
    return str(ctx.ta_value("optim") or "").lower() if ctx.ta is not None and ctx.hf_trainer else ""


def _swap_keeps_algorithm(optim: str) -> bool:
    """accelerate's map_pytorch_optim_to_deepspeed keeps torch Adam/AdamW as they are; an 8-/4-bit AdamW
    becomes DeepSpeedCPUAdam in Adam mode (L2 weight decay), anything else (SGD, Adafactor, ...) plain Adam."""
    return any(optim.startswith(a) for a in ADAM_LIKE) and "8bit" not in optim and "4bit" not in optim


def _has_cpu_kernel(optim: str) -> bool:
    """DeepSpeed steps offloaded states natively only for Adam/AdamW (and Adagrad/Lion, which HF's `optim`
    names do not map to): other optimizers can only run as torch code on the CPU."""
    return not optim or any(optim.startswith(a) for a in ADAM_LIKE)


def _force_false(ctx: CheckContext) -> bool:
    force = ctx.ds.get("zero_force_ds_cpu_optimizer", True)
    return force is False or str(force).lower() == "false"


def _offloads_with_client_optimizer(ctx: CheckContext) -> bool:
    return (_applies(ctx) and ctx.offload_device("optimizer") in ("cpu", "nvme")
            and "optimizer" not in ctx.ds)


@rule("DS-OFFLOAD-CLIENT-OPTIMIZER", FAMILY, "optimizer offload: accelerate swaps the optimizer built in code",
      fixable=True)
def offload_client_optimizer(ctx: CheckContext) -> Iterable:
    kind = _offload_client_optimizer(ctx)
    if kind is None:
        return
    optim = _optim(ctx)
    detail = (f"your optim={optim!r} silently becomes Adam" if kind == "algorithm"
              else "your adam_beta1/adam_beta2/adam_epsilon are not carried over, only lr and weight_decay")
    fix = ('"zero_force_ds_cpu_optimizer": false to keep your optimizer (a torch step on the CPU: DeepSpeed '
           'has CPU kernels only for Adam/AdamW/Adagrad/Lion)' if not _has_cpu_kernel(optim)
           else 'a DeepSpeed "optimizer" block {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", '
                '"eps": "auto", "weight_decay": "auto"}}: DeepSpeedCPUAdam with the values of your '
                'TrainingArguments')
    fixable = not (_force_explicit_true(ctx) and not _has_cpu_kernel(optim))   # never flip an explicit true
    yield finding(
        "error" if kind == "algorithm" else "warning", "DS-OFFLOAD-CLIENT-OPTIMIZER", _file(ctx),
        "zero_force_ds_cpu_optimizer",
        f"optimizer offload to {ctx.offload_device('optimizer')} with the optimizer built in code (no \"optimizer\" "
        f"block) and zero_force_ds_cpu_optimizer not false: at prepare accelerate swaps that optimizer for "
        f"DeepSpeedCPUAdam ({detail}), and a plain deepspeed.initialize raises ZeRORuntimeException",
        fix=fix if fixable else fix + " (you set zero_force_ds_cpu_optimizer: true yourself: --fix leaves it)",
        when="prepare", fixable=fixable)


def _force_explicit_true(ctx: CheckContext) -> bool:
    force = ctx.ds.get("zero_force_ds_cpu_optimizer")
    return force is True or str(force).lower() == "true"


def _offload_client_optimizer(ctx: CheckContext) -> str | None:
    """'algorithm' when accelerate's swap changes the optimizer, 'betas' when it drops the Trainer's
    betas/eps, None otherwise (an Adam(W) swapped for DeepSpeedCPUAdam is the fast path: no finding)."""
    if not _offloads_with_client_optimizer(ctx) or _force_false(ctx):
        return None
    optim = _optim(ctx)
    if optim and not _swap_keeps_algorithm(optim):
        return "algorithm"
    if ctx.hf_trainer and ctx.ta is not None and any(
            _differs(ctx.ta_given(k), v) for k, v in ADAM_DEFAULTS.items()):
        return "betas"
    return None


def _differs(value: Any, default: float) -> bool:
    try:
        return value is not None and float(value) != default
    except (TypeError, ValueError):
        return False


@fixer("DS-OFFLOAD-CLIENT-OPTIMIZER")
def fix_offload_client_optimizer(ctx: CheckContext, findings: list) -> list[str]:
    if _offload_client_optimizer(ctx) is None:
        return []
    if not _has_cpu_kernel(_optim(ctx)):
        if _force_explicit_true(ctx):
            return []          # the user's explicit choice: --fix never flips it
        ctx.ds["zero_force_ds_cpu_optimizer"] = False
        return ["zero_force_ds_cpu_optimizer -> false (the optimizer built in code is kept)"]
    ctx.ds["optimizer"] = copy.deepcopy(CPU_ADAM_BLOCK)
    return ['optimizer -> AdamW with "auto" values (DeepSpeedCPUAdam; the Trainer fills them)']


@rule("DS-OFFLOAD-TORCH-OPTIMIZER", FAMILY, "optimizer offload stepped by a torch optimizer on the CPU (a note)")
def offload_torch_optimizer(ctx: CheckContext) -> Iterable:
    # zero_force_ds_cpu_optimizer: false is always the user's explicit choice (the default is true): respected,
    # so a note, not a warning, and --fix leaves it (axolotl ships it on purpose).
    if not _offload_torch_optimizer(ctx):
        return
    fix = ('for DeepSpeedCPUAdam instead: remove zero_force_ds_cpu_optimizer and add a DeepSpeed "optimizer" block '
           '{"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}'
           if ctx.hf_trainer else "for DeepSpeedCPUAdam instead: remove zero_force_ds_cpu_optimizer (accelerate "
           "then swaps your torch AdamW for it)")
    yield finding(
        "info", "DS-OFFLOAD-TORCH-OPTIMIZER", _file(ctx), "zero_force_ds_cpu_optimizer",
        f"optimizer offload to {ctx.offload_device('optimizer')} with zero_force_ds_cpu_optimizer false and no "
        f"\"optimizer\" block: the Trainer's or your loop's torch AdamW steps the offloaded states on the CPU, which "
        f"DeepSpeed says 'in most cases will yield poor performance' (DeepSpeedCPUAdam is vectorised and "
        f"multi-threaded)", fix=fix, when="step 0")


def _offload_torch_optimizer(ctx: CheckContext) -> bool:
    # SGD / Adafactor have no DeepSpeed CPU kernel: false is the only way to keep them, so no finding.
    return _offloads_with_client_optimizer(ctx) and _force_false(ctx) and _has_cpu_kernel(_optim(ctx))


@rule("DS-BF16-UNSUPPORTED", FAMILY, "bf16 on GPUs without native bf16")
def bf16_unsupported(ctx: CheckContext) -> Iterable:
    hw = ctx.hardware
    if not _applies(ctx) or hw is None or not hw.gpus or hw.all_bf16:
        return
    enabled = ctx.ds_get("bf16.enabled", ctx.ds_get("bfloat16.enabled"))
    if enabled == "auto":
        enabled = bool(ctx.ta_value("bf16")) if ctx.ta is not None else False
    if not (enabled is True or str(enabled).lower() == "true"):
        return
    bad = sorted({g.name for g in hw.gpus if not g.bf16})
    yield finding(
        "error", "DS-BF16-UNSUPPORTED", _file(ctx), "bf16.enabled",
        f"bf16 is enabled but {', '.join(bad)} have no native bf16 (compute capability < 8.0): PyTorch only "
        f"emulates it there (torch.cuda.is_bf16_supported counts emulation, so DeepSpeed and transformers let it "
        f"through), which is many times slower, and fused kernels such as flash attention refuse it",
        fix='use fp16: "fp16": {"enabled": "auto"} with fp16=True in TrainingArguments', when="step 0")


def _is_comment(key: str) -> bool:
    """`_comment`, `__doc`, `comment`, `//`: how people write comments in JSON."""
    return key.startswith(("_", "//", "#")) or "comment" in key.lower()


def _present(cfg: dict[str, Any], dotted: str) -> bool:
    node: Any = cfg
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _too_new(ctx: CheckContext) -> list[tuple[str, str, KeyStatus]]:
    """(key path, DeepSpeed release that added it, where the installed DeepSpeed stops) for each key of
    KEY_INTRODUCED the file uses and the installed DeepSpeed's models do not have."""
    if not _applies(ctx):
        return []
    out = []
    for path, introduced in KEY_INTRODUCED.items():
        if _present(ctx.ds, path):
            status = key_status(path)
            if not status.known:
                out.append((path, introduced, status))
    return out


@rule("DS-KEY-NEEDS-NEWER-DEEPSPEED", FAMILY, "a DeepSpeed key the installed DeepSpeed does not have yet")
def key_needs_newer_deepspeed(ctx: CheckContext) -> Iterable:
    too_new = _too_new(ctx)
    if not too_new:
        return          # no ds_config.json, or nothing newer than the installed DeepSpeed: DeepSpeed stays unimported
    schema = ds_schema()
    installed = schema.version if schema is not None else ""
    for path, introduced, status in too_new:
        if older(installed, introduced) or not installed:
            history = f"'{path}' was added in DeepSpeed {introduced}; the installed DeepSpeed {installed} does not have it"
            fix = f"upgrade DeepSpeed to {introduced} or later (pip install -U 'deepspeed>={introduced}'), or remove '{path}'"
        else:
            history = (f"'{path}' was added in DeepSpeed {introduced}, but the installed DeepSpeed {installed} no longer "
                       f"has it (removed or renamed)")
            fix = f"see the installed DeepSpeed's release notes for its replacement, or remove '{path}'"
        if status.rejects:
            what = (f"{status.model} forbids unknown keys, so deepspeed.initialize raises 'Extra inputs are not "
                    f"permitted' on '{status.missing}'")
        elif status.model is None:
            what = (f"its DeepSpeedConfig does not read the top-level '{status.missing}' block and silently ignores "
                    f"it, so the run goes ahead without the setting")
        else:
            what = (f"{status.model} silently drops '{status.missing}', so the run goes ahead without the setting")
        yield finding("error", "DS-KEY-NEEDS-NEWER-DEEPSPEED", _file(ctx), path, f"{history}: {what}", fix=fix,
                      when="prepare")


@rule("DS-UNKNOWN-TOP-KEY", FAMILY, "top-level key DeepSpeed does not read")
def unknown_top_level(ctx: CheckContext) -> Iterable:
    if not _applies(ctx):
        return
    schema = ds_schema()
    known = schema.top_level if schema is not None else known_top_level_keys()
    too_new = {status.missing for _, _, status in _too_new(ctx)}     # DS-KEY-NEEDS-NEWER-DEEPSPEED says it
    unknown = [key for key in ctx.ds if key not in known and key not in too_new]
    for key in unknown[:MAX_FINDINGS_PER_RULE]:
        if _is_comment(str(key)):
            yield finding("info", "DS-UNKNOWN-TOP-KEY", _file(ctx), str(key),
                          f"'{key}' reads as a comment (JSON has none); DeepSpeed ignores it")
            continue
        hint = where_it_belongs(str(key))
        yield finding(
            "warning", "DS-UNKNOWN-TOP-KEY", _file(ctx), str(key),
            f"'{key}' is not a DeepSpeed setting: top-level keys are not validated, so DeepSpeed silently "
            f"ignores it (a misspelt key means the setting you wanted is not applied)"
            + (f"; DeepSpeed reads {' or '.join(repr(h) for h in hint)}" if hint else ""),
            fix=_move_or_respell(str(key), hint), when="launch")
    if len(unknown) > MAX_FINDINGS_PER_RULE:
        yield more_like_these("warning", "DS-UNKNOWN-TOP-KEY", _file(ctx), unknown[MAX_FINDINGS_PER_RULE:],
                              "top-level keys DeepSpeed does not read (it silently ignores them)",
                              fix="remove them, or fix their spelling", when="launch")


def _move_or_respell(key: str, hint: list[str]) -> str:
    if not hint:
        return "fix the spelling or remove it"
    if "." in hint[0]:
        return f"move it to {hint[0]}" if len(hint) == 1 else f"move it to one of {', '.join(hint)}"
    return f"did you mean {' or '.join(hint)}?"


# ----------------------------------------------------------------------------- pinned memory and ulimit -l

# DeepSpeed 0.19.5 made pin_memory default to true in both offload blocks (offload_config.py: False up to 0.19.4).
# Only the message cites it: whether a block pins is read from the installed model's default.
PIN_MEMORY_DEFAULT_TRUE_SINCE = "0.19.5"
# With the model unknown: a memlock limit below this is too small for the pinned offload buffers of any model
# worth offloading (the fp32 gradient partition alone is 4 B per parameter per process: 1 GiB is 268M
# parameters on one process, 2.1B over 8).
MEMLOCK_FLOOR = 1 << 30


def memlock_limit() -> int | None:
    """This machine's RLIMIT_MEMLOCK (soft, what `ulimit -l` shows, in KiB there) in bytes; None when unlimited
    or unknown. The rule takes it from the context when one is given (tests, a check for another machine)."""
    try:
        import resource
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return memlock_bytes(soft, resource.RLIM_INFINITY)


def memlock_bytes(soft: int, infinity: int) -> int | None:
    """A getrlimit soft limit as bytes, None for unlimited."""
    return None if soft == infinity or soft < 0 else int(soft)


def pin_memory_default(which: str) -> bool | None:
    """The installed DeepSpeed's default of zero_optimization.offload_<which>.pin_memory (None: unknown)."""
    schema = ds_schema()
    model = schema.sections.get(f"zero_optimization.offload_{which}") if schema is not None else None
    info = model.model_fields.get("pin_memory") if model is not None else None
    return info.default if info is not None and isinstance(info.default, bool) else None


def _pinned_offloads(ctx: CheckContext) -> list[tuple[str, str]]:
    """(which, "explicit" | "default") for each CPU offload block that pins its host buffers."""
    stage = ctx.zero_stage() or 0
    out = []
    for which in ("optimizer", "param"):
        if ctx.offload_device(which) != "cpu" or stage < (3 if which == "param" else 1):
            continue                # offload_param below ZeRO-3 is never read (DS-OFFLOAD-PARAM-BELOW-ZERO3)
        value = ctx.ds_get(f"zero_optimization.offload_{which}.pin_memory")
        if value is None or value == "auto":           # "auto" is dropped to the default
            if pin_memory_default(which):
                out.append((which, "default"))
        elif value is True or str(value).lower() == "true":
            out.append((which, "explicit"))
    return out


def pinned_bytes(ctx: CheckContext, pinned: list[tuple[str, str]]) -> int | None:
    """At least how much host memory each process pins for these offload blocks, with the model known (full
    fine-tuning): the fp32 gradient partition, 4 B x params / processes, with optimizer offload (ZeRO-1/2:
    single_partition_of_fp32_groups[i].grad, which also pins the fp32 master and a 16-bit copy; ZeRO-3:
    grad_partitions_flat_buffer), and the 16-bit parameter partition, 2 B x params / processes, with ZeRO-3
    parameter offload (param_groups_fp16_flat_cpu_memory). A lower bound, read from DeepSpeed 0.19.8's
    stage_1_and_2.py / stage3.py: a limit below it fails for sure."""
    model = ctx.model if ctx.model is not None else getattr(ctx.planned, "model", None)
    params = getattr(model, "params", None)
    if not params or (ctx.method is not None and getattr(ctx.method, "method", "full") != "full"):
        return None                 # LoRA / QLoRA offload only the adapters' optimizer: not sized here
    return pinned_bytes_per_process(int(params), ctx.num_processes, [which for which, _ in pinned])


def pinned_bytes_per_process(params: int, processes: int, blocks: list[str]) -> int:
    """The lower bound of pinned_bytes for `params` parameters (full fine-tuning) over `processes`, with the offload
    blocks ("optimizer", "param") that pin: also what `wizard preflight` holds each node's ulimit -l against."""
    per_param = sum(4 if which == "optimizer" else 2 for which in blocks)
    return per_param * int(params) // max(1, processes)


def _pins_on_this_machine(ctx: CheckContext) -> bool:
    """The files are checked on the machine that trains (this machine's probe) and it trains on GPUs: only there
    is host memory page-locked (DeepSpeed's CPU accelerator's pin_memory is a no-op), and only there is this
    machine's limit the one that counts."""
    hw = ctx.hardware
    return (hw is not None and str(getattr(hw, "source", "")) == "probe" and bool(getattr(hw, "gpus", None))
            and ctx.acc_get("use_cpu") is not True)


@rule("DS-PIN-MEMORY-MEMLOCK", FAMILY, "CPU offload pins more host memory than this machine's ulimit -l allows")
def pin_memory_memlock(ctx: CheckContext) -> Iterable:
    if not _applies(ctx) or not _pins_on_this_machine(ctx):
        return
    pinned = _pinned_offloads(ctx)
    if not pinned:
        return
    limit = (ctx.memlock_limit or memlock_limit)()
    if limit is None:
        return
    need = pinned_bytes(ctx, pinned)
    if need is not None and limit >= need:
        return
    if need is None and limit >= MEMLOCK_FLOOR:
        return
    from wizard.units import fmt_bytes

    which, how = pinned[0]
    key = f"zero_optimization.offload_{which}.pin_memory"
    schema = ds_schema()
    installed = schema.version if schema is not None else ""
    blocks = " and ".join(f"offload_{w}" for w, _ in pinned)
    why = ("pin_memory: true" if all(h == "explicit" for _, h in pinned) else
           f"pin_memory not set: the installed DeepSpeed {installed} defaults it to true, as every release since "
           f"{PIN_MEMORY_DEFAULT_TRUE_SINCE} does")
    model_name = ctx.model_id or "the model"
    if need is not None:
        who = f"each of the {ctx.num_processes} processes pins" if ctx.num_processes > 1 else "the process pins"
        verdict = (f"{who} at least {fmt_bytes(need)} for {model_name}, over this machine's memlock limit "
                   f"(ulimit -l) of {fmt_bytes(limit)}")
    else:
        verdict = (f"this machine's memlock limit (ulimit -l) is {fmt_bytes(limit)}, below "
                   f"{fmt_bytes(MEMLOCK_FLOOR)}: too small for the pinned buffers of all but small models (at least "
                   f"4 B per parameter per process; --model compares the model's own size)")
    yield finding(
        "warning", "DS-PIN-MEMORY-MEMLOCK", _file(ctx), key,
        f"CPU offload ({blocks}) pins its host buffers ({why}), and {verdict}: DeepSpeed counts pinned memory "
        f"against that limit (its pin_memory docs: disable it 'only on hosts with tight memlock limits (ulimit -l)'), "
        f"so pinning the offload buffers at deepspeed.initialize can fail or fall back",
        fix="raise the limit where the training runs: `ulimit -l unlimited` before the launch (needs a hard limit "
            "that allows it), `* - memlock unlimited` in /etc/security/limits.conf, or `--ulimit memlock=-1` / "
            "the container runtime's memlock setting; or set \"pin_memory\": false in the offload block (slower "
            "host-GPU copies)", when="prepare")
