"""The DeepSpeed keys users now write (offload_optimizer.ratio and .super_offload, zero_optimization.zenflow,
tensor_parallel.autotp_size, compile.deepcompile), judged by the installed DeepSpeed's own config models, and
CPU offload's pinned memory against this machine's memlock limit.

- a valid value: no finding; a misspelt or misplaced key: DeepSpeed's model rejects it (DS-LIBRARY-REJECTS, with
  where DeepSpeed reads a key of that name); a value DeepSpeed rejects: its own message;
- a key the installed DeepSpeed does not have yet: DS-KEY-NEEDS-NEWER-DEEPSPEED names the release that added it.
  The installed DeepSpeed has them all, so a release before each is simulated (tests/ds_simulation.py); the
  same detection on the real releases (0.16.3-0.19.5 sdists) is in the commit that added the rule;
- DS-PIN-MEMORY-MEMLOCK: the limit is an input (`memlock_limit`), never this machine's.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.ds_simulation import deepspeed_lacking
from tests.plans import LLAMA2_7B
from wizard.check.doctor import check_texts
from wizard.check.rules import deepspeed_json as dj
from wizard.probe.hardware import Hardware, assume

DS3 = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto",
                          "stage3_gather_16bit_weights_on_model_save": True},
}
TA = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "learning_rate": 2e-5, "bf16": True,
      "max_steps": 100}
ACC = """compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: ds_config.json
  zero3_init_flag: true
distributed_type: DEEPSPEED
machine_rank: 0
main_process_port: 0
num_machines: 1
num_processes: 4
"""


def ds_with(path: str, value) -> dict:
    cfg = copy.deepcopy(DS3)
    node = cfg
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return cfg


def check(cfg: dict, memlock=None, hardware=None, model=None, acc: str | None = None):
    """Every finding on `cfg` as the HF Trainer's, this machine's memlock limit being `memlock` (None: unlimited)."""
    return check_texts(acc, cfg, training_args=TA, versions={}, port_in_use=lambda port: False,
                       memlock_limit=lambda: memlock, hardware=hardware, model_shape=model)


def rules(findings) -> set[str]:
    return {f.rule for f in findings}


OFFLOAD = {"device": "cpu", "pin_memory": False}

# key -> (valid config, misspelt/misplaced config and the key DeepSpeed names, where it belongs,
#         a value DeepSpeed rejects and words of DeepSpeed's own message)
CASES = {
    "ratio": (ds_with("zero_optimization.offload_optimizer", {**OFFLOAD, "ratio": 0.3}),
              ds_with("zero_optimization.offload_optimizer", {**OFFLOAD, "ratioo": 0.3}),
              "zero_optimization.offload_optimizer.ratioo", "zero_optimization.offload_optimizer.ratio",
              ds_with("zero_optimization.offload_optimizer", {**OFFLOAD, "ratio": 1.5}),
              "zero_optimization.offload_optimizer.ratio", "less than or equal to 1"),
    "super_offload": (ds_with("zero_optimization.offload_optimizer", {**OFFLOAD, "super_offload": True}),
                      ds_with("zero_optimization.super_offload", True),      # the block it is not read from
                      "zero_optimization.super_offload", "zero_optimization.offload_optimizer.super_offload",
                      ds_with("zero_optimization.offload_optimizer", {**OFFLOAD, "super_offload": "yes please"}),
                      "zero_optimization.offload_optimizer.super_offload", "valid boolean"),
    "zenflow": (ds_with("zero_optimization.zenflow", {"topk_ratio": 0.1, "select_strategy": "step",
                                                      "select_interval": 100, "update_interval": 4}),
                ds_with("zero_optimization.zenflow", {"topk_ratioo": 0.1}),
                "zero_optimization.zenflow.topk_ratioo", "zero_optimization.zenflow.topk_ratio",
                ds_with("zero_optimization.zenflow", {"topk_ratio": 1.5}),   # 0.19.8: < 1; 0.19.0: <= 1
                "zero_optimization.zenflow.topk_ratio", "Input should be less than"),
    "autotp_size": (ds_with("tensor_parallel", {"autotp_size": 2}),
                    ds_with("tensor_parallel", {"autotp_sizee": 2}),
                    "tensor_parallel.autotp_sizee", "tensor_parallel.autotp_size",
                    ds_with("tensor_parallel", {"autotp_size": "two"}),
                    "tensor_parallel.autotp_size", "valid integer"),
    "deepcompile": (ds_with("compile", {"deepcompile": True}),
                    ds_with("compile", {"deep_compile": True}),
                    "compile.deep_compile", "compile.deepcompile",
                    ds_with("compile", {"deepcompile": "maybe"}),
                    "compile.deepcompile", "valid boolean"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_valid_value_gets_no_finding(name):
    assert check(CASES[name][0]) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_misspelt_or_misplaced_key_is_rejected_by_deepspeeds_model_and_placed(name):
    _, bad, key, belongs, *_ = CASES[name]
    findings = check(bad)
    assert rules(findings) == {"DS-LIBRARY-REJECTS"}, [f.message for f in findings]
    (f,) = findings
    assert f.key == key and "Extra inputs are not permitted" in f.message
    assert belongs in f.fix


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_value_deepspeed_rejects_carries_its_own_message(name):
    *_, bad, key, words = CASES[name]
    findings = check(bad)
    assert rules(findings) == {"DS-LIBRARY-REJECTS"}, [f.message for f in findings]
    assert any(f.key == key and words in f.message for f in findings), [(f.key, f.message) for f in findings]


def test_zenflows_own_auto_is_taken_by_accelerate_for_its_placeholder():
    """ZenFlowConfig's select_strategy / select_interval / update_interval default to the string "auto"; written
    out, accelerate's prepare-time fill takes it for its own placeholder and raises '... not found in kwargs'."""
    findings = check(ds_with("zero_optimization.zenflow", {"topk_ratio": 0.1, "select_strategy": "auto"}))
    (f,) = findings
    assert f.rule == "DS-AUTO-UNFILLED" and f.key == "zero_optimization.zenflow.select_strategy"
    assert "ZenFlowConfig" in f.message and f.fix.startswith("remove the key")


