"""Measure what PyTorch keeps for backward in a real transformers causal LM, on CPU, and compare it with
wizard/sizing/memory.py's activation and logits formulas.

    python bench/measure_activations.py            # the default grid (about 3 minutes on 2 cores)
    python bench/measure_activations.py --quick    # a few shapes
    python bench/measure_activations.py --logits   # the loss path at two sequence lengths, Llama-3's vocabulary
    python bench/measure_activations.py --fused-loss   # the same with DeepSpeed's TiledFusedLogitsLoss (ALST)

Two instruments, both on CPU, both exact for what they see:

- saved_tensors_hooks: every tensor autograd saves for backward during the forward. Distinct storages
  (deduplicated by storage data_ptr; views share one), parameters excluded. Each saved tensor is
  attributed to the module running when it was saved (embedding, layer i, final norm, lm_head+loss).
  Under non-reentrant gradient checkpointing the checkpoint installs its own (inner) hooks, so the
  outer hooks only see what is saved outside the checkpointed layers; the layer inputs the checkpoint
  keeps for recomputation are held by a closure, not saved, and only the live-storage tracker sees them.
- A live-storage tracker (a TorchDispatchMode): every storage an operator outputs is followed with a
  weak reference until it is freed; the peak is taken between operators, forward and backward. Parameter
  gradients (.grad, model states in the plan) are excluded afterwards. It sees the transient gradients
  of backward and the layer recomputed under checkpointing; it cannot see workspace a fused kernel
  allocates inside one operator (e.g. CPU flash attention's per-thread buffers), nor anything the CUDA
  caching allocator does (block rounding to 512 B / 2 MiB segments, cached free blocks, fragmentation),
  cuBLAS/cuDNN/flash-attention workspaces or NCCL buffers: those stay in the plan's margin.

What the GPU kernels would keep is reasoned from their backward signatures, not measured here:
flash-attention (flash_attn and SDPA's CUDA flash / cuDNN / memory-efficient backends) saves q, k, v,
its output and an fp32 logsumexp of b*a*s (plus an RNG state); CPU SDPA takes
_scaled_dot_product_flash_attention_for_cpu, whose backward keeps exactly the same tensors, so the CPU
"sdpa" figures stand for the GPU flash/SDPA ones (the memory-efficient kernel pads the logsumexp to a
multiple of 32 tokens: noise).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu.alst import fused_causal_lm_loss  # noqa: E402  DeepSpeed's TiledFusedLogitsLoss, as ALST uses it
from wizard.sizing import memory as mem  # noqa: E402

# --- Measurement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    hidden: int = 256
    heads: int = 4
    kv_heads: int | None = None          # None: = heads (MHA)
    intermediate: int | None = None      # None: the Llama ratio, 8/3 * h rounded up to a multiple of 64
    layers: int = 2
    vocab: int = 32000
    seq: int = 256
    batch: int = 1
    dtype: str = "bf16"                  # bf16 | fp32
    attn: str = "sdpa"                   # sdpa | eager
    gc: bool = False
    attention_dropout: float = 0.0
    model_type: str = "llama"            # llama (gated MLP) | gpt2 (tanh-GELU MLP) | mixtral (MoE, gated)
    experts: int = 4                     # mixtral only: experts per layer, 2 routed per token
    fused_shards: int = 0                # > 0: the loss by DeepSpeed's TiledFusedLogitsLoss in this many shards

    @property
    def ffn(self) -> int:
        if self.intermediate:
            return self.intermediate
        if self.model_type == "gpt2":
            return 4 * self.hidden
        return -(-int(8 * self.hidden / 3) // 64) * 64

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    def label(self) -> str:
        gqa = f"/kv{self.kv}" if self.kv != self.heads else ""
        drop = f" drop{self.attention_dropout:g}" if self.attention_dropout else ""
        fused = f" fused/{self.fused_shards}" if self.fused_shards else ""
        return (f"{self.model_type} h{self.hidden} a{self.heads}{gqa} f{self.ffn} L{self.layers} V{self.vocab} "
                f"s{self.seq} b{self.batch} {self.dtype} {self.attn}{drop}{' gc' if self.gc else ''}{fused}")

    @property
    def chunk_tokens(self) -> int:
        """Tokens per shard of the fused loss (TiledFusedLogitsLoss: torch.chunk of the b*s flattened tokens)."""
        return -(-self.seq * self.batch // self.fused_shards) if self.fused_shards else self.seq * self.batch


@dataclass
class Measured:
    shape: Shape
    saved: dict[str, int] = field(default_factory=dict)   # region -> bytes saved for backward (hooks)
    live_after_forward: int = 0          # tracked storages alive after forward (loss kept, outputs dropped)
    live_after_forward_regions: dict[str, int] = field(default_factory=dict)
    backward_peak: int = 0               # max tracked live bytes over forward and backward, .grad excluded
    loss_peak: int = 0                   # max live bytes allocated in lm_head + loss, forward or backward
    layers_peak: int = 0                 # max live bytes, excluding lm_head + loss allocations
    saved_kinds: dict[str, int] = field(default_factory=dict)   # "layer0:bf16[2,256,256]" -> bytes, for reading

    def saved_layers(self) -> list[int]:
        return [v for k, v in sorted(self.saved.items()) if k.startswith("layer")]


def _torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[name]


def build_model(shape: Shape):
    """A randomly initialised causal LM of this shape, in train mode, on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if shape.model_type == "gpt2":
        config = GPT2Config(n_embd=shape.hidden, n_head=shape.heads, n_layer=shape.layers, n_inner=shape.ffn,
                            vocab_size=shape.vocab, n_positions=max(shape.seq, 128), attn_pdrop=shape.attention_dropout,
                            resid_pdrop=0.0, embd_pdrop=0.0)
    elif shape.model_type == "mixtral":
        from transformers import MixtralConfig
        config = MixtralConfig(hidden_size=shape.hidden, num_attention_heads=shape.heads,
                               num_key_value_heads=shape.kv, intermediate_size=shape.ffn,
                               num_hidden_layers=shape.layers, vocab_size=shape.vocab,
                               max_position_embeddings=max(shape.seq, 128), num_local_experts=shape.experts,
                               num_experts_per_tok=2, tie_word_embeddings=False)
    else:
        config = LlamaConfig(hidden_size=shape.hidden, num_attention_heads=shape.heads,
                             num_key_value_heads=shape.kv, intermediate_size=shape.ffn,
                             num_hidden_layers=shape.layers, vocab_size=shape.vocab,
                             max_position_embeddings=max(shape.seq, 128), attention_dropout=shape.attention_dropout,
                             tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=shape.attn, dtype=_torch_dtype(shape.dtype))
    model.train()
    if shape.gc:
        # What the HF Trainer calls (transformers 5.x; gradient_checkpointing_enable before), non-reentrant.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _regions(model):
    """(module, region name) for the parts whose saved tensors we attribute."""
    base = model.base_model
    if hasattr(base, "embed_tokens") and hasattr(base, "layers"):       # Llama family
        embeds, layers, norm = [base.embed_tokens], base.layers, base.norm
    elif hasattr(base, "wte"):              # GPT-2
        embeds, layers, norm = [base.wte, base.wpe], base.h, base.ln_f
    else:                                   # any other family: the layers and the LM head only
        return _generic_regions(model)
    out = [(m, "embed") for m in embeds]
    out += [(layer, f"layer{i:03d}") for i, layer in enumerate(layers)]
    out += [(norm, "final_norm"), (model.lm_head, "loss")]
    return out


