"""Rules on DeepSpeed's Ulysses sequence parallelism as accelerate's YAML configures it (`parallelism_config_sp_*`
beside a DeepSpeed config): what accelerate's own checks let through and DeepSpeed or the Trainer then refuse, or
get wrong, at the script's start.

Facts (accelerate 1.13-1.16, DeepSpeed 0.19.0-0.19.8, read from their code):
- `ParallelismConfig._validate_accelerator` skips its "total_size must be num_processes" check when sp_backend is
  deepspeed and sp_size > 1 ("DeepSpeed handles global process groups internally");
- DeepSpeed's `initialize_sequence_parallel` raises "world_size (N) is not divisible by sequence_parallel_size"
  (runtime/sequence_parallel/parallel_state_sp.py);
- accelerate's `_prepare_deepspeed` (and the HF Trainer through it) sets DeepSpeed's train_batch_size to micro-batch
  x accumulation x `data_parallel_size` (dp_replicate x dp_shard), which DeepSpeed checks against its own
  data-parallel world, the processes / sp;
- Ulysses is registered only in `_prepare_deepspeed`: under another distributed type the sequence is never split;
- `UlyssesSPAttentionHF` raises "Attention head count H is not divisible by SP size" and refuses KV heads that
  neither divide sp nor are divided by it;
- transformers 5.17-5.24 with ZeRO-1/2 gives the Ulysses run gradients sp times too large (measured,
  wizard.sizing.sequence.ulysses_gradients_too_large); nothing raises.
"""

from __future__ import annotations

from typing import Iterable

from wizard.check.rules.common import CheckContext, as_int, finding, rule

FAMILY = "accelerate"
SECTION = "parallelism_config"


def _size(ctx: CheckContext, name: str) -> int:
    return as_int(ctx.acc_get(SECTION, f"parallelism_config_{name}"), 1) or 1


def _sp(ctx: CheckContext) -> int:
    return _size(ctx, "sp_size") if isinstance(ctx.acc_get(SECTION), dict) else 1


@rule("ACC-SP-NEEDS-DEEPSPEED", FAMILY, "a sequence-parallel size without DeepSpeed")
def sp_needs_deepspeed(ctx: CheckContext) -> Iterable:
    sp = _sp(ctx)
    if sp <= 1 or ctx.distributed_type in (None, "DEEPSPEED"):
        return
    yield finding(
        "error", "ACC-SP-NEEDS-DEEPSPEED", ctx.acc_path, f"{SECTION}.parallelism_config_sp_size",
        f"sp_size {sp} with distributed_type {ctx.distributed_type}: accelerate registers DeepSpeed's Ulysses only "
        "when it prepares a DeepSpeed engine, so the sequence is never split, and the HF Trainer then fails looking "
        "for DeepSpeed's sequence-parallel group",
        fix="distributed_type: DEEPSPEED with a ZeRO config, or parallelism_config_cp_size for FSDP2's context "
            "parallelism", when="prepare")


@rule("ACC-SP-PROCESSES", FAMILY, "sp_size or the data-parallel sizes beside it do not fit the processes")
def sp_processes(ctx: CheckContext) -> Iterable:
    sp = _sp(ctx)
    if sp <= 1 or ctx.distributed_type != "DEEPSPEED":
        return
    n = ctx.num_processes
    key = f"{SECTION}.parallelism_config_sp_size"
    if n % sp:
        yield finding(
            "error", "ACC-SP-PROCESSES", ctx.acc_path, key,
            f"sp_size {sp} does not divide the {n} processes: DeepSpeed's initialize_sequence_parallel raises "
            f"'world_size ({n}) is not divisible by sequence_parallel_size {sp}' (accelerate's own check skips "
            "sequence parallelism)", fix=f"a divisor of {n}", when="prepare")
        return
    dp = _size(ctx, "dp_replicate_size") * _size(ctx, "dp_shard_size")
    if dp != n // sp:
        yield finding(
            "error", "ACC-SP-PROCESSES", ctx.acc_path, f"{SECTION}.parallelism_config_dp_shard_size",
            f"dp_replicate_size x dp_shard_size = {dp}, but the {n} processes in groups of sp {sp} leave {n // sp} "
            f"data-parallel ranks: accelerate sets DeepSpeed's train_batch_size with {dp}, and DeepSpeed checks it "
            f"against {n // sp} (micro-batch x accumulation x data-parallel ranks)",
            fix=f"parallelism_config_dp_shard_size: {n // sp} (with dp_replicate_size 1)", when="prepare")


@rule("ACC-SP-HEADS", FAMILY, "an sp_size the model's attention heads do not allow (with --model)")
def sp_heads(ctx: CheckContext) -> Iterable:
    sp = _sp(ctx)
    model = ctx.model
    if sp <= 1 or model is None or not getattr(model, "heads", 0):
        return
    from wizard.sizing.sequence import ulysses_sizes_allowed

    heads, kv = model.heads, getattr(model, "kv_heads", None) or model.heads
    allowed = ulysses_sizes_allowed(heads, kv)
    if sp in allowed:
        return
    yield finding(
        "error", "ACC-SP-HEADS", ctx.acc_path, f"{SECTION}.parallelism_config_sp_size",
        f"sp_size {sp} with {ctx.model_id}'s {heads} attention heads ({kv} key/value heads): DeepSpeed's "
        "UlyssesSPAttentionHF needs the heads divisible by sp and the key/value heads dividing it or divisible by it, "
        "and raises at prepare", fix="one of " + ", ".join(str(s) for s in allowed if s > 1) if len(allowed) > 1
        else "sp_size 1: no Ulysses for this model", when="prepare")


@rule("ACC-SP-ZERO12-GRADIENTS", FAMILY, "Ulysses on ZeRO-1/2 with a transformers that scales its gradients by sp")
def sp_zero12_gradients(ctx: CheckContext) -> Iterable:
    sp = _sp(ctx)
    if sp <= 1 or ctx.distributed_type != "DEEPSPEED":
        return
    from wizard.sizing.sequence import ulysses_gradients_text, ulysses_gradients_too_large

    stage, version = ctx.zero_stage(), ctx.versions.get("transformers")
    if not ulysses_gradients_too_large(stage, sp, version):
        return
    problem, fix = ulysses_gradients_text(stage, sp, version)
    yield finding("error", "ACC-SP-ZERO12-GRADIENTS", ctx.acc_path, f"{SECTION}.parallelism_config_sp_size",
                  f"{problem}: the run does not fail, it trains wrong", fix=fix, when="step 0")
