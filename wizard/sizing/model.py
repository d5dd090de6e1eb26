"""Model sizing: exact parameter counts from a config, built on the meta device (no weights).

Two ways in:
- `size_model(id_or_path)`: a local directory with `config.json`, a `config.json` path, or a Hub id
  that is already in the local Hugging Face cache. transformers builds the model on the `meta`
  device (shapes only, no memory), and we count what it built: exact, tied weights counted once.
- `from_params(params, ...)`: `--params 7B` with no config; a well-known Llama/Qwen shape of about
  that size, with optional overrides (exact=False).

torch and transformers are imported inside `size_model` only: `wizard plan --params 7B` and
`wizard --help` must stay free of them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import re
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from wizard.errors import InputError
from wizard.fsutil import replace_file
from wizard.paths import hf_home
from wizard.units import fmt_count, parse_count

_MODEL_ALLOWED = "a local directory with config.json, a config.json path, or a Hub id in the local HF cache"


@dataclass
class ModelShape:
    params: int                           # exact; tied embeddings counted once
    largest_layer_params: int             # max over modules of params owned directly (DeepSpeed's definition)
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    intermediate_size: int
    layer_class: str | None = None        # decoder layer class, for FSDP transformer wrapping
    model_type: str | None = None
    tied_embeddings: bool = False
    source: str = ""                      # path / hub id / "--params 7B"
    exact: bool = True                    # False when estimated from --params
    num_experts: int = 0                  # MoE: experts per MoE layer (0 = dense)
    experts_per_token: int = 0            # MoE: experts routed per token
    max_position_embeddings: int | None = None
    moe_block_class: str | None = None    # MoE: class of the block holding the experts (a ZeRO-3 leaf module)
    # Fields below were added later; their defaults keep older cached shapes and hand-built ones valid.
    encoder_layers: int = 0               # encoder-decoder: encoder layers (`layers` counts encoder + decoder)
    decoder_layers: int = 0               # encoder-decoder: decoder layers, each with cross-attention
    head_dim: int | None = None           # query/key width per head when it is not hidden / heads
    v_head_dim: int | None = None         # value width per head (DeepSeek's MLA), else head_dim
    kv_lora_rank: int = 0                 # DeepSeek MLA: the compressed key/value width
    moe_intermediate_size: int = 0        # MoE: one routed expert's width (0: intermediate_size)
    shared_expert_intermediate_size: int = 0  # MoE: the always-on shared expert(s) width, all of them together
    moe_layers: int | None = None         # MoE: layers with routed experts (None: all, when num_experts)
    attn_implementation: str | None = None    # what transformers picks by default for this class
    ssm_state_size: int = 0               # Mamba-style SSM: state size N (0: not an SSM)
    ssm_inner_size: int = 0               # Mamba-style SSM: the expanded inner width
    weights_dtype_bytes: int | None = None    # bytes per weight of the checkpoint's dtype (config dtype)
    gated_mlp: bool | None = None         # set when the config says (T5's is_gated_act); else from model_type
    attention_dropout: float = 0.0        # training dropout on the attention probabilities (BERT 0.1, Llama 0.0):
    #                                       eager attention then keeps a mask and a dropped copy of every score
    # The head the built class has (from the config's `architectures`, else a causal LM): its output decides
    # the logits' size (a sequence classifier's are num_labels per sample, not a vocabulary per token).
    task: str = "causal-lm"
    num_labels: int = 0

    @property
    def is_ssm(self) -> bool:
        return self.ssm_state_size > 0

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder_layers > 0 and self.decoder_layers > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Finding config.json
# ---------------------------------------------------------------------------------------------

def hub_cache_dir() -> Path:
    """The Hub cache huggingface_hub would use, read from the environment now (not at import).

    Same precedence as huggingface_hub.constants: HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, then
    $HF_HOME/hub, with HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface.
    Tests and users change HF_HOME after huggingface_hub was imported, so its constants can be stale.
    """
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return Path(hf_home()) / "hub"


# A Hub repo id: "name" or "org/name", optionally "@revision"; letters, digits, "-", "_", ".".
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


def _looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not text.endswith(".json") and ".." not in text


def _resolve_config_path(id_or_path: str) -> tuple[Path, str]:
    """Return (path to config.json, source label) or raise InputError."""
    text = str(id_or_path).strip()
    if not text:
        raise InputError("model", "is empty", _MODEL_ALLOWED)
    path = Path(text).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise InputError("model", f"{text} has no config.json", _MODEL_ALLOWED)
        return config, str(path)
    if path.is_file():
        return path, str(path)
    if _looks_like_hub_id(text):
        return _config_from_hub_cache(text), text
    raise InputError("model", f"{text} does not exist", _MODEL_ALLOWED)


def _config_from_hub_cache(hub_id: str) -> Path:
    """config.json of a Hub model from the local cache only; never touches the network."""
    repo_id, _, revision = hub_id.partition("@")
    cache = hub_cache_dir()
    found = None
    with _offline():
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache),
                                           revision=revision or None)
        except (ValueError, OSError):  # HFValidationError (a malformed id) or an unreadable cache: not cached
            found = None
    if isinstance(found, str) and os.path.isfile(found):
        return Path(found)
    if not revision:
        # Snapshots fetched by commit hash have no refs/main; any snapshot with a config will do.
        fallback = _newest_snapshot_config(cache / _repo_folder(repo_id))
        if fallback is not None:
            return fallback
    raise InputError(
        "model",
        f"{hub_id} is not in the local Hugging Face cache ({cache}); download it "
        f"(hf download {repo_id} config.json) or pass --params 7B",
        _MODEL_ALLOWED,
    )


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _newest_snapshot_config(repo_dir: Path) -> Path | None:
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    configs = [s / "config.json" for s in snapshots.iterdir() if (s / "config.json").is_file()]
    return max(configs, key=lambda p: p.stat().st_mtime) if configs else None


def cached_model_ids() -> list[str]:
    """Hub model ids in the local HF cache that have a config.json in some snapshot (sorted).

    A filesystem scan only (no huggingface_hub import): cheap enough for TUI completion.
    """
    cache = hub_cache_dir()
    try:
        entries = list(cache.iterdir())
    except OSError:
        return []
    ids = []
    for entry in entries:
        if not entry.name.startswith("models--") or not entry.is_dir():
            continue
        if _newest_snapshot_config(entry) is None:
            continue
        ids.append(entry.name[len("models--"):].replace("--", "/"))
    return sorted(ids, key=str.lower)


# ---------------------------------------------------------------------------------------------
# Reading and building the config
# ---------------------------------------------------------------------------------------------

CONFIG_MAX_BYTES = 8 * 1024 * 1024   # real config.json files are a few KiB (label maps: a few hundred)
# Upper limits on shape values, far above any real model: sizing builds the model on the meta device,
# so 10 million layers would take minutes and gigabytes before any arithmetic is done.
SHAPE_LIMITS = {
    "num_hidden_layers": 10_000, "n_layer": 10_000, "num_layers": 10_000, "n_layers": 10_000,
    "hidden_size": 1_000_000, "n_embd": 1_000_000, "d_model": 1_000_000,
    "intermediate_size": 10_000_000, "n_inner": 10_000_000, "ffn_dim": 10_000_000,
    "num_attention_heads": 100_000, "n_head": 100_000, "num_key_value_heads": 100_000,
    "vocab_size": 100_000_000, "num_local_experts": 100_000, "num_experts": 100_000,
    # transformers' PreTrainedConfig builds id2label / label2id with num_labels entries before any model exists
    # (10^45 ended in MemoryError)
    "num_labels": 1_000_000,
}


def _read_config_dict(config_path: Path) -> dict[str, Any]:
    from wizard.fsutil import loads_limited, quote_path, read_text_limited
    text = read_text_limited(config_path, CONFIG_MAX_BYTES, "model", _MODEL_ALLOWED)
    data = loads_limited(text, "json", "model", quote_path(config_path), "a Hugging Face config.json")
    if not isinstance(data, dict):
        raise InputError("model", f"{config_path} is not a JSON object", "a Hugging Face config.json")
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise InputError("model", f"{config_path} has no model_type", "a Hugging Face config.json with model_type")
    architectures = data.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise InputError("model", f"architectures in {config_path} is {str(architectures)[:40]!r}, not a list of "
                                  "class names", 'a Hugging Face config.json ("architectures": ["LlamaForCausalLM"])')
    _check_shape_limits(data, config_path)
    return data


def _check_shape_limits(data: dict[str, Any], config_path: Path) -> None:
    """Shape values above SHAPE_LIMITS, in the config or a nested one (text_config), are bad input."""
    stack = [data]
    while stack:
        node = stack.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                stack.append(value)
            elif key in SHAPE_LIMITS and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and not abs(value) <= SHAPE_LIMITS[key]:
                raise InputError("model", f"{key} = {str(value)[:30]} in {config_path} is above the limit "
                                          f"{SHAPE_LIMITS[key]:,}", f"{key} <= {SHAPE_LIMITS[key]:,}")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE=1 for the duration, restored afterwards (nothing here may reach the network)."""
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' logging and warnings while we build, then restore the user's level."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


