"""Long sequences (issue 30): the logits counted at the asked length, context-parallel rungs where nothing without
offload fits the sequence, and the longest sequence that fits the chosen rung."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pytest
import yaml

from wizard.config import parallelism
from wizard.planning import plan as plan_mod
from wizard.planning import rungs
from wizard.planning import speed as speed_mod
from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions, make_plan
from wizard.probe import hardware
from wizard.sizing import memory as mem
from wizard.sizing import sequence as seqmem
from wizard.sizing.model import ModelShape

LLAMA31_8B = ModelShape(params=8_030_261_248, largest_layer_params=128_256 * 4096, hidden_size=4096, layers=32,
                        heads=32, kv_heads=8, vocab_size=128_256, intermediate_size=14_336, model_type="llama")


def plan_8b(seq: int, training: TrainingOptions | None = None, strategy: StrategyOptions | None = None,
            assume: str = "8xH100-80GB"):
    hw = hardware.assume(assume)
    training = replace(training or TrainingOptions(), seq_len=seq)
    return make_plan(hw, LLAMA31_8B, training, strategy or StrategyOptions(), Topology(1, hw.num_gpus))


def cli(*args: str) -> tuple[int, str, str]:
    from wizard.frontends.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


# --- The done-when: 8B at 64k tokens on 8xH100-80GB ---------------------------------------------------------

def test_8b_at_64k_tokens_plans_a_rung_that_splits_the_sequence():
    """With the full logits (--loss full: issue 30's case) nothing without offload fits whole sequences; a rung that
    splits each sequence (FSDP2's context parallelism or DeepSpeed's Ulysses) does."""
    p = plan_8b(65536, TrainingOptions(loss="full"))
    plain = [r for r in p.rungs if r.seq_shards == 1]
    # v3's ladder: nothing without offload fits (the logits alone are 12 B x 65,536 x 128,256 = 93.9 GiB per GPU)
    assert not any(r.fits and not r.offloads for r in plain)
    assert all(r.breakdown["logits"] == mem.logits_bytes(65536, 1, 128_256, "bf16") for r in plain)
    c = p.choice
    assert c is not None and c.fits and c.seq_shards > 1 and not c.offloads
    # each GPU holds 1/cp (1/sp) of every sequence's logits and activations; the states are those of the same
    # strategy over whole sequences (FSDP2 resharding, or ZeRO at the same stage): over all 8 GPUs
    assert c.breakdown["logits"] == mem.logits_bytes(65536 // c.seq_shards, 1, 128_256, "bf16")
    base = plan_8b(2048, TrainingOptions(loss="full"), StrategyOptions(backend=c.backend))
    same = next(r for r in base.rungs if (r.zero_stage, r.fsdp_reshard, r.offloads) ==
                (c.zero_stage, c.fsdp_reshard, False) and r.seq_shards == 1)
    assert c.breakdown["parameters"] == same.breakdown["parameters"]
    assert c.speed is not None and c.speed.tokens_per_second > 0 and c.speed.communication_seconds >= 0
    assert c.per_gpu_bytes <= p.usable_bytes


def test_8b_at_64k_tokens_with_the_fused_loss_needs_no_split():
    """--loss auto takes Liger there (the logits would be 93.9 GiB per GPU): its memory, not the full logits', is
    counted, and whole sequences fit again without offload."""
    p = plan_8b(65536)
    assert p.loss == "liger"
    zero2 = next(r for r in p.rungs if r.key == "zero2")
    assert zero2.breakdown["logits"] == seqmem.loss_bytes("liger", 65536, 1, 128_256, 4096, "bf16")
    assert any(r.fits and not r.offloads and r.seq_shards == 1 for r in p.rungs)


def test_the_context_parallel_files_are_written_and_accepted_by_accelerate(tmp_path):
    code, out, err = cli("--non-interactive", "--assume", "8xH100-80GB", "--params", "8B", "--hidden-size", "4096",
                         "--layers", "32", "--heads", "32", "--vocab-size", "128256", "--seq-len", "65536",
                         "--output-dir", str(tmp_path))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "default_config.yaml").read_text())
    plan = json.loads((tmp_path / "wizard_plan.json").read_text())["plan"]
    cp = plan["choice"]["cp_size"]
    assert cp > 1 and doc["distributed_type"] == "FSDP" and doc["fsdp_config"]["fsdp_version"] == 2
    section = doc["parallelism_config"]
    assert section["parallelism_config_cp_size"] == cp
    assert section["parallelism_config_dp_shard_size"] * cp == doc["num_processes"] == 8
    sizes = {name: section[parallelism.PREFIX + name] for name in parallelism.SIZES}
    assert parallelism.problem(sizes, doc["num_processes"], 2, section[parallelism.CP_COMM_ID]) is None
    # the files read back as that rung (launch's OOM advice, wizard check)
    assert rungs.key_for(rungs.strategy_from_files(doc, None)) == plan["choice"]["key"]
    assert "not model" not in out + err


def test_short_sequences_keep_their_plan_without_split_rungs():
    p = plan_8b(2048)
    assert all(r.seq_shards == 1 for r in p.rungs)
    assert p.choice.max_seq_len == 0 or p.choice.max_seq_len < 2 * 2048


def test_at_8k_tokens_a_split_rung_joins_and_wins_where_it_is_the_fastest():
    """8B at 8,192 tokens on 8 x H100: every rung without offload needs gradient checkpointing for whole sequences,
    so the ladder also holds rungs that split them; one needs no recomputation and is chosen, faster than ZeRO-2
    with checkpointing by more than the tie."""
    p = plan_8b(8192)
    zero2 = next(r for r in p.rungs if r.key == "zero2")
    assert zero2.fits and zero2.gradient_checkpointing
    split = [r for r in p.rungs if r.seq_shards > 1]
    assert {r.cp_size > 1 for r in split} == {True, False}          # context and sequence parallel both tried
    c = p.choice
    assert c.seq_shards > 1 and not c.gradient_checkpointing
    assert c.tokens_per_second > zero2.tokens_per_second * (1 + plan_mod.SPEED_TIE)
    assert c.tokens_per_second == max(r.tokens_per_second for r in p.rungs if r.fits and not r.offloads)
    assert "chosen: the fastest rung that fits" in c.reason


def test_context_parallelism_needs_sdpa_fsdp2_and_a_sequence_it_can_split():
    full = TrainingOptions(loss="full")
    flash = plan_8b(65536, replace(full, attention="flash"))
    assert all(r.cp_size == 1 for r in flash.rungs)
    assert any(r.sp_size > 1 for r in flash.rungs)                  # Ulysses runs flash attention
    assert any("context parallelism: they need SDPA" in n for n in flash.notes)
    fsdp1 = plan_8b(65536, full, strategy=StrategyOptions(fsdp_version=1))
    assert all(r.cp_size == 1 for r in fsdp1.rungs)
    assert any("FSDP2" in n for n in fsdp1.notes)
    deepspeed = plan_8b(65536, full, strategy=StrategyOptions(backend="deepspeed"))
    assert all(r.cp_size == 1 for r in deepspeed.rungs)
    # cp must divide the sequence into 2 x cp chunks (torch's causal load balancer), and fit in a machine
    assert rungs.context_parallel_keys("auto", "auto", "full", 8, 65536 + 4) == ["fsdp-cp2"]
    assert rungs.context_parallel_keys("auto", "auto", "full", 4, 65536) == ["fsdp-cp2", "fsdp-cp4"]
    assert rungs.context_parallel_keys("auto", "cpu", "full", 8, 65536) == []


def test_ring_attention_costs_communication_that_grows_with_cp():
    hw = hardware.assume("8xH100-80GB")
    m = speed_mod.machine_from_hardware(hw, "bf16", 8)
    work = speed_mod.Workload(matmul_params=7_000_000_000, params=8_000_000_000, layers=32, hidden=4096,
                              seq=65536, micro_batch=1, grad_accum=1, precision="bf16", flash=True,
                              gradient_checkpointing=True, kv_width=1024)
    layout = speed_mod.Layout("fsdp", None, "none", "none", True, 8, 1)
    plain = speed_mod.estimate(m, work, layout)
    kv = [speed_mod.ring_attention_seconds(m, replace(work, seq_shards=cp)) for cp in (1, 2, 4, 8)]
    assert kv[0] == 0
    split = speed_mod.estimate(m, replace(work, seq_shards=4), layout)
    # a GPU runs 1/4 of each sequence: its step is shorter, and the job trains 1/4 of the sequences per step
    assert split.step_seconds < plain.step_seconds
    assert split.tokens_per_second < plain.tokens_per_second


# --- The longest sequence that fits -------------------------------------------------------------------------

def test_the_longest_sequence_that_fits_is_the_edge_of_fitting():
    p = plan_8b(65536, TrainingOptions(loss="full"))
    c = p.choice
    assert 65536 <= c.max_seq_len < 2 * 65536
    spec = rungs.BY_KEY[c.key]
    unit = plan_mod.seq_unit(spec)
    assert c.max_seq_len % unit == 0
    x = plan_mod._resolve(hardware.assume("8xH100-80GB"), LLAMA31_8B, TrainingOptions(seq_len=65536, loss="full"),
                          StrategyOptions(), Topology(1, 8), [])
    x = replace(x, batch=c.micro_batch, grad_accum=c.grad_accum)
    assert plan_mod._fits_seq(spec, x, c.max_seq_len, c.gradient_checkpointing)
    assert not plan_mod._fits_seq(spec, x, c.max_seq_len + unit, c.gradient_checkpointing)


def test_the_plan_output_shows_the_longest_sequence_near_the_limit():
    args = ["plan", "--assume", "8xH100-80GB", "--params", "8B", "--hidden-size", "4096", "--layers", "32",
            "--heads", "32", "--vocab-size", "128256"]
    _, near, _ = cli(*args, "--seq-len", "65536", "--loss", "full")
    assert "Longest sequence that fits: --seq-len " in near
    _, short, _ = cli(*args, "--seq-len", "1024")
    assert "Longest sequence that fits" not in short


# --- The logits, honestly -----------------------------------------------------------------------------------

def test_the_logits_note_says_what_they_cost_and_what_would_avoid_them():
    long = plan_8b(65536, TrainingOptions(loss="full"))
    note = next(n for n in long.notes if n.startswith("Logits:"))
    assert "--loss liger" in note and "--loss full was asked" in note
    assert not any(n.startswith("Logits:") for n in plan_8b(2048).notes)
    # where --loss auto cannot take Liger (V100: Triton needs compute capability 8.0+), the note says why
    v100 = plan_8b(32768, assume="8xV100-32GB")
    assert v100.loss == "full"
    note = next(n for n in v100.notes if n.startswith("Logits:"))
    assert "compute capability 8.0+" in note and "--loss tiled" in note


def test_the_fused_loss_figure_follows_liger_chunking():
    # Llama-3's V / h = 31.3 -> 32; 65,536 tokens / 32 = 2,048 per chunk; the input's and the head's gradients
    w = 2
    assert seqmem.liger_chunk_tokens(65536, 128_256, 4096) == 2048
    assert seqmem.loss_bytes("liger", 65536, 1, 128_256, 4096, "bf16") == \
        w * 65536 * 4096 + w * 128_256 * 4096 + w * 2048 * 128_256 + 4 * 65536
    assert seqmem.loss_bytes("liger", 65536, 1, 128_256, 4096, "bf16") < mem.logits_bytes(65536, 1, 128_256, "bf16") / 20


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_a_context_parallel_rung_is_recognised_from_its_files(cp):
    acc = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True},
           "parallelism_config": {"parallelism_config_cp_size": cp, "parallelism_config_dp_shard_size": 8 // cp}}
    assert rungs.key_for(rungs.strategy_from_files(acc, None)) == f"fsdp-cp{cp}"


# --- Many machines: HSDP against full sharding --------------------------------------------------------------

LLAMA3_70B = ModelShape(params=70_553_706_496, largest_layer_params=128_256 * 8192, hidden_size=8192, layers=80,
                        heads=64, kv_heads=8, vocab_size=128_256, intermediate_size=28_672, model_type="llama")


def plan_nodes(model: ModelShape, gbps: float | None, strategy: StrategyOptions | None = None, machines: int = 2):
    hw = hardware.assume("8xH100-80GB")
    return make_plan(hw, model, TrainingOptions(), strategy or StrategyOptions(),
                     Topology(machines, 8, inter_node_gbps=gbps))


def network_note(p) -> str:
    return next(n for n in p.notes if n.startswith("Across machines"))


@pytest.mark.parametrize("strategy", [StrategyOptions(), StrategyOptions(backend="fsdp")])
@pytest.mark.parametrize("gbps", [100.0, 3200.0])
def test_70b_on_two_machines_compares_hsdp_with_full_sharding_and_names_the_faster(strategy, gbps):
    p = plan_nodes(LLAMA3_70B, gbps, strategy)
    hsdp = next(r for r in p.rungs if rungs.BY_KEY[r.key].replicate)
    full = [r for r in p.rungs if not r.offloads and r.cp_size == 1 and not rungs.BY_KEY[r.key].replicate
            and (r.zero_stage == 3 or (r.backend == "fsdp" and r.fsdp_reshard))]
    assert full, [r.key for r in p.rungs]
    note = network_note(p)
    assert f"{gbps:g} Gb/s per machine" in note and hsdp.name in note and all(r.name in note for r in full)
    fastest = max([hsdp] + full, key=lambda r: r.tokens_per_second)
    assert f"{fastest.name} is the fastest here" in note
    # HSDP keeps the network least busy: one gradient all-reduce against two weight gathers and a reduce-scatter
    assert f"{hsdp.name} keeps the network least busy" in note
    # its states are one machine's FSDP: 8 GPUs' share, not 16's (70B does not fit so)
    assert hsdp.breakdown["optimizer"] == mem.states_fsdp(LLAMA3_70B.params, "bf16", "adamw", 8, 1, True).optimizer
    assert not hsdp.fits and "more than fits" in note
    if gbps == 100.0:
        assert fastest is hsdp and "less waiting on communication" in note


def test_a_slow_network_makes_hsdp_faster_than_full_sharding_by_its_traffic():
    fast, slow = (plan_nodes(LLAMA3_70B, g, StrategyOptions(backend="fsdp")) for g in (3200.0, 100.0))

    def rate(p, replicate):
        return next(r.tokens_per_second for r in p.rungs if rungs.BY_KEY[r.key].replicate == replicate
                    and r.fsdp_reshard and r.cp_size == 1 and not r.offloads)

    assert rate(slow, True) > 2 * rate(slow, False)
    assert rate(fast, True) < 1.2 * rate(fast, False)


def test_hsdp_is_chosen_where_it_fits_and_is_faster_and_its_files_are_accepted(tmp_path):
    p = plan_nodes(LLAMA31_8B, 100.0)
    assert p.choice.key == "fsdp-hsdp" and p.choice.fits
    code, out, err = cli("--non-interactive", "--assume", "8xH100-80GB", "--num-machines", "2", "--main-process-ip",
                         "10.0.0.1", "--inter-node-gbps", "100", "--params", "8B", "--hidden-size", "4096",
                         "--layers", "32", "--heads", "32", "--vocab-size", "128256", "--output-dir", str(tmp_path))
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "default_config.yaml").read_text())
    section = doc["parallelism_config"]
    assert (section["parallelism_config_dp_replicate_size"], section["parallelism_config_dp_shard_size"]) == (2, 8)
    sizes = {name: section[parallelism.PREFIX + name] for name in parallelism.SIZES}
    assert parallelism.problem(sizes, doc["num_processes"], 2) is None
    assert rungs.key_for(rungs.strategy_from_files(doc, None)) == "fsdp-hsdp"


def test_one_machine_has_no_hsdp_rung():
    assert not any(rungs.BY_KEY[r.key].replicate for r in plan_8b(2048).rungs)
    assert rungs.hsdp_keys("auto", "auto", "full", 1) == [] and rungs.hsdp_keys("deepspeed", "auto", "full", 2) == []


def test_context_parallel_rungs_stay_off_where_the_states_do_not_fit():
    """70B full fine-tuning on one 8 x H100 machine: nothing without offload fits, but because of the model states,
    which context parallelism does not split: the ladder stays v3's (no CP rungs). 8B at 512k tokens, whose
    states fit, keeps them even when none fits (the closest rung is one)."""
    big = make_plan(hardware.assume("8xH100-80GB"), LLAMA3_70B, TrainingOptions(), StrategyOptions(), Topology(1, 8))
    assert all(r.cp_size == 1 for r in big.rungs)
    long = plan_8b(524288)
    assert [r.cp_size for r in long.rungs if r.cp_size > 1] == [2, 4, 8]
