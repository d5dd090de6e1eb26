"""LoRA / QLoRA sizing: adapters counted as the real peft counts them on the meta device, the frozen base's NF4
bytes derived from bitsandbytes' layout, and the model-state bytes per GPU of each strategy.

Three parts:
- `LoraOptions` / `lora_options(...)`: the method question (`--method full|lora|qlora`, `--lora-rank`,
  `--lora-alpha`, `--lora-targets`, `--lora-dropout`) validated into one frozen dataclass.
- `size_adapters(model, options) -> AdapterShape`: transformers builds the model on the meta device
  (wizard.sizing.model's build, no weights; the one size_model built, when there is one). Where every target
  is a plain Linear / Conv1D, `count_lora` counts what peft adds from the module shapes (r * (in + out) each), with
  no peft import and the model left as it was; otherwise peft's `get_peft_model` wraps it with the LoraConfig and
  peft's own `get_nb_trainable_parameters()` counts trainable and frozen parameters. For QLoRA the modules that
  transformers' bitsandbytes quantiser would turn into `Linear4bit` are found with transformers' own rules
  and their NF4 bytes computed from bitsandbytes' layout (see `nf4_linear_bytes`). bitsandbytes is never
  imported: sizing works without it. A `--params` shape (no config) is sized analytically as a Llama
  (`size_llama_adapters`), which a test checks against peft on a real Llama config.
- `adapter_model_states(...) -> ModelStates`: pure arithmetic, the same shape as wizard.sizing.memory's.

torch / transformers / peft are imported inside functions only, never at module import.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

from wizard.errors import InputError
from wizard.sizing.memory import (
    DS_ADDITIONAL_BUFFER_FACTOR,
    FP32_GRAD_BYTES,
    ModelStates,
    state_bytes,
    states_zero1,
    states_zero2,
    states_zero3,
    zero3_gathers,
    working_bytes,
)

METHODS = ("full", "lora", "qlora")
ALL_LINEAR = "all-linear"          # peft's INCLUDE_LINEAR_LAYERS_SHORTHAND: every Linear except the output layer
QUANT_STORAGES = {"uint8": 1, "bf16": 2, "fp16": 2, "fp32": 4}   # bnb_4bit_quant_storage -> itemsize
STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp")

# --- bitsandbytes' NF4 layout (bitsandbytes 0.50.2, functional.py quantize_4bit and _ops.py) ---------------
# quantize_4bit(A, blocksize=64, ...): the fake/meta kernel allocates
#   out    = empty(((n + 1) // (quant_storage.itemsize * 2), 1), dtype=quant_storage)   two 4-bit codes per byte
#   absmax = empty((ceil(n / blocksize),), dtype=float32)                               one scale per block
# Linear4bit / Params4bit default blocksize 64, and transformers' BitsAndBytesConfig has no blocksize option
# (integrations/bitsandbytes.py replace_with_bnb_linear builds Linear4bit without one), so 64 it is.
NF4_BLOCKSIZE = 64
# compress_statistics=True (bnb_4bit_use_double_quant): offset = absmax.mean(); the absmax are quantised again
# with quantize_blockwise(absmax - offset, blocksize=256): uint8 codes, one fp32 absmax per 256, the 0-d fp32
# offset, and the 256-entry fp32 dynamic code: cached in name2qmap["dynamic"] but stored in each QuantState
# as `code.to(A.device, copy=True)` (functional.py quantize_blockwise), so one copy per quantised Linear.
NESTED_BLOCKSIZE = 256
NESTED_CODE_BYTES = 256 * 4
OFFSET_BYTES = 4
# get_4bit_type("nf4") builds a fresh 16-entry fp32 table for every quantize_4bit call: one per Linear4bit.
NF4_CODE_BYTES = 16 * 4


@dataclass(frozen=True)
class LoraOptions:
    """The method question, validated (see `lora_options`)."""

    method: str = "full"
    rank: int = 16
    # None: 2 x rank, TRL's ModelConfig default (lora_r=16, lora_alpha=32; trl/trainer/model_config.py).
    # alpha only scales the update (alpha / r); it changes no byte.
    alpha: int | None = None
    # TRL ModelConfig's lora_dropout default; peft's own default is 0.0. No byte depends on it either.
    dropout: float = 0.05
    # None: the default, every Linear module of the model but the output layer, by name (DEFAULT_TARGETS_WHY);
    # "all-linear" (peft's shorthand, which also wraps fused MoE expert parameters); or module names,
    # comma-separated ("q_proj,k_proj,v_proj,o_proj").
    targets: str | None = None
    # QLoRA's double quantisation (Dettmers et al. 2023, section 3): the recipe of the QLoRA paper.
    # BitsAndBytesConfig and TRL default to False; what is emitted must say the same as what is sized.
    double_quant: bool = True
    # bnb_4bit_quant_storage; ZeRO-3 and FSDP need it equal to the compute dtype (qlora_requirements).
    quant_storage: str = "uint8"

    @property
    def lora_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank

    @property
    def target_list(self) -> list[str] | None:
        """None (peft's default), or the module names; "all-linear" is `targets` itself."""
        if self.targets is None or self.targets == ALL_LINEAR:
            return None
        return [t.strip() for t in self.targets.split(",") if t.strip()]


def lora_options(method: str = "full", rank: Any = 16, alpha: Any = None, dropout: Any = 0.05,
                 targets: str | None = None, double_quant: bool = True, quant_storage: str = "uint8") -> LoraOptions:
    """LoraOptions from flag or answers-file values; InputError (field + allowed values) on bad input."""
    method = str(method).strip().lower()
    if method not in METHODS:
        raise InputError("method", f"{method!r} is not a method", "|".join(METHODS))
    rank = _positive_int(rank, "lora_rank")
    alpha = None if alpha is None or alpha == "" else _positive_int(alpha, "lora_alpha")
    try:
        dropout = float(dropout)
    except (TypeError, ValueError):
        raise InputError("lora_dropout", f"{dropout!r} is not a number", "a number from 0 up to (not including) 1") \
            from None
    if not 0.0 <= dropout < 1.0:
        raise InputError("lora_dropout", f"{dropout} is out of range", "a number from 0 up to (not including) 1")
    if targets is not None:
        targets = str(targets).strip()
        if targets in ("", "default", "auto"):
            targets = None
        elif targets.lower() == ALL_LINEAR:
            targets = ALL_LINEAR
        else:
            names = [t.strip() for t in targets.split(",")]
            if any(not n or not all(c.isalnum() or c in "_." for c in n) for n in names):
                raise InputError("lora_targets", f"{targets!r} is not a list of module names",
                                 "default, all-linear, or comma-separated module names such as q_proj,v_proj")
            targets = ",".join(names)
    storage = str(quant_storage).strip().lower()
    storage = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(storage, storage)
    if storage not in QUANT_STORAGES:
        raise InputError("quant_storage", f"{quant_storage!r} is not a storage dtype", "|".join(QUANT_STORAGES))
    return LoraOptions(method=method, rank=rank, alpha=alpha, dropout=dropout, targets=targets,
                       double_quant=bool(double_quant), quant_storage=storage)


def _positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field_name, f"{value!r} is not a positive whole number", "a positive integer such as 16")
    return value


