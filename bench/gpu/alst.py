"""ALST's single-GPU techniques (Arctic Long Sequence Training, arXiv 2506.13996), applied to an HF causal LM under
the HF Trainer as Snowflake's ArcticTraining applies them, with DeepSpeed's own code (issue 38). Used by
bench/gpu/train_one.py's --alst and by bench/measure_activations.py --fused-loss.

- fused-loss: the logits and the loss by DeepSpeed's TiledFusedLogitsLoss (runtime/sequence_parallel/
  ulysses_sp.py), shard by shard, each shard's backward run inside the forward, so that only one shard's logits
  ever exist; shards of about 1 GiB of fp32 logits, ArcticTraining's rule (SFTTrainer.loss: ceil(b*s*V*4 / 2**30)).
  Pure torch: it runs on a CPU as on a GPU (Liger's fused linear cross-entropy, the other way ALST names, is Triton,
  GPU only).
- tiled-mlp: every decoder layer's MLP through DeepSpeed's TiledMLP (same file), ceil(s / hidden) shards
  (TiledMLP's own example): the MLP's intermediate activations exist for one shard of the sequence at a time.
- ckpt-offload: the inputs that gradient checkpointing keeps per layer, moved to host memory during the forward
  and back for the backward (DeepSpeed's CheckpointHiddenStatesOffload,
  runtime/activation_checkpointing/offload_activations.py, DeepSpeed 0.19.8 and later; HF's non-reentrant
  checkpointing). It needs gradient checkpointing, and a GPU: on a CPU there is no device memory to free.
"""

from __future__ import annotations

import math
import types

TECHNIQUES = ("fused-loss", "tiled-mlp", "ckpt-offload")
FUSED_SHARD_BYTES = 2 ** 30          # ArcticTraining: about 1 GiB of fp32 logits per shard


class Unsupported(RuntimeError):
    """The technique cannot run as itself here (what is missing, said in the message)."""


def parse(text: str | None) -> tuple[str, ...]:
    """'fused-loss+tiled-mlp' -> ('fused-loss', 'tiled-mlp'), in TECHNIQUES' order; '' or None -> ()."""
    names = [t for t in (text or "").split("+") if t]
    unknown = [t for t in names if t not in TECHNIQUES]
    if unknown:
        raise ValueError(f"ALST technique {', '.join(unknown)}: any of {', '.join(TECHNIQUES)}, joined by '+'")
    return tuple(t for t in TECHNIQUES if t in names)


def fused_loss_shards(tokens: int, vocab: int) -> int:
    """ArcticTraining's shard count for the fused loss: about FUSED_SHARD_BYTES of fp32 logits per shard."""
    return max(1, math.ceil(tokens * vocab * 4 / FUSED_SHARD_BYTES))


def tiled_mlp_shards(seq: int, hidden: int) -> int:
    """TiledMLP's example (ulysses_sp.py): ceil(seqlen / hidden) shards, so each shard has about hidden tokens."""
    return max(1, math.ceil(seq / hidden))


def fused_causal_lm_loss(owner, hidden, labels, shards: int | None = None):
    """The causal-LM loss of `hidden` (the decoder's last hidden states) through DeepSpeed's TiledFusedLogitsLoss:
    labels shifted as HF's loss shifts them, each shard's share of the mean over all labelled tokens (shards may
    hold different numbers of -100 labels), summed. `owner` is the *ForCausalLM model: its lm_head and its
    loss_function make each shard's logits and loss.

    The mean is taken inside the shards, never after: TiledFusedLogitsLoss computes the LM head's gradient inside
    its forward with an upstream gradient of 1 and scales only x's gradient by the real one in backward
    (ulysses_sp.py 0.19.8: forward's `incoming_grad`, backward's `x_grad *= grads[0]`), so a division after it
    (ArcticTraining's sum-then-divide) would leave the head's gradient N times too large. For the same reason the
    result must reach backward unscaled: gradient accumulation's 1/steps or fp16 loss scaling would miss the head."""
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    vocab = owner.config.get_text_config().vocab_size
    shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    if shards is None:
        shards = fused_loss_shards(shift_labels.numel(), vocab)
    labelled = (shift_labels != -100).sum().clamp(min=1)

    def shard_share(model, x, y):
        logits = model.lm_head(x)
        good = (y != -100).sum()
        if good.item() == 0:            # cross-entropy of no token is NaN; a zero that still reaches lm_head
            return (logits.sum() * 0.0).float()
        return model.loss_function(logits=logits, labels=None, shift_labels=y, vocab_size=vocab) * good / labelled

    return TiledFusedLogitsLoss.apply(shard_share, owner, hidden, shift_labels, None, shards,
                                      [owner.lm_head.weight], "sum")


def tile_mlps(model) -> int:
    """Route every decoder layer's MLP through DeepSpeed's TiledMLP (its own forward, per shard); the count."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    count = 0
    for layer in model.get_decoder().layers:
        mlp = layer.mlp
        original = type(mlp).forward

        def forward(self, x, _original=original):
            return TiledMLP.apply(_original, self, x, tiled_mlp_shards(x.shape[-2], x.shape[-1]),
                                  list(self.parameters()))

        mlp.forward = types.MethodType(forward, mlp)
        count += 1
    return count


def checkpoint_offload():
    """DeepSpeed's context that offloads the checkpointed layer inputs to host memory (around a training step)."""
    try:
        from deepspeed.runtime.activation_checkpointing.offload_activations import (
            get_checkpoint_hidden_states_offloading_ctx_manager,
        )
    except ImportError as exc:
        import deepspeed
        raise Unsupported(f"DeepSpeed {deepspeed.__version__} has no CheckpointHiddenStatesOffload "
                          "(runtime/activation_checkpointing/offload_activations.py, 0.19.8 and later)") from exc
    return get_checkpoint_hidden_states_offloading_ctx_manager()


def trainer_class(techniques: tuple[str, ...]):
    """transformers' Trainer, its loss through the fused loss and each training step inside the checkpoint
    offload, as `techniques` ask (tiled-mlp changes the model itself: tile_mlps)."""
    from transformers import Trainer

    class ALSTTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if "fused-loss" not in techniques:
                return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                            num_items_in_batch=num_items_in_batch)
            inputs = dict(inputs)
            labels = inputs.pop("labels")
            owner = self.accelerator.unwrap_model(model)
            hidden = owner.get_decoder()(**inputs).last_hidden_state
            loss = fused_causal_lm_loss(owner, hidden, labels)
            return (loss, None) if return_outputs else loss

        def training_step(self, *args, **kwargs):
            if "ckpt-offload" not in techniques:
                return super().training_step(*args, **kwargs)
            ctx = checkpoint_offload()
            with ctx:
                loss = super().training_step(*args, **kwargs)
            stats = getattr(ctx, "stats", None)        # what was offloaded and restored, for the report
            self.alst_offload_stats = dict(vars(stats)) if stats is not None else None
            return loss

    return ALSTTrainer