@contextlib.contextmanager
def _heavy_imports() -> Iterator[None]:
    """Wrap the first import of torch, transformers and a modeling module: cyclic GC paused while
    they load, and what they created frozen afterwards (gc.freeze: ignored by later collections).

    Why: the imports create over half a million objects that live until exit. With the GC on,
    every full collection during the import walks all of them again (~0.6 s of a cold sizing),
    and the interpreter's final collection at exit walks them once more (~1 s). gc.freeze moves
    every tracked object to a generation collections skip: modules and classes were never going
    to be collected, and the only thing collected less than before is cyclic garbage that already
    existed at that moment. Later sizings in the same process (the TUI) import nothing new of
    that size, so this is done once.
    """
    if "transformers.modeling_utils" in sys.modules:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    finder = _WidenTransformersScanCache()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
        gc.freeze()
        if was_enabled:
            gc.enable()


class _WidenTransformersScanCache:  # an import finder (find_spec); importlib.abc costs 24 ms to import
    """While transformers' import_utils loads, give its model-folder scan an unbounded cache.

    Why: on the way to a modeling module transformers scans its ~560 model folders twice, reading
    every file's __all__ (`import transformers`, then `import transformers.models`), and its
    per-folder `lru_cache` keeps 128 entries, so the second pass finds nothing cached (~0.45 s).
    The scan is a pure function of the folder, so caching every folder changes no result. When
    transformers is laid out differently this finds nothing to widen and changes nothing.
    """

    MODULE = "transformers.utils.import_utils"
    FUNCTION = "create_import_structure_from_path"

    def find_spec(self, name, path, target=None):
        if name != self.MODULE:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        load = getattr(spec.loader, "exec_module", None) if spec is not None else None
        if load is None:
            return spec

        def exec_module(module) -> None:
            load(module)
            scan = getattr(module, self.FUNCTION, None)
            if callable(getattr(scan, "__wrapped__", None)) and hasattr(scan, "cache_info"):
                # The scan recurses through this module-level name, so every folder lands in the new cache.
                setattr(module, self.FUNCTION, functools.lru_cache(maxsize=None)(scan.__wrapped__))

        with contextlib.suppress(AttributeError, TypeError):  # a loader that takes no attributes: leave it
            spec.loader.exec_module = exec_module  # this loader object was made for this one import
        return spec


