"""The memory of long sequences beyond memory.py's layers and logits: the loss computed without the full logits
(Liger Kernel's fused linear cross-entropy, DeepSpeed's TiledFusedLogitsLoss), Ulysses sequence parallelism
(DeepSpeed's UlyssesSPAttentionHF: each GPU runs 1/sp of the sequence, attention on all of it for heads/sp heads),
and ALST's code-side options: DeepSpeed's TiledMLP and the activation checkpoints offloaded to host RAM
(arXiv 2506.13996, 3.1-3.3).

Pure arithmetic, no torch. Every formula names what it was read from and whether it was MEASURED on the CPU
(bench/measure_sequence_memory.py) or only READ from the libraries' code.
"""

from __future__ import annotations

import math
from dataclasses import replace

from wizard import versions
from wizard.sizing import memory as mem

# How the loss is computed: the full logits (transformers' ForCausalLMLoss), Liger Kernel's fused linear
# cross-entropy (TrainingArguments(use_liger_kernel=True): Triton, NVIDIA GPUs of compute capability 8.0+), or
# DeepSpeed's TiledFusedLogitsLoss (pure PyTorch, any GPU: lines in the training script).
LOSSES = ("full", "liger", "tiled")

# Triton (what Liger's kernels are written in) supports NVIDIA GPUs of compute capability 8.0+ (its README,
# "Supported Hardware"): A100, A10, L4, H100 and newer, RTX 30xx and newer; not V100 (7.0) or T4 (7.5).
LIGER_MIN_COMPUTE_CAPABILITY = (8, 0)

# The config model_types Liger Kernel 0.8's `_apply_liger_kernel_to_instance` (what use_liger_kernel=True calls)
# patches: liger_kernel/transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN. Any other model gets a warning
# from Liger and keeps the full logits.
LIGER_MODEL_TYPES = frozenset({
    "deepseek_v4", "gemma", "gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4", "glm4", "glm4v", "glm4v_moe",
    "gpt_oss", "internvl", "llama", "llama4_text", "llama4", "llava", "granite", "mllama", "mllama_text_model",
    "ministral", "mistral", "mixtral", "nemotron", "olmo2", "pixtral", "olmo3", "qwen2", "qwen3", "qwen3_moe",
    "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_next", "qwen3_5", "qwen3_5_text",
    "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "smollm3",
    "phi3", "paligemma", "falcon_h1", "smolvlm", "hunyuan_v1_dense", "hunyuan_v1_moe", "exaone4",
})

# ArcticTraining's rule for TiledFusedLogitsLoss's shards (sequence-parallelism trainer, num_shards "auto"): about
# 1 GiB of fp32 logits in a shard, "less than 1GB doesn't seem to make much of an impact".
TILED_LOSS_SHARD_BYTES = 1 << 30


# What a Llama-family layer saves with Liger's kernels, which use_liger_kernel=True swaps in beside the loss
# (apply_liger_kernel_to_llama & co.: rms_norm=True, swiglu=True by default). LigerRMSNormFunction saves its
# input and an fp32 rstd per row (4 B a token, left out) where HF's RMSNorm keeps an fp32 copy and the normalised
# tensor: the plain norm's 2w per element; LigerSiLUMulFunction saves the gate's and the up projection's outputs
# (down_proj keeps the product): 3 f-tensors, not 4, and writes their gradients over them in backward, whose MLP
# then holds about 1.2 f-sized gradients at once, not HF's 2.5. MEASURED with torch ports of the two functions
# (bench/measure_sequence_memory.py --liger-layers: a tiny Llama, bf16, SDPA; without checkpointing the saved
# tensors within 2 %, with it the peak at 1,024 and 4,096 tokens 10,528 B a token both, 1.20 f-tensors of backward).
LIGER_GATED_PROFILE = mem.LayerProfile("liger", gated_mlp=True, ffn_tensors=3, rms_norm_fp32=False,
                                       softmax_fp32=True, backward_ffn_tensors=1.2)


