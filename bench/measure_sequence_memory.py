"""Measure, on the CPU, what the long-sequence options hold at their peak, and compare it with
wizard/sizing/sequence.py's formulas.

    python bench/measure_sequence_memory.py            # both below (about a minute on 2 cores)
    python bench/measure_sequence_memory.py --loss     # the loss paths at two sequence lengths, Llama-3's vocabulary
    python bench/measure_sequence_memory.py --tiled-mlp  # a Llama step with DeepSpeed's TiledMLP at two lengths
    python bench/measure_sequence_memory.py --liger-layers  # a Llama step with Liger's RMSNorm and SwiGLU (ported)

The instrument is bench/measure_activations.py's live-storage tracker (a TorchDispatchMode following every
storage an operator outputs until it is freed); the peak is over the loss's forward and backward, and it counts
everything the loss path allocates: the logits or their chunks, the gradients of the LM head's input and of its
weight (in a fused loss the weight's gradient is made in the forward and lives to the end of backward, so it is
part of the peak; ZeRO-2 counts no gradient of the head elsewhere), the fp32 loss per token.

Three losses:
- full: transformers' ForCausalLMLoss on the materialised logits (what the plan has counted since issue 30:
  12 B per s*b*V element at the peak, bench/measure_activations.py --logits); the head's weight gradient is made
  after the logits' peak;
- liger: Liger Kernel's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py, 0.8.x,
  mean reduction) ported to torch step for step: the same chunk size (next power of 2 of ceil(s*b / ceil(V / h))
  tokens), the same buffers (grad_input like the input, grad_weight like the weight, an fp32 loss per token, one
  chunk of logits in the working dtype), the gradient computed in the forward and the logits' gradient written
  over the chunk's logits. Liger itself does not run here: its cross-entropy is a Triton kernel (NVIDIA GPUs of
  compute capability 8.0+), which keeps a row's softmax in registers; the port does one row at a time, whose
  fp32 temporaries (2 x V x 4 B) are the only bytes it holds that Liger does not;
- tiled: DeepSpeed's own TiledFusedLogitsLoss (deepspeed.runtime.sequence_parallel.ulysses_sp, which runs on the
  CPU), around transformers' loss, with ArcticTraining's shard rule (about 1 GiB of fp32 logits per shard),
  wizard/sizing/sequence.py tiled_loss_shards.

TiledMLP: DeepSpeed's TiledMLP patched into LlamaMLP.forward as ALST does (shards = ceil(s / h)), one training step
of a small Llama with non-reentrant gradient checkpointing, against the same step without it: the layers' peak
(bench/measure_activations.py's "rest" peak, the loss path excluded) drops by what the recomputed layer's MLP no
longer holds at once.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.measure_activations import Shape, Tracker, build_model, dispatch_mode, error_pct, measure_model  # noqa: E402
from wizard.sizing import memory as mem  # noqa: E402
from wizard.sizing import sequence as seqmem  # noqa: E402


# --- The loss paths -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class LossShape:
    seq: int
    hidden: int = 256
    vocab: int = 128_256                 # Llama-3's
    dtype: str = "bf16"
    shard_bytes: int = seqmem.TILED_LOSS_SHARD_BYTES   # the tiled loss's shards: smaller here to get several

    def label(self) -> str:
        shards = seqmem.tiled_loss_shards(self.seq, self.vocab, self.shard_bytes)
        return f"h{self.hidden} V{self.vocab} s{self.seq} b1 {self.dtype} ({shards} tiled shard{'s' * (shards > 1)})"


def _torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def liger_function():
    """Liger's LigerFusedLinearCrossEntropyFunction (mean reduction; no bias, soft-cap, z-loss or label
    smoothing), its Triton cross-entropy kernel replaced by a torch loop over rows that writes each row's
    gradient over its logits as the kernel does."""
    import torch

    class ChunkedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, target, ignore_index=-100):
            bt, h = x.shape
            v = weight.shape[0]
            inc = -(-v // h)                                    # triton.cdiv(V, chunk_mem_const * H)
            chunk = min(_next_power_of_2(-(-bt // inc)), bt)
            grad_input = torch.zeros_like(x)
            grad_weight = torch.zeros_like(weight)              # accum_dtype None: the weight's dtype
            loss_1d = torch.zeros(bt, dtype=torch.float32)
            n = int((target != ignore_index).sum().item())
            for start in range(0, bt, chunk):
                end = min(start + chunk, bt)
                x_chunk = x[start:end]
                logits = x_chunk @ weight.t()                   # chunk x V, the working dtype
                for row in range(end - start):                  # liger_cross_entropy_kernel, one program a row
                    y = int(target[start + row])
                    if y == ignore_index:
                        logits[row].zero_()
                        continue
                    values = logits[row].float()
                    lse = torch.logsumexp(values, 0)
                    loss_1d[start + row] = (lse - values[y]) / n
                    values = torch.exp(values - lse)
                    values[y] -= 1
                    logits[row] = values / n                    # the gradient, written over the logits
                    del values
                grad_input[start:end] = logits @ weight
                torch.addmm(grad_weight, logits.t(), x_chunk, out=grad_weight)
                del logits
            ctx.save_for_backward(grad_input.detach(), grad_weight.detach())
            return loss_1d.sum()

        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight = ctx.saved_tensors
            if not torch.equal(grad_output, torch.tensor(1.0, dtype=grad_output.dtype)):
                grad_input = grad_input * grad_output
                grad_weight = grad_weight * grad_output
            return grad_input, grad_weight, None, None

    return ChunkedLinearCrossEntropy


def _hf_loss(logits, labels, vocab: int, **kwargs):
    from transformers.loss.loss_utils import ForCausalLMLoss
    return ForCausalLMLoss(logits, labels, vocab, **kwargs)


def measure_loss(shape: LossShape, kind: str) -> int:
    """The peak bytes the loss path allocates over its forward and backward (everything but the hidden states,
    the head's weight and the labels, which exist before it)."""
    import torch

    torch.manual_seed(0)
    dtype = _torch_dtype(shape.dtype)
    x = (torch.randn(1, shape.seq, shape.hidden) * 0.5).to(dtype).requires_grad_(True)
    head = torch.nn.Linear(shape.hidden, shape.vocab, bias=False).to(dtype)
    labels = torch.randint(0, shape.vocab, (1, shape.seq))
    before = {t.untyped_storage().data_ptr() for t in (x, head.weight, labels)}
    tracker = Tracker(before)
    with dispatch_mode(tracker):
        if kind == "full":
            loss = _hf_loss(head(x), labels, shape.vocab)
        elif kind == "liger":
            # Liger's causal-LM forward shifts the labels and flattens the tokens before the fused loss
            shift = torch.cat([labels[:, 1:], torch.full((1, 1), -100)], dim=1).reshape(-1)
            loss = liger_function().apply(x.reshape(-1, shape.hidden), head.weight, shift)
        elif kind == "tiled":
            from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

            shift = torch.cat([labels[:, 1:], torch.full((1, 1), -100)], dim=1)

            def loss_fn(module, hidden, shift_labels):
                # the shard's sum (num_items_in_batch=1: transformers' loss sums), as ArcticTraining's
                # fused_logits_loss_fn sums each shard and divides by the unmasked tokens once
                return _hf_loss(module(hidden), None, shape.vocab, shift_labels=shift_labels, num_items_in_batch=1)

            shards = seqmem.tiled_loss_shards(shape.seq, shape.vocab, shape.shard_bytes)
            total = TiledFusedLogitsLoss.apply(loss_fn, head, x, shift, None, shards, [head.weight], "sum")
            loss = total / (shift != -100).sum()
        else:
            raise ValueError(kind)
        loss.backward()
        del loss
        tracker.sweep()
    live = peak = 0
    for kind_, _, nbytes, _ in tracker.events:
        live += kind_ * nbytes
        peak = max(peak, live)
    return peak


def estimate_loss(shape: LossShape, kind: str) -> int:
    if kind == "full":
        return mem.logits_bytes(shape.seq, 1, shape.vocab, shape.dtype)
    return seqmem.loss_bytes(kind, shape.seq, 1, shape.vocab, shape.hidden, shape.dtype, shape.shard_bytes)


def loss_grid() -> list[LossShape]:
    """Two lengths 4x apart with Llama-3's vocabulary; the longer with the tiled loss's shards at 256 MiB of fp32
    logits (4 shards: ArcticTraining's 1 GiB would need 4x the tokens for as many, hours on this CPU)."""
    return [LossShape(seq=512), LossShape(seq=2048, shard_bytes=256 << 20)]


# --- TiledMLP ---------------------------------------------------------------------------------------------

def _patch_tiled_mlp():
    """ALST's patch (DeepSpeed's TiledMLP docstring): LlamaMLP.forward through TiledMLP with ceil(s / h) shards.
    Returns a function that undoes it."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaMLP.forward

    def tiled_mlp_forward(self, x):
        shards = seqmem.tiled_mlp_shards(x.shape[-2], x.shape[-1])

        def mlp_forward(module, x_shard):
            return original(module, x_shard)

        return TiledMLP.apply(mlp_forward, self, x, shards, [self.down_proj.weight, self.gate_proj.weight,
                                                              self.up_proj.weight])

    modeling_llama.LlamaMLP.forward = tiled_mlp_forward

    def undo():
        modeling_llama.LlamaMLP.forward = original
    return undo


def tiled_mlp_grid() -> list[Shape]:
    """Two MLP widths at one hidden size (the shard's phase against the norm's), a wider hidden size with two
    shards, and a longer sequence (more shards, the same per-token figure)."""
    base = dict(heads=4, kv_heads=2, layers=2, vocab=2000, batch=1, gc=True)
    return [Shape(seq=1024, hidden=256, intermediate=704, **base),
            Shape(seq=1024, hidden=256, intermediate=1408, **base),
            Shape(seq=1024, hidden=512, intermediate=704, **{**base, "heads": 8, "kv_heads": 4}),
            Shape(seq=4096, hidden=256, intermediate=704, **base)]


def measure_tiled_mlp(shape: Shape) -> tuple[int, int, int]:
    """(layers' peak without TiledMLP, with it, with it and Liger's norms): bench/measure_activations.py's peak
    outside the loss path."""
    plain = measure_model(build_model(shape), shape).layers_peak
    undo = _patch_tiled_mlp()
    try:
        tiled = measure_model(build_model(shape), shape).layers_peak
    finally:
        undo()
    return plain, tiled, measure_tiled_mlp_liger(shape)


def estimate_tiled_mlp(shape: Shape) -> tuple[int, int, int]:
    from wizard.planning.resolve import layer_stack
    from wizard.sizing.model import ModelShape

    model = ModelShape(params=1, largest_layer_params=1, hidden_size=shape.hidden, layers=shape.layers,
                       heads=shape.heads, kv_heads=shape.kv, vocab_size=shape.vocab, intermediate_size=shape.ffn,
                       model_type="llama")
    stack = layer_stack(model)
    liger = seqmem.stack_for_loss(stack, "liger", "llama")
    plain = sum(mem.stack_activation_parts(stack, shape.seq, shape.batch, True, True, shape.dtype))
    tiled = sum(seqmem.layer_parts(stack, shape.seq, shape.batch, True, True, shape.dtype, tiled_mlp=True))
    tiled_liger = sum(seqmem.layer_parts(liger, shape.seq, shape.batch, True, True, shape.dtype, tiled_mlp=True))
    return plain, tiled, tiled_liger


# --- Liger's RMSNorm and SwiGLU (what use_liger_kernel=True also swaps in) ----------------------------------------

ROWS = 64          # rows a port's backward computes at once: its temporaries stand for the kernels' registers


def _patch_liger_norm_and_tiled_mlp():
    """ALST's Llama as its paper ran it: Liger's RMSNorm (ported, _patch_liger_layers) with DeepSpeed's TiledMLP in
    the MLP (Liger's SwiGLU off: 'all of Liger-Kernel's Llama features were enabled, except swiglu when TiledMLP was
    used')."""
    from transformers.models.llama import modeling_llama

    mlp_forward = modeling_llama.LlamaMLP.forward
    undo_liger = _patch_liger_layers()
    modeling_llama.LlamaMLP.forward = mlp_forward        # HF's MLP again, then tiled
    undo_tiled = _patch_tiled_mlp()

    def undo():
        undo_tiled()
        undo_liger()
    return undo


def measure_tiled_mlp_liger(shape: Shape) -> int:
    undo = _patch_liger_norm_and_tiled_mlp()
    try:
        return measure_model(build_model(shape), shape).layers_peak
    finally:
        undo()


def _patch_liger_layers():
    """LigerRMSNorm and LigerSwiGLUMLP (liger_kernel/transformers/rms_norm.py, swiglu.py) patched into the Llama
    classes as apply_liger_kernel_to_llama does, their Triton functions ported to torch with the tensors they save:
    LigerRMSNormFunction saves its input and an fp32 rstd per row (rms_norm.py: ctx.save_for_backward(X, W, RSTD)),
    LigerSiLUMulFunction the gate's and the up projection's outputs (swiglu.py: ctx.save_for_backward(a, b)), whose
    backward writes the two gradients over them. The ports compute ROWS rows at a time, so their temporaries stay a
    small part of what is measured. Returns a function that undoes the patch."""
    import torch
    from transformers.models.llama import modeling_llama

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            rows = x.reshape(-1, x.shape[-1])
            y = torch.empty_like(rows)
            rstd = torch.empty(rows.shape[0], dtype=torch.float32)
            for i in range(0, rows.shape[0], ROWS):
                block = rows[i:i + ROWS].float()
                rstd[i:i + ROWS] = torch.rsqrt(block.pow(2).mean(-1) + eps)
                y[i:i + ROWS] = (block * rstd[i:i + ROWS, None]).to(x.dtype) * weight
            ctx.eps = eps
            ctx.save_for_backward(x, weight, rstd)
            return y.view_as(x)

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            rows, grads = x.reshape(-1, x.shape[-1]), dy.reshape(-1, x.shape[-1])
            dx = torch.empty_like(grads)                  # Liger writes dX over dY (in_place): one buffer either way
            dw = torch.zeros(weight.shape, dtype=torch.float32)
            for i in range(0, rows.shape[0], ROWS):
                xb, r = rows[i:i + ROWS].float(), rstd[i:i + ROWS, None]
                g = grads[i:i + ROWS].float() * weight.float()
                normed = xb * r
                dx[i:i + ROWS] = (r * (g - normed * (g * normed).mean(-1, keepdim=True))).to(dx.dtype)
                dw += (grads[i:i + ROWS].float() * normed).sum(0)
            return dx.view_as(x), dw.to(weight.dtype), None

    class SiLUMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            c = torch.empty_like(a)
            fa, fb, fc = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), c.view(-1, c.shape[-1])
            for i in range(0, fa.shape[0], ROWS):
                fc[i:i + ROWS] = torch.nn.functional.silu(fa[i:i + ROWS].float()).to(a.dtype) * fb[i:i + ROWS]
            ctx.save_for_backward(a, b)
            return c

        @staticmethod
        def backward(ctx, dc):
            a, b = ctx.saved_tensors
            fa, fb, fd = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), dc.reshape(-1, dc.shape[-1])
            for i in range(0, fa.shape[0], ROWS):      # swiglu_backward: da, db written over a, b
                xa, xb, g = fa[i:i + ROWS].float(), fb[i:i + ROWS].float(), fd[i:i + ROWS].float()
                sig = torch.sigmoid(xa)
                silu = xa * sig
                fb[i:i + ROWS] = (g * silu).to(b.dtype)
                fa[i:i + ROWS] = (g * xb * sig * (1 + xa * (1 - sig))).to(a.dtype)
            return a, b

    norm_forward, mlp_forward = modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward

    def rms_norm(self, hidden_states):
        return RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)

    def mlp(self, x):
        return self.down_proj(SiLUMul.apply(self.gate_proj(x), self.up_proj(x)))

    modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward = rms_norm, mlp

    def undo():
        modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward = norm_forward, mlp_forward
    return undo


