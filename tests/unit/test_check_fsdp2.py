"""FSDP2 (`fsdp_config.fsdp_version: 2`) in `wizard check` (issue 27): LOCAL_STATE_DICT is an error before launch,
FSDP1-only keys are named with what accelerate does with them, and an FSDP1 strategy name where FSDP2 takes a
bool is an error naming the key. What the rules claim about accelerate is shown on the installed accelerate in
test_check_library_facts.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from wizard.check.doctor import check_texts
from wizard.probe.hardware import assume

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
# the FSDP2 config of the fixtures (make_fixtures.ACC["fsdp"]), which checks clean
FSDP2 = yaml.safe_load((FIXTURES / "TRN-FSDP2-8BIT-OPTIMIZER" / "clean" / "default_config.yaml").read_text())


def found(**fsdp: object) -> list:
    doc = {**FSDP2, "fsdp_config": {**FSDP2["fsdp_config"], **fsdp}}
    doc["fsdp_config"] = {k: v for k, v in doc["fsdp_config"].items() if v is not None}
    return check_texts(yaml.safe_dump(doc), hardware=assume("4xA100-80GB"), versions={},
                       port_in_use=lambda port: False)


def test_the_fixture_is_fsdp2_and_clean():
    assert FSDP2["fsdp_config"]["fsdp_version"] == 2 and found() == []


def test_local_state_dict_under_fsdp2_is_an_error_before_launch():
    # accelerate 1.16 raises inside the training script, when it builds FullyShardedDataParallelPlugin
    [f] = found(fsdp_state_dict_type="LOCAL_STATE_DICT")
    assert (f.rule, f.severity, f.when) == ("ACC-LAUNCH-REJECTS", "error", "launch")
    assert "FSDP2 does not support LOCAL_STATE_DICT" in f.message
    assert found(fsdp_state_dict_type="SHARDED_STATE_DICT") == []
    assert found(fsdp_version=1, fsdp_reshard_after_forward="FULL_SHARD", fsdp_state_dict_type="LOCAL_STATE_DICT",
                 fsdp_sync_module_states=True) == []


@pytest.mark.parametrize("key, value, says", [
    ("fsdp_sharding_strategy", "SHARD_GRAD_OP", "fsdp_reshard_after_forward: false"),
    ("fsdp_backward_prefetch", "BACKWARD_PRE", "Setting backward prefetch to None"),
    ("fsdp_forward_prefetch", True, "not yet implemented in FSDP2"),
    ("fsdp_use_orig_params", True, "always uses the original parameters"),
    ("fsdp_sync_module_states", True, "not needed"),
])
def test_each_fsdp1_only_key_is_one_warning_saying_what_accelerate_does(key, value, says):
    [f] = found(**{key: value})
    assert (f.rule, f.severity, f.key) == ("ACC-FSDP1-KEY-UNDER-FSDP2", "warning", f"fsdp_config.{key}")
    assert says in f.message + f.fix
    fsdp1 = {"fsdp_version": 1, "fsdp_reshard_after_forward": "FULL_SHARD", "fsdp_sync_module_states": True}
    assert found(**{**fsdp1, key: value}) == []


def test_sharding_strategy_says_whether_fsdp2_already_does_the_same():
    [f] = found(fsdp_sharding_strategy="FULL_SHARD")           # reshard_after_forward: true, as FULL_SHARD
    assert "already" in f.message
    [f] = found(fsdp_sharding_strategy="SHARD_GRAD_OP")        # FSDP2 reshards anyway: ZeRO-3, not ZeRO-2
    assert "already" not in f.message and "fsdp_reshard_after_forward: true" in f.message


def test_sync_module_states_false_is_launchs_error_under_its_own_key():
    # launch still checks it against fsdp_cpu_ram_efficient_loading (also under FSDP2): one finding, on the key
    [f] = found(fsdp_sync_module_states=False)
    assert (f.rule, f.severity, f.key) == ("ACC-FSDP1-KEY-UNDER-FSDP2", "error", "fsdp_config.fsdp_sync_module_states")
    assert "fsdp_cpu_ram_efficient_loading" in f.message


@pytest.mark.parametrize("strategy, equivalent", [("FULL_SHARD", "true"), ("SHARD_GRAD_OP", "false"),
                                                  ("NO_SHARD", "false")])
def test_an_fsdp1_strategy_as_reshard_after_forward_is_an_error_naming_the_bool(strategy, equivalent):
    [f] = found(fsdp_reshard_after_forward=strategy)
    assert (f.rule, f.severity, f.key) == ("ACC-FSDP2-RESHARD-NOT-BOOL", "error",
                                           "fsdp_config.fsdp_reshard_after_forward")
    assert f"invalid truth value {strategy.lower()}" in f.message
    assert f.fix.startswith(f"fsdp_reshard_after_forward: {equivalent}")


@pytest.mark.parametrize("value", [True, False, "true", "false", "yes"])
def test_a_bool_or_a_word_accelerate_reads_as_one_is_fine(value):
    assert found(fsdp_reshard_after_forward=value) == []
