"""The ladder: which rung is chosen and why, by the arithmetic of memory.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from wizard.errors import InputError
from wizard.planning.plan import (
    COMPONENTS,
    Plan,
    StrategyOptions,
    Topology,
    TrainingOptions,
    explain_nothing_fits,
    ladder_keys,
    make_plan,
    next_rung,
    rung_by_key,
    what_would_fit,
)
from wizard.probe.hardware import GPU, Hardware
from wizard.sizing import memory as mem
from wizard.sizing.model import ModelShape
from wizard.units import GiB

# Shapes of real models (parameter counts as DeepSpeed counts them: tied weights once).
LLAMA2_7B = ModelShape(params=6_738_415_616, largest_layer_params=32_000 * 4096, hidden_size=4096, layers=32,
                       heads=32, kv_heads=32, vocab_size=32_000, intermediate_size=11_008, model_type="llama")
LLAMA3_70B = ModelShape(params=70_553_706_496, largest_layer_params=128_256 * 8192, hidden_size=8192, layers=80,
                        heads=64, kv_heads=8, vocab_size=128_256, intermediate_size=28_672, model_type="llama")
LLAMA31_405B = ModelShape(params=405_853_388_800, largest_layer_params=128_256 * 16_384, hidden_size=16_384,
                          layers=126, heads=128, kv_heads=8, vocab_size=128_256, intermediate_size=53_248)
ONE_B = ModelShape(params=1_000_000_000, largest_layer_params=32_000 * 2048, hidden_size=2048, layers=16, heads=32,
                   kv_heads=8, vocab_size=32_000, intermediate_size=5632)
GPT2 = ModelShape(params=124_439_808, largest_layer_params=50_257 * 768, hidden_size=768, layers=12, heads=12,
                  kv_heads=12, vocab_size=50_257, intermediate_size=3072, tied_embeddings=True)


def gpus(n: int, gib: int, ram_gib: int = 2048, bf16: bool = True, **kw) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name=f"GPU-{gib}GB", memory_total=gib * GiB, bf16=bf16,
                              compute_capability=(9, 0) if bf16 else (7, 0)) for i in range(n)],
                    ram_total=ram_gib * GiB, ram_available=ram_gib * GiB, **kw)


def plan_for(hw: Hardware, model: ModelShape, per_machine: int | None = None, machines: int = 1,
             training: TrainingOptions | None = None, strategy: StrategyOptions | None = None) -> Plan:
    topo = Topology(num_machines=machines, processes_per_machine=per_machine or hw.num_gpus)
    return make_plan(hw, model, training or TrainingOptions(), strategy or StrategyOptions(), topo)


def states(rung) -> int:
    return rung.breakdown["parameters"] + rung.breakdown["gradients"] + rung.breakdown["optimizer"]


def keys(plan: Plan) -> list[str]:
    return [r.key for r in plan.rungs]


# --- The ladder on real shapes -------------------------------------------------------------------------

@pytest.mark.parametrize("headroom", [0.10, 0.25])
def test_a_rung_fits_only_within_the_capacity_less_the_headroom(headroom):
    """An estimate between (1 - headroom) x capacity and the capacity does not fit; with no headroom it does."""
    training = TrainingOptions(gradient_checkpointing="off")
    need = rung_by_key(plan_for(gpus(1, 80), ONE_B, training=training), "single").per_gpu_bytes
    capacity = int(need / (1 - headroom / 2))        # need is half way into the headroom
    hw = Hardware(gpus=[GPU(index=0, name="GPU", memory_total=capacity, bf16=True, compute_capability=(9, 0))],
                  ram_total=2048 * GiB, ram_available=2048 * GiB)
    tight = plan_for(hw, ONE_B, training=training, strategy=StrategyOptions(headroom=headroom))
    single = rung_by_key(tight, "single")
    assert single.per_gpu_bytes == need and tight.usable_bytes == int(capacity * (1 - headroom))
    assert not single.fits and "usable" in single.reason
    assert single.max_micro_batch == 0
    loose = plan_for(hw, ONE_B, training=training, strategy=StrategyOptions(headroom=0.0))
    assert rung_by_key(loose, "single").fits and rung_by_key(loose, "single").max_micro_batch >= 1


def test_7b_on_8x80gb_picks_zero2_because_ddp_model_states_alone_exceed_the_gpu():
    plan = plan_for(gpus(8, 80), LLAMA2_7B)
    assert plan.precision == "bf16"
    assert plan.usable_bytes == int(80 * GiB * 0.9)
    assert keys(plan) == ["ddp", "zero2", "zero3", "zero2-offload-opt", "zero3-offload-opt", "zero3-offload-all",
                          "zero3-nvme"]
    ddp, zero2 = plan.rungs[0], plan.rungs[1]
    # DDP: 16 B/param of model states = 107.8 GB > 72 GiB usable, before any activation.
    assert states(ddp) == 16 * LLAMA2_7B.params > plan.usable_bytes
    assert not ddp.fits and not ddp.gradient_checkpointing
    assert "72.0 GiB is usable (80.0 GiB - 10% headroom)" in ddp.reason
    # ZeRO-2: DeepSpeed's own figure, 2P + 18P/8, plus activations etc. fits.
    cpu, gpu = mem.ds_estimate_zero2_model_states_mem_needs(LLAMA2_7B.params, 8, 1, False)
    assert states(zero2) == gpu
    # Host RAM: the plan's loading rule (memory.load_host_bytes), not the estimator's fp32 load: 8 x P x 2 B.
    assert zero2.cpu_bytes == 8 * LLAMA2_7B.params * 2 < cpu
    assert zero2.fits and not zero2.gradient_checkpointing
    assert plan.choice is zero2
    assert "chosen: the fastest rung that fits" in zero2.reason
    zero3 = plan.rungs[2]
    # ZeRO-3 fits too, but gathers the weights in forward and backward: slower, and said so.
    assert zero3.fits and zero3.tokens_per_second < zero2.tokens_per_second
    assert re.search(r"Fits \(.*\), 1\.\d+x slower \(≈.* tok/s\): ", zero3.reason), zero3.reason


def test_1b_on_one_24gb_gpu_picks_single():
    plan = plan_for(gpus(1, 24, ram_gib=64), ONE_B)
    assert keys(plan)[0] == "single"
    single = plan.choice
    assert single.key == "single" and single.backend == "single" and single.zero_stage is None
    assert states(single) == 16 * ONE_B.params
    assert single.breakdown["buffers"] == 0          # no DDP buckets with one process
    assert single.per_gpu_bytes <= plan.usable_bytes


def test_70b_on_8x80gb_needs_zero3_with_optimizer_offload():
    plan = plan_for(gpus(8, 80), LLAMA3_70B)
    by = {r.key: r for r in plan.rungs}
    # ZeRO-2 and plain ZeRO-3: model states alone are over the usable memory, so GC is not tried.
    for key in ("ddp", "zero2", "zero3"):
        assert states(by[key]) > plan.usable_bytes and not by[key].fits and not by[key].gradient_checkpointing
    cpu, gpu, _ = mem.ds_estimate_zero3_model_states_mem_needs(LLAMA3_70B.params, LLAMA3_70B.largest_layer_params,
                                                               8, 1, False, False, True)
    # DeepSpeed's estimator less the fp32 gradient partition stage3.py never holds whole (memory.states_zero3).
    assert abs(states(by["zero3"]) + int(2 * LLAMA3_70B.params / 8) - gpu) <= 2
    assert by["zero3"].cpu_bytes == LLAMA3_70B.params * 2     # zero.Init: rank 0 alone reads the 16-bit weights
    # Offloading the optimizer leaves 4*LL + 2P/8 on the GPU, and the rest fits.
    cpu, gpu, _ = mem.ds_estimate_zero3_model_states_mem_needs(LLAMA3_70B.params, LLAMA3_70B.largest_layer_params,
                                                               8, 1, True, False, True)
    assert states(by["zero3-offload-opt"]) == gpu
    assert plan.choice.key == "zero3-offload-opt"
    assert plan.choice.offload_optimizer == "cpu" and plan.choice.offload_param == "none"
    assert plan.choice.per_gpu_bytes <= plan.usable_bytes and plan.choice.cpu_bytes == cpu <= 2048 * GiB


def test_405b_on_8x80gb_needs_parameter_offload():
    plan = plan_for(gpus(8, 80, ram_gib=12 * 1024), LLAMA31_405B)
    by = {r.key: r for r in plan.rungs}
    # Even the optimizer-offload rung keeps 2P/8 = 101 GB of 16-bit weights per GPU.
    assert states(by["zero3-offload-opt"]) > plan.usable_bytes
    assert plan.choice.key == "zero3-offload-all"
    # Only the largest layer (4 * 2.1e9 B) stays; activations need checkpointing.
    assert states(plan.choice) == 4 * LLAMA31_405B.largest_layer_params
    assert plan.choice.gradient_checkpointing
    assert "with gradient checkpointing switched on" in plan.choice.reason


def test_405b_with_too_little_ram_goes_to_nvme_when_a_path_with_space_is_given():
    hw = gpus(8, 80, ram_gib=4096, nvme_path="/nvme", disk_free_nvme=8 * 1024 * GiB)
    plan = plan_for(hw, LLAMA31_405B)
    assert not rung_by_key(plan, "zero3-offload-all").fits
    assert "of host RAM per machine" in rung_by_key(plan, "zero3-offload-all").reason
    assert plan.choice.key == "zero3-nvme"
    assert plan.choice.offload_param == "nvme" and plan.choice.offload_optimizer == "nvme"
    assert plan.choice.nvme_bytes == int(LLAMA31_405B.params * (2 + 4 + 8))
    small_disk = replace(hw, disk_free_nvme=1024 * GiB)
    plan = plan_for(small_disk, LLAMA31_405B)
    assert plan.choice is None
    assert "on NVMe at /nvme" in rung_by_key(plan, "zero3-nvme").reason
    # The NVMe rung needs a path: without one it never fits.
    plan = plan_for(gpus(8, 80, ram_gib=4096), LLAMA31_405B)
    assert "--nvme-path" in rung_by_key(plan, "zero3-nvme").reason and plan.choice is None


def test_huge_sequence_turns_on_gradient_checkpointing_at_the_first_rung_where_activations_are_the_problem():
    # whole sequences only (--parallelism-config-cp-size 1 --parallelism-config-sp-size 1): with the splitting rungs
    # a context-parallel one without recomputation is faster (test_plan_long_context)
    whole = StrategyOptions(cp_size=1, sp_size=1)
    plan = plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(seq_len=32_768), strategy=whole)
    ddp, zero2 = plan.rungs[0], plan.rungs[1]
    # DDP: model states don't fit, so checkpointing would not help and is not switched on.
    assert not ddp.fits and not ddp.gradient_checkpointing
    # ZeRO-2: states fit, activations at s = 32k do not; with GC it fits.
    without = plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(seq_len=32_768, gradient_checkpointing="off"),
                       strategy=whole)
    assert not rung_by_key(without, "zero2").fits
    assert states(zero2) + zero2.breakdown["buffers"] + zero2.breakdown["context"] <= plan.usable_bytes
    assert zero2.gradient_checkpointing and zero2.fits and plan.choice is zero2
    s, h, f, layers = 32_768, 4096, 11_008, 32
    # bf16, flash: every layer keeps its 2-byte input; one layer is recomputed, h * (24 + 8f/h) per token
    # (bench/measure_activations.py), and its backward holds 2.5 f-sized bf16 gradients.
    expected = 2 * s * h * layers + s * (24 * h + 8 * f) + s * 5 * f
    assert expected == 2 * s * h * layers + mem.activation_bytes_per_layer(s, 1, h, 32, f, flash=True) \
        + s * mem.backward_working_bytes_per_token(s, h, 32, f, flash=True)
    # The recomputed layer and the loss's peak (12 B per logit) never coexist: the step's peak is the checkpoints
    # plus the larger of the two, and here the logits (12 * s * V) are the larger.
    recomputed = expected - 2 * s * h * layers
    logits = 12 * s * 32_000
    assert logits > recomputed and zero2.breakdown["logits"] == logits
    assert zero2.breakdown["activations"] + zero2.breakdown["logits"] == 2 * s * h * layers + max(recomputed, logits)
    assert "gradient checkpointing switched on" in zero2.reason


def test_gradient_checkpointing_forced():
    on = plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(gradient_checkpointing="on"))
    assert all(r.gradient_checkpointing for r in on.rungs)
    off = plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(seq_len=32_768, gradient_checkpointing="off"))
    assert not any(r.gradient_checkpointing for r in off.rungs)
    assert off.choice is None or off.choice.key != "zero2"


def test_host_ram_decides_between_zero2_and_zero3():
    # ZeRO-2 has every local process load the 16-bit checkpoint: P * 2 * 8 = 100.4 GiB of host RAM.
    plan = plan_for(gpus(8, 80, ram_gib=64), LLAMA2_7B)
    zero2 = rung_by_key(plan, "zero2")
    assert zero2.per_gpu_bytes <= plan.usable_bytes and not zero2.fits
    assert "100.4 GiB of host RAM per machine but 64.0 GiB is available" in zero2.reason
    assert plan.choice.key == "zero3"          # zero.Init: only rank 0 reads the checkpoint (12.6 GiB)


def test_unknown_host_ram_is_not_checked_but_noted():
    hw = gpus(8, 80, ram_gib=0)
    plan = plan_for(hw, LLAMA2_7B)
    assert plan.choice.key == "zero2"
    assert any("Host RAM is unknown" in n for n in plan.notes)
    assumed = replace(gpus(8, 80, ram_gib=64), ram_available=0)
    plan = plan_for(assumed, LLAMA2_7B)
    assert plan.choice.key == "zero3"          # total RAM used when available is unknown
    assert any("total is used" in n for n in plan.notes)


# --- Nothing fits -------------------------------------------------------------------------------------------

def test_nothing_fits_says_how_far_and_what_would_fit_verified_by_recomputing():
    hw = gpus(2, 24, ram_gib=64)
    training = TrainingOptions(micro_batch=4)
    plan = plan_for(hw, LLAMA2_7B, training=training)
    assert plan.choice is None and all(not r.fits for r in plan.rungs)
    text = explain_nothing_fits(plan, hw, LLAMA2_7B, training, StrategyOptions(), plan.topology)
    # ZeRO-2 + CPU optimizer offload fits on the 24 GB cards (20.1 of 21.6 GiB: its recomputed layer and the
    # loss's peak do not coexist); the 64 GiB of RAM is what stops it (issue 19: say so).
    assert text.startswith("Nothing fits. The closest rung")
    assert "GiB" in text and "%" in text
    assert "Host RAM is what stops ZeRO-2 + CPU optimizer offload: it fits on the GPUs" in text
    suggestions = what_would_fit(hw, LLAMA2_7B, training, StrategyOptions(), plan.topology)
    assert suggestions
    for s in suggestions:
        assert s.text in text
        again = make_plan(hw, LLAMA2_7B, s.training, s.strategy, s.topology)
        assert again.choice is not None and again.choice.key == s.choice_key
    gpu_counts = [s for s in suggestions if s.topology != plan.topology]
    assert gpu_counts, "more GPUs must make a 7B model fit"
    # It is the smallest count: one machine fewer does not fit.
    found = gpu_counts[0].topology
    assert f"with {found.world_size} GPUs" in text
    fewer = replace(found, num_machines=found.num_machines - 1)
    assert make_plan(hw, LLAMA2_7B, training, StrategyOptions(), fewer).choice is None


def test_nothing_fits_suggests_smaller_micro_batch_and_shorter_sequence():
    # 32 GB: with AMP's 16-bit weight copies (1.7 GiB) a 1B model at micro-batch 1 no longer fits 24 GB.
    hw = gpus(1, 32, ram_gib=64)
    training = TrainingOptions(micro_batch=4, seq_len=2048, gradient_checkpointing="off", grad_accum=2)
    strategy = StrategyOptions(backend="ddp")
    plan = make_plan(hw, ONE_B, training, strategy, Topology())
    assert plan.choice is None and keys(plan) == ["single"]
    suggestions = what_would_fit(hw, ONE_B, training, strategy, Topology())
    texts = " | ".join(s.text for s in suggestions)
    assert "--micro-batch" in texts and "--seq-len" in texts and "--gradient-checkpointing on" in texts
    micro = next(s for s in suggestions if "--micro-batch" in s.text)
    assert micro.training.micro_batch * micro.training.grad_accum == 8 or "keep" not in micro.text
    for s in suggestions:
        assert make_plan(hw, ONE_B, s.training, s.strategy, s.topology).choice is not None
    # The largest micro-batch that fits is chosen: one more does not fit.
    bigger = replace(micro.training, micro_batch=micro.training.micro_batch + 1)
    assert make_plan(hw, ONE_B, bigger, strategy, Topology()).choice is None


def test_nothing_fits_without_any_fix_says_so():
    hw = gpus(1, 8, ram_gib=16)
    huge = replace(LLAMA31_405B)
    plan = plan_for(hw, huge, training=TrainingOptions(seq_len=128))
    assert plan.choice is None
    text = explain_nothing_fits(plan, hw, huge, TrainingOptions(seq_len=128), StrategyOptions(), plan.topology)
    assert "No single change tried" in text


# --- Forced backends ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy, world, expected", [
    (StrategyOptions(backend="ddp"), 8, ["ddp"]),
    (StrategyOptions(backend="ddp"), 1, ["single"]),
    (StrategyOptions(backend="deepspeed"), 8,
     ["zero2", "zero3", "zero2-offload-opt", "zero3-offload-opt", "zero3-offload-all", "zero3-nvme"]),
    (StrategyOptions(backend="deepspeed", zero_stage="1"), 8, ["zero1", "zero1-offload-opt"]),
    (StrategyOptions(backend="deepspeed", zero_stage="2"), 8, ["zero2", "zero2-offload-opt"]),
    (StrategyOptions(backend="deepspeed", zero_stage="3"), 8,
     ["zero3", "zero3-offload-opt", "zero3-offload-all", "zero3-nvme"]),
    (StrategyOptions(backend="deepspeed", zero_stage="3", offload="none"), 8, ["zero3"]),
    (StrategyOptions(backend="deepspeed", offload="cpu"), 8,
     ["zero2-offload-opt", "zero3-offload-opt", "zero3-offload-all"]),
    (StrategyOptions(backend="deepspeed", offload="nvme"), 8, ["zero3-nvme"]),
    (StrategyOptions(zero_stage="2"), 8, ["zero2", "zero2-offload-opt"]),
    (StrategyOptions(offload="none"), 8, ["ddp", "zero2", "zero3"]),
    (StrategyOptions(backend="fsdp"), 8, ["fsdp-noreshard", "fsdp-reshard", "fsdp-offload"]),
    (StrategyOptions(backend="fsdp", offload="none"), 8, ["fsdp-noreshard", "fsdp-reshard"]),
    (StrategyOptions(backend="fsdp", offload="cpu"), 8, ["fsdp-offload"]),
])
def test_forced_backends_pick_their_ladder(strategy, world, expected):
    assert ladder_keys(strategy, world) == expected
    plan = plan_for(gpus(8, 80), LLAMA2_7B, per_machine=world, strategy=strategy)
    assert keys(plan) == expected


@pytest.mark.parametrize("strategy, flag", [
    (StrategyOptions(backend="ddp", zero_stage="2"), "--zero-stage"),
    (StrategyOptions(backend="ddp", offload="cpu"), "--offload"),
    (StrategyOptions(backend="fsdp", offload="nvme"), "--offload"),
    (StrategyOptions(backend="fsdp", zero_stage="3"), "--zero-stage"),
    (StrategyOptions(backend="deepspeed", zero_stage="2", offload="nvme"), "--offload"),
    (StrategyOptions(backend="megatron"), "--backend"),
    (StrategyOptions(headroom=1.0), "--headroom"),
])
def test_bad_strategy_combinations_are_input_errors(strategy, flag):
    with pytest.raises(InputError) as err:
        plan_for(gpus(8, 80), LLAMA2_7B, strategy=strategy)
    assert err.value.field == flag


def test_bad_training_and_topology_are_input_errors():
    with pytest.raises(InputError) as err:
        plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(optimizer="lion"))
    assert err.value.field == "--optimizer" and "adamw-8bit" in str(err.value)
    with pytest.raises(InputError) as err:
        plan_for(gpus(2, 80), LLAMA2_7B, per_machine=4)
    assert err.value.field == "--num-processes"
    with pytest.raises(InputError):
        plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(micro_batch=0))
    with pytest.raises(InputError):
        make_plan(Hardware(gpu_reason="no driver", ram_total=GiB), GPT2, TrainingOptions(), StrategyOptions(),
                  Topology())


def test_fsdp_ladder_arithmetic():
    plan = plan_for(gpus(8, 80), LLAMA2_7B, strategy=StrategyOptions(backend="fsdp"))
    noreshard, reshard, offload = plan.rungs
    p = LLAMA2_7B.params
    assert p % 8 == 0 and states(reshard) == 16 * p // 8           # (4 + 4 + 8) P / N, no master copy
    assert states(noreshard) - states(reshard) == 2 * p            # the unsharded bf16 weights stay
    assert states(offload) == 0 and offload.cpu_bytes > 0
    assert reshard.breakdown["buffers"] > noreshard.breakdown["buffers"]
    assert plan.choice is noreshard and noreshard.fsdp_reshard is False and reshard.fsdp_reshard is True


# --- Precision, CPU processes --------------------------------------------------------------------------------

def test_precision_auto_is_fp16_when_a_gpu_lacks_bf16():
    hw = gpus(2, 32, bf16=False)
    plan = plan_for(hw, GPT2)
    assert plan.precision == "fp16"
    forced = plan_for(hw, GPT2, training=TrainingOptions(precision="bf16"))
    assert forced.precision == "bf16" and any("bf16" in n for n in forced.notes)


def test_attention_auto_counts_the_s_squared_term_only_without_fused_kernels():
    plan16 = plan_for(gpus(1, 80), GPT2, training=TrainingOptions(seq_len=4096))
    plan32 = plan_for(gpus(1, 80), GPT2, training=TrainingOptions(seq_len=4096, precision="fp32"))
    a16 = plan16.rungs[0].breakdown["activations"]
    a32 = plan32.rungs[0].breakdown["activations"]
    eager = mem.activation_bytes(4096, 1, 768, 12, 12, 3072, flash=False, gradient_checkpointing=False,
                                 precision="fp32")
    assert a16 == mem.activation_bytes(4096, 1, 768, 12, 12, 3072, True, False, "bf16")
    assert a32 == eager


def test_cpu_processes_share_host_ram_in_fp32():
    hw = Hardware(gpus=[], gpu_reason="NVML Shared Library Not Found", ram_total=16 * GiB, ram_available=12 * GiB,
                  cpu_cores=2)
    topo = Topology(processes_per_machine=2, cpu=True)
    plan = make_plan(hw, GPT2, TrainingOptions(seq_len=512), StrategyOptions(), topo)
    assert plan.precision == "fp32"
    assert plan.gpu_capacity_bytes == 6 * GiB and plan.usable_bytes == int(6 * GiB * 0.9)
    assert keys(plan) == ["ddp", "zero2", "zero3"]               # no offload on CPU processes
    assert any("CPU processes" in n and "gloo" in n for n in plan.notes)
    assert all(r.cpu_bytes == 0 and r.breakdown["context"] == mem.CPU_PROCESS_OVERHEAD_BYTES for r in plan.rungs)
    assert plan.choice is not None and "per process" in plan.choice.reason
    single = make_plan(hw, GPT2, TrainingOptions(seq_len=512), StrategyOptions(), Topology(cpu=True))
    assert single.choice.key == "single" and single.choice.name == "Single process"
    with pytest.raises(InputError):
        make_plan(hw, GPT2, TrainingOptions(), StrategyOptions(offload="cpu"), topo)


# --- Shape of the result ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model, hw, strategy", [
    (LLAMA2_7B, gpus(8, 80), StrategyOptions()),
    (LLAMA3_70B, gpus(8, 80), StrategyOptions()),
    (LLAMA31_405B, gpus(8, 80, ram_gib=4096, nvme_path="/nvme", disk_free_nvme=2**44), StrategyOptions()),
    (LLAMA2_7B, gpus(8, 80), StrategyOptions(backend="fsdp")),
    (LLAMA2_7B, gpus(8, 80), StrategyOptions(backend="deepspeed", zero_stage="1")),
])
def test_every_rung_has_a_breakdown_that_sums_to_its_estimate(model, hw, strategy):
    for gc in ("auto", "on", "off"):
        plan = plan_for(hw, model, strategy=strategy, training=TrainingOptions(gradient_checkpointing=gc))
        for r in plan.rungs:
            assert tuple(r.breakdown) == COMPONENTS
            assert sum(r.breakdown.values()) == r.per_gpu_bytes
            assert all(isinstance(v, int) and v >= 0 for v in r.breakdown.values())
            assert r.reason and r.reason.endswith(".")
            assert r.reason.count(". ") == 0, r.reason     # one sentence
            if r is plan.choice:
                assert r.fits and "chosen:" in r.reason
            elif r.fits:
                # Every other rung that fits says how fast it is against the choice, and why it lost.
                assert re.search(r"(\d\.\d+x (slower|faster)|about as fast) \(≈", r.reason), r.reason
            else:
                assert not r.reason.startswith("Fits"), r.reason


def test_to_json_matches_the_design_shape():
    plan = plan_for(gpus(8, 80), LLAMA2_7B)
    data = json.loads(json.dumps(plan.to_json()))
    assert set(data["choice"]) >= {"backend", "zero_stage", "offload_optimizer", "offload_param",
                                   "gradient_checkpointing", "per_gpu_bytes", "cpu_bytes"}
    assert data["choice"]["backend"] == "deepspeed" and data["choice"]["zero_stage"] == 2
    assert data["choice"]["offload_optimizer"] == "none" and data["choice"]["offload_param"] == "none"
    assert data["gpu_capacity_bytes"] == 80 * GiB
    for r in data["rungs"]:
        assert set(r) >= {"name", "fits", "per_gpu_bytes", "cpu_bytes", "breakdown", "reason"}
        assert isinstance(r["breakdown"], dict) and isinstance(r["per_gpu_bytes"], int)
    nothing = plan_for(gpus(1, 8, ram_gib=16), LLAMA31_405B)
    assert json.loads(json.dumps(nothing.to_json()))["choice"] is None


# --- next_rung / rung_by_key ---------------------------------------------------------------------------------

def test_next_rung_after_oom():
    plan = plan_for(gpus(8, 80), LLAMA3_70B)
    # After ZeRO-2, the first later rung that fits (ZeRO-3 itself does not).
    assert next_rung(plan, "zero2").key == "zero3-offload-opt"
    assert next_rung(plan, "ddp").key == "zero3-offload-opt"
    assert next_rung(plan, "zero3-offload-opt").key == "zero3-offload-all"
    assert next_rung(plan, "zero3-nvme") is None
    assert next_rung(plan, "fsdp-reshard") is None
    assert rung_by_key(plan, "zero3").zero_stage == 3 and rung_by_key(plan, "nope") is None
    # When nothing later fits, the next escalation is still offered.
    hopeless = plan_for(gpus(1, 8, ram_gib=16), LLAMA31_405B)
    assert next_rung(hopeless, "single").key == "zero2-offload-opt"     # one GPU: ZeRO-2 alone partitions nothing


def test_nothing_fits_when_only_the_nvme_path_is_missing():
    hw = gpus(8, 80, ram_gib=4096)
    plan = plan_for(hw, LLAMA31_405B)
    assert plan.choice is None
    text = explain_nothing_fits(plan, hw, LLAMA31_405B, TrainingOptions(), StrategyOptions(), plan.topology)
    assert "The closest rung, ZeRO-3 + NVMe offload of optimizer and parameters, fits in GPU memory" in text
    assert "--nvme-path" in text and not re.search(r"(^|[\s(])-\d", text)       # no negative shortfall
    assert text.count("--nvme-path") == 1
    short_disk = gpus(8, 80, ram_gib=4096, nvme_path="/nvme", disk_free_nvme=4 * 1024 * GiB)
    plan = plan_for(short_disk, LLAMA31_405B)
    text = explain_nothing_fits(plan, short_disk, LLAMA31_405B, TrainingOptions(), StrategyOptions(), plan.topology)
    assert "on NVMe at /nvme" in text and "more than the 4.0 TiB free" in text


# --- Issue 9: memory-model fixes ------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from wizard.probe.hardware import assume  # noqa: E402
from wizard.sizing.model import size_model  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


def test_host_ram_counts_loading_the_16_bit_checkpoint_per_process_not_deepspeeds_fp32_build():
    # Llama-3.1-8B (bf16 checkpoint) on 8 x A100-80GB with 256G: ZeRO-2 fits the GPUs and, loading
    # 8 x 2 B x P = 119.7 GiB, the host too (DeepSpeed's estimator says 4 x P x 8 x 1.5 = 359 GiB).
    model = size_model(str(FIXTURES / "llama-3.1-8b"), use_cache=False)
    assert model.weights_dtype_bytes == 2
    plan = plan_for(assume("8xA100-80GB,ram=256G"), model)
    zero2 = rung_by_key(plan, "zero2")
    assert zero2.cpu_bytes == 8 * 2 * model.params
    assert mem.ds_estimate_zero2_model_states_mem_needs(model.params, 8, 1, False)[0] > 256 * GiB
    assert plan.choice.key == "zero2"
    # ZeRO-3 under zero.Init: rank 0 alone reads the checkpoint.
    assert rung_by_key(plan, "zero3").cpu_bytes == 2 * model.params


def test_small_model_on_eight_gpus_with_little_ram_stays_on_ddp():
    model = size_model(str(FIXTURES / "qwen2-0.5b"), use_cache=False)
    plan = plan_for(assume("8xA100-80GB,ram=16G"), model)
    assert plan.choice.key == "ddp"
    assert plan.choice.cpu_bytes == 8 * 2 * model.params <= int(16 * GiB * 0.9)


def test_offload_rungs_count_the_offloaded_states_or_the_load_whichever_is_larger():
    plan = plan_for(gpus(8, 80, ram_gib=4096), LLAMA3_70B)
    by = {r.key: r for r in plan.rungs}
    cpu, _, _ = mem.ds_estimate_zero3_model_states_mem_needs(LLAMA3_70B.params, LLAMA3_70B.largest_layer_params,
                                                            8, 1, True, False, True)
    assert by["zero3-offload-opt"].cpu_bytes == max(cpu, 2 * LLAMA3_70B.params) == cpu


def test_autocast_weight_copies_are_counted_on_ddp_only():
    plan = plan_for(gpus(8, 80), LLAMA2_7B)
    ddp, zero2 = rung_by_key(plan, "ddp"), rung_by_key(plan, "zero2")
    untied_matmul_params = LLAMA2_7B.params - LLAMA2_7B.vocab_size * LLAMA2_7B.hidden_size   # the embedding is a lookup
    assert ddp.breakdown["autocast"] == 2 * untied_matmul_params
    assert zero2.breakdown["autocast"] == 0
    assert set(ddp.breakdown) == set(COMPONENTS)
    fp32 = plan_for(gpus(8, 80), LLAMA2_7B, training=TrainingOptions(precision="fp32"))
    assert rung_by_key(fp32, "ddp").breakdown["autocast"] == 0


def test_attention_auto_follows_the_models_eager_default():
    sdpa_model = replace(LLAMA2_7B, attn_implementation="sdpa")
    eager_model = replace(LLAMA2_7B, attn_implementation="eager")
    training = TrainingOptions(gradient_checkpointing="off")
    sdpa = rung_by_key(plan_for(gpus(8, 80), sdpa_model, training=training), "zero3")
    eager = rung_by_key(plan_for(gpus(8, 80), eager_model, training=training), "zero3")
    s, a = 2048, LLAMA2_7B.heads
    scores = LLAMA2_7B.layers * a * s * s * mem.attention_score_bytes("bf16")
    assert eager.breakdown["activations"] - sdpa.breakdown["activations"] >= scores
    note = " ".join(plan_for(gpus(8, 80), eager_model).notes)
    assert "transformers runs this model with eager attention" in note


def test_mamba_plans_with_a_labelled_estimate():
    mamba = ModelShape(params=130_000_000, largest_layer_params=50_280 * 768, hidden_size=768, layers=24, heads=0,
                       kv_heads=0, vocab_size=50_280, intermediate_size=1536, model_type="mamba",
                       tied_embeddings=True, ssm_state_size=16, ssm_inner_size=1536, attn_implementation="eager")
    plan = plan_for(gpus(1, 80), mamba)
    assert plan.choice is not None
    tokens = 2048
    per_layer = tokens * mem.ssm_bytes_per_token(1536, 16, "bf16")
    assert plan.choice.breakdown["activations"] >= per_layer
    assert any("Mamba" in n and "upper estimate" in n for n in plan.notes)


def test_seq_len_above_the_models_context_is_a_warning_not_an_error():
    model = replace(LLAMA2_7B, max_position_embeddings=4096)
    plan = plan_for(gpus(8, 80), model, training=TrainingOptions(seq_len=8192))
    assert any(n.startswith("Warning: --seq-len 8192 is longer than the model's context (4096") for n in plan.notes)
    assert not any("--seq-len" in n for n in plan_for(gpus(8, 80), model).notes)


def test_mixed_gpu_sizes_are_planned_on_the_smallest_with_a_note():
    plan = plan_for(assume("4xA100-80GB+4xA100-40GB"), LLAMA2_7B)
    assert plan.gpu_capacity_bytes == 40 * GiB
    assert any("different memory sizes" in n and "planned on the smallest, 40.0 GiB" in n for n in plan.notes)
    assert not any("different memory sizes" in n for n in plan_for(assume("8xA100-80GB"), LLAMA2_7B).notes)


def test_nvme_rung_checks_disk_of_an_assumed_machine():
    strategy = StrategyOptions(nvme_path="/local_nvme")
    small = plan_for(assume("8xH100-80GB,ram=4096G,disk=100G"), LLAMA31_405B, strategy=strategy)
    nvme = rung_by_key(small, "zero3-nvme")
    assert nvme.nvme_bytes > 100 * GiB and not nvme.fits
    assert "on NVMe at /local_nvme but 100.0 GiB is free" in nvme.reason
    big = plan_for(assume("8xH100-80GB,ram=4096G,disk=8T"), LLAMA31_405B, strategy=strategy)
    assert rung_by_key(big, "zero3-nvme").fits


def test_nvme_rung_measures_another_path_on_this_machine(tmp_path, monkeypatch):
    import wizard.probe.hardware as hardware_mod

    monkeypatch.setattr(hardware_mod, "free_disk", lambda path: 10 * GiB if path == str(tmp_path) else None)
    hw = gpus(8, 80, ram_gib=1024, nvme_path="/elsewhere", disk_free_nvme=2**50)
    plan = plan_for(hw, LLAMA31_405B, strategy=StrategyOptions(nvme_path=str(tmp_path)))
    assert "10.0 GiB is free" in rung_by_key(plan, "zero3-nvme").reason


# --- Issue 19: the head a task has, not always a vocabulary ---------------------------------------------------

def test_a_sequence_classifier_is_sized_with_its_labels_not_a_vocabulary(tmp_path, monkeypatch):
    """A BERT ForSequenceClassification config: the logits are num_labels per sample (12 B each at the loss's peak),
    not 0.7 GiB of vocabulary-wide LM logits. --task overrides what the architecture says."""
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path / "cache"))
    from transformers import BertConfig
    BertConfig(architectures=["BertForSequenceClassification"], num_labels=3).save_pretrained(tmp_path / "bert")
    shape = size_model(str(tmp_path / "bert"))
    assert (shape.task, shape.num_labels) == ("sequence-classification", 3)
    hw = assume("1xA100-80GB")
    training = TrainingOptions(seq_len=512, micro_batch=8)
    plan = make_plan(hw, shape, training, StrategyOptions(), Topology(1, 1))
    assert rung_by_key(plan, "single").breakdown["logits"] == 12 * 8 * 3
    lm = make_plan(hw, shape, replace(training, task="causal-lm"), StrategyOptions(), Topology(1, 1))
    assert rung_by_key(lm, "single").breakdown["logits"] == 12 * 512 * 8 * shape.vocab_size
    tokens = make_plan(hw, shape, replace(training, task="token-classification"), StrategyOptions(), Topology(1, 1))
    assert rung_by_key(tokens, "single").breakdown["logits"] == 12 * 512 * 8 * 3
    with pytest.raises(InputError, match="--task"):
        make_plan(hw, shape, replace(training, task="translation"), StrategyOptions(), Topology(1, 1))


@pytest.mark.parametrize("name, task", [("LlamaForCausalLM", "causal-lm"), ("GPT2LMHeadModel", "causal-lm"),
                                        ("BertForSequenceClassification", "sequence-classification"),
                                        ("RobertaForTokenClassification", "token-classification"),
                                        ("BertForQuestionAnswering", "question-answering"),
                                        ("BertForMaskedLM", "masked-lm"), ("T5ForConditionalGeneration", "seq2seq-lm"),
                                        ("BertModel", "base")])
def test_the_task_follows_the_class_name(name, task):
    from wizard.sizing.model import task_of_class
    assert task_of_class(name) == task


def test_inside_the_speed_tie_a_rung_with_room_wins_over_a_tight_one():
    """4x RTX 4090, 7B, micro-batch 4: ZeRO-2 + offload and ZeRO-3 + offload tie (both ≈1.26k tok/s); the tie went
    to ZeRO-2 + offload with 1008.7 MiB to spare over ZeRO-3 + offload with 9 GiB (issue 29: 686 vs 687 tok/s, 425 MiB
    against 18.2 GiB then). Inside the tie, the rung that leaves room wins, and both reasons say so."""
    from wizard import pipeline
    from wizard.planning.reasons import TIGHT_SPARE, choose
    result = pipeline.build(pipeline.Request(assume="4xRTX4090", plan_only=True,
                                             given={"params": "7B", "micro_batch": 4}))
    plan = result.plan
    z2, z3 = rung_by_key(plan, "zero2-offload-opt"), rung_by_key(plan, "zero3-offload-opt")
    assert z2.fits and z3.fits and abs(z2.tokens_per_second / z3.tokens_per_second - 1) < 0.03   # the premise: a tie
    assert plan.usable_bytes - z2.per_gpu_bytes < TIGHT_SPARE * plan.usable_bytes                  # z2 is tight
    assert plan.choice.key == "zero3-offload-opt", plan.choice.key
    assert "the first offload rung within 3% of the fastest that leaves room (ZeRO-2 + CPU optimizer offload " \
        "leaves less than 5% of the usable memory to spare" in plan.choice.reason, plan.choice.reason
    assert "but with only 1008.7 MiB to spare; ZeRO-3 + CPU optimizer offload, as fast with room, wins the tie." \
        in z2.reason, z2.reason
    # without the usable memory (the old rule), the earlier rung; with room on both, the earlier rung still wins
    assert choose(plan.rungs).key == "zero2-offload-opt"
    assert choose(plan.rungs, plan.usable_bytes * 2).key == "zero2-offload-opt"
