"""DeepSpeed optimizer offload runs DeepSpeedCPUAdam: 8-bit AdamW is never paired with CPU offload, in the
memory plan (memory.optimizer_for_rung via plan._states) and in the 'what would fit' hints alike."""

from __future__ import annotations

import pytest

from wizard.planning.plan import RUNG_SPECS, StrategyOptions, Topology, TrainingOptions, make_plan, what_would_fit
from wizard.probe.hardware import GPU, Hardware
from wizard.sizing import memory as mem
from wizard.sizing.model import ModelShape
from wizard.units import GiB

LLAMA2_7B = ModelShape(params=6_738_415_616, largest_layer_params=32_000 * 4096, hidden_size=4096, layers=32,
                       heads=32, kv_heads=32, vocab_size=32_000, intermediate_size=11_008, model_type="llama")


def gpus(n: int, gib: int, ram_gib: int) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name=f"GPU-{gib}GB", memory_total=gib * GiB, bf16=True,
                              compute_capability=(9, 0)) for i in range(n)],
                    ram_total=ram_gib * GiB, ram_available=ram_gib * GiB)


@pytest.mark.parametrize("asked,offloads,runs", [
    ("adamw", True, "adamw"), ("adamw-8bit", True, "adamw"), ("sgd", True, "sgd"), ("adafactor", True, "adafactor"),
    ("adamw", False, "adamw"), ("adamw-8bit", False, "adamw-8bit"), ("sgd", False, "sgd"),
])
def test_optimizer_for_rung(asked, offloads, runs):
    assert mem.optimizer_for_rung(asked, offloads) == runs


def _rungs(optimizer: str) -> dict:
    hw = gpus(4, 80, 2048)
    plan = make_plan(hw, LLAMA2_7B, TrainingOptions(optimizer=optimizer), StrategyOptions(),
                     Topology(num_machines=1, processes_per_machine=4))
    return {r.key: r for r in plan.rungs}


def test_offload_rungs_count_adamw_states_when_8bit_was_asked():
    eight, full = _rungs("adamw-8bit"), _rungs("adamw")
    offload_keys = [k for k in eight
                    if RUNG_SPECS[k].backend == "deepspeed" and RUNG_SPECS[k].offload_optimizer != "none"]
    assert offload_keys
    for key in offload_keys:        # DeepSpeedCPUAdam's fp32 states, exactly as for AdamW
        assert eight[key].breakdown == full[key].breakdown and eight[key].cpu_bytes == full[key].cpu_bytes, key
    # without offload 8-bit AdamW really runs: 2 B/param instead of 8 B/param of optimizer states (ZeRO-2: / 4 GPUs)
    assert full["zero2"].breakdown["optimizer"] - eight["zero2"].breakdown["optimizer"] == \
        pytest.approx(6 * LLAMA2_7B.params / 4, rel=1e-6)


def test_what_would_fit_never_suggests_8bit_with_offload():
    # 4 x 24 GB and 96 GiB of RAM: nothing fits a 7B with AdamW; before this rule the hint was
    # "with --optimizer adamw-8bit: ZeRO-3 + CPU optimizer offload fits", which would run DeepSpeedCPUAdam
    hw = gpus(4, 24, 96)
    training, topo = TrainingOptions(micro_batch=1, seq_len=2048), Topology(num_machines=1, processes_per_machine=4)
    assert make_plan(hw, LLAMA2_7B, training, StrategyOptions(), topo).choice is None
    hints = what_would_fit(hw, LLAMA2_7B, training, StrategyOptions(), topo)
    assert hints          # other single changes still fit
    assert not [h for h in hints if "adamw-8bit" in h.text and RUNG_SPECS[h.choice_key].offloads]