def _generic_regions(model):
    """The repeated blocks (every GradientCheckpointingLayer inside a ModuleList: T5's encoder and
    decoder blocks, BERT's layers, Mamba's blocks), numbered in order, and the output embedding as
    "loss"."""
    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    out = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for child in module:
                if isinstance(child, GradientCheckpointingLayer):
                    out.append((child, f"layer{len(out):03d}"))
    out.append((model.get_output_embeddings(), "loss"))
    return out


class Tracker:
    """Follows every storage an operator outputs until it is freed; records alloc/free events by region."""

    def __init__(self, ignore: set[int]):
        self.ignore = ignore                  # storages that exist before the step: parameters
        self.entries: dict[int, list] = {}    # data_ptr -> [weakref, nbytes, entry_id, region]
        self.events: list[tuple[int, int, int, str]] = []   # (+1 alloc / -1 free, entry_id, nbytes, region)
        self.next_id = 0
        self.region = "other"
        self.recording = True

    def sweep(self):
        dead = [p for p, e in self.entries.items() if e[0].expired()]
        for p in dead:
            _, nbytes, eid, region = self.entries.pop(p)
            self.events.append((-1, eid, nbytes, region))

    def add(self, t):
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef

        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0 or storage.nbytes() == 0 or ptr in self.ignore:
            return
        old = self.entries.get(ptr)
        if old is not None:
            if not old[0].expired() and old[1] == storage.nbytes():
                return
            self.entries.pop(ptr)
            self.events.append((-1, old[2], old[1], old[3]))
        eid = self.next_id
        self.next_id += 1
        self.entries[ptr] = [StorageWeakRef(storage), storage.nbytes(), eid, self.region]
        self.events.append((1, eid, storage.nbytes(), self.region))

    def live_entries(self) -> dict[int, list]:
        self.sweep()
        return self.entries


