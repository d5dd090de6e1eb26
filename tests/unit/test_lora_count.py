"""LoRA counted from the module shapes (wizard.sizing.lora.count_lora, linear_leaf_names), the cold plan's path:
equal to peft's own get_peft_model + get_nb_trainable_parameters() on every fixture model, and left to peft
wherever peft does more than r * (in + out) per Linear."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import peft  # noqa: F401  the reference these tests compare against: a broken install fails here
import pytest

from wizard.errors import InputError
from wizard.sizing import lora
from wizard.sizing import model as model_mod

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"
FIXTURES = ["llama-tiny", "llama-tiny-tied", "qwen2-tiny-tied", "gpt2-tiny", "llava-tiny", "mixtral-tiny",
            "llama-3.1-8b", "llama-3-70b", "qwen2.5-7b", "qwen2-0.5b", "mixtral-8x7b"]
# Fixtures whose every count count_lora makes itself (no MoE conversion in peft, plain Linear / Conv1D targets).
COUNTED = {"llama-tiny", "llama-tiny-tied", "qwen2-tiny-tied", "gpt2-tiny", "llava-tiny", "llama-3.1-8b",
           "llama-3-70b", "qwen2.5-7b", "qwen2-0.5b"}
TARGETS = {"gpt2-tiny": [None, "c_attn", "c_attn,c_fc,c_proj"]}
DEFAULT_TARGETS = [None, "q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"]


def _meta_model(name: str):
    data = json.loads((MODELS / name / "config.json").read_text())
    config = model_mod._import_and_build_config(data, MODELS / name / "config.json")
    with model_mod._quiet_transformers():
        return model_mod._build_on_meta(config, MODELS / name)


def _peft_figures(name: str, options):
    """peft on a fresh meta build, as the wizard's peft path runs it: (trainable, total, per leaf, targets)."""
    base = _meta_model(name)
    with lora._peft_on_meta():
        wrapped, targets = lora._apply_lora(base, options, name)
        trainable, total = wrapped.get_nb_trainable_parameters()
        return trainable, total, lora._adapted_modules(wrapped), targets


def _cases():
    for name in FIXTURES:
        for targets in TARGETS.get(name, DEFAULT_TARGETS):
            yield name, targets


@pytest.mark.parametrize("name,targets", list(_cases()))
def test_count_equals_peft_on_the_fixtures(name, targets):
    options = lora.lora_options("lora", rank=16, targets=targets)
    counted = lora.count_lora(_meta_model(name), options)
    if name in COUNTED:
        assert counted is not None, "counted without peft"
    if counted is None:
        return
    trainable, total, per_target, used = counted
    assert (trainable, total, per_target, used) == _peft_figures(name, options)
    assert trainable > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_linear_leaf_names_equal_peft_all_linear(name):
    model = _meta_model(name)
    assert lora.linear_leaf_names(model) == lora.all_linear_names(model)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny", "llava-tiny", "mixtral-tiny"])
@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("targets", [None, "q_proj,v_proj", "all-linear", "embed_tokens", "no_such_proj"])
def test_size_adapters_equals_the_peft_path(monkeypatch, name, method, targets):
    """The whole AdapterShape (QLoRA's NF4 figures included) with the shape count and with peft forced."""
    def sized():
        monkeypatch.setattr(model_mod, "_LAST_BUILT", None)
        try:
            return dataclasses.asdict(lora.size_adapters(str(MODELS / name),
                                                         lora.lora_options(method, targets=targets, dropout=0.0)))
        except InputError as e:
            return str(e)

    fast = sized()
    monkeypatch.setattr(lora, "count_lora", lambda model, options: None)
    assert fast == sized()


def test_what_is_left_to_peft():
    llama = _meta_model("llama-tiny")
    assert lora.count_lora(llama, lora.lora_options("lora", targets="all-linear")) is None   # peft resolves it
    assert lora.count_lora(llama, lora.lora_options("lora", targets="embed_tokens")) is None  # not a Linear
    assert lora.count_lora(llama, lora.lora_options("lora", targets="no_such_proj")) is None  # peft's error
    assert lora.count_lora(_meta_model("mixtral-tiny"), lora.lora_options("lora")) is None    # peft converts MoE
    many = ",".join(f"m{i}" for i in range(lora.PEFT_MIN_TARGET_MODULES_FOR_OPTIMIZATION - 1)) + ",q_proj"
    assert lora.count_lora(llama, lora.lora_options("lora", targets=many)) is None          # peft condenses


def test_the_rules_read_from_peft_still_hold():
    from peft.utils.constants import MIN_TARGET_MODULES_FOR_OPTIMIZATION
    from peft.utils.transformers_weight_conversion import _MODEL_TO_CONVERSION_PATTERN

    assert lora.PEFT_MIN_TARGET_MODULES_FOR_OPTIMIZATION == MIN_TARGET_MODULES_FOR_OPTIMIZATION
    assert set(_MODEL_TO_CONVERSION_PATTERN) <= lora._moe_conversion_types()


def test_cold_adapter_sizing_builds_once_and_imports_no_peft(tmp_path):
    """The cold 70B plan's sizing: the model size_model built serves both methods; peft, bitsandbytes and
    accelerate's peft side are never imported."""
    code = ("import json, sys\n"
            "from wizard.sizing import model as m, lora\n"
            "builds = []\nreal = m._build_on_meta\n"
            "m._build_on_meta = lambda *a: builds.append(1) or real(*a)\n"
            f"s = m.size_model({str(MODELS / 'llama-3-70b')!r}, use_cache=False)\n"
            "shapes = [lora.size_adapters(s, lora.lora_options(k)) for k in ('lora', 'qlora')]\n"
            "print(json.dumps([len(builds), [x.trainable_params for x in shapes],"
            " sorted(n for n in ('peft', 'bitsandbytes') if n in sys.modules)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={**os.environ, "WIZARD_NO_CACHE": "1", "HF_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    builds, trainable, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert builds == 1 and imported == []
    assert trainable[0] == trainable[1] > 0