def stack_for_loss(stack: mem.LayerStack, loss: str, model_type: str | None) -> mem.LayerStack:
    """The layers as the loss option runs them: with Liger (use_liger_kernel=True) a dense Llama-layout model's
    norms and SwiGLU MLP are Liger's (LIGER_GATED_PROFILE); anything else keeps its own profile (other families'
    Liger kernels are not measured: their HF figures are kept, the larger)."""
    if loss != "liger" or (stack.profile or mem.GATED_PROFILE) is not mem.GATED_PROFILE or stack.experts_per_token \
            or (model_type or "") not in LIGER_MODEL_TYPES:
        return stack
    return replace(stack, profile=LIGER_GATED_PROFILE)


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """The tokens of one chunk of Liger's fused linear cross-entropy: next_power_of_2(ceil(tokens / ceil(V / h))),
    at most the tokens (fused_linear_cross_entropy_forward, chunk_mem_const 1): a chunk's logits are about as large
    as the hidden states."""
    if tokens <= 0:
        return 0
    inc = -(-vocab // max(hidden, 1))
    return min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)


def tiled_loss_shards(tokens: int, vocab: int, shard_bytes: int = TILED_LOSS_SHARD_BYTES) -> int:
    """TiledFusedLogitsLoss's shards for this many tokens: ceil(fp32 logits / 1 GiB), ArcticTraining's rule."""
    return max(1, math.ceil(tokens * vocab * 4 / shard_bytes))


def tiled_mlp_shards(tokens: int, hidden: int) -> int:
    """TiledMLP's shards: ceil(sequence / hidden size), the rule of DeepSpeed's TiledMLP docstring and ALST (3.1.1:
    256,000 tokens of Llama-8B in 63 shards)."""
    return max(1, math.ceil(tokens / max(hidden, 1)))