def dispatch_mode(tracker: Tracker):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tracker.sweep()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    tracker.add(t)
            return out

    return Mode()


def measure(shape: Shape) -> Measured:
    """Forward + backward of one micro-batch with the LM loss; what was saved, kept and peaked."""
    return measure_model(build_model(shape), shape)


def measure_model(model, shape: Shape, inputs: dict | None = None) -> Measured:
    """measure() for a model already built (train mode, on CPU); `shape` gives seq, batch and vocab. `inputs`: the
    forward's keyword arguments instead of random ids as their own labels (a sequence-parallel shard)."""
    import torch

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    result = Measured(shape)
    tracker = Tracker(param_ptrs)
    state = {"region": "other", "forward": True}
    seen: set[int] = set()
    saved_refs = []

    def pre(region):
        def hook(module, args, kwargs=None):
            if state["forward"]:
                state["region"] = tracker.region = region
        return hook

    def post(region):
        def hook(module, args, output):
            if state["forward"] and region != "loss":
                state["region"] = tracker.region = "other"
        return hook

    handles = []
    for module, region in _regions(model):
        handles.append(module.register_forward_pre_hook(pre(region)))
        handles.append(module.register_forward_hook(post(region)))

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_ptrs and ptr not in seen and storage.nbytes() > 0:
            seen.add(ptr)
            result.saved[state["region"]] = result.saved.get(state["region"], 0) + storage.nbytes()
            key = f"{state['region']}:{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            result.saved_kinds[key] = result.saved_kinds.get(key, 0) + storage.nbytes()
            saved_refs.append(t)
        return t

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab, (shape.batch, shape.seq), generator=g)
    with dispatch_mode(tracker):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if shape.fused_shards:
                hidden = model.model(input_ids=ids).last_hidden_state
            else:
                out = model(**(inputs or {"input_ids": ids, "labels": ids}))
        if shape.fused_shards:
            # Outside the hooks: pack() keeps what it sees alive until the forward ends, and the fused loss runs
            # each shard's backward inside its forward, freeing that shard's saved tensors at once.
            state["region"] = tracker.region = "loss"     # all the fused loss allocates, x's gradient first
            loss = fused_causal_lm_loss(model, hidden, ids, shape.fused_shards)
            del hidden
        else:
            loss = out.loss
            del out                            # the HF Trainer keeps only the loss until backward
        saved_refs.clear()
        state["forward"] = False
        live = tracker.live_entries()
        result.live_after_forward = sum(e[1] for e in live.values())
        for e in live.values():
            result.live_after_forward_regions[e[3]] = result.live_after_forward_regions.get(e[3], 0) + e[1]
        tracker.region = "backward"
        loss.backward()
        del loss
        tracker.sweep()
    for h in handles:
        h.remove()
    grad_ptrs = {p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None}
    excluded = {e[2] for p, e in tracker.entries.items() if p in grad_ptrs}
    result.backward_peak, result.loss_peak, result.layers_peak = _peaks(tracker.events, excluded)
    return result


