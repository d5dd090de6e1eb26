"""The adapters a plan sizes: LoRA / QLoRA counts of a sized model, remembered in the process and on disk.

Counting adapters needs the model transformers builds on the meta device (wizard.sizing.lora; peft too, for
targets other than plain Linear layers), which imports torch and transformers: seconds. The counts depend only on the config, the method options, the
libraries' versions and the sizing code, so they are kept beside the sizing cache (`adapters/` next to
`sizing/` under $WIZARD_CACHE_DIR or ~/.cache/wizard; WIZARD_NO_CACHE=1 turns it off), and a plan of a model
sized before (its full fine-tuning, and the LoRA / QLoRA alternatives it names) imports none of them.

`training` below is anything with TrainingOptions' method and lora_* fields (wizard.planning.plan); this
module sits in the sizing layer and imports nothing above it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wizard.errors import InputError
from wizard.fsutil import replace_file
from wizard.sizing.model import ModelShape, sizing_cache_dir

if TYPE_CHECKING:   # wizard.sizing.lora is imported when first needed: `wizard --help` imports this module
    from wizard.sizing.lora import AdapterShape, LoraOptions

# Bump when what an entry means changes; the sizing code's own text is part of the key as well (_code_digest).
ADAPTER_CACHE_VERSION = 1
# What the counts depend on besides the config and the options (torch: the modules transformers builds).
_LIBRARIES = ("transformers", "torch", "peft")
# The code that computes an entry: a change to it is a new key, even when nobody bumps the version.
_SIZING_CODE = ("lora.py", "model.py")

# Sizings by (model, options) for this process: the TUI re-plans on every keystroke. A sizing that failed is
# kept too (as its InputError), so a front end does not retry it forever.
_ADAPTERS: dict[tuple, Any] = {}   # AdapterShape | InputError


def lora_options_for(training) -> LoraOptions:
    from wizard.sizing.lora import lora_options
    return lora_options(training.method, training.lora_rank, training.lora_alpha, training.lora_dropout,
                        training.lora_targets)


def _memory_key(model: ModelShape, options: LoraOptions) -> tuple:
    return (model.source, model.params, model.exact, options)


def adapters_cached(model: ModelShape, training) -> bool:
    """True when adapters_for needs no slow sizing for these answers (full, --params, or sized before, in this
    process or on disk)."""
    if training.method == "full" or not model.exact:
        return True
    options = lora_options_for(training)
    key = _memory_key(model, options)
    if key not in _ADAPTERS:
        found = _read_entry(_cache_file(model, options), options)
        if found is None:
            return False
        _ADAPTERS[key] = found
    return True


def adapters_for(model: ModelShape, training) -> AdapterShape | None:
    """The AdapterShape of --method lora/qlora for this model, or None for full fine-tuning.

    Exact shapes: counted as peft counts on the meta device (wizard.sizing.lora.size_adapters), remembered in the process and on
    disk; a --params shape: counted analytically as a Llama. InputError when peft cannot apply the options.
    """
    if training.method == "full":
        return None
    options = lora_options_for(training)
    if not model.exact:
        from wizard.sizing.lora import size_llama_adapters
        return size_llama_adapters(model, options)
    key = _memory_key(model, options)
    if key not in _ADAPTERS:
        _ADAPTERS[key] = _size_remembered(model, options)
    found = _ADAPTERS[key]
    if isinstance(found, InputError):
        raise found
    return found


def _size_remembered(model: ModelShape, options: LoraOptions) -> AdapterShape | InputError:
    from wizard.sizing.lora import size_adapters

    cache_file = _cache_file(model, options)
    found = _read_entry(cache_file, options)
    if found is not None:
        return found
    try:
        found = size_adapters(model, options)
    except InputError as e:
        found = e
    if cache_file is not None:
        _write_entry(cache_file, found)
    return found


# ---------------------------------------------------------------------------------------------------------
# On disk
# ---------------------------------------------------------------------------------------------------------

def adapter_cache_dir() -> Path:
    """`adapters/` beside the sizing cache: $WIZARD_CACHE_DIR/adapters, else ~/.cache/wizard/adapters."""
    return sizing_cache_dir().parent / "adapters"


def _cache_file(model: ModelShape, options: LoraOptions) -> Path | None:
    """The entry for this model's config and these options, or None when there is nothing to key it by (no
    config behind the shape, a library missing, the cache switched off)."""
    if os.environ.get("WIZARD_NO_CACHE") or not model.source or model.source.startswith("--params"):
        return None
    from importlib import metadata

    from wizard.sizing.model import _read_config_dict, _resolve_config_path

    try:
        versions = ";".join(f"{name}={metadata.version(name)}" for name in _LIBRARIES)
        config_path, source = _resolve_config_path(model.source)
        data = _read_config_dict(config_path)
    except (metadata.PackageNotFoundError, InputError):   # sized without the cache; the sizing says what failed
        return None
    # The source is part of the key: an entry holds it (AdapterShape.source, an error's message names it).
    parts = [f"v{ADAPTER_CACHE_VERSION}", versions, _code_digest(), source,
             json.dumps(asdict(options), sort_keys=True), json.dumps(data, sort_keys=True, default=str)]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return adapter_cache_dir() / f"{key}.json"


def _code_digest() -> str:
    digest = hashlib.sha256()
    for name in _SIZING_CODE:
        try:
            digest.update((Path(__file__).with_name(name)).read_bytes())
        except OSError:   # not installed as files: the version number alone keys the code
            digest.update(name.encode())
    return digest.hexdigest()


def _read_entry(path: Path | None, options: LoraOptions) -> AdapterShape | InputError | None:
    """The entry at `path`, or None when it is missing, unreadable or not what this code writes (sized again)."""
    from wizard.sizing.lora import AdapterShape

    if path is None:
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if "error" in entry:
            error = entry["error"]
            if not all(isinstance(error.get(k), str) for k in ("field", "problem")):
                return None
            allowed = error.get("allowed")
            return InputError(error["field"], error["problem"], allowed if isinstance(allowed, str) else None)
        shape = entry["adapters"]
        if set(shape) != {f.name for f in fields(AdapterShape)}:
            return None
        found = AdapterShape(**shape)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    counts = (found.trainable_params, found.frozen_params, found.adapted_modules)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) \
            or not found.trainable_params or not isinstance(found.modules_per_target, dict) \
            or (found.method, found.rank) != (options.method, options.rank):
        return None
    return found


def _write_entry(path: Path, found: AdapterShape | InputError) -> None:
    if isinstance(found, InputError):
        entry: dict[str, Any] = {"error": {"field": found.field, "problem": found.problem, "allowed": found.allowed}}
    else:
        entry = {"adapters": asdict(found)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(entry), fsync=False)   # a lost entry is only sized again
    except OSError:   # a read-only home is fine: sized again next time
        pass