# ---------------------------------------------------------------------------------------------------------
# NF4 bytes of one quantised Linear
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Nf4Bytes:
    weights: int          # the packed 4-bit codes (Params4bit data)
    constants: int        # absmax (fp32, or uint8 + nested fp32 absmax + offset) and the NF4 code table

    @property
    def total(self) -> int:
        return self.weights + self.constants


def nf4_linear_bytes(numel: int, double_quant: bool, quant_storage: str = "uint8",
                     blocksize: int = NF4_BLOCKSIZE) -> Nf4Bytes:
    """Bytes of one Linear4bit weight of `numel` elements and its quant state, as bitsandbytes allocates them."""
    itemsize = QUANT_STORAGES[quant_storage]
    weights = (numel + 1) // (itemsize * 2) * itemsize
    blocks = -(numel // -blocksize)
    if double_quant:
        absmax = blocks * 1 + -(blocks // -NESTED_BLOCKSIZE) * 4 + OFFSET_BYTES + NESTED_CODE_BYTES
    else:
        absmax = blocks * 4
    return Nf4Bytes(weights=weights, constants=absmax + NF4_CODE_BYTES)


# ---------------------------------------------------------------------------------------------------------
# Sizing the adapters
# ---------------------------------------------------------------------------------------------------------

@dataclass
class AdapterShape:
    """What LoRA / QLoRA adds to (and leaves of) one model; counts are per model, not per GPU."""

    method: str                              # "lora" | "qlora"
    rank: int
    trainable_params: int                    # peft's get_nb_trainable_parameters()[0]
    frozen_params: int                       # every other parameter (tied weights once)
    adapted_modules: int                     # modules (or MoE parameters) that received an adapter
    modules_per_target: dict[str, int]       # leaf name -> how many were adapted ("q_proj": 32, ...)
    targets: list[str]                       # the target names actually used (after peft resolved them)
    # QLoRA only (zero for LoRA): the frozen base as transformers' bitsandbytes quantiser leaves it.
    quantized_modules: int = 0
    quantized_params: int = 0                # weights that become NF4
    nf4_weight_bytes: int = 0                # packed 4-bit codes
    nf4_constant_bytes: int = 0              # absmax / nested constants / code tables (double_quant as given)
    nf4_constant_bytes_single: int = 0       # the same without double quantisation, for comparison
    nf4_constant_bytes_double: int = 0       # the same with double quantisation
    unquantized_params: int = 0              # embeddings, norms, lm_head, biases, non-Linear parameters
    double_quant: bool = True
    quant_storage: str = "uint8"
    # QLoRA on one GPU / DDP: whether peft's prepare_model_for_kbit_training runs (the wizard's snippet calls it,
    # snippets.kbit_prepared): the unquantised parameters become fp32, and so does the residual stream. False
    # describes a run that keeps them in the compute dtype (litgpt's bf16-true, for the published rows).
    kbit_prepared: bool = True
    source: str = ""
    exact: bool = True                       # False for an analytic --params shape
    notes: list[str] = field(default_factory=list)

    def frozen_bytes(self, dtype_bytes: int, unquantized_dtype_bytes: int | None = None) -> int:
        """Bytes of the frozen base on one replica: in `dtype_bytes` for LoRA; for QLoRA the NF4 bytes plus
        the unquantised parameters in `unquantized_dtype_bytes` (default: dtype_bytes)."""
        if self.method != "qlora":
            return self.frozen_params * dtype_bytes
        unq = dtype_bytes if unquantized_dtype_bytes is None else unquantized_dtype_bytes
        return self.nf4_weight_bytes + self.nf4_constant_bytes + self.unquantized_params * unq


def size_adapters(model: Any, options: LoraOptions) -> AdapterShape:
    """Size the adapters of `model` for `options` (method lora or qlora).

    `model`: a local directory / config.json path / cached Hub id (as wizard.sizing.model.size_model takes), a
    transformers PretrainedConfig, or a wizard.sizing.model.ModelShape. A ModelShape that is not exact (from
    --params) is sized analytically as a Llama; an exact one is rebuilt from its source.
    """
    if options.method not in ("lora", "qlora"):
        raise ValueError(f"size_adapters needs method lora or qlora, not {options.method!r}")
    from wizard.sizing.model import ModelShape

    if isinstance(model, ModelShape):
        if not model.exact or not model.source or model.source.startswith("--params"):
            return size_llama_adapters(model, options)
        model = model.source
    if isinstance(model, str):
        from wizard.sizing.model import _read_config_dict, _resolve_config_path

        config_path, source = _resolve_config_path(model)
        data = _read_config_dict(config_path)
        return _size_with_peft(data=data, config=None, config_path=config_path, source=source, options=options)
    return _size_with_peft(data=None, config=model, config_path=None, source=type(model).__name__, options=options)


def _size_with_peft(data, config, config_path, source: str, options: LoraOptions) -> AdapterShape:
    """Adapters of the model transformers builds on meta: counted from its Linear shapes where that is what peft
    does (`count_lora`), else by peft itself (`get_peft_model`, which also changes the model it wraps)."""
    from pathlib import Path

    from wizard.libraries import IMPORT_LOCK
    from wizard.sizing.model import (_build_on_meta, _import_and_build_config, _offline, _quiet_transformers,
                                     _remember_built, peek_built, take_built)

    with IMPORT_LOCK, _offline(), _quiet_transformers():
        # The model size_model just built from this config: counting only reads it, so it stays there for the
        # next method's count (the 70B full plan names LoRA and QLoRA alternatives); peft takes it for good.
        found = peek_built(data, config_path) if config is None else None
        if found is not None:
            config, base = found
        else:
            from_data = config is None
            if from_data:
                config = _import_and_build_config(data, config_path)
            base = _build_on_meta(config, config_path or Path(source))
            if from_data:   # the shape came from the sizing cache: this build serves the next method's count too
                _remember_built(data, config_path, config, base)
                found = (config, base)
        quant = _nf4_of_model(base, options) if options.method == "qlora" else None
        counted = count_lora(base, options)
        if counted is None:
            if found is not None:
                take_built(data, config_path)
            with _peft_on_meta():
                peft_model, targets = _apply_lora(base, options, source)
                trainable, total = peft_model.get_nb_trainable_parameters()
                per_target = _adapted_modules(peft_model)
        else:
            trainable, total, per_target, targets = counted
    shape = AdapterShape(
        method=options.method, rank=options.rank, trainable_params=trainable, frozen_params=total - trainable,
        adapted_modules=sum(per_target.values()), modules_per_target=per_target, targets=targets,
        double_quant=options.double_quant, quant_storage=options.quant_storage, source=source, exact=True,
    )
    if quant is not None:
        _fill_quant(shape, quant)
    return shape


# peft 0.21 (tuners_utils.py, utils/constants.py), what `count_lora` reproduces and where it leaves the count to peft:
# - a list of target names matches a module whose name equals one or ends with "." + one (check_target_module_exists);
# - from MIN_TARGET_MODULES_FOR_OPTIMIZATION names on, inject_adapter condenses the list it keeps in its config,
#   and that condensed list is what AdapterShape.targets reports: peft counts those;
# - LoRA on a Linear(in, out) or a GPT-2 Conv1D adds lora_A (r x in) and lora_B (out x r), no bias (bias="none",
#   lora_bias False): r * (in + out) trainable parameters (tuners/lora/layer.py update_layer); every base
#   parameter stays, frozen. Any other matched module type (Embedding, Conv2d, a Linear subclass another
#   dispatcher may claim): peft counts it;
# - transformers-v5 MoE models (the model types of transformers' conversion_mapping._MODEL_TO_CONVERSION_PATTERN
#   and peft's additions) may get their peft config rewritten before matching (utils/transformers_weight_conversion
#   .py): peft counts them;
# - Mamba-like model types refuse out_proj / conv1d targets (_check_lora_target_modules_mamba): peft says so.
PEFT_MIN_TARGET_MODULES_FOR_OPTIMIZATION = 20
_PEFT_MAMBA_MODEL_TYPES = frozenset({"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"})


def count_lora(model, options: LoraOptions) -> tuple[int, int, dict[str, int], list[str]] | None:
    """(trainable, total parameters, leaf name -> adapted count, target names) of LoRA on `model` as
    peft's get_peft_model + get_nb_trainable_parameters() count them, from the module shapes alone (no peft,
    the model untouched); None where only peft can say (see above): an "all-linear" shorthand, an MoE
    conversion, a matched module that is not a plain Linear / Conv1D, nothing matched (peft's error)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if options.targets == ALL_LINEAR:
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    converted = _moe_conversion_types()
    if model_type in _PEFT_MAMBA_MODEL_TYPES or converted is None or model_type in converted:
        return None
    targets = options.target_list if options.targets is not None else linear_leaf_names(model)
    if targets is None:
        return None
    wanted = set(targets)
    if not wanted or len(wanted) >= PEFT_MIN_TARGET_MODULES_FOR_OPTIMIZATION:
        return None
    suffixes = tuple("." + t for t in wanted)
    trainable = 0
    per_target: dict[str, int] = {}
    for name, module in model.named_modules():
        if not name or not (name in wanted or name.endswith(suffixes)):
            continue
        kind = type(module)
        if kind is torch.nn.Linear:
            size = module.in_features + module.out_features
        elif kind is Conv1D:
            size = sum(module.weight.shape)
        else:
            return None
        trainable += options.rank * size
        leaf = name.rsplit(".", 1)[-1]
        per_target[leaf] = per_target.get(leaf, 0) + 1
    if not per_target:
        return None
    base = sum(p.numel() for _, p in model.named_parameters())
    return trainable, base + trainable, dict(sorted(per_target.items())), sorted(wanted)


# What peft 0.21 adds to transformers' table (utils/transformers_weight_conversion.py); a test checks it still is.
_PEFT_EXTRA_CONVERSION_TYPES = frozenset({"mixtral"})


def _moe_conversion_types() -> set[str] | None:
    """Model types whose peft config peft may rewrite for transformers v5's MoE layout (_convert_peft_config_moe
    looks the type up in transformers' _MODEL_TO_CONVERSION_PATTERN plus its own additions); None when
    transformers does not say (then peft counts every model)."""
    try:
        from transformers.conversion_mapping import _MODEL_TO_CONVERSION_PATTERN as patterns
    except ImportError:
        return None
    return set(patterns) | _PEFT_EXTRA_CONVERSION_TYPES


@contextlib.contextmanager
def _peft_on_meta() -> Iterator[None]:
    """peft counting on the meta device, with bitsandbytes hidden from it.

    The meta device: peft creates lora_A / lora_B where the device context says and initialises them (kaiming,
    zeros); on the CPU that is about 0.5 s of a 70B sizing spent on numbers nobody reads. On meta it is nothing.
    bitsandbytes: `import peft` imports it when it is installed (peft.helpers), and peft's dispatch for each
    adapted layer asks for it (is_bnb_4bit_available imports it): 0.8 s and torch._inductor, on a model that has
    no bitsandbytes layer, so peft's default dispatch wraps every target exactly as it would with it. An entry
    of None in sys.modules makes `import bitsandbytes` fail and find_spec answer None for the duration; the
    libraries' cached "is it available" answers are cleared afterwards, so later callers see it again (only
    peft.helpers' module-level `bnb`, used to dequantise bnb weights, stays None in this process, which never
    loads a quantised model). Another thread importing a library meanwhile (--non-interactive preloads accelerate
    and DeepSpeed for validation) sees it missing too: validation never uses it, and the wizard's own
    bitsandbytes rules read the package metadata. Nothing is hidden when bitsandbytes is already imported.
    """
    import torch

    hide = "bitsandbytes" not in sys.modules
    if hide:
        sys.modules["bitsandbytes"] = None
        _clear_bnb_availability()
    try:
        with torch.device("meta"):
            yield
    finally:
        if hide:
            if "bitsandbytes" in sys.modules and sys.modules["bitsandbytes"] is None:
                del sys.modules["bitsandbytes"]
            _clear_bnb_availability()


# lru_cached "is bitsandbytes available" answers of the libraries sizing drives (peft 0.21, transformers 5.24).
_BNB_AVAILABILITY = (("peft.import_utils", "is_bnb_available"), ("peft.import_utils", "is_bnb_4bit_available"),
                     ("transformers.utils.import_utils", "is_bitsandbytes_available"))


def _clear_bnb_availability() -> None:
    for module_name, name in _BNB_AVAILABILITY:
        clear = getattr(getattr(sys.modules.get(module_name), name, None), "cache_clear", None)
        if clear is not None:
            clear()
# Why the default targets are all the Linear layers, for LoRA and QLoRA alike (and not peft's per-architecture
# mapping, q_proj and v_proj for Llama, from the LoRA paper's attention-only experiments):
# - QLoRA paper (Dettmers et al. 2023, arXiv:2305.14314, section 4 and figure 2): "LoRA on all linear transformer
#   block layers is required to match full finetuning performance"; adapting only the attention's query and value
#   falls short, whatever the rank. The finding is about LoRA's placement, 16-bit LoRA included.
# - The recipes people run follow it: LLaMA-Factory's lora_target: all, axolotl's lora_target_linear: true in its
#   LoRA and QLoRA examples, peft's and TRL's docs with target_modules="all-linear".
# Named module by module (peft's own all-linear list, read from the model), not as "all-linear": under
# transformers 5 that shorthand also wraps fused MoE expert parameters, which peft refuses with dropout > 0.
DEFAULT_TARGETS_WHY = "every Linear layer but the output layer, as the QLoRA paper and LLaMA-Factory/axolotl recipes"


def all_linear_names(model) -> list[str]:
    """The leaf names of the modules peft's "all-linear" targets (Linear and Conv1D, not the output layer)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    config = _maybe_include_all_linear_layers(LoraConfig(target_modules=ALL_LINEAR, task_type="CAUSAL_LM"), model)
    return sorted({name.rsplit(".", 1)[-1] for name in config.target_modules})


def linear_leaf_names(model) -> list[str] | None:
    """all_linear_names without peft: peft's _maybe_include_all_linear_layers on a model with no adapter yet
    (every torch Linear / transformers Conv1D, less the output embeddings of a PreTrainedModel; a causal LM's
    task type excludes no classifier head), as sorted leaf names; None when the output embeddings are no module of
    the model (peft fails on that)."""
    import torch
    from transformers import PreTrainedModel
    from transformers.pytorch_utils import Conv1D

    modules = list(model.named_modules())
    names = {name for name, module in modules if isinstance(module, (torch.nn.Linear, Conv1D))}
    if isinstance(model, PreTrainedModel):
        output = model.get_output_embeddings()
        if output is not None:
            found = [name for name, module in modules if module is output]
            if not found:
                return None
            names.discard(found[0])
    return sorted({name.rsplit(".", 1)[-1] for name in names})


def default_targets(model_type: str | None) -> list[str] | None:
    """peft's default LoRA targets for a model type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)."""
    from wizard.libraries import IMPORT_LOCK
    with IMPORT_LOCK:                 # `import peft` imports transformers and accelerate (wizard.libraries)
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping

    found = mapping.get(model_type or "")
    if found is None:
        return None
    return [found] if isinstance(found, str) else list(found)


def _apply_lora(base, options: LoraOptions, source: str):
    """get_peft_model on the meta model; returns (peft model, the target names used)."""
    from peft import LoraConfig, get_peft_model

    model_type = getattr(base.config, "model_type", None)
    if options.targets == ALL_LINEAR:
        target_modules: Any = ALL_LINEAR
    elif options.targets is None:
        # The default (DEFAULT_TARGETS_WHY), as names: a None target list would also hit peft 0.21's
        # transformers-v5 MoE conversion, which empties it (Mixtral then fails).
        target_modules = all_linear_names(base)
        if not target_modules:
            raise InputError("lora_targets", f"{model_type!r} has no Linear layers for LoRA",
                             "comma-separated module names such as q_proj,v_proj")
    else:
        target_modules = options.target_list
    config = LoraConfig(r=options.rank, lora_alpha=options.lora_alpha, lora_dropout=options.dropout,
                        target_modules=target_modules, bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(base, config)
    except (ValueError, TypeError, RuntimeError) as exc:
        text = str(exc).strip().splitlines()
        if "lora_dropout" in str(exc):   # peft's ParamWrapper (MoE experts under all-linear) needs dropout 0
            raise InputError("lora_dropout", f"{options.dropout} with these targets on {source}: "
                             f"{(text[0] if text else '')[:200]}", "0 when MoE expert weights are targeted") from None
        raise InputError("lora_targets", f"peft cannot apply {options.targets or 'the default targets'} to "
                                         f"{source}: {(text[0] if text else type(exc).__name__)[:200]}",
                         "all-linear, or module names that exist in the model") from None
    used = peft_model.peft_config["default"]
    names = set(used.target_modules) if not isinstance(used.target_modules, str) else {used.target_modules}
    names |= set(getattr(used, "target_parameters", None) or [])
    return peft_model, sorted(names)


def _adapted_modules(peft_model) -> dict[str, int]:
    """Leaf name -> count of the layers peft wrapped (every LoraLayer has a lora_A ModuleDict)."""
    counts: dict[str, int] = {}
    for name, module in peft_model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if lora_a is None or not len(lora_a) or name.endswith(("lora_A", "lora_B")):
            continue
        leaf = _adapted_leaf(name, module)
        counts[leaf] = counts.get(leaf, 0) + 1
    return dict(sorted(counts.items()))


def _adapted_leaf(name: str, module) -> str:
    # A peft ParamWrapper adapts one parameter (transformers v5 MoE: the experts' fused gate_up_proj /
    # down_proj, nested in one another, or the router's weight); name it by that parameter, a Linear by its module.
    parameter = getattr(module, "parameter_name", None)
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(parameter, str) and parameter and parameter != "weight":
        return parameter
    return leaf


# ---------------------------------------------------------------------------------------------------------
# Which weights bitsandbytes quantises (transformers' Bnb4BitHfQuantizer, read from transformers 5.24)
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Quantized:
    modules: int
    params: int
    weight_bytes: int
    constant_bytes_single: int
    constant_bytes_double: int
    constant_bytes: int
    unquantized_params: int


def quantized_module_names(model) -> list[str]:
    """Names of the modules that `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))`
    turns into bnb Linear4bit, decided as transformers decides it without importing bitsandbytes:

    - Bnb4BitHfQuantizer._process_model_before_weight_loading skips get_modules_to_not_convert(model,
      llm_int8_skip_modules=None, model._keep_in_fp32_modules); with no skip list that is
      quantizers/base.py get_keys_to_not_convert: tied weights, the last parameter's module and the output
      embeddings (lm_head).
    - integrations/bitsandbytes.py replace_with_bnb_linear converts only `type(module) is nn.Linear` or a
      GPT-2 Conv1D, when quantizers_utils.should_convert_module says the name is not skipped. Embeddings and
      norms are not Linear; transformers v5's fused MoE experts are parameters of a non-Linear module, so
      they stay in the compute dtype too.
    """
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = HfQuantizer.get_modules_to_not_convert(model, None, getattr(model, "_keep_in_fp32_modules", None))
    return [name for name, module in model.named_modules()
            if (type(module) is torch.nn.Linear or isinstance(module, Conv1D)) and should_convert_module(name, skip)]


def _nf4_of_model(model, options: LoraOptions) -> _Quantized:
    names = set(quantized_module_names(model))
    modules = dict(model.named_modules())
    numels = [modules[n].weight.numel() for n in sorted(names)]
    quantized_ids = {id(modules[n].weight) for n in names}
    total = sum(p.numel() for _, p in model.named_parameters())
    unquantized = total - sum(p.numel() for _, p in model.named_parameters() if id(p) in quantized_ids)
    single = sum(nf4_linear_bytes(n, False, options.quant_storage).constants for n in numels)
    double = sum(nf4_linear_bytes(n, True, options.quant_storage).constants for n in numels)
    return _Quantized(
        modules=len(numels), params=sum(numels),
        weight_bytes=sum(nf4_linear_bytes(n, options.double_quant, options.quant_storage).weights for n in numels),
        constant_bytes_single=single, constant_bytes_double=double,
        constant_bytes=double if options.double_quant else single, unquantized_params=unquantized,
    )


def _fill_quant(shape: AdapterShape, quant: _Quantized) -> None:
    shape.quantized_modules = quant.modules
    shape.quantized_params = quant.params
    shape.nf4_weight_bytes = quant.weight_bytes
    shape.nf4_constant_bytes = quant.constant_bytes
    shape.nf4_constant_bytes_single = quant.constant_bytes_single
    shape.nf4_constant_bytes_double = quant.constant_bytes_double
    shape.unquantized_params = quant.unquantized_params


# ---------------------------------------------------------------------------------------------------------
# --params: a Llama shape, counted analytically (no torch)
# ---------------------------------------------------------------------------------------------------------

# Llama's Linear layers per decoder layer: name -> (in_features, out_features) as functions of the shape.
def _llama_linears(hidden: int, heads: int, kv_heads: int, intermediate: int) -> dict[str, tuple[int, int]]:
    head_dim = hidden // heads
    return {
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden),
    }


def size_llama_adapters(shape, options: LoraOptions) -> AdapterShape:
    """Adapters of a LlamaForCausalLM of `shape` (wizard.sizing.model.ModelShape), without building anything.

    LoRA on a Linear(in, out) adds A (r x in) and B (out x r): r * (in + out) parameters (peft
    tuners/lora/layer.py update_layer). "all-linear" is every Linear but the output layer (peft
    _maybe_include_all_linear_layers); QLoRA quantises the same seven Linears per layer and leaves the
    embeddings, norms and lm_head unquantised (quantized_module_names).
    """
    from wizard.sizing.model import llama_param_count

    if options.method not in ("lora", "qlora"):
        raise ValueError(f"size_llama_adapters needs method lora or qlora, not {options.method!r}")
    linears = _llama_linears(shape.hidden_size, shape.heads, shape.kv_heads, shape.intermediate_size)
    if options.targets == ALL_LINEAR:
        targets = list(linears)
    elif options.targets is None:
        targets = list(linears)               # the default: every Linear of the layer (DEFAULT_TARGETS_WHY)
    else:
        targets = options.target_list or []
        unknown = [t for t in targets if t not in linears]
        if unknown:
            raise InputError("lora_targets", f"{','.join(unknown)} is not a Linear of a Llama layer",
                             "all-linear, default, or names from " + ",".join(linears))
    trainable = shape.layers * sum(options.rank * sum(linears[t]) for t in targets)
    total = llama_param_count(shape.hidden_size, shape.layers, shape.heads, shape.kv_heads,
                              shape.intermediate_size, shape.vocab_size, shape.tied_embeddings)
    result = AdapterShape(
        method=options.method, rank=options.rank, trainable_params=trainable, frozen_params=total,
        adapted_modules=shape.layers * len(targets), modules_per_target={t: shape.layers for t in sorted(targets)},
        targets=sorted(targets), double_quant=options.double_quant, quant_storage=options.quant_storage,
        source=shape.source, exact=False,
        notes=["--params shape: a Llama-like model, adapters counted analytically"],
    )
    if options.method == "qlora":
        # Every layer has the same Linears: one layer's figures times the layers (never a list per layer, which
        # a huge --layers would make huge).
        layer = [i * o for i, o in linears.values()]
        single = shape.layers * sum(nf4_linear_bytes(n, False, options.quant_storage).constants for n in layer)
        double = shape.layers * sum(nf4_linear_bytes(n, True, options.quant_storage).constants for n in layer)
        weights = shape.layers * sum(nf4_linear_bytes(n, options.double_quant, options.quant_storage).weights
                                     for n in layer)
        _fill_quant(result, _Quantized(
            modules=len(layer) * shape.layers, params=sum(layer) * shape.layers,
            weight_bytes=weights, constant_bytes_single=single, constant_bytes_double=double,
            constant_bytes=double if options.double_quant else single,
            unquantized_params=total - sum(layer) * shape.layers,
        ))
    return result


# ---------------------------------------------------------------------------------------------------------
# What QLoRA needs from the strategy
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QloraRequirements:
    quant_storage: str            # the bnb_4bit_quant_storage to emit
    zero3_init_flag: bool | None  # accelerate's deepspeed_config.zero3_init_flag (None: not DeepSpeed ZeRO-3)
    reason: str


def qlora_requirements(backend: str, zero_stage: int | None, precision: str) -> QloraRequirements:
    """The rule implemented (peft 0.21 / transformers 5.24 / accelerate 1.15):

    - DeepSpeed ZeRO-3: bnb_4bit_quant_storage = the compute dtype and zero3_init_flag: true (peft docs,
      accelerate/deepspeed.md "Use PEFT QLoRA and DeepSpeed with ZeRO3"): ZeRO-3 partitions parameters as
      flat tensors of the model's dtype, so the packed 4-bit weights must be stored in that dtype to be
      partitioned with the rest. transformers skips zero.Init for quantised models (modeling_utils.py
      `needs_zero3_init = is_deepspeed_zero3_enabled() and not _is_quantized`), so the NF4 model is loaded
      whole on each GPU before the engine partitions it.
    - FSDP: bnb_4bit_quant_storage = the compute dtype (peft docs, accelerate/fsdp.md "Use PEFT QLoRA and
      FSDP"); accelerate's fsdp2_prepare_model (utils/fsdp_utils.py) excludes non-floating frozen
      Params4bit (uint8 storage) from sharding, so they would stay whole on every GPU.
    - Single GPU, DDP, ZeRO-1/2: the default uint8 storage (no parameter is partitioned).
    """
    compute = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}.get(precision)
    if compute is None:
        raise InputError("precision", f"{precision!r} is not a resolved precision", "bf16|fp16|fp32")
    if backend == "deepspeed" and zero_stage == 3:
        return QloraRequirements(compute, True, "DeepSpeed ZeRO-3 partitions the 4-bit weights only when they "
                                 "are stored in the compute dtype; zero3_init_flag: true as peft's guide says")
    if backend == "fsdp":
        return QloraRequirements(compute, None, "FSDP shards Params4bit only when stored in a floating dtype "
                                 "(accelerate leaves uint8 ones unsharded)")
    return QloraRequirements("uint8", None, "no parameter is partitioned: bitsandbytes' default uint8 storage")