def liger_layers_grid() -> list[Shape]:
    base = dict(hidden=256, heads=4, kv_heads=2, layers=2, vocab=2000, batch=1)
    return [Shape(seq=1024, **base), Shape(seq=1024, gc=True, **base), Shape(seq=4096, gc=True, **base)]


def measure_liger_layers(shape: Shape) -> int:
    """The layers' figure bench/measure_activations.py compares (saved without checkpointing, the peak outside the
    loss with it), with Liger's norms and MLP."""
    from bench.measure_activations import measured_activations

    undo = _patch_liger_layers()
    try:
        return measured_activations(measure_model(build_model(shape), shape))
    finally:
        undo()


def estimate_liger_layers(shape: Shape) -> int:
    from wizard.planning.resolve import layer_stack
    from wizard.sizing.model import ModelShape

    model = ModelShape(params=1, largest_layer_params=1, hidden_size=shape.hidden, layers=shape.layers,
                       heads=shape.heads, kv_heads=shape.kv, vocab_size=shape.vocab, intermediate_size=shape.ffn,
                       model_type="llama")
    stack = seqmem.stack_for_loss(layer_stack(model), "liger", "llama")
    return sum(mem.stack_activation_parts(stack, shape.seq, shape.batch, True, shape.gc, shape.dtype))