def test_zenflow_at_the_top_level_is_silently_ignored_and_placed():
    cfg = copy.deepcopy(DS3)
    cfg["zenflow"] = {"topk_ratio": 0.1}
    (f,) = check(cfg)
    assert f.rule == "DS-UNKNOWN-TOP-KEY" and f.severity == "warning"
    assert "zero_optimization.zenflow" in f.message and f.fix == "move it to zero_optimization.zenflow"


def test_the_models_are_found_in_the_installed_deepspeed_not_listed():
    from deepspeed.compile.config import CompileConfig
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    schema = dj.ds_schema()
    assert schema.sections["zero_optimization"] is DeepSpeedZeroConfig
    assert schema.sections["zero_optimization.offload_optimizer"] is DeepSpeedZeroOffloadOptimizerConfig
    assert schema.sections["zero_optimization.zenflow"] is ZenFlowConfig
    assert schema.sections["tensor_parallel"] is TPTrainingConfig
    assert schema.sections["compile"] is CompileConfig
    assert schema.prefixes["TPTrainingConfig"] == "tensor_parallel"
    # every one of them refuses a key it does not know (the top level, read key by key, ignores it)
    assert all(dj.forbids_extra(schema.sections[p]) for p in
               ("zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.zenflow",
                "tensor_parallel", "compile"))
    assert all(dj.key_status(p).known for p in dj.KEY_INTRODUCED)


# --------------------------------------------------------------------------- keys newer than the DeepSpeed

# key -> (the release before it, the top-level block that release does not read at all, or None)
BEFORE = {
    "zero_optimization.offload_optimizer.ratio": ("0.12.2", None),
    "zero_optimization.offload_optimizer.super_offload": ("0.17.6", None),
    "zero_optimization.zenflow": ("0.17.4", None),
    "tensor_parallel.autotp_size": ("0.16.3", "tensor_parallel"),
    "compile.deepcompile": ("0.16.5", "compile"),
}
VALID = {"zero_optimization.offload_optimizer.ratio": CASES["ratio"][0],
         "zero_optimization.offload_optimizer.super_offload": CASES["super_offload"][0],
         "zero_optimization.zenflow": CASES["zenflow"][0], "tensor_parallel.autotp_size": CASES["autotp_size"][0],
         "compile.deepcompile": CASES["deepcompile"][0]}