def check_qlora_strategy(options: LoraOptions, backend: str, zero_stage: int | None, precision: str) -> None:
    """InputError when an explicitly chosen quant storage contradicts what the strategy needs."""
    if options.method != "qlora":
        return
    need = qlora_requirements(backend, zero_stage, precision)
    if need.quant_storage != "uint8" and options.quant_storage != need.quant_storage:
        raise InputError("quant_storage", f"{options.quant_storage} with {backend}"
                         f"{' ZeRO-3' if zero_stage == 3 else ''}: {need.reason}", need.quant_storage)


# ---------------------------------------------------------------------------------------------------------
# Model states per GPU
# ---------------------------------------------------------------------------------------------------------

def adapter_model_states(adapters: AdapterShape, strategy: str, precision: str, optimizer: str = "adamw",
                         num_gpus_per_node: int = 1, num_nodes: int = 1, offload_optimizer: bool = False,
                         largest_frozen_layer_params: int = 0, kbit_prepared: bool = True,
                         additional_buffer_factor: float = DS_ADDITIONAL_BUFFER_FACTOR,
                         offload_param: bool = False, reshard: bool = True) -> ModelStates:
    """Weights, gradients and optimizer states per GPU of LoRA / QLoRA training, and host RAM per machine.

    T = trainable (adapter) parameters, w = bytes of the compute dtype (working_bytes(precision)).
    - Frozen base: LoRA keeps it in the compute dtype (from_pretrained(dtype=...)); QLoRA keeps the NF4
      bytes plus the unquantised parameters. No gradient and no optimizer state: peft sets
      requires_grad=False on it, and the HF Trainer gives the optimizer only parameters that require grad.
    - single / ddp (torch AMP, no DeepSpeed): peft's autocast_adapter_dtype=True (tuners_utils.py
      cast_adapter_dtype) keeps the adapters in fp32 when the base is 16-bit, so they are their own master:
      4T weights + 4T fp32 gradients + optimizer states (memory.state_bytes). For QLoRA, peft's
      prepare_model_for_kbit_training (utils/other.py; the QLoRA recipes call it) casts every non-Params4bit
      16-bit parameter to fp32: the unquantised parameters cost 4 B each (kbit_prepared=False: w).
    - zero1 / zero2 (DeepSpeed): the engine casts every floating parameter, adapters and unquantised base
      included, to the compute dtype (engine.py _configure_distributed_model ->
      _cast_module_mixed_precision). DeepSpeed's optimizer holds only the trainable parameters, so the frozen
      base is replicated on every GPU, and the adapters cost what memory.states_zero1 / states_zero2 give
      for T parameters (DeepSpeed's estimator accounting).
    - zero3: every parameter is partitioned, frozen ones too (stage3.py partitions all module parameters):
      base / N, except the quantisation constants, which live in Params4bit.quant_state (not parameters)
      and stay whole on every GPU; plus the gathered 16-bit weights of the largest frozen module
      (w * largest_frozen_layer_params, no gradient since it is frozen). Adapters: memory.states_zero3 for
      T parameters with no largest-layer term.
    - offload_optimizer: the adapters' fp32 master, gradients and optimizer states move to host RAM as in
      the ZeRO estimators (memory.states_zero2 / states_zero3 with offload, for T).
    - zero3 with offload_param (and offload_optimizer, DeepSpeed has no parameter-only case): the partitioned
      base moves to host RAM (its 16-bit / packed 4-bit bytes, per machine its processes' partitions, x1.5 as
      the estimators' additional buffer); the GPU keeps the whole quantisation constants and the gathered
      largest frozen module.
    - fsdp: see `_fsdp_adapter_states`.
    Host RAM (cpu): the offloaded adapter states (estimator accounting) plus, GUESS, the base as loaded:
    LoRA without ZeRO-3 materialises the frozen base in the compute dtype in every local process before it
    moves to the GPU (w * frozen * processes per machine); with ZeRO-3 (zero.Init) and for QLoRA (weights
    quantised as each is loaded onto the GPU) no whole copy is held on the host, so that term is 0.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    if adapters.method not in ("lora", "qlora"):
        raise ValueError("adapter_model_states needs a lora or qlora AdapterShape")
    w = working_bytes(precision)
    trainable = adapters.trainable_params
    world = num_gpus_per_node * num_nodes
    qlora = adapters.method == "qlora"
    host_load = 0 if qlora or strategy == "zero3" else adapters.frozen_params * w * num_gpus_per_node

    if strategy in ("single", "ddp"):
        unq = 4 if qlora and kbit_prepared else w
        sb = state_bytes(precision, optimizer)
        adapter_bytes = 4                 # fp32 adapters (cast_adapter_dtype), also in fp32 training
        cpu = host_load
        optim = sb.optim * trainable
        if offload_optimizer:
            raise ValueError("optimizer offload needs DeepSpeed (zero1/zero2/zero3)")
        return ModelStates(parameters=adapters.frozen_bytes(w, unq) + adapter_bytes * trainable,
                           gradients=FP32_GRAD_BYTES * trainable, optimizer=optim, cpu=cpu)

    if strategy == "fsdp":
        return _fsdp_adapter_states(adapters, precision, optimizer, world, num_nodes, reshard, offload_param,
                                    additional_buffer_factor)

    if strategy in ("zero1", "zero2"):
        states_of = states_zero1 if strategy == "zero1" else states_zero2
        adapter = states_of(trainable, precision, optimizer, num_gpus_per_node, num_nodes,
                            offload_optimizer=offload_optimizer, additional_buffer_factor=additional_buffer_factor)
        cpu = host_load + (adapter.cpu if offload_optimizer else 0)
        return ModelStates(parameters=adapters.frozen_bytes(w) + adapter.parameters,
                           gradients=adapter.gradients, optimizer=adapter.optimizer, cpu=cpu)

    adapter = states_zero3(trainable, 0, precision, optimizer, num_gpus_per_node, num_nodes,
                           offload_optimizer=offload_optimizer, offload_param=offload_param, zero_init=True,
                           additional_buffer_factor=additional_buffer_factor)
    partitioned, replicated = _partitioned_base(adapters, w)
    # The largest frozen module's gathered copy; none with one process and the partitions on the GPU, where
    # ZeRO-3 computes with the partition itself (memory.zero3_gathers).
    gathered = w * largest_frozen_layer_params if zero3_gathers(world, offload_param) else 0
    cpu = host_load + (adapter.cpu if offload_optimizer else 0)
    if offload_param:
        cpu += int(partitioned / num_nodes * additional_buffer_factor)
        return ModelStates(parameters=replicated + gathered + adapter.parameters, gradients=adapter.gradients,
                           optimizer=adapter.optimizer, cpu=cpu)
    frozen = int(partitioned / world) + replicated + gathered
    return ModelStates(parameters=frozen + adapter.parameters, gradients=adapter.gradients,
                       optimizer=adapter.optimizer, cpu=cpu)


def _partitioned_base(adapters: AdapterShape, w: int) -> tuple[int, int]:
    """(bytes of the frozen base a ZeRO-3 / FSDP rung partitions, bytes every GPU keeps whole). QLoRA: the
    packed NF4 codes (stored in the compute dtype, the same bytes) and the unquantised parameters in the
    compute dtype are parameters and get partitioned; the quantisation constants live in Params4bit.quant_state,
    not in parameters, and stay whole on every GPU."""
    if adapters.method == "qlora":
        return adapters.nf4_weight_bytes + adapters.unquantized_params * w, adapters.nf4_constant_bytes
    return adapters.frozen_params * w, 0


def _fsdp_adapter_states(adapters: AdapterShape, precision: str, optimizer: str, world: int, num_nodes: int,
                         reshard: bool, offload: bool, additional_buffer_factor: float) -> ModelStates:
    """LoRA / QLoRA under FSDP2 (fully_shard), as accelerate 1.15's fsdp2_prepare_model sets it up.

    - Every parameter is sharded over the N ranks, the frozen base too (`_partitioned_base`): LoRA's base in the
      compute dtype; QLoRA's NF4 codes only when bnb_4bit_quant_storage is a floating dtype (accelerate leaves
      uint8 Params4bit out of sharding; qlora_requirements makes it the compute dtype) and its unquantised
      parameters in the compute dtype (TRL's SFTTrainer skips prepare_model_for_kbit_training for sharded QLoRA,
      `is_sharded_qlora`). The quantisation constants stay whole on every rank.
    - The adapters are fp32 (peft's cast_adapter_dtype; accelerate upcasts trainable parameters for FSDP2 mixed
      precision) and sharded with their fp32 gradients and optimizer states: (4 + 4 + optimizer) T / N, as
      memory.states_fsdp for T parameters.
    - Without resharding every layer's gathered weights stay alive from its forward to its backward: the whole
      base (partitioned bytes) plus the adapters in the compute dtype, as states_fsdp's unsharded term.
    - CPU offload (CPUOffloadPolicy): the shards of the base, the adapters' weights, gradients and optimizer
      states live in host RAM, per machine its processes' shards, x1.5 as states_fsdp (GUESS modelled on
      DeepSpeed's accounting).
    """
    sb = state_bytes(precision, optimizer)
    w = working_bytes(precision)
    trainable = adapters.trainable_params
    partitioned, replicated = _partitioned_base(adapters, w)
    unsharded = 0 if reshard else partitioned + w * trainable
    if offload:
        on_host = partitioned + (4 + FP32_GRAD_BYTES + sb.optim) * trainable
        return ModelStates(parameters=replicated + unsharded, gradients=0, optimizer=0,
                           cpu=int(on_host / num_nodes * additional_buffer_factor))
    return ModelStates(parameters=int(partitioned / world) + replicated + int(4 * trainable / world) + unsharded,
                       gradients=int(FP32_GRAD_BYTES * trainable / world),
                       optimizer=int(sb.optim * trainable / world), cpu=0)


def qlora_load_gpu_bytes(adapters: AdapterShape, precision: str) -> int:
    """GPU bytes of one rank while a QLoRA model loads on a rung that shards weights (ZeRO-3, FSDP): the whole
    4-bit model. transformers 5.24 builds quantised models without zero.Init (modeling_utils: zero.Init and
    FSDP's meta loading both exclude `is_quantized`), and bitsandbytes' quantiser sets device_map={"": current
    GPU} (quantizer_bnb_4bit.update_device_map), so every rank quantises the whole model onto its own GPU;
    accelerate 1.15's fsdp2_prepare_model skips its RAM-efficient path for Params4bit ("bypassing the move to
    meta will still cause the VRAM spike"). Only then does ZeRO-3 / FSDP partition it. Run on two CPU ranks under
    accelerate's FSDP environment, rank 1 holds the whole NF4 model as rank 0 does (bench/measure_qlora_loading.py,
    bench/results/qlora-loading.md). 0 for LoRA."""
    if adapters.method != "qlora":
        return 0
    return adapters.frozen_bytes(working_bytes(precision))


def adapter_fsdp_buffers(adapters: AdapterShape, layers: int, root_params: int, precision: str,
                         reshard: bool) -> int:
    """memory.fsdp_buffers for LoRA / QLoRA: the gathered root (embeddings, LM head, in the compute dtype) and,
    with resharding, two gathered layers of the frozen base in its stored bytes (4-bit codes for QLoRA); backward
    reduces only the adapters' gradients: two layers' worth of them. HEURISTIC, as fsdp_buffers."""
    w = working_bytes(precision)
    partitioned, _ = _partitioned_base(adapters, w)
    root = min(root_params * w, partitioned)
    layer = max(partitioned - root, 0) // max(layers, 1) + w * adapters.trainable_params // max(layers, 1)
    adapter_grads = 2 * w * adapters.trainable_params // max(layers, 1)
    return root + (2 * layer if reshard else 0) + adapter_grads