def _peaks(events, excluded) -> tuple[int, int, int]:
    """(peak of all, peak of lm_head+loss allocations, peak of the rest) over the event sequence.

    Backward allocations are attributed to "backward"; the logits' gradients are told apart by size
    (b*s*V elements and up), which nothing else in these models reaches."""
    live = loss_live = 0
    peak = loss_peak = rest_peak = 0
    loss_ids = set()
    big = None
    for kind, eid, nbytes, region in events:
        if eid in excluded:
            continue
        if kind == 1 and region == "loss":
            big = nbytes if big is None else max(big, nbytes)
        is_loss = region == "loss" or (region == "backward" and big is not None and nbytes >= big // 2)
        if kind == 1 and is_loss:
            loss_ids.add(eid)
        in_loss = eid in loss_ids
        live += kind * nbytes
        if in_loss:
            loss_live += kind * nbytes
        peak = max(peak, live)
        loss_peak = max(loss_peak, loss_live)
        rest_peak = max(rest_peak, live - loss_live)
    return peak, loss_peak, rest_peak


# --- Comparison with the formulas ---------------------------------------------------------------------

def estimate(shape: Shape) -> dict[str, int]:
    """wizard/sizing/memory.py's figures for this shape: one layer, all activations, logits.

    One correction is CPU-only and applied here, not in the formula: torch's CPU dropout is unfused
    and keeps its mask in the compute dtype (w bytes per score) where the fused CUDA kernel keeps a
    1-byte bool mask, which is what memory.attention_score_bytes counts."""
    profile = mem.layer_profile(shape.model_type)
    flash = shape.attn != "eager"
    dropout = shape.attention_dropout > 0
    kwargs = dict(precision=shape.dtype, profile=profile, kv_heads=shape.kv, attention_dropout=dropout,
                  experts_per_token=2 if shape.model_type == "mixtral" else 0)
    per_layer = mem.activation_bytes_per_layer(shape.seq, shape.batch, shape.hidden, shape.heads, shape.ffn, flash,
                                               **kwargs)
    acts = mem.activation_bytes(shape.seq, shape.batch, shape.hidden, shape.heads, shape.layers, shape.ffn, flash,
                                shape.gc, **kwargs)
    if dropout and not flash:
        cpu_mask = (mem.working_bytes(shape.dtype) - 1) * shape.heads * shape.seq * shape.seq * shape.batch
        per_layer += cpu_mask
        acts += cpu_mask * (1 if shape.gc else shape.layers)
    logits = mem.logits_bytes(shape.seq, shape.batch, shape.vocab, shape.dtype)
    return {"per_layer": per_layer, "activations": acts, "logits": logits}


def measured_activations(m: Measured) -> int:
    """The activations figure the plan should match.

    Without checkpointing: the bytes saved for backward outside the logits (every layer, the embedding's
    token ids, the final norm, the LM head's input), i.e. what is alive when backward starts besides
    the loss path. With checkpointing the saved tensors say little (the checkpoint holds the layer
    inputs itself, and backward recomputes one layer at a time): the peak of live bytes outside the loss
    path over forward and backward, parameter gradients excluded."""
    if m.shape.gc:
        return m.layers_peak
    return sum(m.saved.values()) - _logits_saved(m)


def compare(m: Measured) -> list[tuple[str, int, int]]:
    """(what, measured, estimated) rows for one measurement."""
    est = estimate(m.shape)
    rows = []
    if not m.shape.gc:
        rows.append(("layer (saved)", m.saved_layers()[-1], est["per_layer"]))
        rows.append(("activations (saved)", measured_activations(m), est["activations"]))
    else:
        rows.append(("activations (peak)", measured_activations(m), est["activations"]))
    rows.append(("logits (peak)", m.loss_peak, est["logits"]))
    return rows


def _logits_saved(m: Measured) -> int:
    """Bytes saved in the loss region by logits-sized tensors (the logits term counts them)."""
    s = m.shape
    elems = s.seq * s.batch * s.vocab
    return sum(v for k, v in m.saved_kinds.items() if k.startswith("loss:") and v >= elems)


def error_pct(measured: int, estimated: int) -> float:
    return (estimated - measured) / measured * 100


def logits_grid() -> list[Shape]:
    """The long-context question: does the logits term (memory.logits_bytes, 12 B per s*b*V element) hold at the
    sequence length asked? Llama-3's 128,256-token vocabulary, two lengths 4x apart, bf16 with checkpointing as a
    long-context run has it (and fp32 once: the upcast is a no-op there, the peak the same 12 B)."""
    base = dict(hidden=256, heads=4, kv_heads=2, layers=2, vocab=128_256, batch=1, gc=True)
    return [Shape(seq=512, **base), Shape(seq=2048, **base), Shape(seq=512, dtype="fp32", **base)]


def fused_loss_grid() -> list[Shape]:
    """The fused loss (issue 38): DeepSpeed's TiledFusedLogitsLoss at two sequence lengths 4x apart, from one shard
    (the whole sequence's logits, as without it) down to 64 tokens a shard, bf16 with checkpointing as a long run
    has it. A 32k vocabulary keeps the full-logits runs within this box's memory; the loss path is linear in V
    (--logits holds 12 B per s*b*V element at Llama-3's 128k)."""
    base = dict(hidden=256, heads=4, kv_heads=2, layers=2, vocab=32_000, batch=1, gc=True)
    return [Shape(seq=512, fused_shards=n, **base) for n in (1, 2, 8)] + \
        [Shape(seq=2048, fused_shards=n, **base) for n in (2, 8, 32)]


def fused_loss_fit(shape: Shape) -> int:
    """The fused loss's peak as measured (bench/results/fused-loss.md): 12 B per element of one shard's logits
    (each shard runs transformers' own loss, whose per-element peak is memory.logits_bytes' 12 B) plus the
    gradient of the LM head's input, kept whole for backward (b*s*h in the hidden states' dtype)."""
    return (12 * shape.chunk_tokens * shape.vocab
            + mem.working_bytes(shape.dtype) * shape.batch * shape.seq * shape.hidden)


def default_grid(quick: bool = False) -> list[Shape]:
    if quick:
        return [Shape(), Shape(attn="eager"), Shape(gc=True), Shape(attn="eager", gc=True)]
    grid = []
    for hidden, heads, kv in ((256, 4, 4), (512, 8, 2), (1024, 16, 4)):
        for seq, batch in ((128, 4), (512, 1), (1024, 2)):
            if hidden == 1024 and seq == 1024:
                continue
            for attn in ("sdpa", "eager"):
                for gc in (False, True):
                    grid.append(Shape(hidden=hidden, heads=heads, kv_heads=kv, layers=4, seq=seq, batch=batch,
                                      attn=attn, gc=gc))
    grid += [Shape(dtype="fp32"), Shape(dtype="fp32", attn="eager"), Shape(dtype="fp32", gc=True),
             Shape(vocab=152064, seq=256, batch=1), Shape(vocab=152064, dtype="fp32", seq=256),
             Shape(attn="eager", attention_dropout=0.1),
             Shape(model_type="mixtral"), Shape(model_type="mixtral", gc=True),
             Shape(model_type="gpt2", attn="eager"), Shape(model_type="gpt2", attn="sdpa"),
             Shape(model_type="gpt2", attn="eager", gc=True)]
    return grid


# --- Model families, through the plan's own path ------------------------------------------------------
#
# Tiny random configs of each family the plan sizes (a few layers, small widths, dropout off: hidden
# dropout is not in the memory model). Each is measured as transformers builds it by default (its own
# attention implementation) and estimated the way `wizard plan --model DIR` estimates it: size_model on
# the same config.json, then plan.activation_estimate.

FAMILY_CONFIGS: dict[str, dict] = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=688,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=4000,
                  tie_word_embeddings=False),
    "mistral": dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=256,
                    intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=4000, tie_word_embeddings=False),
    "gemma2": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=256, intermediate_size=512,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4000),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=256, intermediate_size=688,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=4000,
                  tie_word_embeddings=True),
    "mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=256,
                    intermediate_size=384, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=4000, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
    # DeepSeek-V2-Lite's layout: MLA without q compression, one dense layer first, 2 shared experts.
    "deepseek_v2": dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=256,
                        intermediate_size=688, moe_intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=4, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
                        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=48, vocab_size=4000, tie_word_embeddings=False),
    "qwen2_moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=256,
                      intermediate_size=688, moe_intermediate_size=96, shared_expert_intermediate_size=384,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                      num_experts_per_tok=2, vocab_size=4000, tie_word_embeddings=False),
    "t5": dict(architectures=["T5ForConditionalGeneration"], model_type="t5", d_model=256, d_ff=1024, d_kv=64,
               num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=4000, dropout_rate=0.0,
               decoder_start_token_id=0),
    "gpt2": dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=256, n_layer=2, n_head=4,
                 vocab_size=4000, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "bert": dict(architectures=["BertForMaskedLM"], model_type="bert", hidden_size=256, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=1024, vocab_size=4000, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0),
    "mamba": dict(architectures=["MambaForCausalLM"], model_type="mamba", hidden_size=256, num_hidden_layers=2,
                  state_size=16, expand=2, vocab_size=4000),
}