def loss_bytes(loss: str, seq_len: int, micro_batch: int, vocab: int, hidden: int, precision: str,
               shard_bytes: int = TILED_LOSS_SHARD_BYTES) -> int:
    """The loss path at its peak, per GPU, for `seq_len` tokens of this GPU (1/sp of the sequence under sequence
    parallelism). MEASURED on the CPU at two lengths, bench/measure_sequence_memory.py (Llama-3's vocabulary):

    - full: memory.logits_bytes, 12 B per token x vocabulary element.
    - liger: Liger's buffers, made in the forward and alive to the end of the loss's backward: the gradient of the
      head's input (w x tokens x h), of its weight (w x V x h: the loss computes it in the forward, so it coexists
      with the layers' activations), one chunk of logits in the working dtype (liger_chunk_tokens x V x w, the
      chunk's gradient written over it) and an fp32 loss per token. Measured with a torch port of its algorithm
      (its Triton kernel does not run on the CPU).
    - tiled: DeepSpeed's TiledFusedLogitsLoss around transformers' loss (each shard's backward runs inside the
      forward): the gradient of the head's input (w x tokens x h, filled shard by shard) and one shard's full-logits
      peak (12 B per element of tiled_loss_shards' shard), beside the head's weight gradient that the shards before
      it accumulated (w x V x h; none for the first). The accumulation of a shard's weight gradient (the sum and
      the new one, 2 x w x V x h) comes after its logits are gone.
    """
    tokens = seq_len * micro_batch
    if tokens <= 0 or vocab <= 0:
        return 0
    if loss == "full":
        return mem.logits_bytes(seq_len, micro_batch, vocab, precision)
    w = mem.working_bytes(precision)
    head_grad = w * vocab * hidden
    input_grad = w * tokens * hidden
    if loss == "liger":
        return input_grad + head_grad + w * liger_chunk_tokens(tokens, vocab, hidden) * vocab + 4 * tokens
    if loss == "tiled":
        shards = tiled_loss_shards(tokens, vocab, shard_bytes)
        shard = -(-tokens // shards)
        if shards == 1:
            return input_grad + mem.LOGITS_PEAK_BYTES_PER_ELEMENT * shard * vocab
        return input_grad + max(head_grad + mem.LOGITS_PEAK_BYTES_PER_ELEMENT * shard * vocab, 2 * head_grad)
    raise ValueError(f"unknown loss {loss!r}")


# --- Context parallelism (FSDP2's ring attention) ----------------------------------------------------------------

def context_parallel_kv_bytes(seq_len: int, micro_batch: int, kv_width: int, precision: str) -> int:
    """Context parallelism with accelerate's default cp_comm_strategy allgather: torch's ring attention gathers the
    whole sequence's keys and values for the layer it computes (rotate_method ALL_GATHER), and its backward holds
    their gradients as long: 2 (k, v) x 2 (values, gradients) x s x b x kv_width in the working dtype, transient,
    one layer at a time (kv_width = kv_heads x head_dim). Read from torch's _context_parallel/_attention.py,
    not measured (it needs several processes with a device mesh)."""
    return 4 * seq_len * micro_batch * kv_width * mem.working_bytes(precision)


# --- Ulysses sequence parallelism ---------------------------------------------------------------------------

def ulysses_sizes_allowed(heads: int, kv_heads: int) -> tuple[int, ...]:
    """The sequence-parallel sizes DeepSpeed's UlyssesSPAttentionHF accepts for this attention (ulysses_sp.py,
    0.19.0 to 0.19.8): heads % sp == 0, and kv_heads % sp == 0 or sp % kv_heads == 0 (grouped KV heads are
    replicated up to sp when there are fewer than sp of them). 1 is always allowed (no sequence parallelism)."""
    if heads < 1:
        return (1,)
    kv = kv_heads or heads
    return tuple(sp for sp in range(1, heads + 1)
                 if heads % sp == 0 and (kv % sp == 0 or sp % kv == 0))


def ulysses_kv_heads_per_rank(kv_heads: int, sp: int) -> int:
    """The key/value heads each rank attends with: kv_heads / sp, or 1 replicated head when sp > kv_heads
    (UlyssesSPAttentionHF.kv_replication_factor)."""
    return max(kv_heads // sp, 1)


def ulysses_extra_saved_per_token(hidden: int, heads: int, kv_heads: int, head_dim: int | None, sp: int,
                                  precision: str) -> int:
    """Bytes per local token one layer saves for backward under Ulysses beyond the same layer without it, READ from
    ulysses_sp.py (0.19.8), not measured (it needs sp processes):

    - o_proj's input is a new tensor (_partition_global_sequence's all-to-all and reshape().contiguous()), no longer
      the attention's own output, which the attention kernel keeps: w x heads x head_dim;
    - with fewer KV heads than sp, each rank's keys and values are its replicated head over the whole sequence:
      2 x w x head_dim x (sp - kv_heads) per local token more than the local sequence's kv_heads heads.
    The queries and keys before the all-to-all are not saved (rotary embeddings keep only cos and sin)."""
    if sp <= 1:
        return 0
    w = mem.working_bytes(precision)
    hd = head_dim or hidden // max(heads, 1)
    kv = kv_heads or heads
    replicated = 2 * w * hd * (sp - kv) if sp > kv else 0
    return w * heads * hd + replicated


def ulysses_all_to_all_bytes(tokens: int, hidden: int, heads: int, kv_heads: int, head_dim: int | None, sp: int,
                             precision: str) -> int:
    """The transient buffers of one layer's all-to-alls, per GPU, READ from ulysses_sp.py (not measured): for the
    queries, keys and values of the local tokens, the rearranged contiguous copy that is sent and the received
    tensor (_combine_local_sequences: rearrange(...).contiguous(), _dim_zero_all_to_all), both alive at once."""
    if sp <= 1:
        return 0
    w = mem.working_bytes(precision)
    hd = head_dim or hidden // max(heads, 1)
    kv_width = ulysses_kv_heads_per_rank(kv_heads or heads, sp) * sp * hd
    return 2 * w * tokens * (heads * hd + 2 * kv_width)


# transformers 5.17-5.24 under DeepSpeed ZeRO-1 or 2 with Ulysses: the gradients come out sp times too large (MEASURED
# at the oldest end, bench/results/ulysses-cpu.md item 7: the SP run's losses are the 1-process run's at sp times the
# learning rate); transformers 5.25 fixed it, and ZeRO-3 is right at both ends.
ULYSSES_ZERO12_FIXED_IN = "5.25"


def ulysses_gradients_too_large(zero_stage: int | None, sp: int, transformers_version: str | None) -> bool:
    """Whether this transformers (its version string; None: not installed or unknown) gives a Ulysses run on ZeRO
    `zero_stage` gradients sp times too large. An unreadable version is not judged."""
    if sp <= 1 or zero_stage not in (1, 2) or not transformers_version:
        return False
    have = versions.release(transformers_version)
    return have is not None and have < versions.release(ULYSSES_ZERO12_FIXED_IN)


def ulysses_gradients_text(zero_stage: int, sp: int, transformers_version: str) -> tuple[str, str]:
    """(what goes wrong, the fix) for ulysses_gradients_too_large: one wording for the plan's note and wizard check."""
    return (f"transformers {transformers_version} with DeepSpeed ZeRO-{zero_stage} and Ulysses SP {sp} makes the "
            f"gradients {sp} times too large (the run trains as at {sp}x the learning rate; fixed in transformers "
            f"{ULYSSES_ZERO12_FIXED_IN}, ZeRO-3 is unaffected)",
            f"pip install 'transformers>={ULYSSES_ZERO12_FIXED_IN}' on the training machine, or DeepSpeed ZeRO-3")


# --- The layers with ALST's options -------------------------------------------------------------------------

# TiledMLP's backward, MEASURED on the CPU (bench/measure_sequence_memory.py --tiled-mlp, the live storages at the
# layers' peak of a tiny Llama, bf16, non-reentrant checkpointing; h 256/512, f 704/1408, 2 and 4 shards):
# - at the MLP's shard: the layer output's gradient and TiledMLP's x_grad (w x h per token each), the shard's
#   output (w x h per shard token), and per shard token the HF MLP's four saved f-tensors (gate, up, act(gate),
#   their product: Liger's SwiGLU is off under TiledMLP, as ALST runs it) and two gradients of that size;
# - at the second norm's backward (HF's fp32 RMSNorm): the gradient coming in (w x h) and six fp32 h-sized
#   tensors (its saved fp32 input and the backward's temporaries), while its bf16 tensors are freed. With the
#   MLP no longer the layer's largest phase this one is, as soon as a shard is a small part of the sequence.
TILED_MLP_SHARD_GRADIENTS = 2
NORM_BACKWARD_FP32_TENSORS = 6


def tiled_mlp_phase_bytes(tokens: int, hidden: int, ffn: int, precision: str, profile: mem.LayerProfile | None,
                          experts: int = 1) -> int:
    """Bytes per token that a layer with TiledMLP holds, in its backward, beyond its saved tensors without the MLP's
    (the constants above; tiled_mlp_shards' shards). Liger's norms (not fp32) have no norm phase above the MLP's."""
    p = profile or mem.GATED_PROFILE
    w = mem.working_bytes(precision)
    shard_fraction = 1 / tiled_mlp_shards(tokens, hidden)
    shard_ffn = (mem.GATED_PROFILE.ffn_tensors if p.gated_mlp else p.ffn_tensors) + TILED_MLP_SHARD_GRADIENTS
    mlp = (2 + shard_fraction) * w * hidden + shard_ffn * ffn * w * experts * shard_fraction
    norm = 0
    if p.rms_norm_fp32:
        norm = w * hidden + NORM_BACKWARD_FP32_TENSORS * 4 * hidden - mem.norm_bytes_per_token(hidden, precision, p)
    return math.ceil(max(mlp, norm))


def layer_parts(stack: mem.LayerStack, seq_len: int, micro_batch: int, flash: bool, gradient_checkpointing: bool,
                precision: str, tiled_mlp: bool = False, sp: int = 1, checkpoint_offload: bool = False
                ) -> tuple[int, int]:
    """memory.stack_activation_parts (kept until backward, recomputed layer) for `seq_len` tokens of this GPU, with:

    - tiled_mlp: DeepSpeed's TiledMLP in each decoder layer's MLP. It runs the MLP shard by shard without grad in
      the forward and saves only its input (the norm's output, already counted), so the layer saves
      profile.ffn_tensors f-sized tensors less per token; its backward re-runs each shard with grad, and the layer's
      backward then peaks at the larger of tiled_mlp_phase_bytes' two phases (the MLP's shard, the second norm's
      backward) instead of memory.py's MLP phase.
    - sp > 1: Ulysses (ulysses_extra_saved_per_token, and the all-to-alls' transient buffers in the recomputed
      layer, ulysses_all_to_all_bytes); `seq_len` is already the local 1/sp.
    - checkpoint_offload: ALST's activation-checkpoint offload (its patch of torch.utils.checkpoint moves each
      checkpointed layer input to host RAM in the forward and back in the backward): of the kept layer inputs
      only the one being recomputed stays on the GPU (checkpoint_offload_host_bytes is what host RAM holds).
    Uniform decoders only (the Llama layout); other stacks take memory.stack_activation_parts' figures for the
    options they do not change."""
    kept, recomputed = mem.stack_activation_parts(stack, seq_len, micro_batch, flash, gradient_checkpointing,
                                                  precision, stack.attention_dropout)
    tokens = seq_len * micro_batch
    w = mem.working_bytes(precision)
    p = stack.profile or mem.GATED_PROFILE
    extra = tokens * ulysses_extra_saved_per_token(stack.hidden, stack.heads, stack.kv_heads, stack.head_dim, sp,
                                                   precision)
    mlp_backward = int(p.backward_ffn_tensors * stack.ffn * w) * tokens
    if tiled_mlp and not stack.ssm_state:
        f = stack.expert_ffn or stack.ffn if stack.experts_per_token else stack.ffn
        experts = max(stack.experts_per_token, 1)
        saved_mlp = int(p.ffn_tensors * f * w) * experts * tokens            # what the plain MLP keeps
        plain_backward = tokens * mem.backward_working_bytes_per_token(
            seq_len, stack.hidden, stack.heads, f, flash, precision, p, stack.experts_per_token)
        tiled_phase = tokens * tiled_mlp_phase_bytes(tokens, stack.hidden, f, precision, p, experts)
        if gradient_checkpointing:
            recomputed += tiled_phase - plain_backward - saved_mlp
        else:
            kept -= saved_mlp * stack.layers
            recomputed += max(0, tiled_phase - plain_backward)
        mlp_backward = tiled_phase
    # The all-to-alls' buffers live while the attention runs (forward, recomputation, its backward), when the MLP's
    # saved tensors and backward are not yet or no longer there: they count where they exceed the MLP's backward.
    a2a = ulysses_all_to_all_bytes(tokens, stack.hidden, stack.heads, stack.kv_heads, stack.head_dim, sp, precision)
    if gradient_checkpointing:
        recomputed += extra + max(0, a2a - mlp_backward)
        if checkpoint_offload:
            kept = w * tokens * stack.hidden
    else:
        kept += extra * stack.layers
        recomputed += max(0, a2a - mlp_backward)
    return kept, recomputed


def checkpoint_offload_host_bytes(seq_len: int, micro_batch: int, hidden: int, layers: int, precision: str,
                                  processes_per_machine: int) -> int:
    """Host RAM per machine that ALST's activation-checkpoint offload holds: every layer's input of every local
    process, w x tokens x h x L each (ALST 5.3.2: "1_000_000/32 x 8192 x 80 x 2 / 2^30 x 8 = 305 GiB per 1M seqlen"
    for Llama-70B on 4 nodes)."""
    return mem.working_bytes(precision) * seq_len * micro_batch * hidden * layers * processes_per_machine