def _config_class(data: dict[str, Any], config_path: Path):
    """The config class for `model_type`. Taken from the checkpoint's own architecture class when
    it names one (its module is imported for the build anyway), which skips loading transformers'
    Auto mappings: about 0.5 s of a ~5 s cold sizing."""
    import transformers

    model_type = data["model_type"]
    for name in data.get("architectures") or []:
        cls = getattr(transformers, str(name), None) if re.fullmatch(r"\w+", str(name)) else None
        config_class = getattr(cls, "config_class", None)
        if config_class is not None and getattr(config_class, "model_type", None) == model_type:
            return config_class
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise InputError(
            "model",
            f"model_type {model_type!r} in {config_path} is unknown to transformers {transformers.__version__}",
            "a model type transformers supports natively (upgrade transformers, or pass --params)",
        )
    return CONFIG_MAPPING[model_type]


def _build_config(data: dict[str, Any], config_path: Path):
    config_class = _config_class(data, config_path)
    try:
        return config_class.from_dict(dict(data))
    except Exception as exc:  # each model type's config __init__ raises its own (ValueError, TypeError, KeyError, ...)
        raise InputError("model", f"{config_path} is not a valid {data['model_type']} config: {_one_line(exc)}",
                         "a Hugging Face config.json") from None


def _import_and_build_config(data: dict[str, Any], config_path: Path):
    """Import torch and transformers (never at module level) and build the config; the config class
    comes from the checkpoint's architecture class, so this also imports its modeling module."""
    from wizard.libraries import IMPORT_LOCK
    with IMPORT_LOCK, _heavy_imports():
        import torch  # noqa: F401
        import transformers  # noqa: F401

        with _quiet_transformers():
            return _build_config(data, config_path)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else exc.__class__.__name__)[:200]


def _model_classes(config) -> Iterator:
    """Candidate classes, most faithful first: the checkpoint's own architecture, then the Auto
    classes that include a language-model head (so lm_head is counted), then the bare model.
    A generator, so the Auto machinery (~0.4 s of imports) is loaded only when needed."""
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, str(name), None) if re.fullmatch(r"\w+", str(name)) else None
        config_class = getattr(cls, "config_class", None)
        if cls is not None and config_class is not None and isinstance(config, config_class):
            yield cls
    for auto_name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModel"):
        auto = getattr(transformers, auto_name, None)
        if auto is not None:
            yield auto


