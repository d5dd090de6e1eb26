"""Long sequences the way ALST trains them (issue 38): DeepSpeed's Ulysses rungs, the loss as a choice, the code
options (TiledMLP, checkpoint offload), a requested cp / sp size, the machine's longest sequence, and the offload
rung taken over a tight one (issue 36, item 5)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from wizard.errors import InputError
from wizard.planning import reasons, rungs
from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions, make_plan
from wizard.planning.plan_types import Rung
from wizard.probe import hardware
from wizard.sizing import memory as mem
from wizard.sizing import sequence as seqmem
from wizard.sizing.model import ModelShape

LLAMA31_8B = ModelShape(params=8_030_261_248, largest_layer_params=128_256 * 4096, hidden_size=4096, layers=32,
                        heads=32, kv_heads=8, vocab_size=128_256, intermediate_size=14_336, model_type="llama",
                        layer_class="LlamaDecoderLayer")
LLAMA3_70B = ModelShape(params=70_553_706_496, largest_layer_params=128_256 * 8192, hidden_size=8192, layers=80,
                        heads=64, kv_heads=8, vocab_size=128_256, intermediate_size=28_672, model_type="llama")


def plan(seq: int, assume: str = "8xH100-80GB", model: ModelShape = LLAMA31_8B, machines: int = 1,
         training: TrainingOptions | None = None, strategy: StrategyOptions | None = None):
    hw = hardware.assume(assume)
    training = replace(training or TrainingOptions(), seq_len=seq)
    return make_plan(hw, model, training, strategy or StrategyOptions(), Topology(machines, hw.num_gpus))


CODE = TrainingOptions(allow_code_changes=True)


# --- Ulysses: the sizes DeepSpeed allows, the memory of a rung ---------------------------------------------------

def test_ulysses_sizes_follow_deepspeeds_head_rule():
    assert seqmem.ulysses_sizes_allowed(32, 8) == (1, 2, 4, 8, 16, 32)     # Llama-3-8B: KV heads replicated past 8
    assert 64 in seqmem.ulysses_sizes_allowed(64, 8)                      # Llama-3-70B on 64 GPUs (ALST 5.3.2)
    assert seqmem.ulysses_sizes_allowed(9, 3) == (1, 3, 9)                # ALST 3.2.1's example
    assert 6 not in seqmem.ulysses_sizes_allowed(12, 4)                   # 4 KV heads neither divide 6 nor 6 them
    # the rule is DeepSpeed's own: both conditions are in the installed UlyssesSPAttentionHF
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    source = inspect.getsource(UlyssesSPAttentionHF.__init__)
    assert "self.attn_head_count % self.world_size != 0" in source
    assert "self.global_kv_head_count % self.world_size == 0 or self.world_size % self.global_kv_head_count == 0" \
        in source


def test_a_ulysses_rung_holds_1_over_sp_of_the_sequence_and_zero3s_states():
    p = plan(262144, strategy=StrategyOptions(sp_size=8, offload="none", zero_stage="3"))
    assert [r.key for r in p.rungs] == ["zero3-sp8"]
    r = p.rungs[0]
    whole = plan(2048, strategy=StrategyOptions(zero_stage="3", offload="none", sp_size=1))
    zero3 = next(x for x in whole.rungs if x.key == "zero3")
    assert (r.breakdown["parameters"], r.breakdown["gradients"], r.breakdown["optimizer"]) == \
        (zero3.breakdown["parameters"], zero3.breakdown["gradients"], zero3.breakdown["optimizer"])
    assert r.breakdown["logits"] == seqmem.loss_bytes(p.loss, 262144 // 8, 1, 128_256, 4096, "bf16")
    # the activations: 32,768 tokens a GPU, plus what Ulysses adds (o_proj's own input)
    stack = seqmem.stack_for_loss(__import__("wizard.planning.resolve", fromlist=["x"]).layer_stack(LLAMA31_8B),
                                  p.loss, "llama")
    kept, recomputed = mem.stack_activation_parts(stack, 32768, 1, True, True, "bf16")
    extra = 32768 * seqmem.ulysses_extra_saved_per_token(4096, 32, 8, None, 8, "bf16")
    assert r.breakdown["activations"] == mem.peak_activation_bytes(kept, recomputed + extra, r.breakdown["logits"])


def test_grouped_kv_heads_replicated_past_their_count_cost_memory():
    # 8 KV heads over sp 16: each rank attends with one replicated head over the whole sequence
    assert seqmem.ulysses_kv_heads_per_rank(8, 16) == 1 and seqmem.ulysses_kv_heads_per_rank(8, 4) == 2
    below = seqmem.ulysses_extra_saved_per_token(4096, 32, 8, None, 8, "bf16")
    above = seqmem.ulysses_extra_saved_per_token(4096, 32, 8, None, 16, "bf16")
    assert above - below == 2 * 2 * 128 * (16 - 8)


def test_ulysses_communication_crosses_the_network_only_for_groups_wider_than_a_machine():
    from wizard.planning import speed as speed_mod
    hw = hardware.assume("8xH100-80GB")
    m = speed_mod.machine_from_hardware(hw, "bf16", 8)
    work = speed_mod.Workload(matmul_params=7_000_000_000, params=8_000_000_000, layers=32, hidden=4096,
                              seq=1 << 20, micro_batch=1, grad_accum=1, precision="bf16", flash=True,
                              gradient_checkpointing=True, kv_width=1024, q_width=4096, ulysses=True)
    inside = speed_mod.ulysses_seconds(m, replace(work, seq_shards=8), speed_mod.Layout(
        "deepspeed", 3, "none", "none", None, 8, 1))
    across = speed_mod.ulysses_seconds(m, replace(work, seq_shards=16), speed_mod.Layout(
        "deepspeed", 3, "none", "none", None, 8, 2))
    assert 0 < inside < across


# --- The loss as a choice ------------------------------------------------------------------------------------

def test_auto_takes_liger_where_the_logits_are_a_large_share_and_full_elsewhere():
    assert plan(2048).loss == "full"
    long = plan(65536)
    assert long.loss == "liger" and any(n.startswith("Loss: the full logits would take") for n in long.notes)
    assert plan(65536, training=TrainingOptions(loss="full")).loss == "full"


def test_liger_is_refused_where_triton_cannot_run_and_tiled_needs_code():
    with pytest.raises(InputError) as err:
        plan(65536, assume="8xV100-32GB", training=TrainingOptions(loss="liger"))
    assert err.value.field == "--loss" and "compute capability 8.0+" in str(err.value)
    assert plan(65536, assume="8xV100-32GB").loss == "full"          # auto: no Liger there, no code allowed
    assert plan(65536, assume="8xV100-32GB", training=CODE).loss == "tiled"
    with pytest.raises(InputError) as err:
        plan(65536, training=TrainingOptions(loss="tiled"))
    assert "--allow-code-changes" in str(err.value)
    with pytest.raises(InputError) as err:
        plan(65536, training=TrainingOptions(loss="liger", trainer="accelerate"))
    assert "Accelerate loop" in str(err.value)
    other = replace(LLAMA31_8B, model_type="gpt_neox")
    assert plan(65536, model=other).loss == "full"                    # a model Liger does not patch


def test_the_fused_losses_are_far_below_the_full_logits_and_follow_their_chunks():
    full = mem.logits_bytes(131072, 1, 128_256, "bf16")
    assert seqmem.loss_bytes("liger", 131072, 1, 128_256, 4096, "bf16") < full / 20
    tiled = seqmem.loss_bytes("tiled", 131072, 1, 128_256, 4096, "bf16")
    shards = seqmem.tiled_loss_shards(131072, 128_256)
    assert shards == 63 and tiled < full / 10                          # about 1 GiB of fp32 logits a shard


# --- ALST's code options -----------------------------------------------------------------------------------------

def test_code_options_switch_on_only_where_allowed_and_needed_offload_first():
    off = plan(1 << 21)
    assert not any(r.checkpoint_offload or r.tiled_mlp for r in off.rungs)
    on = plan(1 << 21, training=CODE)
    used = [r for r in on.rungs if r.checkpoint_offload or r.tiled_mlp]
    assert used and all(r.backend == "deepspeed" and r.gradient_checkpointing for r in used)
    c = on.choice
    assert c is not None and c.fits and c.sp_size > 1 and c.checkpoint_offload
    # the offloaded checkpoints are host RAM: every local process's layer inputs
    assert c.cpu_bytes >= seqmem.checkpoint_offload_host_bytes((1 << 21) // c.sp_size, 1, 4096, 32, "bf16", 8)
    # a rung that fits without them runs without them
    assert not any(r.checkpoint_offload or r.tiled_mlp for r in plan(65536, training=CODE).rungs if r.fits
                   and not r.gradient_checkpointing)


def test_tiled_mlp_shrinks_the_recomputed_layer():
    from wizard.planning.resolve import layer_stack
    stack = layer_stack(LLAMA31_8B)
    plain = seqmem.layer_parts(stack, 131072, 1, True, True, "bf16")
    tiled = seqmem.layer_parts(stack, 131072, 1, True, True, "bf16", tiled_mlp=True)
    offload = seqmem.layer_parts(stack, 131072, 1, True, True, "bf16", checkpoint_offload=True)
    tokens, h, f = 131072, 4096, 14336
    # the MLP's four saved f-tensors and its 2.5 f-tensors of backward go; HF's fp32 RMSNorm backward (18 h B a
    # token in bf16) is then the layer's largest phase, above the MLP's shard (32 shards of 4,096 tokens)
    assert tiled[0] == plain[0]
    assert tiled[1] == plain[1] - tokens * int(6.5 * f * 2) + tokens * 18 * h
    liger = seqmem.layer_parts(seqmem.stack_for_loss(stack, "liger", "llama"), tokens, 1, True, True, "bf16",
                               tiled_mlp=True)
    liger_plain = seqmem.layer_parts(seqmem.stack_for_loss(stack, "liger", "llama"), tokens, 1, True, True, "bf16")
    shard_phase = (2 + 1 / 32) * 2 * h + 6 * f * 2 / 32          # Liger's norms: the MLP's shard is the largest
    assert liger[1] == liger_plain[1] - tokens * int((3 + 1.2) * f * 2) + tokens * shard_phase
    assert offload[1] == plain[1] and offload[0] == 2 * tokens * h


# --- The done-when of issue 38 ------------------------------------------------------------------------------------

def test_8b_at_a_million_tokens_fits_on_a_ulysses_rung_with_the_fused_loss():
    p = plan(1048576)
    assert p.loss == "liger"
    assert p.choice is not None and p.choice.fits and p.choice.sp_size > 1
    assert p.longest.seq_len >= 1048576


def test_the_machines_longest_sequence_with_code_changes():
    one = plan(2048, training=CODE)
    assert one.longest.seq_len >= 3_000_000 and rungs.BY_KEY[one.longest.key].sp_size == 8
    four = plan(2048, assume="8xH100-80GB,nodes=4", machines=4, training=CODE)
    assert four.longest.seq_len >= 10_000_000 and rungs.BY_KEY[four.longest.key].sp_size == 32
    # without code changes, shorter; with offload ruled out, no offload rung reaches it
    plain = plan(2048)
    assert plain.longest.seq_len < one.longest.seq_len and plain.longest.code.any is False
    none = plan(2048, strategy=StrategyOptions(offload="none"))
    assert not rungs.BY_KEY[none.longest.key].offloads
    assert plain.to_json()["longest"] == plain.longest.to_json()
    assert set(plain.to_json()["longest"]) >= {"seq_len", "rung", "loss", "checkpoint_offload", "tiled_mlp"}


def test_a_70b_plans_a_long_sequence_rung_on_one_8xh100_machine():
    p = plan(65536, assume="8xH100-80GB,ram=2T", model=LLAMA3_70B)
    assert p.choice is not None and p.choice.fits and p.choice.sp_size > 1
    # with too little host RAM for its CPU optimizer states, no rung takes any sequence: the longest says so
    small = plan(65536, model=LLAMA3_70B)
    assert small.choice is None and small.longest is None


# --- A requested size: honoured or refused with the reason -----------------------------------------------------

def test_a_requested_sp_size_is_the_ladder():
    p = plan(65536, strategy=StrategyOptions(sp_size=4))
    assert p.rungs and {r.sp_size for r in p.rungs} == {4} and p.choice.sp_size == 4


@pytest.mark.parametrize("strategy, training, seq, words", [
    (StrategyOptions(sp_size=3), TrainingOptions(), 65536, "heads"),
    (StrategyOptions(sp_size=16), TrainingOptions(), 65536, "does not divide the 8 processes"),
    (StrategyOptions(sp_size=4, backend="fsdp"), TrainingOptions(), 65536, "DeepSpeed's"),
    (StrategyOptions(sp_size=4), TrainingOptions(attention="eager"), 65536, "eager"),
    (StrategyOptions(sp_size=4), TrainingOptions(), 65538, "multiple of 4"),
    (StrategyOptions(sp_size=2, cp_size=2), TrainingOptions(), 65536, "mutually exclusive"),
    (StrategyOptions(cp_size=4), TrainingOptions(), 65540, "multiple of 8"),
    (StrategyOptions(cp_size=4, backend="deepspeed"), TrainingOptions(), 65536, "FSDP2's"),
    (StrategyOptions(cp_size=3), TrainingOptions(), 65536, "does not divide the 8 processes"),
])
def test_a_size_the_plan_cannot_honour_is_refused_in_one_line(strategy, training, seq, words):
    with pytest.raises(InputError) as err:
        plan(seq, training=training, strategy=strategy)
    text = str(err.value)
    assert words in text and "\n" not in text
    assert err.value.field in ("parallelism-config-sp-size", "parallelism-config-cp-size")


def test_size_one_keeps_whole_sequences():
    p = plan(8192, strategy=StrategyOptions(cp_size=1, sp_size=1))
    assert all(r.seq_shards == 1 for r in p.rungs)


# --- Offload over a tight rung (issue 36, item 5) ----------------------------------------------------------------

def rung(key, per_gpu, rate, offload="none"):
    from wizard.planning.speed import Speed
    return Rung(key=key, name=key, backend="deepspeed", offload_optimizer=offload, fits=True, per_gpu_bytes=per_gpu,
                speed=Speed(1.0, rate, rate, 0.3, "compute", 1, 0, 0, 0, 0))


USABLE = 100_000


@pytest.mark.parametrize("plain_spare, offload_rate, offload_wins", [
    (0.015, 1.074, True),         # issue 36's 8 x V100: 1.5 % to spare, the offload rung 7 % faster
    (0.049, 1.074, True),         # just inside the model's error
    (0.051, 1.074, False),        # just outside: no offload while a rung without it fits with room
    (0.015, 1.02, False),         # tight, but the offload rung is only as fast (within the tie)
])
def test_an_offload_rung_wins_only_over_a_tight_rung_and_only_when_faster(plain_spare, offload_rate, offload_wins):
    plain = rung("fsdp-cp4", int(USABLE * (1 - plain_spare)), 1.0)
    offload = rung("zero3-offload-all", USABLE // 3, offload_rate, offload="cpu")
    choice = reasons.choose([plain, offload], USABLE)
    assert choice is (offload if offload_wins else plain)
    assert reasons.tight_rung_passed([plain, offload], choice, USABLE) is (plain if offload_wins else None)


def test_the_8xv100_70b_lora_case_takes_the_faster_offload_rung_and_says_why():
    from wizard.sizing import lora
    hw = hardware.assume("8xV100-32GB")
    training = TrainingOptions(method="lora")
    adapters = lora.size_llama_adapters(LLAMA3_70B, lora.lora_options("lora", 16, None, 0.05, None))
    p = make_plan(hw, LLAMA3_70B, training, StrategyOptions(sp_size=1), Topology(1, 8), adapters=adapters)
    cp4 = next(r for r in p.rungs if r.key == "fsdp-cp4")
    assert cp4.fits and reasons.tight(cp4, p.usable_bytes)
    assert p.choice.offloads and p.choice.tokens_per_second > cp4.tokens_per_second * (1 + reasons.SPEED_TIE)
    assert "within the memory model's measured error" in p.choice.reason and cp4.name in p.choice.reason
    assert "with offload, is faster and has room" in cp4.reason


# --- transformers 5.17-5.24: ZeRO-1/2 Ulysses gradients sp times too large ------------------------------------------

@pytest.mark.parametrize("stage, sp, version, wrong", [
    (2, 4, "5.17.0", True), (1, 2, "5.24.1", True), (2, 4, "5.25.0", False), (3, 4, "5.17.0", False),
    (2, 1, "5.17.0", False), (2, 4, None, False), (2, 4, "not-a-version", False),
])
def test_ulysses_gradients_too_large_only_on_zero12_below_5_25(stage, sp, version, wrong):
    assert seqmem.ulysses_gradients_too_large(stage, sp, version) is wrong


def test_a_zero2_ulysses_plan_warns_where_the_machines_transformers_scales_its_gradients():
    def planned(version, zero_stage="auto"):
        hw = replace(hardware.assume("8xH100-80GB"), libraries={"transformers": version})
        training = TrainingOptions(seq_len=8192)
        return make_plan(hw, LLAMA31_8B, training, StrategyOptions(sp_size=4, zero_stage=zero_stage), Topology(1, 8))

    old = planned("5.17.0")
    assert old.choice.key == "zero2-sp4"
    [note] = [n for n in old.notes if "times too large" in n]
    assert "transformers 5.17.0" in note and "ZeRO-2" in note and "transformers>=5.25" in note and "ZeRO-3" in note
    assert not any("times too large" in n for n in planned("5.25.0").notes)
    zero3 = planned("5.17.0", zero_stage="3")
    assert zero3.choice.zero_stage == 3 and not any("times too large" in n for n in zero3.notes)
