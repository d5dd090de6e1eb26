"""The adapter sizing the plan uses (wizard/sizing/adapters.py): remembered on disk beside the sizing cache, keyed
by config, options, library versions and code; and, when cold, peft run on the model size_model already built,
on the meta device, without importing bitsandbytes. test_lora.py checks the counts themselves against peft."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from wizard.config.answers import training_options
from wizard.errors import InputError
from wizard.sizing import adapters, lora
from wizard.sizing import model as model_mod
from wizard.sizing.model import size_model

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("WIZARD_NO_CACHE", raising=False)
    monkeypatch.setattr(adapters, "_ADAPTERS", {})
    monkeypatch.setattr(model_mod, "_LAST_BUILT", None)


class _Calls:
    """Counts the calls of a real function and calls it (a spy, not a stand-in)."""

    def __init__(self, monkeypatch, owner, name):
        self.count = 0
        real = getattr(owner, name)

        def spy(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)


def _training(method="lora", **lora_fields):
    return training_options({"method": method, **lora_fields})


def _entries(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / "adapters").glob("*.json"))


def _forget_process_memory(monkeypatch):
    monkeypatch.setattr(adapters, "_ADAPTERS", {})


# --- the model size_model built is handed to the first adapter sizing ----------------------------------------

SEQUENCE = [
    dict(method="qlora", rank=16),
    dict(method="lora", rank=8),
    dict(method="lora", rank=16, targets="all-linear", dropout=0.0),
    dict(method="qlora", rank=8, targets="no_such_proj"),
    dict(method="qlora", rank=4, targets="all-linear", dropout=0.0, double_quant=False, quant_storage="bf16"),
]


def _sized(shape, options):
    try:
        return dataclasses.asdict(lora.size_adapters(shape, options))
    except InputError as e:
        return str(e)


# Builds for size_model and SEQUENCE: counting from the shapes (lora.count_lora: default and named Linear targets
# of a model peft does not convert) reads the model size_model built and leaves it there; peft (all-linear, a
# target that matches nothing, Mixtral's MoE conversion) changes the model it wraps, so the first peft sizing takes
# that model and every later one builds its own.
BUILDS = {"llama-tiny": 3, "gpt2-tiny": 3, "mixtral-tiny": 5}


@pytest.mark.parametrize("name", ["llama-tiny", "mixtral-tiny", "gpt2-tiny"])
def test_the_first_adapter_sizing_uses_the_model_size_model_built(monkeypatch, name):
    """A cold plan builds its model once for the shape and every method counted from the shapes; peft changes
    the model it wraps, so each peft sizing after the first builds its own. Each figure equals a sizing on a
    fresh build."""
    builds = _Calls(monkeypatch, model_mod, "_build_on_meta")
    shape = size_model(str(MODELS / name), use_cache=False)
    options = [lora.lora_options(**o) for o in SEQUENCE]
    handed_over = [_sized(shape, o) for o in options]
    assert builds.count == BUILDS[name]
    fresh = []
    for o in options:
        monkeypatch.setattr(model_mod, "_LAST_BUILT", None)
        fresh.append(_sized(shape, o))
    assert builds.count == BUILDS[name] + len(options)
    assert handed_over == fresh
    assert isinstance(fresh[3], str) and fresh[3].startswith("lora_targets:")
    assert all(isinstance(s, dict) and s["trainable_params"] > 0 for i, s in enumerate(fresh) if i != 3)


def test_a_shape_from_the_sizing_cache_builds_once_for_every_counted_method(monkeypatch):
    """The sizing cache answered and the adapters are cold: the first adapter sizing builds the model, and the
    methods counted from the shapes after it read that same build."""
    size_model(str(MODELS / "llama-tiny"))                    # fills the sizing cache
    monkeypatch.setattr(model_mod, "_LAST_BUILT", None)
    builds = _Calls(monkeypatch, model_mod, "_build_on_meta")
    shape = size_model(str(MODELS / "llama-tiny"))
    sized = [_sized(shape, lora.lora_options(**o)) for o in (dict(method="lora"), dict(method="qlora", rank=8),
                                                              dict(method="lora", targets="q_proj,v_proj"))]
    assert builds.count == 1
    fresh = []
    for o in (dict(method="lora"), dict(method="qlora", rank=8), dict(method="lora", targets="q_proj,v_proj")):
        monkeypatch.setattr(model_mod, "_LAST_BUILT", None)
        fresh.append(_sized(shape, lora.lora_options(**o)))
    assert sized == fresh and all(isinstance(s, dict) for s in sized)


def test_a_model_built_from_another_config_is_not_used(monkeypatch):
    size_model(str(MODELS / "llama-tiny"))                    # fills the sizing cache
    builds = _Calls(monkeypatch, model_mod, "_build_on_meta")
    size_model(str(MODELS / "llama-tiny-tied"), use_cache=False)
    other = size_model(str(MODELS / "llama-tiny"))          # from the cache: nothing built, the slot still holds
    assert builds.count == 1
    sized = lora.size_adapters(other, lora.lora_options("lora"))
    assert builds.count == 2
    monkeypatch.setattr(model_mod, "_LAST_BUILT", None)
    assert dataclasses.asdict(lora.size_adapters(other, lora.lora_options("lora"))) == dataclasses.asdict(sized)


def test_sizing_never_imports_bitsandbytes_and_leaves_it_importable():
    """peft imports bitsandbytes (0.8 s and torch._inductor) when it is installed; sizing hides it from peft and
    puts it back: afterwards it is found again, and peft's and transformers' cached answers say so."""
    code = ("import importlib.util, json, sys\n"
            "from wizard.sizing.model import size_model\nfrom wizard.sizing import lora\n"
            f"s = size_model({str(MODELS / 'llama-tiny')!r}, use_cache=False)\n"
            "q = lora.size_adapters(s, lora.lora_options('qlora', targets='q_proj,v_proj'))\n"
            "l = lora.size_adapters(s, lora.lora_options('lora', targets='all-linear'))\n"
            "imported = 'bitsandbytes' in sys.modules\n"
            "from peft.import_utils import is_bnb_available\n"
            "from transformers.utils.import_utils import is_bitsandbytes_available\n"
            "installed = importlib.util.find_spec('bitsandbytes') is not None\n"
            "print(json.dumps([imported, installed, is_bnb_available(), is_bitsandbytes_available(),"
            " q.trainable_params, l.trainable_params]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "WIZARD_NO_CACHE": "1"})
    assert out.returncode == 0, out.stderr
    imported, installed, peft_says, transformers_says, qlora, every = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported is False
    assert peft_says == installed and transformers_says == installed
    assert qlora > 0 and every > qlora


# --- on disk ----------------------------------------------------------------------------------------------

def test_a_second_process_reads_the_counts_from_disk(monkeypatch, tmp_path):
    shape = size_model(str(MODELS / "llama-tiny"))
    first = adapters.adapters_for(shape, _training("qlora", lora_rank=8))
    assert len(_entries(tmp_path)) == 1
    _forget_process_memory(monkeypatch)
    sizings = _Calls(monkeypatch, lora, "size_adapters")
    assert adapters.adapters_cached(shape, _training("qlora", lora_rank=8))
    again = adapters.adapters_for(shape, _training("qlora", lora_rank=8))
    assert sizings.count == 0
    assert dataclasses.asdict(again) == dataclasses.asdict(first)
    assert not adapters.adapters_cached(shape, _training("qlora", lora_rank=4))   # other options: not sized yet


def test_a_refusal_is_remembered_on_disk_too(monkeypatch, tmp_path):
    shape = size_model(str(MODELS / "llama-tiny"))
    training = _training("lora", lora_targets="no_such_proj")
    with pytest.raises(InputError) as first:
        adapters.adapters_for(shape, training)
    _forget_process_memory(monkeypatch)
    sizings = _Calls(monkeypatch, lora, "size_adapters")
    with pytest.raises(InputError) as again:
        adapters.adapters_for(shape, training)
    assert sizings.count == 0
    assert (str(again.value), again.value.field, again.value.allowed) == \
        (str(first.value), first.value.field, first.value.allowed)


def test_the_key_changes_with_config_options_versions_and_code(monkeypatch, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(MODELS / "llama-tiny", target)
    shape = size_model(str(target))
    options = lora.lora_options("lora", rank=8)
    key = adapters._cache_file(shape, options)
    assert key is not None and key.parent == tmp_path / "cache" / "adapters"
    assert adapters._cache_file(shape, lora.lora_options("lora", rank=8)) == key
    assert adapters._cache_file(shape, lora.lora_options("lora", rank=16)) != key
    assert adapters._cache_file(shape, lora.lora_options("lora", rank=8, alpha=64)) != key
    assert adapters._cache_file(shape, lora.lora_options("qlora", rank=8)) != key

    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (target / "config.json").write_text(json.dumps(config))
    changed = adapters._cache_file(shape, options)
    assert changed != key
    assert adapters.adapters_for(size_model(str(target)), _training("lora", lora_rank=8)).modules_per_target == \
        {name: 3 for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}

    real_version = metadata.version
    for library in ("peft", "transformers", "torch"):
        monkeypatch.setattr(metadata, "version",
                            lambda name, lib=library: "0.0.1" if name == lib else real_version(name))
        assert adapters._cache_file(shape, options) != changed, library
    monkeypatch.setattr(metadata, "version", real_version)
    assert adapters._cache_file(shape, options) == changed
    monkeypatch.setattr(adapters, "ADAPTER_CACHE_VERSION", adapters.ADAPTER_CACHE_VERSION + 1)
    assert adapters._cache_file(shape, options) != changed
    monkeypatch.setattr(adapters, "ADAPTER_CACHE_VERSION", adapters.ADAPTER_CACHE_VERSION - 1)
    monkeypatch.setattr(adapters, "_SIZING_CODE", ("lora.py",))
    assert adapters._cache_file(shape, options) != changed


def test_a_missing_library_means_no_entry(monkeypatch):
    shape = size_model(str(MODELS / "llama-tiny"))
    monkeypatch.setattr(adapters, "_LIBRARIES", ("transformers", "torch", "no-such-distribution-wizard"))
    assert adapters._cache_file(shape, lora.lora_options("lora")) is None


@pytest.mark.parametrize("garbage", [
    "{not json",
    json.dumps(["adapters"]),
    json.dumps({"adapters": {"method": "lora"}}),
    json.dumps({"error": {"field": 3}}),
    "BAD-COUNTS",
    "OTHER-METHOD",
])
def test_an_unreadable_or_foreign_entry_is_sized_again(monkeypatch, tmp_path, garbage):
    shape = size_model(str(MODELS / "llama-tiny"))
    training = _training("lora", lora_rank=8)
    right = dataclasses.asdict(adapters.adapters_for(shape, training))
    [entry] = _entries(tmp_path)
    if garbage in ("BAD-COUNTS", "OTHER-METHOD"):
        doc = json.loads(entry.read_text())
        doc["adapters"].update({"trainable_params": -5} if garbage == "BAD-COUNTS" else {"method": "qlora"})
        garbage = json.dumps(doc)
    entry.write_text(garbage)
    _forget_process_memory(monkeypatch)
    assert not adapters.adapters_cached(shape, training)
    sizings = _Calls(monkeypatch, lora, "size_adapters")
    assert dataclasses.asdict(adapters.adapters_for(shape, training)) == right
    assert sizings.count == 1
    assert json.loads(entry.read_text())["adapters"] == right    # and written again


def test_no_cache_writes_nothing_and_an_unwritable_cache_is_not_an_error(monkeypatch, tmp_path):
    shape = size_model(str(MODELS / "llama-tiny"))
    monkeypatch.setenv("WIZARD_NO_CACHE", "1")
    assert adapters.adapters_for(shape, _training("lora")).trainable_params > 0
    assert not (tmp_path / "cache" / "adapters").exists()
    monkeypatch.delenv("WIZARD_NO_CACHE")
    _forget_process_memory(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(blocker))
    assert adapters.adapters_for(shape, _training("lora")).trainable_params > 0


def test_params_shapes_and_full_fine_tuning_need_no_entry(tmp_path):
    from wizard.sizing.model import from_params

    shape = from_params("7B")
    assert adapters.adapters_cached(shape, _training("qlora"))
    assert adapters.adapters_for(shape, _training("qlora")).exact is False
    assert adapters.adapters_for(size_model(str(MODELS / "llama-tiny")), _training("full")) is None
    assert _entries(tmp_path) == []