def _build_on_meta(config, config_path: Path):
    import torch

    errors = []
    for cls in _model_classes(config):
        try:
            # The meta device gives every tensor a shape and no storage, so a 405B model costs
            # only its Python objects; weight init on meta tensors does no work.
            with torch.device("meta"):
                if cls.__name__.startswith("Auto"):
                    return cls.from_config(config)
                return cls(config)
        except ValueError as exc:  # "Unrecognized configuration class ... for this kind of AutoModel"
            errors.append(_one_line(exc))
        except Exception as exc:  # modeling code raises anything (ImportError of an optional package, TypeError, ...)
            errors.append(_one_line(exc))
            break
    raise InputError("model", f"transformers could not build {config.model_type} from {config_path}: "
                              f"{errors[-1] if errors else 'no model class'}", "a supported model config")


# ---------------------------------------------------------------------------------------------
# Measuring the built model
# ---------------------------------------------------------------------------------------------

def count_params(model) -> int:
    """Parameters counted once each. Meta tensors all have data_ptr 0, so DeepSpeed's
    data_ptr dedupe can't be used here; named_parameters() already dedupes by identity, which
    is how tied weights (lm_head.weight is embed_tokens.weight) are shared."""
    return sum(p.numel() for _, p in model.named_parameters(remove_duplicate=True))