# --- Ulysses (DeepSpeed's UlyssesSPAttentionHF, 2 processes over gloo) ----------------------------------------

SP = 2


def ulysses_grid() -> list[Shape]:
    """The Llama MLP (its backward the layer's largest phase: what Ulysses saves more), a narrow one (the
    all-to-alls' buffers the largest), and one KV head that each rank replicates."""
    base = dict(hidden=256, heads=4, layers=2, vocab=2000, batch=1, seq=2048, gc=True)
    return [Shape(kv_heads=2, **base), Shape(kv_heads=2, intermediate=256, **base),
            Shape(kv_heads=1, intermediate=256, **base)]


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ulysses_rank(rank: int, port: int, shape: Shape, results) -> None:
    """One rank of a 2-process step: the model with 'ulysses' attention around SDPA, fed its half of the sequence
    as UlyssesSPDataLoaderAdapter shards it (input_ids, position_ids, shift_labels), under the live-storage
    tracker."""
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(SP),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(SP))
    import deepspeed
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = build_model(shape)
    # It wraps the model's own "sdpa" entry of ALL_ATTENTION_FUNCTIONS (in this process only).
    UlyssesSPAttentionHF.register_with_transformers(model, "sdpa", SP, shape.batch, seq_length_is_variable=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab, (shape.batch, shape.seq), generator=g)
    shift_labels = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:]
    local = shape.seq // SP
    part = slice(rank * local, (rank + 1) * local)
    inputs = {"input_ids": ids[:, part], "position_ids": torch.arange(shape.seq)[None, part].expand(shape.batch, -1),
              "labels": shift_labels[:, part], "shift_labels": shift_labels[:, part]}
    results[rank] = measure_model(model, replace(shape, seq=local), inputs).layers_peak
    torch.distributed.destroy_process_group()