def test_the_table_names_exactly_the_keys_it_is_about():
    assert set(dj.KEY_INTRODUCED) == set(BEFORE)


@pytest.mark.parametrize("path", sorted(BEFORE))
def test_a_key_the_deepspeed_lacks_names_the_release_that_added_it(path):
    version, block = BEFORE[path]
    with deepspeed_lacking(block or path, version=version):
        findings = check(VALID[path])
    assert rules(findings) == {"DS-KEY-NEEDS-NEWER-DEEPSPEED"}, [f.message for f in findings]
    (f,) = findings
    introduced = dj.KEY_INTRODUCED[path]
    assert f.severity == "error" and f.key == path
    assert f"added in DeepSpeed {introduced}" in f.message and f"installed DeepSpeed {version}" in f.message
    assert f"deepspeed>={introduced}" in f.fix
    if block:   # the top level is read key by key: the whole block is dropped without a word
        assert f"does not read the top-level '{block}' block and silently ignores it" in f.message
    else:       # the model that lacks the field forbids extras
        assert "Extra inputs are not permitted" in f.message


def test_the_library_verdict_on_the_same_key_gives_way_to_the_release():
    """On the real older DeepSpeed, its model rejects the key too (DS-LIBRARY-REJECTS, same key): one problem,
    one finding, the one that says which release has it."""
    from wizard.check.doctor import one_finding_per_problem
    from wizard.check.rules.common import finding

    path = "zero_optimization.offload_optimizer.super_offload"
    with deepspeed_lacking(path, version="0.17.6"):
        ours = list(dj.key_needs_newer_deepspeed(_ctx(VALID[path])))
    library = finding("error", "DS-LIBRARY-REJECTS", "ds_config.json", path, "Extra inputs are not permitted")
    assert [f.rule for f in one_finding_per_problem(ours + [library])] == ["DS-KEY-NEEDS-NEWER-DEEPSPEED"]


def _ctx(cfg: dict):
    from wizard.check.rules.common import CheckContext
    return CheckContext(ds=cfg, ds_path="ds_config.json")


def test_a_key_a_later_deepspeed_dropped_is_not_called_new():
    path = "compile.deepcompile"
    with deepspeed_lacking("compile.deepcompile", version="0.99.0"):
        (f,) = check(VALID[path])
    assert "no longer has it" in f.message and "deepspeed>=" not in f.fix


# --------------------------------------------------------------------------- pinned memory and ulimit -l

GPUS = assume("4xA100-80GB")
PROBE = dataclasses.replace(GPUS, source="probe")                # this machine, which trains on its GPUs
NO_GPU = Hardware(gpus=[], gpu_reason="test", source="probe", cpu_cores=2)   # nothing is page-locked there
MiB, GiB = 1 << 20, 1 << 30


def offload(optimizer: dict | None = None, param: dict | None = None, stage: int = 3) -> dict:
    cfg = copy.deepcopy(DS3)
    cfg["zero_optimization"]["stage"] = stage
    if optimizer is not None:
        cfg["zero_optimization"]["offload_optimizer"] = optimizer
    if param is not None:
        cfg["zero_optimization"]["offload_param"] = param
    return cfg


def memlock_findings(cfg, memlock, hardware=PROBE, model=None, acc=None):
    return [f for f in check(cfg, memlock=memlock, hardware=hardware, model=model, acc=acc)
            if f.rule == "DS-PIN-MEMORY-MEMLOCK"]


def test_the_pin_memory_default_is_the_installed_models():
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)

    from wizard.check.rules.common import older

    assert dj.pin_memory_default("optimizer") is DeepSpeedZeroOffloadOptimizerConfig().pin_memory
    assert dj.pin_memory_default("param") is DeepSpeedZeroOffloadParamConfig().pin_memory
    # false up to 0.19.4, true from 0.19.5 (offload_config.py of both sdists)
    assert dj.pin_memory_default("optimizer") is not older(dj.ds_schema().version, dj.PIN_MEMORY_DEFAULT_TRUE_SINCE)