def build_family_model(config_dict: dict, dtype: str = "bf16"):
    """The config's own architecture class, randomly initialised in `dtype`, train mode, on CPU,
    with the attention implementation transformers picks by default."""
    import torch
    import transformers

    torch.manual_seed(0)
    data = dict(config_dict)
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    cls = getattr(transformers, config.architectures[0])
    model = cls._from_config(config, dtype=_torch_dtype(dtype))
    model.train()
    return model


def measure_family(name: str, seq: int = 256, batch: int = 2, dtype: str = "bf16",
                   config_dict: dict | None = None, attn: str | None = None) -> Measured:
    """Saved tensors of one forward of a family's tiny model (see FAMILY_CONFIGS); `attn` None runs
    the attention implementation transformers picks for the family."""
    config_dict = dict(config_dict or FAMILY_CONFIGS[name])
    if attn is not None:
        config_dict["attn_implementation"] = attn
    model = build_family_model(config_dict, dtype)
    vocab = model.config.get_text_config().vocab_size
    shape = Shape(seq=seq, batch=batch, dtype=dtype, vocab=vocab, model_type=config_dict["model_type"],
                  attn=model.config._attn_implementation)
    return measure_model(model, shape)


def estimate_family(config_dict: dict, seq: int, batch: int, dtype: str = "bf16") -> int:
    """The plan's activation figure for this config, by the plan's own path (size_model, then the plan)."""
    import json
    import tempfile

    from wizard.planning import plan
    from wizard.sizing.model import size_model

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(config_dict))
        model = size_model(tmp, use_cache=False)
    # As planned for GPUs: attention "auto" follows the model's implementation, and CPU SDPA saves what the
    # GPU flash / memory-efficient kernels save (see the module doc).
    return plan.activation_estimate(model, seq, batch, dtype, attention="auto", gradient_checkpointing=False,
                                    cpu=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--detail", action="store_true", help="print every saved tensor kind")
    parser.add_argument("--logits", action="store_true", help="only the loss path at two sequence lengths")
    parser.add_argument("--fused-loss", action="store_true",
                        help="the loss path through DeepSpeed's TiledFusedLogitsLoss, shards of 64 tokens to all")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(2)
    if args.fused_loss:
        return fused_loss_main()
    print(f"{'shape':<72} {'quantity':<24} {'measured':>12} {'estimated':>12} {'error':>8}")
    worst = 0.0
    for shape in (logits_grid() if args.logits else default_grid(args.quick)):
        t0 = time.perf_counter()
        m = measure(shape)
        for what, measured, estimated in compare(m):
            err = error_pct(measured, estimated)
            worst = max(worst, abs(err))
            print(f"{shape.label():<72} {what:<24} {measured:>12,} {estimated:>12,} {err:>+7.1f}%")
        if args.detail:
            for k, v in sorted(m.saved_kinds.items()):
                if k.startswith(("layer000", "embed", "final", "loss", "other")):
                    print(f"    {k:<60} {v:>12,}")
            print(f"    live after forward {m.live_after_forward:,} {m.live_after_forward_regions}")
            print(f"    peaks: all {m.backward_peak:,} loss {m.loss_peak:,} rest {m.layers_peak:,}  "
                  f"({time.perf_counter() - t0:.1f} s)")
    print(f"worst |error|: {worst:.1f}%")
    return 0


def fused_loss_main() -> int:
    """The fused grid: each shape's loss-path peak against fused_loss_fit, beside the full logits' figure
    (memory.logits_bytes) and the plan's Liger figure (memory.chunked_loss_bytes, Liger's own chunk)."""
    print(f"{'shape':<72} {'chunk':>6} {'measured':>12} {'fit':>12} {'error':>7} {'full logits':>12} "
          f"{'Liger (plan)':>12}")
    worst = 0.0
    for shape in fused_loss_grid():
        m = measure(shape)
        fit = fused_loss_fit(shape)
        err = error_pct(m.loss_peak, fit)
        worst = max(worst, abs(err))
        full = mem.logits_bytes(shape.seq, shape.batch, shape.vocab, shape.dtype)
        liger = mem.chunked_loss_bytes(shape.seq, shape.batch, shape.vocab, shape.hidden, shape.dtype)
        print(f"{shape.label():<72} {shape.chunk_tokens:>6} {m.loss_peak:>12,} {fit:>12,} {err:>+6.2f}% "
              f"{full:>12,} {liger:>12,}", flush=True)
    print(f"worst |error|: {worst:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