def measure_ulysses(shape: Shape) -> tuple[int, int]:
    """(the layers' peak of rank 0 under Ulysses SP 2, the same model's peak on its local length alone)."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_ulysses_rank, args=(_free_port(), shape, results), nprocs=SP, join=True)
        sp_peak = results[0]
    alone = measure_model(build_model(shape), replace(shape, seq=shape.seq // SP)).layers_peak
    return sp_peak, alone


def estimate_ulysses(shape: Shape) -> tuple[int, int]:
    from wizard.planning.resolve import layer_stack
    from wizard.sizing.model import ModelShape

    model = ModelShape(params=1, largest_layer_params=1, hidden_size=shape.hidden, layers=shape.layers,
                       heads=shape.heads, kv_heads=shape.kv, vocab_size=shape.vocab, intermediate_size=shape.ffn,
                       model_type="llama")
    stack = layer_stack(model)
    local = shape.seq // SP
    return (sum(seqmem.layer_parts(stack, local, shape.batch, True, True, shape.dtype, sp=SP)),
            sum(mem.stack_activation_parts(stack, local, shape.batch, True, True, shape.dtype)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loss", action="store_true", help="only the loss paths")
    parser.add_argument("--kinds", default="full,liger,tiled", help="the losses measured (comma-separated)")
    parser.add_argument("--seq", type=int, action="append", help="only these lengths of the loss grid")
    parser.add_argument("--tiled-mlp", action="store_true", help="only the TiledMLP step")
    parser.add_argument("--liger-layers", action="store_true", help="only the layers with Liger's norm and MLP")
    parser.add_argument("--ulysses", action="store_true", help="only the 2-process Ulysses step")
    args = parser.parse_args(argv)
    both = not (args.loss or args.tiled_mlp or args.liger_layers or args.ulysses)
    import torch
    torch.set_num_threads(2)
    print(f"{'case':<48} {'quantity':<26} {'measured':>14} {'estimated':>14} {'error':>8}")
    worst = 0.0
    if both or args.loss:
        for shape in [s for s in loss_grid() if not args.seq or s.seq in args.seq]:
            for kind in args.kinds.split(","):
                t0 = time.perf_counter()
                measured, estimated = measure_loss(shape, kind), estimate_loss(shape, kind)
                err = error_pct(measured, estimated)
                worst = max(worst, abs(err))
                print(f"{shape.label():<48} {'loss peak (' + kind + ')':<26} {measured:>14,} {estimated:>14,} "
                      f"{err:>+7.1f}%  ({time.perf_counter() - t0:.1f} s)")
    if both or args.tiled_mlp:
        for shape in tiled_mlp_grid():
            measured, estimated = measure_tiled_mlp(shape), estimate_tiled_mlp(shape)
            whats = ("layers' peak (plain)", "layers' peak (TiledMLP)", "... (TiledMLP, Liger norms)")
            for what, m, e in zip(whats, measured, estimated):
                err = error_pct(m, e)
                worst = max(worst, abs(err))
                print(f"{shape.label():<48} {what:<26} {m:>14,} {e:>14,} {err:>+7.1f}%")
    if both or args.liger_layers:
        for shape in liger_layers_grid():
            m, e = measure_liger_layers(shape), estimate_liger_layers(shape)
            err = error_pct(m, e)
            worst = max(worst, abs(err))
            what = "layers' peak (Liger)" if shape.gc else "layers saved (Liger)"
            print(f"{shape.label():<48} {what:<26} {m:>14,} {e:>14,} {err:>+7.1f}%")
    if both or args.ulysses:
        for shape in ulysses_grid():
            measured, estimated = measure_ulysses(shape), estimate_ulysses(shape)
            for what, m, e in zip((f"layers' peak (SP {SP})", "... (local length alone)"), measured, estimated):
                err = error_pct(m, e)
                worst = max(worst, abs(err))
                print(f"{shape.label():<48} {what:<26} {m:>14,} {e:>14,} {err:>+7.1f}%")
    print(f"worst |error|: {worst:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