def largest_layer_params(model) -> int:
    """DeepSpeed's largest layer: the module owning the most parameters directly (not recursing)."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)


def _moe_block_class(model) -> str | None:
    """The class of the sparse-MoE block (the module whose child is named `experts`, e.g.
    MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, DeepseekV2MoE), or None for a dense model.
    ZeRO-3 must treat it as one leaf: a token routes to only some experts, so per-expert parameter
    fetching differs across ranks and can hang (accelerate's `deepspeed_moe_layer_cls_names`)."""
    for module in model.modules():
        if "experts" in module._modules:
            return type(module).__name__
    return None


def _decoder_layer_class(model, num_layers: int | None) -> str | None:
    """The class of the repeated decoder layers: what FSDP wraps and what DeepSpeed's
    transformer layer classes name. Searched first inside the text decoder (so a vision tower
    with as many layers doesn't win), then anywhere in the model."""
    import torch

    no_split = set(getattr(model, "_no_split_modules", None) or [])
    decoder = None
    with contextlib.suppress(Exception):     # each architecture's get_decoder fails its own way: no decoder
        decoder = model.get_decoder()
    scopes = [decoder, model] if isinstance(decoder, torch.nn.Module) else [model]
    for scope in scopes:
        best = None
        for module in scope.modules():
            if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
                continue
            names = {type(child).__name__ for child in module}
            if len(names) != 1:
                continue
            name = names.pop()
            matches_count = num_layers is not None and len(module) == num_layers
            score = (matches_count and name in no_split, matches_count, name in no_split)
            if any(score) and (best is None or score > best[0]):
                best = (score, name)
        if best is not None:
            return best[1]
    # _no_split_modules is a set in recent transformers: prefer the decoder-layer-looking name.
    ranked = sorted(no_split, key=lambda n: (not n.endswith("DecoderLayer"), not n.endswith(("Layer", "Block")), n))
    return ranked[0] if ranked else None


def _is_tied(model) -> bool:
    try:
        out = model.get_output_embeddings()
        inp = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    out_weight = getattr(out, "weight", None)
    return out_weight is not None and out_weight is getattr(inp, "weight", None)


def _first_int(obj, *names: str) -> int | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _shape_from_config(text_config, config_path: Path) -> dict[str, int]:
    hidden = _first_int(text_config, "hidden_size", "n_embd", "d_model", "dim")
    layers = _first_int(text_config, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    heads = _first_int(text_config, "num_attention_heads", "n_head", "num_heads", "n_heads")
    vocab = _first_int(text_config, "vocab_size")
    ssm = _ssm_fields(text_config, hidden)
    if heads is None and ssm:
        heads = 0                          # Mamba has no attention; the SSM fields describe its layers
    for field, value in (("hidden_size", hidden), ("num_hidden_layers", layers),
                         ("num_attention_heads", heads), ("vocab_size", vocab)):
        if value is None:
            raise InputError("model", f"{config_path} has no usable {field}", "a decoder config with "
                             "hidden_size, num_hidden_layers, num_attention_heads and vocab_size, or --params")
    encoder_decoder = _encoder_decoder_layers(text_config)
    if encoder_decoder:
        layers = sum(encoder_decoder)      # T5's num_layers is the encoder's alone; the decoder has as many again
    kv_heads = _first_int(text_config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num") or heads
    if getattr(text_config, "multi_query", False) is True:  # gpt_bigcode / falcon style MQA
        kv_heads = 1
    # gpt2 leaves n_inner None meaning 4*h; T5 calls it d_ff.
    intermediate = _first_int(text_config, "intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size") \
        or 4 * hidden
    head_dim = _first_int(text_config, "qk_head_dim", "head_dim", "d_kv")
    if head_dim is None and getattr(text_config, "qk_nope_head_dim", None):
        head_dim = text_config.qk_nope_head_dim + (getattr(text_config, "qk_rope_head_dim", 0) or 0)
    shared = _first_int(text_config, "shared_expert_intermediate_size")
    n_shared = _first_int(text_config, "n_shared_experts", "num_shared_experts")
    moe_width = _first_int(text_config, "moe_intermediate_size")
    if shared is None and n_shared and moe_width:
        shared = n_shared * moe_width      # DeepSeek: one MLP of n_shared_experts * moe_intermediate_size
    gated = getattr(text_config, "is_gated_act", None)
    return dict(hidden_size=hidden, layers=layers, heads=heads, kv_heads=0 if ssm and not heads else kv_heads,
                vocab_size=vocab, intermediate_size=intermediate,
                encoder_layers=encoder_decoder[0] if encoder_decoder else 0,
                decoder_layers=encoder_decoder[1] if encoder_decoder else 0,
                head_dim=head_dim if heads and head_dim and head_dim * heads != hidden else None,
                v_head_dim=_first_int(text_config, "v_head_dim"),
                kv_lora_rank=_first_int(text_config, "kv_lora_rank") or 0,
                moe_intermediate_size=moe_width or 0, shared_expert_intermediate_size=shared or 0,
                gated_mlp=gated if isinstance(gated, bool) else None,
                attention_dropout=_attention_dropout(text_config),
                ssm_state_size=ssm[0] if ssm else 0, ssm_inner_size=ssm[1] if ssm else 0)


def _attention_dropout(text_config) -> float:
    """The config's dropout on attention probabilities (0.0 when it names none)."""
    for key in ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "attention_dropout_prob"):
        value = getattr(text_config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def _ssm_fields(text_config, hidden: int | None) -> tuple[int, int] | None:
    """(state size N, inner width) of a Mamba-style selective-state-space model, or None."""
    state = _first_int(text_config, "state_size", "ssm_state_size", "d_state")
    if state is None or hidden is None or "mamba" not in str(getattr(text_config, "model_type", "")):
        return None
    expand = getattr(text_config, "expand", None) or 2
    inner = _first_int(text_config, "intermediate_size", "d_inner") or int(expand * hidden)
    return state, inner


def _encoder_decoder_layers(config) -> tuple[int, int] | None:
    """(encoder layers, decoder layers) of an encoder-decoder model (T5: num_layers + num_decoder_layers;
    BART: encoder_layers + decoder_layers), else None."""
    if not getattr(config, "is_encoder_decoder", False):
        return None
    encoder = _first_int(config, "encoder_layers", "num_layers", "num_hidden_layers")
    decoder = _first_int(config, "decoder_layers", "num_decoder_layers") or encoder
    return (encoder, decoder) if encoder and decoder else None


# bytes per element of the dtypes a config.json names ("dtype" in transformers 5, "torch_dtype" before)
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8, "float8_e4m3fn": 1}


def _weights_dtype_bytes(data: dict[str, Any]) -> int | None:
    """Bytes per weight of the checkpoint's stored dtype, as config.json records it; None if absent.
    transformers' from_pretrained(dtype="auto", its default) loads in exactly this dtype
    (modeling_utils._get_dtype reads config.dtype first)."""
    for key in ("dtype", "torch_dtype"):
        value = data.get(key)
        if isinstance(value, str):
            return _DTYPE_BYTES.get(value.removeprefix("torch."))
    text = data.get("text_config")
    return _weights_dtype_bytes(text) if isinstance(text, dict) else None


def _moe_layer_count(model, layer_class: str | None) -> int | None:
    """Decoder layers that hold routed experts (a submodule named `experts`): DeepSeek keeps its first
    layers dense, Qwen-MoE may (mlp_only_layers, decoder_sparse_step). None when there are none."""
    if not layer_class:
        return None
    count = 0
    for module in model.modules():
        if type(module).__name__ == layer_class and any(name.endswith("experts") and not name.endswith("shared_experts")
                                                        for name, _ in module.named_modules()):
            count += 1
    return count or None


def _text_config(config):
    getter = getattr(config, "get_text_config", None)
    if getter is not None:
        try:
            return getter(decoder=True)
        except TypeError:
            return getter()
    return getattr(config, "text_config", None) or config


def size_model(id_or_path: str, use_cache: bool = True) -> ModelShape:
    """Local dir with config.json, a config.json path, or a Hub id in the local HF cache (offline).

    The result is remembered in a small on-disk cache keyed by the config's content and the
    transformers version (see `_sizing_cache_file`), so sizing the same config again skips
    importing torch and transformers. `use_cache=False` or WIZARD_NO_CACHE=1 always builds.
    """
    config_path, source = _resolve_config_path(id_or_path)
    data = _read_config_dict(config_path)
    cache_file = _sizing_cache_file(data) if use_cache and not os.environ.get("WIZARD_NO_CACHE") else None
    cached = _read_cached_shape(cache_file) if cache_file else None
    if cached is not None:
        cached.source = source
        return cached
    shape = _size_config(data, config_path, source)
    if cache_file:
        _write_cached_shape(cache_file, shape)
    return shape


def _size_config(data: dict[str, Any], config_path: Path, source: str) -> ModelShape:
    with _offline():
        config = _import_and_build_config(data, config_path)
        with _quiet_transformers():
            model = _build_on_meta(config, config_path)
            _remember_built(data, config_path, config, model)
            text = _text_config(config)
            shape = _shape_from_config(text, config_path)
            layer_class = _decoder_layer_class(model, shape["layers"] - shape["encoder_layers"] or None)
            num_experts = _first_int(text, "num_local_experts", "num_experts", "n_routed_experts",
                                     "moe_num_experts") or 0
            return ModelShape(
                params=count_params(model),
                largest_layer_params=largest_layer_params(model),
                layer_class=layer_class,
                moe_layers=_moe_layer_count(model, layer_class) if num_experts else None,
                attn_implementation=getattr(model.config, "_attn_implementation", None),
                weights_dtype_bytes=_weights_dtype_bytes(data),
                model_type=config.model_type,
                tied_embeddings=_is_tied(model),
                source=source,
                exact=True,
                num_experts=num_experts,
                experts_per_token=_first_int(text, "num_experts_per_tok", "moe_topk", "top_k") or 0,
                max_position_embeddings=_first_int(text, "max_position_embeddings", "n_positions"),
                moe_block_class=_moe_block_class(model),
                task=task_of_class(type(model).__name__),
                num_labels=int(getattr(config, "num_labels", 0) or 0),
                **shape,
            )


# What a model class's name says about its head (transformers' naming: <Arch>For<Task>).
TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "sequence-classification", "token-classification",
         "question-answering", "base")
_CLASS_SUFFIX_TASK = (("ForSequenceClassification", "sequence-classification"),
                      ("ForTokenClassification", "token-classification"),
                      ("ForQuestionAnswering", "question-answering"), ("ForMaskedLM", "masked-lm"),
                      ("ForConditionalGeneration", "seq2seq-lm"), ("ForSeq2SeqLM", "seq2seq-lm"),
                      ("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"))


def task_of_class(name: str) -> str:
    """The task of a transformers model class by its name; "base" for a bare model (no head)."""
    for suffix, task in _CLASS_SUFFIX_TASK:
        if name.endswith(suffix):
            return task
    return "base" if name.endswith("Model") else "causal-lm"


def module_class_names(id_or_path: str) -> set[str]:
    """Class names of every module of the model, built on the meta device the way size_model builds
    it (offline, no weights): the names FSDP's transformer_layer_cls_to_wrap can use. InputError
    like size_model when the config cannot be found or built."""
    config_path, _ = _resolve_config_path(id_or_path)
    data = _read_config_dict(config_path)
    with _offline():
        config = _import_and_build_config(data, config_path)
        with _quiet_transformers():
            model = _build_on_meta(config, config_path)
    return {type(m).__name__ for m in model.modules()}


# ---------------------------------------------------------------------------------------------
# Sizing cache: importing torch + transformers is most of the ~5 s a sizing costs
# ---------------------------------------------------------------------------------------------

# Bump when what size_model computes changes, so old entries are ignored.
_SIZING_CACHE_VERSION = 4


def sizing_cache_dir() -> Path:
    """$WIZARD_CACHE_DIR/sizing, else ${XDG_CACHE_HOME:-~/.cache}/wizard/sizing."""
    root = os.environ.get("WIZARD_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "wizard")
    return Path(root).expanduser() / "sizing"


@functools.cache
def _sizing_libraries() -> str | None:
    """The libraries a sizing depends on, read once a process (importlib.metadata parses each package's METADATA:
    about 9 ms a plan, as much as the plan's own arithmetic; a process keeps the transformers it imported)."""
    from wizard.versions import installed_version

    found = {name: installed_version(name) for name in ("transformers", "torch")}
    if None in found.values():
        return None
    return ";".join(f"{name}={version}" for name, version in found.items())


def _sizing_cache_file(data: dict[str, Any]) -> Path | None:
    import hashlib

    versions = _sizing_libraries()
    if versions is None:
        return None
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    key = hashlib.sha256(f"v{_SIZING_CACHE_VERSION};{versions};{canonical}".encode()).hexdigest()
    return sizing_cache_dir() / f"{key}.json"


def _read_cached_shape(path: Path) -> ModelShape | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        shape = ModelShape(**entry)
    except (OSError, ValueError, TypeError):  # missing, unreadable or from another layout: rebuild
        return None
    return shape if isinstance(shape.params, int) and shape.params > 0 and shape.exact else None


# The last model built on the meta device, for the adapter sizing that usually follows in the same process
# (wizard.sizing.lora), which then builds nothing. Counting adapters from the module shapes only reads it
# (peek_built), so every method's count uses the one model; peft changes the model it wraps, so a sizing that
# needs peft takes it out (take_built) and the next one builds its own (0.04 s for 70B on the meta device, cheaper
# than peft's unload). One slot: a TUI session sizes many models, and only the latest is asked about.
_LAST_BUILT: tuple[tuple[str, str], Any, Any] | None = None


def _built_key(data: dict[str, Any], config_path: Path) -> tuple[str, str]:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str), str(config_path)


def _remember_built(data: dict[str, Any], config_path: Path, config, model) -> None:
    global _LAST_BUILT
    _LAST_BUILT = (_built_key(data, config_path), config, model)


def peek_built(data: dict[str, Any], config_path: Path):
    """(config, model) that size_model last built from exactly this config, or None; left in place, so the caller
    must not change the model."""
    found = _LAST_BUILT
    return (found[1], found[2]) if found is not None and found[0] == _built_key(data, config_path) else None


def take_built(data: dict[str, Any], config_path: Path):
    """(config, model) that size_model last built from exactly this config, or None; the caller owns the model
    from then on (a second call answers None)."""
    global _LAST_BUILT
    found, _LAST_BUILT = _LAST_BUILT, None
    return (found[1], found[2]) if found is not None and found[0] == _built_key(data, config_path) else None


def _write_cached_shape(path: Path, shape: ModelShape) -> None:
    entry = shape.to_json()
    entry["source"] = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(entry), fsync=False)   # a lost cache entry is only sized again
    except OSError:  # a read-only home is fine: we just size again next time
        pass