def test_pinning_by_the_installed_default_under_a_small_limit_warns_with_limit_key_and_fix(monkeypatch):
    monkeypatch.setattr(dj, "pin_memory_default", lambda which: True)     # a DeepSpeed 0.19.5 or later
    (f,) = memlock_findings(offload({"device": "cpu"}), 8 * MiB)
    assert f.severity == "warning" and f.key == "zero_optimization.offload_optimizer.pin_memory"
    assert "8.0 MiB" in f.message and "defaults it to true" in f.message and "0.19.5" in f.message
    assert "ulimit -l unlimited" in f.fix and "limits.conf" in f.fix and '"pin_memory": false' in f.fix


def test_an_explicit_pin_memory_true_warns_too_and_false_never():
    (f,) = memlock_findings(offload({"device": "cpu", "pin_memory": True}), 8 * MiB)
    assert "(pin_memory: true)" in f.message
    assert memlock_findings(offload({"device": "cpu", "pin_memory": False}), 8 * MiB) == []


def test_a_deepspeed_whose_default_is_false_pins_only_when_told(monkeypatch):
    # DeepSpeed 0.19.4 and older: pin_memory defaults to false (offload_config.py), read from the model
    monkeypatch.setattr(dj, "pin_memory_default", lambda which: False)
    assert memlock_findings(offload({"device": "cpu"}), 8 * MiB) == []
    assert len(memlock_findings(offload({"device": "cpu", "pin_memory": True}), 8 * MiB)) == 1


def test_unlimited_large_or_elsewhere_is_quiet():
    cfg = offload({"device": "cpu", "pin_memory": True})
    assert memlock_findings(cfg, None) == []                    # unlimited
    assert memlock_findings(cfg, 64 * GiB) == []                # above the floor, model unknown
    assert memlock_findings(cfg, 8 * MiB, hardware=GPUS) == []     # --assume: files checked for another machine
    assert memlock_findings(cfg, 8 * MiB, hardware=NO_GPU) == []   # DeepSpeed's CPU accelerator pins nothing
    assert memlock_findings(cfg, 8 * MiB, hardware=None) == []     # files read alone: no machine to judge
    assert memlock_findings(offload({"device": "nvme", "nvme_path": "/nvme", "pin_memory": True}), 8 * MiB) == []
    # offload_param below ZeRO-3 is never read (DS-OFFLOAD-PARAM-BELOW-ZERO3 says so)
    assert memlock_findings(offload(param={"device": "cpu", "pin_memory": True}, stage=2), 8 * MiB) == []


def test_with_the_model_known_the_pinned_bytes_decide():
    # 4 processes: each pins at least 4 B x 6.74e9 / 4 = 6.3 GiB for optimizer offload
    cfg = offload({"device": "cpu", "pin_memory": True})
    (f,) = memlock_findings(cfg, 4 * GiB, model=LLAMA2_7B, acc=ACC)     # above the 1 GiB floor, below the need
    assert "each of the 4 processes pins at least 6.3 GiB" in f.message and "4.0 GiB" in f.message
    assert memlock_findings(cfg, 8 * GiB, model=LLAMA2_7B, acc=ACC) == []
    # parameter offload (ZeRO-3) adds the 16-bit partition: 6 B x 6.74e9 / 4 = 9.4 GiB
    pinned = {"device": "cpu", "pin_memory": True}
    (f,) = memlock_findings(offload(pinned, pinned), 8 * GiB, model=LLAMA2_7B, acc=ACC)
    assert "9.4 GiB" in f.message and "offload_optimizer and offload_param" in f.message
    # a small model fits a small limit: its bytes, not the floor, decide
    tiny = dataclasses.replace(LLAMA2_7B, params=1_000_000)
    assert memlock_findings(cfg, 8 * MiB, model=tiny, acc=ACC) == []


def test_the_machine_limit_is_read_as_ulimit_shows_it():
    import resource

    assert dj.memlock_bytes(resource.RLIM_INFINITY, resource.RLIM_INFINITY) is None
    assert dj.memlock_bytes(8 * MiB, resource.RLIM_INFINITY) == 8 * MiB
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert dj.memlock_bytes(soft, resource.RLIM_INFINITY) in (None, soft)