# ---------------------------------------------------------------------------------------------
# --params 7B: a well-known shape of about that size
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _KnownShape:
    name: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied: bool = False

    @property
    def params(self) -> int:
        return llama_param_count(self.hidden_size, self.layers, self.heads, self.kv_heads,
                                 self.intermediate_size, self.vocab_size, self.tied)


# Published configs of well-known Llama-architecture models (Qwen2 adds q/k/v biases, which this
# Llama-like estimate ignores: a few hundred thousand parameters).
KNOWN_SHAPES: tuple[_KnownShape, ...] = (
    _KnownShape("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, tied=True),
    _KnownShape("SmolLM2-360M", 960, 32, 15, 5, 2560, 49152, tied=True),
    _KnownShape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, tied=True),
    _KnownShape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256, tied=True),
    _KnownShape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, tied=True),
    _KnownShape("Llama-3.2-3B", 3072, 28, 24, 8, 8192, 128256, tied=True),
    _KnownShape("Llama-2-7B", 4096, 32, 32, 32, 11008, 32000),
    _KnownShape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256),
    _KnownShape("Llama-2-13B", 5120, 40, 40, 40, 13824, 32000),
    _KnownShape("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064),
    _KnownShape("Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064),
    _KnownShape("CodeLlama-34B", 8192, 48, 64, 8, 22016, 32000),
    _KnownShape("Llama-3-70B", 8192, 80, 64, 8, 28672, 128256),
    _KnownShape("Llama-3.1-405B", 16384, 126, 128, 8, 53248, 128256),
)


def llama_param_count(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                      vocab: int, tied: bool = False) -> int:
    """Parameters of a LlamaForCausalLM with this shape (no biases), exactly as transformers builds it."""
    head_dim = hidden // heads
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * intermediate                                               # gate, up, down
    norms = 2 * hidden
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * (attention + mlp + norms) + embeddings + hidden


def _nearest_known(params: int) -> _KnownShape:
    # Nearest on a log scale: 10B is closer to 8B than to 13B the way people mean sizes.
    return min(KNOWN_SHAPES, key=lambda s: abs(math.log(s.params / params)))


def _positive_int(value, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise InputError(field, f"{value!r} is not a whole number", "a positive integer")
    if value <= 0:
        raise InputError(field, f"{value} must be greater than zero", "a positive integer")
    return value


def _round_up(value: float, multiple: int) -> int:
    return max(multiple, int(math.ceil(value / multiple)) * multiple)


def _intermediate_for(hidden: int) -> int:
    # Llama's SwiGLU width: 8/3·h rounded up to a multiple of 256.
    return _round_up(8 * hidden / 3, 256)


def _per_layer_params(hidden: int, heads: int, kv_heads: int, intermediate: int) -> int:
    return llama_param_count(hidden, 1, heads, kv_heads, intermediate, 0) - hidden


def _default_heads(hidden: int) -> int:
    # Llama keeps head_dim 128; smaller models use 64; other widths take the first that divides.
    for head_dim in (128, 64, 96, 80, 32):
        if hidden % head_dim == 0:
            return hidden // head_dim
    return 1


def _default_kv_heads(heads: int) -> int:
    return 8 if heads % 8 == 0 and heads > 8 else heads


def from_params(params: int | str, hidden_size: int | None = None, layers: int | None = None,
                heads: int | None = None, vocab_size: int | None = None) -> ModelShape:
    """A Llama-like shape for `--params 7B` with optional shape overrides (exact=False).

    `params` is kept exactly as given (it is what the user said). The shape is the well-known
    model nearest in size; an overridden hidden size or layer count re-derives the other from
    `params`, so the shape still adds up to roughly that many parameters.
    """
    if isinstance(params, str):
        params = parse_count(params, "params")
    elif isinstance(params, float) and params.is_integer():
        params = int(params)
    params = _positive_int(params, "params")
    if params is None:
        raise InputError("params", "is required", "a positive count such as 7B, 350M or 1.5e9")
    hidden_size = _positive_int(hidden_size, "hidden_size")
    layers = _positive_int(layers, "layers")
    heads = _positive_int(heads, "heads")
    vocab_size = _positive_int(vocab_size, "vocab_size")

    base = _nearest_known(params)
    vocab = vocab_size or base.vocab_size
    tied = base.tied and vocab == base.vocab_size

    ratio = params / base.params
    if hidden_size is None and layers is None and ratio > 2:
        # Beyond the largest known shape: keep its width, grow the depth.
        hidden, n_layers = base.hidden_size, None
    elif hidden_size is None and layers is None and ratio < 0.5:
        # Below the smallest known shape: keep its depth, shrink the width.
        n_layers = base.layers
        hidden = _hidden_for(params, n_layers, vocab, tied)
    elif hidden_size is None and layers is None:
        hidden, n_layers = base.hidden_size, base.layers
    elif hidden_size is not None and layers is not None:
        hidden, n_layers = hidden_size, layers
    elif hidden_size is not None:
        hidden = hidden_size
        n_layers = None  # derived below, once heads are known
    else:
        n_layers = layers
        hidden = _hidden_for(params, n_layers, vocab, tied)

    same_width = hidden == base.hidden_size
    n_heads = heads or (base.heads if same_width else _default_heads(hidden))
    if hidden % n_heads:
        raise InputError("heads", f"{n_heads} does not divide hidden_size {hidden}",
                         "a positive integer that divides hidden_size")
    kv = base.kv_heads if same_width and n_heads == base.heads else _default_kv_heads(n_heads)
    intermediate = base.intermediate_size if same_width else _intermediate_for(hidden)
    if n_layers is None:
        body = params - vocab * hidden * (1 if tied else 2)
        n_layers = max(1, round(body / _per_layer_params(hidden, n_heads, kv, intermediate)))

    return ModelShape(
        params=params,
        # The embedding is the largest layer of a Llama; capped for budgets too small to hold one.
        largest_layer_params=min(vocab * hidden, params),
        hidden_size=hidden,
        layers=n_layers,
        heads=n_heads,
        kv_heads=kv,
        vocab_size=vocab,
        intermediate_size=intermediate,
        layer_class="LlamaDecoderLayer",
        model_type="llama",
        tied_embeddings=tied,
        source=f"--params {fmt_count(params)}",
        exact=False,
    )


def _hidden_for(params: int, layers: int, vocab: int, tied: bool) -> int:
    """Hidden size (a multiple of 128) whose Llama-like shape with `layers` layers is nearest `params`."""
    best_hidden, best_gap = 128, None
    for hidden in range(128, 65536 + 1, 128):
        heads = _default_heads(hidden)
        total = llama_param_count(hidden, layers, heads, _default_kv_heads(heads), _intermediate_for(hidden),
                                  vocab, tied)
        gap = abs(total - params)
        if best_gap is None or gap < best_gap:
            best_hidden, best_gap = hidden, gap
        if total > params:
            break
    return best_hidden
